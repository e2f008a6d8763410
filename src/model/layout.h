/* The model as a list of units (embedding, decoder layers, head), each a list
 * of tensors with Hugging Face names, and the byte layout of each unit's host
 * tile. Pure arithmetic on a validated config: shared by the plan, the tiler,
 * the loaders and the backends. */
#ifndef MT_LAYOUT_H
#define MT_LAYOUT_H

#include "megatrain.h"
#include "model/family.h"

#include <stddef.h>
#include <stdint.h>

#define MT_TENSOR_ALIGN_BYTES 256 /* every tensor starts at a multiple of this in every block */
#define MT_BLOCK_ALIGN_BYTES 4096 /* every block starts at a multiple of this in its tile */
/* Tensor offsets are counted in elements and rounded to this, which puts them
 * on 256-byte boundaries in both bf16 (2 B) and fp32 (4 B) blocks. */
#define MT_TENSOR_ALIGN_ELEMS (MT_TENSOR_ALIGN_BYTES / 2)
/* The lean mode's blocks of weights and moments (one 16-bit or 8-bit code per
 * element, one fp32 scale per block): tensors start at multiples of it, so no
 * block spans two. */
#define MT_LEAN_BLOCK_ELEMS 256

typedef enum mt_unit_kind { MT_UNIT_EMBED = 0, MT_UNIT_LAYER = 1, MT_UNIT_HEAD = 2 } mt_unit_kind;

typedef enum mt_tensor_role {
    MT_T_EMBED, /* (V, C) token embedding */
    MT_T_ATTN_NORM, MT_T_Q, MT_T_K, MT_T_V, MT_T_Q_BIAS, MT_T_K_BIAS, MT_T_V_BIAS,
    MT_T_Q_NORM, MT_T_K_NORM, /* (D) RMSNorm scales of each head of q and k (Qwen3) */
    MT_T_O,
    MT_T_MLP_NORM, MT_T_GATE, MT_T_UP, MT_T_DOWN,
    MT_T_POST_ATTN_NORM, MT_T_POST_MLP_NORM, /* (C) Gemma's norms of the attention's and the MLP's outputs */
    MT_T_FINAL_NORM, MT_T_LM_HEAD,
    /* mixture of experts (Qwen3-MoE, Mixtral): the router (E, C) and the E experts' matrices, each role one
     * layout tensor of E stacked blocks (mt_tensor_desc.experts): gate and up (E*F, C), down (E*C, F) */
    MT_T_ROUTER, MT_T_EXP_GATE, MT_T_EXP_UP, MT_T_EXP_DOWN,
    /* a shared expert (Qwen2-MoE): gate and up (S, C), down (C, S), and its sigmoid gate (1, C) */
    MT_T_SH_GATE, MT_T_SH_UP, MT_T_SH_DOWN, MT_T_SH_SCORE,
    /* GPT-OSS: o_proj's bias (C), the attention sinks (H), the router's bias (E) and the experts' biases,
     * stacked as their matrices are: gate and up (E*F), down (E*C) */
    MT_T_O_BIAS, MT_T_SINKS, MT_T_ROUTER_BIAS, MT_T_EXP_GATE_BIAS, MT_T_EXP_UP_BIAS, MT_T_EXP_DOWN_BIAS,
    /* DeepSeek-V3: the router's e_score_correction_bias (E), a buffer transformers does not train: added to
     * the sigmoid scores for the choice of experts only; held fixed (no gradient, no optimizer step) */
    MT_T_ROUTER_CORR,
    /* multi-head latent attention (DeepSeek-V2/V3): q_a_proj (Rq, C) and its norm (Rq), q_b_proj
     * (H*(Dn+Dr), Rq); kv_a_proj_with_mqa (Rkv+Dr, C) and the norm of its first Rkv (Rkv); kv_b_proj
     * (H*(Dn+Dv), Rkv); and the biases of q_a and kv_a where attention_bias */
    MT_T_Q_A, MT_T_Q_A_NORM, MT_T_Q_B, MT_T_KV_A, MT_T_KV_A_NORM, MT_T_KV_B, MT_T_Q_A_BIAS, MT_T_KV_A_BIAS,
    MT_T_ROLE_COUNT
} mt_tensor_role;

