// The experts' products through cublasGemmGroupedBatchedEx, loaded with dlopen.
//
// Each expert with rows is a group of one problem. The call takes the
// problems' sizes from host arrays (built here from the host offsets) and
// their operand pointers from device arrays: a one-block kernel writes those
// from the same offsets on the device (the copy the host offsets were read
// from), so nothing crosses to the device for a call and the host never
// waits. Row-major products as cuda/gemm/gemm.cu maps them: row-major
// C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T, B first.
#include "cuda/gemm/grouped_blas.h"

#include <cublas_api.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)

enum { OP_FWD, OP_DX, OP_DW };

struct mt_gblas {
    void *lib;
    cublasHandle_t handle;
    void **ptrs; // device: 3 x max_groups pointers (first operand, second, output), the caller's memory
    int max_groups;
    // the groups' sizes and scalars on the host (max_groups each)
    int *m, *n, *k, *lda, *ldb, *ldc, *size, *exp;
    float *alpha, *beta;
    cublasOperation_t *ta, *tb;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetWorkspace_v2) set_workspace;
    decltype(&cublasGemmGroupedBatchedEx) grouped;
};

static void say(char *why, size_t len, const char *fmt, const char *a)
{
    if (why && len) snprintf(why, len, fmt, a);
}

extern "C" size_t mt_gblas_ptr_bytes(int max_groups) { return (size_t)3 * (size_t)max_groups * sizeof(void *); }

extern "C" mt_gblas *mt_gblas_create(void *ptrs, int max_groups, void *workspace, size_t ws_bytes, char *why,
                                     size_t why_len)
{
    const char *name = "libcublas.so." STR(CUBLAS_VER_MAJOR);
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        say(why, why_len, "cannot load %s", name);
        return NULL;
    }
    mt_gblas *g = (mt_gblas *)calloc(1, sizeof *g);
    const size_t mg = (size_t)(max_groups > 0 ? max_groups : 1);
    int *ints = (int *)calloc(8 * mg, sizeof(int));
    float *fl = (float *)calloc(2 * mg, sizeof(float));
    cublasOperation_t *ops = (cublasOperation_t *)calloc(2 * mg, sizeof *ops);
    if (!g || !ints || !fl || !ops) {
        free(g), free(ints), free(fl), free(ops);
        dlclose(lib);
        say(why, why_len, "%s", "out of host memory");
        return NULL;
    }
    g->lib = lib;
    g->ptrs = (void **)ptrs;
    g->max_groups = (int)mg;
    g->m = ints, g->n = ints + mg, g->k = ints + 2 * mg, g->lda = ints + 3 * mg, g->ldb = ints + 4 * mg;
    g->ldc = ints + 5 * mg, g->size = ints + 6 * mg, g->exp = ints + 7 * mg;
    g->alpha = fl, g->beta = fl + mg;
    g->ta = ops, g->tb = ops + mg;
