#define _GNU_SOURCE
/* Lean mode (MT_PRECISION_LEAN) on the CPU backend: what it costs in host
 * memory (the plan and the tiles), that it learns as the bf16 mode does, that
 * a failed step leaves it as it was, and that its folders hold the bf16
 * values of its weight codes. Its checkpoints: tests/test_checkpoint.c; its kernels:
 * tests/test_lean.c; its update against the kernels: tests/test_optimizer.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model.h"
#include "core/bf16.h"
#include "optim/q16.h"

enum { V = 64 };

static mt_model_config cfg_of(int precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = V;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.05f;
    c.precision = (uint32_t)precision;
    return c;
}

static mt_model *make(const mt_model_config *c)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = 2;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

/* B sequences of S tokens, targets the next token (a pattern with structure to learn). */
enum { B = 2, S = 32, N = B * S };
static mt_batch batch(int32_t *tok, int32_t *tg)
{
    uint32_t r = 12345;
    for (int i = 0; i < N; i++) tok[i] = i % 3 == 0 ? (int32_t)((r = r * 1103515245u + 12345u) >> 16) % V : (tok[i - 1] * 7 + 3) % V;
    for (int i = 0; i < N; i++) tg[i] = (i + 1) % S ? tok[i + 1] : MT_IGNORE_INDEX;
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = B, b.seq_len = S, b.num_micro_batches = 1, b.tokens = tok, b.targets = tg;
    return b;
}

static double eval_loss(mt_model *m, const mt_batch *b)
{
    mt_eval_stats st;
    mt_eval_stats_init(&st);
    cr_assert_eq(mt_eval(m, b, &st), MT_OK, "%s", mt_model_errmsg(m));
    return st.loss;
}

/* At most 6.1 bytes of host state per parameter (the bound; 6.05 by
 * design: 16-bit weight codes, bf16 gradients, two 8-bit codes, three fp32
 * scales per 256), by the plan and by the tiles of the layout (4 KiB blocks aside;
 * the layout is what mt_model_create maps). */
Test(lean_mode, host_bytes_per_parameter)
{
    mt_model_config c = cfg_of(MT_PRECISION_LEAN);
    c.vocab_size = 32000, c.hidden_size = 1024, c.intermediate_size = 2816, c.num_hidden_layers = 4;
    c.num_attention_heads = c.num_key_value_heads = 8, c.head_dim = 128;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.host_budget_bytes = (uint64_t)1 << 40;
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    cr_assert_eq(mt_plan(&plan, &c, &p, NULL), MT_OK, "%s", mt_last_errmsg());
    const double state = (double)(plan.weight_bytes + plan.grad_bytes + plan.master_bytes + plan.optim_bytes);
    const double bpp = state / (double)plan.num_params;
    cr_assert(bpp <= 6.1 && bpp >= 6.0, "%.4f bytes per parameter", bpp);
    cr_assert_eq(plan.master_bytes, 0);
    mt_layout lo;
    cr_assert_eq(mt_layout_build(&lo, &c), 0);
    cr_assert_eq(lo.num_params, plan.num_params);
    cr_assert((double)lo.tile_bytes / (double)plan.num_params <= 6.1, "tiles: %.4f bytes per parameter",
              (double)lo.tile_bytes / (double)plan.num_params);
    for (int u = 0; u < lo.n_units; u++)
        for (int i = 0; i < lo.units[u].n_tensors; i++)
            cr_assert_eq(lo.units[u].tensors[i].offset % 256, 0, "no block of 256 spans two tensors");
    mt_layout_free(&lo);
    c.precision = MT_PRECISION_BF16;
    mt_memory_plan_init(&plan);
    cr_assert_eq(mt_plan(&plan, &c, &p, NULL), MT_OK);
    cr_assert((double)(plan.weight_bytes + plan.grad_bytes + plan.master_bytes + plan.optim_bytes) / (double)plan.num_params >= 13.9,
              "the default mode keeps 14");
}

/* 12 steps on one batch from the same initial weights: the lean model's
 * loss falls as the bf16 model's does, within 5% of it at the end (two
 * rounding schemes of the weights, and 8-bit moments; a lean update that
 * did nothing or the wrong thing stays near the start, 3x higher). */
