/* Training throughput of the CPU backend on a ~10M-parameter Llama:
 * tokens/s of whole optimizer steps (forward, backward with recompute,
 * AdamW), median of the timed steps after warm-up.
 *
 *   build/bench/cpu_step [--threads N] [--steps N] [--seq-len N] [--micro-batch N] [--fp32]
 */
#include <megatrain.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int threads = 0, steps = 10, S = 256, B = 8, fp32 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq-len") && i + 1 < argc) S = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--micro-batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fp32")) fp32 = 1;
        else {
            fprintf(stderr, "usage: cpu_step [--threads N] [--steps N] [--seq-len N] [--micro-batch N] [--fp32]\n");
            return 2;
        }
    }
    if (steps < 2 || S < 2 || B < 1) return 2;
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 8192;
    c.hidden_size = 256;
    c.intermediate_size = 768;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = (uint32_t)S;
    c.precision = fp32 ? MT_PRECISION_FP32 : MT_PRECISION_BF16;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = (uint32_t)threads;
    mt_model *m;
    if (mt_model_create(&m, &c, &p) != MT_OK) {
        fprintf(stderr, "cpu_step: %s\n", mt_last_errmsg());
        return 1;
    }
    size_t n = (size_t)B * S;
    int32_t *tok = malloc(n * sizeof *tok), *tg = malloc(n * sizeof *tg);
    unsigned r = 1;
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 16) % 8192;
    for (size_t i = 0; i < n; i++) tg[i] = tok[(i + 1) % n];
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = (uint32_t)B;
    b.seq_len = (uint32_t)S;
    b.num_micro_batches = 1;
    b.tokens = tok;
    b.targets = tg;
    mt_optim_config o;
    mt_optim_config_init(&o);
    double *t = malloc((size_t)steps * sizeof *t), fwd = 0, bwd = 0, opt = 0;
    for (int s = 0; s <= steps; s++) { /* step 0 is the warm-up */
        mt_step_stats st;
        mt_step_stats_init(&st);
        if (mt_step(m, &b, &o, &st) != MT_OK) {
            fprintf(stderr, "cpu_step: %s\n", mt_model_errmsg(m));
            return 1;
        }
        if (s) {
            t[s - 1] = st.seconds;
            fwd += st.forward_seconds, bwd += st.backward_seconds, opt += st.optimizer_seconds;
        }
    }
    qsort(t, (size_t)steps, sizeof *t, cmp);
    double med = t[steps / 2];
    printf("cpu_step: %.1f M parameters (hidden 256, 8 layers, GQA 8/4, vocab 8192), %s, %d x %d tokens per step\n",
           mt_model_num_params(m) / 1e6, fp32 ? "fp32" : "bf16", B, S);
    printf("median step %.1f ms over %d steps: %.0f tokens/s (forward %.0f%%, backward %.0f%%, optimizer %.0f%%)\n",
           med * 1e3, steps, (double)n / med, 100 * fwd / (fwd + bwd + opt), 100 * bwd / (fwd + bwd + opt),
           100 * opt / (fwd + bwd + opt));
    mt_model_destroy(m);
    free(tok), free(tg), free(t);
    return 0;
}
