/* The document file's writer (MT_TOKENS_DOCS, docs/data.md), beside its
 * reader in data.c: documents of token ids with a loss mask, written as they
 * come.
 *
 * The tokens go straight to a temporary file, path.tmp, through a buffer;
 * what the format puts after them (the end of each document, the mask) is
 * kept in memory, 8 bytes a document and a bit a token, and written by
 * finish, which then writes the header (whose counts are known only then),
 * syncs the file, renames it to path and syncs the folder. Until that
 * rename nothing is under path (an older file there stays as it was), and a
 * writer that fails or is freed unfinished removes its temporary: a half
 * file never carries the name. */
#define _GNU_SOURCE
#include "core/internal.h"
#include "io/documents.h"
#include "io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WRITE_BUF_BYTES (64u << 10)
#define PATH_BYTES 4096
/* Ids are handed out as int32 (data.c reads no larger). */
#define MAX_VOCAB ((uint64_t)INT32_MAX + 1)

struct mt_doc_writer {
    char path[PATH_BYTES], tmp[PATH_BYTES + 8];
    int fd;            /* the temporary; -1 once closed */
    uint32_t vocab;    /* ids are below it */
    uint32_t tok_bytes; /* 2 or 4 */
    uint64_t n_tokens, n_targets, n_docs;
    uint64_t doc_start; /* the first token of the document being appended to */
    uint64_t *ends;     /* [n_docs] */
    uint64_t cap_docs;
    unsigned char *mask; /* bit i: token i is a target */
    uint64_t cap_mask;   /* bytes */
    unsigned char buf[WRITE_BUF_BYTES];
    size_t buffered;
    int broken; /* a write failed: only free is left */
    int done;   /* finished: the file is under path */
};

static void put32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* A failed write leaves the file in an unknown state: the writer refuses
 * everything after it, and free removes the temporary. */
static mt_status write_failed(mt_err err, mt_doc_writer *w, int e)
{
    w->broken = 1;
    return mt_fail(err, MT_ERR_IO, "cannot write document file '%s' (its temporary '%s'): %s", w->path, w->tmp,
                   strerror(e));
}

static mt_status flush(mt_err err, mt_doc_writer *w)
{
    if (w->buffered && mt_write_all(w->fd, w->buf, w->buffered)) return write_failed(err, w, errno);
    w->buffered = 0;
    return MT_OK;
}

static mt_status put(mt_err err, mt_doc_writer *w, const void *p, size_t n)
{
    if (w->buffered + n > sizeof w->buf) {
        mt_status st = flush(err, w);
        if (st) return st;
    }
    if (n > sizeof w->buf) return mt_write_all(w->fd, p, n) ? write_failed(err, w, errno) : MT_OK;
    memcpy(w->buf + w->buffered, p, n);
    w->buffered += n;
    return MT_OK;
}

/* A call on a writer that can take no more: the reason. */
static mt_status unusable(mt_err err, const mt_doc_writer *w, const char *fn)
{
    if (!w) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s: writer is NULL", fn);
    if (w->done) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s: '%s' is already finished", fn, w->path);
    return mt_fail(err, MT_ERR_IO, "%s: an earlier write of '%s' failed; free the writer", fn, w->path);
}

static int usable(const mt_doc_writer *w) { return w && !w->done && !w->broken; }

mt_status mt_doc_writer_create(mt_doc_writer **out, const char *path, uint32_t vocab_size)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_doc_writer_create: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_doc_writer_create: path is %s", path ? "empty" : "NULL");
    if (vocab_size == 0 || vocab_size > MAX_VOCAB)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_doc_writer_create: vocab_size %u is outside [1, 2^31] (ids are int32)", vocab_size);
    if (strlen(path) >= PATH_BYTES) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "path too long: %s", path);
    /* found at the end, by the rename, a folder would cost the whole tokenizing */
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return mt_fail(err, MT_ERR_IO, "cannot create document file '%s': it is a folder", path);
    mt_doc_writer *w = calloc(1, sizeof *w);
    if (!w) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for a document writer");
    mt_status st;
    memcpy(w->path, path, strlen(path) + 1);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->vocab = vocab_size;
    w->tok_bytes = vocab_size <= 0x10000 ? 2 : 4;
    /* 0666 as fopen makes files: the caller's umask decides */
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0) {
        const int e = errno;
        char dir[PATH_BYTES];
        memcpy(dir, path, strlen(path) + 1);
        st = e == ENOENT ? mt_fail(err, MT_ERR_IO, "cannot create document file '%s': the folder '%s' does not exist",
                                   path, dirname(dir))
                         : mt_fail(err, MT_ERR_IO, "cannot create document file '%s' (its temporary '%s'): %s", path,
                                   w->tmp, strerror(e));
        free(w);
        return st;
    }
    /* the header's place; finish writes it */
    static const unsigned char zero[DOCS_HEADER_BYTES];
    st = put(err, w, zero, sizeof zero);
    if (st) {
        mt_doc_writer_free(w);
        return st;
    }
    *out = w;
    return MT_OK;
}

/* Room for the mask bits of n_tokens + n tokens. */
static mt_status grow_mask(mt_err err, mt_doc_writer *w, uint64_t n_tokens)
{
    const uint64_t need = (n_tokens + 7) / 8;
    if (need <= w->cap_mask) return MT_OK;
    uint64_t cap = w->cap_mask ? w->cap_mask : 4096;
    while (cap < need) cap *= 2;
    if (cap > SIZE_MAX) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the loss mask");
    unsigned char *m = realloc(w->mask, (size_t)cap);
    if (!m)
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the loss mask of %llu tokens",
                       (unsigned long long)n_tokens);
    memset(m + w->cap_mask, 0, (size_t)(cap - w->cap_mask));
    w->mask = m;
    w->cap_mask = cap;
    return MT_OK;
}

