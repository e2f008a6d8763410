#define _GNU_SOURCE
/* Hugging Face model folders: config.json, model.safetensors (or shards
 * listed by model.safetensors.index.json). See docs/formats.md. */
#include "model.h"
#include "bf16.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define CONFIG_MAX_BYTES (64u << 20)   /* a config.json or index larger than this is not one */
#define HEADER_MAX_BYTES (256ull << 20) /* safetensors header cap */
#define IO_CHUNK (1u << 20)            /* bytes per write() */

/* ---- small helpers ------------------------------------------------------- */

static void join_path(char *out, size_t size, const char *dir, const char *name)
{
    snprintf(out, size, "%s/%s", dir, name);
}

/* Reads a whole (small) file into a NUL-terminated buffer. */
static mt_status read_small_file(mt_err err, const char *path, char **out, size_t *len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_fail(err, MT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mt_fail(err, MT_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mt_fail(err, MT_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > CONFIG_MAX_BYTES) {
        close(fd);
        return mt_fail(err, MT_ERR_FORMAT, "%s is %lld bytes, too large for a JSON file of this kind", path,
                       (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory reading %s", path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return mt_fail(err, MT_ERR_IO, "cannot read %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return MT_OK;
}

/* A JSON error position as "line L, column C" of text. */
static void json_where(char *out, size_t size, const char *text, size_t len)
{
    const char *p = cJSON_GetErrorPtr();
    if (!p || p < text || p > text + len) {
        snprintf(out, size, "unknown position");
        return;
    }
    int line = 1, col = 1;
    for (const char *q = text; q < p; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    snprintf(out, size, "line %d, column %d", line, col);
}

static mt_status parse_json_file(mt_err err, const char *path, cJSON **out)
{
    char *text = NULL;
    size_t len = 0;
    mt_status st = read_small_file(err, path, &text, &len);
    if (st) return st;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) {
        char where[64];
        json_where(where, sizeof where, text, len);
        free(text);
        return mt_fail(err, MT_ERR_FORMAT, "%s is not valid JSON (error near %s)", path, where);
    }
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return mt_fail(err, MT_ERR_FORMAT, "%s does not hold a JSON object", path);
    }
    *out = j;
    return MT_OK;
}

/* ---- config.json ----------------------------------------------------------- */

/* An unsigned integer field. required: absence is an error; else *out keeps its value. */
static mt_status get_u32(mt_err err, const cJSON *o, const char *key, uint32_t *out, int required, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return mt_fail(err, MT_ERR_FORMAT, "%s lacks \"%s\"", path, key);
        return MT_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 4294967295.0 ||
        v->valuedouble != floor(v->valuedouble))
        return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be a non-negative integer", path, key);
    *out = (uint32_t)v->valuedouble;
    return MT_OK;
}

static mt_status get_float(mt_err err, const cJSON *o, const char *key, float *out, int required, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return mt_fail(err, MT_ERR_FORMAT, "%s lacks \"%s\"", path, key);
        return MT_OK;
    }
    if (!cJSON_IsNumber(v)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be a number", path, key);
    *out = (float)v->valuedouble;
    return MT_OK;
}

static mt_status get_bool(mt_err err, const cJSON *o, const char *key, uint32_t *out, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return MT_OK;
    if (!cJSON_IsBool(v)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be true or false", path, key);
    *out = cJSON_IsTrue(v) ? 1u : 0u;
    return MT_OK;
}

static const struct {
    const char *architecture, *model_type;
    mt_arch arch;
} ARCHS[] = {
    {"LlamaForCausalLM", "llama", MT_ARCH_LLAMA},
    {"Qwen2ForCausalLM", "qwen2", MT_ARCH_QWEN2},
    {"MistralForCausalLM", "mistral", MT_ARCH_MISTRAL},
};
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])

static mt_status config_from_json(mt_err err, mt_model_config *c, const cJSON *j, const char *path)
{
    mt_status st;
    /* architecture */
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    int found = -1;
    if (archs && !cJSON_IsNull(archs)) {
        if (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) < 1)
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"architectures\" must be a non-empty list of names", path);
        const cJSON *a0 = cJSON_GetArrayItem(archs, 0);
        if (!cJSON_IsString(a0))
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"architectures\" must be a list of names", path);
        for (size_t i = 0; i < N_ARCHS; i++)
            if (!strcmp(a0->valuestring, ARCHS[i].architecture)) found = (int)i;
        if (found < 0)
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: architecture %s is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
                           "MistralForCausalLM are)",
                           path, a0->valuestring);
    } else if (cJSON_IsString(mtype)) {
        for (size_t i = 0; i < N_ARCHS; i++)
            if (!strcmp(mtype->valuestring, ARCHS[i].model_type)) found = (int)i;
        if (found < 0)
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: model_type %s is not supported (llama, qwen2, mistral are)", path,
                           mtype->valuestring);
    } else {
        return mt_fail(err, MT_ERR_FORMAT, "%s names neither \"architectures\" nor \"model_type\"", path);
    }
    c->arch = ARCHS[found].arch;

    /* shape */
    if ((st = get_u32(err, j, "vocab_size", &c->vocab_size, 1, path)) ||
        (st = get_u32(err, j, "hidden_size", &c->hidden_size, 1, path)) ||
        (st = get_u32(err, j, "intermediate_size", &c->intermediate_size, 1, path)) ||
        (st = get_u32(err, j, "num_hidden_layers", &c->num_hidden_layers, 1, path)) ||
        (st = get_u32(err, j, "num_attention_heads", &c->num_attention_heads, 1, path)))
        return st;
    c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = 0;
    if ((st = get_u32(err, j, "num_key_value_heads", &c->num_key_value_heads, 0, path)) ||
        (st = get_u32(err, j, "head_dim", &c->head_dim, 0, path)) ||
        (st = get_u32(err, j, "max_position_embeddings", &c->max_position_embeddings, 1, path)) ||
        (st = get_float(err, j, "rms_norm_eps", &c->rms_norm_eps, 0, path)))
        return st;
    c->rope_theta = 10000.0f;
    if ((st = get_float(err, j, "rope_theta", &c->rope_theta, 0, path))) return st;
    c->tie_word_embeddings = 0;
    if ((st = get_bool(err, j, "tie_word_embeddings", &c->tie_word_embeddings, path))) return st;

    /* biases */
    c->attention_bias = 0;
    if (c->arch == MT_ARCH_QWEN2) {
        c->attention_bias = 1; /* Qwen2 always has q/k/v biases */
    } else if ((st = get_bool(err, j, "attention_bias", &c->attention_bias, path))) {
        return st;
    }
    uint32_t mlp_bias = 0;
    if ((st = get_bool(err, j, "mlp_bias", &mlp_bias, path))) return st;
    if (mlp_bias) return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", path);

    /* activation */
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (act && !cJSON_IsNull(act)) {
        if (!cJSON_IsString(act)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"hidden_act\" must be a string", path);
        if (strcmp(act->valuestring, "silu") != 0)
            return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: hidden_act %s is not supported (only silu is)", path,
                           act->valuestring);
    }

    /* sliding-window attention */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (sw && !cJSON_IsNull(sw)) {
        if (c->arch == MT_ARCH_QWEN2) {
            uint32_t use = 0;
            if ((st = get_bool(err, j, "use_sliding_window", &use, path))) return st;
            if (use)
                return mt_fail(err, MT_ERR_UNSUPPORTED,
                               "%s: use_sliding_window true (sliding_window attention) is not supported", path);
        } else {
            /* Mistral (and Llama configs that carry it) apply the window whenever it is set: only a
             * window that covers every position is harmless. */
            uint32_t w = 0;
            if ((st = get_u32(err, j, "sliding_window", &w, 0, path))) return st;
            if (w < c->max_position_embeddings)
                return mt_fail(err, MT_ERR_UNSUPPORTED,
                               "%s: sliding_window %u (shorter than max_position_embeddings %u) is not supported",
                               path, w, c->max_position_embeddings);
        }
    }

    /* rope scaling */
    c->rope_scaling = MT_ROPE_SCALING_NONE;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        if (!cJSON_IsObject(rs)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"rope_scaling\" must be an object or null", path);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsString(t))
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"rope_scaling\" has no \"rope_type\" (or \"type\")", path);
        if (!strcmp(t->valuestring, "llama3")) {
            c->rope_scaling = MT_ROPE_SCALING_LLAMA3;
            if ((st = get_float(err, rs, "factor", &c->rope_factor, 1, path)) ||
                (st = get_float(err, rs, "low_freq_factor", &c->rope_low_freq_factor, 1, path)) ||
                (st = get_float(err, rs, "high_freq_factor", &c->rope_high_freq_factor, 1, path)) ||
                (st = get_u32(err, rs, "original_max_position_embeddings", &c->rope_original_max_position, 1, path)))
                return st;
        } else if (strcmp(t->valuestring, "default") != 0) {
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: rope_scaling type %s is not supported (only llama3 is)", path, t->valuestring);
        }
    }
    return MT_OK;
}

