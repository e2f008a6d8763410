/* The CUDA backend's own kernels (everything but the GEMMs and attention):
 * RMSNorm, RoPE, the gated activations (SwiGLU, GeGLU, GPT-OSS's clamped
 * SwiGLU), attention sinks, embedding, cross-entropy (with soft-caps),
 * elementwise helpers, the column moves of multi-head latent attention and
 * deterministic reductions. A plain C API, so host code and tests include it
 * without the CUDA headers; the kernels are in cuda/kernels/kernels.cu. See docs/cuda-kernels.md for the design and the
 * measured bandwidth.
 *
 * Conventions
 * - Shapes as in src/cpu/cpu_ops.h: T tokens, C hidden, nh heads of D, V vocab.
 *   Tensors are row-major and dense; device pointers unless said otherwise.
 * - Activations (and the weights read from a weight slot) are in an
 *   mt_cu_dtype: bf16 (the default mode) or fp32 (the reference mode).
 *   Kernels load them, compute in fp32 (row statistics and losses in
 *   double), and round once on store (bf16: round to nearest even).
 * - Always fp32: the gradient of the residual stream (dx of RMSNorm, dout of
 *   the embedding), weight-gradient accumulators (dw, db, dwte), rstd,
 *   logits. Gradients that feed a GEMM as its A or B operand (SwiGLU's dgate
 *   and dup, dlogits) are in the activation dtype.
 * - Every launcher takes its stream explicitly (NULL: the legacy default
 *   stream), enqueues asynchronously, checks the launch with
 *   cudaGetLastError and returns 0, or -1 on bad arguments or a launch
 *   error. None aborts, prints or allocates; reductions take caller-owned
 *   device scratch of at least the size the matching *_scratch_bytes
 *   function gives (any alignment; its contents are garbage before and after;
 *   one scratch must not serve two calls that may run at the same time).
 * - Reductions (rmsnorm dw, bias gradient, embedding gradient, loss, sum of
 *   squares, the sinks' gradient) use no floating-point atomics: partial
 *   sums are combined in an order fixed by the shapes, so results are
 *   bit-identical run to run (the sinks' gradient, one thread-block cluster
 *   per head, needs no scratch).
 * - Vectorised paths (16-byte accesses) are taken when the pointers are
 *   16-byte aligned and the row lengths multiples of 8 (4 for the fp32
 *   logits); otherwise the same kernels run element by element.
 *
 * Device memory, copies and synchronisation are the device layer's
 * (src/device/device.h): mt_device_malloc, mt_device_copy_h2d, mt_device_sync.
 *
 * When the library is built without CUDA (CUDA=0) this header supplies
 * stand-ins that fail every call, so callers (tests) compile unchanged. */
#ifndef MT_CUDA_KERNELS_H
#define MT_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *mt_cu_stream; /* the same type as cudaStream_t */

typedef enum mt_cu_dtype { MT_CU_BF16 = 0, MT_CU_F32 = 1 } mt_cu_dtype;

/* ---- tuning (for benchmarks and tests) ---------------------------------------
 * Variants of a few kernels, chosen per call: the launchers that have
 * variants (mt_cu_rmsnorm, mt_cu_rmsnorm_bwd and its scratch size,
 * mt_cu_cross_entropy) take a const mt_cu_tuning *, NULL for the defaults
 * (what the library itself uses). A variant keeps results within the
 * tolerances of tests/test_cuda_kernels.c but may change the bits of a
 * reduction. Fill a struct with mt_cu_tuning_default (or
 * MT_CU_TUNING_DEFAULT), then change it with mt_cu_tuning_set, which checks
 * the value; a struct with a value it would refuse makes the launchers fail
 * (-1) and the scratch sizes 0. The scratch of mt_cu_rmsnorm_bwd depends on
 * RMS_BWD_CHUNKS: ask for its size with the tuning the calls will use. */
