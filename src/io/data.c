/* Token data: a memory-mapped file of token ids (raw uint16, raw uint32 or
 * llm.c .bin), validated once at open, cut into windows of seq_len + 1
 * tokens with stride seq_len, split into training and held-out windows, and
 * read in a seeded order that is a fresh permutation every epoch.
 *
 * The permutation is computed, not stored: a keyed Feistel network over the
 * next power of two above the number of training windows, restricted to
 * [0, n_train) by cycle-walking. Reads are O(seq_len) with no table, and a
 * dataset is immutable after open, so any number of threads may read it. */
#define _DEFAULT_SOURCE
#include "core/internal.h"
#include "core/rng.h"
#include "io/documents.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES 1024u /* 256 int32 */


/* The stream of mt_rng_u64 that keys the shuffle of epoch e is SHUFFLE_STREAM + e. */
#define SHUFFLE_STREAM 0x5348554646ull /* "SHUFF" */
#define FEISTEL_ROUNDS 6

/* Token ids are handed out as int32. */
#define MAX_TOKEN_ID 0x7FFFFFFFu

struct mt_dataset {
    const unsigned char *map; /* the whole file, read-only */
    size_t map_size;
    const unsigned char *tok; /* the first token */
    uint32_t tok_bytes;       /* 2 or 4 */
    uint32_t seq_len;
    uint64_t n_tokens;
    uint64_t n_windows;
    uint64_t n_train; /* windows [0, n_train) */
    uint64_t n_heldout; /* windows [n_train, n_windows) */
    uint64_t seed;
    /* document files: a window is one piece of one document (all of it when
     * it fits seq_len + 1 tokens), padded to seq_len */
    const unsigned char *mask; /* bit i: token i is a target; NULL: all are */
    uint64_t n_docs;
    uint64_t *win_start;       /* [n_windows] first token of each window */
    uint32_t *win_len;         /* [n_windows] its tokens, 2 .. seq_len + 1 */
    uint64_t pad[2];           /* padded positions of the train and held-out windows */
};

/* ---- options ------------------------------------------------------------ */

void mt_dataset_options_init_sized(mt_dataset_options *p, uint32_t size)
{
    mt_dataset_options o;
    memset(&o, 0, sizeof o);
    o.format = MT_TOKENS_AUTO;
    o.vocab_size = 0;
    o.seq_len = 1024;
    o.heldout_fraction = 0.01f;
    o.seed = 1;
    mt_struct_init(p, size, &o, sizeof o);
}

static mt_status dataset_import(mt_err err, mt_dataset_options *o, const mt_dataset_options *src)
{
    mt_dataset_options_init(o);
    mt_status st = mt_copy_in(err, o, sizeof *o, src, MT_FIRST_SIZE_DATASET_OPTIONS, "mt_dataset_options");
    if (st) return st;
#define BAD(...) mt_fail(err, MT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (o->format > MT_TOKENS_DOCS)
        return BAD("mt_dataset_options.format %u is not an mt_token_format value", o->format);
    if (o->seq_len == 0) return BAD("mt_dataset_options.seq_len is 0: a sequence needs at least one token");
    if (!(o->heldout_fraction >= 0.0f && o->heldout_fraction <= 0.5f))
        return BAD("mt_dataset_options.heldout_fraction %g is outside [0, 0.5]", (double)o->heldout_fraction);
    if (o->reserved0) return BAD("mt_dataset_options.reserved0 must be zero");
#undef BAD
    return MT_OK;
}

/* ---- little-endian loads -------------------------------------------------- */

/* The mapping is page-aligned and tokens start at byte 0 or 1024, so every
 * token is naturally aligned; mapped memory has no declared type. */
static inline uint32_t le16(uint16_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    return v;
}

