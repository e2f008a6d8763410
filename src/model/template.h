/* Layer templates: a model family's units (embedding, decoder layer, head)
 * written once, as calls on a table of kernels that every backend
 * implements. A template is stateless: each call gets the unit's weights
 * (pointers into whichever slot holds them), its input and output, and the
 * backend's working buffers; nothing of a layer persists between calls.
 *
 * The backend owns memory and order (slots, checkpoints, streams); the
 * template owns the arithmetic of the family. The CPU backend runs the
 * kernels in fp32 on the thread pool, the CUDA backend on a stream in the
 * model's precision; both run the same template, so a new family is one new
 * template (and kernels only where it needs an operation no kernel has).
 *
 * Types. The template never sees element types: a buffer is either in the
 * backend's activation type ("act": bf16 or fp32 on CUDA, fp32 on the CPU)
 * or fp32 ("f32": norm scales, log-sum-exps, logits, gradients of the
 * residual stream and the weight gradients). Kernels that write a GEMM
 * output say which with out_f32.
 *
 * Notation: T = n_seq * seq_len tokens of one micro-batch, C hidden, Q =
 * H*D, KV = Hkv*D, F the MLP width, V the vocabulary. Matrices use the
 * nn.Linear layout W[N_out, K_in]. */
#ifndef MT_MODEL_TEMPLATE_H
#define MT_MODEL_TEMPLATE_H

#include "core/internal.h"
#include "model/layout.h"

#include <stddef.h>
#include <stdint.h>

/* The reductions of the kernel table whose scratch depends on their shape. */
typedef enum mt_reduction_op {
    MT_RED_RMSNORM_BWD = 0, /* rmsnorm_bwd of rows x cols (its dw: a sum over the rows) */
    MT_RED_EMBEDDING_BWD,   /* embedding_bwd of rows tokens */
    MT_RED_BIAS_GRAD,       /* linear_dw with a bias, rows M x cols N */
    MT_RED_CROSS_ENTROPY,   /* cross_entropy of a chunk of rows */
} mt_reduction_op;

/* One reduction a template calls, at its largest shape. */
typedef struct mt_reduction {
    mt_reduction_op op;
    uint64_t rows, cols;
} mt_reduction;

#define MT_MAX_REDUCTIONS 16

typedef struct mt_route mt_route; /* the routing's mode (moe_route): defined below, beside mt_dims */

/* The kernel table. kc is the backend's own state (its stream, scratch,
 * pool). Kernels issue work and return: a backend that runs asynchronously
 * keeps the first failure and reports it when the step is synchronised, so
 * a template never checks results. */
