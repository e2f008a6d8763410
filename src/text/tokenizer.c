/* Hugging Face tokenizers: a tokenizer.json read into a BPE model with its
 * normalizers, pre-tokenizers, added tokens, post-processor and decoders.
 *
 * Every step follows the Rust `tokenizers` library (what transformers' fast
 * tokenizers run), down to its quirks, because token ids must be the ones a
 * model was trained on:
 *
 *   text ── split on added tokens matched in the raw text (leftmost-longest)
 *        ── each piece between them: normalizer, then split on added tokens
 *           matched in the normalized text
 *        ── each remaining piece: pre-tokenizer steps, depth first
 *        ── each pre-token: BPE (cached ids, or a merge queue), ids out
 *        ── with MT_ENCODE_ADD_SPECIAL: the post-processor's ids around them
 *
 * After load a tokenizer changes in one place only, its cache of words,
 * which every call and thread shares without locks (sc_get, sc_put);
 * everything else a call writes lives in its own workspace (struct enc).
 * So any number of threads may encode at once.
 *
 * Byte-level tokenizers (GPT-2, Llama 3, Qwen): their ByteLevel pre-tokenizer
 * spells every byte as a printable character before BPE. Here the model works
 * on the raw bytes instead, with the vocabulary also indexed by raw bytes, so
 * nothing is rewritten per byte; the ids are the same by construction (the
 * map is a bijection). That needs ByteLevel to be the last pre-tokenizer step,
 * which every known tokenizer.json has; others are refused.
 *
 * Split regexes: tokenizers compiles them with Oniguruma; here PCRE2 (JIT).
 * The two agree on the syntax these files use, except for what \s, \h and \w
 * mean, which translate_regex() rewrites to Oniguruma's definitions. */
#define _GNU_SOURCE
#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/fileio.h"
#include "core/internal.h"

#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* The largest id accepted: a typo in a file must not size the id tables. */
#define MAX_TOKEN_ID ((1u << 25) - 1)
/* Normalizer, pre-tokenizer, post-processor and decoder steps after flattening Sequences. */
#define MAX_STEPS 16
#define MAX_NESTING 8
/* The per-call cache of pre-token -> ids: words longer than this are rarely
 * seen twice (tokenizers caches below 256 too), and the table stops growing
 * at CACHE_MAX_ENTRIES so one call's memory stays proportional to its text. */
#define CACHE_MAX_WORD 256
#define CACHE_MAX_ENTRIES (1u << 18)
/* The JIT stack a regex may grow to on pathological text (long runs that
 * backtrack); the default 32 KiB machine stack serves ordinary text. */
#define JIT_STACK_MAX ((size_t)64 << 20)

/* ---- growable byte buffers ---------------------------------------------------- */

typedef struct tbuf {
    char *p;
    size_t n, cap;
} tbuf;

