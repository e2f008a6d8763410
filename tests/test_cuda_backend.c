/* The CUDA backend against the CPU backend on the same models and batches.
 * These tests need a GPU; on a machine without one each says so and skips
 * (fails under MT_REQUIRE_GPU=1, tests/gpu.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "engine/engine.h"
#include "gpu.h"


enum { V = 211 };

/* family: 0 Llama, 1 Qwen2 (q/k/v biases), QWEN3 (norms of q and k), MISTRAL_WINDOW (every layer
 * slides over 24 keys), QWEN2_WINDOW (biases; the second layer slides over 32) */
enum { QWEN3 = 2, MISTRAL_WINDOW = 3, QWEN2_WINDOW = 4 };

static mt_model_config cfg_of(int precision, int family, int tied, int head_dim)
{
    mt_model_config c;
    mt_model_config_init(&c);
    const int bias = family == 1 || family == QWEN2_WINDOW;
    c.arch = bias ? MT_ARCH_QWEN2 : family == QWEN3 ? MT_ARCH_QWEN3 : family == MISTRAL_WINDOW ? MT_ARCH_MISTRAL
                                                                                               : MT_ARCH_LLAMA;
    c.sliding_window = family == MISTRAL_WINDOW ? 24 : family == QWEN2_WINDOW ? 32 : 0;
    c.max_window_layers = family == QWEN2_WINDOW;
    c.vocab_size = V;
    /* 4 heads (2 kv heads), or 2 (1) at head_dim 256: widths of at most 512,
     * where this initialisation (0.1) keeps the model unsaturated. At 1024
     * wide the untrained loss is 9.8 against ln V = 5.4, and the bf16
     * backward of such peaked softmaxes is noise (20% in the embedding). */
    const uint32_t heads = head_dim > 128 ? 2 : 4;
    c.hidden_size = heads * (uint32_t)head_dim;
    c.intermediate_size = 200;
    c.num_hidden_layers = 2;
    c.num_attention_heads = heads;
    c.num_key_value_heads = heads / 2;
    c.head_dim = (uint32_t)head_dim;
    c.attention_bias = (uint32_t)bias;
    c.tie_word_embeddings = (uint32_t)tied;
    c.precision = (uint32_t)precision;
    c.max_position_embeddings = 256;
    c.initializer_range = 0.1f;
    c.seed = 5;
    return c;
}

/* The model, or the test ended (tests/gpu.h) where there is no CUDA device. */
static mt_model *make_with(const mt_model_config *c, const mt_offload_policy *p)
{
    mt_model *m = NULL;
    mt_status st = mt_model_create(&m, c, p);
    if (st == MT_ERR_NO_DEVICE) MT_GPU_MISSING("no CUDA device: %s", mt_last_errmsg());
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    return m;
}

static mt_offload_policy quiet_policy(int backend)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = (uint32_t)backend;
    p.log_level = MT_LOG_ERROR;
    return p;
}

static mt_model *make(const mt_model_config *c, int backend, int slots)
{
    mt_offload_policy p = quiet_policy(backend);
    p.weight_slots = (uint32_t)slots;
    return make_with(c, &p);
}

static void fill(int32_t *tok, int32_t *tg, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((seed = seed * 1103515245u + 12345u) >> 16) % V;
    for (int i = 0; i < n; i++) tg[i] = i % 7 == 3 ? MT_IGNORE_INDEX : tok[(i + 1) % n];
}

static mt_batch batch_of(const int32_t *tok, const int32_t *tg, int b, int s, int m)
{
    mt_batch x;
    mt_batch_init(&x);
    x.micro_batch_size = (uint32_t)b, x.seq_len = (uint32_t)s, x.num_micro_batches = (uint32_t)m;
    x.tokens = tok, x.targets = tg;
    return x;
}

static uint64_t count_targets(const int32_t *tg, int n)
{
    uint64_t c = 0;
    for (int i = 0; i < n; i++) c += tg[i] != MT_IGNORE_INDEX;
    return c;
}

/* The gradients of every tensor, in fp32 (bf16 mode: the bf16 values the tile received). */
static float *grads(const mt_model *m)
{
    float *g = malloc(m->layout.num_params * sizeof *g);
    size_t k = 0;
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        const mt_tile *t = &m->tiles.tile[u];
        for (int i = 0; i < d->n_tensors; i++) {
            const mt_tensor_desc *td = &d->tensors[i];
            for (uint64_t e = 0; e < td->numel; e++) {
                if (mt_tile_grad_f32(t, d)) {
                    g[k++] = mt_tile_grad_f32(t, d)[td->offset + e];
                } else { /* bf16: in the weight block, or lean mode's gradient block */
                    uint32_t x = (uint32_t)mt_tile_grad_bf16(t, d)[td->offset + e] << 16;
                    memcpy(&g[k++], &x, 4);
                }
            }
        }
    }
    return g;
}

/* max |a - b| / max |b| and ||a - b|| / ||b|| */
static void compare(const float *a, const float *b, uint64_t n, double *max_rel, double *l2_rel)
{
    double mx = 0, md = 0, dd = 0, bb = 0;
    for (uint64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        mx = fmax(mx, fabs(b[i]));
        md = fmax(md, fabs(d));
        dd += d * d, bb += (double)b[i] * b[i];
    }
    *max_rel = mx > 0 ? md / mx : md;
    *l2_rel = bb > 0 ? sqrt(dd / bb) : sqrt(dd);
}

/* One forward and backward on both backends from the same weights.
 * fp32: every operation in fp32 on both sides, only summation orders differ
 * (cuBLASLt's tiling, the attention's blocks): the loss to 1e-5 relative and
 * every gradient to 1e-4 of the largest (measured: 4e-6).
 * bf16: the GPU rounds activations, attention probabilities and the GEMM
 * operands to bf16 (unit roundoff 2^-9) while the CPU computes in fp32 from the
 * same bf16 weights. The error is noise spread evenly over all tensors:
 * measured relative L2 errors of 2-5% per tensor, up to 8.4% in the first
 * layer with head_dim 128 and 9% in the embedding with head_dim 256, where
 * this test's large initialisation (0.1) gives peaked softmaxes whose
 * backward cancels. A wrong term in any gradient gives
 * errors of order 100% in the tensors it reaches. Bounds: loss 1% relative,
 * norm 2%, every tensor's gradient within 10% relative L2 error. */
