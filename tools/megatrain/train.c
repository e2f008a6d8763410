/* megatrain train: from settings to a saved model, with resume checkpoints
 * that a signal, a full disk or a reused folder cannot take away, a metrics
 * log and held-out evaluation. */
#define _GNU_SOURCE
#include "run.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct train_args {
    const char *data, *model_dir, *config, *tokenizer, *out, *resume, *checkpoints, *log_file;
    int steps, seq_len, micro_batch, grad_accum, log_every, save_every, eval_every, eval_batches;
    int layers, hidden, heads, kv_heads, ffn, vocab;
    uint32_t format, precision;
    double lr, min_lr_ratio, weight_decay, clip;
    int warmup, slots, threads, cpu, restart, force, attention, nondet_attention;
    int n_devices;      /* --devices: 0 (the default GPU), 1, or several (data parallel) */
    int32_t devices[64];
    uint32_t weight_fetch; /* --weight-fetch: mt_weight_fetch */
    uint64_t seed;
    int argc;
    char **argv;
} train_args;

static const char train_help[] =
    "usage: megatrain train [options]\n"
    "\n"
    "With no --data, trains the built-in demo: a small model learns two-digit\n"
    "addition (\"57+68=125\") from generated problems, reports its exact-match\n"
    "accuracy on problems it never saw, and saves itself to --out.\n"
    "\n"
    "data and model:\n"
    "  --data FILE        token file to train on\n"
    "  --format F         its format: auto (default: llm.c .bin by its header, else raw uint16), u16, u32, llmc\n"
    "  --model DIR        start from this Hugging Face model folder\n"
    "  --config FILE      a new model described by a Hugging Face config.json (the file or its folder)\n"
    "  --vocab N          the vocabulary of a new model (default: the tokenizer's, else --config's, else 32000)\n"
    "  --tokenizer DIR    the tokenizer of a new model (a tokenizer.json or its folder): saved with the model\n"
    "  --layers N --hidden N --heads N --kv-heads N --ffn N   the shape of a new model (over --config)\n"
    "  --precision P      bf16 (the default: 14 bytes of host state per parameter), fp32 (16), or lean\n"
    "                     (6.05: 16-bit block-scaled weights, 8-bit AdamW moments, no fp32 master)\n"
    "  --fp32             the same as --precision fp32\n"
    "  --out DIR          where to save the model (default: megatrain-demo, or megatrain-out)\n"
    "\n"
    "schedule:\n"
    "  --steps N          optimizer steps (demo: 2000 on the CPU, 3000 on a GPU; else 1000)\n"
    "  --seq-len N        tokens per sequence (demo: 64, else 1024)\n"
    "  --micro-batch N    sequences per micro-batch (demo: 16, else 4)\n"
    "  --grad-accum N     micro-batches per optimizer step (default 1)\n"
    "  --lr X             peak learning rate (demo: 3e-3, otherwise 3e-4)\n"
    "  --warmup N         warm-up steps (demo: 30, else steps / 20)\n"
    "  --min-lr-ratio X   cosine floor as a fraction of lr (default 0.1)\n"
    "  --weight-decay X   (default 0.1)\n"
    "  --clip X           global gradient-norm clip, 0 for none (default 1.0)\n"
    "  --seed N           initialisation and data order (default 1)\n"
    "\n"
    "checkpoints (a folder of step-NNNNNNNN checkpoints and `latest`):\n"
    "  --save-every N     write a resume checkpoint every N steps (and at the end)\n"
    "  --checkpoints DIR  where checkpoints go (default: OUT/checkpoints)\n"
    "  --resume DIR       continue the run of DIR (its newest checkpoint) or of DIR/step-N, bit for bit;\n"
    "                     give the run's other options again: a difference is refused\n"
    "  --force            resume although settings differ from the checkpoint's run, or set aside\n"
    "                     checkpoints after the one resumed from\n"
    "  --restart          delete an earlier run's checkpoints from the checkpoint folder and start over\n"
    "\n"
    "progress:\n"
    "  --log-every N      progress line every N steps (default 25)\n"
    "  --log-file FILE    one JSON object per step: step, loss, lr, grad_norm, tokens, tokens_per_s,\n"
    "                     seconds, elapsed (since this process began training), heldout_loss when\n"
    "                     measured (draw it: megatrain plot)\n"
    "  --eval-every N     held-out loss every N steps and at the end\n"
    "  --eval-batches N   batches of the training shape per held-out loss (default 2)\n"
    "\n"
    "machine:\n"
    "  --slots N          weight slots (default 2)\n"
    "  --devices LIST     the GPUs, e.g. 0,1,2,3 (default: GPU 0); several train data parallel, sharing one\n"
    "                     host copy of the model, --grad-accum divided among them (a multiple of their number)\n"
    "  --weight-fetch F   how each of several GPUs receives a layer's weights: whole (each over its own\n"
    "                     link; auto, the default, picks it) or slices (each a share, then an NCCL all-gather)\n"
    "  --threads N        CPU threads (default: all cores)\n"
    "  --cpu              use the CPU backend even when a GPU is present\n"
    "  --attention A      the GPU's attention: auto (cuDNN's fused kernels where installed and they\n"
    "                     serve the shape, else the library's; the default), kernels, cudnn\n"
    "  --nondeterministic-attention\n"
    "                     let cuDNN's attention backward add with atomics: faster at long sequences,\n"
    "                     with far less GPU memory, but the bits of a run are not reproducible\n"
    "\n"
    "SIGINT or SIGTERM (Ctrl-C, a scheduler's notice) abandons the step in flight, saves a checkpoint and\n"
    "the model, prints the command that resumes, and exits with 128 + the signal (130, 143); a second\n"
    "signal stops at once, leaving the last complete checkpoint intact. A checkpoint that cannot be\n"
    "written is reported and tried again at the next interval; a model that cannot be saved to --out is\n"
    "saved under $TMPDIR instead.\n"
    "\n"
    "Before any step: --out, the checkpoint folder and --log-file are locked for the whole run (a second\n"
    "run into one of them is refused, naming the first; the lock is DIR/.megatrain.lock, or FILE.lock), no\n"
    "output may be an input (--data, --model, --config, --tokenizer), and each output must be writable\n"
    "with room for the model and a checkpoint. A log that cannot be written mid-run is reported once, and\n"
    "the run ends with status 1.\n";