Test(lean_mode, learns_like_bf16)
{
    mt_model_config cl = cfg_of(MT_PRECISION_LEAN), cb = cfg_of(MT_PRECISION_BF16);
    mt_model *ms[2] = {make(&cl), make(&cb)};
    int32_t tok[N], tg[N];
    mt_batch b = batch(tok, tg);
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 3e-3f, o.warmup_steps = 2, o.total_steps = 12;
    double first[2], last[2];
    for (int k = 0; k < 2; k++) {
        first[k] = eval_loss(ms[k], &b);
        for (int s = 0; s < 12; s++) cr_assert_eq(mt_step(ms[k], &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(ms[k]));
        last[k] = eval_loss(ms[k], &b);
    }
    cr_log_info("lean %.4f -> %.4f, bf16 %.4f -> %.4f", first[0], last[0], first[1], last[1]);
    /* the same initial weights up to one bf16 ulp where a weight lies within a 16-bit code's half step of a
     * bf16 rounding boundary: the initial losses agree to 1e-4 */
    cr_assert(fabs(first[0] - first[1]) <= 1e-4 * first[1], "the same initial weights (%.7f, %.7f)", first[0], first[1]);
    cr_assert(last[1] < first[1] / 3, "bf16 learned: %.4f -> %.4f", first[1], last[1]);
    cr_assert(fabs(last[0] - last[1]) <= 0.05 * last[1], "lean %.4f against bf16 %.4f", last[0], last[1]);
    mt_model_destroy(ms[0]);
    mt_model_destroy(ms[1]);
}

/* A NaN loss fails the step and leaves every byte of the tiles but the
 * gradient block as it was (lean mode's gradients have a block of their own:
 * nothing to restore). The NaN: a block of weights whose scale is NaN, as a
 * folder's NaN weight loads (every value of its block reads NaN). */
Test(lean_mode, non_finite_step_changes_nothing)
{
    mt_model_config c = cfg_of(MT_PRECISION_LEAN);
    mt_model *m = make(&c);
    const int hu = m->layout.n_units - 1;
    const mt_unit_desc *h = &m->layout.units[hu];
    mt_tile_sw(&m->tiles.tile[hu], h)[0] = NAN; /* the final norm's first block */
    size_t total = 0;
    for (int u = 0; u < m->layout.n_units; u++) total += m->layout.units[u].tile_bytes;
    unsigned char *snap = malloc(total), *p = snap;
    for (int u = 0; u < m->layout.n_units; u++, p += m->layout.units[u - 1].tile_bytes)
        memcpy(p, m->tiles.tile[u].base, m->layout.units[u].tile_bytes);
    int32_t tok[N], tg[N];
    mt_batch b = batch(tok, tg);
    mt_optim_config o;
    mt_optim_config_init(&o);
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_NONFINITE);
    p = snap;
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        const unsigned char *t = m->tiles.tile[u].base;
        cr_assert_eq(memcmp(p, t, d->weight_bytes), 0, "unit %d weights", u);
        cr_assert_eq(memcmp(p + d->m_off, t + d->m_off, d->tile_bytes - d->m_off), 0, "unit %d moments", u);
        p += d->tile_bytes;
    }
    cr_assert_eq(mt_model_step_count(m), 0);
    free(snap);
    mt_model_destroy(m);
}

/* mt_model_save writes the bf16 values of the weight codes (what the GPU
 * computes with), which a bf16-mode model loads bit for bit. Loaded into
 * another lean model, those values encode again: each within half a 16-bit
 * step of the bf16 value (bf16 values below 2^-8 of their block's largest
 * have more bits than a code step holds), and the moments start at zero. */
