/* The scheduler: one optimizer step as a fixed sequence of unit visits,
 * layer-major over the micro-batches, with each unit's weights loaded into
 * one of K slots K-1 visits ahead; then exact clipping and AdamW on the host.
 *
 *   forward   units 0 .. L        (embedding, layers), every micro-batch
 *   head      unit L+1            loss and its gradient, every micro-batch
 *   backward  units L .. 1, 0     recompute + backward, every micro-batch;
 *                                 gradients accumulated, then sent to the tile
 *                                 (before layer u, layer u-1's forward again
 *                                 where the backend keeps no checkpoint u-1:
 *                                 mt_ck_recomputed)
 *
 * So each unit's weights cross to the device twice per step (once for the
 * embedding, whose backward needs none) and its gradients come back once,
 * whatever the number of micro-batches. */
#include "optim/adamw.h"
#include "engine/backend.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "core/sysinfo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A visit's phase: mt_phase, the head computing logits only, or a layer's
 * forward again in the backward (to a recomputed checkpoint). */
enum { PH_FORWARD = MT_PHASE_FORWARD, PH_HEAD = MT_PHASE_HEAD, PH_BACKWARD = MT_PHASE_BACKWARD, PH_HEAD_LOGITS,
       PH_RECOMPUTE };

typedef struct mt_visit {
    int unit;
    int phase;
    int needs_weights;
} visit;

/* The visit list of any call holds at most 2 L + 3 visits and L / 2
 * recomputes; m->visits has room for them and, behind them, as many load
 * indices (prepare()). */
static int visits_cap(const mt_model *m) { return 3 * (int)m->cfg.num_hidden_layers + 4; }
static int *load_list(mt_model *m) { return (int *)(m->visits + visits_cap(m)); }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for the previous step's update of unit before its weights are
 * loaded; a full trace keeps the time the wait took. */
static void await_unit(mt_model *m, mt_trace *t, int unit)
{
    const int full = t && t->level == MT_TRACE_FULL;
    const double a = full ? now() : 0;
    if (mt_optimizer_await_unit(&m->opt, unit) && full && t->n_opt < t->cap_opt)
        t->opt[t->n_opt++] = (mt_trace_span){a - t->origin, now() - t->origin};
}

/* The caller's abort callback (mt_offload_policy), asked before each
 * micro-batch of each visit: nonzero stops the work. */
static int abort_requested(const mt_model *m)
{
    return m->pol.abort_callback && m->pol.abort_callback(m->pol.abort_user_data);
}

/* Runs visits[0..n) over n_micro micro-batches with K slots; a step passes
 * its trace t, evaluations NULL. Returns nonzero when the abort callback
 * stopped it: what was issued is left to finish, nothing more is issued
 * (no gradient reaches a host tile after the stop), and the caller still
 * calls sync(). */
