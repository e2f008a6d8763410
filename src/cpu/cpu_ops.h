/* The CPU backend's layer operations: fp32, row-major, forward and backward.
 *
 * Shapes: B batch, S sequence, T = B*S tokens, C hidden, H query heads, Hkv
 * key/value heads (H % Hkv == 0; query head h reads kv head h / (H/Hkv)), D
 * head dim, F MLP width, V vocab. Activations are [T, ...] row-major; q is
 * [B,S,H,D] (the [T, H*D] output of a matmul), k and v are [B,S,Hkv,D].
 * Weights use the nn.Linear layout W[N_out, K_in].
 *
 * Determinism: every output element is computed by one task, with a
 * reduction order fixed by the shapes alone, so results are bit-identical
 * from run to run and for any number of threads in the pool (pool may be
 * NULL: serial). They may differ between CPUs of different instruction sets
 * (the GEMM kernels use fused multiply-adds where the CPU has them; the
 * other ops give the same bits everywhere). The softmaxes, the cross-entropy
 * and SwiGLU use a vectorized expf within 2 ulp of exp.
 *
 * Scratch: the matmuls and the attention take `ws`, caller-owned scratch of
 * at least mt_cpu_ws_size(mt_pool_size(p), S) bytes, any alignment. Its
 * contents are garbage before and after a call; one ws must not serve two
 * calls at the same time. No op allocates memory, none can fail. */
#ifndef MT_CPU_OPS_H
#define MT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "model/rope.h"

/* ---- scratch ------------------------------------------------------------ */

/* Bytes of ws the ops need with a pool of n_threads threads (mt_pool_size)
 * and attention over sequences of at most S positions (0 when the
 * attention ops are not used): 544 KiB per thread for the GEMM, plus
 * 2 * 48 * S floats per thread for the attention. */
size_t mt_cpu_ws_size(int n_threads, int S);

/* The layout inside ws: its start rounded up to 64 bytes, then one region
 * per thread, which begins with the GEMM's packing buffers (this many bytes,
 * a multiple of 64). */
size_t mt_cpu_gemm_ws_bytes(void);
static inline float *mt_cpu_ws_align(void *ws) { return (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63); }

/* ---- GEMM (cpu_gemm.c) ---------------------------------------------------- */

/* C[M,N] = (accumulate ? C : 0) + (bias ? bias[n] : 0) + op(A)[M,K] @ op(B)[K,N]
 *   op(A) = A, stored [M, K] with row stride lda,   or if transA: A^T, A stored [K, M];
 *   op(B) = B, stored [K, N] with row stride ldb,   or if transB: B^T, B stored [N, K];
 *   C stored [M, N] with row stride ldc.
 * Each C element sums its products in ascending k, in chunks of a fixed
 * length, whatever the tiling or the threads. ws as above (only the GEMM
 * part is used: mt_cpu_ws_size(n_threads, 0)). */
void mt_cpu_gemm(mt_pool *p, void *ws, int transA, int transB, int M, int N, int K, const float *A, size_t lda,
                 const float *B, size_t ldb, float *C, size_t ldc, const float *bias, int accumulate);

/* The GEMM micro-kernels. mt_cpu_gemm, and every op below, uses the best the
 * CPU supports (mt_cpu_isa_best). Tests and benchmarks pick a lower one per
 * call with the *_isa forms of the GEMM and the linear layers, which run
 * min(isa, mt_cpu_isa_best()): a kernel the CPU lacks is never run. */
typedef enum mt_cpu_isa { MT_CPU_ISA_GENERIC = 0, MT_CPU_ISA_AVX2 = 1, MT_CPU_ISA_AVX512 = 2 } mt_cpu_isa;
mt_cpu_isa mt_cpu_isa_best(void);
void mt_cpu_gemm_isa(mt_pool *p, void *ws, mt_cpu_isa isa, int transA, int transB, int M, int N, int K,
                     const float *A, size_t lda, const float *B, size_t ldb, float *C, size_t ldc, const float *bias,
                     int accumulate);