mt_status mt_config_load(mt_model_config *cfg, const char *dir)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!cfg) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_config_load: cfg is NULL");
    if (!dir) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_config_load: dir is NULL");
    mt_model_config caller;
    mt_model_config_init(&caller);
    mt_status st = mt_copy_in(err, &caller, sizeof caller, cfg, sizeof(mt_model_config), "mt_model_config");
    if (st) return st;

    mt_model_config c;
    mt_model_config_init(&c);
    c.precision = caller.precision;
    c.seed = caller.seed;
    c.initializer_range = caller.initializer_range;

    char path[4096];
    join_path(path, sizeof path, dir, "config.json");
    cJSON *j;
    if ((st = parse_json_file(err, path, &j))) return st;
    st = config_from_json(err, &c, j, path);
    cJSON_Delete(j);
    if (st) return st;

    mt_model_config check;
    char why[MT_ERRMSG_MAX];
    if ((st = mt_config_import((mt_err){why}, &check, &c)))
        return mt_fail(err, st, "%s describes an impossible model: %s", path, why);
    return mt_copy_out(err, cfg, &c, sizeof c, sizeof(mt_model_config), "mt_model_config");
}

/* ---- writing ------------------------------------------------------------------ */

static mt_status mkdir_p(mt_err err, const char *dir)
{
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bad directory name \"%s\"", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char save = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            return mt_fail(err, MT_ERR_IO, "cannot create directory %s: %s", p, strerror(e));
        }
        p[i] = save;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return mt_fail(err, MT_ERR_IO, "%s is not a directory", dir);
    return MT_OK;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, MT_MIN(n, (size_t)IO_CHUNK));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The shortest decimal that reads back as the same float, as a JSON number. */
