/* Matrix products on the GPU through cuBLASLt, row-major, with fp32
 * accumulation. cuBLASLt is loaded at run time (dlopen), so the library
 * loads and serves the CPU backend on machines without it. Plain C: the
 * backend and the tests include this without CUDA headers. */
#ifndef MT_CUDA_GEMM_H
#define MT_CUDA_GEMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { MT_GEMM_BF16 = 0, MT_GEMM_F32 = 1 };

typedef struct mt_gemm mt_gemm;

/* Loads cuBLASLt and creates its handle and a workspace on the current
 * device; NULL with the reason in why when it cannot. */
mt_gemm *mt_gemm_create(char *why, size_t why_len);
void mt_gemm_destroy(mt_gemm *g); /* NULL ok */
/* Device memory a handle holds (its workspace), for GPU budgets. */
size_t mt_gemm_device_bytes(void);

/* C[M,N] = op(A)[M,K] op(B)[K,N] (+ bias[N] per row) + beta * C, row-major:
 *   op(A) = A stored [M,K], or with transA A stored [K,M] transposed;
 *   op(B) = B stored [K,N], or with transB B stored [N,K] transposed.
 * A and B are ab_type (bf16 or fp32), C and the bias c_type; fp32 compute.
 * Returns 0, or -1 with a message in why (may be NULL). */
int mt_gemm_run(mt_gemm *g, void *stream, int transA, int transB, int M, int N, int K, int ab_type, const void *A,
                const void *B, int c_type, void *C, float beta, const void *bias, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
