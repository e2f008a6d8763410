#define _GNU_SOURCE
/* Hugging Face model folders: config.json parsing and writing, safetensors
 * save/load round trips, hand-written files in every dtype, shards, and the
 * refusals (each leaving the model as it was). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bf16.h"
#include "engine/model.h"
#include "io/safetensors.h"
#include "model/rope.h"

/* ---- a temporary directory per test ------------------------------------------ */

static char tmp_dir[64];

static void make_tmp_dir(void)
{
    strcpy(tmp_dir, "/tmp/mt_hf_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp failed");
}

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            struct stat sb;
            if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) remove_tree(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

static void remove_tmp_dir(void)
{
    if (!tmp_dir[0]) return;
    remove_tree(tmp_dir);
    tmp_dir[0] = '\0';
}

TestSuite(hf, .init = make_tmp_dir, .fini = remove_tmp_dir);

/* "<tmp>/<name>" in a caller's buffer of 512 bytes. */
static const char *tmp_path(char *buf, const char *name)
{
    snprintf(buf, 512, "%s/%s", tmp_dir, name);
    return buf;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_file(p, text, strlen(text));
}

/* ---- models ---------------------------------------------------------------------- */

static mt_model_config llama_gqa(int precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 100;
    c.hidden_size = 32;
    c.intermediate_size = 72;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 256;
    c.precision = (uint32_t)precision;
    c.initializer_range = 0.5f; /* values spread over many exponents */
    c.seed = 7;
    return c;
}

static mt_model_config qwen_tied(int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = MT_ARCH_QWEN2;
    c.attention_bias = 1;
    c.tie_word_embeddings = 1;
    c.rope_theta = 1000000.0f;
    c.rms_norm_eps = 1e-6f;
    return c;
}

static mt_model_config qwen3(int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = MT_ARCH_QWEN3;
    c.head_dim = 16; /* Qwen3 sets it explicitly, != hidden / heads */
    c.rope_theta = 1000000.0f;
    c.rms_norm_eps = 1e-6f;
    return c;
}

static mt_model *make(const mt_model_config *c)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = 1;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

/* A copy of every tile, to check that a failed call changed nothing. */
typedef struct snapshot {
    int n;
    unsigned char **bytes;
    uint64_t step;
} snapshot;

static snapshot take(const mt_model *m)
{
    snapshot s = {m->tiles.n, calloc((size_t)m->tiles.n, sizeof(unsigned char *)), m->step};
    for (int u = 0; u < s.n; u++) {
        s.bytes[u] = malloc(m->tiles.tile[u].bytes);
        memcpy(s.bytes[u], m->tiles.tile[u].base, m->tiles.tile[u].bytes);
    }
    return s;
}

static void assert_unchanged(const mt_model *m, snapshot *s, const char *what)
{
    for (int u = 0; u < s->n; u++)
        cr_assert_eq(memcmp(s->bytes[u], m->tiles.tile[u].base, m->tiles.tile[u].bytes), 0,
                     "%s: tile %d changed by a failed load", what, u);
    cr_assert_eq(m->step, s->step, "%s: step changed", what);
}

static void drop(snapshot *s)
{
    for (int u = 0; u < s->n; u++) free(s->bytes[u]);
    free(s->bytes);
}

/* Puts recognisable values in the optimizer state and step counter, which a
 * successful load resets. */
static void dirty_optimizer(mt_model *m)
{
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        float *mm = mt_tile_m(&m->tiles.tile[u], d), *vv = mt_tile_v(&m->tiles.tile[u], d);
        for (uint64_t i = 0; i < d->numel; i++) mm[i] = vv[i] = 0.25f;
    }
    m->step = 5;
}

static void assert_optimizer_reset(const mt_model *m)
{
    cr_assert_eq(m->step, 0);
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        const float *mm = mt_tile_m(&m->tiles.tile[u], d), *vv = mt_tile_v(&m->tiles.tile[u], d);
        for (uint64_t i = 0; i < d->padded; i++) cr_assert(mm[i] == 0.0f && vv[i] == 0.0f, "unit %d m/v zeroed", u);
    }
}

static void round_trip(mt_model_config c)
{
    mt_model *a = make(&c);
    char dir[512];
    tmp_path(dir, "out/nested"); /* created with its parent */
    cr_assert_eq(mt_model_save(a, dir), MT_OK, "%s", mt_model_errmsg(a));

    mt_model_config c2 = c;
    c2.seed = 12345;
    mt_model *b = make(&c2);
    dirty_optimizer(b);
    cr_assert_eq(mt_model_load(b, dir), MT_OK, "%s", mt_model_errmsg(b));
    cr_assert_str_eq(mt_model_errmsg(b), "");
    assert_optimizer_reset(b);
    const int fp32 = c.precision == MT_PRECISION_FP32;
    for (int u = 0; u < a->layout.n_units; u++) {
        const mt_unit_desc *d = &a->layout.units[u];
        const float *ma = mt_tile_master(&a->tiles.tile[u], d), *mb = mt_tile_master(&b->tiles.tile[u], d);
        const uint16_t *wa = mt_tile_weights_bf16(&a->tiles.tile[u], d), *wb = mt_tile_weights_bf16(&b->tiles.tile[u], d);
        cr_assert_eq(wa == NULL, fp32);
        cr_assert_eq(wb == NULL, fp32);
        for (int t = 0; t < d->n_tensors; t++) {
            const mt_tensor_desc *td = &d->tensors[t];
            for (uint64_t i = td->offset; i < td->offset + td->numel; i++) {
                if (fp32) {
                    cr_assert_eq(memcmp(&ma[i], &mb[i], 4), 0, "%s[%llu]", td->name,
                                 (unsigned long long)(i - td->offset));
                } else {
                    cr_assert_eq(wa[i], wb[i], "%s[%llu] bf16 copy", td->name, (unsigned long long)(i - td->offset));
                    float want = mt_bf16_to_f32(wa[i]);
                    cr_assert_eq(memcmp(&want, &mb[i], 4), 0, "%s[%llu] master is the bf16 value", td->name,
                                 (unsigned long long)(i - td->offset));
                }
            }
        }
    }

    /* the file is what the format says: header length, alignment, size */
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    FILE *f = fopen(p, "rb");
    unsigned char len8[8];
    cr_assert_eq(fread(len8, 1, 8, f), 8);
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
    cr_assert_eq((8 + hlen) % 8, 0, "data starts 8-byte aligned");
    uint64_t data = 0; /* every tensor in the model's dtype, but frozen buffers in fp32 (DeepSeek-V3's) */
    for (int u = 0; u < a->layout.n_units; u++)
        for (int t = 0; t < a->layout.units[u].n_tensors; t++) {
            const mt_tensor_desc *td = &a->layout.units[u].tensors[t];
            data += td->numel * (fp32 || mt_role_is_frozen(td->role) ? 4 : 2);
        }
    cr_assert_eq((uint64_t)sb.st_size, 8 + hlen + data);
    snprintf(p, sizeof p, "%s/model.safetensors.tmp", dir);
    cr_assert_neq(access(p, F_OK), 0, "no temporary file left");
    snprintf(p, sizeof p, "%s/config.json.tmp", dir);
    cr_assert_neq(access(p, F_OK), 0, "no temporary file left");

    /* saving again over the existing files works */
    cr_assert_eq(mt_model_save(b, dir), MT_OK, "%s", mt_model_errmsg(b));
    mt_model_destroy(a);
    mt_model_destroy(b);
}

Test(hf, round_trip_llama_gqa_fp32) { round_trip(llama_gqa(MT_PRECISION_FP32)); }
Test(hf, round_trip_llama_gqa_bf16) { round_trip(llama_gqa(MT_PRECISION_BF16)); }
Test(hf, round_trip_qwen2_bias_tied_bf16) { round_trip(qwen_tied(MT_PRECISION_BF16)); }
Test(hf, round_trip_qwen2_bias_tied_fp32) { round_trip(qwen_tied(MT_PRECISION_FP32)); }
Test(hf, round_trip_qwen3_bf16) { round_trip(qwen3(MT_PRECISION_BF16)); }

static mt_model_config phi3(int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = MT_ARCH_PHI3;
    c.sliding_window = 24;
    return c;
}

static mt_model_config gemma(mt_arch arch, int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = arch;
    c.num_hidden_layers = 3;
    c.head_dim = 16;
    c.tie_word_embeddings = 1;
    c.query_pre_attn_scalar = 24.0f;
    c.sliding_window = 16, c.sliding_window_pattern = 3;
    if (arch == MT_ARCH_GEMMA2) {
        c.attn_logit_softcapping = 50.0f, c.final_logit_softcapping = 30.0f;
    } else {
        c.rope_theta = 1e6f, c.rope_local_base_freq = 10000.0f;
        c.rope_scaling = MT_ROPE_SCALING_LINEAR, c.rope_factor = 8.0f;
    }
    return c;
}

Test(hf, round_trip_gemma2_bf16) { round_trip(gemma(MT_ARCH_GEMMA2, MT_PRECISION_BF16)); }
Test(hf, round_trip_gemma3_fp32) { round_trip(gemma(MT_ARCH_GEMMA3, MT_PRECISION_FP32)); }

Test(hf, round_trip_phi3_bf16) { round_trip(phi3(MT_PRECISION_BF16)); }
Test(hf, round_trip_phi3_fp32) { round_trip(phi3(MT_PRECISION_FP32)); }

/* Phi-3's folder holds q, k, v as one qkv_proj and gate, up as one gate_up_proj, in that row order,
 * as transformers' Phi3 splits them */
Test(hf, phi3_folder_fuses_qkv_and_gate_up)
{
    mt_model_config c = phi3(MT_PRECISION_FP32);
    mt_model *m = make(&c);
    char dir[512];
    tmp_path(dir, "phi3");
    cr_assert_eq(mt_model_save(m, dir), MT_OK, "%s", mt_model_errmsg(m));
    mt_st_set s = {0};
    mt_err err = mt_err_thread();
    cr_assert_eq(mt_st_open_dir(err, &s, dir), MT_OK);
    cr_assert_eq(mt_st_index(err, &s), MT_OK);
    const uint32_t C = c.hidden_size, D = C / c.num_attention_heads, Q = c.num_attention_heads * D,
                   KV = c.num_key_value_heads * D, F = c.intermediate_size;
    const mt_st_tensor *qkv = mt_st_find(&s, "model.layers.1.self_attn.qkv_proj.weight");
    const mt_st_tensor *gu = mt_st_find(&s, "model.layers.1.mlp.gate_up_proj.weight");
    cr_assert(qkv && gu);
    cr_assert(qkv->ndim == 2 && qkv->dims[0] == Q + 2 * KV && qkv->dims[1] == C);
    cr_assert(gu->ndim == 2 && gu->dims[0] == 2 * F && gu->dims[1] == C);
    cr_assert_null(mt_st_find(&s, "model.layers.1.self_attn.k_proj.weight"));
    cr_assert_null(mt_st_find(&s, "model.layers.1.mlp.up_proj.weight"));
    /* the rows of k start after q's, up's after gate's */
    const mt_unit_desc *u = &m->layout.units[2];
    const float *master = mt_tile_master(&m->tiles.tile[2], u);
    for (int i = 0; i < u->n_tensors; i++) {
        const mt_tensor_desc *t = &u->tensors[i];
        const mt_st_tensor *f = t->role == MT_T_K ? qkv : t->role == MT_T_UP ? gu : NULL;
        if (!f) continue;
        const uint64_t row0 = t->role == MT_T_K ? Q : F;
        cr_assert_eq(memcmp((const float *)f->data + row0 * C, master + t->offset, t->numel * 4), 0, "%s", t->name);
    }
    mt_st_free(&s);
    mt_model_destroy(m);
}

/* An embedding of 1.28 M elements: several write chunks and conversion tasks. */
Test(hf, round_trip_large_tensor)
{
    mt_model_config c = llama_gqa(MT_PRECISION_BF16);
    c.vocab_size = 40000;
    c.num_hidden_layers = 1;
    c.tie_word_embeddings = 1;
    round_trip(c);
    c.precision = MT_PRECISION_FP32;
    round_trip(c);
}

static void assert_same_config(const mt_model_config *a, const mt_model_config *b)
{
    cr_assert_eq(a->arch, b->arch);
    cr_assert_eq(a->vocab_size, b->vocab_size);
    cr_assert_eq(a->hidden_size, b->hidden_size);
    cr_assert_eq(a->intermediate_size, b->intermediate_size);
    cr_assert_eq(a->num_hidden_layers, b->num_hidden_layers);
    cr_assert_eq(a->num_attention_heads, b->num_attention_heads);
    cr_assert_eq(a->num_key_value_heads, b->num_key_value_heads);
    cr_assert_eq(a->head_dim, b->head_dim);
    cr_assert_eq(a->max_position_embeddings, b->max_position_embeddings);
    cr_assert_eq(a->pad_token_id, b->pad_token_id);
    cr_assert_eq(a->rms_norm_eps, b->rms_norm_eps);
    cr_assert_eq(a->rope_theta, b->rope_theta);
    cr_assert_eq(a->rope_scaling, b->rope_scaling);
    if (a->rope_scaling) {
        cr_assert_eq(a->rope_factor, b->rope_factor);
        cr_assert_eq(a->rope_low_freq_factor, b->rope_low_freq_factor);
        cr_assert_eq(a->rope_high_freq_factor, b->rope_high_freq_factor);
        cr_assert_eq(a->rope_original_max_position, b->rope_original_max_position);
    }
    cr_assert_eq(a->attention_bias, b->attention_bias);
    cr_assert_eq(a->tie_word_embeddings, b->tie_word_embeddings);
    cr_assert_eq(a->precision, b->precision);
    cr_assert_eq(a->seed, b->seed);
    cr_assert_eq(a->initializer_range, b->initializer_range);
    cr_assert_eq(a->sliding_window, b->sliding_window);
    cr_assert_eq(a->sliding_window_pattern, b->sliding_window_pattern);
    cr_assert_eq(a->max_window_layers, b->max_window_layers);
    cr_assert_eq(a->query_pre_attn_scalar, b->query_pre_attn_scalar);
    cr_assert_eq(a->rope_local_base_freq, b->rope_local_base_freq);
    cr_assert_eq(a->attn_logit_softcapping, b->attn_logit_softcapping);
    cr_assert_eq(a->final_logit_softcapping, b->final_logit_softcapping);
    cr_assert_eq(a->num_experts, b->num_experts);
    cr_assert_eq(a->num_experts_per_tok, b->num_experts_per_tok);
    cr_assert_eq(a->moe_intermediate_size, b->moe_intermediate_size);
    cr_assert_eq(a->norm_topk_prob, b->norm_topk_prob);
    cr_assert_eq(a->decoder_sparse_step ? a->decoder_sparse_step : 1, b->decoder_sparse_step ? b->decoder_sparse_step : 1);
    cr_assert_eq(a->output_router_logits, b->output_router_logits);
    cr_assert_eq(a->router_aux_loss_coef, b->router_aux_loss_coef);
    cr_assert_eq(memcmp(a->mlp_only_layers, b->mlp_only_layers, sizeof a->mlp_only_layers), 0);
    cr_assert_eq(a->kv_lora_rank, b->kv_lora_rank);
    cr_assert_eq(a->q_lora_rank, b->q_lora_rank);
    cr_assert_eq(a->qk_nope_head_dim, b->qk_nope_head_dim);
    cr_assert_eq(a->qk_rope_head_dim, b->qk_rope_head_dim);
    cr_assert_eq(a->v_head_dim, b->v_head_dim);
    cr_assert_eq(a->rope_interleave, b->rope_interleave);
    cr_assert_eq(a->n_group > 1 ? a->n_group : 0, b->n_group > 1 ? b->n_group : 0);
    cr_assert_eq(a->n_group > 1 ? a->topk_group : 0, b->n_group > 1 ? b->topk_group : 0);
    cr_assert_eq(a->routed_scaling_factor != 0.0f ? a->routed_scaling_factor : 1.0f,
                 b->routed_scaling_factor != 0.0f ? b->routed_scaling_factor : 1.0f);
    cr_assert_eq(a->moe_scoring, b->moe_scoring);
}

