/* Internal declarations shared by the library's modules: error reporting,
 * logging and the small helpers every file uses. Never installed. */
#ifndef MT_INTERNAL_H
#define MT_INTERNAL_H

#include "core/abi.h"
#include "megatrain.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define MT_ERRMSG_MAX 1024
/* Weight slots a policy may ask for: the backends size their tables by it. */
#define MT_MAX_WEIGHT_SLOTS 16
#define MT_MAX_DEVICES 64      /* GPUs of one host in a data-parallel model (mt_offload_policy.devices) */

#if defined(__GNUC__)
#define MT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MT_PRINTF(a, b)
#endif

#define MT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MT_ALIGN_UP(x, a) (((x) + ((a) - 1)) / (a) * (a))

/* Where a failing call writes its message: a model's buffer, or the calling
 * thread's buffer behind mt_last_errmsg() when there is no model yet. */
typedef struct mt_err {
    char *buf; /* MT_ERRMSG_MAX bytes */
} mt_err;

mt_err mt_err_thread(void);
/* Formats the message into err and returns status, so that failures read
 * `return mt_fail(err, MT_ERR_..., "...", ...);`. */
mt_status mt_fail(mt_err err, mt_status status, const char *fmt, ...) MT_PRINTF(3, 4);
void mt_err_clear(mt_err err);

/* Logging through a policy's callback (stderr by default). */
typedef struct mt_logger {
    mt_log_fn fn;
    void *user_data;
    mt_log_level level;
} mt_logger;

void mt_log(const mt_logger *lg, mt_log_level level, const char *fmt, ...) MT_PRINTF(3, 4);

/* Copies a caller's option struct (any struct_size) over dst, which holds the
 * defaults and is dst_size bytes. min_size is the size of the struct's first
 * release. Refuses sizes below it and unknown non-zero tail bytes. */
mt_status mt_copy_in(mt_err err, void *dst, size_t dst_size, const void *src, size_t min_size, const char *what);
/* Writes src (src_size bytes) into a caller's output struct that says its own
 * size in its first field; fields the caller does not know are dropped. */
mt_status mt_copy_out(mt_err err, void *dst, const void *src, size_t src_size, size_t min_size, const char *what);

/* The body of every mt_X_init_sized: writes exactly `size` bytes at p (a
 * caller's struct of that size): the first `size` bytes of `defaults` (the
 * library's struct, `known` bytes; NULL: all zeros), zeros past them, and
 * struct_size = size. NULL p or a size below 4 writes nothing. */
void mt_struct_init(void *p, uint32_t size, const void *defaults, size_t known);

/* Validated copies of the public option structs. mt_config_import is defined
 * in src/model/config.c: its rules depend on the model family. */
mt_status mt_config_import(mt_err err, mt_model_config *dst, const mt_model_config *src);
/* The first byte of c at or past known that differs from mt_model_config_init's defaults (a
 * setting a caller whose struct ends at known could not be given), or sizeof *c if none; and
 * what the fields around a byte of mt_model_config are for ("the sliding window", ...). */
size_t mt_config_first_set_past(const mt_model_config *c, size_t known);
const char *mt_config_field_group(size_t byte);
mt_status mt_policy_import(mt_err err, mt_offload_policy *dst, const mt_offload_policy *src);
mt_status mt_optim_import(mt_err err, mt_optim_config *dst, const mt_optim_config *src);
mt_status mt_shape_import(mt_err err, mt_batch_shape *dst, const mt_batch_shape *src);

/* "1.50 GiB" style formatting into buf (>= 32 bytes); returns buf. */
const char *mt_fmt_bytes(char *buf, size_t size, uint64_t bytes);

#endif
