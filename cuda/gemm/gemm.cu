// cuBLASLt, loaded with dlopen, behind a row-major GEMM. Row-major
// C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T, so B
// goes first: the call sees m = N, n = M, and each row-major operand's
// storage read as column-major is already its transpose.
#include "cuda/gemm/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKSPACE_BYTES (64u << 20)
// Remembered algorithm choices, by shape and operand alignment: an open-addressed table (a power of two)
// filled to three quarters at most. A mixture of experts runs one GEMM per expert with a number of rows
// that changes from step to step, so the distinct shapes number in the thousands, each asked of
// cuBLASLt's heuristic once.
#define CACHE 8192
#define KEY_INTS 12

#define STR2(x) #x
#define STR(x) STR2(x)

struct algo_entry {
    int used;
    int key[KEY_INTS];
    cublasLtMatmulAlgo_t algo;
};

static uint32_t key_hash(const int *key) // FNV-1a over the ints
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < KEY_INTS; i++) h = (h ^ (uint32_t)key[i]) * 16777619u;
    return h;
}

struct mt_gemm {
    void *lib;
    cublasLtHandle_t handle;
    void *workspace;
    // the entry points we use, resolved from the library
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtMatmul) matmul;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    algo_entry cache[CACHE];
    int n_cached;
};

static void say(char *why, size_t len, const char *fmt, const char *a, const char *b)
{
    if (why && len) snprintf(why, len, fmt, a, b);
}

extern "C" size_t mt_gemm_device_bytes(void) { return WORKSPACE_BYTES; }

mt_gemm *mt_gemm_create(char *why, size_t why_len)
{
    const char *name = "libcublasLt.so." STR(CUBLAS_VER_MAJOR);
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        say(why, why_len, "cannot load %s: %s", name, dlerror());
        return NULL;
    }
    mt_gemm *g = (mt_gemm *)calloc(1, sizeof *g);
    if (!g) {
        dlclose(lib);
        say(why, why_len, "%s%s", "out of host memory", "");
        return NULL;
    }
    g->lib = lib;