typedef enum mt_cu_knob {
    MT_CU_TUNE_DEFAULTS = 0,         /* every field back to its default (value ignored) */
    MT_CU_TUNE_RMS_FWD_EMIN = 1,     /* RMSNorm forward: at least this many 8-wide accesses per thread (1, 2, 4; default 2) */
    MT_CU_TUNE_RMS_BWD_EMIN = 2,     /* the same for the backward (default 1) */
    MT_CU_TUNE_RMS_BWD_PREFETCH = 3, /* backward: dx loaded with x and dy (default 0) */
    MT_CU_TUNE_RMS_BWD_CHUNKS = 4,   /* backward: at most this many row chunks, i.e. dw partials (>= 1, default 512),
                                      * for rows of 2048 or more; rows of C < 2048 get 2048 / C times as many */
    MT_CU_TUNE_CE_THREADS = 5,       /* cross-entropy: threads per row (32..1024, multiples of 32; default 1024) */
    MT_CU_TUNE_CE_SMEM = 6,          /* cross-entropy: shared memory bytes per block, to limit rows in flight */
                                     /* (0..200 KiB, default 0) */
    MT_CU_TUNE_CE_REVERSE = 7,       /* cross-entropy: the gradient pass runs back to front (default 1) */
    MT_CU_TUNE_CE_CLUSTER = 8        /* cross-entropy: each row on a cluster of blocks, read once (default 0) */
} mt_cu_knob;

/* One field per knob; for the flags (prefetch, reverse, cluster) any nonzero value means 1. */
typedef struct mt_cu_tuning {
    int rms_fwd_emin, rms_bwd_emin, rms_bwd_prefetch, rms_bwd_chunks;
    int ce_threads, ce_smem, ce_reverse, ce_cluster;
} mt_cu_tuning;

/* The defaults, in the order of the fields (bench/cuda_kernels -v on the
 * H200; docs/cuda-kernels.md). */
#define MT_CU_TUNING_DEFAULT {2, 1, 0, 512, 1024, 0, 1, 0}

#if defined(MT_HAVE_CUDA) || defined(__CUDACC__)

/* ---- helpers --------------------------------------------------------------------- */

/* Bytes of one element. */
size_t mt_cu_dtype_size(mt_cu_dtype dt);

/* *t = the defaults (MT_CU_TUNING_DEFAULT); t may be NULL (nothing done). */
void mt_cu_tuning_default(mt_cu_tuning *t);
/* Sets one knob of *t (MT_CU_TUNE_DEFAULTS: all of them): 0, or -1 (and *t
 * unchanged) for an unknown knob or a value out of its range. */
int mt_cu_tuning_set(mt_cu_tuning *t, mt_cu_knob knob, int value);

/* ---- RMSNorm ------------------------------------------------------------------- */

/* y = x * rsqrt(mean(x^2) + eps) * (woff + w) per row, as mt_cpu_rmsnorm
 * (the mean of squares reduced in double; in bf16 mode, x or w bf16, each
 * thread's part of it in fp32), rstd[t] saved if not NULL. woff: 0 (Llama's
 * w), or 1 for Gemma's norms (1 + w, w upcast to fp32 first); the same
 * arithmetic either way (0 + w is w).
 * y (T, C) and w (C) in dt; x (T, C) in xdt (the residual stream may be fp32
 * while the normed output is bf16). C <= 32768 on the vector path (C % 8 ==
 * 0, 16-byte aligned pointers), else C <= 16384; -1 beyond. One block per
 * row, the row held in registers. */
int mt_cu_rmsnorm(mt_cu_stream s, mt_cu_dtype dt, void *y, float *rstd, mt_cu_dtype xdt, const void *x,
                  const void *w, int T, int C, float eps, float woff, const mt_cu_tuning *tune);

/* With the tuning of the calls that use the scratch (NULL: the defaults). */
size_t mt_cu_rmsnorm_bwd_scratch_bytes(int T, int C, const mt_cu_tuning *tune);
/* dx += d(loss)/dx (fp32, the residual gradient stream; may be NULL),
 * dw += d(loss)/dw (fp32, may be NULL: then scratch may be NULL), from
 * dy (T, C) fp32, x (T, C) in xdt, w (C) in dt, rstd (T) from the forward or
 * NULL (recomputed), woff as for the forward (dx sees dy * (woff + w); dw
 * does not depend on it). dx must not alias dy. C as for the forward.
 * One pass: each block takes a fixed chunk of rows (at most 512 chunks by
 * default), adds into their dx, and sums their dw terms in ascending t into
 * scratch; a second kernel adds the chunks in order. */
