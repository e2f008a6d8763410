#define _GNU_SOURCE
/* Parity with transformers: the fixture reader and the comparison that
 * tests/test_parity.c and tests/test_cuda_parity.c share (parity_common.h). */
#include "parity_common.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bf16.h"
#include "cpu/cpu_ops.h"
#include "gpu.h"

/* ---- JSON ------------------------------------------------------------------------ */

char *parity_read_text(const char *path)
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

const cJSON *parity_jget(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert_not_null(v, "fixture.json lacks \"%s\"", key);
    return v;
}

double parity_jnum(const cJSON *o, const char *key)
{
    const cJSON *v = parity_jget(o, key);
    cr_assert(cJSON_IsNumber(v), "fixture.json: \"%s\" is not a number", key);
    return v->valuedouble;
}

int parity_jbool(const cJSON *o, const char *key)
{
    const cJSON *v = parity_jget(o, key);
    cr_assert(cJSON_IsBool(v), "fixture.json: \"%s\" is not a boolean", key);
    return cJSON_IsTrue(v);
}

float *parity_jfloats(const cJSON *o, const char *key, size_t n)
{
    const cJSON *a = parity_jget(o, key);
    cr_assert(cJSON_IsArray(a) && (size_t)cJSON_GetArraySize(a) == n, "fixture.json: \"%s\" is not %zu numbers", key,
              n);
    float *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) x[i++] = (float)e->valuedouble;
    return x;
}

int32_t *parity_jints(const cJSON *o, const char *key, size_t n)
{
    const cJSON *a = parity_jget(o, key);
    cr_assert(cJSON_IsArray(a) && (size_t)cJSON_GetArraySize(a) == n, "fixture.json: \"%s\" is not %zu numbers", key,
              n);
    int32_t *x = malloc(n * sizeof *x);
    cr_assert_not_null(x);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) x[i++] = (int32_t)e->valueint;
    return x;
}

double parity_rel_diff(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* ---- fixtures ---------------------------------------------------------------------- */

/* config.json's architecture of an mt_arch value, from the library's family table */
static const char *arch_name(uint32_t a)
{
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        mt_family_info f;
        mt_family_info_init(&f);
        if (mt_family_get(&f, i) == MT_OK && f.arch == a) return f.architecture;
    }
    return "?";
}

/* mt_config_load on the fixture's model folder, checked against the
 * configuration transformers used. A RoPE setting read differently is a
 * failure; the test then goes on with transformers' value so that the
 * numerical comparison still runs. */
