/* Loading a tokenizer.json: the loader's messages and JSON helpers, the
 * post-processor (TemplateProcessing's ids around the text), the tables
 * built once every component is read (each id's spelling, the byte-level
 * vocabulary, the pair table), and the order the components load in. */
#define _GNU_SOURCE
#include "text/load.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Every refusal names the file, then says what is wrong. */
mt_status mt_tok_fail(loader *L, mt_status st, const char *fmt, ...)
{
    char what[MT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mt_fail(L->err, st, "%s: %s", L->path, what);
}

mt_status mt_tok_oom(loader *L) { return mt_tok_fail(L, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory"); }

mt_status mt_tok_jbool(loader *L, const cJSON *o, const char *key, int def, int *out, const char *where)
{
    const cJSON *v = jget(o, key);
    if (jnull(v)) return *out = def, MT_OK;
    if (!cJSON_IsBool(v)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.%s is not true or false", where, key);
    *out = cJSON_IsTrue(v);
    return MT_OK;
}

/* A required string; cJSON strings end at their NUL. */
mt_status mt_tok_jstr(loader *L, const cJSON *o, const char *key, const char **out, const char *where)
{
    const cJSON *v = jget(o, key);
    if (!cJSON_IsString(v)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.%s is missing or not a string", where, key);
    *out = v->valuestring;
    return MT_OK;
}

/* A whole number in [0, max]. */
mt_status mt_tok_jcount(loader *L, const cJSON *v, double max, int64_t *out, const char *what)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > max || floor(v->valuedouble) != v->valuedouble)
        return mt_tok_fail(L, MT_ERR_FORMAT, "%s is not a whole number in [0, %.0f]", what, max);
    *out = (int64_t)v->valuedouble;
    return MT_OK;
}

/* One character, as tokenizers' `char` fields (Metaspace's replacement). */
mt_status mt_tok_jchar(loader *L, const cJSON *o, const char *key, char out[4], size_t *len, const char *where)
{
    const char *s = NULL;
    mt_status st = mt_tok_jstr(L, o, key, &s, where);
    if (st) return st;
    size_t n = strlen(s);
    size_t k = n ? utf8_len((const unsigned char *)s, n) : 0;
    if (!k || k != n) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.%s must be one character, not \"%s\"", where, key, s);
    memcpy(out, s, n);
    *len = n;
    return MT_OK;
}

mt_status mt_tok_jscheme(loader *L, const cJSON *o, prepend_scheme *out, const char *where)
{
    /* tokenizers: prepend_scheme defaults to always; the older add_prefix_space: false means never */
    *out = SCHEME_ALWAYS;
    const cJSON *v = jget(o, "prepend_scheme");
    if (!jnull(v)) {
        if (!cJSON_IsString(v)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.prepend_scheme is not a string", where);
        if (!strcmp(v->valuestring, "always")) *out = SCHEME_ALWAYS;
        else if (!strcmp(v->valuestring, "first")) *out = SCHEME_FIRST;
        else if (!strcmp(v->valuestring, "never")) *out = SCHEME_NEVER;
        else
            return mt_tok_fail(L, MT_ERR_FORMAT, "%s.prepend_scheme '%s' is not always, first or never", where,
                         v->valuestring);
    }
    const cJSON *aps = jget(o, "add_prefix_space");
    if (cJSON_IsFalse(aps)) *out = SCHEME_NEVER;
    return MT_OK;
}

/* A copy of a pattern's {"String": s}; Regex patterns are named and refused. */
mt_status mt_tok_jstring_pattern(loader *L, const cJSON *o, char **out, size_t *len, const char *where)
{
    const cJSON *p = jget(o, "pattern");
    const cJSON *s = cJSON_IsObject(p) ? jget(p, "String") : NULL;
    if (cJSON_IsObject(p) && jget(p, "Regex"))
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: a Regex pattern is not supported here (supported: String)", where);
    if (!cJSON_IsString(s)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.pattern is not {\"String\": ...}", where);
    if (!s->valuestring[0]) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.pattern is the empty string", where);
    size_t n = strlen(s->valuestring);
    if (mt_utf8_check(s->valuestring, n) != n) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.pattern is not valid UTF-8", where);
    *out = strdup(s->valuestring);
    if (!*out) return mt_tok_oom(L);
    *len = strlen(*out);
    return MT_OK;
}

/* A copy of a string that goes into text (so it must be UTF-8: the regexes
 * match without checking). */
mt_status mt_tok_jstrdup(loader *L, const cJSON *o, const char *key, char **out, size_t *len, const char *where)
{
    const char *s = NULL;
    mt_status st = mt_tok_jstr(L, o, key, &s, where);
    if (st) return st;
    if (mt_utf8_check(s, strlen(s)) != strlen(s)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.%s is not valid UTF-8", where, key);
    *out = strdup(s);
    if (!*out) return mt_tok_oom(L);
    *len = strlen(s);
    return MT_OK;
}

mt_status mt_tok_vocab_id(loader *L, const char *tok, int32_t *id)
{
    int32_t e = sm_find(&L->t->vocab, tok, strlen(tok), hash_bytes(tok, strlen(tok)));
    *id = e < 0 ? -1 : L->t->vocab.e[e].v0;
    return MT_OK;
}

/* ---- loading: post-processor ---------------------------------------------------------------- */

#define POST_SUPPORTED "ByteLevel, TemplateProcessing, Sequence"

static mt_status push_ids(loader *L, int32_t **ids, size_t *n, const int32_t *add, size_t k, int front)
{
    int32_t *p = realloc(*ids, (*n + k + 1) * sizeof *p);
    if (!p) return mt_tok_oom(L);
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
    if (!cJSON_IsArray(single)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.single is not an array", where);
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
                st = mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s.single must hold the sequence A once (a single text's template)",
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
                st = mt_tok_fail(L, MT_ERR_FORMAT, "%s: special token \"%s\" of the template has no ids in special_tokens",
                           where, cJSON_IsString(name) ? name->valuestring : "?");
                break;
            }
            const cJSON *x;
            cJSON_ArrayForEach(x, ids)
            {
                int64_t id;
                if ((st = mt_tok_jcount(L, x, MAX_TOKEN_ID, &id, "a template special token's id"))) break;
                if ((uint32_t)id >= t->n_ids) {
                    st = mt_tok_fail(L, MT_ERR_FORMAT,
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
            st = mt_tok_fail(L, MT_ERR_FORMAT, "%s.single holds an item that is neither SpecialToken nor Sequence", where);
            break;
        }
    }
    if (!st && !seen_a) st = mt_tok_fail(L, MT_ERR_FORMAT, "%s.single has no sequence A", where);
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
    if (!type) return mt_tok_fail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "ByteLevel")) return MT_OK; /* it only trims offsets */
    if (!strcmp(type, "TemplateProcessing")) return load_template(L, o, where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "processors");
        if (!cJSON_IsArray(list)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.processors is not an array", where);
        if (depth >= MAX_NESTING) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
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
    return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " POST_SUPPORTED ")", where, type);
}

/* ---- loading: tables ---------------------------------------------------------------------------- */

/* The spelling of every id (added tokens over the model's), the specials,
 * and for byte-level models the vocabulary indexed by raw bytes. */
static mt_status build_tables(loader *L)
{
    mt_tokenizer *t = L->t;
    t->cache = aligned_alloc(64, SC_SLOTS * sizeof *t->cache);
    if (!t->cache) return mt_tok_oom(L);
    for (uint32_t i = 0; i < SC_SLOTS; i++) {
        atomic_init(&t->cache[i].seq, 0);
        for (int j = 0; j < 7; j++) atomic_init(&t->cache[i].w[j], 0); /* key length 0: no pre-token */
    }
    t->tok_str = calloc(t->n_ids, sizeof *t->tok_str);
    t->tok_len = calloc(t->n_ids, sizeof *t->tok_len);
    t->special = calloc(t->n_ids, 1);
    if (!t->tok_str || !t->tok_len || !t->special) return mt_tok_oom(L);
    for (uint32_t e = 0; e < t->vocab.n; e++) {
        int32_t id = t->vocab.e[e].v0;
        t->tok_str[id] = sm_key(&t->vocab, e);
        t->tok_len[id] = t->vocab.e[e].len;
    }
    if (!t->byte_level) {
        /* split_words: "▁" is a token, and few characters come before a "▁"
         * in a token that a merge makes (those go in glue). ignore_merges
         * looks a whole pre-token up in the vocabulary, so it must not be cut. */
        int32_t meta = -1;
        mt_tok_vocab_id(L, METASPACE_CHAR, &meta);
        t->split_words = meta >= 0 && !t->ignore_merges;
        for (uint64_t i = 0; t->split_words && i <= t->merges.mask; i++) {
            const pm_entry *m = &t->merges.e[i];
            if (m->key == PM_EMPTY) continue;
            const char *tok = t->tok_str[m->id];
            for (const char *hit = strstr(tok, METASPACE_CHAR); hit && t->split_words;
                 hit = strstr(hit + 3, METASPACE_CHAR)) {
                if (hit == tok || (hit - tok >= 3 && !memcmp(hit - 3, METASPACE_CHAR, 3))) continue;
                uint32_t c = mt_utf8_last(tok, (size_t)(hit - tok));
                size_t g = 0;
                while (g < t->n_glue && t->glue[g] != c) g++;
                if (g < t->n_glue) continue;
                if (t->n_glue == MAX_GLUE) t->split_words = 0;
                else t->glue[t->n_glue++] = c;
            }
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
            return mt_tok_fail(L, MT_ERR_FORMAT, "post_processor: the template's special token id %d is no token's id", id);
    }

    mt_byte_level_alphabet(t->bl_cp);
    for (uint32_t c = 0; c < BYTE_LEVEL_CP_END; c++) t->bl_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        t->bl_byte[t->bl_cp[b]] = (int16_t)b;
        t->bl_len[b] = (uint8_t)mt_utf8_encode(t->bl_cp[b], t->bl_str[b]);
        int32_t e = sm_find(&t->vocab, t->bl_str[b], t->bl_len[b], hash_bytes(t->bl_str[b], t->bl_len[b]));
        t->bl_id[b] = e < 0 ? -1 : t->vocab.e[e].v0;
    }
    if (!t->byte_level) return MT_OK;
    t->byte_pairs = malloc(65536 * sizeof *t->byte_pairs);
    if (!t->byte_pairs) return mt_tok_oom(L);
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
                return mt_tok_oom(L);
            }
            i += k;
        }
        /* a token outside the alphabet can never come out of byte-level BPE */
        if (i < n) continue;
        if (mt_sm_put(&t->raw_vocab, raw.p, raw.n, hash_bytes(raw.p, raw.n), t->vocab.e[e].v0, 0) < 0) {
            tbuf_free(&raw);
            return mt_tok_oom(L);
        }
    }
    tbuf_free(&raw);
    return MT_OK;
}

mt_status mt_tok_load_json(loader *L, const cJSON *root)
{
    mt_status st;
    if ((st = mt_tok_load_model(L, jget(root, "model")))) return st;
    if ((st = mt_tok_load_normalizer(L, jget(root, "normalizer"), "normalizer", 0))) return st;
    if ((st = mt_tok_load_added_tokens(L, jget(root, "added_tokens")))) return st;
    if ((st = mt_tok_load_pre_tokenizer(L, jget(root, "pre_tokenizer"), "pre_tokenizer", 0))) return st;
    if ((st = load_post_processor(L, jget(root, "post_processor"), "post_processor", 0))) return st;
    if ((st = mt_tok_load_decoder(L, jget(root, "decoder"), "decoder", 0))) return st;
    /* truncation and padding are left to the caller, as transformers does */
    return build_tables(L);
}
