/* Shared by the fuzz targets (libFuzzer entry points, one per file): a
 * scratch folder for the process and helpers that write the input there and
 * read files back.
 * Each target feeds bytes to a reader of the library the way a file on disk
 * would and checks the contract of every reader: a clean success or an error
 * with a message, never a crash, a leak or an out-of-bounds access (the
 * targets are built with AddressSanitizer and UndefinedBehaviorSanitizer). */
#ifndef MT_FUZZ_H
#define MT_FUZZ_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp, nftw */
#endif

#include <megatrain.h>

#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The process's scratch folder (made on first use, removed at exit by the
 * harness's atexit handler). */
static char fuzz_dir[64];

static inline int fuzz_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static inline void fuzz_rm_dir(void)
{
    if (nftw(fuzz_dir, fuzz_rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) fprintf(stderr, "fuzz: cannot remove %s\n", fuzz_dir);
}

static inline const char *fuzz_scratch(void)
{
    if (!fuzz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/mt-fuzz-XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
        if (!mkdtemp(fuzz_dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(fuzz_rm_dir);
    }
    return fuzz_dir;
}

/* Writes n bytes to dir/name (replacing it); aborts the run if it cannot,
 * since every later input would test nothing. */
static inline void fuzz_write(const char *dir, const char *name, const void *data, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* The bytes of dir/name (and a NUL after them), for resetting a file between
 * inputs. */
static inline unsigned char *fuzz_read(const char *dir, const char *name, size_t *n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    FILE *f = fopen(path, "rb");
    if (!f || fstat(fileno(f), &sb) != 0) {
        perror(path);
        abort();
    }
    *n = (size_t)sb.st_size;
    unsigned char *p = malloc(*n + 1);
    if (!p || fread(p, 1, *n, f) != *n) abort();
    fclose(f);
    p[*n] = '\0';
    return p;
}

/* A failing call must say why. */
static inline void fuzz_expect_message(mt_status st, const char *msg, const char *what)
{
    if (st != MT_OK && (!msg || !msg[0])) {
        fprintf(stderr, "%s failed with %s and no message\n", what, mt_status_str(st));
        abort();
    }
}

/* Splits the input at the first "\n--\n" (for targets that build more than
 * one file): part 0 is what precedes it (the whole input when there is none),
 * part 1 what follows it (empty when there is none). */
typedef struct fuzz_part {
    const uint8_t *p;
    size_t n;
} fuzz_part;

static inline void fuzz_split(const uint8_t *data, size_t size, fuzz_part out[2])
{
    out[0] = (fuzz_part){data, size};
    out[1] = (fuzz_part){data + size, 0};
    for (size_t i = 0; i + 4 <= size; i++)
        if (!memcmp(data + i, "\n--\n", 4)) {
            out[0].n = i;
            out[1] = (fuzz_part){data + i + 4, size - i - 4};
            return;
        }
}

#endif
