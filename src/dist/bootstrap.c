/* The bootstrap of a job of several processes (bootstrap.h): rank 0's blob
 * to every rank, through a shared file or a TCP connection to rank 0.
 *
 * Both methods have the same shape: every rank > 0 tells rank 0 who it is
 * (rank, n_ranks, blob length), rank 0 checks that they agree, hands out the
 * blob, and returns only once each rank has confirmed it holds it. All waits
 * are polls against one deadline, timeout_s after the call began; sockets
 * are non-blocking, sends never raise SIGPIPE (MSG_NOSIGNAL), and every
 * system call interrupted by a signal is retried or re-polled. */
#define _GNU_SOURCE
#include "dist/bootstrap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Room after PATH for ".rank65535.tmp", and the size of a buffer for
 * PATH with any of its suffixes. */
#define NAME_SLACK 32
#define NAME_SIZE (PATH_MAX + 2 * NAME_SLACK)
#define NONCE_BYTES 16
#define FILE_MAX (MT_BOOTSTRAP_FILE_HEADER + MT_BOOTSTRAP_MAX_BLOB)
#define HDR MT_BOOTSTRAP_TCP_HEADER

/* ---------------------------------------------------------------- helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A signal may cut the sleep short: every caller loops and re-checks its
 * deadline, so that is harmless. */
static void sleep_s(double s)
{
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Milliseconds left before the deadline, for poll(); 0 once it has passed. */
static int ms_until(double deadline)
{
    double left = deadline - now_s();
    if (left <= 0) return 0;
    double ms = ceil(left * 1000.0);
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#define FNV_START 0xcbf29ce484222325ull

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A job's nonce only has to differ from every earlier job's: the kernel's
 * random bytes, or where they are not to be had without blocking (early at
 * boot), the clocks, the process and an address mixed. */
static void make_nonce(uint8_t out[NONCE_BYTES])
{
    size_t got = 0;
    while (got < NONCE_BYTES) {
        ssize_t k = getrandom(out + got, NONCE_BYTES - got, GRND_NONBLOCK);
        if (k > 0)
            got += (size_t)k;
        else if (k < 0 && errno == EINTR)
            continue;
        else
            break;
    }
    if (got == NONCE_BYTES) return;
    struct timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t s = (uint64_t)a.tv_sec * 1000000007ull ^ (uint64_t)a.tv_nsec ^ (uint64_t)b.tv_nsec << 20 ^
                 (uint64_t)getpid() << 40 ^ (uint64_t)(uintptr_t)out;
    put64(out, splitmix(&s));
    put64(out + 8, splitmix(&s));
}

/* The ranks in [1, n) whose level is below `want`, as "1, 3-5, 9", cut
 * short with ", ..." where buf ends. */
static void fmt_ranks(char *buf, size_t size, const unsigned char *level, int n, unsigned char want)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int r = 1; r < n; r++) {
        if (level[r] >= want) continue;
        int end = r;
        while (end + 1 < n && level[end + 1] < want) end++;
        char item[32];
        int k = end == r ? snprintf(item, sizeof item, "%s%d", at ? ", " : "", r)
                         : snprintf(item, sizeof item, "%s%d-%d", at ? ", " : "", r, end);
        if (at + (size_t)k + 6 > size) {
            snprintf(buf + at, size - at, "%s...", at ? ", " : "");
            return;
        }
        memcpy(buf + at, item, (size_t)k + 1);
        at += (size_t)k;
        r = end;
    }
}

/* -------------------------------------------------------- the init string */

enum { METHOD_FILE = 1, METHOD_TCP = 2 };

typedef struct bs_init {
    int method;
    char path[PATH_MAX]; /* file: rank 0's file */
    char host[256];      /* tcp: without brackets */
    char port[8];
    int port_num;
    char where[300]; /* tcp: "host:port" or "[v6]:port", for messages */
} bs_init;

#define EXPECTED "expected file:PATH or tcp:HOST:PORT"

static mt_status parse_init(mt_err err, const char *init, bs_init *out)
{
    memset(out, 0, sizeof *out);
    if (!init) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: the init string is NULL (" EXPECTED ")");
    const char *colon = strchr(init, ':');
    if (!colon)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: '%.200s' names no method (" EXPECTED ")", init);
    size_t mlen = (size_t)(colon - init);
    const char *rest = colon + 1;
    if (!strncmp(rest, "//", 2)) rest += 2; /* torch's spelling: file:///path, tcp://host:port */

    if (mlen == 4 && !memcmp(init, "file", 4)) {
        size_t n = strlen(rest);
        if (!n)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: '%.200s' names no file (expected file:PATH)",
                           init);
        if (rest[n - 1] == '/')
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                           "bootstrap: '%.200s' names a directory; the file method needs a file name in it "
                           "(file:/shared/dir/job-1234)",
                           init);
        if (n + NAME_SLACK >= PATH_MAX)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: the path in '%.100s...' is too long (%zu bytes)",
                           init, n);
        memcpy(out->path, rest, n + 1);
        out->method = METHOD_FILE;
        return MT_OK;
    }
    if (!(mlen == 3 && !memcmp(init, "tcp", 3)))
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: unknown method '%.*s' in '%.200s' (" EXPECTED ")",
                       (int)MT_MIN(mlen, 32), init, init);

    const char *host, *host_end, *port;
    if (rest[0] == '[') { /* [IPv6]:PORT */
        const char *close = strchr(rest, ']');
        if (!close)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: '%.200s' opens a bracket it does not close", init);
        host = rest + 1, host_end = close;
        if (close[1] != ':')
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                           "bootstrap: '%.200s' has no port (expected tcp:[ADDRESS]:PORT)", init);
        port = close + 2;
    } else {
        const char *last = strrchr(rest, ':');
        if (!last)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: '%.200s' has no port (expected tcp:HOST:PORT)",
                           init);
        host = rest, host_end = last, port = last + 1;
        if (memchr(host, ':', (size_t)(host_end - host)))
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                           "bootstrap: '%.200s': an IPv6 address goes in brackets, as in tcp:[::1]:29500", init);
    }
    size_t hlen = (size_t)(host_end - host);
    if (!hlen)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: '%.200s' has no host (expected tcp:HOST:PORT)", init);
    if (hlen >= sizeof out->host)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bootstrap: the host in '%.100s...' is too long (%zu bytes)", init,
                       hlen);
    size_t plen = strlen(port);
    long pn = 0;
    int ok = plen >= 1 && plen <= 5;
    for (size_t i = 0; ok && i < plen; i++) {
        if (port[i] < '0' || port[i] > '9') ok = 0;
        pn = pn * 10 + (port[i] - '0');
    }
    if (!ok || pn < 1 || pn > 65535)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "bootstrap: bad port '%.20s' in '%.200s' (expected a number from 1 to 65535)", port, init);
    memcpy(out->host, host, hlen);
    memcpy(out->port, port, plen + 1);
    out->port_num = (int)pn;
    int v6 = memchr(out->host, ':', hlen) != NULL;
    snprintf(out->where, sizeof out->where, "%s%s%s:%s", v6 ? "[" : "", out->host, v6 ? "]" : "", out->port);
    out->method = METHOD_TCP;
    return MT_OK;
}

