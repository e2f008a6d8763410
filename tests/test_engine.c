/* The training engine on the CPU backend: whole-model gradients against
 * finite differences, micro-batching, slot counts, determinism, the loss
 * mask, and bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"


enum { V = 37 };

static mt_model_config cfg_of_arch(mt_arch arch, int gqa, int bias, int tied, int precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.arch = arch;
    c.vocab_size = V;
    c.hidden_size = 24;
    c.intermediate_size = 40;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = gqa ? 2 : 4;
    c.attention_bias = (uint32_t)bias;
    c.tie_word_embeddings = (uint32_t)tied;
    c.precision = (uint32_t)precision;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.2f; /* large enough that every path carries gradient */
    c.seed = 7;
    return c;
}

static mt_model_config cfg_of(int gqa, int bias, int tied, int precision)
{
    return cfg_of_arch(bias ? MT_ARCH_QWEN2 : MT_ARCH_LLAMA, gqa, bias, tied, precision);
}

static mt_model *make(const mt_model_config *c, int slots)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.weight_slots = (uint32_t)slots;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

/* n tokens of pseudo-random data and next-token targets, some masked. */
static void fill(int32_t *tok, int32_t *tg, int n, unsigned seed, int mask_every)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        tok[i] = (int32_t)((seed >> 16) % V);
    }
    for (int i = 0; i < n; i++) tg[i] = (mask_every && i % mask_every == 0) ? MT_IGNORE_INDEX : tok[(i + 1) % n];
}

static mt_batch batch_of(const int32_t *tok, const int32_t *tg, int b, int s, int m)
{
    mt_batch x;
    mt_batch_init(&x);
    x.micro_batch_size = (uint32_t)b;
    x.seq_len = (uint32_t)s;
    x.num_micro_batches = (uint32_t)m;
    x.tokens = tok;
    x.targets = tg;
    return x;
}

static uint64_t count_targets(const int32_t *tg, int n)
{
    uint64_t c = 0;
    for (int i = 0; i < n; i++) c += tg[i] != MT_IGNORE_INDEX;
    return c;
}

static double eval_loss(mt_model *m, const mt_batch *b)
{
    mt_eval_stats s;
    mt_eval_stats_init(&s);
    cr_assert_eq(mt_eval(m, b, &s), MT_OK, "%s", mt_model_errmsg(m));
    return s.loss;
}

/* Whole-model gradient check in fp32 mode, where the streamed weights are the
 * master weights themselves. For every tensor, the directional derivative
 * along a random direction d: analytic <g, d> against the central difference
 * (L(w + eps d) - L(w - eps d)) / 2 eps. The forward is fp32, the loss about
 * 3.6 with rounding near 1e-7 relative, so with eps = 1e-2 the difference
 * carries ~1e-5 absolute noise plus O(eps^2) curvature error; tolerance
 * 2e-3 absolute + 2% relative. Qwen3's norms of q and k make every head's
 * q and k unit-RMS, so the attention logits (and the loss's curvature along
 * d) are larger than with small random q, k: it steps by eps 3e-3, whose
 * O(eps^2) error is 11x smaller, at ~3x the rounding noise (~3e-5). */