Test(hf, config_round_trip)
{
    mt_model_config cases[9] = {llama_gqa(MT_PRECISION_FP32), qwen_tied(MT_PRECISION_BF16),
                                llama_gqa(MT_PRECISION_BF16), qwen3(MT_PRECISION_FP32),
                                llama_gqa(MT_PRECISION_BF16), qwen_tied(MT_PRECISION_BF16),
                                qwen3(MT_PRECISION_BF16),     gemma(MT_ARCH_GEMMA2, MT_PRECISION_BF16),
                                gemma(MT_ARCH_GEMMA3, MT_PRECISION_BF16)};
    /* sliding windows: Mistral's every layer, Qwen2's from a layer on, one in 2 full */
    cases[4].arch = MT_ARCH_MISTRAL, cases[4].sliding_window = 48;
    cases[5].sliding_window = 32, cases[5].max_window_layers = 1;
    cases[6].sliding_window = 16, cases[6].sliding_window_pattern = 2;
    cases[2].rope_scaling = MT_ROPE_SCALING_LLAMA3;
    cases[2].rope_factor = 32.0f;
    cases[2].rope_low_freq_factor = 1.0f;
    cases[2].rope_high_freq_factor = 4.0f;
    cases[2].rope_original_max_position = 8192;
    cases[2].rope_theta = 500000.0f;
    cases[2].arch = MT_ARCH_MISTRAL;
    cases[2].head_dim = 16; /* != hidden / heads */
    cases[8].attn_logit_softcapping = 20.0f; /* a Gemma 3 may cap too */
    cases[7].pad_token_id = 0;                             /* Gemma's */
    cases[1].pad_token_id = (int32_t)cases[1].vocab_size - 1; /* the last row */
    for (int k = 0; k < 9; k++) {
        mt_model *m = make(&cases[k]);
        char dir[512], name[32];
        snprintf(name, sizeof name, "cfg%d", k);
        cr_assert_eq(mt_model_save(m, tmp_path(dir, name)), MT_OK, "%s", mt_model_errmsg(m));
        mt_model_config got;
        mt_model_config_init(&got);
        got.precision = cases[k].precision;
        got.seed = cases[k].seed;
        got.initializer_range = cases[k].initializer_range;
        cr_assert_eq(mt_config_load(&got, dir), MT_OK, "%s", mt_last_errmsg());
        cr_assert_str_eq(mt_last_errmsg(), "");
        assert_same_config(&m->cfg, &got);
        mt_model_destroy(m);
    }
}

Test(hf, config_load_keeps_callers_training_fields)
{
    char dir[512];
    tmp_path(dir, "");
    write_text(dir, "config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
               "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"max_position_embeddings\":128,\"rms_norm_eps\":1e-05,\"torch_dtype\":\"bfloat16\"}");
    mt_model_config c;
    mt_model_config_init(&c);
    c.precision = MT_PRECISION_FP32;
    c.seed = 99;
    c.initializer_range = 0.01f;
    c.rope_theta = 3.0f;
    c.attention_bias = 1;
    cr_assert_eq(mt_config_load(&c, dir), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(c.precision, MT_PRECISION_FP32);
    cr_assert_eq(c.seed, 99);
    cr_assert_eq(c.initializer_range, 0.01f);
    cr_assert_eq(c.num_key_value_heads, 4, "defaults to num_attention_heads");
    cr_assert_eq(c.rope_theta, 10000.0f, "defaults to 10000");
    cr_assert_eq(c.attention_bias, 0);
    cr_assert_eq(c.tie_word_embeddings, 0);
    cr_assert_eq(c.rms_norm_eps, 1e-5f);
    cr_assert_eq(c.struct_size, sizeof c);
}

/* The parameters of a config as mt_config_load returns it (head_dim 0 there means hidden / heads) */
static uint64_t params_of(const mt_model_config *c)
{
    mt_model_config v;
    char why[MT_ERRMSG_MAX];
    cr_assert_eq(mt_config_import((mt_err){why}, &v, c), MT_OK, "%s", why);
    return mt_layout_count_params(&v);
}

/* config.json of text in dir, loaded into a fresh default config (which must succeed) */
static mt_model_config load_text(const char *dir, const char *json)
{
    write_text(dir, "config.json", json);
    mt_model_config c;
    mt_model_config_init(&c);
    cr_assert_eq(mt_config_load(&c, dir), MT_OK, "%s", mt_last_errmsg());
    return c;
}

Test(hf, config_load_real_world_shapes)
{
    char dir[512];
    tmp_path(dir, "");
    /* Qwen2.5-0.5B's config.json */
    write_text(dir, "config.json",
               "{\n  \"architectures\": [\"Qwen2ForCausalLM\"],\n  \"attention_dropout\": 0.0,\n"
               "  \"bos_token_id\": 151643,\n  \"eos_token_id\": 151643,\n  \"hidden_act\": \"silu\",\n"
               "  \"hidden_size\": 896,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": 4864,\n"
               "  \"max_position_embeddings\": 32768,\n  \"max_window_layers\": 24,\n"
               "  \"model_type\": \"qwen2\",\n  \"num_attention_heads\": 14,\n  \"num_hidden_layers\": 24,\n"
               "  \"num_key_value_heads\": 2,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": 1000000.0,\n"
               "  \"sliding_window\": 32768,\n  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"bfloat16\",\n"
               "  \"transformers_version\": \"4.40.1\",\n  \"use_cache\": true,\n  \"use_sliding_window\": false,\n"
               "  \"vocab_size\": 151936\n}\n");
    mt_model_config c;
    mt_model_config_init(&c);
    cr_assert_eq(mt_config_load(&c, dir), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(c.arch, MT_ARCH_QWEN2);
    cr_assert_eq(c.attention_bias, 1);
    cr_assert_eq(c.tie_word_embeddings, 1);
    cr_assert_eq(c.num_key_value_heads, 2);
    cr_assert_eq(c.vocab_size, 151936);
    cr_assert_eq(c.rope_theta, 1e6f);
    cr_assert_eq(c.rms_norm_eps, 1e-6f);

    /* Llama 3.2 1B's config.json, llama3 rope scaling */
    c = load_text(dir,
                  "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                  "\"bos_token_id\":128000,\"eos_token_id\":128001,\"head_dim\":64,\"hidden_act\":\"silu\","
                  "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":8192,"
                  "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
                  "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,"
                  "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,"
                  "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
                  "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":true,"
                  "\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"vocab_size\":128256}");
    cr_assert_eq(c.arch, MT_ARCH_LLAMA);
    cr_assert_eq(c.rope_scaling, MT_ROPE_SCALING_LLAMA3);
    cr_assert_eq(c.rope_factor, 32.0f);
    cr_assert_eq(c.rope_original_max_position, 8192);
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.num_key_value_heads, 8);

    /* transformers 5 writes rope_parameters instead of rope_theta and rope_scaling */
    c = load_text(dir,
                  "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                  "\"max_position_embeddings\":64,\"num_attention_heads\":4,\"num_hidden_layers\":2,"
                  "\"num_key_value_heads\":2,\"rope_parameters\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
                  "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":16,\"rope_theta\":500000.0,"
                  "\"rope_type\":\"llama3\"},\"vocab_size\":96}");
    cr_assert_eq(c.rope_theta, 500000.0f, "rope_theta from rope_parameters");
    cr_assert_eq(c.rope_scaling, MT_ROPE_SCALING_LLAMA3);
    cr_assert_eq(c.rope_factor, 8.0f);
    cr_assert_eq(c.rope_original_max_position, 16);
    c = load_text(dir,
                  "{\"model_type\":\"qwen2\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":64,"
                  "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"max_position_embeddings\":128,"
                  "\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":\"default\"}}");
    cr_assert_eq(c.rope_theta, 1e6f);
    cr_assert_eq(c.rope_scaling, MT_ROPE_SCALING_NONE);

    /* Qwen3-8B's config.json: q/k norms, explicit head_dim, no biases */
    c = load_text(dir,
                  "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                  "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\","
                  "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":12288,"
                  "\"max_position_embeddings\":40960,\"max_window_layers\":36,\"model_type\":\"qwen3\","
                  "\"num_attention_heads\":32,\"num_hidden_layers\":36,\"num_key_value_heads\":8,"
                  "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"
                  "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\","
                  "\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}");
    cr_assert_eq(c.arch, MT_ARCH_QWEN3);
    cr_assert_eq(c.attention_bias, 0);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.num_key_value_heads, 8);
    cr_assert_eq(c.intermediate_size, 12288);
    /* 8.19 B parameters, as Qwen3-8B's model card says: the norms of q and k are 2 x 128 a layer */
    cr_assert_eq(params_of(&c), 8190735360ull);

    /* Mistral-7B-v0.1's config.json: every layer slides over 4096 tokens */
    c = load_text(dir,
                  "{\"architectures\":[\"MistralForCausalLM\"],\"bos_token_id\":1,\"eos_token_id\":2,"
                  "\"hidden_act\":\"silu\",\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,"
                  "\"max_position_embeddings\":32768,\"model_type\":\"mistral\",\"num_attention_heads\":32,"
                  "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,"
                  "\"sliding_window\":4096,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
                  "\"transformers_version\":\"4.34.0.dev0\",\"use_cache\":true,\"vocab_size\":32000}");
    cr_assert_eq(c.arch, MT_ARCH_MISTRAL);
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_eq(c.max_window_layers, 0);
    cr_assert_eq(c.sliding_window_pattern, 0);
    for (int l = 0; l < 32; l++) cr_assert(mt_config_layer_slides(&c, l), "layer %d slides", l);
    cr_assert_eq(mt_config_layer_window(&c, 5, 4096), 0, "a window as long as the sequence masks nothing");
    cr_assert_eq(mt_config_layer_window(&c, 5, 4097), 4096);

    /* Qwen2 with use_sliding_window: the layers from max_window_layers on slide */
    c = load_text(dir,
                  "{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                  "\"intermediate_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
                  "\"max_position_embeddings\":128,\"use_sliding_window\":true,\"sliding_window\":16,"
                  "\"max_window_layers\":3}");
    cr_assert_eq(c.sliding_window, 16);
    cr_assert_eq(c.max_window_layers, 3);
    cr_assert(!mt_config_layer_slides(&c, 2) && mt_config_layer_slides(&c, 3));
    /* ... and without max_window_layers transformers' default, 28: none of 4 layers slides */
    c = load_text(dir,
                  "{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                  "\"intermediate_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
                  "\"max_position_embeddings\":128,\"use_sliding_window\":true,\"sliding_window\":16}");
    cr_assert_eq(c.sliding_window, 0);
    /* layer_types decide: sliding and full in turn (one in 2 full, as Gemma 2) */
    c = load_text(dir,
                  "{\"architectures\":[\"Qwen3ForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                  "\"intermediate_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
                  "\"max_position_embeddings\":128,\"use_sliding_window\":true,\"sliding_window\":16,"
                  "\"max_window_layers\":28,\"layer_types\":[\"sliding_attention\",\"full_attention\","
                  "\"sliding_attention\",\"full_attention\"]}");
    cr_assert_eq(c.sliding_window, 16);
    cr_assert_eq(c.sliding_window_pattern, 2);
    cr_assert_eq(c.max_window_layers, 0);
    for (int l = 0; l < 4; l++) cr_assert_eq(mt_config_layer_slides(&c, l), l % 2 == 0, "layer %d", l);
    /* a caller built against 0.1's header (96 bytes) cannot hold the window: refused, not dropped */
    union {
        mt_model_config c;
        unsigned char bytes[sizeof(mt_model_config)];
    } old;
    memset(&old, 0, sizeof old); /* the bytes past 96 too: the library must not write there either */
    mt_model_config_init_sized(&old.c, 96);
    const mt_model_config before = old.c;
    cr_assert_eq(mt_config_load(&old.c, dir), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "the sliding window"), "%s", mt_last_errmsg());
    cr_assert_eq(memcmp(&old.c, &before, sizeof before), 0);

    /* Phi-3-mini-4k-instruct's config.json: a window of 2047 on every layer */
    c = load_text(dir,
                  "{\"architectures\":[\"Phi3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                  "\"bos_token_id\":1,\"embd_pdrop\":0.0,\"eos_token_id\":32000,\"hidden_act\":\"silu\","
                  "\"hidden_size\":3072,\"initializer_range\":0.02,\"intermediate_size\":8192,"
                  "\"max_position_embeddings\":4096,\"model_type\":\"phi3\",\"num_attention_heads\":32,"
                  "\"num_hidden_layers\":32,\"num_key_value_heads\":32,\"original_max_position_embeddings\":4096,"
                  "\"pad_token_id\":32000,\"resid_pdrop\":0.0,\"rms_norm_eps\":1e-05,\"rope_scaling\":null,"
                  "\"rope_theta\":10000.0,\"sliding_window\":2047,\"tie_word_embeddings\":false,"
                  "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.40.2\",\"use_cache\":true,"
                  "\"vocab_size\":32064}");
    cr_assert_eq(c.arch, MT_ARCH_PHI3);
    cr_assert_eq(c.sliding_window, 2047);
    cr_assert(mt_config_layer_slides(&c, 0) && mt_config_layer_slides(&c, 31));
    cr_assert_eq(params_of(&c), 3821079552ull, "3.82 B, as the model card says");
    /* Phi-4's: grouped-query attention, no window, theta 250000 (14.7 B) */
    c = load_text(dir,
                  "{\"architectures\":[\"Phi3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                  "\"bos_token_id\":100257,\"embd_pdrop\":0.0,\"eos_token_id\":100265,\"hidden_act\":\"silu\","
                  "\"hidden_size\":5120,\"initializer_range\":0.02,\"intermediate_size\":17920,"
                  "\"max_position_embeddings\":16384,\"model_type\":\"phi3\",\"num_attention_heads\":40,"
                  "\"num_hidden_layers\":40,\"num_key_value_heads\":10,\"original_max_position_embeddings\":16384,"
                  "\"pad_token_id\":100349,\"partial_rotary_factor\":1.0,\"resid_pdrop\":0.0,\"rms_norm_eps\":1e-05,"
                  "\"rope_scaling\":null,\"rope_theta\":250000,\"sliding_window\":null,\"tie_word_embeddings\":false,"
                  "\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"vocab_size\":100352}");
    cr_assert_eq(c.arch, MT_ARCH_PHI3);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_eq(c.rope_theta, 250000.0f);
    cr_assert_eq(params_of(&c), 14659507200ull);

    /* Gemma 2 2B's config.json: soft-caps, every other layer sliding over 4096 (transformers 4 wrote
     * no pattern), tied embeddings by default, hidden_act beside hidden_activation */
    c = load_text(dir,
                  "{\"architectures\":[\"Gemma2ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                  "\"attn_logit_softcapping\":50.0,\"bos_token_id\":2,\"cache_implementation\":\"hybrid\","
                  "\"eos_token_id\":1,\"final_logit_softcapping\":30.0,\"head_dim\":256,"
                  "\"hidden_act\":\"gelu_pytorch_tanh\",\"hidden_activation\":\"gelu_pytorch_tanh\","
                  "\"hidden_size\":2304,\"initializer_range\":0.02,\"intermediate_size\":9216,"
                  "\"max_position_embeddings\":8192,\"model_type\":\"gemma2\",\"num_attention_heads\":8,"
                  "\"num_hidden_layers\":26,\"num_key_value_heads\":4,\"pad_token_id\":0,"
                  "\"query_pre_attn_scalar\":256,\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,"
                  "\"sliding_window\":4096,\"torch_dtype\":\"float32\",\"transformers_version\":\"4.42.4\","
                  "\"use_cache\":true,\"vocab_size\":256000}");
    cr_assert_eq(c.arch, MT_ARCH_GEMMA2);
    cr_assert_eq(c.tie_word_embeddings, 1);
    cr_assert_eq(c.attn_logit_softcapping, 50.0f);
    cr_assert_eq(c.final_logit_softcapping, 30.0f);
    cr_assert_eq(c.query_pre_attn_scalar, 256.0f);
    cr_assert_eq(c.rope_local_base_freq, 0.0f);
    cr_assert_eq(c.sliding_window, 4096);
    for (int l = 0; l < 26; l++) cr_assert_eq(mt_config_layer_slides(&c, l), l % 2 == 0, "layer %d", l);
    cr_assert_eq(params_of(&c), 2614341888ull, "2.61 B, as the model card says");
    /* ... and without the caps transformers' defaults, 50 and 30; null: none */
    c = load_text(dir, "{\"architectures\":[\"Gemma2ForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                       "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                       "\"max_position_embeddings\":128,\"final_logit_softcapping\":null}");
    cr_assert_eq(c.attn_logit_softcapping, 50.0f);
    cr_assert_eq(c.final_logit_softcapping, 0.0f);

    /* Gemma 3 1B's: q/k norms, 5 of 6 layers sliding over 512 with their own RoPE base, no caps */
    c = load_text(dir,
                  "{\"architectures\":[\"Gemma3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
                  "\"attn_logit_softcapping\":null,\"bos_token_id\":2,\"cache_implementation\":\"hybrid\","
                  "\"eos_token_id\":1,\"final_logit_softcapping\":null,\"head_dim\":256,"
                  "\"hidden_activation\":\"gelu_pytorch_tanh\",\"hidden_size\":1152,\"initializer_range\":0.02,"
                  "\"intermediate_size\":6912,\"max_position_embeddings\":32768,\"model_type\":\"gemma3_text\","
                  "\"num_attention_heads\":4,\"num_hidden_layers\":26,\"num_key_value_heads\":1,"
                  "\"pad_token_id\":0,\"query_pre_attn_scalar\":256,\"rms_norm_eps\":1e-06,"
                  "\"rope_local_base_freq\":10000,\"rope_scaling\":null,\"rope_theta\":1000000,"
                  "\"sliding_window\":512,\"sliding_window_pattern\":6,\"torch_dtype\":\"bfloat16\","
                  "\"transformers_version\":\"4.50.0.dev0\",\"use_cache\":true,\"vocab_size\":262144}");
    cr_assert_eq(c.arch, MT_ARCH_GEMMA3);
    cr_assert_eq(c.attn_logit_softcapping, 0.0f);
    cr_assert_eq(c.final_logit_softcapping, 0.0f);
    cr_assert_eq(c.rope_theta, 1e6f);
    cr_assert_eq(c.rope_local_base_freq, 10000.0f);
    cr_assert_eq(c.sliding_window, 512);
    for (int l = 0; l < 26; l++) {
        cr_assert_eq(mt_config_layer_slides(&c, l), (l + 1) % 6 != 0, "layer %d", l);
        cr_assert_eq(mt_config_layer_local_rope(&c, l), (l + 1) % 6 != 0, "layer %d", l);
    }
    cr_assert_eq(params_of(&c), 999885952ull, "1 B: 26 layers of 26.8 M and a 302 M embedding");
    /* Gemma 3 27B's RoPE: linear x8 on the full layers, as transformers 4 and 5 write it */
    static const char *const g3_rope[] = {
        "\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,"
        "\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"}",
        "\"rope_parameters\":{\"full_attention\":{\"factor\":8.0,\"rope_theta\":1000000.0,\"rope_type\":\"linear\"},"
        "\"sliding_attention\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"}}",
    };
    for (int i = 0; i < 2; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"architectures\":[\"Gemma3ForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                 "\"intermediate_size\":64,\"num_hidden_layers\":12,\"num_attention_heads\":4,"
                 "\"max_position_embeddings\":128,\"head_dim\":8,\"sliding_window\":16,%s}",
                 g3_rope[i]);
        c = load_text(dir, json);
        cr_assert_eq(c.rope_scaling, MT_ROPE_SCALING_LINEAR, "form %d", i);
        cr_assert_eq(c.rope_factor, 8.0f, "form %d", i);
        cr_assert_eq(c.rope_theta, 1e6f, "form %d", i);
        cr_assert_eq(c.rope_local_base_freq, 10000.0f, "form %d", i);
        cr_assert_eq(c.sliding_window_pattern, 6, "transformers' default pattern, form %d", i);
        float global[16], local[16];
        mt_rope_inv_freq_of(global, &c, MT_ROPE_GLOBAL);
        mt_rope_inv_freq_of(local, &c, MT_ROPE_LOCAL);
        cr_assert_eq(local[1], 1.0f / powf(10000.0f, 2.0f / 8.0f), "the local table is unscaled, base 10000");
        cr_assert_eq(global[1], 1.0f / powf(1e6f, 2.0f / 8.0f) / 8.0f, "the global table is divided by 8");
    }

    /* model_type alone is enough */
    c = load_text(dir,
                  "{\"model_type\":\"mistral\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":64,"
                  "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
                  "\"max_position_embeddings\":128,\"sliding_window\":null}");
    cr_assert_eq(c.arch, MT_ARCH_MISTRAL);
}

