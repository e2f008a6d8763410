#define _GNU_SOURCE
#include "memory/tiler.h"
#include "device/device.h"
#include "core/sysinfo.h"
#include "core/bf16.h"

#include <errno.h>
#include <numa.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE (2u << 20)

static void unmap_tile(mt_tile *t)
{
    if (!t->base) return;
    if (t->pinned) mt_device_host_unregister(t->base);
    munmap(t->base, t->bytes);
    t->base = NULL;
    t->pinned = 0;
}

mt_status mt_tiles_map(mt_tiles *ts, const mt_layout *lo, int numa_node, mt_err err)
{
    memset(ts, 0, sizeof *ts);
    ts->numa_node = -1;
    ts->tile = calloc((size_t)lo->n_units, sizeof *ts->tile);
    if (!ts->tile) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the tile table");
    ts->n = lo->n_units;
    const int bind = numa_node >= 0 && mt_sys_numa_nodes() > 1;
    for (int i = 0; i < lo->n_units; i++) {
        mt_tile *t = &ts->tile[i];
        t->bytes = lo->units[i].tile_bytes;
        void *p = mmap(NULL, t->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            char b[32];
            int e = errno;
            mt_tiles_free(ts);
            return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "cannot map the %s host tile of unit %d: %s",
                           mt_fmt_bytes(b, sizeof b, lo->units[i].tile_bytes), i, strerror(e));
        }
        t->base = p;
        if (t->bytes >= HUGE_PAGE) (void)madvise(p, t->bytes, MADV_HUGEPAGE); /* a hint; fine if refused */
        if (bind) numa_tonode_memory(p, t->bytes, numa_node);
    }
    if (bind) ts->numa_node = numa_node;
    return MT_OK;
}

mt_status mt_tiles_pin(mt_tiles *ts, int must, const mt_logger *lg, mt_err err)
{
    char why[256];
    for (int i = 0; i < ts->n; i++) {
        mt_tile *t = &ts->tile[i];
        if (t->pinned) continue;
        if (mt_device_host_register(t->base, t->bytes, why, sizeof why) != 0) {
            for (int j = 0; j < i; j++)
                if (ts->tile[j].pinned) {
                    mt_device_host_unregister(ts->tile[j].base);
                    ts->tile[j].pinned = 0;
                }
            if (must) return mt_fail(err, MT_ERR_DEVICE, "cannot page-lock host tile %d: %s", i, why);
            mt_log(lg, MT_LOG_WARN, "host tiles stay pageable (transfers will be slow): %s", why);
            return MT_OK;
        }
        t->pinned = 1;
    }
    ts->pinned = 1;
    return MT_OK;
}

void mt_tiles_free(mt_tiles *ts)
{
    if (!ts || !ts->tile) return;
    for (int i = 0; i < ts->n; i++) unmap_tile(&ts->tile[i]);
    free(ts->tile);
    memset(ts, 0, sizeof *ts);
}

typedef struct {
    uint16_t *w;
    const float *master;
    size_t n, nt;
} round_job;

static void round_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    const round_job *j = ctx;
    size_t lo, hi;
    mt_split_range(j->n, j->nt, task, 64, &lo, &hi);
    for (size_t i = lo; i < hi; i++) j->w[i] = mt_f32_to_bf16(j->master[i]);
}

void mt_tile_weights_from_master(mt_pool *pool, const mt_tile *t, const mt_unit_desc *u, uint16_t *w)
{
    round_job j = {w, mt_tile_master(t, u), u->padded, (size_t)mt_pool_size(pool)};
    mt_pool_run(pool, j.nt, round_task, &j);
}