static void gradient_check_config(const mt_model_config *cfg, float eps, int per_layer)
{
    mt_model_config c = *cfg;
    mt_model *m = make(&c, 2);
    enum { B = 2, S = 9, M = 2, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 3, 5);
    mt_batch b = batch_of(tok, tg, B, S, M);
    double loss, norm;
    cr_assert_eq(mt_engine_grads(m, &b, count_targets(tg, N), &loss, &norm, NULL), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert(fabs(loss - eval_loss(m, &b)) < 1e-6, "training and evaluation compute the same loss");
    int checked = 0;
    for (int ui = 0; ui < m->layout.n_units; ui++) {
        const mt_unit_desc *u = &m->layout.units[ui];
        const mt_tile *t = &m->tiles.tile[ui];
        for (int ti = 0; ti < u->n_tensors; ti++) {
            const mt_tensor_desc *td = &u->tensors[ti];
            float *w = mt_tile_master(t, u) + td->offset;
            const float *g = mt_tile_grad_f32(t, u) + td->offset;
            float *d = malloc(td->numel * sizeof *d), *w0 = malloc(td->numel * sizeof *w0);
            double gd = 0;
            unsigned seed = 99u + (unsigned)(ui * 16 + ti);
            for (uint64_t i = 0; i < td->numel; i++) {
                seed = seed * 1664525u + 1013904223u;
                d[i] = ((float)(seed >> 8) / 16777216.0f) * 2.0f - 1.0f;
                gd += (double)g[i] * d[i];
            }
            memcpy(w0, w, td->numel * sizeof *w);
            for (uint64_t i = 0; i < td->numel; i++) w[i] = w0[i] + eps * d[i];
            double lp = eval_loss(m, &b);
            for (uint64_t i = 0; i < td->numel; i++) w[i] = w0[i] - eps * d[i];
            double lm = eval_loss(m, &b);
            memcpy(w, w0, td->numel * sizeof *w);
            double fd = (lp - lm) / (2.0 * eps);
            cr_assert(fabs(fd - gd) <= 2e-3 + 2e-2 * fabs(fd), "%s: analytic %.6g, finite difference %.6g", td->name, gd,
                      fd);
            cr_assert(fabs(gd) > 1e-4, "%s carries gradient (%.3g)", td->name, gd);
            checked++;
            free(d);
            free(w0);
        }
    }
    cr_assert_eq(checked, (int)(1 + 2 * per_layer + (c.tie_word_embeddings ? 1 : 2)));
    mt_model_destroy(m);
}

static void gradient_check_windowed(mt_arch arch, int gqa, int tied, float eps, uint32_t window, uint32_t from_layer)
{
    const int bias = arch == MT_ARCH_QWEN2, qk_norm = arch == MT_ARCH_QWEN3;
    mt_model_config c = cfg_of_arch(arch, gqa, bias, tied, MT_PRECISION_FP32);
    c.sliding_window = window, c.max_window_layers = from_layer;
    gradient_check_config(&c, eps, 9 + (bias ? 3 : 0) + (qk_norm ? 2 : 0));
}

static void gradient_check(mt_arch arch, int gqa, int tied, float eps)
{
    gradient_check_windowed(arch, gqa, tied, eps, 0, 0);
}

Test(engine, gradient_check_llama_gqa, .timeout = 120) { gradient_check(MT_ARCH_LLAMA, 1, 0, 1e-2f); }
Test(engine, gradient_check_qwen2_bias_tied, .timeout = 120) { gradient_check(MT_ARCH_QWEN2, 1, 1, 1e-2f); }
Test(engine, gradient_check_mha_tied, .timeout = 120) { gradient_check(MT_ARCH_LLAMA, 0, 1, 1e-2f); }
Test(engine, gradient_check_qwen3_gqa, .timeout = 120) { gradient_check(MT_ARCH_QWEN3, 1, 0, 3e-3f); }
/* Sequences of 9, a window of 4: Mistral's every layer, Qwen2's second layer
 * only (tied). Softmaxes over at most 4 keys curve the loss more than over
 * up to 9: at eps 1e-2 the tied Qwen2 case's O(eps^2) error reaches 17%
 * (layer 0's k_proj: 0.0175 analytic, 0.0146 by difference), at 3e-3 and
 * 1e-3 both agree within the bound; eps 3e-3 as for Qwen3. */
Test(engine, gradient_check_mistral_window, .timeout = 120) { gradient_check_windowed(MT_ARCH_MISTRAL, 1, 0, 3e-3f, 4, 0); }
Test(engine, gradient_check_qwen2_window, .timeout = 120) { gradient_check_windowed(MT_ARCH_QWEN2, 1, 1, 3e-3f, 4, 1); }

/* RoPE scalings: Qwen3 with YaRN (factor 4 over an original length of 4, DeepSeek's mscale settings, the
 * ramp left fractional), and Phi-3 turning half of each head (4 of head_dim 8) by LongRoPE, whose long
 * factors the 9-token sequences take (their last position passes the original length of 4). eps 3e-3 as for
 * Qwen3. */
static mt_model_config yarn_cfg(void)
{
    mt_model_config c = cfg_of_arch(MT_ARCH_QWEN3, 1, 0, 0, MT_PRECISION_FP32);
    c.rope_scaling = MT_ROPE_SCALING_YARN, c.rope_factor = 4.0f, c.rope_original_max_position = 4;
    c.rope_mscale = 0.707f, c.rope_mscale_all_dim = 1.0f, c.rope_no_truncate = 1, c.rope_beta_fast = 4.0f;
    return c;
}

static mt_model_config longrope_cfg(uint32_t original)
{
    mt_model_config c = cfg_of_arch(MT_ARCH_PHI3, 1, 0, 0, MT_PRECISION_FP32);
    c.head_dim = 8, c.partial_rotary_factor = 0.5f;
    c.rope_scaling = MT_ROPE_SCALING_LONGROPE, c.rope_factor = 16.0f, c.rope_original_max_position = original;
    c.rope_n_factors = 2;
    c.rope_short_factor[0] = 1.0f, c.rope_short_factor[1] = 1.5f;
    c.rope_long_factor[0] = 3.0f, c.rope_long_factor[1] = 7.0f;
    return c;
}

Test(engine, gradient_check_qwen3_yarn, .timeout = 120)
{
    const mt_model_config c = yarn_cfg();
    gradient_check_config(&c, 3e-3f, 11);
}

Test(engine, gradient_check_phi3_longrope_partial, .timeout = 120)
{
    const mt_model_config c = longrope_cfg(4);
    gradient_check_config(&c, 3e-3f, 9);
}

/* LongRoPE's table follows the micro-batch's positions: sequences of 9 use the long factors where the
 * original length is 4 and the short ones where it is 16; changing the other list changes nothing. */
Test(engine, longrope_factors_by_position)
{
    enum { B = 2, S = 9, M = 1, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 3, 5);
    const mt_batch b = batch_of(tok, tg, B, S, M);
    for (int orig = 4; orig <= 16; orig += 12) {
        double loss[3];
        for (int k = 0; k < 3; k++) {
            mt_model_config c = longrope_cfg((uint32_t)orig);
            if (k == 1) c.rope_short_factor[1] = 20.0f;
            if (k == 2) c.rope_long_factor[1] = 20.0f;
            mt_model *m = make(&c, 2);
            loss[k] = eval_loss(m, &b);
            mt_model_destroy(m);
        }
        const int long_ = orig < S;
        cr_assert_eq(loss[0], loss[long_ ? 1 : 2], "original %d: the unused factors changed the loss", orig);
        cr_assert(loss[0] != loss[long_ ? 2 : 1], "original %d: the factors in force changed nothing", orig);
    }
}

/* Gemma: (1 + w) norms (started at 0, so the scale is 1 and w's gradient is
 * that of a Llama norm), post norms, GELU-tanh, the scaled embedding, tied.
 * Gemma 2: attention scores capped at 1 (initializer 0.2 makes the raw
 * scores O(1), so tanh bends them) and logits capped at 1.5, every other
 * layer sliding over 4 of 9 positions. Gemma 3: per-head q/k norms, a
 * query_pre_attn_scalar other than head_dim, layer 0 sliding with its own
 * RoPE base, layer 1 full with linear RoPE scaling. eps 3e-3 as for the
 * windows and Qwen3 (softmaxes over few keys, unit-RMS q and k). */
static mt_model_config gemma_cfg(mt_arch arch)
{
    mt_model_config c = cfg_of_arch(arch, 1, 0, 1, MT_PRECISION_FP32);
    c.sliding_window = 4, c.sliding_window_pattern = 2;
    if (arch == MT_ARCH_GEMMA2) {
        c.attn_logit_softcapping = 1.0f, c.final_logit_softcapping = 1.5f;
    } else {
        c.query_pre_attn_scalar = 16.0f, c.rope_local_base_freq = 100.0f;
        c.rope_scaling = MT_ROPE_SCALING_LINEAR, c.rope_factor = 4.0f;
    }
    return c;
}

Test(engine, gradient_check_gemma2, .timeout = 120)
{
    const mt_model_config c = gemma_cfg(MT_ARCH_GEMMA2);
    gradient_check_config(&c, 3e-3f, 11);
}

Test(engine, gradient_check_gemma3, .timeout = 120)
{
    const mt_model_config c = gemma_cfg(MT_ARCH_GEMMA3);
    gradient_check_config(&c, 3e-3f, 13);
}

/* Each of Gemma's differences changes the loss: a wiring check that the
 * template passes every one to the kernels (the gradient checks above and
 * the transformers fixtures check what each computes). */
Test(engine, gemma_settings_each_change_the_loss)
{
    enum { B = 2, S = 9, N = B * S };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 3, 0);
    mt_batch b = batch_of(tok, tg, B, S, 1);
    static const char *const what[] = {"Gemma 2",   "no attention cap", "no logit cap", "no window",
                                       "Gemma 3",   "scalar = head_dim", "local base = rope_theta",
                                       "no linear scaling"};
    double loss[8];
    for (int i = 0; i < 8; i++) {
        mt_model_config c = gemma_cfg(i < 4 ? MT_ARCH_GEMMA2 : MT_ARCH_GEMMA3);
        if (i == 1) c.attn_logit_softcapping = 0.0f;
        if (i == 2) c.final_logit_softcapping = 0.0f;
        if (i == 3) c.sliding_window = 0, c.sliding_window_pattern = 0;
        if (i == 5) c.query_pre_attn_scalar = 0.0f;
        if (i == 6) c.rope_local_base_freq = 0.0f;
        if (i == 7) c.rope_scaling = MT_ROPE_SCALING_NONE;
        mt_model *m = make(&c, 2);
        loss[i] = eval_loss(m, &b);
        mt_model_destroy(m);
    }
    for (int i = 1; i < 8; i++) {
        if (i == 4) continue;
        const double ref = loss[i < 4 ? 0 : 4];
        cr_expect(fabs(loss[i] - ref) > 1e-6, "%s: loss %.9g, the same as with it (%.9g)", what[i], loss[i], ref);
    }
}