static int run_visits(mt_model *m, mt_trace *t, int n, int n_micro, float loss_scale, float *logits_out)
{
    mt_be *be = m->be;
    const visit *v = m->visits;
    const int full = t && t->level == MT_TRACE_FULL;
    const int K = (int)m->pol.weight_slots;
    int *loads = load_list(m), n_loads = 0; /* visits that need weights, in order */
    for (int i = 0; i < n; i++)
        if (v[i].needs_weights) loads[n_loads++] = i;
    for (int j = 0; j < K - 1 && j < n_loads; j++) {
        await_unit(m, t, v[loads[j]].unit);
        be->ops->load_weights(be, j % K, v[loads[j]].unit);
    }
    int li = 0;
    for (int i = 0; i < n; i++) {
        int slot = -1, ahead = -1; /* the visit whose load this one starts, K-1 ahead */
        if (v[i].needs_weights) {
            slot = li % K;
            if (li + K - 1 < n_loads) ahead = loads[li + K - 1];
            li++;
        }
        const int u = v[i].unit;
        const int phase = v[i].phase == PH_HEAD_LOGITS ? PH_HEAD : v[i].phase == PH_RECOMPUTE ? PH_BACKWARD : v[i].phase;
        if (full && t->n_visits < t->cap_visits)
            t->visit[t->n_visits++] = (mt_trace_visit){u, phase, now() - t->origin, 0, 0, -1, -1};
        if (abort_requested(m)) return 1;
        be->ops->begin_visit(be, slot, u, phase);
        int stop = 0; /* set by a poll between micro-batches: the visit ends without sending gradients */
        switch (v[i].phase) {
        case PH_FORWARD:
        case PH_RECOMPUTE:
            for (int mb = 0; mb < n_micro && !(stop = mb && abort_requested(m)); mb++) be->ops->forward(be, slot, u, mb);
            break;
        case PH_HEAD:
            if (t) { /* the device's time replaces the host's where it keeps one */
                t->head_start = now() - t->origin;
                if (t->level >= MT_TRACE_MARKS) be->ops->mark_head(be);
            }
            if (loss_scale != 0) be->ops->begin_grads(be, u);
            for (int mb = 0; mb < n_micro && !(stop = mb && abort_requested(m)); mb++)
                be->ops->head(be, slot, mb, loss_scale, loss_scale != 0);
            if (loss_scale != 0 && !stop) be->ops->send_grads(be, u);
            break;
        case PH_HEAD_LOGITS:
            for (int mb = 0; mb < n_micro && !(stop = mb && abort_requested(m)); mb++)
                be->ops->head_logits(be, slot, mb, logits_out + (size_t)mb * m->be_shape.n_seq * m->cfg.vocab_size);
            break;
        case PH_BACKWARD:
            be->ops->begin_grads(be, u);
            for (int mb = n_micro - 1; mb >= 0 && !(stop = mb < n_micro - 1 && abort_requested(m)); mb--)
                be->ops->backward(be, slot, u, mb);
            if (!stop) be->ops->send_grads(be, u);
            break;
        }
        be->ops->end_visit(be, slot);
        if (stop) return 1;
        /* Only now wait for the optimizer to finish the unit ahead (the
         * previous step's update), so the GPU has this visit queued while the
         * host waits; the load goes into the slot the last visit freed. */
        if (ahead >= 0) {
            await_unit(m, t, v[ahead].unit);
            be->ops->load_weights(be, (li + K - 2) % K, v[ahead].unit);
        }
    }
    return 0;
}

static mt_status fail_aborted(mt_model *m, const char *call)
{
    return mt_fail(mt_model_err(m), MT_ERR_ABORTED, "%s: stopped by the abort callback after step %llu; the model is as "
                   "before the call", call, (unsigned long long)m->step);
}

/* The visit list of a step (train), an evaluation or a logits pass. */
static int build_visits(mt_model *m, int phase_head, int train)
{
    visit *v = m->visits;
    const int L = (int)m->cfg.num_hidden_layers;
    int n = 0;
    for (int u = 0; u <= L; u++) v[n++] = (visit){u, PH_FORWARD, 1};
    v[n++] = (visit){L + 1, phase_head, 1};
    if (train) {
        const int rc = m->be->held.recomputed;
        for (int u = L; u >= 1; u--) {
            if (mt_ck_recomputed(L, rc, u - 1)) v[n++] = (visit){u - 1, PH_RECOMPUTE, 1};
            v[n++] = (visit){u, PH_BACKWARD, 1};
        }
        v[n++] = (visit){0, PH_BACKWARD, 0};
    }
    return n;
}

/* The ranks of a data-parallel model (the policy's GPUs, or a test's
 * simulated CPU ranks) or the one backend. */
static int ranks_of(const mt_model *m) { return m->backend == MT_BACKEND_CPU && m->sim_ranks > 1 ? m->sim_ranks : m->n_ranks; }