/* ---- config refusals ----------------------------------------------------------------- */

#define BASE_FIELDS                                                                                    \
    "\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,"           \
    "\"num_attention_heads\":4,\"max_position_embeddings\":128"

static void expect_config_refusal(const char *json, mt_status want, const char *needle)
{
    char dir[512];
    tmp_path(dir, "");
    write_text(dir, "config.json", json);
    mt_model_config c, before;
    mt_model_config_init(&c);
    c.seed = 42;
    before = c;
    mt_status st = mt_config_load(&c, dir);
    cr_assert_eq(st, want, "status %d (%s) for %s", st, mt_last_errmsg(), json);
    cr_assert(strstr(mt_last_errmsg(), needle), "message \"%s\" names %s", mt_last_errmsg(), needle);
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "cfg untouched by a failed load");
}

Test(hf, config_refusals)
{
    expect_config_refusal("{\"architectures\":[\"GPT2LMHeadModel\"]," BASE_FIELDS "}", MT_ERR_UNSUPPORTED,
                          "GPT2LMHeadModel");
    expect_config_refusal("{\"model_type\":\"gpt2\"," BASE_FIELDS "}", MT_ERR_UNSUPPORTED, "gpt2");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4.0}}",
                          MT_ERR_UNSUPPORTED, "dynamic");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2.0}}",
                          MT_ERR_UNSUPPORTED, "dynamic");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS ",\"hidden_act\":\"gelu\"}",
                          MT_ERR_UNSUPPORTED, "gelu");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS ",\"mlp_bias\":true}",
                          MT_ERR_UNSUPPORTED, "mlp_bias");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS ",\"sliding_window\":64}",
                          MT_ERR_UNSUPPORTED, "sliding_window 64");
    expect_config_refusal("{\"architectures\":[\"Qwen2ForCausalLM\"]," BASE_FIELDS ",\"use_sliding_window\":true}",
                          MT_ERR_FORMAT, "sliding_window is not set");
    expect_config_refusal("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE_FIELDS
                          ",\"layer_types\":[\"full_attention\",\"linear_attention\"]}",
                          MT_ERR_UNSUPPORTED, "layer_types[1] is linear_attention");
    expect_config_refusal("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE_FIELDS
                          ",\"layer_types\":[\"full_attention\",\"sliding_attention\"]}",
                          MT_ERR_FORMAT, "layer_types[1] is sliding_attention but the model has no sliding_window");
    expect_config_refusal("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE_FIELDS
                          ",\"layer_types\":[\"full_attention\"]}",
                          MT_ERR_FORMAT, "1 entries for 2 layers");
    expect_config_refusal("{\"architectures\":[\"Qwen2ForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                          "\"intermediate_size\":64,\"num_hidden_layers\":5,\"num_attention_heads\":4,"
                          "\"max_position_embeddings\":128,\"use_sliding_window\":true,\"sliding_window\":8,"
                          "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\","
                          "\"sliding_attention\",\"full_attention\"]}",
                          MT_ERR_UNSUPPORTED, "layer 3 slides, which does not follow the pattern");
    expect_config_refusal("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE_FIELDS ",\"layer_types\":\"full\"}",
                          MT_ERR_FORMAT, "layer_types");
    /* part of each head turns in Phi-3's attention only; an odd count of dimensions nowhere */
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS ",\"partial_rotary_factor\":0.75}",
                          MT_ERR_UNSUPPORTED, "partial_rotary_factor 0.75 is not supported for Llama");
    expect_config_refusal("{\"architectures\":[\"Phi3ForCausalLM\"]," BASE_FIELDS ",\"partial_rotary_factor\":0.375}",
                          MT_ERR_INVALID_ARGUMENT, "turns 3 of head_dim 8");
    expect_config_refusal("{\"architectures\":[\"Phi3ForCausalLM\"]," BASE_FIELDS ",\"partial_rotary_factor\":1.5}",
                          MT_ERR_FORMAT, "partial_rotary_factor 1.5 must be in (0, 1]");
    /* longrope: one factor per pair of rotary dimensions (head_dim 8: 4), positive */
    expect_config_refusal("{\"architectures\":[\"Phi3ForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1.0],\"long_factor\":[2.0]}}",
                          MT_ERR_FORMAT, "\"short_factor\" must be a list of 4 numbers");
    expect_config_refusal("{\"architectures\":[\"Phi3ForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1,1],"
                          "\"long_factor\":[2,2,-2,2]}}",
                          MT_ERR_FORMAT, "long_factor[2] must be a positive number");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1,1]}}",
                          MT_ERR_FORMAT, "longrope lacks \"long_factor\"");
    /* Phi3Config knows the default and longrope alone; yarn must name its factor (transformers indexes it) */
    expect_config_refusal("{\"architectures\":[\"Phi3ForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}",
                          MT_ERR_UNSUPPORTED, "Phi-3 has only the default and longrope");
    expect_config_refusal("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"beta_fast\":8}}",
                          MT_ERR_FORMAT, "yarn rope_scaling lacks \"factor\"");
    expect_config_refusal("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE_FIELDS
                          ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
                          "\"original_max_position_embeddings\":0}}",
                          MT_ERR_FORMAT, "original_max_position_embeddings is 0");
    /* Qwen2-MoE: the even layers below max_window_layers slide; only all of them or none */
    expect_config_refusal("{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                          "\"intermediate_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
                          "\"max_position_embeddings\":128,\"use_sliding_window\":true,\"sliding_window\":8,"
                          "\"max_window_layers\":2,\"num_experts\":4,\"num_experts_per_tok\":2}",
                          MT_ERR_UNSUPPORTED, "slides the even layers below it only");
    expect_config_refusal("{\"architectures\":[\"Qwen2MoeForCausalLM\"]," BASE_FIELDS
                          ",\"shared_expert_intermediate_size\":0}",
                          MT_ERR_UNSUPPORTED, "without its shared expert");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                          ",\"shared_expert_intermediate_size\":64}",
                          MT_ERR_UNSUPPORTED, "Qwen3-MoE has no shared expert");
    expect_config_refusal("{\"architectures\":[\"Phi3ForCausalLM\"]," BASE_FIELDS ",\"attention_bias\":true}",
                          MT_ERR_INVALID_ARGUMENT, "qkv_proj has no bias");
    expect_config_refusal("{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"text_config\":{" BASE_FIELDS
                          "},\"vision_config\":{\"hidden_size\":1152}}",
                          MT_ERR_UNSUPPORTED, "vision_config: Gemma3ForConditionalGeneration has a vision encoder");
    expect_config_refusal("{\"architectures\":[\"Gemma2ForCausalLM\"]," BASE_FIELDS ",\"hidden_activation\":\"gelu\"}",
                          MT_ERR_UNSUPPORTED, "hidden_activation gelu is not supported");
    expect_config_refusal("{\"architectures\":[\"Gemma3ForCausalLM\"]," BASE_FIELDS
                          ",\"use_bidirectional_attention\":true}",
                          MT_ERR_UNSUPPORTED, "use_bidirectional_attention true");
    expect_config_refusal("{\"architectures\":[\"Gemma3ForCausalLM\"]," BASE_FIELDS
                          ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"},"
                          "\"sliding_attention\":{\"rope_type\":\"linear\",\"factor\":2.0}}}",
                          MT_ERR_UNSUPPORTED, "scaled RoPE on the sliding layers");
    expect_config_refusal("{\"architectures\":[\"Qwen3ForCausalLM\"]," BASE_FIELDS
                          ",\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\"}}}",
                          MT_ERR_UNSUPPORTED, "Gemma 3's only");
    expect_config_refusal("{\"architectures\":[\"Qwen3NextForCausalLM\"]," BASE_FIELDS "}", MT_ERR_UNSUPPORTED,
                          "Qwen3NextForCausalLM is not supported: its linear-attention layers (Gated DeltaNet");
    expect_config_refusal("{\"architectures\":[\"Qwen3_5MoeForCausalLM\"]," BASE_FIELDS "}", MT_ERR_UNSUPPORTED,
                          "linear-attention layers");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"], \"vocab_size\":64,", MT_ERR_FORMAT,
                          "config.json");
    expect_config_refusal("[1, 2]", MT_ERR_FORMAT, "config.json");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS "}\n}\n", MT_ERR_FORMAT,
                          "not valid JSON (error near line 2, column 1)");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":32}", MT_ERR_FORMAT,
                          "vocab_size");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"]," BASE_FIELDS ",\"num_key_value_heads\":3}",
                          MT_ERR_INVALID_ARGUMENT, "num_key_value_heads");
    expect_config_refusal("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":-4,\"hidden_size\":32}",
                          MT_ERR_FORMAT, "vocab_size");
}

Test(hf, config_missing_file_and_bad_arguments)
{
    mt_model_config c;
    mt_model_config_init(&c);
    cr_assert_eq(mt_config_load(&c, "/nonexistent/mt_hf_model"), MT_ERR_IO);
    cr_assert(strstr(mt_last_errmsg(), "/nonexistent/mt_hf_model/config.json"), "%s", mt_last_errmsg());
    cr_assert(strstr(mt_last_errmsg(), strerror(ENOENT)), "%s", mt_last_errmsg());
    cr_assert_eq(mt_config_load(NULL, tmp_dir), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_config_load(&c, NULL), MT_ERR_INVALID_ARGUMENT);
    c.struct_size = 4;
    cr_assert_eq(mt_config_load(&c, tmp_dir), MT_ERR_STRUCT_SIZE);
}

/* ---- hand-written safetensors files ------------------------------------------------------ */

typedef struct ht {
    char name[128];
    const char *dtype; /* "F32", "F16", "BF16", or anything to test refusals */
    int nd;
    uint64_t dims[2];
    void *data;
    size_t bytes;
} ht;

/* Writes a safetensors file by hand (no padding: the data need not be aligned). */
static void write_safetensors(const char *path, const ht *t, int n)
{
    size_t cap = 256 + (size_t)n * 256, len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].nd; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%llu", d ? "," : "", (unsigned long long)t[i].dims[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                (unsigned long long)(off + t[i].bytes));
        off += t[i].bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    cr_assert_lt(len, cap);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(h, 1, len, f);
    for (int i = 0; i < n; i++) fwrite(t[i].data, 1, t[i].bytes, f);
    fclose(f);
    free(h);
}

/* fp16 -> double, written independently of the library's decoder. */
static double half_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, man = h & 1023;
    double v = e == 0 ? ldexp(man, -24) : ldexp(1024 + man, e - 25);
    return s ? -v : v;
}

/* A random finite fp16 bit pattern (subnormals and zeros included). */
static uint16_t random_half(uint32_t *state)
{
    for (;;) {
        *state = *state * 1664525u + 1013904223u;
        uint16_t h = (uint16_t)(*state >> 16);
        if (((h >> 10) & 31) != 31) return h;
    }
}

/* Tensors for every tensor the model expects, with dtype chosen per tensor:
 * F16 for matrices with even index, F32 for the others (BF16 when bf16 is set
 * for the embedding). expect[u][...] receives the values the master must get. */
typedef struct hand_model {
    ht *t;
    int n;
    float **expect; /* per unit, padded */
} hand_model;

static hand_model hand_tensors(const mt_model *m, int extra)
{
    hand_model h = {calloc(64 + (size_t)extra, sizeof(ht)), 0, calloc((size_t)m->layout.n_units, sizeof(float *))};
    uint32_t rng = 12345;
    int k = 0;
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        h.expect[u] = calloc(d->padded, sizeof(float));
        for (int i = 0; i < d->n_tensors; i++, k++) {
            const mt_tensor_desc *td = &d->tensors[i];
            ht *t = &h.t[h.n++];
            snprintf(t->name, sizeof t->name, "%s", td->name);
            int vec = td->role == MT_T_ATTN_NORM || td->role == MT_T_MLP_NORM || td->role == MT_T_FINAL_NORM ||
                      td->role == MT_T_Q_BIAS || td->role == MT_T_K_BIAS || td->role == MT_T_V_BIAS ||
                      td->role == MT_T_Q_NORM || td->role == MT_T_K_NORM;
            t->nd = vec ? 1 : 2;
            t->dims[0] = td->rows;
            t->dims[1] = td->cols;
            float *ex = h.expect[u] + td->offset;
            if (td->role == MT_T_EMBED) {
                t->dtype = "BF16";
                uint16_t *b = malloc(td->numel * 2);
                for (uint64_t e = 0; e < td->numel; e++) {
                    rng = rng * 1664525u + 1013904223u;
                    b[e] = (uint16_t)(rng >> 16);
                    if (((b[e] >> 7) & 0xff) == 0xff) b[e] &= 0xbfff; /* keep it finite */
                    ex[e] = mt_bf16_to_f32(b[e]);
                }
                t->data = b;
                t->bytes = td->numel * 2;
            } else if (k % 2 == 0) {
                t->dtype = "F16";
                uint16_t *b = malloc(td->numel * 2);
                for (uint64_t e = 0; e < td->numel; e++) {
                    b[e] = random_half(&rng);
                    ex[e] = (float)half_value(b[e]);
                }
                t->data = b;
                t->bytes = td->numel * 2;
            } else {
                t->dtype = "F32";
                float *b = malloc(td->numel * 4);
                for (uint64_t e = 0; e < td->numel; e++) {
                    rng = rng * 1664525u + 1013904223u;
                    b[e] = ((float)(rng >> 8) / 16777216.0f - 0.5f) * 3.0f;
                    ex[e] = b[e];
                }
                t->data = b;
                t->bytes = td->numel * 4;
            }
        }
    }
    return h;
}

