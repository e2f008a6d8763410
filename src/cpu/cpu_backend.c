/* The CPU backend: every unit computed in fp32 with the ops of cpu_ops.c on
 * the model's thread pool. Weight "slots" are fp32 buffers that the bf16 (or
 * fp32) weights of a unit are copied into, so the scheduler drives the same
 * path as on a GPU; it is the reference the CUDA backend is checked against.
 *
 * Notation: T = n_seq * seq_len tokens of one micro-batch, C hidden, Q = H*D,
 * KV = Hkv*D, F MLP width, V vocabulary. */
#include "engine/backend.h"
#include "optim/adamw.h"
#include "cpu/cpu_ops.h"
#include "engine/model.h"

#include <stdlib.h>
#include <string.h>

/* Logits of the head are computed for this many tokens at a time. */
#define HEAD_CHUNK 256

typedef struct cpu_be {
    mt_be base;
    mt_model *m;
    mt_be_shape shape;
    int T, C, Q, KV, F, V, H, Hkv, D, L;
    size_t slot_elems;
    float *slots[16];
    float *acc;      /* (largest unit) fp32 gradient accumulator */
    float *tied_acc; /* (V, C) embedding gradients when the head shares them */
    float *ck;       /* (L+1, n_micro, T, C) checkpoints: the output of units 0..L */
    float *dx;       /* (n_micro, T, C) gradient of the hidden state */
    int32_t *tokens, *targets; /* (n_micro, T) */
    int32_t *pos;    /* (T) position of each token in its sequence */
    float *inv_freq; /* (D/2) */
    /* one layer's saved activations and gradients, (T, .) each */
    float *xn1, *q, *k, *v, *att, *lse, *h, *xn2, *g, *u, *a, *rstd1, *rstd2;
    float *dxn, *dq, *dk, *dv, *datt, *dg, *du, *da;
    float *logits;   /* (HEAD_CHUNK, V) */
    void *ws;
    double loss_sum, sumsq;
} cpu_be;

