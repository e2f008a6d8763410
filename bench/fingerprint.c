/* The bits of a few short training runs, through the public API only, so
 * that two builds of the library can be compared exactly: a refactor that
 * claims to change nothing must print the same lines before and after.
 *
 *     build/bench/fingerprint cpu|cuda|7b > before.txt   (old build)
 *     build/bench/fingerprint cpu|cuda > after.txt    (new build)
 *     cmp before.txt after.txt
 *
 * Each run prints every step's loss and gradient norm in hexadecimal
 * floating point, then the evaluation loss and an FNV-1a hash of the
 * next-token logits of the trained model. The configurations cover both
 * precisions, grouped and plain attention, q/k/v biases, tied embeddings,
 * llama3 RoPE scaling, several micro-batches, three weight slots and more
 * than one logits chunk; on CUDA each runs with activations kept on the
 * device and kept attention outputs, and again with checkpoints in host
 * memory and full recompute. `fixtures DIR cpu|cuda` runs the models of
 * every transformers fixture (tests/fixtures) with their weights, in bf16,
 * fp32 and lean. `7b` runs three steps of the Llama-2-7B shape
 * at 131072 tokens each on the GPU (about two minutes on an H200). */
#include <megatrain.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run {
    const char *name;
    uint32_t arch, precision, vocab, hidden, inter, layers, heads, kv_heads, head_dim, bias, tied, llama3;
    uint32_t n_seq, seq_len, n_micro, slots;
} run;

static const run RUNS[] = {
    {"llama-bf16-gqa", MT_ARCH_LLAMA, MT_PRECISION_BF16, 256, 128, 352, 3, 4, 2, 32, 0, 0, 0, 2, 64, 2, 2},
    {"qwen2-fp32-tied", MT_ARCH_QWEN2, MT_PRECISION_FP32, 300, 128, 256, 2, 2, 1, 64, 1, 1, 1, 4, 128, 1, 2},
    {"llama-bf16-d128", MT_ARCH_LLAMA, MT_PRECISION_BF16, 512, 256, 512, 2, 2, 2, 128, 0, 1, 0, 1, 96, 3, 3},
    {"qwen2-bf16-bias", MT_ARCH_QWEN2, MT_PRECISION_BF16, 384, 192, 448, 2, 6, 2, 32, 1, 0, 1, 3, 48, 2, 2},
};

/* `fingerprint 7b`: the Llama-2-7B shape at 131072 tokens a step (the
 * benchmark's), on the GPU with the default policy. */
static const run RUN_7B = {"llama2-7b", MT_ARCH_LLAMA, MT_PRECISION_BF16, 32000, 4096, 11008, 32, 32, 32, 128, 0, 0, 0,
                           4, 4096, 8, 2};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static int train(const run *r, const mt_model_config *cfg, const char *load_dir, uint32_t backend, uint32_t recompute,
                 uint32_t activations, const char *variant);

static int one(const run *r, uint32_t backend, uint32_t recompute, uint32_t activations, const char *variant)
{
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    cfg.arch = r->arch;
    cfg.precision = r->precision;
    cfg.vocab_size = r->vocab;
    cfg.hidden_size = r->hidden;
    cfg.intermediate_size = r->inter;
    cfg.num_hidden_layers = r->layers;
    cfg.num_attention_heads = r->heads;
    cfg.num_key_value_heads = r->kv_heads;
    cfg.head_dim = r->head_dim;
    cfg.attention_bias = r->bias;
    cfg.tie_word_embeddings = r->tied;
    cfg.max_position_embeddings = r->seq_len > 256 ? r->seq_len : 256;
    cfg.seed = 7;
    if (r->llama3) {
        cfg.rope_scaling = MT_ROPE_SCALING_LLAMA3;
        cfg.rope_factor = 8;
        cfg.rope_low_freq_factor = 1;
        cfg.rope_high_freq_factor = 4;
        cfg.rope_original_max_position = 64;
        cfg.rope_theta = 500000;
    }
    return train(r, &cfg, NULL, backend, recompute, activations, variant);
}

/* Three steps of r's batch shape on the model of cfg (weights from
 * load_dir, a Hugging Face folder, when given), then an evaluation and the
 * logits: each printed in hexadecimal or hashed. */
