#define _GNU_SOURCE
/* Parity with transformers: fixtures made by tools/fixtures/make_fixtures.py
 * (tiny models built, saved and trained with transformers in fp32; see
 * docs/parity.md) are loaded from their Hugging Face folders and trained here
 * in fp32 on the CPU backend with the same tokens and optimizer settings. The
 * test compares the configuration as read, RoPE's inverse frequencies, the
 * step-0 logits at every position, the per-step loss, gradient norm and
 * learning rate, and finally every weight after training.
 *
 * Tolerances (fp32 on both sides, different summation orders):
 *   loss, gradient norm       relative 1e-5  (sums of a few hundred fp32 terms agree to ~1e-7;
 *                                              later steps add the drift of the weights)
 *   learning rate             relative 1e-7  (the same float formula: at most one rounding apart)
 *   logits                    absolute 1e-4  (|logit| < ~10, fp32 ulp there ~1e-6)
 *   inv_freq                  relative 1e-6  (pow and the llama3 smoothing in float32, a few ulp)
 *   weights after training    absolute 1e-5  (AdamW moves each weight by ~lr per step, 1e-3 here;
 *                                              its update m / (sqrt(v) + eps) is normalised, so a
 *                                              gradient error of relative e moves a weight by
 *                                              ~lr * e per step: measured <= 1e-6 nearly everywhere)
 *     except where the result is set by rounding: a weight whose gradient is mostly cancellation
 *     (|g| ~1e-8 against terms of ~1e-3, or a k bias on a slow RoPE pair, where softmax's shift
 *     invariance makes the true gradient ~0) gets an AdamW step that is the sign and size of
 *     that noise. Such a weight may differ by more than 1e-5 (one or two per fixture, up to
 *     ~6e-5) if training libmegatrain again from the start weights moved by one ulp (three
 *     patterns) moves its own result there by at least a tenth of the difference, and by at
 *     most 2 * (sum of the steps' lr); at most max(4, 1 in 10^4) weights may take this way.
 *     For nearly every weight that spread is below 1e-6, so a real error in a gradient still
 *     fails.
 * The measured differences are printed on stderr (docs/parity.md keeps them).
 *
 * llama_packed packs several documents into each sequence: its steps carry
 * positions, given to mt_step and mt_eval as mt_batch.positions (transformers
 * ran them as position_ids, and its script checked that this equals the
 * documents run one by one); its logits at position p are compared with
 * those after the prefix of p's document.
 *
 * The fixtures' paths are relative to the repository root, where `make test`
 * runs the suite. A missing fixture fails its test. The reading and the
 * comparison are in parity_common.c, shared with tests/test_cuda_parity.c (the
 * same fixtures in bf16 on the CPU, suite parity_bf16_cpu, and on the CUDA
 * backend, suite cuda_parity). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "parity_common.h"

static const parity_tol TOL = {
    .inv_freq_rel = 1e-6,
    .logit_abs = 1e-4,
    .loss_rel = 1e-5,
    .norm_rel = 1e-5,
    .loss_rel_trained = 1e-5,
    .norm_rel_trained = 1e-5,
    .lr_rel = 1e-7,
    .weight_abs = 1e-5,
};

static const char *const EXPECTED[] = {"llama_gqa", "qwen2_tied", "llama3_rope", "qwen2_tied_d32", "llama_gqa_d64",
                                       "llama_packed", "qwen3_gqa", "mistral_window", "qwen2_window",
                                       "phi3_window", "gemma2_window", "gemma3_window", "qwen3_moe", "mixtral",
                                       "qwen3_moe_routed", "mixtral_routed", "gemma3_pad", "llama_pad", "qwen2_moe",
                                       "qwen2_moe_routed", "qwen3_yarn", "llama_yarn", "phi3_longrope",
                                       "gpt_oss", "gpt_oss_routed", "deepseek_v3", "deepseek_v3_routed", "deepseek_v2",
                                       "deepseek_v2_routed", "llama4", "llama4_routed"};
#define N_EXPECTED (sizeof EXPECTED / sizeof EXPECTED[0])

TestSuite(parity);

static void run_fixture(const char *name) { parity_run(name, MT_BACKEND_CPU, MT_PRECISION_FP32, &TOL); }

/* ---- the tests ----------------------------------------------------------------------------- */