static void hand_free(hand_model *h, const mt_model *m)
{
    for (int i = 0; i < h->n; i++) free(h->t[i].data);
    free(h->t);
    for (int u = 0; u < m->layout.n_units; u++) free(h->expect[u]);
    free(h->expect);
}

static void assert_master_is(const mt_model *m, const hand_model *h)
{
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        const float *ma = mt_tile_master(&m->tiles.tile[u], d);
        const uint16_t *w = mt_tile_weights_bf16(&m->tiles.tile[u], d);
        for (int t = 0; t < d->n_tensors; t++) {
            const mt_tensor_desc *td = &d->tensors[t];
            for (uint64_t i = td->offset; i < td->offset + td->numel; i++) {
                cr_assert_eq(memcmp(&ma[i], &h->expect[u][i], 4), 0, "%s[%llu]: %g, want %g", td->name,
                             (unsigned long long)(i - td->offset), (double)ma[i], (double)h->expect[u][i]);
                if (w) cr_assert_eq(w[i], mt_f32_to_bf16(ma[i]), "%s bf16 copy", td->name);
            }
        }
    }
}

static mt_model_config tiny(int precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 16;
    c.hidden_size = 8;
    c.intermediate_size = 12;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.max_position_embeddings = 32;
    c.precision = (uint32_t)precision;
    return c;
}

Test(hf, hand_written_f16_f32_bf16)
{
    for (int prec = 0; prec <= 1; prec++)
        for (int qwen = 0; qwen <= 1; qwen++) {
            mt_model_config c = tiny(prec);
            if (qwen) c.arch = MT_ARCH_QWEN2, c.attention_bias = 1, c.tie_word_embeddings = 1;
            mt_model *m = make(&c);
            hand_model h = hand_tensors(m, 2);
            /* an ignored rotary buffer, and for the tied model an ignored lm_head */
            float inv[4] = {1, 0.5f, 0.25f, 0.125f};
            ht *r = &h.t[h.n++];
            *r = (ht){"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", 1, {4, 0}, malloc(16), 16};
            memcpy(r->data, inv, 16);
            if (qwen) {
                ht *lm = &h.t[h.n++];
                *lm = (ht){"lm_head.weight", "F32", 2, {16, 8}, calloc(128, 4), 512};
            }
            char dir[512], p[1024];
            tmp_path(dir, "");
            snprintf(p, sizeof p, "%s/model.safetensors", dir);
            write_safetensors(p, h.t, h.n);
            dirty_optimizer(m);
            cr_assert_eq(mt_model_load(m, dir), MT_OK, "%s", mt_model_errmsg(m));
            assert_master_is(m, &h);
            assert_optimizer_reset(m);
            hand_free(&h, m);
            mt_model_destroy(m);
        }
}

Test(hf, f16_special_values)
{
    mt_model_config c = tiny(MT_PRECISION_FP32);
    mt_model *m = make(&c);
    hand_model h = hand_tensors(m, 0);
    /* the final norm (unit L+1, tensor 0) gets hand-picked fp16 values */
    const uint16_t bits[8] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0xc000, 0x7bff};
    const float want[8] = {0.0f, -0.0f, 5.9604644775390625e-08f, 6.09755516052246094e-05f, 6.103515625e-05f,
                           1.0f, -2.0f, 65504.0f};
    int idx = -1;
    for (int i = 0; i < h.n; i++)
        if (!strcmp(h.t[i].name, "model.norm.weight")) idx = i;
    cr_assert_geq(idx, 0);
    free(h.t[idx].data);
    h.t[idx].dtype = "F16";
    h.t[idx].data = malloc(16);
    h.t[idx].bytes = 16;
    memcpy(h.t[idx].data, bits, 16);
    char dir[512], p[1024];
    tmp_path(dir, "");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_safetensors(p, h.t, h.n);
    cr_assert_eq(mt_model_load(m, dir), MT_OK, "%s", mt_model_errmsg(m));
    const mt_unit_desc *d = &m->layout.units[m->layout.n_units - 1];
    const float *ma = mt_tile_master(&m->tiles.tile[m->layout.n_units - 1], d) + d->tensors[0].offset;
    for (int i = 0; i < 8; i++)
        cr_assert_eq(memcmp(&ma[i], &want[i], 4), 0, "fp16 0x%04x: %a, want %a", bits[i], (double)ma[i],
                     (double)want[i]);
    hand_free(&h, m);
    mt_model_destroy(m);
}

Test(hf, sharded_folder_with_index)
{
    mt_model_config c = tiny(MT_PRECISION_BF16);
    mt_model *m = make(&c);
    hand_model h = hand_tensors(m, 0);
    char dir[512], p[1024];
    tmp_path(dir, "");
    int half = h.n / 2;
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_safetensors(p, h.t, half);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_safetensors(p, h.t + half, h.n - half);
    char index[8192];
    size_t len = (size_t)snprintf(index, sizeof index, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    for (int i = 0; i < h.n; i++)
        len += (size_t)snprintf(index + len, sizeof index - len, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"",
                                i ? "," : "", h.t[i].name, i < half ? 1 : 2);
    snprintf(index + len, sizeof index - len, "}}");
    write_text(dir, "model.safetensors.index.json", index);
    cr_assert_eq(mt_model_load(m, dir), MT_OK, "%s", mt_model_errmsg(m));
    assert_master_is(m, &h);

    /* an index that puts a tensor in the wrong shard is refused */
    mt_model *m2 = make(&c);
    snapshot s = take(m2);
    char *q = strstr(index, "00001-of");
    cr_assert_not_null(q);
    q[4] = '2'; /* the first tensor now claims to be in shard 2 */
    write_text(dir, "model.safetensors.index.json", index);
    cr_assert_eq(mt_model_load(m2, dir), MT_ERR_FORMAT);
    cr_assert(strstr(mt_model_errmsg(m2), h.t[0].name), "%s", mt_model_errmsg(m2));
    assert_unchanged(m2, &s, "wrong shard");
    drop(&s);

    /* a missing shard: I/O error naming it */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    unlink(p);
    s = take(m2);
    cr_assert_eq(mt_model_load(m2, dir), MT_ERR_IO);
    cr_assert(strstr(mt_model_errmsg(m2), "model-00002-of-00002.safetensors"), "%s", mt_model_errmsg(m2));
    assert_unchanged(m2, &s, "missing shard");
    drop(&s);
    hand_free(&h, m);
    mt_model_destroy(m);
    mt_model_destroy(m2);
}

/* ---- load refusals ------------------------------------------------------------------------- */

/* Writes h as the folder's model.safetensors, loads it into m, and checks
 * the status, the message and that m is as before. */
static void expect_load_refusal(mt_model *m, const ht *t, int n, mt_status want, const char *needle,
                                const char *needle2)
{
    char dir[512], p[1024];
    tmp_path(dir, "");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_safetensors(p, t, n);
    snapshot s = take(m);
    mt_status st = mt_model_load(m, dir);
    cr_assert_eq(st, want, "status %d: %s", st, mt_model_errmsg(m));
    cr_assert(strstr(mt_model_errmsg(m), needle), "message \"%s\" names %s", mt_model_errmsg(m), needle);
    if (needle2) cr_assert(strstr(mt_model_errmsg(m), needle2), "message \"%s\" names %s", mt_model_errmsg(m), needle2);
    assert_unchanged(m, &s, needle);
    drop(&s);
}

/* Writes a safetensors file of header alone (the 8-byte length, then
 * header) to path p in dir and checks that loading it fails with
 * MT_ERR_FORMAT, a message holding needle, and m as in s. */
static void expect_header_refusal(mt_model *m, const char *dir, const char *p, const char *header, const char *needle,
                                  snapshot *s)
{
    const size_t n = strlen(header);
    unsigned char *file = calloc(1, 8 + n);
    for (int i = 0; i < 8; i++) file[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(file + 8, header, n);
    write_file(p, file, 8 + n);
    free(file);
    cr_assert_eq(mt_model_load(m, dir), MT_ERR_FORMAT, "%s", mt_model_errmsg(m));
    cr_assert(strstr(mt_model_errmsg(m), needle), "message \"%s\" names %s", mt_model_errmsg(m), needle);
    assert_unchanged(m, s, needle);
}

Test(hf, load_refusals_leave_model_unchanged)
{
    mt_model_config c = tiny(MT_PRECISION_BF16);
    mt_model *m = make(&c);
    dirty_optimizer(m);
    hand_model h = hand_tensors(m, 1);
    int q = -1, last = h.n - 1;
    for (int i = 0; i < h.n; i++)
        if (!strcmp(h.t[i].name, "model.layers.1.self_attn.q_proj.weight")) q = i;
    cr_assert_geq(q, 0);

    /* wrong shape: q_proj [8, 8] stored as [4, 16] */
    h.t[q].dims[0] = 4;
    h.t[q].dims[1] = 16;
    expect_load_refusal(m, h.t, h.n, MT_ERR_FORMAT, "model.layers.1.self_attn.q_proj.weight has shape [4, 16]",
                        "the model expects [8, 8]");
    h.t[q].dims[0] = 8;
    h.t[q].dims[1] = 8;

    /* a vector stored as a matrix */
    int norm = -1;
    for (int i = 0; i < h.n; i++)
        if (!strcmp(h.t[i].name, "model.norm.weight")) norm = i;
    h.t[norm].nd = 2;
    h.t[norm].dims[1] = 1;
    expect_load_refusal(m, h.t, h.n, MT_ERR_FORMAT, "model.norm.weight has shape [8, 1]", "expects [8]");
    h.t[norm].nd = 1;

    /* missing tensor (the last one, lm_head) */
    expect_load_refusal(m, h.t, last, MT_ERR_FORMAT, h.t[last].name, "lacks");

    /* unknown extra tensor */
    ht *x = &h.t[h.n];
    *x = (ht){"model.layers.9.mlp.up_proj.weight", "F32", 1, {2, 0}, calloc(2, 4), 8};
    expect_load_refusal(m, h.t, h.n + 1, MT_ERR_FORMAT, "model.layers.9.mlp.up_proj.weight", NULL);
    free(x->data);

    /* unsupported dtype */
    const char *dt = h.t[q].dtype;
    h.t[q].dtype = "F64";
    expect_load_refusal(m, h.t, h.n, MT_ERR_UNSUPPORTED, "F64", h.t[q].name);
    h.t[q].dtype = "I8";
    expect_load_refusal(m, h.t, h.n, MT_ERR_UNSUPPORTED, "I8", NULL);
    h.t[q].dtype = dt;

    /* dtypes a file may hold (lean checkpoints' codes) but weights are not: the right byte counts, refused
     * before a byte is read as anything */
    void *const data = h.t[q].data;
    const size_t bytes = h.t[q].bytes;
    unsigned char codes[8 * 8 * 2] = {0};
    h.t[q].data = codes;
    h.t[q].dtype = "U8", h.t[q].bytes = 64;
    expect_load_refusal(m, h.t, h.n, MT_ERR_FORMAT, h.t[q].name, "is not F32, BF16 or F16");
    h.t[q].dtype = "I16", h.t[q].bytes = 128;
    expect_load_refusal(m, h.t, h.n, MT_ERR_FORMAT, h.t[q].name, "is not F32, BF16 or F16");
    h.t[q].dtype = dt, h.t[q].data = data, h.t[q].bytes = bytes;

    /* byte count that does not match shape * dtype (claims F32 with F16 bytes or vice versa) */
    h.t[q].dtype = !strcmp(dt, "F32") ? "F16" : "F32";
    expect_load_refusal(m, h.t, h.n, MT_ERR_FORMAT, h.t[q].name, NULL);
    h.t[q].dtype = dt;

    char dir[512], p[1024];
    tmp_path(dir, "");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);

    /* header length beyond the file */
    write_safetensors(p, h.t, h.n);
    FILE *f = fopen(p, "r+b");
    unsigned char big[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    fwrite(big, 1, 8, f);
    fclose(f);
    snapshot s = take(m);
    cr_assert_eq(mt_model_load(m, dir), MT_ERR_FORMAT);
    cr_assert(strstr(mt_model_errmsg(m), "header length"), "%s", mt_model_errmsg(m));
    cr_assert(strstr(mt_model_errmsg(m), p), "names the file: %s", mt_model_errmsg(m));
    assert_unchanged(m, &s, "header length");

    /* truncated data: the last tensor's bytes end beyond the file */
    write_safetensors(p, h.t, h.n);
    struct stat sb;
    stat(p, &sb);
    cr_assert_eq(truncate(p, sb.st_size - 3), 0);
    cr_assert_eq(mt_model_load(m, dir), MT_ERR_FORMAT);
    cr_assert(strstr(mt_model_errmsg(m), "data_offsets"), "%s", mt_model_errmsg(m));
    assert_unchanged(m, &s, "truncated");

    /* shorter than the length field */
    write_file(p, "abc", 3);
    cr_assert_eq(mt_model_load(m, dir), MT_ERR_FORMAT);
    assert_unchanged(m, &s, "tiny file");

    /* header that is not JSON */
    expect_header_refusal(m, dir, p, "{xyz  ", "JSON", &s);
    /* a header whose JSON object is followed by more than padding (found by the safetensors fuzz target:
     * the parser stopped at the object's end and took the rest for padding) */
    expect_header_refusal(m, dir, p, "{\"__metadata__\":{}}}} ", "not valid JSON (error at byte 19 of 22)", &s);
    /* a valid file with no tensors at all (with space padding, which the format allows) */
    expect_header_refusal(m, dir, p, "{\"__metadata__\":{\"format\":\"pt\"}}     ",
                          "lacks tensor model.embed_tokens.weight", &s);

    /* no weights at all */
    unlink(p);
    cr_assert_eq(mt_model_load(m, dir), MT_ERR_IO);
    cr_assert(strstr(mt_model_errmsg(m), "model.safetensors"), "%s", mt_model_errmsg(m));
    cr_assert_eq(mt_model_load(m, "/nonexistent/mt_hf_model"), MT_ERR_IO);
    cr_assert_eq(mt_model_load(m, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_model_load(NULL, dir), MT_ERR_INVALID_ARGUMENT);
    assert_unchanged(m, &s, "no file");
    drop(&s);

    /* a model of another shape */
    mt_model_config c2 = tiny(MT_PRECISION_BF16);
    c2.hidden_size = 16;
    mt_model *other = make(&c2);
    cr_assert_eq(mt_model_save(other, dir), MT_OK, "%s", mt_model_errmsg(other));
    s = take(m);
    cr_assert_eq(mt_model_load(m, dir), MT_ERR_FORMAT);
    cr_assert(strstr(mt_model_errmsg(m), "model.embed_tokens.weight has shape [16, 16]"), "%s", mt_model_errmsg(m));
    assert_unchanged(m, &s, "other model");
    drop(&s);

    /* and the valid file still loads afterwards */
    write_safetensors(p, h.t, h.n);
    cr_assert_eq(mt_model_load(m, dir), MT_OK, "%s", mt_model_errmsg(m));
    assert_master_is(m, &h);
    hand_free(&h, m);
    mt_model_destroy(m);
    mt_model_destroy(other);
}

Test(hf, save_failure_is_an_io_error)
{
    mt_model_config c = tiny(MT_PRECISION_BF16);
    mt_model *m = make(&c);
    char file[512], dir[1024];
    tmp_path(file, "plainfile");
    write_file(file, "x", 1);
    snprintf(dir, sizeof dir, "%s/sub", file);
    cr_assert_eq(mt_model_save(m, dir), MT_ERR_IO);
    cr_assert(strstr(mt_model_errmsg(m), file), "%s", mt_model_errmsg(m));
    cr_assert(strstr(mt_model_errmsg(m), strerror(ENOTDIR)), "%s", mt_model_errmsg(m));
    cr_assert_eq(mt_model_save(m, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_model_save(NULL, dir), MT_ERR_INVALID_ARGUMENT);

    /* a temporary name that cannot be created (a directory is in the way):
     * the old files stay as they were */
    char out[512], in_way[1024];
    tmp_path(out, "kept");
    cr_assert_eq(mt_model_save(m, out), MT_OK, "%s", mt_model_errmsg(m));
    snprintf(in_way, sizeof in_way, "%s/model.safetensors.tmp", out);
    cr_assert_eq(mkdir(in_way, 0755), 0);
    mt_model_config c2 = c;
    c2.seed = 77;
    mt_model *other = make(&c2);
    cr_assert_eq(mt_model_save(other, out), MT_ERR_IO);
    cr_assert(strstr(mt_model_errmsg(other), "model.safetensors.tmp"), "%s", mt_model_errmsg(other));
    cr_assert(strstr(mt_model_errmsg(other), strerror(EISDIR)), "%s", mt_model_errmsg(other));
    rmdir(in_way);
    snprintf(in_way, sizeof in_way, "%s/config.json.tmp", out);
    cr_assert_neq(access(in_way, F_OK), 0, "no temporary config left");
    mt_model *b = make(&c2);
    cr_assert_eq(mt_model_load(b, out), MT_OK, "old files intact: %s", mt_model_errmsg(b));
    const mt_unit_desc *d0 = &m->layout.units[0];
    cr_assert_eq(memcmp(mt_tile_weights_bf16(&b->tiles.tile[0], d0), mt_tile_weights_bf16(&m->tiles.tile[0], d0),
                        d0->tensors[0].numel * 2),
                 0, "the folder still holds the first model");
    mt_model_destroy(b);
    mt_model_destroy(other);
    mt_model_destroy(m);
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        same = x == y;
        if (x == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* A model loaded from a folder with a tokenizer saves the tokenizer's files
 * with itself, so the saved folder is a whole model; saving into the folder
 * it came from leaves them be; a model never loaded saves none. */
Test(hf, save_carries_the_tokenizer_files)
{
    mt_model_config c = llama_gqa(MT_PRECISION_BF16);
    mt_model *m = make(&c);
    char src[256], dst[256], a[512], b[512];
    tmp_path(src, "with-tokenizer");
    tmp_path(dst, "saved");
    cr_assert_eq(mt_model_save(m, src), MT_OK, "%s", mt_model_errmsg(m));
    snprintf(a, sizeof a, "%s/tokenizer.json", dst);
    struct stat sb;
    cr_assert_neq(stat(a, &sb), 0, "a model never loaded has no tokenizer to save");
    write_text(src, "tokenizer.json", "{\"model\": {\"type\": \"BPE\"}}");
    write_text(src, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    /* the chat template in its own file, as recent transformers versions save it */
    write_text(src, "chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
    mt_model *n = make(&c);
    cr_assert_eq(mt_model_load(n, src), MT_OK, "%s", mt_model_errmsg(n));
    cr_assert_eq(mt_model_save(n, dst), MT_OK, "%s", mt_model_errmsg(n));
    const char *files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        cr_assert(same_file(a, b), "%s was not carried along", files[i]);
    }
    snprintf(b, sizeof b, "%s/special_tokens_map.json", dst);
    cr_assert_neq(stat(b, &sb), 0, "only the files that exist");
    cr_assert_eq(mt_model_save(n, src), MT_OK, "saving where it came from: %s", mt_model_errmsg(n));
    snprintf(a, sizeof a, "%s/tokenizer.json", src);
    cr_assert_eq(stat(a, &sb), 0);
    mt_model_destroy(n);
    mt_model_destroy(m);
}

/* The special token ids of the folder a model came from go with it (transformers stops generating at
 * eos; a padding row comes from pad_token_id), and a new Phi-3 says it has no padding row rather than
 * leave transformers Phi3Config's 32000, beyond a small vocabulary. */
static cJSON *saved_config(const char *dir)
{
    char p[512], *text = NULL;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc(len + 1);
    cr_assert_eq(fread(text, 1, len, f), len);
    fclose(f);
    text[len] = '\0';
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(j);
    return j;
}

Test(hf, save_carries_the_token_ids)
{
    mt_model_config c = llama_gqa(MT_PRECISION_BF16);
    mt_model *m = make(&c);
    char src[256], dst[256];
    tmp_path(src, "ids-src");
    tmp_path(dst, "ids-dst");
    cr_assert_eq(mt_model_save(m, src), MT_OK, "%s", mt_model_errmsg(m));
    cJSON *j = saved_config(src);
    cr_assert_null(cJSON_GetObjectItem(j, "eos_token_id"), "a new Llama leaves them to transformers");
    cJSON_Delete(j);
    /* the source's ids, an eos list among them (Llama 3.1 Instruct's) */
    char *text = NULL;
    {
        j = saved_config(src);
        cJSON_AddNumberToObject(j, "bos_token_id", 98);
        cJSON *eos = cJSON_AddArrayToObject(j, "eos_token_id");
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(97));
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(99));
        cJSON_AddNullToObject(j, "pad_token_id");
        text = cJSON_Print(j);
        cJSON_Delete(j);
    }
    write_text(src, "config.json", text);
    cJSON_free(text);
    mt_model *n = make(&c);
    cr_assert_eq(mt_model_load(n, src), MT_OK, "%s", mt_model_errmsg(n));
    cr_assert_eq(mt_model_save(n, dst), MT_OK, "%s", mt_model_errmsg(n));
    j = saved_config(dst);
    cr_assert_eq(cJSON_GetObjectItem(j, "bos_token_id")->valuedouble, 98);
    const cJSON *eos = cJSON_GetObjectItem(j, "eos_token_id");
    cr_assert(cJSON_IsArray(eos) && cJSON_GetArraySize(eos) == 2 && cJSON_GetArrayItem(eos, 1)->valuedouble == 99);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "pad_token_id")));
    cJSON_Delete(j);
    mt_model_destroy(n);
    mt_model_destroy(m);

    mt_model_config p = phi3(MT_PRECISION_BF16);
    mt_model *f = make(&p);
    cr_assert_eq(mt_model_save(f, dst), MT_OK, "%s", mt_model_errmsg(f));
    j = saved_config(dst);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "pad_token_id")), "a new Phi-3 has no padding row");
    cJSON_Delete(j);
    mt_model_destroy(f);
}