static mt_status create_backend(mt_model *m, const mt_be_class *cls, mt_err err)
{
    const int n = ranks_of(m);
    const mt_be_shape none = {0, 0, 0, 0};
    const mt_be_request req = mt_be_request_of(m, &none);
    if (n <= 1 && !m->force_group) return cls->create(&req, m->pol.device, &m->be, err);
    mt_be *ranks[MT_MAX_DEVICES] = {0};
    int devices[MT_MAX_DEVICES];
    for (int r = 0; r < n; r++) {
        devices[r] = m->backend != MT_BACKEND_CUDA ? -1 : n > 1 ? m->devices[r] : m->pol.device;
        mt_status st = cls->create(&req, devices[r] < 0 ? 0 : devices[r], &ranks[r], err);
        if (st) {
            for (int k = 0; k < r; k++) {
                if (devices[k] >= 0) mt_device_use(devices[k]);
                ranks[k]->ops->destroy(ranks[k]);
            }
            return st;
        }
    }
    return mt_group_create(cls, ranks, devices, n, (mt_weight_fetch)m->pol.weight_fetch, &m->be, err);
}

/* Makes the backend ready for this shape: created on first use, reserved
 * again when the shape changes or training needs gradient buffers that an
 * evaluation-only reservation lacks. The backend's needs are checked
 * against the budgets first (the host's: what the tiles leave of it). */
static mt_status prepare(mt_model *m, int n_seq, int seq_len, int n_micro, int want_grad)
{
    mt_err err = mt_model_err(m);
    mt_status st;
    if (!m->visits && !(m->visits = malloc((size_t)visits_cap(m) * (sizeof(visit) + sizeof(int)))))
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the step's visit list");
    if (!m->be) {
        const mt_be_class *cls = mt_be_class_of(m->backend, err);
        if (!cls) return MT_ERR_UNSUPPORTED;
        if ((st = create_backend(m, cls, err))) return st;
        memset(&m->be_shape, 0, sizeof m->be_shape);
    }
    const mt_be_shape *have = &m->be_shape;
    if (have->n_seq == n_seq && have->seq_len == seq_len && have->n_micro == n_micro && have->want_grad >= want_grad)
        return MT_OK;
    /* the old reservation goes first: the plan sees the memory it leaves */
    m->be->ops->release(m->be);
    memset(&m->be_shape, 0, sizeof m->be_shape);
    mt_offload_policy pol = m->pol;
    if (!pol.host_budget_bytes) pol.host_budget_bytes = mt_sys_mem_available() + m->layout.tile_bytes;
    m->host_budget = pol.host_budget_bytes; /* the plan's and the reservation's */
    const mt_be_shape s = {n_seq, seq_len, n_micro, want_grad};
    mt_be_request r = mt_be_request_of(m, &s);
    r.pol = &pol;
    r.n_ranks = ranks_of(m); /* each rank plans for its share (engine/group.c) */
    r.shape.n_micro = mt_rank_share(n_micro, r.n_ranks);
    if (m->backend == MT_BACKEND_CUDA) { /* several GPUs: the least free of them */
        const uint64_t fr = mt_plan_gpu_free(&m->pol);
        if (fr) r.gpu_free = fr + m->be->device_fixed;
    }
    mt_memory_plan plan;
    if ((st = mt_plan_compute(err, &plan, &r, 1, m->backend))) return st;
    const mt_be_request own = mt_be_request_of(m, &s); /* the model's policy (r's is this call's copy) */
    if ((st = m->be->ops->reserve(m->be, &own, err))) return st;
    m->be_shape = s;
    return MT_OK;
}