typedef struct mt_kernels {
    /* y (T, C) act = x (T, C) act * rsqrt(mean(x^2) + eps) * (woff + w (C)) in fp32; rstd (T) f32 saved.
     * woff: 0, or 1 for Gemma's norms, whose weights store the scale minus one */
    void (*rmsnorm)(void *kc, void *y, float *rstd, const void *x, const void *w, int T, int C, float eps, float woff);
    /* dx (T, C) f32 += the input gradient, dw (C) f32 += the weight's, from dy (T, C) f32 */
    void (*rmsnorm_bwd)(void *kc, float *dx, float *dw, const float *dy, const void *x, const void *w,
                        const float *rstd, int T, int C, float eps, float woff);
    /* y[M, N] = x[M, K] W[N, K]^T (+ bias[N]) (+ y if accumulate); y act, or f32 if out_f32 */
    void (*linear)(void *kc, void *y, int out_f32, const void *x, const void *W, const void *bias, int M, int K, int N,
                   int accumulate);
    /* dx[M, K] = dy[M, N] W[N, K] (+ dx if accumulate); dx act, or f32 if out_f32 */
    void (*linear_dx)(void *kc, void *dx, int out_f32, const void *dy, const void *W, int M, int K, int N,
                      int accumulate);
    /* dW[N, K] += dy[M, N]^T x[M, K] and, if db, db[N] += the column sums of dy; dW, db f32 */
    void (*linear_dw)(void *kc, float *dW, float *db, const void *dy, const void *x, int M, int K, int N);
    /* RoPE in place on x (T, nh, D) act at the positions of the micro-batch; inverse: the backward.
     * local: the sliding layers' frequencies (Gemma 3's rope_local_base_freq), else the model's. It turns
     * mt_config_rotary_dims dimensions of each head from mt_config_rotary_offset, in pairs (i, i + n/2)
     * or, where mt_config_rope_interleaved, (2i, 2i + 1) */
    void (*rope)(void *kc, void *x, int T, int nh, int D, int inverse, int local);
    /* Columns between row-major matrices of act: dst[r, doff + j] = src[r / rep, soff + j] for r < rows,
     * j < w (rep 1: row for row; rep n: each src row n times), rows dld and sld elements apart. The pieces
     * of multi-head latent attention's keys and values, the shared key part broadcast to every head */
    void (*copy_cols)(void *kc, void *dst, int dld, int doff, const void *src, int sld, int soff, int rows, int w,
                      int rep);
    /* Its backward for rep n: dst[r, doff + j] = sum over i < n of src[r * n + i, soff + j], summed in fp32
     * in ascending i, rounded once (act) */
    void (*sum_cols)(void *kc, void *dst, int dld, int doff, const void *src, int sld, int soff, int rows, int w,
                     int n);
    /* Causal grouped-query attention over n_seq sequences of seq_len: out (T, H*D) act and the
     * log-sum-exp lse f32 of each query row; q (T, H*D), k, v (T, Hkv*D) act. Each query sees
     * the keys of its document (the micro-batch's positions); window > 0 (d->window, on the
     * layers that slide): only the last window of them, itself included. softcap > 0: each score
     * s = scale q.k becomes softcap * tanh(s / softcap) before the softmax (Gemma 2). */
    void (*attention)(void *kc, void *out, float *lse, const void *q, const void *k, const void *v, int n_seq,
                      int seq_len, int H, int Hkv, int D, float scale, int window, float softcap);
    /* Its backward from out and lse: dq, dk, dv act, overwritten */
    void (*attention_bwd)(void *kc, void *dq, void *dk, void *dv, const void *dout, const void *out, const float *lse,
                          const void *q, const void *k, const void *v, int n_seq, int seq_len, int H, int Hkv, int D,
                          float scale, int window, float softcap);
    /* Attention sinks (GPT-OSS): a learnt logit sink[h] per head in the denominator of every softmax
     * of head h. On out and lse as attention wrote them (n_seq sequences of seq_len, H heads of D):
     * with r = 1 / (1 + exp(sink[h] - lse)), out *= r and lse becomes log(exp(lse) + exp(sink[h])).
     * attention_bwd from that out and lse is then the backward of the attention with sinks (its
     * probabilities exp(s - lse) are the sink's, and D_i = rowsum(dout * out) too); attn_sink_bwd
     * adds the sinks' gradient, dsink[h] (f32) += -sum over the rows of head h of
     * exp(sink[h] - lse) dot(dout, out), summed in a fixed order. sinks (H) act (a weight). */
    void (*attn_sink)(void *kc, void *out, float *lse, const void *sinks, int n_seq, int seq_len, int H, int D);
    void (*attn_sink_bwd)(void *kc, float *dsink, const void *dout, const void *out, const float *lse,
                          const void *sinks, int n_seq, int seq_len, int H, int D);
    /* Llama 4's attention temperature on its NoPE layers: each row of x (T, n) act, token i of its
     * sequence (i = t % seq_len, as transformers' arange, whatever the documents), multiplied by
     * 1 + scale * log1p(floor((i + 1) / floor_scale)), the factor in fp32 and the product rounded once.
     * Linear in x: its backward is the same call on the gradient */
    void (*attn_temperature)(void *kc, void *x, int T, int seq_len, int n, float floor_scale, float scale);
    /* A gated MLP's middle: out = act(gate) * up, n elements act (mt_glu_act); and its backward */
    void (*glu)(void *kc, void *out, const void *gate, const void *up, size_t n, int act);
    void (*glu_bwd)(void *kc, void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n,
                    int act);
    /* dst = src, n act elements */
    void (*copy)(void *kc, void *dst, const void *src, size_t n);
    /* rows[i] = src[(i + 1) * stride - 1] for i < n: the last row of each of n groups of stride rows of C act */
    void (*last_rows)(void *kc, void *rows, const void *src, int n, int stride, int C);
    /* src (n f32) as an act buffer: src itself where act is fp32, else converted into scratch */
    const void *(*as_act)(void *kc, void *scratch, const float *src, size_t n);
    /* src (n act) as an f32 buffer: src itself where act is fp32, else converted into scratch */
    const float *(*as_f32)(void *kc, float *scratch, const void *src, size_t n);
    /* bytes of zeros at p */
    void (*zero)(void *kc, void *p, size_t bytes);
    /* out[t, :] = wte[tokens[t], :] * scale: out (T, C) act; and dwte[tokens[t], :] += dout[t, :] * scale (f32)
     * for every t whose token is not pad (the padding row, d->pad: -1 none).
     * scale: 1, or Gemma's sqrt(C) (d->embed_scale) */
    void (*embedding)(void *kc, void *out, const int32_t *tokens, const void *wte, int T, int C, int V, float scale);
    void (*embedding_bwd)(void *kc, float *dwte, const int32_t *tokens, const float *dout, int T, int C, int V,
                          float scale, int pad);
    /* Cross-entropy of n rows of logits (f32) against targets (MT_IGNORE_INDEX rows count nothing):
     * adds the sum of -log p(target) to the step's loss; with dlogits, writes the gradient of
     * that sum times dscale there (act): (softmax - onehot) * dscale, times 1 - tanh^2 of the cap
     * where softcap > 0 (the logits then being softcap * tanh(logit / softcap)). logits may be
     * overwritten. */
    void (*cross_entropy)(void *kc, void *dlogits, float *logits, const int32_t *targets, int n, int V, float dscale,
                          float softcap);
    /* x = cap * tanh(x / cap) in place, n f32 (the head's logits of a soft-capped model) */
    void (*softcap)(void *kc, float *x, size_t n, float cap);
    /* dst = a + b, n act elements, rounded once; dst may be a or b */
    void (*add)(void *kc, void *dst, const void *a, const void *b, size_t n);
    /* bytes from the f32 buffer src to host memory dst (the logits of mt_model_logits) */
    void (*to_host)(void *kc, float *dst, const float *src, size_t n);

    /* ---- mixture of experts (Qwen3-MoE, Mixtral: src/model/moe.c). A layer routes each of T tokens to
     * k of E experts: R = T*k routed rows, slot t*k+j being token t's j-th choice. */
    /* From router logits (T, E) f32, as rt says (mt_route): probs (T, E) f32, the softmax of each row;
     * topw, topi (T*k): each token's k most probable experts in descending order (ties: the lower index),
     * with their probabilities, renormalised to sum to 1 when rt->norm (times rt->scale where it is not 1).
     * With rt->sigmoid (DeepSeek-V3): probs holds the scores sigmoid(logit); the k experts are those of
     * highest choice score, score + rt->bias (act, NULL: zeros), among the experts of the rt->topk_group
     * groups (of rt->n_group, n_group dividing E; 0 or 1: no groups) whose two best choice scores sum
     * highest (in descending order of choice score; ties, of experts and of groups: the lower index);
     * topw their scores (without the bias), divided by their sum + 1e-20 when rt->norm, times rt->scale.
     * rows (R): the routed rows sorted by expert (stably: by slot), as the slot each came from, and
     * slot_row (R) the inverse. offs_buf (E+1) int32, in the backend's memory (device memory on a GPU):
     * expert e's routed rows are offs_buf[e] .. offs_buf[e+1]-1, the offs that the grouped GEMMs below
     * (moe_linear, moe_linear_dx, moe_linear_dw) take. Nothing is read back to the host, so a sparse layer
     * runs without a wait: a GPU backend checks the offsets on the device (0 first, nondecreasing, all R
     * rows placed, which a non-finite router logit prevents) and reports a bad routing when the step is
     * synchronised. stats (2E) f32 if not NULL: overwritten with each expert's routed rows (as floats),
     * then the sum over the T tokens of its probability (the load-balancing loss; with rt->sigmoid, of its
     * score). */
    void (*moe_route)(void *kc, float *probs, float *topw, int32_t *topi, int32_t *rows, int32_t *slot_row,
                      int32_t *offs_buf, float *stats, const float *logits, int T, int E, int k, const mt_route *rt);
    /* Its backward into dlogits (T, E) f32, overwritten: from dw (T*k) f32, the gradient of the routing
     * weights topw, through rt->scale, the renormalisation (rt->norm) and the softmax (rt->sigmoid: the
     * sigmoid, d logit = s (1 - s) d s; the bias and the choice of groups and experts carry no gradient);
     * with stats (L rows of 2E, those of every layer of the micro-batch) also the load-balancing loss's,
     * aux * (the routed rows of each expert summed over the L rows) added to the gradient of its
     * probability (score). */
    void (*moe_route_bwd)(void *kc, float *dlogits, const float *dw, const float *probs, const float *topw,
                          const int32_t *topi, const float *stats, int L, float aux, int T, int E, int k,
                          const mt_route *rt);
    /* dst[r, :] = src[rows[r] / k, :], act, for the R routed rows: each token's row to its experts' */
    void (*moe_gather)(void *kc, void *dst, const void *src, const int32_t *rows, int R, int k, int C);
    /* out[t, :] += sum_j (w ? w[t*k+j] : 1) * src[slot_row[t*k+j], :] for t < T, summed in fp32 in slot
     * order; out act or f32 (out_f32), src act or f32 (src_f32) */
    void (*moe_combine)(void *kc, void *out, int out_f32, const void *src, int src_f32, const float *w,
                        const int32_t *slot_row, int T, int k, int C);
    /* For the R routed rows: dw[rows[r]] = dot(x[r, :], y[r, :]) (f32), then x[r, :] and y[r, :] (act, n
     * each) multiplied by w[rows[r]]. dw NULL: no dot; y NULL: x alone is scaled (Llama 4's routing weight
     * on the experts' input rows) */
    void (*moe_dot_scale)(void *kc, float *dw, void *x, void *y, const float *w, const int32_t *rows, int R, int n);
    /* The shared expert's gate (Qwen2-MoE): out[t, :] += sigmoid(z[t]) * src[t, :] for t < T, rows of C act,
     * z f32, added in fp32 and rounded once; and its backward on rows of n act: with s = sigmoid(z[t]),
     * dz[t] = dot(x[t, :], y[t, :]) * s * (1 - s) (f32), then x[t, :] and y[t, :] multiplied by s */
    void (*moe_shared_gate)(void *kc, void *out, const void *src, const float *z, int T, int C);
    void (*moe_shared_gate_bwd)(void *kc, float *dz, void *x, void *y, const float *z, int T, int n);
    /* Adds scale * E * sum_e c_e p_e to the step's loss, c_e and p_e each expert's routed rows and
     * probability sum over the L rows of stats (L, 2E) f32 */
    void (*moe_aux_loss)(void *kc, const float *stats, int L, int E, double scale);
    /* The experts' GEMMs over the R routed rows sorted by expert, one call for all E experts. offs (E+1)
     * int32 is moe_route's offs_buf, in the backend's memory (device memory on a GPU, host memory on the
     * CPU): the template never reads it, so no call waits for the routing. Expert e's rows are offs[e] ..
     * offs[e+1]-1; a backend clamps them to [0, R], so a bad routing (reported at the step's end) reads
     * and writes nothing out of bounds. Matrices are stacked: W (E, N, K) act, expert e's W_e[N, K] at
     * e*N*K; bias (E, N) act or NULL. Each expert's rows are the same arithmetic as linear, linear_dx and
     * linear_dw on that block (the CPU runs exactly those).
     * moe_linear: y[r, :N] = x[r, :K] W_e[N, K]^T (+ bias_e[N]) (+ y if accumulate) for every r of expert
     * e; x (R, K) act, y (R, N) act, or f32 if out_f32. Rows of no expert (past offs[E]) are not written */
    void (*moe_linear)(void *kc, void *y, int out_f32, const void *x, const void *W, const void *bias,
                       const int32_t *offs, int E, int R, int K, int N, int accumulate);
    /* dx[r, :K] = dy[r, :N] W_e[N, K] (+ dx if accumulate) for every r of expert e; dy (R, N) act, dx (R, K)
     * act, or f32 if out_f32. Rows of no expert are not written */
    void (*moe_linear_dx)(void *kc, void *dx, int out_f32, const void *dy, const void *W, const int32_t *offs,
                          int E, int R, int K, int N, int accumulate);
    /* dW_e[N, K] += dy_e^T x_e over expert e's rows (dy (R, N), x (R, K) act), dW f32 stacked (E, N, K); if
     * db, db_e[N] (f32, (E, N)) += the column sums of dy over e's rows. Experts without rows are left
     * untouched (their gradient stays as begin_grads zeroed it) */
    void (*moe_linear_dw)(void *kc, float *dW, float *db, const void *dy, const void *x, const int32_t *offs, int E,
                          int R, int K, int N);

    /* The scratch bytes the reduction r needs on this backend (mt_reduction: the template declares every
     * reduction it calls, the backend sizes its scratch from them, and each kernel checks the size it is
     * given); NULL where the backend's kernels need none. */
    size_t (*scratch_bytes)(const mt_reduction *r);
} mt_kernels;

