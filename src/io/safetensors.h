/* safetensors: an 8-byte little-endian header length, a JSON header
 * {name: {dtype, shape, data_offsets}}, then the raw tensors. */
#ifndef MT_SAFETENSORS_H
#define MT_SAFETENSORS_H

#include "core/internal.h"
#include "core/threadpool.h"

#include <stdint.h>

/* U8 and I16: lean mode's checkpoints of 8-bit moment and 16-bit weight codes. MT_ST_Q16 is no file's
 * dtype: a write request's source of lean mode's weight codes (mt_st_write_req.part_scale). */
enum { MT_ST_F32, MT_ST_BF16, MT_ST_F16, MT_ST_U8, MT_ST_I16, MT_ST_Q16 };

/* Bytes per element of a dtype. */
static inline uint64_t mt_st_esize(int dtype) { return dtype == MT_ST_F32 ? 4 : dtype == MT_ST_U8 ? 1 : 2; }

/* Whether a tensor of dtype converts to model weights (F32, BF16 or F16). */
static inline int mt_st_is_float(int dtype) { return dtype == MT_ST_F32 || dtype == MT_ST_BF16 || dtype == MT_ST_F16; }

typedef struct mt_st_tensor {
    char *name; /* owned */
    int file;   /* index into the set's files */
    int dtype;  /* MT_ST_* */
    int ndim;
    uint64_t dims[8];
    uint64_t numel;
    const unsigned char *data; /* inside the file's mapping */
    int used;                  /* set by mt_st_expect */
} mt_st_tensor;

typedef struct mt_st_file {
    char path[4096];
    void *map;
    size_t size;
} mt_st_file;

/* Tensors of one or more mapped files. Zero-initialise, then add files. */
typedef struct mt_st_set {
    mt_st_file *files;
    int n_files;
    mt_st_tensor *t;
    size_t n, cap;
} mt_st_set;

/* Maps dir/name and adds its tensors (headers fully validated). */
mt_status mt_st_add_file(mt_err err, mt_st_set *s, const char *dir, const char *name);
/* dir/model.safetensors, or the shards model.safetensors.index.json lists. */
mt_status mt_st_open_dir(mt_err err, mt_st_set *s, const char *dir);
/* Sorts the tensors by name for mt_st_find; refuses a name held twice. */
mt_status mt_st_index(mt_err err, mt_st_set *s);
mt_st_tensor *mt_st_find(mt_st_set *s, const char *name);
/* Finds name with exactly this shape (else a message naming both shapes) and marks it used. */
mt_status mt_st_expect(mt_err err, mt_st_set *s, const char *name, const uint64_t *dims, int ndim, const char *where,
                       mt_st_tensor **out);
void mt_st_free(mt_st_set *s);
void mt_st_shape_str(char *out, size_t size, const uint64_t *dims, int nd);

/* One tensor converted into fp32 (and, if bf16 is not NULL, its bf16 rounding):
 * its numel elements from offset (numel 0: all of it), e.g. some rows of a
 * checkpoint's fused matrix. dst may be NULL (lean mode: bf16 only; a BF16
 * tensor is then copied bit for bit). A U8 tensor is not converted: read it
 * through mt_st_tensor.data. */
/* Where a model's tensor is not in the checkpoint's order (GPT-OSS's experts: mt_tensor_desc.ck_il):
 * element j of the model's order, (e, r, c) of blocks of rows x cols, is element
 * ((e * cols + c) * rows + r) * il + phase of the checkpoint's, which holds each block transposed and il
 * tensors interleaved. il 0: the same order. */
typedef struct mt_st_map {
    uint64_t rows, cols;
    uint32_t il, phase;
    uint32_t cat; /* the il matrices concatenated along the last dimension, not interleaved: element (e, r, c)
                   * is (e, c, phase * rows + r) */
} mt_st_map;

static inline uint64_t mt_st_map_src(const mt_st_map *m, uint64_t j)
{
    const uint64_t per = m->rows * m->cols, e = j / per, r = j % per / m->cols, c = j % m->cols;
    if (m->cat) return ((e * m->cols + c) * m->il + m->phase) * m->rows + r;
    return ((e * m->cols + c) * m->rows + r) * m->il + m->phase;
}

typedef struct mt_st_read_req {
    const mt_st_tensor *src;
    float *dst;
    uint16_t *bf16;
    uint64_t offset, numel; /* with a map: elements offset .. offset + numel - 1 of the model's order */
    mt_st_map map;
} mt_st_read_req;
mt_status mt_st_read(mt_err err, mt_pool *pool, const mt_st_read_req *req, size_t n);

#define MT_ST_MAX_PARTS 3

/* One tensor to write: the concatenation of n_parts arrays (a fused matrix
 * from its row blocks) of src values. fp32 values written as BF16 are rounded
 * to nearest even, bf16 values written as F32 widened; lean mode's weight
 * codes (MT_ST_Q16: int16 codes of blocks of 256, optim/q16.h) are written as
 * their values, q * scale, exact as F32 or rounded to nearest even as BF16,
 * element j of part p in block (part_phase[p] + j) / 256 of part_scale[p];
 * anything else is written as it is (src == dtype). */
typedef struct mt_st_write_req {
    const char *name;
    int dtype; /* MT_ST_F32, MT_ST_BF16, MT_ST_U8 or MT_ST_I16 */
    int ndim;
    uint64_t dims[3];
    uint64_t numel; /* of all the parts */
    int n_parts;
    const void *part[MT_ST_MAX_PARTS];
    uint64_t part_numel[MT_ST_MAX_PARTS];
    int src; /* what the parts hold: MT_ST_F32 (0), MT_ST_BF16, MT_ST_U8, MT_ST_I16 or MT_ST_Q16 */
    const float *part_scale[MT_ST_MAX_PARTS]; /* MT_ST_Q16: the scales of the blocks of each part's first code */
    uint32_t part_phase[MT_ST_MAX_PARTS];     /* MT_ST_Q16: the first code's place in its block */
    /* map.il != 0: the parts are map.il tensors in the model's order (part p at phase p), written
     * interleaved and transposed as the map says, one whole tensor */
    mt_st_map map;
} mt_st_write_req;
/* Writes path.tmp tensor by tensor, fsyncs it and renames it to path. */
mt_status mt_st_write(mt_err err, const char *path, const mt_st_write_req *t, size_t n);

#endif
