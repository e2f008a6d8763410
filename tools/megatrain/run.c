/* What a training run needs around its steps: signals that end it with a
 * checkpoint, a checkpoint folder that cannot eat a run, the identity of the
 * run a checkpoint belongs to, and the metrics log. */
#define _GNU_SOURCE
#include "run.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- signals --------------------------------------------------------------- */

/* The first SIGINT or SIGTERM: the library's abort callback stops the step in
 * flight, and the run saves a checkpoint and the model. A second one ends
 * the process at once: every file the library writes goes to a temporary
 * name first, so the last complete checkpoint stays intact. */
static volatile sig_atomic_t first_signal;
static int hold_off; /* a held-out evaluation runs: it finishes first */

static void say(const char *s) { (void)!write(2, s, strlen(s)); }

static void on_signal(int sig)
{
    if (first_signal) {
        say("\nmegatrain: second signal: stopping now; the last complete checkpoint is intact\n");
        _exit(128 + sig);
    }
    first_signal = sig;
    say("\nmegatrain: stopping: the step in flight is abandoned, then a checkpoint and the model are saved "
        "(send the signal again to stop at once)\n");
}

void run_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int run_signal(void) { return first_signal; }

int run_abort_requested(void *user_data)
{
    (void)user_data;
    return first_signal != 0 && !hold_off;
}

void run_hold_off_signals(int on) { hold_off = on; }

const char *run_signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

