/* Added tokens: their trie, loading added_tokens (each normalized when
 * it is matched in normalized text), and splitting text on them as
 * tokenizers' find_matches does. */
#define _GNU_SOURCE
#include "text/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the trie ------------------------------------------------------------------------- */

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

/* ---- loading: added tokens ------------------------------------------------------------------- */

mt_status mt_tok_load_added_tokens(loader *L, const cJSON *list)
{
    mt_tokenizer *t = L->t;
    if (jnull(list)) return MT_OK;
    if (!cJSON_IsArray(list)) return mt_tok_fail(L, MT_ERR_FORMAT, "added_tokens is not an array");
    size_t n = (size_t)cJSON_GetArraySize(list);
    if (!n) return MT_OK;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added) return mt_tok_oom(L);
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
            st = mt_tok_fail(L, MT_ERR_FORMAT, "%s is not an object", where);
            break;
        }
        char idwhat[96];
        snprintf(idwhat, sizeof idwhat, "%s.id", where);
        if ((st = mt_tok_jstr(L, o, "content", &content, where)) ||
            (st = mt_tok_jcount(L, jget(o, "id"), MAX_TOKEN_ID, &id, idwhat)) ||
            (st = mt_tok_jbool(L, o, "special", 0, &special, where)) ||
            (st = mt_tok_jbool(L, o, "single_word", 0, &single_word, where)) ||
            (st = mt_tok_jbool(L, o, "lstrip", 0, &lstrip, where)) || (st = mt_tok_jbool(L, o, "rstrip", 0, &rstrip, where)) ||
            /* tokenizers' AddedToken::from: special tokens are not normalized unless told */
            (st = mt_tok_jbool(L, o, "normalized", !special, &normalized, where)))
            break;
        size_t len = strlen(content);
        if (!len) {
            st = mt_tok_fail(L, MT_ERR_FORMAT, "%s.content is empty", where);
            break;
        }
        if (mt_utf8_check(content, len) != len) {
            st = mt_tok_fail(L, MT_ERR_FORMAT, "%s.content is not valid UTF-8", where);
            break;
        }
        a->content = strdup(content);
        if (!a->content) {
            st = mt_tok_oom(L);
            break;
        }
        a->len = len;
        a->id = (int32_t)id;
        a->special = (uint8_t)special, a->single_word = (uint8_t)single_word;
        a->lstrip = (uint8_t)lstrip, a->rstrip = (uint8_t)rstrip, a->normalized = (uint8_t)normalized;
        int32_t idx = (int32_t)t->n_added++;
        if ((uint32_t)id + 1 > t->n_ids) t->n_ids = (uint32_t)id + 1;
        if (mt_sm_put(&t->added_map, content, len, hash_bytes(content, len), idx, 0) < 0) {
            st = mt_tok_oom(L);
            break;
        }
        /* a normalized token is looked for in normalized text, so its own text is normalized too */
        if (normalized && t->n_norm) {
            const char *np;
            size_t nn;
            st = mt_tok_normalize(t, content, len, &norm, &tmp, &np, &nn);
            if (st) {
                st = st == MT_ERR_OUT_OF_HOST_MEMORY ? mt_tok_oom(L)
                                                     : mt_tok_fail(L, st, "%s: cannot normalize its content", where);
                break;
            }
            if (nn && trie_add(&t->norm_trie, np, nn, idx)) {
                st = mt_tok_oom(L);
                break;
            }
        } else if (trie_add(normalized ? &t->norm_trie : &t->raw_trie, content, len, idx)) {
            st = mt_tok_oom(L);
            break;
        }
    }
    tbuf_free(&norm);
    tbuf_free(&tmp);
    return st;
}

/* ---- encoding: added tokens ----------------------------------------------------------------------- */

/* Splits p on the added tokens of tr as tokenizers' find_matches does:
 * matches leftmost-longest without overlap; a special token without
 * MT_ENCODE_SPECIAL, or a single_word token inside a word, is passed over
 * (what it covered stays text); lstrip and rstrip take the whitespace beside
 * a token into it. The text between tokens goes to `text` (first: the piece
 * starts the whole text). */
mt_status mt_tok_split_added(enc *e, const trie *tr, const char *p, size_t n, int first, piece_fn text)
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
        if (a->single_word && ((start > 0 && mt_is_word_char(mt_utf8_last(p, start))) ||
                               (stop < n && mt_is_word_char(utf8_decode((const unsigned char *)p + stop, &cl)))))
            continue;
        if (a->lstrip) { /* back over whitespace, but not into the previous token */
            while (start > done) {
                size_t i = start - 1;
                while (i > done && ((unsigned char)p[i] & 0xC0) == 0x80) i--;
                if (!mt_is_white_space(utf8_decode((const unsigned char *)p + i, &cl))) break;
                start = i;
            }
        }
        if (a->rstrip) {
            while (stop < n && mt_is_white_space(utf8_decode((const unsigned char *)p + stop, &cl))) stop += cl;
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
