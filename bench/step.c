/* Whole optimizer steps on a model shape, any backend: tokens/s and model
 * TFLOP/s = (6 * params * tokens + 12 * layers * heads * head_dim * seq * tokens) / time
 * (the recompute not counted), median over the timed steps after the warm-up
 * steps (1 unless --warmup says otherwise; 0 for runs whose one step takes minutes).
 * heads * head_dim is the hidden size of every preset but Qwen3-30B-A3B's
 * (4096 against 2048). For a mixture of experts `params` are the ACTIVE ones:
 * everything but the experts a token does not use, (E - k) of each sparse
 * layer's E (Qwen3-30B-A3B: 3.3 B of 30.5 B).
 *
 * --preset qwen3-30b-a3b (and mixtral-8x7b) with --layers N: the whole model
 * does not fit a 125 GiB host (14 bytes a parameter: 8.7 GB for the embedding
 * and head, 8.7 GB a layer); --layers 12 (113 GB) does.
 *
 *   build/bench/step [--backend cpu|cuda] [--preset tiny|1b|1.5b|7b|qwen7b|qwen14b|8b|qwen3-8b|qwen3-30b-a3b|mixtral-8x7b|gpt-oss-20b|deepseek-v2-lite]
 *                    [--layers N] [--seq-len N]
 *                    [--micro-batch N] [--grad-accum N] [--steps N] [--warmup N] [--fp32 | --lean] [--slots K]
 *                    [--host-budget GIB] [--gpu-budget GIB] [--recompute auto|full] [--timeline]
 *                    [--timeline-csv FILE] [--attention auto|kernels|cudnn] [--nondeterministic]
 *                    [--devices LIST] [--weight-fetch auto|whole|slices]
 *
 * --devices 0,1,2,3 trains data parallel on those GPUs (mt_offload_policy.devices): --grad-accum is
 * the step's total, divided among them (the 7B shape at 131072 tokens per GPU on 4 GPUs: --micro-batch 4
 * --seq-len 4096 --grad-accum 32), and the last line adds the model TFLOP/s per GPU; --weight-fetch
 * picks how each GPU receives a unit's weights (mt_offload_policy.weight_fetch: whole over its own link, or
 * a slice each and an NCCL all-gather).
 *
 * --attention picks the CUDA backend's attention (mt_attention; the log line
 * "CUDA backend: ..." says which ran), --nondeterministic lets cuDNN's
 * backward add dQ with atomics (MT_ATTENTION_NONDETERMINISTIC).
 *
 * --timeline records each step's timeline (mt_model_timeline) and reports,
 * for every step and for the median one, the fraction of the step during
 * which the compute stream was busy and where its idle time went;
 * --timeline-csv also writes the median step's unit visits to FILE.
 */
#include <megatrain.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const WAIT_NAMES[MT_WAIT_COUNT] = {"weights", "optimizer", "checkpoints", "launch", "host"};
static const char *const PHASE_NAMES[] = {"forward", "head", "backward"};

static void print_timeline(const char *what, const mt_timeline *t)
{
    printf("%s: compute busy %.1f%% of %.3f s; idle:", what, 100 * t->busy_seconds / t->seconds, t->seconds);
    for (int k = 0; k < MT_WAIT_COUNT; k++)
        printf(" %s %.1f%% (%.0f ms)%s", WAIT_NAMES[k], 100 * t->wait_seconds[k] / t->seconds, 1e3 * t->wait_seconds[k],
               k + 1 < MT_WAIT_COUNT ? "," : "");
    printf(" | h2d %.1f GB in %.2f s (%.1f GB/s), d2h %.1f GB in %.2f s (%.1f GB/s)\n", t->h2d_bytes / 1e9,
           t->h2d_seconds, t->h2d_seconds > 0 ? t->h2d_bytes / 1e9 / t->h2d_seconds : 0.0, t->d2h_bytes / 1e9,
           t->d2h_seconds, t->d2h_seconds > 0 ? t->d2h_bytes / 1e9 / t->d2h_seconds : 0.0);
}

