/* Data parallelism (engine/group.c) with simulated ranks: the CPU backend as
 * G ranks of a group, which divide each step's micro-batches and reduce their
 * gradients in slices (the CUDA backend does the same over NCCL; its tests
 * need GPUs). A step on G ranks gives the loss, the gradients and, step after
 * step, the weights of the same step on one backend, up to the order of the
 * reduction's sums; the policy's device list is checked; the plan counts
 * each GPU's share. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "optim/optimizer.h"
#include "optim/q16.h"

enum { V = 37, S = 16, B = 2, M = 12, N = M * B * S };

static mt_model_config cfg_of(int precision, int tied)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.arch = tied ? MT_ARCH_QWEN2 : MT_ARCH_LLAMA;
    c.attention_bias = (uint32_t)tied;
    c.tie_word_embeddings = (uint32_t)tied;
    c.vocab_size = V;
    c.hidden_size = 24;
    c.intermediate_size = 40;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.2f;
    c.precision = (uint32_t)precision;
    c.seed = 11;
    return c;
}

static mt_model *make_fetching(const mt_model_config *c, int ranks, mt_weight_fetch fetch)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.weight_fetch = (uint32_t)fetch;
    p.optimizer_threads = 2;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    m->sim_ranks = ranks;
    return m;
}

static mt_model *make(const mt_model_config *c, int ranks) { return make_fetching(c, ranks, MT_FETCH_AUTO); }

static void fill(int32_t *tok, int32_t *tg)
{
    unsigned seed = 99;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(((seed = seed * 1103515245u + 12345u) >> 16) % V);
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 2 ? MT_IGNORE_INDEX : tok[(i + 1) % N];
}

static mt_batch batch_of(const int32_t *tok, const int32_t *tg, int n_micro)
{
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = B, b.seq_len = S, b.num_micro_batches = (uint32_t)n_micro, b.tokens = tok, b.targets = tg;
    return b;
}

static uint64_t targets(const int32_t *tg, int n)
{
    uint64_t c = 0;
    for (int i = 0; i < n; i++) c += tg[i] != MT_IGNORE_INDEX;
    return c;
}

/* Element e of unit u's gradient block as fp32 (bf16 and lean: the bf16 the tile received). */
static double grad_at(const mt_model *m, int u, uint64_t e)
{
    const mt_unit_desc *d = &m->layout.units[u];
    const mt_tile *t = &m->tiles.tile[u];
    const float *g32 = mt_tile_grad_f32(t, d);
    return g32 ? g32[e] : mt_bf16_to_f32(mt_tile_grad_bf16(t, d)[e]);
}

/* The gradients of one step of M micro-batches on 1 and on G ranks: the
 * loss to 1e-12 relative (sums of the same per-token terms in double, in
 * another order), the norm to 1e-6 (fp32 sums of M contributions in
 * another order), and every element within 1e-5 of its tensor's largest in
 * fp32, or one bf16 ulp of it (up to 2^-7 relative, plus 1e-5) in bf16 and
 * lean modes: a sum in another order can round to the neighbouring bf16. */
static void same_gradients(int precision, int tied, int G)
{
    mt_model_config c = cfg_of(precision, tied);
    mt_model *one = make(&c, 1), *grp = make(&c, G);
    static int32_t tok[N], tg[N];
    fill(tok, tg);
    const mt_batch b = batch_of(tok, tg, M);
    const uint64_t nt = targets(tg, N);
    double l1, n1, lg, ng;
    cr_assert_eq(mt_engine_grads(one, &b, nt, &l1, &n1, NULL), MT_OK, "%s", mt_model_errmsg(one));
    cr_assert_eq(mt_engine_grads(grp, &b, nt, &lg, &ng, NULL), MT_OK, "%s", mt_model_errmsg(grp));
    cr_assert(fabs(lg - l1) <= 1e-12 * l1, "loss %.17g on %d ranks, %.17g on one", lg, G, l1);
    cr_assert(fabs(ng - n1) <= 1e-6 * n1, "gradient norm %.9g on %d ranks, %.9g on one", ng, G, n1);
    const double rel = precision == MT_PRECISION_FP32 ? 1e-5 : 1.0 / 128 + 1e-5;
    for (int u = 0; u < one->layout.n_units; u++) {
        const mt_unit_desc *d = &one->layout.units[u];
        for (int i = 0; i < d->n_tensors; i++) {
            const mt_tensor_desc *t = &d->tensors[i];
            double top = 0;
            for (uint64_t e = t->offset; e < t->offset + t->numel; e++) top = fmax(top, fabs(grad_at(one, u, e)));
            cr_assert_gt(top, 0.0, "%s has gradients", t->name);
            for (uint64_t e = t->offset; e < t->offset + t->numel; e++) {
                const double a = grad_at(grp, u, e), x = grad_at(one, u, e);
                cr_assert(fabs(a - x) <= rel * fmax(fabs(x), 1e-5 * top / rel) + 1e-5 * top,
                          "%s[%llu]: %.9g on %d ranks, %.9g on one", t->name, (unsigned long long)(e - t->offset), a,
                          G, x);
            }
        }
    }
    mt_model_destroy(one);
    mt_model_destroy(grp);
}

