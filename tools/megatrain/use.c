/* megatrain eval / sample / plan: using a saved model, and planning one. */
#define _GNU_SOURCE
#include "chat.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
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

static const char sample_help[] =
    "usage: megatrain sample [--model DIR] [--cpu] [PROMPT]\n"
    "       megatrain sample --model DIR [--chat] [--system TEXT] [--chat-template NAME|FILE]\n"
    "                        [--chat-vars JSON] [--max-new N]\n"
    "                        [--temperature T] [--top-p P] [--seed N] [--cpu] PROMPT\n"
    "       megatrain sample --model DIR --ids 1,2,3 [--max-new N] [--cpu]\n"
    "\n"
    "Completes a prompt with the model in DIR (default megatrain-demo).\n"
    "For the arithmetic demo, PROMPT is a problem such as \"57+68=\"; without one,\n"
    "problems are read from standard input, one per line. A model folder with a\n"
    "tokenizer.json takes PROMPT as text and prints the text it writes: greedy, or\n"
    "with --temperature above 0 sampled from the likeliest tokens that make up\n"
    "--top-p of the probability (default 1), reproducibly for a --seed. --chat\n"
    "renders PROMPT as a user's message with the model's chat template (its\n"
    "chat_template.jinja or tokenizer_config.json's; --chat-template chatml,\n"
    "llama3, mistral or a file for a folder without one) and stops at the end of\n"
    "the assistant's turn (the template's end-of-turn token) or at EOS. --chat-vars\n"
    "gives the template variables ('{\"enable_thinking\": false}'). Any other model folder takes its prompt as\n"
    "token ids (--ids) and prints the ids it generates.\n";

static int has_tokenizer(const char *dir)
{
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return stat(path, &sb) == 0;
}

/* A text model's continuation of prompt (or its answer, with chat). */
static int sample_text(mt_model *m, const char *dir, const char *prompt, int chat, const char *chat_named,
                       const char *vars, const char *system, gen_options *o)
{
    mt_tokenizer *t;
    if (mt_tokenizer_load(&t, dir) != MT_OK) cli_die("%s", mt_last_errmsg());
    char eos[256] = "", why[512];
    chat_eos(dir, eos, sizeof eos);
    mt_chat_template *tmpl = chat ? chat_template_open(dir, chat_named, why, sizeof why) : NULL;
    if (chat && !tmpl) cli_die("sample --chat: %s", why);
    chat_stops(tmpl, vars, t, eos, o->stop);
    char *text = chat ? chat_prompt(tmpl, vars, system, prompt) : strdup(prompt);
    if (!text) cli_die("out of memory");
    if (!chat) fputs(prompt, stdout);
    o->echo = 1;
    /* a chat prompt carries its special tokens; a plain one gets the
     * tokenizer's own (Llama 2's <s>) */
    char *out = generate(m, t, text, chat ? MT_ENCODE_SPECIAL : MT_ENCODE_ADD_SPECIAL, o);
    putchar('\n');
    const int rc = out ? 0 : 1;
    free(out);
    free(text);
    mt_chat_template_free(tmpl);
    mt_tokenizer_free(t);
    return rc;
}