static int tbuf_reserve(tbuf *b, size_t extra)
{
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int tbuf_put(tbuf *b, const void *s, size_t n)
{
    if (tbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static void tbuf_free(tbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- UTF-8 ------------------------------------------------------------------- */

/* The length of the well-formed sequence at s (n > 0 bytes available), or 0
 * when it is ill-formed (Unicode's table 3-7: no overlongs, surrogates or
 * code points above U+10FFFF). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xC2 || c > 0xF4) return 0;
    if (c < 0xE0) return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (n < 2 || s[1] < lo || s[1] > hi) return 0;
    if (c < 0xF0) return n >= 3 && (s[2] & 0xC0) == 0x80 ? 3 : 0;
    return n >= 4 && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 ? 4 : 0;
}

/* At an ill-formed sequence: how many bytes one U+FFFD replaces, the
 * "maximal subpart" rule of Rust's String::from_utf8_lossy (and of the
 * WHATWG decoder): a valid prefix of a sequence counts as one. */
static size_t utf8_bad_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0xC2 || c > 0xF4) return 1;
    size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (n < 2 || s[1] < lo || s[1] > hi) return 1;
    size_t i = 2;
    while (i < need && i < n && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

/* The offset of the first ill-formed byte of s, or n when s is UTF-8. */
static size_t utf8_check(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) { /* ASCII runs, 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_len(s + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* The code point at s (well-formed), its length in *len. */
static uint32_t utf8_decode(const unsigned char *s, size_t *len)
{
    unsigned c = s[0];
    if (c < 0x80) return *len = 1, c;
    if (c < 0xE0) return *len = 2, ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    if (c < 0xF0) return *len = 3, ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    return *len = 4, ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

static size_t utf8_encode(uint32_t c, char *out)
{
    if (c < 0x80) return out[0] = (char)c, 1;
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Appends s with every ill-formed sequence replaced by U+FFFD. */
static int put_lossy(tbuf *b, const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        size_t bad = utf8_check(text + i, n - i);
        if (tbuf_put(b, text + i, bad)) return -1;
        i += bad;
        if (i >= n) break;
        if (tbuf_put(b, "\xEF\xBF\xBD", 3)) return -1;
        i += utf8_bad_len(s + i, n - i);
    }
    return 0;
}

/* Unicode's White_Space property: what Rust's \s and Oniguruma's \s match
 * (used for added tokens' lstrip and rstrip). */
static int is_white_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Rust regex's \w, which decides an added token's single_word: letters,
 * marks, decimal digits, connector punctuation, letter numbers and the
 * joiners (Alphabetic's few symbols aside). */
static int is_word_char(uint32_t c)
{
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* The code point that ends at s + n (n > 0, well-formed text). */
static uint32_t utf8_last(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = n - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    size_t len;
    return utf8_decode(s + i, &len);
}

/* ---- GPT-2's byte-level alphabet ------------------------------------------------ */

/* bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the 68
 * others for U+0100 onwards in byte order. */
static void byte_level_alphabet(uint32_t cp[256])
{
    uint32_t next = 256;
    for (unsigned b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? b : next++;
    }
}

#define BYTE_LEVEL_CP_END 0x144 /* 256 + 68: one past the alphabet's largest code point */

/* U+2581, SentencePiece's word boundary */
#define METASPACE_CHAR "\xE2\x96\x81"

/* ---- hashing --------------------------------------------------------------------- */

static uint32_t hash_bytes(const void *p, size_t n)
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

static int32_t sm_find(const strmap *m, const char *k, size_t n, uint32_t h)
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
static int32_t sm_put(strmap *m, const char *k, size_t n, uint32_t h, int32_t v0, uint32_t v1)
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

static const char *sm_key(const strmap *m, uint32_t entry) { return m->keys.p + m->e[entry].off; }

static void sm_free(strmap *m)
{
    free(m->slots);
    free(m->e);
    tbuf_free(&m->keys);
    memset(m, 0, sizeof *m);
}

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

/* ---- the shared cache: pre-token -> ids, across calls and threads ---------------------- */

/* Most of BPE's time goes to looking pairs up in a merge table of megabytes;
 * words repeat, so their ids are kept. The table belongs to the tokenizer and
 * serves every call and thread at once without locks: 64-byte slots, mapped
 * directly by hash, each with a sequence number that is odd while a writer
 * fills the slot (a seqlock). A reader that sees it odd, or changed by the
 * time it has copied the slot, takes a miss; a writer that finds it odd, or
 * loses the race to make it odd, does not write. A miss only costs the BPE
 * it would have saved, so ids never depend on what other threads do. */
#define SC_SLOTS (1u << 15) /* 2 MiB */
#define SC_KEY_MAX 24       /* bytes of a pre-token kept in a slot */
#define SC_IDS_MAX 6

typedef struct sc_slot {
    _Atomic uint64_t seq;
    /* w[0]: hash | key length << 32 | id count << 40; w[1..3]: the key; w[4..6]: the ids */
    _Atomic uint64_t w[7];
} sc_slot;

/* The ids of pre-token k (n <= SC_KEY_MAX bytes, hash h) into ids, and their count; -1 on a miss. */
static int sc_get(sc_slot *cache, uint32_t h, const char *k, size_t n, int32_t ids[SC_IDS_MAX])
{
    sc_slot *s = &cache[h & (SC_SLOTS - 1)];
    uint64_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (seq & 1) return -1;
    uint64_t d[7];
    for (int i = 0; i < 7; i++) d[i] = atomic_load_explicit(&s->w[i], memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->seq, memory_order_relaxed) != seq) return -1;
    if ((uint32_t)d[0] != h || ((d[0] >> 32) & 0xFF) != n || memcmp(&d[1], k, n) != 0) return -1;
    int count = (int)((d[0] >> 40) & 0xFF);
    memcpy(ids, &d[4], (size_t)count * sizeof *ids);
    return count;
}

static void sc_put(sc_slot *cache, uint32_t h, const char *k, size_t n, const int32_t *ids, size_t count)
{
    if (!n || n > SC_KEY_MAX || count > SC_IDS_MAX) return;
    sc_slot *s = &cache[h & (SC_SLOTS - 1)];
    uint64_t seq = atomic_load_explicit(&s->seq, memory_order_relaxed);
    if ((seq & 1) ||
        !atomic_compare_exchange_strong_explicit(&s->seq, &seq, seq + 1, memory_order_relaxed, memory_order_relaxed))
        return;
    /* the odd number is visible before any of the new words (readers fence before their second look) */
    atomic_thread_fence(memory_order_release);
    uint64_t d[7] = {0};
    d[0] = h | (uint64_t)n << 32 | (uint64_t)count << 40;
    memcpy(&d[1], k, n);
    memcpy(&d[4], ids, count * sizeof *ids);
    for (int i = 0; i < 7; i++) atomic_store_explicit(&s->w[i], d[i], memory_order_relaxed);
    atomic_store_explicit(&s->seq, seq + 2, memory_order_release);
}

/* ---- added tokens and their trie ---------------------------------------------------- */

typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    uint8_t special, single_word, lstrip, rstrip, normalized;
} added_token;

typedef struct trie_node {
    int32_t child, sibling; /* node indices, -1 for none */
    int32_t token;          /* added_token index ending here, -1 for none */
    unsigned char byte;
} trie_node;

typedef struct trie {
    trie_node *nodes; /* nodes[0] is the root */
    uint32_t n, cap;
    uint8_t first[256]; /* bytes that start some token: others are skipped at once */
    int only_first;     /* the one byte every token starts with, -1 when they differ */
} trie;

static int32_t trie_new_node(trie *tr, unsigned char byte)
{
    if (tr->n == tr->cap) {
        uint32_t cap = tr->cap ? tr->cap * 2 : 64;
        trie_node *p = realloc(tr->nodes, (size_t)cap * sizeof *p);
        if (!p) return -1;
        tr->nodes = p;
        tr->cap = cap;
    }
    tr->nodes[tr->n] = (trie_node){-1, -1, -1, byte};
    return (int32_t)tr->n++;
}

static int trie_add(trie *tr, const char *s, size_t n, int32_t token)
{
    if (!tr->n && trie_new_node(tr, 0) < 0) return -1;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int32_t ch = tr->nodes[node].child;
        while (ch >= 0 && tr->nodes[ch].byte != c) ch = tr->nodes[ch].sibling;
        if (ch < 0) {
            ch = trie_new_node(tr, c);
            if (ch < 0) return -1;
            tr->nodes[ch].sibling = tr->nodes[node].child;
            tr->nodes[node].child = ch;
        }
        node = ch;
    }
    /* a second token with the same text replaces the first, as in a map */
    tr->nodes[node].token = token;
    tr->first[(unsigned char)s[0]] = 1;
    const int32_t root_child = tr->nodes[0].child;
    tr->only_first = tr->nodes[root_child].sibling < 0 ? tr->nodes[root_child].byte : -1;
    return 0;
}

/* The longest token that starts at s: its index, its length in *len; -1 for none. */
static int32_t trie_longest(const trie *tr, const char *s, size_t n, size_t *len)
{
    int32_t node = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t ch = tr->nodes[node].child;
        while (ch >= 0 && tr->nodes[ch].byte != (unsigned char)s[i]) ch = tr->nodes[ch].sibling;
        if (ch < 0) break;
        node = ch;
        if (tr->nodes[node].token >= 0) best = tr->nodes[node].token, *len = i + 1;
    }
    return best;
}

/* ---- pipeline steps ----------------------------------------------------------------- */

typedef enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE } norm_kind;

typedef struct norm_step {
    norm_kind kind;
    char *a, *b; /* Prepend: a; Replace: pattern a, content b */
    size_t alen, blen;
} norm_step;

typedef enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE } pre_kind;
typedef enum { SCHEME_ALWAYS, SCHEME_FIRST, SCHEME_NEVER } prepend_scheme;

typedef struct pre_step {
    pre_kind kind;
    pcre2_code *re;       /* Split; ByteLevel with use_regex */
    int add_prefix_space; /* ByteLevel */
    char rep[4];          /* Metaspace: the replacement character */
    size_t rep_len;
    prepend_scheme scheme;
    int split;
} pre_step;

typedef enum { DEC_BYTE_LEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP } dec_kind;

typedef struct dec_step {
    dec_kind kind;
    char *a, *b; /* Replace: pattern a, content b */
    size_t alen, blen;
    char rep[4]; /* Metaspace's replacement, Strip's content */
    size_t rep_len;
    prepend_scheme scheme;
    size_t start, stop; /* Strip */
} dec_step;

struct mt_tokenizer {
    uint32_t n_ids;          /* the largest id plus one */
    const char **tok_str;    /* n_ids: an id's spelling (an added token's over the model's), NULL for none */
    uint32_t *tok_len;       /* n_ids */
    uint8_t *special;        /* n_ids: 1 for added tokens marked special */
    strmap vocab;            /* the model's vocabulary: spelling -> id (v0) */
    strmap raw_vocab;        /* byte-level: the raw bytes a token stands for -> id */
    strmap added_map;        /* added token content -> index into added (v0) */
    pairmap merges;
    sc_slot *cache; /* SC_SLOTS, shared by all calls */

    /* BPE options */
    int byte_fallback, ignore_merges, fuse_unk;
    char *unk_token; /* NULL for none */
    int32_t unk_id;  /* -1 when unk_token is not in the vocabulary */
    int32_t byte_tok[256]; /* byte fallback: the id of "<0xXX>", -1 when missing */
    int32_t ascii_id[128]; /* the id of each one-character ASCII token, -1 when missing */

    /* byte-level: BPE works on raw bytes */
    int byte_level;
    uint32_t bl_cp[256];                  /* byte -> the alphabet's code point */
    int16_t bl_byte[BYTE_LEVEL_CP_END];   /* code point -> byte, -1 outside the alphabet */
    char bl_str[256][2];                  /* byte -> the character's UTF-8 (1 or 2 bytes) */
    uint8_t bl_len[256];
    int32_t bl_id[256];                   /* byte -> the id of its character, -1 when missing */
    pm_entry *byte_pairs;                 /* 65536: the merge of two bytes' characters (id -1: none) */

    /* Not byte-level: when no merge can make a token in which another
     * character is followed by "▁", BPE of a text is BPE of its pieces cut
     * before each such "▁", which the cache then serves (Llama 2 has no
     * pre-tokenizer: without this its BPE runs over whole texts). */
    int split_words;

    added_token *added;
    size_t n_added;
    trie raw_trie, norm_trie; /* added tokens matched before / after normalization */

    norm_step norm[MAX_STEPS];
    size_t n_norm;
    pre_step pre[MAX_STEPS];
    size_t n_pre;
    int32_t *post_prefix, *post_suffix; /* ids the template puts before / after the text */
    size_t n_post_prefix, n_post_suffix;
    dec_step dec[MAX_STEPS];
    size_t n_dec;
    int has_decoder;
};

/* ---- loading: messages ------------------------------------------------------------------ */

typedef struct loader {
    mt_err err;
    const char *path;
    mt_tokenizer *t;
} loader;

/* Every refusal names the file, then says what is wrong. */
static mt_status lfail(loader *L, mt_status st, const char *fmt, ...) MT_PRINTF(3, 4);
static mt_status lfail(loader *L, mt_status st, const char *fmt, ...)
{
    char what[MT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mt_fail(L->err, st, "%s: %s", L->path, what);
}

static mt_status loom(loader *L) { return lfail(L, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory"); }

static const cJSON *jget(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }
static int jnull(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A component's "type", or NULL. */
static const char *jtype(const cJSON *o)
{
    const cJSON *t = jget(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static mt_status jbool(loader *L, const cJSON *o, const char *key, int def, int *out, const char *where)
{
    const cJSON *v = jget(o, key);
    if (jnull(v)) return *out = def, MT_OK;
    if (!cJSON_IsBool(v)) return lfail(L, MT_ERR_FORMAT, "%s.%s is not true or false", where, key);
    *out = cJSON_IsTrue(v);
    return MT_OK;
}

/* A required string; cJSON strings end at their NUL. */
static mt_status jstr(loader *L, const cJSON *o, const char *key, const char **out, const char *where)
{
    const cJSON *v = jget(o, key);
    if (!cJSON_IsString(v)) return lfail(L, MT_ERR_FORMAT, "%s.%s is missing or not a string", where, key);
    *out = v->valuestring;
    return MT_OK;
}

/* A whole number in [0, max]. */
static mt_status jcount(loader *L, const cJSON *v, double max, int64_t *out, const char *what)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > max || floor(v->valuedouble) != v->valuedouble)
        return lfail(L, MT_ERR_FORMAT, "%s is not a whole number in [0, %.0f]", what, max);
    *out = (int64_t)v->valuedouble;
    return MT_OK;
}

/* One character, as tokenizers' `char` fields (Metaspace's replacement). */
static mt_status jchar(loader *L, const cJSON *o, const char *key, char out[4], size_t *len, const char *where)
{
    const char *s = NULL;
    mt_status st = jstr(L, o, key, &s, where);
    if (st) return st;
    size_t n = strlen(s);
    size_t k = n ? utf8_len((const unsigned char *)s, n) : 0;
    if (!k || k != n) return lfail(L, MT_ERR_FORMAT, "%s.%s must be one character, not \"%s\"", where, key, s);
    memcpy(out, s, n);
    *len = n;
    return MT_OK;
}

static mt_status jscheme(loader *L, const cJSON *o, prepend_scheme *out, const char *where)
{
    /* tokenizers: prepend_scheme defaults to always; the older add_prefix_space: false means never */
    *out = SCHEME_ALWAYS;
    const cJSON *v = jget(o, "prepend_scheme");
    if (!jnull(v)) {
        if (!cJSON_IsString(v)) return lfail(L, MT_ERR_FORMAT, "%s.prepend_scheme is not a string", where);
        if (!strcmp(v->valuestring, "always")) *out = SCHEME_ALWAYS;
        else if (!strcmp(v->valuestring, "first")) *out = SCHEME_FIRST;
        else if (!strcmp(v->valuestring, "never")) *out = SCHEME_NEVER;
        else
            return lfail(L, MT_ERR_FORMAT, "%s.prepend_scheme '%s' is not always, first or never", where,
                         v->valuestring);
    }
    const cJSON *aps = jget(o, "add_prefix_space");
    if (cJSON_IsFalse(aps)) *out = SCHEME_NEVER;
    return MT_OK;
}

/* A copy of a pattern's {"String": s}; Regex patterns are named and refused. */
static mt_status jstring_pattern(loader *L, const cJSON *o, char **out, size_t *len, const char *where)
{
    const cJSON *p = jget(o, "pattern");
    const cJSON *s = cJSON_IsObject(p) ? jget(p, "String") : NULL;
    if (cJSON_IsObject(p) && jget(p, "Regex"))
        return lfail(L, MT_ERR_UNSUPPORTED, "%s: a Regex pattern is not supported here (supported: String)", where);
    if (!cJSON_IsString(s)) return lfail(L, MT_ERR_FORMAT, "%s.pattern is not {\"String\": ...}", where);
    if (!s->valuestring[0]) return lfail(L, MT_ERR_FORMAT, "%s.pattern is the empty string", where);
    size_t n = strlen(s->valuestring);
    if (utf8_check(s->valuestring, n) != n) return lfail(L, MT_ERR_FORMAT, "%s.pattern is not valid UTF-8", where);
    *out = strdup(s->valuestring);
    if (!*out) return loom(L);
    *len = strlen(*out);
    return MT_OK;
}

/* A copy of a string that goes into text (so it must be UTF-8: the regexes
 * match without checking). */
static mt_status jstrdup(loader *L, const cJSON *o, const char *key, char **out, size_t *len, const char *where)
{
    const char *s = NULL;
    mt_status st = jstr(L, o, key, &s, where);
    if (st) return st;
    if (utf8_check(s, strlen(s)) != strlen(s)) return lfail(L, MT_ERR_FORMAT, "%s.%s is not valid UTF-8", where, key);
    *out = strdup(s);
    if (!*out) return loom(L);
    *len = strlen(s);
    return MT_OK;
}

/* ---- loading: regexes ------------------------------------------------------------------------ */

/* Oniguruma's \s (White_Space); PCRE2's also has U+180E. Written as class items. */
#define ONIG_SPACE                                                                                               \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
/* Oniguruma's \w: letters, marks, decimal digits, connector punctuation (PCRE2 10.42's: \p{L}, \p{N}, _). */
#define ONIG_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
/* Oniguruma's \h is a hexadecimal digit (PCRE2's: horizontal space). */
#define ONIG_HEX "0-9a-fA-F"

/* Rewrites an Oniguruma pattern (what tokenizers compiles) for PCRE2: \s, \w
 * and \h take Oniguruma's meanings, inside and outside classes; \S, \W and \H
 * outside classes. Everything else passes through: the two share the syntax
 * of tokenizer.json regexes (\p{..}, (?i:..), lookahead, {m,n}). */
static int translate_regex(const char *src, tbuf *out)
{
    int in_class = 0;
    for (size_t i = 0; src[i]; i++) {
        char c = src[i];
        if (c == '\\' && src[i + 1]) {
            char e = src[++i];
            const char *items = e == 's' || e == 'S' ? ONIG_SPACE : e == 'w' || e == 'W' ? ONIG_WORD
                              : e == 'h' || e == 'H' ? ONIG_HEX : NULL;
            int negated = e == 'S' || e == 'W' || e == 'H';
            if (items && in_class && !negated) {
                if (tbuf_put(out, items, strlen(items))) return -1;
            } else if (items && !in_class) {
                if (tbuf_put(out, negated ? "[^" : "[", negated ? 2 : 1) || tbuf_put(out, items, strlen(items)) ||
                    tbuf_put(out, "]", 1))
                    return -1;
            } else {
                /* negated shorthands inside a class keep PCRE2's meaning */
                char esc[2] = {'\\', e};
                if (tbuf_put(out, esc, 2)) return -1;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            if (tbuf_put(out, &c, 1)) return -1;
            if (src[i + 1] == '^') {
                if (tbuf_put(out, "^", 1)) return -1;
                i++;
            }
            if (src[i + 1] == ']') { /* a ']' first in a class is itself */
                if (tbuf_put(out, "]", 1)) return -1;
                i++;
            }
            continue;
        }
        if (in_class && c == '[' && src[i + 1] == ':') { /* [:alpha:] */
            const char *end = strstr(src + i, ":]");
            size_t n = end ? (size_t)(end - (src + i)) + 2 : 1;
            if (tbuf_put(out, src + i, n)) return -1;
            i += n - 1;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        if (tbuf_put(out, &c, 1)) return -1;
    }
    return tbuf_put(out, "", 1);
}

static mt_status compile_regex(loader *L, const char *pattern, int literal, pcre2_code **out, const char *where)
{
    tbuf pat = {0};
    if (literal ? tbuf_put(&pat, pattern, strlen(pattern) + 1) : translate_regex(pattern, &pat)) {
        tbuf_free(&pat);
        return loom(L);
    }
    int code;
    PCRE2_SIZE off;
    /* PCRE2_UCP does not go with PCRE2_LITERAL, nor does a literal need it */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat.p, PCRE2_ZERO_TERMINATED, opts, &code, &off, NULL);
    tbuf_free(&pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return lfail(L, MT_ERR_UNSUPPORTED,
                     "%s: the regex does not compile: %s (near offset %zu of the rewritten pattern)", where,
                     (const char *)msg, (size_t)off);
    }
    /* without JIT (a platform that lacks it) the interpreter gives the same matches, slower */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return MT_OK;
}

/* GPT-2's pre-tokenizer regex, ByteLevel's use_regex. */
static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- loading: the model ----------------------------------------------------------------------- */

static mt_status vocab_id(loader *L, const char *tok, int32_t *id)
{
    int32_t e = sm_find(&L->t->vocab, tok, strlen(tok), hash_bytes(tok, strlen(tok)));
    *id = e < 0 ? -1 : L->t->vocab.e[e].v0;
    return MT_OK;
}

static mt_status load_vocab(loader *L, const cJSON *vocab)
{
    mt_tokenizer *t = L->t;
    if (!cJSON_IsObject(vocab)) return lfail(L, MT_ERR_FORMAT, "model.vocab is missing or not an object");
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab)
    {
        int64_t id;
        char what[96];
        snprintf(what, sizeof what, "the id of vocabulary token \"%.40s\"", v->string);
        mt_status st = jcount(L, v, MAX_TOKEN_ID, &id, what);
        if (st) return st;
        size_t n = strlen(v->string);
        if (utf8_check(v->string, n) != n)
            return lfail(L, MT_ERR_FORMAT, "vocabulary token %lld is not valid UTF-8", (long long)id);
        if (sm_put(&t->vocab, v->string, n, hash_bytes(v->string, n), (int32_t)id, 0) < 0) return loom(L);
        if ((uint32_t)id + 1 > t->n_ids) t->n_ids = (uint32_t)id + 1;
    }
    if (!t->vocab.n) return lfail(L, MT_ERR_FORMAT, "model.vocab is empty");
    return MT_OK;
}

static mt_status load_merges(loader *L, const cJSON *merges)
{
    mt_tokenizer *t = L->t;
    /* no merges is a vocabulary of whole tokens: the table exists all the same */
    if (!jnull(merges) && !cJSON_IsArray(merges)) return lfail(L, MT_ERR_FORMAT, "model.merges is not an array");
    size_t n = jnull(merges) ? 0 : (size_t)cJSON_GetArraySize(merges);
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)n) slots *= 2;
    t->merges.e = malloc(slots * sizeof *t->merges.e);
    if (!t->merges.e) return loom(L);
    for (uint64_t i = 0; i < slots; i++) t->merges.e[i].key = PM_EMPTY;
    t->merges.mask = slots - 1;

    tbuf joined = {0};
    mt_status st = MT_OK;
    size_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        /* "a b" (tokenizers < 0.20) or ["a", "b"] */
        const char *a, *b;
        size_t alen, blen;
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = lfail(L, MT_ERR_FORMAT, "model.merges[%zu] \"%s\" is not two tokens separated by one space", rank,
                           m->valuestring);
                break;
            }
            a = m->valuestring, alen = (size_t)(sp - a);
            b = sp + 1, blen = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = m->child->valuestring, alen = strlen(a);
            b = m->child->next->valuestring, blen = strlen(b);
        } else {
            st = lfail(L, MT_ERR_FORMAT, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", rank);
            break;
        }
        joined.n = 0;
        if (tbuf_put(&joined, a, alen) || tbuf_put(&joined, "", 1)) {
            st = loom(L);
            break;
        }
        size_t b_at = joined.n;
        if (tbuf_put(&joined, b, blen) || tbuf_put(&joined, "", 1) || tbuf_put(&joined, a, alen) ||
            tbuf_put(&joined, b, blen) || tbuf_put(&joined, "", 1)) {
            st = loom(L);
            break;
        }
        const char *ab = joined.p + b_at + blen + 1;
        int32_t ia = -1, ib = -1, iab = -1;
        vocab_id(L, joined.p, &ia);
        vocab_id(L, joined.p + b_at, &ib);
        vocab_id(L, ab, &iab);
        if (ia < 0 || ib < 0 || iab < 0) {
            const char *missing = ia < 0 ? joined.p : ib < 0 ? joined.p + b_at : ab;
            st = lfail(L, MT_ERR_FORMAT,
                       "model.merges[%zu] (\"%s\" + \"%s\") names \"%s\", which is not in the vocabulary", rank,
                       joined.p, joined.p + b_at, missing);
            break;
        }
        /* a pair listed twice keeps its last rank, as tokenizers' map does */
        const uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint64_t i = pm_slot(key, t->merges.mask);
        while (t->merges.e[i].key != PM_EMPTY && t->merges.e[i].key != key) i = (i + 1) & t->merges.mask;
        t->merges.e[i] = (pm_entry){key, (uint32_t)rank, iab};
        rank++;
    }
    tbuf_free(&joined);
    return st;
}

static mt_status load_model(loader *L, const cJSON *model)
{
    mt_tokenizer *t = L->t;
    if (!cJSON_IsObject(model)) return lfail(L, MT_ERR_FORMAT, "has no \"model\" object");
    const char *type = jtype(model);
    if (!type) return lfail(L, MT_ERR_UNSUPPORTED, "model has no type (supported: BPE)");
    if (strcmp(type, "BPE") != 0)
        return lfail(L, MT_ERR_UNSUPPORTED, "model type '%s' is not supported (supported: BPE)", type);

    const cJSON *dropout = jget(model, "dropout");
    if (!jnull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return lfail(L, MT_ERR_UNSUPPORTED,
                     "model.dropout is set: BPE dropout samples merges at random, which this library does not do");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = jget(model, affixes[i]);
        if (!jnull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return lfail(L, MT_ERR_UNSUPPORTED, "model.%s is set: not supported (only null or \"\")", affixes[i]);
    }
    mt_status st;
    if ((st = jbool(L, model, "byte_fallback", 0, &t->byte_fallback, "model")) ||
        (st = jbool(L, model, "ignore_merges", 0, &t->ignore_merges, "model")) ||
        (st = jbool(L, model, "fuse_unk", 0, &t->fuse_unk, "model")))
        return st;
    const cJSON *unk = jget(model, "unk_token");
    if (!jnull(unk)) {
        if (!cJSON_IsString(unk)) return lfail(L, MT_ERR_FORMAT, "model.unk_token is not a string");
        t->unk_token = strdup(unk->valuestring);
        if (!t->unk_token) return loom(L);
    }
    if ((st = load_vocab(L, jget(model, "vocab")))) return st;
    if ((st = load_merges(L, jget(model, "merges")))) return st;
    /* tokenizers fails an encode that needs unk_token when it is not in the
     * vocabulary, not the load: a byte-level vocabulary never needs it */
    t->unk_id = -1;
    if (t->unk_token) vocab_id(L, t->unk_token, &t->unk_id);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        vocab_id(L, name, &t->byte_tok[b]);
    }
    for (int c = 0; c < 128; c++) {
        char s[2] = {(char)c, 0};
        t->ascii_id[c] = -1;
        if (c) vocab_id(L, s, &t->ascii_id[c]);
    }
    return MT_OK;
}

/* ---- loading: normalizers ------------------------------------------------------------------- */

#define NORM_SUPPORTED "NFC, Prepend, Replace, Sequence"

static mt_status load_normalizer(loader *L, const cJSON *o, const char *where, int depth)
{
    mt_tokenizer *t = L->t;
    if (jnull(o)) return MT_OK;
    const char *type = jtype(o);
    if (!type) return lfail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "normalizers");
        if (!cJSON_IsArray(list)) return lfail(L, MT_ERR_FORMAT, "%s.normalizers is not an array", where);
        if (depth >= MAX_NESTING) return lfail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", where, i++);
            mt_status st = load_normalizer(L, x, sub, depth + 1);
            if (st) return st;
        }
        return MT_OK;
    }
    if (t->n_norm == MAX_STEPS) return lfail(L, MT_ERR_UNSUPPORTED, "%s: more than %d normalizers", where, MAX_STEPS);
    norm_step *s = &t->norm[t->n_norm];
    memset(s, 0, sizeof *s);
    mt_status st = MT_OK;
    if (!strcmp(type, "NFC")) {
        s->kind = NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        s->kind = NORM_PREPEND;
        st = jstrdup(L, o, "prepend", &s->a, &s->alen, where);
    } else if (!strcmp(type, "Replace")) {
        s->kind = NORM_REPLACE;
        st = jstring_pattern(L, o, &s->a, &s->alen, where);
        if (!st) st = jstrdup(L, o, "content", &s->b, &s->blen, where);
    } else {
        return lfail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " NORM_SUPPORTED ")", where,
                     type);
    }
    t->n_norm++; /* counted even on failure, so that free() finds its strings */
    return st;
}