/* Checks a batch and counts its target tokens. */
static mt_status check_batch(mt_model *m, mt_batch *b, const mt_batch *src, int need_targets, uint64_t *n_targets)
{
    mt_err err = mt_model_err(m);
    mt_batch_init(b);
    mt_status st = mt_copy_in(err, b, sizeof *b, src, MT_FIRST_SIZE_BATCH, "mt_batch");
    if (st) return st;
    if (!b->micro_batch_size || !b->seq_len || !b->num_micro_batches)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_batch needs micro_batch_size, seq_len and num_micro_batches > 0");
    if (b->seq_len > m->cfg.max_position_embeddings)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "seq_len %u exceeds the model's max_position_embeddings %u",
                       b->seq_len, m->cfg.max_position_embeddings);
    if ((uint64_t)b->micro_batch_size * b->seq_len > (1u << 24) || b->num_micro_batches > 4096)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_batch of %u x %u x %u tokens is too large", b->num_micro_batches,
                       b->micro_batch_size, b->seq_len);
    /* a mixture of experts routes each token of a micro-batch to k experts: T * k rows, counted in int */
    if ((uint64_t)b->micro_batch_size * b->seq_len * m->cfg.num_experts_per_tok > INT32_MAX)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_batch: %u x %u tokens a micro-batch, each routed to %u experts, are more rows than the "
                       "experts' GEMMs take (2^31)",
                       b->micro_batch_size, b->seq_len, m->cfg.num_experts_per_tok);
    if (!b->tokens) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_batch.tokens is NULL");
    if (need_targets && !b->targets) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_batch.targets is NULL");
    const size_t n = (size_t)b->num_micro_batches * b->micro_batch_size * b->seq_len;
    const int32_t V = (int32_t)m->cfg.vocab_size;
    uint64_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= V)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "token id %d at position %zu is outside the vocabulary [0, %d)",
                           b->tokens[i], i, V);
        if (b->targets) {
            int32_t t = b->targets[i];
            if (t == MT_IGNORE_INDEX) continue;
            if (t < 0 || t >= V)
                return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                               "target id %d at position %zu is outside the vocabulary [0, %d) and not %d", t, i, V,
                               MT_IGNORE_INDEX);
            count++;
        }
    }
    if (need_targets && count == 0)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "every target of the batch is MT_IGNORE_INDEX: nothing to learn");
    /* documents: each sequence starts one at position 0; a position is 0
     * (the next document) or one more than the one before */
    for (size_t i = 0; b->positions && i < n; i++) {
        const int32_t p = b->positions[i];
        if (i % b->seq_len == 0 && p != 0)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                           "mt_batch.positions[%zu] is %d, but a sequence starts a document: its first position is 0",
                           i, p);
        if (i % b->seq_len && p != 0 && p != b->positions[i - 1] + 1)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                           "mt_batch.positions[%zu] is %d after %d: a position is 0 (a new document) or one more than "
                           "the one before", i, p, b->positions[i - 1]);
    }
    *n_targets = count;
    return MT_OK;
}

static void stage_tokens(mt_model *m, const mt_batch *b)
{
    const size_t per = (size_t)b->micro_batch_size * b->seq_len;
    for (uint32_t mb = 0; mb < b->num_micro_batches; mb++)
        m->be->ops->set_tokens(m->be, (int)mb, b->tokens + mb * per, b->targets ? b->targets + mb * per : NULL,
                               b->positions ? b->positions + mb * per : NULL);
}

/* After a failed step in bf16 mode the weight blocks hold gradients: put
 * the weights back from the master copy. (Lean mode's gradients have a block
 * of their own.) */
static void restore_weights(mt_model *m)
{
    for (int ui = 0; ui < m->layout.n_units; ui++) {
        const mt_unit_desc *u = &m->layout.units[ui];
        const mt_tile *tl = &m->tiles.tile[ui];
        uint16_t *w = mt_tile_weights_bf16(tl, u);
        if (w && !u->lean) mt_tile_weights_from_master(m->pool, tl, u, w);
    }
}

/* ---- public entry points ------------------------------------------------------- */

/* Starts the step's trace, with nothing running on the backend: FULL with
 * the policy's timeline, else the head mark alone (mt_step_stats' split),
 * where the backend keeps time. */
static void trace_start(mt_model *m)
{
    mt_trace *t = &m->trace;
    mt_be *be = m->be;
    const int L = (int)m->cfg.num_hidden_layers, n_visits = 2 * L + 3 + be->held.recomputed;
    int level = !be->ops->trace_start ? MT_TRACE_OFF : m->pol.timeline ? MT_TRACE_FULL : MT_TRACE_MARKS;
    if (mt_trace_reset(t, level, n_visits, n_visits + 3 * L + 8)) level = MT_TRACE_MARKS;
    t->level = level;
    t->origin = now();
    if (level && be->ops->trace_start(be, t)) t->level = MT_TRACE_OFF;
}

