/* File-system helpers for model folders and checkpoints. Every failing call
 * writes a message naming the path and the system's reason into err. */
#ifndef MT_FILEIO_H
#define MT_FILEIO_H

#include "core/internal.h"

#include <cjson/cJSON.h>
#include <stddef.h>

void mt_path_join(char *out, size_t size, const char *dir, const char *name);
/* A whole small (<= 64 MiB) regular file, NUL-terminated; free() it. */
mt_status mt_read_small_file(mt_err err, const char *path, char **out, size_t *len);
/* len bytes of text as one JSON value and nothing after it but whitespace;
 * NULL when they are not, with *where the offset of the first byte that is
 * wrong. Unlike cJSON_Parse, trailing bytes are an error and the position
 * is the call's own (cJSON_GetErrorPtr is one pointer for the process). */
cJSON *mt_json_parse(const char *text, size_t len, size_t *where);
/* A file holding one JSON object; cJSON_Delete() it. */
mt_status mt_parse_json_file(mt_err err, const char *path, cJSON **out);
/* mkdir -p. */
mt_status mt_mkdir_p(mt_err err, const char *dir);
/* write() until done; 0, or -1 with errno. */
int mt_write_all(int fd, const void *buf, size_t n);
/* fsync of a directory, so renames inside it are durable. */
mt_status mt_sync_dir(mt_err err, const char *dir);
/* Replaces path with data: written to path.tmp, fsynced, renamed. */
mt_status mt_write_file_atomic(mt_err err, const char *path, const void *data, size_t n);

/* The advisory lock of a folder that a writer owns for a while (a checkpoint
 * folder, a run's output folder): MT_LOCK_NAME in it, held with flock(2) and
 * holding the owner's process id and a newline. The kernel drops a flock
 * when its holder dies, so a lock file left by a killed process is stale and
 * taken over; the pid in it only names a live holder in messages. A program
 * may hold the lock of a folder around a whole run (megatrain train does) and
 * then call the library's writers on it: a lock whose file names this
 * process is taken as held. */
#define MT_LOCK_NAME ".megatrain.lock"
/* Takes dir's lock: *fd >= 0 is the lock this call took (mt_unlock_dir
 * releases it), -1 when this process already held it; MT_ERR_IO naming the
 * holder's pid when another process holds it. dir must exist. */
mt_status mt_lock_dir(mt_err err, const char *dir, int *fd);
void mt_unlock_dir(const char *dir, int fd);

#endif
