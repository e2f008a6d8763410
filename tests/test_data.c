/* Token data: every file format round-trips, windows and the split, the
 * per-epoch shuffle is a seeded permutation, bad files and bad options are
 * refused with messages that name the file and the problem.
 *
 * Every test writes its files into a fresh directory under /tmp and the
 * suite's .fini removes it, whether the test passed or not. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "megatrain.h"

/* ---- a temporary directory per test ---------------------------------------- */

static char tmp_dir[64];

static void make_tmp_dir(void)
{
    strcpy(tmp_dir, "/tmp/mt_data_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp failed");
}

static void remove_tmp_dir(void)
{
    if (!tmp_dir[0]) return;
    DIR *d = opendir(tmp_dir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
            if (rmdir(p) != 0) unlink(p);
        }
        closedir(d);
    }
    rmdir(tmp_dir);
    tmp_dir[0] = '\0';
}

TestSuite(data, .init = make_tmp_dir, .fini = remove_tmp_dir);

/* ---- writing token files ----------------------------------------------------- */

#define LLMC_MAGIC 20240520

/* The path of `name` in the test directory, in a caller's buffer of 256 bytes. */
static const char *tmp_path(char *buf, const char *name)
{
    snprintf(buf, 256, "%s/%s", tmp_dir, name);
    return buf;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    if (len) cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static void put_le16(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Raw little-endian tokens of `bytes` (2 or 4) each, after `header` bytes of
 * header (llm.c: magic, version, count; 0: none). */
static void write_tokens(const char *path, const uint32_t *tok, size_t n, int bytes, int llmc_version,
                         uint32_t llmc_magic, uint32_t llmc_count)
{
    size_t header = llmc_version ? 1024 : 0;
    size_t len = header + n * (size_t)bytes;
    unsigned char *buf = calloc(len ? len : 1, 1);
    cr_assert_not_null(buf);
    if (llmc_version) {
        put_le32(buf, llmc_magic);
        put_le32(buf + 4, (uint32_t)llmc_version);
        put_le32(buf + 8, llmc_count);
    }
    for (size_t i = 0; i < n; i++) {
        if (bytes == 2)
            put_le16(buf + header + 2 * i, tok[i]);
        else
            put_le32(buf + header + 4 * i, tok[i]);
    }
    write_bytes(path, buf, len);
    free(buf);
}

static void write_u16(const char *path, const uint32_t *tok, size_t n) { write_tokens(path, tok, n, 2, 0, 0, 0); }
static void write_u32(const char *path, const uint32_t *tok, size_t n) { write_tokens(path, tok, n, 4, 0, 0, 0); }
static void write_llmc(const char *path, int version, const uint32_t *tok, size_t n)
{
    write_tokens(path, tok, n, version == 1 ? 2 : 4, version, LLMC_MAGIC, (uint32_t)n);
}

/* Distinct token values: 16-bit ones, and 32-bit ones above 65535. */
static uint32_t value16(size_t i) { return (uint32_t)((i * 40503u + 17u) % 65521u); } /* i < 65521 */
static uint32_t value32(size_t i) { return (uint32_t)(0x10000u + i * 977u); }

static uint32_t *make_tokens(size_t n, uint32_t (*value)(size_t))
{
    uint32_t *t = malloc(n * sizeof *t);
    cr_assert_not_null(t);
    for (size_t i = 0; i < n; i++) t[i] = value(i);
    return t;
}

static mt_dataset_options options(uint32_t format, uint32_t seq_len, float heldout)
{
    mt_dataset_options o;
    mt_dataset_options_init(&o);
    o.format = format;
    o.seq_len = seq_len;
    o.heldout_fraction = heldout;
    return o;
}

static mt_dataset *open_ok(const char *path, const mt_dataset_options *o)
{
    mt_dataset *ds = NULL;
    mt_status st = mt_dataset_open(&ds, path, o);
    cr_assert_eq(st, MT_OK, "opening %s: %s (%s)", path, mt_status_str(st), mt_last_errmsg());
    cr_assert_not_null(ds);
    cr_assert_str_eq(mt_last_errmsg(), "");
    return ds;
}

/* The window whose first token is tokens[0] (values are distinct), checked
 * token by token against the file's contents; -1 when none matches. */
static int64_t window_of(const uint32_t *tok, uint64_t n_windows, uint32_t L, const int32_t *tokens,
                         const int32_t *targets)
{
    for (uint64_t w = 0; w < n_windows; w++) {
        if ((int32_t)tok[w * L] != tokens[0]) continue;
        for (uint32_t j = 0; j < L; j++) {
            cr_assert_eq(tokens[j], (int32_t)tok[w * L + j], "window %llu token %u", (unsigned long long)w, j);
            cr_assert_eq(targets[j], (int32_t)tok[w * L + j + 1], "window %llu target %u", (unsigned long long)w, j);
        }
        return (int64_t)w;
    }
    return -1;
}

/* Reads one epoch of each split and checks every sequence against tok. */
static void check_contents(const mt_dataset *ds, const uint32_t *tok, size_t n, uint32_t L)
{
    const uint64_t n_windows = (n - 1) / L;
    const uint64_t n_train = mt_dataset_num_windows(ds, MT_SPLIT_TRAIN);
    const uint64_t n_held = mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT);
    cr_assert_eq(mt_dataset_num_tokens(ds), n);
    cr_assert_eq(n_train + n_held, n_windows);
    int32_t *tokens = malloc(n_windows * L * sizeof *tokens), *targets = malloc(n_windows * L * sizeof *targets);
    cr_assert(tokens && targets);
    char *seen = calloc(n_windows, 1);

    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, 0, (uint32_t)n_train, tokens, targets), MT_OK, "%s",
                 mt_last_errmsg());
    for (uint64_t i = 0; i < n_train; i++) {
        int64_t w = window_of(tok, n_windows, L, tokens + i * L, targets + i * L);
        cr_assert(w >= 0 && (uint64_t)w < n_train, "train sequence %llu is window %lld", (unsigned long long)i,
                  (long long)w);
        cr_assert_eq(seen[w], 0, "window %lld read twice in one epoch", (long long)w);
        seen[w] = 1;
    }
    if (n_held) {
        cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_HELDOUT, 0, (uint32_t)n_held, tokens, targets), MT_OK);
        for (uint64_t i = 0; i < n_held; i++)
            cr_assert_eq(window_of(tok, n_windows, L, tokens + i * L, targets + i * L), (int64_t)(n_train + i),
                         "held-out windows come in file order");
    }
    free(seen);
    free(tokens);
    free(targets);
}

/* ---- formats round-trip -------------------------------------------------------- */

Test(data, options_defaults)
{
    mt_dataset_options o;
    memset(&o, 0xAB, sizeof o);
    mt_dataset_options_init(&o);
    cr_assert_eq(o.struct_size, sizeof o);
    cr_assert_eq(o.format, MT_TOKENS_AUTO);
    cr_assert_eq(o.vocab_size, 0);
    cr_assert_eq(o.seq_len, 1024);
    cr_assert_float_eq(o.heldout_fraction, 0.01f, 1e-9);
    cr_assert_eq(o.reserved0, 0);
    cr_assert_eq(o.seed, 1);
    mt_dataset_options_init(NULL); /* a no-op */
}