/* ---- loading: pre-tokenizers ------------------------------------------------------------------ */

#define PRE_SUPPORTED "Split, ByteLevel, Metaspace, Sequence"

static mt_status load_pre_tokenizer(loader *L, const cJSON *o, const char *where, int depth)
{
    mt_tokenizer *t = L->t;
    if (jnull(o)) return MT_OK;
    const char *type = jtype(o);
    if (!type) return lfail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "pretokenizers");
        if (!cJSON_IsArray(list)) return lfail(L, MT_ERR_FORMAT, "%s.pretokenizers is not an array", where);
        if (depth >= MAX_NESTING) return lfail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", where, i++);
            mt_status st = load_pre_tokenizer(L, x, sub, depth + 1);
            if (st) return st;
        }
        return MT_OK;
    }
    if (t->byte_level)
        return lfail(L, MT_ERR_UNSUPPORTED,
                     "%s: a %s after the ByteLevel pre-tokenizer is not supported (ByteLevel must come last)", where,
                     type);
    if (t->n_pre == MAX_STEPS) return lfail(L, MT_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", where, MAX_STEPS);
    pre_step *s = &t->pre[t->n_pre];
    memset(s, 0, sizeof *s);
    mt_status st;
    if (!strcmp(type, "Split")) {
        s->kind = PRE_SPLIT;
        const char *behavior = NULL;
        int invert = 0;
        if ((st = jstr(L, o, "behavior", &behavior, where)) || (st = jbool(L, o, "invert", 0, &invert, where)))
            return st;
        if (strcmp(behavior, "Isolated") != 0)
            return lfail(L, MT_ERR_UNSUPPORTED, "%s (Split): behavior '%s' is not supported (supported: Isolated)",
                         where, behavior);
        if (invert) return lfail(L, MT_ERR_UNSUPPORTED, "%s (Split): invert true is not supported", where);
        const cJSON *p = jget(o, "pattern");
        const cJSON *re = cJSON_IsObject(p) ? jget(p, "Regex") : NULL;
        const cJSON *str = cJSON_IsObject(p) ? jget(p, "String") : NULL;
        if (cJSON_IsString(re)) st = compile_regex(L, re->valuestring, 0, &s->re, where);
        else if (cJSON_IsString(str) && str->valuestring[0]) st = compile_regex(L, str->valuestring, 1, &s->re, where);
        else return lfail(L, MT_ERR_FORMAT, "%s.pattern is neither {\"Regex\": ...} nor {\"String\": ...}", where);
        if (st) return st;
    } else if (!strcmp(type, "ByteLevel")) {
        s->kind = PRE_BYTE_LEVEL;
        int use_regex;
        /* tokenizers' defaults: add_prefix_space true, use_regex true */
        if ((st = jbool(L, o, "add_prefix_space", 1, &s->add_prefix_space, where)) ||
            (st = jbool(L, o, "use_regex", 1, &use_regex, where)))
            return st;
        if (use_regex && (st = compile_regex(L, GPT2_REGEX, 0, &s->re, where))) return st;
        t->byte_level = 1;
    } else if (!strcmp(type, "Metaspace")) {
        s->kind = PRE_METASPACE;
        if ((st = jchar(L, o, "replacement", s->rep, &s->rep_len, where)) || (st = jscheme(L, o, &s->scheme, where)) ||
            (st = jbool(L, o, "split", 1, &s->split, where)))
            return st;
    } else {
        return lfail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " PRE_SUPPORTED ")", where,
                     type);
    }
    t->n_pre++;
    return MT_OK;
}