mt_status mt_bootstrap_check_init(mt_err err, const char *init)
{
    bs_init *in = malloc(sizeof *in);
    if (!in) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "bootstrap: out of memory");
    mt_status st = parse_init(err, init, in);
    free(in);
    return st;
}

/* ------------------------------------------------------ the file method */

typedef struct bs_file {
    uint32_t kind, rank, n_ranks, blob_len, payload_len, status;
    uint8_t nonce[NONCE_BYTES];
    uint8_t payload[MT_BOOTSTRAP_MAX_BLOB];
} bs_file;

enum { RD_ABSENT, RD_OK, RD_BAD };

/* Reads one of the job's files: RD_OK with it in *f, RD_ABSENT, RD_BAD with
 * the reason in why (not one of ours, another version, not whole), or -1
 * with errno for an error of the system. ESTALE (a shared file system's
 * handle to a file renamed over meanwhile) counts as absent: the next poll
 * sees the new file. */
static int read_bs_file(const char *path, bs_file *f, char *why, size_t why_size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESTALE || errno == EINTR ? RD_ABSENT : -1;
    uint8_t buf[FILE_MAX + 1];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t k = read(fd, buf + got, sizeof buf - got);
        if (k > 0) {
            got += (size_t)k;
        } else if (k == 0) {
            break;
        } else if (errno != EINTR) {
            int e = errno;
            close(fd);
            errno = e;
            return e == ESTALE ? RD_ABSENT : -1;
        }
    }
    close(fd);
    if (got < MT_BOOTSTRAP_FILE_HEADER || memcmp(buf, MT_BOOTSTRAP_FILE_MAGIC, 8)) {
        snprintf(why, why_size, "%zu bytes without the bootstrap magic", got);
        return RD_BAD;
    }
    uint32_t version = get32(buf + 8);
    if (version != MT_BOOTSTRAP_VERSION) {
        snprintf(why, why_size, "bootstrap format version %u, this library reads %u", version, MT_BOOTSTRAP_VERSION);
        return RD_BAD;
    }
    f->kind = get32(buf + 12);
    f->rank = get32(buf + 16);
    f->n_ranks = get32(buf + 20);
    f->blob_len = get32(buf + 24);
    f->payload_len = get32(buf + 28);
    memcpy(f->nonce, buf + 32, NONCE_BYTES);
    f->status = get32(buf + 48);
    if (f->payload_len > MT_BOOTSTRAP_MAX_BLOB || got != MT_BOOTSTRAP_FILE_HEADER + (size_t)f->payload_len) {
        snprintf(why, why_size, "%zu bytes where its header says %u: not whole", got,
                 MT_BOOTSTRAP_FILE_HEADER + f->payload_len);
        return RD_BAD;
    }
    uint64_t h = fnv1a(fnv1a(FNV_START, buf, 56), buf + MT_BOOTSTRAP_FILE_HEADER, f->payload_len);
    if (h != get64(buf + 56)) {
        snprintf(why, why_size, "its checksum does not match");
        return RD_BAD;
    }
    memcpy(f->payload, buf + MT_BOOTSTRAP_FILE_HEADER, f->payload_len);
    return RD_OK;
}

/* Writes one of the job's files whole or not at all: to PATH.tmp, renamed
 * over PATH, so that a reader on any node sees the old file or the new one.
 * No fsync: the files matter only while the job starts, not after a crash
 * of the machine, and close() is what makes a shared file system publish
 * them. Returns 0 or an errno. */
