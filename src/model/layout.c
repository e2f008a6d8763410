#include "model/layout.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_tensor(mt_unit_desc *u, mt_tensor_role role, const char *name, uint32_t rows, uint32_t cols, int decay)
{
    mt_tensor_desc *t = &u->tensors[u->n_tensors++];
    t->role = role;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->numel = (uint64_t)rows * cols;
    t->offset = u->padded;
    t->decay = decay;
    u->numel += t->numel;
    u->padded += MT_ALIGN_UP(t->numel, u->lean ? MT_LEAN_BLOCK_ELEMS : MT_TENSOR_ALIGN_ELEMS);
}

/* Tensors first .. first + n - 1 of u are row blocks, in order, of one matrix of the checkpoint. */
static void fuse(mt_unit_desc *u, int first, int n)
{
    uint32_t rows = 0;
    for (int i = first; i < first + n; i++) rows += u->tensors[i].rows;
    for (int i = first, row0 = 0; i < first + n; row0 += (int)u->tensors[i].rows, i++) {
        u->tensors[i].fused_rows = rows;
        u->tensors[i].fused_row0 = (uint32_t)row0;
    }
}

/* A matrix of E stacked expert blocks of rows x cols each, named per expert by pattern. */
static void add_experts(mt_unit_desc *u, mt_tensor_role role, const char *pattern, uint32_t E, uint32_t rows,
                        uint32_t cols)
{
    add_tensor(u, role, pattern, E * rows, cols, 1);
    u->tensors[u->n_tensors - 1].experts = E;
}

/* GPT-OSS's sparse MLP: the router with its bias, and the experts' matrices and biases, each role one
 * stacked layout tensor as for the others, which its checkpoint holds transposed in one tensor of all
 * the experts, gate and up interleaved (mt_tensor_desc.ck_il) */
static void add_gpt_oss_moe(mt_unit_desc *u, const mt_model_config *c, int l)
{
    const uint32_t C = c->hidden_size, F = c->moe_intermediate_size, E = c->num_experts;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%d.mlp." s, l), n)
    add_tensor(u, MT_T_ROUTER, NAME("router.weight"), E, C, 1);
    add_tensor(u, MT_T_ROUTER_BIAS, NAME("router.bias"), E, 1, 0);
    static const struct {
        mt_tensor_role role;
        const char *name;
        int down, bias;
        uint8_t il, phase;
    } ex[6] = {{MT_T_EXP_GATE, "experts.gate_up_proj", 0, 0, 2, 0},
               {MT_T_EXP_UP, "experts.gate_up_proj", 0, 0, 2, 1},
               {MT_T_EXP_DOWN, "experts.down_proj", 1, 0, 1, 0},
               {MT_T_EXP_GATE_BIAS, "experts.gate_up_proj_bias", 0, 1, 2, 0},
               {MT_T_EXP_UP_BIAS, "experts.gate_up_proj_bias", 0, 1, 2, 1},
               {MT_T_EXP_DOWN_BIAS, "experts.down_proj_bias", 1, 1, 1, 0}};
    for (int i = 0; i < 6; i++) {
        snprintf(n, sizeof n, "model.layers.%d.mlp.%s", l, ex[i].name);
        const uint32_t rows = ex[i].down ? C : F, cols = ex[i].bias ? 1 : ex[i].down ? F : C;
        add_tensor(u, ex[i].role, n, E * rows, cols, !ex[i].bias);
        mt_tensor_desc *t = &u->tensors[u->n_tensors - 1];
        t->experts = E, t->ck_il = ex[i].il, t->ck_phase = ex[i].phase;
    }
#undef NAME
}

/* Llama 4's sparse MLP (Llama4TextMoe): feed_forward.router, the experts stacked and transposed in one
 * tensor each, gate and up concatenated (gate_up_proj (E, C, 2F): mt_tensor_desc.ck_cat), and the shared
 * expert, an MLP as wide as each routed one */