/* pad_token_id: transformers' nn.Embedding(padding_idx) takes -V <= p < V (negative from the end)
 * and refuses the rest; absent, the config class's default (Gemma 0, Phi3Config 32000 where the
 * vocabulary has that row, else None); written back as the model's own, or null */
static int32_t load_pad(mt_model_config c, const char *name, const char *pad_json, mt_status *st)
{
    mt_model *m = make(&c);
    char dir[512];
    tmp_path(dir, name);
    cr_assert_eq(mt_model_save(m, dir), MT_OK, "%s", mt_model_errmsg(m));
    mt_model_destroy(m);
    cJSON *j = saved_config(dir);
    cJSON_DeleteItemFromObject(j, "pad_token_id");
    if (pad_json) cJSON_AddItemToObject(j, "pad_token_id", cJSON_Parse(pad_json));
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    write_text(dir, "config.json", text);
    cJSON_free(text);
    mt_model_config got;
    mt_model_config_init(&got);
    *st = mt_config_load(&got, dir);
    return got.pad_token_id;
}

Test(hf, config_pad_token_id)
{
    mt_status st;
    const mt_model_config l = llama_gqa(MT_PRECISION_BF16), g = gemma(MT_ARCH_GEMMA3, MT_PRECISION_BF16);
    mt_model_config p = phi3(MT_PRECISION_BF16);
    const int32_t V = (int32_t)l.vocab_size;
    cr_assert_eq(load_pad(l, "pad-absent", NULL, &st), -1);
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(load_pad(l, "pad-null", "null", &st), -1);
    cr_assert_eq(load_pad(l, "pad-5", "5", &st), 5);
    cr_assert_eq(load_pad(l, "pad-minus1", "-1", &st), V - 1, "a negative padding_idx counts from the end");
    char num[32];
    snprintf(num, sizeof num, "%d", -V);
    cr_assert_eq(load_pad(l, "pad-minusV2", num, &st), 0);
    cr_assert_eq(st, MT_OK);
    snprintf(num, sizeof num, "%d", V);
    load_pad(l, "pad-V", num, &st);
    cr_assert_eq(st, MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "pad_token_id") && strstr(mt_last_errmsg(), "outside the vocabulary"), "%s",
              mt_last_errmsg());
    snprintf(num, sizeof num, "%d", -V - 1);
    load_pad(l, "pad-below", num, &st);
    cr_assert_eq(st, MT_ERR_FORMAT);
    load_pad(l, "pad-float", "2.5", &st);
    cr_assert_eq(st, MT_ERR_FORMAT);
    load_pad(l, "pad-string", "\"0\"", &st);
    cr_assert_eq(st, MT_ERR_FORMAT);
    /* the config classes' defaults */
    cr_assert_eq(load_pad(g, "pad-gemma", NULL, &st), 0, "Gemma3TextConfig's pad_token_id is 0");
    cr_assert_eq(load_pad(g, "pad-gemma-null", "null", &st), -1);
    cr_assert_lt(p.vocab_size, 32001u, "the fixture's Phi-3 has no row 32000");
    cr_assert_eq(load_pad(p, "pad-phi3-small", NULL, &st), -1, "Phi3Config's 32000 is no row of this vocabulary");
    p.vocab_size = 32064;
    cr_assert_eq(load_pad(p, "pad-phi3", NULL, &st), 32000, "Phi3Config's default");
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    /* a caller built against 0.1's header cannot hold the padding row: refused, naming it */
    mt_model_config old;
    mt_model_config_init_sized(&old, 96);
    char dir[512];
    cr_assert_eq(mt_config_load(&old, tmp_path(dir, "pad-5")), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "the padding row"), "%s", mt_last_errmsg());
    /* the padding row of the model is written, whatever the folder said */
    mt_model_config c = l;
    c.pad_token_id = 7;
    mt_model *m = make(&c);
    cr_assert_eq(mt_model_save(m, tmp_path(dir, "pad-written")), MT_OK, "%s", mt_model_errmsg(m));
    mt_model_destroy(m);
    cJSON *j = saved_config(dir);
    cr_assert_eq(cJSON_GetObjectItem(j, "pad_token_id")->valuedouble, 7);
    cJSON_Delete(j);
    /* and refused by the config itself outside the vocabulary */
    c.pad_token_id = V;
    mt_model_config v;
    char why[MT_ERRMSG_MAX];
    cr_assert_eq(mt_config_import((mt_err){why}, &v, &c), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(why, "pad_token_id"), "%s", why);
    c.pad_token_id = -2;
    cr_assert_eq(mt_config_import((mt_err){why}, &v, &c), MT_ERR_INVALID_ARGUMENT);
}

/* ---- mixture of experts (Qwen3-MoE, Mixtral) --------------------------------------- */

static mt_model_config qwen3_moe(int precision)
{
    mt_model_config c = qwen3(precision);
    c.arch = MT_ARCH_QWEN3_MOE;
    c.num_hidden_layers = 3;
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 24;
    c.norm_topk_prob = 1;
    c.decoder_sparse_step = 1;
    c.output_router_logits = 1;
    c.router_aux_loss_coef = 0.01f;
    c.mlp_only_layers[0] = 1u << 1; /* layer 1 dense */
    return c;
}

static mt_model_config mixtral(int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = MT_ARCH_MIXTRAL;
    c.num_experts = 3;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = c.intermediate_size; /* Mixtral's experts are intermediate_size wide */
    c.norm_topk_prob = 1;
    c.router_aux_loss_coef = 0.02f;
    c.sliding_window = 24;
    return c;
}

Test(hf, round_trip_qwen3_moe_bf16) { round_trip(qwen3_moe(MT_PRECISION_BF16)); }
Test(hf, round_trip_qwen3_moe_fp32) { round_trip(qwen3_moe(MT_PRECISION_FP32)); }
Test(hf, round_trip_mixtral_bf16) { round_trip(mixtral(MT_PRECISION_BF16)); }

/* config.json written for an MoE model reads back as the same config, the keys transformers reads
 * included (num_local_experts for Mixtral, mlp_only_layers as a list for Qwen3-MoE) */
Test(hf, config_round_trip_moe)
{
    mt_model_config cases[3] = {qwen3_moe(MT_PRECISION_BF16), mixtral(MT_PRECISION_FP32), qwen3_moe(MT_PRECISION_FP32)};
    cases[2].mlp_only_layers[0] = 0, cases[2].decoder_sparse_step = 3, cases[2].norm_topk_prob = 0;
    cases[2].output_router_logits = 0, cases[2].sliding_window = 8, cases[2].max_window_layers = 1;
    for (int k = 0; k < 3; k++) {
        mt_model *m = make(&cases[k]);
        char dir[512], name[32];
        snprintf(name, sizeof name, "moe%d", k);
        cr_assert_eq(mt_model_save(m, tmp_path(dir, name)), MT_OK, "%s", mt_model_errmsg(m));
        mt_model_config got;
        mt_model_config_init(&got);
        got.precision = cases[k].precision, got.seed = cases[k].seed, got.initializer_range = cases[k].initializer_range;
        cr_assert_eq(mt_config_load(&got, dir), MT_OK, "%s", mt_last_errmsg());
        assert_same_config(&m->cfg, &got);
        cJSON *j = saved_config(dir);
        if (cases[k].arch == MT_ARCH_MIXTRAL) {
            cr_assert_eq(cJSON_GetObjectItem(j, "num_local_experts")->valueint, 3);
            cr_assert_eq(cJSON_GetObjectItem(j, "intermediate_size")->valueint, (int)cases[k].moe_intermediate_size);
            cr_assert_null(cJSON_GetObjectItem(j, "num_experts"));
            /* a float as Python writes one: transformers 5's typed config refuses the integer 0 */
            char path[600], text[8192] = "";
            snprintf(path, sizeof path, "%s/config.json", dir);
            FILE *f = fopen(path, "rb");
            cr_assert_not_null(f);
            text[fread(text, 1, sizeof text - 1, f)] = '\0';
            fclose(f);
            const char *at = strstr(text, "\"router_jitter_noise\":");
            cr_assert_not_null(at);
            at += strlen("\"router_jitter_noise\":");
            while (*at == ' ' || *at == '\t') at++;
            cr_assert(!strncmp(at, "0.0", 3) && (at[3] == ',' || at[3] == '\n'), "router_jitter_noise: %.8s", at);
        } else {
            const cJSON *ml = cJSON_GetObjectItem(j, "mlp_only_layers");
            cr_assert(cJSON_IsArray(ml));
            cr_assert_eq(cJSON_GetArraySize(ml), k == 0 ? 1 : 0);
            if (k == 0) cr_assert_eq(cJSON_GetArrayItem(ml, 0)->valueint, 1);
            cr_assert_eq(cJSON_GetObjectItem(j, "moe_intermediate_size")->valueint, 24);
        }
        cJSON_Delete(j);
        mt_model_destroy(m);
    }
}

/* The folder holds each expert's matrices under its own name, in the layout's order of blocks:
 * Qwen3-MoE mlp.experts.E.{gate,up,down}_proj and mlp.gate (the router); Mixtral
 * block_sparse_moe.experts.E.{w1,w3,w2} and block_sparse_moe.gate. A dense layer keeps mlp.*_proj. */
static void experts_per_expert(mt_model_config c, const char *block, const char *const names[3])
{
    mt_model *m = make(&c);
    char dir[512];
    tmp_path(dir, "experts");
    cr_assert_eq(mt_model_save(m, dir), MT_OK, "%s", mt_model_errmsg(m));
    mt_st_set s = {0};
    mt_err err = mt_err_thread();
    cr_assert_eq(mt_st_open_dir(err, &s, dir), MT_OK);
    cr_assert_eq(mt_st_index(err, &s), MT_OK);
    const uint32_t C = c.hidden_size, F = c.moe_intermediate_size, E = c.num_experts;
    for (int l = 0; l < (int)c.num_hidden_layers; l++) {
        const mt_unit_desc *u = &m->layout.units[l + 1];
        const float *master = mt_tile_master(&m->tiles.tile[l + 1], u);
        char n[128];
        snprintf(n, sizeof n, "model.layers.%d.%s.gate.weight", l, block);
        if (!mt_config_layer_sparse(&c, l)) {
            cr_assert_null(mt_st_find(&s, n), "dense layer %d has no router", l);
            snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", l);
            cr_assert_not_null(mt_st_find(&s, n), "dense layer %d keeps its MLP", l);
            continue;
        }
        const mt_st_tensor *r = mt_st_find(&s, n);
        cr_assert(r && r->ndim == 2 && r->dims[0] == E && r->dims[1] == C, "%s", n);
        for (int i = 0; i < u->n_tensors; i++) {
            const mt_tensor_desc *t = &u->tensors[i];
            const int which = t->role == MT_T_EXP_GATE ? 0 : t->role == MT_T_EXP_UP ? 1 : t->role == MT_T_EXP_DOWN ? 2 : -1;
            if (which < 0) continue;
            cr_assert_eq(t->experts, E);
            for (uint32_t e = 0; e < E; e++) {
                snprintf(n, sizeof n, "model.layers.%d.%s.experts.%u.%s.weight", l, block, e, names[which]);
                const mt_st_tensor *f = mt_st_find(&s, n);
                cr_assert_not_null(f, "%s", n);
                const uint64_t rows = which == 2 ? C : F, cols = which == 2 ? F : C;
                cr_assert(f->ndim == 2 && f->dims[0] == rows && f->dims[1] == cols, "%s shape", n);
                cr_assert_eq(memcmp(f->data, master + t->offset + e * rows * cols, rows * cols * 4), 0, "%s", n);
            }
        }
    }
    mt_st_free(&s);
    mt_model_destroy(m);
}

