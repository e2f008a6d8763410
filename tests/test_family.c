#define _GNU_SOURCE
/* The family descriptor (src/model/family.h): the table is complete and
 * consistent, its public listing keeps the struct rules, and each family's
 * entry does what its family needs: this file's own expectations of every
 * family (names of a layer's tensors, the template and its dims, config.json
 * defaults and keys) fail when a descriptor field is wrong. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "io/hf.h"
#include "model/family.h"
#include "model/layout.h"
#include "model/template.h"

static char tmp_dir[64];

static void make_tmp_dir(void)
{
    strcpy(tmp_dir, "/tmp/mt_family_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp failed");
}

static void remove_tmp_dir(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", tmp_dir);
    unlink(p);
    rmdir(tmp_dir);
}

TestSuite(family, .init = make_tmp_dir, .fini = remove_tmp_dir);

static uint32_t largest_arch(void)
{
    uint32_t a = 0;
    for (size_t i = 0; mt_family_at(i); i++) a = MT_MAX(a, (uint32_t)mt_family_at(i)->arch);
    return a;
}

Test(family, every_arch_value_has_one_entry)
{
    const uint32_t top = largest_arch();
    cr_assert_geq(top, MT_ARCH_MIXTRAL, "the header's values have entries");
    size_t n = 0;
    while (mt_family_at(n)) n++;
    cr_assert_eq(n, top + 1, "one entry for each value 0 .. %u (no value retired yet)", top);
    cr_assert_eq(mt_family_count(), n);
    for (uint32_t a = 0; a <= top; a++) {
        const mt_family *f = mt_family_of(a);
        cr_assert_not_null(f, "arch %u has no entry", a);
        cr_assert_eq((uint32_t)f->arch, a);
    }
    cr_assert_null(mt_family_of(top + 1));
    cr_assert_null(mt_family_of(MT_ARCH_MAX_ENUM));
}

Test(family, names_are_unique_and_look_up_their_entry)
{
    for (size_t i = 0; mt_family_at(i); i++) {
        const mt_family *f = mt_family_at(i);
        cr_assert(f->name && f->display_name && f->architecture && f->model_type && f->particular && f->example,
                  "entry %zu lacks a name", i);
        cr_assert_eq(mt_family_by_architecture(f->architecture), f, "%s", f->architecture);
        cr_assert_eq(mt_family_by_model_type(f->model_type), f, "%s", f->model_type);
        cr_assert_eq(mt_family_of(f->arch), f);
        for (size_t k = 0; k < i; k++) {
            const mt_family *g = mt_family_at(k);
            cr_assert_str_neq(f->name, g->name);
            cr_assert_str_neq(f->display_name, g->display_name);
            cr_assert_str_neq(f->architecture, g->architecture);
            cr_assert_str_neq(f->model_type, g->model_type);
        }
    }
    cr_assert_null(mt_family_by_architecture("GPT2LMHeadModel"));
    cr_assert_null(mt_family_by_model_type("gpt2"));
    cr_assert_null(mt_family_by_architecture(NULL));
}

Test(family, every_entry_has_a_template_and_what_it_reads)
{
    for (size_t i = 0; mt_family_at(i); i++) {
        const mt_family *f = mt_family_at(i);
        cr_assert_not_null(f->layer_template, "%s has no template", f->display_name);
        cr_assert_not_null(f->template_name);
        cr_assert_not_null(f->hidden_act);
        cr_assert(f->rope_theta > 1.0f, "%s: a default rope_theta", f->display_name);
        mt_model_config c;
        mt_model_config_init(&c);
        c.arch = (uint32_t)f->arch;
        cr_assert_eq(mt_template_for(&c), f->layer_template);
        cr_assert_eq(f->moe != MT_MOE_NONE, f->layer_template == &mt_template_moe, "%s", f->display_name);
        /* GPT-OSS's experts are named by the layout (one fused tensor of all of them), not per expert */
        /* (DeepseekV2Config has no default num_experts_per_tok: config.json must say) */
        if (f->moe != MT_MOE_NONE)
            cr_assert(f->moe_block &&
                          (f->moe == MT_MOE_GPT_OSS || (f->expert_names[0] && f->expert_names[1] && f->expert_names[2])) &&
                          f->experts && (f->experts_per_tok || f->arch == MT_ARCH_DEEPSEEK_V2),
                      "%s: the experts' names and defaults", f->display_name);
        if (f->window == MT_WINDOW_PATTERN) cr_assert_geq(f->window_pattern, 2u, "%s", f->display_name);
        if (f->window == MT_WINDOW_FROM_LAYER) cr_assert_gt(f->max_window_layers, 0u, "%s", f->display_name);
    }
}

