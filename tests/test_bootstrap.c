/* The bootstrap of a multi-process job (src/dist/bootstrap.h), between real
 * processes of this machine: every rank gets rank 0's bytes bit for bit over
 * a shared file and over TCP (IPv4 and IPv6), the call is a barrier, and
 * each way it can go wrong (bad init strings and ranks, ranks that
 * disagree, timeouts, a port in use, an unreachable host, a missing
 * directory, files left by earlier jobs, truncated or foreign messages,
 * peers that close early) ends within its timeout with a message naming the
 * problem.
 *
 * Each rank is a forked child that sends its result back through a pipe and
 * is reaped; fake peers (a rank 0 or a rank that misbehaves) speak the wire
 * and file formats documented in bootstrap.h, written here independently.
 * Every test works in a fresh directory under /tmp that the suite's .fini
 * removes; the tests of successful jobs check that the bootstrap itself
 * left nothing in it. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/bootstrap.h"

enum { MAX_RANKS = 8, BLOB = 128 };
#define LONG 20.0   /* the timeout of jobs that succeed: they end as soon as every rank has the blob */
#define SHORT 0.25  /* the timeout of jobs that must fail by timing out */
#define QUICK 1.5   /* a failure that is not a timeout comes well before this */

/* ---- a temporary directory per test ------------------------------------- */

static char tmp_dir[64];

static void make_tmp_dir(void)
{
    strcpy(tmp_dir, "/tmp/mt_boot_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp failed");
}

/* Files the bootstrap left in the directory (not counting `except`), each
 * removed; returns how many. */
static int sweep(const char *except)
{
    int left = 0;
    DIR *d = opendir(tmp_dir);
    if (!d) return 0;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (except && !strcmp(e->d_name, except)) continue;
        snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
        if (rmdir(p) != 0) unlink(p);
        left++;
    }
    closedir(d);
    return left;
}

static void remove_tmp_dir(void)
{
    if (!tmp_dir[0]) return;
    sweep(NULL);
    rmdir(tmp_dir);
    tmp_dir[0] = '\0';
}

TestSuite(bootstrap, .init = make_tmp_dir, .fini = remove_tmp_dir);

static const char *tmp_path(char *buf, const char *name)
{
    snprintf(buf, 256, "%s/%s", tmp_dir, name);
    return buf;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- helpers ------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void random_bytes(void *p, size_t n)
{
    cr_assert_eq(getrandom(p, n, 0), (ssize_t)n);
}

/* A TCP port nothing listens on now: the kernel's pick for port 0. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static int have_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* ---- ranks as processes -------------------------------------------------- */

typedef struct result {
    int status;
    double t_start, t_end; /* CLOCK_MONOTONIC: one clock for every process of the machine */
    char msg[MT_ERRMSG_MAX];
    uint8_t blob[MT_BOOTSTRAP_MAX_BLOB];
} result;

/* One rank of a job: started after `delay` s, with its own view of n_ranks
 * and of the blob length (to make ranks disagree). */
typedef struct rank_spec {
    int run;
    int n_ranks;
    size_t len;
    double delay, timeout;
} rank_spec;

typedef struct child {
    pid_t pid;
    int fd;
} child;

static void write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) _exit(90);
        c += k, n -= (size_t)k;
    }
}

/* One call of the bootstrap, timed; blob: rank 0's bytes, 0xEE elsewhere. */
static void call_rank(result *res, const char *init, int rank, const rank_spec *s, const uint8_t *blob0)
{
    uint8_t blob[MT_BOOTSTRAP_MAX_BLOB];
    if (rank == 0)
        memcpy(blob, blob0, s->len);
    else
        memset(blob, 0xEE, sizeof blob);
    memset(res, 0, sizeof *res);
    mt_err e = {res->msg};
    res->t_start = now_s();
    res->status = mt_bootstrap_share(e, init, rank, s->n_ranks, blob, s->len, s->timeout);
    res->t_end = now_s();
    memcpy(res->blob, blob, s->len);
}

static child spawn(const char *init, int rank, const rank_spec *s, const uint8_t *blob0)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        static result res; /* the child's: no heap, so nothing to free before _exit */
        sleep_s(s->delay);
        call_rank(&res, init, rank, s, blob0);
        write_all(p[1], &res, sizeof res);
        _exit(0);
    }
    close(p[1]);
    return (child){pid, p[0]};
}