Test(parity, llama_gqa) { run_fixture("llama_gqa"); }
Test(parity, qwen2_tied) { run_fixture("qwen2_tied"); }
Test(parity, llama3_rope) { run_fixture("llama3_rope"); }
Test(parity, qwen2_tied_d32) { run_fixture("qwen2_tied_d32"); }
Test(parity, llama_gqa_d64) { run_fixture("llama_gqa_d64"); }
/* documents packed into each sequence (mt_batch.positions, transformers' position_ids) */
Test(parity, llama_packed) { run_fixture("llama_packed"); }
/* Qwen3: norms of each head of q and k */
Test(parity, qwen3_gqa) { run_fixture("qwen3_gqa"); }
/* sliding windows: Mistral's on every layer, Qwen2's from max_window_layers on */
Test(parity, mistral_window) { run_fixture("mistral_window"); }
Test(parity, qwen2_window) { run_fixture("qwen2_window"); }
/* Phi-3: q, k, v and gate, up fused in the checkpoint; a window on every layer */
Test(parity, phi3_window) { run_fixture("phi3_window"); }
/* Gemma 2: sandwich norms, GELU-tanh, soft-capped scores and logits; Gemma 3: q/k norms, local RoPE */
Test(parity, gemma2_window) { run_fixture("gemma2_window"); }
Test(parity, gemma3_window) { run_fixture("gemma3_window"); }
/* mixture of experts: Qwen3-MoE (a dense layer among sparse ones, idle experts) and Mixtral (a window), both
 * with the load-balancing loss */
Test(parity, qwen3_moe) { run_fixture("qwen3_moe"); }
Test(parity, mixtral) { run_fixture("mixtral"); }
/* the same two with routing clear of ties by construction: the bf16 and CUDA suites' MoE fixtures */
Test(parity, qwen3_moe_routed) { run_fixture("qwen3_moe_routed"); }
Test(parity, mixtral_routed) { run_fixture("mixtral_routed"); }
/* the embedding's padding row (nn.Embedding's padding_idx): Gemma 3's 0, tied, and an untied Llama's 5, with pad
 * tokens in the batches */
Test(parity, gemma3_pad) { run_fixture("gemma3_pad"); }
Test(parity, llama_pad) { run_fixture("llama_pad"); }
/* Qwen2-MoE: a shared expert behind its sigmoid gate beside routed experts whose top-k is not renormalised */
Test(parity, qwen2_moe) { run_fixture("qwen2_moe"); }
Test(parity, qwen2_moe_routed) { run_fixture("qwen2_moe_routed"); }
/* RoPE scalings: YaRN with transformers' defaults (Qwen3) and with DeepSeek's mscale settings untruncated (Llama);
 */
Test(parity, qwen3_yarn) { run_fixture("qwen3_yarn"); }
Test(parity, llama_yarn) { run_fixture("llama_yarn"); }
/* LongRoPE on three quarters of each head, micro-batch 0 by the short factors and micro-batch 1 by the long */
Test(parity, phi3_longrope) { run_fixture("phi3_longrope"); }
/* GPT-OSS: sinks, q/k/v/o biases, a sliding and a full layer, experts and router with biases, the clamped
 * SwiGLU past its limits, YaRN, the load-balancing loss; and the same with routing clear of ties */
Test(parity, gpt_oss) { run_fixture("gpt_oss"); }
Test(parity, gpt_oss_routed) { run_fixture("gpt_oss_routed"); }
/* DeepSeek-V3: latent attention (q and kv latents with their 1e-6 norms, the shared RoPE key part, values
 * narrower than the heads), yarn's mscale in the softmax scale, q_a/kv_a/o biases, sigmoid routing within
 * groups with the correction bias, the scale, shared experts, a dense first layer; the same decisively routed */
Test(parity, deepseek_v3) { run_fixture("deepseek_v3"); }
Test(parity, deepseek_v3_routed) { run_fixture("deepseek_v3_routed"); }
/* DeepSeek-V2: latent attention with q projected at full rank (q_lora_rank null), softmax routing with the
 * greedy group limit, the scale applied, shared experts, a dense first layer; the same decisively routed */
Test(parity, deepseek_v2) { run_fixture("deepseek_v2"); }
Test(parity, deepseek_v2_routed) { run_fixture("deepseek_v2_routed"); }
/* Llama 4 text: chunked attention on the RoPE layers and a NoPE global layer, the q/k L2 norm, attention
 * temperature tuning, MoE every other layer with sigmoid top-1 routing and a shared expert */
Test(parity, llama4) { run_fixture("llama4"); }
Test(parity, llama4_routed) { run_fixture("llama4_routed"); }

/* Any other fixture folder under tests/fixtures is checked the same way. */
Test(parity, other_fixtures)
{
    DIR *d = opendir(PARITY_FIXTURE_ROOT);
    cr_assert_not_null(d, "%s is missing (run from the repository root)", PARITY_FIXTURE_ROOT);
    char names[64][256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof names[0]) continue;
        int known = 0;
        for (size_t i = 0; i < N_EXPECTED; i++) known |= !strcmp(e->d_name, EXPECTED[i]);
        char p[600];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s/fixture.json", PARITY_FIXTURE_ROOT, e->d_name);
        if (!known && stat(p, &sb) == 0) snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++) run_fixture(names[i]);
}
