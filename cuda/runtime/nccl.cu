// NCCL through dlopen (cuda/runtime/nccl.h).
#include "cuda/runtime/nccl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int nccl_result;                      // ncclResult_t: 0 is ncclSuccess
enum { NCCL_UINT8 = 1, NCCL_FLOAT32 = 7, NCCL_SUM = 0 }; // ncclUint8, ncclFloat32, ncclSum
enum { MIN_VERSION = 21800 };                 // 2.18: ncclCommInitAll, in-place reduce-scatter, async errors

struct mt_nccl {
    void *lib;
    int version;
    nccl_result (*get_version)(int *);
    const char *(*error_string)(nccl_result);
    nccl_result (*comm_init_all)(mt_nccl_comm *, int, const int *);
    nccl_result (*comm_destroy)(mt_nccl_comm);
    nccl_result (*comm_get_async_error)(mt_nccl_comm, nccl_result *);
    nccl_result (*group_start)(void);
    nccl_result (*group_end)(void);
    nccl_result (*reduce_scatter)(const void *, void *, size_t, int, int, mt_nccl_comm, void *);
    nccl_result (*all_gather)(const void *, void *, size_t, int, mt_nccl_comm, void *);
};

static int fail(const mt_nccl *n, nccl_result r, const char *what, char *why, size_t len)
{
    if (why && len) snprintf(why, len, "NCCL %s: %s (%d)", what, n->error_string(r), r);
    return -1;
}

mt_nccl *mt_nccl_open(char *why, size_t why_len)
{
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        if (why && why_len)
            snprintf(why, why_len, "cannot load libnccl.so.2, which training on several GPUs needs (%s)", dlerror());
        return NULL;
    }
    mt_nccl *n = (mt_nccl *)calloc(1, sizeof *n);
    if (!n) {
        dlclose(lib);
        if (why && why_len) snprintf(why, why_len, "out of host memory");
        return NULL;
    }
    n->lib = lib;
    const char *missing = NULL;
#define SYM(field, name)                                                                                                \
    if (!missing && !(*(void **)&n->field = dlsym(lib, name))) missing = name
    SYM(get_version, "ncclGetVersion");
    SYM(error_string, "ncclGetErrorString");
    SYM(comm_init_all, "ncclCommInitAll");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(comm_get_async_error, "ncclCommGetAsyncError");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(reduce_scatter, "ncclReduceScatter");
    SYM(all_gather, "ncclAllGather");
#undef SYM
    if (!missing && n->get_version(&n->version) != 0) missing = "a working ncclGetVersion";
    if (missing || n->version < MIN_VERSION) {
        if (why && why_len) {
            if (missing) snprintf(why, why_len, "libnccl.so.2 lacks %s", missing);
            else snprintf(why, why_len, "libnccl.so.2 is NCCL %d.%d, older than the 2.18 this library needs",
                          n->version / 10000, n->version / 100 % 100);
        }
        mt_nccl_close(n);
        return NULL;
    }
    return n;
}

void mt_nccl_close(mt_nccl *n)
{
    if (!n) return;
    dlclose(n->lib);
    free(n);
}

void mt_nccl_version(const mt_nccl *n, char *buf, size_t len)
{
    snprintf(buf, len, "%d.%d.%d", n->version / 10000, n->version / 100 % 100, n->version % 100);
}

int mt_nccl_comms_init(mt_nccl *n, mt_nccl_comm *comms, int count, const int *devices, char *why,
                                  size_t why_len)
{
    const nccl_result r = n->comm_init_all(comms, count, devices);
    return r ? fail(n, r, "ncclCommInitAll", why, why_len) : 0;
}

void mt_nccl_comm_destroy(mt_nccl *n, mt_nccl_comm comm)
{
    if (n && comm) n->comm_destroy(comm);
}

int mt_nccl_group_begin(mt_nccl *n) { return n->group_start() ? -1 : 0; }

int mt_nccl_group_end(mt_nccl *n, char *why, size_t why_len)
{
    const nccl_result r = n->group_end();
    return r ? fail(n, r, "ncclGroupEnd", why, why_len) : 0;
}

int mt_nccl_reduce_scatter_f32(mt_nccl *n, float *buf, size_t count, int rank, mt_nccl_comm comm,
                                          void *stream, char *why, size_t why_len)
{
    const nccl_result r = n->reduce_scatter(buf, buf + (size_t)rank * count, count, NCCL_FLOAT32, NCCL_SUM, comm, stream);
    return r ? fail(n, r, "ncclReduceScatter", why, why_len) : 0;
}

int mt_nccl_async_error(mt_nccl *n, mt_nccl_comm comm, char *why, size_t why_len)
{
    nccl_result a = 0;
    const nccl_result r = n->comm_get_async_error(comm, &a);
    if (r) return fail(n, r, "ncclCommGetAsyncError", why, why_len);
    return a ? fail(n, a, "communicator", why, why_len) : 0;
}

int mt_nccl_all_gather_u8(mt_nccl *n, void *buf, size_t count, int rank, mt_nccl_comm comm, void *stream, char *why,
                          size_t why_len)
{
    const nccl_result r = n->all_gather((const char *)buf + (size_t)rank * count, buf, count, NCCL_UINT8, comm, stream);
    return r ? fail(n, r, "ncclAllGather", why, why_len) : 0;
}