/* The child's result (status -1000 if it sent none) and its exit. */
static void collect(child c, result *res)
{
    size_t got = 0;
    while (got < sizeof *res) {
        ssize_t k = read(c.fd, (char *)res + got, sizeof *res - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(c.fd);
    int st = 0;
    while (waitpid(c.pid, &st, 0) < 0 && errno == EINTR) {}
    if (got != sizeof *res || !WIFEXITED(st) || WEXITSTATUS(st)) {
        memset(res, 0, sizeof *res);
        res->status = -1000;
        snprintf(res->msg, sizeof res->msg, "the rank's process failed (wait status %d, %zu bytes)", st, got);
    }
}

/* Runs the ranks of one job (those with run set) as processes and waits for
 * them all. */
static void run_job(const char *init, int n, const rank_spec *spec, const uint8_t *blob0, result *res)
{
    child c[MAX_RANKS];
    for (int r = 0; r < n; r++)
        if (spec[r].run) c[r] = spawn(init, r, &spec[r], blob0);
    for (int r = 0; r < n; r++)
        if (spec[r].run) collect(c[r], &res[r]);
}

static void uniform(rank_spec *spec, int n, size_t len, double timeout)
{
    for (int r = 0; r < MAX_RANKS; r++)
        spec[r] = (rank_spec){.run = r < n, .n_ranks = n, .len = len, .delay = 0, .timeout = timeout};
}

static void tcp_init(char *buf, size_t size, const char *host, int port)
{
    snprintf(buf, size, "tcp:%s:%d", host, port);
}

#define ASSERT_OK(res, r) cr_assert_eq((res)[r].status, MT_OK, "rank %d: %s", r, (res)[r].msg)
#define ASSERT_MSG(res, text) cr_assert(strstr((res).msg, text), "expected \"%s\" in: %s", text, (res).msg)

/* Every rank succeeded with rank 0's bytes, and none returned before the
 * last rank had begun its call: the bootstrap is a barrier. */
static void assert_shared(const result *res, int n, const uint8_t *blob0, size_t len)
{
    double last_start = 0;
    for (int r = 0; r < n; r++) last_start = res[r].t_start > last_start ? res[r].t_start : last_start;
    for (int r = 0; r < n; r++) {
        ASSERT_OK(res, r);
        cr_assert(!memcmp(res[r].blob, blob0, len), "rank %d holds rank 0's bytes", r);
        cr_assert_geq(res[r].t_end, last_start, "rank %d returned before the last rank had started", r);
    }
}

/* A whole TCP job on a free port of HOST; tries again on a port that another
 * process took meanwhile (the suite runs tests in parallel). */
static void run_tcp_job(const char *host_fmt, int n, const rank_spec *spec, const uint8_t *blob0, result *res)
{
    for (int attempt = 0;; attempt++) {
        char init[128];
        snprintf(init, sizeof init, host_fmt, free_port());
        run_job(init, n, spec, blob0, res);
        if (!(res[0].status == MT_ERR_IO && strstr(res[0].msg, "in use")) || attempt == 4) return;
    }
}

/* ---- jobs that succeed --------------------------------------------------- */

static void staggered(rank_spec *spec, int n)
{
    uniform(spec, n, BLOB, LONG);
    for (int r = 0; r < n; r++) spec[r].delay = (double)((r * 7 + 3) % 5) * 0.01; /* rank 0 is not always first */
}

Test(bootstrap, file_method_2_4_8_ranks, .timeout = 60)
{
    const int sizes[] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        int n = sizes[i];
        char path[256], init[300];
        snprintf(init, sizeof init, "file:%s", tmp_path(path, "job"));
        uint8_t blob[BLOB];
        random_bytes(blob, sizeof blob);
        rank_spec spec[MAX_RANKS];
        staggered(spec, n);
        result res[MAX_RANKS];
        run_job(init, n, spec, blob, res);
        assert_shared(res, n, blob, BLOB);
        cr_assert_eq(sweep(NULL), 0, "the bootstrap removed all its files (%d ranks)", n);
    }
}

Test(bootstrap, tcp_method_2_4_8_ranks, .timeout = 60)
{
    const int sizes[] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        int n = sizes[i];
        uint8_t blob[BLOB];
        random_bytes(blob, sizeof blob);
        rank_spec spec[MAX_RANKS];
        staggered(spec, n);
        result res[MAX_RANKS];
        run_tcp_job("tcp:127.0.0.1:%d", n, spec, blob, res);
        assert_shared(res, n, blob, BLOB);
    }
}

/* IPv6 in brackets, a host name, torch's spellings, the largest blob. */
Test(bootstrap, addresses_and_spellings, .timeout = 60)
{
    const char *tcp[] = {"tcp:[::1]:%d", "tcp:localhost:%d", "tcp://127.0.0.1:%d"};
    int v6 = have_ipv6_loopback();
    for (int i = 0; i < 3; i++) {
        if (i == 0 && !v6) continue; /* no IPv6 on this machine: the other spellings still run */
        uint8_t blob[MT_BOOTSTRAP_MAX_BLOB];
        random_bytes(blob, sizeof blob);
        rank_spec spec[MAX_RANKS];
        uniform(spec, 3, sizeof blob, LONG);
        result res[MAX_RANKS];
        run_tcp_job(tcp[i], 3, spec, blob, res);
        assert_shared(res, 3, blob, sizeof blob);
    }
    char path[256], init[300];
    snprintf(init, sizeof init, "file://%s", tmp_path(path, "job"));
    uint8_t blob[BLOB];
    random_bytes(blob, sizeof blob);
    rank_spec spec[MAX_RANKS];
    uniform(spec, 3, BLOB, LONG);
    result res[MAX_RANKS];
    run_job(init, 3, spec, blob, res);
    assert_shared(res, 3, blob, BLOB);
    cr_assert_eq(sweep(NULL), 0);
}

/* Rank 0 starting last (the others wait for its file or retry its port),
 * and a zero-length blob: a pure barrier that holds every rank until the
 * last one, 0.2 s late, arrives. */
