#define _GNU_SOURCE
/* Parity with transformers: fixtures made by tools/fixtures/make_fixtures.py
 * (tiny models built, saved and trained with transformers in fp32; see
 * docs/parity.md) are loaded from their Hugging Face folders and trained here
 * in fp32 on the CPU backend with the same tokens and optimizer settings. The
 * test compares the configuration as read, RoPE's inverse frequencies, the
 * step-0 logits at every position, the per-step loss, gradient norm and
 * learning rate, and finally every weight after training.
 *
 * Tolerances (fp32 on both sides, different summation orders):
 *   loss, gradient norm       relative 1e-5  (sums of a few hundred fp32 terms agree to ~1e-7;
 *                                              later steps add the drift of the weights)
 *   learning rate             relative 1e-7  (the same float formula: at most one rounding apart)
 *   logits                    absolute 1e-4  (|logit| < ~10, fp32 ulp there ~1e-6)
 *   inv_freq                  relative 1e-6  (pow and the llama3 smoothing in float32, a few ulp)
 *   weights after training    absolute 1e-5  (AdamW moves each weight by ~lr per step, 1e-3 here;
 *                                              its update m / (sqrt(v) + eps) is normalised, so a
 *                                              gradient error of relative e moves a weight by
 *                                              ~lr * e per step: measured <= 1e-6 nearly everywhere)
 *     except where the result is set by rounding: a weight whose gradient is mostly cancellation
 *     (|g| ~1e-8 against terms of ~1e-3, or a k bias on a slow RoPE pair, where softmax's shift
 *     invariance makes the true gradient ~0) gets an AdamW step that is the sign and size of
 *     that noise. Such a weight may differ by more than 1e-5 (one or two per fixture, up to
 *     ~6e-5) if training libmegatrain again from the start weights moved by one ulp (three
 *     patterns) moves its own result there by at least a tenth of the difference, and by at
 *     most 2 * (sum of the steps' lr); at most max(4, 1 in 10^4) weights may take this way.
 *     For nearly every weight that spread is below 1e-6, so a real error in a gradient still
 *     fails.
 * The measured differences are printed on stderr (docs/parity.md keeps them).
 *
 * The fixtures' paths are relative to the repository root, where `make test`
 * runs the suite. A missing fixture fails its test. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu_ops.h"
#include "model.h"

#define FIXTURE_ROOT "tests/fixtures"

#define TOL_LOSS_REL 1e-5
#define TOL_NORM_REL 1e-5
#define TOL_LR_REL 1e-7
#define TOL_LOGIT_ABS 1e-4
#define TOL_INV_FREQ_REL 1e-6
#define TOL_WEIGHT_ABS 1e-5

static const char *const EXPECTED[] = {"llama_gqa", "qwen2_tied", "llama3_rope"};
#define N_EXPECTED (sizeof EXPECTED / sizeof EXPECTED[0])

TestSuite(parity);

/* ---- JSON ------------------------------------------------------------------------ */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert_not_null(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n, "cannot read %s", path);
    s[n] = '\0';
    fclose(f);
    return s;
}

static const cJSON *jget(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert_not_null(v, "fixture.json lacks \"%s\"", key);
    return v;
}

static double jnum(const cJSON *o, const char *key)
{
    const cJSON *v = jget(o, key);
    cr_assert(cJSON_IsNumber(v), "fixture.json: \"%s\" is not a number", key);
    return v->valuedouble;
}

static int jbool(const cJSON *o, const char *key)
{
    const cJSON *v = jget(o, key);
    cr_assert(cJSON_IsBool(v), "fixture.json: \"%s\" is not a boolean", key);
    return cJSON_IsTrue(v);
}

/* The n numbers of a JSON array, as float or int32 (malloc'd). */
static float *jfloats(const cJSON *o, const char *key, size_t n)
{
    const cJSON *a = jget(o, key);
    cr_assert(cJSON_IsArray(a) && (size_t)cJSON_GetArraySize(a) == n, "fixture.json: \"%s\" is not %zu numbers", key,
              n);
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) x[i++] = (float)e->valuedouble;
    return x;
}