int mt_cu_rmsnorm_bwd(mt_cu_stream s, float *dx, float *dw, const float *dy, mt_cu_dtype xdt, const void *x,
                      mt_cu_dtype dt, const void *w, const float *rstd, int T, int C, float eps, float woff,
                      void *scratch, const mt_cu_tuning *tune);

/* ---- RoPE ---------------------------------------------------------------------------- */

/* In place on the first rd dimensions of each head of x (T, nh, D) in dt,
 * Hugging Face's rotate_half convention, as mt_cpu_rope: a = (float)pos[t] *
 * inv_freq[i] (sincosf, full accuracy), cos and sin times scale in fp32;
 * inverse != 0 rotates by -a (the backward). pos (T) int32, inv_freq (rd/2)
 * fp32; D and rd even, rd <= D. */
int mt_cu_rope(mt_cu_stream s, mt_cu_dtype dt, void *x, const int32_t *pos, const float *inv_freq, int T, int nh,
               int D, int rd, float scale, int inverse);
/* The same on dimensions off .. off + rd - 1 of each head, in pairs
 * (off + i, off + i + rd/2), or where interleaved (off + 2i, off + 2i + 1),
 * pair i turning by inv_freq[i] in both, as mt_cpu_rope_at; off + rd <= D.
 * Off 0 and not interleaved is mt_cu_rope. The 8-wide path also needs
 * off % 8 == 0. */
int mt_cu_rope_at(mt_cu_stream s, mt_cu_dtype dt, void *x, const int32_t *pos, const float *inv_freq, int T, int nh,
                  int D, int off, int rd, int interleaved, float scale, int inverse);

/* ---- columns (multi-head latent attention) ------------------------------------------------ */

/* dst[r, doff + j] = src[r / rep, soff + j] for r < rows, j < w, all in dt,
 * rows dld and sld elements apart (rep 1: row for row; rep n: each src row n
 * times), as mt_cpu_copy_cols: the bits copied. 16-byte accesses where w,
 * dld, sld are multiples of 16 bytes' elements and both starts aligned.
 * dst must not overlap src. */
int mt_cu_copy_cols(mt_cu_stream s, mt_cu_dtype dt, void *dst, int dld, int doff, const void *src, int sld, int soff,
                    int rows, int w, int rep);
/* dst[r, doff + j] = the sum over i < n of src[r * n + i, soff + j], all in
 * dt, added in fp32 in ascending i from 0 and rounded once to dt: the same
 * bits as mt_cpu_sum_cols on the same (dt-rounded) values, and no atomics.
 * dst must not overlap src. */
int mt_cu_sum_cols(mt_cu_stream s, mt_cu_dtype dt, void *dst, int dld, int doff, const void *src, int sld, int soff,
                   int rows, int w, int n);

/* ---- gated activations: SwiGLU, GeGLU, GPT-OSS ------------------------------------------ */

/* act: the MLP's activation, model/template.h's mt_glu_act as mt_cpu_glu
 * takes it: MT_GLU_SILU, or MT_GLU_GELU_TANH, gelu's tanh form (torch's
 * gelu(approximate="tanh"), Gemma's gelu_pytorch_tanh), tanhf at full
 * accuracy in both dtypes, or MT_GLU_GPTOSS, GPT-OSS's clamped SwiGLU:
 * with g = min(gate, 7) and u = clamp(up, -7, 7) (MT_GPTOSS_LIMIT),
 * out = (u + 1) * g * sigmoid(1.702 g) (MT_GPTOSS_ALPHA), its gradients zero
 * where gate > 7 (dgate) and where up is outside [-7, 7] (dup); the sigmoid
 * as SiLU's (the fast exp and division in bf16 mode). Any other value is
 * taken as SiLU. */

/* out = act(gate) * up, all (n) in dt. out may alias gate or up. */
int mt_cu_glu(mt_cu_stream s, mt_cu_dtype dt, int act, void *out, const void *gate, const void *up, size_t n);
/* dgate = dout * up * act'(gate), dup = dout * act(gate), all (n) in dt
 * (dgate and dup feed the GEMMs). Each element is read before it is written
 * by the same thread, so dgate may alias gate or dout and dup may alias up. */
