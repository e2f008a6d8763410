/* What a command checks before it does any work: that no file it writes is
 * one it reads (by device and inode, so through links too), that its output
 * folders and files can be written and have room, and that no other run
 * writes them at the same time (an advisory lock, the library's checkpoint
 * lock: dir/.megatrain.lock, flock(2), the holder's pid). */
#define _GNU_SOURCE
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* ---- inputs and outputs -------------------------------------------------------------- */

static void add_one(cli_inputs *in, const char *path, const struct stat *sb, const char *what)
{
    if (in->n == in->cap) {
        in->cap = in->cap ? 2 * in->cap : 32;
        if (!(in->v = realloc(in->v, (size_t)in->cap * sizeof *in->v))) cli_die("out of memory");
    }
    cli_input *e = &in->v[in->n++];
    e->dev = (uint64_t)sb->st_dev, e->ino = (uint64_t)sb->st_ino, e->dir = S_ISDIR(sb->st_mode);
    snprintf(e->path, sizeof e->path, "%s", path);
    snprintf(e->what, sizeof e->what, "%s", what);
}

void cli_input_add(cli_inputs *in, const char *what, const char *path)
{
    struct stat sb;
    if (!path || stat(path, &sb) != 0) return; /* its reader names what is missing */
    add_one(in, path, &sb, what);
    if (!S_ISDIR(sb.st_mode)) return;
    /* a folder (a model, a tokenizer): the files directly in it */
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) {
        char file[4200];
        struct stat fb;
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        if (e->d_name[0] != '.' && stat(file, &fb) == 0 && S_ISREG(fb.st_mode)) add_one(in, file, &fb, what);
    }
    if (d) closedir(d);
}

void cli_inputs_free(cli_inputs *in)
{
    free(in->v);
    in->v = NULL;
    in->n = in->cap = 0;
}

static const cli_input *input_at(const cli_inputs *in, const struct stat *sb)
{
    for (int i = 0; i < in->n; i++)
        if (in->v[i].dev == (uint64_t)sb->st_dev && in->v[i].ino == (uint64_t)sb->st_ino) return &in->v[i];
    return NULL;
}

void cli_output_check(const cli_inputs *in, const char *what, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return; /* not there yet: no input either */
    const cli_input *e = input_at(in, &sb);
    if (e)
        cli_die("%s %s is %s%s %s: writing it would destroy an input of this command; give another %s", what, path,
                strcmp(path, e->path) ? "the same file as " : "", e->what, e->path, what);
}

void cli_output_dir_check(const cli_inputs *in, const char *what, const char *dir, const char *const *names)
{
    cli_output_check(in, what, dir);
    for (; names && *names; names++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, *names);
        struct stat sb;
        const cli_input *e = stat(path, &sb) == 0 ? input_at(in, &sb) : NULL;
        if (e)
            cli_die("%s %s would replace %s, which is %s%s %s: writing it would destroy an input of this command; "
                    "give another %s", what, dir, path, strcmp(path, e->path) ? "the same file as " : "", e->what,
                    e->path, what);
    }
}

void cli_std_check(const cli_inputs *in)
{
    for (int fd = 1; fd <= 2; fd++) {
        struct stat sb;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        const cli_input *e = input_at(in, &sb);
        if (e)
            cli_die("the standard %s is %s %s, an input of this command: it would be written into; send the output "
                    "elsewhere", fd == 1 ? "output" : "error", e->what, e->path);
    }
}

/* ---- writable outputs with room ------------------------------------------------------- */

/* Folders cli_make_dir made, removed at exit when they are still empty: a
 * run refused or stopped before it wrote anything leaves no trace. */
static char made[16][4200];
static int n_made;

static void remove_made(void)
{
    while (n_made > 0) rmdir(made[--n_made]); /* the deepest first; one with files in it stays */
}

void cli_make_dir(const char *what, const char *dir)
{
    static int registered;
    if (!registered) atexit(remove_made), registered = 1; /* before the locks': runs after their release */
    char path[4200];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1;; p++) {
        const int end = *p == '\0';
        if (*p != '/' && !end) continue;
        *p = '\0';
        struct stat sb;
        if (mkdir(path, 0777) == 0) {
            if (n_made < 16) snprintf(made[n_made++], sizeof made[0], "%s", path);
        } else if (errno != EEXIST) {
            cli_die("%s %s: cannot create the folder %s: %s", what, dir, path, strerror(errno));
        }
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            cli_die("%s %s: %s is %s", what, dir, path, stat(path, &sb) ? "missing" : "in the way: not a folder");
        if (end) break;
        *p = '/';
    }
}