/* ---- loading: added tokens ------------------------------------------------------------------- */

static mt_status normalize_string(const mt_tokenizer *t, const char *s, size_t n, tbuf *a, tbuf *b, const char **out,
                                  size_t *out_n);

static mt_status load_added_tokens(loader *L, const cJSON *list)
{
    mt_tokenizer *t = L->t;
    if (jnull(list)) return MT_OK;
    if (!cJSON_IsArray(list)) return lfail(L, MT_ERR_FORMAT, "added_tokens is not an array");
    size_t n = (size_t)cJSON_GetArraySize(list);
    if (!n) return MT_OK;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added) return loom(L);
    tbuf norm = {0}, tmp = {0};
    mt_status st = MT_OK;
    const cJSON *o;
    cJSON_ArrayForEach(o, list)
    {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", t->n_added);
        added_token *a = &t->added[t->n_added];
        const char *content = NULL;
        int64_t id = 0;
        int special = 0, single_word = 0, lstrip = 0, rstrip = 0, normalized = 0;
        if (!cJSON_IsObject(o)) {
            st = lfail(L, MT_ERR_FORMAT, "%s is not an object", where);
            break;
        }
        char idwhat[96];
        snprintf(idwhat, sizeof idwhat, "%s.id", where);
        if ((st = jstr(L, o, "content", &content, where)) ||
            (st = jcount(L, jget(o, "id"), MAX_TOKEN_ID, &id, idwhat)) ||
            (st = jbool(L, o, "special", 0, &special, where)) ||
            (st = jbool(L, o, "single_word", 0, &single_word, where)) ||
            (st = jbool(L, o, "lstrip", 0, &lstrip, where)) || (st = jbool(L, o, "rstrip", 0, &rstrip, where)) ||
            /* tokenizers' AddedToken::from: special tokens are not normalized unless told */
            (st = jbool(L, o, "normalized", !special, &normalized, where)))
            break;
        size_t len = strlen(content);
        if (!len) {
            st = lfail(L, MT_ERR_FORMAT, "%s.content is empty", where);
            break;
        }
        if (utf8_check(content, len) != len) {
            st = lfail(L, MT_ERR_FORMAT, "%s.content is not valid UTF-8", where);
            break;
        }
        a->content = strdup(content);
        if (!a->content) {
            st = loom(L);
            break;
        }
        a->len = len;
        a->id = (int32_t)id;
        a->special = (uint8_t)special, a->single_word = (uint8_t)single_word;
        a->lstrip = (uint8_t)lstrip, a->rstrip = (uint8_t)rstrip, a->normalized = (uint8_t)normalized;
        int32_t idx = (int32_t)t->n_added++;
        if ((uint32_t)id + 1 > t->n_ids) t->n_ids = (uint32_t)id + 1;
        if (sm_put(&t->added_map, content, len, hash_bytes(content, len), idx, 0) < 0) {
            st = loom(L);
            break;
        }
        /* a normalized token is looked for in normalized text, so its own text is normalized too */
        if (normalized && t->n_norm) {
            const char *np;
            size_t nn;
            st = normalize_string(t, content, len, &norm, &tmp, &np, &nn);
            if (st) {
                st = st == MT_ERR_OUT_OF_HOST_MEMORY ? loom(L)
                                                     : lfail(L, st, "%s: cannot normalize its content", where);
                break;
            }
            if (nn && trie_add(&t->norm_trie, np, nn, idx)) {
                st = loom(L);
                break;
            }
        } else if (trie_add(normalized ? &t->norm_trie : &t->raw_trie, content, len, idx)) {
            st = loom(L);
            break;
        }
    }
    tbuf_free(&norm);
    tbuf_free(&tmp);
    return st;
}

/* ---- loading: post-processor ---------------------------------------------------------------- */

#define POST_SUPPORTED "ByteLevel, TemplateProcessing, Sequence"

static mt_status push_ids(loader *L, int32_t **ids, size_t *n, const int32_t *add, size_t k, int front)
{
    int32_t *p = realloc(*ids, (*n + k + 1) * sizeof *p);
    if (!p) return loom(L);
    *ids = p;
    if (front) {
        memmove(p + k, p, *n * sizeof *p);
        memcpy(p, add, k * sizeof *p);
    } else {
        memcpy(p + *n, add, k * sizeof *p);
    }
    *n += k;
    return MT_OK;
}

/* TemplateProcessing's "single" template: the special tokens before and
 * after $A. A later processor of a Sequence wraps what the earlier made. */
static mt_status load_template(loader *L, const cJSON *o, const char *where)
{
    mt_tokenizer *t = L->t;
    const cJSON *single = jget(o, "single");
    const cJSON *specials = jget(o, "special_tokens");
    if (!cJSON_IsArray(single)) return lfail(L, MT_ERR_FORMAT, "%s.single is not an array", where);
    int32_t *before = NULL, *after = NULL;
    size_t n_before = 0, n_after = 0;
    int seen_a = 0;
    mt_status st = MT_OK;
    const cJSON *item;
    cJSON_ArrayForEach(item, single)
    {
        const cJSON *seq = jget(item, "Sequence");
        const cJSON *sp = jget(item, "SpecialToken");
        if (cJSON_IsObject(seq)) {
            const cJSON *id = jget(seq, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0 || seen_a) {
                st = lfail(L, MT_ERR_UNSUPPORTED, "%s.single must hold the sequence A once (a single text's template)",
                           where);
                break;
            }
            seen_a = 1;
        } else if (cJSON_IsObject(sp)) {
            const cJSON *name = jget(sp, "id");
            const cJSON *def =
                cJSON_IsString(name) && cJSON_IsObject(specials) ? jget(specials, name->valuestring) : NULL;
            const cJSON *ids = def ? jget(def, "ids") : NULL;
            if (!cJSON_IsArray(ids)) {
                st = lfail(L, MT_ERR_FORMAT, "%s: special token \"%s\" of the template has no ids in special_tokens",
                           where, cJSON_IsString(name) ? name->valuestring : "?");
                break;
            }
            const cJSON *x;
            cJSON_ArrayForEach(x, ids)
            {
                int64_t id;
                if ((st = jcount(L, x, MAX_TOKEN_ID, &id, "a template special token's id"))) break;
                if ((uint32_t)id >= t->n_ids) {
                    st = lfail(L, MT_ERR_FORMAT,
                               "%s: special token \"%s\" has id %lld, outside the vocabulary (%u ids)", where,
                               name->valuestring, (long long)id, t->n_ids);
                    break;
                }
                int32_t v = (int32_t)id;
                if ((st = seen_a ? push_ids(L, &after, &n_after, &v, 1, 0) : push_ids(L, &before, &n_before, &v, 1, 0)))
                    break;
            }
            if (st) break;
        } else {
            st = lfail(L, MT_ERR_FORMAT, "%s.single holds an item that is neither SpecialToken nor Sequence", where);
            break;
        }
    }
    if (!st && !seen_a) st = lfail(L, MT_ERR_FORMAT, "%s.single has no sequence A", where);
    if (!st && n_before) st = push_ids(L, &t->post_prefix, &t->n_post_prefix, before, n_before, 1);
    if (!st && n_after) st = push_ids(L, &t->post_suffix, &t->n_post_suffix, after, n_after, 0);
    free(before);
    free(after);
    return st;
}

