/* Data parallelism on the GPUs of one host (engine/backend.h,
 * mt_group_create): a backend made of G backends of one class, the ranks,
 * which share the model's one host copy of the state. To the scheduler it is
 * one backend; underneath, every visit goes to every rank (each loads the
 * unit's weights from the host tile over its own link, or with
 * MT_FETCH_SLICES its G-th of them, which the class's gather_weights
 * completes from the others': NCCL's all-gather on CUDA), each micro-batch to
 * the one rank that owns it (contiguous runs: rank r owns [r M / G,
 * (r + 1) M / G)), and a unit's gradients, accumulated by each rank over its
 * micro-batches, are reduced across the ranks (the class's reduce_grads:
 * NCCL's reduce-scatter on CUDA) before each rank sends its slice to the
 * host tile. The optimizer then runs once, on the host, as for one backend.
 *
 * Every rank reserves the same shape (the largest share), so they keep and
 * recompute the same checkpoints and the scheduler's visit list holds for
 * all. A training step needs M to be a multiple of G (mt_step checks), so
 * every rank runs every micro-batch of its reservation; an evaluation may
 * leave a rank with fewer, or none. */
#include "engine/backend.h"
#include "device/device.h"

#include <stdlib.h>
#include <string.h>

typedef struct group_be {
    mt_be base;
    const mt_be_class *cls;
    int n;         /* ranks */
    mt_be **rank;  /* [n] */
    int *device;   /* [n]: each rank's device, made current before each call to it; -1: none */
    int n_micro;   /* micro-batches of the reservation, all ranks together */
} group_be;

static group_be *grp(mt_be *be) { return (group_be *)be; }

static void use(const group_be *g, int r)
{
    if (g->device[r] >= 0) mt_device_use(g->device[r]);
}

/* The first micro-batch of rank r. */
static int first_mb(const group_be *g, int r) { return (int)((long long)r * g->n_micro / g->n); }

/* The rank that owns micro-batch mb, and mb's place in its run. */
static int owner(const group_be *g, int mb, int *local)
{
    int r = g->n - 1;
    while (r > 0 && first_mb(g, r) > mb) r--;
    *local = mb - first_mb(g, r);
    use(g, r);
    return r;
}

static void group_destroy(mt_be *be)
{
    group_be *g = grp(be);
    for (int r = 0; r < g->n; r++)
        if (g->rank[r]) {
            use(g, r);
            g->rank[r]->ops->destroy(g->rank[r]);
        }
    free(g->rank);
    free(g->device);
    free(g);
}

static void group_release(mt_be *be)
{
    group_be *g = grp(be);
    for (int r = 0; r < g->n; r++) {
        use(g, r);
        g->rank[r]->ops->release(g->rank[r]);
    }
    memset(&be->held, 0, sizeof be->held);
}

/* Each rank reserves the largest share; what the group holds is the sum over
 * the ranks but for device memory, which is per GPU (the largest). */
static mt_status group_reserve(mt_be *be, const mt_be_request *req, mt_err err)
{
    group_be *g = grp(be);
    mt_be_request s = *req;
    s.shape.n_micro = mt_rank_share(req->shape.n_micro, g->n);
    s.n_ranks = g->n;
    mt_be_needs h;
    memset(&h, 0, sizeof h);
    for (int r = 0; r < g->n; r++) {
        use(g, r);
        mt_status st = g->rank[r]->ops->reserve(g->rank[r], &s, err);
        if (st) {
            group_release(be);
            return st;
        }
        const mt_be_needs *x = &g->rank[r]->held;
        h.device_bytes = MT_MAX(h.device_bytes, x->device_bytes);
        h.pinned_bytes += x->pinned_bytes;
        h.host_bytes += x->host_bytes;
        h.checkpoint_bytes += x->checkpoint_bytes;
        h.activations = x->activations;
        h.host_checkpoints = x->host_checkpoints;
        h.recomputed = x->recomputed;
    }
    be->held = h;
    g->n_micro = req->shape.n_micro;
    return MT_OK;
}

static void group_set_tokens(mt_be *be, int mb, const int32_t *tokens, const int32_t *targets, const int32_t *positions)
{
    group_be *g = grp(be);
    int local;
    mt_be *x = g->rank[owner(g, mb, &local)];
    x->ops->set_tokens(x, local, tokens, targets, positions);
}

static void group_load_weights(mt_be *be, int slot, int unit)
{
    group_be *g = grp(be);
    for (int r = 0; r < g->n; r++) {
        use(g, r);
        g->rank[r]->ops->load_weights(g->rank[r], slot, unit);
    }
    if (g->rank[0]->fetch_slices) g->cls->gather_weights(g->rank, g->n, slot, unit);
}

static void group_begin_visit(mt_be *be, int slot, int unit, int phase)
{
    group_be *g = grp(be);
    for (int r = 0; r < g->n; r++) {
        use(g, r);
        g->rank[r]->ops->begin_visit(g->rank[r], slot, unit, phase);
    }
}

static void group_end_visit(mt_be *be, int slot)
{
    group_be *g = grp(be);
    for (int r = 0; r < g->n; r++) {
        use(g, r);
        g->rank[r]->ops->end_visit(g->rank[r], slot);
    }
}