int mt_cu_glu_bwd(mt_cu_stream s, mt_cu_dtype dt, int act, void *dgate, void *dup, const void *dout, const void *gate,
                  const void *up, size_t n);

/* ---- attention sinks (GPT-OSS) ----------------------------------------------------------- */

/* On out (B, S, H, D) in dt and lse (B, H, S) fp32 (natural log) as the
 * attention left them, a learnt logit sinks[h] (H, in dt: a weight) joins
 * the denominator of every softmax of head h, as mt_cpu_attn_sink: with
 * r = 1 / (1 + exp(sinks[h] - lse)), out *= r (in fp32, rounded once to dt)
 * and lse = log(exp(lse) + exp(sinks[h])), both in place; r and lse in
 * double from exp(-|sinks[h] - lse|), so neither overflows. One group of
 * lanes per row. */
int mt_cu_attn_sink(mt_cu_stream s, mt_cu_dtype dt, void *out, float *lse, const void *sinks, int B, int S, int H,
                    int D);
/* dsink (H, fp32) += -sum over b, s of exp(sinks[h] - lse[b, h, s])
 * dot(dout[b, s, h, :], out[b, s, h, :]), from dout, out (B, S, H, D) in dt
 * and lse (B, H, S) as mt_cu_attn_sink left them, as mt_cpu_attn_sink_bwd.
 * A cluster of 8 blocks per head: each row's dot in fp32, the weighted rows
 * summed in double in an order fixed by the shapes (and by whether the
 * 8-wide path is taken: D % 8 == 0 and dout, out 16-byte aligned), then
 * block sums, added in block order; no atomics, so the bits are the same on
 * every run. */
int mt_cu_attn_sink_bwd(mt_cu_stream s, mt_cu_dtype dt, float *dsink, const void *dout, const void *out,
                        const float *lse, const void *sinks, int B, int S, int H, int D);

/* ---- attention temperature (Llama 4) ------------------------------------------------------- */

/* Row t of x (T, n) in dt, in place, times f = 1 + scale * log1p(floor((i + 1) / floor_scale)) with
 * i = t % seq_len, as mt_cpu_attn_temperature: the factor by the same fp32 steps (p = i + 1, q =
 * floorf(p / floor_scale), log1p(q) in double rounded once to fp32, then * scale + 1 with no fused
 * multiply-add), the product x * f in fp32 rounded once to dt: the same bits as the CPU op on the same
 * (dt-rounded) values. Linear in x: the backward is the same call on the gradient. seq_len > 0.
 * 8-wide accesses where n % 8 == 0 and x is 16-byte aligned. */
int mt_cu_attn_temperature(mt_cu_stream s, mt_cu_dtype dt, void *x, int T, int seq_len, int n, float floor_scale,
                           float scale);

/* ---- embedding ---------------------------------------------------------------------- */

/* out[t, :] = wte[tokens[t], :] * scale (in fp32, rounded once to dt); out
 * (T, C) in dt, wte (V, C) in wdt (a conversion when they differ). scale: 1
 * (exact), or Gemma's sqrt(C). A token outside [0, V) gives a zero row
 * (callers validate tokens; this only keeps the read in bounds). */
int mt_cu_embedding(mt_cu_stream s, mt_cu_dtype dt, void *out, const int32_t *tokens, mt_cu_dtype wdt,
                    const void *wte, int T, int C, int V, float scale);

/* 0 when it cannot be determined (no device). */
size_t mt_cu_embedding_bwd_scratch_bytes(int T);
/* dwte[tokens[t], :] += dout[t, :] * scale with, for every row, the t in
 * ascending order: the same sums, bit for bit, as mt_cpu_embedding_bwd (with
 * scale 1; other scales, each product rounded before its sum). dwte (V, C)
 * fp32, dout (T, C) fp32. Tokens are stably radix-sorted (CUB) with their
 * positions; one block per distinct token (and column range) adds its rows
 * in order. Tokens outside [0, V) are skipped, and so is pad, the padding
 * row (nn.Embedding's padding_idx; -1: none). */
int mt_cu_embedding_bwd(mt_cu_stream s, float *dwte, const int32_t *tokens, const float *dout, int T, int C, int V,
                        float scale, int pad, void *scratch);