typedef struct mt_tensor_desc {
    mt_tensor_role role;
    char name[96];      /* Hugging Face name, e.g. "model.layers.3.mlp.up_proj.weight" */
    uint32_t rows, cols;/* cols == 1 for vectors; numel = rows * cols */
    uint64_t numel;
    uint64_t offset;    /* in elements from the start of the unit's blocks */
    int decay;          /* matrices take weight decay; norms and biases do not */
    /* fused_rows != 0: the checkpoint holds this matrix as rows fused_row0 .. fused_row0 + rows of
     * the fused_rows x cols matrix `name`, beside the other tensors of the unit with that name
     * (Phi-3's qkv_proj and gate_up_proj) */
    uint32_t fused_rows, fused_row0;
    /* experts != 0: the checkpoint holds this matrix as `experts` tensors of rows / experts rows each,
     * expert e's block at offset + e * numel / experts, named `name` with e in place of its '*'
     * (model.layers.3.mlp.experts.*.up_proj.weight) */
    uint32_t experts;
    /* ck_il != 0 (with experts): the checkpoint holds all the experts' blocks as ONE tensor `name`, each
     * block transposed, and ck_il such matrices interleaved along its last dimension, this one at
     * ck_phase: element (e, r, c) of this (experts * rows', cols) matrix is element
     * (e, c, r * ck_il + ck_phase) of the checkpoint's (experts, cols, rows' * ck_il), or (e, r * ck_il +
     * ck_phase) of its (experts, rows' * ck_il) where cols is 1 (GPT-OSS's mlp.experts.gate_up_proj,
     * down_proj and their biases: mt_st_map). ck_cat: the ck_il matrices concatenated along that
     * dimension instead, element (e, c, ck_phase * rows' + r) (Llama 4's feed_forward.experts.gate_up_proj) */
    uint8_t ck_il, ck_phase, ck_cat;
} mt_tensor_desc;

#define MT_MAX_UNIT_TENSORS 24

typedef struct mt_unit_desc {
    mt_unit_kind kind;
    int layer;                 /* layer index for MT_UNIT_LAYER, -1 otherwise */
    int n_tensors;
    mt_tensor_desc tensors[MT_MAX_UNIT_TENSORS];
    uint64_t numel;            /* parameters in the unit */
    uint64_t padded;           /* elements per block including alignment padding */
    /* byte offsets of the blocks inside the tile; 0-size blocks have offset 0 */
    uint64_t weight_off, weight_bytes; /* the streamed copy: bf16 (lean mode: int16 codes), none in fp32 mode */
    uint64_t grad_off, grad_bytes;     /* fp32 in fp32 mode, bf16 in lean mode; bf16 mode lands gradients in
                                        * the weight block */
    uint64_t master_off, m_off, v_off; /* fp32, padded*4 bytes each; lean mode: no master, m and v 8-bit
                                        * codes (padded bytes each) */
    uint64_t sw_off, sm_off, sv_off;   /* lean mode: the fp32 scales of the weights', m's and v's blocks, padded /
                                        * 256 each */
    uint64_t scale_bytes;              /* lean mode: the bytes of each of those three blocks */
    uint64_t tile_bytes;               /* total, a multiple of 4 KiB */
    int lean;                          /* the unit is in lean mode */
} mt_unit_desc;

typedef struct mt_layout {
    int n_units;               /* layers + 2 */
    mt_unit_desc *units;       /* [n_units]: 0 embedding, 1..L layers, L+1 head */
    uint64_t num_params;
    uint64_t tile_bytes;       /* sum over units */
    uint64_t largest_unit_padded;
    uint64_t weight_bytes, grad_bytes, master_bytes, optim_bytes; /* lean: weight_bytes counts the weights' scales */
} mt_layout;

/* Norm scales start at 1 (Gemma's, which store the scale minus one, at 0:
 * mt_family_norm_init), biases at 0; neither takes weight decay. */
static inline int mt_role_is_norm(mt_tensor_role r)
{
    return r == MT_T_ATTN_NORM || r == MT_T_MLP_NORM || r == MT_T_FINAL_NORM || r == MT_T_Q_NORM || r == MT_T_K_NORM ||
           r == MT_T_POST_ATTN_NORM || r == MT_T_POST_MLP_NORM || r == MT_T_Q_A_NORM || r == MT_T_KV_A_NORM;
}
static inline int mt_role_is_bias(mt_tensor_role r)
{
    return r == MT_T_Q_BIAS || r == MT_T_K_BIAS || r == MT_T_V_BIAS || r == MT_T_O_BIAS || r == MT_T_EXP_GATE_BIAS ||
           r == MT_T_EXP_UP_BIAS || r == MT_T_EXP_DOWN_BIAS || r == MT_T_Q_A_BIAS || r == MT_T_KV_A_BIAS;
}
/* Tensors training leaves as they are: no gradient, no optimizer step (DeepSeek-V3's
 * e_score_correction_bias, a buffer in transformers, loaded and saved as the checkpoint has it) */
static inline int mt_role_is_frozen(mt_tensor_role r) { return r == MT_T_ROUTER_CORR; }
/* Vectors that start as draws of N(0, initializer_range), as matrices do, but take no weight decay:
 * GPT-OSS's attention sinks and router bias (GptOssPreTrainedModel._init_weights) */
static inline int mt_role_is_drawn_vector(mt_tensor_role r) { return r == MT_T_SINKS || r == MT_T_ROUTER_BIAS; }