#define LOAD(field, sym)                                                                                               \
    if (!(*(void **)&g->field = dlsym(lib, #sym))) {                                                                  \
        say(why, why_len, "cuBLAS lacks " #sym "%s", "");                                                              \
        mt_gblas_destroy(g);                                                                                           \
        return NULL;                                                                                                   \
    }
    LOAD(create, cublasCreate_v2)
    LOAD(destroy, cublasDestroy_v2)
    LOAD(set_stream, cublasSetStream_v2)
    LOAD(set_workspace, cublasSetWorkspace_v2)
    LOAD(grouped, cublasGemmGroupedBatchedEx)
#undef LOAD
    if (g->create(&g->handle) != CUBLAS_STATUS_SUCCESS) {
        g->handle = NULL;
        say(why, why_len, "%s", "cublasCreate failed");
        mt_gblas_destroy(g);
        return NULL;
    }
    // its own workspace, so that cuBLAS allocates nothing behind the memory plan's back
    if (g->set_workspace(g->handle, workspace, ws_bytes) != CUBLAS_STATUS_SUCCESS) {
        say(why, why_len, "%s", "cublasSetWorkspace failed");
        mt_gblas_destroy(g);
        return NULL;
    }
    return g;
}

extern "C" void mt_gblas_destroy(mt_gblas *g)
{
    if (!g) return;
    if (g->handle) g->destroy(g->handle);
    if (g->lib) dlclose(g->lib);
    free(g->m), free(g->alpha), free(g->ta);
    free(g);
}

// CUDA kernels

// The groups' operand pointers from the device offsets: expert e with rows (clamped as the host clamps
// them) is group i, i the number of experts with rows before it, exactly the host's list. One block of
// 1024 threads, E <= 1024; each thread scans a share of the experts.
struct ptr_args {
    const char *x, *W; // the operand with routed rows, the stacked weights or second routed operand
    char *out;
    size_t x_row, w_expert, w_row, out_row, out_expert; // bytes
    int op;
};

__global__ void fill_ptrs(void **ptrs, int max_groups, const int32_t *offs, int E, int R, ptr_args a)
{
    __shared__ int count[1024];
    const int t = threadIdx.x;
    int has = 0;
    if (t < E) {
        const int lo = min(max(offs[t], 0), R), hi = min(max(offs[t + 1], lo), R);
        has = hi > lo;
    }
    count[t] = has;
    __syncthreads();
    for (int s = 1; s < 1024; s <<= 1) { // inclusive scan (Hillis-Steele)
        const int v = t >= s ? count[t - s] : 0;
        __syncthreads();
        count[t] += v;
        __syncthreads();
    }
    if (!has) return;
    const int i = count[t] - 1;
    if (i >= max_groups) return;
    const int lo = min(max(offs[t], 0), R);
    const char *first, *second;
    char *out;
    if (a.op == OP_DW) { // column-major: x_e first, dy_e second, dW_e out
        first = a.W + (size_t)lo * a.w_row;
        second = a.x + (size_t)lo * a.x_row;
        out = a.out + (size_t)t * a.out_expert;
    } else { // W_e first, the routed rows second
        first = a.W + (size_t)t * a.w_expert;
        second = a.x + (size_t)lo * a.x_row;
        out = a.out + (size_t)lo * a.out_row;
    }
    ptrs[i] = (void *)first;
    ptrs[max_groups + i] = (void *)second;
    ptrs[2 * max_groups + i] = (void *)out;
}

// kernel launchers

// The groups of one product: host sizes from offs_h, device pointers from offs_d (the same offsets).
static int run(mt_gblas *g, void *stream, int op, void *out, int out_f32, const void *rows_op, const void *other,
               const int32_t *offs_h, const int32_t *offs_d, int E, int R, int K, int N, float beta, char *why,
               size_t why_len)
{
    if (E <= 0 || E > g->max_groups || E > 1024) {
        say(why, why_len, "%s", "cuBLAS grouped GEMM: more experts than the call was made for");
        return -1;
    }
    int n_groups = 0;
    for (int e = 0; e < E; e++) {
        const int lo = offs_h[e] < 0 ? 0 : offs_h[e] > R ? R : offs_h[e];
        int hi = offs_h[e + 1] < lo ? lo : offs_h[e + 1];
        hi = hi > R ? R : hi;
        if (hi <= lo) continue;
        const int i = n_groups++, rows = hi - lo;
        g->exp[i] = e;
        g->size[i] = 1, g->alpha[i] = 1.0f, g->beta[i] = beta;
        if (op == OP_FWD) { // y^T (N, rows) = W_e (K, N)^T x^T (K, rows)
            g->ta[i] = CUBLAS_OP_T, g->tb[i] = CUBLAS_OP_N;
            g->m[i] = N, g->n[i] = rows, g->k[i] = K, g->lda[i] = K, g->ldb[i] = K, g->ldc[i] = N;
        } else if (op == OP_DX) { // dx^T (K, rows) = W_e (K, N) dy^T (N, rows)
            g->ta[i] = CUBLAS_OP_N, g->tb[i] = CUBLAS_OP_N;
            g->m[i] = K, g->n[i] = rows, g->k[i] = N, g->lda[i] = K, g->ldb[i] = N, g->ldc[i] = K;
        } else { // dW_e^T (K, N) += x_e^T (K, rows) dy_e (rows, N)
            g->ta[i] = CUBLAS_OP_N, g->tb[i] = CUBLAS_OP_T;
            g->m[i] = K, g->n[i] = N, g->k[i] = rows, g->lda[i] = K, g->ldb[i] = N, g->ldc[i] = K;
        }
    }
    if (!n_groups) return 0;
    const size_t ys = out_f32 ? 4 : 2;
    ptr_args a;
    a.op = op;
    a.out = (char *)out;
    if (op == OP_DW) { // rows_op: dy (R, N); other: x (R, K)
        a.x = (const char *)rows_op, a.x_row = (size_t)N * 2;
        a.W = (const char *)other, a.w_row = (size_t)K * 2, a.w_expert = 0;
        a.out_row = 0, a.out_expert = (size_t)N * K * 4;
    } else { // rows_op: x (R, K) or dy (R, N); other: W (E, N, K)
        a.x = (const char *)rows_op, a.x_row = (size_t)(op == OP_FWD ? K : N) * 2;
        a.W = (const char *)other, a.w_expert = (size_t)N * K * 2, a.w_row = 0;
        a.out_row = (size_t)(op == OP_FWD ? N : K) * ys, a.out_expert = 0;
    }
    cudaStream_t s = (cudaStream_t)stream;
    fill_ptrs<<<1, 1024, 0, s>>>(g->ptrs, g->max_groups, offs_d, E, R, a);
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess) {
        say(why, why_len, "cuBLAS grouped GEMM: its pointers' kernel failed: %s", cudaGetErrorString(ce));
        return -1;
    }
    const cudaDataType_t ct = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    void *const *P = g->ptrs;
    cublasStatus_t st = g->set_stream(g->handle, s);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->grouped(g->handle, g->ta, g->tb, g->m, g->n, g->k, g->alpha, (const void *const *)P, CUDA_R_16BF, g->lda,
                        (const void *const *)(P + g->max_groups), CUDA_R_16BF, g->ldb, g->beta,
                        (void *const *)(P + 2 * g->max_groups), ct, g->ldc, n_groups, g->size, CUBLAS_COMPUTE_32F);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char code[48];
        snprintf(code, sizeof code, "%d", (int)st);
        say(why, why_len, "cublasGemmGroupedBatchedEx failed with status %s", code);
        return -1;
    }
    return 0;
}