Test(data, u16_round_trips_auto_and_forced)
{
    char p[256];
    const uint32_t L = 8;
    const size_t n = 1 + 10 * L + 3; /* 10 windows and a tail that no window covers */
    uint32_t *tok = make_tokens(n, value16);
    write_u16(tmp_path(p, "tokens.u16"), tok, n);
    const uint32_t formats[] = {MT_TOKENS_AUTO, MT_TOKENS_U16};
    for (int f = 0; f < 2; f++) {
        mt_dataset_options o = options(formats[f], L, 0.2f);
        o.vocab_size = 65521;
        mt_dataset *ds = open_ok(p, &o);
        cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), 8);
        cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 2);
        check_contents(ds, tok, n, L);
        mt_dataset_close(ds);
    }
    free(tok);
}

Test(data, u32_round_trips_forced)
{
    char p[256];
    const uint32_t L = 5;
    const size_t n = 1 + 12 * L;
    uint32_t *tok = make_tokens(n, value32);
    write_u32(tmp_path(p, "tokens.u32"), tok, n);
    mt_dataset_options o = options(MT_TOKENS_U32, L, 0.25f);
    o.vocab_size = value32(n); /* every token below it */
    mt_dataset *ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), 9);
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 3);
    check_contents(ds, tok, n, L);
    mt_dataset_close(ds);
    free(tok);
}

Test(data, llmc_v1_round_trips_auto_and_forced)
{
    char p[256];
    const uint32_t L = 16;
    const size_t n = 1 + 20 * L + 7;
    uint32_t *tok = make_tokens(n, value16);
    write_llmc(tmp_path(p, "tokens_v1.bin"), 1, tok, n);
    const uint32_t formats[] = {MT_TOKENS_AUTO, MT_TOKENS_LLMC};
    for (int f = 0; f < 2; f++) {
        mt_dataset_options o = options(formats[f], L, 0.1f);
        mt_dataset *ds = open_ok(p, &o);
        cr_assert_eq(mt_dataset_num_tokens(ds), n, "the header is not read as tokens");
        cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 2);
        check_contents(ds, tok, n, L);
        mt_dataset_close(ds);
    }
    free(tok);
}

Test(data, llmc_v2_round_trips_auto_and_forced)
{
    char p[256];
    const uint32_t L = 3;
    const size_t n = 1 + 40 * L + 2;
    uint32_t *tok = make_tokens(n, value32);
    write_llmc(tmp_path(p, "tokens_v2.bin"), 2, tok, n);
    const uint32_t formats[] = {MT_TOKENS_AUTO, MT_TOKENS_LLMC};
    for (int f = 0; f < 2; f++) {
        mt_dataset_options o = options(formats[f], L, 0.05f);
        o.vocab_size = 1u << 20;
        mt_dataset *ds = open_ok(p, &o);
        cr_assert_eq(mt_dataset_num_tokens(ds), n);
        cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 2);
        check_contents(ds, tok, n, L);
        mt_dataset_close(ds);
    }
    free(tok);
}

Test(data, auto_reads_a_small_file_that_starts_like_the_magic_as_u16)
{
    /* Under 1024 bytes there is no room for an llm.c header: raw uint16. */
    char p[256];
    const size_t n = 300;
    uint32_t *tok = make_tokens(n, value16);
    tok[0] = LLMC_MAGIC & 0xFFFF;
    tok[1] = LLMC_MAGIC >> 16;
    write_u16(tmp_path(p, "magic_like.u16"), tok, n);
    mt_dataset_options o = options(MT_TOKENS_AUTO, 10, 0.0f);
    mt_dataset *ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_num_tokens(ds), n);
    int32_t tokens[10], targets[10];
    /* window 0 is somewhere in the first epoch */
    int found = 0;
    for (uint64_t pos = 0; pos < mt_dataset_num_windows(ds, MT_SPLIT_TRAIN); pos++) {
        cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, pos, 1, tokens, targets), MT_OK);
        if (tokens[0] == (int32_t)tok[0]) {
            cr_assert_eq(tokens[1], (int32_t)tok[1]);
            cr_assert_eq(targets[0], (int32_t)tok[1]);
            found++;
        }
    }
    cr_assert_eq(found, 1);
    mt_dataset_close(ds);
    free(tok);
}

Test(data, vocab_boundary_is_accepted)
{
    char p[256];
    uint32_t tok[9] = {0, 1, 2, 3, 99, 5, 6, 7, 8};
    write_u16(tmp_path(p, "boundary.u16"), tok, 9);
    mt_dataset_options o = options(MT_TOKENS_U16, 4, 0.0f);
    o.vocab_size = 100; /* 99 is the largest id allowed */
    mt_dataset *ds = open_ok(p, &o);
    mt_dataset_close(ds);
}

/* ---- windows and the split ------------------------------------------------------ */

Test(data, num_tokens_and_windows)
{
    char p[256];
    const uint32_t L = 8;
    const size_t n = 1 + 10 * L + 3; /* (n - 1) / L = 10 windows */
    uint32_t *tok = make_tokens(n, value16);
    write_u16(tmp_path(p, "count.u16"), tok, n);
    const struct {
        float fraction;
        uint64_t held;
    } cases[] = {{0.0f, 0}, {0.01f, 1}, {0.04f, 1}, {0.1f, 1}, {0.15f, 2}, {0.25f, 3}, {0.3f, 3}, {0.5f, 5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mt_dataset_options o = options(MT_TOKENS_AUTO, L, cases[c].fraction);
        mt_dataset *ds = open_ok(p, &o);
        cr_assert_eq(mt_dataset_num_tokens(ds), n);
        cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), cases[c].held, "fraction %g: %llu held out",
                     (double)cases[c].fraction, (unsigned long long)mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT));
        cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), 10 - cases[c].held);
        cr_assert_eq(mt_dataset_num_windows(ds, (mt_split)7), 0);
        mt_dataset_close(ds);
    }
    cr_assert_eq(mt_dataset_num_tokens(NULL), 0);
    cr_assert_eq(mt_dataset_num_windows(NULL, MT_SPLIT_TRAIN), 0);
    mt_dataset_close(NULL); /* a no-op */

    /* exactly one window: seq_len + 1 tokens, nothing held out at a small fraction */
    mt_dataset_options o = options(MT_TOKENS_AUTO, L, 0.01f);
    write_u16(tmp_path(p, "one_window.u16"), tok, L + 1);
    mt_dataset *ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_num_tokens(ds), L + 1);
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), 1);
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 0);
    int32_t tokens[8], targets[8];
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, 12345, 1, tokens, targets), MT_OK);
    cr_assert_eq(window_of(tok, 1, L, tokens, targets), 0);
    mt_dataset_close(ds);

    /* two windows: any positive fraction holds out one */
    o.heldout_fraction = 0.001f;
    write_u16(tmp_path(p, "two_windows.u16"), tok, 2 * L + 1);
    ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), 1);
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 1);
    mt_dataset_close(ds);
    free(tok);
}