static cJSON *float_number(float f)
{
    char s[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, (double)f);
        if (strtof(s, NULL) == f) break;
    }
    return cJSON_CreateNumber(strtod(s, NULL));
}

static char *config_json_text(const mt_model_config *c)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    int ai = 0;
    for (size_t i = 0; i < N_ARCHS; i++)
        if (ARCHS[i].arch == (mt_arch)c->arch) ai = (int)i;
    const char *names[1] = {ARCHS[ai].architecture};
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(names, 1));
    cJSON_AddStringToObject(j, "model_type", ARCHS[ai].model_type);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddItemToObject(j, "rms_norm_eps", float_number(c->rms_norm_eps));
    cJSON_AddItemToObject(j, "rope_theta", float_number(c->rope_theta));
    if (c->rope_scaling == MT_ROPE_SCALING_LLAMA3) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddItemToObject(rs, "factor", float_number(c->rope_factor));
        cJSON_AddItemToObject(rs, "low_freq_factor", float_number(c->rope_low_freq_factor));
        cJSON_AddItemToObject(rs, "high_freq_factor", float_number(c->rope_high_freq_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max_position);
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    if (c->arch != MT_ARCH_QWEN2) cJSON_AddBoolToObject(j, "attention_bias", c->attention_bias != 0);
    cJSON_AddBoolToObject(j, "mlp_bias", 0);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings != 0);
    if (c->arch == MT_ARCH_QWEN2) cJSON_AddBoolToObject(j, "use_sliding_window", 0);
    if (c->arch != MT_ARCH_LLAMA) cJSON_AddNullToObject(j, "sliding_window");
    cJSON_AddStringToObject(j, "torch_dtype", c->precision == MT_PRECISION_FP32 ? "float32" : "bfloat16");
    cJSON_AddItemToObject(j, "initializer_range", float_number(c->initializer_range));
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