void cli_probe_dir(const char *what, const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.megatrain-probe-XXXXXX", dir);
    const int fd = mkstemp(path);
    if (fd < 0) cli_die("%s %s cannot be written: %s", what, dir, strerror(errno));
    close(fd);
    unlink(path);
}

void cli_probe_file(const char *what, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) cli_die("%s %s is a folder", what, path);
        const int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC); /* changes nothing */
        if (fd < 0) cli_die("%s %s cannot be written: %s", what, path, strerror(errno));
        close(fd);
        return;
    }
    char dir[4200];
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    else snprintf(dir, sizeof dir, ".");
    if (stat(dir, &sb) != 0) cli_die("%s %s cannot be written: the folder %s does not exist", what, path, dir);
    if (!S_ISDIR(sb.st_mode)) cli_die("%s %s cannot be written: %s is not a folder", what, path, dir);
    cli_probe_dir(what, dir);
}

int cli_free_bytes(const char *dir, uint64_t *free_bytes, uint64_t *fs)
{
    struct statvfs v;
    struct stat sb;
    if (statvfs(dir, &v) != 0 || stat(dir, &sb) != 0) return -1;
    *free_bytes = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    *fs = (uint64_t)sb.st_dev;
    return 0;
}

/* ---- locks ---------------------------------------------------------------------------------- */

static long owner_of(int fd)
{
    char buf[32];
    const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const long pid = strtol(buf, NULL, 10);
    return pid > 0 ? pid : 0;
}

/* Locks held, released when the program exits (a refusal after they were
 * taken included); a second signal's _exit leaves them, stale. */
static cli_lock *held[8];

static void release_all(void)
{
    for (int i = 0; i < 8; i++)
        if (held[i]) cli_lock_release(held[i]);
}

void cli_lock_take(cli_lock *l, const char *what, const char *target, const char *lock_path)
{
    static int registered;
    if (!registered) atexit(release_all), registered = 1;
    snprintf(l->path, sizeof l->path, "%s", lock_path);
    for (int tries = 0;; tries++) {
        const int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) cli_die("%s %s cannot be written: creating its lock %s: %s", what, target, lock_path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int e = errno;
            long owner = owner_of(fd);
            /* the holder writes its pid just after it takes the lock */
            for (int wait = 0; e == EWOULDBLOCK && !owner && wait < 100; wait++) {
                const struct timespec ms = {0, 10 * 1000 * 1000};
                nanosleep(&ms, NULL);
                owner = owner_of(fd);
            }
            close(fd);
            if (e == EWOULDBLOCK)
                cli_die("%s %s is in use by process %ld (its lock %s): another run writes it; wait for that run to "
                        "end, or give this one another %s", what, target, owner, lock_path, what);
            cli_die("%s %s: cannot lock %s: %s", what, target, lock_path, strerror(e));
        }
        /* the holder before us may have removed the file between our open and our flock */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(lock_path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            const long stale = owner_of(fd);
            if (stale && stale != (long)getpid())
                printf("%s: the lock of process %ld, which ended without releasing it, is stale: taken over\n",
                       lock_path, stale);
            char pid[32];
            const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
                cli_die("%s %s cannot be written: its lock %s: %s", what, target, lock_path, strerror(errno));
            l->fd = fd, l->held = 1;
            for (int i = 0; i < 8; i++)
                if (!held[i]) {
                    held[i] = l;
                    break;
                }
            return;
        }
        close(fd);
        if (tries == 100) cli_die("%s %s: cannot lock %s: it keeps being replaced", what, target, lock_path);
    }
}

void cli_lock_release(cli_lock *l)
{
    if (!l->held) return;
    unlink(l->path); /* while held: whoever opens the name next makes a new file */
    close(l->fd);
    l->held = 0;
    for (int i = 0; i < 8; i++)
        if (held[i] == l) held[i] = NULL;
}
