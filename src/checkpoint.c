/* Resume checkpoints: dir/step-NNNNNNNN/ folders and a dir/latest pointer.
 *
 *   step-00000042/config.json            the model's shape
 *   step-00000042/model.safetensors      fp32 master weights (Hugging Face names)
 *   step-00000042/optimizer.safetensors  <name>.exp_avg, <name>.exp_avg_sq (fp32)
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
#include "fileio.h"
#include "hf.h"
#include "model.h"
#include "safetensors.h"

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

void mt_checkpoint_info_init_sized(mt_checkpoint_info *info, uint32_t size) { mt_struct_init(info, size, NULL, 0); }

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path) { (void)nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static mt_status write_state(mt_err err, const char *dir, const mt_model *m, const mt_checkpoint_info *info)
{
    cJSON *j = cJSON_CreateObject();
    char num[32], path[4096];
    cJSON_AddStringToObject(j, "format", STATE_FORMAT);
    cJSON_AddNumberToObject(j, "version", STATE_VERSION);
    cJSON_AddStringToObject(j, "library", mt_version_string());
    cJSON_AddStringToObject(j, "precision", m->cfg.precision == MT_PRECISION_FP32 ? "fp32" : "bf16");
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
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    mt_path_join(path, sizeof path, dir, "trainer_state.json");
    mt_status st = mt_write_file_atomic(err, path, text, strlen(text));
    cJSON_free(text);
    return st;
}

/* Removes step folders other than the newest KEEP, and leftovers of killed saves. */
static void prune(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char names[64][64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) || len >= 64) continue;
        char path[4096];
        mt_path_join(path, sizeof path, dir, e->d_name);
        if (len > 4 && (!strcmp(e->d_name + len - 4, ".tmp") || !strcmp(e->d_name + len - 4, ".old")))
            rm_rf(path);
        else if (n < 64)
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 0; i < n - KEEP; i++) {
        char path[4096];
        mt_path_join(path, sizeof path, dir, names[i]);
        rm_rf(path);
    }
}

mt_status mt_checkpoint_save(mt_model *m, const char *dir, const mt_checkpoint_info *info_in)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_optimizer_drain(m); /* the last step's update, if it still runs */
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    if (!dir) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_checkpoint_save: dir is NULL");
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    mt_status st;
    if (info_in && (st = mt_copy_in(err, &info, sizeof info, info_in, MT_FIRST_SIZE_CHECKPOINT_INFO, "mt_checkpoint_info"))) return st;
    if ((st = mt_mkdir_p(err, dir))) return st;

    char name[32], final[4096], tmp[4200], old[4200], path[4096];
    snprintf(name, sizeof name, "step-%08" PRIu64, m->step);
    mt_path_join(final, sizeof final, dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    rm_rf(tmp); /* a killed save's leftovers */
    if ((st = mt_mkdir_p(err, tmp))) return st;
    mt_path_join(path, sizeof path, tmp, "model.safetensors");
    if (!(st = mt_save_tensors(err, m, path, 0, MT_ST_F32))) {
        mt_path_join(path, sizeof path, tmp, "optimizer.safetensors");
        size_t n = mt_tensor_count(m);
        char(*names)[128] = malloc(2 * n * sizeof *names);
        mt_st_write_req *a = names ? mt_tensor_write_list(m, 1, MT_ST_F32, names) : NULL;
        mt_st_write_req *b = names ? mt_tensor_write_list(m, 2, MT_ST_F32, names + n) : NULL;
        mt_st_write_req *both = a && b ? malloc(2 * n * sizeof *both) : NULL;
        if (both) {
            memcpy(both, a, n * sizeof *both);
            memcpy(both + n, b, n * sizeof *both);
            st = mt_st_write(err, path, both, 2 * n);
        } else {
            st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory writing %s", path);
        }
        free(both), free(a), free(b), free(names);
    }
    if (!st) st = mt_write_config(err, &m->cfg, tmp);
    if (!st) st = write_state(err, tmp, m, &info);
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
    mt_path_join(path, sizeof path, dir, "latest");
    char line[40];
    int len = snprintf(line, sizeof line, "%s\n", name);
    if ((st = mt_write_file_atomic(err, path, line, (size_t)len)) || (st = mt_sync_dir(err, dir))) return st;
    prune(dir);
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
static mt_status check_config(mt_err err, const mt_model *m, const char *ckdir)
{
    mt_model_config c;
    mt_model_config_init(&c);
    mt_status st = mt_config_load(&c, ckdir);
    if (st) return mt_fail(err, st, "%s", mt_last_errmsg());
    const mt_model_config *h = &m->cfg;
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

mt_status mt_checkpoint_load(mt_model *m, const char *dir, mt_checkpoint_info *info_out)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_optimizer_drain(m); /* the last step's update, if it still runs */
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    if (!dir) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_checkpoint_load: dir is NULL");
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
    const char *want_prec = m->cfg.precision == MT_PRECISION_FP32 ? "fp32" : "bf16";
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
    if (!st) st = mt_load_tensors(err, m, &model, &weights, 1, where_model, 1, 1);
    if (!st) st = mt_load_tensors(err, m, &opt, moments, 2, where_opt, 0, 1);
    if (!st) st = mt_load_tensors(err, m, &model, &weights, 1, where_model, 1, 0);
    if (!st) st = mt_load_tensors(err, m, &opt, moments, 2, where_opt, 0, 0);
    mt_st_free(&model);
    mt_st_free(&opt);
    if (st) return st;
    m->step = info.step;
    return info_out ? mt_copy_out(err, info_out, &info, sizeof info, MT_FIRST_SIZE_CHECKPOINT_INFO, "mt_checkpoint_info") : MT_OK;
}