mt_status mt_doc_writer_append(mt_doc_writer *w, const int32_t *tokens, const uint8_t *targets, size_t n)
{
    mt_err err = mt_err_thread();
    if (!usable(w)) return unusable(err, w, "mt_doc_writer_append");
    if (!n) return MT_OK;
    if (!tokens) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_doc_writer_append: tokens is NULL");
    /* everything is checked before anything is written: a refused call appends nothing */
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= w->vocab)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                           "mt_doc_writer_append: tokens[%zu] = %d is outside the vocabulary (ids 0 to %u)", i,
                           tokens[i], w->vocab - 1);
        if (targets && targets[i] > 1)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_doc_writer_append: targets[%zu] is %u, not 0 or 1", i,
                           (unsigned)targets[i]);
    }
    if (n >= DOCS_MAX_COUNT - w->n_tokens)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_doc_writer_append: '%s' would hold more than 2^56 tokens, which the format does not allow",
                       w->path);
    mt_status st = grow_mask(err, w, w->n_tokens + n);
    if (st) return st;
    for (size_t i = 0; i < n; i++) {
        unsigned char b[4];
        if (w->tok_bytes == 2) b[0] = (unsigned char)tokens[i], b[1] = (unsigned char)(tokens[i] >> 8);
        else put32(b, (uint32_t)tokens[i]);
        if ((st = put(err, w, b, w->tok_bytes))) return st;
        const uint64_t k = w->n_tokens + i;
        if (!targets || targets[i]) w->mask[k / 8] |= (unsigned char)(1u << (k % 8)), w->n_targets++;
    }
    w->n_tokens += n;
    return MT_OK;
}

mt_status mt_doc_writer_end_document(mt_doc_writer *w)
{
    mt_err err = mt_err_thread();
    if (!usable(w)) return unusable(err, w, "mt_doc_writer_end_document");
    if (w->n_tokens == w->doc_start) return MT_OK; /* empty: nothing to end */
    if (w->n_docs == w->cap_docs) {
        const uint64_t cap = w->cap_docs ? 2 * w->cap_docs : 1024;
        uint64_t *e = cap <= SIZE_MAX / sizeof *e ? realloc(w->ends, (size_t)cap * sizeof *e) : NULL;
        if (!e) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the ends of %llu documents",
                               (unsigned long long)cap);
        w->ends = e;
        w->cap_docs = cap;
    }
    w->ends[w->n_docs++] = w->n_tokens;
    w->doc_start = w->n_tokens;
    return MT_OK;
}

/* Everything after the tokens, then the header at offset 0. */
static mt_status write_tail(mt_err err, mt_doc_writer *w)
{
    static const unsigned char zero[8];
    mt_status st = put(err, w, zero, (size_t)((8 - w->n_tokens * w->tok_bytes % 8) % 8)); /* tokens end on 8 bytes */
    for (uint64_t d = 0; !st && d < w->n_docs; d++) {
        unsigned char b[8];
        put64(b, w->ends[d]);
        st = put(err, w, b, 8);
    }
    if (!st && w->n_tokens) st = put(err, w, w->mask, (size_t)((w->n_tokens + 7) / 8));
    if (!st) st = flush(err, w);
    if (st) return st;
    unsigned char h[DOCS_HEADER_BYTES] = {0};
    memcpy(h, DOCS_MAGIC, 8);
    put32(h + 8, DOCS_VERSION);
    put32(h + 12, w->tok_bytes);
    put64(h + 16, w->n_tokens);
    put64(h + 24, w->n_docs);
    put32(h + 32, w->vocab);
    put32(h + 36, DOCS_HAS_MASK);
    for (size_t off = 0; off < sizeof h;) {
        ssize_t k = pwrite(w->fd, h + off, sizeof h - off, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return write_failed(err, w, k < 0 ? errno : EIO);
        off += (size_t)k;
    }
    return MT_OK;
}

mt_status mt_doc_writer_finish(mt_doc_writer *w)
{
    mt_err err = mt_err_thread();
    if (!usable(w)) return unusable(err, w, "mt_doc_writer_finish");
    mt_status st = mt_doc_writer_end_document(w);
    if (st) return st;
    if (!w->n_docs)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_doc_writer_finish: '%s' would hold no document (a document file needs one)", w->path);
    if ((st = write_tail(err, w))) return st;
    if (fsync(w->fd)) return write_failed(err, w, errno);
    const int rc = close(w->fd);
    w->fd = -1;
    if (rc) return write_failed(err, w, errno);
    if (rename(w->tmp, w->path)) {
        const int e = errno;
        w->broken = 1;
        return mt_fail(err, MT_ERR_IO, "cannot rename '%s' to '%s': %s", w->tmp, w->path, strerror(e));
    }
    w->done = 1;
    char dir[PATH_BYTES];
    memcpy(dir, w->path, strlen(w->path) + 1);
    return mt_sync_dir(err, dirname(dir)); /* the rename is durable too */
}

uint64_t mt_doc_writer_num_tokens(const mt_doc_writer *w) { return w ? w->n_tokens : 0; }
uint64_t mt_doc_writer_num_targets(const mt_doc_writer *w) { return w ? w->n_targets : 0; }
uint64_t mt_doc_writer_num_documents(const mt_doc_writer *w) { return w ? w->n_docs : 0; }

void mt_doc_writer_free(mt_doc_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (!w->done) unlink(w->tmp); /* unfinished or failed: no half file stays behind */
    free(w->ends);
    free(w->mask);
    free(w);
}