/* One epoch-long read of positions [first, first + n): the windows, in order. */
static void train_windows(const mt_dataset *ds, uint32_t L, uint64_t first, uint32_t n, uint64_t *windows)
{
    int32_t *tokens = malloc((size_t)n * L * sizeof *tokens), *targets = malloc((size_t)n * L * sizeof *targets);
    cr_assert(tokens && targets);
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, first, n, tokens, targets), MT_OK, "%s", mt_last_errmsg());
    for (uint32_t i = 0; i < n; i++) {
        /* the files below hold token i at position i */
        cr_assert_eq(tokens[(size_t)i * L] % (int32_t)L, 0);
        windows[i] = (uint64_t)tokens[(size_t)i * L] / L;
        for (uint32_t j = 0; j < L; j++) {
            cr_assert_eq(tokens[(size_t)i * L + j], (int32_t)(windows[i] * L + j));
            cr_assert_eq(targets[(size_t)i * L + j], (int32_t)(windows[i] * L + j + 1));
        }
    }
    free(tokens);
    free(targets);
}

static uint32_t identity(size_t i) { return (uint32_t)i; }

static void assert_permutation(const uint64_t *w, uint64_t n, const char *what)
{
    char *seen = calloc(n ? n : 1, 1);
    for (uint64_t i = 0; i < n; i++) {
        cr_assert_lt(w[i], n, "%s: window %llu is not a training window", what, (unsigned long long)w[i]);
        cr_assert_eq(seen[w[i]], 0, "%s: window %llu drawn twice", what, (unsigned long long)w[i]);
        seen[w[i]] = 1;
    }
    free(seen);
}

Test(data, train_order_is_a_seeded_permutation_per_epoch)
{
    char p[256];
    const uint32_t L = 4;
    const size_t n = 1 + 100 * L; /* 100 windows: 90 train, 10 held out */
    uint32_t *tok = make_tokens(n, identity);
    write_u16(tmp_path(p, "perm.u16"), tok, n);
    mt_dataset_options o = options(MT_TOKENS_U16, L, 0.1f);
    o.seed = 42;
    mt_dataset *ds = open_ok(p, &o);
    const uint64_t nt = mt_dataset_num_windows(ds, MT_SPLIT_TRAIN);
    cr_assert_eq(nt, 90);
    uint64_t e0[90], e1[90], again[180], piece[180];
    train_windows(ds, L, 0, 90, e0);
    train_windows(ds, L, 90, 90, e1);
    assert_permutation(e0, nt, "epoch 0");
    assert_permutation(e1, nt, "epoch 1");
    cr_assert(memcmp(e0, e1, sizeof e0) != 0, "epoch 1 repeats the order of epoch 0");
    int fixed = 0;
    for (int i = 0; i < 90; i++) fixed += e0[i] == (uint64_t)i;
    cr_assert_lt(fixed, 10, "epoch 0 is barely shuffled (%d fixed points)", fixed);

    /* one read across the epoch boundary, and reads in pieces, give the same */
    train_windows(ds, L, 0, 180, again);
    cr_assert(memcmp(again, e0, sizeof e0) == 0 && memcmp(again + 90, e1, sizeof e1) == 0);
    for (uint64_t pos = 0; pos < 180;) {
        uint32_t len = (uint32_t)(1 + pos % 7);
        if (pos + len > 180) len = (uint32_t)(180 - pos);
        train_windows(ds, L, pos, len, piece + pos);
        pos += len;
    }
    cr_assert(memcmp(piece, again, sizeof again) == 0, "the order depends on how reads are cut");

    /* the same seed in another handle: the same order; another seed: another */
    mt_dataset *same = open_ok(p, &o);
    train_windows(same, L, 0, 180, piece);
    cr_assert(memcmp(piece, again, sizeof again) == 0);
    mt_dataset_close(same);
    o.seed = 43;
    mt_dataset *other = open_ok(p, &o);
    train_windows(other, L, 0, 90, piece);
    assert_permutation(piece, nt, "seed 43");
    cr_assert(memcmp(piece, e0, sizeof e0) != 0, "seeds 42 and 43 give the same order");
    mt_dataset_close(other);

    /* held-out windows: the last 10, in file order, wrapping; never in train reads */
    int32_t tokens[4 * 25], targets[4 * 25];
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_HELDOUT, 3, 25, tokens, targets), MT_OK);
    for (int i = 0; i < 25; i++) {
        uint64_t w = (uint64_t)tokens[i * 4] / L;
        cr_assert_eq(w, 90 + (3 + i) % 10);
        cr_assert_eq(targets[i * 4 + 3], (int32_t)(w * L + 4));
    }
    for (int i = 0; i < 180; i++) cr_assert_lt(again[i], 90, "a held-out window in a train read");

    /* far epochs are permutations too */
    uint64_t far[90];
    train_windows(ds, L, UINT64_C(123456789) * 90, 90, far);
    assert_permutation(far, nt, "epoch 123456789");
    mt_dataset_close(ds);
    free(tok);
}

Test(data, permutation_for_many_sizes)
{
    /* seq_len 1: window w is tokens (w, w + 1), so the first token names it */
    const uint32_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 64, 100, 255, 256, 257, 1000, 1023, 1025};
    char p[256];
    uint32_t *tok = make_tokens(1026, identity);
    uint64_t *w = malloc(1025 * sizeof *w), *prev = malloc(1025 * sizeof *prev);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const uint32_t nw = sizes[s];
        char name[32];
        snprintf(name, sizeof name, "size%u.u16", nw);
        write_u16(tmp_path(p, name), tok, nw + 1);
        mt_dataset_options o = options(MT_TOKENS_U16, 1, 0.0f);
        mt_dataset *ds = open_ok(p, &o);
        cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), nw);
        int differ = 0;
        for (uint64_t e = 0; e < 8; e++) {
            train_windows(ds, 1, e * nw, nw, w);
            assert_permutation(w, nw, name);
            if (e && memcmp(w, prev, nw * sizeof *w)) differ = 1;
            memcpy(prev, w, nw * sizeof *w);
        }
        if (nw >= 2) cr_assert(differ, "%u windows: the order never changes over 8 epochs", nw);
        mt_dataset_close(ds);
    }
    free(w);
    free(prev);
    free(tok);
}

/* Several threads reading one dataset get what one thread gets. */
typedef struct reader_arg {
    const mt_dataset *ds;
    uint64_t first;
    int32_t tokens[64 * 4], targets[64 * 4];
    mt_status st;
} reader_arg;

static void *reader(void *p)
{
    reader_arg *a = p;
    a->st = MT_OK;
    for (int rep = 0; rep < 50 && a->st == MT_OK; rep++)
        a->st = mt_dataset_read(a->ds, MT_SPLIT_TRAIN, a->first, 64, a->tokens, a->targets);
    return NULL;
}

Test(data, concurrent_reads)
{
    char p[256];
    const size_t n = 1 + 500 * 4;
    uint32_t *tok = make_tokens(n, identity);
    write_u16(tmp_path(p, "threads.u16"), tok, n);
    mt_dataset_options o = options(MT_TOKENS_U16, 4, 0.0f);
    mt_dataset *ds = open_ok(p, &o);
    enum { T = 4 };
    static reader_arg args[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        args[t].ds = ds;
        args[t].first = (uint64_t)t * 300;
        cr_assert_eq(pthread_create(&th[t], NULL, reader, &args[t]), 0);
    }
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    int32_t tokens[64 * 4], targets[64 * 4];
    for (int t = 0; t < T; t++) {
        cr_assert_eq(args[t].st, MT_OK);
        cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, args[t].first, 64, tokens, targets), MT_OK);
        cr_assert(memcmp(tokens, args[t].tokens, sizeof tokens) == 0);
        cr_assert(memcmp(targets, args[t].targets, sizeof targets) == 0);
    }
    mt_dataset_close(ds);
    free(tok);
}