/* The window masks keys: the same model and batch with and without it give
 * other losses (a wiring check; the gradient checks above and the
 * transformers fixtures check what it computes), and a window as long as the
 * sequence the same bits as none. */
Test(engine, sliding_window_changes_the_loss_only_when_shorter)
{
    enum { B = 2, S = 9, M = 1, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 5, 0);
    mt_batch b = batch_of(tok, tg, B, S, M);
    double loss[3];
    const uint32_t windows[3] = {0, S, 3};
    for (int i = 0; i < 3; i++) {
        mt_model_config c = cfg_of_arch(MT_ARCH_MISTRAL, 1, 0, 0, MT_PRECISION_FP32);
        c.sliding_window = windows[i];
        mt_model *m = make(&c, 2);
        loss[i] = eval_loss(m, &b);
        mt_model_destroy(m);
    }
    cr_assert_eq(memcmp(&loss[0], &loss[1], sizeof loss[0]), 0, "window == seq_len: %.9g vs %.9g", loss[1], loss[0]);
    cr_assert(fabs(loss[2] - loss[0]) > 1e-4, "a window of 3 changes the loss: %.9g vs %.9g", loss[2], loss[0]);
}

static void copy_grads(mt_model *m, float *out)
{
    size_t k = 0;
    for (int ui = 0; ui < m->layout.n_units; ui++) {
        const mt_unit_desc *u = &m->layout.units[ui];
        for (int ti = 0; ti < u->n_tensors; ti++) {
            const mt_tensor_desc *td = &u->tensors[ti];
            memcpy(out + k, mt_tile_grad_f32(&m->tiles.tile[ui], u) + td->offset, td->numel * sizeof(float));
            k += td->numel;
        }
    }
}

/* M micro-batches of b sequences against one micro-batch of M*b: the same
 * sums in another order, so fp32 agreement: loss to 1e-6 relative, every
 * gradient to 1e-5 of the largest, and after an AdamW step (eps 1e-3 keeps
 * the update's sensitivity to the gradient at most lr/eps = 1) the weights
 * to 1e-6. */
