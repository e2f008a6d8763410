/* Parity with transformers, shared by tests/test_parity.c (CPU backend, fp32
 * and bf16) and tests/test_cuda_parity.c (CUDA backend, fp32 and bf16): reading
 * a fixture made by tools/fixtures/make_fixtures.py (see docs/parity.md),
 * training a model on it with a given backend and precision, and comparing
 * every figure against the fixture with the caller's tolerances.
 *
 * The helpers fail the running Criterion test on a broken or missing fixture;
 * the comparisons use cr_expect, so that one run reports every difference. */
#ifndef MT_TESTS_PARITY_COMMON_H
#define MT_TESTS_PARITY_COMMON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

/* Relative to the repository root, where `make test` runs the suite. */
#define PARITY_FIXTURE_ROOT "tests/fixtures"

/* ---- JSON ------------------------------------------------------------------------ */

char *parity_read_text(const char *path); /* the whole file, NUL-terminated (malloc'd) */
const cJSON *parity_jget(const cJSON *o, const char *key);
double parity_jnum(const cJSON *o, const char *key);
int parity_jbool(const cJSON *o, const char *key);
/* The n numbers of a JSON array, as float or int32 (malloc'd). */
float *parity_jfloats(const cJSON *o, const char *key, size_t n);
int32_t *parity_jints(const cJSON *o, const char *key, size_t n);
double parity_rel_diff(double a, double b); /* |a - b| / |b| */

/* ---- fixtures ---------------------------------------------------------------------- */

typedef struct parity_fixture {
    char name[128];
    char dir[512], model_dir[600];
    cJSON *json;
    const cJSON *steps; /* fixture.json's "steps" */
    int n_steps;
    /* mt_config_load on model/ in the requested precision, checked against the
     * configuration transformers used; RoPE as transformers applied it */
    mt_model_config cfg;
    mt_batch batch; /* the shape; tokens, targets and positions of the step set by parity_use_step */
    size_t n_tok;   /* tokens per step */
    int32_t **tokens, **targets;
    /* each step's "positions" (documents packed into each sequence, as
     * transformers' position_ids), or NULL for a fixture without them */
    int32_t **positions;
    mt_optim_config optim;
} parity_fixture;

/* Reads fixture `name` under PARITY_FIXTURE_ROOT (a missing folder fails the test). */
void parity_fixture_open(parity_fixture *f, const char *name, uint32_t precision);
void parity_fixture_close(parity_fixture *f);
/* Points f->batch at step s's tokens, targets and positions (NULL without). */
void parity_use_step(parity_fixture *f, int s);

/* ---- models ------------------------------------------------------------------------ */

/* A model on `backend`; the test is skipped (failed under MT_REQUIRE_GPU=1,
 * tests/gpu.h) when the backend is CUDA and there is no device
 * (mt_model_create returns MT_ERR_NO_DEVICE). */
mt_model *parity_create(const mt_model_config *c, uint32_t backend);
/* A CPU model with the weights of a safetensors file: a temporary folder whose
 * model.safetensors links to it (mt_model_load reads no config.json). */
mt_model *parity_load_weights_file(const mt_model_config *c, const char *file);
/* Moves every master weight of m one ulp up or down, in a fixed pseudo-random pattern. */
void parity_perturb_one_ulp(mt_model *m, unsigned seed);

/* ---- the comparison ------------------------------------------------------------------ */

typedef struct parity_tol {
    double inv_freq_rel; /* RoPE's inverse frequencies (mt_rope_inv_freq), relative */
    double logit_abs;    /* step-0 logits at every position, absolute */
    double loss_rel;     /* mt_eval before training and step 0's loss, relative */
    double norm_rel;     /* step 0's gradient norm (before clipping), relative */
    double loss_rel_trained, norm_rel_trained; /* the same for steps 1 and later, from trained weights */
    double lr_rel;       /* every step's learning rate, relative */
    /* fp32: every master weight after training, absolute, with the rule for
     * weights set by rounding (see parity_run) */
    double weight_abs;
    /* bf16: the relative L2 error of what training changed in the fp32 masters,
     * ||(w - w0) - (w_ref - w0)|| / ||w_ref - w0||: per tensor, per attention
     * k bias (a gradient that is mostly cancellation: see test_cuda_parity.c),
     * and over all weights */
    double update_rel, update_rel_k_bias, update_rel_all;
} parity_tol;

/* Loads fixture `name` into a model on `backend` in `precision` and compares,
 * against transformers' fp32 figures: RoPE's inverse frequencies, the step-0
 * logits at every position, mt_eval's loss, every step's loss, gradient norm,
 * learning rate and target count, and the weights after training. Prints one
 * line with the measured differences on stderr. A fixture with positions runs
 * every step and evaluation with them as mt_batch.positions; the logits at
 * position p are then those after the prefix of p's document up to p.
 *
 * Weights in fp32: element by element, within tol->weight_abs, except a weight
 * that is set by rounding: training the model again N times from the start
 * moved by one ulp (on the same backend) moves its result by at least a tenth
 * of the difference, the difference is at most 2 x (sum of the steps' lr), and
 * at most max(4, 1 in 10^4) weights pass this way.
 * Weights in bf16: the fp32 masters (not their bf16 copies, whose rounding,
 * ~|w| / 512, is of the size of five AdamW steps), per tensor as
 * tol->update_rel says, every weight within 2 x (sum of the steps' lr) of
 * transformers' (AdamW's bound on how far two runs can drift apart) and the
 * streamed bf16 copy equal to the rounded master. */
void parity_run(const char *name, uint32_t backend, uint32_t precision, const parity_tol *tol);

#endif