/* ---- linear layers -------------------------------------------------------- */

/* y[T,N] = x[T,K] @ W[N,K]^T (+ b[N] if b); accumulate != 0: y += instead of =.
 * y (T, N), x (T, K), W (N, K), b (N) or NULL */
void mt_cpu_matmul(mt_pool *p, void *ws, float *y, const float *x, const float *W, const float *b, int T, int K,
                   int N, int accumulate);
/* The same with the GEMM micro-kernel of min(isa, mt_cpu_isa_best()). */
void mt_cpu_matmul_isa(mt_pool *p, void *ws, mt_cpu_isa isa, float *y, const float *x, const float *W, const float *b,
                       int T, int K, int N, int accumulate);

/* dx = (or += if dx_accumulate) dy @ W;  dW += dy^T @ x;  db += sum over t of dy.
 * dx (T, K), dW (N, K), db (N), dy (T, N), x (T, K), W (N, K). Any of dx, dW,
 * db may be NULL (then x or W may be NULL too where unused). */
void mt_cpu_matmul_bwd(mt_pool *p, void *ws, float *dx, float *dW, float *db, const float *dy, const float *x,
                       const float *W, int T, int K, int N, int dx_accumulate);
void mt_cpu_matmul_bwd_isa(mt_pool *p, void *ws, mt_cpu_isa isa, float *dx, float *dW, float *db, const float *dy,
                           const float *x, const float *W, int T, int K, int N, int dx_accumulate);

/* ---- RMSNorm ------------------------------------------------------------------ */

/* y = x * rsqrt(mean(x^2) + eps) * (woff + w), as Hugging Face's LlamaRMSNorm
 * (woff 0) and GemmaRMSNorm (woff 1) in fp32 (the mean of squares accumulated
 * in double).
 * y (T, C), rstd (T) = rsqrt(mean(x^2) + eps), saved if not NULL, x (T, C), w (C) */
void mt_cpu_rmsnorm(mt_pool *p, float *y, float *rstd, const float *x, const float *w, int T, int C, float eps,
                    float woff);

/* dx += d(loss)/dx, dw += d(loss)/dw (dx must not alias dy).
 * dx (T, C), dw (C), dy (T, C), x (T, C), w (C), rstd (T) from the forward or
 * NULL (recomputed). */
void mt_cpu_rmsnorm_bwd(mt_pool *p, float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, int T, int C, float eps, float woff);

/* ---- rotary position embedding ---------------------------------------------- */

/* RoPE with Hugging Face's rotate_half convention on the first rd dimensions
 * of each head (dimension i pairs with i + rd/2; the rest pass), in place: for
 * i < rd/2, a = (float)pos[t] * inv_freq[i], c = cos a * scale, s = sin a * scale,
 *   x[i] <- x[i] c - x[i+rd/2] s,   x[i+rd/2] <- x[i+rd/2] c + x[i] s.
 * scale: 1, or yarn's and longrope's attention factor (transformers multiplies
 * cos and sin by it). inverse != 0 rotates by -a: the transpose, that is the
 * backward. x (T, nh, D), pos (T), inv_freq (rd/2); rd even, <= D. */
void mt_cpu_rope(mt_pool *p, float *x, const int32_t *pos, const float *inv_freq, int T, int nh, int D, int rd,
                 float scale, int inverse);
/* The same on dimensions off .. off + rd - 1 of each head (multi-head latent
 * attention: the part of a head after its unrotated qk_nope_head_dim), in
 * pairs (off + i, off + i + rd/2), or where interleaved (off + 2i, off + 2i + 1),
 * pair i turning by inv_freq[i] in both; off + rd <= D. Off 0 and not
 * interleaved is mt_cpu_rope, bit for bit. */
void mt_cpu_rope_at(mt_pool *p, float *x, const int32_t *pos, const float *inv_freq, int T, int nh, int D, int off,
                    int rd, int interleaved, float scale, int inverse);