/* The sizes of one micro-batch's computation, fixed by the backend when it
 * reserves memory for a batch shape. */
/* How a layer scores its experts and weighs a token's choices (moe_route, moe_route_bwd). Qwen3-MoE,
 * Mixtral, GPT-OSS: the softmax of the router logits, the k most probable, renormalised where norm.
 * DeepSeek-V3 (DeepseekV3TopkRouter): scores sigmoid(logit); the choice by score + bias (the
 * e_score_correction_bias, E values of the weights' type, NULL none) among the experts of the topk_group
 * of n_group groups whose two best choice scores sum highest (n_group 0: no groups); the weights are the
 * chosen experts' scores (without the bias), renormalised where norm, times scale. */
typedef struct mt_route {
    int norm;
    int sigmoid;
    int n_group, topk_group;
    float scale;      /* routed_scaling_factor: 1 for the softmax families */
    const void *bias; /* act (E), or NULL */
} mt_route;

typedef struct mt_dims {
    int n_seq, seq_len, T;
    int C, H, Hkv, D, Q, KV, F, V;
    size_t es; /* bytes of an act element: the template's only view of types (buffer offsets) */
    int FT;    /* MLP tokens per piece: T, or fewer to keep (FT, F) buffers small */
    int chunk; /* head tokens per logits chunk: the head never holds (T, V) */
    int dw_rows; /* head tokens per weight-gradient GEMM: whole chunks (or the rest of T) whose dlogits are kept
                  * until their one GEMM, so that the (V, C) fp32 gradient is read and written once per dw_rows
                  * tokens instead of once per chunk */
    float eps, attn_scale;
    int qk_norm; /* RMSNorm of each head of q and k before RoPE (Qwen3, Gemma 3) */
    int qk_l2;   /* Llama 4: on the layers with RoPE, each head of q and k divided by its root mean square
                  * (eps), no weight, after RoPE */
    float temp_floor, temp_scale; /* Llama 4's attention temperature on the NoPE layers (attn_temperature):
                                   * temp_floor 0 none */
    int window;  /* the sliding layers' window, 0 where none is shorter than seq_len; -N: Llama 4's chunks
                  * of N on its layers with RoPE (mt_window_starts) */
    float norm_offset;    /* every RMSNorm scales by norm_offset + w: 0, Gemma 1 */
    float embed_scale;    /* the embedding's output factor: 1, Gemma bf16(sqrt(C)) in bf16 mode */
    int pad;              /* the embedding's padding row (pad_token_id): no gradient from lookups; -1 none */
    int glu_act;          /* mt_glu_act of the MLP */
    float attn_softcap;   /* Gemma 2's attention score cap, 0 none */
    float final_softcap;  /* Gemma 2's logit cap, 0 none */
    /* multi-head latent attention (DeepSeek-V2/V3; mla 0 elsewhere): q from a rank-Rq latent (0: q_proj),
     * keys and values from a rank-Rkv latent; D = Dn + Dr (Dr of them rotated, the key's shared by all
     * heads), values Dv wide held D wide (zeros past Dv) so that the attention runs one head size; Hkv = H.
     * Qo: the width o_proj reads, H * Dv (Q elsewhere) */
    int mla, Rq, Rkv, Dn, Dr, Dv, Qo;
    /* mixture of experts (0 for dense models): E experts of width FE, k a token, the routing weights
     * renormalised (norm_topk); L layers, n_sparse of them with experts; aux_coef the load-balancing
     * loss's weight (0 without output_router_logits); n_micro the micro-batches of a step (set by the
     * backend: the loss is the mean of theirs) */
    int E, FE, topk, norm_topk, L, n_sparse, n_micro;
    float aux_coef;
    int FS;          /* the shared expert's width beside the routed ones, 0 none */
    int shared_gate; /* its output scaled by a sigmoid gate (Qwen2-MoE) */
    int expert_bias; /* the router and every expert matrix have biases (GPT-OSS) */
    int input_weighted; /* each routing weight scales its expert's input rows, not its output (Llama 4) */
    /* the routing (mt_route): sigmoid scores with a choice among n_group groups' topk_group best (0: no
     * groups), the weights times route_scale (DeepSeek-V3); softmax, no groups and 1 for the others */
    int route_sigmoid, n_group, topk_group;
    float route_scale;
} mt_dims;