Test(hf, qwen3_moe_folder_holds_each_expert)
{
    static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
    experts_per_expert(qwen3_moe(MT_PRECISION_FP32), "mlp", names);
}

Test(hf, mixtral_folder_holds_each_expert)
{
    static const char *const names[3] = {"w1", "w3", "w2"};
    experts_per_expert(mixtral(MT_PRECISION_FP32), "block_sparse_moe", names);
}

/* The config.json files of Qwen3-30B-A3B and Mixtral-8x7B-v0.1 as published, and their parameter
 * counts: 30,532,122,624 (attention 18.9 M + router 0.26 M + 128 experts of 3 x 768 x 2048 = 604 M
 * a layer, 48 layers, two 311 M embeddings) and 46,702,792,704 (attention 41.9 M + router 32 K + 8
 * experts of 3 x 14336 x 4096 a layer, 32 layers, two 131 M embeddings). */
Test(hf, config_load_real_world_moe)
{
    char dir[512];
    tmp_path(dir, "");
    mt_model_config c = load_text(
        dir, "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n  \"attention_bias\": false,\n"
             "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 151643,\n  \"decoder_sparse_step\": 1,\n"
             "  \"eos_token_id\": 151645,\n  \"head_dim\": 128,\n  \"hidden_act\": \"silu\",\n"
             "  \"hidden_size\": 2048,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": 6144,\n"
             "  \"max_position_embeddings\": 40960,\n  \"max_window_layers\": 48,\n  \"mlp_only_layers\": [],\n"
             "  \"model_type\": \"qwen3_moe\",\n  \"moe_intermediate_size\": 768,\n  \"norm_topk_prob\": true,\n"
             "  \"num_attention_heads\": 32,\n  \"num_experts\": 128,\n  \"num_experts_per_tok\": 8,\n"
             "  \"num_hidden_layers\": 48,\n  \"num_key_value_heads\": 4,\n  \"output_router_logits\": false,\n"
             "  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n  \"rope_theta\": 1000000.0,\n"
             "  \"router_aux_loss_coef\": 0.001,\n  \"sliding_window\": null,\n  \"tie_word_embeddings\": false,\n"
             "  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.51.0\",\n  \"use_cache\": true,\n"
             "  \"use_sliding_window\": false,\n  \"vocab_size\": 151936\n}\n");
    cr_assert_eq(c.arch, MT_ARCH_QWEN3_MOE);
    cr_assert_eq(c.num_experts, 128);
    cr_assert_eq(c.num_experts_per_tok, 8);
    cr_assert_eq(c.moe_intermediate_size, 768);
    cr_assert_eq(c.norm_topk_prob, 1);
    cr_assert_eq(c.output_router_logits, 0);
    cr_assert_eq(c.router_aux_loss_coef, 0.001f);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_eq(mt_config_sparse_layers(&c), 48);
    cr_assert_eq(params_of(&c), 30532122624ull);

    c = load_text(dir, "{\n  \"architectures\": [\"MixtralForCausalLM\"],\n  \"attention_dropout\": 0.0,\n"
                       "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"silu\",\n"
                       "  \"hidden_size\": 4096,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": 14336,\n"
                       "  \"max_position_embeddings\": 32768,\n  \"model_type\": \"mixtral\",\n"
                       "  \"num_attention_heads\": 32,\n  \"num_experts_per_tok\": 2,\n  \"num_hidden_layers\": 32,\n"
                       "  \"num_key_value_heads\": 8,\n  \"num_local_experts\": 8,\n  \"output_router_logits\": false,\n"
                       "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 1e6,\n  \"router_aux_loss_coef\": 0.02,\n"
                       "  \"sliding_window\": null,\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n"
                       "  \"transformers_version\": \"4.36.0.dev0\",\n  \"use_cache\": true,\n  \"vocab_size\": 32000\n}\n");
    cr_assert_eq(c.arch, MT_ARCH_MIXTRAL);
    cr_assert_eq(c.num_experts, 8);
    cr_assert_eq(c.num_experts_per_tok, 2);
    cr_assert_eq(c.moe_intermediate_size, 14336);
    cr_assert_eq(c.norm_topk_prob, 1, "Mixtral always renormalises");
    cr_assert_eq(c.router_aux_loss_coef, 0.02f);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_eq(params_of(&c), 46702792704ull);
    /* Qwen3-MoE's decoder_sparse_step and mlp_only_layers: which layers keep a dense MLP */
    c = load_text(dir, "{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                       ",\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,"
                       "\"decoder_sparse_step\":2,\"mlp_only_layers\":[]}");
    cr_assert(!mt_config_layer_sparse(&c, 0) && mt_config_layer_sparse(&c, 1));
    c = load_text(dir, "{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                       ",\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"mlp_only_layers\":[0]}");
    cr_assert(!mt_config_layer_sparse(&c, 0) && mt_config_layer_sparse(&c, 1));
    /* transformers 5 maps num_experts and num_local_experts to each other: a folder it saved may name either */
    mt_model_config alias = load_text(dir, "{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                                           ",\"num_local_experts\":6,\"num_experts_per_tok\":2,\"moe_intermediate_size\":16}");
    cr_assert_eq(alias.num_experts, 6);
    alias = load_text(dir, "{\"architectures\":[\"MixtralForCausalLM\"]," BASE_FIELDS ",\"num_experts\":5}");
    cr_assert_eq(alias.num_experts, 5);
    cr_assert_eq(params_of(&c), 64 * 32 * 2 + 2 * (2 * 32 + 4 * 32 * 32 + 2 * 8) + 3 * 64 * 32 + 4 * 32 +
                                   4 * 3 * 16 * 32 + 32);
}

Test(hf, config_refusals_moe)
{
    expect_config_refusal("{\"architectures\":[\"MixtralForCausalLM\"]," BASE_FIELDS ",\"router_jitter_noise\":0.1}",
                          MT_ERR_UNSUPPORTED, "router_jitter_noise 0.1");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                          ",\"num_experts\":4,\"shared_expert_intermediate_size\":64}",
                          MT_ERR_UNSUPPORTED, "shared_expert_intermediate_size 64");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                          ",\"num_experts\":4,\"num_experts_per_tok\":2,\"mlp_only_layers\":[2]}",
                          MT_ERR_FORMAT, "mlp_only_layers names layer 2, past the model's layers");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                          "\"intermediate_size\":64,\"num_hidden_layers\":300,\"num_attention_heads\":4,"
                          "\"max_position_embeddings\":128,\"num_experts\":4,\"num_experts_per_tok\":2,"
                          "\"mlp_only_layers\":[256]}",
                          MT_ERR_UNSUPPORTED, "mlp_only_layers names layer 256");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                          ",\"num_experts\":4,\"mlp_only_layers\":\"0\"}",
                          MT_ERR_FORMAT, "mlp_only_layers");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                          ",\"num_experts\":4,\"num_experts_per_tok\":5}",
                          MT_ERR_INVALID_ARGUMENT, "num_experts_per_tok 5");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS ",\"num_experts\":0}",
                          MT_ERR_UNSUPPORTED, "num_experts 0");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                          ",\"num_experts\":4,\"num_local_experts\":8}",
                          MT_ERR_FORMAT, "num_experts 4 and num_local_experts 8 disagree");
    expect_config_refusal("{\"architectures\":[\"Qwen3MoeForCausalLM\"]," BASE_FIELDS
                          ",\"num_experts\":4,\"num_experts_per_tok\":2,\"decoder_sparse_step\":0}",
                          MT_ERR_FORMAT, "decoder_sparse_step");
}

/* ---- GPT-OSS: all the experts in one tensor, transposed, gate and up interleaved -------------------- */

static mt_model_config gpt_oss(int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = MT_ARCH_GPT_OSS;
    c.attention_bias = 1;
    c.num_experts = 3;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = c.intermediate_size; /* GPT-OSS's experts are intermediate_size wide */
    c.norm_topk_prob = 1;
    c.router_aux_loss_coef = 0.02f;
    c.sliding_window = 24, c.sliding_window_pattern = 2;
    return c;
}

Test(hf, round_trip_gpt_oss_bf16) { round_trip(gpt_oss(MT_PRECISION_BF16)); }
Test(hf, round_trip_gpt_oss_fp32) { round_trip(gpt_oss(MT_PRECISION_FP32)); }

/* DeepSeek-V3 and -V2: multi-head latent attention (q from a latent, and from q_proj), shared experts, the
 * first layer dense, and V3's e_score_correction_bias */
static mt_model_config deepseek(mt_arch arch, int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = arch;
    c.num_key_value_heads = c.num_attention_heads;
    c.head_dim = 0;
    c.kv_lora_rank = 16, c.q_lora_rank = arch == MT_ARCH_DEEPSEEK_V3 ? 24 : 0;
    c.qk_nope_head_dim = 8, c.qk_rope_head_dim = 8, c.v_head_dim = 12, c.rope_interleave = 1;
    c.num_experts = 8, c.num_experts_per_tok = 3, c.moe_intermediate_size = 16;
    c.shared_expert_intermediate_size = 32, c.mlp_only_layers[0] = 1;
    c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5f;
    c.norm_topk_prob = arch == MT_ARCH_DEEPSEEK_V3;
    c.moe_scoring = arch == MT_ARCH_DEEPSEEK_V3 ? MT_MOE_SCORING_SIGMOID : MT_MOE_SCORING_SOFTMAX;
    return c;
}

Test(hf, round_trip_deepseek_v3_bf16) { round_trip(deepseek(MT_ARCH_DEEPSEEK_V3, MT_PRECISION_BF16)); }
Test(hf, round_trip_deepseek_v3_fp32) { round_trip(deepseek(MT_ARCH_DEEPSEEK_V3, MT_PRECISION_FP32)); }
Test(hf, round_trip_deepseek_v2_bf16) { round_trip(deepseek(MT_ARCH_DEEPSEEK_V2, MT_PRECISION_BF16)); }

/* The folder holds DeepseekV3's names and shapes (its attention's, its router's correction bias, the dense
 * layer's, the shared experts'), and a bf16 folder keeps the correction bias's fp32 bits, as transformers
 * holds the buffer in fp32 (_keep_in_fp32_modules_strict); training leaves it as it is. */
