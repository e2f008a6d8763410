/* The model: BPE as tokenizers runs it. Loading model.vocab and
 * model.merges (with its options: byte_fallback, unk_token, fuse_unk,
 * ignore_merges); the shared cache of pre-token -> ids; BPE itself, a
 * priority queue of merges over a linked list of symbols; and mt_tok_model_word,
 * which puts one pre-token through the cache or BPE. */
#define _GNU_SOURCE
#include "text/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the shared cache: pre-token -> ids, across calls and threads ---------------------- */

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

/* ---- loading: the model ----------------------------------------------------------------------- */

static mt_status load_vocab(loader *L, const cJSON *vocab)
{
    mt_tokenizer *t = L->t;
    if (!cJSON_IsObject(vocab)) return mt_tok_fail(L, MT_ERR_FORMAT, "model.vocab is missing or not an object");
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab)
    {
        int64_t id;
        char what[96];
        snprintf(what, sizeof what, "the id of vocabulary token \"%.40s\"", v->string);
        mt_status st = mt_tok_jcount(L, v, MAX_TOKEN_ID, &id, what);
        if (st) return st;
        size_t n = strlen(v->string);
        if (mt_utf8_check(v->string, n) != n)
            return mt_tok_fail(L, MT_ERR_FORMAT, "vocabulary token %lld is not valid UTF-8", (long long)id);
        if (mt_sm_put(&t->vocab, v->string, n, hash_bytes(v->string, n), (int32_t)id, 0) < 0) return mt_tok_oom(L);
        if ((uint32_t)id + 1 > t->n_ids) t->n_ids = (uint32_t)id + 1;
    }
    if (!t->vocab.n) return mt_tok_fail(L, MT_ERR_FORMAT, "model.vocab is empty");
    return MT_OK;
}