/* ---- each family as this file expects it ---------------------------------------------- */

#define ATTN "input_layernorm q_proj k_proj v_proj"
#define QKN " q_norm k_norm"
#define DENSE " gate_proj up_proj down_proj"
static const struct {
    mt_arch arch;
    const char *layer0; /* the last part of each name of layer 0's tensors (a minimal config: no bias asked) */
    const mt_template *tmpl;
    int qk_norm, glu_act, embed_scaled;
    float norm_init;
    /* config.json defaults where the keys are absent */
    float rope_theta;
    uint32_t tied, bias;
    float qpas, attn_cap, final_cap, local_base;
    uint32_t experts, per_tok, expert_ffn, norm_topk;
    uint32_t window, rope_scaling, head_dim; /* 0 where unlisted: no window, no scaling, hidden / heads (8) */
} EXPECT[] = {
    {MT_ARCH_LLAMA, ATTN " o_proj post_attention_layernorm" DENSE, &mt_template_llama, 0, MT_GLU_SILU, 0, 1.0f,
     10000.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {MT_ARCH_QWEN2, ATTN " q_proj.bias k_proj.bias v_proj.bias o_proj post_attention_layernorm" DENSE,
     &mt_template_llama, 0, MT_GLU_SILU, 0, 1.0f, 10000.0f, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {MT_ARCH_MISTRAL, ATTN " o_proj post_attention_layernorm" DENSE, &mt_template_llama, 0, MT_GLU_SILU, 0, 1.0f,
     10000.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {MT_ARCH_QWEN3, ATTN QKN " o_proj post_attention_layernorm" DENSE, &mt_template_llama, 1, MT_GLU_SILU, 0, 1.0f,
     10000.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {MT_ARCH_PHI3, "input_layernorm qkv_proj qkv_proj qkv_proj o_proj post_attention_layernorm gate_up_proj "
                   "gate_up_proj down_proj",
     &mt_template_llama, 0, MT_GLU_SILU, 0, 1.0f, 10000.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {MT_ARCH_GEMMA2, ATTN " o_proj post_attention_layernorm pre_feedforward_layernorm post_feedforward_layernorm" DENSE,
     &mt_template_gemma, 0, MT_GLU_GELU_TANH, 1, 0.0f, 10000.0f, 1, 0, 256.0f, 50.0f, 30.0f, 0, 0, 0, 0, 0, 0, 0, 0},
    {MT_ARCH_GEMMA3,
     ATTN QKN " o_proj post_attention_layernorm pre_feedforward_layernorm post_feedforward_layernorm" DENSE,
     &mt_template_gemma, 1, MT_GLU_GELU_TANH, 1, 0.0f, 1e6f, 1, 0, 256.0f, 0, 0, 10000.0f, 0, 0, 0, 0, 0, 0, 0},
    {MT_ARCH_QWEN3_MOE,
     ATTN QKN " o_proj post_attention_layernorm mlp.gate experts.*.gate_proj experts.*.up_proj experts.*.down_proj",
     &mt_template_moe, 1, MT_GLU_SILU, 0, 1.0f, 10000.0f, 0, 0, 0, 0, 0, 0, 128, 8, 768, 0, 0, 0, 0},
    {MT_ARCH_MIXTRAL,
     ATTN " o_proj post_attention_layernorm block_sparse_moe.gate experts.*.w1 experts.*.w3 experts.*.w2",
     &mt_template_moe, 0, MT_GLU_SILU, 0, 1.0f, 10000.0f, 0, 0, 0, 0, 0, 0, 8, 2, 48, 1, 0, 0, 0},
    /* Qwen2MoeConfig: qkv_bias true, 60 experts of 1408, top-4 unnormalised, a gated shared expert */
    {MT_ARCH_QWEN2_MOE,
     ATTN " q_proj.bias k_proj.bias v_proj.bias o_proj post_attention_layernorm mlp.gate experts.*.gate_proj "
          "experts.*.up_proj experts.*.down_proj shared_expert.gate_proj shared_expert.up_proj "
          "shared_expert.down_proj shared_expert_gate",
     &mt_template_moe, 0, MT_GLU_SILU, 0, 1.0f, 10000.0f, 0, 1, 0, 0, 0, 0, 60, 4, 1408, 0, 0, 0, 0},
    /* GptOssConfig: attention_bias true, 128 experts of intermediate_size top-4 (the softmax of the top-4 logits:
     * renormalised), sliding_window 128 with layer_types sliding, full, ...; head_dim 64 whatever the hidden size;
     * yarn RoPE, rope_theta 150000 */
    {MT_ARCH_GPT_OSS,
     ATTN " q_proj.bias k_proj.bias v_proj.bias o_proj o_proj.bias sinks post_attention_layernorm router router.bias "
          "experts.gate_up_proj experts.gate_up_proj experts.down_proj experts.gate_up_proj_bias "
          "experts.gate_up_proj_bias experts.down_proj_bias",
     &mt_template_moe, 0, MT_GLU_GPTOSS, 0, 1.0f, 150000.0f, 0, 1, 0, 0, 0, 0, 128, 4, 48, 1, 128,
     MT_ROPE_SCALING_YARN, 64},
    /* DeepseekV3Config: latent attention with q_lora_rank 1536, kv_lora_rank 512, heads of 128 + 64 (head_dim
     * 192), the first 3 layers dense; 256 experts of 2048 top-8, renormalised */
    {MT_ARCH_DEEPSEEK_V3,
     "input_layernorm q_a_proj q_a_layernorm q_b_proj kv_a_proj_with_mqa kv_a_layernorm kv_b_proj o_proj "
     "post_attention_layernorm" DENSE,
     &mt_template_moe, 0, MT_GLU_SILU, 0, 1.0f, 10000.0f, 0, 0, 0, 0, 0, 0, 256, 8, 2048, 1, 0, 0, 192},
    /* DeepseekV2Config: the same attention, no dense layer, 64 experts of 1407 (top-k as config.json says:
     * 2 here), never renormalised, two shared experts */
    {MT_ARCH_DEEPSEEK_V2,
     "input_layernorm q_a_proj q_a_layernorm q_b_proj kv_a_proj_with_mqa kv_a_layernorm kv_b_proj o_proj "
     "post_attention_layernorm mlp.gate experts.*.gate_proj experts.*.up_proj experts.*.down_proj "
     "shared_experts.gate_proj shared_experts.up_proj shared_experts.down_proj",
     &mt_template_moe, 0, MT_GLU_SILU, 0, 1.0f, 10000.0f, 0, 0, 0, 0, 0, 0, 64, 2, 1407, 0, 0, 0, 192},
    /* Llama4TextConfig: 16 experts of intermediate_size top-1 beside a shared one, every layer sparse, the
     * experts fused as in its checkpoints; rope_theta 500000, head_dim 128 whatever the hidden size */
    {MT_ARCH_LLAMA4,
     ATTN " o_proj post_attention_layernorm feed_forward.router experts.gate_up_proj experts.gate_up_proj "
          "experts.down_proj shared_expert.gate_proj shared_expert.up_proj shared_expert.down_proj",
     &mt_template_moe, 0, MT_GLU_SILU, 0, 1.0f, 500000.0f, 0, 0, 0, 0, 0, 0, 16, 1, 48, 0, 0, 0, 128},
};
#define N_EXPECT (sizeof EXPECT / sizeof EXPECT[0])

Test(family, this_file_expects_every_family)
{
    cr_assert_eq(N_EXPECT, mt_family_count(), "a new family needs its row in EXPECT");
}

/* config.json with the shape alone: the family's defaults fill the rest */
static mt_model_config load_minimal(const mt_family *f)
{
    char path[128], text[512];
    snprintf(path, sizeof path, "%s/config.json", tmp_dir);
    /* latent attention expands a key and value for every head; DeepseekV2Config has no default top-k */
    const int mla = (f->flags & MT_FAMILY_MLA) != 0;
    snprintf(text, sizeof text,
             "{\"architectures\":[\"%s\"],\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,"
             "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":%d,"
             "\"max_position_embeddings\":128%s}",
             f->architecture, mla ? 4 : 2, f->arch == MT_ARCH_DEEPSEEK_V2 ? ",\"num_experts_per_tok\":2" : "");
    FILE *fp = fopen(path, "w");
    cr_assert_not_null(fp);
    fputs(text, fp);
    fclose(fp);
    mt_model_config c;
    mt_model_config_init(&c);
    cr_assert_eq(mt_config_load(&c, tmp_dir), MT_OK, "%s: %s", f->display_name, mt_last_errmsg());
    mt_model_config v;
    char why[MT_ERRMSG_MAX];
    cr_assert_eq(mt_config_import((mt_err){why}, &v, &c), MT_OK, "%s", why);
    return v;
}

Test(family, config_json_defaults_of_each_family)
{
    for (size_t i = 0; i < N_EXPECT; i++) {
        const mt_family *f = mt_family_of(EXPECT[i].arch);
        const mt_model_config c = load_minimal(f);
        cr_assert_eq(c.arch, (uint32_t)EXPECT[i].arch);
        cr_assert_eq(c.rope_theta, EXPECT[i].rope_theta, "%s", f->display_name);
        cr_assert_eq(c.tie_word_embeddings, EXPECT[i].tied, "%s", f->display_name);
        cr_assert_eq(c.attention_bias, EXPECT[i].bias, "%s", f->display_name);
        cr_assert_eq(c.query_pre_attn_scalar, EXPECT[i].qpas, "%s", f->display_name);
        cr_assert_eq(c.attn_logit_softcapping, EXPECT[i].attn_cap, "%s", f->display_name);
        cr_assert_eq(c.final_logit_softcapping, EXPECT[i].final_cap, "%s", f->display_name);
        cr_assert_eq(c.rope_local_base_freq, EXPECT[i].local_base, "%s", f->display_name);
        cr_assert_eq(c.num_experts, EXPECT[i].experts, "%s", f->display_name);
        cr_assert_eq(c.num_experts_per_tok, EXPECT[i].per_tok, "%s", f->display_name);
        cr_assert_eq(c.moe_intermediate_size, EXPECT[i].expert_ffn, "%s", f->display_name);
        cr_assert_eq(c.norm_topk_prob, EXPECT[i].norm_topk, "%s", f->display_name);
        cr_assert_eq(c.sliding_window, EXPECT[i].window, "%s: the window without the key", f->display_name);
        cr_assert_eq(c.rope_scaling, EXPECT[i].rope_scaling, "%s: RoPE without the key", f->display_name);
        cr_assert_eq(c.head_dim, EXPECT[i].head_dim ? EXPECT[i].head_dim : 8u, "%s: head_dim", f->display_name);
    }
}

Test(family, layer_tensors_template_and_dims_of_each_family)
{
    for (size_t i = 0; i < N_EXPECT; i++) {
        const mt_family *f = mt_family_of(EXPECT[i].arch);
        const mt_model_config c = load_minimal(f);
        mt_layout lo;
        cr_assert_eq(mt_layout_build(&lo, &c), 0);
        char got[1024] = "";
        const mt_unit_desc *u = &lo.units[1];
        for (int t = 0; t < u->n_tensors; t++) {
            /* "model.layers.0.self_attn.q_proj.weight" -> "q_proj"; biases and the router keep more */
            char n[96];
            snprintf(n, sizeof n, "%s", u->tensors[t].name + strlen("model.layers.0."));
            char *w = strstr(n, ".weight");
            if (w) *w = '\0';
            const char *shown = n;
            if (!strncmp(n, "self_attn.", 10)) shown = n + 10;
            else if (!strncmp(n, "mlp.experts.", 12) || !strncmp(n, "block_sparse_moe.experts.", 25))
                shown = strstr(n, "experts.");
            else if (!strncmp(n, "mlp.", 4) && strcmp(n, "mlp.gate") != 0) shown = n + 4;
            else if (!strncmp(n, "feed_forward.", 13) && strcmp(n, "feed_forward.router") != 0) shown = n + 13;
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", t ? " " : "", shown);
        }
        cr_assert_str_eq(got, EXPECT[i].layer0, "%s's layer 0", f->display_name);
        cr_assert_eq(mt_layout_count_params(&c), lo.num_params, "%s", f->display_name);
        mt_layout_free(&lo);
        cr_assert_eq(mt_template_for(&c), EXPECT[i].tmpl, "%s", f->display_name);
        mt_dims d;
        mt_dims_init(&d, &c, 1, 16);
        cr_assert_eq(d.qk_norm, EXPECT[i].qk_norm, "%s", f->display_name);
        cr_assert_eq(d.glu_act, EXPECT[i].glu_act, "%s", f->display_name);
        cr_assert_eq(d.norm_offset, 1.0f - EXPECT[i].norm_init, "%s", f->display_name);
        cr_assert_eq(d.embed_scale != 1.0f, EXPECT[i].embed_scaled, "%s", f->display_name);
        cr_assert_eq(mt_family_norm_init(f), EXPECT[i].norm_init, "%s", f->display_name);
    }
}

/* A config of each family with what it allows set (a window, experts, Gemma's fields), written as
 * config.json and read back: the same config, and the keys its config class has. */
Test(family, config_json_written_and_read_back_for_each_family)
{
    for (size_t i = 0; mt_family_at(i); i++) {
        const mt_family *f = mt_family_at(i);
        mt_model_config c = load_minimal(f);
        if (f->window != MT_WINDOW_NONE) c.sliding_window = 8;
        if (f->window == MT_WINDOW_FROM_LAYER) c.max_window_layers = 1;
        if (f->window == MT_WINDOW_PATTERN || f->window == MT_WINDOW_EVEN_BELOW) c.sliding_window_pattern = 2;
        if (f->shared_block) c.shared_expert_intermediate_size = 24;
        if (f->flags & MT_FAMILY_PHI3_ROPE) { /* part of each head, longrope's factors */
            c.partial_rotary_factor = 0.5f, c.rope_scaling = MT_ROPE_SCALING_LONGROPE, c.rope_factor = 16.0f;
            c.rope_original_max_position = 64, c.rope_n_factors = mt_config_rotary_dims(&c) / 2;
            for (uint32_t r = 0; r < c.rope_n_factors; r++)
                c.rope_short_factor[r] = 1.0f + 0.25f * r, c.rope_long_factor[r] = 2.0f + 1.5f * r;
        } else if (i % 3 == 1) { /* yarn with every setting given */
            c.rope_scaling = MT_ROPE_SCALING_YARN, c.rope_factor = 4.0f, c.rope_original_max_position = 32;
            c.rope_beta_fast = 16.0f, c.rope_beta_slow = 2.0f, c.rope_mscale = 0.707f, c.rope_mscale_all_dim = 1.0f;
            c.rope_no_truncate = 1, c.rope_attention_factor = i % 2 ? 1.25f : 0.0f;
        }
        if (f->moe == MT_MOE_QWEN3) c.decoder_sparse_step = 2, c.mlp_only_layers[0] = 1;
        if (f->moe != MT_MOE_NONE) c.num_experts = 4, c.num_experts_per_tok = 2, c.moe_intermediate_size = 48;
        if (f->moe != MT_MOE_NONE && f->moe != MT_MOE_DEEPSEEK && f->moe != MT_MOE_LLAMA4)
            c.output_router_logits = 1, c.router_aux_loss_coef = 0.01f;
        if (f->moe == MT_MOE_LLAMA4) { /* layer 1 dense, layer 3 without RoPE, chunks of 16, the temperature */
            c.shared_expert_intermediate_size = 48, c.mlp_only_layers[0] = 2, c.nope_layers[0] = 8;
            c.attention_chunk_size = 16, c.qk_l2_norm = i % 2, c.attn_temperature_floor = 4.0f;
            c.attn_temperature_scale = 0.125f;
        }
        if (f->moe == MT_MOE_DEEPSEEK) { /* two shared experts, groups, a dense first layer, small latents */
            c.shared_expert_intermediate_size = 96, c.n_group = 2, c.topk_group = 1, c.routed_scaling_factor = 1.5f;
            c.mlp_only_layers[0] = 1, c.kv_lora_rank = 8, c.q_lora_rank = i % 2 ? 0 : 12, c.qk_nope_head_dim = 6;
            c.qk_rope_head_dim = 4, c.v_head_dim = 6, c.head_dim = 10;
        }
        if (f->flags & MT_FAMILY_GEMMA_CONFIG) c.query_pre_attn_scalar = 16.0f, c.attn_logit_softcapping = 20.0f;
        if (f->flags & MT_FAMILY_LOCAL_ROPE) c.rope_local_base_freq = 5000.0f;
        if (i % 2) c.pad_token_id = (int32_t)(i % c.vocab_size); /* half the families with a padding row */
        mt_model_config v;
        char why[MT_ERRMSG_MAX];
        cr_assert_eq(mt_config_import((mt_err){why}, &v, &c), MT_OK, "%s: %s", f->display_name, why);
        char *text = mt_config_json_text(&v, NULL);
        cr_assert_not_null(text);
        cJSON *j = cJSON_Parse(text);
        cr_assert_not_null(j);
        const cJSON *a0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0);
        cr_assert_str_eq(a0->valuestring, f->architecture);
        cr_assert_str_eq(cJSON_GetObjectItem(j, "model_type")->valuestring, f->model_type);
        cr_assert_str_eq(cJSON_GetObjectItem(j, "hidden_act")->valuestring, f->hidden_act);
        cr_assert_eq(cJSON_HasObjectItem(j, "attention_bias"),
                     !(f->flags & MT_FAMILY_BIAS) && (!f->bias_key || !strcmp(f->bias_key, "attention_bias")), "%s",
                     f->display_name);
        if (f->bias_key) cr_assert(cJSON_IsBool(cJSON_GetObjectItem(j, f->bias_key)), "%s", f->display_name);
        const int use_key = f->window == MT_WINDOW_FROM_LAYER || f->window == MT_WINDOW_EVEN_BELOW;
        cr_assert_eq(cJSON_HasObjectItem(j, "use_sliding_window"), use_key, "%s", f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "layer_types"),
                     use_key || f->window == MT_WINDOW_PATTERN || (f->flags & MT_FAMILY_CHUNKED_NOPE), "%s",
                     f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "shared_expert_intermediate_size"),
                     f->shared_block != NULL && f->moe != MT_MOE_DEEPSEEK && f->moe != MT_MOE_LLAMA4, "%s",
                     f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "n_shared_experts"), f->moe == MT_MOE_DEEPSEEK, "%s", f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "kv_lora_rank"), (f->flags & MT_FAMILY_MLA) != 0, "%s", f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "partial_rotary_factor"), (f->flags & MT_FAMILY_PHI3_ROPE) != 0, "%s",
                     f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "num_local_experts"),
                     f->moe == MT_MOE_MIXTRAL || f->moe == MT_MOE_GPT_OSS || f->moe == MT_MOE_LLAMA4, "%s",
                     f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "no_rope_layers"), f->moe == MT_MOE_LLAMA4, "%s", f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "mlp_only_layers"), f->moe == MT_MOE_QWEN3, "%s", f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "query_pre_attn_scalar"), (f->flags & MT_FAMILY_GEMMA_CONFIG) != 0,
                     "%s", f->display_name);
        cr_assert_eq(cJSON_HasObjectItem(j, "rope_local_base_freq"), (f->flags & MT_FAMILY_LOCAL_ROPE) != 0, "%s",
                     f->display_name);
        /* the model's padding row or null, never left to the config class's default */
        const cJSON *pad = cJSON_GetObjectItem(j, "pad_token_id");
        cr_assert(pad && (v.pad_token_id < 0 ? cJSON_IsNull(pad) : pad->valuedouble == v.pad_token_id), "%s",
                  f->display_name);
        cJSON_Delete(j);
        char path[128];
        snprintf(path, sizeof path, "%s/config.json", tmp_dir);
        FILE *fp = fopen(path, "w");
        fputs(text, fp);
        fclose(fp);
        cJSON_free(text);
        mt_model_config back;
        mt_model_config_init(&back);
        cr_assert_eq(mt_config_load(&back, tmp_dir), MT_OK, "%s: %s", f->display_name, mt_last_errmsg());
        mt_model_config w;
        cr_assert_eq(mt_config_import((mt_err){why}, &w, &back), MT_OK, "%s", why);
        cr_assert_eq(memcmp(&v, &w, sizeof v), 0, "%s: config.json read back differs", f->display_name);
    }
}