static void parse_train(int argc, char **argv, train_args *a)
{
    memset(a, 0, sizeof *a);
    a->steps = -1, a->seq_len = -1, a->micro_batch = -1, a->grad_accum = 1, a->log_every = 25;
    a->layers = -1, a->hidden = -1, a->heads = -1, a->kv_heads = -1, a->ffn = -1, a->vocab = -1;
    a->lr = -1, a->min_lr_ratio = 0.1, a->weight_decay = 0.1, a->clip = 1.0, a->warmup = -1, a->slots = 2;
    a->seed = 1, a->eval_batches = 2, a->format = MT_TOKENS_AUTO;
    a->argc = argc, a->argv = argv;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            fputs(train_help, stdout);
            exit(0);
        } else if (cli_opt(argc, argv, &i, "--data", &v)) a->data = v;
        else if (cli_opt(argc, argv, &i, "--format", &v)) a->format = cli_token_format(v);
        else if (cli_opt(argc, argv, &i, "--model", &v)) a->model_dir = v;
        else if (cli_opt(argc, argv, &i, "--config", &v)) a->config = v;
        else if (cli_opt(argc, argv, &i, "--tokenizer", &v)) a->tokenizer = v;
        else if (cli_opt(argc, argv, &i, "--vocab", &v)) a->vocab = (int)cli_int("--vocab", v, 2, 1 << 24);
        else if (cli_opt(argc, argv, &i, "--out", &v)) a->out = v;
        else if (cli_opt(argc, argv, &i, "--resume", &v)) a->resume = v;
        else if (cli_opt(argc, argv, &i, "--checkpoints", &v)) a->checkpoints = v;
        else if (cli_opt(argc, argv, &i, "--log-file", &v)) a->log_file = v;
        else if (cli_opt(argc, argv, &i, "--save-every", &v)) a->save_every = (int)cli_int("--save-every", v, 0, 1 << 30);
        else if (cli_opt(argc, argv, &i, "--eval-every", &v)) a->eval_every = (int)cli_int("--eval-every", v, 0, 1 << 30);
        else if (cli_opt(argc, argv, &i, "--eval-batches", &v)) a->eval_batches = (int)cli_int("--eval-batches", v, 1, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--steps", &v)) a->steps = (int)cli_int("--steps", v, 1, 100000000);
        else if (cli_opt(argc, argv, &i, "--seq-len", &v)) a->seq_len = (int)cli_int("--seq-len", v, 2, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--micro-batch", &v)) a->micro_batch = (int)cli_int("--micro-batch", v, 1, 1 << 16);
        else if (cli_opt(argc, argv, &i, "--grad-accum", &v)) a->grad_accum = (int)cli_int("--grad-accum", v, 1, 4096);
        else if (cli_opt(argc, argv, &i, "--lr", &v)) a->lr = cli_float("--lr", v, 0, 10);
        else if (cli_opt(argc, argv, &i, "--warmup", &v)) a->warmup = (int)cli_int("--warmup", v, 0, 100000000);
        else if (cli_opt(argc, argv, &i, "--min-lr-ratio", &v)) a->min_lr_ratio = cli_float("--min-lr-ratio", v, 0, 1);
        else if (cli_opt(argc, argv, &i, "--weight-decay", &v)) a->weight_decay = cli_float("--weight-decay", v, 0, 10);
        else if (cli_opt(argc, argv, &i, "--clip", &v)) a->clip = cli_float("--clip", v, 0, 1e9);
        else if (cli_opt(argc, argv, &i, "--layers", &v)) a->layers = (int)cli_int("--layers", v, 1, 4096);
        else if (cli_opt(argc, argv, &i, "--hidden", &v)) a->hidden = (int)cli_int("--hidden", v, 2, 1 << 17);
        else if (cli_opt(argc, argv, &i, "--heads", &v)) a->heads = (int)cli_int("--heads", v, 1, 1024);
        else if (cli_opt(argc, argv, &i, "--kv-heads", &v)) a->kv_heads = (int)cli_int("--kv-heads", v, 1, 1024);
        else if (cli_opt(argc, argv, &i, "--ffn", &v)) a->ffn = (int)cli_int("--ffn", v, 1, 1 << 20);
        else if (cli_opt(argc, argv, &i, "--slots", &v)) a->slots = (int)cli_int("--slots", v, 2, 16);
        else if (cli_opt(argc, argv, &i, "--devices", &v)) a->n_devices = cli_devices("--devices", v, a->devices, 64);
        else if (cli_opt(argc, argv, &i, "--weight-fetch", &v)) {
            if (!strcmp(v, "auto")) a->weight_fetch = MT_FETCH_AUTO;
            else if (!strcmp(v, "whole")) a->weight_fetch = MT_FETCH_WHOLE;
            else if (!strcmp(v, "slices")) a->weight_fetch = MT_FETCH_SLICES;
            else cli_die("train: --weight-fetch takes auto, whole or slices, not '%s'", v);
        }
        else if (cli_opt(argc, argv, &i, "--threads", &v)) a->threads = (int)cli_int("--threads", v, 1, 4096);
        else if (cli_opt(argc, argv, &i, "--seed", &v)) a->seed = (uint64_t)cli_int("--seed", v, 0, INT64_MAX);
        else if (cli_opt(argc, argv, &i, "--log-every", &v)) a->log_every = (int)cli_int("--log-every", v, 1, 1 << 30);
        else if (cli_flag(argv, i, "--fp32")) a->precision = MT_PRECISION_FP32;
        else if (cli_opt(argc, argv, &i, "--precision", &v)) a->precision = cli_precision(v);
        else if (cli_flag(argv, i, "--cpu")) a->cpu = 1;
        else if (cli_opt(argc, argv, &i, "--attention", &v)) {
            if (!strcmp(v, "auto")) a->attention = MT_ATTENTION_AUTO;
            else if (!strcmp(v, "kernels")) a->attention = MT_ATTENTION_KERNELS;
            else if (!strcmp(v, "cudnn")) a->attention = MT_ATTENTION_CUDNN;
            else cli_die("train: --attention takes auto, kernels or cudnn, not '%s'", v);
        } else if (cli_flag(argv, i, "--nondeterministic-attention")) a->nondet_attention = 1;
        else if (cli_flag(argv, i, "--restart")) a->restart = 1;
        else if (cli_flag(argv, i, "--force")) a->force = 1;
        else cli_die("train: unknown option '%s' (see megatrain train --help)", argv[i]);
    }
    if (a->model_dir && !a->data) cli_die("train: --model needs --data");
    if (a->resume && a->model_dir) cli_die("train: --resume continues a run; it takes no --model");
    if (a->config && a->model_dir) cli_die("train: --model brings its own config.json; --config is for a new model");
    if (a->resume && a->restart) cli_die("train: --resume continues a run and --restart starts one over: pick one");
    if (!a->data && (a->config || a->vocab > 0 || a->tokenizer))
        cli_die("train: --config, --vocab and --tokenizer describe a model for --data; the demo has its own");
    if (a->model_dir && (a->vocab > 0 || a->layers > 0 || a->hidden > 0 || a->heads > 0 || a->kv_heads > 0 || a->ffn > 0))
        cli_die("train: --model brings its own shape and vocabulary; --vocab and the shape options are for a new model");
    if (a->tokenizer && a->model_dir)
        cli_die("train: --model brings its own tokenizer (saved with the model); --tokenizer is for a new model");
    if (a->n_devices && a->cpu) cli_die("train: --devices names GPUs; --cpu trains without one: pick one");
    if (a->n_devices > 1 && a->grad_accum % a->n_devices)
        cli_die("train: --grad-accum %d is not a multiple of the %d devices: each GPU takes the same number of "
                "micro-batches", a->grad_accum, a->n_devices);
}