static inline uint32_t le32(uint32_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t header_word(const unsigned char *p, int i)
{
    uint32_t v;
    memcpy(&v, p + 4 * i, sizeof v);
    return le32(v);
}

static const char *format_name(uint32_t format, uint32_t tok_bytes)
{
    if (format == MT_TOKENS_DOCS) return tok_bytes == 2 ? "megatrain documents, uint16" : "megatrain documents, uint32";
    if (format == MT_TOKENS_LLMC) return tok_bytes == 2 ? "llm.c version 1, uint16" : "llm.c version 2, uint32";
    return tok_bytes == 2 ? "raw uint16" : "raw uint32";
}

/* ---- validation scan -------------------------------------------------------- */

/* The first index of a token >= limit, or n when there is none. Scans in
 * chunks with a branch-free maximum (which vectorises) and only looks for
 * the position inside a chunk that has an offender. One body for both
 * widths: `bytes` is a constant at each of scan_ids' two calls below, and
 * the body is always inlined there, so each width gets its own loop with
 * no test of the width inside it (as two hand-written copies did). */
#define SCAN_CHUNK 65536u

static inline uint32_t id_at(const void *t, uint64_t i, uint32_t bytes)
{
    return bytes == 2 ? le16(((const uint16_t *)t)[i]) : le32(((const uint32_t *)t)[i]);
}

static inline __attribute__((always_inline)) uint64_t scan_width(const void *t, uint64_t n, uint64_t limit,
                                                                 uint32_t bytes, uint32_t *value)
{
    for (uint64_t base = 0; base < n; base += SCAN_CHUNK) {
        uint64_t len = MT_MIN((uint64_t)SCAN_CHUNK, n - base);
        uint32_t mx = 0;
        for (uint64_t i = 0; i < len; i++) {
            uint32_t v = id_at(t, base + i, bytes);
            mx = v > mx ? v : mx;
        }
        if (mx < limit) continue;
        for (uint64_t i = 0; i < len; i++)
            if (id_at(t, base + i, bytes) >= limit) {
                *value = id_at(t, base + i, bytes);
                return base + i;
            }
    }
    return n;
}

static uint64_t scan_ids(const void *t, uint32_t bytes, uint64_t n, uint64_t limit, uint32_t *value)
{
    return bytes == 2 ? scan_width(t, n, limit, 2, value) : scan_width(t, n, limit, 4, value);
}

/* ---- open / close --------------------------------------------------------- */

/* A document file: every size and offset checked against the file's length
 * before anything is read through them. */
static mt_status parse_docs(mt_err err, mt_dataset *ds, const char *path)
{
    const unsigned char *p = ds->map;
    const uint64_t size = ds->map_size;
    if (size < DOCS_HEADER_BYTES || memcmp(p, DOCS_MAGIC, 8))
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' is not a megatrain document file (no %s header)", path,
                       DOCS_MAGIC);
    const uint32_t version = header_word(p, 2), tok_bytes = header_word(p, 3), flags = header_word(p, 9);
    const uint64_t n_tokens = load_le64(p + 16), n_docs = load_le64(p + 24);
    if (version != DOCS_VERSION)
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' is a megatrain document file of version %u; this library "
                       "reads version %u", path, version, DOCS_VERSION);
    if (tok_bytes != 2 && tok_bytes != 4)
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' says its tokens have %u bytes (2 or 4)", path, tok_bytes);
    if (flags & ~DOCS_HAS_MASK)
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' has unknown flags 0x%x", path, flags & ~DOCS_HAS_MASK);
    for (unsigned i = 40; i < DOCS_HEADER_BYTES; i++)
        if (p[i]) return mt_fail(err, MT_ERR_FORMAT, "token file '%s': header byte %u is reserved and not zero", path, i);
    /* sizes in 64 bits with room to spare: counts above 2^56 are refused first */
    if (n_tokens >= DOCS_MAX_COUNT || n_docs >= DOCS_MAX_COUNT || n_docs > n_tokens)
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' announces %llu tokens in %llu documents", path,
                       (unsigned long long)n_tokens, (unsigned long long)n_docs);
    const uint64_t tok_end = DOCS_HEADER_BYTES + (n_tokens * tok_bytes + 7) / 8 * 8;
    const uint64_t docs_end = tok_end + n_docs * 8;
    const uint64_t want = docs_end + ((flags & DOCS_HAS_MASK) ? (n_tokens + 7) / 8 : 0);
    if (size != want)
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' is %llu bytes, but its header (%llu tokens of %u bytes, %llu "
                       "documents%s) makes %llu: %s",
                       path, (unsigned long long)size, (unsigned long long)n_tokens, tok_bytes,
                       (unsigned long long)n_docs, (flags & DOCS_HAS_MASK) ? ", a loss mask" : "",
                       (unsigned long long)want, size < want ? "truncated" : "longer than its header says");
    uint64_t prev = 0;
    for (uint64_t d = 0; d < n_docs; d++) {
        const uint64_t end = load_le64(p + tok_end + 8 * d);
        if (end <= prev || end > n_tokens)
            return mt_fail(err, MT_ERR_FORMAT, "token file '%s': document %llu ends at token %llu, after %llu and within "
                           "%llu tokens it must", path, (unsigned long long)d, (unsigned long long)end,
                           (unsigned long long)prev, (unsigned long long)n_tokens);
        prev = end;
    }
    if (n_docs == 0 || prev != n_tokens)
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s': its documents cover %llu of its %llu tokens", path,
                       (unsigned long long)prev, (unsigned long long)n_tokens);
    ds->tok_bytes = tok_bytes;
    ds->tok = p + DOCS_HEADER_BYTES;
    ds->n_tokens = n_tokens;
    ds->n_docs = n_docs;
    ds->mask = (flags & DOCS_HAS_MASK) ? p + docs_end : NULL;
    return MT_OK;
}