static int write_bs_file(const char *path, uint32_t kind, int rank, int n_ranks, size_t blob_len,
                         const uint8_t nonce[NONCE_BYTES], mt_status status, const void *payload, size_t payload_len)
{
    uint8_t buf[FILE_MAX];
    memset(buf, 0, MT_BOOTSTRAP_FILE_HEADER);
    memcpy(buf, MT_BOOTSTRAP_FILE_MAGIC, 8);
    put32(buf + 8, MT_BOOTSTRAP_VERSION);
    put32(buf + 12, kind);
    put32(buf + 16, (uint32_t)rank);
    put32(buf + 20, (uint32_t)n_ranks);
    put32(buf + 24, (uint32_t)blob_len);
    put32(buf + 28, (uint32_t)payload_len);
    memcpy(buf + 32, nonce, NONCE_BYTES);
    put32(buf + 48, (uint32_t)status);
    if (payload_len) memcpy(buf + MT_BOOTSTRAP_FILE_HEADER, payload, payload_len);
    put64(buf + 56, fnv1a(fnv1a(FNV_START, buf, 56), buf + MT_BOOTSTRAP_FILE_HEADER, payload_len));

    char tmp[NAME_SIZE];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    size_t n = MT_BOOTSTRAP_FILE_HEADER + payload_len, done = 0;
    while (done < n) {
        ssize_t k = write(fd, buf + done, n - done);
        if (k > 0) {
            done += (size_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else {
            int e = k < 0 ? errno : EIO;
            close(fd);
            unlink(tmp);
            return e;
        }
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return e;
    }
    return 0;
}

static void ack_name(char *out, const char *path, int rank)
{
    snprintf(out, NAME_SIZE, "%s.rank%d", path, rank);
}

/* Every rank writes next to PATH, so its directory must exist; said at
 * once rather than as a timeout. */
static mt_status check_dir(mt_err err, const char *path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            return mt_fail(
                err, MT_ERR_IO,
                "the directory %.300s of the file %.300s does not exist (it must exist, on a file system every "
                "rank shares)",
                dir, path);
        return mt_fail(err, MT_ERR_IO, "cannot reach the directory %.300s of the file %.300s: %s", dir, path,
                       strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return mt_fail(err, MT_ERR_IO, "%.300s, where the file %.300s would go, is not a directory", dir, path);
    return MT_OK;
}

/* How often to look at the files: from 1 ms up to 50 ms for a small job,
 * slower for a large one, so that many ranks do not flood a shared file
 * system's metadata server. */
static double poll_cap(int n) { return MT_MIN(0.5, 0.05 * MT_MAX(1, n / 64)); }

/* Rank 0: publish, collect the acknowledgements of this nonce, release,
 * wait until every rank has seen the release, remove the file. */
static mt_status file_rank0(mt_err err, const bs_init *in, int n, const void *blob, size_t len, double start,
                            double deadline)
{
    const char *path = in->path;
    uint8_t nonce[NONCE_BYTES];
    make_nonce(nonce);
    int e = write_bs_file(path, MT_BOOTSTRAP_PUBLISHED, 0, n, len, nonce, MT_OK, blob, len);
    if (e) return mt_fail(err, MT_ERR_IO, "cannot write %.300s: %s", path, strerror(e));

    char msg[MT_ERRMSG_MAX], why[256], list[256], name[NAME_SIZE];
    mt_status status = MT_OK;
    /* per rank: 0 nothing yet, 1 acknowledged this nonce, 2 saw the release */
    unsigned char *level = calloc((size_t)n, 1);
    bs_file *f = malloc(sizeof *f);
    if (!level || !f) {
        status = MT_ERR_OUT_OF_HOST_MEMORY;
        snprintf(msg, sizeof msg, "out of memory");
        goto fail;
    }
    double pause = 0.001, cap = poll_cap(n);
    for (unsigned char phase = 1; phase <= 2; phase++) {
        int count = 0;
        for (;;) {
            /* Phase 1 reads the files of the ranks that acknowledged too,
             * to learn at once when one of them gives up. */
            for (int r = 1; r < n; r++) {
                if (level[r] == 2) continue;
                ack_name(name, path, r);
                int rd = read_bs_file(name, f, why, sizeof why);
                if (rd < 0) {
                    status = MT_ERR_IO;
                    snprintf(msg, sizeof msg, "cannot read %.300s: %s", name, strerror(errno));
                    goto fail;
                }
                /* Only a file about this job's nonce counts: one left by an
                 * earlier job, or by a rank that read an earlier job's file,
                 * is ignored until that rank acknowledges ours. */
                int this_job = rd == RD_OK && f->rank == (uint32_t)r && !memcmp(f->nonce, nonce, NONCE_BYTES);
                if (this_job && f->kind == MT_BOOTSTRAP_ABORTED) {
                    /* The rank gave up after acknowledging (its own timeout,
                     * most often): the job cannot go on, and its reason is
                     * the job's. Its file is ours to remove now. */
                    unlink(name);
                    status =
                        f->status > 0 && f->status < (uint32_t)MT_STATUS_MAX_ENUM ? (mt_status)f->status : MT_ERR_IO;
                    int said = (int)MT_MIN(f->payload_len, 400);
                    fmt_ranks(list, sizeof list, level, n, 1);
                    if (phase == 1)
                        snprintf(msg, sizeof msg,
                                 "rank %d gave up; %d of %d ranks had joined; missing: %s; rank %d said: %.*s", r,
                                 count + 1, n, list, r, said, (const char *)f->payload);
                    else
                        snprintf(
                            msg, sizeof msg,
                            "rank %d gave up before it saw the release (all %d ranks had joined); rank %d said: %.*s",
                            r, n, r, said, (const char *)f->payload);
                    goto fail;
                }
                int ours = this_job && f->kind == MT_BOOTSTRAP_ACK;
                if (phase == 1 && ours && !level[r]) {
                    if (f->n_ranks != (uint32_t)n) {
                        status = MT_ERR_INVALID_ARGUMENT;
                        snprintf(msg, sizeof msg, "ranks disagree on n_ranks: rank 0 has %d, rank %d has %u", n, r,
                                 f->n_ranks);
                        goto fail;
                    }
                    if (f->blob_len != len) {
                        status = MT_ERR_INVALID_ARGUMENT;
                        snprintf(msg, sizeof msg,
                                 "ranks disagree on the blob length: rank 0 has %zu bytes, rank %d has %u", len, r,
                                 f->blob_len);
                        goto fail;
                    }
                }
                /* phase 2: a rank removes its file once it saw the release */
                if (phase == 1 ? ours && !level[r] : !ours) {
                    level[r] = phase;
                    count++;
                    pause = 0.001; /* progress: look again soon */
                }
            }
            if (count == n - 1) break;
            if (now_s() >= deadline) {
                status = MT_ERR_IO;
                fmt_ranks(list, sizeof list, level, n, phase);
                if (phase == 1)
                    snprintf(msg, sizeof msg,
                             "timed out after %.3g s waiting for the ranks to acknowledge %.300s: %d of %d ranks "
                             "joined; missing: %s",
                             now_s() - start, path, count + 1, n, list);
                else
                    snprintf(msg, sizeof msg,
                             "timed out after %.3g s: every rank acknowledged %.300s, but ranks %s did not confirm the "
                             "release (did they exit?)",
                             now_s() - start, path, list);
                goto fail;
            }
            sleep_s(MT_MIN(pause, deadline - now_s()));
            pause = MT_MIN(pause * 2, cap);
        }
        if (phase == 1) {
            e = write_bs_file(path, MT_BOOTSTRAP_RELEASED, 0, n, len, nonce, MT_OK, blob, len);
            if (e) {
                status = MT_ERR_IO;
                snprintf(msg, sizeof msg, "cannot write %.300s: %s", path, strerror(e));
                goto fail;
            }
        }
    }
    unlink(path);
    free(level);
    free(f);
    return MT_OK;

fail:
    /* The ranks that acknowledged this nonce learn why and stop at once;
     * the file stays, holding the reason, until the next job replaces it. */
    write_bs_file(path, MT_BOOTSTRAP_ABORTED, 0, n, len, nonce, status, msg, strlen(msg));
    free(level);
    free(f);
    return mt_fail(err, status, "%s", msg);
}

/* Rank r > 0: read rank 0's file, acknowledge its nonce, and return once
 * the file says that nonce is released. A rank accepts only the release of
 * a nonce it acknowledged during this call, so a file left by an earlier
 * job (published, released or aborted) never hands it a blob: its rank 0 is
 * gone and will release nothing. */
static mt_status file_rank(mt_err err, const bs_init *in, int rank, int n, void *blob, size_t len, double start,
                           double deadline)
{
    const char *path = in->path;
    char name[NAME_SIZE], seen[700], why[256];
    ack_name(name, path, rank);
    bs_file *f = malloc(sizeof *f);
    if (!f) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    uint8_t acked[NONCE_BYTES];
    int have_acked = 0, rank0_stopped = 0;
    mt_status status = MT_OK;
    double pause = 0.001, cap = poll_cap(n);
    snprintf(seen, sizeof seen, "no file %.300s appeared (is rank 0 running, with the same path?)", path);
    for (;;) {
        int rd = read_bs_file(path, f, why, sizeof why);
        if (rd < 0) {
            status = mt_fail(err, MT_ERR_IO, "cannot read %.300s: %s", path, strerror(errno));
            break;
        }
        int same = rd == RD_OK && have_acked && !memcmp(f->nonce, acked, NONCE_BYTES);
        if (rd == RD_ABSENT) {
            if (have_acked) snprintf(seen, sizeof seen, "%.300s disappeared after this rank acknowledged it", path);
        } else if (rd == RD_BAD || f->rank != 0) {
            snprintf(seen, sizeof seen,
                     "%.300s is not a bootstrap file of rank 0 (%s); rank 0 replaces it when it starts", path,
                     rd == RD_BAD ? why : "written by another rank");
        } else if (f->kind == MT_BOOTSTRAP_PUBLISHED && !same) {
            /* A new job, or an earlier job's file: acknowledge it either way
             * (even one this rank disagrees with, so that rank 0 can say
             * who disagrees), and look again for its release. */
            int e = write_bs_file(name, MT_BOOTSTRAP_ACK, rank, n, len, f->nonce, MT_OK, NULL, 0);
            if (e) {
                status = mt_fail(err, MT_ERR_IO, "cannot write %.300s: %s", name, strerror(e));
                break;
            }
            memcpy(acked, f->nonce, NONCE_BYTES);
            have_acked = 1;
            pause = 0.001;
            if (f->n_ranks != (uint32_t)n || f->blob_len != len)
                snprintf(
                    seen, sizeof seen,
                    "%.300s is for a job of %u ranks and a %u-byte blob, this rank has %d ranks and %zu bytes: the "
                    "ranks disagree, or the file is left from an earlier job",
                    path, f->n_ranks, f->blob_len, n, len);
            else
                snprintf(seen, sizeof seen,
                         "this rank acknowledged %.300s, which rank 0 releases once all %d ranks have (some have not)",
                         path, n);
        } else if (f->kind == MT_BOOTSTRAP_RELEASED && same) {
            if (f->n_ranks != (uint32_t)n || f->payload_len != len) {
                status = mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                                 "rank 0 released a job of %u ranks and a %u-byte blob; this rank has %d and %zu",
                                 f->n_ranks, f->payload_len, n, len);
                break;
            }
            if (len) memcpy(blob, f->payload, len);
            break; /* MT_OK */
        } else if (f->kind == MT_BOOTSTRAP_ABORTED && same) {
            mt_status st = f->status > 0 && f->status < (uint32_t)MT_STATUS_MAX_ENUM ? (mt_status)f->status : MT_ERR_IO;
            status = mt_fail(err, st, "rank 0 stopped the job: %.*s", (int)MT_MIN(f->payload_len, MT_BOOTSTRAP_MSG_MAX),
                             (const char *)f->payload);
            rank0_stopped = 1;
            break;
        } else if (f->kind == MT_BOOTSTRAP_ABORTED) {
            snprintf(seen, sizeof seen,
                     "%.300s holds the failure of a job this rank did not join (an earlier job's, or this one's rank 0 "
                     "gave up before this rank started): \"%.*s\"",
                     path, (int)MT_MIN(f->payload_len, 300), (const char *)f->payload);
        } else if (f->kind == MT_BOOTSTRAP_RELEASED) {
            snprintf(seen, sizeof seen,
                     "%.300s is left from an earlier job (released before this rank acknowledged it: not accepted)",
                     path);
        } else if (f->kind != MT_BOOTSTRAP_PUBLISHED) {
            snprintf(seen, sizeof seen, "%.300s is not rank 0's file (kind %u)", path, f->kind);
        }
        if (now_s() >= deadline) {
            status = mt_fail(err, MT_ERR_IO, "timed out after %.3g s waiting for rank 0's file: %s", now_s() - start,
                             seen);
            break;
        }
        sleep_s(MT_MIN(pause, deadline - now_s()));
        pause = MT_MIN(pause * 2, cap);
    }
    /* Removing the acknowledgement is what tells rank 0 that this rank saw
     * the release. A rank that fails otherwise says so in its place, lest
     * rank 0 take the missing file for a confirmation and return as if all
     * had the blob; rank 0 removes that file when it reads it, and if rank 0
     * is gone, the next job's rank r replaces it. */
    if (have_acked && (status == MT_OK || rank0_stopped)) {
        unlink(name);
    } else if (have_acked) {
        const char *why_failed = err.buf ? err.buf : "";
        write_bs_file(name, MT_BOOTSTRAP_ABORTED, rank, n, len, acked, status, why_failed,
                      MT_MIN(strlen(why_failed), (size_t)MT_BOOTSTRAP_MSG_MAX));
    }
    free(f);
    return status;
}

/* ------------------------------------------------------- the TCP method */

typedef struct bs_msg {
    uint32_t magic, version, kind, rank, n_ranks, blob_len, status, payload_len;
} bs_msg;

static void msg_put(uint8_t *b, uint32_t kind, int rank, int n_ranks, size_t blob_len, uint32_t status,
                    size_t payload_len)
{
    const uint32_t v[8] = {MT_BOOTSTRAP_TCP_MAGIC, MT_BOOTSTRAP_VERSION, kind,     (uint32_t)rank,
                           (uint32_t)n_ranks,      (uint32_t)blob_len,   status,   (uint32_t)payload_len};
    for (int i = 0; i < 8; i++) put32(b + 4 * i, v[i]);
}

static bs_msg msg_get(const uint8_t *b)
{
    return (bs_msg){get32(b),      get32(b + 4),  get32(b + 8),  get32(b + 12),
                    get32(b + 16), get32(b + 20), get32(b + 24), get32(b + 28)};
}

/* Sends n bytes before the deadline: 0, or -1 with errno (ETIMEDOUT at the
 * deadline; EPIPE or ECONNRESET for a peer gone, without SIGPIPE). */
static int send_all(int fd, const void *buf, size_t n, double deadline)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int ms = ms_until(deadline);
            if (!ms) {
                errno = ETIMEDOUT;
                return -1;
            }
            struct pollfd pf = {fd, POLLOUT, 0};
            if (poll(&pf, 1, ms) < 0 && errno != EINTR) return -1;
            continue;
        }
        return -1;
    }
    return 0;
}