/* ---- refusals ---------------------------------------------------------------------- */

/* Opens path expecting `want`, a NULL handle and a message holding the path
 * (when given) and each of the NULL-terminated key phrases. */
static void expect_refusal(const char *path, const mt_dataset_options *o, mt_status want, ...)
{
    mt_dataset *ds = (mt_dataset *)0x1;
    mt_status st = mt_dataset_open(&ds, path, o);
    const char *msg = mt_last_errmsg();
    cr_assert_eq(st, want, "%s: got %s, expected %s (%s)", path ? path : "(null)", mt_status_str(st),
                 mt_status_str(want), msg);
    cr_assert_null(ds, "a failed open sets *out to NULL");
    if (path) cr_assert(strstr(msg, path), "the message does not name %s: %s", path, msg);
    va_list ap;
    va_start(ap, want);
    for (const char *key; (key = va_arg(ap, const char *));)
        cr_assert(strstr(msg, key), "the message lacks \"%s\": %s", key, msg);
    va_end(ap);
}

/* Bad options: MT_ERR_INVALID_ARGUMENT, a NULL handle, the field named. */
static void expect_option_refusal(const char *path, const mt_dataset_options *o, const char *key)
{
    mt_dataset *ds = (mt_dataset *)0x1;
    mt_status st = mt_dataset_open(&ds, path, o);
    cr_assert_eq(st, MT_ERR_INVALID_ARGUMENT, "%s expected for %s: got %s (%s)", mt_status_str(MT_ERR_INVALID_ARGUMENT),
                 key, mt_status_str(st), mt_last_errmsg());
    cr_assert_null(ds);
    cr_assert(strstr(mt_last_errmsg(), key), "the message lacks \"%s\": %s", key, mt_last_errmsg());
}

Test(data, refuses_a_missing_file)
{
    char p[256];
    mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
    expect_refusal(tmp_path(p, "no_such_file.bin"), &o, MT_ERR_IO, "cannot open", "No such file", NULL);
    expect_refusal(tmp_dir, &o, MT_ERR_IO, "not a regular file", NULL); /* a directory */
}

Test(data, refuses_an_empty_file)
{
    char p[256];
    write_bytes(tmp_path(p, "empty.u16"), "", 0);
    mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
    expect_refusal(p, &o, MT_ERR_FORMAT, "empty", NULL);
    o.format = MT_TOKENS_U32;
    expect_refusal(p, &o, MT_ERR_FORMAT, "empty", NULL);
}

Test(data, refuses_sizes_that_are_not_whole_tokens)
{
    char p[256];
    static unsigned char zeros[1002];
    write_bytes(tmp_path(p, "odd.u16"), zeros, 1001);
    mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
    expect_refusal(p, &o, MT_ERR_FORMAT, "is 1001 bytes, not a multiple of 2-byte tokens", NULL);
    o.format = MT_TOKENS_U16;
    expect_refusal(p, &o, MT_ERR_FORMAT, "is 1001 bytes, not a multiple of 2-byte tokens", NULL);
    write_bytes(tmp_path(p, "six.u32"), zeros, 1002);
    o.format = MT_TOKENS_U32;
    expect_refusal(p, &o, MT_ERR_FORMAT, "is 1002 bytes, not a multiple of 4-byte tokens", NULL);
}

Test(data, refuses_bad_llmc_headers)
{
    char p[256];
    uint32_t *tok = make_tokens(200, value16);
    mt_dataset_options o = options(MT_TOKENS_LLMC, 4, 0.0f);

    write_tokens(tmp_path(p, "magic.bin"), tok, 200, 2, 1, 12345, 200);
    expect_refusal(p, &o, MT_ERR_FORMAT, "magic", "12345", NULL);
    o.format = MT_TOKENS_AUTO; /* without the magic it is just uint16 data */
    mt_dataset *ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_num_tokens(ds), 512 + 200);
    mt_dataset_close(ds);

    write_bytes(tmp_path(p, "small.bin"), tok, 600);
    o.format = MT_TOKENS_LLMC;
    expect_refusal(p, &o, MT_ERR_FORMAT, "too small", "header", NULL);

    write_tokens(tmp_path(p, "version.bin"), tok, 200, 2, 3, LLMC_MAGIC, 200);
    o.format = MT_TOKENS_AUTO;
    expect_refusal(p, &o, MT_ERR_FORMAT, "version 3", NULL);
    o.format = MT_TOKENS_LLMC;
    expect_refusal(p, &o, MT_ERR_FORMAT, "version 3", NULL);

    write_tokens(tmp_path(p, "truncated.bin"), tok, 200, 2, 1, LLMC_MAGIC, 1000);
    o.format = MT_TOKENS_AUTO;
    expect_refusal(p, &o, MT_ERR_FORMAT, "truncated", "1000", NULL);
    write_tokens(tmp_path(p, "truncated_v2.bin"), tok, 200, 4, 2, LLMC_MAGIC, 201);
    expect_refusal(p, &o, MT_ERR_FORMAT, "truncated", "201", NULL);
    write_tokens(tmp_path(p, "long.bin"), tok, 200, 2, 1, LLMC_MAGIC, 150);
    expect_refusal(p, &o, MT_ERR_FORMAT, "longer than its header says", "150", NULL);

    write_tokens(tmp_path(p, "header_only.bin"), tok, 0, 2, 1, LLMC_MAGIC, 0);
    expect_refusal(p, &o, MT_ERR_FORMAT, "too short", NULL);
    free(tok);
}

Test(data, refuses_tokens_outside_the_vocabulary)
{
    char p[256];
    const size_t n = 200;
    uint32_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (uint32_t)(i % 1000);
    tok[77] = 1234;
    tok[150] = 5000; /* only the first is reported */
    mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
    o.vocab_size = 1000;

    write_u16(tmp_path(p, "vocab.u16"), tok, n);
    expect_refusal(p, &o, MT_ERR_FORMAT, "1234", "position 77", "vocab_size 1000", NULL);
    write_llmc(tmp_path(p, "vocab_v1.bin"), 1, tok, n);
    expect_refusal(p, &o, MT_ERR_FORMAT, "1234", "position 77", "vocab_size 1000", NULL);
    write_llmc(tmp_path(p, "vocab_v2.bin"), 2, tok, n);
    expect_refusal(p, &o, MT_ERR_FORMAT, "1234", "position 77", "vocab_size 1000", NULL);
    o.format = MT_TOKENS_U32;
    write_u32(tmp_path(p, "vocab.u32"), tok, n);
    expect_refusal(p, &o, MT_ERR_FORMAT, "1234", "position 77", "vocab_size 1000", NULL);

    /* a token in a later scan chunk */
    const size_t big = 200000;
    uint32_t *many = calloc(big, sizeof *many);
    many[150001] = 70000;
    write_u32(tmp_path(p, "late.u32"), many, big);
    o.vocab_size = 65536;
    expect_refusal(p, &o, MT_ERR_FORMAT, "70000", "position 150001", "vocab_size 65536", NULL);

    /* no vocabulary check, but ids must fit an int32 */
    o.vocab_size = 0;
    many[150001] = 0;
    many[199999] = 0x80000000u;
    write_u32(tmp_path(p, "int32.u32"), many, big);
    expect_refusal(p, &o, MT_ERR_FORMAT, "2147483648", "position 199999", "int32", NULL);
    many[199999] = 0x7FFFFFFFu;
    write_u32(tmp_path(p, "int32max.u32"), many, big);
    mt_dataset *ds = open_ok(p, &o);
    int32_t t[4], g[4];
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, 0, 1, t, g), MT_OK);
    mt_dataset_close(ds);
    free(many);
    free(tok);
}

