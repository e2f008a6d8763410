/* A main() for a fuzz target without libFuzzer: runs the target once on
 * each file named (or each file of each folder named), so that the seed and
 * regression inputs run with the ordinary compiler, in `make check` and
 * under valgrind. Prints one line per target; exits 1 if a file cannot be
 * read (a failing input aborts inside the target). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        perror(path);
        if (f) fclose(f);
        return -1;
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *p = malloc(n ? n : 1);
    int ok = p && fread(p, 1, n, f) == n;
    fclose(f);
    if (ok) LLVMFuzzerTestOneInput(p, n);
    else fprintf(stderr, "%s: cannot read\n", path);
    free(p);
    return ok ? 0 : -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The regular files of a folder, in name order (runs are repeatable). */
static int run_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) abort();
            names = nn;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len))) abort();
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat sb;
        if (stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (run_file(names[i])) rc = -1;
            else ++*count;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize && LLVMFuzzerInitialize(&argc, &argv)) return 1;
    int rc = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            rc = 1;
        } else if (S_ISDIR(sb.st_mode) ? run_dir(argv[i], &count) : (run_file(argv[i]) ? -1 : (count++, 0))) {
            rc = 1;
        }
    }
    if (rc) fprintf(stderr, "%s: %d inputs ran; some named inputs could not be read\n", argv[0], count);
    else printf("%s: %d inputs, none failed\n", argv[0], count);
    return rc;
}