static uint32_t token_at(const mt_dataset *ds, uint64_t i)
{
    return ds->tok_bytes == 2 ? le16(((const uint16_t *)(const void *)ds->tok)[i])
                              : le32(((const uint32_t *)(const void *)ds->tok)[i]);
}

static int is_target(const mt_dataset *ds, uint64_t i) { return !ds->mask || (ds->mask[i / 8] >> (i % 8) & 1); }

static uint64_t doc_end(const mt_dataset *ds, uint64_t d)
{
    const uint64_t tok_end = (ds->n_tokens * ds->tok_bytes + 7) / 8 * 8;
    return load_le64(ds->tok + tok_end + 8 * d);
}

/* A raw file of uint32 ids read as uint16 shows a zero in every other
 * position (the high halves, little-endian): for a real uint16 stream that
 * would mean token 0 at every odd position. Looks at up to the first 2^20
 * values; needs 32 of them to say anything. */
static int looks_like_u32(const unsigned char *p, uint64_t size)
{
    const uint64_t n = MT_MIN(size / 4, (uint64_t)1 << 19) * 2;
    if (n < 32 || size % 4) return 0;
    int low_nonzero = 0;
    for (uint64_t i = 0; i < n; i += 2) {
        uint16_t lo, hi;
        memcpy(&lo, p + 2 * i, 2);
        memcpy(&hi, p + 2 * i + 2, 2);
        if (hi) return 0;
        low_nonzero |= lo != 0;
    }
    return low_nonzero;
}

/* A file that is not a document file (its magic is not intact) but starts
 * like one: a magic that differs from DOCS_MAGIC in at most two bytes, or a
 * header whose fields describe exactly this file. Read as raw uint16 it
 * would train on the header, the document ends and the mask. */
static int damaged_docs(const unsigned char *p, uint64_t size)
{
    if (size < DOCS_HEADER_BYTES) return 0;
    int differ = 0;
    for (int i = 0; i < 8; i++) differ += p[i] != (unsigned char)DOCS_MAGIC[i];
    if (differ <= 2) return 1;
    const uint32_t version = header_word(p, 2), tok_bytes = header_word(p, 3), flags = header_word(p, 9);
    const uint64_t n_tokens = load_le64(p + 16), n_docs = load_le64(p + 24);
    if (version != DOCS_VERSION || (tok_bytes != 2 && tok_bytes != 4) || (flags & ~DOCS_HAS_MASK) ||
        n_tokens >= DOCS_MAX_COUNT || n_docs >= DOCS_MAX_COUNT || n_docs == 0 || n_docs > n_tokens)
        return 0;
    const uint64_t docs_end = DOCS_HEADER_BYTES + (n_tokens * tok_bytes + 7) / 8 * 8 + n_docs * 8;
    return size == docs_end + ((flags & DOCS_HAS_MASK) ? (n_tokens + 7) / 8 : 0);
}

/* Works out where the tokens are and how many there are; the mapping covers
 * the whole file. */