/* The activation of a gated MLP: out = act(gate) * up. */
typedef enum mt_glu_act {
    MT_GLU_SILU = 0,      /* SwiGLU: silu(x) = x / (1 + exp(-x)) (Llama and the others) */
    MT_GLU_GELU_TANH = 1, /* GeGLU: gelu's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Gemma) */
    /* GPT-OSS's clamped SwiGLU, as transformers' GptOssExperts computes it: with g = min(gate, L) and
     * u = clamp(up, -L, L), out = (u + 1) * g * sigmoid(MT_GPTOSS_ALPHA * g); L = MT_GPTOSS_LIMIT. Its
     * backward passes gate's gradient where gate <= L and up's where -L <= up <= L (torch.clamp's) */
    MT_GLU_GPTOSS = 2,
} mt_glu_act;

/* GPT-OSS's activation constants (transformers' GptOssExperts: fixed, not read from the config) */
#define MT_GPTOSS_ALPHA 1.702f
#define MT_GPTOSS_LIMIT 7.0f

/* The model's part of d (everything but es, FT, chunk and dw_rows, which the backend
 * sets) for micro-batches of n_seq sequences of seq_len. */
void mt_dims_init(mt_dims *d, const mt_model_config *cfg, int n_seq, int seq_len);

/* The working buffers of one unit's forward and backward (one micro-batch
 * at a time), laid out by the backend from the template's work(): those of
 * the pieces every template shares (blocks.h). A template with buffers of
 * its own extends it, its own struct beginning with an mt_work (gemma.c,
 * moe.c), so that a family's buffers are its template's business alone. */
