/* megatrain eval / sample / plan: using a saved model, and planning one. */
#define _GNU_SOURCE
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- loading a saved model ------------------------------------------------------ */

static mt_model *open_model(const char *dir, int cpu)
{
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    if (mt_config_load(&cfg, dir) != MT_OK) cli_die("%s", mt_last_errmsg());
    cfg.max_position_embeddings = cfg.max_position_embeddings < 4096 ? 4096 : cfg.max_position_embeddings;
    mt_offload_policy pol;
    mt_offload_policy_init(&pol);
    pol.backend = cpu ? MT_BACKEND_CPU : MT_BACKEND_AUTO;
    pol.log_callback = cli_log;
    mt_model *m;
    if (mt_model_create(&m, &cfg, &pol) != MT_OK) cli_die("%s", mt_last_errmsg());
    if (mt_model_load(m, dir) != MT_OK) cli_die("%s", mt_model_errmsg(m));
    return m;
}

static int is_demo(const char *dir)
{
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, DEMO_MARKER);
    return stat(path, &sb) == 0;
}

/* Greedy continuation of token ids, one token at a time (the whole prefix
 * is recomputed each time: there is no key/value cache). */
static int sample_ids(mt_model *m, const char *list, int max_new)
{
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    mt_model_get_config(m, &cfg);
    int cap = 64, n = 0;
    int32_t *ids = malloc((size_t)(cap + max_new) * sizeof *ids);
    float *logits = malloc(cfg.vocab_size * sizeof *logits);
    if (!ids || !logits) cli_die("out of memory");
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= (long)cfg.vocab_size)
            cli_die("sample: --ids wants comma-separated token ids below the vocabulary size %u", cfg.vocab_size);
        if (n == cap) {
            cap *= 2;
            if (!(ids = realloc(ids, (size_t)(cap + max_new) * sizeof *ids))) cli_die("out of memory");
        }
        ids[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') cli_die("sample: --ids: unexpected '%c'", *end);
    }
    if (n == 0) cli_die("sample: --ids is empty");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf(" ->");
    int rc = 0;
    for (int k = 0; k < max_new && n < (int)cfg.max_position_embeddings; k++) {
        if (mt_model_logits(m, ids, 1, (uint32_t)n, logits) != MT_OK) {
            fprintf(stderr, "megatrain: %s\n", mt_model_errmsg(m));
            rc = 1;
            break;
        }
        int best = 0;
        for (int v = 1; v < (int)cfg.vocab_size; v++)
            if (logits[v] > logits[best]) best = v;
        ids[n++] = best;
        printf(" %d", best);
        fflush(stdout);
    }
    printf("\n");
    free(ids);
    free(logits);
    return rc;
}

int cmd_sample(int argc, char **argv)
{
    const char *dir = "megatrain-demo", *prompt = NULL, *ids = NULL;
    int cpu = 0, max_new = 16;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            puts("usage: megatrain sample [--model DIR] [--cpu] [PROMPT]\n"
                 "       megatrain sample --model DIR --ids 1,2,3 [--max-new N] [--cpu]\n\n"
                 "Completes a prompt greedily with the model in DIR (default megatrain-demo).\n"
                 "For the arithmetic demo, PROMPT is a problem such as \"57+68=\"; without one,\n"
                 "problems are read from standard input, one per line. Any other model folder\n"
                 "takes its prompt as token ids (--ids) and prints the ids it generates.");
            return 0;
        } else if (cli_opt(argc, argv, &i, "--model", &v)) dir = v;
        else if (cli_opt(argc, argv, &i, "--ids", &v)) ids = v;
        else if (cli_opt(argc, argv, &i, "--max-new", &v)) max_new = (int)cli_int("--max-new", v, 1, 1 << 20);
        else if (cli_flag(argv, i, "--cpu")) cpu = 1;
        else if (argv[i][0] == '-' && argv[i][1] == '-') cli_die("sample: unknown option '%s'", argv[i]);
        else prompt = argv[i];
    }
    if (!ids && !is_demo(dir))
        cli_die("sample: %s is not the arithmetic demo; give the prompt as token ids with --ids", dir);
    mt_model *m = open_model(dir, cpu);
    if (ids) {
        int rc = sample_ids(m, ids, max_new);
        mt_model_destroy(m);
        return rc;
    }
    char line[256], ans[32];
    int rc = 0;
    for (;;) {
        const char *q = prompt;
        if (!q) {
            if (isatty(0)) fputs("problem> ", stdout), fflush(stdout);
            if (!fgets(line, sizeof line, stdin)) break;
            line[strcspn(line, "\r\n")] = '\0';
            if (!line[0]) continue;
            q = line;
        }
        char p[300];
        snprintf(p, sizeof p, "%s%s", q, q[strlen(q) - 1] == '=' ? "" : "=");
        if (demo_answer(m, p, ans, sizeof ans))
            fprintf(stderr, "megatrain: '%s' is not a problem like 57+68= (digits, '+', '=')\n", q), rc = 1;
        else
            printf("%s%s\n", p, ans);
        if (prompt) break;
    }
    mt_model_destroy(m);
    return rc;
}

