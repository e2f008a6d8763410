#include "optim/optimizer.h"
#include "optim/lean.h"
#include "optim/q16.h"
#include "optim/q8.h"

#include <string.h>

_Static_assert(MT_LEAN_BLOCK_ELEMS == MT_Q8_BLOCK && MT_LEAN_BLOCK_ELEMS == MT_Q16_BLOCK,
               "the layout's lean blocks are the codes' blocks");

void mt_optimizer_init(mt_optimizer *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->ready = 1;
}

void mt_optimizer_bind(mt_optimizer *o, mt_pool *pool, const mt_layout *lo, const mt_tiles *tiles, uint64_t seed)
{
    o->seed = seed;
    o->lean_kernel = mt_lean_kernel(mt_adamw_best_isa()); /* every ISA has one */
    o->pool = pool;
    o->layout = lo;
    o->tiles = tiles;
}

/* AdamW on one unit's tensors: the gradients are in the bf16 weight block
 * (bf16 mode, overwritten there by the new weights) or the fp32 gradient
 * block. */
/* ---- lean mode: a unit's tensors in blocks of MT_LEAN_BLOCK_ELEMS (lean.h) ---- */

typedef struct {
    mt_lean_block_fn k;
    const mt_adamw_hyper *h;
    float wd;
    uint64_t seed, step;
    const mt_unit_desc *u;
    const mt_tile *tl;
    uint64_t index0;    /* the unit's first parameter's number for the random bits */
    uint64_t *skipped;
} lean_job;

static size_t lean_len(const void *ctx, size_t s) { return ((const lean_job *)ctx)->u->tensors[s].numel; }

/* Elements [lo, hi) of tensor s: lo is a multiple of the block, and so is hi unless it ends the tensor. */
static void lean_run(void *ctx, size_t s, size_t lo, size_t hi)
{
    const lean_job *j = ctx;
    const mt_unit_desc *u = j->u;
    const mt_tensor_desc *td = &u->tensors[s];
    mt_adamw_hyper h = *j->h;
    h.weight_decay = td->decay ? j->wd : 0.0f;
    int16_t *wq = mt_tile_wq(j->tl, u);
    float *sw = mt_tile_sw(j->tl, u);
    const uint16_t *g = mt_tile_grad_bf16(j->tl, u);
    uint8_t *qm = mt_tile_qm(j->tl, u), *qv = mt_tile_qv(j->tl, u);
    float *sm = mt_tile_sm(j->tl, u), *sv = mt_tile_sv(j->tl, u);
    uint64_t skipped = 0;
    for (size_t i = lo; i < hi; i += MT_LEAN_BLOCK_ELEMS) {
        const size_t e = td->offset + i, n = hi - i < MT_LEAN_BLOCK_ELEMS ? hi - i : MT_LEAN_BLOCK_ELEMS;
        const size_t b = e / MT_LEAN_BLOCK_ELEMS;
        skipped += j->k(&h, j->seed, j->step, j->index0 + e, n, wq + e, sw + b, g + e, qm + e, sm + b, qv + e, sv + b) != 0;
    }
    if (skipped) __atomic_fetch_add(j->skipped, skipped, __ATOMIC_RELAXED);
}

static void update_unit_lean(mt_optimizer *o, int ui, const mt_adamw_hyper *h, float wd, uint64_t step)
{
    const mt_unit_desc *u = &o->layout->units[ui];
    lean_job lj = {o->lean_kernel, h, wd, o->seed, step, u, &o->tiles->tile[ui],
                   (uint64_t)ui << 40, &o->skipped_blocks};
    const mt_chunked job = {(size_t)u->n_tensors, MT_LEAN_BLOCK_ELEMS, MT_ADAMW_CHUNK, lean_len, lean_run, &lj};
    mt_apply_chunked(o->pool, &job);
}

static void update_unit(mt_optimizer *o, int ui, const mt_adamw_hyper *h, float wd, uint64_t step,
                        mt_adamw_kernel_fn k)
{
    const mt_unit_desc *u = &o->layout->units[ui];
    const mt_tile *tl = &o->tiles->tile[ui];
    if (u->lean) {
        update_unit_lean(o, ui, h, wd, step);
        return;
    }
    mt_adamw_segment seg[MT_MAX_UNIT_TENSORS];
    uint16_t *w = mt_tile_weights_bf16(tl, u);
    float *g32 = mt_tile_grad_f32(tl, u);
    for (int i = 0; i < u->n_tensors; i++) {
        const mt_tensor_desc *td = &u->tensors[i];
        seg[i] = (mt_adamw_segment){
            .master = mt_tile_master(tl, u) + td->offset,
            .m = mt_tile_m(tl, u) + td->offset,
            .v = mt_tile_v(tl, u) + td->offset,
            .grad = w ? (const void *)(w + td->offset) : (const void *)(g32 + td->offset),
            .grad_is_bf16 = w != NULL,
            .w_bf16 = w ? w + td->offset : NULL,
            .n = td->numel,
            .weight_decay = td->decay ? wd : 0.0f,
        };
    }
    mt_adamw_apply(o->pool, k, h, seg, (size_t)u->n_tensors);
}

static void *thread_main(void *arg)
{
    mt_optimizer *o = arg;
    const mt_adamw_kernel_fn k = mt_adamw_kernel(mt_adamw_best_isa());
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->busy && !o->quit) pthread_cond_wait(&o->cv, &o->mu);
        if (o->quit) break;
        const mt_adamw_hyper h = o->h;
        const float wd = o->weight_decay;
        const uint64_t step = o->step;
        pthread_mutex_unlock(&o->mu);
        for (int u = 0; u < o->layout->n_units; u++) {
            update_unit(o, u, &h, wd, step, k);
            pthread_mutex_lock(&o->mu);
            o->done = u + 1;
            pthread_cond_broadcast(&o->cv);
            pthread_mutex_unlock(&o->mu);
        }
        pthread_mutex_lock(&o->mu);
        o->busy = 0;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

int mt_optimizer_run(mt_optimizer *o, const mt_adamw_hyper *h, float wd, uint64_t step, int async)
{
    if (!async) {
        const mt_adamw_kernel_fn k = mt_adamw_kernel(mt_adamw_best_isa());
        for (int u = 0; u < o->layout->n_units; u++) update_unit(o, u, h, wd, step, k);
        return 0;
    }
    if (!o->started) {
        if (pthread_create(&o->thread, NULL, thread_main, o) != 0) return -1;
        o->started = 1;
    }
    pthread_mutex_lock(&o->mu);
    o->h = *h;
    o->weight_decay = wd;
    o->step = step;
    o->done = 0;
    o->busy = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return 0;
}

int mt_optimizer_await_unit(mt_optimizer *o, int unit)
{
    if (!o->started) return 0;
    int waited = 0;
    pthread_mutex_lock(&o->mu);
    while (o->busy && o->done <= unit) pthread_cond_wait(&o->cv, &o->mu), waited = 1;
    pthread_mutex_unlock(&o->mu);
    return waited;
}

void mt_optimizer_drain(mt_optimizer *o)
{
    if (!o->started) return;
    pthread_mutex_lock(&o->mu);
    while (o->busy) pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
}

void mt_optimizer_fini(mt_optimizer *o)
{
    if (!o->ready) return;
    if (o->started) {
        mt_optimizer_drain(o);
        pthread_mutex_lock(&o->mu);
        o->quit = 1;
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->thread, NULL);
        o->started = 0;
    }
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    o->ready = 0;
}
