/* megatrain: train, evaluate and sample decoder-only language models (the
 * library's families: mt_family_get) with the model state in host memory. */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: megatrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  prepare  tokenize text, chat and instruction data (JSONL) into a token file with a loss mask\n"
    "  train    train a model (with no options: the built-in arithmetic demo)\n"
    "  eval     loss on a token file, or the demo's held-out accuracy\n"
    "  sample   complete a prompt with a trained model\n"
    "  plan     the memory a model would need, per tier\n"
    "  plot     draw the loss curves of training logs (train --log-file) as an SVG\n"
    "  sft-data write the fine-tuning demo's conversations and tokenizer (tools/sft-demo.sh)\n"
    "  info     library version, backend, machine\n"
    "\n"
    "`megatrain <command> --help` describes each one.\n";

void cli_print_families(FILE *out)
{
    fputs("\nfamilies:", out);
    for (uint32_t i = 0; i < mt_family_count(); i++) {
        mt_family_info f;
        mt_family_info_init(&f);
        if (mt_family_get(&f, i) != MT_OK) cli_die("%s", mt_last_errmsg());
        fprintf(out, "%s %s", i ? "," : "", f.display_name);
    }
    fputs(" (megatrain plan --families)\n", out);
}

void cli_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("megatrain: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

const char *cli_program = "megatrain";

void cli_fmt_params(char *buf, size_t n, uint64_t count)
{
    const double c = (double)count;
    if (c >= 1e9) snprintf(buf, n, "%.2f B", c / 1e9);
    else if (c >= 1e6) snprintf(buf, n, "%.*f M", c >= 1e8 ? 0 : c >= 1e7 ? 1 : 2, c / 1e6);
    else if (c >= 1e3) snprintf(buf, n, "%.1f K", c / 1e3);
    else snprintf(buf, n, "%llu", (unsigned long long)count);
}

int cli_flag(char **argv, int i, const char *name) { return strcmp(argv[i], name) == 0; }

int cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return 0;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0') return 0;
    if (*i + 1 >= argc) cli_die("%s needs a value", name);
    *val = argv[++*i];
    return 1;
}

long long cli_int(const char *name, const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) cli_die("%s: '%s' is not an integer", name, s);
    if (v < lo || v > hi) cli_die("%s: %lld is outside [%lld, %lld]", name, v, lo, hi);
    return v;
}

int cli_devices(const char *name, const char *s, int32_t *out, int max)
{
    int n = 0;
    for (const char *p = s;; p++) {
        char *end;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > 1023 || (*end && *end != ','))
            cli_die("%s: '%s' is not a list of device indices such as 0,1,2,3", name, s);
        if (n == max) cli_die("%s: more than %d devices", name, max);
        for (int k = 0; k < n; k++)
            if (out[k] == (int32_t)v) cli_die("%s: device %ld is listed twice", name, v);
        out[n++] = (int32_t)v;
        if (!*end) return n;
        p = end;
    }
}

double cli_float(const char *name, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) cli_die("%s: '%s' is not a number", name, s);
    if (!(v >= lo && v <= hi)) cli_die("%s: %g is outside [%g, %g]", name, v, lo, hi);
    return v;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_fmt_duration(char *buf, size_t n, double s)
{
    if (s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%02ld:%02ld", t / 60, t % 60);
}

void cli_config_load(mt_model_config *cfg, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) cli_die("%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        if (mt_config_load(cfg, path) != MT_OK) cli_die("%s", mt_last_errmsg());
        return;
    }
    /* a file of any name: the library reads DIR/config.json, so give it one */
    const char *tmp = getenv("TMPDIR");
    char tdir[4200], real[PATH_MAX], link_path[4300];
    snprintf(tdir, sizeof tdir, "%s/megatrain-config-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!realpath(path, real) || !mkdtemp(tdir)) cli_die("%s: %s", path, strerror(errno));
    snprintf(link_path, sizeof link_path, "%s/config.json", tdir);
    if (symlink(real, link_path) != 0) {
        int e = errno;
        rmdir(tdir);
        cli_die("%s: %s", path, strerror(e));
    }
    const mt_status st = mt_config_load(cfg, tdir);
    unlink(link_path);
    rmdir(tdir);
    if (st == MT_OK) return;
    /* the message names the file the user gave, not the stand-in */
    const char *msg = mt_last_errmsg(), *at = strstr(msg, link_path);
    if (!at) at = strstr(msg, tdir);
    if (!at) cli_die("%s", msg);
    const size_t skip = strncmp(at, link_path, strlen(link_path)) ? strlen(tdir) : strlen(link_path);
    cli_die("%.*s%s%s", (int)(at - msg), msg, path, at + skip);
}

uint32_t cli_precision(const char *s)
{
    if (!strcmp(s, "bf16")) return MT_PRECISION_BF16;
    if (!strcmp(s, "fp32")) return MT_PRECISION_FP32;
    if (!strcmp(s, "lean")) return MT_PRECISION_LEAN;
    cli_die("--precision takes bf16, fp32 or lean, not '%s'", s);
}

const char *cli_precision_name(uint32_t precision)
{
    return precision == MT_PRECISION_FP32 ? "fp32" : precision == MT_PRECISION_LEAN ? "lean" : "bf16";
}

uint32_t cli_token_format(const char *s)
{
    static const struct { const char *name; uint32_t format; } f[] = {
        {"auto", MT_TOKENS_AUTO}, {"u16", MT_TOKENS_U16}, {"u32", MT_TOKENS_U32}, {"llmc", MT_TOKENS_LLMC}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!strcmp(s, f[i].name)) return f[i].format;
    cli_die("--format %s: the token formats are auto, u16, u32 and llmc", s);
}

void cli_log(mt_log_level level, const char *text, void *user)
{
    (void)user;
    static const char *names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "megatrain: %s: %s\n", level <= MT_LOG_ERROR ? names[level] : "log", text);
}

int cmd_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (cli_flag(argv, i, "--help")) {
            puts("usage: megatrain info\n\nPrints the library version, the backend a model would use here, and the\n"
                 "machine's memory as the library sees it.");
            return 0;
        }
        cli_die("info: unknown option '%s'", argv[i]);
    }
    printf("libmegatrain %s (header %d.%d.%d)\n", mt_version_string(), MT_VERSION_MAJOR, MT_VERSION_MINOR,
           MT_VERSION_PATCH);
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    mt_plan(&plan, &cfg, NULL, NULL);
    printf("backend:          %s\n", plan.backend == MT_BACKEND_CUDA ? "CUDA" : "CPU");
    printf("host memory:      %.1f GiB available\n", (double)plan.host_budget_bytes / (1u << 30));
    if (plan.backend == MT_BACKEND_CUDA)
        printf("GPU memory:       %.1f GiB free\n", (double)plan.gpu_budget_bytes / (1u << 30));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 0 && argv[0] && *argv[0]) cli_program = argv[0];
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        cli_print_families(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("megatrain %s\n", mt_version_string());
        return 0;
    }
    static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
        {"prepare", cmd_prepare}, {"train", cmd_train}, {"eval", cmd_eval}, {"sample", cmd_sample}, {"plan", cmd_plan}, {"plot", cmd_plot},
        {"sft-data", cmd_sft_data}, {"info", cmd_info},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "megatrain: unknown command '%s'\n\n%s", argv[1], usage);
    return 2;
}