#define DEFAULT(x, d) ((x) < 0 ? (d) : (x))

/* ---- one run ------------------------------------------------------------------ */

/* Where a run's batches come from: the demo's generator or a token file. The
 * position is what a checkpoint stores to continue the stream exactly. */
typedef struct batch_source {
    const demo_data *demo; /* or */
    mt_dataset *ds;
    uint64_t position;     /* demo: the generator's state; data: the next window */
} batch_source;

typedef struct run {
    const train_args *a;
    mt_model *m;
    batch_source src;
    int steps, M, B, S;
    const char *out;
    int demo;
    run_ckpt ck;
    cJSON *identity; /* the settings a resume must match ("run" in each checkpoint) */
    cJSON *history;  /* trainer_state.json's log_history: the logged steps and held-out losses */
    int log_fd;      /* --log-file, or -1 */
    int log_lost;    /* the first step the log could not take, or 0 */
    cli_lock out_lock, ck_lock, log_lock; /* the run's outputs are its own */
    int32_t *tok, *tg;
    mt_batch batch;
    uint64_t saved_step; /* the step of the last checkpoint written, or resumed from */
    int n_saves;         /* checkpoints this process wrote */
} run;

static void next_batch(batch_source *src, int n_seq, int seq_len, int32_t *tok, int32_t *tg)
{
    if (src->demo) {
        demo_fill_batch(src->demo, &src->position, n_seq, seq_len, tok, tg);
    } else {
        if (mt_dataset_read(src->ds, MT_SPLIT_TRAIN, src->position, (uint32_t)n_seq, tok, tg) != MT_OK)
            cli_die("%s", mt_last_errmsg());
        src->position += (uint64_t)n_seq;
    }
}

/* The held-out loss: eval_batches batches of the training shape, the same
 * ones every time (the file's held-out windows, or the demo's held-out
 * problems); NaN when the model says no (an abort, say). */
static double heldout_loss(run *r)
{
    double sum = 0;
    uint64_t count = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    const int n_seq = r->M * r->B;
    for (int k = 0; k < r->a->eval_batches; k++) {
        if (r->src.demo)
            demo_fill_from(r->src.demo->heldout, r->src.demo->n_heldout, &rng, n_seq, r->S, r->tok, r->tg);
        else if (mt_dataset_read(r->src.ds, MT_SPLIT_HELDOUT, (uint64_t)k * n_seq, (uint32_t)n_seq, r->tok, r->tg))
            cli_die("%s", mt_last_errmsg());
        mt_eval_stats es;
        mt_eval_stats_init(&es);
        if (mt_eval(r->m, &r->batch, &es) != MT_OK) {
            if (!run_signal()) fprintf(stderr, "megatrain: held-out loss: %s\n", mt_model_errmsg(r->m));
            return NAN;
        }
        sum += es.loss * (double)es.target_tokens;
        count += es.target_tokens;
    }
    return count ? sum / (double)count : NAN;
}

/* The bytes of the files in dir (a checkpoint's step folder). */
static uint64_t folder_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    uint64_t total = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[4600];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) total += (uint64_t)sb.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* A resume checkpoint of the model's step, with the run's settings and log
 * history in its trainer_state.json, and its size (a line: the first time,
 * then each 10th). 0, or 1 with the problem reported. */
static int save_checkpoint(run *r)
{
    cJSON *c = cJSON_CreateObject();
    if (!c || !cJSON_AddItemReferenceToObject(c, "run", r->identity) ||
        !cJSON_AddItemReferenceToObject(c, "log_history", r->history))
        cli_die("out of memory");
    char *text = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    if (!text) cli_die("out of memory");
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    info.data_position = r->src.position;
    info.caller_json = text;
    const mt_status st = mt_checkpoint_save(r->m, r->ck.dir, &info);
    cJSON_free(text);
    const uint64_t step = mt_model_step_count(r->m);
    if (st != MT_OK) {
        fprintf(stderr, "megatrain: the checkpoint of step %llu could not be written: %s\n", (unsigned long long)step,
                mt_model_errmsg(r->m));
        return 1;
    }
    r->saved_step = step;
    if (r->n_saves++ % 10 == 0) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/step-%08llu", r->ck.dir, (unsigned long long)step);
        const uint64_t bytes = folder_bytes(dir);
        const int gib = bytes >= (1u << 30);
        printf("checkpoint %s: %.2f %s, %.2f bytes per parameter (%s)\n", dir,
               (double)bytes / (gib ? 1u << 30 : 1u << 20), gib ? "GiB" : "MiB",
               (double)bytes / (double)mt_model_num_params(r->m), cli_precision_name(r->a->precision));
    }
    return 0;
}

static int write_demo_marker(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, DEMO_MARKER);
    return run_write_atomic(path, "megatrain arithmetic demo; vocabulary: digits 0-9, '+' = 10, '=' = 11, newline = 12\n");
}