typedef struct mt_work {
    void *xn1, *q, *k, *v, *att, *h, *xn2, *g, *u, *a, *rows;         /* act */
    float *lse, *rstd1, *rstd2, *logits;                               /* f32 */
    void *dy_act, *da, *dg, *du, *datt, *dq, *dk, *dv, *dlogits;        /* act, training only */
    float *dxn;                                                         /* f32, training only */
    /* with qk_norm or qk_l2: q and k before their norms (act) and the norms' 1/rms (f32); in the
     * backward the f32 gradients of q and k before the norms, and an f32 scratch */
    void *qr, *kr;
    float *rstdq, *rstdk, *dqr, *dkr, *dqk32;
    void *l2w; /* with qk_l2 (Llama 4): D zeros, the weight of the norms' kernel with woff 1 (a scale of 1) */
    /* multi-head latent attention (d->mla): the q latent before and after its norm (T, Rq), the kv latent
     * and shared key part (T, Rkv + Dr), the latent alone before and after its norm (T, Rkv), their 1/rms,
     * the expanded keys' parts and values (T, H * (Dn + Dv)), the attention output o_proj reads (T, Qo);
     * in the backward their gradients, f32 scratch for the latents' (T, max(Rq, Rkv)) and its act copy */
    void *cq, *cqn, *kva, *kvc, *kvn, *kvb, *attp;
    float *rstdcq, *rstdkv;
    void *dkvb, *dkva, *dattp, *dlat_act;
    float *dlat32, *dlatn32;
} mt_work;