Test(family, refusals_follow_the_descriptor)
{
    char why[MT_ERRMSG_MAX];
    mt_model_config c, v;
    for (size_t i = 0; mt_family_at(i); i++) {
        const mt_family *f = mt_family_at(i);
        c = load_minimal(f);
        c.sliding_window = 8, c.sliding_window_pattern = 2;
        const mt_status st = mt_config_import((mt_err){why}, &v, &c);
        if (f->window == MT_WINDOW_NONE || f->window == MT_WINDOW_EVERY_LAYER) {
            cr_assert_eq(st, MT_ERR_INVALID_ARGUMENT, "%s takes no pattern", f->display_name);
            cr_assert(strstr(why, f->display_name), "%s names the family", why);
        } else {
            cr_assert_eq(st, MT_OK, "%s: %s", f->display_name, why);
        }
        c = load_minimal(f);
        c.attention_bias = 1;
        cr_assert_eq(mt_config_import((mt_err){why}, &v, &c), (f->flags & MT_FAMILY_FUSED) ? MT_ERR_INVALID_ARGUMENT
                                                                                            : MT_OK,
                     "%s: %s", f->display_name, why);
        c = load_minimal(f);
        c.attn_logit_softcapping = 10.0f;
        cr_assert_eq(mt_config_import((mt_err){why}, &v, &c),
                     (f->flags & MT_FAMILY_GEMMA_CONFIG) ? MT_OK : MT_ERR_INVALID_ARGUMENT, "%s: %s", f->display_name,
                     why);
    }
    mt_model_config_init(&c);
    c.arch = largest_arch() + 1;
    cr_assert_eq(mt_config_import((mt_err){why}, &v, &c), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(why, "is not an mt_arch value"), "%s", why);
}

