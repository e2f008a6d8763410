/* Resume checkpoints: dir/step-NNNNNNNN/ folders and a dir/latest pointer.
 *
 *   step-00000042/config.json            the model's shape
 *   step-00000042/model.safetensors      fp32 master weights (Hugging Face names); lean mode: each
 *                                        unit's 16-bit weight codes and block scales,
 *                                        unit.<u>.weight.codes (I16) and unit.<u>.weight.scales (F32)
 *   step-00000042/optimizer.safetensors  <name>.exp_avg, <name>.exp_avg_sq (fp32); lean mode: each unit's
 *                                        8-bit codes and block scales, unit.<u>.exp_avg.codes (U8)
 *                                        and the like (lean_part): all as the tiles hold them
 *   step-00000042/trainer_state.json     step, data position, caller's RNG state
 *   latest                               "step-00000042"
 *
 * A save writes step-00000042.tmp/, syncs every file and the folder, renames
 * it to step-00000042/, syncs dir, then replaces `latest` (write, sync,
 * rename, sync). Until that last rename, `latest` names the previous
 * checkpoint, which is complete; after it, the new one, which is too. In bf16
 * mode the bf16 weights are the rounding of the master, so they are rebuilt
 * on load rather than stored. */
#define _GNU_SOURCE
#include "io/fileio.h"
#include "io/hf.h"
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STATE_FORMAT "megatrain-checkpoint"
#define STATE_VERSION 1
#define KEEP 2 /* checkpoints kept */

/* trainer_state.json's keys that are the library's; the caller's JSON
 * (mt_checkpoint_info.caller_json) may use any other. */
static const char *const STATE_KEYS[] = {"format", "version", "library", "precision", "step", "data_position",
                                         "rng_state", "rounding_seed"};

static int is_state_key(const char *name)
{
    for (size_t i = 0; i < sizeof STATE_KEYS / sizeof STATE_KEYS[0]; i++)
        if (!strcmp(name, STATE_KEYS[i])) return 1;
    return 0;
}

/* The caller's JSON, checked before anything is written: an object whose
 * keys are not the library's. NULL text: an empty object. */
static mt_status parse_caller_json(mt_err err, const char *text, cJSON **out)
{
    *out = NULL;
    if (!text) return MT_OK;
    size_t where = 0;
    cJSON *c = mt_json_parse(text, strlen(text), &where);
    if (!c)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_checkpoint_info.caller_json is not valid JSON (at byte %zu)",
                       where);
    mt_status st;
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_checkpoint_info.caller_json is not a JSON object");
    }
    for (const cJSON *e = c->child; e; e = e->next)
        if (is_state_key(e->string)) {
            st = mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                         "mt_checkpoint_info.caller_json uses the key \"%s\", which trainer_state.json keeps for the "
                         "library", e->string);
            cJSON_Delete(c);
            return st;
        }
    *out = c;
    return MT_OK;
}