static void add_llama4_moe(mt_unit_desc *u, const mt_model_config *c, int l)
{
    const uint32_t C = c->hidden_size, F = c->moe_intermediate_size, E = c->num_experts;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%d.feed_forward." s, l), n)
    add_tensor(u, MT_T_ROUTER, NAME("router.weight"), E, C, 1);
    static const struct {
        mt_tensor_role role;
        const char *name;
        int down;
        uint8_t parts, phase;
    } ex[3] = {{MT_T_EXP_GATE, "experts.gate_up_proj", 0, 2, 0},
               {MT_T_EXP_UP, "experts.gate_up_proj", 0, 2, 1},
               {MT_T_EXP_DOWN, "experts.down_proj", 1, 1, 0}};
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "model.layers.%d.feed_forward.%s", l, ex[i].name);
        add_tensor(u, ex[i].role, n, E * (ex[i].down ? C : F), ex[i].down ? F : C, 1);
        mt_tensor_desc *t = &u->tensors[u->n_tensors - 1];
        t->experts = E, t->ck_il = ex[i].parts, t->ck_phase = ex[i].phase, t->ck_cat = ex[i].parts > 1;
    }
    add_tensor(u, MT_T_SH_GATE, NAME("shared_expert.gate_proj.weight"), F, C, 1);
    add_tensor(u, MT_T_SH_UP, NAME("shared_expert.up_proj.weight"), F, C, 1);
    add_tensor(u, MT_T_SH_DOWN, NAME("shared_expert.down_proj.weight"), C, F, 1);
#undef NAME
}

/* The MLP of a sparse layer: the router and the experts' gate, up and down matrices, named as the
 * family's checkpoints name them: Qwen3-MoE mlp.gate and mlp.experts.E.{gate,up,down}_proj, Mixtral
 * block_sparse_moe.gate and block_sparse_moe.experts.E.{w1,w3,w2} (mt_family.moe_block, expert_names). */
static void add_moe_tensors(mt_unit_desc *u, const mt_model_config *c, const mt_family *f, int l)
{
    const uint32_t C = c->hidden_size, F = c->moe_intermediate_size, E = c->num_experts;
    static const mt_tensor_role roles[3] = {MT_T_EXP_GATE, MT_T_EXP_UP, MT_T_EXP_DOWN};
    char n[96];
    snprintf(n, sizeof n, "model.layers.%d.%s.gate.weight", l, f->moe_block);
    add_tensor(u, MT_T_ROUTER, n, E, C, 1);
    if (f->moe == MT_MOE_DEEPSEEK && c->moe_scoring == MT_MOE_SCORING_SIGMOID) { /* DeepSeek-V3's buffer */
        snprintf(n, sizeof n, "model.layers.%d.%s.gate.e_score_correction_bias", l, f->moe_block);
        add_tensor(u, MT_T_ROUTER_CORR, n, E, 1, 0);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "model.layers.%d.%s.experts.*.%s.weight", l, f->moe_block, f->expert_names[i]);
        add_experts(u, roles[i], n, E, i < 2 ? F : C, i < 2 ? C : F);
    }
    /* the shared expert: Qwen2-MoE's mlp.shared_expert.{gate,up,down}_proj and mlp.shared_expert_gate */
    const uint32_t S = c->shared_expert_intermediate_size;
    static const mt_tensor_role shared[3] = {MT_T_SH_GATE, MT_T_SH_UP, MT_T_SH_DOWN};
    for (int i = 0; S && i < 3; i++) {
        snprintf(n, sizeof n, "model.layers.%d.%s.%s.%s.weight", l, f->moe_block, f->shared_block, f->expert_names[i]);
        add_tensor(u, shared[i], n, i < 2 ? S : C, i < 2 ? C : S, 1);
    }
    if (S && c->shared_expert_gate) {
        snprintf(n, sizeof n, "model.layers.%d.%s.%s.weight", l, f->moe_block, f->shared_gate);
        add_tensor(u, MT_T_SH_SCORE, n, 1, C, 1);
    }
}

/* Multi-head latent attention (DeepseekV3Attention): q from q_proj, or from the rank-Rq latent q_a_proj
 * normed by q_a_layernorm and expanded by q_b_proj, each head Dn + Dr wide; the rank-Rkv latent and the
 * shared key part from kv_a_proj_with_mqa (Rkv + Dr rows), the latent normed by kv_a_layernorm and
 * expanded by kv_b_proj into each head's key part without RoPE (Dn) and value (Dv); o_proj reads H * Dv.
 * attention_bias gives q_a_proj, kv_a_proj_with_mqa and o_proj biases (q_proj and kv_b_proj have none). */
