/* Host tiles: one contiguous, 4 KiB-aligned region per unit holding that
 * unit's blocks (see layout.h), placed on a NUMA node and page-locked for
 * DMA when a GPU will read it. */
#ifndef MT_TILER_H
#define MT_TILER_H

#include "core/internal.h"
#include "model/layout.h"
#include "core/threadpool.h"

#include <stdint.h>

typedef struct mt_tile {
    unsigned char *base; /* tile_bytes of the unit, page aligned */
    uint64_t bytes;
    int pinned;
} mt_tile;

typedef struct mt_tiles {
    int n;
    mt_tile *tile;
    int numa_node; /* the node the tiles are bound to; -1 none */
    int pinned;    /* every tile is page-locked */
} mt_tiles;

/* Maps the tiles of every unit, zero-filled (by the kernel, lazily), bound to
 * numa_node when the machine has NUMA (-1: no binding), with transparent huge
 * pages requested. Nothing is touched yet, so the caller's first writes,
 * from threads on that node, place the pages. */
mt_status mt_tiles_map(mt_tiles *ts, const mt_layout *lo, int numa_node, mt_err err);
/* Page-locks every tile (after the caller has written them). must != 0: a
 * failure is an error; else it is logged and the tiles stay pageable. */
mt_status mt_tiles_pin(mt_tiles *ts, int must, const mt_logger *lg, mt_err err);
void mt_tiles_free(mt_tiles *ts);

/* The fp32 master weights; NULL in lean mode, which has none. */
static inline float *mt_tile_master(const mt_tile *t, const mt_unit_desc *u)
{
    return u->lean ? NULL : (float *)(t->base + u->master_off);
}
/* The fp32 moments; NULL in lean mode (mt_tile_qm and the others below). */
static inline float *mt_tile_m(const mt_tile *t, const mt_unit_desc *u)
{
    return u->lean ? NULL : (float *)(t->base + u->m_off);
}
static inline float *mt_tile_v(const mt_tile *t, const mt_unit_desc *u)
{
    return u->lean ? NULL : (float *)(t->base + u->v_off);
}
/* The streamed bf16 copy; NULL in fp32 mode and in lean mode, whose weights
 * are codes (mt_tile_wq). */
static inline uint16_t *mt_tile_weights_bf16(const mt_tile *t, const mt_unit_desc *u)
{
    return u->weight_bytes && !u->lean ? (uint16_t *)(t->base + u->weight_off) : NULL;
}
/* fp32 gradients; NULL in bf16 and lean modes. */
static inline float *mt_tile_grad_f32(const mt_tile *t, const mt_unit_desc *u)
{
    return u->grad_bytes && !u->lean ? (float *)(t->base + u->grad_off) : NULL;
}
/* Where bf16 gradients land: the weight block in bf16 mode, the gradient
 * block in lean mode; NULL in fp32 mode. */
static inline uint16_t *mt_tile_grad_bf16(const mt_tile *t, const mt_unit_desc *u)
{
    return u->lean ? (uint16_t *)(t->base + u->grad_off) : mt_tile_weights_bf16(t, u);
}
/* Lean mode: the weights' 16-bit codes and their blocks' scales (optim/q16.h). */
static inline int16_t *mt_tile_wq(const mt_tile *t, const mt_unit_desc *u) { return (int16_t *)(t->base + u->weight_off); }
static inline float *mt_tile_sw(const mt_tile *t, const mt_unit_desc *u) { return (float *)(t->base + u->sw_off); }
/* Lean mode: the 8-bit codes of m and v, and their blocks' scales (optim/q8.h). */
static inline uint8_t *mt_tile_qm(const mt_tile *t, const mt_unit_desc *u) { return t->base + u->m_off; }
static inline uint8_t *mt_tile_qv(const mt_tile *t, const mt_unit_desc *u) { return t->base + u->v_off; }
static inline float *mt_tile_sm(const mt_tile *t, const mt_unit_desc *u) { return (float *)(t->base + u->sm_off); }
static inline float *mt_tile_sv(const mt_tile *t, const mt_unit_desc *u) { return (float *)(t->base + u->sv_off); }

/* The streamed bf16 weights w of unit u rounded again from its fp32
 * master (bf16 mode): after a failed step left gradients in that block. */
void mt_tile_weights_from_master(mt_pool *pool, const mt_tile *t, const mt_unit_desc *u, uint16_t *w);

#endif