Test(engine, micro_batches_match_one_large_batch)
{
    mt_model_config c = cfg_of(1, 1, 0, MT_PRECISION_FP32);
    mt_model *a = make(&c, 2), *b1 = make(&c, 2);
    enum { N = 4 * 8 };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 11, 3);
    mt_batch split = batch_of(tok, tg, 1, 8, 4), whole = batch_of(tok, tg, 4, 8, 1);
    double la, lb, na, nb;
    uint64_t nt = count_targets(tg, N);
    cr_assert_eq(mt_engine_grads(a, &split, nt, &la, &na, NULL), MT_OK);
    cr_assert_eq(mt_engine_grads(b1, &whole, nt, &lb, &nb, NULL), MT_OK);
    cr_assert(fabs(la - lb) <= 1e-6 * fabs(lb), "loss %.9g vs %.9g", la, lb);
    uint64_t P = a->layout.num_params;
    float *ga = malloc(P * sizeof *ga), *gb = malloc(P * sizeof *gb);
    copy_grads(a, ga);
    copy_grads(b1, gb);
    float gmax = 0;
    for (uint64_t i = 0; i < P; i++) gmax = fmaxf(gmax, fabsf(gb[i]));
    for (uint64_t i = 0; i < P; i++) cr_assert(fabsf(ga[i] - gb[i]) <= 1e-5f * gmax, "grad %llu: %g vs %g", (unsigned long long)i, ga[i], gb[i]);
    free(ga);
    free(gb);

    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-3f;
    o.eps = 1e-3f;
    mt_step_stats sa, sb;
    mt_step_stats_init(&sa);
    mt_step_stats_init(&sb);
    cr_assert_eq(mt_step(a, &split, &o, &sa), MT_OK);
    cr_assert_eq(mt_step(b1, &whole, &o, &sb), MT_OK);
    cr_assert_eq(sa.tokens, 32);
    cr_assert_eq(sa.target_tokens, nt);
    for (int ui = 0; ui < a->layout.n_units; ui++) {
        const mt_unit_desc *u = &a->layout.units[ui];
        const float *wa = mt_tile_master(&a->tiles.tile[ui], u), *wb = mt_tile_master(&b1->tiles.tile[ui], u);
        for (uint64_t i = 0; i < u->padded; i++) cr_assert(fabsf(wa[i] - wb[i]) <= 1e-6f, "unit %d weight %llu", ui, (unsigned long long)i);
    }
    mt_model_destroy(a);
    mt_model_destroy(b1);
}

/* The head in chunks of 5 tokens, its weight gradient once per chunk or once per
 * 3 chunks (the last group 13 tokens: 5, 5 and a short 3), against one chunk
 * of all 58: the same sums in another order (the head's weight gradient over
 * 5, 15 or 58 rows at a time, dx row by row as before), so fp32 agreement: the
 * loss to 1e-6 relative, every gradient to 1e-5 of the largest. A group
 * multiplied with the wrong rows of the normed input, or a chunk's dlogits
 * left out of its group, is off by the gradient's own size. */
Test(engine, head_gradient_groups_match_one_chunk)
{
    mt_model_config c = cfg_of(1, 1, 0, MT_PRECISION_FP32);
    mt_model *whole = make(&c, 2), *per_chunk = make(&c, 2), *grouped = make(&c, 2);
    whole->head_chunk_tokens = 1000;
    per_chunk->head_chunk_tokens = 5;
    grouped->head_chunk_tokens = 5;
    grouped->head_dw_tokens = 15;
    enum { N = 2 * 29 };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 5, 4);
    mt_batch b = batch_of(tok, tg, 2, 29, 1);
    const uint64_t nt = count_targets(tg, N), P = whole->layout.num_params;
    double lw, nw;
    cr_assert_eq(mt_engine_grads(whole, &b, nt, &lw, &nw, NULL), MT_OK, "%s", mt_model_errmsg(whole));
    float *gw = malloc(P * sizeof *gw), *g = malloc(P * sizeof *g);
    copy_grads(whole, gw);
    float gmax = 0;
    for (uint64_t i = 0; i < P; i++) gmax = fmaxf(gmax, fabsf(gw[i]));
    cr_assert(gmax > 0);
    mt_model *other[] = {per_chunk, grouped};
    for (int k = 0; k < 2; k++) {
        double l, n;
        cr_assert_eq(mt_engine_grads(other[k], &b, nt, &l, &n, NULL), MT_OK, "%s", mt_model_errmsg(other[k]));
        cr_assert(fabs(l - lw) <= 1e-6 * fabs(lw), "%s: loss %.9g vs %.9g", k ? "grouped" : "per chunk", l, lw);
        copy_grads(other[k], g);
        for (uint64_t i = 0; i < P; i++)
            cr_assert(fabsf(g[i] - gw[i]) <= 1e-5f * gmax, "%s: grad %llu: %g vs %g", k ? "grouped" : "per chunk",
                      (unsigned long long)i, g[i], gw[i]);
    }
    free(gw);
    free(g);
    mt_model_destroy(whole);
    mt_model_destroy(per_chunk);
    mt_model_destroy(grouped);
}

static int tiles_equal(const mt_model *a, const mt_model *b)
{
    for (int ui = 0; ui < a->layout.n_units; ui++)
        if (memcmp(a->tiles.tile[ui].base, b->tiles.tile[ui].base, a->layout.units[ui].tile_bytes)) return 0;
    return 1;
}