int cmd_eval(int argc, char **argv)
{
    const char *dir = "megatrain-demo", *data = NULL;
    int cpu = 0, seq_len = 1024, batches = 16;
    uint32_t format = MT_TOKENS_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            puts("usage: megatrain eval [--model DIR] [--data FILE [--format F] [--seq-len N] [--batches N]] [--cpu]\n\n"
                 "With --data: the mean loss of the model in DIR on the file's held-out windows.\n"
                 "Without: the arithmetic demo's exact-match accuracy on its held-out problems.");
            return 0;
        } else if (cli_opt(argc, argv, &i, "--model", &v)) dir = v;
        else if (cli_opt(argc, argv, &i, "--data", &v)) data = v;
        else if (cli_opt(argc, argv, &i, "--format", &v)) format = cli_token_format(v);
        else if (cli_opt(argc, argv, &i, "--seq-len", &v)) seq_len = (int)cli_int("--seq-len", v, 2, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--batches", &v)) batches = (int)cli_int("--batches", v, 1, 1 << 20);
        else if (cli_flag(argv, i, "--cpu")) cpu = 1;
        else cli_die("eval: unknown option '%s'", argv[i]);
    }
    mt_model *m = open_model(dir, cpu);
    int rc = 0;
    if (!data) {
        if (!is_demo(dir)) cli_die("eval: %s is not a demo model: give --data", dir);
        demo_data d;
        if (demo_data_make(&d, DEMO_LO, DEMO_HI, DEMO_HELDOUT, 1)) cli_die("out of memory");
        int n = 0, right = demo_accuracy(m, d.heldout, d.n_heldout, &n);
        printf("held-out exact match: %.1f%% (%d of %d)\n", 100.0 * right / (n ? n : 1), right, n);
        demo_data_free(&d);
    } else {
        mt_model_config cfg;
        mt_model_config_init(&cfg);
        mt_model_get_config(m, &cfg);
        mt_dataset_options o;
        mt_dataset_options_init(&o);
        o.vocab_size = cfg.vocab_size;
        o.format = format;
        o.seq_len = (uint32_t)seq_len;
        mt_dataset *ds;
        if (mt_dataset_open(&ds, data, &o) != MT_OK) cli_die("%s", mt_last_errmsg());
        uint64_t nw = mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT);
        int32_t *tok = malloc((size_t)seq_len * sizeof *tok), *tg = malloc((size_t)seq_len * sizeof *tg);
        double sum = 0;
        uint64_t cnt = 0;
        for (uint64_t w = 0; w < nw && w < (uint64_t)batches; w++) {
            mt_dataset_read(ds, MT_SPLIT_HELDOUT, w, 1, tok, tg);
            mt_batch b;
            mt_batch_init(&b);
            b.micro_batch_size = 1, b.seq_len = (uint32_t)seq_len, b.num_micro_batches = 1, b.tokens = tok, b.targets = tg;
            mt_eval_stats es;
            mt_eval_stats_init(&es);
            if (mt_eval(m, &b, &es) != MT_OK) cli_die("%s", mt_model_errmsg(m));
            sum += es.loss * (double)es.target_tokens;
            cnt += es.target_tokens;
        }
        printf("held-out loss %.4f (perplexity %.2f) over %llu tokens\n", sum / (double)cnt, exp(sum / (double)cnt),
               (unsigned long long)cnt);
        free(tok), free(tg);
        mt_dataset_close(ds);
    }
    mt_model_destroy(m);
    return rc;
}

/* ---- plan --------------------------------------------------------------------------- */

static double gib(uint64_t b) { return (double)b / (1u << 30); }

