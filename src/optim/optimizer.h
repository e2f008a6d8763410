/* The optimizer step over a model's units (its tiles and layout), run either on the caller or on a
 * per-model thread behind the next step: unit u's weights are then awaited
 * just before the next step's forward loads them, so the CPU's AdamW
 * overlaps the GPU's forward (units are updated in forward order). */
#ifndef MT_OPTIMIZER_H
#define MT_OPTIMIZER_H

#include "optim/adamw.h"
#include "optim/lean.h"
#include "memory/tiler.h"
#include "model/layout.h"
#include "core/threadpool.h"

#include <pthread.h>
#include <stdint.h>

typedef struct mt_optimizer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started;        /* the thread exists */
    int busy;           /* a job is queued or running */
    int done;           /* units the running job has finished */
    int quit;
    int ready;          /* initialised and not yet finished */
    mt_adamw_hyper h;   /* the job */
    float weight_decay; /* for matrices; norms and biases take none */
    uint64_t step;      /* the job's step, 1-based (lean mode's random bits) */
    uint64_t seed;      /* lean mode's random bits (mt_optimizer_bind) */
    mt_lean_block_fn lean_kernel; /* this CPU's (mt_optimizer_bind) */
    uint64_t skipped_blocks; /* lean mode: blocks a non-finite moment left unchanged, ever (__atomic_*: the
                              * header is also C++'s) */
    mt_pool *pool;      /* what it updates, with which threads (mt_optimizer_bind) */
    const mt_layout *layout;
    const mt_tiles *tiles;
} mt_optimizer;

void mt_optimizer_init(mt_optimizer *o);
/* The state the optimizer updates: every unit of lo in tiles, on pool; seed
 * picks lean mode's stochastic rounding. */
void mt_optimizer_bind(mt_optimizer *o, mt_pool *pool, const mt_layout *lo, const mt_tiles *tiles, uint64_t seed);
/* Waits for a running job, stops the thread; once (later calls do nothing). */
void mt_optimizer_fini(mt_optimizer *o);
/* Updates every unit with h (weight decay wd on matrices), the update of 1-based
 * step `step` (lean mode's random bits depend on it): on the caller when
 * async is 0, else queued for the model's optimizer thread (started on first
 * use); returns -1 only when that thread cannot be started (then nothing
 * was queued). A previous job must be finished (mt_optimizer_drain). */
int mt_optimizer_run(mt_optimizer *o, const mt_adamw_hyper *h, float wd, uint64_t step, int async);
/* Returns once unit's update (if one is pending) is done: 1 if it had to wait. */
int mt_optimizer_await_unit(mt_optimizer *o, int unit);
/* Returns once no update is pending: before anything reads or writes the
 * model's state outside the step. */
void mt_optimizer_drain(mt_optimizer *o);

#endif