/* One buffer of a template's work struct: where its pointer lives, its elements and type. */
typedef struct mt_work_buf {
    size_t field; /* offsetof(the template's work struct, ...) */
    uint64_t elems;
    int f32;      /* 4-byte elements (fp32, or int32) whatever the activation type */
} mt_work_buf;

#define MT_WORK_MAX_BUFS 96

/* Appends buffer `name` of the work struct `type`, n elements, to out[k++] (inside a work()). */
#define MT_WORK_BUF(type, name, n, is_f32) (out[k++] = (mt_work_buf){offsetof(type, name), (uint64_t)(n), is_f32})

/* Room for any template's work struct: pointers only, at most MT_WORK_MAX_BUFS of them (each template
 * asserts its struct fits). */
typedef union mt_work_store {
    mt_work base;
    void *ptr[MT_WORK_MAX_BUFS];
} mt_work_store;

/* Where a layer's attention inputs and output and its residual live for
 * micro-batch mb: kept from the forward for the backward (the backend
 * decides which layers keep them, from what the template's keeps() says
 * they spare), or the work buffers. */
typedef struct mt_layer_acts {
    void *att;    /* attention output (T, Q) act */
    float *lse;   /* its log-sum-exp (T, H) f32 */
    void *h;      /* the residual after attention (T, C) act */
    int att_kept; /* att and lse hold the forward's values in the backward */
    int h_kept;   /* h does */
    void *q, *k, *v; /* the attention's inputs after RoPE: (T, Q), (T, KV), (T, KV) act */
    int qkv_kept;    /* q, k and v do */
    int window;      /* this layer's sliding window (mt_config_layer_window): 0 none, -N chunks of N */
    int rope_local;  /* this layer rotates by the sliding layers' frequencies (mt_config_layer_local_rope) */
    int layer;       /* the decoder layer, 0 .. L-1 (the row of mt_exec.state it may use) */
    int nope;        /* this layer has no RoPE (mt_config_layer_nope, Llama 4) */
} mt_layer_acts;