/* ---- cross-entropy ----------------------------------------------------------------- */

size_t mt_cu_cross_entropy_scratch_bytes(int n);
/* On n rows of logits (n, V) fp32 (not modified unless dlogits aliases it):
 * dlogits (n, V) in dt = (softmax - onehot(target)) * dscale, zero in the
 * rows whose target is ignore_index (or outside [0, V): callers validate);
 * dlogits may be NULL (loss only) and, when dt is fp32, may be logits
 * itself (in place). *loss_sum (device double, may be NULL) += the sum over
 * the other rows of logsumexp - logit[target] (each row in double, rows
 * added in a fixed order); *count (device int, may be NULL) += their number.
 * One block per row: an online max / sum of exponentials, then a second pass
 * (back to front) that writes the gradient.
 * softcap > 0 (Gemma 2's final_logit_softcapping): every logit x is read as
 * c = tanhf(x / softcap) * softcap, and dlogits is through the cap:
 * (softmax(c) - onehot) * dscale * (1 - (c / softcap)^2), as
 * mt_cpu_cross_entropy. 0: none (the code path without the cap; the cluster
 * variant is only used then). */
int mt_cu_cross_entropy(mt_cu_stream s, const float *logits, const int32_t *targets, int n, int V, float dscale,
                        float softcap, int ignore_index, mt_cu_dtype dt, void *dlogits, double *loss_sum, int *count,
                        void *scratch, const mt_cu_tuning *tune);
/* x = tanhf(x / cap) * cap in place, n fp32 (the logits a soft-capped model
 * returns), as mt_cpu_softcap. cap > 0. */
int mt_cu_softcap(mt_cu_stream s, float *x, size_t n, float cap);

/* ---- elementwise --------------------------------------------------------------------- */

/* y = x converted (n elements); ydt == xdt copies. y must not overlap x unless y == x and ydt == xdt. */
int mt_cu_convert(mt_cu_stream s, mt_cu_dtype ydt, void *y, mt_cu_dtype xdt, const void *x, size_t n);
/* The lean mode's weights (optim/q16.h), in place: n int16 codes at data
 * become bf16(code * scale[i / 256]), element i's 256-element block's scale. */
int mt_cu_q16_to_bf16(mt_cu_stream s, void *data, const float *scale, size_t n);
/* y = a + b in fp32, stored in ydt (e.g. the fp32 residual stream plus a bf16
 * branch). y may be a or b when it has the same dtype. */
int mt_cu_add(mt_cu_stream s, mt_cu_dtype ydt, void *y, mt_cu_dtype adt, const void *a, mt_cu_dtype bdt, const void *b,
              size_t n);
/* x *= alpha in place (n elements of dt). */
int mt_cu_scale(mt_cu_stream s, mt_cu_dtype dt, void *x, float alpha, size_t n);
/* bytes of p = 0 */
int mt_cu_zero(mt_cu_stream s, void *p, size_t bytes);

/* ---- reductions ------------------------------------------------------------------------ */

size_t mt_cu_sumsq_scratch_bytes(void);
/* *out (device double) += sum of x[i]^2 over n fp32 elements, each square
 * exact in double and summed in double: a fixed grid (from n alone) of
 * per-block partials, then one block adds them in a fixed order. */
int mt_cu_sumsq(mt_cu_stream s, double *out, const float *x, size_t n, void *scratch);

size_t mt_cu_bias_grad_scratch_bytes(int T, int N);
/* db[n] += sum over t of dy[t, n]; db (N) fp32, dy (T, N) in dt. Fixed row
 * chunks summed in ascending t into scratch, then the chunks in order. */
int mt_cu_bias_grad(mt_cu_stream s, float *db, mt_cu_dtype dt, const void *dy, int T, int N, void *scratch);

#else /* built without CUDA: no device, every call fails */