/* ---- attention -------------------------------------------------------------- */

/* Causal self-attention with grouped-query heads:
 *   out[b,i,h] = sum_{j<=i} softmax_j(scale * q[b,i,h] . k[b,j,h/(H/Hkv)]) v[b,j,h/(H/Hkv)]
 * out (B, S, H, D), lse (B, H, S) = log-sum-exp of each query row's scaled
 * scores, kept for the backward; q (B, S, H, D), k, v (B, S, Hkv, D); scale > 0
 * (1/sqrt(D) in Llama).
 * Parallel over (b, h, block of 48 queries). Memory is linear in S: blocks of
 * 48 query rows against their keys, in ws. */
void mt_cpu_attention(mt_pool *p, void *ws, float *out, float *lse, const float *q, const float *k, const float *v,
                      int B, int S, int H, int Hkv, int D, float scale);

/* The backward, flash-attention style from out and lse (D_i = rowsum(dout * out)).
 * dq (B, S, H, D), dk, dv (B, S, Hkv, D): overwritten; dout, out (B, S, H, D),
 * lse (B, H, S) from the forward. Parallel over (b, kv head): each task owns
 * its dk and dv rows and sums the query heads of its group in order. */
void mt_cpu_attention_bwd(mt_pool *p, void *ws, float *dq, float *dk, float *dv, const float *dout, const float *out,
                          const float *lse, const float *q, const float *k, const float *v, int B, int S, int H,
                          int Hkv, int D, float scale);

/* Both with documents packed into each sequence: doc_start (B, S) gives, for
 * each token, the index in its sequence of its document's first token
 * (nondecreasing along the sequence, doc_start[i] <= i), and query i sees the
 * keys [doc_start[i], i]. NULL: one document per sequence, as above.
 * softcap > 0: each score u = scale q.k becomes softcap * tanh(u / softcap)
 * before the softmax (Gemma 2), and the backward goes through it; 0: none. */
void mt_cpu_attention_docs(mt_pool *p, void *ws, float *out, float *lse, const float *q, const float *k,
                           const float *v, const int32_t *doc_start, int B, int S, int H, int Hkv, int D, float scale,
                           float softcap);
void mt_cpu_attention_bwd_docs(mt_pool *p, void *ws, float *dq, float *dk, float *dv, const float *dout,
                               const float *out, const float *lse, const float *q, const float *k, const float *v,
                               const int32_t *doc_start, int B, int S, int H, int Hkv, int D, float scale,
                               float softcap);

/* Attention sinks (template.h's attn_sink): out (B, S, H, D) *= 1 / (1 + exp(sinks[h] - lse)) and
 * lse (B, H, S) = log(exp(lse) + exp(sinks[h])); the backward adds to dsink (H) -sum over b, s of
 * exp(sinks[h] - lse) dot(dout, out) for each head, from the out and lse the forward left. */
void mt_cpu_attn_sink(float *out, float *lse, const float *sinks, int B, int S, int H, int D);
void mt_cpu_attn_sink_bwd(float *dsink, const float *dout, const float *out, const float *lse, const float *sinks,
                          int B, int S, int H, int D);

/* Llama 4's attention temperature (template.h's attn_temperature), in place: row t of x (T, n) times
 * f(t % seq_len), f(i) = 1 + scale * log1p(floor((i + 1) / floor_scale)) in fp32 as transformers writes
 * it: p = (float)i + 1, q = floorf(p / floor_scale), f = L(q) * scale + 1.0f with each step rounded to
 * fp32, where L(q) is log1p(q) rounded once to fp32 (computed in double, then rounded: for every integer
 * q < 2^24 the double is at least 5 double ulps from an fp32 rounding boundary, so this is the correctly
 * rounded log1pf, within 1 ulp of any libm's log1pf, and the CUDA kernel gets the same bits). Then each
 * element x * f, one fp32 product. Linear in x: the backward is the same call on the gradient. */
