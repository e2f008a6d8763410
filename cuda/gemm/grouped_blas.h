/* The experts' products of a mixture-of-experts layer through cuBLAS's
 * grouped GEMM (cublasGemmGroupedBatchedEx): one call for every expert with
 * rows, each expert a group of one problem, row-major as cuda/gemm/gemm.h.
 * The row counts come from offsets on the host (E + 1, each expert's first
 * routed row), which is what the call takes: the backend has them in the
 * backward from the forward's routing, copied while the forward ran.
 * cuBLAS is loaded at run time (dlopen), as cuBLASLt is. Plain C.
 *
 * The caller gives the device memory: room for the groups' operand
 * pointers (mt_gblas_ptr_bytes) and cuBLAS's workspace. */
#ifndef MT_CUDA_GROUPED_BLAS_H
#define MT_CUDA_GROUPED_BLAS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_gblas mt_gblas;

/* Loads cuBLAS, creates its handle on the current device; ptrs (device,
 * mt_gblas_ptr_bytes(max_groups)) and workspace (device, ws_bytes) stay the
 * caller's. NULL with the reason in why when it cannot. */
mt_gblas *mt_gblas_create(void *ptrs, int max_groups, void *workspace, size_t ws_bytes, char *why, size_t why_len);
void mt_gblas_destroy(mt_gblas *g); /* NULL ok */
size_t mt_gblas_ptr_bytes(int max_groups);
/* The workspace the backend gives it (cuBLAS's recommendation for Hopper). */
#define MT_GBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

/* All bf16 operands, fp32 accumulation; offs_h the host offsets (E + 1),
 * offs_d the same offsets on the device (they must be equal: the sizes
 * come from the one, the operands' pointers from the other), each expert's
 * rows clamped to [0, R]; E at most 1024. The products as moe_linear's:
 *   y[r, :N]  = x[r, :K] W_e^T (+ y)       y bf16 or fp32 (out_f32)
 *   dx[r, :K] = dy[r, :N] W_e (+ dx)       dx bf16 or fp32
 *   dW_e     += dy_e^T x_e                 dW fp32 (E, N, K)
 * W is (E, N, K). Returns 0, or -1 with a message in why. */
int mt_gblas_linear(mt_gblas *g, void *stream, void *y, int out_f32, const void *x, const void *W,
                    const int32_t *offs_h, const int32_t *offs_d, int E, int R, int K, int N, int accumulate,
                    char *why, size_t why_len);
int mt_gblas_linear_dx(mt_gblas *g, void *stream, void *dx, int out_f32, const void *dy, const void *W,
                       const int32_t *offs_h, const int32_t *offs_d, int E, int R, int K, int N, int accumulate,
                       char *why, size_t why_len);
int mt_gblas_linear_dw(mt_gblas *g, void *stream, float *dW, const void *dy, const void *x, const int32_t *offs_h,
                       const int32_t *offs_d, int E, int R, int K, int N, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