static void free_buffers(cpu_be *b)
{
    float **bufs[] = {&b->acc, &b->tied_acc, &b->ck, &b->dx, &b->inv_freq, &b->xn1, &b->q, &b->k, &b->v, &b->att,
                      &b->lse, &b->h, &b->xn2, &b->g, &b->u, &b->a, &b->rstd1, &b->rstd2, &b->dxn, &b->dq, &b->dk,
                      &b->dv, &b->datt, &b->dg, &b->du, &b->da, &b->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    for (int s = 0; s < 16; s++) {
        free(b->slots[s]);
        b->slots[s] = NULL;
    }
    free(b->tokens);
    free(b->targets);
    free(b->pos);
    free(b->ws);
    b->tokens = b->targets = b->pos = NULL;
    b->ws = NULL;
}

static void cpu_destroy(mt_be *be)
{
    cpu_be *b = (cpu_be *)be;
    free_buffers(b);
    free(b);
}

static const mt_unit_desc *unit_desc(cpu_be *b, int unit) { return &b->m->layout.units[unit]; }

static mt_status cpu_reserve(mt_be *be, const mt_be_shape *s, mt_err err)
{
    cpu_be *b = (cpu_be *)be;
    free_buffers(b);
    const mt_model_config *c = &b->m->cfg;
    const mt_layout *lo = &b->m->layout;
    b->shape = *s;
    b->T = s->n_seq * s->seq_len;
    b->C = (int)c->hidden_size;
    b->H = (int)c->num_attention_heads;
    b->Hkv = (int)c->num_key_value_heads;
    b->D = (int)c->head_dim;
    b->Q = b->H * b->D;
    b->KV = b->Hkv * b->D;
    b->F = (int)c->intermediate_size;
    b->V = (int)c->vocab_size;
    b->L = (int)c->num_hidden_layers;
    const size_t T = (size_t)b->T, C = (size_t)b->C, Q = (size_t)b->Q, KV = (size_t)b->KV, F = (size_t)b->F;
    const int tied = c->tie_word_embeddings != 0;
    const mt_unit_desc *embed = unit_desc(b, 0), *head = unit_desc(b, b->L + 1);

    b->slot_elems = lo->largest_unit_padded;
    if (tied) b->slot_elems = MT_MAX(b->slot_elems, head->padded + embed->padded);
    int ok = 1;
#define ALLOC(p, n) (ok = ok && ((p) = malloc(MT_MAX((size_t)(n), (size_t)1) * sizeof *(p))) != NULL)
    for (uint32_t i = 0; i < b->m->pol.weight_slots; i++) ALLOC(b->slots[i], b->slot_elems);
    ALLOC(b->acc, lo->largest_unit_padded);
    if (tied) ALLOC(b->tied_acc, embed->padded);
    ALLOC(b->ck, ((size_t)b->L + 1) * (size_t)s->n_micro * T * C);
    if (s->want_grad) ALLOC(b->dx, (size_t)s->n_micro * T * C);
    ALLOC(b->tokens, (size_t)s->n_micro * T);
    ALLOC(b->targets, (size_t)s->n_micro * T);
    ALLOC(b->pos, T);
    ALLOC(b->inv_freq, (size_t)b->D / 2);
    ALLOC(b->xn1, T * C); ALLOC(b->q, T * Q); ALLOC(b->k, T * KV); ALLOC(b->v, T * KV);
    ALLOC(b->att, T * Q); ALLOC(b->lse, T * (size_t)b->H); ALLOC(b->h, T * C); ALLOC(b->xn2, T * C);
    ALLOC(b->g, T * F); ALLOC(b->u, T * F); ALLOC(b->a, T * F); ALLOC(b->rstd1, T); ALLOC(b->rstd2, T);
    if (s->want_grad) {
        ALLOC(b->dxn, T * C); ALLOC(b->dq, T * Q); ALLOC(b->dk, T * KV); ALLOC(b->dv, T * KV);
        ALLOC(b->datt, T * Q); ALLOC(b->dg, T * F); ALLOC(b->du, T * F); ALLOC(b->da, T * F);
    }
    ALLOC(b->logits, (size_t)HEAD_CHUNK * (size_t)b->V);
    b->ws = malloc(mt_cpu_ws_size(mt_pool_size(b->m->pool), s->seq_len));
    ok = ok && b->ws;
#undef ALLOC
    if (!ok) {
        free_buffers(b);
        char b1[32];
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the CPU backend's %s of activations",
                       mt_fmt_bytes(b1, sizeof b1, ((size_t)b->L + 1) * (size_t)s->n_micro * T * C * 4));
    }
    for (int t = 0; t < b->T; t++) b->pos[t] = t % s->seq_len;
    mt_rope_params rp = {c->rope_theta, c->rope_scaling == MT_ROPE_SCALING_LLAMA3, c->rope_factor,
                         c->rope_low_freq_factor, c->rope_high_freq_factor, (int)c->rope_original_max_position};
    mt_rope_inv_freq(b->inv_freq, b->D, &rp);
    b->loss_sum = b->sumsq = 0;
    return MT_OK;
}

static void cpu_set_tokens(mt_be *be, int mb, const int32_t *tokens, const int32_t *targets)
{
    cpu_be *b = (cpu_be *)be;
    memcpy(b->tokens + (size_t)mb * b->T, tokens, (size_t)b->T * sizeof *tokens);
    if (targets) memcpy(b->targets + (size_t)mb * b->T, targets, (size_t)b->T * sizeof *targets);
}

/* A unit's weights into a slot in fp32: from the tile's bf16 block, or in
 * fp32 mode from the master. */
static void copy_unit(cpu_be *b, float *dst, int unit)
{
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->m->tiles.tile[unit];
    const uint16_t *w = mt_tile_weights_bf16(t, u);
    if (w) mt_cpu_convert(b->m->pool, dst, 0, w, 1, u->padded);
    else mt_cpu_convert(b->m->pool, dst, 0, mt_tile_master(t, u), 0, u->padded);
}

static void cpu_load_weights(mt_be *be, int slot, int unit)
{
    cpu_be *b = (cpu_be *)be;
    copy_unit(b, b->slots[slot], unit);
    if (unit == b->L + 1 && b->m->cfg.tie_word_embeddings) /* the head also reads the embedding matrix */
        copy_unit(b, b->slots[slot] + unit_desc(b, unit)->padded, 0);
}

/* Work runs when issued: there is nothing to wait for or release. */
static void cpu_begin_visit(mt_be *be, int slot, int unit, int phase) { (void)be, (void)slot, (void)unit, (void)phase; }
static void cpu_end_visit(mt_be *be, int slot) { (void)be, (void)slot; }