float mt_cpu_attn_temperature_factor(int i, float floor_scale, float scale);
void mt_cpu_attn_temperature(mt_pool *p, float *x, int T, int seq_len, int n, float floor_scale, float scale);

/* ---- elementwise, embedding, loss ------------------------------------------- */

/* out = act(gate) * up, act (template.h's mt_glu_act) MT_GLU_SILU, silu(g) = g / (1 + exp(-g)),
 * or MT_GLU_GELU_TANH, gelu's tanh form as torch's gelu(approximate="tanh") (Gemma's
 * gelu_pytorch_tanh), or MT_GLU_GPTOSS, (clamp(up, -7, 7) + 1) * g sigmoid(1.702 g) with
 * g = min(gate, 7); any other value is taken as MT_GLU_SILU.  out, gate, up (n) */
void mt_cpu_glu(mt_pool *p, int act, float *out, const float *gate, const float *up, size_t n);
/* dgate = dout * up * act'(gate), dup = dout * act(gate): dgate, dup (n) overwritten; dout, gate, up (n) */
void mt_cpu_glu_bwd(mt_pool *p, int act, float *dgate, float *dup, const float *dout, const float *gate,
                    const float *up, size_t n);

/* x = cap * tanh(x / cap) in place (serial; the logits of the last positions).  x (n) */
void mt_cpu_softcap(float *x, size_t n, float cap);

/* out[t,:] = wte[tokens[t], :] * scale.  out (T, C), tokens (T) in [0, V), wte (V, C) */
void mt_cpu_embedding(mt_pool *p, float *out, const int32_t *tokens, const float *wte, int T, int C, float scale);
/* dwte[tokens[t], :] += dout[t, :] * scale, summed in ascending t for every row, skipping the t whose
 * token is pad (nn.Embedding's padding_idx; -1: none).  dwte (V, C), tokens (T), dout (T, C) */
void mt_cpu_embedding_bwd(mt_pool *p, float *dwte, const int32_t *tokens, const float *dout, int T, int C, int V,
                          float scale, int pad);

/* Cross-entropy on n rows of logits, in place: on return logits holds
 * dlogits = (softmax - onehot(target)) * dscale, zeros in the rows whose
 * target is ignore_index. softcap > 0: the logits are first capped,
 * softcap * tanh(logit / softcap), and dlogits is through the cap. Returns the sum over the other rows of
 * logsumexp - logit[target], accumulated in double in row order; *count
 * (if not NULL) receives their number. Targets must be ignore_index or in
 * [0, V) (the caller validates). logits (n, V), targets (n) */
double mt_cpu_cross_entropy(mt_pool *p, float *logits, const int32_t *targets, int n, int V, float dscale,
                            float softcap, int ignore_index, int *count);

/* y = a + b (y may alias a or b).  y, a, b (n) */
void mt_cpu_add(mt_pool *p, float *y, const float *a, const float *b, size_t n);

/* Columns between row-major matrices: dst[r, doff + j] = src[r / rep, soff + j]
 * for r < rows, j < w (rep 1: row for row; rep n: each src row n times).
 * Rows are dld and sld floats apart; dst must not overlap src. A plain copy
 * (template.h's copy_cols). */
void mt_cpu_copy_cols(mt_pool *p, float *dst, int dld, int doff, const float *src, int sld, int soff, int rows, int w,
                      int rep);
/* Its backward for rep n: dst[r, doff + j] = the sum over i < n of
 * src[r * n + i, soff + j], added in fp32 in ascending i from 0 (template.h's
 * sum_cols); dst must not overlap src. */
void mt_cpu_sum_cols(mt_pool *p, float *dst, int dld, int doff, const float *src, int sld, int soff, int rows, int w,
                     int n);

/* y = x with a change of precision: each of y and x is bf16 (uint16_t) when
 * its flag is set, else fp32; fp32 to bf16 rounds to nearest even.  y, x (n) */
void mt_cpu_convert(mt_pool *p, void *y, int y_bf16, const void *x, int x_bf16, size_t n);

#endif