void mt_checkpoint_info_init_sized(mt_checkpoint_info *info, uint32_t size) { mt_struct_init(info, size, NULL, 0); }

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path) { (void)nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* trainer_state.json; takes caller (the caller's members, may be NULL) */
static const char *precision_name(const mt_model_files *m)
{
    return m->cfg->precision == MT_PRECISION_FP32 ? "fp32" : m->cfg->precision == MT_PRECISION_LEAN ? "lean" : "bf16";
}

/* Lean mode's state, six arrays a unit, as the tiles hold them (padding
 * included): in model.safetensors the weights' 16-bit codes (I16) and their
 * blocks' scales (F32); in optimizer.safetensors the 8-bit codes of m and v
 * (U8) and their blocks' scales. */
enum { LEAN_WEIGHT_PARTS = 2, LEAN_PARTS = 6 };

static void lean_part(const mt_model_files *m, int u, int p, char *name, size_t len, void **data, uint64_t *numel,
                      int *dtype)
{
    static const char *const what[LEAN_PARTS] = {"weight.codes",     "weight.scales",  "exp_avg.codes",
                                                 "exp_avg_sq.codes", "exp_avg.scales", "exp_avg_sq.scales"};
    static const int type[LEAN_PARTS] = {MT_ST_I16, MT_ST_F32, MT_ST_U8, MT_ST_U8, MT_ST_F32, MT_ST_F32};
    const mt_unit_desc *ud = &m->layout->units[u];
    const mt_tile *tl = &m->tiles->tile[u];
    void *const at[LEAN_PARTS] = {mt_tile_wq(tl, ud), mt_tile_sw(tl, ud), mt_tile_qm(tl, ud),
                                  mt_tile_qv(tl, ud), mt_tile_sm(tl, ud), mt_tile_sv(tl, ud)};
    snprintf(name, len, "unit.%d.%s", u, what[p]);
    *dtype = type[p];
    *numel = type[p] == MT_ST_F32 ? ud->scale_bytes / 4 : ud->padded;
    *data = at[p];
}

/* Parts [p0, p1) of every unit into path. */
static mt_status write_lean_parts(mt_err err, const mt_model_files *m, const char *path, int p0, int p1)
{
    const int per = p1 - p0;
    const size_t n = (size_t)m->layout->n_units * (size_t)per;
    mt_st_write_req *r = calloc(n, sizeof *r);
    char(*names)[64] = calloc(n, sizeof *names);
    mt_status st;
    if (r && names) {
        for (size_t k = 0; k < n; k++) {
            void *data;
            lean_part(m, (int)(k / (size_t)per), p0 + (int)(k % (size_t)per), names[k], sizeof names[k], &data,
                      &r[k].numel, &r[k].dtype);
            r[k].name = names[k], r[k].ndim = 1, r[k].dims[0] = r[k].numel, r[k].n_parts = 1;
            r[k].part[0] = data, r[k].part_numel[0] = r[k].numel, r[k].src = r[k].dtype;
        }
        st = mt_st_write(err, path, r, n);
    } else {
        st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory writing %s", path);
    }
    free(names);
    free(r);
    return st;
}

/* Checks parts [p0, p1) of every unit in s, and that s holds nothing else
 * (dry_run), or copies them into the tiles. */
static mt_status read_lean_parts(mt_err err, const mt_model_files *m, mt_st_set *s, const char *where, int p0, int p1,
                                 int dry_run)
{
    static const char *const dtype_name[] = {[MT_ST_F32] = "F32", [MT_ST_U8] = "U8", [MT_ST_I16] = "I16"};
    for (int u = 0; u < m->layout->n_units; u++)
        for (int p = p0; p < p1; p++) {
            char name[64];
            void *data;
            uint64_t numel;
            int dtype;
            mt_st_tensor *t;
            lean_part(m, u, p, name, sizeof name, &data, &numel, &dtype);
            mt_status st = mt_st_expect(err, s, name, &numel, 1, where, &t);
            if (st) return st;
            if (t->dtype != dtype) return mt_fail(err, MT_ERR_FORMAT, "%s: %s is not %s", where, name, dtype_name[dtype]);
            if (!dry_run) memcpy(data, t->data, numel * mt_st_esize(dtype));
        }
    for (size_t i = 0; dry_run && i < s->n; i++)
        if (!s->t[i].used)
            return mt_fail(err, MT_ERR_FORMAT, "%s holds tensor %s, which this model does not have", where, s->t[i].name);
    return MT_OK;
}

static mt_status write_state(mt_err err, const char *dir, const mt_model_files *m, const mt_checkpoint_info *info,
                             cJSON *caller)
{
    cJSON *j = cJSON_CreateObject();
    char num[32], path[4096];
    cJSON_AddStringToObject(j, "format", STATE_FORMAT);
    cJSON_AddNumberToObject(j, "version", STATE_VERSION);
    cJSON_AddStringToObject(j, "library", mt_version_string());
    cJSON_AddStringToObject(j, "precision", precision_name(m));
    /* 64-bit values as decimal strings: JSON numbers are doubles */
    snprintf(num, sizeof num, "%" PRIu64, m->step);
    cJSON_AddStringToObject(j, "step", num);
    snprintf(num, sizeof num, "%" PRIu64, info->data_position);
    cJSON_AddStringToObject(j, "data_position", num);
    cJSON *rng = cJSON_AddArrayToObject(j, "rng_state");
    for (int i = 0; i < 4; i++) {
        snprintf(num, sizeof num, "%" PRIu64, info->rng_state[i]);
        cJSON_AddItemToArray(rng, cJSON_CreateString(num));
    }
    if (m->cfg->precision == MT_PRECISION_LEAN) { /* the stochastic rounding's bits: the run's, not the loader's seed */
        snprintf(num, sizeof num, "%" PRIu64, m->seed);
        cJSON_AddStringToObject(j, "rounding_seed", num);
    }
    while (caller && caller->child) {
        cJSON *e = cJSON_DetachItemViaPointer(caller, caller->child);
        cJSON_AddItemToObject(j, e->string, e);
    }
    cJSON_Delete(caller);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    mt_path_join(path, sizeof path, dir, "trainer_state.json");
    mt_status st = mt_write_file_atomic(err, path, text, strlen(text));
    cJSON_free(text);
    return st;
}

/* The step number of a complete step folder's name ("step-00000042"), or -1
 * for any other name (leftovers "step-N.tmp" and "step-N.old" included). */
static int64_t step_of(const char *name)
{
    if (strncmp(name, "step-", 5)) return -1;
    const char *p = name + 5;
    if (!*p) return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* After the checkpoint of step `keep` was saved and `latest` names it:
 * removes the step folders numbered below it but the newest KEEP - 1 of
 * them. Folders numbered above it belong to another continuation of the
 * run, and anything else is not ours: both stay. */
static void prune(const char *dir, uint64_t keep)
{
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t *below = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const int64_t v = step_of(e->d_name);
        if (v < 0 || (uint64_t)v >= keep) continue;
        if (n == cap) {
            int64_t *grown = realloc(below, (cap = cap ? 2 * cap : 16) * sizeof *grown);
            if (!grown) break; /* pruning is tidiness: out of memory, keep everything */
            below = grown;
        }
        below[n++] = v;
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) { /* all but the KEEP - 1 largest */
        size_t larger = 0;
        for (size_t k = 0; k < n; k++) larger += below[k] > below[i];
        if (larger < KEEP - 1) continue;
        char name[32], path[4096];
        snprintf(name, sizeof name, "step-%08" PRId64, below[i]);
        mt_path_join(path, sizeof path, dir, name);
        rm_rf(path);
    }
    free(below);
}

static mt_status save_locked(mt_err err, const mt_model_files *m, const char *dir, const mt_checkpoint_info *info_in);

/* The save under the folder's lock (MT_LOCK_NAME, fileio.h): two writers of
 * one folder would replace each other's step folders and `latest`. */
mt_status mt_ck_save(mt_err err, const mt_model_files *m, const char *dir, const mt_checkpoint_info *info_in)
{
    mt_status st;
    int lock;
    if ((st = mt_mkdir_p(err, dir)) || (st = mt_lock_dir(err, dir, &lock))) return st;
    st = save_locked(err, m, dir, info_in);
    mt_unlock_dir(dir, lock);
    return st;
}

static mt_status save_locked(mt_err err, const mt_model_files *m, const char *dir, const mt_checkpoint_info *info_in)
{
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    mt_status st;
    if (info_in && (st = mt_copy_in(err, &info, sizeof info, info_in, MT_FIRST_SIZE_CHECKPOINT_INFO, "mt_checkpoint_info"))) return st;
    cJSON *caller;
    if ((st = parse_caller_json(err, info.caller_json, &caller))) return st;

    char name[32], final[4096], tmp[4200], old[4200], path[4096];
    snprintf(name, sizeof name, "step-%08" PRIu64, m->step);
    mt_path_join(final, sizeof final, dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    rm_rf(tmp); /* a killed save's leftovers */
    if ((st = mt_mkdir_p(err, tmp))) {
        cJSON_Delete(caller);
        return st;
    }
    mt_path_join(path, sizeof path, tmp, "model.safetensors");
    const int lean = m->cfg->precision == MT_PRECISION_LEAN;
    if (lean && !(st = write_lean_parts(err, m, path, 0, LEAN_WEIGHT_PARTS))) {
        mt_path_join(path, sizeof path, tmp, "optimizer.safetensors");
        st = write_lean_parts(err, m, path, LEAN_WEIGHT_PARTS, LEAN_PARTS);
    } else if (!lean && !(st = mt_save_tensors(err, m, path, 0, MT_ST_F32))) {
        mt_path_join(path, sizeof path, tmp, "optimizer.safetensors");
        size_t n = mt_tensor_count(m), na = 0, nb = 0;
        char(*names)[128] = malloc(2 * n * sizeof *names);
        mt_st_write_req *a = names ? mt_tensor_write_list(m, 1, MT_ST_F32, names, &na) : NULL;
        mt_st_write_req *b = names ? mt_tensor_write_list(m, 2, MT_ST_F32, names + n, &nb) : NULL;
        mt_st_write_req *both = a && b ? malloc((na + nb) * sizeof *both) : NULL;
        if (both) {
            memcpy(both, a, na * sizeof *both);
            memcpy(both + na, b, nb * sizeof *both);
            st = mt_st_write(err, path, both, na + nb);
        } else {
            st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory writing %s", path);
        }
        free(both), free(a), free(b), free(names);
    }
    if (!st) st = mt_write_config(err, m->cfg, m->source_dir, tmp);
    if (!st) st = write_state(err, tmp, m, &info, caller);
    else cJSON_Delete(caller);
    if (!st) st = mt_sync_dir(err, tmp);
    if (st) {
        rm_rf(tmp);
        return st;
    }
    /* a checkpoint of the same step is replaced: moved aside first, so that a
     * kill in between leaves it findable as .old */
    struct stat sb;
    if (stat(final, &sb) == 0 && rename(final, old) != 0) {
        int e = errno;
        rm_rf(tmp);
        return mt_fail(err, MT_ERR_IO, "cannot move %s aside: %s", final, strerror(e));
    }
    if (rename(tmp, final) != 0) {
        int e = errno;
        rm_rf(tmp);
        rename(old, final);
        return mt_fail(err, MT_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(e));
    }
    if ((st = mt_sync_dir(err, dir))) return st;
    rm_rf(old); /* the replaced checkpoint of this step, now that the new one is in place */
    mt_path_join(path, sizeof path, dir, "latest");
    char line[40];
    int len = snprintf(line, sizeof line, "%s\n", name);
    if ((st = mt_write_file_atomic(err, path, line, (size_t)len)) || (st = mt_sync_dir(err, dir))) return st;
    prune(dir, m->step);
    return MT_OK;
}

/* ---- loading ------------------------------------------------------------------------ */

static int parse_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsString(v) || !v->valuestring[0]) return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v->valuestring, &end, 10);
    if (errno || *end || v->valuestring[0] == '-') return -1;
    *out = x;
    return 0;
}