static void step_matches_cpu_with(int precision, int family, int tied, int head_dim, int S, uint32_t attention,
                                  uint32_t attention_flags)
{
    mt_model_config c = cfg_of(precision, family, tied, head_dim);
    mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
    p.attention = attention, p.attention_flags = attention_flags;
    mt_model *gpu = make_with(&c, &p), *cpu = make(&c, MT_BACKEND_CPU, 2);
    enum { B = 2, M = 2, N_MAX = B * 256 * M };
    cr_assert_leq(S, 256);
    const int N = B * S * M;
    int32_t tok[N_MAX], tg[N_MAX];
    fill(tok, tg, N, 3);
    mt_batch b = batch_of(tok, tg, B, S, M);
    double lg, ng, lc, nc;
    cr_assert_eq(mt_engine_grads(gpu, &b, count_targets(tg, N), &lg, &ng, NULL), MT_OK, "%s", mt_model_errmsg(gpu));
    cr_assert_eq(mt_engine_grads(cpu, &b, count_targets(tg, N), &lc, &nc, NULL), MT_OK, "%s", mt_model_errmsg(cpu));
    const int fp32 = precision == MT_PRECISION_FP32;
    cr_log_info("precision %d: loss %.7f vs %.7f, norm %.6f vs %.6f", precision, lg, lc, ng, nc);
    cr_assert(fabs(lg - lc) <= (fp32 ? 1e-5 : 1e-2) * fabs(lc), "loss %.7f (GPU) vs %.7f (CPU)", lg, lc);
    cr_assert(fabs(ng - nc) <= (fp32 ? 1e-4 : 2e-2) * nc, "norm %.6f (GPU) vs %.6f (CPU)", ng, nc);
    float *gg = grads(gpu), *gc = grads(cpu);
    uint64_t off = 0;
    for (int u = 0; u < gpu->layout.n_units; u++)
        for (int i = 0; i < gpu->layout.units[u].n_tensors; i++) {
            const mt_tensor_desc *td = &gpu->layout.units[u].tensors[i];
            double max_rel, l2_rel;
            compare(gg + off, gc + off, td->numel, &max_rel, &l2_rel);
            cr_log_info("  %-48s max %.3g of the largest, relative L2 %.3g", td->name, max_rel, l2_rel);
            if (fp32)
                cr_assert(max_rel <= 1e-4, "%s: gradients differ by %.3g of the largest", td->name, max_rel);
            else
                cr_assert(l2_rel <= 0.1, "%s: gradients differ by %.3g (relative L2)", td->name, l2_rel);
            off += td->numel;
        }
    free(gg), free(gc);
    mt_model_destroy(gpu);
    mt_model_destroy(cpu);
}

static void step_matches_cpu(int precision, int family, int tied, int head_dim)
{
    step_matches_cpu_with(precision, family, tied, head_dim, 77, MT_ATTENTION_AUTO, 0);
}

Test(cuda_backend, step_matches_cpu_fp32) { step_matches_cpu(MT_PRECISION_FP32, 0, 0, 64); }

/* cuDNN's attention both ways (S a multiple of 128, which every cuDNN 9
 * backward takes; the policy requires cuDNN, so a refusal fails the test
 * rather than falling back), its non-deterministic backward, and the
 * library's kernels alone: each within the bf16 bounds above. */
Test(cuda_backend, step_matches_cpu_bf16_cudnn) { step_matches_cpu_with(MT_PRECISION_BF16, 1, 0, 128, 128, MT_ATTENTION_CUDNN, 0); }
Test(cuda_backend, step_matches_cpu_bf16_cudnn_nondeterministic)
{
    step_matches_cpu_with(MT_PRECISION_BF16, 0, 1, 64, 256, MT_ATTENTION_CUDNN, MT_ATTENTION_NONDETERMINISTIC);
}
Test(cuda_backend, step_matches_cpu_bf16_kernels) { step_matches_cpu_with(MT_PRECISION_BF16, 0, 0, 64, 128, MT_ATTENTION_KERNELS, 0); }
Test(cuda_backend, step_matches_cpu_fp32_bias_tied) { step_matches_cpu(MT_PRECISION_FP32, 1, 1, 32); }
/* Qwen3: the norms of each head of q and k (rows of D on both backends) */
Test(cuda_backend, qwen3_step_matches_cpu_fp32) { step_matches_cpu(MT_PRECISION_FP32, QWEN3, 0, 64); }
Test(cuda_backend, qwen3_step_matches_cpu_bf16_cudnn)
{
    step_matches_cpu_with(MT_PRECISION_BF16, QWEN3, 1, 128, 128, MT_ATTENTION_CUDNN, 0);
}
/* Sliding windows: the kernels take the window's first keys; cuDNN runs the layer that attends fully */
Test(cuda_backend, window_step_matches_cpu_fp32) { step_matches_cpu(MT_PRECISION_FP32, MISTRAL_WINDOW, 0, 64); }
Test(cuda_backend, window_step_matches_cpu_bf16) { step_matches_cpu(MT_PRECISION_BF16, MISTRAL_WINDOW, 0, 64); }
Test(cuda_backend, window_step_matches_cpu_bf16_cudnn_full_layer)
{
    step_matches_cpu_with(MT_PRECISION_BF16, QWEN2_WINDOW, 1, 128, 128, MT_ATTENTION_AUTO, 0);
}
Test(cuda_backend, step_matches_cpu_bf16) { step_matches_cpu(MT_PRECISION_BF16, 0, 0, 64); }
/* lean mode: the same bf16 arithmetic, the gradients landing in their own block */
Test(cuda_backend, step_matches_cpu_lean) { step_matches_cpu(MT_PRECISION_LEAN, 1, 1, 64); }
Test(cuda_backend, step_matches_cpu_bf16_bias_tied_d128) { step_matches_cpu(MT_PRECISION_BF16, 1, 1, 128); }
/* Head sizes between the attention's tiles (padded) and the largest, 256 */
Test(cuda_backend, step_matches_cpu_fp32_d16) { step_matches_cpu(MT_PRECISION_FP32, 0, 0, 16); }
Test(cuda_backend, step_matches_cpu_bf16_d80) { step_matches_cpu(MT_PRECISION_BF16, 0, 0, 80); }
Test(cuda_backend, step_matches_cpu_bf16_bias_d96) { step_matches_cpu(MT_PRECISION_BF16, 1, 0, 96); }
Test(cuda_backend, step_matches_cpu_fp32_tied_d96) { step_matches_cpu(MT_PRECISION_FP32, 0, 1, 96); }
Test(cuda_backend, step_matches_cpu_bf16_d256) { step_matches_cpu(MT_PRECISION_BF16, 0, 0, 256); }
Test(cuda_backend, step_matches_cpu_fp32_d256) { step_matches_cpu(MT_PRECISION_FP32, 0, 0, 256); }

