/* Normalizers: loading them (NFC, Prepend, Replace, Sequence) and running
 * them over a piece of text. */
#define _GNU_SOURCE
#include "text/load.h"

#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

/* ---- loading: normalizers ------------------------------------------------------------------- */

#define NORM_SUPPORTED "NFC, Prepend, Replace, Sequence"

mt_status mt_tok_load_normalizer(loader *L, const cJSON *o, const char *where, int depth)
{
    mt_tokenizer *t = L->t;
    if (jnull(o)) return MT_OK;
    const char *type = jtype(o);
    if (!type) return mt_tok_fail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "normalizers");
        if (!cJSON_IsArray(list)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.normalizers is not an array", where);
        if (depth >= MAX_NESTING) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", where, i++);
            mt_status st = mt_tok_load_normalizer(L, x, sub, depth + 1);
            if (st) return st;
        }
        return MT_OK;
    }
    if (t->n_norm == MAX_STEPS) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: more than %d normalizers", where, MAX_STEPS);
    norm_step *s = &t->norm[t->n_norm];
    memset(s, 0, sizeof *s);
    mt_status st = MT_OK;
    if (!strcmp(type, "NFC")) {
        s->kind = NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        s->kind = NORM_PREPEND;
        st = mt_tok_jstrdup(L, o, "prepend", &s->a, &s->alen, where);
    } else if (!strcmp(type, "Replace")) {
        s->kind = NORM_REPLACE;
        st = mt_tok_jstring_pattern(L, o, &s->a, &s->alen, where);
        if (!st) st = mt_tok_jstrdup(L, o, "content", &s->b, &s->blen, where);
    } else {
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " NORM_SUPPORTED ")", where,
                     type);
    }
    t->n_norm++; /* counted even on failure, so that free() finds its strings */
    return st;
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
mt_status mt_tok_normalize(const mt_tokenizer *t, const char *s, size_t n, tbuf *a, tbuf *b, const char **out,
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
        if (tbuf_pad(nxt)) return MT_ERR_OUT_OF_HOST_MEMORY; /* the pre-tokenizer's regexes read past the end */
        cur = nxt->p, n = nxt->n;
    }
    *out = cur, *out_n = n;
    return MT_OK;
}
