/* The ABI as released: every public struct's layout asserted (abi_layout.h,
 * generated), where each first release ended, and the 0.1 timeline layout
 * that 0.2 changed. A failing assertion here is a change of the ABI. */
#include "core/abi.h"

#include "core/abi_layout.h"

#include <stddef.h>
#include <string.h>

#define ENDS_AT(T, field, size) \
    _Static_assert(offsetof(T, field) + sizeof(((T *)0)->field) == (size), #T "'s first release ended at " #field)

ENDS_AT(mt_model_config, reserved0, MT_FIRST_SIZE_MODEL_CONFIG);
ENDS_AT(mt_offload_policy, abort_user_data, MT_FIRST_SIZE_OFFLOAD_POLICY);
ENDS_AT(mt_optim_config, reserved0, MT_FIRST_SIZE_OPTIM_CONFIG);
ENDS_AT(mt_batch_shape, num_micro_batches, MT_FIRST_SIZE_BATCH_SHAPE);
ENDS_AT(mt_memory_plan, largest_unit_params, MT_FIRST_SIZE_MEMORY_PLAN);
ENDS_AT(mt_batch, targets, MT_FIRST_SIZE_BATCH);
ENDS_AT(mt_step_stats, optimizer_seconds, MT_FIRST_SIZE_STEP_STATS);
ENDS_AT(mt_eval_stats, seconds, MT_FIRST_SIZE_EVAL_STATS);
ENDS_AT(mt_timeline, d2h_bytes, MT_FIRST_SIZE_TIMELINE);
ENDS_AT(mt_checkpoint_info, rng_state, MT_FIRST_SIZE_CHECKPOINT_INFO);
ENDS_AT(mt_dataset_options, seed, MT_FIRST_SIZE_DATASET_OPTIONS);
ENDS_AT(mt_family_info, example, MT_FIRST_SIZE_FAMILY_INFO);

/* 0.1's timeline, as tests/abi/megatrain-0.1.0.h declares it */
_Static_assert(sizeof(mt_timeline_0_1) == MT_SIZE_TIMELINE_0_1, "mt_timeline of 0.1: size");
_Static_assert(offsetof(mt_timeline_0_1, h2d_seconds) == 72, "mt_timeline of 0.1: h2d_seconds");
_Static_assert(offsetof(mt_timeline_0_1, d2h_bytes) == 96, "mt_timeline of 0.1: d2h_bytes");
_Static_assert(sizeof(mt_timeline_visit_0_1) == 80, "mt_timeline_visit of 0.1: size");
_Static_assert(MT_WAIT_COUNT <= MT_WAIT_CAPACITY, "the wait arrays hold every cause");
_Static_assert((int)MT_WAITS_0_1 <= (int)MT_WAIT_COUNT, "0.1's causes keep their numbers");

void mt_timeline_to_0_1(mt_timeline_0_1 *out, const mt_timeline *tl, mt_timeline_visit_0_1 *out_visits,
                        const mt_timeline_visit *visits, uint32_t n)
{
    const uint32_t size = out->struct_size;
    memset(out, 0, sizeof *out);
    out->struct_size = size;
    out->n_visits = tl->n_visits;
    out->step = tl->step;
    out->seconds = tl->seconds;
    out->busy_seconds = tl->busy_seconds;
    memcpy(out->wait_seconds, tl->wait_seconds, sizeof out->wait_seconds);
    out->h2d_seconds = tl->h2d_seconds;
    out->d2h_seconds = tl->d2h_seconds;
    out->h2d_bytes = tl->h2d_bytes;
    out->d2h_bytes = tl->d2h_bytes;
    for (uint32_t i = 0; out_visits && i < n; i++) {
        const mt_timeline_visit *v = &visits[i];
        mt_timeline_visit_0_1 *o = &out_visits[i];
        o->unit = v->unit;
        o->phase = v->phase;
        o->start = v->start;
        o->end = v->end;
        o->weights_start = v->weights_start;
        o->weights_end = v->weights_end;
        memcpy(o->wait_seconds, v->wait_seconds, sizeof o->wait_seconds);
    }
}