/* Pointers to each tensor of a unit inside a block laid out like its tile. */
static void bind(float **w, float *block, const mt_unit_desc *u)
{
    memset(w, 0, MT_T_ROLE_COUNT * sizeof *w);
    for (int i = 0; i < u->n_tensors; i++) w[u->tensors[i].role] = block + u->tensors[i].offset;
}

static float *ck_at(cpu_be *b, int idx, int mb)
{
    return b->ck + ((size_t)idx * (size_t)b->shape.n_micro + (size_t)mb) * (size_t)b->T * (size_t)b->C;
}

/* A decoder layer's forward, leaving in the buffers of b everything the
 * backward needs: x (T, C) -> out (T, C). The backward's recompute passes
 * out NULL: the down projection only makes the output, which it never reads. */
static void layer_forward(cpu_be *b, float *const *w, const float *x, float *out)
{
    mt_pool *p = b->m->pool;
    const int T = b->T, C = b->C, Q = b->Q, KV = b->KV, F = b->F;
    const float eps = b->m->cfg.rms_norm_eps, scale = 1.0f / sqrtf((float)b->D);
    mt_cpu_rmsnorm(p, b->xn1, b->rstd1, x, w[MT_T_ATTN_NORM], T, C, eps);
    mt_cpu_matmul(p, b->ws, b->q, b->xn1, w[MT_T_Q], w[MT_T_Q_BIAS], T, C, Q, 0);
    mt_cpu_matmul(p, b->ws, b->k, b->xn1, w[MT_T_K], w[MT_T_K_BIAS], T, C, KV, 0);
    mt_cpu_matmul(p, b->ws, b->v, b->xn1, w[MT_T_V], w[MT_T_V_BIAS], T, C, KV, 0);
    mt_cpu_rope(p, b->q, b->pos, b->inv_freq, T, b->H, b->D, 0);
    mt_cpu_rope(p, b->k, b->pos, b->inv_freq, T, b->Hkv, b->D, 0);
    mt_cpu_attention(p, b->ws, b->att, b->lse, b->q, b->k, b->v, b->shape.n_seq, b->shape.seq_len, b->H, b->Hkv, b->D,
                     scale);
    memcpy(b->h, x, (size_t)T * C * sizeof(float));
    mt_cpu_matmul(p, b->ws, b->h, b->att, w[MT_T_O], NULL, T, Q, C, 1);
    mt_cpu_rmsnorm(p, b->xn2, b->rstd2, b->h, w[MT_T_MLP_NORM], T, C, eps);
    mt_cpu_matmul(p, b->ws, b->g, b->xn2, w[MT_T_GATE], NULL, T, C, F, 0);
    mt_cpu_matmul(p, b->ws, b->u, b->xn2, w[MT_T_UP], NULL, T, C, F, 0);
    mt_cpu_swiglu(p, b->a, b->g, b->u, (size_t)T * F);
    if (!out) return;
    memcpy(out, b->h, (size_t)T * C * sizeof(float));
    mt_cpu_matmul(p, b->ws, out, b->a, w[MT_T_DOWN], NULL, T, F, C, 1);
}

/* The layer's backward after layer_forward(x): dy (T, C) holds the output
 * gradient on entry and the input gradient on return; weight gradients add
 * into gw. */