static mt_status parse_layout(mt_err err, mt_dataset *ds, const char *path, uint32_t *format, uint32_t vocab_size)
{
    const unsigned char *p = ds->map;
    const uint64_t size = ds->map_size;
    const int automatic = *format == MT_TOKENS_AUTO;
    if (automatic) {
        *format = size >= DOCS_HEADER_BYTES && !memcmp(p, DOCS_MAGIC, 8)                 ? MT_TOKENS_DOCS
                  : size >= LLMC_HEADER_BYTES && header_word(p, 0) == LLMC_MAGIC ? MT_TOKENS_LLMC
                                                                                   : MT_TOKENS_U16;
        if (*format == MT_TOKENS_U16 && damaged_docs(p, size)) {
            char shown[40]; /* the magic as it is, its unprintable bytes as \xNN */
            size_t k = 0;
            for (int i = 0; i < 8; i++)
                k += (size_t)snprintf(shown + k, sizeof shown - k, p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' ? "%c" : "\\x%02x", p[i]);
            return mt_fail(err, MT_ERR_FORMAT,
                           "token file '%s' starts like a megatrain document file, but its magic is '%s', not '%s': "
                           "the file is damaged (write it again; to read it as raw uint16 anyway, give that format: "
                           "MT_TOKENS_U16, the CLI's --format u16)",
                           path, shown, DOCS_MAGIC);
        }
        /* a raw file is taken for uint16 only where nothing says otherwise */
        if (*format == MT_TOKENS_U16 && vocab_size > 0x10000)
            return mt_fail(err, MT_ERR_FORMAT,
                           "token file '%s' has no llm.c header, and raw files are read as uint16 unless told, but "
                           "vocab_size %u needs ids above 65535: give its format (raw uint32: MT_TOKENS_U32, the "
                           "CLI's --format u32)",
                           path, vocab_size);
    }
    if (*format == MT_TOKENS_U16 && looks_like_u32(p, size))
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' %s as raw uint16, but every other 16-bit value is 0, as in uint32 ids: it "
                       "looks like raw uint32 (MT_TOKENS_U32, the CLI's --format u32)",
                       path, automatic ? "has no llm.c header and would be read" : "was to be read");

    if (*format == MT_TOKENS_U16 || *format == MT_TOKENS_U32) {
        ds->tok_bytes = *format == MT_TOKENS_U16 ? 2 : 4;
        if (size % ds->tok_bytes)
            return mt_fail(err, MT_ERR_FORMAT,
                           "token file '%s' is %llu bytes, not a multiple of %u-byte tokens (%s)", path,
                           (unsigned long long)size, ds->tok_bytes, format_name(*format, ds->tok_bytes));
        ds->tok = p;
        ds->n_tokens = size / ds->tok_bytes;
        return MT_OK;
    }

    if (*format == MT_TOKENS_DOCS) return parse_docs(err, ds, path);

    /* llm.c */
    if (size < LLMC_HEADER_BYTES)
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' is %llu bytes, too small for the %u-byte llm.c header", path,
                       (unsigned long long)size, LLMC_HEADER_BYTES);
    uint32_t magic = header_word(p, 0), version = header_word(p, 1), count = header_word(p, 2);
    if (magic != LLMC_MAGIC)
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' is not an llm.c .bin file: bad magic %u (expected %u) in its header",
                       path, magic, LLMC_MAGIC);
    if (version != 1 && version != 2)
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' has llm.c header version %u; this library reads version 1 (uint16 "
                       "tokens) and 2 (uint32 tokens)",
                       path, version);
    ds->tok_bytes = version == 1 ? 2 : 4;
    const uint64_t payload = size - LLMC_HEADER_BYTES;
    const uint64_t want = (uint64_t)count * ds->tok_bytes;
    if (payload != want)
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' is %s: its llm.c header announces %u %u-byte tokens (%llu bytes after the "
                       "%u-byte header) but the file holds %llu bytes after it",
                       path, payload < want ? "truncated" : "longer than its header says", count, ds->tok_bytes,
                       (unsigned long long)want, LLMC_HEADER_BYTES, (unsigned long long)payload);
    ds->tok = p + LLMC_HEADER_BYTES;
    ds->n_tokens = count;
    return MT_OK;
}