static void add_mla_tensors(mt_unit_desc *u, const mt_model_config *c, int l)
{
    const uint32_t C = c->hidden_size, H = c->num_attention_heads, Rq = c->q_lora_rank, Rkv = c->kv_lora_rank;
    const uint32_t Dqk = c->qk_nope_head_dim + c->qk_rope_head_dim, Dr = c->qk_rope_head_dim;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%d.self_attn." s, l), n)
    if (Rq) {
        add_tensor(u, MT_T_Q_A, NAME("q_a_proj.weight"), Rq, C, 1);
        if (c->attention_bias) add_tensor(u, MT_T_Q_A_BIAS, NAME("q_a_proj.bias"), Rq, 1, 0);
        add_tensor(u, MT_T_Q_A_NORM, NAME("q_a_layernorm.weight"), Rq, 1, 0);
        add_tensor(u, MT_T_Q_B, NAME("q_b_proj.weight"), H * Dqk, Rq, 1);
    } else {
        add_tensor(u, MT_T_Q, NAME("q_proj.weight"), H * Dqk, C, 1);
    }
    add_tensor(u, MT_T_KV_A, NAME("kv_a_proj_with_mqa.weight"), Rkv + Dr, C, 1);
    if (c->attention_bias) add_tensor(u, MT_T_KV_A_BIAS, NAME("kv_a_proj_with_mqa.bias"), Rkv + Dr, 1, 0);
    add_tensor(u, MT_T_KV_A_NORM, NAME("kv_a_layernorm.weight"), Rkv, 1, 0);
    add_tensor(u, MT_T_KV_B, NAME("kv_b_proj.weight"), H * (c->qk_nope_head_dim + c->v_head_dim), Rkv, 1);
    add_tensor(u, MT_T_O, NAME("o_proj.weight"), C, H * c->v_head_dim, 1);
    if (c->attention_bias) add_tensor(u, MT_T_O_BIAS, NAME("o_proj.bias"), C, 1, 0);
#undef NAME
}

void mt_tensor_name_of(char *buf, size_t len, const mt_tensor_desc *t, uint32_t e)
{
    const char *star = t->experts ? strchr(t->name, '*') : NULL;
    if (!star) {
        snprintf(buf, len, "%s", t->name);
        return;
    }
    snprintf(buf, len, "%.*s%u%s", (int)(star - t->name), t->name, e, star + 1);
}

static void add_layer_tensors(mt_unit_desc *u, const mt_model_config *c, int l)
{
    const uint32_t C = c->hidden_size, F = c->intermediate_size;
    const uint32_t q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "model.layers.%d." s, l), n)
    const mt_family *f = mt_config_family(c);
    const int fused = (f->flags & MT_FAMILY_FUSED) != 0; /* Phi-3's checkpoints fuse q, k, v and gate, up */
    add_tensor(u, MT_T_ATTN_NORM, NAME("input_layernorm.weight"), C, 1, 0);
    if (c->kv_lora_rank) {
        add_mla_tensors(u, c, l);
    } else {
    add_tensor(u, MT_T_Q, fused ? NAME("self_attn.qkv_proj.weight") : NAME("self_attn.q_proj.weight"), q, C, 1);
    add_tensor(u, MT_T_K, fused ? NAME("self_attn.qkv_proj.weight") : NAME("self_attn.k_proj.weight"), kv, C, 1);
    add_tensor(u, MT_T_V, fused ? NAME("self_attn.qkv_proj.weight") : NAME("self_attn.v_proj.weight"), kv, C, 1);
    if (fused) fuse(u, u->n_tensors - 3, 3);
    if (c->attention_bias) {
        add_tensor(u, MT_T_Q_BIAS, NAME("self_attn.q_proj.bias"), q, 1, 0);
        add_tensor(u, MT_T_K_BIAS, NAME("self_attn.k_proj.bias"), kv, 1, 0);
        add_tensor(u, MT_T_V_BIAS, NAME("self_attn.v_proj.bias"), kv, 1, 0);
    }
    if (f->flags & MT_FAMILY_QK_NORM) {
        add_tensor(u, MT_T_Q_NORM, NAME("self_attn.q_norm.weight"), c->head_dim, 1, 0);
        add_tensor(u, MT_T_K_NORM, NAME("self_attn.k_norm.weight"), c->head_dim, 1, 0);
    }
    add_tensor(u, MT_T_O, NAME("self_attn.o_proj.weight"), C, q, 1);
    }
    if (c->attention_bias && (f->flags & MT_FAMILY_O_BIAS)) add_tensor(u, MT_T_O_BIAS, NAME("self_attn.o_proj.bias"), C, 1, 0);
    if (f->flags & MT_FAMILY_SINKS) add_tensor(u, MT_T_SINKS, NAME("self_attn.sinks"), c->num_attention_heads, 1, 0);
    if (f->flags & MT_FAMILY_SANDWICH) { /* sandwich norms: post_attention_layernorm is the attention output's */
        add_tensor(u, MT_T_POST_ATTN_NORM, NAME("post_attention_layernorm.weight"), C, 1, 0);
        add_tensor(u, MT_T_MLP_NORM, NAME("pre_feedforward_layernorm.weight"), C, 1, 0);
        add_tensor(u, MT_T_POST_MLP_NORM, NAME("post_feedforward_layernorm.weight"), C, 1, 0);
    } else {
        add_tensor(u, MT_T_MLP_NORM, NAME("post_attention_layernorm.weight"), C, 1, 0);
    }
    if (mt_config_layer_sparse(c, l)) {
        if (f->moe == MT_MOE_GPT_OSS) add_gpt_oss_moe(u, c, l);
        else if (f->moe == MT_MOE_LLAMA4) add_llama4_moe(u, c, l);
        else add_moe_tensors(u, c, f, l);
        return;
    }
    if (f->moe == MT_MOE_LLAMA4) { /* Llama4TextMLP under feed_forward */
        add_tensor(u, MT_T_GATE, NAME("feed_forward.gate_proj.weight"), F, C, 1);
        add_tensor(u, MT_T_UP, NAME("feed_forward.up_proj.weight"), F, C, 1);
        add_tensor(u, MT_T_DOWN, NAME("feed_forward.down_proj.weight"), C, F, 1);
        return;
    }
    add_tensor(u, MT_T_GATE, fused ? NAME("mlp.gate_up_proj.weight") : NAME("mlp.gate_proj.weight"), F, C, 1);
    add_tensor(u, MT_T_UP, fused ? NAME("mlp.gate_up_proj.weight") : NAME("mlp.up_proj.weight"), F, C, 1);
    if (fused) fuse(u, u->n_tensors - 2, 2);
    add_tensor(u, MT_T_DOWN, NAME("mlp.down_proj.weight"), C, F, 1);
