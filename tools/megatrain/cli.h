/* The megatrain command-line program: shared helpers. It uses only the
 * public API of libmegatrain. */
#ifndef MEGATRAIN_CLI_H
#define MEGATRAIN_CLI_H

#include <megatrain.h>
#include <stdint.h>
#include <stdio.h>

/* Subcommands: return the process exit status. */
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_sft_data(int argc, char **argv);
int cmd_info(int argc, char **argv);

/* Exit statuses besides 0 and 1: a usage error; a run stopped by SIGINT or
 * SIGTERM after saving its checkpoint exits 128 + the signal, as a shell
 * reports a process the signal ended. */
#define CLI_EXIT_USAGE 2

/* A Hugging Face config.json into *cfg: path is the file itself (any name)
 * or the folder holding it. Exits with the library's message on failure. */
void cli_config_load(mt_model_config *cfg, const char *path);
/* "u16", "u32", "llmc" or "auto" as an mt_token_format; exits on others. */
uint32_t cli_token_format(const char *s);
/* "bf16", "fp32" or "lean" as an mt_precision; exits on others. */
uint32_t cli_precision(const char *s);
const char *cli_precision_name(uint32_t precision);

/* Option parsing: "--name value" or "--name=value". Returns 1 and sets *val
 * when argv[*i] is the option (advancing *i past its value), 0 otherwise;
 * exits the program with a message when the value is missing. */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
int cli_flag(char **argv, int i, const char *name);
long long cli_int(const char *name, const char *s, long long lo, long long hi);
double cli_float(const char *name, const char *s, double lo, double hi);
/* A list of CUDA device indices, "0,1,2,3", into out[0..max); returns how
 * many. Exits with a message on anything else (empty entries, negatives,
 * one listed twice). */
int cli_devices(const char *name, const char *s, int32_t *out, int max);
void cli_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* "families: Llama, Qwen2, ..." from the library, for help texts. */
void cli_print_families(FILE *out);
double cli_now(void);
void cli_fmt_duration(char *buf, size_t n, double seconds);
/* The library's log lines, on stderr, prefixed. */
void cli_log(mt_log_level level, const char *text, void *user);

/* The path the program was run by (main's argv[0]), for the commands it prints. */
extern const char *cli_program;
/* A parameter count for messages: "4.19 M", "53.2 K", "8.03 B". */
void cli_fmt_params(char *buf, size_t n, uint64_t count);

/* ---- what a command reads and writes (guard.c) ---------------------------- */

/* The files a command reads, by device and inode: an output that is one of
 * them (a link to it, a second name of it included) is refused before any
 * work, since writing it would destroy the input. */
typedef struct cli_input {
    uint64_t dev, ino;
    int dir;
    char path[4200];
    char what[32]; /* the option that named it: "--data" */
} cli_input;
typedef struct cli_inputs {
    cli_input *v;
    int n, cap;
} cli_inputs;
/* path (when it exists) and, for a folder, the regular files in it. */
void cli_input_add(cli_inputs *in, const char *what, const char *path);
void cli_inputs_free(cli_inputs *in);
/* Exits with a message when path (an output: what names its option) is an input. */
void cli_output_check(const cli_inputs *in, const char *what, const char *path);
/* The same for a folder the command writes, and the files names[] (NULL-ended) in it. */
void cli_output_dir_check(const cli_inputs *in, const char *what, const char *dir, const char *const *names);
/* Standard output or error redirected into an input file: refused. */
void cli_std_check(const cli_inputs *in);
/* mkdir -p, or exit naming what stands in the way; the folders it made are
 * removed at exit while they are still empty. */
void cli_make_dir(const char *what, const char *dir);
/* Creates and removes a file in dir, or exits: the folder can be written. */
void cli_probe_dir(const char *what, const char *dir);
/* A file the command will write: one that exists can be opened for
 * writing (nothing is changed), else its folder exists and can be written;
 * or exits. */
void cli_probe_file(const char *what, const char *path);
/* The bytes free to this user on dir's file system, and the file system's id; -1 when unknown. */
int cli_free_bytes(const char *dir, uint64_t *free_bytes, uint64_t *fs);

/* An advisory lock: lock_path locked with flock(2) and holding this
 * process's id, as the library's checkpoint lock (DIR/.megatrain.lock,
 * mt_checkpoint_save). cli_lock_take exits naming the holder when another
 * process has it; a lock file whose holder died holds no flock and is taken
 * over (said on stdout). Released, and its file removed, by
 * cli_lock_release or at exit. */
typedef struct cli_lock {
    int fd, held;
    char path[4300];
} cli_lock;
#define CLI_LOCK_NAME ".megatrain.lock"
void cli_lock_take(cli_lock *l, const char *what, const char *target, const char *lock_path);
void cli_lock_release(cli_lock *l);

/* ---- the built-in arithmetic demo (demo.c) ------------------------------ */

/* The demo's problems: two-digit operands, so the model must learn carries.
 * A saved demo model is marked by DEMO_MARKER in its folder. */
#define DEMO_LO 10
#define DEMO_HI 99
#define DEMO_HELDOUT 500
#define DEMO_MARKER "megatrain-demo.txt"

/* Character vocabulary of the demo: digits, '+', '=', newline. */
#define DEMO_VOCAB "0123456789+=\n"
#define DEMO_V 13
int demo_tok(char c);       /* -1 if not in the vocabulary */
char demo_chr(int id);

typedef struct demo_problem { int a, b; } demo_problem;

typedef struct demo_data {
    demo_problem *train, *heldout;
    int n_train, n_heldout;
} demo_data;

/* All problems a + b with both operands in [lo, hi], shuffled by seed; the
 * first n_heldout are held out and never trained on. */
int demo_data_make(demo_data *d, int lo, int hi, int n_heldout, uint64_t seed);
void demo_data_free(demo_data *d);
/* Packs problems drawn from the training set (from rng state *rng) into
 * n_seq sequences of seq_len tokens: "a+b=c\n..." with targets only on the
 * answer and its newline; the tail after the last whole problem is padding
 * with ignored targets. */
void demo_fill_batch(const demo_data *d, uint64_t *rng, int n_seq, int seq_len, int32_t *tokens, int32_t *targets);
/* The same from any set of problems (the held-out ones, for a held-out loss). */
void demo_fill_from(const demo_problem *set, int n_set, uint64_t *rng, int n_seq, int seq_len, int32_t *tokens,
                    int32_t *targets);
/* Greedy answers to problems[0..n): fills correct and returns the count right. */
int demo_accuracy(mt_model *m, const demo_problem *p, int n, int *n_done);
/* Answers one prompt "a+b=" greedily into out (digits, NUL-terminated). */
int demo_answer(mt_model *m, const char *prompt, char *out, size_t out_len);

#endif