/* Compares every byte of two models' tiles, once their last AdamW updates
 * (which run behind mt_step on a library thread) have finished. */
static int tiles_equal(mt_model *a, mt_model *b)
{
    mt_optimizer_drain(&a->opt);
    mt_optimizer_drain(&b->opt);
    for (int u = 0; u < a->layout.n_units; u++)
        if (memcmp(a->tiles.tile[u].base, b->tiles.tile[u].base, a->layout.units[u].tile_bytes)) return 0;
    return 1;
}

/* steps of 2 micro-batches of 2 sequences of S <= 128 tokens */
static void train_s(mt_model *m, int steps, int S)
{
    enum { B = 2, N_MAX = B * 128 * 2 };
    cr_assert_leq(S, 128);
    const int N = B * S * 2;
    int32_t tok[N_MAX], tg[N_MAX];
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 3e-3f;
    for (int s = 0; s < steps; s++) {
        fill(tok, tg, N, 100u + (unsigned)s);
        mt_batch b = batch_of(tok, tg, B, S, 2);
        mt_step_stats st;
        mt_step_stats_init(&st);
        cr_assert_eq(mt_step(m, &b, &o, &st), MT_OK, "%s", mt_model_errmsg(m));
    }
}

static void train(mt_model *m, int steps) { train_s(m, steps, 64); }

/* One step that must fail with st, naming fp32 (cuDNN's attention has none). */
static void train_expect(mt_model *m, mt_status want)
{
    enum { B = 2, S = 64, N = B * S * 2 };
    int32_t tok[N], tg[N];
    mt_optim_config o;
    mt_optim_config_init(&o);
    fill(tok, tg, N, 100u);
    mt_batch b = batch_of(tok, tg, B, S, 2);
    mt_step_stats st;
    mt_step_stats_init(&st);
    cr_assert_eq(mt_step(m, &b, &o, &st), want, "%s", mt_model_errmsg(m));
    cr_assert(strstr(mt_model_errmsg(m), "fp32"), "%s", mt_model_errmsg(m));
}

Test(cuda_backend, two_and_three_slots_and_reruns_are_bit_identical)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 1, 64);
    mt_model *a = make(&c, MT_BACKEND_CUDA, 2), *b = make(&c, MT_BACKEND_CUDA, 3), *d = make(&c, MT_BACKEND_CUDA, 2);
    train(a, 4);
    train(b, 4);
    train(d, 4);
    cr_assert(tiles_equal(a, b), "K=2 and K=3 give the same bits");
    cr_assert(tiles_equal(a, d), "two runs give the same bits");
    mt_model_destroy(a);
    mt_model_destroy(b);
    mt_model_destroy(d);
}

/* Lean mode on the GPU: two runs give the same bits (the optimizer thread's
 * stochastic rounding, behind the next step's forward, included) and the
 * model learns as the bf16 mode's does: 8 steps on one batch, which both
 * memorise (the H200: 6.52 -> 0.0173 lean, 6.52 -> 0.0067 bf16), the two
 * final losses within 2% of the initial one of each other (a lean update
 * that did nothing or the wrong thing leaves the loss near its start). */
static double eval_loss(mt_model *m, const mt_batch *b)
{
    mt_eval_stats st;
    mt_eval_stats_init(&st);
    cr_assert_eq(mt_eval(m, b, &st), MT_OK, "%s", mt_model_errmsg(m));
    return st.loss;
}

Test(cuda_backend, lean_runs_are_bit_identical_and_train_like_bf16)
{
    mt_model_config c = cfg_of(MT_PRECISION_LEAN, 1, 1, 64), cb = cfg_of(MT_PRECISION_BF16, 1, 1, 64);
    mt_model *ms[3] = {make(&c, MT_BACKEND_CUDA, 2), make(&c, MT_BACKEND_CUDA, 2), make(&cb, MT_BACKEND_CUDA, 2)};
    enum { B = 2, S = 64, N = B * S * 2 };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 100u);
    mt_batch b = batch_of(tok, tg, B, S, 2);
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 3e-3f;
    double first[3], last[3];
    for (int k = 0; k < 3; k++) {
        first[k] = eval_loss(ms[k], &b);
        for (int s = 0; s < 8; s++) cr_assert_eq(mt_step(ms[k], &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(ms[k]));
        last[k] = eval_loss(ms[k], &b);
    }
    cr_assert(tiles_equal(ms[0], ms[1]), "two lean runs give the same bits");
    cr_log_info("lean: loss %.4f -> %.4f; bf16: %.4f -> %.4f", first[0], last[0], first[2], last[2]);
    cr_assert(fabs(first[0] - first[2]) <= 1e-3 * first[2], "the same initial model");
    cr_assert(last[2] < 0.1 * first[2] && last[0] < 0.1 * first[0], "both learned: lean %.4f -> %.4f, bf16 %.4f -> %.4f",
              first[0], last[0], first[2], last[2]);
    cr_assert(fabs(last[0] - last[2]) <= 0.02 * first[2], "lean %.4f against bf16 %.4f", last[0], last[2]);
    for (int k = 0; k < 3; k++) mt_model_destroy(ms[k]);
}