static void layer_backward(cpu_be *b, float *const *w, float *const *gw, const float *x, float *dy)
{
    mt_pool *p = b->m->pool;
    const int T = b->T, C = b->C, Q = b->Q, KV = b->KV, F = b->F;
    const float eps = b->m->cfg.rms_norm_eps, scale = 1.0f / sqrtf((float)b->D);
    /* out = h + a Wd^T: dh = dy (kept in dy), da = dy Wd */
    mt_cpu_matmul_bwd(p, b->ws, b->da, gw[MT_T_DOWN], NULL, dy, b->a, w[MT_T_DOWN], T, F, C, 0);
    mt_cpu_swiglu_bwd(p, b->dg, b->du, b->da, b->g, b->u, (size_t)T * F);
    mt_cpu_matmul_bwd(p, b->ws, b->dxn, gw[MT_T_GATE], NULL, b->dg, b->xn2, w[MT_T_GATE], T, C, F, 0);
    mt_cpu_matmul_bwd(p, b->ws, b->dxn, gw[MT_T_UP], NULL, b->du, b->xn2, w[MT_T_UP], T, C, F, 1);
    mt_cpu_rmsnorm_bwd(p, dy, gw[MT_T_MLP_NORM], b->dxn, b->h, w[MT_T_MLP_NORM], b->rstd2, T, C, eps);
    /* h = x + att Wo^T: dx = dh, datt = dh Wo */
    mt_cpu_matmul_bwd(p, b->ws, b->datt, gw[MT_T_O], NULL, dy, b->att, w[MT_T_O], T, Q, C, 0);
    mt_cpu_attention_bwd(p, b->ws, b->dq, b->dk, b->dv, b->datt, b->att, b->lse, b->q, b->k, b->v, b->shape.n_seq,
                         b->shape.seq_len, b->H, b->Hkv, b->D, scale);
    mt_cpu_rope(p, b->dq, b->pos, b->inv_freq, T, b->H, b->D, 1);
    mt_cpu_rope(p, b->dk, b->pos, b->inv_freq, T, b->Hkv, b->D, 1);
    mt_cpu_matmul_bwd(p, b->ws, b->dxn, gw[MT_T_Q], gw[MT_T_Q_BIAS], b->dq, b->xn1, w[MT_T_Q], T, C, Q, 0);
    mt_cpu_matmul_bwd(p, b->ws, b->dxn, gw[MT_T_K], gw[MT_T_K_BIAS], b->dk, b->xn1, w[MT_T_K], T, C, KV, 1);
    mt_cpu_matmul_bwd(p, b->ws, b->dxn, gw[MT_T_V], gw[MT_T_V_BIAS], b->dv, b->xn1, w[MT_T_V], T, C, KV, 1);
    mt_cpu_rmsnorm_bwd(p, dy, gw[MT_T_ATTN_NORM], b->dxn, x, w[MT_T_ATTN_NORM], b->rstd1, T, C, eps);
}

static void cpu_forward(mt_be *be, int slot, int unit, int mb)
{
    cpu_be *b = (cpu_be *)be;
    float *w[MT_T_ROLE_COUNT];
    bind(w, b->slots[slot], unit_desc(b, unit));
    if (unit == 0)
        mt_cpu_embedding(b->m->pool, ck_at(b, 0, mb), b->tokens + (size_t)mb * b->T, w[MT_T_EMBED], b->T, b->C);
    else
        layer_forward(b, w, ck_at(b, unit - 1, mb), ck_at(b, unit, mb));
}

static void cpu_backward(mt_be *be, int slot, int unit, int mb)
{
    cpu_be *b = (cpu_be *)be;
    float *gw[MT_T_ROLE_COUNT];
    const mt_unit_desc *u = unit_desc(b, unit);
    if (unit == 0) {
        float *acc = b->tied_acc ? b->tied_acc : b->acc;
        mt_cpu_embedding_bwd(b->m->pool, acc, b->tokens + (size_t)mb * b->T, b->dx + (size_t)mb * b->T * b->C, b->T,
                             b->C, b->V);
        return;
    }
    float *w[MT_T_ROLE_COUNT];
    bind(w, b->slots[slot], u);
    bind(gw, b->acc, u);
    const float *x = ck_at(b, unit - 1, mb);
    layer_forward(b, w, x, NULL);
    layer_backward(b, w, gw, x, b->dx + (size_t)mb * b->T * b->C);
}