/* Whether layer l of a validated config has a mixture-of-experts MLP: every
 * decoder_sparse_step-th layer of a model with experts, except those of
 * mlp_only_layers (transformers' Qwen3-MoE rule; Mixtral: every layer). */
static inline int mt_config_layer_sparse(const mt_model_config *c, int l)
{
    const uint32_t step = c->decoder_sparse_step ? c->decoder_sparse_step : 1;
    return c->num_experts && ((uint32_t)l + 1) % step == 0 && !(l < 256 && c->mlp_only_layers[l / 64] >> (l % 64) & 1);
}

/* Whether layer l of a validated config has no RoPE (Llama 4's NoPE layers, which attend to the whole
 * sequence, their q scaled by the attention temperature). */
static inline int mt_config_layer_nope(const mt_model_config *c, int l)
{
    return l < 256 && (c->nope_layers[l / 64] >> (l % 64) & 1);
}

/* Whether layer l of a validated config attends through a sliding window. */
static inline int mt_config_layer_slides(const mt_model_config *c, int l)
{
    const uint32_t P = c->sliding_window_pattern;
    return c->sliding_window && (uint32_t)l >= c->max_window_layers && (P == 0 || ((uint32_t)l + 1) % P != 0);
}

/* The window of layer l for sequences of seq_len: 0 where it attends to
 * every earlier token of its document (a window of seq_len or more masks
 * nothing); -N where it attends in chunks of N (Llama 4's layers with RoPE,
 * attention_chunk_size N < seq_len: mt_window_starts). */
static inline int mt_config_layer_window(const mt_model_config *c, int l, int seq_len)
{
    if (c->attention_chunk_size && !mt_config_layer_nope(c, l))
        return c->attention_chunk_size < (uint32_t)seq_len ? -(int)c->attention_chunk_size : 0;
    return mt_config_layer_slides(c, l) && c->sliding_window < (uint32_t)seq_len ? (int)c->sliding_window : 0;
}

/* Whether layer l rotates by the sliding layers' own RoPE frequencies: Gemma 3's
 * sliding layers, base rope_local_base_freq (rope_theta when 0), never scaled,
 * whatever the window's length against the sequence. */
static inline int mt_config_layer_local_rope(const mt_model_config *c, int l)
{
    return mt_config_has(c, MT_FAMILY_LOCAL_ROPE) && mt_config_layer_slides(c, l);
}

/* The dimensions of each head that RoPE turns: head_dim, or the first
 * int(head_dim * partial_rotary_factor) (transformers' rotary dim). */
static inline uint32_t mt_config_rotary_dims(const mt_model_config *c)
{
    if (c->kv_lora_rank) return c->qk_rope_head_dim; /* multi-head latent attention: the heads' last part */
    const float f = c->partial_rotary_factor;
    return f == 0.0f || f == 1.0f ? c->head_dim : (uint32_t)((double)c->head_dim * (double)f);
}

/* Where in each q and k head RoPE's dimensions start: 0, or after the qk_nope_head_dim that it leaves
 * unrotated (multi-head latent attention) */
static inline uint32_t mt_config_rotary_offset(const mt_model_config *c)
{
    return c->kv_lora_rank ? c->qk_nope_head_dim : 0;
}
/* Whether RoPE turns the pairs (2i, 2i + 1) of its dimensions (DeepSeek's rope_interleave; an order of the
 * dimensions that q and k share, which leaves their dot products those of transformers' de-interleaved
 * output) rather than (i, i + n/2) */
static inline int mt_config_rope_interleaved(const mt_model_config *c)
{
    return (c->kv_lora_rank && c->rope_interleave) || mt_config_has(c, MT_FAMILY_CHUNKED_NOPE); /* Llama 4 too */
}

/* The checkpoint name of block e of t (its only name where t->experts is 0). */
void mt_tensor_name_of(char *buf, size_t len, const mt_tensor_desc *t, uint32_t e);

/* The checkpoint tensors of a layout tensor: its experts, or 1. */
static inline uint32_t mt_tensor_blocks(const mt_tensor_desc *t) { return t->experts && !t->ck_il ? t->experts : 1u; }

/* The sparse layers of a validated config (0 for a dense model). */
static inline int mt_config_sparse_layers(const mt_model_config *c)
{
    int n = 0;
    for (int l = 0; l < (int)c->num_hidden_layers; l++) n += mt_config_layer_sparse(c, l);
    return n;
}

/* cfg must have passed mt_config_import. Returns -1 when out of memory. */
int mt_layout_build(mt_layout *lo, const mt_model_config *cfg);
void mt_layout_free(mt_layout *lo);

/* The number of parameters without building anything (for quick checks). */
uint64_t mt_layout_count_params(const mt_model_config *cfg);

#endif