static mt_status load_post_processor(loader *L, const cJSON *o, const char *where, int depth)
{
    if (jnull(o)) return MT_OK;
    const char *type = jtype(o);
    if (!type) return lfail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "ByteLevel")) return MT_OK; /* it only trims offsets */
    if (!strcmp(type, "TemplateProcessing")) return load_template(L, o, where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "processors");
        if (!cJSON_IsArray(list)) return lfail(L, MT_ERR_FORMAT, "%s.processors is not an array", where);
        if (depth >= MAX_NESTING) return lfail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.processors[%d]", where, i++);
            mt_status st = load_post_processor(L, x, sub, depth + 1);
            if (st) return st;
        }
        return MT_OK;
    }
    return lfail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " POST_SUPPORTED ")", where, type);
}

/* ---- loading: decoders ---------------------------------------------------------------------------- */

#define DEC_SUPPORTED "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence"

static mt_status load_decoder(loader *L, const cJSON *o, const char *where, int depth)
{
    mt_tokenizer *t = L->t;
    if (jnull(o)) return MT_OK;
    t->has_decoder = 1;
    const char *type = jtype(o);
    if (!type) return lfail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "decoders");
        if (!cJSON_IsArray(list)) return lfail(L, MT_ERR_FORMAT, "%s.decoders is not an array", where);
        if (depth >= MAX_NESTING) return lfail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.decoders[%d]", where, i++);
            mt_status st = load_decoder(L, x, sub, depth + 1);
            if (st) return st;
        }
        return MT_OK;
    }
    if (t->n_dec == MAX_STEPS) return lfail(L, MT_ERR_UNSUPPORTED, "%s: more than %d decoders", where, MAX_STEPS);
    dec_step *s = &t->dec[t->n_dec];
    memset(s, 0, sizeof *s);
    mt_status st = MT_OK;
    if (!strcmp(type, "ByteLevel")) {
        s->kind = DEC_BYTE_LEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        s->kind = DEC_METASPACE;
        if (!(st = jchar(L, o, "replacement", s->rep, &s->rep_len, where))) st = jscheme(L, o, &s->scheme, where);
    } else if (!strcmp(type, "Replace")) {
        s->kind = DEC_REPLACE;
        st = jstring_pattern(L, o, &s->a, &s->alen, where);
        if (!st) st = jstrdup(L, o, "content", &s->b, &s->blen, where);
    } else if (!strcmp(type, "ByteFallback")) {
        s->kind = DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        s->kind = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        s->kind = DEC_STRIP;
        int64_t start = 0, stop = 0;
        char what[300];
        st = jchar(L, o, "content", s->rep, &s->rep_len, where);
        if (!st) {
            snprintf(what, sizeof what, "%s.start", where);
            st = jcount(L, jget(o, "start"), 1e9, &start, what);
        }
        if (!st) {
            snprintf(what, sizeof what, "%s.stop", where);
            st = jcount(L, jget(o, "stop"), 1e9, &stop, what);
        }
        s->start = (size_t)start, s->stop = (size_t)stop;
    } else {
        return lfail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " DEC_SUPPORTED ")", where,
                     type);
    }
    t->n_dec++;
    return st;
}

/* ---- loading: tables ---------------------------------------------------------------------------- */

/* The spelling of every id (added tokens over the model's), the specials,
 * and for byte-level models the vocabulary indexed by raw bytes. */
static mt_status build_tables(loader *L)
{
    mt_tokenizer *t = L->t;
    t->cache = aligned_alloc(64, SC_SLOTS * sizeof *t->cache);
    if (!t->cache) return loom(L);
    for (uint32_t i = 0; i < SC_SLOTS; i++) {
        atomic_init(&t->cache[i].seq, 0);
        for (int j = 0; j < 7; j++) atomic_init(&t->cache[i].w[j], 0); /* key length 0: no pre-token */
    }
    t->tok_str = calloc(t->n_ids, sizeof *t->tok_str);
    t->tok_len = calloc(t->n_ids, sizeof *t->tok_len);
    t->special = calloc(t->n_ids, 1);
    if (!t->tok_str || !t->tok_len || !t->special) return loom(L);
    for (uint32_t e = 0; e < t->vocab.n; e++) {
        int32_t id = t->vocab.e[e].v0;
        t->tok_str[id] = sm_key(&t->vocab, e);
        t->tok_len[id] = t->vocab.e[e].len;
    }
    if (!t->byte_level) {
        /* split_words: "▁" is a token, and no merge makes one with "▁" after another character */
        int32_t meta = -1;
        vocab_id(L, METASPACE_CHAR, &meta);
        t->split_words = meta >= 0;
        for (uint64_t i = 0; t->split_words && i <= t->merges.mask; i++) {
            const pm_entry *m = &t->merges.e[i];
            if (m->key == PM_EMPTY) continue;
            const char *tok = t->tok_str[m->id];
            for (const char *hit = strstr(tok, METASPACE_CHAR); hit; hit = strstr(hit + 3, METASPACE_CHAR))
                if (hit > tok && (hit - tok < 3 || memcmp(hit - 3, METASPACE_CHAR, 3) != 0)) t->split_words = 0;
        }
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        t->tok_str[a->id] = a->content;
        t->tok_len[a->id] = (uint32_t)a->len;
        t->special[a->id] = a->special;
    }
    /* every id an encode gives must decode */
    for (size_t i = 0; i < t->n_post_prefix + t->n_post_suffix; i++) {
        int32_t id = i < t->n_post_prefix ? t->post_prefix[i] : t->post_suffix[i - t->n_post_prefix];
        if (!t->tok_str[id])
            return lfail(L, MT_ERR_FORMAT, "post_processor: the template's special token id %d is no token's id", id);
    }

    byte_level_alphabet(t->bl_cp);
    for (uint32_t c = 0; c < BYTE_LEVEL_CP_END; c++) t->bl_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        t->bl_byte[t->bl_cp[b]] = (int16_t)b;
        t->bl_len[b] = (uint8_t)utf8_encode(t->bl_cp[b], t->bl_str[b]);
        int32_t e = sm_find(&t->vocab, t->bl_str[b], t->bl_len[b], hash_bytes(t->bl_str[b], t->bl_len[b]));
        t->bl_id[b] = e < 0 ? -1 : t->vocab.e[e].v0;
    }
    if (!t->byte_level) return MT_OK;
    t->byte_pairs = malloc(65536 * sizeof *t->byte_pairs);
    if (!t->byte_pairs) return loom(L);
    for (int b = 0; b < 65536; b++) {
        int32_t l = t->bl_id[b >> 8], r = t->bl_id[b & 255];
        const pm_entry *m = l >= 0 && r >= 0 ? pm_find(&t->merges, l, r) : NULL;
        t->byte_pairs[b] = m ? *m : (pm_entry){0, 0, -1};
    }
    tbuf raw = {0};
    for (uint32_t e = 0; e < t->vocab.n; e++) {
        const unsigned char *s = (const unsigned char *)sm_key(&t->vocab, e);
        size_t n = t->vocab.e[e].len, i = 0;
        raw.n = 0;
        while (i < n) {
            size_t k;
            uint32_t c = utf8_decode(s + i, &k);
            if (c >= BYTE_LEVEL_CP_END || t->bl_byte[c] < 0) break;
            char byte = (char)t->bl_byte[c];
            if (tbuf_put(&raw, &byte, 1)) {
                tbuf_free(&raw);
                return loom(L);
            }
            i += k;
        }
        /* a token outside the alphabet can never come out of byte-level BPE */
        if (i < n) continue;
        if (sm_put(&t->raw_vocab, raw.p, raw.n, hash_bytes(raw.p, raw.n), t->vocab.e[e].v0, 0) < 0) {
            tbuf_free(&raw);
            return loom(L);
        }
    }
    tbuf_free(&raw);
    return MT_OK;
}