/* Every token id against vocab_size (and against the int32 range). */
static mt_status check_tokens(mt_err err, const mt_dataset *ds, const char *path, uint32_t vocab_size)
{
    const uint64_t limit = vocab_size && vocab_size <= MAX_TOKEN_ID ? vocab_size : (uint64_t)MAX_TOKEN_ID + 1;
    if (ds->tok_bytes == 2 && limit > 0xFFFF) return MT_OK; /* nothing to check */
    madvise((void *)ds->map, ds->map_size, MADV_SEQUENTIAL);
    uint32_t value = 0;
    const uint64_t at = scan_ids(ds->tok, ds->tok_bytes, ds->n_tokens, limit, &value);
    if (at == ds->n_tokens) return MT_OK;
    if (vocab_size && value >= vocab_size)
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' has token id %u at position %llu (counting tokens from 0), which is >= "
                       "vocab_size %u",
                       path, value, (unsigned long long)at, vocab_size);
    return mt_fail(err, MT_ERR_FORMAT,
                   "token file '%s' has token id %u at position %llu (counting tokens from 0), which does not fit "
                   "an int32 token id",
                   path, value, (unsigned long long)at);
}

/* A document file's windows: each document whole when it fits seq_len + 1
 * tokens, else in pieces of seq_len + 1 that overlap by one token (as a
 * stream's windows do), so no document is cut that fits; pieces without a
 * target are left out. Held out: the last documents' windows. */
static mt_status cut_doc_windows(mt_err err, mt_dataset *ds, const char *path, const mt_dataset_options *o)
{
    const uint32_t L = o->seq_len;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        uint64_t n = 0, start = 0, held_from = 0;
        const uint64_t held_docs = (uint64_t)((double)o->heldout_fraction * (double)ds->n_docs + 0.5);
        for (uint64_t d = 0; d < ds->n_docs; d++) {
            const uint64_t end = doc_end(ds, d);
            const int held = d >= ds->n_docs - held_docs;
            if (d == ds->n_docs - held_docs) held_from = n;
            for (uint64_t a = start; a + 1 < end; a += L) {
                const uint64_t c = MT_MIN((uint64_t)L + 1, end - a);
                int targets = 0;
                for (uint64_t k = a + 1; k < a + c && !targets; k++) targets = is_target(ds, k);
                if (!targets) continue;
                if (pass) {
                    ds->win_start[n] = a;
                    ds->win_len[n] = (uint32_t)c;
                    ds->pad[held] += L - (c - 1);
                }
                n++;
            }
            start = end;
        }
        if (!pass) {
            if (n == 0)
                return mt_fail(err, MT_ERR_FORMAT, "token file '%s': none of its %llu documents has a token to learn",
                               path, (unsigned long long)ds->n_docs);
            if (!(ds->win_start = malloc(n * sizeof *ds->win_start)) || !(ds->win_len = malloc(n * sizeof *ds->win_len)))
                return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the windows of '%s'", path);
            ds->n_windows = n;
        } else {
            ds->n_heldout = held_docs ? n - held_from : 0;
        }
    }
    if (ds->n_heldout >= ds->n_windows)
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' holds %llu document(s); holding out %g of them leaves no "
                       "training window", path, (unsigned long long)ds->n_docs, (double)o->heldout_fraction);
    ds->n_train = ds->n_windows - ds->n_heldout;
    ds->seq_len = L;
    ds->seed = o->seed;
    return MT_OK;
}

/* Windows and the split. */
static mt_status cut_windows(mt_err err, mt_dataset *ds, const char *path, const mt_dataset_options *o)
{
    if (ds->n_docs) return cut_doc_windows(err, ds, path, o);
    if (ds->n_tokens < (uint64_t)o->seq_len + 1)
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' holds %llu tokens, too short for one window of seq_len + 1 = %llu tokens",
                       path, (unsigned long long)ds->n_tokens, (unsigned long long)o->seq_len + 1);
    ds->seq_len = o->seq_len;
    ds->n_windows = (ds->n_tokens - 1) / o->seq_len;
    uint64_t held = (uint64_t)((double)o->heldout_fraction * (double)ds->n_windows + 0.5);
    if (held == 0 && o->heldout_fraction > 0.0f && ds->n_windows >= 2) held = 1;
    if (held >= ds->n_windows)
        return mt_fail(err, MT_ERR_FORMAT,
                       "token file '%s' holds %llu window(s) of %u + 1 tokens; holding out %llu of them "
                       "(heldout_fraction %g) leaves no training window",
                       path, (unsigned long long)ds->n_windows, o->seq_len, (unsigned long long)held,
                       (double)o->heldout_fraction);
    ds->n_heldout = held;
    ds->n_train = ds->n_windows - held;
    ds->seed = o->seed;
    return MT_OK;
}