Test(group, gradients_of_two_ranks_fp32) { same_gradients(MT_PRECISION_FP32, 0, 2); }
Test(group, gradients_of_three_ranks_bf16_tied) { same_gradients(MT_PRECISION_BF16, 1, 3); }
Test(group, gradients_of_four_ranks_lean) { same_gradients(MT_PRECISION_LEAN, 0, 4); }
Test(group, gradients_of_six_ranks_fp32_tied) { same_gradients(MT_PRECISION_FP32, 1, 6); }

/* Five optimizer steps on 1 and on 3 ranks (fp32): the losses agree to
 * 1e-5 relative and the weights to 1e-4 of each tensor's largest (the
 * reductions' orders differ, and AdamW carries the differences on; a rank
 * that dropped its share or sent a slice to the wrong place is off by far
 * more: tests above). Under `make memcheck` (valgrind, MT_MEMCHECK set) two
 * steps: the second already runs every path again, behind the first's
 * update. */
Test(group, steps_on_three_ranks_train_as_one)
{
    mt_model_config c = cfg_of(MT_PRECISION_FP32, 1);
    mt_model *ms[2] = {make(&c, 1), make(&c, 3)};
    static int32_t tok[N], tg[N];
    fill(tok, tg);
    const mt_batch b = batch_of(tok, tg, M);
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-2f, o.warmup_steps = 0, o.total_steps = 5;
    const int steps = getenv("MT_MEMCHECK") ? 2 : 5;
    double loss[2][5];
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < steps; s++) {
            mt_step_stats st;
            mt_step_stats_init(&st);
            cr_assert_eq(mt_step(ms[k], &b, &o, &st), MT_OK, "%s", mt_model_errmsg(ms[k]));
            loss[k][s] = st.loss;
        }
    for (int s = 0; s < steps; s++)
        cr_assert(fabs(loss[1][s] - loss[0][s]) <= 1e-5 * loss[0][s], "step %d: loss %.9g on 3 ranks, %.9g on one", s,
                  loss[1][s], loss[0][s]);
    cr_assert_lt(loss[0][steps - 1], loss[0][0], "it trained");
    for (int u = 0; u < ms[0]->layout.n_units; u++) {
        const mt_unit_desc *d = &ms[0]->layout.units[u];
        const float *w1 = mt_tile_master(&ms[0]->tiles.tile[u], d), *w3 = mt_tile_master(&ms[1]->tiles.tile[u], d);
        for (int i = 0; i < d->n_tensors; i++) {
            const mt_tensor_desc *t = &d->tensors[i];
            double top = 0;
            for (uint64_t e = t->offset; e < t->offset + t->numel; e++) top = fmax(top, fabs(w1[e]));
            for (uint64_t e = t->offset; e < t->offset + t->numel; e++)
                cr_assert(fabs((double)w3[e] - w1[e]) <= 1e-4 * top, "%s[%llu]: %.9g on 3 ranks, %.9g on one",
                          t->name, (unsigned long long)(e - t->offset), w3[e], w1[e]);
        }
    }
    mt_model_destroy(ms[0]);
    mt_model_destroy(ms[1]);
}

/* Weights fetched in slices (MT_FETCH_SLICES: each rank converts its G-th
 * of a unit's slot, the group's gather copies in the others') against
 * fetched whole, on the same number of ranks: the same bits after two
 * steps, every tile (weights, gradients, moments) and every loss. Slices
 * that straddle a tied head and the embedding behind it, ranks whose slice
 * is short or empty (units of a few thousand elements in slices of 256 on
 * five ranks), lean codes converted from a slice's first block. A slice
 * left out, or gathered into the wrong place, computes with another unit's
 * weights and fails this. */