Test(hf, deepseek_v3_folder_holds_transformers_layout)
{
    mt_model_config c = deepseek(MT_ARCH_DEEPSEEK_V3, MT_PRECISION_BF16);
    mt_model *a = make(&c);
    int n_corr = 0;
    for (int u = 0; u < a->layout.n_units; u++) {
        const mt_unit_desc *d = &a->layout.units[u];
        for (int t = 0; t < d->n_tensors; t++)
            if (mt_role_is_frozen(d->tensors[t].role)) {
                float *w = mt_tile_master(&a->tiles.tile[u], d) + d->tensors[t].offset;
                for (uint64_t i = 0; i < d->tensors[t].numel; i++) w[i] = 0.1234567f * (float)(i + 1) / 7.0f;
                n_corr++;
            }
    }
    cr_assert_eq(n_corr, (int)c.num_hidden_layers - 1, "one correction bias per sparse layer");
    char dir[512];
    tmp_path(dir, "ds");
    cr_assert_eq(mt_model_save(a, dir), MT_OK, "%s", mt_model_errmsg(a));
    char why[256] = "";
    mt_st_set set = {0}, *f = &set;
    cr_assert_eq(mt_st_open_dir((mt_err){why}, f, dir), MT_OK, "%s", why);
    cr_assert_eq(mt_st_index((mt_err){why}, f), MT_OK, "%s", why);
    static const struct {
        const char *name;
        int dtype;
        uint64_t d0, d1;
    } want[] = {
        {"model.layers.0.self_attn.q_a_proj.weight", MT_ST_BF16, 24, 32},
        {"model.layers.0.self_attn.q_a_layernorm.weight", MT_ST_BF16, 24, 0},
        {"model.layers.0.self_attn.q_b_proj.weight", MT_ST_BF16, 4 * 16, 24},
        {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", MT_ST_BF16, 16 + 8, 32},
        {"model.layers.0.self_attn.kv_a_layernorm.weight", MT_ST_BF16, 16, 0},
        {"model.layers.0.self_attn.kv_b_proj.weight", MT_ST_BF16, 4 * (8 + 12), 16},
        {"model.layers.0.self_attn.o_proj.weight", MT_ST_BF16, 32, 4 * 12},
        {"model.layers.0.mlp.gate_proj.weight", MT_ST_BF16, 72, 32},
        {"model.layers.1.mlp.gate.weight", MT_ST_BF16, 8, 32},
        {"model.layers.1.mlp.gate.e_score_correction_bias", MT_ST_F32, 8, 0},
        {"model.layers.1.mlp.experts.7.down_proj.weight", MT_ST_BF16, 32, 16},
        {"model.layers.1.mlp.shared_experts.up_proj.weight", MT_ST_BF16, 32, 32},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const mt_st_tensor *t = mt_st_find(f, want[i].name);
        cr_assert(t, "%s is in the folder", want[i].name);
        cr_assert_eq(t->dtype, want[i].dtype, "%s's dtype", want[i].name);
        cr_assert_eq(t->dims[0], want[i].d0, "%s's rows", want[i].name);
        cr_assert_eq(t->ndim, want[i].d1 ? 2 : 1, "%s's dimensions", want[i].name);
        if (want[i].d1) cr_assert_eq(t->dims[1], want[i].d1, "%s's columns", want[i].name);
    }
    cr_assert_null(mt_st_find(f, "model.layers.0.mlp.gate.weight"), "layer 0 is dense");
    cr_assert_null(mt_st_find(f, "model.layers.0.self_attn.q_proj.weight"), "q from the latent");
    mt_st_free(f);
    /* read back: the correction bias bit for bit, in a bf16 model too */
    mt_model_config c2 = c;
    c2.seed = 99;
    mt_model *b = make(&c2);
    cr_assert_eq(mt_model_load(b, dir), MT_OK, "%s", mt_model_errmsg(b));
    for (int u = 0; u < a->layout.n_units; u++) {
        const mt_unit_desc *d = &a->layout.units[u];
        for (int t = 0; t < d->n_tensors; t++)
            if (mt_role_is_frozen(d->tensors[t].role))
                cr_assert_eq(memcmp(mt_tile_master(&a->tiles.tile[u], d) + d->tensors[t].offset,
                                    mt_tile_master(&b->tiles.tile[u], d) + d->tensors[t].offset,
                                    d->tensors[t].numel * 4),
                             0, "%s's fp32 bits", d->tensors[t].name);
    }
    /* DeepSeek-V3's checkpoints carry multi-token-prediction layers past the model's (layer 61 of 61), which
     * transformers does not load: neither does the library; a tensor it does not know inside its layers is
     * still refused */
    char from[1024], to[1024], extra[1024], index[1024];
    snprintf(from, sizeof from, "%s/model.safetensors", dir);
    snprintf(to, sizeof to, "%s/model-00001-of-00002.safetensors", dir);
    cr_assert_eq(rename(from, to), 0);
    float z[4] = {0};
    for (int bad = 0; bad < 2; bad++) {
        ht mtp = {.dtype = "F32", .nd = 1, .dims = {4}, .data = z, .bytes = sizeof z};
        snprintf(mtp.name, sizeof mtp.name, bad ? "model.layers.1.self_attn.extra" : "model.layers.2.eh_proj.weight");
        snprintf(extra, sizeof extra, "%s/model-00002-of-00002.safetensors", dir);
        write_safetensors(extra, &mtp, 1);
        char idx[512];
        snprintf(idx, sizeof idx,
                 "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\", "
                 "\"%s\": \"model-00002-of-00002.safetensors\"}}",
                 mtp.name);
        snprintf(index, sizeof index, "%s", dir);
        write_text(index, "model.safetensors.index.json", idx);
        const mt_status st = mt_model_load(b, dir);
        if (bad)
            cr_assert(st == MT_ERR_FORMAT && strstr(mt_model_errmsg(b), "model.layers.1.self_attn.extra"), "%s",
                      mt_model_errmsg(b));
        else
            cr_assert_eq(st, MT_OK, "%s", mt_model_errmsg(b));
    }
    mt_model_destroy(a);
    mt_model_destroy(b);
}

/* The value the model holds for element i of tensor t of unit u: its master, or in lean mode its code
 * times its block's scale. */
static float model_value(const mt_model *m, int u, const mt_tensor_desc *t, uint64_t i)
{
    const mt_unit_desc *d = &m->layout.units[u];
    const mt_tile *tl = &m->tiles.tile[u];
    const uint64_t k = t->offset + i;
    if (!d->lean) return mt_tile_master(tl, d)[k];
    return (float)mt_tile_wq(tl, d)[k] * mt_tile_sw(tl, d)[k / MT_LEAN_BLOCK_ELEMS];
}

static float file_value(const mt_st_tensor *f, uint64_t i)
{
    if (f->dtype == MT_ST_F32) {
        float x;
        memcpy(&x, f->data + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, f->data + 2 * i, 2);
    return mt_bf16_to_f32(h);
}

/* Each expert tensor of the folder against the model, element by element, by GptOssExperts' own
 * indexing: gate_up_proj[e, c, 2f] is the gate's (f, c) and [e, c, 2f + 1] the up's, down_proj[e, f, c]
 * the down projection's (c, f), gate_up_proj_bias[e, 2f (+1)] and down_proj_bias[e, c]. tol(value):
 * how far the file may be from the model (the bf16 rounding of a bf16 folder, or a lean model's own
 * rounding of what it read). */
static void check_gpt_oss_experts(const mt_model *m, const mt_model_config *c, mt_st_set *s, int file_is_model)
{
    const uint64_t C = c->hidden_size, F = c->moe_intermediate_size, E = c->num_experts;
    for (int l = 0; l < (int)c->num_hidden_layers; l++) {
        const mt_unit_desc *u = &m->layout.units[l + 1];
        char n[128];
        int seen = 0;
        for (int i = 0; i < u->n_tensors; i++) {
            const mt_tensor_desc *t = &u->tensors[i];
            const int gate = t->role == MT_T_EXP_GATE || t->role == MT_T_EXP_GATE_BIAS;
            const int up = t->role == MT_T_EXP_UP || t->role == MT_T_EXP_UP_BIAS;
            const int down = t->role == MT_T_EXP_DOWN || t->role == MT_T_EXP_DOWN_BIAS;
            if (!gate && !up && !down) continue;
            const int bias = mt_role_is_bias(t->role);
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s%s", l, down ? "down_proj" : "gate_up_proj",
                     bias ? "_bias" : "");
            const mt_st_tensor *f = mt_st_find(s, n);
            cr_assert_not_null(f, "%s", n);
            const uint64_t last = down ? C : 2 * F;
            if (bias) cr_assert(f->ndim == 2 && f->dims[0] == E && f->dims[1] == last, "%s shape", n);
            else cr_assert(f->ndim == 3 && f->dims[0] == E && f->dims[1] == (down ? F : C) && f->dims[2] == last,
                           "%s shape", n);
            const uint64_t rows = down ? C : F, cols = bias ? 1 : down ? F : C;
            for (uint64_t e = 0; e < E; e++)
                for (uint64_t r = 0; r < rows; r++)
                    for (uint64_t k = 0; k < cols; k++) {
                        const uint64_t at = bias ? e * last + (down ? r : 2 * r + (uint64_t)up)
                                                 : (e * cols + k) * last + (down ? r : 2 * r + (uint64_t)up);
                        const float want = file_value(f, at), got = model_value(m, l + 1, t, (e * rows + r) * cols + k);
                        if (file_is_model) { /* the file holds the model's values, rounded as the file's dtype */
                            const float w = f->dtype == MT_ST_F32 ? got : mt_bf16_to_f32(mt_f32_to_bf16(got));
                            cr_assert(memcmp(&w, &want, 4) == 0, "%s[%llu]: file %.9g, model %.9g", n,
                                      (unsigned long long)at, want, got);
                        } else { /* a lean model read the file: within half its block's step */
                            const mt_tile *tl = &m->tiles.tile[l + 1];
                            const float sc = mt_tile_sw(tl, u)[(t->offset + (e * rows + r) * cols + k) / MT_LEAN_BLOCK_ELEMS];
                            cr_assert(fabsf(got - want) <= 0.5f * sc, "%s[%llu]: file %.9g, lean model %.9g", n,
                                      (unsigned long long)at, want, got);
                        }
                    }
            seen++;
        }
        cr_assert_eq(seen, 6, "layer %d: six expert tensors", l);
        /* the router, its bias, the sinks and o_proj's bias under their own names */
        static const char *const plain[4][2] = {{"mlp.router.weight", "2"}, {"mlp.router.bias", "1"},
                                                 {"self_attn.sinks", "1"}, {"self_attn.o_proj.bias", "1"}};
        for (int i = 0; i < 4; i++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", l, plain[i][0]);
            const mt_st_tensor *f = mt_st_find(s, n);
            cr_assert(f && f->ndim == atoi(plain[i][1]), "%s", n);
        }
    }
}

Test(hf, gpt_oss_folder_holds_transformers_layout)
{
    const int precisions[3] = {MT_PRECISION_FP32, MT_PRECISION_BF16, MT_PRECISION_LEAN};
    for (int p = 0; p < 3; p++) {
        const mt_model_config c = gpt_oss(precisions[p]);
        mt_model *m = make(&c);
        char dir[512], name[32];
        snprintf(name, sizeof name, "gpt_oss%d", p);
        cr_assert_eq(mt_model_save(m, tmp_path(dir, name)), MT_OK, "%s", mt_model_errmsg(m));
        mt_st_set s = {0};
        mt_err err = mt_err_thread();
        cr_assert_eq(mt_st_open_dir(err, &s, dir), MT_OK);
        cr_assert_eq(mt_st_index(err, &s), MT_OK);
        check_gpt_oss_experts(m, &c, &s, 1);
        /* read back into a lean model: its codes hold what the file says, each within half a step */
        if (precisions[p] == MT_PRECISION_BF16) {
            const mt_model_config cl = gpt_oss(MT_PRECISION_LEAN);
            mt_model *b = make(&cl);
            cr_assert_eq(mt_model_load(b, dir), MT_OK, "%s", mt_model_errmsg(b));
            check_gpt_oss_experts(b, &cl, &s, 0);
            mt_model_destroy(b);
        }
        mt_st_free(&s);
        mt_model_destroy(m);
    }
}

/* GPT-OSS's published checkpoints hold MXFP4 experts: refused by name, not misread */
Test(hf, gpt_oss_quantized_checkpoint_refused)
{
    char dir[512];
    tmp_path(dir, "");
    const char *text = "{\"architectures\":[\"GptOssForCausalLM\"],\"vocab_size\":64,\"hidden_size\":32,"
                       "\"intermediate_size\":32,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                       "\"num_key_value_heads\":2,\"max_position_embeddings\":128,"
                       "\"quantization_config\":{\"quant_method\":\"mxfp4\"}}";
    write_text(dir, "config.json", text);
    mt_model_config c;
    mt_model_config_init(&c);
    cr_assert_eq(mt_config_load(&c, dir), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "mxfp4") && strstr(mt_last_errmsg(), "quantized"), "%s", mt_last_errmsg());
}

/* gpt-oss-20b's config.json as published, less its quantization_config (a dequantized bf16 copy's):
 * 20,914,757,184 parameters (attention 26.6 M with its biases and sinks, router 92 K, 32 experts of
 * 3 x 2880 x 2880 and 8640 biases a layer, 24 layers, two 579 M embeddings), layer_types read as every
 * other layer sliding, its yarn, and its padding row 199999. */
Test(hf, config_load_real_world_gpt_oss)
{
    char dir[512];
    tmp_path(dir, "");
    char text[4096];
    int n = snprintf(text, sizeof text,
                     "{\n  \"architectures\": [\"GptOssForCausalLM\"],\n  \"attention_bias\": true,\n"
                     "  \"attention_dropout\": 0.0,\n  \"eos_token_id\": 200002,\n  \"experts_per_token\": 4,\n"
                     "  \"head_dim\": 64,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": 2880,\n"
                     "  \"initial_context_length\": 4096,\n  \"initializer_range\": 0.02,\n"
                     "  \"intermediate_size\": 2880,\n  \"layer_types\": [");
    for (int l = 0; l < 24; l++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s\"%s\"", l ? ", " : "",
                      l % 2 ? "full_attention" : "sliding_attention");
    snprintf(text + n, sizeof text - (size_t)n,
             "],\n  \"max_position_embeddings\": 131072,\n  \"model_type\": \"gpt_oss\",\n"
             "  \"num_attention_heads\": 64,\n  \"num_experts_per_tok\": 4,\n  \"num_hidden_layers\": 24,\n"
             "  \"num_key_value_heads\": 8,\n  \"num_local_experts\": 32,\n  \"output_router_logits\": false,\n"
             "  \"pad_token_id\": 199999,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_scaling\": {\n"
             "    \"beta_fast\": 32.0,\n    \"beta_slow\": 1.0,\n    \"factor\": 32.0,\n"
             "    \"original_max_position_embeddings\": 4096,\n    \"rope_type\": \"yarn\",\n    \"truncate\": false\n"
             "  },\n  \"rope_theta\": 150000,\n  \"router_aux_loss_coef\": 0.9,\n  \"sliding_window\": 128,\n"
             "  \"swiglu_limit\": 7.0,\n  \"tie_word_embeddings\": false,\n  \"transformers_version\": \"4.55.0.dev0\",\n"
             "  \"use_cache\": true,\n  \"vocab_size\": 201088\n}\n");
    mt_model_config c = load_text(dir, text);
    cr_assert_eq(c.arch, MT_ARCH_GPT_OSS);
    cr_assert_eq(c.num_experts, 32);
    cr_assert_eq(c.num_experts_per_tok, 4);
    cr_assert_eq(c.moe_intermediate_size, 2880);
    cr_assert_eq(c.norm_topk_prob, 1);
    cr_assert_eq(c.attention_bias, 1);
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.pad_token_id, 199999);
    cr_assert_eq(c.router_aux_loss_coef, 0.9f);
    cr_assert(c.sliding_window == 128 && mt_config_layer_slides(&c, 0) && !mt_config_layer_slides(&c, 1) &&
              mt_config_layer_slides(&c, 22) && !mt_config_layer_slides(&c, 23));
    cr_assert(c.rope_scaling == MT_ROPE_SCALING_YARN && c.rope_factor == 32.0f && c.rope_original_max_position == 4096 &&
              c.rope_beta_fast == 32.0f && c.rope_beta_slow == 1.0f && c.rope_no_truncate && c.rope_theta == 150000.0f);
    cr_assert_eq(mt_config_sparse_layers(&c), 24);
    cr_assert_eq(params_of(&c), 20914757184ull);
}

/* ---- DeepSeek-V3 and -V2: the published configs ------------------------------------------------ */

/* deepseek-ai/DeepSeek-V3's config.json, less its quantization_config (the published weights are fp8; a
 * bf16 copy of them, as people fine-tune, has none): 61 layers, the first 3 dense, 256 routed experts in 8
 * groups and one shared, multi-head latent attention with q and kv latents of 1536 and 512, YaRN 40 with
 * DeepSeek's mscale. 671,026,419,200 values: 671,026,404,352 parameters (embedding and head 2 x 129280 x 7168,
 * each layer's attention 187,107,328 and two norms, 3 dense MLPs of 3 x 7168 x 18432, 58 sparse layers of
 * router 256 x 7168, 256 experts and one shared of 3 x 7168 x 2048) and 58 x 256 correction-bias values. */
#define DEEPSEEK_V3_CONFIG(quant)                                                                                      \
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,\n"      \
    " \"aux_loss_alpha\": 0.001, \"bos_token_id\": 0, \"eos_token_id\": 1, \"ep_size\": 1,\n"                        \
    " \"first_k_dense_replace\": 3, \"hidden_act\": \"silu\", \"hidden_size\": 7168, \"initializer_range\": 0.02,\n" \
    " \"intermediate_size\": 18432, \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840,\n"                  \
    " \"model_type\": \"deepseek_v3\", \"moe_intermediate_size\": 2048, \"moe_layer_freq\": 1, \"n_group\": 8,\n"   \
    " \"n_routed_experts\": 256, \"n_shared_experts\": 1, \"norm_topk_prob\": true, \"num_attention_heads\": 128,\n" \
    " \"num_experts_per_tok\": 8, \"num_hidden_layers\": 61, \"num_key_value_heads\": 128,\n"                        \
    " \"num_nextn_predict_layers\": 1, \"q_lora_rank\": 1536, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,\n" \
    quant " \"rms_norm_eps\": 1e-06, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40,\n"      \
    "  \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},\n"  \
    " \"rope_theta\": 10000, \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\", \"seq_aux\": true,\n"    \
    " \"tie_word_embeddings\": false, \"topk_group\": 4, \"topk_method\": \"noaux_tc\",\n"                            \
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.33.1\", \"use_cache\": true,\n"                   \
    " \"v_head_dim\": 128, \"vocab_size\": 129280}\n"

Test(hf, config_load_real_world_deepseek_v3)
{
    char dir[512];
    tmp_path(dir, "");
    mt_model_config c = load_text(dir, DEEPSEEK_V3_CONFIG(""));
    cr_assert_eq(c.arch, MT_ARCH_DEEPSEEK_V3);
    cr_assert(c.kv_lora_rank == 512 && c.q_lora_rank == 1536 && c.qk_nope_head_dim == 128 &&
              c.qk_rope_head_dim == 64 && c.v_head_dim == 128 && c.head_dim == 192 && c.rope_interleave);
    cr_assert(c.num_experts == 256 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 2048 &&
              c.shared_expert_intermediate_size == 2048 && !c.shared_expert_gate && c.norm_topk_prob);
    cr_assert(c.n_group == 8 && c.topk_group == 4 && c.routed_scaling_factor == 2.5f &&
              c.moe_scoring == MT_MOE_SCORING_SIGMOID && !c.output_router_logits);
    cr_assert(c.mlp_only_layers[0] == 7 && mt_config_sparse_layers(&c) == 58, "the first 3 layers dense");
    cr_assert(c.rope_scaling == MT_ROPE_SCALING_YARN && c.rope_factor == 40.0f && c.rope_mscale == 1.0f &&
              c.rope_mscale_all_dim == 1.0f && c.rope_original_max_position == 4096);
    cr_assert_eq(params_of(&c), 671026419200ull);
    /* the published fp8 weights: refused, naming the quantization */
    expect_config_refusal(DEEPSEEK_V3_CONFIG(" \"quantization_config\": {\"activation_scheme\": \"dynamic\", "
                                             "\"fmt\": \"e4m3\", \"quant_method\": \"fp8\", \"weight_block_size\": "
                                             "[128, 128]},\n"),
                          MT_ERR_UNSUPPORTED, "fp8");
    /* what DeepseekV3ForCausalLM cannot be */
    expect_config_refusal("{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": "
                          "128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 64, "
                          "\"vocab_size\": 100, \"scoring_func\": \"softmax\"}",
                          MT_ERR_UNSUPPORTED, "scoring_func softmax");
}

/* deepseek-ai/DeepSeek-V2-Lite: q_proj from the hidden state (q_lora_rank null), 64 experts without groups
 * (greedy), softmax scores, two shared experts, the first layer dense; 15,706,484,224 parameters */
Test(hf, config_load_real_world_deepseek_v2_lite)
{
    char dir[512];
    tmp_path(dir, "");
    mt_model_config c = load_text(
        dir, "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,\n"
             " \"aux_loss_alpha\": 0.001, \"bos_token_id\": 100000, \"eos_token_id\": 100001,\n"
             " \"first_k_dense_replace\": 1, \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": "
             "0.02,\n \"intermediate_size\": 10944, \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840,\n"
             " \"model_type\": \"deepseek_v2\", \"moe_intermediate_size\": 1408, \"moe_layer_freq\": 1, \"n_group\": 1,\n"
             " \"n_routed_experts\": 64, \"n_shared_experts\": 2, \"norm_topk_prob\": false, \"num_attention_heads\": 16,\n"
             " \"num_experts_per_tok\": 6, \"num_hidden_layers\": 27, \"num_key_value_heads\": 16, \"pretraining_tp\": 1,\n"
             " \"q_lora_rank\": null, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"rms_norm_eps\": 1e-06,\n"
             " \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 0.707,\n"
             "  \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},\n"
             " \"rope_theta\": 10000, \"routed_scaling_factor\": 1.0, \"scoring_func\": \"softmax\", \"seq_aux\": true,\n"
             " \"tie_word_embeddings\": false, \"topk_group\": 1, \"topk_method\": \"greedy\", \"torch_dtype\": "
             "\"bfloat16\",\n \"transformers_version\": \"4.39.3\", \"use_cache\": true, \"v_head_dim\": 128, "
             "\"vocab_size\": 102400}\n");
    cr_assert_eq(c.arch, MT_ARCH_DEEPSEEK_V2);
    cr_assert(c.kv_lora_rank == 512 && c.q_lora_rank == 0 && c.head_dim == 192 && c.v_head_dim == 128 &&
              c.rope_interleave);
    cr_assert(c.num_experts == 64 && c.num_experts_per_tok == 6 && c.shared_expert_intermediate_size == 2816 &&
              !c.norm_topk_prob && c.n_group <= 1 && c.moe_scoring == MT_MOE_SCORING_SOFTMAX);
    cr_assert(c.mlp_only_layers[0] == 1 && mt_config_sparse_layers(&c) == 26);
    cr_assert(c.rope_mscale == 0.707f && c.rope_mscale_all_dim == 0.707f);
    cr_assert_eq(params_of(&c), 15706484224ull);
    /* the largest DeepSeek-V2 chooses within groups: group_limited_greedy reads n_group and topk_group */
    mt_model_config g = load_text(
        dir, "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128,"
             " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 64, \"vocab_size\": "
             "100, \"kv_lora_rank\": 16, \"q_lora_rank\": 24, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, "
             "\"v_head_dim\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, "
             "\"topk_method\": \"group_limited_greedy\", \"n_group\": 4, \"topk_group\": 2}");
    cr_assert(g.n_group == 4 && g.topk_group == 2 && g.routed_scaling_factor == 1.0f && g.mlp_only_layers[0] == 0 &&
              g.shared_expert_intermediate_size == 32, "DeepseekV2Config's defaults: 2 shared experts, no dense layer");
    expect_config_refusal("{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": "
                          "128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 64, "
                          "\"vocab_size\": 100, \"num_experts_per_tok\": 2, \"topk_method\": \"noaux_tc\"}",
                          MT_ERR_UNSUPPORTED, "noaux_tc");
}