static void late_ranks(int tcp)
{
    char path[256], init[300];
    snprintf(init, sizeof init, "file:%s", tmp_path(path, "job"));
    for (int barrier = 0; barrier < 2; barrier++) {
        uint8_t blob[BLOB];
        random_bytes(blob, sizeof blob);
        rank_spec spec[MAX_RANKS];
        uniform(spec, 4, barrier ? 0 : BLOB, LONG);
        spec[barrier ? 3 : 0].delay = 0.2;
        result res[MAX_RANKS];
        if (tcp)
            run_tcp_job("tcp:127.0.0.1:%d", 4, spec, blob, res);
        else
            run_job(init, 4, spec, blob, res);
        assert_shared(res, 4, blob, barrier ? 0 : BLOB);
        if (barrier)
            for (int r = 0; r < 4; r++)
                cr_assert_geq(res[r].t_end - res[3].t_start, 0.0, "rank %d waited for rank 3", r);
        cr_assert_eq(sweep(NULL), 0);
    }
}

Test(bootstrap, file_late_rank_0_and_barrier, .timeout = 60) { late_ranks(0); }
Test(bootstrap, tcp_late_rank_0_and_barrier, .timeout = 60) { late_ranks(1); }

Test(bootstrap, one_rank_needs_nobody)
{
    char path[256], init[300];
    snprintf(init, sizeof init, "file:%s", tmp_path(path, "job"));
    uint8_t blob[8] = {1, 2, 3, 4, 5, 6, 7, 8}, copy[8];
    memcpy(copy, blob, sizeof blob);
    char msg[MT_ERRMSG_MAX] = "";
    mt_err e = {msg};
    cr_assert_eq(mt_bootstrap_share(e, init, 0, 1, blob, sizeof blob, 1.0), MT_OK, "%s", msg);
    cr_assert_eq(mt_bootstrap_share(e, "tcp:127.0.0.1:1", 0, 1, blob, sizeof blob, 1.0), MT_OK, "%s", msg);
    cr_assert(!memcmp(blob, copy, sizeof blob));
    cr_assert_eq(sweep(NULL), 0, "a job of one rank writes no file");
}

/* Calls on several threads of one process, two jobs at once: no state is
 * shared between calls. */
typedef struct thread_arg {
    const char *init;
    int rank;
    uint8_t *blob;
    int status;
    char msg[MT_ERRMSG_MAX];
} thread_arg;

static void *thread_rank(void *p)
{
    thread_arg *a = p;
    mt_err e = {a->msg};
    a->status = mt_bootstrap_share(e, a->init, a->rank, 3, a->blob, BLOB, LONG);
    return NULL;
}

Test(bootstrap, threads_run_independent_jobs, .timeout = 60)
{
    char path[256], file_init[300], tcp_a[64], tcp_b[64];
    snprintf(file_init, sizeof file_init, "file:%s", tmp_path(path, "job"));
    tcp_init(tcp_a, sizeof tcp_a, "127.0.0.1", free_port());
    tcp_init(tcp_b, sizeof tcp_b, "localhost", free_port());
    const char *inits[3] = {file_init, tcp_a, tcp_b};
    uint8_t blobs[3][3][BLOB];
    thread_arg args[3][3];
    pthread_t th[3][3];
    for (int j = 0; j < 3; j++) {
        random_bytes(blobs[j][0], BLOB);
        for (int r = 0; r < 3; r++) {
            if (r) memset(blobs[j][r], 0, BLOB);
            args[j][r] = (thread_arg){.init = inits[j], .rank = r, .blob = blobs[j][r]};
            cr_assert_eq(pthread_create(&th[j][r], NULL, thread_rank, &args[j][r]), 0);
        }
    }
    for (int j = 0; j < 3; j++)
        for (int r = 0; r < 3; r++) cr_assert_eq(pthread_join(th[j][r], NULL), 0);
    for (int j = 0; j < 3; j++)
        for (int r = 0; r < 3; r++) {
            cr_assert_eq(args[j][r].status, MT_OK, "job %d rank %d: %s", j, r, args[j][r].msg);
            cr_assert(!memcmp(blobs[j][r], blobs[j][0], BLOB), "job %d rank %d", j, r);
        }
    cr_assert_eq(sweep(NULL), 0);
}

/* ---- refusals before any waiting ---------------------------------------- */

