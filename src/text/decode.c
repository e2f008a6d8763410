/* Decoding: loading the decoders (ByteLevel, Metaspace, Replace,
 * ByteFallback, Fuse, Strip, Sequence) and running them over ids' spellings,
 * a list of strings from one step to the next, as tokenizers does. */
#define _GNU_SOURCE
#include "text/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading: decoders ---------------------------------------------------------------------------- */

#define DEC_SUPPORTED "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence"

mt_status mt_tok_load_decoder(loader *L, const cJSON *o, const char *where, int depth)
{
    mt_tokenizer *t = L->t;
    if (jnull(o)) return MT_OK;
    t->has_decoder = 1;
    const char *type = jtype(o);
    if (!type) return mt_tok_fail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "decoders");
        if (!cJSON_IsArray(list)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.decoders is not an array", where);
        if (depth >= MAX_NESTING) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.decoders[%d]", where, i++);
            mt_status st = mt_tok_load_decoder(L, x, sub, depth + 1);
            if (st) return st;
        }
        return MT_OK;
    }
    if (t->n_dec == MAX_STEPS) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: more than %d decoders", where, MAX_STEPS);
    dec_step *s = &t->dec[t->n_dec];
    memset(s, 0, sizeof *s);
    mt_status st = MT_OK;
    if (!strcmp(type, "ByteLevel")) {
        s->kind = DEC_BYTE_LEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        s->kind = DEC_METASPACE;
        if (!(st = mt_tok_jchar(L, o, "replacement", s->rep, &s->rep_len, where))) st = mt_tok_jscheme(L, o, &s->scheme, where);
    } else if (!strcmp(type, "Replace")) {
        s->kind = DEC_REPLACE;
        st = mt_tok_jstring_pattern(L, o, &s->a, &s->alen, where);
        if (!st) st = mt_tok_jstrdup(L, o, "content", &s->b, &s->blen, where);
    } else if (!strcmp(type, "ByteFallback")) {
        s->kind = DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        s->kind = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        s->kind = DEC_STRIP;
        int64_t start = 0, stop = 0;
        char what[300];
        st = mt_tok_jchar(L, o, "content", s->rep, &s->rep_len, where);
        if (!st) {
            snprintf(what, sizeof what, "%s.start", where);
            st = mt_tok_jcount(L, jget(o, "start"), 1e9, &start, what);
        }
        if (!st) {
            snprintf(what, sizeof what, "%s.stop", where);
            st = mt_tok_jcount(L, jget(o, "stop"), 1e9, &stop, what);
        }
        s->start = (size_t)start, s->stop = (size_t)stop;
    } else {
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " DEC_SUPPORTED ")", where,
                     type);
    }
    t->n_dec++;
    return st;
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
    if (mt_utf8_check(bytes->p, bytes->n) == bytes->n) bad = chain_add(out, bytes->p, bytes->n);
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
        return mt_utf8_put_lossy(&out->b, tmp->p, tmp->n) || chain_close(out, from);
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