#define LOAD(field, sym)                                                                                               \
    if (!(*(void **)&g->field = dlsym(lib, #sym))) {                                                                  \
        say(why, why_len, "%s lacks %s", name, #sym);                                                                  \
        mt_gemm_destroy(g);                                                                                            \
        return NULL;                                                                                                   \
    }
    LOAD(create, cublasLtCreate)
    LOAD(destroy, cublasLtDestroy)
    LOAD(matmul, cublasLtMatmul)
    LOAD(desc_create, cublasLtMatmulDescCreate)
    LOAD(desc_destroy, cublasLtMatmulDescDestroy)
    LOAD(desc_set, cublasLtMatmulDescSetAttribute)
    LOAD(layout_create, cublasLtMatrixLayoutCreate)
    LOAD(layout_destroy, cublasLtMatrixLayoutDestroy)
    LOAD(pref_create, cublasLtMatmulPreferenceCreate)
    LOAD(pref_destroy, cublasLtMatmulPreferenceDestroy)
    LOAD(pref_set, cublasLtMatmulPreferenceSetAttribute)
    LOAD(heuristic, cublasLtMatmulAlgoGetHeuristic)
#undef LOAD
    if (g->create(&g->handle) != CUBLAS_STATUS_SUCCESS) {
        g->handle = NULL;
        say(why, why_len, "%s%s", "cublasLtCreate failed", "");
        mt_gemm_destroy(g);
        return NULL;
    }
    if (cudaMalloc(&g->workspace, WORKSPACE_BYTES) != cudaSuccess) {
        cudaGetLastError();
        g->workspace = NULL;
        say(why, why_len, "%s%s", "out of GPU memory for the cuBLASLt workspace", "");
        mt_gemm_destroy(g);
        return NULL;
    }
    return g;
}

extern "C" void mt_gemm_destroy(mt_gemm *g)
{
    if (!g) return;
    if (g->workspace) cudaFree(g->workspace);
    if (g->handle) g->destroy(g->handle);
    if (g->lib) dlclose(g->lib);
    free(g);
}

static cudaDataType_t cuda_type(int t) { return t == MT_GEMM_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// The alignment of p in bytes, at most 256 (what cuBLASLt assumes when not told). Pointers into
// a buffer of rows (the experts' row blocks of a mixture-of-experts layer) may be less aligned, and
// an algorithm chosen for 256-byte operands may not run on them: the heuristic is told, and the
// choice remembered per alignment.
static uint32_t align_of(const void *p)
{
    const uintptr_t u = (uintptr_t)p, a = u & (~u + 1); // the lowest set bit
    return a == 0 || a > 256 ? 256u : (uint32_t)a;
}

extern "C" int mt_gemm_run(mt_gemm *g, void *stream, int transA, int transB, int M, int N, int K, int ab_type,
                           const void *A, const void *B, int c_type, void *C, float beta, const void *bias, char *why,
                           size_t why_len)
{
    // column-major view: D^T[N,M] = opB'[N,K] * opA'[K,M]
    const cublasOperation_t ta = transB ? CUBLAS_OP_T : CUBLAS_OP_N; // first operand: B
    const cublasOperation_t tb = transA ? CUBLAS_OP_T : CUBLAS_OP_N; // second operand: A
    const int lda = transB ? K : N, ldb = transA ? M : K, ldc = N;
    const int rows_a = transB ? K : N, cols_a = transB ? N : K; // B's storage as column-major
    const int rows_b = transA ? M : K, cols_b = transA ? K : M; // A's storage as column-major
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int rc = -1;
    const float alpha = 1.0f;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (g->desc_create(&desc, compute, CUDA_R_32F) || g->desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
        g->desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
        g->desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
        (bias && g->desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) ||
        g->layout_create(&la, cuda_type(ab_type), rows_a, cols_a, lda) ||
        g->layout_create(&lb, cuda_type(ab_type), rows_b, cols_b, ldb) ||
        g->layout_create(&lc, cuda_type(c_type), N, M, ldc)) {
        say(why, why_len, "%s%s", "cuBLASLt refused the matrix descriptions", "");
        goto out;
    }
    {
        const uint32_t al_a = align_of(B), al_b = align_of(A), al_c = align_of(C); // cuBLASLt's A is our B
        const int key[KEY_INTS] = {transA, transB, M, N, K, ab_type, c_type, beta != 0.0f, bias != NULL,
                                   (int)al_a, (int)al_b, (int)al_c};
        cublasLtMatmulAlgo_t *algo = NULL;
        uint32_t slot = key_hash(key) & (CACHE - 1);
        for (; g->cache[slot].used; slot = (slot + 1) & (CACHE - 1)) // ends: the table is never full
            if (!memcmp(g->cache[slot].key, key, sizeof key)) {
                algo = &g->cache[slot].algo;
                break;
            }
        cublasLtMatmulHeuristicResult_t res;
        if (!algo) {
            size_t ws = WORKSPACE_BYTES;
            int found = 0;
            if (g->pref_create(&pref) ||
                g->pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ||
                g->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a) ||
                g->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b) ||
                g->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c) ||
                g->pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c) ||
                g->heuristic(g->handle, desc, la, lb, lc, lc, pref, 1, &res, &found) || found == 0) {
                say(why, why_len, "%s%s", "cuBLASLt has no algorithm for this product", "");
                goto out;
            }
            if (g->n_cached < CACHE / 4 * 3) { // slot is the free one the search ended on
                g->cache[slot].used = 1;
                memcpy(g->cache[slot].key, key, sizeof key);
                g->cache[slot].algo = res.algo;
                algo = &g->cache[slot].algo;
                g->n_cached++;
            } else {
                algo = &res.algo;
            }
        }
        cublasStatus_t s = g->matmul(g->handle, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, algo, g->workspace,
                                     WORKSPACE_BYTES, (cudaStream_t)stream);
        if (s != CUBLAS_STATUS_SUCCESS) {
            char code[16];
            snprintf(code, sizeof code, "%d", (int)s);
            say(why, why_len, "cublasLtMatmul failed with status %s%s", code, "");
            goto out;
        }
        rc = 0;
    }
out:
    if (pref) g->pref_destroy(pref);
    if (lc) g->layout_destroy(lc);
    if (lb) g->layout_destroy(lb);
    if (la) g->layout_destroy(la);
    if (desc) g->desc_destroy(desc);
    return rc;
}