/* ---- files ------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int rm_rf(const char *path) { return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Replaces path with text: a temporary file, synced, renamed over it. */
int run_write_atomic(const char *path, const char *text)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    size_t n = strlen(text), done = 0;
    while (done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    int ok = done == n && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

/* ---- the checkpoint folder --------------------------------------------------- */

/* "step-00000042" -> 42; -1 for any other name ("step-42.tmp" included). */
int64_t run_step_of(const char *name)
{
    if (strncmp(name, "step-", 5) || !name[5]) return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* The complete step folders of dir (a folder is renamed into place only when
 * every file in it is written and synced), newest first; *n of them. */
static int64_t *list_steps(const char *dir, int *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int64_t *v = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = run_step_of(e->d_name);
        char path[4400]; /* a folder of up to 4096 bytes and a name of up to 255 */
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (s < 0 || !is_dir(path)) continue;
        if (*n == cap && !(v = realloc(v, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *v))) cli_die("out of memory");
        v[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* newest first */
        for (int k = i; k > 0 && v[k] > v[k - 1]; k--) {
            int64_t t = v[k];
            v[k] = v[k - 1], v[k - 1] = t;
        }
    return v;
}

/* Leftovers of saves that were killed: step-N.tmp folders and latest.tmp go;
 * a step-N.old (a checkpoint moved aside to be replaced) goes back to step-N
 * when the replacement never arrived, else goes. Returns how many. */
static int clean_leftovers(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int cleaned = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const size_t len = strlen(e->d_name);
        char path[4400], base[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp") &&
            (!strncmp(e->d_name, "step-", 5) || !strcmp(e->d_name, "latest.tmp"))) {
            cleaned += rm_rf(path) == 0;
        } else if (len > 4 && !strcmp(e->d_name + len - 4, ".old") && !strncmp(e->d_name, "step-", 5)) {
            snprintf(base, sizeof base, "%s", path);
            base[strlen(base) - 4] = '\0';
            cleaned += (is_dir(base) ? rm_rf(path) : rename(path, base)) == 0;
        }
    }
    closedir(d);
    return cleaned;
}

/* The step that dir/latest names, -1 when it names none that exists. */
static int64_t read_latest(const char *dir)
{
    char path[4200], line[64] = "";
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (!fgets(line, sizeof line, f)) line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    int64_t s = run_step_of(line);
    snprintf(path, sizeof path, "%s/%s", dir, line);
    return s >= 0 && is_dir(path) ? s : -1;
}

static void write_latest(const char *dir, int64_t step)
{
    char path[4200], line[40];
    snprintf(path, sizeof path, "%s/latest", dir);
    snprintf(line, sizeof line, "step-%08" PRId64 "\n", step);
    if (run_write_atomic(path, line)) cli_die("cannot write %s: %s", path, strerror(errno));
}

static void parent_of(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') out[--len] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

void run_ckpt_resolve(run_ckpt *c, const char *resume, const char *checkpoints, const char *out)
{
    memset(c, 0, sizeof *c);
    c->resume_step = -1;
    char state[4200];
    if (resume) {
        /* a step folder continues in its parent: that is where its run's
         * checkpoints and `latest` are */
        snprintf(state, sizeof state, "%s/trainer_state.json", resume);
        if (is_file(state)) {
            parent_of(resume, c->dir, sizeof c->dir);
            char name[4200];
            snprintf(name, sizeof name, "%s", resume);
            size_t len = strlen(name);
            while (len > 1 && name[len - 1] == '/') name[--len] = '\0';
            const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
            if ((c->resume_step = run_step_of(base)) < 0)
                cli_die("--resume %s: a checkpoint's step folder is named step-NNNNNNNN", resume);
        } else {
            snprintf(c->dir, sizeof c->dir, "%s", resume);
        }
        if (checkpoints && strcmp(checkpoints, c->dir))
            cli_die("--resume continues in the run's own folder %s; it takes no other --checkpoints", c->dir);
    } else if (checkpoints) {
        snprintf(c->dir, sizeof c->dir, "%s", checkpoints);
    } else {
        snprintf(c->dir, sizeof c->dir, "%s/checkpoints", out);
    }
    if (resume && !is_dir(c->dir)) cli_die("--resume %s: no such folder", resume);
}

void run_ckpt_prepare(run_ckpt *c, const char *resume, int restart, int force)
{
    int n = clean_leftovers(c->dir);
    if (n) printf("removed %d leftover(s) of a save that was killed from %s\n", n, c->dir);
    int n_steps;
    int64_t *steps = list_steps(c->dir, &n_steps);
    const int64_t newest = n_steps ? steps[0] : -1, latest = read_latest(c->dir);

    if (!resume) {
        if (n_steps || latest >= 0) {
            if (!restart)
                cli_die("%s holds the checkpoints of another run (newest: step %" PRId64 "): resume it with --resume "
                        "%s, give this run another --checkpoints folder, or pass --restart to delete them and start "
                        "over",
                        c->dir, newest, c->dir);
            char path[4200];
            for (int i = 0; i < n_steps; i++) {
                snprintf(path, sizeof path, "%s/step-%08" PRId64, c->dir, steps[i]);
                if (rm_rf(path)) cli_die("--restart: cannot remove %s: %s", path, strerror(errno));
            }
            snprintf(path, sizeof path, "%s/latest", c->dir);
            unlink(path);
            printf("--restart: removed %d checkpoint(s) of the earlier run from %s\n", n_steps, c->dir);
        }
        free(steps);
        return;
    }

    if (c->resume_step < 0) {
        if (newest < 0) cli_die("--resume %s: no checkpoint there (no step-NNNNNNNN folder)", resume);
        /* `latest` is replaced after its step folder is in place: a run killed
         * in between left a newer complete checkpoint than `latest` names */
        if (latest != newest) {
            printf("%s/latest %s; the newest complete checkpoint is step %" PRId64 ": resuming from it\n", c->dir,
                   latest < 0 ? "names no checkpoint" : "is older than a complete checkpoint", newest);
            write_latest(c->dir, newest);
        }
        c->resume_step = newest;
    }
    snprintf(c->resume_path, sizeof c->resume_path, "%s/step-%08" PRId64, c->dir, c->resume_step);
    /* later checkpoints belong to a continuation that this run replaces */
    int later = 0;
    for (int i = 0; i < n_steps; i++) later += steps[i] > c->resume_step;
    if (later && !force)
        cli_die("%s holds %d checkpoint(s) after step %" PRId64 " (newest: step %" PRId64 "): resuming from step "
                "%" PRId64 " would replace them; resume from the newest with --resume %s, or pass --force to set "
                "them aside (renamed superseded-step-NNNNNNNN)",
                c->dir, later, c->resume_step, newest, c->resume_step, c->dir);
    for (int i = 0; i < n_steps && later; i++) {
        if (steps[i] <= c->resume_step) continue;
        char from[4200], to[4200];
        snprintf(from, sizeof from, "%s/step-%08" PRId64, c->dir, steps[i]);
        snprintf(to, sizeof to, "%s/superseded-step-%08" PRId64, c->dir, steps[i]);
        if (rename(from, to)) cli_die("cannot rename %s: %s", from, strerror(errno));
        printf("--force: set %s aside as %s\n", from, to);
    }
    if (later) write_latest(c->dir, c->resume_step);
    free(steps);
}

/* ---- the identity of a run --------------------------------------------------- */

/* FNV-1a over up to 256 evenly spaced 64 KiB pieces of the file and its size:
 * a token file of any size is told from another in at most 16 MiB of reads,
 * and one edited anywhere in a piece is told from itself. */
int run_fingerprint(const char *path, uint64_t *bytes, char out[17])
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat sb;
    if (fstat(fd, &sb)) {
        close(fd);
        return -1;
    }
    const uint64_t size = (uint64_t)sb.st_size, piece = 65536, n = size / piece < 256 ? size / piece + 1 : 256;
    unsigned char *buf = malloc(piece);
    if (!buf) cli_die("out of memory");
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t at = n > 1 ? (size - MT_MIN_U64(size, piece)) / (n - 1) * i : 0;
        ssize_t got = pread(fd, buf, (size_t)MT_MIN_U64(piece, size - at), (off_t)at);
        if (got < 0) {
            free(buf);
            close(fd);
            return -1;
        }
        for (ssize_t k = 0; k < got; k++) h = (h ^ buf[k]) * 0x100000001b3ull;
    }
    for (int k = 0; k < 8; k++) h = (h ^ ((size >> (8 * k)) & 0xff)) * 0x100000001b3ull;
    free(buf);
    close(fd);
    *bytes = size;
    snprintf(out, 17, "%016" PRIx64, h);
    return 0;
}

/* Where a and b differ, as "path: A in the checkpoint's run, B now" lines
 * appended to msg; keys named in `skip` are not compared. */
static void diff_json(const cJSON *a, const cJSON *b, const char *path, char *msg, size_t n)
{
    static const char *const skip[] = {"file", "init"};
    if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
        for (const cJSON *e = a->child; e; e = e->next) {
            int skipped = 0;
            for (size_t k = 0; k < sizeof skip / sizeof skip[0]; k++) skipped |= !strcmp(e->string, skip[k]);
            if (skipped) continue;
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", e->string);
            diff_json(e, cJSON_GetObjectItemCaseSensitive(b, e->string), sub, msg, n);
        }
        for (const cJSON *e = b->child; e; e = e->next)
            if (!cJSON_GetObjectItemCaseSensitive(a, e->string)) {
                size_t len = strlen(msg);
                snprintf(msg + len, n - len, "\n  %s%s%s: not in the checkpoint's run", path, *path ? "." : "",
                         e->string);
            }
        return;
    }
    if (a && b && cJSON_Compare(a, b, 1)) return;
    char *ta = a ? cJSON_PrintUnformatted(a) : NULL, *tb = b ? cJSON_PrintUnformatted(b) : NULL;
    size_t len = strlen(msg);
    snprintf(msg + len, n - len, "\n  %s: %s in the checkpoint's run, %s now", path, ta ? ta : "(none)",
             tb ? tb : "(none)");
    cJSON_free(ta), cJSON_free(tb);
}