Test(data, refuses_files_shorter_than_one_window)
{
    char p[256];
    uint32_t *tok = make_tokens(64, value16);
    mt_dataset_options o = options(MT_TOKENS_AUTO, 64, 0.0f);
    write_u16(tmp_path(p, "short.u16"), tok, 64); /* 64 tokens, a window needs 65 */
    expect_refusal(p, &o, MT_ERR_FORMAT, "too short", "64 tokens", "65", NULL);
    write_llmc(tmp_path(p, "short.bin"), 2, tok, 64);
    expect_refusal(p, &o, MT_ERR_FORMAT, "too short", NULL);

    /* one window and half of it held out: nothing left to train on */
    o.seq_len = 63;
    o.heldout_fraction = 0.5f;
    expect_refusal(p, &o, MT_ERR_FORMAT, "no training window", NULL);
    free(tok);
}

Test(data, refuses_bad_options)
{
    char p[256];
    uint32_t *tok = make_tokens(100, value16);
    write_u16(tmp_path(p, "opts.u16"), tok, 100);
    mt_dataset_options o;

    o = options(MT_TOKENS_AUTO, 0, 0.0f);
    expect_option_refusal(p, &o, "seq_len");
    const float bad_fractions[] = {-0.1f, 0.51f, 1.0f, NAN, INFINITY};
    for (int i = 0; i < 5; i++) {
        o = options(MT_TOKENS_AUTO, 4, bad_fractions[i]);
        expect_option_refusal(p, &o, "heldout_fraction");
    }
    o = options(MT_TOKENS_DOCS + 1, 4, 0.0f);
    expect_option_refusal(p, &o, "format 5");
    o = options(MT_TOKENS_AUTO, 4, 0.0f);
    o.reserved0 = 1;
    expect_option_refusal(p, &o, "reserved0");

    /* struct sizes: too small, larger with a zero tail, larger with a non-zero one */
    o = options(MT_TOKENS_AUTO, 4, 0.0f);
    o.struct_size = 8;
    mt_dataset *ds = NULL;
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_STRUCT_SIZE);
    cr_assert_null(ds);
    struct {
        mt_dataset_options o;
        uint64_t future;
    } big;
    memset(&big, 0, sizeof big);
    big.o = options(MT_TOKENS_AUTO, 4, 0.0f);
    big.o.struct_size = sizeof big;
    ds = open_ok(p, &big.o);
    mt_dataset_close(ds);
    big.future = 1;
    cr_assert_eq(mt_dataset_open(&ds, p, &big.o), MT_ERR_STRUCT_SIZE);
    cr_assert_null(ds);

    /* NULL arguments */
    o = options(MT_TOKENS_AUTO, 4, 0.0f);
    cr_assert_eq(mt_dataset_open(NULL, p, &o), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "out is NULL"));
    ds = (mt_dataset *)0x1;
    cr_assert_eq(mt_dataset_open(&ds, NULL, &o), MT_ERR_INVALID_ARGUMENT);
    cr_assert_null(ds);
    cr_assert(strstr(mt_last_errmsg(), "path is NULL"));
    ds = (mt_dataset *)0x1;
    cr_assert_eq(mt_dataset_open(&ds, p, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_null(ds);
    cr_assert(strstr(mt_last_errmsg(), "mt_dataset_options is NULL"));
    free(tok);
}

Test(data, read_refuses_bad_arguments)
{
    char p[256];
    uint32_t *tok = make_tokens(100, value16);
    write_u16(tmp_path(p, "read.u16"), tok, 100);
    mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
    mt_dataset *ds = open_ok(p, &o);
    int32_t t[8], g[8];
    cr_assert_eq(mt_dataset_read(NULL, MT_SPLIT_TRAIN, 0, 1, t, g), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, 0, 1, NULL, g), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "tokens is NULL"));
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, 0, 1, t, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "targets is NULL"));
    cr_assert_eq(mt_dataset_read(ds, (mt_split)2, 0, 1, t, g), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_HELDOUT, 0, 1, t, g), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "no windows"), "%s", mt_last_errmsg());
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, 0, 0, t, g), MT_OK, "reading nothing is fine");
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, 5, 2, t, g), MT_OK);
    mt_dataset_close(ds);
    free(tok);
}

/* A raw file is never silently read in the wrong width: uint32 ids of a small
 * vocabulary (every other 16-bit value 0) are refused as uint16, whether by
 * AUTO or by an explicit U16, and read as U32 when told; a vocabulary above
 * 65536 makes AUTO ask for the format; a uint16 stream with zeros of its own
 * is still uint16. */
/* The first held-out window (the file's windows in order) against tok[]. */
static void check_heldout_window(const mt_dataset *ds, const uint32_t *tok, uint32_t L)
{
    const uint64_t w = mt_dataset_num_windows(ds, MT_SPLIT_TRAIN);
    int32_t t[64], g[64];
    cr_assert_leq(L, 64);
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_HELDOUT, 0, 1, t, g), MT_OK, "%s", mt_last_errmsg());
    for (uint32_t k = 0; k < L; k++) {
        cr_assert_eq((uint32_t)t[k], tok[w * L + k], "token %u", k);
        cr_assert_eq((uint32_t)g[k], tok[w * L + k + 1], "target %u", k);
    }
}

Test(data, raw_width_is_never_guessed_wrong)
{
    char p[256];
    const uint32_t L = 8;
    const size_t n = 1 + 20 * L;
    uint32_t *tok = make_tokens(n, value16);
    for (size_t i = 0; i < n; i++) tok[i] = 1 + tok[i] % 1000;
    write_u32(tmp_path(p, "small-vocab.u32"), tok, n);
    const uint32_t wrong[] = {MT_TOKENS_AUTO, MT_TOKENS_U16};
    for (int f = 0; f < 2; f++) {
        mt_dataset_options o = options(wrong[f], L, 0.1f);
        o.vocab_size = 1001;
        mt_dataset *ds = NULL;
        cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT, "format %u", wrong[f]);
        cr_assert_null(ds);
        cr_assert(strstr(mt_last_errmsg(), "looks like raw uint32"), "%s", mt_last_errmsg());
    }
    mt_dataset_options o = options(MT_TOKENS_U32, L, 0.1f);
    o.vocab_size = 1001;
    mt_dataset *ds = open_ok(p, &o);
    check_heldout_window(ds, tok, L);
    mt_dataset_close(ds);

    /* a big vocabulary: AUTO does not assume 16 bits */
    write_u16(tmp_path(p, "big-vocab.raw"), tok, n);
    o = options(MT_TOKENS_AUTO, L, 0.1f);
    o.vocab_size = 128256;
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "vocab_size 128256 needs ids above 65535"), "%s", mt_last_errmsg());
    o.format = MT_TOKENS_U16; /* told: the ids are all below 1001 */
    ds = open_ok(p, &o);
    mt_dataset_close(ds);

    /* uint16 data with token 0 often, but not at every odd position */
    for (size_t i = 0; i < n; i++) tok[i] = i % 2 ? (i % 6 == 1 ? 5 : 0) : 7;
    write_u16(tmp_path(p, "zeros.u16"), tok, n);
    o = options(MT_TOKENS_AUTO, L, 0.1f);
    o.vocab_size = 8;
    ds = open_ok(p, &o);
    check_heldout_window(ds, tok, L);
    mt_dataset_close(ds);
    free(tok);
}