/* The safetensors header of the model, padded with spaces so that 8 + its
 * length is a multiple of 8. */
static char *safetensors_header(const mt_model *m, size_t *len)
{
    const int fp32 = m->cfg.precision == MT_PRECISION_FP32;
    const uint64_t esize = fp32 ? 4 : 2;
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON *meta = cJSON_AddObjectToObject(j, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *t = &ud->tensors[i];
            cJSON *e = cJSON_AddObjectToObject(j, t->name);
            cJSON_AddStringToObject(e, "dtype", fp32 ? "F32" : "BF16");
            cJSON *shape = cJSON_AddArrayToObject(e, "shape");
            cJSON_AddItemToArray(shape, cJSON_CreateNumber(t->rows));
            if (t->cols != 1 || (t->role != MT_T_ATTN_NORM && t->role != MT_T_MLP_NORM &&
                                 t->role != MT_T_FINAL_NORM && t->role != MT_T_Q_BIAS &&
                                 t->role != MT_T_K_BIAS && t->role != MT_T_V_BIAS))
                cJSON_AddItemToArray(shape, cJSON_CreateNumber(t->cols));
            cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
            off += t->numel * esize;
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        }
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return NULL;
    size_t n = strlen(s), padded = MT_ALIGN_UP(8 + n, 8) - 8;
    char *out = malloc(padded + 1);
    if (out) {
        memcpy(out, s, n);
        memset(out + n, ' ', padded - n);
        out[padded] = '\0';
        *len = padded;
    }
    cJSON_free(s);
    return out;
}

static int is_vector_role(mt_tensor_role r)
{
    return r == MT_T_ATTN_NORM || r == MT_T_MLP_NORM || r == MT_T_FINAL_NORM || r == MT_T_Q_BIAS ||
           r == MT_T_K_BIAS || r == MT_T_V_BIAS;
}

/* Writes the tensor data of the model, converting chunk by chunk. */
static int write_tensors(int fd, const mt_model *m, void *buf)
{
    const int fp32 = m->cfg.precision == MT_PRECISION_FP32;
    const size_t per = IO_CHUNK / 4;
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        const float *master = mt_tile_master(&m->tiles.tile[u], ud);
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *t = &ud->tensors[i];
            const float *src = master + t->offset;
            for (uint64_t k = 0; k < t->numel; k += per) {
                size_t n = (size_t)MT_MIN((uint64_t)per, t->numel - k);
                if (fp32) {
                    memcpy(buf, src + k, n * 4); /* little-endian host (x86-64) */
                    if (write_all(fd, buf, n * 4)) return -1;
                } else {
                    uint16_t *b = buf;
                    for (size_t e = 0; e < n; e++) b[e] = mt_f32_to_bf16(src[k + e]);
                    if (write_all(fd, buf, n * 2)) return -1;
                }
            }
        }
    }
    return 0;
}

typedef enum { PAYLOAD_TEXT, PAYLOAD_SAFETENSORS } payload_kind;

/* Writes path.tmp (text, or the model as safetensors) and fsyncs it; the
 * caller renames it. Removes the temporary file on failure. */