static void train_steps(mt_model *m, int steps, unsigned seed)
{
    enum { N = 2 * 2 * 16 };
    int32_t tok[N], tg[N];
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-2f;
    o.warmup_steps = 2;
    o.total_steps = (uint32_t)steps;
    for (int s = 0; s < steps; s++) {
        fill(tok, tg, N, seed + (unsigned)s, 4);
        mt_batch b = batch_of(tok, tg, 2, 16, 2);
        mt_step_stats st;
        mt_step_stats_init(&st);
        cr_assert_eq(mt_step(m, &b, &o, &st), MT_OK, "%s", mt_model_errmsg(m));
        cr_assert(isfinite(st.loss) && st.grad_norm > 0);
    }
}

/* nn.Embedding(padding_idx=pad_token_id): the padding row starts at zero and its lookups add no
 * gradient to it. A model with pad 3 against one without whose row 3 is zeroed by hand: the same
 * forward, so the same loss and every gradient the same bits but row 3's, which is zero (untied)
 * or the LM head's part alone, not zero (tied; its value is checked against transformers by the
 * parity fixtures). AdamW then leaves an untied zero row at zero (its moments stay zero;
 * decoupled decay of zero is zero). */
static void padding_row(int tied)
{
    mt_model_config c = cfg_of(1, 0, tied, MT_PRECISION_FP32);
    c.pad_token_id = 3;
    mt_model *a = make(&c, 2);
    c.pad_token_id = -1;
    mt_model *b = make(&c, 2);
    const mt_unit_desc *u = &a->layout.units[0];
    const mt_tensor_desc *e = &u->tensors[0];
    cr_assert_eq(e->role, MT_T_EMBED);
    const int C = (int)c.hidden_size;
    float *wa = mt_tile_master(&a->tiles.tile[0], u) + e->offset, *wb = mt_tile_master(&b->tiles.tile[0], u) + e->offset;
    for (int v = 0; v < V; v++)
        for (int k = 0; k < C; k++) {
            if (v == 3) cr_assert_eq(wa[v * C + k], 0.0f, "the padding row starts at zero");
            else cr_assert_eq(wa[v * C + k], wb[v * C + k], "row %d as without a padding row", v);
        }
    memset(wb + 3 * C, 0, (size_t)C * sizeof *wb);
    enum { N = 4 * 8 };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 12, 0);
    tok[0] = tok[9] = tok[17] = 3; /* pad tokens in the batch, predicted too */
    tg[5] = 3;
    mt_batch bt = batch_of(tok, tg, 2, 8, 2);
    const uint64_t nt = count_targets(tg, N);
    double la, lb, na, nb;
    cr_assert_eq(mt_engine_grads(a, &bt, nt, &la, &na, NULL), MT_OK, "%s", mt_model_errmsg(a));
    cr_assert_eq(mt_engine_grads(b, &bt, nt, &lb, &nb, NULL), MT_OK, "%s", mt_model_errmsg(b));
    cr_assert_eq(la, lb, "the same forward");
    const uint64_t P = a->layout.num_params;
    float *ga = malloc(P * sizeof *ga), *gb = malloc(P * sizeof *gb);
    copy_grads(a, ga);
    copy_grads(b, gb);
    float rmax = 0;
    for (int k = 0; k < C; k++) rmax = fmaxf(rmax, fabsf(gb[3 * C + k]));
    cr_assert_gt(rmax, 0.0f, "the pad tokens' lookups give row 3 a gradient without padding_idx");
    int row_zero = 1;
    for (uint64_t i = 0; i < P; i++) {
        const int in_row = i >= 3 * (uint64_t)C && i < 4 * (uint64_t)C;
        if (in_row) row_zero &= ga[i] == 0.0f;
        else cr_assert(memcmp(&ga[i], &gb[i], sizeof ga[i]) == 0, "grad %llu: %g vs %g", (unsigned long long)i, ga[i],
                       gb[i]);
    }
    if (!tied) cr_assert(row_zero, "an untied padding row gets no gradient");
    else cr_assert(!row_zero, "a tied padding row keeps the LM head's gradient");
    free(ga), free(gb);
    if (!tied) {
        train_steps(a, 3, 5);
        for (int k = 0; k < C; k++) cr_assert_eq(wa[3 * C + k], 0.0f, "AdamW leaves the padding row at zero");
    }
    mt_model_destroy(a), mt_model_destroy(b);
}

Test(engine, padding_row_gets_no_gradient_from_lookups) { padding_row(0); }
Test(engine, tied_padding_row_keeps_the_heads_gradient) { padding_row(1); }

Test(engine, two_and_three_slots_are_bit_identical)
{
    for (int prec = 0; prec <= 1; prec++) {
        mt_model_config c = cfg_of(1, 0, 1, prec);
        mt_model *a = make(&c, 2), *b = make(&c, 3);
        train_steps(a, 4, 5);
        train_steps(b, 4, 5);
        cr_assert(tiles_equal(a, b), "precision %d: K=2 and K=3 give the same bits", prec);
        cr_assert_eq(mt_model_step_count(a), 4);
        mt_model_destroy(a);
        mt_model_destroy(b);
    }
}