/* What the forward can keep for the backward's recompute to skip (mt_template.keeps). */
enum {
    MT_KEEP_ATT = 1, /* the attention output and its log-sum-exp */
    MT_KEEP_H = 2,   /* the residual after attention */
    MT_KEEP_QKV = 4, /* q, k and v after RoPE */
};

/* What a template call runs on. */
typedef struct mt_exec {
    const mt_kernels *k;
    void *kc;
    const mt_dims *d;
    const mt_work *w; /* the template's work struct (its first member) */
    /* this micro-batch's state of the template's (state_elems f32), kept by the backend from the
     * forward to the backward and the head, zero at reserve; NULL where the template keeps none.
     * The mixture of experts keeps each layer's routing statistics there (moe.c). */
    float *state;
} mt_exec;

/* A family's template. Weights are bound by tensor role (w[MT_T_Q], ...;
 * NULL where the unit has no such tensor); gw the same for the fp32 weight
 * gradients. Besides the arithmetic it declares what a backend sizes for
 * it: its working buffers, its reductions' shapes, the state it keeps per
 * micro-batch and which activations kept from the forward spare it work. */
typedef struct mt_template {
    const char *name;
    /* The working buffers for dims d (training: want_grad); returns their number. */
    int (*work)(const mt_dims *d, int want_grad, mt_work_buf *out);
    /* The reductions (mt_reduction) it calls for dims d at their largest, for the backend's scratch;
     * returns their number (at most MT_MAX_REDUCTIONS). */
    int (*reductions)(const mt_dims *d, int want_grad, mt_reduction *out);
    /* The f32 elements of state it keeps per micro-batch (mt_exec.state); NULL: none. */
    uint64_t (*state_elems)(const mt_dims *d);
    /* MT_KEEP_* bits: what kept activations spare its recompute for dims d. */
    unsigned (*keeps)(const mt_dims *d);
    /* Embedding: out (T, C) act from tokens; backward: gwte += from dy (T, C) f32 */
    void (*embed_forward)(const mt_exec *x, void *const *w, const int32_t *tokens, void *out);
    void (*embed_backward)(const mt_exec *x, float *gwte, const int32_t *tokens, const float *dy);
    /* A decoder layer: in (T, C) act -> out (T, C) act. out NULL: the
     * backward's recompute, which stops where layer_backward takes over and
     * skips what a->att_kept / a->h_kept say the forward kept. */
    void (*layer_forward)(const mt_exec *x, void *const *w, const void *in, void *out, const mt_layer_acts *a);
    /* After layer_forward(in, NULL): dy (T, C) f32 holds the output gradient
     * and gets the input gradient; weight gradients add into gw. */
    void (*layer_backward)(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                           const mt_layer_acts *a);
    /* The head on in (T, C) act: the loss of targets (scaled by loss_scale
     * for the gradients) into the step's loss; with dy (T, C) f32 its input
     * gradient, the head's weight gradients into gw and the LM matrix's into
     * glm. lm is the LM matrix (the embedding's when tied). */
    void (*head)(const mt_exec *x, void *const *w, const void *lm, float *const *gw, float *glm, const void *in,
                 const int32_t *targets, float loss_scale, float *dy);
    /* Next-token logits at the last position of each sequence: out[n_seq * V] in host memory. */
    void (*head_logits)(const mt_exec *x, void *const *w, const void *lm, const void *in, float *out);
} mt_template;