Test(lean_mode, folders_hold_the_bf16_weights)
{
    mt_model_config c = cfg_of(MT_PRECISION_LEAN);
    mt_model *m = make(&c);
    int32_t tok[N], tg[N];
    mt_batch b = batch(tok, tg);
    mt_optim_config o;
    mt_optim_config_init(&o);
    for (int s = 0; s < 3; s++) cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
    char dir[] = "/tmp/mt-lean-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(mt_model_save(m, dir), MT_OK, "%s", mt_model_errmsg(m));
    mt_model_config c2 = c;
    c2.seed = 99;
    mt_model *l = make(&c2);
    cr_assert_eq(mt_model_load(l, dir), MT_OK, "%s", mt_model_errmsg(l));
    mt_model_config cb = cfg_of(MT_PRECISION_BF16);
    mt_model *f = make(&cb);
    cr_assert_eq(mt_model_load(f, dir), MT_OK, "%s", mt_model_errmsg(f));
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u], *df = &f->layout.units[u];
        const mt_tile *tm = &m->tiles.tile[u], *tl = &l->tiles.tile[u];
        uint16_t *w = malloc(d->padded * 2);
        mt_q16_blocks_to_bf16(mt_tile_wq(tm, d), mt_tile_sw(tm, d), d->padded, w);
        for (int i = 0; i < d->n_tensors; i++) {
            const mt_tensor_desc *t = &d->tensors[i], *tf = &df->tensors[i];
            const uint16_t *wf = mt_tile_weights_bf16(&f->tiles.tile[u], df);
            cr_assert_eq(memcmp(w + t->offset, wf + tf->offset, t->numel * 2), 0, "%s in the bf16 model", t->name);
            for (uint64_t e = t->offset; e < t->offset + t->numel; e++) {
                const float sl = mt_tile_sw(tl, d)[e / MT_Q16_BLOCK];
                const double got = (double)mt_tile_wq(tl, d)[e] * sl, want = mt_bf16_to_f32(w[e]);
                cr_assert(fabs(got - want) <= 0.5 * sl, "%s[%llu] loaded as %g, saved %g", t->name,
                          (unsigned long long)(e - t->offset), got, want);
            }
        }
        free(w);
        for (uint64_t k = 0; k < d->padded / 256; k++)
            cr_assert(mt_tile_sm(tl, d)[k] == 0 && mt_tile_sv(tl, d)[k] == 0, "unit %d: moments start at zero", u);
    }
    cr_assert_eq(mt_model_step_count(l), 0);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    mt_model_destroy(m);
    mt_model_destroy(l);
    mt_model_destroy(f);
}

/* A folder's NaN weight has no 16-bit code: its block of 256 loads with the
 * scale NaN (every value of it NaN, the other blocks as they were), and
 * the step refuses the NaN loss as a bf16 model with that weight does. */
Test(lean_mode, nan_weight_in_a_folder_makes_its_block_nan)
{
    mt_model_config cb = cfg_of(MT_PRECISION_BF16), cl = cfg_of(MT_PRECISION_LEAN);
    mt_model *f = make(&cb), *l = make(&cl);
    const int u = 1;
    const mt_unit_desc *d = &f->layout.units[u];
    mt_tile_master(&f->tiles.tile[u], d)[d->tensors[2].offset + 3] = NAN;
    mt_tile_weights_bf16(&f->tiles.tile[u], d)[d->tensors[2].offset + 3] = 0x7fc0;
    char dir[] = "/tmp/mt-lean-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(mt_model_save(f, dir), MT_OK, "%s", mt_model_errmsg(f));
    cr_assert_eq(mt_model_load(l, dir), MT_OK, "%s", mt_model_errmsg(l));
    const mt_unit_desc *dl = &l->layout.units[u]; /* the lean layout: tensors start at multiples of 256 */
    const uint64_t blk = (dl->tensors[2].offset + 3) / 256;
    const float *sw = mt_tile_sw(&l->tiles.tile[u], dl);
    for (uint64_t k = 0; k < dl->padded / 256; k++)
        cr_assert_eq(isnan(sw[k]) != 0, k == blk, "block %llu's scale %g", (unsigned long long)k, sw[k]);
    int32_t tok[N], tg[N];
    mt_batch b = batch(tok, tg);
    mt_optim_config o;
    mt_optim_config_init(&o);
    cr_assert_eq(mt_step(l, &b, &o, NULL), MT_ERR_NONFINITE, "%s", mt_model_errmsg(l));
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    mt_model_destroy(f);
    mt_model_destroy(l);
}
