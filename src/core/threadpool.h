/* A fixed pool of worker threads owned by one model (never global).
 *
 * mt_pool_run(pool, n_tasks, fn, ctx) calls fn(ctx, task, thread) for every task
 * in [0, n_tasks) spread over the pool's threads (the calling thread takes
 * part as thread 0) and returns when all tasks have finished. Tasks are handed
 * out dynamically from an atomic counter, so uneven tasks balance themselves.
 * A pool is used by one caller at a time; calls do not nest. */
#ifndef MT_THREADPOOL_H
#define MT_THREADPOOL_H

#include <stddef.h>

typedef struct mt_pool mt_pool;
typedef void (*mt_pool_fn)(void *ctx, size_t task, int thread);

/* n_threads >= 1 counts the caller. cpus, if not NULL, lists n_threads CPU
 * ids to pin the threads to (cpus[0] is left to the caller). Returns NULL when
 * a thread or memory cannot be had. */
mt_pool *mt_pool_create(int n_threads, const int *cpus);
void mt_pool_destroy(mt_pool *pool); /* NULL ok */
int mt_pool_size(const mt_pool *pool); /* 1 for NULL */
/* pool may be NULL: then the tasks run on the caller, in order. */
void mt_pool_run(mt_pool *pool, size_t n_tasks, mt_pool_fn fn, void *ctx);

/* Split [0, n) into n_parts nearly equal ranges, each a multiple of `align`
 * elements except the last; part p is [*lo, *hi). */
void mt_split_range(size_t n, size_t n_parts, size_t p, size_t align, size_t *lo, size_t *hi);

#endif
