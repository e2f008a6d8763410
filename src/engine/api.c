/* The public calls on a model that run it or move it to and from files:
 * each checks its handle, lets the optimizer finish, clears the model's
 * error and hands the work to the scheduler (engine.c) or to src/io, which
 * see a view of the model (io/hf.h) rather than the handle. */
#include "engine/engine.h"
#include "device/device.h"
#include "io/hf.h"

#include <stdlib.h>
#include <string.h>

/* The entry points that reach the backend make the policy's device current
 * on the caller's thread for the call and leave the caller's own current
 * device as they found it (device/device.h). */
mt_status mt_step(mt_model *m, const mt_batch *batch, const mt_optim_config *opt, mt_step_stats *stats)
{
    const int prev = mt_engine_enter(m);
    const mt_status st = mt_engine_step(m, batch, opt, stats);
    mt_device_restore(prev);
    return st;
}

mt_status mt_eval(mt_model *m, const mt_batch *batch, mt_eval_stats *stats)
{
    const int prev = mt_engine_enter(m);
    const mt_status st = mt_engine_eval(m, batch, stats);
    mt_device_restore(prev);
    return st;
}

mt_status mt_model_logits(mt_model *m, const int32_t *tokens, uint32_t n_seq, uint32_t seq_len, float *out)
{
    const int prev = mt_engine_enter(m);
    const mt_status st = mt_engine_logits(m, tokens, n_seq, seq_len, out);
    mt_device_restore(prev);
    return st;
}

uint64_t mt_model_step_count(const mt_model *m) { return m ? m->step : 0; }

void mt_timeline_init_sized(mt_timeline *t, uint32_t size) { mt_struct_init(t, size, NULL, 0); }

mt_status mt_model_timeline(mt_model *m, mt_timeline *out, mt_timeline_visit *visits, uint32_t cap)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_model_timeline: out is NULL");
    /* a caller built against 0.1 passes 0.1's size and gets 0.1's layout */
    uint32_t size;
    memcpy(&size, out, sizeof size);
    const int v0_1 = size == MT_SIZE_TIMELINE_0_1;
    mt_timeline tl;
    mt_timeline_init(&tl);
    mt_status st = v0_1 ? MT_OK : mt_copy_out(err, out, &tl, sizeof tl, MT_FIRST_SIZE_TIMELINE, "mt_timeline");
    if (st) return st;
    if (!m->pol.timeline || m->backend != MT_BACKEND_CUDA)
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "mt_model_timeline needs the CUDA backend and mt_offload_policy.timeline set when the model is "
                       "created");
    if (!m->trace_valid)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_model_timeline: no step recorded yet (or the last one failed)");
    if (v0_1) {
        const uint32_t n = visits ? MT_MIN(cap, (uint32_t)m->trace.n_visits) : 0;
        mt_timeline_visit *vis = n ? calloc(n, sizeof *vis) : NULL;
        if (n && !vis) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "mt_model_timeline: out of host memory");
        mt_trace_split(&m->trace, m->trace_before, m->trace_after, &tl, vis, n);
        tl.step = m->step;
        mt_timeline_to_0_1((mt_timeline_0_1 *)out, &tl, (mt_timeline_visit_0_1 *)visits, vis, n);
        free(vis);
        return MT_OK;
    }
    mt_trace_split(&m->trace, m->trace_before, m->trace_after, &tl, visits, cap);
    tl.step = m->step;
    return mt_copy_out(err, out, &tl, sizeof tl, MT_FIRST_SIZE_TIMELINE, "mt_timeline");
}

void mt_batch_init_sized(mt_batch *b, uint32_t size) { mt_struct_init(b, size, NULL, 0); }

void mt_step_stats_init_sized(mt_step_stats *s, uint32_t size) { mt_struct_init(s, size, NULL, 0); }

void mt_eval_stats_init_sized(mt_eval_stats *s, uint32_t size) { mt_struct_init(s, size, NULL, 0); }

/* What src/io reads and writes of m; files_back keeps what a load changed. */
static mt_model_files files_of(mt_model *m)
{
    return (mt_model_files){.cfg = &m->cfg,
                            .layout = &m->layout,
                            .tiles = &m->tiles,
                            .pool = m->pool,
                            .step = m->step,
                            .seed = m->opt.seed,
                            .source_dir = m->source_dir,
                            .caller_json = m->caller_json};
}

static void files_back(mt_model *m, const mt_model_files *f)
{
    m->step = f->step;
    m->opt.seed = f->seed;
    m->source_dir = f->source_dir;
    m->caller_json = f->caller_json;
}

/* The start every file call shares: the last step's update, if it still
 * runs, finishes before the tiles are read or written. */
static mt_status files_enter(mt_model *m, const void *dir, const char *call)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_optimizer_drain(&m->opt);
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    return dir ? MT_OK : mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s: dir is NULL", call);
}

mt_status mt_model_save(mt_model *m, const char *dir)
{
    mt_status st = files_enter(m, dir, "mt_model_save");
    if (st) return st;
    const mt_model_files f = files_of(m);
    return mt_hf_save(mt_model_err(m), &f, dir);
}

mt_status mt_model_load(mt_model *m, const char *dir)
{
    mt_status st = files_enter(m, dir, "mt_model_load");
    if (st) return st;
    mt_model_files f = files_of(m);
    st = mt_hf_load(mt_model_err(m), &f, dir);
    files_back(m, &f);
    return st;
}

mt_status mt_checkpoint_save(mt_model *m, const char *dir, const mt_checkpoint_info *info)
{
    mt_status st = files_enter(m, dir, "mt_checkpoint_save");
    if (st) return st;
    const mt_model_files f = files_of(m);
    return mt_ck_save(mt_model_err(m), &f, dir, info);
}

mt_status mt_checkpoint_load(mt_model *m, const char *dir, mt_checkpoint_info *info_out)
{
    mt_status st = files_enter(m, dir, "mt_checkpoint_load");
    if (st) return st;
    mt_model_files f = files_of(m);
    st = mt_ck_load(mt_model_err(m), &f, dir, info_out);
    files_back(m, &f);
    return st;
}