/* Training through cuDNN's attention (deterministic backward) twice gives
 * the same bits (sequences of 128: every cuDNN 9 backward takes them; cuDNN
 * before 9.16 refuses 64, which the policy's CUDNN then turns into an error);
 * a model in fp32 that requires cuDNN is refused, naming why. */
Test(cuda_backend, cudnn_runs_are_bit_identical)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 1, 64);
    mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
    p.attention = MT_ATTENTION_CUDNN;
    mt_model *a = make_with(&c, &p), *b = make_with(&c, &p);
    train_s(a, 3, 128);
    train_s(b, 3, 128);
    cr_assert(tiles_equal(a, b), "two runs through cuDNN give the same bits");
    mt_model_destroy(a);
    mt_model_destroy(b);
    c.precision = MT_PRECISION_FP32;
    mt_model *m = NULL;
    mt_status st = mt_model_create(&m, &c, &p);
    if (st == MT_OK) { /* the refusal may come with the first batch shape */
        train_expect(m, MT_ERR_UNSUPPORTED);
        mt_model_destroy(m);
    } else {
        cr_assert_eq(st, MT_ERR_UNSUPPORTED, "%s", mt_last_errmsg());
        cr_assert(strstr(mt_last_errmsg(), "fp32"), "%s", mt_last_errmsg());
    }
}

Test(cuda_backend, trains_and_logits_match_cpu)
{
    mt_model_config c = cfg_of(MT_PRECISION_FP32, 0, 1, 64);
    mt_model *gpu = make(&c, MT_BACKEND_CUDA, 2), *cpu = make(&c, MT_BACKEND_CPU, 2);
    train(gpu, 3);
    train(cpu, 3);
    enum { S = 33 };
    int32_t tok[2 * S], tg[2 * S];
    fill(tok, tg, 2 * S, 77);
    float lg[2 * V], lc[2 * V];
    cr_assert_eq(mt_model_logits(gpu, tok, 2, S, lg), MT_OK, "%s", mt_model_errmsg(gpu));
    cr_assert_eq(mt_model_logits(cpu, tok, 2, S, lc), MT_OK, "%s", mt_model_errmsg(cpu));
    double rel, l2;
    compare(lg, lc, 2 * V, &rel, &l2);
    /* three AdamW steps amplify fp32 summation-order differences of the
     * gradients only where they are near zero; the logits stay within 1e-3 */
    cr_assert(rel < 1e-3, "logits differ by %.3g of the largest", rel);
    mt_model_destroy(gpu);
    mt_model_destroy(cpu);
}

/* Activation checkpoints in pinned host memory (two rotating device rows,
 * copies on the d2h and h2d streams) compute exactly what device checkpoints
 * compute: all that can travel (policy HOST: checkpoints 0..3 of a 5-layer
 * model travel, 4 and 5 stay in the rows), and the split the backend makes
 * when only some fit the GPU (the first 1, 2 or 3 on the host, the rest in
 * rows of their own), so that the rotation meets the device rows at every
 * place. The backend's log says how many it put on the host. */
static void note_host(mt_log_level level, const char *text, void *user)
{
    (void)level;
    const char *q = strstr(text, "activation checkpoints in pinned host memory");
    if (!strstr(text, "CUDA backend: ") || !q) return;
    /* ", N of M activation checkpoints ...": N follows the comma before */
    while (q > text && q[-1] != ',') q--;
    sscanf(q, " %d", (int *)user);
}

Test(cuda_backend, host_checkpoints_are_bit_identical)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 0, 64);
    c.num_hidden_layers = 5;
    enum { RUNS = 5 };
    mt_model *m[RUNS];
    const uint32_t forced[RUNS] = {0, 0, 1, 2, 3};
    for (int i = 0; i < RUNS; i++) {
        mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
        p.activations = i == 1 ? MT_PLACE_HOST : MT_PLACE_DEVICE;
        int host = 0;
        p.log_level = MT_LOG_INFO;
        p.log_callback = note_host;
        p.log_user_data = &host;
        m[i] = make_with(&c, &p);
        m[i]->host_checkpoints = forced[i];
        train(m[i], 3);
        const int want = i == 0 ? 0 : i == 1 ? 4 : (int)forced[i];
        cr_assert_eq(host, want, "run %d: %d checkpoints on the host, expected %d", i, host, want);
    }
    for (int i = 1; i < RUNS; i++)
        cr_assert(tiles_equal(m[0], m[i]), "run %d (%u forced to the host) gives the bits of device checkpoints", i,
                  forced[i]);
    for (int i = 0; i < RUNS; i++) mt_model_destroy(m[i]);
}

/* Checkpoints the backward recomputes (the forward of the layer below again,
 * into one spare row) compute what kept ones compute: 1 and 2 of a 5-layer
 * model's, and 1 beside a host checkpoint (the rotating rows meet the
 * recomputed one). The backend's log names them; the timeline has one more
 * visit for each. */
typedef struct ck_note {
    int host, recomputed;
} ck_note;

static void note_checkpoints(mt_log_level level, const char *text, void *user)
{
    ck_note *n = (ck_note *)user;
    note_host(level, text, &n->host);
    const char *q = strstr(text, "checkpoints recomputed in the backward");
    if (!strstr(text, "CUDA backend: ") || !q) return;
    while (q > text && q[-1] != ',') q--;
    sscanf(q, " %d", &n->recomputed);
}