mt_status mt_dataset_open(mt_dataset **out, const char *path, const mt_dataset_options *opt)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_dataset_open: out is NULL");
    *out = NULL;
    if (!path) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_dataset_open: path is NULL");
    mt_dataset_options o;
    mt_status st = dataset_import(err, &o, opt);
    if (st) return st;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_fail(err, MT_ERR_IO, "cannot open token file '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return mt_fail(err, MT_ERR_IO, "cannot stat token file '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mt_fail(err, MT_ERR_IO, "token file '%s' is not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return mt_fail(err, MT_ERR_FORMAT, "token file '%s' is empty (0 bytes)", path);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return mt_fail(err, MT_ERR_IO, "token file '%s' is too large to map in this address space", path);
    }

    mt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        close(fd);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the dataset handle");
    }
    ds->map_size = (size_t)sb.st_size;
    void *map = mmap(NULL, ds->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) {
        free(ds);
        return mt_fail(err, MT_ERR_IO, "cannot map token file '%s' (%llu bytes): %s", path,
                       (unsigned long long)sb.st_size, strerror(map_errno));
    }
    ds->map = map;

    uint32_t format = o.format;
    if ((st = parse_layout(err, ds, path, &format, o.vocab_size)) || (st = check_tokens(err, ds, path, o.vocab_size)) ||
        (st = cut_windows(err, ds, path, &o))) {
        mt_dataset_close(ds);
        return st;
    }
    madvise((void *)ds->map, ds->map_size, MADV_RANDOM);
    *out = ds;
    return MT_OK;
}

void mt_dataset_close(mt_dataset *ds)
{
    if (!ds) return;
    if (ds->map) munmap((void *)ds->map, ds->map_size);
    free(ds->win_start);
    free(ds->win_len);
    free(ds);
}

uint64_t mt_dataset_num_tokens(const mt_dataset *ds) { return ds ? ds->n_tokens : 0; }

uint64_t mt_dataset_padding(const mt_dataset *ds, mt_split split)
{
    return ds && (split == MT_SPLIT_TRAIN || split == MT_SPLIT_HELDOUT) ? ds->pad[split] : 0;
}

uint64_t mt_dataset_num_documents(const mt_dataset *ds) { return ds ? ds->n_docs : 0; }

uint64_t mt_dataset_num_windows(const mt_dataset *ds, mt_split split)
{
    if (!ds) return 0;
    switch (split) {
    case MT_SPLIT_TRAIN: return ds->n_train;
    case MT_SPLIT_HELDOUT: return ds->n_heldout;
    default: return 0;
    }
}

/* ---- the shuffle ------------------------------------------------------------ */

/* A bijection of [0, 2^bits) keyed by (seed, epoch): each round XORs a key
 * into the whole word, then a Feistel step sends (hi, lo) to
 * (lo ^ F(hi), hi), with hi the top bits - bits/2 and lo the low bits/2 bits.
 * Both steps are invertible whatever the widths, so the composition is a
 * permutation; the XOR also makes the 1- and 2-bit domains shuffle. */
typedef struct feistel {
    uint32_t bits;
    uint64_t key[FEISTEL_ROUNDS][2];
} feistel;

static void feistel_init(feistel *f, uint64_t seed, uint64_t epoch, uint64_t n)
{
    uint32_t bits = 0;
    while (bits < 64 && (UINT64_C(1) << bits) < n) bits++;
    f->bits = bits;
    for (int r = 0; r < FEISTEL_ROUNDS; r++) {
        f->key[r][0] = mt_rng_u64(seed, SHUFFLE_STREAM + epoch, 2 * (uint64_t)r);
        f->key[r][1] = mt_rng_u64(seed, SHUFFLE_STREAM + epoch, 2 * (uint64_t)r + 1);
    }
}