static mt_model_config load_config(const char *name, const char *model_dir, const cJSON *jc, uint32_t precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.precision = precision;
    cr_assert_eq(mt_config_load(&c, model_dir), MT_OK, "%s: %s", model_dir, mt_last_errmsg());
    cr_assert_eq(c.precision, precision, "%s: mt_config_load changed the precision", name);

    const cJSON *arch = parity_jget(jc, "architecture");
    cr_assert(cJSON_IsString(arch));
    cr_assert_str_eq(arch_name(c.arch), arch->valuestring, "%s: architecture", name);
#define SAME_U32(field)                                                                                          \
    cr_assert_eq(c.field, (uint32_t)parity_jnum(jc, #field),                                                     \
                 "%s: mt_config_load read " #field " %u, transformers %u", name, c.field,                         \
                 (uint32_t)parity_jnum(jc, #field))
    SAME_U32(vocab_size);
    SAME_U32(hidden_size);
    SAME_U32(intermediate_size);
    SAME_U32(num_hidden_layers);
    SAME_U32(num_attention_heads);
    SAME_U32(num_key_value_heads);
    SAME_U32(max_position_embeddings);
#undef SAME_U32
    const uint32_t head_dim = c.head_dim ? c.head_dim : c.hidden_size / c.num_attention_heads; /* 0: C / H */
    cr_assert_eq(head_dim, (uint32_t)parity_jnum(jc, "head_dim"), "%s: head_dim %u, transformers %u", name, head_dim,
                 (uint32_t)parity_jnum(jc, "head_dim"));
    cr_assert_eq(c.rms_norm_eps, (float)parity_jnum(jc, "rms_norm_eps"), "%s: rms_norm_eps %g, transformers %g", name,
                 (double)c.rms_norm_eps, parity_jnum(jc, "rms_norm_eps"));
    cr_assert_eq(c.tie_word_embeddings != 0, parity_jbool(jc, "tie_word_embeddings"), "%s: tie_word_embeddings",
                 name);
    cr_assert_eq(c.attention_bias != 0, parity_jbool(jc, "attention_bias"), "%s: attention_bias", name);
    /* the sliding window and the layers it applies to, where the fixture has one (transformers' layer_types
     * when its config has them, else every layer: Mistral) */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(jc, "sliding_window");
    const uint32_t want_w = cJSON_IsNumber(sw) ? (uint32_t)sw->valuedouble : 0;
    cr_assert_eq(c.sliding_window, want_w, "%s: sliding_window %u, transformers %u", name, c.sliding_window, want_w);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(jc, "layer_types");
    for (uint32_t l = 0; want_w && l < c.num_hidden_layers; l++) {
        const cJSON *e = cJSON_IsArray(lt) ? cJSON_GetArrayItem(lt, (int)l) : NULL;
        const int slides = e ? cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention") : 1;
        cr_assert_eq(mt_config_layer_slides(&c, (int)l), slides, "%s: layer %u %s, transformers' %s", name, l,
                     mt_config_layer_slides(&c, (int)l) ? "slides" : "attends fully",
                     slides ? "slides" : "attends fully");
    }

    /* mixture of experts, where the fixture has them: as transformers held them */
    if (cJSON_GetObjectItemCaseSensitive(jc, "num_experts")) {
        cr_assert_eq(c.num_experts, (uint32_t)parity_jnum(jc, "num_experts"), "%s: num_experts", name);
        cr_assert_eq(c.num_experts_per_tok, (uint32_t)parity_jnum(jc, "num_experts_per_tok"), "%s: num_experts_per_tok",
                     name);
        cr_assert_eq(c.moe_intermediate_size, (uint32_t)parity_jnum(jc, "moe_intermediate_size"),
                     "%s: moe_intermediate_size", name);
        cr_assert_eq(c.norm_topk_prob != 0, parity_jbool(jc, "norm_topk_prob"), "%s: norm_topk_prob", name);
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(jc, "shared_expert_intermediate_size");
        cr_assert_eq(c.shared_expert_intermediate_size, cJSON_IsNumber(sh) ? (uint32_t)sh->valuedouble : 0u,
                     "%s: shared_expert_intermediate_size", name);
        cr_assert_eq(c.output_router_logits != 0, parity_jbool(jc, "output_router_logits"), "%s: output_router_logits",
                     name);
        cr_assert_eq(c.router_aux_loss_coef, (float)parity_jnum(jc, "router_aux_loss_coef"), "%s: router_aux_loss_coef",
                     name);
        const uint32_t step = (uint32_t)parity_jnum(jc, "decoder_sparse_step");
        cr_assert_eq(c.decoder_sparse_step ? c.decoder_sparse_step : 1, step ? step : 1, "%s: decoder_sparse_step",
                     name);
        const cJSON *ml = parity_jget(jc, "mlp_only_layers"), *e;
        uint64_t want_dense[4] = {0};
        cJSON_ArrayForEach(e, ml) want_dense[e->valueint / 64] |= (uint64_t)1 << (e->valueint % 64);
        cr_assert_eq(memcmp(c.mlp_only_layers, want_dense, sizeof want_dense), 0, "%s: mlp_only_layers", name);
    }

    /* Llama 4's attention, where the fixture has it: as transformers held it */
    if (cJSON_GetObjectItemCaseSensitive(jc, "attention_chunk_size")) {
        cr_assert_eq(c.attention_chunk_size, (uint32_t)parity_jnum(jc, "attention_chunk_size"),
                     "%s: attention_chunk_size", name);
        cr_assert_eq(c.qk_l2_norm != 0, parity_jbool(jc, "use_qk_norm"), "%s: use_qk_norm", name);
        const int tuning = parity_jbool(jc, "attn_temperature_tuning");
        cr_assert_eq(c.attn_temperature_floor, tuning ? (float)parity_jnum(jc, "floor_scale") : 0.0f,
                     "%s: floor_scale", name);
        cr_assert_eq(c.attn_temperature_scale, tuning ? (float)parity_jnum(jc, "attn_scale") : 0.0f,
                     "%s: attn_scale", name);
        const cJSON *nr = parity_jget(jc, "no_rope_layers");
        for (uint32_t l = 0; l < c.num_hidden_layers; l++)
            cr_assert_eq(mt_config_layer_nope(&c, (int)l), cJSON_GetArrayItem(nr, (int)l)->valueint == 0,
                         "%s: layer %u's RoPE", name, l);
    }
    const float theta = (float)parity_jnum(jc, "rope_theta");
    cr_expect_eq(c.rope_theta, theta,
                 "%s/config.json: mt_config_load read rope_theta %g, transformers used %g (transformers 5 writes "
                 "it inside \"rope_parameters\"); continuing with %g",
                 model_dir, (double)c.rope_theta, (double)theta, (double)theta);
    c.rope_theta = theta;
    const cJSON *rs = parity_jget(jc, "rope_scaling");
    const cJSON *rtype = cJSON_IsNull(rs) ? NULL : parity_jget(rs, "rope_type");
    static const char *const scaling_names[] = {"none", "llama3", "linear", "yarn", "longrope"};
    uint32_t want = MT_ROPE_SCALING_NONE;
    for (uint32_t i = 1; rtype && i < 5; i++)
        if (!strcmp(rtype->valuestring, scaling_names[i])) want = i;
    cr_assert(!rtype || want != MT_ROPE_SCALING_NONE, "%s: rope_type %s", name, rtype ? rtype->valuestring : "");
    cr_expect_eq(c.rope_scaling, want,
                 "%s/config.json: mt_config_load read rope scaling %s, transformers used %s (transformers 5 writes "
                 "it as \"rope_parameters\"); continuing with transformers' parameters",
                 model_dir, scaling_names[c.rope_scaling % 5], scaling_names[want]);
    /* yarn's and longrope's settings: what they give is checked below as the frequencies and the factor */
    cr_assert(want < MT_ROPE_SCALING_YARN || c.rope_scaling == want, "%s: %s read as %s", name, scaling_names[want],
              scaling_names[c.rope_scaling % 5]);
    const uint32_t read_scaling = c.rope_scaling;
    c.rope_scaling = want;
    if (want == MT_ROPE_SCALING_LINEAR) {
        const float f = (float)parity_jnum(rs, "factor");
        cr_expect(read_scaling != MT_ROPE_SCALING_LINEAR || c.rope_factor == f, "%s: linear factor %g, transformers %g",
                  name, (double)c.rope_factor, (double)f);
        c.rope_factor = f;
    }
    /* Gemma's settings, where the fixture has them (absent or null: none) */
    static const char *const gemma_keys[] = {"query_pre_attn_scalar", "attn_logit_softcapping",
                                             "final_logit_softcapping", "rope_local_base_freq"};
    const float gemma_read[] = {c.query_pre_attn_scalar, c.attn_logit_softcapping, c.final_logit_softcapping,
                                c.rope_local_base_freq};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(jc, gemma_keys[i]);
        const float want_v = cJSON_IsNumber(v) ? (float)v->valuedouble : 0.0f;
        cr_assert_eq(gemma_read[i], want_v, "%s: %s read as %g, transformers %g", name, gemma_keys[i],
                     (double)gemma_read[i], (double)want_v);
    }
    if (want == MT_ROPE_SCALING_LLAMA3) {
        const float f = (float)parity_jnum(rs, "factor"), lo = (float)parity_jnum(rs, "low_freq_factor");
        const float hi = (float)parity_jnum(rs, "high_freq_factor");
        const uint32_t orig = (uint32_t)parity_jnum(rs, "original_max_position_embeddings");
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

void parity_fixture_open(parity_fixture *f, const char *name, uint32_t precision)
{
    memset(f, 0, sizeof *f);
    char path[1024];
    snprintf(f->name, sizeof f->name, "%s", name);
    snprintf(f->dir, sizeof f->dir, "%s/%s", PARITY_FIXTURE_ROOT, name);
    struct stat sb;
    cr_assert(stat(f->dir, &sb) == 0 && S_ISDIR(sb.st_mode),
              "fixture %s is missing (run from the repository root; python3 tools/fixtures/make_fixtures.py makes it)",
              f->dir);
    snprintf(f->model_dir, sizeof f->model_dir, "%s/model", f->dir);
    snprintf(path, sizeof path, "%s/fixture.json", f->dir);
    char *text = parity_read_text(path);
    f->json = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(f->json, "%s is not JSON", path);

    f->cfg = load_config(name, f->model_dir, parity_jget(f->json, "config"), precision);

    /* batches */
    const cJSON *jb = parity_jget(f->json, "batch");
    f->steps = parity_jget(f->json, "steps");
    mt_batch_init(&f->batch);
    f->batch.micro_batch_size = (uint32_t)parity_jnum(jb, "micro_batch_size");
    f->batch.seq_len = (uint32_t)parity_jnum(jb, "seq_len");
    f->batch.num_micro_batches = (uint32_t)parity_jnum(jb, "num_micro_batches");
    f->n_tok = (size_t)f->batch.num_micro_batches * f->batch.micro_batch_size * f->batch.seq_len;
    cr_assert(cJSON_IsArray(f->steps) && cJSON_GetArraySize(f->steps) > 0);
    f->n_steps = cJSON_GetArraySize(f->steps);
    f->tokens = calloc((size_t)f->n_steps, sizeof *f->tokens);
    f->targets = calloc((size_t)f->n_steps, sizeof *f->targets);
    cr_assert(f->tokens && f->targets);
    /* positions: in every step or in none (the first step decides) */
    const int packed = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(f->steps, 0), "positions") != NULL;
    if (packed) {
        f->positions = calloc((size_t)f->n_steps, sizeof *f->positions);
        cr_assert_not_null(f->positions);
    }
    for (int s = 0; s < f->n_steps; s++) {
        const cJSON *js = cJSON_GetArrayItem(f->steps, s);
        f->tokens[s] = parity_jints(js, "tokens", f->n_tok);
        f->targets[s] = parity_jints(js, "targets", f->n_tok);
        const int has = cJSON_GetObjectItemCaseSensitive(js, "positions") != NULL;
        cr_assert_eq(has, packed, "%s: step %d %s \"positions\", step 0 %s", name, s, has ? "has" : "lacks",
                     packed ? "has" : "does not");
        if (packed) f->positions[s] = parity_jints(js, "positions", f->n_tok);
    }

    /* optimizer */
    const cJSON *jo = parity_jget(f->json, "optim");
    mt_optim_config *o = &f->optim;
    mt_optim_config_init(o);
    const cJSON *sched = parity_jget(jo, "schedule");
    cr_assert(cJSON_IsString(sched));
    o->schedule = !strcmp(sched->valuestring, "cosine") ? MT_LR_COSINE : MT_LR_CONSTANT;
    o->lr = (float)parity_jnum(jo, "lr");
    o->beta1 = (float)parity_jnum(jo, "beta1");
    o->beta2 = (float)parity_jnum(jo, "beta2");
    o->eps = (float)parity_jnum(jo, "eps");
    o->weight_decay = (float)parity_jnum(jo, "weight_decay");
    o->grad_clip = (float)parity_jnum(jo, "grad_clip");
    o->min_lr_ratio = (float)parity_jnum(jo, "min_lr_ratio");
    o->warmup_steps = (uint32_t)parity_jnum(jo, "warmup_steps");
    o->total_steps = (uint32_t)parity_jnum(jo, "total_steps");
}

void parity_fixture_close(parity_fixture *f)
{
    for (int s = 0; s < f->n_steps; s++) {
        free(f->tokens[s]);
        free(f->targets[s]);
        if (f->positions) free(f->positions[s]);
    }
    free(f->tokens);
    free(f->targets);
    free(f->positions);
    cJSON_Delete(f->json);
    memset(f, 0, sizeof *f);
}

void parity_use_step(parity_fixture *f, int s)
{
    f->batch.tokens = f->tokens[s];
    f->batch.targets = f->targets[s];
    f->batch.positions = f->positions ? f->positions[s] : NULL;
}

/* ---- models ------------------------------------------------------------------------- */

mt_model *parity_create(const mt_model_config *c, uint32_t backend)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = backend;
    p.optimizer_threads = 2;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    mt_status st = mt_model_create(&m, c, &p);
    if (st == MT_ERR_NO_DEVICE && backend == MT_BACKEND_CUDA) MT_GPU_MISSING("no CUDA device: %s", mt_last_errmsg());
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    return m;
}

mt_model *parity_load_weights_file(const mt_model_config *c, const char *file)
{
    char real[PATH_MAX], tmp[] = "/tmp/mt_parity_XXXXXX", link_path[PATH_MAX + 32];
    cr_assert_not_null(realpath(file, real), "missing %s", file);
    cr_assert_not_null(mkdtemp(tmp));
    snprintf(link_path, sizeof link_path, "%s/model.safetensors", tmp);
    cr_assert_eq(symlink(real, link_path), 0);
    mt_model *m = parity_create(c, MT_BACKEND_CPU);
    mt_status st = mt_model_load(m, tmp);
    unlink(link_path);
    rmdir(tmp);
    cr_assert_eq(st, MT_OK, "loading %s: %s", file, mt_model_errmsg(m));
    return m;
}

void parity_perturb_one_ulp(mt_model *m, unsigned seed)
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

/* The fp32 master of tensor i of unit u. */
static const float *master_of(const mt_model *m, int u, int i)
{
    const mt_unit_desc *ud = &m->layout.units[u];
    return mt_tile_master(&m->tiles.tile[u], ud) + ud->tensors[i].offset;
}

/* ---- weights in fp32: element by element -------------------------------------------- */

/* The weights of m (trained here) against want (transformers) and the runs
 * `alt` (trained here from the start moved by one ulp). */
typedef struct weight_report {
    double bulk_max;      /* largest |m - want| over the well-conditioned weights */
    char bulk_at[160];
    int n_noisy;          /* weights beyond tol that are noise-determined */
    int n_noisy_k_bias;   /* of them, attention k biases: their gradient is zero but for rounding (each
                           * query's scores all move by q . b_k, which the softmax ignores), so every one
                           * that training moves is noise-set, however well the fixture is conditioned */
    double noisy_max, noisy_spread;
    char noisy_at[160];
    int n_bad;            /* weights beyond tol that are not */
    double bad_max, bad_spread;
    char bad_at[160];
    double moved;         /* largest |want - start|: how far training moved the weights */
} weight_report;

#define N_ALT 3

static void compare_weights(weight_report *r, const mt_model *m, const mt_model *want, const mt_model *start,
                            mt_model *const *alt, double tol, double cap)
{
    memset(r, 0, sizeof *r);
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *t = &ud->tensors[i];
            const float *wm = master_of(m, u, i), *ww = master_of(want, u, i), *w0 = master_of(start, u, i);
            const float *wa[N_ALT];
            for (int a = 0; a < N_ALT; a++) wa[a] = master_of(alt[a], u, i);
            for (uint64_t k = 0; k < t->numel; k++) {
                const double d = fabs((double)wm[k] - (double)ww[k]);
                r->moved = fmax(r->moved, fabs((double)ww[k] - (double)w0[k]));
                if (d <= tol) {
                    if (d > r->bulk_max) {
                        r->bulk_max = d;
                        snprintf(r->bulk_at, sizeof r->bulk_at, "%s[%llu]", t->name, (unsigned long long)k);
                    }
                    continue;
                }
                double spread = 0.0; /* how far one ulp at the start moves this weight's result here */
                for (int a = 0; a < N_ALT; a++) spread = fmax(spread, fabs((double)wm[k] - (double)wa[a][k]));
                if (d <= 10.0 * spread && d <= cap) {
                    r->n_noisy++;
                    r->n_noisy_k_bias += t->role == MT_T_K_BIAS;
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

/* ---- weights in bf16: what training changed, per tensor ------------------------------ */

typedef struct update_report {
    double worst_rel;    /* the largest per-tensor ||(m - w0) - (want - w0)|| / ||want - w0||, k biases aside */
    char worst_at[128];
    double k_bias_rel;   /* the same, the largest over the attention k biases */
    char k_bias_at[128];
    double all_rel;      /* the same over every weight */
    double max_abs;      /* largest |m - want| */
    char max_at[160];
    double moved;        /* largest |want - w0| */
    uint64_t n_bf16_off; /* streamed bf16 weights that are not the rounded master */
    char bf16_at[160];
} update_report;

static void compare_updates(update_report *r, const mt_model *m, const mt_model *want, const mt_model *start)
{
    memset(r, 0, sizeof *r);
    double all_dd = 0.0, all_uu = 0.0;
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        const uint16_t *wb = mt_tile_weights_bf16(&m->tiles.tile[u], ud);
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *t = &ud->tensors[i];
            const float *wm = master_of(m, u, i), *ww = master_of(want, u, i), *w0 = master_of(start, u, i);
            double dd = 0.0, uu = 0.0;
            for (uint64_t k = 0; k < t->numel; k++) {
                const double e = (double)wm[k] - (double)ww[k], up = (double)ww[k] - (double)w0[k];
                dd += e * e, uu += up * up;
                if (!(fabs(e) <= r->max_abs)) {
                    r->max_abs = isnan(e) ? INFINITY : fabs(e);
                    snprintf(r->max_at, sizeof r->max_at, "%s[%llu]", t->name, (unsigned long long)k);
                }
                r->moved = fmax(r->moved, fabs(up));
                if (wb && wb[t->offset + k] != mt_f32_to_bf16(wm[k]) && r->n_bf16_off++ == 0)
                    snprintf(r->bf16_at, sizeof r->bf16_at, "%s[%llu]", t->name, (unsigned long long)k);
            }
            all_dd += dd, all_uu += uu;
            double rel = sqrt(dd / fmax(uu, 1e-300));
            if (isnan(rel)) rel = INFINITY;
            cr_log_info("  %-48s update relative L2 error %.3g", t->name, rel);
            const int k_bias = t->role == MT_T_K_BIAS;
            double *worst = k_bias ? &r->k_bias_rel : &r->worst_rel;
            if (rel > *worst) {
                *worst = rel;
                snprintf(k_bias ? r->k_bias_at : r->worst_at, sizeof r->worst_at, "%s", t->name);
            }
        }
    }
    r->all_rel = sqrt(all_dd / fmax(all_uu, 1e-300));
    if (isnan(r->all_rel)) r->all_rel = INFINITY;
}

/* ---- one fixture ----------------------------------------------------------------------- */

static const char *backend_name(uint32_t b) { return b == MT_BACKEND_CUDA ? "cuda" : "cpu"; }
static const char *precision_name(uint32_t p) { return p == MT_PRECISION_FP32 ? "fp32" : "bf16"; }

void parity_run(const char *name, uint32_t backend, uint32_t precision, const parity_tol *tol)
{
    parity_fixture f;
    parity_fixture_open(&f, name, precision);
    const char *bn = backend_name(backend), *pn = precision_name(precision);

    mt_model *m = parity_create(&f.cfg, backend);
    cr_assert_eq(mt_model_load(m, f.model_dir), MT_OK, "%s", mt_model_errmsg(m));
    const uint32_t V = f.cfg.vocab_size, D = mt_config_rotary_dims(&m->cfg), S = f.batch.seq_len;

    /* RoPE's inverse frequencies, as the CPU backend computes them */
    float *want_if = parity_jfloats(f.json, "inv_freq", D / 2), *inv = malloc(D / 2 * sizeof *inv);
    mt_rope_inv_freq_of(inv, &m->cfg, MT_ROPE_GLOBAL);
    double if_max = 0.0;
    int if_at = 0;
    for (uint32_t i = 0; i < D / 2; i++) {
        double r = parity_rel_diff(inv[i], want_if[i]);
        if (!(r <= if_max)) if_max = r, if_at = (int)i;
    }
    cr_expect(if_max <= tol->inv_freq_rel, "%s: inv_freq[%d] = %.9g, transformers %.9g (relative %.3g)", name, if_at,
              (double)inv[if_at], (double)want_if[if_at], if_max);
    free(want_if);
    /* Gemma 3: the sliding layers' own frequencies; longrope: those of its long factors */
    static const char *const tables[2] = {"inv_freq_local", "inv_freq_long"};
    for (int t = 0; t < 2; t++) {
        if (!cJSON_GetObjectItemCaseSensitive(f.json, tables[t])) continue;
        want_if = parity_jfloats(f.json, tables[t], D / 2);
        mt_rope_inv_freq_of(inv, &m->cfg, t ? MT_ROPE_LONG : MT_ROPE_LOCAL);
        for (uint32_t i = 0; i < D / 2; i++)
            cr_expect(parity_rel_diff(inv[i], want_if[i]) <= tol->inv_freq_rel, "%s: %s[%u] = %.9g, transformers %.9g",
                      name, tables[t], i, (double)inv[i], (double)want_if[i]);
        free(want_if);
    }
    free(inv);
    /* the factor of cos and sin (yarn's and longrope's attention factor; 1 for the others) */
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(f.json, "rope_attention_scaling");
    if (cJSON_IsNumber(scaling))
        cr_expect(parity_rel_diff(mt_rope_attention_factor(&m->cfg, MT_ROPE_GLOBAL), scaling->valuedouble) <=
                      tol->inv_freq_rel,
                  "%s: RoPE's attention factor %.9g, transformers %.9g", name,
                  (double)mt_rope_attention_factor(&m->cfg, MT_ROPE_GLOBAL), scaling->valuedouble);

    /* step-0 logits of the first sequence at every position: position p is
     * the last position of the prefix of p + 1 tokens (causal attention).
     * With positions (transformers computed these logits with position_ids),
     * p sees only its own document, which starts at p - positions[p]: the
     * prefix of that document up to p, whose positions are 0, 1, ... */
    const cJSON *jl = parity_jget(f.json, "logits_check");
    cr_assert_eq((uint32_t)parity_jnum(jl, "seq_len"), S);
    cr_assert_eq((uint32_t)parity_jnum(jl, "vocab_size"), V);
    float *want_logits = parity_jfloats(jl, "logits", (size_t)S * V), *logits = malloc(V * sizeof *logits);
    double lg_max = 0.0, lg_scale = 0.0;
    uint32_t lg_pos = 0, lg_id = 0;
    const int32_t *pos0 = f.positions ? f.positions[0] : NULL;
    for (uint32_t p = 0; p < S; p++) {
        const uint32_t in_doc = pos0 ? (uint32_t)pos0[p] : p; /* p's position in its document */
        cr_assert(in_doc <= p && (!pos0 || in_doc == 0 || (uint32_t)pos0[p - 1] == in_doc - 1),
                  "%s: step 0's positions do not describe documents at %u", name, p);
        cr_assert_eq(mt_model_logits(m, f.tokens[0] + (p - in_doc), 1, in_doc + 1, logits), MT_OK, "%s",
                     mt_model_errmsg(m));
        for (uint32_t v = 0; v < V; v++) {
            const double w = want_logits[(size_t)p * V + v], d = fabs((double)logits[v] - w);
            lg_scale = fmax(lg_scale, fabs(w));
            if (!(d <= lg_max)) lg_max = isnan(d) ? INFINITY : d, lg_pos = p, lg_id = v;
        }
    }
    cr_expect(lg_max <= tol->logit_abs,
              "%s (%s, %s): step-0 logit at position %u, id %u differs from transformers by %.3g", name, bn, pn,
              lg_pos, lg_id, lg_max);
    free(want_logits);
    free(logits);

    /* the steps: under `make memcheck` (valgrind, MT_MEMCHECK set), which
     * looks for memory errors, the first two: the second runs every path
     * again behind the first's update, the later ones the same code (and
     * the weights after training are then not compared); `make check` runs
     * all of them and the weights' test */
    const int memcheck = getenv("MT_MEMCHECK") != NULL;
    const int n_run = memcheck && f.n_steps > 2 ? 2 : f.n_steps;
    double loss_max = 0.0, norm_max = 0.0, eval_rel = 0.0, lr_sum = 0.0, loss0 = 0.0, norm0 = 0.0;
    int loss_at = 0, norm_at = 0;
    /* each step's loss and norm here and transformers' (a later step beyond its bound is judged after the
     * one-ulp runs, below) */
    double *got = calloc((size_t)n_run * 4, sizeof *got);
    cr_assert(got);
    for (int s = 0; s < n_run; s++) {
        const cJSON *js = cJSON_GetArrayItem(f.steps, s);
        parity_use_step(&f, s);
        const double want_loss = parity_jnum(js, "loss"), want_norm = parity_jnum(js, "grad_norm");
        if (s == 0) { /* the evaluation path too, before anything changes */
            mt_eval_stats es;
            mt_eval_stats_init(&es);
            cr_assert_eq(mt_eval(m, &f.batch, &es), MT_OK, "%s", mt_model_errmsg(m));
            /* mt_eval reports the cross-entropy alone: a fixture with a load-balancing loss records it apart */
            const cJSON *jce = cJSON_GetObjectItemCaseSensitive(js, "ce_loss");
            const double want_ce = jce ? parity_jnum(js, "ce_loss") : want_loss;
            eval_rel = parity_rel_diff(es.loss, want_ce);
            cr_expect(eval_rel <= tol->loss_rel, "%s (%s, %s): mt_eval loss %.9g, transformers %.9g (relative %.3g)",
                      name, bn, pn, es.loss, want_ce, eval_rel);
        }
        mt_step_stats st;
        mt_step_stats_init(&st);
        cr_assert_eq(mt_step(m, &f.batch, &f.optim, &st), MT_OK, "%s step %d: %s", name, s, mt_model_errmsg(m));
        cr_expect_eq(st.target_tokens, (uint64_t)parity_jnum(js, "target_tokens"), "%s step %d: target count", name,
                     s);
        const double lr_rel = parity_rel_diff(st.lr, parity_jnum(js, "lr"));
        cr_expect(lr_rel <= tol->lr_rel, "%s step %d: lr %.9g, fixture %.9g", name, s, (double)st.lr,
                  parity_jnum(js, "lr"));
        lr_sum += st.lr;
        const double lr_ = parity_rel_diff(st.loss, want_loss), nr = parity_rel_diff(st.grad_norm, want_norm);
        got[4 * s] = st.loss, got[4 * s + 1] = want_loss, got[4 * s + 2] = st.grad_norm, got[4 * s + 3] = want_norm;
        if (s == 0) {
            cr_expect(lr_ <= tol->loss_rel, "%s (%s, %s) step 0: loss %.9g, transformers %.9g (relative %.3g)", name,
                      bn, pn, st.loss, want_loss, lr_);
            cr_expect(nr <= tol->norm_rel, "%s (%s, %s) step 0: gradient norm %.9g, transformers %.9g (relative %.3g)",
                      name, bn, pn, st.grad_norm, want_norm, nr);
        }
        if (!(lr_ <= loss_max)) loss_max = lr_, loss_at = s;
        if (!(nr <= norm_max)) norm_max = nr, norm_at = s;
        if (s == 0) loss0 = lr_, norm0 = nr;
    }
    mt_optimizer_drain(&m->opt); /* the CUDA backend runs the last update behind the step */

    /* the weights after training, against transformers' (read into CPU models in fp32) */
    char path[1024];
    mt_model_config c32 = m->cfg;
    c32.precision = MT_PRECISION_FP32;
    snprintf(path, sizeof path, "%s/final.safetensors", f.dir);
    mt_model *want = parity_load_weights_file(&c32, path);
    snprintf(path, sizeof path, "%s/model.safetensors", f.model_dir);
    mt_model *start = parity_load_weights_file(&c32, path);
    const double cap = 2.0 * lr_sum;
    char line[1024];
    /* how far one ulp at the start moves each step's loss and norm here (the fp32 one-ulp runs below) */
    double *spread = calloc((size_t)n_run * 2, sizeof *spread);
    cr_assert(spread);
    if (n_run < f.n_steps) {
        /* (nor the one-ulp re-trainings below, the very code of the training
         * above, 3x its time under valgrind) */
        snprintf(line, sizeof line, "weights: not compared under memcheck (%d of %d steps)", n_run, f.n_steps);
    } else if (precision == MT_PRECISION_FP32) {
        /* The same training from the start moved by one ulp, N_ALT times:
         * where that moves libmegatrain's own result, the result is set by
         * rounding (a gradient that is mostly cancellation, normalised by
         * AdamW), and transformers' rounding may move it as far. */
        mt_model *alt[N_ALT];
        for (int a = 0; a < N_ALT; a++) {
            alt[a] = parity_create(&m->cfg, backend);
            cr_assert_eq(mt_model_load(alt[a], f.model_dir), MT_OK, "%s", mt_model_errmsg(alt[a]));
            parity_perturb_one_ulp(alt[a], 1u + (unsigned)a);
            for (int s = 0; s < f.n_steps; s++) {
                parity_use_step(&f, s);
                mt_step_stats st;
                mt_step_stats_init(&st);
                cr_assert_eq(mt_step(alt[a], &f.batch, &f.optim, &st), MT_OK, "%s", mt_model_errmsg(alt[a]));
                spread[2 * s] = fmax(spread[2 * s], fabs(st.loss - got[4 * s]));
                spread[2 * s + 1] = fmax(spread[2 * s + 1], fabs(st.grad_norm - got[4 * s + 2]));
            }
            mt_optimizer_drain(&alt[a]->opt);
        }
        weight_report r;
        compare_weights(&r, m, want, start, alt, tol->weight_abs, cap);
        cr_expect(r.n_bad == 0,
                  "%s (%s, %s): %d weights after %d steps differ from transformers' by more than %g; the largest, "
                  "%s, by %.3g (one ulp at the start moves libmegatrain's result there by at most %.3g)",
                  name, bn, pn, r.n_bad, f.n_steps, tol->weight_abs, r.bad_at, r.bad_max, r.bad_spread);
        /* more than 1 in 10^4 would mean the fixture is badly conditioned
         * (measured: 0 to 2 per fixture on the CPU, up to 4 on an H200) */
        const uint64_t n_params = mt_model_num_params(m), max_noisy = n_params / 10000 > 4 ? n_params / 10000 : 4;
        cr_expect((uint64_t)(r.n_noisy - r.n_noisy_k_bias) <= max_noisy,
                  "%s: %d weights besides k biases are set by rounding, more than %llu: remake the fixture", name,
                  r.n_noisy - r.n_noisy_k_bias, (unsigned long long)max_noisy);
        cr_expect(r.moved > 10 * tol->weight_abs, "%s: training moved the weights by only %.3g", name, r.moved);
        snprintf(line, sizeof line,
                 "weights abs %.2g at %s; %d noise-set weight(s) (%d k biases) up to %.2g at %s (1-ulp spread %.2g) | "
                 "training moved weights up to %.2g",
                 r.bulk_max, r.bulk_at, r.n_noisy, r.n_noisy_k_bias, r.noisy_max, r.n_noisy ? r.noisy_at : "-", r.noisy_spread,
                 r.moved);
        for (int a = 0; a < N_ALT; a++) mt_model_destroy(alt[a]);
    } else {
        update_report r;
        compare_updates(&r, m, want, start);
        cr_expect(r.worst_rel <= tol->update_rel,
                  "%s (%s, %s): what training changed in %s differs from transformers' by %.3g (relative L2)", name,
                  bn, pn, r.worst_at, r.worst_rel);
        cr_expect(r.k_bias_rel <= tol->update_rel_k_bias,
                  "%s (%s, %s): what training changed in %s differs from transformers' by %.3g (relative L2)", name,
                  bn, pn, r.k_bias_at, r.k_bias_rel);
        cr_expect(r.all_rel <= tol->update_rel_all,
                  "%s (%s, %s): what training changed differs from transformers' by %.3g (relative L2 over all "
                  "weights)",
                  name, bn, pn, r.all_rel);
        cr_expect(r.max_abs <= cap,
                  "%s (%s, %s): weight %s differs from transformers' by %.3g, more than 2 x (sum of lr) = %.3g", name,
                  bn, pn, r.max_at, r.max_abs, cap);
        cr_expect(r.n_bf16_off == 0, "%s: %llu streamed bf16 weights are not the rounded master, the first %s", name,
                  (unsigned long long)r.n_bf16_off, r.bf16_at);
        cr_expect(r.moved > lr_sum / f.n_steps, "%s: training moved the weights by only %.3g", name, r.moved);
        snprintf(line, sizeof line,
                 "update rel L2 %.2g worst tensor (%s), %.2g k bias, %.2g all | weights abs %.2g at %s (bound %.2g) "
                 "| training moved weights up to %.2g",
                 r.worst_rel, r.worst_at, r.k_bias_rel, r.all_rel, r.max_abs, r.max_at, cap, r.moved);
    }

    /* Steps 1 and later run from trained weights: beyond the bound, a step's loss or norm passes only where
     * one ulp at the start moves libmegatrain's own figure by a tenth as much or more (the weights' rule: a
     * weight set by rounding that the later steps see), which needs the fp32 one-ulp runs. In bf16, a step's
     * gradient norm may also be as far from the fp32 run's as twice what transformers' own training with bf16
     * weights and gradients gives on the fixture (fixture.json's bf16_emulation, measured by the generator):
     * there the fixture's conditioning, not the library, sets the distance (docs/parity.md) */
    const cJSON *emu = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f.json, "bf16_emulation"),
                                                        "grad_norm_rel");
    for (int s = 1; s < n_run; s++) {
        const double dl = fabs(got[4 * s] - got[4 * s + 1]), dn = fabs(got[4 * s + 2] - got[4 * s + 3]);
        const double emu_rel = precision == MT_PRECISION_BF16 && cJSON_IsNumber(cJSON_GetArrayItem(emu, s))
                                   ? cJSON_GetArrayItem(emu, s)->valuedouble
                                   : 0.0;
        const double norm_bound = fmax(tol->norm_rel_trained, 2.0 * emu_rel);
        const int l_ok = dl <= tol->loss_rel_trained * fabs(got[4 * s + 1]),
                  n_ok = dn <= norm_bound * fabs(got[4 * s + 3]);
        if (n_ok && dn > tol->norm_rel_trained * fabs(got[4 * s + 3]))
            fprintf(stderr, "parity %s (%s, %s) step %d: norm rel %.3g, beyond %.3g but within twice transformers' "
                            "own bf16 distance (%.3g)\n",
                    name, bn, pn, s, parity_rel_diff(got[4 * s + 2], got[4 * s + 3]), tol->norm_rel_trained, emu_rel);
        const int l_noise = !l_ok && dl <= 10.0 * spread[2 * s], n_noise = !n_ok && dn <= 10.0 * spread[2 * s + 1];
        cr_expect(l_ok || l_noise,
                  "%s (%s, %s) step %d: loss %.9g, transformers %.9g (relative %.3g; one ulp at the start moves it "
                  "by %.3g)",
                  name, bn, pn, s, got[4 * s], got[4 * s + 1], parity_rel_diff(got[4 * s], got[4 * s + 1]),
                  spread[2 * s]);
        cr_expect(n_ok || n_noise,
                  "%s (%s, %s) step %d: gradient norm %.9g, transformers %.9g (relative %.3g, bound %.3g; one ulp at "
                  "the start moves it by %.3g)",
                  name, bn, pn, s, got[4 * s + 2], got[4 * s + 3], parity_rel_diff(got[4 * s + 2], got[4 * s + 3]),
                  norm_bound, spread[2 * s + 1]);
        if (l_noise || n_noise)
            fprintf(stderr, "parity %s (%s, %s) step %d: loss rel %.3g, norm rel %.3g, beyond the bound but within "
                            "10x of what one ulp at the start moves them (%.3g, %.3g)\n",
                    name, bn, pn, s, parity_rel_diff(got[4 * s], got[4 * s + 1]),
                    parity_rel_diff(got[4 * s + 2], got[4 * s + 3]), spread[2 * s], spread[2 * s + 1]);
    }
    free(spread);
    free(got);

    fprintf(stderr,
            "parity %-14s %-4s %s | inv_freq rel %.2g | logits abs %.2g (max |logit| %.2g) | eval loss rel %.2g | "
            "step 0 loss rel %.2g, grad_norm rel %.2g | all steps loss rel %.2g (step %d), grad_norm rel %.2g (step "
            "%d) | %s\n",
            name, bn, pn, if_max, lg_max, lg_scale, eval_rel, loss0, norm0, loss_max, loss_at, norm_max, norm_at,
            line);

    mt_model_destroy(start);
    mt_model_destroy(want);
    mt_model_destroy(m);
    parity_fixture_close(&f);
}