Test(bootstrap, bad_arguments_are_named)
{
    uint8_t blob[BLOB] = {0};
    static const struct {
        const char *init;
        int rank, n;
        size_t len;
        int null_blob;
        double timeout;
        const char *expect;
    } cases[] = {
        {NULL, 0, 2, BLOB, 0, 1, "init string is NULL"},
        {"", 0, 2, BLOB, 0, 1, "names no method"},
        {"/shared/job", 0, 2, BLOB, 0, 1, "names no method"},
        {"env://", 0, 2, BLOB, 0, 1, "unknown method 'env'"},
        {"file:", 0, 2, BLOB, 0, 1, "names no file"},
        {"file:/tmp/", 0, 2, BLOB, 0, 1, "names a directory"},
        {"tcp:node1", 0, 2, BLOB, 0, 1, "has no port"},
        {"tcp::29500", 0, 2, BLOB, 0, 1, "has no host"},
        {"tcp:node1:", 0, 2, BLOB, 0, 1, "bad port ''"},
        {"tcp:node1:0", 0, 2, BLOB, 0, 1, "bad port '0'"},
        {"tcp:node1:65536", 0, 2, BLOB, 0, 1, "bad port '65536'"},
        {"tcp:node1:29x0", 0, 2, BLOB, 0, 1, "bad port '29x0'"},
        {"tcp:node1:-1", 0, 2, BLOB, 0, 1, "bad port '-1'"},
        {"tcp:::1:29500", 0, 2, BLOB, 0, 1, "IPv6 address goes in brackets"},
        {"tcp:[::1:29500", 0, 2, BLOB, 0, 1, "does not close"},
        {"tcp:[::1]", 0, 2, BLOB, 0, 1, "has no port"},
        {"tcp:[]:29500", 0, 2, BLOB, 0, 1, "has no host"},
        {"tcp:node1:29500", 2, 2, BLOB, 0, 1, "rank 2 is outside [0, 2)"},
        {"tcp:node1:29500", -1, 2, BLOB, 0, 1, "rank -1 is outside [0, 2)"},
        {"tcp:node1:29500", 0, 0, BLOB, 0, 1, "n_ranks 0 is outside"},
        {"tcp:node1:29500", 0, 2, MT_BOOTSTRAP_MAX_BLOB + 1, 0, 1, "4097 bytes is more than"},
        {"tcp:node1:29500", 0, 2, BLOB, 1, 1, "blob is NULL"},
        {"tcp:node1:29500", 0, 2, BLOB, 0, 0, "timeout 0 s"},
        {"tcp:node1:29500", 0, 2, BLOB, 0, -1, "timeout -1 s"},
        {"tcp:node1:29500", 0, 2, BLOB, 0, INFINITY, "timeout inf s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[MT_ERRMSG_MAX] = "";
        mt_err e = {msg};
        mt_status st = mt_bootstrap_share(e, cases[i].init, cases[i].rank, cases[i].n,
                                          cases[i].null_blob ? NULL : blob, cases[i].len, cases[i].timeout);
        cr_assert_eq(st, MT_ERR_INVALID_ARGUMENT, "case %zu (%s): %s", i, cases[i].init, msg);
        cr_assert(strstr(msg, cases[i].expect), "case %zu: expected \"%s\" in: %s", i, cases[i].expect, msg);
        if (i < 17) { /* the init strings alone */
            msg[0] = '\0';
            cr_assert_eq(mt_bootstrap_check_init(e, cases[i].init), MT_ERR_INVALID_ARGUMENT, "case %zu", i);
            cr_assert(strstr(msg, cases[i].expect), "case %zu: %s", i, msg);
        }
    }
    char msg[MT_ERRMSG_MAX];
    mt_err e = {msg};
    cr_assert_eq(mt_bootstrap_check_init(e, "tcp:[fe80::1%eth0]:29500"), MT_OK, "%s", msg);
    cr_assert_eq(mt_bootstrap_check_init(e, "tcp://node-7.cluster:65535"), MT_OK, "%s", msg);
    cr_assert_eq(mt_bootstrap_check_init(e, "file:relative/job"), MT_OK, "%s", msg);
    cr_assert_eq(sweep(NULL), 0);
}

Test(bootstrap, file_directory_must_exist)
{
    char path[256], init[300], msg[MT_ERRMSG_MAX];
    mt_err e = {msg};
    uint8_t blob[BLOB] = {0};
    snprintf(init, sizeof init, "file:%s/no/such/dir/job", tmp_dir);
    for (int rank = 0; rank < 2; rank++) {
        double t0 = now_s();
        cr_assert_eq(mt_bootstrap_share(e, init, rank, 2, blob, BLOB, 5.0), MT_ERR_IO);
        cr_assert(strstr(msg, "/no/such/dir of the file") && strstr(msg, "does not exist"), "%s", msg);
        cr_assert(strstr(msg, "rank 1 of 2") || rank == 0, "the message names the rank: %s", msg);
        cr_assert_lt(now_s() - t0, QUICK, "said at once, not at the timeout");
    }
    /* a "directory" that is a file */
    int fd = open(tmp_path(path, "plain"), O_CREAT | O_WRONLY, 0600);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(init, sizeof init, "file:%s/plain/job", tmp_dir);
    cr_assert_eq(mt_bootstrap_share(e, init, 1, 2, blob, BLOB, 5.0), MT_ERR_IO);
    cr_assert(strstr(msg, "is not a directory"), "%s", msg);
}

/* ---- timeouts ------------------------------------------------------------ */

/* Ranks 1 and 3 of 4 never come. When rank 0's timeout comes first, it
 * says how many joined and which are missing, and rank 2 hears it at once.
 * When rank 2's comes first, rank 0 stops then, not at its own timeout,
 * with the same list: it never takes a rank that gave up for one that has
 * the blob. Either way no rank file stays. */
static void missing_ranks(int tcp, int rank2_first)
{
    char path[256], init[300];
    snprintf(init, sizeof init, "file:%s", tmp_path(path, "job"));
    if (tcp) tcp_init(init, sizeof init, "127.0.0.1", free_port());
    rank_spec spec[MAX_RANKS];
    uniform(spec, 4, BLOB, SHORT);
    spec[1].run = spec[3].run = 0;
    spec[rank2_first ? 0 : 2].timeout = 5.0;
    uint8_t blob[BLOB];
    random_bytes(blob, sizeof blob);
    result res[MAX_RANKS];
    run_job(init, 4, spec, blob, res);
    for (int r = 0; r < 4; r += 2) {
        cr_assert_eq(res[r].status, MT_ERR_IO, "rank %d: %s", r, res[r].msg);
        cr_assert_lt(res[r].t_end - res[r].t_start, SHORT + QUICK, "rank %d ends at the first timeout", r);
    }
    ASSERT_MSG(res[0], "bootstrap (rank 0 of 4, ");
    ASSERT_MSG(res[0], "2 of 4 ranks");
    ASSERT_MSG(res[0], "joined; missing: 1, 3");
    if (rank2_first) {
        ASSERT_MSG(res[0], tcp ? "rank 2 closed its connection" : "rank 2 gave up");
        ASSERT_MSG(res[2], "timed out after");
    } else {
        ASSERT_MSG(res[0], "timed out after");
        ASSERT_MSG(res[2], "rank 0 stopped the job: timed out after");
        ASSERT_MSG(res[2], "missing: 1, 3");
    }
    for (int i = 0; i < BLOB; i++) cr_assert_eq(res[2].blob[i], 0xEE, "a failing rank's blob is left alone");
    cr_assert(!exists(tmp_path(path, "job.rank2")) && !exists(tmp_path(path, "job.tmp")),
              "no rank file stays after a failure");
}

Test(bootstrap, file_timeout_names_missing_ranks, .timeout = 30)
{
    missing_ranks(0, 0);
    missing_ranks(0, 1);
}

Test(bootstrap, tcp_timeout_names_missing_ranks, .timeout = 30)
{
    missing_ranks(1, 0);
    missing_ranks(1, 1);
}

/* ---- ranks that disagree ------------------------------------------------- */

/* Rank 2 thinks the job has 4 ranks, or rank 1 that the blob has 64 bytes:
 * rank 0 stops the job at once, names the disagreement, and the rank at
 * fault hears it with the same status. */
static void disagreement(int tcp, int on_length)
{
    char path[256], init[300];
    snprintf(init, sizeof init, "file:%s", tmp_path(path, "job"));
    if (tcp) tcp_init(init, sizeof init, "127.0.0.1", free_port());
    rank_spec spec[MAX_RANKS];
    uniform(spec, 3, BLOB, 2.0);
    int bad = on_length ? 1 : 2;
    if (on_length)
        spec[1].len = 64;
    else
        spec[2].n_ranks = 4;
    spec[0].delay = 0.05; /* the others are already there */
    uint8_t blob[BLOB];
    random_bytes(blob, sizeof blob);
    result res[MAX_RANKS];
    run_job(init, 3, spec, blob, res);
    const char *what = on_length ? "ranks disagree on the blob length: rank 0 has 128 bytes, rank 1 has 64"
                                 : "ranks disagree on n_ranks: rank 0 has 3, rank 2 has 4";
    cr_assert_eq(res[0].status, MT_ERR_INVALID_ARGUMENT, "%s", res[0].msg);
    ASSERT_MSG(res[0], what);
    cr_assert_lt(res[0].t_end - res[0].t_start, QUICK, "found at once: %s", res[0].msg);
    cr_assert_eq(res[bad].status, MT_ERR_INVALID_ARGUMENT, "%s", res[bad].msg);
    ASSERT_MSG(res[bad], "rank 0 stopped the job");
    ASSERT_MSG(res[bad], what);
    int good = 3 - bad;
    cr_assert_neq(res[good].status, MT_OK, "rank %d does not go on alone: %s", good, res[good].msg);
    cr_assert(!exists(tmp_path(path, "job.rank1")) && !exists(tmp_path(path, "job.rank2")));
}

Test(bootstrap, file_ranks_disagree_on_n_ranks, .timeout = 30) { disagreement(0, 0); }
Test(bootstrap, file_ranks_disagree_on_length, .timeout = 30) { disagreement(0, 1); }
Test(bootstrap, tcp_ranks_disagree_on_n_ranks, .timeout = 30) { disagreement(1, 0); }
Test(bootstrap, tcp_ranks_disagree_on_length, .timeout = 30) { disagreement(1, 1); }

/* ---- TCP: ports and hosts ------------------------------------------------ */

static int listen_on(int family, int port)
{
    int fd = socket(family, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    int rc;
    if (family == AF_INET) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        a.sin6_addr = in6addr_any;
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    cr_assert_eq(rc, 0, "bind: %s", strerror(errno));
    cr_assert_eq(listen(fd, 8), 0);
    return fd;
}

static int port_of(int fd)
{
    struct sockaddr_storage s;
    socklen_t len = sizeof s;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&s, &len), 0);
    return ntohs(s.ss_family == AF_INET ? ((struct sockaddr_in *)&s)->sin_port
                                         : ((struct sockaddr_in6 *)&s)->sin6_port);
}