/* Receives n bytes before the deadline. Returns how many came: n, or fewer
 * with *why 0 (the peer closed), ETIMEDOUT, or the error's errno. */
static size_t recv_all(int fd, void *buf, size_t n, double deadline, int *why)
{
    uint8_t *p = buf;
    size_t got = 0;
    *why = 0;
    while (got < n) {
        ssize_t k = recv(fd, p + got, n - got, 0);
        if (k > 0) {
            got += (size_t)k;
            continue;
        }
        if (k == 0) return got;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            *why = errno;
            return got;
        }
        int ms = ms_until(deadline);
        if (!ms) {
            *why = ETIMEDOUT;
            return got;
        }
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, ms) < 0 && errno != EINTR) {
            *why = errno;
            return got;
        }
    }
    return got;
}

/* Waits for a non-blocking connect to finish: 0, or -1 with the reason in
 * *why (at the deadline, ETIMEDOUT unless *why holds an earlier attempt's
 * reason). */
static int wait_connected(int fd, double deadline, int *why)
{
    for (;;) {
        /* at the deadline, one last look (poll with 0 ms): a refusal that
         * came meanwhile is a better reason than the deadline */
        int ms = ms_until(deadline);
        struct pollfd pf = {fd, POLLOUT, 0};
        int k = poll(&pf, 1, ms);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            *why = errno;
            return -1;
        }
        if (k == 0) {
            if (ms) continue;
            /* cut short by the deadline: "no answer" only if no attempt
             * had a definite one */
            if (!*why) *why = ETIMEDOUT;
            return -1;
        }
        int so = 0;
        socklen_t sl = sizeof so;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0) so = errno;
        if (so) {
            *why = so;
            return -1;
        }
        return 0;
    }
}

