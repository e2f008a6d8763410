/* What the library keeps of earlier releases of the public structs: the
 * size of each struct's first release, the smallest struct_size accepted,
 * and the layouts that a later release changed, for callers built against
 * them (docs/abi.md). */
#ifndef MT_ABI_H
#define MT_ABI_H

#include "megatrain.h"

/* struct_size of each struct's first release. A caller that passes it (or
 * any size up to this library's) gets the defaults of the fields appended
 * since (option structs), or just the fields it knows (output structs).
 * src/core/abi.c asserts where each one ends; these numbers never change. */
enum {
    MT_FIRST_SIZE_MODEL_CONFIG = 96,     /* 0.1: ... seed, initializer_range, reserved0 */
    MT_FIRST_SIZE_OFFLOAD_POLICY = 88,   /* 0.1: ... abort_callback, abort_user_data */
    MT_FIRST_SIZE_OPTIM_CONFIG = 48,     /* 0.1: ... total_steps, reserved0 */
    MT_FIRST_SIZE_BATCH_SHAPE = 16,      /* 0.1: ... num_micro_batches */
    MT_FIRST_SIZE_MEMORY_PLAN = 128,     /* 0.1: ... reserved0, largest_unit_params */
    MT_FIRST_SIZE_BATCH = 32,            /* 0.1: ... tokens, targets */
    MT_FIRST_SIZE_STEP_STATS = 88,       /* 0.1: ... optimizer_seconds */
    MT_FIRST_SIZE_EVAL_STATS = 40,       /* 0.1: ... seconds */
    MT_FIRST_SIZE_TIMELINE = 128,        /* 0.2: ... d2h_bytes, wait arrays of MT_WAIT_CAPACITY */
    MT_FIRST_SIZE_CHECKPOINT_INFO = 56,  /* 0.1: ... rng_state */
    MT_FIRST_SIZE_DATASET_OPTIONS = 32,  /* 0.1: ... seed */
    MT_FIRST_SIZE_FAMILY_INFO = 64,      /* 0.2: ... example */
};

/* mt_timeline and mt_timeline_visit as 0.1 laid them out, with wait arrays
 * of MT_WAIT_COUNT (then 5) entries. mt_model_timeline writes these for a
 * caller whose mt_timeline.struct_size is 0.1's. */
enum { MT_WAITS_0_1 = 5, MT_SIZE_TIMELINE_0_1 = 104 };

typedef struct mt_timeline_0_1 {
    uint32_t struct_size;
    uint32_t n_visits;
    uint64_t step;
    double seconds;
    double busy_seconds;
    double wait_seconds[MT_WAITS_0_1];
    double h2d_seconds;
    double d2h_seconds;
    uint64_t h2d_bytes;
    uint64_t d2h_bytes;
} mt_timeline_0_1;

typedef struct mt_timeline_visit_0_1 {
    uint32_t unit;
    uint32_t phase;
    double start, end;
    double weights_start;
    double weights_end;
    double wait_seconds[MT_WAITS_0_1];
} mt_timeline_visit_0_1;

/* Writes tl and the first n of visits in the 0.1 layout into out and
 * out_visits (which may be NULL); struct_size of out is kept. */
void mt_timeline_to_0_1(mt_timeline_0_1 *out, const mt_timeline *tl, mt_timeline_visit_0_1 *out_visits,
                        const mt_timeline_visit *visits, uint32_t n);

#endif