void mt_tokenizer_free(mt_tokenizer *t)
{
    if (!t) return;
    free(t->tok_str);
    free(t->tok_len);
    free(t->special);
    sm_free(&t->vocab);
    sm_free(&t->raw_vocab);
    sm_free(&t->added_map);
    free(t->merges.e);
    free(t->cache);
    free(t->byte_pairs);
    free(t->unk_token);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->raw_trie.nodes);
    free(t->norm_trie.nodes);
    for (size_t i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (size_t i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    /* a step that failed half-way was not counted but may hold a regex */
    if (t->n_pre < MAX_STEPS) pcre2_code_free(t->pre[t->n_pre].re);
    free(t->post_prefix);
    free(t->post_suffix);
    for (size_t i = 0; i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    free(t);
}

static mt_status load_all(loader *L, const cJSON *root)
{
    mt_status st;
    if ((st = load_model(L, jget(root, "model")))) return st;
    if ((st = load_normalizer(L, jget(root, "normalizer"), "normalizer", 0))) return st;
    if ((st = load_added_tokens(L, jget(root, "added_tokens")))) return st;
    if ((st = load_pre_tokenizer(L, jget(root, "pre_tokenizer"), "pre_tokenizer", 0))) return st;
    if ((st = load_post_processor(L, jget(root, "post_processor"), "post_processor", 0))) return st;
    if ((st = load_decoder(L, jget(root, "decoder"), "decoder", 0))) return st;
    /* truncation and padding are left to the caller, as transformers does */
    return build_tables(L);
}

mt_status mt_tokenizer_load(mt_tokenizer **out, const char *path)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_load: path is NULL");
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) != 0) return mt_fail(err, MT_ERR_IO, "cannot open tokenizer %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        if (strlen(path) + sizeof "/tokenizer.json" > sizeof file)
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "path too long: %s", path);
        mt_path_join(file, sizeof file, path, "tokenizer.json");
        if (stat(file, &sb) != 0)
            return mt_fail(err, MT_ERR_IO, "folder %s has no tokenizer.json: %s", path, strerror(errno));
    } else {
        if (strlen(path) >= sizeof file) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "path too long: %s", path);
        strcpy(file, path);
    }
    cJSON *root = NULL;
    mt_status st = mt_parse_json_file(err, file, &root);
    if (st) return st;
    mt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory loading %s", file);
    }
    loader L = {err, file, t};
    st = load_all(&L, root);
    cJSON_Delete(root);
    if (st) {
        mt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

/* ---- normalizing -------------------------------------------------------------------------------- */

/* NFC with utf8proc (no NUL termination: text may hold U+0000). */
static mt_status nfc(const char *s, size_t n, tbuf *out)
{
    out->n = 0;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (r < 0) {
        free(dst);
        return r == UTF8PROC_ERROR_NOMEM ? MT_ERR_OUT_OF_HOST_MEMORY : MT_ERR_INVALID_ARGUMENT;
    }
    int bad = tbuf_put(out, dst, (size_t)r);
    free(dst);
    return bad ? MT_ERR_OUT_OF_HOST_MEMORY : MT_OK;
}

/* The normalizer's steps over s; the result in *out, *out_n: s itself when
 * no step changes it (ASCII under NFC, say), else one of the buffers a, b. */
static mt_status normalize_string(const mt_tokenizer *t, const char *s, size_t n, tbuf *a, tbuf *b, const char **out,
                                  size_t *out_n)
{
    const char *cur = s;
    for (size_t k = 0; k < t->n_norm; k++) {
        const norm_step *ns = &t->norm[k];
        tbuf *nxt = cur == a->p ? b : a;
        nxt->n = 0;
        switch (ns->kind) {
        case NORM_NFC: {
            size_t i = 0;
            while (i < n && !((unsigned char)cur[i] & 0x80)) i++;
            if (i == n) continue; /* ASCII is NFC */
            mt_status st = nfc(cur, n, nxt);
            if (st) return st;
            break;
        }
        case NORM_PREPEND: /* tokenizers prepends to non-empty text only */
            if (!n) continue;
            if (tbuf_put(nxt, ns->a, ns->alen) || tbuf_put(nxt, cur, n)) return MT_ERR_OUT_OF_HOST_MEMORY;
            break;
        case NORM_REPLACE: {
            const char *hit = n >= ns->alen ? memmem(cur, n, ns->a, ns->alen) : NULL;
            if (!hit) continue;
            size_t i = 0;
            while (hit) {
                size_t upto = (size_t)(hit - cur);
                if (tbuf_put(nxt, cur + i, upto - i) || tbuf_put(nxt, ns->b, ns->blen))
                    return MT_ERR_OUT_OF_HOST_MEMORY;
                i = upto + ns->alen;
                hit = n - i >= ns->alen ? memmem(cur + i, n - i, ns->a, ns->alen) : NULL;
            }
            if (tbuf_put(nxt, cur + i, n - i)) return MT_ERR_OUT_OF_HOST_MEMORY;
            break;
        }
        }
        cur = nxt->p, n = nxt->n;
    }
    *out = cur, *out_n = n;
    return MT_OK;
}

/* ---- encoding: the per-call workspace ---------------------------------------------------------- */

typedef struct sym {
    int32_t id;
    int32_t prev, next;
    int32_t alive;
} sym;

typedef struct merge_ent {
    uint32_t rank;
    uint32_t pos;
    int32_t left, right; /* the pair it merges, to tell when it went stale */
    int32_t id;
} merge_ent;

typedef struct enc {
    const mt_tokenizer *t;
    mt_err err;
    uint32_t flags;
    int32_t *ids; /* the caller's; written below cap, counted beyond */
    size_t cap, n;
    tbuf norm, norm_tmp;
    tbuf depth[MAX_STEPS]; /* per pre-tokenizer step: the piece it rewrote */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    sym *syms;
    size_t syms_cap;
    merge_ent *heap;
    size_t heap_cap;
    strmap cache; /* pre-token -> ids: v0 = offset into cache_ids, v1 = count */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
} enc;

static void enc_free(enc *e)
{
    tbuf_free(&e->norm);
    tbuf_free(&e->norm_tmp);
    for (int i = 0; i < MAX_STEPS; i++) tbuf_free(&e->depth[i]);
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit_stack);
    free(e->syms);
    free(e->heap);
    sm_free(&e->cache);
    free(e->cache_ids);
}

static inline void emit(enc *e, int32_t id)
{
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
}

static mt_status enc_oom(enc *e)
{
    return mt_fail(e->err, MT_ERR_OUT_OF_HOST_MEMORY, "mt_tokenizer_encode: out of host memory");
}

/* ---- encoding: BPE ------------------------------------------------------------------------------ */

static inline int merge_less(merge_ent a, merge_ent b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(merge_ent *h, size_t *n, merge_ent x)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static merge_ent heap_pop(merge_ent *h, size_t *n)
{
    merge_ent top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(h[c + 1], h[c])) c++;
        if (!merge_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

static int add_sym(enc *e, size_t *ns, int32_t id)
{
    if (*ns == e->syms_cap) {
        size_t cap = e->syms_cap ? e->syms_cap * 2 : 256;
        sym *p = realloc(e->syms, cap * sizeof *p);
        if (!p) return -1;
        e->syms = p;
        e->syms_cap = cap;
    }
    e->syms[*ns] = (sym){id, (int32_t)*ns - 1, (int32_t)*ns + 1, 1};
    (*ns)++;
    return 0;
}

/* BPE of one pre-token into e->syms, as tokenizers' merge_word: each
 * character's id, or its bytes' <0xXX> ids (byte_fallback), or unk_token
 * (consecutive ones fused with fuse_unk); then merges, lowest rank first and
 * leftmost among equals. The number of symbols (alive or not) in *out_ns. */
static mt_status bpe(enc *e, const char *w, size_t n, size_t *out_ns)
{
    const mt_tokenizer *t = e->t;
    size_t ns = 0;
    int32_t unk = -1; /* an unknown character waiting to be added (tokenizers' `unk`) */
    size_t i = 0;
    while (i < n) {
        const char *cs;
        size_t clen;
        int32_t id;
        unsigned char c = (unsigned char)w[i];
        if (t->byte_level) { /* the character that stands for byte c */
            cs = t->bl_str[c], clen = t->bl_len[c], id = t->bl_id[c];
            i++;
        } else {
            cs = w + i;
            if (c < 0x80) {
                clen = 1, id = t->ascii_id[c];
            } else {
                clen = utf8_len((const unsigned char *)cs, n - i);
                if (!clen) clen = 1; /* not reached: the text was checked, and so was every string added to it */
                int32_t en = sm_find(&t->vocab, cs, clen, hash_bytes(cs, clen));
                id = en < 0 ? -1 : t->vocab.e[en].v0;
            }
            i += clen;
        }
        if (id >= 0) {
            if (unk >= 0) {
                if (add_sym(e, &ns, unk)) return enc_oom(e);
                unk = -1;
            }
            if (add_sym(e, &ns, id)) return enc_oom(e);
            continue;
        }
        if (t->byte_fallback) {
            size_t k = 0;
            while (k < clen && t->byte_tok[(unsigned char)cs[k]] >= 0) k++;
            if (k == clen) {
                /* tokenizers adds these before an unknown character still waiting: kept as it is */
                for (k = 0; k < clen; k++)
                    if (add_sym(e, &ns, t->byte_tok[(unsigned char)cs[k]])) return enc_oom(e);
                continue;
            }
        }
        if (t->unk_token) {
            if (t->unk_id < 0)
                return mt_fail(e->err, MT_ERR_FORMAT,
                               "mt_tokenizer_encode: the text needs the unknown token \"%s\", which is not in the "
                               "vocabulary",
                               t->unk_token);
            if (unk >= 0 && !t->fuse_unk && add_sym(e, &ns, unk)) return enc_oom(e);
            unk = t->unk_id;
        }
        /* no unk_token: tokenizers drops the character */
    }
    if (unk >= 0 && add_sym(e, &ns, unk)) return enc_oom(e);
    if (ns) e->syms[ns - 1].next = -1;

    if (ns > 1) {
        if (e->heap_cap < 3 * ns) { /* at most ns - 1 pairs at first, 2 more per merge */
            free(e->heap);
            e->heap_cap = 3 * ns;
            e->heap = malloc(e->heap_cap * sizeof *e->heap);
            if (!e->heap) return e->heap_cap = 0, enc_oom(e);
        }
        sym *s = e->syms;
        merge_ent *h = e->heap;
        size_t hn = 0;
        /* the first pairs of a byte-level word are pairs of bytes: a table */
        const int bytes = t->byte_pairs && ns == n;
        for (size_t k = 0; k + 1 < ns; k++) {
            if (bytes) {
                const pm_entry *m = &t->byte_pairs[(unsigned char)w[k] << 8 | (unsigned char)w[k + 1]];
                if (m->id >= 0) heap_push(h, &hn, (merge_ent){m->rank, (uint32_t)k, s[k].id, s[k + 1].id, m->id});
                continue;
            }
            const pm_entry *m = pm_find(&t->merges, s[k].id, s[k + 1].id);
            if (m) heap_push(h, &hn, (merge_ent){m->rank, (uint32_t)k, s[k].id, s[k + 1].id, m->id});
        }
        while (hn) {
            merge_ent top = heap_pop(h, &hn);
            sym *a = &s[top.pos];
            if (!a->alive || a->next < 0) continue;
            sym *b = &s[a->next];
            /* An entry is stale when the pair at its place is no longer the
             * one it merges. tokenizers asks the merge map whether the pair
             * there now gives the same token; comparing ids is the same test
             * (symbols only grow, and one spelling has one id). */
            if (a->id != top.left || b->id != top.right) continue;
            const pm_entry *m;
            a->id = top.id;
            a->next = b->next;
            b->alive = 0;
            if (a->next >= 0) s[a->next].prev = (int32_t)top.pos;
            if (a->prev >= 0) {
                m = pm_find(&t->merges, s[a->prev].id, a->id);
                if (m) heap_push(h, &hn, (merge_ent){m->rank, (uint32_t)a->prev, s[a->prev].id, a->id, m->id});
            }
            if (a->next >= 0) {
                m = pm_find(&t->merges, a->id, s[a->next].id);
                if (m) heap_push(h, &hn, (merge_ent){m->rank, top.pos, a->id, s[a->next].id, m->id});
            }
        }
    }
    *out_ns = ns;
    return MT_OK;
}

/* The model on one pre-token: raw bytes for a byte-level tokenizer, text
 * otherwise. Short pre-tokens go through the shared cache, longer ones
 * (rare) through this call's own. */
static mt_status model_word(enc *e, const char *w, size_t n)
{
    const mt_tokenizer *t = e->t;
    if (!n) return MT_OK;
    if (t->byte_level && n == 1 && t->bl_id[(unsigned char)w[0]] >= 0) { /* one symbol: nothing to merge */
        emit(e, t->bl_id[(unsigned char)w[0]]);
        return MT_OK;
    }
    const uint32_t h = hash_bytes(w, n);
    const int shared = n <= SC_KEY_MAX;
    int32_t few[SC_IDS_MAX];
    if (shared) {
        int count = sc_get(t->cache, h, w, n, few);
        if (count >= 0) {
            for (int k = 0; k < count; k++) emit(e, few[k]);
            return MT_OK;
        }
    }
    if (t->ignore_merges) { /* Llama 3: a pre-token that is a token is that token */
        const strmap *v = t->byte_level ? &t->raw_vocab : &t->vocab;
        int32_t en = sm_find(v, w, n, h);
        if (en >= 0) {
            emit(e, v->e[en].v0);
            if (shared) sc_put(t->cache, h, w, n, &v->e[en].v0, 1);
            return MT_OK;
        }
    }
    const int own = !shared && n <= CACHE_MAX_WORD;
    if (own) {
        int32_t en = sm_find(&e->cache, w, n, h);
        if (en >= 0) {
            const int32_t *ids = e->cache_ids + e->cache.e[en].v0;
            for (uint32_t k = 0; k < e->cache.e[en].v1; k++) emit(e, ids[k]);
            return MT_OK;
        }
    }
    size_t ns = 0;
    mt_status st = bpe(e, w, n, &ns);
    if (st) return st;
    size_t count = 0;
    for (size_t k = 0; k < ns; k++) {
        if (!e->syms[k].alive) continue;
        emit(e, e->syms[k].id);
        if (count < SC_IDS_MAX) few[count] = e->syms[k].id;
        count++;
    }
    if (shared) {
        sc_put(t->cache, h, w, n, few, count);
    } else if (own && e->cache.n < CACHE_MAX_ENTRIES && e->cache_n + count <= INT32_MAX) {
        if (!e->cache_ids || e->cache_n + count > e->cache_cap) { /* allocated even for no ids (all dropped) */
            size_t cap = e->cache_cap ? e->cache_cap * 2 : 1024;
            while (cap < e->cache_n + count) cap *= 2;
            int32_t *p = realloc(e->cache_ids, cap * sizeof *p);
            if (!p) return enc_oom(e);
            e->cache_ids = p;
            e->cache_cap = cap;
        }
        int32_t *dst = e->cache_ids + e->cache_n;
        for (size_t k = 0; k < ns; k++)
            if (e->syms[k].alive) *dst++ = e->syms[k].id;
        if (sm_put(&e->cache, w, n, h, (int32_t)e->cache_n, (uint32_t)count) < 0) return enc_oom(e);
        e->cache_n += count;
    }
    return MT_OK;
}

/* ---- encoding: pre-tokenizers -------------------------------------------------------------------- */

static mt_status pre_tokenize(enc *e, size_t k, const char *p, size_t n, int first);

/* The next match of re in p[0, n) at or after pos: 1 and its bounds, 0 when none. */
static int regex_next(enc *e, const pcre2_code *re, const char *p, size_t n, size_t pos, size_t *ms, size_t *me,
                      mt_status *st)
{
    if (!e->md && !(e->md = pcre2_match_data_create(1, NULL))) return *st = enc_oom(e), 0;
    for (;;) {
        int rc = pcre2_match(re, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc >= 0) { /* 0: the ovector holds only the whole match, which is all we read */
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            *ms = ov[0], *me = ov[1];
            return 1;
        }
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->jit_stack) {
            /* a long run that backtracks: retry with a larger stack */
            e->mctx = pcre2_match_context_create(NULL);
            e->jit_stack = pcre2_jit_stack_create(32 << 10, JIT_STACK_MAX, NULL);
            if (!e->mctx || !e->jit_stack) return *st = enc_oom(e), 0;
            pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
            continue;
        }
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        *st = mt_fail(e->err, MT_ERR_UNSUPPORTED,
                      "mt_tokenizer_encode: the pre-tokenizer's regex failed on this text: %s", (const char *)msg);
        return 0;
    }
}

/* tokenizers' Split with behavior Isolated: every match a piece, and the
 * text between matches too. */
static mt_status split_regex(enc *e, size_t k, const pcre2_code *re, const char *p, size_t n, int first)
{
    size_t pos = 0, prev = 0, ms, me;
    mt_status st = MT_OK;
    while (pos <= n && regex_next(e, re, p, n, pos, &ms, &me, &st)) {
        if (ms > prev && (st = pre_tokenize(e, k + 1, p + prev, ms - prev, first && prev == 0))) return st;
        if (me > ms && (st = pre_tokenize(e, k + 1, p + ms, me - ms, first && ms == 0))) return st;
        prev = me;
        if (me > ms) {
            pos = me;
        } else { /* an empty match: look again one character on */
            if (me >= n) break;
            size_t clen = utf8_len((const unsigned char *)p + me, n - me);
            pos = me + (clen ? clen : 1);
        }
    }
    if (st) return st;
    if (prev < n) return pre_tokenize(e, k + 1, p + prev, n - prev, first && prev == 0);
    return MT_OK;
}

/* Metaspace: spaces become the replacement, which is prepended as the scheme
 * says, and (split) each replacement starts a new piece. */
static mt_status metaspace(enc *e, size_t k, const pre_step *ps, const char *p, size_t n, int first)
{
    tbuf *b = &e->depth[k];
    b->n = 0;
    const int starts = n >= ps->rep_len && memcmp(p, ps->rep, ps->rep_len) == 0;
    const int prepend = ps->scheme == SCHEME_ALWAYS ? !starts : ps->scheme == SCHEME_FIRST ? !starts && first : 0;
    if (prepend && tbuf_put(b, ps->rep, ps->rep_len)) return enc_oom(e);
    if (tbuf_reserve(b, n * ps->rep_len)) return enc_oom(e);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') memcpy(b->p + b->n, ps->rep, ps->rep_len), b->n += ps->rep_len;
        else b->p[b->n++] = p[i];
    }
    if (!ps->split) return pre_tokenize(e, k + 1, b->p, b->n, first);
    size_t cur = 0;
    for (size_t i = 1; i + ps->rep_len <= b->n; i++) {
        if (memcmp(b->p + i, ps->rep, ps->rep_len) != 0) continue;
        mt_status st = pre_tokenize(e, k + 1, b->p + cur, i - cur, first && cur == 0);
        if (st) return st;
        cur = i;
        i += ps->rep_len - 1;
    }
    return pre_tokenize(e, k + 1, b->p + cur, b->n - cur, first && cur == 0);
}