Test(bootstrap, tcp_port_in_use)
{
    uint8_t blob[BLOB] = {0};
    char init[64], msg[MT_ERRMSG_MAX];
    mt_err e = {msg};
    for (int v6 = 0; v6 < 2; v6++) {
        if (v6 && !have_ipv6_loopback()) continue;
        int occupant = listen_on(v6 ? AF_INET6 : AF_INET, 0); /* another program holds the port */
        tcp_init(init, sizeof init, "127.0.0.1", port_of(occupant));
        double t0 = now_s();
        cr_assert_eq(mt_bootstrap_share(e, init, 0, 2, blob, BLOB, 5.0), MT_ERR_IO, "%s", msg);
        cr_assert(strstr(msg, "is in use on this host"), "%s", msg);
        cr_assert_lt(now_s() - t0, QUICK);
        close(occupant);
    }
}

Test(bootstrap, tcp_unreachable_rank_0, .timeout = 30)
{
    uint8_t blob[BLOB] = {0};
    char init[64], msg[MT_ERRMSG_MAX];
    mt_err e = {msg};
    /* nothing listens on the port */
    tcp_init(init, sizeof init, "127.0.0.1", free_port());
    double t0 = now_s();
    cr_assert_eq(mt_bootstrap_share(e, init, 1, 2, blob, BLOB, SHORT), MT_ERR_IO);
    cr_assert(strstr(msg, "could not connect to rank 0 at 127.0.0.1:") && strstr(msg, "nothing listens there"), "%s",
              msg);
    cr_assert_lt(now_s() - t0, SHORT + QUICK);
    /* an address of the documentation range (TEST-NET-1), routed nowhere:
     * refused at once where there is no route, silence elsewhere */
    t0 = now_s();
    cr_assert_eq(mt_bootstrap_share(e, "tcp:192.0.2.1:29500", 1, 2, blob, BLOB, SHORT), MT_ERR_IO);
    cr_assert(strstr(msg, "could not connect to rank 0 at 192.0.2.1:29500"), "%s", msg);
    cr_assert_lt(now_s() - t0, SHORT + QUICK);
}