/* ---- the public listing -------------------------------------------------------------- */

Test(family, get_lists_the_table)
{
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        mt_family_info info;
        mt_family_info_init(&info);
        cr_assert_eq(mt_family_get(&info, i), MT_OK, "%s", mt_last_errmsg());
        const mt_family *f = mt_family_at(i);
        cr_assert_eq(info.struct_size, sizeof info);
        cr_assert_eq(info.arch, (uint32_t)f->arch);
        cr_assert_str_eq(info.name, f->name);
        cr_assert_str_eq(info.display_name, f->display_name);
        cr_assert_str_eq(info.architecture, f->architecture);
        cr_assert_str_eq(info.model_type, f->model_type);
        cr_assert_str_eq(info.layer_template, f->template_name);
        cr_assert_str_eq(info.particular, f->particular);
        cr_assert_str_eq(info.example, f->example);
    }
}

Test(family, get_refuses_a_bad_index_and_struct)
{
    mt_family_info info;
    mt_family_info_init(&info);
    cr_assert_eq(mt_family_get(&info, mt_family_count()), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "past the last family"), "%s", mt_last_errmsg());
    cr_assert_eq(mt_family_get(&info, UINT32_MAX), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_family_get(NULL, 0), MT_ERR_INVALID_ARGUMENT);
    mt_family_info_init_sized(&info, 8); /* below the first release */
    cr_assert_eq(mt_family_get(&info, 0), MT_ERR_STRUCT_SIZE);
    cr_assert(strstr(mt_last_errmsg(), "mt_family_info.struct_size is 8"), "%s", mt_last_errmsg());
    /* a newer caller's larger struct: the fields this library knows, the rest untouched */
    struct {
        mt_family_info info;
        uint64_t later;
    } big;
    memset(&big, 0xab, sizeof big);
    mt_family_info_init_sized(&big.info, sizeof big);
    big.later = 7;
    cr_assert_eq(mt_family_get(&big.info, 0), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(big.info.struct_size, sizeof big);
    cr_assert_str_eq(big.info.name, "llama");
    cr_assert_eq(big.later, 7);
    cr_assert_str_eq(mt_last_errmsg(), "");
}