/* 0 when the run of the checkpoint (its caller JSON's "run") is this one;
 * else a message naming each difference. */
int run_compare(const char *caller_json, const cJSON *now, char *msg, size_t n)
{
    msg[0] = '\0';
    cJSON *saved = caller_json ? cJSON_Parse(caller_json) : NULL;
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(saved, "run");
    if (!run) {
        snprintf(msg, n, "\n  the checkpoint records no run settings (not written by megatrain train)");
    } else {
        diff_json(run, now, "", msg, n);
    }
    cJSON_Delete(saved);
    return msg[0] != '\0';
}

/* ---- the metrics log ------------------------------------------------------------ */

/* The log with the lines of steps after `step` dropped: a resumed run writes
 * those steps again. The lines kept are rewritten as they were. */
void run_log_trim(const char *path, uint64_t step)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp); /* a trim that was killed */
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t cap = 1 << 16, len = 0;
    char *kept = malloc(cap), *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int dropped = 0;
    if (!kept) cli_die("out of memory");
    while ((got = getline(&line, &lcap, f)) > 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
        const int keep = !cJSON_IsNumber(s) || s->valuedouble <= (double)step;
        cJSON_Delete(j);
        if (!keep) {
            dropped++;
            continue;
        }
        while (len + (size_t)got + 1 > cap)
            if (!(kept = realloc(kept, cap *= 2))) cli_die("out of memory");
        memcpy(kept + len, line, (size_t)got);
        len += (size_t)got;
    }
    free(line);
    fclose(f);
    kept[len] = '\0';
    if (dropped && run_write_atomic(path, kept)) cli_die("cannot rewrite %s: %s", path, strerror(errno));
    free(kept);
}

static void add_number(cJSON *j, const char *name, double v)
{
    if (isfinite(v)) cJSON_AddNumberToObject(j, name, v);
    else cJSON_AddNullToObject(j, name);
}

cJSON *run_record(uint64_t step, const mt_step_stats *s, double elapsed, double heldout)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) cli_die("out of memory");
    cJSON_AddNumberToObject(j, "step", (double)step);
    add_number(j, "loss", s->loss);
    add_number(j, "lr", s->lr);
    add_number(j, "grad_norm", s->grad_norm);
    cJSON_AddNumberToObject(j, "tokens", (double)s->tokens);
    add_number(j, "tokens_per_s", s->seconds > 0 ? (double)s->tokens / s->seconds : 0);
    add_number(j, "seconds", s->seconds);
    add_number(j, "elapsed", elapsed);
    if (!isnan(heldout)) add_number(j, "heldout_loss", heldout);
    return j;
}