/* ---- megatrain document files (MT_TOKENS_DOCS) ---------------------------------- */

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A document file as docs/data.md lays it out: tokens of `bytes` bytes, the
 * end of each document, and the mask (NULL: none) of which tokens are targets. */
static void write_docs(const char *path, const uint32_t *tok, size_t n, const uint64_t *ends, size_t n_docs,
                       const unsigned char *mask, int bytes)
{
    const size_t tok_bytes = (n * (size_t)bytes + 7) / 8 * 8;
    const size_t size = 64 + tok_bytes + 8 * n_docs + (mask ? (n + 7) / 8 : 0);
    unsigned char *b = calloc(1, size);
    cr_assert_not_null(b);
    memcpy(b, "MTTOKENS", 8);
    put_le32(b + 8, 1);
    put_le32(b + 12, (uint32_t)bytes);
    put_le64(b + 16, n);
    put_le64(b + 24, n_docs);
    put_le32(b + 32, 0);
    put_le32(b + 36, mask ? 1 : 0);
    for (size_t i = 0; i < n; i++) (bytes == 2 ? put_le16 : put_le32)(b + 64 + (size_t)bytes * i, tok[i]);
    for (size_t d = 0; d < n_docs; d++) put_le64(b + 64 + tok_bytes + 8 * d, ends[d]);
    if (mask)
        for (size_t i = 0; i < n; i++)
            if (mask[i]) b[64 + tok_bytes + 8 * n_docs + i / 8] |= (unsigned char)(1u << (i % 8));
    write_bytes(path, b, size);
    free(b);
}

/* Documents of 4, 7 (a prompt of 3 masked out), 13 and 2 tokens with seq_len
 * 6: windows are the documents, padded, except the 13-token one, which does
 * not fit 7 tokens and comes in two pieces of 7 overlapping by one token;
 * targets only where the mask says; the padding reported. */
Test(data, documents_are_windows_padded_and_masked)
{
    char p[256];
    enum { N = 26 };
    uint32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = 100 + (uint32_t)i;
    const uint64_t ends[] = {4, 11, 24, 26};
    unsigned char mask[N];
    for (int i = 0; i < N; i++) mask[i] = !(i >= 4 && i < 7); /* the second document's prompt */
    for (int bytes = 2; bytes <= 4; bytes += 2) {
        write_docs(tmp_path(p, "docs.mt"), tok, N, ends, 4, mask, bytes);
        const uint32_t formats[] = {MT_TOKENS_AUTO, MT_TOKENS_DOCS};
        for (int f = 0; f < 2; f++) {
            mt_dataset_options o = options(formats[f], 6, 0.25f); /* 1 of 4 documents held out */
            o.vocab_size = 200;
            mt_dataset *ds = open_ok(p, &o);
            cr_assert_eq(mt_dataset_num_documents(ds), 4);
            cr_assert_eq(mt_dataset_num_tokens(ds), N);
            /* windows: [0,4) | [4,11) | [11,18) [17,24) | held out: [24,26) */
            cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), 4);
            cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 1);
            cr_assert_eq(mt_dataset_padding(ds, MT_SPLIT_TRAIN), (6 - 3) + (6 - 6) + 0 + (6 - 6));
            cr_assert_eq(mt_dataset_padding(ds, MT_SPLIT_HELDOUT), 6 - 1);
            int32_t t[6], g[6];
            cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_HELDOUT, 0, 1, t, g), MT_OK);
            cr_assert_eq(t[0], 124);
            cr_assert_eq(g[0], 125);
            for (int j = 1; j < 6; j++) cr_assert(t[j] == 0 && g[j] == MT_IGNORE_INDEX, "padding at %d", j);
            /* every training window once per epoch: find each by its first token */
            int seen[4] = {0};
            for (int w = 0; w < 4; w++) {
                cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_TRAIN, (uint64_t)w, 1, t, g), MT_OK);
                const uint32_t first = (uint32_t)t[0] - 100;
                const uint64_t starts[] = {0, 4, 11, 17}, lens[] = {4, 7, 7, 7};
                int k = 0;
                while (k < 4 && starts[k] != first) k++;
                cr_assert_lt(k, 4, "a window starting at token %u", first);
                seen[k]++;
                for (uint64_t j = 0; j < 6; j++) {
                    if (j + 1 < lens[k]) {
                        const uint64_t at = starts[k] + j;
                        cr_assert_eq(t[j], (int32_t)tok[at], "window %d input %llu", k, (unsigned long long)j);
                        cr_assert_eq(g[j], mask[at + 1] ? (int32_t)tok[at + 1] : MT_IGNORE_INDEX, "window %d target %llu", k,
                                     (unsigned long long)j);
                    } else {
                        cr_assert(t[j] == 0 && g[j] == MT_IGNORE_INDEX, "window %d padding %llu", k, (unsigned long long)j);
                    }
                }
            }
            for (int k = 0; k < 4; k++) cr_assert_eq(seen[k], 1, "window %d", k);
            mt_dataset_close(ds);
        }
    }
}

/* A piece with no target (a long prompt) is not a window; a file without
 * any target is refused. */
Test(data, documents_without_targets)
{
    char p[256];
    enum { N = 12 };
    uint32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint32_t)i + 1;
    const uint64_t ends[] = {N};
    unsigned char mask[N] = {0};
    mask[10] = mask[11] = 1; /* only the end of the document is learnt */
    write_docs(tmp_path(p, "prompt.mt"), tok, N, ends, 1, mask, 2);
    mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
    mt_dataset *ds = open_ok(p, &o);
    /* pieces [0,5) [4,9) [8,12): only the last has targets */
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_TRAIN), 1);
    mt_dataset_close(ds);
    memset(mask, 0, sizeof mask);
    write_docs(p, tok, N, ends, 1, mask, 2);
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "has a token to learn"), "%s", mt_last_errmsg());
}

/* Corrupt document files are refused with the file's name and the problem. */
Test(data, bad_document_files)
{
    char p[256];
    uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint64_t ends[] = {3, 8}, bad_order[] = {5, 3}, short_cover[] = {3, 7};
    struct {
        const uint64_t *ends;
        const char *why;
    } cases[] = {{bad_order, "document 1 ends at token 3"}, {short_cover, "cover 7 of its 8 tokens"}};
    mt_dataset_options o = options(MT_TOKENS_DOCS, 4, 0.0f);
    mt_dataset *ds = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_docs(tmp_path(p, "bad.mt"), tok, 8, cases[i].ends, 2, NULL, 4);
        cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
        cr_assert(strstr(mt_last_errmsg(), cases[i].why), "%s", mt_last_errmsg());
        cr_assert(strstr(mt_last_errmsg(), "bad.mt"), "%s", mt_last_errmsg());
    }
    /* a truncated file, a bad version, a reserved byte, a vocabulary check */
    write_docs(p, tok, 8, ends, 2, NULL, 4);
    FILE *f = fopen(p, "rb");
    unsigned char b[200];
    size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    write_bytes(p, b, n - 3);
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "truncated"), "%s", mt_last_errmsg());
    b[8] = 9;
    write_bytes(p, b, n);
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "version 9"), "%s", mt_last_errmsg());
    b[8] = 1;
    b[50] = 1;
    write_bytes(p, b, n);
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "header byte 50 is reserved"), "%s", mt_last_errmsg());
    b[50] = 0;
    write_bytes(p, b, n);
    o.vocab_size = 8;
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "token id 8"), "%s", mt_last_errmsg());
    cr_assert_null(ds);
}