static inline size_t mt_cu_dtype_size(mt_cu_dtype dt) { return dt == MT_CU_BF16 ? 2 : 4; }
static inline void mt_cu_tuning_default(mt_cu_tuning *t)
{
    const mt_cu_tuning d = MT_CU_TUNING_DEFAULT;
    if (t) *t = d;
}
static inline int mt_cu_tuning_set(mt_cu_tuning *t, mt_cu_knob knob, int value)
{ (void)t, (void)knob, (void)value; return -1; }
static inline int mt_cu_rmsnorm(mt_cu_stream s, mt_cu_dtype dt, void *y, float *rstd, mt_cu_dtype xdt, const void *x,
                                const void *w, int T, int C, float eps, float woff, const mt_cu_tuning *tune)
{
    (void)s, (void)dt, (void)y, (void)rstd, (void)xdt, (void)x, (void)w, (void)T, (void)C, (void)eps, (void)woff;
    (void)tune;
    return -1;
}
static inline size_t mt_cu_rmsnorm_bwd_scratch_bytes(int T, int C, const mt_cu_tuning *tune)
{ (void)T, (void)C, (void)tune; return 0; }
static inline int mt_cu_rmsnorm_bwd(mt_cu_stream s, float *dx, float *dw, const float *dy, mt_cu_dtype xdt,
                                    const void *x, mt_cu_dtype dt, const void *w, const float *rstd, int T, int C,
                                    float eps, float woff, void *scratch, const mt_cu_tuning *tune)
{
    (void)s, (void)dx, (void)dw, (void)dy, (void)xdt, (void)x, (void)dt, (void)w, (void)rstd, (void)T, (void)C;
    (void)eps, (void)woff, (void)scratch, (void)tune;
    return -1;
}
static inline int mt_cu_rope(mt_cu_stream s, mt_cu_dtype dt, void *x, const int32_t *pos, const float *inv_freq,
                             int T, int nh, int D, int rd, float scale, int inverse)
{
    (void)s, (void)dt, (void)x, (void)pos, (void)inv_freq, (void)T, (void)nh, (void)D, (void)rd, (void)scale;
    (void)inverse;
    return -1;
}
static inline int mt_cu_rope_at(mt_cu_stream s, mt_cu_dtype dt, void *x, const int32_t *pos, const float *inv_freq,
                                int T, int nh, int D, int off, int rd, int interleaved, float scale, int inverse)
{
    (void)s, (void)dt, (void)x, (void)pos, (void)inv_freq, (void)T, (void)nh, (void)D, (void)off, (void)rd;
    (void)interleaved, (void)scale, (void)inverse;
    return -1;
}
static inline int mt_cu_copy_cols(mt_cu_stream s, mt_cu_dtype dt, void *dst, int dld, int doff, const void *src,
                                  int sld, int soff, int rows, int w, int rep)
{
    (void)s, (void)dt, (void)dst, (void)dld, (void)doff, (void)src, (void)sld, (void)soff, (void)rows, (void)w;
    (void)rep;
    return -1;
}
static inline int mt_cu_sum_cols(mt_cu_stream s, mt_cu_dtype dt, void *dst, int dld, int doff, const void *src,
                                 int sld, int soff, int rows, int w, int n)
{
    (void)s, (void)dt, (void)dst, (void)dld, (void)doff, (void)src, (void)sld, (void)soff, (void)rows, (void)w;
    (void)n;
    return -1;
}
static inline int mt_cu_glu(mt_cu_stream s, mt_cu_dtype dt, int act, void *out, const void *gate, const void *up,
                            size_t n)
{ (void)s, (void)dt, (void)act, (void)out, (void)gate, (void)up, (void)n; return -1; }
static inline int mt_cu_glu_bwd(mt_cu_stream s, mt_cu_dtype dt, int act, void *dgate, void *dup, const void *dout,
                                const void *gate, const void *up, size_t n)
{ (void)s, (void)dt, (void)act, (void)dgate, (void)dup, (void)dout, (void)gate, (void)up, (void)n; return -1; }
static inline int mt_cu_attn_sink(mt_cu_stream s, mt_cu_dtype dt, void *out, float *lse, const void *sinks, int B,
                                  int S, int H, int D)
{ (void)s, (void)dt, (void)out, (void)lse, (void)sinks, (void)B, (void)S, (void)H, (void)D; return -1; }
static inline int mt_cu_attn_sink_bwd(mt_cu_stream s, mt_cu_dtype dt, float *dsink, const void *dout, const void *out,
                                      const float *lse, const void *sinks, int B, int S, int H, int D)
{
    (void)s, (void)dt, (void)dsink, (void)dout, (void)out, (void)lse, (void)sinks, (void)B, (void)S, (void)H;
    (void)D;
    return -1;
}
static inline int mt_cu_attn_temperature(mt_cu_stream s, mt_cu_dtype dt, void *x, int T, int seq_len, int n,
                                         float floor_scale, float scale)
{ (void)s, (void)dt, (void)x, (void)T, (void)seq_len, (void)n, (void)floor_scale, (void)scale; return -1; }
static inline int mt_cu_embedding(mt_cu_stream s, mt_cu_dtype dt, void *out, const int32_t *tokens, mt_cu_dtype wdt,
                                  const void *wte, int T, int C, int V, float scale)
{ (void)s, (void)dt, (void)out, (void)tokens, (void)wdt, (void)wte, (void)T, (void)C, (void)V, (void)scale; return -1; }
static inline size_t mt_cu_embedding_bwd_scratch_bytes(int T) { (void)T; return 0; }
static inline int mt_cu_embedding_bwd(mt_cu_stream s, float *dwte, const int32_t *tokens, const float *dout, int T,
                                      int C, int V, float scale, int pad, void *scratch)
{ (void)s, (void)dwte, (void)tokens, (void)dout, (void)T, (void)C, (void)V, (void)scale, (void)pad, (void)scratch; return -1; }
static inline size_t mt_cu_cross_entropy_scratch_bytes(int n) { (void)n; return 0; }
static inline int mt_cu_cross_entropy(mt_cu_stream s, const float *logits, const int32_t *targets, int n, int V,
                                      float dscale, float softcap, int ignore_index, mt_cu_dtype dt, void *dlogits,
                                      double *loss_sum, int *count, void *scratch, const mt_cu_tuning *tune)
{
    (void)s, (void)logits, (void)targets, (void)n, (void)V, (void)dscale, (void)softcap, (void)ignore_index, (void)dt;
    (void)dlogits, (void)loss_sum, (void)count, (void)scratch, (void)tune;
    return -1;
}
static inline int mt_cu_softcap(mt_cu_stream s, float *x, size_t n, float cap)
{ (void)s, (void)x, (void)n, (void)cap; return -1; }
static inline int mt_cu_convert(mt_cu_stream s, mt_cu_dtype ydt, void *y, mt_cu_dtype xdt, const void *x, size_t n)
{ (void)s, (void)ydt, (void)y, (void)xdt, (void)x, (void)n; return -1; }
static inline int mt_cu_q16_to_bf16(mt_cu_stream s, void *data, const float *scale, size_t n)
{ (void)s, (void)data, (void)scale, (void)n; return -1; }
static inline int mt_cu_add(mt_cu_stream s, mt_cu_dtype ydt, void *y, mt_cu_dtype adt, const void *a, mt_cu_dtype bdt,
                            const void *b, size_t n)
{ (void)s, (void)ydt, (void)y, (void)adt, (void)a, (void)bdt, (void)b, (void)n; return -1; }
static inline int mt_cu_scale(mt_cu_stream s, mt_cu_dtype dt, void *x, float alpha, size_t n)
{ (void)s, (void)dt, (void)x, (void)alpha, (void)n; return -1; }
static inline int mt_cu_zero(mt_cu_stream s, void *p, size_t bytes) { (void)s, (void)p, (void)bytes; return -1; }
static inline size_t mt_cu_sumsq_scratch_bytes(void) { return 0; }
static inline int mt_cu_sumsq(mt_cu_stream s, double *out, const float *x, size_t n, void *scratch)
{ (void)s, (void)out, (void)x, (void)n, (void)scratch; return -1; }
static inline size_t mt_cu_bias_grad_scratch_bytes(int T, int N) { (void)T, (void)N; return 0; }
static inline int mt_cu_bias_grad(mt_cu_stream s, float *db, mt_cu_dtype dt, const void *dy, int T, int N,
                                  void *scratch)
{ (void)s, (void)db, (void)dt, (void)dy, (void)T, (void)N, (void)scratch; return -1; }

#endif

#ifdef __cplusplus
}
#endif

#endif
