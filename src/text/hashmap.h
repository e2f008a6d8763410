/* The tokenizer's hash maps: a hash of bytes, a string -> value map (the
 * vocabulary, added tokens, a call's cache of long words) and the merge
 * map of (left id, right id) -> (rank, merged id). Lookups are inline:
 * BPE does one per character and per pair. */
#ifndef MT_TEXT_HASHMAP_H
#define MT_TEXT_HASHMAP_H

#include "text/utf8.h"

#include <stdint.h>
#include <string.h>

/* ---- hashing --------------------------------------------------------------------- */

static inline uint32_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return (uint32_t)h;
}

/* ---- string -> value map: open addressing over entries with pooled keys ------------ */

typedef struct sm_entry {
    uint32_t off, len, hash; /* key: pool bytes [off, off + len), NUL after them */
    int32_t v0;
    uint32_t v1;
} sm_entry;

typedef struct strmap {
    uint64_t *slots; /* hash << 32 | (entry index + 1), 0 when empty: a probe reads entries only on a hash match */
    uint32_t mask;   /* slots - 1 */
    sm_entry *e;
    uint32_t n, cap;
    tbuf keys;
} strmap;

static inline int32_t sm_find(const strmap *m, const char *k, size_t n, uint32_t h)
{
    if (!m->slots) return -1;
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t s = m->slots[i];
        if (!s) return -1;
        if ((uint32_t)(s >> 32) != h) continue;
        uint32_t j = (uint32_t)s - 1;
        const sm_entry *e = &m->e[j];
        if (e->len == n && memcmp(m->keys.p + e->off, k, n) == 0) return (int32_t)j;
    }
}

/* Inserts or overwrites; the entry index, or -1 when out of memory. */
int32_t mt_sm_put(strmap *m, const char *k, size_t n, uint32_t h, int32_t v0, uint32_t v1);
static inline const char *sm_key(const strmap *m, uint32_t entry) { return m->keys.p + m->e[entry].off; }
void mt_sm_free(strmap *m);

/* ---- merge map: (left id, right id) -> (rank, merged id) ---------------------------- */

typedef struct pm_entry {
    uint64_t key; /* PM_EMPTY when free */
    uint32_t rank;
    int32_t id;
} pm_entry;

#define PM_EMPTY UINT64_MAX

typedef struct pairmap {
    pm_entry *e;
    uint64_t mask;
} pairmap;

static inline uint64_t pm_slot(uint64_t key, uint64_t mask) { return ((key * 0x9E3779B97F4A7C15ull) >> 17) & mask; }

static inline const pm_entry *pm_find(const pairmap *m, int32_t a, int32_t b)
{
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = pm_slot(key, m->mask);; i = (i + 1) & m->mask) {
        const pm_entry *e = &m->e[i];
        if (e->key == key) return e;
        if (e->key == PM_EMPTY) return NULL;
    }
}

#endif