#undef NAME
}

/* Places the blocks of a unit inside its tile. bf16 mode: [bf16 weights |
 * master | m | v], gradients landing in the weight block once the unit's
 * backward is done (14 bytes per parameter). fp32 mode: the master weights are
 * what is streamed, and gradients need their own fp32 block: [grad | master |
 * m | v] (16 bytes per parameter). Lean mode: no master; the weights are
 * 16-bit block codes (optim/q16.h), so the gradients need their own bf16
 * block: [weight codes | bf16 grad | m codes | v codes | weight scales |
 * m scales | v scales] (6.05 bytes per parameter). */
static void place_blocks(mt_unit_desc *u, int fp32)
{
    uint64_t off = 0, f32 = u->padded * 4;
#define BLOCK(field_off, bytes) (field_off = off, off = MT_ALIGN_UP(off + (bytes), MT_BLOCK_ALIGN_BYTES))
    if (u->lean) {
        u->scale_bytes = u->padded / MT_LEAN_BLOCK_ELEMS * 4;
        u->weight_bytes = u->grad_bytes = u->padded * 2;
        BLOCK(u->weight_off, u->weight_bytes);
        BLOCK(u->grad_off, u->grad_bytes);
        BLOCK(u->m_off, u->padded);
        BLOCK(u->v_off, u->padded);
        BLOCK(u->sw_off, u->scale_bytes);
        BLOCK(u->sm_off, u->scale_bytes);
        BLOCK(u->sv_off, u->scale_bytes);
        u->tile_bytes = off;
        return;
    }
    if (fp32) {
        u->weight_bytes = 0;
        u->grad_bytes = f32;
        BLOCK(u->grad_off, f32);
    } else {
        u->weight_bytes = u->padded * 2;
        u->grad_bytes = 0;
        BLOCK(u->weight_off, u->weight_bytes);
    }
    BLOCK(u->master_off, f32);
    BLOCK(u->m_off, f32);
    BLOCK(u->v_off, f32);
#undef BLOCK
    u->tile_bytes = off;
}