/* Connects to rank 0, trying every address of HOST, again and again while
 * nothing listens there (rank 0 may start after this rank), until the
 * deadline. Returns the socket, or -1 with a message in err. */
static int tcp_connect(mt_err err, const bs_init *in, double start, double deadline)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    double pause = 0.005;
    for (;;) {
        int g = getaddrinfo(in->host, in->port, &hints, &res);
        if (!g) break;
        /* EAI_AGAIN: the resolver could not answer now; worth another try */
        if (g != EAI_AGAIN || now_s() >= deadline) {
            mt_fail(err, MT_ERR_IO, "cannot resolve '%s', the host of rank 0: %s", in->host,
                    g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
            return -1;
        }
        sleep_s(MT_MIN(pause, deadline - now_s()));
        pause = MT_MIN(pause * 2, 0.25);
    }
    int attempts = 0, why = 0;
    for (;;) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            attempts++;
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                why = errno;
                continue;
            }
            int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
            if (rc != 0) {
                /* EINTR: the connection goes on without us, as EINPROGRESS */
                if (errno == EINPROGRESS || errno == EINTR)
                    rc = wait_connected(fd, deadline, &why);
                else
                    why = errno;
            }
            if (rc == 0) {
                freeaddrinfo(res);
                return fd;
            }
            close(fd);
        }
        if (now_s() >= deadline) break;
        sleep_s(MT_MIN(pause, deadline - now_s()));
        pause = MT_MIN(pause * 2, 0.25);
    }
    freeaddrinfo(res);
    mt_fail(err, MT_ERR_IO, "could not connect to rank 0 at %s within %.3g s (%d attempts): %s%s", in->where,
            now_s() - start, attempts, why == ETIMEDOUT ? "no answer" : strerror(why),
            why == ECONNREFUSED ? " (nothing listens there: rank 0 has not started, or it uses another port)"
            : why == EHOSTUNREACH || why == ENETUNREACH || why == ETIMEDOUT
                ? " (the host is unreachable from here: a wrong address, or a firewall?)"
                : "");
    return -1;
}