Test(cuda_backend, recomputed_checkpoints_are_bit_identical)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 0, 64);
    c.num_hidden_layers = 5;
    enum { RUNS = 4 };
    mt_model *m[RUNS];
    const uint32_t host[RUNS] = {0, 0, 0, 1}, rc[RUNS] = {0, 1, 2, 1};
    for (int i = 0; i < RUNS; i++) {
        mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
        ck_note n = {0, 0};
        p.log_level = MT_LOG_INFO;
        p.log_callback = note_checkpoints;
        p.log_user_data = &n;
        p.timeline = 1;
        m[i] = make_with(&c, &p);
        m[i]->host_checkpoints = host[i];
        m[i]->recomputed_checkpoints = rc[i];
        train(m[i], 3);
        cr_assert_eq(n.host, (int)host[i], "run %d: %d checkpoints on the host", i, n.host);
        cr_assert_eq(n.recomputed, (int)rc[i], "run %d: %d checkpoints recomputed", i, n.recomputed);
        mt_timeline t;
        mt_timeline_init(&t);
        cr_assert_eq(mt_model_timeline(m[i], &t, NULL, 0), MT_OK, "%s", mt_model_errmsg(m[i]));
        cr_assert_eq(t.n_visits, 2 * 5 + 3 + rc[i], "run %d: %u visits", i, t.n_visits);
    }
    for (int i = 1; i < RUNS; i++)
        cr_assert(tiles_equal(m[0], m[i]), "run %d (%u on the host, %u recomputed) gives the bits of kept checkpoints",
                  i, host[i], rc[i]);
    for (int i = 0; i < RUNS; i++) mt_model_destroy(m[i]);
}

/* The timeline of a step: every visit (2L + 3: the embedding, L layers and
 * the head forward, L layers and the embedding backward) in the engine's order, each starting
 * only after its weights arrived (the events are ordered by the stream
 * waits), busy time and waits adding up to the step's wall time (1 us: the
 * sum of ~20 differences of doubles), and the copies' bytes those the step
 * must move: every unit's bf16 weights on the way in (the layers twice,
 * forward and backward), every unit's bf16 gradients on the way out, and
 * with host checkpoints L-1 rows out and back. */
static void timeline_of(int place)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 0, 64);
    c.num_hidden_layers = 4;
    const int L = 4;
    mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
    p.activations = (uint32_t)place;
    p.timeline = 1;
    mt_model *m = make_with(&c, &p);
    enum { B = 2, S = 64, MB = 2, N = B * S * MB };
    int32_t tok[N], tg[N];
    mt_optim_config o;
    mt_optim_config_init(&o);
    mt_timeline tl;
    mt_timeline_init(&tl);
    cr_assert_eq(mt_model_timeline(m, &tl, NULL, 0), MT_ERR_INVALID_ARGUMENT, "no step yet");
    uint64_t w_bytes = 0, layer_bytes = 0;
    for (int u = 0; u < m->layout.n_units; u++) w_bytes += m->layout.units[u].weight_bytes;
    for (int u = 1; u <= L; u++) layer_bytes += m->layout.units[u].weight_bytes;
    const uint64_t row = (uint64_t)MB * B * S * c.hidden_size * 2;
    const uint64_t ck = place == MT_PLACE_HOST ? (uint64_t)(L - 1) * row : 0;
    for (int s = 0; s < 3; s++) {
        fill(tok, tg, N, 7u + (unsigned)s);
        mt_batch b = batch_of(tok, tg, B, S, MB);
        mt_step_stats ss;
        mt_step_stats_init(&ss);
        cr_assert_eq(mt_step(m, &b, &o, &ss), MT_OK, "%s", mt_model_errmsg(m));
        cr_assert_float_eq(ss.forward_seconds + ss.backward_seconds + ss.optimizer_seconds, ss.seconds, 1e-9);
        cr_assert_gt(ss.forward_seconds, 0.0);
        cr_assert_gt(ss.backward_seconds, 0.0);
        mt_timeline_visit v[2 * L + 3];
        cr_assert_eq(mt_model_timeline(m, &tl, v, 2 * L + 3), MT_OK, "%s", mt_model_errmsg(m));
        cr_assert_eq(tl.step, (uint64_t)s + 1);
        cr_assert_eq(tl.n_visits, (uint32_t)(2 * L + 3));
        cr_assert_float_eq(tl.seconds, ss.seconds, 1e-9);
        double sum = tl.busy_seconds;
        for (int k = 0; k < MT_WAIT_COUNT; k++) {
            cr_assert_geq(tl.wait_seconds[k], 0.0, "wait %d", k);
            sum += tl.wait_seconds[k];
        }
        cr_assert_float_eq(sum, tl.seconds, 1e-6);
        cr_assert_gt(tl.busy_seconds, 0.0);
        cr_assert_eq(tl.h2d_bytes, w_bytes + layer_bytes + ck, "h2d %llu", (unsigned long long)tl.h2d_bytes);
        cr_assert_eq(tl.d2h_bytes, w_bytes + ck, "d2h %llu", (unsigned long long)tl.d2h_bytes);
        for (int i = 0; i < 2 * L + 3; i++) {
            const int unit = i <= L + 1 ? i : 2 * L + 2 - i;
            const int phase = i <= L ? MT_PHASE_FORWARD : i == L + 1 ? MT_PHASE_HEAD : MT_PHASE_BACKWARD;
            cr_assert_eq(v[i].unit, (uint32_t)unit, "visit %d", i);
            cr_assert_eq(v[i].phase, (uint32_t)phase, "visit %d", i);
            cr_assert_leq(v[i].start, v[i].end, "visit %d", i);
            if (i) cr_assert_geq(v[i].start, v[i - 1].end - 1e-6, "visit %d", i);
            if (unit == 0 && phase == MT_PHASE_BACKWARD) {
                cr_assert_eq(v[i].weights_start, -1.0, "the embedding's backward needs no weights");
            } else {
                cr_assert_leq(v[i].weights_start, v[i].weights_end, "visit %d", i);
                cr_assert_leq(v[i].weights_end, v[i].start + 1e-6, "visit %d began before its weights arrived", i);
            }
        }
        /* a caller built against 0.1 passes 0.1's size: the same step in 0.1's layout */
        mt_timeline_0_1 old;
        mt_timeline_visit_0_1 ov[2 * L + 3];
        memset(&old, 0xff, sizeof old);
        memset(ov, 0xff, sizeof ov);
        old.struct_size = MT_SIZE_TIMELINE_0_1;
        cr_assert_eq(mt_model_timeline(m, (mt_timeline *)&old, (mt_timeline_visit *)ov, 2 * L + 3), MT_OK, "%s",
                     mt_model_errmsg(m));
        cr_assert_eq(old.struct_size, MT_SIZE_TIMELINE_0_1);
        cr_assert_eq(old.step, tl.step);
        cr_assert_eq(old.n_visits, tl.n_visits);
        cr_assert_eq(old.busy_seconds, tl.busy_seconds);
        cr_assert_eq(old.d2h_bytes, tl.d2h_bytes);
        cr_assert_eq(memcmp(old.wait_seconds, tl.wait_seconds, sizeof old.wait_seconds), 0);
        for (int i = 0; i < 2 * L + 3; i++) {
            cr_assert_eq(ov[i].unit, v[i].unit);
            cr_assert_eq(ov[i].end, v[i].end);
            cr_assert_eq(memcmp(ov[i].wait_seconds, v[i].wait_seconds, sizeof ov[i].wait_seconds), 0);
        }
    }
    mt_model_destroy(m);
}