/* The final norm and the LM head over chunks of tokens: no (T, V) tensor. */
static void head_run(cpu_be *b, int slot, int mb, float loss_scale, int want_grad, float *logits_out)
{
    mt_pool *p = b->m->pool;
    const mt_unit_desc *u = unit_desc(b, b->L + 1);
    const int T = b->T, C = b->C, V = b->V;
    float *w[MT_T_ROLE_COUNT], *gw[MT_T_ROLE_COUNT];
    bind(w, b->slots[slot], u);
    bind(gw, b->acc, u);
    const float *lm = b->m->cfg.tie_word_embeddings ? b->slots[slot] + u->padded : w[MT_T_LM_HEAD];
    float *glm = b->m->cfg.tie_word_embeddings ? b->tied_acc : gw[MT_T_LM_HEAD];
    const float *x = ck_at(b, b->L, mb);
    mt_cpu_rmsnorm(p, b->xn1, b->rstd1, x, w[MT_T_FINAL_NORM], T, C, b->m->cfg.rms_norm_eps);
    if (logits_out) { /* the last position of each sequence: rows seq_len - 1 apart, one GEMM */
        const size_t S = (size_t)b->shape.seq_len;
        mt_cpu_gemm(p, b->ws, 0, 1, b->shape.n_seq, V, C, b->xn1 + (S - 1) * C, S * C, lm, C, logits_out, V, NULL, 0);
        return;
    }
    const int32_t *tg = b->targets + (size_t)mb * T;
    if (want_grad) memset(b->dxn, 0, (size_t)T * C * sizeof(float));
    for (int t0 = 0; t0 < T; t0 += HEAD_CHUNK) {
        int n = MT_MIN(HEAD_CHUNK, T - t0);
        const float *xc = b->xn1 + (size_t)t0 * C;
        mt_cpu_matmul(p, b->ws, b->logits, xc, lm, NULL, n, C, V, 0);
        b->loss_sum += mt_cpu_cross_entropy(p, b->logits, tg + t0, n, V, loss_scale, MT_IGNORE_INDEX, NULL);
        if (want_grad)
            mt_cpu_matmul_bwd(p, b->ws, b->dxn + (size_t)t0 * C, glm, NULL, b->logits, xc, lm, n, C, V, 0);
    }
    if (want_grad) {
        float *dx = b->dx + (size_t)mb * T * C;
        memset(dx, 0, (size_t)T * C * sizeof(float));
        mt_cpu_rmsnorm_bwd(p, dx, gw[MT_T_FINAL_NORM], b->dxn, x, w[MT_T_FINAL_NORM], b->rstd1, T, C,
                           b->m->cfg.rms_norm_eps);
    }
}

static void cpu_head(mt_be *be, int slot, int mb, float loss_scale, int want_grad)
{
    head_run((cpu_be *)be, slot, mb, loss_scale, want_grad, NULL);
}

static void cpu_head_logits(mt_be *be, int slot, int mb, float *out) { head_run((cpu_be *)be, slot, mb, 0, 0, out); }

static void cpu_begin_grads(mt_be *be, int unit)
{
    cpu_be *b = (cpu_be *)be;
    memset(b->acc, 0, unit_desc(b, unit)->padded * sizeof(float));
    if (unit == b->L + 1 && b->tied_acc) memset(b->tied_acc, 0, unit_desc(b, 0)->padded * sizeof(float));
}

static void cpu_send_grads(mt_be *be, int unit)
{
    cpu_be *b = (cpu_be *)be;
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->m->tiles.tile[unit];
    const float *src = unit == 0 && b->tied_acc ? b->tied_acc : b->acc;
    b->sumsq += mt_sumsq_f32(b->m->pool, src, u->padded);
    /* bf16 mode: into the weight block, which this step no longer reads */
    uint16_t *w = mt_tile_weights_bf16(t, u);
    if (w) mt_cpu_convert(b->m->pool, w, 1, src, 0, u->padded);
    else mt_cpu_convert(b->m->pool, mt_tile_grad_f32(t, u), 0, src, 0, u->padded);
}

static mt_status cpu_sync(mt_be *be, double *loss_sum, double *grad_sumsq, mt_err err)
{
    (void)err;
    cpu_be *b = (cpu_be *)be;
    *loss_sum = b->loss_sum;
    *grad_sumsq = b->sumsq;
    b->loss_sum = b->sumsq = 0;
    return MT_OK;
}

static const mt_be_ops cpu_ops = {
    .name = "CPU",
    .destroy = cpu_destroy,
    .reserve = cpu_reserve,
    .set_tokens = cpu_set_tokens,
    .load_weights = cpu_load_weights,
    .begin_visit = cpu_begin_visit,
    .end_visit = cpu_end_visit,
    .forward = cpu_forward,
    .head = cpu_head,
    .head_logits = cpu_head_logits,
    .backward = cpu_backward,
    .begin_grads = cpu_begin_grads,
    .send_grads = cpu_send_grads,
    .sync = cpu_sync,
};

mt_be *mt_cpu_backend_create(mt_model *m)
{
    cpu_be *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->base.ops = &cpu_ops;
    b->m = m;
    return &b->base;
}
