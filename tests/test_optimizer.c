/* The optimizer thread: an update run behind the next step gives the same
 * bits as one run on the caller, units become ready in forward order, and a
 * drain waits for all of it. */
#include <criterion/criterion.h>
#include <string.h>

#include "engine/model.h"
#include "optim/lean.h"

static mt_model *make_in(mt_precision precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 300;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.precision = precision;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = 2;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK, "%s", mt_last_errmsg());
    /* some gradients where a backward leaves them: the bf16 weight blocks, lean mode's gradient blocks */
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        uint16_t *w = mt_tile_grad_bf16(&m->tiles.tile[u], d);
        for (uint64_t i = 0; i < d->padded; i++) w[i] = (uint16_t)(0x3c00 + (i * 7919 + (uint64_t)u) % 512);
    }
    return m;
}

static mt_model *make(void) { return make_in(MT_PRECISION_BF16); }

Test(optimizer, async_update_equals_sync_update)
{
    mt_model *a = make(), *b = make();
    const mt_adamw_hyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 0.5f};
    cr_assert_eq(mt_optimizer_run(&a->opt, &h, 0.1f, 1, 0), 0);
    cr_assert_eq(mt_optimizer_run(&b->opt, &h, 0.1f, 1, 1), 0);
    for (int u = 0; u < b->layout.n_units; u++) {
        mt_optimizer_await_unit(&b->opt, u);
        const mt_unit_desc *d = &b->layout.units[u];
        /* once awaited, unit u is final: the same bits as the synchronous run */
        cr_assert_eq(memcmp(mt_tile_master(&a->tiles.tile[u], d), mt_tile_master(&b->tiles.tile[u], d), d->padded * 4), 0,
                     "unit %d", u);
        cr_assert_eq(memcmp(mt_tile_weights_bf16(&a->tiles.tile[u], d), mt_tile_weights_bf16(&b->tiles.tile[u], d),
                            d->weight_bytes),
                     0, "unit %d bf16", u);
    }
    mt_optimizer_drain(&b->opt);
    cr_assert_eq(b->opt.busy, 0);
    /* a second job on the same thread */
    cr_assert_eq(mt_optimizer_run(&a->opt, &h, 0.1f, 1, 0), 0);
    cr_assert_eq(mt_optimizer_run(&b->opt, &h, 0.1f, 1, 1), 0);
    mt_optimizer_drain(&b->opt);
    for (int u = 0; u < a->layout.n_units; u++)
        cr_assert_eq(memcmp(a->tiles.tile[u].base, b->tiles.tile[u].base, a->layout.units[u].tile_bytes), 0);
    mt_model_destroy(b);
    mt_model_destroy(a);
}

/* Finishing the optimizer (as mt_model_destroy does first) with a job in
 * flight waits for the whole job: every unit then holds the update. */
Test(optimizer, fini_waits_for_the_job_in_flight)
{
    mt_model *a = make(), *b = make();
    const mt_adamw_hyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 0.5f};
    cr_assert_eq(mt_optimizer_run(&a->opt, &h, 0.1f, 1, 0), 0);
    cr_assert_eq(mt_optimizer_run(&b->opt, &h, 0.1f, 1, 1), 0);
    mt_optimizer_fini(&b->opt);
    cr_assert_eq(b->opt.started, 0, "the thread is gone");
    for (int u = 0; u < a->layout.n_units; u++)
        cr_assert_eq(memcmp(a->tiles.tile[u].base, b->tiles.tile[u].base, a->layout.units[u].tile_bytes), 0,
                     "unit %d was not updated before fini returned", u);
    mt_model_destroy(b); /* finishes again: nothing left to do */
    mt_model_destroy(a);
}

/* Lean mode: the thread's update is the caller's, bit for bit, and each
 * block of 256 is the lean kernel's step of that block (numbered by unit and
 * offset for the random bits), so the chunking over threads changes nothing. */