/* ---- TCP: peers that misbehave ------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void tcp_msg(uint8_t *b, uint32_t magic, uint32_t version, uint32_t kind, uint32_t rank, uint32_t n,
                    uint32_t len, uint32_t payload)
{
    const uint32_t v[8] = {magic, version, kind, rank, n, len, 0, payload};
    for (int i = 0; i < 8; i++) put32(b + 4 * i, v[i]);
}

/* A fake rank 0: takes one connection and sends `n` bytes of `reply`, then
 * (wait_s later) closes. Runs in a child; returns its pid. */
static pid_t fake_rank0(int lfd, const uint8_t *reply, size_t n, double wait_s)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid) return pid;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) _exit(1);
    uint8_t hello[32];
    size_t got = 0;
    while (got < sizeof hello) {
        ssize_t k = read(fd, hello + got, sizeof hello - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    if (n) write_all(fd, reply, n);
    sleep_s(wait_s);
    close(fd);
    close(lfd);
    _exit(0);
}

static void reap(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
}

Test(bootstrap, tcp_rank_0_that_misbehaves, .timeout = 30)
{
    uint8_t blob[BLOB] = {0}, reply[64];
    char init[64], msg[MT_ERRMSG_MAX];
    mt_err e = {msg};
    static const struct {
        int what;
        size_t n;
        const char *expect;
    } cases[] = {
        {0, 10, "closed the connection after 10 of the 32 bytes of its reply"},
        {1, 32, "is not a bootstrap rank 0"},
        {2, 37, "sent 5 of the 128 bytes of its blob: it closed the connection"},
        {3, 0, "waiting for rank 0 at 127.0.0.1:"},
        {4, 32, "speaks bootstrap protocol version 99"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(reply, 0x5a, sizeof reply);
        if (cases[i].what == 2 || cases[i].what == 4) /* a blob's header: of this version, or of 99 */
            tcp_msg(reply, MT_BOOTSTRAP_TCP_MAGIC, cases[i].what == 2 ? MT_BOOTSTRAP_VERSION : 99, MT_BOOTSTRAP_BLOB, 1,
                    2, BLOB, BLOB);
        int lfd = listen_on(AF_INET, 0);
        tcp_init(init, sizeof init, "127.0.0.1", port_of(lfd));
        pid_t pid = fake_rank0(lfd, reply, cases[i].n, cases[i].what == 3 ? 2 * SHORT : 0);
        close(lfd);
        double t0 = now_s();
        mt_status st = mt_bootstrap_share(e, init, 1, 2, blob, BLOB, cases[i].what == 3 ? SHORT : 5.0);
        double took = now_s() - t0;
        reap(pid);
        cr_assert_neq(st, MT_OK, "case %zu", i);
        cr_assert(strstr(msg, cases[i].expect), "case %zu: expected \"%s\" in: %s", i, cases[i].expect, msg);
        cr_assert_lt(took, QUICK + SHORT, "case %zu", i);
        cr_assert_eq(blob[0], 0, "a failing rank's blob is left alone");
    }
}

/* A fake rank > 0: connects to rank 0 (retrying until it listens), sends
 * `n` bytes, reads `read_n` bytes, waits, closes. Runs in a child. */
static pid_t fake_rank(int port, const uint8_t *msg, size_t n, size_t read_n, double wait_s)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid) return pid;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = -1;
    for (int i = 0; i < 1000 && fd < 0; i++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd), fd = -1;
            sleep_s(0.005);
        }
    }
    if (fd < 0) _exit(1);
    write_all(fd, msg, n);
    uint8_t buf[256];
    size_t got = 0;
    while (got < read_n) {
        ssize_t k = read(fd, buf, MT_MIN(sizeof buf, read_n - got));
        if (k <= 0) break;
        got += (size_t)k;
    }
    sleep_s(wait_s);
    close(fd);
    _exit(0);
}