/* Step k of the pre-tokenizer on one piece (first: it starts the text), down to the model. */
static mt_status pre_tokenize(enc *e, size_t k, const char *p, size_t n, int first)
{
    const mt_tokenizer *t = e->t;
    if (!n) return MT_OK;
    if (k == t->n_pre && t->split_words) {
        size_t cur = 0;
        for (const char *hit = memmem(p, n, METASPACE_CHAR, 3); hit;
             hit = memmem(hit + 3, n - (size_t)(hit + 3 - p), METASPACE_CHAR, 3)) {
            size_t q = (size_t)(hit - p);
            if (q <= cur || (q >= 3 && memcmp(p + q - 3, METASPACE_CHAR, 3) == 0)) continue;
            mt_status st = model_word(e, p + cur, q - cur);
            if (st) return st;
            cur = q;
        }
        return model_word(e, p + cur, n - cur);
    }
    if (k == t->n_pre) return model_word(e, p, n);
    const pre_step *ps = &t->pre[k];
    switch (ps->kind) {
    case PRE_SPLIT:
        return split_regex(e, k, ps->re, p, n, first);
    case PRE_METASPACE:
        return metaspace(e, k, ps, p, n, first);
    case PRE_BYTE_LEVEL:
        /* the last step: its pieces go to the model as raw bytes */
        if (ps->add_prefix_space && p[0] != ' ') {
            tbuf *b = &e->depth[k];
            b->n = 0;
            if (tbuf_put(b, " ", 1) || tbuf_put(b, p, n)) return enc_oom(e);
            p = b->p, n = b->n;
        }
        if (ps->re) return split_regex(e, k, ps->re, p, n, first);
        return pre_tokenize(e, k + 1, p, n, first);
    }
    return MT_OK;
}


/* ---- encoding: added tokens ----------------------------------------------------------------------- */

typedef mt_status (*piece_fn)(enc *e, const char *p, size_t n, int first);

/* Splits p on the added tokens of tr as tokenizers' find_matches does:
 * matches leftmost-longest without overlap; a special token without
 * MT_ENCODE_SPECIAL, or a single_word token inside a word, is passed over
 * (what it covered stays text); lstrip and rstrip take the whitespace beside
 * a token into it. The text between tokens goes to `text` (first: the piece
 * starts the whole text). */
static mt_status split_added(enc *e, const trie *tr, const char *p, size_t n, int first, piece_fn text)
{
    const mt_tokenizer *t = e->t;
    if (!tr->n) return text(e, p, n, first);
    size_t done = 0, pos = 0; /* done: the end of the last token taken */
    while (pos < n) {
        if (tr->only_first >= 0) { /* the usual case, every token starts with '<' */
            const char *hit = memchr(p + pos, tr->only_first, n - pos);
            if (!hit) break;
            pos = (size_t)(hit - p);
        } else if (!tr->first[(unsigned char)p[pos]]) {
            pos++;
            continue;
        }
        size_t len = 0;
        int32_t ti = trie_longest(tr, p + pos, n - pos, &len);
        if (ti < 0) {
            pos++;
            continue;
        }
        const added_token *a = &t->added[ti];
        size_t start = pos, stop = pos + len, cl;
        pos = stop;
        if (a->special && !(e->flags & MT_ENCODE_SPECIAL)) continue;
        if (a->single_word && ((start > 0 && is_word_char(utf8_last(p, start))) ||
                               (stop < n && is_word_char(utf8_decode((const unsigned char *)p + stop, &cl)))))
            continue;
        if (a->lstrip) { /* back over whitespace, but not into the previous token */
            while (start > done) {
                size_t i = start - 1;
                while (i > done && ((unsigned char)p[i] & 0xC0) == 0x80) i--;
                if (!is_white_space(utf8_decode((const unsigned char *)p + i, &cl))) break;
                start = i;
            }
        }
        if (a->rstrip) {
            while (stop < n && is_white_space(utf8_decode((const unsigned char *)p + stop, &cl))) stop += cl;
            pos = stop;
        }
        if (start > done) {
            mt_status st = text(e, p + done, start - done, first && done == 0);
            if (st) return st;
        }
        emit(e, a->id);
        done = stop;
    }
    if (done < n) return text(e, p + done, n - done, first && done == 0);
    return MT_OK;
}

static mt_status encode_normalized(enc *e, const char *p, size_t n, int first)
{
    return pre_tokenize(e, 0, p, n, first);
}

/* A piece of the caller's text between added tokens: normalized, then split
 * on the added tokens that match normalized text. */
static mt_status encode_raw(enc *e, const char *p, size_t n, int first)
{
    const mt_tokenizer *t = e->t;
    if (!n) return MT_OK;
    if (t->n_norm) {
        mt_status st = normalize_string(t, p, n, &e->norm, &e->norm_tmp, &p, &n);
        if (st == MT_ERR_OUT_OF_HOST_MEMORY) return enc_oom(e);
        if (st) return mt_fail(e->err, st, "mt_tokenizer_encode: the normalizer failed on this text");
    }
    return split_added(e, &t->norm_trie, p, n, first, encode_normalized);
}