mt_status mt_engine_grads(mt_model *m, const mt_batch *b, uint64_t n_targets, double *loss, double *norm,
                          double *t_head)
{
    mt_err err = mt_model_err(m);
    mt_status st;
    if ((st = prepare(m, (int)b->micro_batch_size, (int)b->seq_len, (int)b->num_micro_batches, 1))) return st;
    trace_start(m);
    stage_tokens(m, b);
    const int n = build_visits(m, PH_HEAD, 1);
    const int stopped = run_visits(m, &m->trace, n, (int)b->num_micro_batches, (float)(1.0 / (double)n_targets), NULL);
    double loss_sum, sumsq;
    if ((st = m->be->ops->sync(m->be, &loss_sum, &sumsq, err))) return st;
    if (stopped) return fail_aborted(m, "mt_step");
    mt_trace *t = &m->trace;
    if (t->level && m->be->ops->trace_read(m->be)) t->level = MT_TRACE_OFF; /* no device times: host ones stay */
    if (t_head) *t_head = t->origin + t->head_start;
    *loss = loss_sum / (double)n_targets;
    *norm = sqrt(sumsq);
    return MT_OK;
}

mt_status mt_engine_step(mt_model *m, const mt_batch *batch_in, const mt_optim_config *opt_in, mt_step_stats *stats)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    const double t0 = now();
    mt_batch b;
    mt_optim_config o;
    uint64_t n_targets = 0;
    mt_status st;
    if ((st = check_batch(m, &b, batch_in, 1, &n_targets)) || (st = mt_optim_import(err, &o, opt_in))) return st;
    if (b.num_micro_batches % (uint32_t)ranks_of(m))
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_batch.num_micro_batches %u is not a multiple of the model's %d GPUs: each trains on the "
                       "same number of micro-batches", b.num_micro_batches, ranks_of(m));
    if (stats) {
        mt_step_stats probe;
        mt_step_stats_init(&probe);
        if ((st = mt_copy_out(err, stats, &probe, sizeof probe, MT_FIRST_SIZE_STEP_STATS, "mt_step_stats"))) return st;
    }
    double loss, norm, t_head = t0;
    m->trace_valid = 0;
    if ((st = mt_engine_grads(m, &b, n_targets, &loss, &norm, &t_head))) {
        mt_optimizer_drain(&m->opt); /* a failure can come before every unit was awaited */
        restore_weights(m);
        return st;
    }
    const double t_bwd = now();
    if (!isfinite(loss) || !isfinite(norm)) {
        restore_weights(m);
        return mt_fail(err, MT_ERR_NONFINITE, "step %llu: loss %g, gradient norm %g: weights left unchanged",
                       (unsigned long long)m->step + 1, loss, norm);
    }
    /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1 */
    float scale = 1.0f;
    if (o.grad_clip > 0 && norm > o.grad_clip) scale = (float)((double)o.grad_clip / (norm + 1e-6));
    const float lr = mt_lr_at(&o, m->step);
    const double t = (double)(m->step + 1);
    const mt_adamw_hyper h = {lr, o.beta1, o.beta2, o.eps, o.weight_decay, (float)(1.0 - pow((double)o.beta1, t)),
                              (float)(1.0 - pow((double)o.beta2, t)), scale};
    /* With a GPU the update runs behind the next step's forward, which waits
     * for each unit before loading it; the CPU backend needs the cores itself. */
    mt_optimizer_drain(&m->opt);
    if (m->opt.skipped_blocks != m->skipped_logged) { /* lean mode: a moment overflowed fp32 (|g| ~ 1e19) */
        mt_log(&m->log, MT_LOG_WARN, "lean optimizer: %llu block(s) of 256 parameters left unchanged by an update "
               "whose moments were not finite (%llu in all)", (unsigned long long)(m->opt.skipped_blocks - m->skipped_logged),
               (unsigned long long)m->opt.skipped_blocks);
        m->skipped_logged = m->opt.skipped_blocks;
    }
    if (m->backend != MT_BACKEND_CUDA || mt_optimizer_run(&m->opt, &h, o.weight_decay, m->step + 1, 1) != 0)
        mt_optimizer_run(&m->opt, &h, o.weight_decay, m->step + 1, 0);
    m->step++;
    const double t_end = now();
    if (m->trace.level == MT_TRACE_FULL) {
        m->trace_before = m->trace.origin - t0;
        m->trace_after = t_end - m->trace.origin;
        m->trace_valid = 1;
    }
    if (stats) {
        mt_step_stats s;
        mt_step_stats_init(&s);
        s.step = m->step;
        s.loss = loss;
        s.grad_norm = norm;
        s.lr = lr;
        s.tokens = (uint64_t)b.num_micro_batches * b.micro_batch_size * b.seq_len;
        s.target_tokens = n_targets;
        s.seconds = t_end - t0;
        s.forward_seconds = t_head - t0;
        s.backward_seconds = t_bwd - t_head;
        s.optimizer_seconds = t_end - t_bwd;
        mt_copy_out(err, stats, &s, sizeof s, MT_FIRST_SIZE_STEP_STATS, "mt_step_stats");
    }
    return MT_OK;
}