/* Checkpoints the backward recomputes (engine/backend.h: mt_ck_recomputed)
 * instead of keeping: layer u-1's forward runs again before layer u's
 * backward, into one spare row. A forward is deterministic, so the bits do
 * not change: 1, 2 and all 3 that a 6-layer model allows (a request for more
 * is capped) train to the tiles of a model that keeps every checkpoint, in
 * both precisions, over micro-batches; and the backend holds that many rows
 * fewer (one spare more). */
Test(engine, recomputed_checkpoints_are_bit_identical)
{
    for (int prec = 0; prec <= 1; prec++) {
        mt_model_config c = cfg_of(1, 1, 0, prec);
        c.num_hidden_layers = 6;
        enum { RUNS = 4 };
        const uint32_t asked[RUNS] = {0, 1, 2, 9};
        const int held[RUNS] = {0, 1, 2, 3};
        mt_model *m[RUNS];
        for (int i = 0; i < RUNS; i++) {
            m[i] = make(&c, 2);
            m[i]->recomputed_checkpoints = asked[i];
            train_steps(m[i], 3, 21);
            cr_assert_eq(m[i]->be->held.recomputed, held[i], "precision %d: asked %u, holds %d", prec, asked[i],
                         m[i]->be->held.recomputed);
            const uint64_t row = m[0]->be->held.checkpoint_bytes / 7; /* L + 1 rows without recompute */
            cr_assert_eq(m[i]->be->held.checkpoint_bytes, (uint64_t)(7 - held[i] + (held[i] > 0)) * row);
        }
        for (int i = 1; i < RUNS; i++)
            cr_assert(tiles_equal(m[0], m[i]), "precision %d: %d checkpoints recomputed give other bits", prec,
                      held[i]);
        for (int i = 0; i < RUNS; i++) mt_model_destroy(m[i]);
    }
}

Test(engine, same_seed_same_bits)
{
    mt_model_config c = cfg_of(1, 1, 0, MT_PRECISION_BF16);
    mt_model *a = make(&c, 2), *b = make(&c, 2);
    train_steps(a, 5, 9);
    train_steps(b, 5, 9);
    cr_assert(tiles_equal(a, b));
    mt_model *d = make(&c, 2);
    train_steps(d, 5, 10); /* other data */
    cr_assert(!tiles_equal(a, d));
    mt_model_destroy(a);
    mt_model_destroy(b);
    mt_model_destroy(d);
}

/* The loss is the mean over unmasked targets: masking changes it exactly as
 * the mean of the per-token losses over the kept ones. */
Test(engine, ignore_index_masks_targets)
{
    mt_model_config c = cfg_of(1, 0, 0, MT_PRECISION_FP32);
    mt_model *m = make(&c, 2);
    enum { S = 12 };
    int32_t tok[S], all[S], one[S];
    fill(tok, all, S, 21, 0);
    double sum = 0;
    for (int k = 0; k < S; k++) {
        for (int i = 0; i < S; i++) one[i] = i == k ? all[i] : MT_IGNORE_INDEX;
        mt_batch b = batch_of(tok, one, 1, S, 1);
        sum += eval_loss(m, &b);
    }
    mt_batch b = batch_of(tok, all, 1, S, 1);
    cr_assert(fabs(eval_loss(m, &b) - sum / S) < 1e-6, "mean of per-token losses");
    mt_model_destroy(m);
}

Test(engine, learns_a_pattern)
{
    mt_model_config c = cfg_of(1, 0, 1, MT_PRECISION_BF16);
    mt_model *m = make(&c, 2);
    enum { N = 4 * 16 };
    int32_t tok[N], tg[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 5) % V;
    for (int i = 0; i < N; i++) tg[i] = ((i + 1) * 5) % V;
    mt_batch b = batch_of(tok, tg, 4, 16, 1);
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-2f;
    o.total_steps = 60;
    double first = 0, last = 0;
    for (int s = 0; s < 60; s++) {
        mt_step_stats st;
        mt_step_stats_init(&st);
        cr_assert_eq(mt_step(m, &b, &o, &st), MT_OK);
        if (s == 0) first = st.loss;
        last = st.loss;
    }
    cr_assert(first > 3.0 && last < 0.3, "loss %g -> %g", first, last);
    mt_model_destroy(m);
}

Test(engine, bad_batches_are_refused_and_change_nothing)
{
    mt_model_config c = cfg_of(1, 0, 0, MT_PRECISION_BF16);
    mt_model *m = make(&c, 2), *ref = make(&c, 2);
    enum { N = 2 * 8 };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 4, 0);
    mt_optim_config o;
    mt_optim_config_init(&o);
    mt_batch b = batch_of(tok, tg, 2, 8, 1);

    tok[5] = V;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "token id 37 at position 5"), "%s", mt_model_errmsg(m));
    tok[5] = 1;
    tg[3] = -5;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "target id -5 at position 3"), "%s", mt_model_errmsg(m));
    for (int i = 0; i < N; i++) tg[i] = MT_IGNORE_INDEX;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "nothing to learn"), "%s", mt_model_errmsg(m));
    fill(tok, tg, N, 4, 0);
    b.seq_len = 65;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "max_position_embeddings"), "%s", mt_model_errmsg(m));
    b = batch_of(NULL, tg, 2, 8, 1);
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    b = batch_of(tok, tg, 2, 8, 1);
    b.struct_size = 4;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_STRUCT_SIZE);
    b = batch_of(tok, tg, 2, 8, 1);
    o.lr = -1;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_step(NULL, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_model_step_count(m), 0);
    cr_assert(tiles_equal(m, ref), "refused steps left the model as it was");
    mt_model_destroy(m);
    mt_model_destroy(ref);
}