Test(bootstrap, tcp_ranks_that_misbehave, .timeout = 30)
{
    uint8_t blob[BLOB], hello[32], junk[32], old[32];
    random_bytes(blob, sizeof blob);
    memset(junk, 'x', sizeof junk);
    tcp_msg(hello, MT_BOOTSTRAP_TCP_MAGIC, MT_BOOTSTRAP_VERSION, MT_BOOTSTRAP_HELLO, 1, 0, BLOB, 0);
    tcp_msg(old, MT_BOOTSTRAP_TCP_MAGIC, 99, MT_BOOTSTRAP_HELLO, 1, 3, BLOB, 0);
    char init[64], msg[MT_ERRMSG_MAX];
    mt_err e = {msg};
    static const struct {
        int n_ranks;    /* of the job */
        int what;       /* 0 cut short, 1 junk, 2 hello then close, 3 no ack, 4 twice rank 1, 5 version */
        double timeout;
        const char *expect[2];
    } cases[] = {
        {2, 0, SHORT, {"1 of 2 ranks joined; missing: 1", "1 connection(s) closed before a whole greeting"}},
        {2, 1, SHORT, {"1 of 2 ranks joined; missing: 1", "1 connection(s) were not this protocol"}},
        {3, 2, 5.0, {"rank 1 closed its connection before the blob was shared", "2 of 3 ranks had joined"}},
        {2, 3, 5.0, {"rank 1 closed its connection before acknowledging the blob", ""}},
        {3, 4, 5.0, {"two processes say they are rank 1", ""}},
        {3, 5, 5.0, {"rank 1 speaks bootstrap protocol version 99", "mixes library versions"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = cases[i].n_ranks, what = cases[i].what;
        put32(hello + 16, (uint32_t)n);
        int port = free_port();
        tcp_init(init, sizeof init, "127.0.0.1", port);
        pid_t pids[2] = {-1, -1};
        if (what == 0) pids[0] = fake_rank(port, hello, 10, 0, 0);
        if (what == 1) pids[0] = fake_rank(port, junk, 32, 0, 0);
        if (what == 2) pids[0] = fake_rank(port, hello, 32, 0, 0.05);
        if (what == 3) pids[0] = fake_rank(port, hello, 32, 32 + BLOB, 0);
        if (what == 4) pids[0] = fake_rank(port, hello, 32, 0, 0.3), pids[1] = fake_rank(port, hello, 32, 0, 0.3);
        if (what == 5) pids[0] = fake_rank(port, old, 32, 0, 0);
        double t0 = now_s();
        mt_status st = mt_bootstrap_share(e, init, 0, n, blob, BLOB, cases[i].timeout);
        double took = now_s() - t0;
        for (int k = 0; k < 2; k++)
            if (pids[k] > 0) reap(pids[k]);
        cr_assert_neq(st, MT_OK, "case %zu", i);
        for (int k = 0; k < 2; k++)
            cr_assert(strstr(msg, cases[i].expect[k]), "case %zu: expected \"%s\" in: %s", i, cases[i].expect[k], msg);
        cr_assert_lt(took, cases[i].timeout < 1 ? SHORT + QUICK : QUICK, "case %zu ends %s", i,
                     cases[i].timeout < 1 ? "at its timeout" : "at once");
    }
}

/* ---- files left by earlier jobs ------------------------------------------ */

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* A file as bootstrap.h describes it, as an earlier job would have left it. */
static void write_job_file(const char *path, uint32_t kind, uint32_t rank, uint32_t n, const uint8_t nonce[16],
                           const void *payload, uint32_t payload_len, size_t keep)
{
    uint8_t buf[MT_BOOTSTRAP_FILE_HEADER + MT_BOOTSTRAP_MAX_BLOB] = {0};
    memcpy(buf, MT_BOOTSTRAP_FILE_MAGIC, 8);
    put32(buf + 8, MT_BOOTSTRAP_VERSION);
    put32(buf + 12, kind);
    put32(buf + 16, rank);
    put32(buf + 20, n);
    put32(buf + 24, BLOB);
    put32(buf + 28, payload_len);
    memcpy(buf + 32, nonce, 16);
    put32(buf + 48, kind == MT_BOOTSTRAP_ABORTED ? MT_ERR_IO : 0);
    if (payload_len) memcpy(buf + 64, payload, payload_len);
    uint64_t h = fnv1a(fnv1a(0xcbf29ce484222325ull, buf, 56), buf + 64, payload_len);
    for (int i = 0; i < 8; i++) buf[56 + i] = (uint8_t)(h >> (8 * i));
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    cr_assert_geq(fd, 0);
    size_t len = 64 + payload_len;
    cr_assert_eq(write(fd, buf, keep && keep < len ? keep : len), (ssize_t)(keep && keep < len ? keep : len));
    close(fd);
}

/* One rank alone, facing whatever is in the directory: it must not return
 * with a blob. */
static void lone_rank(const char *init, int rank, result *res)
{
    rank_spec spec = {.run = 1, .n_ranks = 3, .len = BLOB, .timeout = SHORT};
    child c = spawn(init, rank, &spec, (const uint8_t[BLOB]){0});
    collect(c, res);
}

/* Then the real job, its ranks 1 and 2 first, so that they see the old file
 * before rank 0 replaces it: all get the new bytes. */
static void job_after(const char *init, const uint8_t *old_blob)
{
    uint8_t blob[BLOB];
    random_bytes(blob, sizeof blob);
    cr_assert(memcmp(blob, old_blob, BLOB));
    rank_spec spec[MAX_RANKS];
    uniform(spec, 3, BLOB, LONG);
    spec[0].delay = 0.1;
    result res[MAX_RANKS];
    run_job(init, 3, spec, blob, res);
    assert_shared(res, 3, blob, BLOB);
}

Test(bootstrap, file_left_by_earlier_jobs_is_never_taken, .timeout = 60)
{
    char path[256], ack[256], init[300];
    tmp_path(path, "job");
    tmp_path(ack, "job.rank1");
    snprintf(init, sizeof init, "file:%s", path);
    uint8_t nonce[16], old_blob[BLOB];
    random_bytes(nonce, sizeof nonce);
    random_bytes(old_blob, sizeof old_blob);
    result res;
    static const struct {
        uint32_t kind;
        size_t keep;
        const char *expect;
    } cases[] = {
        /* rank 0 died after publishing: rank 1 acknowledges, and waits for
         * a release that never comes */
        {MT_BOOTSTRAP_PUBLISHED, 0, "this rank acknowledged"},
        /* rank 0 died after releasing: not a release this rank asked for */
        {MT_BOOTSTRAP_RELEASED, 0, "left from an earlier job"},
        {MT_BOOTSTRAP_ABORTED, 0, "holds the failure of a job this rank did not join"},
        {MT_BOOTSTRAP_PUBLISHED, 100, "not whole"},
        {0, 0, "without the bootstrap magic"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].kind == MT_BOOTSTRAP_ABORTED)
            write_job_file(path, cases[i].kind, 0, 3, nonce, "an old failure", 14, 0);
        else if (cases[i].kind)
            write_job_file(path, cases[i].kind, 0, 3, nonce, old_blob, BLOB, cases[i].keep);
        else {
            FILE *f = fopen(path, "w");
            cr_assert_not_null(f);
            fputs("left by some other program\n", f);
            fclose(f);
        }
        lone_rank(init, 1, &res);
        cr_assert_eq(res.status, MT_ERR_IO, "case %zu: %s", i, res.msg);
        ASSERT_MSG(res, "timed out after");
        cr_assert(strstr(res.msg, cases[i].expect), "case %zu: expected \"%s\" in: %s", i, cases[i].expect, res.msg);
        cr_assert(memcmp(res.blob, old_blob, BLOB), "case %zu: the old blob was not handed out", i);
        /* where it acknowledged the old file, rank 1 leaves its file saying
         * that it gave up (no rank 0 of that job is left to read it); the
         * next job's rank 1 replaces it */
        cr_assert_eq(exists(ack), i == 0, "case %zu: rank 1's file", i);
        job_after(init, old_blob);
        cr_assert_eq(sweep(NULL), 0, "case %zu", i);
    }

    /* Acknowledgements left by an earlier job do not count for this one. */
    char ack2[256];
    write_job_file(ack, MT_BOOTSTRAP_ACK, 1, 3, nonce, NULL, 0, 0);
    write_job_file(tmp_path(ack2, "job.rank2"), MT_BOOTSTRAP_ACK, 2, 3, nonce, NULL, 0, 0);
    lone_rank(init, 0, &res);
    cr_assert_eq(res.status, MT_ERR_IO, "%s", res.msg);
    ASSERT_MSG(res, "1 of 3 ranks joined; missing: 1-2");
    job_after(init, old_blob); /* the ranks overwrite and remove them */
    cr_assert_eq(sweep(NULL), 0);
}

/* A rank 0 killed after publishing leaves its file: a later job's ranks do
 * not take its bytes. */
Test(bootstrap, file_of_a_killed_rank_0_is_never_taken, .timeout = 60)
{
    char path[256], init[300];
    snprintf(init, sizeof init, "file:%s", tmp_path(path, "job"));
    uint8_t old_blob[BLOB];
    random_bytes(old_blob, sizeof old_blob);
    rank_spec spec = {.run = 1, .n_ranks = 3, .len = BLOB, .timeout = LONG};
    child c = spawn(init, 0, &spec, old_blob);
    double t0 = now_s();
    while (!exists(path) && now_s() - t0 < 10) sleep_s(0.002);
    cr_assert(exists(path), "rank 0 published");
    kill(c.pid, SIGKILL);
    result res;
    collect(c, &res);
    cr_assert_eq(res.status, -1000, "killed");
    lone_rank(init, 2, &res);
    cr_assert_eq(res.status, MT_ERR_IO, "%s", res.msg);
    ASSERT_MSG(res, "this rank acknowledged");
    job_after(init, old_blob);
    cr_assert_eq(sweep(NULL), 0);
}
