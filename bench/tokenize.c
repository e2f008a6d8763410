/* Tokenizer encoding speed on one core: MB/s and tokens/s of English text.
 *
 *   build/bench/tokenize [--text FILE] [--mb N] [--repeat K] TOKENIZER.json...
 *
 * The text is FILE (default /usr/share/common-licenses/GPL-3, which Debian
 * systems carry; a few built-in paragraphs otherwise), repeated to N MB
 * (default 8). Two ways of calling, each on a freshly loaded tokenizer and
 * timed K times (default 3):
 *   whole: one mt_tokenizer_encode call on all of it;
 *   lines: one call per line (texts of a few dozen bytes: the per-call
 *          cost at its worst).
 * "first" is the first run, with the tokenizer's cache of words empty;
 * "best" the fastest, with the cache as the earlier runs left it. Also the
 * time mt_tokenizer_load takes. */
#define _POSIX_C_SOURCE 200809L
#include <megatrain.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char FALLBACK[] =
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.\n"
    "Tokenizers split text into pieces, and language models read those pieces one after another.\n"
    "When in the course of human events it becomes necessary for one people to dissolve the bands\n"
    "which have connected them with another, a decent respect to the opinions of mankind requires it.\n"
    "We'll see what they've done; I'd say it's fine, but you're the judge of that, aren't you?\n";

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *p = malloc(cap);
    while (p && (r = fread(p + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *q = realloc(p, cap *= 2);
            if (!q) free(p);
            p = q;
        }
    }
    fclose(f);
    *len = n;
    return p;
}

/* Encodes text [0, n) in one call (lines: one call per line); the number of ids. */
static size_t encode(const mt_tokenizer *t, const char *text, size_t n, int lines, int32_t *ids, size_t cap)
{
    size_t total = 0, got = 0;
    if (!lines) {
        if (mt_tokenizer_encode(t, text, n, 0, ids, cap, &got) != MT_OK) {
            fprintf(stderr, "tokenize: %s\n", mt_last_errmsg());
            exit(1);
        }
        return got;
    }
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(text + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - text) + 1 : n;
        if (mt_tokenizer_encode(t, text + i, end - i, 0, ids, cap, &got) != MT_OK) {
            fprintf(stderr, "tokenize: %s\n", mt_last_errmsg());
            exit(1);
        }
        total += got;
        i = end;
    }
    return total;
}

int main(int argc, char **argv)
{
    const char *text_path = "/usr/share/common-licenses/GPL-3";
    int explicit_text = 0, repeat = 3;
    double mb = 8;
    int first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (!strcmp(argv[first], "--text") && first + 1 < argc) text_path = argv[++first], explicit_text = 1;
        else if (!strcmp(argv[first], "--mb") && first + 1 < argc) mb = atof(argv[++first]);
        else if (!strcmp(argv[first], "--repeat") && first + 1 < argc) repeat = atoi(argv[++first]);
        else break;
    }
    if (first >= argc || mb <= 0 || repeat < 1) {
        fprintf(stderr, "usage: tokenize [--text FILE] [--mb N] [--repeat K] TOKENIZER.json...\n");
        return 2;
    }
    size_t base_n = 0;
    char *base = read_all(text_path, &base_n);
    if (!base || !base_n) {
        if (explicit_text) {
            fprintf(stderr, "tokenize: cannot read %s\n", text_path);
            return 1;
        }
        free(base);
        text_path = "built-in paragraphs";
        base_n = strlen(FALLBACK);
        base = malloc(base_n);
        memcpy(base, FALLBACK, base_n);
    }
    const size_t n = (size_t)(mb * 1e6);
    char *text = malloc(n);
    for (size_t i = 0; i < n; i += base_n) memcpy(text + i, base, n - i < base_n ? n - i : base_n);
    /* the last copy may end inside a character: cut back to a whole line */
    size_t len = n;
    while (len > 0 && text[len - 1] != '\n') len--;
    free(base);
    printf("text: %s, repeated to %.1f MB; best of %d\n", text_path, (double)len / 1e6, repeat);

    size_t cap = len + 16; /* ids never outnumber bytes here; room for a template's tokens */
    int32_t *ids = malloc(cap * sizeof *ids);
    for (int a = first; a < argc; a++) {
        for (int lines = 0; lines < 2; lines++) {
            mt_tokenizer *t = NULL;
            double t0 = now();
            if (mt_tokenizer_load(&t, argv[a]) != MT_OK) {
                fprintf(stderr, "tokenize: %s\n", mt_last_errmsg());
                return 1;
            }
            double load = now() - t0;
            if (!lines) printf("%s (%u ids), loaded in %.2f s\n", argv[a], mt_tokenizer_vocab_size(t), load);
            double best = 1e30, first_dt = 0;
            size_t count = 0;
            for (int r = 0; r < repeat; r++) {
                t0 = now();
                count = encode(t, text, len, lines, ids, cap);
                double dt = now() - t0;
                if (!r) first_dt = dt;
                if (dt < best) best = dt;
            }
            printf("  %-5s first %6.2f MB/s, best %6.2f MB/s %9.0f tokens/s  (%zu tokens, %.2f bytes/token)\n",
                   lines ? "lines" : "whole", (double)len / 1e6 / first_dt, (double)len / 1e6 / best,
                   (double)count / best, count, (double)len / (double)count);
            mt_tokenizer_free(t);
        }
    }
    free(ids);
    free(text);
    return 0;
}