Test(family, example_is_a_valid_config_of_its_family)
{
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        const mt_family *f = mt_family_at(i);
        mt_model_config c;
        mt_model_config_init(&c);
        c.precision = MT_PRECISION_FP32, c.seed = 5;
        cr_assert_eq(mt_family_example(&c, (uint32_t)f->arch), MT_OK, "%s", mt_last_errmsg());
        cr_assert_eq(c.arch, (uint32_t)f->arch);
        cr_assert_eq(c.precision, MT_PRECISION_FP32, "the caller's precision stays");
        cr_assert_eq(c.seed, 5);
        cr_assert_eq(c.hidden_size, f->example_shape.hidden);
        mt_model_config v;
        char why[MT_ERRMSG_MAX];
        cr_assert_eq(mt_config_import((mt_err){why}, &v, &c), MT_OK, "%s: %s", f->display_name, why);
    }
    /* Llama-3.1-8B has 8.03 B parameters */
    mt_model_config c;
    mt_model_config_init(&c);
    cr_assert_eq(mt_family_example(&c, MT_ARCH_LLAMA), MT_OK);
    mt_model_config v;
    cr_assert_eq(mt_config_import((mt_err){0}, &v, &c), MT_OK);
    cr_assert_eq(mt_layout_count_params(&v), 8030261248ull);
}

Test(family, example_refuses_bad_arguments)
{
    mt_model_config c;
    mt_model_config_init(&c);
    cr_assert_eq(mt_family_example(NULL, MT_ARCH_LLAMA), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_family_example(&c, largest_arch() + 1), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "is not an mt_arch value"), "%s", mt_last_errmsg());
    mt_model_config_init_sized(&c, 8);
    cr_assert_eq(mt_family_example(&c, MT_ARCH_LLAMA), MT_ERR_STRUCT_SIZE);
    /* a 0.1 caller's struct: a dense example fits it, one with experts does not */
    mt_model_config_init_sized(&c, MT_FIRST_SIZE_MODEL_CONFIG);
    cr_assert_eq(mt_family_example(&c, MT_ARCH_LLAMA), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(c.struct_size, MT_FIRST_SIZE_MODEL_CONFIG);
    cr_assert_eq(mt_family_example(&c, MT_ARCH_MIXTRAL), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "Mixtral"), "%s", mt_last_errmsg());
}