static void group_forward(mt_be *be, int slot, int unit, int mb)
{
    group_be *g = grp(be);
    int local;
    mt_be *x = g->rank[owner(g, mb, &local)];
    x->ops->forward(x, slot, unit, local);
}

static void group_head(mt_be *be, int slot, int mb, float loss_scale, int want_grad)
{
    group_be *g = grp(be);
    int local;
    mt_be *x = g->rank[owner(g, mb, &local)];
    x->ops->head(x, slot, local, loss_scale, want_grad);
}

static void group_head_logits(mt_be *be, int slot, int mb, float *out)
{
    group_be *g = grp(be);
    int local;
    mt_be *x = g->rank[owner(g, mb, &local)];
    x->ops->head_logits(x, slot, local, out);
}

static void group_backward(mt_be *be, int slot, int unit, int mb)
{
    group_be *g = grp(be);
    int local;
    mt_be *x = g->rank[owner(g, mb, &local)];
    x->ops->backward(x, slot, unit, local);
}

static void group_begin_grads(mt_be *be, int unit)
{
    group_be *g = grp(be);
    for (int r = 0; r < g->n; r++) {
        use(g, r);
        g->rank[r]->ops->begin_grads(g->rank[r], unit);
    }
}

static void group_send_grads(mt_be *be, int unit)
{
    group_be *g = grp(be);
    g->cls->reduce_grads(g->rank, g->n, unit);
    for (int r = 0; r < g->n; r++) {
        use(g, r);
        g->rank[r]->ops->send_grads(g->rank[r], unit);
    }
}

/* Waits for every rank (also after one failed: the others' work must end
 * before the step's memory is reused); the first failure is the group's. */
static mt_status group_sync(mt_be *be, double *loss_sum, double *grad_sumsq, mt_err err)
{
    group_be *g = grp(be);
    mt_status first = MT_OK;
    double loss = 0, sumsq = 0;
    for (int r = 0; r < g->n; r++) {
        double l = 0, s = 0;
        use(g, r);
        const mt_status st = g->rank[r]->ops->sync(g->rank[r], &l, &s, first ? (mt_err){NULL} : err);
        if (st && !first) first = st;
        loss += l, sumsq += s;
    }
    *loss_sum = loss;
    *grad_sumsq = sumsq;
    return first;
}

/* The timeline is rank 0's: its GPU stands for the others, which run the
 * same visits on their shares. */
static int group_trace_start(mt_be *be, mt_trace *t)
{
    group_be *g = grp(be);
    use(g, 0);
    return g->rank[0]->ops->trace_start ? g->rank[0]->ops->trace_start(g->rank[0], t) : -1;
}

static void group_mark_head(mt_be *be)
{
    group_be *g = grp(be);
    use(g, 0);
    g->rank[0]->ops->mark_head(g->rank[0]);
}

static int group_trace_read(mt_be *be)
{
    group_be *g = grp(be);
    use(g, 0);
    return g->rank[0]->ops->trace_read(g->rank[0]);
}

static const mt_be_ops group_ops = {
    .name = "group",
    .destroy = group_destroy,
    .reserve = group_reserve,
    .release = group_release,
    .set_tokens = group_set_tokens,
    .load_weights = group_load_weights,
    .begin_visit = group_begin_visit,
    .end_visit = group_end_visit,
    .forward = group_forward,
    .head = group_head,
    .head_logits = group_head_logits,
    .backward = group_backward,
    .begin_grads = group_begin_grads,
    .send_grads = group_send_grads,
    .sync = group_sync,
    .trace_start = group_trace_start,
    .mark_head = group_mark_head,
    .trace_read = group_trace_read,
};

mt_status mt_group_create(const mt_be_class *cls, mt_be **ranks, const int *devices, int n, mt_weight_fetch fetch,
                          mt_be **out, mt_err err)
{
    *out = NULL;
    group_be *g = calloc(1, sizeof *g);
    mt_be **rk = calloc((size_t)n, sizeof *rk);
    int *dev = calloc((size_t)n, sizeof *dev);
    if (!g || !rk || !dev) {
        for (int r = 0; r < n; r++)
            if (ranks[r]) ranks[r]->ops->destroy(ranks[r]);
        free(g), free(rk), free(dev);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for a group of %d backends", n);
    }
    memcpy(rk, ranks, (size_t)n * sizeof *rk);
    memcpy(dev, devices, (size_t)n * sizeof *dev);
    g->base.ops = &group_ops;
    g->cls = cls, g->n = n, g->rank = rk, g->device = dev;
    for (int r = 0; r < n; r++) g->base.device_fixed = MT_MAX(g->base.device_fixed, rk[r]->device_fixed);
    mt_status st;
    if (cls->join) st = cls->join(rk, n, err);
    else st = mt_fail(err, MT_ERR_UNSUPPORTED, "the %s backend cannot train on several devices", cls->name);
    if (!st && fetch == MT_FETCH_SLICES && n > 1 && !cls->gather_weights)
        st = mt_fail(err, MT_ERR_UNSUPPORTED, "the %s backend cannot fetch weights in slices", cls->name);
    if (st) {
        group_destroy(&g->base);
        return st;
    }
    for (int r = 0; r < n; r++) rk[r]->fetch_slices = fetch == MT_FETCH_SLICES && n > 1;
    *out = &g->base;
    return MT_OK;
}
