/* megatrain train: signals, the checkpoint folder, the identity of a run and
 * its metrics log (run.c). */
#ifndef MEGATRAIN_RUN_H
#define MEGATRAIN_RUN_H

#include "cli.h"

#include <cjson/cJSON.h>

#define MT_MIN_U64(a, b) ((a) < (b) ? (a) : (b))

/* SIGINT and SIGTERM: the first is noted (run_signal() returns its number,
 * and run_abort_requested, the policy's abort callback, stops the step in
 * flight); the second ends the process at once with status 128 + signal. */
void run_signals_install(void);
int run_signal(void);
int run_abort_requested(void *user_data);
/* While on, the abort callback lets the work finish (a held-out loss that
 * belongs to the step just taken); the signal still stops the run after. */
void run_hold_off_signals(int on);
const char *run_signal_name(int sig);

/* Where a run's checkpoints go and where it resumes from. */
typedef struct run_ckpt {
    char dir[4096];         /* the run's checkpoint folder */
    int64_t resume_step;    /* -1: a new run */
    char resume_path[4200]; /* the step folder resumed from */
} run_ckpt;

/* Resolves the folder (writing nothing), or exits with a message: --resume
 * of a step folder continues in its parent. */
void run_ckpt_resolve(run_ckpt *c, const char *resume, const char *checkpoints, const char *out);
/* Makes the resolved folder safe to use (the run holds its lock by then), or
 * exits with a message: leftovers of killed saves removed; a new run refuses
 * a folder that holds checkpoints unless restart (which deletes them);
 * --resume of a folder continues from its newest complete checkpoint
 * (repairing a stale `latest`); checkpoints after the one resumed from are
 * refused unless force (which renames them superseded-step-N). */
void run_ckpt_prepare(run_ckpt *c, const char *resume, int restart, int force);
int64_t run_step_of(const char *name);

/* A file's size and a fingerprint of its contents (16 hex digits); -1 with
 * errno when it cannot be read. */
int run_fingerprint(const char *path, uint64_t *bytes, char out[17]);
/* Compares the "run" member of a checkpoint's caller JSON with now: 0 when
 * equal, else nonzero with each difference on a line of msg. */
int run_compare(const char *caller_json, const cJSON *now, char *msg, size_t n);

/* Replaces path with text atomically (temporary file, fsync, rename). */
int run_write_atomic(const char *path, const char *text);
/* Drops the lines of steps after `step` from a metrics log. */
void run_log_trim(const char *path, uint64_t step);
/* One step's metrics as a JSON object (heldout NaN: not measured). */
cJSON *run_record(uint64_t step, const mt_step_stats *s, double elapsed, double heldout);

#endif