/* Rank r > 0 over TCP: HELLO, then rank 0's BLOB (or ERROR), then ACK. */
static mt_status tcp_rank(mt_err err, const bs_init *in, int rank, int n, void *blob, size_t len, double start,
                          double deadline)
{
    int fd = tcp_connect(err, in, start, deadline);
    if (fd < 0) return MT_ERR_IO;
    uint8_t hdr[HDR], payload[MT_BOOTSTRAP_MAX_BLOB];
    mt_status status = MT_OK;
    int why = 0;
    msg_put(hdr, MT_BOOTSTRAP_HELLO, rank, n, len, 0, 0);
    if (send_all(fd, hdr, HDR, deadline) != 0) {
        status = mt_fail(err, MT_ERR_IO, "cannot send to rank 0 at %s: %s", in->where, strerror(errno));
        goto done;
    }
    size_t got = recv_all(fd, hdr, HDR, deadline, &why);
    if (got < HDR) {
        if (why == ETIMEDOUT && !got)
            status = mt_fail(err, MT_ERR_IO,
                             "timed out after %.3g s waiting for rank 0 at %s, which answers once all %d ranks have "
                             "connected (some have not)",
                             now_s() - start, in->where, n);
        else if (why == ETIMEDOUT)
            status =
                mt_fail(err, MT_ERR_IO, "timed out after %.3g s: rank 0 at %s sent %zu of the %d bytes of its reply",
                        now_s() - start, in->where, got, HDR);
        else if (why)
            status =
                mt_fail(err, MT_ERR_IO, "lost the connection to rank 0 at %s after %zu of %d bytes of its reply: %s",
                        in->where, got, HDR, strerror(why));
        else
            status = mt_fail(err, MT_ERR_IO,
                             "rank 0 at %s closed the connection after %zu of the %d bytes of its reply (did it fail "
                             "or exit?)",
                             in->where, got, HDR);
        goto done;
    }
    bs_msg m = msg_get(hdr);
    if (m.magic != MT_BOOTSTRAP_TCP_MAGIC) {
        status = mt_fail(err, MT_ERR_IO,
                         "what answers at %s is not a bootstrap rank 0 (no bootstrap magic in its reply): another "
                         "program on that port?",
                         in->where);
        goto done;
    }
    if (m.version != MT_BOOTSTRAP_VERSION) {
        status = mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                         "rank 0 speaks bootstrap protocol version %u, this rank %u: the job mixes library versions",
                         m.version, MT_BOOTSTRAP_VERSION);
        goto done;
    }
    size_t want = m.kind == MT_BOOTSTRAP_ERROR ? MT_BOOTSTRAP_MSG_MAX : len;
    if ((m.kind != MT_BOOTSTRAP_ERROR && m.kind != MT_BOOTSTRAP_BLOB) || m.payload_len > want ||
        (m.kind == MT_BOOTSTRAP_BLOB && m.payload_len != len)) {
        status =
            mt_fail(err, MT_ERR_IO, "rank 0 at %s sent a malformed reply (kind %u, %u bytes; expected a %zu-byte blob)",
                    in->where, m.kind, m.payload_len, len);
        goto done;
    }
    got = recv_all(fd, payload, m.payload_len, deadline, &why);
    if (got < m.payload_len) {
        status = mt_fail(err, MT_ERR_IO, "rank 0 at %s sent %zu of the %u bytes of its %s: %s", in->where, got,
                         m.payload_len, m.kind == MT_BOOTSTRAP_BLOB ? "blob" : "message",
                         why == ETIMEDOUT ? "timed out" : why ? strerror(why) : "it closed the connection");
        goto done;
    }
    if (m.kind == MT_BOOTSTRAP_ERROR) {
        mt_status st = m.status > 0 && m.status < (uint32_t)MT_STATUS_MAX_ENUM ? (mt_status)m.status : MT_ERR_IO;
        status = mt_fail(err, st, "rank 0 stopped the job: %.*s", (int)m.payload_len, (const char *)payload);
        goto done;
    }
    msg_put(hdr, MT_BOOTSTRAP_ACK, rank, n, len, 0, 0);
    if (send_all(fd, hdr, HDR, deadline) != 0) {
        status = mt_fail(err, MT_ERR_IO, "cannot acknowledge the blob to rank 0 at %s: %s", in->where, strerror(errno));
        goto done;
    }
    if (len) memcpy(blob, payload, len);
done:
    close(fd);
    return status;
}

/* Binds PORT on every address of one family; the socket or -1 with errno. */
static int bind_any(int family, int port)
{
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int on = 1, off = 0;
    /* a rank 0 run again at once finds the port free, not held by the
     * connections of the last run waiting out TIME_WAIT; a port that
     * something listens on still refuses the bind */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    int rc;
    if (family == AF_INET6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off); /* IPv4 too, as ::ffff:a.b.c.d */
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof a);
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc == 0 && listen(fd, SOMAXCONN) == 0) return fd;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

/* Rank 0 listens on every interface rather than on HOST's address: HOST is
 * how the others reach this node, and a node's own name may resolve, on
 * the node, to an address the others cannot use (a loopback one). One
 * socket takes IPv6 and IPv4 where the system has IPv6, IPv4 alone
 * otherwise. */
static int tcp_listen(mt_err err, const bs_init *in)
{
    int fd = bind_any(AF_INET6, in->port_num);
    if (fd < 0 && errno != EADDRINUSE && errno != EACCES) fd = bind_any(AF_INET, in->port_num);
    if (fd >= 0) return fd;
    if (errno == EADDRINUSE)
        mt_fail(err, MT_ERR_IO,
                "port %d is in use on this host (by an earlier rank 0 still running, or another program): "
                "choose another port",
                in->port_num);
    else if (errno == EACCES)
        mt_fail(err, MT_ERR_IO, "port %d needs privileges this process lacks (ports below 1024 do): choose another",
                in->port_num);
    else
        mt_fail(err, MT_ERR_IO, "cannot listen on port %d: %s", in->port_num, strerror(errno));
    return -1;
}

/* A connection and the message arriving on it, a few bytes at a time if
 * so: a greeting while it has not said which rank it is, then, once it has
 * joined, its acknowledgement. */
typedef struct bs_conn {
    int fd;
    size_t got;
    uint8_t buf[HDR];
} bs_conn;

/* Tells a peer why the job stops; best effort, bounded by `until`. */
static void send_error(int fd, int rank, int n, size_t len, mt_status status, const char *msg, double until)
{
    uint8_t buf[HDR + MT_BOOTSTRAP_MSG_MAX];
    size_t k = MT_MIN(strlen(msg), (size_t)MT_BOOTSTRAP_MSG_MAX);
    msg_put(buf, MT_BOOTSTRAP_ERROR, rank, n, len, (uint32_t)status, k);
    memcpy(buf + HDR, msg, k);
    send_all(fd, buf, HDR + k, until);
}

/* Rank 0 over TCP: a HELLO from every other rank (checked), the blob to
 * each, an ACK from each. Connections that are not this protocol (a port
 * scanner, a greeting cut short) are dropped and counted; a rank that
 * joined and then disagrees, closes, or says nonsense stops the job, and
 * every rank that joined is told why. */
