/* The string -> value map's growth, insertion and release (its lookup is
 * inline in hashmap.h). */
#include "text/hashmap.h"

#include <stdlib.h>

static int sm_grow(strmap *m)
{
    uint32_t nslots = m->slots ? (m->mask + 1) * 2 : 256;
    uint64_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return -1;
    for (uint32_t j = 0; j < m->n; j++) {
        uint32_t i = m->e[j].hash & (nslots - 1);
        while (slots[i]) i = (i + 1) & (nslots - 1);
        slots[i] = (uint64_t)m->e[j].hash << 32 | (j + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->mask = nslots - 1;
    return 0;
}

/* Inserts or overwrites; the entry index, or -1 when out of memory. */
int32_t mt_sm_put(strmap *m, const char *k, size_t n, uint32_t h, int32_t v0, uint32_t v1)
{
    int32_t found = sm_find(m, k, n, h);
    if (found >= 0) {
        m->e[found].v0 = v0;
        m->e[found].v1 = v1;
        return found;
    }
    if (n > UINT32_MAX - 1 || m->keys.n + n + 1 > UINT32_MAX || m->n >= INT32_MAX - 1) return -1;
    if (!m->slots || (m->n + 1) * 2 > m->mask + 1) {
        if (sm_grow(m)) return -1;
    }
    if (m->n == m->cap) {
        uint32_t cap = m->cap ? m->cap * 2 : 64;
        sm_entry *e = realloc(m->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        m->e = e;
        m->cap = cap;
    }
    uint32_t off = (uint32_t)m->keys.n;
    if (tbuf_put(&m->keys, k, n) || tbuf_put(&m->keys, "", 1)) return -1;
    m->e[m->n] = (sm_entry){off, (uint32_t)n, h, v0, v1};
    uint32_t i = h & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = (uint64_t)h << 32 | ++m->n;
    return (int32_t)(m->n - 1);
}

void mt_sm_free(strmap *m)
{
    free(m->slots);
    free(m->e);
    tbuf_free(&m->keys);
    memset(m, 0, sizeof *m);
}