/* A document file whose magic is damaged is refused as damaged, not read as
 * raw uint16 (which trains on its header, document ends and mask): a magic a
 * byte or two off, or one wholly wrong before a header that describes the
 * file exactly. Read raw only when the caller says so. */
Test(data, damaged_document_magic_is_not_read_raw)
{
    char p[256];
    uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint64_t ends[] = {3, 8};
    write_docs(tmp_path(p, "damaged.mt"), tok, 8, ends, 2, NULL, 2); /* 96 bytes: whole uint16 */
    FILE *f = fopen(p, "rb");
    unsigned char b[200];
    const size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    static const char *const magics[] = {"MTTOKEN\x01", "MTT0KEN5", "XXXXXXXX"};
    for (int i = 0; i < 3; i++) {
        memcpy(b, magics[i], 8);
        write_bytes(p, b, n);
        mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
        o.vocab_size = 65536;
        mt_dataset *ds = NULL;
        cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT, "magic %d", i);
        cr_assert(strstr(mt_last_errmsg(), "starts like a megatrain document file") &&
                      strstr(mt_last_errmsg(), "damaged.mt"),
                  "%s", mt_last_errmsg());
        cr_assert_null(ds);
        o.format = MT_TOKENS_U16;
        ds = open_ok(p, &o);
        cr_assert_eq(mt_dataset_num_tokens(ds), n / 2);
        mt_dataset_close(ds);
    }
    /* the same header two bytes longer describes no file: raw uint16, as any other */
    b[n] = b[n + 1] = 0;
    write_bytes(p, b, n + 2);
    mt_dataset_options o = options(MT_TOKENS_AUTO, 4, 0.0f);
    o.vocab_size = 65536;
    mt_dataset *ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_num_tokens(ds), n / 2 + 1);
    mt_dataset_close(ds);
}

/* ---- the document writer (mt_doc_writer) --------------------------------------- */

TestSuite(doc_writer, .init = make_tmp_dir, .fini = remove_tmp_dir);

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*n + 1);
    cr_assert_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Four documents (a prompt masked out in the second), written by the
 * library and by this file's own encoder of the format: the same bytes; and
 * the dataset reads back the documents, their tokens and their targets. */