int cmd_plan(int argc, char **argv)
{
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    mt_offload_policy pol;
    mt_offload_policy_init(&pol);
    mt_batch_shape sh;
    mt_batch_shape_init(&sh);
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            puts("usage: megatrain plan [--model DIR|FILE | --config DIR|FILE] [--layers N --hidden N --heads N\n"
                 "                      --kv-heads N --ffn N --vocab N] [--seq-len N] [--micro-batch N]\n"
                 "                      [--grad-accum N] [--fp32] [--cpu | --gpu-memory GIB]\n"
                 "                      [--host-budget GIB] [--gpu-budget GIB]\n\n"
                 "Prints the bytes each memory tier would hold, without allocating anything.\n"
                 "--model and --config take a Hugging Face config.json or the folder holding it;\n"
                 "the shape options change what it says. --gpu-memory plans for a GPU with that\n"
                 "much memory, on any machine (one without a GPU too); --gpu-budget caps the\n"
                 "memory of this machine's GPU.");
            return 0;
        } else if (cli_opt(argc, argv, &i, "--model", &v) || cli_opt(argc, argv, &i, "--config", &v)) {
            cli_config_load(&cfg, v);
        } else if (cli_opt(argc, argv, &i, "--gpu-memory", &v)) {
            pol.backend = MT_BACKEND_CUDA;
            pol.gpu_budget_bytes = (uint64_t)(cli_float("--gpu-memory", v, 0.001, 1e6) * (1u << 30));
        } else if (cli_opt(argc, argv, &i, "--layers", &v)) cfg.num_hidden_layers = (uint32_t)cli_int("--layers", v, 1, 4096);
        else if (cli_opt(argc, argv, &i, "--hidden", &v)) cfg.hidden_size = (uint32_t)cli_int("--hidden", v, 2, 1 << 17);
        else if (cli_opt(argc, argv, &i, "--heads", &v)) cfg.num_attention_heads = cfg.num_key_value_heads = (uint32_t)cli_int("--heads", v, 1, 1024);
        else if (cli_opt(argc, argv, &i, "--kv-heads", &v)) cfg.num_key_value_heads = (uint32_t)cli_int("--kv-heads", v, 1, 1024);
        else if (cli_opt(argc, argv, &i, "--ffn", &v)) cfg.intermediate_size = (uint32_t)cli_int("--ffn", v, 1, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--vocab", &v)) cfg.vocab_size = (uint32_t)cli_int("--vocab", v, 2, 1 << 24);
        else if (cli_opt(argc, argv, &i, "--seq-len", &v)) sh.seq_len = (uint32_t)cli_int("--seq-len", v, 1, 1 << 24);
        else if (cli_opt(argc, argv, &i, "--micro-batch", &v)) sh.micro_batch_size = (uint32_t)cli_int("--micro-batch", v, 1, 1 << 16);
        else if (cli_opt(argc, argv, &i, "--grad-accum", &v)) sh.num_micro_batches = (uint32_t)cli_int("--grad-accum", v, 1, 4096);
        else if (cli_opt(argc, argv, &i, "--host-budget", &v)) pol.host_budget_bytes = (uint64_t)(cli_float("--host-budget", v, 0, 1e6) * (1u << 30));
        else if (cli_opt(argc, argv, &i, "--gpu-budget", &v)) pol.gpu_budget_bytes = (uint64_t)(cli_float("--gpu-budget", v, 0, 1e6) * (1u << 30));
        else if (cli_flag(argv, i, "--fp32")) cfg.precision = MT_PRECISION_FP32;
        else if (cli_flag(argv, i, "--cpu")) pol.backend = MT_BACKEND_CPU;
        else cli_die("plan: unknown option '%s'", argv[i]);
    }
    if (pol.backend == MT_BACKEND_CPU && pol.gpu_budget_bytes) cli_die("plan: --cpu plans without a GPU: drop --gpu-memory or --gpu-budget");
    if (cfg.max_position_embeddings < sh.seq_len) cfg.max_position_embeddings = sh.seq_len;
    mt_memory_plan p;
    mt_memory_plan_init(&p);
    mt_status st = mt_plan(&p, &cfg, &pol, &sh);
    if (st == MT_ERR_INVALID_ARGUMENT || st == MT_ERR_STRUCT_SIZE || st == MT_ERR_NO_DEVICE) cli_die("%s", mt_last_errmsg());
    printf("model:       %.3f B parameters in %u units, %s\n", p.num_params / 1e9, p.num_units,
           cfg.precision == MT_PRECISION_FP32 ? "fp32" : "bf16");
    printf("batch:       %u x %u x %u tokens per step, %s backend\n", sh.num_micro_batches, sh.micro_batch_size,
           sh.seq_len, p.backend == MT_BACKEND_CUDA ? "CUDA" : "CPU");
    printf("host:        %8.2f GiB pinned + %8.2f GiB pageable (budget %.2f GiB)\n", gib(p.host_pinned_bytes),
           gib(p.host_pageable_bytes), gib(p.host_budget_bytes));
    printf("  weights %.2f, gradients %.2f, master %.2f, AdamW %.2f GiB (%.1f bytes per parameter)\n",
           gib(p.weight_bytes), gib(p.grad_bytes), gib(p.master_bytes), gib(p.optim_bytes),
           (double)(p.weight_bytes + p.grad_bytes + p.master_bytes + p.optim_bytes) / (double)p.num_params);
    printf("activations: %8.2f GiB checkpoints (%s), %.2f GiB working set\n", gib(p.activation_bytes),
           p.activations == MT_PLACE_DEVICE ? "on the GPU" : "in host memory", gib(p.workspace_bytes));
    if (p.backend == MT_BACKEND_CUDA)
        printf("GPU:         %8.2f GiB (budget %.2f GiB)\n", gib(p.gpu_bytes), gib(p.gpu_budget_bytes));
    if (st != MT_OK) {
        printf("does not fit: %s\n", mt_last_errmsg());
        return 1;
    }
    return 0;
}