Test(engine, non_finite_loss_leaves_the_model_unchanged)
{
    mt_model_config c = cfg_of(1, 0, 0, MT_PRECISION_BF16);
    mt_model *m = make(&c, 2);
    /* poison one weight of the head's final norm: loss and gradients turn NaN */
    const mt_unit_desc *h = &m->layout.units[m->layout.n_units - 1];
    mt_tile_master(&m->tiles.tile[m->layout.n_units - 1], h)[0] = NAN;
    mt_tile_weights_bf16(&m->tiles.tile[m->layout.n_units - 1], h)[0] = 0x7fc0;
    mt_model *ref = NULL;
    enum { N = 2 * 8 };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 4, 0);
    mt_batch b = batch_of(tok, tg, 2, 8, 1);
    mt_optim_config o;
    mt_optim_config_init(&o);
    /* snapshot */
    size_t total = 0;
    for (int ui = 0; ui < m->layout.n_units; ui++) total += m->layout.units[ui].tile_bytes;
    unsigned char *snap = malloc(total), *p = snap;
    for (int ui = 0; ui < m->layout.n_units; ui++) {
        memcpy(p, m->tiles.tile[ui].base, m->layout.units[ui].tile_bytes);
        p += m->layout.units[ui].tile_bytes;
    }
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_NONFINITE);
    cr_assert(strstr(mt_model_errmsg(m), "weights left unchanged"), "%s", mt_model_errmsg(m));
    p = snap;
    for (int ui = 0; ui < m->layout.n_units; ui++) {
        cr_assert_eq(memcmp(p, m->tiles.tile[ui].base, m->layout.units[ui].tile_bytes), 0, "unit %d restored", ui);
        p += m->layout.units[ui].tile_bytes;
    }
    cr_assert_eq(mt_model_step_count(m), 0);
    free(snap);
    mt_model_destroy(ref);
    mt_model_destroy(m);
}

Test(engine, logits_match_the_loss)
{
    mt_model_config c = cfg_of(1, 0, 0, MT_PRECISION_FP32);
    mt_model *m = make(&c, 2);
    enum { S = 10 };
    int32_t tok[S], tg[S];
    fill(tok, tg, S, 8, 0);
    float logits[V];
    cr_assert_eq(mt_model_logits(m, tok, 1, S, logits), MT_OK, "%s", mt_model_errmsg(m));
    /* the loss of the last position alone is logsumexp - logit[target] */
    for (int i = 0; i < S - 1; i++) tg[i] = MT_IGNORE_INDEX;
    tg[S - 1] = 3;
    double mx = -1e30, se = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, logits[v]);
    for (int v = 0; v < V; v++) se += exp(logits[v] - mx);
    mt_batch b = batch_of(tok, tg, 1, S, 1);
    cr_assert(fabs(eval_loss(m, &b) - (mx + log(se) - logits[3])) < 1e-5);
    mt_model_destroy(m);
}

/* The state a step may change: the streamed bf16 copy, the master weights
 * and the moments; not the fp32 mode's gradient block, a landing zone that
 * every step writes before it reads. */
static int state_equal(const mt_model *a, const mt_model *b)
{
    for (int ui = 0; ui < a->layout.n_units; ui++) {
        const mt_unit_desc *u = &a->layout.units[ui];
        const mt_tile *ta = &a->tiles.tile[ui], *tb = &b->tiles.tile[ui];
        if (u->weight_bytes && memcmp(ta->base + u->weight_off, tb->base + u->weight_off, u->weight_bytes)) return 0;
        if (memcmp(mt_tile_master(ta, u), mt_tile_master(tb, u), u->padded * 4) ||
            memcmp(mt_tile_m(ta, u), mt_tile_m(tb, u), u->padded * 4) ||
            memcmp(mt_tile_v(ta, u), mt_tile_v(tb, u), u->padded * 4))
            return 0;
    }
    return 1;
}

/* The abort callback: counts its polls and asks to stop at poll `stop_at`
 * (1-based; 0 never). */
typedef struct abort_probe {
    int polls;
    int stop_at;
} abort_probe;

static int probe_abort(void *user_data)
{
    abort_probe *p = user_data;
    return ++p->polls == p->stop_at;
}

static mt_model *make_abortable(const mt_model_config *c, abort_probe *probe)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.log_level = MT_LOG_ERROR;
    p.abort_callback = probe_abort;
    p.abort_user_data = probe;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

/* A step stopped at any of its polls (before every micro-batch of every
 * visit: forward, head, backward) returns MT_ERR_ABORTED and leaves every
 * byte of every tile and the step count as they were; the model then trains
 * on bit-identically with one that was never stopped. */