Test(cuda_backend, timeline_accounts_for_the_step) { timeline_of(MT_PLACE_DEVICE); }
Test(cuda_backend, timeline_with_host_checkpoints) { timeline_of(MT_PLACE_HOST); }

/* What the backend's log says it kept: layers with attention outputs, of
 * how many, layers with residuals, layers with q/k/v; all -1 until it says. */
typedef struct kept_note {
    int att, layers, h, qkv;
} kept_note;

static void note_kept(mt_log_level level, const char *text, void *user)
{
    (void)level;
    kept_note *k = user;
    const char *p = strstr(text, "CUDA backend: ");
    if (!p) return;
    const char *q = strstr(p, "attention outputs of ");
    if (!q || sscanf(q, "attention outputs of %d of %d layers, residuals of %d, q/k/v of %d", &k->att, &k->layers,
                     &k->h, &k->qkv) != 4)
        k->att = k->h = k->qkv = 0;
}

/* Trains a 3-layer model with the given recompute policy and cap on the
 * layers that keep activations (0: none), noting what the backend kept. */
static mt_model *train_kept(int recompute, uint32_t cap, kept_note *k)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 0, 64);
    c.num_hidden_layers = 3;
    mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
    p.recompute = (uint32_t)recompute;
    p.log_level = MT_LOG_INFO;
    p.log_callback = note_kept;
    p.log_user_data = k;
    *k = (kept_note){-1, -1, -1, -1};
    mt_model *m = make_with(&c, &p);
    m->keep_layers_cap = cap;
    train(m, 3);
    return m;
}

/* Activations kept from the forward (recompute AUTO, where they fit: on this
 * small model the attention outputs, the residuals after attention and q, k,
 * v of every layer; with a cap of 2 of the 3 layers, the attention outputs of
 * layers 1 and 2 alone, since residuals come only once every layer has its
 * attention, and q, k, v once every layer has its residual) give the bits a
 * full recompute gives: the backward reads what the recompute would have
 * computed again, by the same kernels. The backend's log says what it kept. */
Test(cuda_backend, kept_attention_is_bit_identical)
{
    kept_note all, some, none;
    mt_model *a = train_kept(MT_RECOMPUTE_AUTO, 0, &all);
    mt_model *s = train_kept(MT_RECOMPUTE_AUTO, 2, &some);
    mt_model *f = train_kept(MT_RECOMPUTE_FULL, 0, &none);
    cr_assert(all.att == 3 && all.layers == 3 && all.h == 3 && all.qkv == 3,
              "AUTO keeps every layer's attention (%d of %d), residual (%d) and q/k/v (%d)", all.att, all.layers,
              all.h, all.qkv);
    cr_assert(some.att == 2 && some.h == 0 && some.qkv == 0,
              "a cap of 2 keeps 2 layers' attention (%d), no residuals (%d), no q/k/v (%d)", some.att, some.h,
              some.qkv);
    cr_assert(none.att == 0 && none.h == 0 && none.qkv == 0, "FULL keeps nothing (%d, %d, %d)", none.att, none.h,
              none.qkv);
    cr_assert(tiles_equal(a, f), "kept attention, residuals and q/k/v give the bits of a full recompute");
    cr_assert(tiles_equal(s, f), "attention kept for some layers gives the bits of a full recompute");
    mt_model_destroy(a);
    mt_model_destroy(s);
    mt_model_destroy(f);
}

/* whole and other, the same model with other knobs, on one batch: fp32 sums in another order, so
 * the loss to 1e-6 relative and every gradient to 1e-5 of its tensor's largest. Destroys both. */
static void same_sums_as_whole(mt_model *whole, mt_model *other, const char *what, unsigned seed)
{
    enum { B = 2, S = 77, M = 2, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, seed);
    mt_batch b = batch_of(tok, tg, B, S, M);
    double lw, nw, lo, no;
    cr_assert_eq(mt_engine_grads(whole, &b, count_targets(tg, N), &lw, &nw, NULL), MT_OK, "%s", mt_model_errmsg(whole));
    cr_assert_eq(mt_engine_grads(other, &b, count_targets(tg, N), &lo, &no, NULL), MT_OK, "%s",
                 mt_model_errmsg(other));
    cr_assert(fabs(lo - lw) <= 1e-6 * fabs(lw), "loss %.9f (%s) vs %.9f (whole)", lo, what, lw);
    float *go = grads(other), *gw = grads(whole);
    uint64_t off = 0;
    for (int u = 0; u < whole->layout.n_units; u++)
        for (int i = 0; i < whole->layout.units[u].n_tensors; i++) {
            const mt_tensor_desc *td = &whole->layout.units[u].tensors[i];
            double max_rel, l2_rel;
            compare(go + off, gw + off, td->numel, &max_rel, &l2_rel);
            cr_assert(max_rel <= 1e-5, "%s (%s): gradients differ by %.3g of the largest", td->name, what, max_rel);
            off += td->numel;
        }
    free(go), free(gw);
    mt_model_destroy(whole);
    mt_model_destroy(other);
}