static void slices_fetch_the_same_bits(int precision, int tied, int G)
{
    mt_model_config c = cfg_of(precision, tied);
    mt_model *whole = make_fetching(&c, G, MT_FETCH_WHOLE), *sliced = make_fetching(&c, G, MT_FETCH_SLICES);
    static int32_t tok[N], tg[N];
    fill(tok, tg);
    const mt_batch b = batch_of(tok, tg, M);
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-2f, o.warmup_steps = 0;
    for (int s = 0; s < 2; s++) {
        mt_step_stats a, x;
        mt_step_stats_init(&a), mt_step_stats_init(&x);
        cr_assert_eq(mt_step(whole, &b, &o, &a), MT_OK, "%s", mt_model_errmsg(whole));
        cr_assert_eq(mt_step(sliced, &b, &o, &x), MT_OK, "%s", mt_model_errmsg(sliced));
        cr_assert_eq(memcmp(&a.loss, &x.loss, sizeof a.loss), 0, "step %d: loss %.17g in slices, %.17g whole", s, x.loss,
                     a.loss);
        cr_assert_eq(memcmp(&a.grad_norm, &x.grad_norm, sizeof a.grad_norm), 0, "step %d: gradient norm", s);
    }
    mt_optimizer_drain(&whole->opt);
    mt_optimizer_drain(&sliced->opt);
    for (int u = 0; u < whole->layout.n_units; u++)
        cr_assert_eq(memcmp(whole->tiles.tile[u].base, sliced->tiles.tile[u].base, whole->layout.units[u].tile_bytes),
                     0, "unit %d's tile differs in slices", u);
    mt_model_destroy(whole);
    mt_model_destroy(sliced);
}

Test(group, slices_fetch_the_same_bits_fp32_tied) { slices_fetch_the_same_bits(MT_PRECISION_FP32, 1, 2); }
Test(group, slices_fetch_the_same_bits_bf16_tied) { slices_fetch_the_same_bits(MT_PRECISION_BF16, 1, 3); }
Test(group, slices_fetch_the_same_bits_lean) { slices_fetch_the_same_bits(MT_PRECISION_LEAN, 0, 4); }
Test(group, slices_fetch_the_same_bits_lean_tied) { slices_fetch_the_same_bits(MT_PRECISION_LEAN, 1, 6); }

/* A training step gives every rank the same number of micro-batches: 7 on 2
 * ranks is refused by name, the model untouched; an evaluation and the
 * logits may leave ranks without any (2 micro-batches on 3 ranks, 1 for the
 * logits) and give one backend's results. */
Test(group, uneven_shares)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 0);
    mt_model *one = make(&c, 1), *two = make(&c, 2), *three = make(&c, 3);
    static int32_t tok[N], tg[N];
    fill(tok, tg);
    mt_batch b = batch_of(tok, tg, 7);
    mt_optim_config o;
    mt_optim_config_init(&o);
    cr_assert_eq(mt_step(two, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(two), "num_micro_batches 7 is not a multiple of the model's 2 GPUs"), "%s",
              mt_model_errmsg(two));
    cr_assert_eq(mt_model_step_count(two), 0);
    b = batch_of(tok, tg, 2);
    mt_eval_stats e1, e3;
    mt_eval_stats_init(&e1), mt_eval_stats_init(&e3);
    cr_assert_eq(mt_eval(one, &b, &e1), MT_OK, "%s", mt_model_errmsg(one));
    cr_assert_eq(mt_eval(three, &b, &e3), MT_OK, "%s", mt_model_errmsg(three));
    cr_assert(fabs(e3.loss - e1.loss) <= 1e-12 * e1.loss, "eval %.17g on 3 ranks, %.17g on one", e3.loss, e1.loss);
    static float l1[B * V], l3[B * V];
    cr_assert_eq(mt_model_logits(one, tok, B, S, l1), MT_OK, "%s", mt_model_errmsg(one));
    cr_assert_eq(mt_model_logits(three, tok, B, S, l3), MT_OK, "%s", mt_model_errmsg(three));
    cr_assert_eq(memcmp(l1, l3, sizeof l1), 0, "the logits of the one rank that runs them are one backend's");
    mt_model_destroy(one);
    mt_model_destroy(two);
    mt_model_destroy(three);
}

static void expect_policy_refusal(const mt_offload_policy *p, mt_status want, const char *needle)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 0);
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, p), want, "%s", mt_last_errmsg());
    cr_assert_null(m);
    cr_assert(strstr(mt_last_errmsg(), needle), "\"%s\" names %s", mt_last_errmsg(), needle);
}