int mt_layout_build(mt_layout *lo, const mt_model_config *c)
{
    memset(lo, 0, sizeof *lo);
    const int L = (int)c->num_hidden_layers;
    lo->n_units = L + 2;
    lo->units = calloc((size_t)lo->n_units, sizeof *lo->units);
    if (!lo->units) return -1;
    const int fp32 = c->precision == MT_PRECISION_FP32;
    for (int i = 0; i < lo->n_units; i++) {
        mt_unit_desc *u = &lo->units[i];
        u->layer = -1;
        u->lean = c->precision == MT_PRECISION_LEAN;
        if (i == 0) {
            u->kind = MT_UNIT_EMBED;
            add_tensor(u, MT_T_EMBED, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, 1);
        } else if (i <= L) {
            u->kind = MT_UNIT_LAYER;
            u->layer = i - 1;
            add_layer_tensors(u, c, i - 1);
        } else {
            u->kind = MT_UNIT_HEAD;
            add_tensor(u, MT_T_FINAL_NORM, "model.norm.weight", c->hidden_size, 1, 0);
            if (!c->tie_word_embeddings)
                add_tensor(u, MT_T_LM_HEAD, "lm_head.weight", c->vocab_size, c->hidden_size, 1);
        }
        place_blocks(u, fp32);
        lo->num_params += u->numel;
        lo->tile_bytes += u->tile_bytes;
        lo->weight_bytes += u->weight_bytes + (u->lean ? u->scale_bytes : 0);
        lo->grad_bytes += u->grad_bytes;
        lo->master_bytes += u->lean ? 0 : u->padded * 4;
        lo->optim_bytes += u->lean ? u->padded * 2 + u->scale_bytes * 2 : u->padded * 8;
        lo->largest_unit_padded = MT_MAX(lo->largest_unit_padded, u->padded);
    }
    return 0;
}

void mt_layout_free(mt_layout *lo)
{
    if (!lo) return;
    free(lo->units);
    lo->units = NULL;
    lo->n_units = 0;
}

uint64_t mt_layout_count_params(const mt_model_config *c)
{
    const uint64_t C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const uint64_t q = (uint64_t)c->num_attention_heads * c->head_dim, kv = (uint64_t)c->num_key_value_heads * c->head_dim;
    /* multi-head latent attention: q (from its latent, or q_proj), the kv latent and shared key part, their
     * norms, kv_b, o_proj from H * v_head_dim; biases on q_a, kv_a and o */
    const uint64_t H = c->num_attention_heads, Rq = c->q_lora_rank, Rkv = c->kv_lora_rank, Dr = c->qk_rope_head_dim;
    const uint64_t mla = 2 * C + (Rq ? C * Rq + Rq + Rq * q : C * q) + C * (Rkv + Dr) + Rkv +
                         Rkv * H * ((uint64_t)c->qk_nope_head_dim + c->v_head_dim) + H * c->v_head_dim * C +
                         (c->attention_bias ? Rq + Rkv + Dr + C : 0);
    const uint64_t attn = Rkv ? mla : 2 * C + q * C + 2 * kv * C + C * q + (c->attention_bias ? q + 2 * kv : 0) +
                          (mt_config_has(c, MT_FAMILY_QK_NORM) ? 2 * (uint64_t)c->head_dim : 0) +
                          (mt_config_has(c, MT_FAMILY_SANDWICH) ? 2 * C : 0) +
                          (c->attention_bias && mt_config_has(c, MT_FAMILY_O_BIAS) ? C : 0) +
                          (mt_config_has(c, MT_FAMILY_SINKS) ? c->num_attention_heads : 0);
    /* a sparse layer's MLP: the router (E, C) and E experts of three (F_e, C) matrices */
    const uint64_t E = c->num_experts, sparse = (uint64_t)mt_config_sparse_layers(c);
    const mt_family *f = mt_config_family(c);
    const uint64_t moe = E * C + E * 3 * (uint64_t)c->moe_intermediate_size * C +
                         3 * (uint64_t)c->shared_expert_intermediate_size * C + (c->shared_expert_gate ? C : 0) +
                         (f && f->moe == MT_MOE_GPT_OSS ? E + E * (2 * (uint64_t)c->moe_intermediate_size + C) : 0) +
                         (f && f->moe == MT_MOE_DEEPSEEK && c->moe_scoring == MT_MOE_SCORING_SIGMOID
                              ? E
                              : 0); /* e_score_correction_bias */
    return V * C + (uint64_t)c->num_hidden_layers * attn + ((uint64_t)c->num_hidden_layers - sparse) * 3 * F * C +
           sparse * moe + C + (c->tie_word_embeddings ? 0 : V * C);
}