static int32_t *jints(const cJSON *o, const char *key, size_t n)
{
    const cJSON *a = jget(o, key);
    cr_assert(cJSON_IsArray(a) && (size_t)cJSON_GetArraySize(a) == n, "fixture.json: \"%s\" is not %zu numbers", key,
              n);
    int32_t *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) x[i++] = (int32_t)e->valueint;
    return x;
}

static double rel_diff(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* ---- models ------------------------------------------------------------------------- */

static mt_model *create(const mt_model_config *c)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = 2;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

/* A model with the weights of a safetensors file: a temporary folder whose
 * model.safetensors links to it (mt_model_load reads no config.json). */
static mt_model *load_weights_file(const mt_model_config *c, const char *file)
{
    char real[PATH_MAX], tmp[] = "/tmp/mt_parity_XXXXXX", link_path[PATH_MAX + 32];
    cr_assert_not_null(realpath(file, real), "missing %s", file);
    cr_assert_not_null(mkdtemp(tmp));
    snprintf(link_path, sizeof link_path, "%s/model.safetensors", tmp);
    cr_assert_eq(symlink(real, link_path), 0);
    mt_model *m = create(c);
    mt_status st = mt_model_load(m, tmp);
    unlink(link_path);
    rmdir(tmp);
    cr_assert_eq(st, MT_OK, "loading %s: %s", file, mt_model_errmsg(m));
    return m;
}

/* Moves every weight of m one ulp up or down, in a fixed pseudo-random pattern. */
static void perturb_one_ulp(mt_model *m, unsigned seed)
{
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        float *w = mt_tile_master(&m->tiles.tile[u], ud);
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *t = &ud->tensors[i];
            for (uint64_t k = 0; k < t->numel; k++) {
                seed = seed * 1103515245u + 12345u;
                float *x = &w[t->offset + k];
                *x = nextafterf(*x, (seed >> 16) & 1 ? INFINITY : -INFINITY);
            }
        }
    }
}

/* The weights of m (trained here) against want (transformers) and the runs
 * `alt` (trained here from the start moved by one ulp). */
typedef struct weight_report {
    double bulk_max;      /* largest |m - want| over the well-conditioned weights */
    char bulk_at[160];
    int n_noisy;          /* weights beyond TOL_WEIGHT_ABS that are noise-determined */
    double noisy_max, noisy_spread;
    char noisy_at[160];
    int n_bad;            /* weights beyond TOL_WEIGHT_ABS that are not */
    double bad_max, bad_spread;
    char bad_at[160];
    double moved;         /* largest |want - start|: how far training moved the weights */
} weight_report;

#define N_ALT 3

static void compare_weights(weight_report *r, mt_model *m, mt_model *want, mt_model *start, mt_model *const *alt,
                            double cap)
{
    memset(r, 0, sizeof *r);
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        const float *wm = mt_tile_master(&m->tiles.tile[u], ud), *ww = mt_tile_master(&want->tiles.tile[u], ud);
        const float *w0 = mt_tile_master(&start->tiles.tile[u], ud), *wa[N_ALT];
        for (int a = 0; a < N_ALT; a++) wa[a] = mt_tile_master(&alt[a]->tiles.tile[u], ud);
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *t = &ud->tensors[i];
            for (uint64_t k = 0; k < t->numel; k++) {
                const uint64_t e = t->offset + k;
                const double d = fabs((double)wm[e] - (double)ww[e]);
                r->moved = fmax(r->moved, fabs((double)ww[e] - (double)w0[e]));
                if (d <= TOL_WEIGHT_ABS) {
                    if (d > r->bulk_max) {
                        r->bulk_max = d;
                        snprintf(r->bulk_at, sizeof r->bulk_at, "%s[%llu]", t->name, (unsigned long long)k);
                    }
                    continue;
                }
                double spread = 0.0; /* how far one ulp at the start moves this weight's result here */
                for (int a = 0; a < N_ALT; a++) spread = fmax(spread, fabs((double)wm[e] - (double)wa[a][e]));
                if (d <= 10.0 * spread && d <= cap) {
                    r->n_noisy++;
                    if (d > r->noisy_max) {
                        r->noisy_max = d, r->noisy_spread = spread;
                        snprintf(r->noisy_at, sizeof r->noisy_at, "%s[%llu]", t->name, (unsigned long long)k);
                    }
                } else {
                    r->n_bad++;
                    if (!(d <= r->bad_max)) {
                        r->bad_max = isnan(d) ? INFINITY : d, r->bad_spread = spread;
                        snprintf(r->bad_at, sizeof r->bad_at, "%s[%llu]", t->name, (unsigned long long)k);
                    }
                }
            }
        }
    }
}

