/* Small file-system helpers shared by the readers and writers of model
 * folders and checkpoints: paths, whole small files, JSON files, directories,
 * complete writes and durable replacement of a file. */
#define _GNU_SOURCE
#include "io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define JSON_MAX_BYTES (64u << 20) /* a config.json or index larger than this is not one */
#define IO_CHUNK (1u << 20)        /* bytes per write() */

void mt_path_join(char *out, size_t size, const char *dir, const char *name)
{
    snprintf(out, size, "%s/%s", dir, name);
}

/* Reads a whole (small) file into a NUL-terminated buffer. */
mt_status mt_read_small_file(mt_err err, const char *path, char **out, size_t *len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_fail(err, MT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mt_fail(err, MT_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mt_fail(err, MT_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > JSON_MAX_BYTES) {
        close(fd);
        return mt_fail(err, MT_ERR_FORMAT, "%s is %lld bytes, too large for a JSON file of this kind", path,
                       (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory reading %s", path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return mt_fail(err, MT_ERR_IO, "cannot read %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return MT_OK;
}

cJSON *mt_json_parse(const char *text, size_t len, size_t *where)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t off = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
    if (j) { /* the value parsed: what follows it must be whitespace */
        while (off < len && (text[off] == ' ' || text[off] == '\t' || text[off] == '\n' || text[off] == '\r')) off++;
        if (off == len) return j;
        cJSON_Delete(j);
    }
    *where = off;
    return NULL;
}

/* "line L, column C" of byte off of text. */
static void json_where(char *out, size_t size, const char *text, size_t off)
{
    int line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') line++, col = 1;
        else col++;
    }
    snprintf(out, size, "line %d, column %d", line, col);
}

mt_status mt_parse_json_file(mt_err err, const char *path, cJSON **out)
{
    char *text = NULL;
    size_t len = 0, off;
    mt_status st = mt_read_small_file(err, path, &text, &len);
    if (st) return st;
    cJSON *j = mt_json_parse(text, len, &off);
    if (!j) {
        char where[64];
        json_where(where, sizeof where, text, off);
        free(text);
        return mt_fail(err, MT_ERR_FORMAT, "%s is not valid JSON (error near %s)", path, where);
    }
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return mt_fail(err, MT_ERR_FORMAT, "%s does not hold a JSON object", path);
    }
    *out = j;
    return MT_OK;
}

mt_status mt_mkdir_p(mt_err err, const char *dir)
{
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "bad directory name \"%s\"", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char save = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            return mt_fail(err, MT_ERR_IO, "cannot create directory %s: %s", p, strerror(e));
        }
        p[i] = save;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return mt_fail(err, MT_ERR_IO, "%s is not a directory", dir);
    return MT_OK;
}

int mt_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, MT_MIN(n, (size_t)IO_CHUNK));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

mt_status mt_sync_dir(mt_err err, const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return mt_fail(err, MT_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    int rc = fsync(dfd);
    int e = errno;
    close(dfd);
    if (rc) return mt_fail(err, MT_ERR_IO, "cannot sync directory %s: %s", dir, strerror(e));
    return MT_OK;
}

mt_status mt_write_file_atomic(mt_err err, const char *path, const void *data, size_t n)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return mt_fail(err, MT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    int rc = mt_write_all(fd, data, n);
    if (!rc) rc = fsync(fd);
    int e = errno;
    if (close(fd) != 0 && !rc) rc = -1, e = errno;
    if (!rc && rename(tmp, path) != 0) rc = -1, e = errno;
    if (rc) {
        unlink(tmp);
        return mt_fail(err, MT_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return MT_OK;
}

/* The pid a lock file names, or 0. */
static long lock_owner(int fd)
{
    char buf[32];
    const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const long pid = strtol(buf, NULL, 10);
    return pid > 0 ? pid : 0;
}

mt_status mt_lock_dir(mt_err err, const char *dir, int *fd_out)
{
    char path[4200];
    *fd_out = -1;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, MT_LOCK_NAME) >= sizeof path)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "path too long: %s", dir);
    for (int tries = 0;; tries++) {
        const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return mt_fail(err, MT_ERR_IO, "cannot create the lock %s: %s", path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int e = errno;
            long owner = lock_owner(fd);
            /* the holder writes its pid just after it takes the lock */
            for (int wait = 0; e == EWOULDBLOCK && !owner && wait < 100; wait++) {
                const struct timespec ms = {0, 10 * 1000 * 1000};
                nanosleep(&ms, NULL);
                owner = lock_owner(fd);
            }
            close(fd);
            if (e == EWOULDBLOCK && owner == (long)getpid()) return MT_OK; /* the caller's, around a whole run */
            if (e == EWOULDBLOCK)
                return mt_fail(err, MT_ERR_IO, "%s is in use by process %ld (its lock %s): one writer at a time", dir,
                               owner, path);
            return mt_fail(err, MT_ERR_IO, "cannot lock %s: %s", path, strerror(e));
        }
        /* the holder before us may have removed the file between our open and
         * our flock: then the lock is on a name no one else will open */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            char pid[32];
            const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
                const int e = errno;
                close(fd);
                return mt_fail(err, MT_ERR_IO, "cannot write the lock %s: %s", path, strerror(e));
            }
            *fd_out = fd;
            return MT_OK;
        }
        close(fd);
        if (tries == 100) return mt_fail(err, MT_ERR_IO, "cannot lock %s: it keeps being replaced", path);
    }
}

void mt_unlock_dir(const char *dir, int fd)
{
    if (fd < 0) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, MT_LOCK_NAME);
    unlink(path); /* while held: whoever opens the name next makes a new file */
    close(fd);
}