static mt_status write_temp(mt_err err, const char *tmp, payload_kind kind, const char *text, size_t text_len,
                            const mt_model *m)
{
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return mt_fail(err, MT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    int rc = 0;
    if (kind == PAYLOAD_TEXT) {
        rc = write_all(fd, text, text_len);
    } else {
        unsigned char len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)text_len >> (8 * i));
        void *buf = malloc(IO_CHUNK);
        if (!buf) {
            close(fd);
            unlink(tmp);
            return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory writing %s", tmp);
        }
        rc = write_all(fd, len8, 8);
        if (!rc) rc = write_all(fd, text, text_len);
        if (!rc) rc = write_tensors(fd, m, buf);
        free(buf);
    }
    if (!rc) rc = fsync(fd);
    int e = errno;
    if (close(fd) != 0 && !rc) rc = -1, e = errno;
    if (rc) {
        unlink(tmp);
        return mt_fail(err, MT_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
    }
    return MT_OK;
}

mt_status mt_model_save(mt_model *m, const char *dir)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    if (!dir) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_model_save: dir is NULL");
    mt_status st;
    if ((st = mkdir_p(err, dir))) return st;

    char st_path[4096], st_tmp[4096], cfg_path[4096], cfg_tmp[4096];
    join_path(st_path, sizeof st_path, dir, "model.safetensors");
    join_path(st_tmp, sizeof st_tmp, dir, "model.safetensors.tmp");
    join_path(cfg_path, sizeof cfg_path, dir, "config.json");
    join_path(cfg_tmp, sizeof cfg_tmp, dir, "config.json.tmp");

    size_t hlen = 0;
    char *header = safetensors_header(m, &hlen);
    char *cfg_text = config_json_text(&m->cfg);
    if (!header || !cfg_text) {
        free(header);
        cJSON_free(cfg_text);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory building the headers");
    }
    st = write_temp(err, st_tmp, PAYLOAD_SAFETENSORS, header, hlen, m);
    free(header);
    if (!st) {
        size_t n = strlen(cfg_text);
        char *line = malloc(n + 2);
        if (!line) {
            st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory building config.json");
        } else {
            memcpy(line, cfg_text, n);
            line[n] = '\n';
            line[n + 1] = '\0';
            st = write_temp(err, cfg_tmp, PAYLOAD_TEXT, line, n + 1, m);
            free(line);
        }
        if (st) unlink(st_tmp);
    }
    cJSON_free(cfg_text);
    if (st) return st;

    if (rename(st_tmp, st_path) != 0) {
        int e = errno;
        unlink(st_tmp);
        unlink(cfg_tmp);
        return mt_fail(err, MT_ERR_IO, "cannot rename %s to %s: %s", st_tmp, st_path, strerror(e));
    }
    if (rename(cfg_tmp, cfg_path) != 0) {
        int e = errno;
        unlink(cfg_tmp);
        return mt_fail(err, MT_ERR_IO, "cannot rename %s to %s: %s", cfg_tmp, cfg_path, strerror(e));
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return mt_fail(err, MT_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    int rc = fsync(dfd);
    int e = errno;
    close(dfd);
    if (rc) return mt_fail(err, MT_ERR_IO, "cannot sync directory %s: %s", dir, strerror(e));
    return MT_OK;
}

/* ---- reading safetensors -------------------------------------------------------- */

enum { DT_BF16, DT_F16, DT_F32 };

typedef struct st_tensor {
    char *name;            /* owned */
    int file;              /* index into the file table */
    int dtype;
    int ndim;
    uint64_t dims[8];
    uint64_t numel;
    const unsigned char *data;
    int used;
} st_tensor;

typedef struct st_file {
    char path[4096];
    void *map;
    size_t size;
} st_file;

typedef struct st_set {
    st_file *files;
    int n_files;
    st_tensor *t;
    size_t n, cap;
} st_set;

static void st_set_free(st_set *s)
{
    for (int i = 0; i < s->n_files; i++)
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
    free(s->files);
    for (size_t i = 0; i < s->n; i++) free(s->t[i].name);
    free(s->t);
    memset(s, 0, sizeof *s);
}

static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != floor(v->valuedouble))
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* Maps file fi of the set and adds its tensors. */
static mt_status st_open_file(mt_err err, st_set *s, int fi)
{
    st_file *f = &s->files[fi];
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_fail(err, MT_ERR_IO, "cannot open %s: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mt_fail(err, MT_ERR_IO, "cannot stat %s: %s", f->path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mt_fail(err, MT_ERR_IO, "%s is not a regular file", f->path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return mt_fail(err, MT_ERR_FORMAT, "%s is %lld bytes, too short for a safetensors file", f->path,
                       (long long)sb.st_size);
    }
    f->size = (size_t)sb.st_size;
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return mt_fail(err, MT_ERR_IO, "cannot map %s: %s", f->path, strerror(e));
    f->map = map;
    const unsigned char *p = map;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)p[i] << (8 * i);
    if (hlen > f->size - 8 || hlen > HEADER_MAX_BYTES || hlen < 2)
        return mt_fail(err, MT_ERR_FORMAT,
                       "%s: the safetensors header length %llu does not fit in the file of %zu bytes", f->path,
                       (unsigned long long)hlen, f->size);
    const uint64_t data_bytes = f->size - 8 - hlen;
    const unsigned char *data = p + 8 + hlen;
    cJSON *j = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!j) return mt_fail(err, MT_ERR_FORMAT, "%s: the safetensors header is not valid JSON", f->path);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return mt_fail(err, MT_ERR_FORMAT, "%s: the safetensors header is not a JSON object", f->path);
    }
    mt_status st = MT_OK;
    const cJSON *e_;
    cJSON_ArrayForEach(e_, j)
    {
        const char *name = e_->string;
        if (!strcmp(name, "__metadata__")) continue;
#define BADT(...) do { st = mt_fail(err, MT_ERR_FORMAT, __VA_ARGS__); goto done; } while (0)
        if (!cJSON_IsObject(e_)) BADT("%s: tensor %s is not described by an object", f->path, name);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e_, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e_, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(e_, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
            BADT("%s: tensor %s lacks a valid dtype, shape or data_offsets", f->path, name);
        st_tensor t = {0};
        t.file = fi;
        uint64_t esize;
        if (!strcmp(dt->valuestring, "BF16")) t.dtype = DT_BF16, esize = 2;
        else if (!strcmp(dt->valuestring, "F16")) t.dtype = DT_F16, esize = 2;
        else if (!strcmp(dt->valuestring, "F32")) t.dtype = DT_F32, esize = 4;
        else {
            st = mt_fail(err, MT_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (BF16, F16 and F32 are supported)",
                         f->path, name, dt->valuestring);
            goto done;
        }
        int nd = cJSON_GetArraySize(sh);
        if (nd > 8) BADT("%s: tensor %s has %d dimensions", f->path, name, nd);
        t.ndim = nd;
        t.numel = 1;
        for (int d = 0; d < nd; d++) {
            if (json_u64(cJSON_GetArrayItem(sh, d), &t.dims[d]) || t.dims[d] > (1ull << 40))
                BADT("%s: tensor %s has a bad shape", f->path, name);
            t.numel *= t.dims[d];
            if (t.numel > (1ull << 50)) BADT("%s: tensor %s has a bad shape", f->path, name);
        }
        uint64_t b, en;
        if (json_u64(cJSON_GetArrayItem(of, 0), &b) || json_u64(cJSON_GetArrayItem(of, 1), &en) || b > en ||
            en > data_bytes)
            BADT("%s: tensor %s has data_offsets outside the file's %llu data bytes", f->path, name,
                 (unsigned long long)data_bytes);
        if (en - b != t.numel * esize)
            BADT("%s: tensor %s has %llu data bytes, its shape and dtype need %llu", f->path, name,
                 (unsigned long long)(en - b), (unsigned long long)(t.numel * esize));
        t.data = data + b;
        if (s->n == s->cap) {
            size_t nc = s->cap ? 2 * s->cap : 64;
            st_tensor *nt = realloc(s->t, nc * sizeof *nt);
            if (!nt) {
                st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory reading %s", f->path);
                goto done;
            }
            s->t = nt;
            s->cap = nc;
        }
        t.name = strdup(name);
        if (!t.name) {
            st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory reading %s", f->path);
            goto done;
        }
        s->t[s->n++] = t;
#undef BADT
    }
done:
    cJSON_Delete(j);
    return st;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static st_tensor *st_find(st_set *s, const char *name)
{
    st_tensor key = {.name = (char *)name};
    return bsearch(&key, s->t, s->n, sizeof *s->t, cmp_tensor);
}

static mt_status st_add_file(mt_err err, st_set *s, const char *dir, const char *name)
{
    st_file *nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
    if (!nf) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    s->files = nf;
    st_file *f = &s->files[s->n_files++];
    memset(f, 0, sizeof *f);
    join_path(f->path, sizeof f->path, dir, name);
    return st_open_file(err, s, s->n_files - 1);
}

/* Opens the folder's safetensors file or shards. */
static mt_status st_open_dir(mt_err err, st_set *s, const char *dir)
{
    char single[4096], index[4096];
    join_path(single, sizeof single, dir, "model.safetensors");
    join_path(index, sizeof index, dir, "model.safetensors.index.json");
    struct stat sb;
    if (stat(single, &sb) == 0) return st_add_file(err, s, dir, "model.safetensors");
    int e1 = errno;
    if (stat(index, &sb) != 0) {
        int e2 = errno;
        return mt_fail(err, MT_ERR_IO, "cannot open %s (%s) nor %s (%s)", single, strerror(e1), index,
                       strerror(e2));
    }
    cJSON *j;
    mt_status st = parse_json_file(err, index, &j);
    if (st) return st;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        return mt_fail(err, MT_ERR_FORMAT, "%s has no \"weight_map\" object", index);
    }
    const cJSON *e;
    /* shard names in the order they first appear */
    cJSON_ArrayForEach(e, wm)
    {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
            !strcmp(e->valuestring, "..") || !strcmp(e->valuestring, ".")) {
            st = mt_fail(err, MT_ERR_FORMAT, "%s: tensor %s maps to a bad file name", index, e->string);
            break;
        }
        char path[4096];
        join_path(path, sizeof path, dir, e->valuestring);
        int seen = 0;
        for (int f = 0; f < s->n_files && !seen; f++) seen = !strcmp(s->files[f].path, path);
        if (!seen && (st = st_add_file(err, s, dir, e->valuestring))) break;
    }
    if (!st && s->n_files == 0) st = mt_fail(err, MT_ERR_FORMAT, "%s lists no shards", index);
    if (!st) {
        /* every name of the map must be in the shard it names */
        qsort(s->t, s->n, sizeof *s->t, cmp_tensor);
        cJSON_ArrayForEach(e, wm)
        {
            st_tensor *t = st_find(s, e->string);
            char want[4096];
            join_path(want, sizeof want, dir, e->valuestring);
            if (!t || strcmp(s->files[t->file].path, want) != 0) {
                st = mt_fail(err, MT_ERR_FORMAT, "%s maps %s to %s, which does not hold it", index, e->string,
                             e->valuestring);
                break;
            }
        }
    }
    cJSON_Delete(j);
    return st;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: man * 2^-24, exact in fp32 */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            man &= 0x3ff;
            u = sign | (uint32_t)(127 - 15 - e) << 23 | man << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13; /* inf or NaN (payload kept) */
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void shape_str(char *out, size_t size, const uint64_t *dims, int nd)
{
    size_t n = (size_t)snprintf(out, size, "[");
    for (int d = 0; d < nd && n < size; d++)
        n += (size_t)snprintf(out + n, size - n, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    if (n < size) snprintf(out + n, size - n, "]");
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

#define CONVERT_CHUNK (1u << 20) /* elements per parallel task */

/* Converts elements [lo, hi) of t into the master (and the bf16 copy). */
static void convert_range(const st_tensor *t, float *dst, uint16_t *bf, uint64_t lo, uint64_t hi)
{
    const unsigned char *p = t->data;
    for (uint64_t i = lo; i < hi; i++) {
        float x;
        if (t->dtype == DT_F32) {
            memcpy(&x, p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            x = t->dtype == DT_BF16 ? mt_bf16_to_f32(h) : f16_to_f32(h);
        }
        dst[i] = x;
        if (bf) bf[i] = mt_f32_to_bf16(x);
    }
}

typedef struct convert_job {
    const st_tensor *src[MT_MAX_UNIT_TENSORS];
    float *dst[MT_MAX_UNIT_TENSORS];
    uint16_t *bf[MT_MAX_UNIT_TENSORS];
    size_t first_task[MT_MAX_UNIT_TENSORS + 1];
    int n;
} convert_job;

static void convert_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    const convert_job *j = ctx;
    int i = 0;
    while (j->first_task[i + 1] <= task) i++;
    uint64_t lo = (uint64_t)(task - j->first_task[i]) * CONVERT_CHUNK;
    uint64_t hi = MT_MIN(lo + CONVERT_CHUNK, j->src[i]->numel);
    convert_range(j->src[i], j->dst[i], j->bf[i], lo, hi);
}

mt_status mt_model_load(mt_model *m, const char *dir)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_err err = mt_model_err(m);
    mt_err_clear(err);
    if (!dir) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_model_load: dir is NULL");
    st_set s = {0};
    mt_status st = st_open_dir(err, &s, dir);
    if (st) goto out;
    qsort(s.t, s.n, sizeof *s.t, cmp_tensor);
    for (size_t i = 1; i < s.n; i++)
        if (!strcmp(s.t[i].name, s.t[i - 1].name)) {
            st = mt_fail(err, MT_ERR_FORMAT, "tensor %s appears in both %s and %s", s.t[i].name,
                         s.files[s.t[i - 1].file].path, s.files[s.t[i].file].path);
            goto out;
        }

    /* validate everything before touching the model */
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *d = &ud->tensors[i];
            st_tensor *t = st_find(&s, d->name);
            if (!t) {
                st = mt_fail(err, MT_ERR_FORMAT, "%s lacks tensor %s, which the model needs",
                             s.n_files == 1 ? s.files[0].path : dir, d->name);
                goto out;
            }
            uint64_t want[2] = {d->rows, d->cols};
            int want_nd = is_vector_role(d->role) ? 1 : 2;
            int ok = t->ndim == want_nd;
            for (int k = 0; ok && k < want_nd; k++) ok = t->dims[k] == want[k];
            if (!ok) {
                char got_s[128], want_s[64];
                shape_str(got_s, sizeof got_s, t->dims, t->ndim);
                shape_str(want_s, sizeof want_s, want, want_nd);
                st = mt_fail(err, MT_ERR_FORMAT, "%s has shape %s in %s, the model expects %s", d->name, got_s,
                             s.files[t->file].path, want_s);
                goto out;
            }
            t->used = 1;
        }
    }
    for (size_t i = 0; i < s.n; i++) {
        const st_tensor *t = &s.t[i];
        if (t->used || ends_with(t->name, "rotary_emb.inv_freq")) continue;
        if (m->cfg.tie_word_embeddings && !strcmp(t->name, "lm_head.weight")) continue;
        st = mt_fail(err, MT_ERR_FORMAT, "%s holds tensor %s, which this model does not have",
                     s.files[t->file].path, t->name);
        goto out;
    }

    /* convert */
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *ud = &m->layout.units[u];
        const mt_tile *tile = &m->tiles.tile[u];
        float *master = mt_tile_master(tile, ud);
        uint16_t *bf = mt_tile_weights_bf16(tile, ud);
        convert_job j = {.n = ud->n_tensors};
        size_t tasks = 0;
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *d = &ud->tensors[i];
            j.src[i] = st_find(&s, d->name);
            j.dst[i] = master + d->offset;
            j.bf[i] = bf ? bf + d->offset : NULL;
            j.first_task[i] = tasks;
            tasks += (size_t)((d->numel + CONVERT_CHUNK - 1) / CONVERT_CHUNK);
        }
        j.first_task[ud->n_tensors] = tasks;
        mt_pool_run(m->pool, tasks, convert_task, &j);
        memset(mt_tile_m(tile, ud), 0, ud->padded * 4);
        memset(mt_tile_v(tile, ud), 0, ud->padded * 4);
    }
    m->step = 0;
out:
    st_set_free(&s);
    return st;
}
