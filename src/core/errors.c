/* Status strings, version queries, error messages and logging. */
#include "core/internal.h"

#include <stdio.h>
#include <string.h>

#define MT_STR2(x) #x
#define MT_STR(x) MT_STR2(x)

uint32_t mt_version_number(void) { return MT_VERSION_NUMBER; }

const char *mt_version_string(void)
{
    return MT_STR(MT_VERSION_MAJOR) "." MT_STR(MT_VERSION_MINOR) "." MT_STR(MT_VERSION_PATCH);
}

const char *mt_status_str(mt_status s)
{
    switch (s) {
    case MT_OK: return "success";
    case MT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case MT_ERR_STRUCT_SIZE: return "option struct size not supported by this library version";
    case MT_ERR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case MT_ERR_HOST_BUDGET: return "the memory plan exceeds the host memory budget";
    case MT_ERR_GPU_BUDGET: return "the memory plan exceeds the GPU memory budget";
    case MT_ERR_OUT_OF_GPU_MEMORY: return "out of GPU memory";
    case MT_ERR_NO_DEVICE: return "no usable device for the requested backend";
    case MT_ERR_DEVICE: return "GPU runtime error";
    case MT_ERR_IO: return "I/O error";
    case MT_ERR_FORMAT: return "bad file format";
    case MT_ERR_UNSUPPORTED: return "unsupported";
    case MT_ERR_NONFINITE: return "non-finite loss or gradient";
    case MT_ERR_ABORTED: return "aborted by the caller";
    case MT_ERR_INTERNAL: return "internal error";
    case MT_STATUS_MAX_ENUM: break;
    }
    return "unknown status";
}

/* The one per-thread buffer: messages of calls that have no handle. */
static _Thread_local char tls_errmsg[MT_ERRMSG_MAX];

mt_err mt_err_thread(void) { return (mt_err){tls_errmsg}; }

const char *mt_last_errmsg(void) { return tls_errmsg; }

mt_status mt_fail(mt_err err, mt_status status, const char *fmt, ...)
{
    if (err.buf) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err.buf, MT_ERRMSG_MAX, fmt, ap);
        va_end(ap);
    }
    return status;
}

void mt_err_clear(mt_err err)
{
    if (err.buf) err.buf[0] = '\0';
}

static const char *level_name(mt_log_level level)
{
    switch (level) {
    case MT_LOG_DEBUG: return "debug";
    case MT_LOG_INFO: return "info";
    case MT_LOG_WARN: return "warning";
    case MT_LOG_ERROR: return "error";
    default: return "log";
    }
}

void mt_log(const mt_logger *lg, mt_log_level level, const char *fmt, ...)
{
    if (!lg || level < lg->level) return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (lg->fn)
        lg->fn(level, text, lg->user_data);
    else
        fprintf(stderr, "megatrain %s: %s\n", level_name(level), text);
}

const char *mt_fmt_bytes(char *buf, size_t size, uint64_t bytes)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) { v /= 1024.0; u++; }
    if (u == 0)
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, size, "%.2f %s", v, unit[u]);
    return buf;
}