static void round_trip(uint32_t vocab, int bytes)
{
    char p[256], q[300];
    enum { N = 19 };
    uint32_t tok[N];
    int32_t ids[N];
    unsigned char mask[N];
    const uint64_t ends[] = {4, 11, 17, 19};
    for (int i = 0; i < N; i++) tok[i] = (uint32_t)(vocab - 1 - (uint32_t)i * 7), ids[i] = (int32_t)tok[i], mask[i] = 1;
    for (int i = 4; i < 7; i++) mask[i] = 0; /* the second document's prompt */
    mt_doc_writer *w = NULL;
    cr_assert_eq(mt_doc_writer_create(&w, tmp_path(p, "rt.mt"), vocab), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(mt_doc_writer_append(w, ids, NULL, 4), MT_OK);
    cr_assert_eq(mt_doc_writer_end_document(w), MT_OK);
    cr_assert_eq(mt_doc_writer_append(w, ids + 4, mask + 4, 3), MT_OK); /* the prompt, learnt 0 */
    cr_assert_eq(mt_doc_writer_append(w, ids + 7, mask + 7, 4), MT_OK);
    cr_assert_eq(mt_doc_writer_end_document(w), MT_OK);
    cr_assert_eq(mt_doc_writer_end_document(w), MT_OK); /* an empty document is none */
    cr_assert_eq(mt_doc_writer_append(w, ids + 11, NULL, 6), MT_OK);
    cr_assert_eq(mt_doc_writer_end_document(w), MT_OK);
    cr_assert_eq(mt_doc_writer_append(w, ids + 17, NULL, 2), MT_OK); /* ended by finish */
    cr_assert(!exists(p), "the file is under its name before finish");
    cr_assert_eq(mt_doc_writer_finish(w), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(mt_doc_writer_num_tokens(w), N);
    cr_assert_eq(mt_doc_writer_num_targets(w), N - 3);
    cr_assert_eq(mt_doc_writer_num_documents(w), 4);
    mt_doc_writer_free(w);
    snprintf(q, sizeof q, "%s.tmp", p);
    cr_assert(!exists(q), "the temporary is left");

    write_docs(tmp_path(q, "ref.mt"), tok, N, ends, 4, mask, bytes);
    size_t na, nb;
    unsigned char *a = slurp(p, &na), *b = slurp(q, &nb);
    put_le32(b + 32, vocab); /* the reference leaves the informative vocabulary 0 */
    cr_assert_eq(na, nb);
    cr_assert(!memcmp(a, b, na), "the writer's bytes differ from the format's");
    free(a);
    free(b);

    mt_dataset_options o = options(MT_TOKENS_DOCS, 8, 0.5f);
    o.vocab_size = vocab;
    mt_dataset *ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_num_documents(ds), 4);
    cr_assert_eq(mt_dataset_num_tokens(ds), N);
    cr_assert_eq(mt_dataset_num_windows(ds, MT_SPLIT_HELDOUT), 2); /* the last two documents, in order */
    int32_t t[2 * 8], g[2 * 8];
    cr_assert_eq(mt_dataset_read(ds, MT_SPLIT_HELDOUT, 0, 2, t, g), MT_OK);
    for (int j = 0; j < 5; j++) cr_assert(t[j] == ids[11 + j] && g[j] == ids[12 + j], "document 3, token %d", j);
    cr_assert(t[8] == ids[17] && g[8] == ids[18] && g[9] == MT_IGNORE_INDEX);
    mt_dataset_close(ds);
    /* the masked prompt: the second document's first targets are ignored */
    o.heldout_fraction = 0.0f;
    ds = open_ok(p, &o);
    cr_assert_eq(mt_dataset_padding(ds, MT_SPLIT_TRAIN), (8 - 3) + (8 - 6) + (8 - 5) + (8 - 1));
    mt_dataset_close(ds);
}

Test(doc_writer, round_trip_2_byte_ids) { round_trip(300, 2); }
Test(doc_writer, round_trip_4_byte_ids) { round_trip(70000, 4); }

Test(doc_writer, ids_and_flags_out_of_range_are_refused)
{
    char p[256];
    mt_doc_writer *w = NULL;
    cr_assert_eq(mt_doc_writer_create(&w, tmp_path(p, "x.mt"), 100), MT_OK);
    const int32_t bad[] = {5, 100}, neg[] = {-1}, ok[] = {99, 0};
    const uint8_t two[] = {1, 2};
    cr_assert_eq(mt_doc_writer_append(w, bad, NULL, 2), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "tokens[1] = 100 is outside the vocabulary (ids 0 to 99)"), "%s",
              mt_last_errmsg());
    cr_assert_eq(mt_doc_writer_append(w, neg, NULL, 1), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_append(w, ok, two, 2), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "targets[1] is 2"), "%s", mt_last_errmsg());
    cr_assert_eq(mt_doc_writer_num_tokens(w), 0, "a refused call appended tokens");
    cr_assert_eq(mt_doc_writer_append(w, NULL, NULL, 1), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_append(w, ok, NULL, 2), MT_OK, "the writer goes on after a refusal");
    cr_assert_eq(mt_doc_writer_finish(w), MT_OK);
    cr_assert_eq(mt_doc_writer_finish(w), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "already finished"), "%s", mt_last_errmsg());
    cr_assert_eq(mt_doc_writer_append(w, ok, NULL, 2), MT_ERR_INVALID_ARGUMENT);
    mt_doc_writer_free(w);
    /* the vocabulary itself */
    cr_assert_eq(mt_doc_writer_create(&w, p, 0), MT_ERR_INVALID_ARGUMENT);
    cr_assert_null(w);
    cr_assert_eq(mt_doc_writer_create(&w, p, 0x80000001u), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_create(NULL, p, 10), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_create(&w, NULL, 10), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_append(NULL, ok, NULL, 1), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_end_document(NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_finish(NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_doc_writer_num_tokens(NULL), 0);
    mt_doc_writer_free(NULL);
}

Test(doc_writer, a_missing_directory_is_named)
{
    char p[256];
    mt_doc_writer *w = (mt_doc_writer *)1;
    cr_assert_eq(mt_doc_writer_create(&w, tmp_path(p, "nope/x.mt"), 100), MT_ERR_IO);
    cr_assert_null(w);
    cr_assert(strstr(mt_last_errmsg(), "does not exist") && strstr(mt_last_errmsg(), "/nope'"), "%s",
              mt_last_errmsg());
}

/* Abandoned: neither the file nor its temporary, and an older file under
 * the name stays as it was. */
/* A folder at the path is refused at once, not by the rename at the end. */
Test(doc_writer, a_folder_is_refused_at_create)
{
    char p[256], tmp[300];
    cr_assert_eq(mkdir(tmp_path(p, "folder.mt"), 0755), 0);
    mt_doc_writer *w = NULL;
    cr_assert_eq(mt_doc_writer_create(&w, p, 100), MT_ERR_IO);
    cr_assert(strstr(mt_last_errmsg(), "is a folder") && strstr(mt_last_errmsg(), "folder.mt"), "%s", mt_last_errmsg());
    cr_assert_null(w);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    cr_assert_neq(access(tmp, F_OK), 0, "no temporary is left");
}

Test(doc_writer, an_unfinished_writer_leaves_no_file)
{
    char p[256], q[300];
    const int32_t ids[] = {1, 2, 3};
    mt_doc_writer *w = NULL;
    cr_assert_eq(mt_doc_writer_create(&w, tmp_path(p, "x.mt"), 10), MT_OK);
    cr_assert_eq(mt_doc_writer_append(w, ids, NULL, 3), MT_OK);
    cr_assert_eq(mt_doc_writer_end_document(w), MT_OK);
    mt_doc_writer_free(w);
    snprintf(q, sizeof q, "%s.tmp", p);
    cr_assert(!exists(p) && !exists(q));
    write_bytes(p, "old", 3);
    cr_assert_eq(mt_doc_writer_create(&w, p, 10), MT_OK);
    cr_assert_eq(mt_doc_writer_append(w, ids, NULL, 3), MT_OK);
    mt_doc_writer_free(w);
    size_t n;
    unsigned char *b = slurp(p, &n);
    cr_assert(n == 3 && !memcmp(b, "old", 3), "the older file changed");
    free(b);
    cr_assert(!exists(q));
    /* finished, it replaces the older file */
    cr_assert_eq(mt_doc_writer_create(&w, p, 10), MT_OK);
    cr_assert_eq(mt_doc_writer_append(w, ids, NULL, 3), MT_OK);
    cr_assert_eq(mt_doc_writer_finish(w), MT_OK);
    mt_doc_writer_free(w);
    b = slurp(p, &n);
    cr_assert(n > 64 && !memcmp(b, "MTTOKENS", 8));
    free(b);
}

/* A full disk: the temporary is a link to /dev/full, so every write fails
 * with ENOSPC, while the tokens are buffered (at finish) and when the buffer
 * spills (in append). The message says why; nothing is under the name. */
Test(doc_writer, a_full_disk_is_reported)
{
    char p[256], q[300];
    static int32_t ids[40000];
    for (int spill = 0; spill < 2; spill++) {
        tmp_path(p, spill ? "spill.mt" : "x.mt");
        snprintf(q, sizeof q, "%s.tmp", p);
        cr_assert_eq(symlink("/dev/full", q), 0);
        mt_doc_writer *w = NULL;
        cr_assert_eq(mt_doc_writer_create(&w, p, 10), MT_OK, "%s", mt_last_errmsg());
        mt_status st = mt_doc_writer_append(w, ids, NULL, spill ? 40000 : 3);
        if (!spill) {
            cr_assert_eq(st, MT_OK);
            st = mt_doc_writer_finish(w);
        }
        cr_assert_eq(st, MT_ERR_IO);
        cr_assert(strstr(mt_last_errmsg(), "No space left on device") && strstr(mt_last_errmsg(), p), "%s",
                  mt_last_errmsg());
        cr_assert_eq(mt_doc_writer_append(w, ids, NULL, 1), MT_ERR_IO);
        cr_assert(strstr(mt_last_errmsg(), "an earlier write"), "%s", mt_last_errmsg());
        cr_assert_eq(mt_doc_writer_finish(w), MT_ERR_IO);
        mt_doc_writer_free(w);
        struct stat sb;
        cr_assert(lstat(q, &sb) != 0 && !exists(p), "a file was left behind");
    }
}

Test(doc_writer, small_and_empty_inputs)
{
    char p[256];
    mt_doc_writer *w = NULL;
    /* nothing at all: refused, no file */
    cr_assert_eq(mt_doc_writer_create(&w, tmp_path(p, "empty.mt"), 10), MT_OK);
    cr_assert_eq(mt_doc_writer_append(w, NULL, NULL, 0), MT_OK);
    cr_assert_eq(mt_doc_writer_end_document(w), MT_OK);
    cr_assert_eq(mt_doc_writer_finish(w), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "no document"), "%s", mt_last_errmsg());
    mt_doc_writer_free(w);
    cr_assert(!exists(p));
    /* one token, one document: the format's smallest file */
    const int32_t one = 7;
    const uint8_t learnt = 0;
    cr_assert_eq(mt_doc_writer_create(&w, tmp_path(p, "one.mt"), 10), MT_OK);
    cr_assert_eq(mt_doc_writer_append(w, &one, &learnt, 1), MT_OK);
    cr_assert_eq(mt_doc_writer_finish(w), MT_OK);
    mt_doc_writer_free(w);
    size_t n;
    unsigned char *b = slurp(p, &n);
    cr_assert_eq(n, 64 + 8 + 8 + 1);
    cr_assert(b[64] == 7 && b[65] == 0 && b[72] == 1 && b[80] == 0);
    free(b);
    /* the reader refuses it for what it is: nothing to learn */
    mt_dataset_options o = options(MT_TOKENS_DOCS, 4, 0.0f);
    mt_dataset *ds = NULL;
    cr_assert_eq(mt_dataset_open(&ds, p, &o), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "has a token to learn"), "%s", mt_last_errmsg());
}