static int train(const run *r, const mt_model_config *cfg_in, const char *load_dir, uint32_t backend, uint32_t recompute,
                 uint32_t activations, const char *variant)
{
    const mt_model_config cfg = *cfg_in;
    mt_offload_policy pol;
    mt_offload_policy_init(&pol);
    pol.backend = backend;
    pol.weight_slots = r->slots;
    pol.recompute = recompute;
    pol.activations = activations;
    mt_model *m = NULL;
    mt_status st = mt_model_create(&m, &cfg, &pol);
    if (st) {
        fprintf(stderr, "%s: mt_model_create: %s: %s\n", r->name, mt_status_str(st), mt_last_errmsg());
        return 1;
    }
    if (load_dir && (st = mt_model_load(m, load_dir))) {
        fprintf(stderr, "%s: mt_model_load: %s: %s\n", r->name, mt_status_str(st), mt_model_errmsg(m));
        mt_model_destroy(m);
        return 1;
    }
    const size_t per = (size_t)r->n_seq * r->seq_len, n = per * r->n_micro;
    int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
    float *lg = malloc((size_t)r->n_seq * cfg.vocab_size * sizeof *lg);
    if (!tok || !tgt || !lg) return 1;
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % cfg.vocab_size);
    }
    for (size_t i = 0; i < n; i++) tgt[i] = i % 11 == 5 ? MT_IGNORE_INDEX : tok[(i + 1) % n];
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = r->n_seq;
    b.seq_len = r->seq_len;
    b.num_micro_batches = r->n_micro;
    b.tokens = tok;
    b.targets = tgt;
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 2e-3f;
    o.weight_decay = 0.1f;
    o.grad_clip = 0.5f;
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        mt_step_stats ss;
        mt_step_stats_init(&ss);
        if ((st = mt_step(m, &b, &o, &ss))) {
            fprintf(stderr, "%s: mt_step: %s: %s\n", r->name, mt_status_str(st), mt_model_errmsg(m));
            rc = 1;
            break;
        }
        printf("%s %s step %d loss %a norm %a\n", r->name, variant, i + 1, ss.loss, ss.grad_norm);
    }
    mt_eval_stats es;
    mt_eval_stats_init(&es);
    if (!rc && (st = mt_eval(m, &b, &es))) rc = 1;
    if (!rc && (st = mt_model_logits(m, tok, r->n_seq, r->seq_len, lg))) rc = 1;
    if (rc && st) fprintf(stderr, "%s: %s: %s\n", r->name, mt_status_str(st), mt_model_errmsg(m));
    if (!rc)
        printf("%s %s eval %a logits %016llx\n", r->name, variant, es.loss,
               (unsigned long long)fnv(1469598103934665603ull, lg, (size_t)r->n_seq * cfg.vocab_size * sizeof *lg));
    mt_model_destroy(m);
    free(tok), free(tgt), free(lg);
    return rc;
}

/* `fingerprint fixtures DIR cpu|cuda`: the model of every transformers
 * fixture (DIR/NAME/model, Hugging Face folders; every family, tied heads,
 * windows, experts), its weights loaded, in bf16, fp32 and lean; on CUDA
 * with activations kept and with host checkpoints. */
static int fixtures(const char *dir, int cuda)
{
    static const char *names[] = {"gemma2_window", "gemma3_window", "llama3_rope",      "llama_gqa",
                                  "llama_gqa_d64", "llama_packed",  "mistral_window",   "mixtral",
                                  "mixtral_routed", "phi3_window",  "qwen2_tied",       "qwen2_tied_d32",
                                  "qwen2_window",  "qwen3_gqa",     "qwen3_moe",        "qwen3_moe_routed"};
    static const uint32_t precs[] = {MT_PRECISION_BF16, MT_PRECISION_FP32, MT_PRECISION_LEAN};
    static const char *prec_names[] = {"bf16", "fp32", "lean"};
    int rc = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        for (size_t p = 0; p < sizeof precs / sizeof precs[0]; p++) {
            char path[4096], name[96];
            snprintf(path, sizeof path, "%s/%s/model", dir, names[i]);
            mt_model_config cfg;
            mt_model_config_init(&cfg);
            mt_status st = mt_config_load(&cfg, path);
            if (st) {
                fprintf(stderr, "%s: mt_config_load: %s: %s\n", path, mt_status_str(st), mt_last_errmsg());
                return 1;
            }
            cfg.precision = precs[p];
            snprintf(name, sizeof name, "%s-%s", names[i], prec_names[p]);
            const uint32_t seq = cfg.max_position_embeddings < 64 ? cfg.max_position_embeddings : 64;
            const run r = {name, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, seq, 2, 2};
            if (!cuda) {
                rc |= train(&r, &cfg, path, MT_BACKEND_CPU, MT_RECOMPUTE_AUTO, MT_PLACE_AUTO, "cpu");
                continue;
            }
            rc |= train(&r, &cfg, path, MT_BACKEND_CUDA, MT_RECOMPUTE_AUTO, MT_PLACE_DEVICE, "cuda-kept");
            rc |= train(&r, &cfg, path, MT_BACKEND_CUDA, MT_RECOMPUTE_FULL, MT_PLACE_HOST, "cuda-host");
        }
    return rc;
}

int main(int argc, char **argv)
{
    const int fix = argc == 4 && !strcmp(argv[1], "fixtures") && (!strcmp(argv[3], "cpu") || !strcmp(argv[3], "cuda"));
    if (!fix && (argc != 2 || (strcmp(argv[1], "cpu") && strcmp(argv[1], "cuda") && strcmp(argv[1], "7b")))) {
        fprintf(stderr, "usage: %s cpu|cuda|7b, or %s fixtures DIR cpu|cuda\n", argv[0], argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "7b")) return one(&RUN_7B, MT_BACKEND_CUDA, MT_RECOMPUTE_AUTO, MT_PLACE_AUTO, "cuda");
    if (!strcmp(argv[1], "fixtures")) return fixtures(argv[2], !strcmp(argv[3], "cuda"));
    const int cuda = !strcmp(argv[1], "cuda");
    int rc = 0;
    for (size_t i = 0; i < sizeof RUNS / sizeof RUNS[0]; i++) {
        if (!cuda) {
            rc |= one(&RUNS[i], MT_BACKEND_CPU, MT_RECOMPUTE_AUTO, MT_PLACE_AUTO, "cpu");
            continue;
        }
        rc |= one(&RUNS[i], MT_BACKEND_CUDA, MT_RECOMPUTE_AUTO, MT_PLACE_DEVICE, "cuda-kept");
        rc |= one(&RUNS[i], MT_BACKEND_CUDA, MT_RECOMPUTE_FULL, MT_PLACE_HOST, "cuda-host");
    }
    return rc;
}