/* From the positions of a micro-batch (n_seq sequences of seq_len, each
 * token's position in its document; NULL: one document a sequence): pos, the
 * positions RoPE rotates by, and doc_start, the index in its sequence of each
 * token's first key (its document's first token). Returns whether the
 * micro-batch has more than one document in any sequence. */
int mt_doc_layout(int32_t *pos, int32_t *doc_start, const int32_t *positions, int n_seq, int seq_len);

/* The first key of each token in a sliding window's layers: the later of
 * its document's first token and its window's, i - window + 1 (in its
 * sequence); window -N (Llama 4's chunked attention): its chunk's first,
 * N * floor(i / N), as transformers' chunked mask counts i in the sequence.
 * Nondecreasing along each sequence like doc_start, so the attentions take
 * it where they take doc_start. */
void mt_window_starts(int32_t *win, const int32_t *doc_start, int n_seq, int seq_len, int window);

/* The template of a validated config's family. */
const mt_template *mt_template_for(const mt_model_config *cfg);

/* MT_ERR_UNSUPPORTED, naming the architecture, where it has no template. */
mt_status mt_template_check(mt_err err, const mt_model_config *cfg);

/* The template of Llama, Qwen2, Mistral, Qwen3 and Phi-3 (src/model/llama.c). */
extern const mt_template mt_template_llama;
/* The template of Gemma 2 and Gemma 3 (src/model/gemma.c). */
extern const mt_template mt_template_gemma;

/* The attention half of the Llama template's layer, for templates that change only the MLP:
 * the forward from in (T, C) to a->h and xn2 = rmsnorm(h) (recompute: skipping what a says was kept);
 * the backward, with x->w->dxn holding the gradient of xn2 (f32) and dy that of the layer's output,
 * leaves the gradient of in in dy. */
void mt_llama_attn_forward(const mt_exec *x, void *const *w, const void *in, const mt_layer_acts *a, int recompute);
void mt_llama_attn_backward(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                            const mt_layer_acts *a);

/* The most experts a model may have (mt_config_import's bound). */
#define MT_MAX_EXPERTS 1024

/* The template of Qwen3-MoE and Mixtral (src/model/moe.c): Llama's attention, and on the sparse
 * layers a router and experts in place of the MLP. */
extern const mt_template mt_template_moe;

/* Pointers to each tensor of a unit inside a block laid out like its tile,
 * of es-byte elements; roles the unit lacks are NULL. */
void mt_bind_unit(void **w, void *block, const mt_unit_desc *u, size_t es);
void mt_bind_unit_f32(float **w, float *block, const mt_unit_desc *u);

#endif