Test(optimizer, lean_update_is_the_kernel_per_block)
{
    mt_model *a = make_in(MT_PRECISION_LEAN), *b = make_in(MT_PRECISION_LEAN), *r = make_in(MT_PRECISION_LEAN);
    const mt_adamw_hyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 0.5f};
    for (uint64_t step = 1; step <= 3; step++) {
        cr_assert_eq(mt_optimizer_run(&a->opt, &h, 0.1f, step, 0), 0);
        cr_assert_eq(mt_optimizer_run(&b->opt, &h, 0.1f, step, 1), 0);
        mt_optimizer_drain(&b->opt);
        for (int u = 0; u < r->layout.n_units; u++) {
            const mt_unit_desc *d = &r->layout.units[u];
            const mt_tile *t = &r->tiles.tile[u];
            for (int ti = 0; ti < d->n_tensors; ti++) {
                const mt_tensor_desc *td = &d->tensors[ti];
                mt_adamw_hyper ht = h;
                ht.weight_decay = td->decay ? 0.1f : 0.0f;
                for (uint64_t i = 0; i < td->numel; i += 256) {
                    const uint64_t e = td->offset + i, n = td->numel - i < 256 ? td->numel - i : 256;
                    cr_assert_eq(mt_lean_step_block(&ht, r->cfg.seed, step, ((uint64_t)u << 40) + e, n,
                                                    mt_tile_wq(t, d) + e, mt_tile_sw(t, d) + e / 256,
                                                    mt_tile_grad_bf16(t, d) + e,
                                                    mt_tile_qm(t, d) + e, mt_tile_sm(t, d) + e / 256,
                                                    mt_tile_qv(t, d) + e, mt_tile_sv(t, d) + e / 256), 0);
                }
            }
        }
        for (int u = 0; u < a->layout.n_units; u++) {
            const size_t bytes = a->layout.units[u].tile_bytes;
            cr_assert_eq(memcmp(a->tiles.tile[u].base, r->tiles.tile[u].base, bytes), 0, "step %d unit %d", (int)step, u);
            cr_assert_eq(memcmp(b->tiles.tile[u].base, r->tiles.tile[u].base, bytes), 0, "step %d unit %d (thread)",
                         (int)step, u);
        }
    }
    /* the weights moved, the moments are no longer zero */
    const mt_unit_desc *d = &a->layout.units[1];
    cr_assert_neq(mt_tile_sm(&a->tiles.tile[1], d)[0], 0.0f);
    cr_assert_eq(a->opt.skipped_blocks, 0);
    mt_model_destroy(r);
    mt_model_destroy(b);
    mt_model_destroy(a);
}

/* Lean mode: a gradient whose square overflows fp32 makes its block's moments
 * infinite; that block is left as it was and counted (mt_step then logs a
 * warning), every other block is updated. */
Test(optimizer, lean_block_with_infinite_moments_is_skipped_and_counted)
{
    mt_model *a = make_in(MT_PRECISION_LEAN), *r = make_in(MT_PRECISION_LEAN);
    const int u = 1;
    const mt_unit_desc *d = &a->layout.units[u];
    const mt_tile *t = &a->tiles.tile[u];
    mt_tile_grad_bf16(t, d)[300] = 0x7f00; /* 1.7e38: its square is not finite */
    mt_tile_grad_bf16(&r->tiles.tile[u], d)[300] = 0x7f00;
    const mt_adamw_hyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f};
    cr_assert_eq(mt_optimizer_run(&a->opt, &h, 0.1f, 1, 0), 0);
    cr_assert_eq(a->opt.skipped_blocks, 1, "%llu blocks skipped", (unsigned long long)a->opt.skipped_blocks);
    /* block 1 (elements 256..511) as it was; block 0 updated */
    const unsigned char *x = t->base, *y = r->tiles.tile[u].base;
    cr_assert_eq(memcmp(x + d->weight_off + 512, y + d->weight_off + 512, 512), 0, "the skipped block's weights");
    cr_assert_eq(memcmp(x + d->m_off + 256, y + d->m_off + 256, 256), 0, "the skipped block's codes");
    cr_assert_eq(mt_tile_sm(t, d)[1], 0.0f);
    cr_assert_eq(mt_tile_sw(t, d)[1], mt_tile_sw(&r->tiles.tile[u], d)[1], "the skipped block's weight scale");
    cr_assert_neq(memcmp(x + d->weight_off, y + d->weight_off, 512), 0, "block 0 was updated");
    mt_model_destroy(r);
    mt_model_destroy(a);
}