int cmd_sample(int argc, char **argv)
{
    const char *dir = "megatrain-demo", *prompt = NULL, *ids = NULL, *system = NULL, *chat_named = NULL,
               *vars = NULL;
    int cpu = 0, max_new = -1, chat = 0;
    gen_options o = {.temperature = 0, .top_p = 1, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            fputs(sample_help, stdout);
            return 0;
        } else if (cli_opt(argc, argv, &i, "--model", &v)) dir = v;
        else if (cli_opt(argc, argv, &i, "--ids", &v)) ids = v;
        else if (cli_opt(argc, argv, &i, "--max-new", &v)) max_new = (int)cli_int("--max-new", v, 1, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--temperature", &v)) o.temperature = cli_float("--temperature", v, 0, 100);
        else if (cli_opt(argc, argv, &i, "--top-p", &v)) o.top_p = cli_float("--top-p", v, 1e-6, 1);
        else if (cli_opt(argc, argv, &i, "--seed", &v)) o.seed = (uint64_t)cli_int("--seed", v, 0, INT64_MAX);
        else if (cli_opt(argc, argv, &i, "--system", &v)) system = v;
        else if (cli_opt(argc, argv, &i, "--chat-template", &v) || cli_opt(argc, argv, &i, "--chat-format", &v))
            chat_named = v;
        else if (cli_opt(argc, argv, &i, "--chat-vars", &v)) vars = v;
        else if (cli_flag(argv, i, "--chat")) chat = 1;
        else if (cli_flag(argv, i, "--cpu")) cpu = 1;
        else if (argv[i][0] == '-' && argv[i][1] == '-') cli_die("sample: unknown option '%s'", argv[i]);
        else prompt = argv[i];
    }
    cli_inputs in = {0};
    cli_input_add(&in, "--model", dir);
    cli_input_add(&in, "--chat-template", chat_named);
    cli_std_check(&in);
    cli_inputs_free(&in);
    const int text = !ids && has_tokenizer(dir);
    if (!ids && !text && !is_demo(dir))
        cli_die("sample: %s has no tokenizer.json and is not the arithmetic demo; give the prompt as token ids with "
                "--ids",
                dir);
    if (text && !prompt) cli_die("sample: give the prompt");
    mt_model *m = open_model(dir, cpu);
    if (ids || text) {
        o.max_new = max_new > 0 ? max_new : ids ? 16 : 128;
        int rc = ids ? sample_ids(m, ids, o.max_new) : sample_text(m, dir, prompt, chat, chat_named, vars, system, &o);
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

/* The last run of digits in s, or -1: a worked answer's result. */
static long last_number(const char *s)
{
    long v = -1;
    for (const char *p = s; *p; p++)
        if (isdigit((unsigned char)*p) && (p == s || !isdigit((unsigned char)p[-1]))) v = strtol(p, NULL, 10);
    return v;
}

/* Exact match on a JSONL file's answers: each assistant turn (or completion)
 * generated greedily from what comes before it, compared with the file's. */
/* The answers a JSONL file asks for: its assistant turns, or its completions. */
static long count_answers(const char *path)
{
    FILE *in = fopen(path, "r");
    if (!in) cli_die("cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long n = 0;
    while (getline(&line, &cap, in) > 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages"), *e;
        if (cJSON_IsArray(msgs)) {
            cJSON_ArrayForEach(e, msgs) {
                const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
                n += cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
            }
        } else {
            n += cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "completion"));
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(in);
    return n;
}

static int eval_jsonl(mt_model *m, const char *dir, const char *path, const char *chat_named, int show, int max_new)
{
    mt_tokenizer *t;
    if (mt_tokenizer_load(&t, dir) != MT_OK) cli_die("%s", mt_last_errmsg());
    char eos[256] = "", why[512];
    chat_eos(dir, eos, sizeof eos);
    mt_chat_template *tmpl = chat_template_open(dir, chat_named, why, sizeof why);
    int32_t chat_stop[2];
    chat_stops(tmpl, NULL, t, eos, chat_stop);
    FILE *in = fopen(path, "r");
    if (!in) cli_die("cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long no = 0, n = 0, exact = 0, answer = 0;
    gen_options o = {.max_new = max_new, .top_p = 1, .stop = {-1, -1}};
    /* generation takes seconds an answer on the CPU: a progress line on
     * stderr, redrawn on a terminal, else one at the first answer and then
     * every 10 seconds */
    const long total = count_answers(path);
    const int tty = isatty(2);
    const double t0 = cli_now();
    double shown_at = -1;
    while (getline(&line, &cap, in) > 0) {
        no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt"), *comp = cJSON_GetObjectItemCaseSensitive(j, "completion");
        if (!cJSON_IsArray(msgs) && !(cJSON_IsString(prompt) && cJSON_IsString(comp)))
            cli_die("%s:%ld: a record with \"messages\", or \"prompt\" and \"completion\"", path, no);
        const int turns = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 1;
        for (int k = 0; k < turns; k++) {
            const cJSON *e = cJSON_IsArray(msgs) ? cJSON_GetArrayItem(msgs, k) : NULL;
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role"), *content = cJSON_GetObjectItemCaseSensitive(e, "content");
            if (e && !(cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") && cJSON_IsString(content)))
                continue;
            if (e && !tmpl) cli_die("%s:%ld: %s", path, no, why);
            char *text = e ? chat_render(tmpl, NULL, msgs, k) : strdup(prompt->valuestring);
            const char *want = e ? content->valuestring : comp->valuestring;
            o.stop[0] = chat_stop[0];
            o.stop[1] = e ? chat_stop[1] : -1;
            char *got = generate(m, t, text, e ? MT_ENCODE_SPECIAL : MT_ENCODE_ADD_SPECIAL, &o);
            if (!got) cli_die("%s:%ld: generation failed", path, no);
            n++;
            exact += !strcmp(got, want);
            answer += last_number(got) == last_number(want) && last_number(want) >= 0;
            const double now = cli_now() - t0;
            if (tty || shown_at < 0 || now - shown_at >= 10 || n == total) {
                char took[32];
                cli_fmt_duration(took, sizeof took, now);
                fprintf(stderr, "%seval: answer %ld of %ld, %ld exact so far, %s elapsed%s", tty ? "\r" : "", n, total,
                        exact, took, tty && n < total ? "" : "\n");
                shown_at = now;
            }
            if (show && n <= show) printf("  %s\n    -> %s%s\n", want, got, strcmp(got, want) ? "   (differs)" : "");
            free(got);
            free(text);
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(in);
    mt_chat_template_free(tmpl);
    mt_tokenizer_free(t);
    if (!n) cli_die("%s holds no answer to check", path);
    printf("exact match: %.1f%% (%ld of %ld answers of %s); final number right: %.1f%%\n", 100.0 * exact / n, exact, n,
           path, 100.0 * answer / n);
    return 0;
}

int cmd_eval(int argc, char **argv)
{
    const char *dir = "megatrain-demo", *data = NULL, *jsonl = NULL;
    int cpu = 0, seq_len = 1024, batches = 16, show = 3, max_new = 256;
    uint32_t format = MT_TOKENS_AUTO;
    const char *chat = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            puts("usage: megatrain eval [--model DIR] [--data FILE [--format F] [--seq-len N] [--batches N]] [--cpu]\n"
                 "       megatrain eval --model DIR --jsonl FILE [--chat-template NAME|FILE] [--show N] [--max-new N]\n"
                 "                      [--cpu]\n\n"
                 "With --data: the mean loss of the model in DIR on the file's held-out windows.\n"
                 "With --jsonl: exact-match accuracy of the answers the model writes (greedily) to a file of\n"
                 "conversations or prompt/completion pairs, each assistant turn generated from what comes\n"
                 "before it by the model's chat template; --show N prints the first N answers (default 3);\n"
                 "--max-new N caps the tokens of each answer (default 256); a progress line goes to stderr.\n"
                 "Without either: the arithmetic demo's exact-match accuracy on its held-out problems.");
            return 0;
        } else if (cli_opt(argc, argv, &i, "--model", &v)) dir = v;
        else if (cli_opt(argc, argv, &i, "--data", &v)) data = v;
        else if (cli_opt(argc, argv, &i, "--format", &v)) format = cli_token_format(v);
        else if (cli_opt(argc, argv, &i, "--jsonl", &v)) jsonl = v;
        else if (cli_opt(argc, argv, &i, "--show", &v)) show = (int)cli_int("--show", v, 0, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--max-new", &v)) max_new = (int)cli_int("--max-new", v, 1, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--chat-template", &v) || cli_opt(argc, argv, &i, "--chat-format", &v))
            chat = v;
        else if (cli_opt(argc, argv, &i, "--seq-len", &v)) seq_len = (int)cli_int("--seq-len", v, 2, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--batches", &v)) batches = (int)cli_int("--batches", v, 1, 1 << 20);
        else if (cli_flag(argv, i, "--cpu")) cpu = 1;
        else cli_die("eval: unknown option '%s'", argv[i]);
    }
    /* eval writes only its standard output and error: neither may be an input */
    cli_inputs in = {0};
    cli_input_add(&in, "--model", dir);
    cli_input_add(&in, "--data", data);
    cli_input_add(&in, "--jsonl", jsonl);
    cli_input_add(&in, "--chat-template", chat);
    cli_std_check(&in);
    cli_inputs_free(&in);
    mt_model *m = open_model(dir, cpu);
    int rc = 0;
    if (jsonl) {
        rc = eval_jsonl(m, dir, jsonl, chat, show, max_new);
    } else if (!data) {
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

/* The library's family of an mt_arch value, or NULL (a program built against a newer header). */
static int family_info_of(mt_family_info *info, uint32_t arch)
{
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        mt_family_info_init(info);
        if (mt_family_get(info, i) != MT_OK) cli_die("%s", mt_last_errmsg());
        if (info->arch == arch) return 1;
    }
    return 0;
}

static const char *family_of(uint32_t arch)
{
    mt_family_info info;
    return family_info_of(&info, arch) ? info.display_name : "?"; /* the library's string, static */
}

/* What each family's example checkpoint costs in host memory by the library's plan (the GPU holds a
 * layer or two at a time). The families, their examples and shapes are the library's (mt_family_get,
 * mt_family_example). */
static int print_families(void)
{
    /* each text column as wide as its longest entry */
    int w[4] = {(int)strlen("family"), (int)strlen("architecture"), (int)strlen("particular"), (int)strlen("example")};
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        mt_family_info f;
        mt_family_info_init(&f);
        if (mt_family_get(&f, i) != MT_OK) cli_die("%s", mt_last_errmsg());
        const char *col[4] = {f.display_name, f.architecture, f.particular, f.example};
        for (int k = 0; k < 4; k++) w[k] = (int)strlen(col[k]) > w[k] ? (int)strlen(col[k]) : w[k];
    }
    printf("%-*s %-*s %-*s %-*s %10s %9s %7s %9s %7s %9s %7s\n", w[0], "family", w[1], "architecture", w[2],
           "particular", w[3], "example", "parameters", "bf16 GiB", "B/param", "fp32 GiB", "B/param", "lean GiB",
           "B/param");
    static const uint32_t precisions[3] = {MT_PRECISION_BF16, MT_PRECISION_FP32, MT_PRECISION_LEAN};
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        mt_family_info f;
        mt_family_info_init(&f);
        if (mt_family_get(&f, i) != MT_OK) cli_die("%s", mt_last_errmsg());
        double host[3] = {0, 0, 0}, bpp[3] = {0, 0, 0}, params = 0;
        for (int k = 0; k < 3; k++) {
            mt_model_config c;
            mt_model_config_init(&c);
            c.precision = precisions[k];
            if (mt_family_example(&c, f.arch) != MT_OK) cli_die("%s", mt_last_errmsg());
            mt_offload_policy pol;
            mt_offload_policy_init(&pol);
            pol.backend = MT_BACKEND_CPU;
            pol.host_budget_bytes = (uint64_t)1 << 50; /* the cost, not whether this machine has it */
            mt_memory_plan p;
            mt_memory_plan_init(&p);
            if (mt_plan(&p, &c, &pol, NULL) != MT_OK) cli_die("%s", mt_last_errmsg());
            const uint64_t state = p.weight_bytes + p.grad_bytes + p.master_bytes + p.optim_bytes;
            host[k] = gib(state), bpp[k] = (double)state / (double)p.num_params, params = (double)p.num_params;
        }
        printf("%-*s %-*s %-*s %-*s %8.2f B %9.1f %7.2f %9.1f %7.2f %9.1f %7.2f\n", w[0], f.display_name, w[1],
               f.architecture, w[2], f.particular, w[3], f.example, params / 1e9, host[0], bpp[0], host[1], bpp[1],
               host[2], bpp[2]);
    }
    puts("\nGiB, B/param: the model state the host keeps (weights, gradients, fp32 master weights, AdamW\n"
         "moments) in bf16, fp32 and lean training (--precision lean: 16-bit block-scaled weights and 8-bit\n"
         "moments); activations and the GPU's share come on top (plan a shape to see them).");
    return 0;
}

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
                 "                      [--grad-accum N] [--precision bf16|fp32|lean] [--fp32]\n"
                 "                      [--cpu | --gpu-memory GIB]\n"
                 "                      [--host-budget GIB] [--gpu-budget GIB]\n"
                 "       megatrain plan --families\n\n"
                 "Prints the bytes each memory tier would hold, without allocating anything.\n"
                 "--families lists the model families this library trains and what a model of\n"
                 "each costs in host memory.\n"
                 "--model and --config take a Hugging Face config.json or the folder holding it;\n"
                 "the shape options change what it says. --gpu-memory plans for a GPU with that\n"
                 "much memory, on any machine (one without a GPU too); --gpu-budget caps the\n"
                 "memory of this machine's GPU.");
            cli_print_families(stdout);
            return 0;
        } else if (cli_flag(argv, i, "--families")) {
            if (argc != 2) cli_die("plan: --families takes no other option");
            return print_families();
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
        else if (cli_opt(argc, argv, &i, "--precision", &v)) cfg.precision = cli_precision(v);
        else if (cli_flag(argv, i, "--cpu")) pol.backend = MT_BACKEND_CPU;
        else cli_die("plan: unknown option '%s'", argv[i]);
    }
    if (pol.backend == MT_BACKEND_CPU && pol.gpu_budget_bytes) cli_die("plan: --cpu plans without a GPU: drop --gpu-memory or --gpu-budget");
    if (cfg.max_position_embeddings < sh.seq_len) cfg.max_position_embeddings = sh.seq_len;
    mt_memory_plan p;
    mt_memory_plan_init(&p);
    mt_status st = mt_plan(&p, &cfg, &pol, &sh);
    /* a plan that does not fit is printed with the reason; any other failure has no plan to print */
    if (st != MT_OK && st != MT_ERR_HOST_BUDGET && st != MT_ERR_GPU_BUDGET) cli_die("%s", mt_last_errmsg());
    printf("model:       %.3f B parameters in %u units, %s, %s\n", p.num_params / 1e9, p.num_units,
           cli_precision_name(cfg.precision), family_of(cfg.arch));
    if (cfg.sliding_window) {
        printf("attention:   a sliding window of %u keys from layer %u on", cfg.sliding_window, cfg.max_window_layers);
        if (cfg.sliding_window_pattern) printf(", one layer in %u attending fully", cfg.sliding_window_pattern);
        printf("%s\n", cfg.sliding_window >= sh.seq_len ? " (as long as the sequence or longer: it masks nothing)" : "");
    }
    if (cfg.num_experts) {
        printf("experts:     %u of width %u in each sparse layer, %u a token%s; load-balancing loss ", cfg.num_experts,
               cfg.moe_intermediate_size, cfg.num_experts_per_tok, cfg.norm_topk_prob ? " (weights renormalised)" : "");
        if (cfg.output_router_logits) printf("x %g\n", (double)cfg.router_aux_loss_coef);
        else printf("off\n");
    }
    printf("batch:       %u x %u x %u tokens per step, %s backend\n", sh.num_micro_batches, sh.micro_batch_size,
           sh.seq_len, p.backend == MT_BACKEND_CUDA ? "CUDA" : "CPU");
    printf("host:        %8.2f GiB pinned + %8.2f GiB pageable (budget %.2f GiB)\n", gib(p.host_pinned_bytes),
           gib(p.host_pageable_bytes), gib(p.host_budget_bytes));
    printf("  weights %.2f, gradients %.2f, master %.2f, AdamW %.2f GiB (%.2f bytes per parameter)\n",
           gib(p.weight_bytes), gib(p.grad_bytes), gib(p.master_bytes), gib(p.optim_bytes),
           (double)(p.weight_bytes + p.grad_bytes + p.master_bytes + p.optim_bytes) / (double)p.num_params);
    char where[128] = "in host memory";
    const unsigned n_ck = cfg.num_hidden_layers + 1;
    if (p.backend == MT_BACKEND_CUDA && p.host_checkpoints)
        snprintf(where, sizeof where, "%u of %u in pinned host memory", p.host_checkpoints, n_ck);
    else if (p.backend == MT_BACKEND_CUDA)
        snprintf(where, sizeof where, "on the GPU");
    if (p.recomputed_checkpoints)
        snprintf(where + strlen(where), sizeof where - strlen(where), ", %u of %u recomputed in the backward",
                 p.recomputed_checkpoints, n_ck);
    printf("activations: %8.2f GiB checkpoints (%s), %.2f GiB working set\n", gib(p.activation_bytes), where,
           gib(p.workspace_bytes));
    if (p.backend == MT_BACKEND_CUDA)
        printf("GPU:         %8.2f GiB (budget %.2f GiB)\n", gib(p.gpu_bytes), gib(p.gpu_budget_bytes));
    if (st != MT_OK) {
        printf("does not fit: %s\n", mt_last_errmsg());
        return 1;
    }
    return 0;
}