mt_status mt_tokenizer_encode(const mt_tokenizer *tok, const char *text, size_t len, uint32_t flags, int32_t *ids,
                              size_t cap, size_t *n_ids)
{
    mt_err err = mt_err_thread();
    if (n_ids) *n_ids = 0;
    if (!tok) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_encode: tokenizer is NULL");
    if (!n_ids) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_encode: n_ids is NULL");
    if (!text && len) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_encode: text is NULL");
    if (!ids && cap)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_encode: ids is NULL but cap is %zu", cap);
    if (flags & ~(uint32_t)(MT_ENCODE_SPECIAL | MT_ENCODE_ADD_SPECIAL))
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_tokenizer_encode: flags 0x%x hold bits that are not mt_encode_flag values", flags);
    size_t bad = utf8_check(text, len);
    if (bad < len)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_tokenizer_encode: the text is not valid UTF-8 at byte %zu (0x%02X)", bad,
                       (unsigned)(unsigned char)text[bad]);
    enc e;
    memset(&e, 0, sizeof e);
    e.t = tok, e.err = err, e.flags = flags, e.ids = ids, e.cap = cap;
    if (flags & MT_ENCODE_ADD_SPECIAL)
        for (size_t i = 0; i < tok->n_post_prefix; i++) emit(&e, tok->post_prefix[i]);
    mt_status st = len ? split_added(&e, &tok->raw_trie, text, len, 1, encode_raw) : MT_OK;
    if (flags & MT_ENCODE_ADD_SPECIAL)
        for (size_t i = 0; i < tok->n_post_suffix; i++) emit(&e, tok->post_suffix[i]);
    enc_free(&e);
    if (st) return st;
    *n_ids = e.n;
    return MT_OK;
}

/* ---- decoding -------------------------------------------------------------------------------------- */

/* tokenizers' decoders pass a list of strings from one step to the next. */
typedef struct chain {
    tbuf b;
    size_t *off, *len;
    size_t n, cap;
} chain;

/* Records b[from, b.n) as the next string. The buffer exists even when
 * every string is empty, so that a string's address is never NULL + 0. */
static int chain_close(chain *c, size_t from)
{
    if (!c->b.p && tbuf_reserve(&c->b, 1)) return -1;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        size_t *o = realloc(c->off, cap * sizeof *o);
        if (!o) return -1;
        c->off = o;
        size_t *l = realloc(c->len, cap * sizeof *l);
        if (!l) return -1;
        c->len = l;
        c->cap = cap;
    }
    c->off[c->n] = from;
    c->len[c->n] = c->b.n - from;
    c->n++;
    return 0;
}

static int chain_add(chain *c, const char *s, size_t n)
{
    size_t from = c->b.n;
    return tbuf_put(&c->b, s, n) || chain_close(c, from);
}

static void chain_reset(chain *c) { c->b.n = 0, c->n = 0; }

static void chain_free(chain *c)
{
    tbuf_free(&c->b);
    free(c->off);
    free(c->len);
}

/* A "<0xHH>" token's byte, or -1. */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ByteFallback's run of bytes: one string when it is UTF-8, else one U+FFFD per byte (as tokenizers). */
static int flush_bytes(chain *out, tbuf *bytes)
{
    int bad = 0;
    if (!bytes->n) return 0;
    if (utf8_check(bytes->p, bytes->n) == bytes->n) bad = chain_add(out, bytes->p, bytes->n);
    else
        for (size_t i = 0; i < bytes->n && !bad; i++) bad = chain_add(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
    return bad;
}

/* One decoder step from in to out; -1 when out of memory. */
static int decode_step(const mt_tokenizer *t, const dec_step *d, const chain *in, chain *out, tbuf *tmp)
{
    chain_reset(out);
    switch (d->kind) {
    case DEC_FUSE: {
        size_t from = out->b.n;
        for (size_t i = 0; i < in->n; i++)
            if (tbuf_put(&out->b, in->b.p + in->off[i], in->len[i])) return -1;
        return chain_close(out, from);
    }
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->b.p + in->off[i];
            size_t n = in->len[i], j = 0, from = out->b.n;
            while (j < n) {
                const char *hit = n - j >= d->alen ? memmem(s + j, n - j, d->a, d->alen) : NULL;
                size_t upto = hit ? (size_t)(hit - s) : n;
                if (tbuf_put(&out->b, s + j, upto - j)) return -1;
                if (!hit) break;
                if (tbuf_put(&out->b, d->b, d->blen)) return -1;
                j = upto + d->alen;
            }
            if (chain_close(out, from)) return -1;
        }
        return 0;
    case DEC_BYTE_FALLBACK:
        tmp->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->b.p + in->off[i];
            int byte = byte_token(s, in->len[i]);
            if (byte >= 0) {
                char c = (char)byte;
                if (tbuf_put(tmp, &c, 1)) return -1;
                continue;
            }
            if (flush_bytes(out, tmp) || chain_add(out, s, in->len[i])) return -1;
        }
        return flush_bytes(out, tmp);
    case DEC_STRIP:
        /* up to `start` leading and `stop` trailing copies of the content character */
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->b.p + in->off[i];
            size_t n = in->len[i], a = 0, z = n;
            for (size_t k = 0; k < d->start && a + d->rep_len <= n && !memcmp(s + a, d->rep, d->rep_len); k++)
                a += d->rep_len;
            for (size_t k = 0; k < d->stop && z >= a + d->rep_len && !memcmp(s + z - d->rep_len, d->rep, d->rep_len);
                 k++)
                z -= d->rep_len;
            if (chain_add(out, s + a, z - a)) return -1;
        }
        return 0;
    case DEC_METASPACE:
        /* the replacement is a space again, except in the first string, where
         * it was prepended (unless the scheme is never) and is dropped */
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->b.p + in->off[i];
            size_t n = in->len[i], j = 0, from = out->b.n;
            const int drop = i == 0 && d->scheme != SCHEME_NEVER;
            while (j < n) {
                if (n - j >= d->rep_len && !memcmp(s + j, d->rep, d->rep_len)) {
                    if (!drop && tbuf_put(&out->b, " ", 1)) return -1;
                    j += d->rep_len;
                    continue;
                }
                size_t cl = utf8_len((const unsigned char *)s + j, n - j);
                if (!cl) cl = 1;
                if (tbuf_put(&out->b, s + j, cl)) return -1;
                j += cl;
            }
            if (chain_close(out, from)) return -1;
        }
        return 0;
    case DEC_BYTE_LEVEL: {
        /* every string to the bytes its characters stand for (a string with a
         * character outside the alphabet stays as it is), all of them one
         * string, ill-formed UTF-8 replaced */
        tmp->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            const unsigned char *s = (const unsigned char *)in->b.p + in->off[i];
            size_t n = in->len[i], j = 0, mark = tmp->n;
            while (j < n) {
                size_t cl;
                uint32_t c = utf8_decode(s + j, &cl);
                if (c >= BYTE_LEVEL_CP_END || t->bl_byte[c] < 0) break;
                char byte = (char)t->bl_byte[c];
                if (tbuf_put(tmp, &byte, 1)) return -1;
                j += cl;
            }
            if (j < n) {
                tmp->n = mark;
                if (tbuf_put(tmp, s, n)) return -1;
            }
        }
        size_t from = out->b.n;
        return put_lossy(&out->b, tmp->p, tmp->n) || chain_close(out, from);
    }
    }
    return 0;
}

mt_status mt_tokenizer_decode(const mt_tokenizer *tok, const int32_t *ids, size_t n, uint32_t flags, char *text,
                              size_t cap, size_t *len)
{
    mt_err err = mt_err_thread();
    if (len) *len = 0;
    if (!tok) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_decode: tokenizer is NULL");
    if (!len) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_decode: len is NULL");
    if (!ids && n) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_decode: ids is NULL");
    if (!text && cap)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_tokenizer_decode: text is NULL but cap is %zu", cap);
    if (flags & ~(uint32_t)MT_DECODE_SKIP_SPECIAL)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_tokenizer_decode: flags 0x%x hold bits that are not mt_decode_flag values", flags);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok->n_ids || !tok->tok_str[ids[i]])
            return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                           "mt_tokenizer_decode: ids[%zu] = %d is not in the vocabulary (ids 0 to %u%s)", i, ids[i],
                           tok->n_ids - 1,
                           (ids[i] >= 0 && (uint32_t)ids[i] < tok->n_ids) ? ", but this one has no token" : "");
    chain a = {0}, b = {0};
    tbuf tmp = {0};
    chain *cur = &a, *nxt = &b;
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        int32_t id = ids[i];
        if ((flags & MT_DECODE_SKIP_SPECIAL) && tok->special[id]) continue;
        bad = chain_add(cur, tok->tok_str[id], tok->tok_len[id]);
    }
    for (size_t k = 0; k < tok->n_dec && !bad; k++) {
        bad = decode_step(tok, &tok->dec[k], cur, nxt, &tmp);
        chain *x = cur;
        cur = nxt, nxt = x;
    }
    /* the strings joined; with no decoder at all tokenizers puts spaces between them */
    tmp.n = 0;
    for (size_t i = 0; i < cur->n && !bad; i++) {
        if (i && !tok->has_decoder) bad = tbuf_put(&tmp, " ", 1);
        if (!bad) bad = tbuf_put(&tmp, cur->b.p + cur->off[i], cur->len[i]);
    }
    mt_status st = MT_OK;
    if (bad) {
        st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "mt_tokenizer_decode: out of host memory");
    } else {
        if (cap && tmp.n) memcpy(text, tmp.p, MT_MIN(cap, tmp.n));
        if (tmp.n < cap) text[tmp.n] = '\0';
        *len = tmp.n;
    }
    chain_free(&a);
    chain_free(&b);
    tbuf_free(&tmp);
    return st;
}

/* ---- the vocabulary ---------------------------------------------------------------------------------- */

uint32_t mt_tokenizer_vocab_size(const mt_tokenizer *tok) { return tok ? tok->n_ids : 0; }

int32_t mt_tokenizer_token_to_id(const mt_tokenizer *tok, const char *token)
{
    if (!tok || !token) return -1;
    size_t n = strlen(token);
    uint32_t h = hash_bytes(token, n);
    int32_t e = sm_find(&tok->added_map, token, n, h);
    if (e >= 0) return tok->added[tok->added_map.e[e].v0].id;
    e = sm_find(&tok->vocab, token, n, h);
    return e >= 0 ? tok->vocab.e[e].v0 : -1;
}

const char *mt_tokenizer_id_to_token(const mt_tokenizer *tok, int32_t id)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->n_ids) return NULL;
    return tok->tok_str[id];
}