/* ---- one fixture ----------------------------------------------------------------------- */

static const char *arch_name(uint32_t a)
{
    return a == MT_ARCH_LLAMA ? "LlamaForCausalLM" : a == MT_ARCH_QWEN2 ? "Qwen2ForCausalLM"
                                                   : a == MT_ARCH_MISTRAL ? "MistralForCausalLM" : "?";
}

/* mt_config_load on the fixture's model folder, checked against the
 * configuration transformers used. A RoPE setting read differently is a
 * failure; the test then goes on with transformers' value so that the
 * numerical comparison still runs. */
static mt_model_config load_config(const char *name, const char *model_dir, const cJSON *jc)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.precision = MT_PRECISION_FP32;
    cr_assert_eq(mt_config_load(&c, model_dir), MT_OK, "%s: %s", model_dir, mt_last_errmsg());

    const cJSON *arch = jget(jc, "architecture");
    cr_assert(cJSON_IsString(arch));
    cr_assert_str_eq(arch_name(c.arch), arch->valuestring, "%s: architecture", name);
#define SAME_U32(field)                                                                                          \
    cr_assert_eq(c.field, (uint32_t)jnum(jc, #field), "%s: mt_config_load read " #field " %u, transformers %u", \
                 name, c.field, (uint32_t)jnum(jc, #field))
    SAME_U32(vocab_size);
    SAME_U32(hidden_size);
    SAME_U32(intermediate_size);
    SAME_U32(num_hidden_layers);
    SAME_U32(num_attention_heads);
    SAME_U32(num_key_value_heads);
    SAME_U32(max_position_embeddings);
#undef SAME_U32
    const uint32_t head_dim = c.head_dim ? c.head_dim : c.hidden_size / c.num_attention_heads; /* 0: C / H */
    cr_assert_eq(head_dim, (uint32_t)jnum(jc, "head_dim"), "%s: head_dim %u, transformers %u", name, head_dim,
                 (uint32_t)jnum(jc, "head_dim"));
    cr_assert_eq(c.rms_norm_eps, (float)jnum(jc, "rms_norm_eps"), "%s: rms_norm_eps %g, transformers %g", name,
                 (double)c.rms_norm_eps, jnum(jc, "rms_norm_eps"));
    cr_assert_eq(c.tie_word_embeddings != 0, jbool(jc, "tie_word_embeddings"), "%s: tie_word_embeddings", name);
    cr_assert_eq(c.attention_bias != 0, jbool(jc, "attention_bias"), "%s: attention_bias", name);

    const float theta = (float)jnum(jc, "rope_theta");
    cr_expect_eq(c.rope_theta, theta,
                 "%s/config.json: mt_config_load read rope_theta %g, transformers used %g (transformers 5 writes "
                 "it inside \"rope_parameters\"); continuing with %g",
                 model_dir, (double)c.rope_theta, (double)theta, (double)theta);
    c.rope_theta = theta;
    const cJSON *rs = jget(jc, "rope_scaling");
    const uint32_t want = cJSON_IsNull(rs) ? MT_ROPE_SCALING_NONE : MT_ROPE_SCALING_LLAMA3;
    cr_expect_eq(c.rope_scaling, want,
                 "%s/config.json: mt_config_load read rope scaling %s, transformers used %s (transformers 5 writes "
                 "it as \"rope_parameters\"); continuing with transformers' parameters",
                 model_dir, c.rope_scaling ? "llama3" : "none", want ? "llama3" : "none");
    const uint32_t read_scaling = c.rope_scaling;
    c.rope_scaling = want;
    if (want == MT_ROPE_SCALING_LLAMA3) {
        const float f = (float)jnum(rs, "factor"), lo = (float)jnum(rs, "low_freq_factor");
        const float hi = (float)jnum(rs, "high_freq_factor");
        const uint32_t orig = (uint32_t)jnum(rs, "original_max_position_embeddings");
        cr_expect(read_scaling != MT_ROPE_SCALING_LLAMA3 ||
                      (c.rope_factor == f && c.rope_low_freq_factor == lo && c.rope_high_freq_factor == hi &&
                       c.rope_original_max_position == orig),
                  "%s: llama3 parameters read as (%g, %g, %g, %u), transformers (%g, %g, %g, %u)", name,
                  (double)c.rope_factor, (double)c.rope_low_freq_factor, (double)c.rope_high_freq_factor,
                  c.rope_original_max_position, (double)f, (double)lo, (double)hi, orig);
        c.rope_factor = f, c.rope_low_freq_factor = lo, c.rope_high_freq_factor = hi;
        c.rope_original_max_position = orig;
    }
    return c;
}

static void run_fixture(const char *name)
{
    char dir[512], path[1024], model_dir[600];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURE_ROOT, name);
    struct stat sb;
    cr_assert(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode),
              "fixture %s is missing (run from the repository root; python3 tools/fixtures/make_fixtures.py makes it)",
              dir);
    snprintf(model_dir, sizeof model_dir, "%s/model", dir);
    snprintf(path, sizeof path, "%s/fixture.json", dir);
    char *text = read_text(path);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(j, "%s is not JSON", path);

    /* configuration, model, weights */
    const mt_model_config cfg = load_config(name, model_dir, jget(j, "config"));
    mt_model *m = create(&cfg);
    cr_assert_eq(mt_model_load(m, model_dir), MT_OK, "%s", mt_model_errmsg(m));
    const uint32_t V = cfg.vocab_size, D = m->cfg.head_dim;

    /* RoPE's inverse frequencies, as the CPU backend computes them */
    float *want_if = jfloats(j, "inv_freq", D / 2), *inv = malloc(D / 2 * sizeof *inv);
    mt_rope_params rp = {m->cfg.rope_theta, m->cfg.rope_scaling == MT_ROPE_SCALING_LLAMA3, m->cfg.rope_factor,
                         m->cfg.rope_low_freq_factor, m->cfg.rope_high_freq_factor,
                         (int)m->cfg.rope_original_max_position};
    mt_rope_inv_freq(inv, (int)D, &rp);
    double if_max = 0.0;
    int if_at = 0;
    for (uint32_t i = 0; i < D / 2; i++) {
        double r = rel_diff(inv[i], want_if[i]);
        if (!(r <= if_max)) if_max = r, if_at = (int)i;
    }
    cr_expect(if_max <= TOL_INV_FREQ_REL, "%s: inv_freq[%d] = %.9g, transformers %.9g (relative %.3g)", name, if_at,
              (double)inv[if_at], (double)want_if[if_at], if_max);
    free(want_if);
    free(inv);

    /* batches */
    const cJSON *jb = jget(j, "batch"), *jsteps = jget(j, "steps"), *jo = jget(j, "optim");
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = (uint32_t)jnum(jb, "micro_batch_size");
    b.seq_len = (uint32_t)jnum(jb, "seq_len");
    b.num_micro_batches = (uint32_t)jnum(jb, "num_micro_batches");
    const uint32_t S = b.seq_len;
    const size_t n_tok = (size_t)b.num_micro_batches * b.micro_batch_size * S;
    cr_assert(cJSON_IsArray(jsteps) && cJSON_GetArraySize(jsteps) > 0);
    const int n_steps = cJSON_GetArraySize(jsteps);

    /* step-0 logits of the first sequence at every position: position p is
     * the last position of the prefix of p + 1 tokens (causal attention) */
    const cJSON *jl = jget(j, "logits_check");
    cr_assert_eq((uint32_t)jnum(jl, "seq_len"), S);
    cr_assert_eq((uint32_t)jnum(jl, "vocab_size"), V);
    float *want_logits = jfloats(jl, "logits", (size_t)S * V), *logits = malloc(V * sizeof *logits);
    int32_t *tok0 = jints(cJSON_GetArrayItem(jsteps, 0), "tokens", n_tok);
    double lg_max = 0.0;
    uint32_t lg_pos = 0, lg_id = 0;
    for (uint32_t p = 0; p < S; p++) {
        cr_assert_eq(mt_model_logits(m, tok0, 1, p + 1, logits), MT_OK, "%s", mt_model_errmsg(m));
        for (uint32_t v = 0; v < V; v++) {
            double d = fabs((double)logits[v] - (double)want_logits[(size_t)p * V + v]);
            if (!(d <= lg_max)) lg_max = isnan(d) ? INFINITY : d, lg_pos = p, lg_id = v;
        }
    }
    cr_expect(lg_max <= TOL_LOGIT_ABS, "%s: step-0 logit at position %u, id %u differs from transformers by %.3g",
              name, lg_pos, lg_id, lg_max);
    free(want_logits);
    free(logits);
    free(tok0);

    /* optimizer */
    mt_optim_config o;
    mt_optim_config_init(&o);
    const cJSON *sched = jget(jo, "schedule");
    cr_assert(cJSON_IsString(sched));
    o.schedule = !strcmp(sched->valuestring, "cosine") ? MT_LR_COSINE : MT_LR_CONSTANT;
    o.lr = (float)jnum(jo, "lr");
    o.beta1 = (float)jnum(jo, "beta1");
    o.beta2 = (float)jnum(jo, "beta2");
    o.eps = (float)jnum(jo, "eps");
    o.weight_decay = (float)jnum(jo, "weight_decay");
    o.grad_clip = (float)jnum(jo, "grad_clip");
    o.min_lr_ratio = (float)jnum(jo, "min_lr_ratio");
    o.warmup_steps = (uint32_t)jnum(jo, "warmup_steps");
    o.total_steps = (uint32_t)jnum(jo, "total_steps");

    /* the steps */
    int32_t **toks = calloc((size_t)n_steps, sizeof *toks), **tgs = calloc((size_t)n_steps, sizeof *tgs);
    cr_assert(toks && tgs);
    for (int s = 0; s < n_steps; s++) {
        toks[s] = jints(cJSON_GetArrayItem(jsteps, s), "tokens", n_tok);
        tgs[s] = jints(cJSON_GetArrayItem(jsteps, s), "targets", n_tok);
    }
    double loss_max = 0.0, norm_max = 0.0, eval_rel = 0.0, lr_sum = 0.0;
    int loss_at = 0, norm_at = 0;
    for (int s = 0; s < n_steps; s++) {
        const cJSON *js = cJSON_GetArrayItem(jsteps, s);
        b.tokens = toks[s];
        b.targets = tgs[s];
        const double want_loss = jnum(js, "loss"), want_norm = jnum(js, "grad_norm");
        if (s == 0) { /* the evaluation path too, before anything changes */
            mt_eval_stats es;
            mt_eval_stats_init(&es);
            cr_assert_eq(mt_eval(m, &b, &es), MT_OK, "%s", mt_model_errmsg(m));
            eval_rel = rel_diff(es.loss, want_loss);
            cr_expect(eval_rel <= TOL_LOSS_REL, "%s: mt_eval loss %.9g, transformers %.9g", name, es.loss,
                      want_loss);
        }
        mt_step_stats st;
        mt_step_stats_init(&st);
        cr_assert_eq(mt_step(m, &b, &o, &st), MT_OK, "%s step %d: %s", name, s, mt_model_errmsg(m));
        cr_expect_eq(st.target_tokens, (uint64_t)jnum(js, "target_tokens"), "%s step %d: target count", name, s);
        const double lr_rel = rel_diff(st.lr, jnum(js, "lr"));
        cr_expect(lr_rel <= TOL_LR_REL, "%s step %d: lr %.9g, fixture %.9g", name, s, (double)st.lr, jnum(js, "lr"));
        lr_sum += st.lr;
        const double lr_ = rel_diff(st.loss, want_loss), nr = rel_diff(st.grad_norm, want_norm);
        cr_expect(lr_ <= TOL_LOSS_REL, "%s step %d: loss %.9g, transformers %.9g (relative %.3g)", name, s, st.loss,
                  want_loss, lr_);
        cr_expect(nr <= TOL_NORM_REL, "%s step %d: gradient norm %.9g, transformers %.9g (relative %.3g)", name, s,
                  st.grad_norm, want_norm, nr);
        if (!(lr_ <= loss_max)) loss_max = lr_, loss_at = s;
        if (!(nr <= norm_max)) norm_max = nr, norm_at = s;
    }

    /* The same training from the start moved by one ulp, N_ALT times: where
     * that moves libmegatrain's own result, the result is set by rounding
     * (a gradient that is mostly cancellation, normalised by AdamW), and
     * transformers' rounding may move it as far. */
    mt_model *alt[N_ALT];
    for (int a = 0; a < N_ALT; a++) {
        alt[a] = create(&m->cfg);
        cr_assert_eq(mt_model_load(alt[a], model_dir), MT_OK, "%s", mt_model_errmsg(alt[a]));
        perturb_one_ulp(alt[a], 1u + (unsigned)a);
        for (int s = 0; s < n_steps; s++) {
            b.tokens = toks[s];
            b.targets = tgs[s];
            cr_assert_eq(mt_step(alt[a], &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(alt[a]));
        }
    }
    for (int s = 0; s < n_steps; s++) {
        free(toks[s]);
        free(tgs[s]);
    }
    free(toks);
    free(tgs);

    /* the weights after training */
    snprintf(path, sizeof path, "%s/final.safetensors", dir);
    mt_model *want = load_weights_file(&m->cfg, path);
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    mt_model *start = load_weights_file(&m->cfg, path);
    weight_report r;
    compare_weights(&r, m, want, start, alt, 2.0 * lr_sum);
    cr_expect(r.n_bad == 0,
              "%s: %d weights after %d steps differ from transformers' by more than %g; the largest, %s, by %.3g "
              "(one ulp at the start moves libmegatrain's result there by at most %.3g)",
              name, r.n_bad, n_steps, TOL_WEIGHT_ABS, r.bad_at, r.bad_max, r.bad_spread);
    /* more than 1 in 10^4 would mean the fixture is badly conditioned (measured: 0 or 1 per fixture) */
    const uint64_t n_params = mt_model_num_params(m), max_noisy = n_params / 10000 > 4 ? n_params / 10000 : 4;
    cr_expect((uint64_t)r.n_noisy <= max_noisy, "%s: %d weights are set by rounding, more than %llu: remake the fixture",
              name, r.n_noisy, (unsigned long long)max_noisy);
    cr_expect(r.moved > 10 * TOL_WEIGHT_ABS, "%s: training moved the weights by only %.3g", name, r.moved);

    fprintf(stderr,
            "parity %-12s inv_freq rel %.2g | logits abs %.2g | eval loss rel %.2g | loss rel %.2g (step %d) | "
            "grad_norm rel %.2g (step %d) | weights abs %.2g at %s; %d noise-set weight(s) up to %.2g at %s "
            "(1-ulp spread %.2g) | training moved weights up to %.2g\n",
            name, if_max, lg_max, eval_rel, loss_max, loss_at, norm_max, norm_at, r.bulk_max, r.bulk_at, r.n_noisy,
            r.noisy_max, r.n_noisy ? r.noisy_at : "-", r.noisy_spread, r.moved);

    for (int a = 0; a < N_ALT; a++) mt_model_destroy(alt[a]);
    mt_model_destroy(start);
    mt_model_destroy(want);
    mt_model_destroy(m);
    cJSON_Delete(j);
}

/* ---- the tests ----------------------------------------------------------------------------- */

Test(parity, llama_gqa) { run_fixture("llama_gqa"); }
Test(parity, qwen2_tied) { run_fixture("qwen2_tied"); }
Test(parity, llama3_rope) { run_fixture("llama3_rope"); }

/* Any other fixture folder under tests/fixtures is checked the same way. */
Test(parity, other_fixtures)
{
    DIR *d = opendir(FIXTURE_ROOT);
    cr_assert_not_null(d, "%s is missing (run from the repository root)", FIXTURE_ROOT);
    char names[64][256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof names[0]) continue;
        int known = 0;
        for (size_t i = 0; i < N_EXPECTED; i++) known |= !strcmp(e->d_name, EXPECTED[i]);
        char p[600];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s/fixture.json", FIXTURE_ROOT, e->d_name);
        if (!known && stat(p, &sb) == 0) snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++) run_fixture(names[i]);
}