extern "C" int mt_gblas_linear(mt_gblas *g, void *stream, void *y, int out_f32, const void *x, const void *W,
                               const int32_t *offs_h, const int32_t *offs_d, int E, int R, int K, int N,
                               int accumulate, char *why, size_t why_len)
{
    return run(g, stream, OP_FWD, y, out_f32, x, W, offs_h, offs_d, E, R, K, N, accumulate ? 1.0f : 0.0f, why,
               why_len);
}

extern "C" int mt_gblas_linear_dx(mt_gblas *g, void *stream, void *dx, int out_f32, const void *dy, const void *W,
                                  const int32_t *offs_h, const int32_t *offs_d, int E, int R, int K, int N,
                                  int accumulate, char *why, size_t why_len)
{
    return run(g, stream, OP_DX, dx, out_f32, dy, W, offs_h, offs_d, E, R, K, N, accumulate ? 1.0f : 0.0f, why,
               why_len);
}

extern "C" int mt_gblas_linear_dw(mt_gblas *g, void *stream, float *dW, const void *dy, const void *x,
                                  const int32_t *offs_h, const int32_t *offs_d, int E, int R, int K, int N, char *why,
                                  size_t why_len)
{
    return run(g, stream, OP_DW, dW, 1, dy, x, offs_h, offs_d, E, R, K, N, 1.0f, why, why_len);
}