/* The model (and the demo's marker) into dir; 0, or -1 with why filled. */
/* A new model's tokenizer (--tokenizer: a tokenizer.json or its folder) into
 * dir, as mt_model_save carries a loaded model's: tokenizer.json and the
 * config files beside it. */
static int copy_tokenizer(const char *from, const char *dir, char *why, size_t n)
{
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "chat_template.jinja"};
    struct stat sb;
    const int folder = stat(from, &sb) == 0 && S_ISDIR(sb.st_mode);
    const char *slash = strrchr(from, '/');
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[2100], dst[2100];
        if (folder) snprintf(src, sizeof src, "%s/%s", from, files[i]);
        else if (i == 0) snprintf(src, sizeof src, "%s", from);
        else snprintf(src, sizeof src, "%.*s%s", slash ? (int)(slash - from + 1) : 0, from, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        FILE *f = fopen(src, "r");
        if (!f) continue; /* the config files are optional */
        char *text = NULL;
        size_t cap = 0;
        const int bad = getdelim(&text, &cap, '\0', f) < 0 || run_write_atomic(dst, text);
        fclose(f);
        free(text);
        if (bad) {
            snprintf(why, n, "cannot copy %s to %s: %s", src, dst, strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int save_model_to(run *r, const char *dir, char *why, size_t n)
{
    if (mt_model_save(r->m, dir) != MT_OK) {
        snprintf(why, n, "%s", mt_model_errmsg(r->m));
        return -1;
    }
    if (r->a->tokenizer && copy_tokenizer(r->a->tokenizer, dir, why, n)) return -1;
    if (r->demo && write_demo_marker(dir)) {
        snprintf(why, n, "cannot write %s/%s: %s", dir, DEMO_MARKER, strerror(errno));
        return -1;
    }
    return 0;
}

/* The model into --out; when that fails, into a folder of its own under
 * $TMPDIR (often another file system than a full one), and says where.
 * 0 only when --out has it. */
static int save_model(run *r)
{
    char why[4400];
    if (save_model_to(r, r->out, why, sizeof why) == 0) {
        printf("saved the model to %s/\n", r->out);
        return 0;
    }
    fprintf(stderr, "megatrain: the model could not be saved to %s: %s\n", r->out, why);
    const char *tmp = getenv("TMPDIR");
    char rescue[4200];
    snprintf(rescue, sizeof rescue, "%s/megatrain-rescue-%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    if (save_model_to(r, rescue, why, sizeof why) == 0)
        fprintf(stderr, "megatrain: saved the model to %s/ instead: move it where it belongs\n", rescue);
    else
        fprintf(stderr, "megatrain: nor to %s: %s\n", rescue, why);
    return 1;
}

/* The command that continues this run: the same options, with --resume. */
static void print_resume_hint(const run *r)
{
    fprintf(stderr, strpbrk(cli_program, " \t'\"$\\") ? "megatrain: resume with: '%s' train" : "megatrain: resume with: %s train",
            cli_program);
    for (int i = 1; i < r->a->argc; i++) {
        const char *s = r->a->argv[i];
        if (!strcmp(s, "--restart") || !strcmp(s, "--force")) continue;
        if (!strcmp(s, "--resume")) {
            i++;
            continue;
        }
        if (!strncmp(s, "--resume=", 9)) continue;
        fprintf(stderr, strpbrk(s, " \t'\"$\\") ? " '%s'" : " %s", s);
    }
    fprintf(stderr, " --resume %s\n", r->ck.dir);
}

/* One step's line of the metrics log, whole or not at all: a line that could
 * not be written entirely is cut off again, so the log never ends torn. The
 * first failure is reported and ends the log; the run goes on, and its exit
 * status says the log is short. */
static void write_log_line(run *r, int s, const mt_step_stats *stats, double el, double held)
{
    cJSON *j = run_record((uint64_t)s, stats, el, held);
    char *line = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!line) cli_die("out of memory");
    const size_t n = strlen(line);
    line[n] = '\n'; /* over the NUL: written as one piece */
    struct stat sb;
    const int regular = fstat(r->log_fd, &sb) == 0 && S_ISREG(sb.st_mode);
    const off_t before = regular ? lseek(r->log_fd, 0, SEEK_END) : 0;
    size_t done = 0;
    errno = 0;
    while (done < n + 1) {
        const ssize_t w = write(r->log_fd, line + done, n + 1 - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    const int e = done == n + 1 ? 0 : errno ? errno : EIO;
    cJSON_free(line);
    if (!e) return;
    if (regular && before >= 0 && ftruncate(r->log_fd, before) != 0) {
        /* the torn line stays; what follows would join it, so nothing does */
    }
    r->log_lost = s;
    fprintf(stderr, "megatrain: cannot write to --log-file %s: %s: the log stops before step %d; the run goes on, "
            "and ends with status 1\n", r->a->log_file, strerror(e), s);
}

/* Steps from the model's step count up to r->steps, with progress lines,
 * held-out losses, the metrics log and checkpoints. The exit status. */
static int run_steps(run *r, const mt_optim_config *o)
{
    const train_args *a = r->a;
    const int first = (int)mt_model_step_count(r->m) + 1;
    uint64_t done = 0;
    const double t0 = cli_now();
    int failed = 0;
    for (int s = first; s <= r->steps && !run_signal() && !failed; s++) {
        const uint64_t position = r->src.position;
        next_batch(&r->src, r->M * r->B, r->S, r->tok, r->tg);
        mt_step_stats stats;
        mt_step_stats_init(&stats);
        const mt_status st = mt_step(r->m, &r->batch, o, &stats);
        if (st != MT_OK) {
            r->src.position = position; /* the batch is read again by whoever continues */
            if (st != MT_ERR_ABORTED) {
                const char *why = mt_model_errmsg(r->m);
                /* the library's message may name the step already */
                if (!strncmp(why, "step ", 5)) fprintf(stderr, "megatrain: %s\n", why);
                else fprintf(stderr, "megatrain: step %d: %s\n", s, why);
                failed = 1;
            }
            break;
        }
        done += stats.tokens;
        const int last = s == r->steps;
        double held = NAN;
        if (a->eval_every && (s % a->eval_every == 0 || last)) {
            run_hold_off_signals(1); /* the step's record is whole, or a resume would never measure it */
            held = heldout_loss(r);
            run_hold_off_signals(0);
        }
        const double el = cli_now() - t0;
        if (r->log_fd >= 0 && !r->log_lost) write_log_line(r, s, &stats, el, held);
        if (s % a->log_every == 0 || last || s == first || !isnan(held)) {
            cJSON_AddItemToArray(r->history, run_record((uint64_t)s, &stats, el, held));
            const double left = el / (s - first + 1) * (r->steps - s);
            char l[32], e[32], h[40] = "";
            cli_fmt_duration(e, sizeof e, el);
            cli_fmt_duration(l, sizeof l, left);
            if (!isnan(held)) snprintf(h, sizeof h, " | held-out %.4f", held);
            printf("step %5d/%d | loss %.4f%s | grad norm %.3f | lr %.2e | %.0f tok/s | %s elapsed, %s left\n", s,
                   r->steps, stats.loss, h, stats.grad_norm, stats.lr, (double)done / el, e, l);
            fflush(stdout);
        }
        /* a failed checkpoint is reported, and the next interval tries again */
        if (a->save_every && s % a->save_every == 0 && !last && !run_signal()) save_checkpoint(r);
    }
    const uint64_t step = mt_model_step_count(r->m);
    const int sig = run_signal();
    if (sig || failed) {
        /* what was trained since the last checkpoint is kept */
        int kept = step > 0 && (step == r->saved_step || save_checkpoint(r) == 0);
        if (sig) {
            fprintf(stderr, "megatrain: stopped by %s after step %llu of %d%s\n", run_signal_name(sig),
                    (unsigned long long)step, r->steps,
                    kept ? "" : step ? "; no checkpoint could be written" : "; no step was taken: nothing is saved");
            /* an untrained model would replace whatever --out held */
            if (step) save_model(r);
        }
        if (kept) {
            fprintf(stderr, "megatrain: checkpoint of step %llu in %s\n", (unsigned long long)step, r->ck.dir);
            print_resume_hint(r);
        }
        return sig ? 128 + sig : 1;
    }
    int rc = 0;
    if ((a->save_every || a->resume) && step != r->saved_step) rc |= save_checkpoint(r);
    rc |= save_model(r);
    if (r->log_lost) {
        fprintf(stderr, "megatrain: --log-file %s lacks steps %d to %d: they could not be written\n", a->log_file,
                r->log_lost, r->steps);
        rc = 1;
    }
    return rc;
}

/* A float as the shortest decimal that reads back as it: 0.003, not
 * 0.0030000000260770321, in the JSON and in messages. */
static double decimal(float x)
{
    char buf[32];
    for (int digits = 6; digits < 10; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if ((float)strtod(buf, NULL) == x) break;
    }
    return strtod(buf, NULL);
}

/* The settings a resume must match, as the "run" of every checkpoint. */
static cJSON *identity_of(const train_args *a, const mt_model_config *cfg, const mt_optim_config *o, int steps,
                          int M, int B, int S)
{
    cJSON *j = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(j, "model"), *b = cJSON_AddObjectToObject(j, "batch"),
          *s = cJSON_AddObjectToObject(j, "schedule"), *d = cJSON_AddObjectToObject(j, "data");
    if (!d) cli_die("out of memory");
    const char *arch = "?"; /* the family's short name, which a resume compares */
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        mt_family_info f;
        mt_family_info_init(&f);
        if (mt_family_get(&f, i) == MT_OK && f.arch == cfg->arch) arch = f.name;
    }
    cJSON_AddStringToObject(m, "arch", arch);
    cJSON_AddNumberToObject(m, "vocab_size", cfg->vocab_size);
    cJSON_AddNumberToObject(m, "hidden_size", cfg->hidden_size);
    cJSON_AddNumberToObject(m, "intermediate_size", cfg->intermediate_size);
    cJSON_AddNumberToObject(m, "num_hidden_layers", cfg->num_hidden_layers);
    cJSON_AddNumberToObject(m, "num_attention_heads", cfg->num_attention_heads);
    cJSON_AddNumberToObject(m, "num_key_value_heads", cfg->num_key_value_heads);
    cJSON_AddStringToObject(m, "precision", cli_precision_name(cfg->precision));
    cJSON_AddStringToObject(m, "init", a->model_dir ? a->model_dir : a->config ? a->config : "random");
    cJSON_AddNumberToObject(b, "seq_len", S);
    cJSON_AddNumberToObject(b, "micro_batch", B);
    cJSON_AddNumberToObject(b, "grad_accum", M);
    cJSON_AddNumberToObject(s, "steps", steps);
    cJSON_AddNumberToObject(s, "lr", decimal(o->lr));
    cJSON_AddNumberToObject(s, "warmup", o->warmup_steps);
    cJSON_AddNumberToObject(s, "min_lr_ratio", decimal(o->min_lr_ratio));
    cJSON_AddNumberToObject(s, "weight_decay", decimal(o->weight_decay));
    cJSON_AddNumberToObject(s, "clip", decimal(o->grad_clip));
    if (a->data) {
        uint64_t bytes;
        char fp[17];
        if (run_fingerprint(a->data, &bytes, fp)) cli_die("cannot read %s: %s", a->data, strerror(errno));
        cJSON_AddStringToObject(d, "file", a->data);
        cJSON_AddNumberToObject(d, "bytes", (double)bytes);
        cJSON_AddStringToObject(d, "fingerprint", fp);
    } else {
        cJSON_AddStringToObject(d, "demo", "two-digit addition");
    }
    cJSON_AddNumberToObject(j, "seed", (double)a->seed);
    return j;
}

static mt_optim_config optim_of(const train_args *a, int steps, double default_lr, int default_warmup)
{
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = (float)(a->lr < 0 ? default_lr : a->lr);
    o.warmup_steps = (uint32_t)DEFAULT(a->warmup, default_warmup);
    o.total_steps = (uint32_t)steps;
    o.min_lr_ratio = (float)a->min_lr_ratio;
    o.weight_decay = (float)a->weight_decay;
    o.grad_clip = (float)a->clip;
    return o;
}

/* Everything after the model exists: resume, the steps, the saves. */
static int train_model(run *r, const mt_optim_config *o)
{
    const train_args *a = r->a;
    const size_t n = (size_t)r->M * r->B * r->S;
    if (!(r->tok = malloc(n * sizeof *r->tok)) || !(r->tg = malloc(n * sizeof *r->tg))) cli_die("out of memory");
    mt_batch_init(&r->batch);
    r->batch.micro_batch_size = (uint32_t)r->B;
    r->batch.seq_len = (uint32_t)r->S;
    r->batch.num_micro_batches = (uint32_t)r->M;
    r->batch.tokens = r->tok;
    r->batch.targets = r->tg;
    if (!(r->history = cJSON_CreateArray())) cli_die("out of memory");

    if (r->ck.resume_step >= 0) {
        mt_checkpoint_info info;
        mt_checkpoint_info_init(&info);
        if (mt_checkpoint_load(r->m, r->ck.resume_path, &info) != MT_OK) cli_die("%s", mt_model_errmsg(r->m));
        char diff[4096];
        if (run_compare(info.caller_json, r->identity, diff, sizeof diff)) {
            if (!a->force)
                cli_die("--resume %s: this is not the run of that checkpoint:%s\n(give the run's own options, or "
                        "--force to continue anyway, no longer bit for bit)",
                        r->ck.resume_path, diff);
            printf("--force: resuming although the run differs:%s\n", diff);
        }
        cJSON *saved = info.caller_json ? cJSON_Parse(info.caller_json) : NULL;
        cJSON *hist = cJSON_DetachItemFromObjectCaseSensitive(saved, "log_history");
        if (cJSON_IsArray(hist)) {
            cJSON_Delete(r->history);
            r->history = hist;
        } else {
            cJSON_Delete(hist);
        }
        cJSON_Delete(saved);
        r->src.position = info.data_position;
        r->saved_step = info.step;
        printf("resumed from %s at step %llu\n", r->ck.resume_path, (unsigned long long)info.step);
        if (a->log_file) run_log_trim(a->log_file, info.step);
    }
    r->log_fd = -1;
    if (a->log_file) {
        /* a new run's log starts empty; a regular file only: a device or a pipe is written as it is */
        struct stat sb;
        const int truncate = r->ck.resume_step < 0 && stat(a->log_file, &sb) == 0 && S_ISREG(sb.st_mode);
        if ((r->log_fd = open(a->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0),
                              0666)) < 0)
            cli_die("cannot open --log-file %s: %s", a->log_file, strerror(errno));
    }
    int rc = run_steps(r, o);
    if (r->log_fd >= 0 && close(r->log_fd) && !r->log_lost) {
        fprintf(stderr, "megatrain: writing --log-file %s: %s\n", a->log_file, strerror(errno));
        rc = rc ? rc : 1;
    }
    cJSON_Delete(r->history);
    cJSON_Delete(r->identity);
    free(r->tok);
    free(r->tg);
    return rc;
}

/* What a model folder written by this run holds: a file of an input by one
 * of these names in --out would be replaced. */
static const char *const model_files[] = {"model.safetensors", "model.safetensors.index.json", "config.json",
                                          "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                          "special_tokens_map.json", "tokenizer.model", "chat_template.jinja",
                                          DEMO_MARKER, NULL};

/* "512.0 MiB", "3.2 GiB", "1.6 TiB" */
static const char *fmt_bytes(char *buf, size_t n, uint64_t b)
{
    const double x = (double)b;
    if (x >= 1024.0 * (1u << 30)) snprintf(buf, n, "%.1f TiB", x / (1024.0 * (1u << 30)));
    else if (x >= (1u << 30)) snprintf(buf, n, "%.1f GiB", x / (1u << 30));
    else snprintf(buf, n, "%.1f MiB", x / (1u << 20));
    return buf;
}

/* Before any work: no output over an input, outputs that can be written,
 * with room for what the run will write, and that no other run writes (a
 * lock on --out, the checkpoint folder and the log, held to the end). Then
 * the checkpoint folder is made ready (run_ckpt_prepare). Exits with a
 * message on any problem. */
static void guard_outputs(run *r, const mt_model_config *cfg, const mt_offload_policy *pol)
{
    const train_args *a = r->a;
    cli_inputs in = {0};
    cli_input_add(&in, "--data", a->data);
    cli_input_add(&in, "--model", a->model_dir);
    cli_input_add(&in, "--config", a->config);
    cli_input_add(&in, "--tokenizer", a->tokenizer);
    struct stat sb;
    if (a->tokenizer && stat(a->tokenizer, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        /* a tokenizer.json: copy_tokenizer reads the config files beside it */
        const char *slash = strrchr(a->tokenizer, '/');
        for (int i = 4; model_files[i] && i < 9; i++) {
            char path[4200];
            snprintf(path, sizeof path, "%.*s%s", slash ? (int)(slash - a->tokenizer + 1) : 0, a->tokenizer,
                     model_files[i]);
            cli_input_add(&in, "--tokenizer", path);
        }
    }
    cli_std_check(&in);
    run_ckpt_resolve(&r->ck, a->resume, a->checkpoints, r->out);
    if (a->log_file) {
        if (stat(a->log_file, &sb) == 0 && S_ISDIR(sb.st_mode)) cli_die("--log-file %s is a folder", a->log_file);
        cli_output_check(&in, "--log-file", a->log_file);
    }
    cli_output_dir_check(&in, "--out", r->out, model_files);
    cli_output_check(&in, a->resume ? "checkpoint folder" : "--checkpoints", r->ck.dir);
    cli_inputs_free(&in);

    /* writable, and ours: the lock files are the probes */
    char lock[4300];
    cli_make_dir("--out", r->out);
    snprintf(lock, sizeof lock, "%s/%s", r->out, CLI_LOCK_NAME);
    cli_lock_take(&r->out_lock, "--out", r->out, lock);
    const char *ck_what = a->resume ? "the checkpoint folder" : "--checkpoints";
    /* made now where checkpoints are planned; one that a signal's checkpoint
     * makes later is locked by the library's save */
    if (a->save_every || a->resume || a->checkpoints) cli_make_dir(ck_what, r->ck.dir);
    struct stat o, c;
    if (stat(r->ck.dir, &c) == 0 && (stat(r->out, &o) || o.st_dev != c.st_dev || o.st_ino != c.st_ino)) {
        snprintf(lock, sizeof lock, "%s/%s", r->ck.dir, CLI_LOCK_NAME);
        cli_lock_take(&r->ck_lock, ck_what, r->ck.dir, lock);
    }
    if (a->log_file) {
        cli_probe_file("--log-file", a->log_file);
        const int exists = stat(a->log_file, &sb) == 0;
        if (!exists || S_ISREG(sb.st_mode)) { /* a device or a pipe has no place for a lock beside it */
            snprintf(lock, sizeof lock, "%s.lock", a->log_file);
            cli_lock_take(&r->log_lock, "--log-file", a->log_file, lock);
        }
    }

    /* room: the model folder, and a checkpoint (the older ones are removed
     * only once a new one is in place), against each file system's free space */
    mt_memory_plan p;
    mt_memory_plan_init(&p);
    mt_batch_shape sh;
    mt_batch_shape_init(&sh);
    sh.seq_len = (uint32_t)r->S, sh.micro_batch_size = (uint32_t)r->B, sh.num_micro_batches = (uint32_t)r->M;
    const mt_status st = mt_plan(&p, cfg, pol, &sh);
    if (st == MT_OK || st == MT_ERR_HOST_BUDGET || st == MT_ERR_GPU_BUDGET) {
        const uint64_t model = p.num_params * (cfg->precision == MT_PRECISION_FP32 ? 4 : 2);
        const uint64_t ck = a->save_every || a->resume ? (p.master_bytes ? p.master_bytes : p.weight_bytes) + p.optim_bytes : 0;
        uint64_t free_out, free_ck, fs_out, fs_ck;
        if (cli_free_bytes(r->out, &free_out, &fs_out) == 0 &&
            (cli_free_bytes(r->ck.dir, &free_ck, &fs_ck) == 0 || (free_ck = free_out, fs_ck = fs_out, 1))) {
            const uint64_t need_out = model + (fs_ck == fs_out ? ck : 0);
            char b1[32], b2[32], b3[32];
            if (need_out > free_out)
                cli_die("--out %s: the model (%s)%s need%s %s, but its file system has %s free: free some space or "
                        "give another --out", r->out, fmt_bytes(b1, sizeof b1, model),
                        fs_ck == fs_out && ck ? " and a checkpoint of it" : "", fs_ck == fs_out && ck ? "" : "s",
                        fmt_bytes(b2, sizeof b2, need_out), fmt_bytes(b3, sizeof b3, free_out));
            if (fs_ck != fs_out && ck > free_ck)
                cli_die("%s %s: a checkpoint needs %s, but its file system has %s free: free some space or give "
                        "another folder", ck_what, r->ck.dir, fmt_bytes(b1, sizeof b1, ck),
                        fmt_bytes(b2, sizeof b2, free_ck));
        }
    }
    run_ckpt_prepare(&r->ck, a->resume, a->restart, a->force);
}

static mt_offload_policy policy_of(const train_args *a)
{
    mt_offload_policy pol;
    mt_offload_policy_init(&pol);
    pol.backend = a->cpu ? MT_BACKEND_CPU : MT_BACKEND_AUTO;
    pol.weight_slots = (uint32_t)a->slots;
    if (a->n_devices == 1) pol.device = a->devices[0];
    if (a->n_devices > 1) pol.num_devices = (uint32_t)a->n_devices, pol.devices = a->devices;
    pol.weight_fetch = a->weight_fetch;
    pol.optimizer_threads = (uint32_t)a->threads;
    pol.attention = (uint32_t)a->attention;
    pol.attention_flags = a->nondet_attention ? MT_ATTENTION_NONDETERMINISTIC : 0;
    pol.log_callback = cli_log;
    pol.log_level = MT_LOG_WARN;
    pol.abort_callback = run_abort_requested;
    return pol;
}

static int train_demo(train_args *a)
{
    run r = {.a = a, .S = DEFAULT(a->seq_len, 64), .B = DEFAULT(a->micro_batch, 16), .M = a->grad_accum, .demo = 1};
    r.out = a->out ? a->out : "megatrain-demo";
    demo_data d;
    if (demo_data_make(&d, DEMO_LO, DEMO_HI, DEMO_HELDOUT, a->seed)) cli_die("out of memory");

    mt_model_config cfg;
    mt_model_config_init(&cfg);
    cfg.vocab_size = DEMO_V;
    cfg.hidden_size = (uint32_t)DEFAULT(a->hidden, 128);
    cfg.num_hidden_layers = (uint32_t)DEFAULT(a->layers, 3);
    cfg.num_attention_heads = (uint32_t)DEFAULT(a->heads, 4);
    cfg.num_key_value_heads = (uint32_t)DEFAULT(a->kv_heads, 4);
    cfg.intermediate_size = (uint32_t)DEFAULT(a->ffn, 384);
    cfg.max_position_embeddings = (uint32_t)r.S;
    cfg.precision = a->precision;
    cfg.seed = a->seed;
    mt_offload_policy pol = policy_of(a);
    guard_outputs(&r, &cfg, &pol);
    if (mt_model_create(&r.m, &cfg, &pol) != MT_OK) cli_die("%s", mt_last_errmsg());
    /* lr 3e-3 on both backends: 1e-2 learned faster when it worked but was
     * fragile (one CPU run 95.8%, another 3.8%; the GPU's bf16 run 44%).
     * 2000 steps reach 97.8-100% held out on the CPU in 1:40 on two cores,
     * 3000 reach 99.8% on a GPU in six seconds. See docs/benchmarks.md. */
    const int gpu = mt_model_backend(r.m) == MT_BACKEND_CUDA;
    r.steps = DEFAULT(a->steps, gpu ? 3000 : 2000);
    const mt_optim_config o = optim_of(a, r.steps, 3e-3, 30);
    r.identity = identity_of(a, &cfg, &o, r.steps, r.M, r.B, r.S);

    printf("megatrain demo: learning two-digit addition (%d..%d + %d..%d)\n", DEMO_LO, DEMO_HI, DEMO_LO, DEMO_HI);
    printf("  %d training problems, %d held out and never trained on\n", d.n_train, d.n_heldout);
    printf("  model: %u layers, hidden %u, %u heads, %.2f M parameters, %s, %s backend\n", cfg.num_hidden_layers,
           cfg.hidden_size, cfg.num_attention_heads, mt_model_num_params(r.m) / 1e6, cli_precision_name(a->precision),
           gpu ? "CUDA" : "CPU");
    printf("  %d steps of %d x %d x %d tokens\n\n", r.steps, r.M, r.B, r.S);
    fflush(stdout);

    r.src = (batch_source){.demo = &d, .position = a->seed * 0x2545f4914f6cdd1dull + 1};
    const double t0 = cli_now();
    /* the accuracy before: of the model as created, or as resumed */
    int n_before = 0, right_before = 0, resumed = r.ck.resume_step >= 0;
    run_hold_off_signals(1);
    if (!resumed) right_before = demo_accuracy(r.m, d.heldout, d.n_heldout, &n_before);
    run_hold_off_signals(0);
    int rc = train_model(&r, &o);
    if (rc == 0) {
        int n_after = 0, right = demo_accuracy(r.m, d.heldout, d.n_heldout, &n_after);
        char e[32];
        cli_fmt_duration(e, sizeof e, cli_now() - t0);
        printf("\nheld-out exact match: %.1f%% (%d of %d problems never seen in training", 100.0 * right / (n_after ? n_after : 1),
               right, n_after);
        if (!resumed) printf("; %.1f%% before training", 100.0 * right_before / (n_before ? n_before : 1));
        printf(")\ntrained in %s\n", e);
        for (int i = 0; i < 3 && i < d.n_heldout; i++) {
            char prompt[32], ans[16];
            snprintf(prompt, sizeof prompt, "%d+%d=", d.heldout[i].a, d.heldout[i].b);
            if (demo_answer(r.m, prompt, ans, sizeof ans) == 0) printf("  %s%s\n", prompt, ans);
        }
        printf("try: megatrain sample --model %s \"57+68=\"\n", r.out);
    }
    mt_model_destroy(r.m);
    demo_data_free(&d);
    return rc;
}

/* Training from a token file: a new model (--config, --vocab, the shape
 * options) or a model folder. */
static int train_data(train_args *a)
{
    run r = {.a = a, .S = DEFAULT(a->seq_len, 1024), .B = DEFAULT(a->micro_batch, 4), .M = a->grad_accum};
    r.steps = DEFAULT(a->steps, 1000);
    r.out = a->out ? a->out : "megatrain-out";
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    if (a->model_dir) cli_config_load(&cfg, a->model_dir);
    else if (a->config) cli_config_load(&cfg, a->config);
    /* the vocabulary of a new model: --vocab, else the tokenizer's, else
     * --config's, else the default (docs/fine-tuning.md) */
    if (a->vocab > 0 && !a->model_dir) cfg.vocab_size = (uint32_t)a->vocab;
    if (a->tokenizer) {
        mt_tokenizer *t;
        if (mt_tokenizer_load(&t, a->tokenizer) != MT_OK) cli_die("%s", mt_last_errmsg());
        const uint32_t ids = mt_tokenizer_vocab_size(t);
        mt_tokenizer_free(t);
        if (a->vocab > 0 && (uint32_t)a->vocab < ids)
            cli_die("train: --vocab %d is smaller than the tokenizer's %u ids (%s): the model could not take them",
                    a->vocab, ids, a->tokenizer);
        if (a->vocab < 0) {
            if (a->config && cfg.vocab_size != ids)
                printf("the vocabulary is the tokenizer's %u ids, not the %u of --config %s (give --vocab %u to keep "
                       "that)\n", ids, cfg.vocab_size, a->config, cfg.vocab_size);
            cfg.vocab_size = ids;
        }
    }
    if (!a->model_dir) {
        if (a->hidden > 0) cfg.hidden_size = (uint32_t)a->hidden;
        if (a->layers > 0) cfg.num_hidden_layers = (uint32_t)a->layers;
        if (a->heads > 0) cfg.num_attention_heads = cfg.num_key_value_heads = (uint32_t)a->heads;
        if (a->kv_heads > 0) cfg.num_key_value_heads = (uint32_t)a->kv_heads;
        if (a->ffn > 0) cfg.intermediate_size = (uint32_t)a->ffn;
        if (a->hidden > 0 || a->heads > 0) cfg.head_dim = 0; /* derived from the new shape */
    }
    cfg.precision = a->precision;
    cfg.seed = a->seed;
    if (cfg.max_position_embeddings < (uint32_t)r.S) cfg.max_position_embeddings = (uint32_t)r.S;
    mt_dataset_options dopt;
    mt_dataset_options_init(&dopt);
    dopt.format = a->format;
    dopt.vocab_size = cfg.vocab_size;
    dopt.seq_len = (uint32_t)r.S;
    dopt.seed = a->seed;
    if (mt_dataset_open(&r.src.ds, a->data, &dopt) != MT_OK) cli_die("%s", mt_last_errmsg());
    mt_offload_policy pol = policy_of(a);
    guard_outputs(&r, &cfg, &pol);
    const mt_optim_config o = optim_of(a, r.steps, 3e-4, r.steps / 20);
    r.identity = identity_of(a, &cfg, &o, r.steps, r.M, r.B, r.S);
    if (mt_model_create(&r.m, &cfg, &pol) != MT_OK) cli_die("%s", mt_last_errmsg());
    if (a->model_dir && mt_model_load(r.m, a->model_dir) != MT_OK) cli_die("%s", mt_model_errmsg(r.m));
    char params[32];
    cli_fmt_params(params, sizeof params, mt_model_num_params(r.m));
    printf("training %s parameters on %s: %llu tokens, %llu training and %llu held-out windows of %d\n", params, a->data, (unsigned long long)mt_dataset_num_tokens(r.src.ds),
           (unsigned long long)mt_dataset_num_windows(r.src.ds, MT_SPLIT_TRAIN),
           (unsigned long long)mt_dataset_num_windows(r.src.ds, MT_SPLIT_HELDOUT), r.S);
    if (mt_dataset_num_documents(r.src.ds)) {
        /* one document to a window, padded, until attention keeps packed documents apart */
        const uint64_t w = mt_dataset_num_windows(r.src.ds, MT_SPLIT_TRAIN), pad = mt_dataset_padding(r.src.ds, MT_SPLIT_TRAIN);
        printf("  %llu documents, one to a window: %.1f%% of the training positions are padding\n",
               (unsigned long long)mt_dataset_num_documents(r.src.ds), w ? 100.0 * (double)pad / ((double)w * r.S) : 0.0);
    }
    int rc = train_model(&r, &o);
    mt_model_destroy(r.m);
    mt_dataset_close(r.src.ds);
    return rc;
}

int cmd_train(int argc, char **argv)
{
    train_args a;
    parse_train(argc, argv, &a);
    run_signals_install();
    return a.data ? train_data(&a) : train_demo(&a);
}