static mt_status tcp_rank0(mt_err err, const bs_init *in, int n, const void *blob, size_t len, double start,
                           double deadline)
{
    int lfd = tcp_listen(err, in);
    if (lfd < 0) return MT_ERR_IO;
    char msg[MT_ERRMSG_MAX], list[256];
    mt_status status = MT_OK;
    int offender = -1; /* a socket to tell why, beside the ranks that joined */
    bs_conn *peer = calloc((size_t)n, sizeof *peer);
    unsigned char *level = calloc((size_t)n, 1); /* 1: joined, 2: acknowledged */
    uint8_t *reply = malloc(HDR + MT_BOOTSTRAP_MAX_BLOB);
    bs_conn *pend = NULL;
    struct pollfd *pf = malloc(((size_t)n + 1) * sizeof *pf);
    int *pf_rank = malloc(((size_t)n + 1) * sizeof *pf_rank);
    size_t n_pend = 0, cap_pend = 0, pf_cap = (size_t)n + 1;
    int joined = 0, acked = 0, cut_short = 0, foreign = 0;
    if (!peer || !level || !reply || !pf || !pf_rank) {
        close(lfd);
        free(peer), free(level), free(reply), free(pf), free(pf_rank);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    }
    for (int r = 0; r < n; r++) peer[r].fd = -1;

    /* Phase 1: every rank's HELLO. The ranks that joined are watched too,
     * so that one that dies meanwhile stops the job now, not at the
     * deadline. */
    while (joined < n - 1) {
        int ms = ms_until(deadline);
        if (!ms) {
            status = MT_ERR_IO;
            fmt_ranks(list, sizeof list, level, n, 1);
            int k = snprintf(msg, sizeof msg, "timed out after %.3g s: %d of %d ranks joined; missing: %s",
                             now_s() - start, joined + 1, n, list);
            if (cut_short && k > 0 && (size_t)k < sizeof msg)
                k += snprintf(msg + k, sizeof msg - (size_t)k,
                              "; %d connection(s) closed before a whole greeting", cut_short);
            if (foreign && k > 0 && (size_t)k < sizeof msg)
                snprintf(msg + k, sizeof msg - (size_t)k, "; %d connection(s) were not this protocol", foreign);
            goto fail;
        }
        size_t np = 1 + n_pend + (size_t)joined;
        if (np > pf_cap) {
            struct pollfd *p2 = realloc(pf, np * sizeof *pf);
            int *r2 = p2 ? realloc(pf_rank, np * sizeof *pf_rank) : NULL;
            if (p2) pf = p2;
            if (r2) pf_rank = r2;
            if (!p2 || !r2) goto oom;
            pf_cap = np;
        }
        size_t k = 0;
        pf[k] = (struct pollfd){lfd, POLLIN, 0}, pf_rank[k++] = -1;
        for (size_t i = 0; i < n_pend; i++) pf[k] = (struct pollfd){pend[i].fd, POLLIN, 0}, pf_rank[k++] = -1;
        for (int r = 1; r < n; r++)
            if (level[r]) pf[k] = (struct pollfd){peer[r].fd, POLLIN, 0}, pf_rank[k++] = r;
        int ready = poll(pf, (nfds_t)k, ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) {
            status = MT_ERR_IO;
            snprintf(msg, sizeof msg, "poll failed: %s", strerror(errno));
            goto fail;
        }
        if (!ready) continue;

        /* The ranks that joined send nothing until they have the blob. */
        for (size_t i = 1 + n_pend; i < k; i++) {
            if (!pf[i].revents) continue;
            int r = pf_rank[i];
            char c;
            ssize_t got = recv(peer[r].fd, &c, 1, 0);
            if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            status = MT_ERR_IO;
            fmt_ranks(list, sizeof list, level, n, 1);
            /* most often its own timeout, when it started before rank 0:
             * the ranks still missing are then the news */
            if (got > 0)
                snprintf(msg, sizeof msg, "rank %d sent data it should not have before the blob", r);
            else
                snprintf(msg, sizeof msg,
                         "rank %d closed its connection before the blob was shared (it timed out or exited); %d of "
                         "%d ranks had joined; missing: %s",
                         r, joined + 1, n, list);
            goto fail;
        }

        /* The greetings as they come, a few bytes at a time if so. */
        for (size_t i = 0; i < n_pend; i++) {
            if (!pf[1 + i].revents) continue;
            bs_conn *p = &pend[i];
            ssize_t got = recv(p->fd, p->buf + p->got, HDR - p->got, 0);
            if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (got <= 0) { /* closed, or reset: not a rank of this job after all */
                cut_short++;
                close(p->fd), p->fd = -1;
                continue;
            }
            p->got += (size_t)got;
            if (p->got < HDR) continue;
            bs_msg m = msg_get(p->buf);
            if (m.magic != MT_BOOTSTRAP_TCP_MAGIC || m.kind != MT_BOOTSTRAP_HELLO) {
                foreign++;
                close(p->fd), p->fd = -1;
                continue;
            }
            int r = (int)m.rank;
            status = MT_ERR_INVALID_ARGUMENT;
            if (m.version != MT_BOOTSTRAP_VERSION)
                snprintf(msg, sizeof msg,
                         "rank %u speaks bootstrap protocol version %u, rank 0 speaks %u: the job mixes library "
                         "versions",
                         m.rank, m.version, MT_BOOTSTRAP_VERSION);
            else if (m.n_ranks != (uint32_t)n)
                snprintf(msg, sizeof msg, "ranks disagree on n_ranks: rank 0 has %d, rank %u has %u", n, m.rank,
                         m.n_ranks);
            else if (m.rank == 0 || m.rank >= (uint32_t)n)
                snprintf(msg, sizeof msg, "a process says it is rank %u, where rank 0 expects ranks 1 to %d", m.rank,
                         n - 1);
            else if (m.blob_len != len)
                snprintf(msg, sizeof msg, "ranks disagree on the blob length: rank 0 has %zu bytes, rank %u has %u",
                         len, m.rank, m.blob_len);
            else if (level[r])
                snprintf(msg, sizeof msg, "two processes say they are rank %d", r);
            else
                status = MT_OK;
            if (status) {
                offender = p->fd, p->fd = -1;
                goto fail;
            }
            peer[r].fd = p->fd, p->fd = -1;
            level[r] = 1;
            joined++;
        }
        size_t kept = 0; /* drop the entries that joined or were closed */
        for (size_t i = 0; i < n_pend; i++)
            if (pend[i].fd >= 0) pend[kept++] = pend[i];
        n_pend = kept;

        /* New connections: all that wait, without blocking. */
        if (pf[0].revents & POLLIN) {
            for (;;) {
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) {
                    if (errno == EINTR || errno == ECONNABORTED) continue;
                    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                    status = MT_ERR_IO;
                    snprintf(msg, sizeof msg, "cannot accept a connection on port %d: %s", in->port_num,
                             strerror(errno));
                    goto fail;
                }
                if (n_pend == cap_pend) {
                    size_t c2 = cap_pend ? 2 * cap_pend : 16;
                    bs_conn *p2 = realloc(pend, c2 * sizeof *pend);
                    if (!p2) {
                        close(fd);
                        goto oom;
                    }
                    pend = p2, cap_pend = c2;
                }
                pend[n_pend++] = (bs_conn){.fd = fd};
            }
        }
    }

    /* Phase 2: the blob to every rank. It fits a socket's buffer, so these
     * sends complete at once unless a peer is gone. */
    memcpy(reply + HDR, blob, len);
    for (int r = 1; r < n; r++) {
        msg_put(reply, MT_BOOTSTRAP_BLOB, r, n, len, MT_OK, len);
        if (send_all(peer[r].fd, reply, HDR + len, deadline) != 0) {
            status = MT_ERR_IO;
            snprintf(msg, sizeof msg, "cannot send the blob to rank %d: %s", r,
                     errno == ETIMEDOUT ? "timed out" : strerror(errno));
            goto fail;
        }
    }

    /* Phase 3: every rank's ACK, after which each has the blob. */
    while (acked < n - 1) {
        int ms = ms_until(deadline);
        if (!ms) {
            status = MT_ERR_IO;
            fmt_ranks(list, sizeof list, level, n, 2);
            snprintf(msg, sizeof msg, "timed out after %.3g s: ranks %s did not acknowledge the blob",
                     now_s() - start, list);
            goto fail;
        }
        size_t k = 0;
        for (int r = 1; r < n; r++)
            if (level[r] == 1) pf[k] = (struct pollfd){peer[r].fd, POLLIN, 0}, pf_rank[k++] = r;
        int ready = poll(pf, (nfds_t)k, ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) {
            status = MT_ERR_IO;
            snprintf(msg, sizeof msg, "poll failed: %s", strerror(errno));
            goto fail;
        }
        for (size_t i = 0; i < k && ready > 0; i++) {
            if (!pf[i].revents) continue;
            bs_conn *p = &peer[pf_rank[i]];
            ssize_t got = recv(p->fd, p->buf + p->got, HDR - p->got, 0);
            if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (got <= 0) {
                status = MT_ERR_IO;
                snprintf(msg, sizeof msg, "rank %d closed its connection before acknowledging the blob%s%s",
                         pf_rank[i], got < 0 ? ": " : "", got < 0 ? strerror(errno) : "");
                goto fail;
            }
            p->got += (size_t)got;
            if (p->got < HDR) continue;
            bs_msg m = msg_get(p->buf);
            if (m.magic != MT_BOOTSTRAP_TCP_MAGIC || m.kind != MT_BOOTSTRAP_ACK || m.rank != (uint32_t)pf_rank[i]) {
                status = MT_ERR_IO;
                snprintf(msg, sizeof msg, "rank %d sent a malformed acknowledgement", pf_rank[i]);
                goto fail;
            }
            level[pf_rank[i]] = 2;
            acked++;
        }
    }
    goto done;