Test(engine, abort_at_every_poll_leaves_the_model_as_it_was, .timeout = 120)
{
    enum { MB = 2, B = 2, S = 8, N = MB * B * S };
    int32_t tok[N], tg[N];
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-2f;
    for (int prec = 0; prec <= 1; prec++) {
        mt_model_config c = cfg_of(1, 0, 0, prec);
        abort_probe probe = {0, 0};
        mt_model *a = make_abortable(&c, &probe), *ref = make(&c, 2);
        fill(tok, tg, N, 3, 0);
        mt_batch b = batch_of(tok, tg, B, S, MB);
        /* one step first, so that the optimizer state is not all zero */
        cr_assert_eq(mt_step(a, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(a));
        cr_assert_eq(mt_step(ref, &b, &o, NULL), MT_OK);
        const int per_step = probe.polls;
        const int visits = 2 * (int)c.num_hidden_layers + 3;
        cr_assert_eq(per_step, visits * MB, "one poll per micro-batch of each visit: %d", per_step);
        for (int k = 1; k <= per_step; k++) {
            fill(tok, tg, N, 10u + (unsigned)k, 3);
            probe = (abort_probe){0, k};
            cr_assert_eq(mt_step(a, &b, &o, NULL), MT_ERR_ABORTED, "precision %d, poll %d", prec, k);
            cr_assert(strstr(mt_model_errmsg(a), "abort callback"), "%s", mt_model_errmsg(a));
            cr_assert_eq(probe.polls, k, "no poll after the stop");
            cr_assert_eq(mt_model_step_count(a), mt_model_step_count(ref));
            cr_assert(state_equal(a, ref), "precision %d: stopped at poll %d of %d, the model changed", prec, k,
                      per_step);
            probe.stop_at = 0;
            mt_step_stats sa, sr;
            mt_step_stats_init(&sa);
            mt_step_stats_init(&sr);
            cr_assert_eq(mt_step(a, &b, &o, &sa), MT_OK, "%s", mt_model_errmsg(a));
            cr_assert_eq(mt_step(ref, &b, &o, &sr), MT_OK);
            cr_assert_eq(sa.loss, sr.loss, "precision %d, after poll %d: the next step's loss", prec, k);
            cr_assert(tiles_equal(a, ref));
        }
        /* evaluation and logits stop the same way */
        mt_eval_stats es;
        mt_eval_stats_init(&es);
        probe = (abort_probe){0, 2};
        cr_assert_eq(mt_eval(a, &b, &es), MT_ERR_ABORTED);
        float *logits = malloc(sizeof(float) * B * V);
        probe = (abort_probe){0, 1};
        cr_assert_eq(mt_model_logits(a, tok, B, S, logits), MT_ERR_ABORTED);
        probe.stop_at = 0;
        cr_assert_eq(mt_model_logits(a, tok, B, S, logits), MT_OK, "%s", mt_model_errmsg(a));
        free(logits);
        cr_assert(tiles_equal(a, ref));
        mt_model_destroy(a);
        mt_model_destroy(ref);
    }
}

/* Documents one to a sequence, padded (what a document file's windows are
 * until attention keeps packed documents apart): the loss and every
 * gradient equal those of the documents run alone, unpadded, weighted by
 * their targets. fp32, the same sums in another grouping: loss to 1e-6
 * relative, gradients to 1e-5 of the largest. The padding (token 0) follows
 * each document, so causal attention never lets a document see it. */
Test(engine, padded_documents_match_the_documents_alone)
{
    mt_model_config c = cfg_of(1, 0, 0, MT_PRECISION_FP32);
    enum { S = 10, D = 3 };
    const int len[D] = {10, 4, 7}; /* inputs of each document */
    int32_t tok[D * S], tg[D * S];
    fill(tok, tg, D * S, 21, 0);
    for (int d = 0; d < D; d++) {
        for (int j = 0; j < S; j++) {
            if (j >= len[d]) tok[d * S + j] = 0, tg[d * S + j] = MT_IGNORE_INDEX;
        }
        tg[d * S + 1] = MT_IGNORE_INDEX; /* a masked prompt token too */
    }
    const uint64_t P = (uint64_t)D * S;
    const uint64_t nt = count_targets(tg, (int)P);
    mt_model *whole = make(&c, 2);
    mt_batch padded = batch_of(tok, tg, D, S, 1);
    double loss, norm;
    cr_assert_eq(mt_engine_grads(whole, &padded, nt, &loss, &norm, NULL), MT_OK, "%s", mt_model_errmsg(whole));
    const uint64_t n_params = whole->layout.num_params;
    float *gw = malloc(n_params * sizeof *gw), *gd = calloc(n_params, sizeof *gd), *g1 = malloc(n_params * sizeof *g1);
    copy_grads(whole, gw);
    double loss_sum = 0;
    for (int d = 0; d < D; d++) {
        mt_model *one = make(&c, 2);
        mt_batch alone = batch_of(tok + d * S, tg + d * S, 1, len[d], 1);
        const uint64_t n = count_targets(tg + d * S, len[d]);
        double l, nrm;
        cr_assert_eq(mt_engine_grads(one, &alone, n, &l, &nrm, NULL), MT_OK, "%s", mt_model_errmsg(one));
        copy_grads(one, g1);
        for (uint64_t i = 0; i < n_params; i++) gd[i] += g1[i] * (float)((double)n / (double)nt);
        loss_sum += l * (double)n;
        mt_model_destroy(one);
    }
    cr_assert(fabs(loss - loss_sum / (double)nt) <= 1e-6 * fabs(loss), "loss %.9g vs %.9g", loss, loss_sum / (double)nt);
    float gmax = 0;
    for (uint64_t i = 0; i < n_params; i++) gmax = fmaxf(gmax, fabsf(gw[i]));
    for (uint64_t i = 0; i < n_params; i++)
        cr_assert(fabsf(gw[i] - gd[i]) <= 1e-5f * gmax, "grad %llu: %g vs %g", (unsigned long long)i, gw[i], gd[i]);
    free(gw), free(gd), free(g1);
    mt_model_destroy(whole);
}