/* The MLP in pieces of tokens (what a 262144-token micro-batch of a 7B model
 * needs) computes what it computes whole: the same kernels on fewer rows, the
 * weight gradients summed piece by piece in fp32. In fp32 the only difference
 * is that summation order: the loss to 1e-6 relative (the loss does not even
 * depend on it: the forward is the same per row) and every gradient to 1e-5 of
 * its tensor's largest (fp32 rounding of sums over ~300 rows is ~1e-7). Pieces
 * of 48 tokens over 2 x 77 = 154 tokens leave a short last piece. */
Test(cuda_backend, mlp_in_pieces_matches_whole)
{
    mt_model_config c = cfg_of(MT_PRECISION_FP32, 1, 0, 64);
    mt_model *whole = make(&c, MT_BACKEND_CUDA, 2), *pieces = make(&c, MT_BACKEND_CUDA, 2);
    pieces->mlp_piece_tokens = 48;
    same_sums_as_whole(whole, pieces, "pieces", 9);
}

/* The head's logits in chunks of 16 tokens with one weight-gradient GEMM per
 * 48 (the backend's rule groups whole chunks within 512 MiB of dlogits; the
 * last group here 58 tokens of a 154-token micro-batch: 16, 16, 16 and a short
 * 10) against one chunk of all 154: fp32, the same sums in another order, so
 * the loss to 1e-6 relative and every gradient to 1e-5 of its tensor's largest,
 * as for the MLP's pieces above. */
Test(cuda_backend, head_gradient_groups_match_one_chunk)
{
    mt_model_config c = cfg_of(MT_PRECISION_FP32, 1, 0, 64);
    mt_model *whole = make(&c, MT_BACKEND_CUDA, 2), *grouped = make(&c, MT_BACKEND_CUDA, 2);
    whole->head_chunk_tokens = 1000;
    grouped->head_chunk_tokens = 16;
    grouped->head_dw_tokens = 48;
    same_sums_as_whole(whole, grouped, "grouped", 13);
}

/* The library works on the policy's device and leaves the calling thread's
 * current device as it found it: a caller whose own work is on device 1
 * trains a model on device 0 and one on device 1 and finds device 1 current
 * after every call, and the two models (same GPUs) end with the same bits.
 * Needs two devices: with one, every device is the caller's. */
Test(cuda_backend, callers_current_device_is_kept)
{
    char why[256] = "";
    const int n = mt_device_count(why, sizeof why);
    if (n == 0) MT_GPU_MISSING("%s", why);
    /* One GPU is a GPU machine, just not one for this test: it skips even
     * under MT_REQUIRE_GPU=1. */
    if (n < 2) cr_skip_test("needs two CUDA devices, found %d", n);
    const int prev = mt_device_use(1);
    cr_assert_eq(mt_device_current(), 1);
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 0, 64);
    mt_model *m[2];
    for (int d = 0; d < 2; d++) {
        mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
        p.device = d;
        m[d] = make_with(&c, &p);
        cr_assert_eq(mt_device_current(), 1, "after mt_model_create on device %d", d);
        train(m[d], 2);
        cr_assert_eq(mt_device_current(), 1, "after mt_step on device %d", d);
        enum { S = 16 };
        int32_t tok[S], tg[S];
        fill(tok, tg, S, 5);
        float lg[V];
        cr_assert_eq(mt_model_logits(m[d], tok, 1, S, lg), MT_OK, "%s", mt_model_errmsg(m[d]));
        cr_assert_eq(mt_device_current(), 1, "after mt_model_logits on device %d", d);
    }
    cr_assert(tiles_equal(m[0], m[1]), "devices 0 and 1 give the same bits");
    for (int d = 0; d < 2; d++) {
        mt_model_destroy(m[d]);
        cr_assert_eq(mt_device_current(), 1, "after mt_model_destroy of device %d's model", d);
    }
    mt_device_restore(prev);
}

/* The abort callback on the GPU: a step stopped at a poll in the forward
 * (while the previous step's AdamW still runs behind it), in the head, and
 * in the backward (after some gradients reached their tiles) returns
 * MT_ERR_ABORTED with every tile byte as it was; the model then trains on
 * with the bits of one that was never stopped. */
typedef struct abort_probe {
    int polls;
    int stop_at;
} abort_probe;

static int probe_abort(void *user_data)
{
    abort_probe *p = user_data;
    return ++p->polls == p->stop_at;
}

Test(cuda_backend, abort_leaves_the_model_as_it_was)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 0, 0, 64);
    c.num_hidden_layers = 4;
    abort_probe probe = {0, 0};
    mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
    p.abort_callback = probe_abort;
    p.abort_user_data = &probe;
    mt_model *a = make_with(&c, &p), *ref = make(&c, MT_BACKEND_CUDA, 2);
    train(a, 1);
    train(ref, 1);
    const int per_step = probe.polls; /* (2L + 3) visits x 2 micro-batches */
    cr_assert_eq(per_step, (2 * 4 + 3) * 2);
    const int stops[] = {1, 2, 6, 11, 12, 15, per_step};
    enum { B = 2, S = 64, N = B * S * 2 };
    int32_t tok[N], tg[N];
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 3e-3f;
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        fill(tok, tg, N, 500u + (unsigned)i);
        mt_batch b = batch_of(tok, tg, B, S, 2);
        probe = (abort_probe){0, stops[i]};
        cr_assert_eq(mt_step(a, &b, &o, NULL), MT_ERR_ABORTED, "poll %d: %s", stops[i], mt_model_errmsg(a));
        cr_assert_eq(mt_model_step_count(a), mt_model_step_count(ref));
        cr_assert(tiles_equal(a, ref), "stopped at poll %d of %d, the tiles changed", stops[i], per_step);
        probe.stop_at = 0;
        mt_step_stats sa, sr;
        mt_step_stats_init(&sa);
        mt_step_stats_init(&sr);
        cr_assert_eq(mt_step(a, &b, &o, &sa), MT_OK, "%s", mt_model_errmsg(a));
        cr_assert_eq(mt_step(ref, &b, &o, &sr), MT_OK, "%s", mt_model_errmsg(ref));
        cr_assert_eq(sa.loss, sr.loss, "after poll %d: the next step's loss", stops[i]);
        cr_assert_eq(sa.grad_norm, sr.grad_norm, "after poll %d: the next step's gradient norm", stops[i]);
    }
    cr_assert(tiles_equal(a, ref));
    mt_model_destroy(a);
    mt_model_destroy(ref);
}