/* The step folder of dir: dir itself when it holds trainer_state.json, else
 * what dir/latest names (or that name's .old, if a save was killed while
 * replacing a checkpoint of the same step). */
static mt_status find_step_dir(mt_err err, const char *dir, char *out, size_t size)
{
    char path[4096];
    struct stat sb;
    mt_path_join(path, sizeof path, dir, "trainer_state.json");
    if (stat(path, &sb) == 0) {
        snprintf(out, size, "%s", dir);
        return MT_OK;
    }
    mt_path_join(path, sizeof path, dir, "latest");
    char *text;
    size_t len;
    mt_status st = mt_read_small_file(err, path, &text, &len);
    if (st) return mt_fail(err, st, "%s is not a checkpoint: it has neither trainer_state.json nor latest", dir);
    text[strcspn(text, "\r\n")] = '\0';
    if (strncmp(text, "step-", 5) || strchr(text, '/') || strlen(text) > 40) {
        st = mt_fail(err, MT_ERR_FORMAT, "%s does not name a step folder (\"%.40s\")", path, text);
        free(text);
        return st;
    }
    mt_path_join(out, size, dir, text);
    if (stat(out, &sb) != 0) {
        char old[4200];
        snprintf(old, sizeof old, "%s.old", out);
        if (stat(old, &sb) == 0 && strlen(old) < size) {
            snprintf(out, size, "%s", old);
        } else {
            st = mt_fail(err, MT_ERR_IO, "%s names %s, which is missing", path, text);
        }
    }
    free(text);
    return st;
}