/* moonshotai/Moonlight-16B-A3B: DeepseekV3ForCausalLM with q_proj (q_lora_rank null), one group (no limit),
 * sigmoid scores, rope_theta 50000 without scaling; 15,960,110,208 values (26 x 64 correction-bias ones) */
Test(hf, config_load_real_world_moonlight)
{
    char dir[512];
    tmp_path(dir, "");
    mt_model_config c = load_text(
        dir, "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"attention_bias\": false, \"bos_token_id\": 163584,\n"
             " \"eos_token_id\": 163585, \"first_k_dense_replace\": 1, \"hidden_act\": \"silu\", \"hidden_size\": 2048,\n"
             " \"initializer_range\": 0.02, \"intermediate_size\": 11264, \"kv_lora_rank\": 512,\n"
             " \"max_position_embeddings\": 8192, \"model_type\": \"deepseek_v3\", \"moe_intermediate_size\": 1408,\n"
             " \"moe_layer_freq\": 1, \"n_group\": 1, \"n_routed_experts\": 64, \"n_shared_experts\": 2,\n"
             " \"norm_topk_prob\": true, \"num_attention_heads\": 16, \"num_experts_per_tok\": 6,\n"
             " \"num_hidden_layers\": 27, \"num_key_value_heads\": 16, \"num_nextn_predict_layers\": 0,\n"
             " \"q_lora_rank\": null, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"rms_norm_eps\": 1e-05,\n"
             " \"rope_scaling\": null, \"rope_theta\": 50000.0, \"routed_scaling_factor\": 2.446,\n"
             " \"scoring_func\": \"sigmoid\", \"tie_word_embeddings\": false, \"topk_group\": 1, \"topk_method\": "
             "\"noaux_tc\",\n \"torch_dtype\": \"bfloat16\", \"v_head_dim\": 128, \"vocab_size\": 163840}\n");
    cr_assert(c.arch == MT_ARCH_DEEPSEEK_V3 && c.q_lora_rank == 0 && c.n_group <= 1 &&
              c.routed_scaling_factor == 2.446f && c.rope_scaling == MT_ROPE_SCALING_NONE && c.rope_theta == 50000.0f);
    cr_assert_eq(params_of(&c), 15960110208ull);
}

/* ---- Llama 4 --------------------------------------------------------------------------------- */

/* A small Llama 4: layer 0 sparse and layer 1 dense (interleave_moe_layer_step 2 as Maverick's, but
 * starting sparse: moe_layers [0, 2]), layer 2 sparse without RoPE; 4 experts of 16 beside a shared one;
 * chunks of 8, the L2 norms, the temperature */
static mt_model_config llama4(int precision)
{
    mt_model_config c = llama_gqa(precision);
    c.arch = MT_ARCH_LLAMA4;
    c.num_hidden_layers = 3;
    c.num_experts = 4, c.num_experts_per_tok = 1, c.moe_intermediate_size = 16;
    c.shared_expert_intermediate_size = 16, c.mlp_only_layers[0] = 1u << 1, c.decoder_sparse_step = 1;
    c.moe_scoring = MT_MOE_SCORING_SIGMOID, c.moe_input_weighted = 1;
    c.attention_chunk_size = 8, c.qk_l2_norm = 1, c.nope_layers[0] = 1u << 2;
    c.attn_temperature_floor = 4.0f, c.attn_temperature_scale = 0.25f;
    return c;
}

Test(hf, round_trip_llama4_bf16) { round_trip(llama4(MT_PRECISION_BF16)); }
Test(hf, round_trip_llama4_fp32) { round_trip(llama4(MT_PRECISION_FP32)); }

/* The folder holds Llama4ForCausalLM's names and shapes: the experts as one tensor each, stacked and
 * transposed, gate and up concatenated (Llama4TextExperts: gate_up_proj (E, C, 2F), its chunk(2) the gate
 * first; down_proj (E, F, C)), the router and the shared expert under feed_forward, the dense layer's MLP
 * there too; config.json lists every layer (moe_layers, no_rope_layers with 1 for RoPE, layer_types) and
 * reads back as the model's config */
Test(hf, llama4_folder_holds_transformers_layout)
{
    mt_model_config c = llama4(MT_PRECISION_FP32);
    mt_model *a = make(&c);
    const uint32_t C = 32, F = 16, E = 4;
    char dir[512];
    tmp_path(dir, "l4");
    cr_assert_eq(mt_model_save(a, dir), MT_OK, "%s", mt_model_errmsg(a));
    char why[256] = "";
    mt_st_set set = {0}, *f = &set;
    cr_assert_eq(mt_st_open_dir((mt_err){why}, f, dir), MT_OK, "%s", why);
    cr_assert_eq(mt_st_index((mt_err){why}, f), MT_OK, "%s", why);
    static const struct {
        const char *name;
        int ndim;
        uint64_t d0, d1, d2;
    } want[] = {
        {"model.layers.0.feed_forward.router.weight", 2, 4, 32, 0},
        {"model.layers.0.feed_forward.experts.gate_up_proj", 3, 4, 32, 32},
        {"model.layers.0.feed_forward.experts.down_proj", 3, 4, 16, 32},
        {"model.layers.0.feed_forward.shared_expert.gate_proj.weight", 2, 16, 32, 0},
        {"model.layers.0.feed_forward.shared_expert.down_proj.weight", 2, 32, 16, 0},
        {"model.layers.1.feed_forward.gate_proj.weight", 2, 72, 32, 0},
        {"model.layers.1.feed_forward.down_proj.weight", 2, 32, 72, 0},
        {"model.layers.2.self_attn.q_proj.weight", 2, 32, 32, 0},
        {"model.layers.2.post_attention_layernorm.weight", 1, 32, 0, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const mt_st_tensor *t = mt_st_find(f, want[i].name);
        cr_assert(t, "%s is in the folder", want[i].name);
        cr_assert_eq(t->ndim, want[i].ndim, "%s's dimensions", want[i].name);
        cr_assert(t->dims[0] == want[i].d0 && (want[i].ndim < 2 || t->dims[1] == want[i].d1) &&
                      (want[i].ndim < 3 || t->dims[2] == want[i].d2),
                  "%s's shape", want[i].name);
    }
    cr_assert_null(mt_st_find(f, "model.layers.0.feed_forward.experts.0.gate_proj.weight"), "experts fused");
    cr_assert_null(mt_st_find(f, "model.layers.1.feed_forward.router.weight"), "layer 1 is dense");
    /* element (e, c, j) of gate_up_proj is gate row j of expert e at column c for j < F, up row j - F after */
    const mt_st_tensor *gu = mt_st_find(f, "model.layers.0.feed_forward.experts.gate_up_proj");
    const mt_st_tensor *dn = mt_st_find(f, "model.layers.0.feed_forward.experts.down_proj");
    const mt_unit_desc *u = &a->layout.units[1]; /* layer 0 */
    const float *master = mt_tile_master(&a->tiles.tile[1], u);
    const float *gate = NULL, *up = NULL, *down = NULL;
    for (int t = 0; t < u->n_tensors; t++) {
        if (u->tensors[t].role == MT_T_EXP_GATE) gate = master + u->tensors[t].offset;
        if (u->tensors[t].role == MT_T_EXP_UP) up = master + u->tensors[t].offset;
        if (u->tensors[t].role == MT_T_EXP_DOWN) down = master + u->tensors[t].offset;
    }
    cr_assert(gate && up && down && gu->dtype == MT_ST_F32 && dn->dtype == MT_ST_F32);
    const float *g = (const float *)gu->data, *d = (const float *)dn->data;
    for (uint32_t e = 0; e < E; e++)
        for (uint32_t r = 0; r < F; r++)
            for (uint32_t col = 0; col < C; col++) {
                const float *at = g + ((uint64_t)e * C + col) * 2 * F;
                cr_assert_eq(memcmp(&at[r], &gate[((uint64_t)e * F + r) * C + col], 4), 0, "gate %u %u %u", e, r, col);
                cr_assert_eq(memcmp(&at[F + r], &up[((uint64_t)e * F + r) * C + col], 4), 0, "up %u %u %u", e, r, col);
                cr_assert_eq(memcmp(&d[((uint64_t)e * F + r) * C + col], &down[((uint64_t)e * C + col) * F + r], 4), 0,
                             "down %u %u %u", e, r, col);
            }
    mt_st_free(f);
    /* config.json */
    char p[1024], *txt = NULL;
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *fp = fopen(p, "rb");
    cr_assert(fp);
    txt = calloc(1 << 16, 1);
    cr_assert(fread(txt, 1, (1 << 16) - 1, fp) > 0);
    fclose(fp);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    cr_assert(j);
    static const char *const want_json[] = {"\"moe_layers\":[0,2]", "\"no_rope_layers\":[1,1,0]",
                                            "\"layer_types\":[\"chunked_attention\",\"chunked_attention\",\"full_attention\"]",
                                            "\"intermediate_size\":16", "\"intermediate_size_mlp\":72",
                                            "\"attention_chunk_size\":8", "\"use_qk_norm\":true",
                                            "\"attn_temperature_tuning\":true", "\"floor_scale\":4",
                                            "\"attn_scale\":0.25", "\"model_type\":\"llama4_text\""};
    char *flat = cJSON_PrintUnformatted(j);
    for (size_t i = 0; i < sizeof want_json / sizeof want_json[0]; i++)
        cr_assert(strstr(flat, want_json[i]), "config.json has %s: %s", want_json[i], flat);
    free(flat);
    cJSON_Delete(j);
    mt_model_config back;
    mt_model_config_init(&back);
    cr_assert_eq(mt_config_load(&back, dir), MT_OK, "%s", mt_last_errmsg());
    back.precision = c.precision, back.seed = c.seed, back.initializer_range = c.initializer_range;
    mt_model_config want_c;
    cr_assert_eq(mt_config_import((mt_err){why}, &want_c, &c), MT_OK, "%s", why);
    size_t off = 0;
    while (off < sizeof back && ((unsigned char *)&back)[off] == ((unsigned char *)&want_c)[off]) off++;
    cr_assert_eq(off, sizeof back, "config.json reads back as the model's config (byte %zu differs)", off);
    mt_model_destroy(a);
}

/* meta-llama/Llama-4-Scout-17B-16E's text model, as Llama4ForCausalLM's config.json (its text_config):
 * 48 layers, every one sparse (16 experts, one a token, and a shared one, each 8192 wide), every fourth
 * without RoPE (no_rope_layers [] takes the default), chunks of 8192, llama3 RoPE with equal low and high
 * frequency factors, attn_temperature_tuning given as 4. 107,769,861,120 parameters: embedding and head
 * 2 x 202048 x 5120, each layer's attention 62,914,560, two norms, router 16 x 5120, 17 MLPs of
 * 3 x 5120 x 8192; 17.2 B active a token (one routed expert and the shared one). */
Test(hf, config_load_real_world_llama4_scout)
{
    char dir[512];
    tmp_path(dir, "");
    mt_model_config c = load_text(
        dir, "{\"architectures\": [\"Llama4ForCausalLM\"], \"attention_bias\": false, \"attention_chunk_size\": 8192,\n"
             " \"attention_dropout\": 0.0, \"attn_scale\": 0.1, \"attn_temperature_tuning\": 4, \"bos_token_id\": 200000,\n"
             " \"eos_token_id\": [200001, 200007, 200008], \"floor_scale\": 8192, \"for_llm_compressor\": false,\n"
             " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 5120, \"initializer_range\": 0.02,\n"
             " \"interleave_moe_layer_step\": 1, \"intermediate_size\": 8192, \"intermediate_size_mlp\": 16384,\n"
             " \"max_position_embeddings\": 10485760, \"model_type\": \"llama4_text\", \"no_rope_layers\": [],\n"
             " \"num_attention_heads\": 40, \"num_experts_per_tok\": 1, \"num_hidden_layers\": 48,\n"
             " \"num_key_value_heads\": 8, \"num_local_experts\": 16, \"output_router_logits\": false,\n"
             " \"pad_token_id\": 200018, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 16.0,\n"
             "  \"high_freq_factor\": 1.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,\n"
             "  \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"router_aux_loss_coef\": 0.001,\n"
             " \"router_jitter_noise\": 0.0, \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"use_qk_norm\": true,\n"
             " \"vocab_size\": 202048}\n");
    cr_assert_eq(c.arch, MT_ARCH_LLAMA4);
    cr_assert(c.num_experts == 16 && c.num_experts_per_tok == 1 && c.moe_intermediate_size == 8192 &&
              c.intermediate_size == 16384 && c.shared_expert_intermediate_size == 8192 && !c.shared_expert_gate);
    cr_assert(c.moe_scoring == MT_MOE_SCORING_SIGMOID && c.moe_input_weighted && !c.norm_topk_prob &&
              !c.output_router_logits && c.router_aux_loss_coef == 0.0f, "no load-balancing loss in Llama4ForCausalLM");
    cr_assert_eq(mt_config_sparse_layers(&c), 48);
    for (int l = 0; l < 48; l++) {
        cr_assert_eq(mt_config_layer_nope(&c, l), (l + 1) % 4 == 0, "layer %d's RoPE", l);
        cr_assert_eq(mt_config_layer_window(&c, l, 16384), (l + 1) % 4 == 0 ? 0 : -8192, "layer %d's chunks", l);
        cr_assert_eq(mt_config_layer_window(&c, l, 8192), 0, "a chunk as long as the sequence masks nothing");
    }
    cr_assert(c.attention_chunk_size == 8192 && c.qk_l2_norm && c.attn_temperature_floor == 8192.0f &&
              c.attn_temperature_scale == 0.1f);
    cr_assert(c.rope_scaling == MT_ROPE_SCALING_LLAMA3 && c.rope_factor == 16.0f && c.rope_low_freq_factor == 1.0f &&
              c.rope_high_freq_factor == 1.0f && c.pad_token_id == 200018);
    cr_assert_eq(params_of(&c), 107769861120ull);
    /* llama3 with equal factors: frequencies whose wavelength passes 8192 divided by 16, the others kept */
    float inv[64], plain[64];
    mt_model_config u = c;
    u.rope_scaling = MT_ROPE_SCALING_NONE;
    mt_rope_inv_freq_of(inv, &c, MT_ROPE_GLOBAL);
    mt_rope_inv_freq_of(plain, &u, MT_ROPE_GLOBAL);
    int divided = 0;
    for (int i = 0; i < 64; i++) {
        const int far = 2.0 * M_PI / plain[i] > 8192.0;
        cr_assert_eq(inv[i], far ? plain[i] / 16.0f : plain[i], "inv_freq[%d]", i);
        divided += far;
    }
    cr_assert(divided > 0 && divided < 64);
    /* what Llama4ForCausalLM cannot be */
    expect_config_refusal("{\"architectures\": [\"Llama4ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 32, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 64, "
                          "\"vocab_size\": 100, \"no_rope_layers\": [1, 0], \"layer_types\": [\"chunked_attention\", "
                          "\"chunked_attention\"]}",
                          MT_ERR_UNSUPPORTED, "layer_types[1] is chunked_attention");
    expect_config_refusal("{\"architectures\": [\"Llama4ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 32, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 64, "
                          "\"vocab_size\": 100, \"no_rope_layers\": [1, 0, 1]}",
                          MT_ERR_FORMAT, "no_rope_layers");
    expect_config_refusal("{\"architectures\": [\"Llama4ForConditionalGeneration\"], \"text_config\": {}, "
                          "\"vision_config\": {}}",
                          MT_ERR_UNSUPPORTED, "vision encoder");
}