static int write_csv(const char *path, const mt_timeline_visit *v, uint32_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "visit,unit,phase,start_ms,end_ms,weights_start_ms,weights_end_ms");
    for (int k = 0; k < MT_WAIT_COUNT; k++) fprintf(f, ",wait_%s_ms", WAIT_NAMES[k]);
    fprintf(f, "\n");
    for (uint32_t i = 0; i < n; i++) {
        fprintf(f, "%u,%u,%s,%.3f,%.3f,%.3f,%.3f", i, v[i].unit, PHASE_NAMES[v[i].phase % 3], 1e3 * v[i].start,
                1e3 * v[i].end, v[i].weights_start < 0 ? -1.0 : 1e3 * v[i].weights_start,
                v[i].weights_end < 0 ? -1.0 : 1e3 * v[i].weights_end);
        for (int k = 0; k < MT_WAIT_COUNT; k++) fprintf(f, ",%.3f", 1e3 * v[i].wait_seconds[k]);
        fprintf(f, "\n");
    }
    return fclose(f);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int preset(mt_model_config *c, const char *name)
{
    /* D: head_dim (0: C / H); E experts of width FE, k a token (0: dense) */
    struct { const char *name; uint32_t V, C, F, L, H, Hkv; mt_arch arch; uint32_t D, E, K, FE; } p[] = {
        {"tiny", 8192, 256, 768, 8, 8, 4, MT_ARCH_LLAMA, 0, 0, 0, 0},
        {"1b", 32000, 2048, 5632, 22, 32, 4, MT_ARCH_LLAMA, 0, 0, 0, 0},         /* TinyLlama-1.1B */
        {"1.5b", 32000, 2048, 5632, 32, 32, 4, MT_ARCH_LLAMA, 0, 0, 0, 0},       /* 1.5 B: 21.6 GB of state, 10x a 2 GiB GPU budget */
        {"7b", 32000, 4096, 11008, 32, 32, 32, MT_ARCH_LLAMA, 0, 0, 0, 0},       /* Llama-2-7B */
        {"qwen7b", 152064, 3584, 18944, 28, 28, 4, MT_ARCH_QWEN2, 0, 0, 0, 0},   /* Qwen2.5-7B */
        {"qwen14b", 152064, 5120, 13824, 48, 40, 8, MT_ARCH_QWEN2, 0, 0, 0, 0},  /* Qwen2.5-14B: 14.77 B */
        {"8b", 128256, 4096, 14336, 32, 32, 8, MT_ARCH_LLAMA, 0, 0, 0, 0},       /* Llama-3-8B: 8.03 B, 112 GB of state */
        {"qwen3-8b", 151936, 4096, 12288, 36, 32, 8, MT_ARCH_QWEN3, 0, 0, 0, 0}, /* Qwen3-8B: 8.19 B, 115 GB of state */
        /* Qwen3-30B-A3B: 30.5 B, 3.3 B active; 128 experts top-8, renormalised */
        {"qwen3-30b-a3b", 151936, 2048, 6144, 48, 32, 4, MT_ARCH_QWEN3_MOE, 128, 128, 8, 768},
        /* Mixtral-8x7B: 46.7 B, 12.9 B active; 8 experts top-2 */
        {"mixtral-8x7b", 32000, 4096, 14336, 32, 32, 8, MT_ARCH_MIXTRAL, 0, 8, 2, 14336},
        /* gpt-oss-20b: 20.9 B, 3.6 B active; 32 experts top-4, sinks, biases, every other layer a window of 128,
         * yarn (GptOssConfig's) */
        {"gpt-oss-20b", 201088, 2880, 2880, 24, 64, 8, MT_ARCH_GPT_OSS, 64, 32, 4, 2880},
        /* DeepSeek-V2-Lite: 15.7 B, 2.7 B active (mt_family_example's shape): latent attention, 64 experts
         * top-6 and 2 shared, the first layer dense */
        {"deepseek-v2-lite", 0, 0, 0, 0, 0, 0, MT_ARCH_DEEPSEEK_V2, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (!strcmp(name, p[i].name) && p[i].arch == MT_ARCH_DEEPSEEK_V2) {
            return mt_family_example(c, MT_ARCH_DEEPSEEK_V2) == MT_OK ? 0 : -1;
        } else if (!strcmp(name, p[i].name)) {
            c->vocab_size = p[i].V, c->hidden_size = p[i].C, c->intermediate_size = p[i].F;
            c->num_hidden_layers = p[i].L, c->num_attention_heads = p[i].H, c->num_key_value_heads = p[i].Hkv;
            c->arch = p[i].arch;
            c->attention_bias = p[i].arch == MT_ARCH_QWEN2;
            c->head_dim = p[i].D;
            c->num_experts = p[i].E, c->num_experts_per_tok = p[i].K, c->moe_intermediate_size = p[i].FE;
            c->norm_topk_prob = p[i].E != 0;
            if (p[i].arch == MT_ARCH_QWEN3_MOE) c->rope_theta = 1e6f, c->rms_norm_eps = 1e-6f;
            if (p[i].arch == MT_ARCH_GPT_OSS) {
                c->attention_bias = 1, c->sliding_window = 128, c->sliding_window_pattern = 2;
                c->rope_theta = 150000.0f, c->rope_scaling = MT_ROPE_SCALING_YARN, c->rope_factor = 32.0f;
                c->rope_original_max_position = 4096, c->rope_beta_fast = 32.0f, c->rope_beta_slow = 1.0f;
                c->rope_no_truncate = 1, c->max_position_embeddings = 131072;
            }
            return 0;
        }
    return -1;
}

int main(int argc, char **argv)
{
    const char *backend = "cuda", *pre = "tiny";
    int steps = 5, S = 2048, B = 1, M = 1, slots = 2;
    mt_precision precision = MT_PRECISION_BF16;
    double host_gib = 0, gpu_gib = 0;
    int timeline = 0, full_recompute = 0, layers = 0, warmup = 1, nondet = 0;
    uint32_t attention = MT_ATTENTION_AUTO;
    const char *csv = NULL;
    int32_t devices[64];
    int n_devices = 0;
    uint32_t weight_fetch = MT_FETCH_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--backend") && v) backend = argv[++i];
        else if (!strcmp(argv[i], "--preset") && v) pre = argv[++i];
        else if (!strcmp(argv[i], "--layers") && v) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq-len") && v) S = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--micro-batch") && v) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--grad-accum") && v) M = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && v) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--slots") && v) slots = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--host-budget") && v) host_gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--gpu-budget") && v) gpu_gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--fp32")) precision = MT_PRECISION_FP32;
        else if (!strcmp(argv[i], "--lean")) precision = MT_PRECISION_LEAN;
        else if (!strcmp(argv[i], "--timeline")) timeline = 1;
        else if (!strcmp(argv[i], "--recompute") && v) full_recompute = !strcmp(argv[++i], "full");
        else if (!strcmp(argv[i], "--timeline-csv") && v) csv = argv[++i], timeline = 1;
        else if (!strcmp(argv[i], "--nondeterministic")) nondet = 1;
        else if (!strcmp(argv[i], "--devices") && v) {
            /* a comma-separated list; the library checks it */
            for (char *p = argv[++i], *end; n_devices < 64; p = end + 1) {
                devices[n_devices++] = (int32_t)strtol(p, &end, 10);
                if (*end != ',') break;
            }
        }
        else if (!strcmp(argv[i], "--weight-fetch") && v) {
            const char *f = argv[++i];
            weight_fetch = !strcmp(f, "whole") ? MT_FETCH_WHOLE : !strcmp(f, "slices") ? MT_FETCH_SLICES
                           : !strcmp(f, "auto") ? MT_FETCH_AUTO : 99;
        }
        else if (!strcmp(argv[i], "--attention") && v) {
            const char *a = argv[++i];
            attention = !strcmp(a, "kernels") ? MT_ATTENTION_KERNELS : !strcmp(a, "cudnn") ? MT_ATTENTION_CUDNN
                        : !strcmp(a, "auto") ? MT_ATTENTION_AUTO : 99;
        }
        else {
            fprintf(stderr, "usage: step [--backend cpu|cuda] [--preset tiny|1b|1.5b|7b|qwen7b|qwen14b|8b|qwen3-8b|qwen3-30b-a3b|mixtral-8x7b|gpt-oss-20b|deepseek-v2-lite] [--layers N] [--seq-len N] "
                            "[--micro-batch N] [--grad-accum N] [--steps N] [--warmup N] [--fp32 | --lean] [--slots K] [--host-budget GIB] [--gpu-budget GIB] "
                            "[--recompute auto|full] [--timeline] [--timeline-csv FILE] [--attention auto|kernels|cudnn] "
                            "[--nondeterministic] [--devices LIST] [--weight-fetch auto|whole|slices]\n");
            return 2;
        }
    }
    mt_model_config c;
    mt_model_config_init(&c);
    if (preset(&c, pre) || attention == 99 || steps < 1 || warmup < 0 || S < 2 || B < 1 || M < 1 || layers < 0) {
        fprintf(stderr, "step: bad arguments\n");
        return 2;
    }
    if (layers) c.num_hidden_layers = (uint32_t)layers; /* the preset's layer shape, fewer of them (profiling) */
    c.max_position_embeddings = (uint32_t)S;
    c.precision = precision;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = !strcmp(backend, "cpu") ? MT_BACKEND_CPU : MT_BACKEND_CUDA;
    p.weight_slots = (uint32_t)slots;
    if (n_devices == 1) p.device = devices[0];
    if (n_devices > 1) p.num_devices = (uint32_t)n_devices, p.devices = devices;
    p.weight_fetch = weight_fetch; /* the library refuses a value it does not know */
    p.log_level = MT_LOG_INFO;
    p.host_budget_bytes = (uint64_t)(host_gib * (1u << 30)); /* where MemAvailable undercounts */
    p.gpu_budget_bytes = (uint64_t)(gpu_gib * (1u << 30));
    p.timeline = (uint32_t)timeline;
    p.recompute = full_recompute ? MT_RECOMPUTE_FULL : MT_RECOMPUTE_AUTO;
    p.attention = attention;
    p.attention_flags = nondet ? MT_ATTENTION_NONDETERMINISTIC : 0;
    mt_model *m;
    if (mt_model_create(&m, &c, &p) != MT_OK) {
        fprintf(stderr, "step: %s\n", mt_last_errmsg());
        return 1;
    }
    const size_t n = (size_t)M * B * S;
    int32_t *tok = malloc(n * sizeof *tok), *tg = malloc(n * sizeof *tg);
    double *t = malloc((size_t)steps * sizeof *t), fwd = 0, bwd = 0, opt = 0;
    const uint32_t n_visits = 2 * c.num_hidden_layers + 3; /* embedding, layers, head; layers, embedding */
    mt_timeline *tls = calloc((size_t)steps, sizeof *tls);
    mt_timeline_visit *vis = calloc((size_t)steps * n_visits, sizeof *vis);
    if (!tok || !tg || !t || !tls || !vis) return 1;
    unsigned r = 1;
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(((r = r * 1103515245u + 12345u) >> 8) % c.vocab_size);
    for (size_t i = 0; i < n; i++) tg[i] = tok[(i + 1) % n];
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = (uint32_t)B, b.seq_len = (uint32_t)S, b.num_micro_batches = (uint32_t)M;
    b.tokens = tok, b.targets = tg;
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-5f;
    for (int s = 1 - warmup; s <= steps; s++) {
        mt_step_stats st;
        mt_step_stats_init(&st);
        if (mt_step(m, &b, &o, &st) != MT_OK) {
            fprintf(stderr, "step: %s\n", mt_model_errmsg(m));
            return 1;
        }
        if (s > 0) t[s - 1] = st.seconds, fwd += st.forward_seconds, bwd += st.backward_seconds, opt += st.optimizer_seconds;
        printf("step %d: %.3f s (forward %.3f, backward %.3f, optimizer %.3f), loss %.4f\n", s, st.seconds,
               st.forward_seconds, st.backward_seconds, st.optimizer_seconds, st.loss);
        if (timeline && s > 0) {
            mt_timeline_init(&tls[s - 1]);
            if (mt_model_timeline(m, &tls[s - 1], vis + (size_t)(s - 1) * n_visits, n_visits) != MT_OK) {
                fprintf(stderr, "step: %s\n", mt_model_errmsg(m));
                return 1;
            }
            char what[32];
            snprintf(what, sizeof what, "  timeline %d", s);
            print_timeline(what, &tls[s - 1]);
        }
    }
    double *sorted = malloc((size_t)steps * sizeof *sorted);
    if (!sorted) return 1;
    memcpy(sorted, t, (size_t)steps * sizeof *t);
    qsort(sorted, (size_t)steps, sizeof *sorted, cmp);
    const double med = sorted[steps / 2], P_all = (double)mt_model_num_params(m);
    /* the parameters a token uses: a sparse layer's experts count k of E (the layers mlp_only_layers leaves
     * sparse: every layer of these presets but DeepSeek's first) */
    const double idle_experts = c.num_experts ? (double)(c.num_experts - c.num_experts_per_tok) : 0.0;
    const double expert_biases = c.arch == MT_ARCH_GPT_OSS ? 2.0 * c.moe_intermediate_size + c.hidden_size : 0.0;
    int sparse = 0;
    for (uint32_t l = 0; c.num_experts && l < c.num_hidden_layers; l++)
        sparse += l >= 256 || !(c.mlp_only_layers[l / 64] >> (l % 64) & 1);
    const double P = P_all - (double)sparse * idle_experts * (3.0 * c.moe_intermediate_size * c.hidden_size + expert_biases);
    /* the attention's two products a token makes per layer: q.k over the q/k head, p.v over the value head
     * (multi-head latent attention's narrower values: the zeros it pads them with are not counted) */
    const double d_qk = c.head_dim ? c.head_dim : (double)c.hidden_size / c.num_attention_heads;
    const double d_v = c.kv_lora_rank ? (double)c.v_head_dim : d_qk;
    const double attn_width = (double)c.num_attention_heads * (d_qk + d_v) / 2.0;
    if (timeline) {
        int mi = 0; /* the median step */
        while (mi + 1 < steps && t[mi] != med) mi++;
        print_timeline("timeline of the median step", &tls[mi]);
        if (csv && write_csv(csv, vis + (size_t)mi * n_visits, tls[mi].n_visits < n_visits ? tls[mi].n_visits : n_visits)) {
            fprintf(stderr, "step: cannot write %s\n", csv);
            return 1;
        }
    }
    const double flop = 6.0 * P * (double)n + 12.0 * c.num_hidden_layers * attn_width * (double)S * (double)n;
    char active[48] = "";
    if (c.num_experts) snprintf(active, sizeof active, " (%.2f B active)", P / 1e9);
    printf("%s %s, %.2f B parameters%s, %d x %d x %d = %zu tokens per step, K=%d: median %.3f s, %.0f tokens/s, "
           "%.1f model TFLOP/s (forward %.0f%%, backward %.0f%%, optimizer %.0f%%)\n",
           pre, precision == MT_PRECISION_FP32 ? "fp32" : precision == MT_PRECISION_LEAN ? "lean" : "bf16", P_all / 1e9, active, M, B, S, n, slots, med, (double)n / med, flop / med / 1e12,
           100 * fwd / (fwd + bwd + opt), 100 * bwd / (fwd + bwd + opt), 100 * opt / (fwd + bwd + opt));
    if (n_devices > 1)
        printf("%d GPUs, weights fetched %s: %.1f model TFLOP/s per GPU, %zu tokens per GPU per step\n", n_devices,
               weight_fetch == MT_FETCH_SLICES ? "in slices" : "whole", flop / med / 1e12 / n_devices,
               n / (size_t)n_devices);
    mt_model_destroy(m);
    free(tok), free(tg), free(t), free(sorted), free(tls), free(vis);
    return 0;
}