/* The checkpoint's model must have this model's shape. */
static mt_status check_config(mt_err err, const mt_model_files *m, const char *ckdir)
{
    mt_model_config c;
    mt_model_config_init(&c);
    mt_status st = mt_config_load(&c, ckdir);
    if (st) return mt_fail(err, st, "%s", mt_last_errmsg());
    const mt_model_config *h = m->cfg;
#define SAME(f)                                                                                                     \
    if (c.f != h->f)                                                                                                \
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "checkpoint %s is for a model with " #f " %g, this model has %g", \
                       ckdir, (double)c.f, (double)h->f);
    SAME(arch) SAME(vocab_size) SAME(hidden_size) SAME(intermediate_size) SAME(num_hidden_layers)
    SAME(num_attention_heads) SAME(num_key_value_heads) SAME(head_dim) SAME(attention_bias) SAME(tie_word_embeddings)
    SAME(rms_norm_eps) SAME(rope_theta) SAME(rope_scaling)
#undef SAME
    return MT_OK;
}

mt_status mt_ck_load(mt_err err, mt_model_files *m, const char *dir, mt_checkpoint_info *info_out)
{
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    mt_status st;
    if (info_out && (st = mt_copy_out(err, info_out, &info, sizeof info, MT_FIRST_SIZE_CHECKPOINT_INFO, "mt_checkpoint_info"))) return st;
    char ck[4096], path[4096];
    if ((st = find_step_dir(err, dir, ck, sizeof ck)) || (st = check_config(err, m, ck))) return st;

    cJSON *j;
    mt_path_join(path, sizeof path, ck, "trainer_state.json");
    if ((st = mt_parse_json_file(err, path, &j))) return st;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    const cJSON *prec = cJSON_GetObjectItemCaseSensitive(j, "precision");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(j, "rng_state");
    const char *want_prec = precision_name(m);
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT))
        st = mt_fail(err, MT_ERR_FORMAT, "%s is not a megatrain checkpoint state", path);
    else if (!cJSON_IsNumber(ver) || ver->valueint != STATE_VERSION)
        st = mt_fail(err, MT_ERR_UNSUPPORTED, "%s has version %d; this library reads version %d", path,
                     cJSON_IsNumber(ver) ? ver->valueint : -1, STATE_VERSION);
    else if (!cJSON_IsString(prec) || strcmp(prec->valuestring, want_prec))
        st = mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s was saved in %s, this model is %s", path,
                     cJSON_IsString(prec) ? prec->valuestring : "?", want_prec);
    else if (parse_u64(cJSON_GetObjectItemCaseSensitive(j, "step"), &info.step) ||
             parse_u64(cJSON_GetObjectItemCaseSensitive(j, "data_position"), &info.data_position) ||
             !cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4)
        st = mt_fail(err, MT_ERR_FORMAT, "%s lacks a valid step, data_position or rng_state", path);
    for (int i = 0; !st && i < 4; i++)
        if (parse_u64(cJSON_GetArrayItem(rng, i), &info.rng_state[i]))
            st = mt_fail(err, MT_ERR_FORMAT, "%s: rng_state[%d] is not an unsigned integer", path, i);
    uint64_t rounding_seed = m->seed;
    if (!st && m->cfg->precision == MT_PRECISION_LEAN &&
        parse_u64(cJSON_GetObjectItemCaseSensitive(j, "rounding_seed"), &rounding_seed))
        st = mt_fail(err, MT_ERR_FORMAT, "%s lacks a valid rounding_seed (lean mode's stochastic rounding)", path);
    /* the caller's members, handed back once the load has succeeded */
    char *caller_text = NULL;
    if (!st) {
        cJSON *caller = cJSON_CreateObject();
        for (cJSON *e = j->child, *next; caller && e; e = next) {
            next = e->next;
            if (!is_state_key(e->string)) cJSON_AddItemToObject(caller, e->string, cJSON_DetachItemViaPointer(j, e));
        }
        if (!caller || (caller->child && !(caller_text = cJSON_PrintUnformatted(caller))))
            st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory reading %s", path);
        cJSON_Delete(caller);
    }
    cJSON_Delete(j);
    if (st) return st;

    mt_st_set model = {0}, opt = {0};
    char where_model[4096], where_opt[4096];
    mt_path_join(where_model, sizeof where_model, ck, "model.safetensors");
    mt_path_join(where_opt, sizeof where_opt, ck, "optimizer.safetensors");
    const int weights = 0, moments[2] = {1, 2};
    st = mt_st_add_file(err, &model, ck, "model.safetensors");
    if (!st) st = mt_st_add_file(err, &opt, ck, "optimizer.safetensors");
    if (!st) st = mt_st_index(err, &model);
    if (!st) st = mt_st_index(err, &opt);
    /* everything validated before anything is written */
    const int lean = m->cfg->precision == MT_PRECISION_LEAN;
    for (int dry = 1; dry >= 0 && !st; dry--) {
        if (lean) {
            st = read_lean_parts(err, m, &model, where_model, 0, LEAN_WEIGHT_PARTS, dry);
            if (!st) st = read_lean_parts(err, m, &opt, where_opt, LEAN_WEIGHT_PARTS, LEAN_PARTS, dry);
        } else {
            st = mt_load_tensors(err, m, &model, &weights, 1, where_model, 1, dry);
            if (!st) st = mt_load_tensors(err, m, &opt, moments, 2, where_opt, 0, dry);
        }
    }
    mt_st_free(&model);
    mt_st_free(&opt);
    if (st) {
        cJSON_free(caller_text);
        return st;
    }
    m->step = info.step;
    m->seed = rounding_seed;
    free(m->caller_json);
    m->caller_json = NULL;
    if (caller_text) { /* a copy the model frees with free() */
        m->caller_json = strdup(caller_text);
        cJSON_free(caller_text);
    }
    info.caller_json = m->caller_json;
    return info_out ? mt_copy_out(err, info_out, &info, sizeof info, MT_FIRST_SIZE_CHECKPOINT_INFO, "mt_checkpoint_info") : MT_OK;
}