/* ---- several GPUs (engine/group.c) ---------------------------------------------- */

/* A group of one rank (NCCL loaded, a communicator of one GPU, the
 * reduce-scatter a copy in place, the one slice the whole unit): its steps
 * give the plain backend's bits. Needs libnccl.so.2 where the library can
 * load it (on the GPU machine: the CUDA toolkit's, or PyTorch's on
 * LD_LIBRARY_PATH). */
Test(cuda_backend, group_of_one_gpu_is_the_plain_backend)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 1, 1, 64);
    mt_model *plain = make(&c, MT_BACKEND_CUDA, 2), *one = make(&c, MT_BACKEND_CUDA, 2);
    one->force_group = 1;
    train(plain, 3);
    train(one, 3);
    cr_assert(tiles_equal(plain, one), "a group of one GPU changed the bits");
    mt_model_destroy(plain);
    mt_model_destroy(one);
}

/* The tests of two GPUs skip on a machine with one (and fail without a GPU
 * where one is required). */
static void require_two_gpus(void)
{
    char why[256];
    const int n = mt_device_count(why, sizeof why);
    if (n < 1) MT_GPU_MISSING("%s", why);
    if (n < 2) cr_skip_test("needs two GPUs; this machine has %d", n);
}

/* Two GPUs against one, fp32: the same steps' losses to 1e-5 relative and
 * the weights after 3 steps within 1e-4 of each tensor's largest (the
 * reduction adds the two GPUs' partial sums, one GPU adds the micro-batches
 * in turn: the sums' order differs, nothing else). Skips on a machine with
 * one GPU. */
Test(cuda_backend, two_gpus_train_as_one)
{
    require_two_gpus();
    mt_model_config c = cfg_of(MT_PRECISION_FP32, 1, 1, 64);
    mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
    const int32_t devs[2] = {0, 1};
    p.num_devices = 2, p.devices = devs;
    mt_model *two = make_with(&c, &p), *one = make(&c, MT_BACKEND_CUDA, 2);
    enum { B = 2, S = 64, M = 4, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 9);
    mt_batch b = batch_of(tok, tg, B, S, M);
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-3f, o.total_steps = 3;
    for (int s = 0; s < 3; s++) {
        mt_step_stats a, x;
        mt_step_stats_init(&a), mt_step_stats_init(&x);
        cr_assert_eq(mt_step(two, &b, &o, &a), MT_OK, "%s", mt_model_errmsg(two));
        cr_assert_eq(mt_step(one, &b, &o, &x), MT_OK, "%s", mt_model_errmsg(one));
        cr_assert(fabs(a.loss - x.loss) <= 1e-5 * x.loss, "step %d: loss %.7f on two GPUs, %.7f on one", s, a.loss,
                  x.loss);
    }
    mt_optimizer_drain(&two->opt), mt_optimizer_drain(&one->opt);
    for (int u = 0; u < one->layout.n_units; u++) {
        const mt_unit_desc *d = &one->layout.units[u];
        const float *w2 = mt_tile_master(&two->tiles.tile[u], d), *w1 = mt_tile_master(&one->tiles.tile[u], d);
        for (int i = 0; i < d->n_tensors; i++) {
            const mt_tensor_desc *t = &d->tensors[i];
            double top = 0, worst = 0;
            for (uint64_t e = t->offset; e < t->offset + t->numel; e++) top = fmax(top, fabs(w1[e]));
            for (uint64_t e = t->offset; e < t->offset + t->numel; e++) worst = fmax(worst, fabs((double)w2[e] - w1[e]));
            cr_assert(worst <= 1e-4 * top, "%s: weights differ by %.3g of the largest", t->name, worst / top);
        }
    }
    mt_model_destroy(two);
    mt_model_destroy(one);
}

/* Two GPUs fetching each unit's weights in slices (an NCCL all-gather
 * completes them) against the same two fetching whole: the same bits after
 * three steps, in bf16 with a tied head (whose slot holds the embedding
 * behind it) and in lean mode (codes gathered, then made bf16). Skips on a
 * machine with one GPU. */
static void slices_on_two_gpus(int precision, int tied)
{
    require_two_gpus();
    mt_model_config c = cfg_of(precision, 1, tied, 64);
    mt_offload_policy p = quiet_policy(MT_BACKEND_CUDA);
    const int32_t devs[2] = {0, 1};
    p.num_devices = 2, p.devices = devs, p.weight_fetch = MT_FETCH_WHOLE;
    mt_model *whole = make_with(&c, &p);
    p.weight_fetch = MT_FETCH_SLICES;
    mt_model *sliced = make_with(&c, &p);
    enum { B = 2, S = 64, M = 4, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 9);
    mt_batch b = batch_of(tok, tg, B, S, M);
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-3f, o.total_steps = 3;
    for (int s = 0; s < 3; s++) {
        mt_step_stats a, x;
        mt_step_stats_init(&a), mt_step_stats_init(&x);
        cr_assert_eq(mt_step(whole, &b, &o, &a), MT_OK, "%s", mt_model_errmsg(whole));
        cr_assert_eq(mt_step(sliced, &b, &o, &x), MT_OK, "%s", mt_model_errmsg(sliced));
        cr_assert_eq(memcmp(&a.loss, &x.loss, sizeof a.loss), 0, "step %d: loss %.9f in slices, %.9f whole", s, x.loss,
                     a.loss);
    }
    cr_assert(tiles_equal(whole, sliced), "fetching in slices changed the bits");
    mt_model_destroy(whole);
    mt_model_destroy(sliced);
}

Test(cuda_backend, two_gpus_fetch_slices_bf16_tied) { slices_on_two_gpus(MT_PRECISION_BF16, 1); }
Test(cuda_backend, two_gpus_fetch_slices_lean) { slices_on_two_gpus(MT_PRECISION_LEAN, 0); }