/* The device list: refused by name when it cannot be a list of GPUs of this
 * host (checked before anything is allocated), and GPUs that are not there
 * (this test's machine may have none). */
Test(group, device_list_refusals)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.log_level = MT_LOG_ERROR;
    const int32_t dup[3] = {0, 1, 0}, neg[2] = {0, -2}, far[2] = {0, 63};
    p.num_devices = 2, p.backend = MT_BACKEND_CPU, p.devices = far;
    expect_policy_refusal(&p, MT_ERR_INVALID_ARGUMENT, "asks for several GPUs, but the backend is the CPU");
    p.backend = MT_BACKEND_CUDA, p.devices = NULL;
    expect_policy_refusal(&p, MT_ERR_INVALID_ARGUMENT, "devices is NULL, with num_devices 2");
    p.num_devices = 3, p.devices = dup;
    expect_policy_refusal(&p, MT_ERR_INVALID_ARGUMENT, "lists device 0 twice (entries 0 and 2)");
    p.num_devices = 2, p.devices = neg;
    expect_policy_refusal(&p, MT_ERR_INVALID_ARGUMENT, "devices[1] is -2, negative");
    p.num_devices = MT_MAX_DEVICES + 1, p.devices = far;
    expect_policy_refusal(&p, MT_ERR_INVALID_ARGUMENT, "at most 64 GPUs");
    p.num_devices = 2, p.weight_fetch = 3;
    expect_policy_refusal(&p, MT_ERR_INVALID_ARGUMENT, "weight_fetch 3 is not an mt_weight_fetch");
    p.weight_fetch = MT_FETCH_SLICES, p.devices = far; /* device 63: no machine this runs on has it */
    expect_policy_refusal(&p, MT_ERR_NO_DEVICE, "the policy asks for 2 GPUs");
}

/* The plan of G GPUs: each GPU holds what one GPU holds for M / G
 * micro-batches (and G slices of accumulator), and the host the tiles once. */
Test(group, plan_counts_each_gpus_share)
{
#ifdef MT_HAVE_CUDA
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 0);
    c.hidden_size = 512, c.intermediate_size = 1408, c.num_attention_heads = c.num_key_value_heads = 8;
    c.vocab_size = 4096, c.max_position_embeddings = 2048;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CUDA, p.gpu_budget_bytes = (uint64_t)80 << 30; /* a plan for a GPU that may not be here */
    p.host_budget_bytes = (uint64_t)1 << 40;
    mt_batch_shape s;
    mt_batch_shape_init(&s);
    s.micro_batch_size = 2, s.seq_len = 2048, s.num_micro_batches = 4;
    mt_memory_plan one, four;
    mt_memory_plan_init(&one), mt_memory_plan_init(&four);
    cr_assert_eq(mt_plan(&one, &c, &p, &s), MT_OK, "%s", mt_last_errmsg());
    const int32_t devs[4] = {0, 1, 2, 3};
    p.num_devices = 4, p.devices = devs;
    s.num_micro_batches = 16;
    cr_assert_eq(mt_plan(&four, &c, &p, &s), MT_OK, "%s", mt_last_errmsg());
    cr_assert_geq(four.gpu_bytes, one.gpu_bytes, "four slices of accumulator at least");
    cr_assert_lt(four.gpu_bytes - one.gpu_bytes, (uint64_t)8 << 20, "per GPU: %llu against %llu",
                 (unsigned long long)four.gpu_bytes, (unsigned long long)one.gpu_bytes);
    /* the host: the tiles once (a plan without a shape), then each GPU's pinned staging */
    mt_memory_plan tiles;
    mt_memory_plan_init(&tiles);
    cr_assert_eq(mt_plan(&tiles, &c, &p, NULL), MT_OK, "%s", mt_last_errmsg());
    const uint64_t t = tiles.host_pinned_bytes + tiles.host_pageable_bytes;
    const uint64_t h1 = one.host_pinned_bytes + one.host_pageable_bytes, h4 = four.host_pinned_bytes + four.host_pageable_bytes;
    cr_assert_gt(h1, t);
    cr_assert_eq(h4 - t, 4 * (h1 - t), "host beyond the tiles: %llu on four GPUs, %llu on one",
                 (unsigned long long)(h4 - t), (unsigned long long)(h1 - t));
#else
    cr_skip("built without CUDA: no GPU plan");
#endif
}