static mt_status load_merges(loader *L, const cJSON *merges)
{
    mt_tokenizer *t = L->t;
    /* no merges is a vocabulary of whole tokens: the table exists all the same */
    if (!jnull(merges) && !cJSON_IsArray(merges)) return mt_tok_fail(L, MT_ERR_FORMAT, "model.merges is not an array");
    size_t n = jnull(merges) ? 0 : (size_t)cJSON_GetArraySize(merges);
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)n) slots *= 2;
    t->merges.e = malloc(slots * sizeof *t->merges.e);
    if (!t->merges.e) return mt_tok_oom(L);
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
                st = mt_tok_fail(L, MT_ERR_FORMAT, "model.merges[%zu] \"%s\" is not two tokens separated by one space", rank,
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
            st = mt_tok_fail(L, MT_ERR_FORMAT, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", rank);
            break;
        }
        joined.n = 0;
        if (tbuf_put(&joined, a, alen) || tbuf_put(&joined, "", 1)) {
            st = mt_tok_oom(L);
            break;
        }
        size_t b_at = joined.n;
        if (tbuf_put(&joined, b, blen) || tbuf_put(&joined, "", 1) || tbuf_put(&joined, a, alen) ||
            tbuf_put(&joined, b, blen) || tbuf_put(&joined, "", 1)) {
            st = mt_tok_oom(L);
            break;
        }
        const char *ab = joined.p + b_at + blen + 1;
        int32_t ia = -1, ib = -1, iab = -1;
        mt_tok_vocab_id(L, joined.p, &ia);
        mt_tok_vocab_id(L, joined.p + b_at, &ib);
        mt_tok_vocab_id(L, ab, &iab);
        if (ia < 0 || ib < 0 || iab < 0) {
            const char *missing = ia < 0 ? joined.p : ib < 0 ? joined.p + b_at : ab;
            st = mt_tok_fail(L, MT_ERR_FORMAT,
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

mt_status mt_tok_load_model(loader *L, const cJSON *model)
{
    mt_tokenizer *t = L->t;
    if (!cJSON_IsObject(model)) return mt_tok_fail(L, MT_ERR_FORMAT, "has no \"model\" object");
    const char *type = jtype(model);
    if (!type) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "model has no type (supported: BPE)");
    if (strcmp(type, "BPE") != 0)
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "model type '%s' is not supported (supported: BPE)", type);

    const cJSON *dropout = jget(model, "dropout");
    if (!jnull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED,
                     "model.dropout is set: BPE dropout samples merges at random, which this library does not do");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = jget(model, affixes[i]);
        if (!jnull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "model.%s is set: not supported (only null or \"\")", affixes[i]);
    }
    mt_status st;
    if ((st = mt_tok_jbool(L, model, "byte_fallback", 0, &t->byte_fallback, "model")) ||
        (st = mt_tok_jbool(L, model, "ignore_merges", 0, &t->ignore_merges, "model")) ||
        (st = mt_tok_jbool(L, model, "fuse_unk", 0, &t->fuse_unk, "model")))
        return st;
    const cJSON *unk = jget(model, "unk_token");
    if (!jnull(unk)) {
        if (!cJSON_IsString(unk)) return mt_tok_fail(L, MT_ERR_FORMAT, "model.unk_token is not a string");
        t->unk_token = strdup(unk->valuestring);
        if (!t->unk_token) return mt_tok_oom(L);
    }
    if ((st = load_vocab(L, jget(model, "vocab")))) return st;
    if ((st = load_merges(L, jget(model, "merges")))) return st;
    /* tokenizers fails an encode that needs unk_token when it is not in the
     * vocabulary, not the load: a byte-level vocabulary never needs it */
    t->unk_id = -1;
    if (t->unk_token) mt_tok_vocab_id(L, t->unk_token, &t->unk_id);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        mt_tok_vocab_id(L, name, &t->byte_tok[b]);
    }
    for (int c = 0; c < 128; c++) {
        char s[2] = {(char)c, 0};
        t->ascii_id[c] = -1;
        if (c) mt_tok_vocab_id(L, s, &t->ascii_id[c]);
    }
    return MT_OK;
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
                if (add_sym(e, &ns, unk)) return mt_tok_enc_oom(e);
                unk = -1;
            }
            if (add_sym(e, &ns, id)) return mt_tok_enc_oom(e);
            continue;
        }
        if (t->byte_fallback) {
            size_t k = 0;
            while (k < clen && t->byte_tok[(unsigned char)cs[k]] >= 0) k++;
            if (k == clen) {
                /* tokenizers adds these before an unknown character still waiting: kept as it is */
                for (k = 0; k < clen; k++)
                    if (add_sym(e, &ns, t->byte_tok[(unsigned char)cs[k]])) return mt_tok_enc_oom(e);
                continue;
            }
        }
        if (t->unk_token) {
            if (t->unk_id < 0)
                return mt_fail(e->err, MT_ERR_FORMAT,
                               "mt_tokenizer_encode: the text needs the unknown token \"%s\", which is not in the "
                               "vocabulary",
                               t->unk_token);
            if (unk >= 0 && !t->fuse_unk && add_sym(e, &ns, unk)) return mt_tok_enc_oom(e);
            unk = t->unk_id;
        }
        /* no unk_token: tokenizers drops the character */
    }
    if (unk >= 0 && add_sym(e, &ns, unk)) return mt_tok_enc_oom(e);
    if (ns) e->syms[ns - 1].next = -1;

    if (ns > 1) {
        if (e->heap_cap < 3 * ns) { /* at most ns - 1 pairs at first, 2 more per merge */
            free(e->heap);
            e->heap_cap = 3 * ns;
            e->heap = malloc(e->heap_cap * sizeof *e->heap);
            if (!e->heap) return e->heap_cap = 0, mt_tok_enc_oom(e);
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
mt_status mt_tok_model_word(enc *e, const char *w, size_t n)
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
            if (!p) return mt_tok_enc_oom(e);
            e->cache_ids = p;
            e->cache_cap = cap;
        }
        int32_t *dst = e->cache_ids + e->cache_n;
        for (size_t k = 0; k < ns; k++)
            if (e->syms[k].alive) *dst++ = e->syms[k].id;
        if (mt_sm_put(&e->cache, w, n, h, (int32_t)e->cache_n, (uint32_t)count) < 0) return mt_tok_enc_oom(e);
        e->cache_n += count;
    }
    return MT_OK;
}
