/* safetensors files: reading (memory-mapped, validated, single files or
 * the shards of an index) and writing (streamed tensor by tensor, durable). */
#define _GNU_SOURCE
#include "io/safetensors.h"
#include "optim/q16.h"
#include "core/bf16.h"
#include "io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_MAX_BYTES (256ull << 20) /* safetensors header cap */
#define IO_CHUNK (1u << 20)             /* bytes per write() */

/* ---- reading ----------------------------------------------------------------- */

void mt_st_free(mt_st_set *s)
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
static mt_status st_open_file(mt_err err, mt_st_set *s, int fi)
{
    mt_st_file *f = &s->files[fi];
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
    size_t bad;
    cJSON *j = mt_json_parse((const char *)p + 8, (size_t)hlen, &bad);
    if (!j)
        return mt_fail(err, MT_ERR_FORMAT, "%s: the safetensors header is not valid JSON (error at byte %zu of %llu)",
                       f->path, bad, (unsigned long long)hlen);
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
        mt_st_tensor t = {0};
        t.file = fi;
        uint64_t esize;
        if (!strcmp(dt->valuestring, "BF16")) t.dtype = MT_ST_BF16, esize = 2;
        else if (!strcmp(dt->valuestring, "F16")) t.dtype = MT_ST_F16, esize = 2;
        else if (!strcmp(dt->valuestring, "F32")) t.dtype = MT_ST_F32, esize = 4;
        else if (!strcmp(dt->valuestring, "U8")) t.dtype = MT_ST_U8, esize = 1;
        else if (!strcmp(dt->valuestring, "I16")) t.dtype = MT_ST_I16, esize = 2;
        else {
            st = mt_fail(err, MT_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (BF16, F16, F32, U8 and I16 are supported)",
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
            mt_st_tensor *nt = realloc(s->t, nc * sizeof *nt);
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
    return strcmp(((const mt_st_tensor *)a)->name, ((const mt_st_tensor *)b)->name);
}

mt_st_tensor *mt_st_find(mt_st_set *s, const char *name)
{
    mt_st_tensor key = {.name = (char *)name};
    return s->n ? bsearch(&key, s->t, s->n, sizeof *s->t, cmp_tensor) : NULL; /* s->t is NULL when empty */
}

mt_status mt_st_add_file(mt_err err, mt_st_set *s, const char *dir, const char *name)
{
    mt_st_file *nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
    if (!nf) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    s->files = nf;
    mt_st_file *f = &s->files[s->n_files++];
    memset(f, 0, sizeof *f);
    mt_path_join(f->path, sizeof f->path, dir, name);
    return st_open_file(err, s, s->n_files - 1);
}

/* Opens the folder's safetensors file or shards. */
mt_status mt_st_open_dir(mt_err err, mt_st_set *s, const char *dir)
{
    char single[4096], index[4096];
    mt_path_join(single, sizeof single, dir, "model.safetensors");
    mt_path_join(index, sizeof index, dir, "model.safetensors.index.json");
    struct stat sb;
    if (stat(single, &sb) == 0) return mt_st_add_file(err, s, dir, "model.safetensors");
    int e1 = errno;
    if (stat(index, &sb) != 0) {
        int e2 = errno;
        return mt_fail(err, MT_ERR_IO, "cannot open %s (%s) nor %s (%s)", single, strerror(e1), index,
                       strerror(e2));
    }
    cJSON *j;
    mt_status st = mt_parse_json_file(err, index, &j);
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
        mt_path_join(path, sizeof path, dir, e->valuestring);
        int seen = 0;
        for (int f = 0; f < s->n_files && !seen; f++) seen = !strcmp(s->files[f].path, path);
        if (!seen && (st = mt_st_add_file(err, s, dir, e->valuestring))) break;
    }
    if (!st && s->n_files == 0) st = mt_fail(err, MT_ERR_FORMAT, "%s lists no shards", index);
    if (!st) {
        /* every name of the map must be in the shard it names */
        if (s->n) qsort(s->t, s->n, sizeof *s->t, cmp_tensor);
        cJSON_ArrayForEach(e, wm)
        {
            mt_st_tensor *t = mt_st_find(s, e->string);
            char want[4096];
            mt_path_join(want, sizeof want, dir, e->valuestring);
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

void mt_st_shape_str(char *out, size_t size, const uint64_t *dims, int nd)
{
    size_t n = (size_t)snprintf(out, size, "[");
    for (int d = 0; d < nd && n < size; d++)
        n += (size_t)snprintf(out + n, size - n, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    if (n < size) snprintf(out + n, size - n, "]");
}
mt_status mt_st_index(mt_err err, mt_st_set *s)
{
    if (s->n) qsort(s->t, s->n, sizeof *s->t, cmp_tensor); /* s->t is NULL when empty */
    for (size_t i = 1; i < s->n; i++)
        if (!strcmp(s->t[i].name, s->t[i - 1].name))
            return mt_fail(err, MT_ERR_FORMAT, "tensor %s appears in both %s and %s", s->t[i].name,
                           s->files[s->t[i - 1].file].path, s->files[s->t[i].file].path);
    return MT_OK;
}

mt_status mt_st_expect(mt_err err, mt_st_set *s, const char *name, const uint64_t *dims, int ndim, const char *where,
                       mt_st_tensor **out)
{
    mt_st_tensor *t = mt_st_find(s, name);
    if (!t) return mt_fail(err, MT_ERR_FORMAT, "%s lacks tensor %s, which the model needs", where, name);
    int ok = t->ndim == ndim;
    for (int k = 0; ok && k < ndim; k++) ok = t->dims[k] == dims[k];
    if (!ok) {
        char got_s[128], want_s[128];
        mt_st_shape_str(got_s, sizeof got_s, t->dims, t->ndim);
        mt_st_shape_str(want_s, sizeof want_s, dims, ndim);
        return mt_fail(err, MT_ERR_FORMAT, "%s has shape %s in %s, the model expects %s", name, got_s,
                       s->files[t->file].path, want_s);
    }
    t->used = 1;
    *out = t;
    return MT_OK;
}

/* ---- converting into fp32 ---------------------------------------------------------- */

#define CONVERT_CHUNK (1u << 20) /* elements per parallel task */

static float element_f32(const mt_st_tensor *t, uint64_t i)
{
    if (t->dtype == MT_ST_F32) {
        float x;
        memcpy(&x, t->data + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, t->data + 2 * i, 2);
    return t->dtype == MT_ST_BF16 ? mt_bf16_to_f32(h) : f16_to_f32(h);
}

/* Elements [lo, hi) of t from element off on into dst (and their bf16 rounding into bf); through the map
 * where it has one. */
static void convert_range(const mt_st_tensor *t, uint64_t off, const mt_st_map *map, float *dst, uint16_t *bf,
                          uint64_t lo, uint64_t hi)
{
    if (!map->il && !dst && t->dtype == MT_ST_BF16) { /* bf16 into bf16: the bits as they are */
        memcpy(bf + lo, t->data + 2 * (off + lo), (hi - lo) * 2);
        return;
    }
    for (uint64_t i = lo; i < hi; i++) {
        const float x = element_f32(t, map->il ? mt_st_map_src(map, off + i) : off + i);
        if (dst) dst[i] = x;
        if (bf) bf[i] = mt_f32_to_bf16(x); /* a bf16 value through f32 and back: the same bits */
    }
}

typedef struct convert_job {
    const mt_st_read_req *req;
    size_t *first_task; /* [n + 1] */
    size_t n;
} convert_job;

static void convert_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    const convert_job *j = ctx;
    size_t i = 0;
    while (j->first_task[i + 1] <= task) i++;
    const mt_st_read_req *r = &j->req[i];
    uint64_t lo = (uint64_t)(task - j->first_task[i]) * CONVERT_CHUNK;
    uint64_t hi = MT_MIN(lo + CONVERT_CHUNK, r->numel ? r->numel : r->src->numel);
    convert_range(r->src, r->offset, &r->map, r->dst, r->bf16, lo, hi);
}

mt_status mt_st_read(mt_err err, mt_pool *pool, const mt_st_read_req *req, size_t n)
{
    size_t *first = malloc((n + 1) * sizeof *first), tasks = 0;
    if (!first) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    for (size_t i = 0; i < n; i++) {
        first[i] = tasks;
        const uint64_t numel = req[i].numel ? req[i].numel : req[i].src->numel;
        tasks += (size_t)((numel + CONVERT_CHUNK - 1) / CONVERT_CHUNK);
    }
    first[n] = tasks;
    convert_job j = {req, first, n};
    mt_pool_run(pool, tasks, convert_task, &j);
    free(first);
    return MT_OK;
}

/* ---- writing ------------------------------------------------------------------- */

/* The header, padded with spaces so that the data starts at a multiple of 8. */
static char *header_json(const mt_st_write_req *t, size_t n, size_t *len)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON *meta = cJSON_AddObjectToObject(j, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(j, t[i].name);
        static const char *const dtype_name[] = {[MT_ST_F32] = "F32", [MT_ST_BF16] = "BF16", [MT_ST_U8] = "U8",
                                                 [MT_ST_I16] = "I16"};
        cJSON_AddStringToObject(e, "dtype", dtype_name[t[i].dtype]);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].dims[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += t[i].numel * mt_st_esize(t[i].dtype);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return NULL;
    size_t k = strlen(s), padded = MT_ALIGN_UP(8 + k, 8) - 8;
    char *out = malloc(padded + 1);
    if (out) {
        memcpy(out, s, k);
        memset(out + k, ' ', padded - k);
        out[padded] = '\0';
        *len = padded;
    }
    cJSON_free(s);
    return out;
}

/* Element j of part p of t as a float (the source types a mapped tensor may have). */
static float part_f32(const mt_st_write_req *t, int p, uint64_t j)
{
    if (t->src == MT_ST_F32) return ((const float *)t->part[p])[j];
    if (t->src == MT_ST_BF16) return mt_bf16_to_f32(((const uint16_t *)t->part[p])[j]);
    return (float)((const int16_t *)t->part[p])[j] * t->part_scale[p][(t->part_phase[p] + j) / MT_Q16_BLOCK];
}

/* A mapped tensor (mt_st_map) in the checkpoint's order: element o is (e, c, r * il + p), element
 * (e, r, c) of part p ((e, c, p * rows + r) where the parts are concatenated, m->cat). */
static int write_mapped(int fd, const mt_st_write_req *t, void *buf)
{
    const mt_st_map *m = &t->map;
    const size_t per = IO_CHUNK / 4;
    if ((t->dtype != MT_ST_F32 && t->dtype != MT_ST_BF16) || t->n_parts != (int)m->il ||
        (t->src != MT_ST_F32 && t->src != MT_ST_BF16 && t->src != MT_ST_Q16)) {
        errno = EINVAL; /* a caller's mistake */
        return -1;
    }
    const uint64_t row = m->rows * m->il, block = m->cols * row;
    for (uint64_t o0 = 0; o0 < t->numel; o0 += per) {
        const size_t c = (size_t)MT_MIN((uint64_t)per, t->numel - o0);
        for (size_t k = 0; k < c; k++) {
            const uint64_t o = o0 + k, e = o / block, col = o % block / row, x = o % row;
            const uint64_t part = m->cat ? x / m->rows : x % m->il, r = m->cat ? x % m->rows : x / m->il;
            const float v = part_f32(t, (int)part, (e * m->rows + r) * m->cols + col);
            if (t->dtype == MT_ST_F32) ((float *)buf)[k] = v;
            else ((uint16_t *)buf)[k] = mt_f32_to_bf16(v);
        }
        if (mt_write_all(fd, buf, c * mt_st_esize(t->dtype))) return -1;
    }
    return 0;
}

static int write_data(int fd, const mt_st_write_req *t, size_t n, void *buf)
{
    const size_t per = IO_CHUNK / 4;
    for (size_t i = 0; i < n; i++) {
        if (t[i].map.il) {
            if (write_mapped(fd, &t[i], buf)) return -1;
            continue;
        }
        for (int p = 0; p < t[i].n_parts; p++) {
            const int from = t[i].src, to = t[i].dtype;
            const unsigned char *src = t[i].part[p];
            const uint64_t es = mt_st_esize(from);
            for (uint64_t k = 0; k < t[i].part_numel[p]; k += per) {
                size_t c = (size_t)MT_MIN((uint64_t)per, t[i].part_numel[p] - k);
                if (from == to) {
                    if (mt_write_all(fd, src + k * es, c * es)) return -1; /* little-endian host (x86-64) */
                } else if (from == MT_ST_F32 && to == MT_ST_BF16) {
                    uint16_t *b = buf;
                    const float *f = (const float *)src + k;
                    for (size_t e = 0; e < c; e++) b[e] = mt_f32_to_bf16(f[e]);
                    if (mt_write_all(fd, buf, c * 2)) return -1;
                } else if (from == MT_ST_BF16 && to == MT_ST_F32) {
                    float *w = buf;
                    const uint16_t *h = (const uint16_t *)src + k;
                    for (size_t e = 0; e < c; e++) w[e] = mt_bf16_to_f32(h[e]);
                    if (mt_write_all(fd, buf, c * 4)) return -1;
                } else if (from == MT_ST_Q16 && (to == MT_ST_F32 || to == MT_ST_BF16)) {
                    const int16_t *q = (const int16_t *)src + k;
                    const float *sc = t[i].part_scale[p];
                    const uint64_t ph = t[i].part_phase[p] + k;
                    for (size_t e = 0; e < c; e++) {
                        const float x = (float)q[e] * sc[(ph + e) / MT_Q16_BLOCK]; /* exact: a power-of-two scale */
                        if (to == MT_ST_F32) ((float *)buf)[e] = x;
                        else ((uint16_t *)buf)[e] = mt_f32_to_bf16(x);
                    }
                    if (mt_write_all(fd, buf, c * mt_st_esize(to))) return -1;
                } else {
                    errno = EINVAL; /* no such conversion: a caller's mistake */
                    return -1;
                }
            }
        }
    }
    return 0;
}

mt_status mt_st_write(mt_err err, const char *path, const mt_st_write_req *t, size_t n)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "path too long: %s", path);
    size_t hlen = 0;
    char *header = header_json(t, n, &hlen);
    void *buf = malloc(IO_CHUNK);
    if (!header || !buf) {
        free(header);
        free(buf);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory writing %s", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(header);
        free(buf);
        return mt_fail(err, MT_ERR_IO, "cannot create %s: %s", tmp, strerror(e));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    int rc = mt_write_all(fd, len8, 8);
    if (!rc) rc = mt_write_all(fd, header, hlen);
    if (!rc) rc = write_data(fd, t, n, buf);
    if (!rc) rc = fsync(fd);
    int e = errno;
    if (close(fd) != 0 && !rc) rc = -1, e = errno;
    free(header);
    free(buf);
    if (!rc && rename(tmp, path) != 0) rc = -1, e = errno;
    if (rc) {
        unlink(tmp);
        return mt_fail(err, MT_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return MT_OK;
}