mt_status mt_engine_eval(mt_model *m, const mt_batch *batch_in, mt_eval_stats *stats)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_optimizer_drain(&m->opt);
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    const double t0 = now();
    mt_batch b;
    uint64_t n_targets = 0;
    mt_status st;
    if ((st = check_batch(m, &b, batch_in, 1, &n_targets))) return st;
    if (!stats) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_eval: stats is NULL");
    mt_eval_stats s;
    mt_eval_stats_init(&s);
    if ((st = mt_copy_out(err, stats, &s, sizeof s, MT_FIRST_SIZE_EVAL_STATS, "mt_eval_stats"))) return st;
    if ((st = prepare(m, (int)b.micro_batch_size, (int)b.seq_len, (int)b.num_micro_batches, 0))) return st;
    stage_tokens(m, &b);
    const int n = build_visits(m, PH_HEAD, 0);
    const int stopped = run_visits(m, NULL, n, (int)b.num_micro_batches, 0.0f, NULL);
    double loss_sum, sumsq;
    if ((st = m->be->ops->sync(m->be, &loss_sum, &sumsq, err))) return st;
    if (stopped) return fail_aborted(m, "mt_eval");
    s.loss = loss_sum / (double)n_targets;
    s.tokens = (uint64_t)b.num_micro_batches * b.micro_batch_size * b.seq_len;
    s.target_tokens = n_targets;
    s.seconds = now() - t0;
    return mt_copy_out(err, stats, &s, sizeof s, MT_FIRST_SIZE_EVAL_STATS, "mt_eval_stats");
}

mt_status mt_engine_logits(mt_model *m, const int32_t *tokens, uint32_t n_seq, uint32_t seq_len, float *out)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_optimizer_drain(&m->opt);
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_model_logits: out is NULL");
    mt_batch req, b;
    mt_batch_init(&req);
    req.micro_batch_size = n_seq;
    req.seq_len = seq_len;
    req.num_micro_batches = 1;
    req.tokens = tokens;
    uint64_t n_targets;
    mt_status st;
    if ((st = check_batch(m, &b, &req, 0, &n_targets))) return st;
    if ((st = prepare(m, (int)n_seq, (int)seq_len, 1, 0))) return st;
    stage_tokens(m, &b);
    const int n = build_visits(m, PH_HEAD_LOGITS, 0);
    const int stopped = run_visits(m, NULL, n, 1, 0.0f, out);
    double loss_sum, sumsq;
    if ((st = m->be->ops->sync(m->be, &loss_sum, &sumsq, err))) return st;
    return stopped ? fail_aborted(m, "mt_model_logits") : MT_OK;
}

int mt_engine_enter(const mt_model *m)
{
    /* several GPUs: the group makes each rank's current in turn; the caller's is put back all the same */
    return m && m->backend == MT_BACKEND_CUDA ? mt_device_use(m->pol.device) : -1;
}

void mt_engine_fini(mt_model *m)
{
    mt_trace_free(&m->trace);
    if (m->be) {
        const int prev = mt_engine_enter(m);
        m->be->ops->destroy(m->be);
        mt_device_restore(prev);
        m->be = NULL;
    }
    free(m->visits);
    m->visits = NULL;
}