static uint64_t feistel_apply(const feistel *f, uint64_t x)
{
    const uint32_t b = f->bits, lo_bits = b / 2, hi_bits = b - lo_bits;
    const uint64_t mask = b >= 64 ? ~UINT64_C(0) : (UINT64_C(1) << b) - 1;
    const uint64_t lo_mask = (UINT64_C(1) << lo_bits) - 1;
    for (int r = 0; r < FEISTEL_ROUNDS; r++) {
        x = (x ^ f->key[r][0]) & mask;
        const uint64_t hi = x >> lo_bits, lo = x & lo_mask;
        const uint64_t mixed = (lo ^ mt_mix64(hi + f->key[r][1])) & lo_mask;
        x = (mixed << hi_bits) | hi;
    }
    return x;
}

/* perm_epoch(k) for k < n: cycle-walking keeps the bijection inside [0, n).
 * The domain is less than 2n, so the expected number of steps is below 2. */
static uint64_t shuffle(const feistel *f, uint64_t k, uint64_t n)
{
    uint64_t x = k;
    do x = feistel_apply(f, x);
    while (x >= n);
    return x;
}

/* ---- reads ------------------------------------------------------------------ */

static void copy_window(const mt_dataset *ds, uint64_t w, int32_t *tokens, int32_t *targets)
{
    const uint32_t L = ds->seq_len;
    if (ds->n_docs) { /* a document's piece, then padding that nothing learns */
        const uint64_t a = ds->win_start[w];
        const uint32_t c = ds->win_len[w];
        for (uint32_t j = 0; j + 1 < c; j++) {
            tokens[j] = (int32_t)token_at(ds, a + j);
            targets[j] = is_target(ds, a + j + 1) ? (int32_t)token_at(ds, a + j + 1) : MT_IGNORE_INDEX;
        }
        for (uint32_t j = c - 1; j < L; j++) {
            tokens[j] = 0;
            targets[j] = MT_IGNORE_INDEX;
        }
        return;
    }
    const uint64_t first = w * L;
    if (ds->tok_bytes == 2) {
        const uint16_t *t = (const uint16_t *)(const void *)ds->tok + first;
        for (uint32_t j = 0; j < L; j++) {
            tokens[j] = (int32_t)le16(t[j]);
            targets[j] = (int32_t)le16(t[j + 1]);
        }
    } else {
        const uint32_t *t = (const uint32_t *)(const void *)ds->tok + first;
        for (uint32_t j = 0; j < L; j++) {
            tokens[j] = (int32_t)le32(t[j]);
            targets[j] = (int32_t)le32(t[j + 1]);
        }
    }
}

mt_status mt_dataset_read(const mt_dataset *ds, mt_split split, uint64_t position, uint32_t n_seq,
                          int32_t *tokens, int32_t *targets)
{
    mt_err err = mt_err_thread();
    if (!ds) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_dataset_read: dataset is NULL");
    if (!tokens || !targets)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_dataset_read: %s is NULL", !tokens ? "tokens" : "targets");
    if (split != MT_SPLIT_TRAIN && split != MT_SPLIT_HELDOUT)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_dataset_read: split %u is not an mt_split value",
                       (unsigned)split);
    const uint64_t n = split == MT_SPLIT_TRAIN ? ds->n_train : ds->n_heldout;
    if (n == 0)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_dataset_read: the %s split has no windows (heldout_fraction 0 or too few windows)",
                       split == MT_SPLIT_TRAIN ? "train" : "held-out");

    const size_t L = ds->seq_len;
    if (split == MT_SPLIT_HELDOUT) {
        for (uint32_t i = 0; i < n_seq; i++)
            copy_window(ds, ds->n_train + (position + i) % n, tokens + i * L, targets + i * L);
        return MT_OK;
    }
    feistel f;
    uint64_t epoch = position / n;
    feistel_init(&f, ds->seed, epoch, n);
    for (uint32_t i = 0; i < n_seq; i++) {
        const uint64_t p = position + i;
        if (p / n != epoch) feistel_init(&f, ds->seed, epoch = p / n, n);
        copy_window(ds, shuffle(&f, p % n, n), tokens + i * L, targets + i * L);
    }
    return MT_OK;
}