oom:
    status = MT_ERR_OUT_OF_HOST_MEMORY;
    snprintf(msg, sizeof msg, "out of memory");
fail: {
    /* Every rank that joined, and the one at fault, learn why at once
     * rather than at their deadline. */
    double until = now_s() + 0.2;
    if (offender >= 0) send_error(offender, -1, n, len, status, msg, until);
    for (int r = 1; r < n; r++)
        if (peer[r].fd >= 0) send_error(peer[r].fd, r, n, len, status, msg, until);
    mt_fail(err, status, "%s", msg);
}
done:
    if (offender >= 0) close(offender);
    for (int r = 1; r < n; r++)
        if (peer[r].fd >= 0) close(peer[r].fd);
    for (size_t i = 0; i < n_pend; i++)
        if (pend[i].fd >= 0) close(pend[i].fd);
    close(lfd);
    free(peer), free(level), free(reply), free(pend), free(pf), free(pf_rank);
    return status;
}

/* ---------------------------------------------------------------- entry */

mt_status mt_bootstrap_share(mt_err err, const char *init, int rank, int n_ranks, void *blob, size_t len,
                             double timeout_s)
{
    double start = now_s();
    bs_init *in = malloc(sizeof *in);
    if (!in) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "bootstrap: out of memory");
    mt_status st = parse_init(err, init, in);
    if (st) goto out;
    st = MT_ERR_INVALID_ARGUMENT;
    if (n_ranks < 1 || n_ranks > MT_BOOTSTRAP_MAX_RANKS)
        mt_fail(err, st, "bootstrap: n_ranks %d is outside [1, %d]", n_ranks, MT_BOOTSTRAP_MAX_RANKS);
    else if (rank < 0 || rank >= n_ranks)
        mt_fail(err, st, "bootstrap: rank %d is outside [0, %d): ranks count from 0 to n_ranks - 1", rank, n_ranks);
    else if (len > MT_BOOTSTRAP_MAX_BLOB)
        mt_fail(err, st, "bootstrap: a blob of %zu bytes is more than the %d bytes this bootstrap carries", len,
                MT_BOOTSTRAP_MAX_BLOB);
    else if (len && !blob)
        mt_fail(err, st, "bootstrap: the blob is NULL and its length %zu", len);
    else if (!(timeout_s > 0) || !isfinite(timeout_s))
        mt_fail(err, st, "bootstrap: the timeout %g s is not a positive finite number of seconds", timeout_s);
    else
        st = MT_OK;
    if (st || n_ranks == 1) goto out; /* one rank: it has the blob already */

    /* The methods write their messages here; the one returned names the
     * rank and the init string, as a job's logs interleave many ranks. */
    char msg[MT_ERRMSG_MAX] = "";
    mt_err inner = {msg};
    double deadline = start + timeout_s;
    if (in->method == METHOD_FILE) {
        st = check_dir(inner, in->path);
        if (!st)
            st = rank == 0 ? file_rank0(inner, in, n_ranks, blob, len, start, deadline)
                           : file_rank(inner, in, rank, n_ranks, blob, len, start, deadline);
    } else {
        st = rank == 0 ? tcp_rank0(inner, in, n_ranks, blob, len, start, deadline)
                       : tcp_rank(inner, in, rank, n_ranks, blob, len, start, deadline);
    }
    if (st) mt_fail(err, st, "bootstrap (rank %d of %d, %.200s): %s", rank, n_ranks, init, msg);
out:
    free(in);
    return st;
}
