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
 * which every call and thread shares without locks (sc_get, sc_put in bpe.c);
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
 * mean, which translate_regex() (pretokenize.c) rewrites to Oniguruma's
 * definitions.
 *
 * The files: tokenizer.c (this one) holds the public entry points; load.c
 * reads the file and builds the tables; bpe.c is the model; normalize.c,
 * pretokenize.c, added.c and decode.c each load and run one stage;
 * utf8.c and hashmap.c are the byte-level pieces they share (tokenizer.h
 * and load.h are what the files share of the tokenizer and its loader). */
#define _GNU_SOURCE
#include "io/fileio.h"
#include "text/load.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- loading and freeing ------------------------------------------------------------------ */

void mt_tokenizer_free(mt_tokenizer *t)
{
    if (!t) return;
    free(t->tok_str);
    free(t->tok_len);
    free(t->special);
    mt_sm_free(&t->vocab);
    mt_sm_free(&t->raw_vocab);
    mt_sm_free(&t->added_map);
    free(t->merges.e);
    free(t->cache);
    free(t->byte_pairs);
    free(t->unk_token);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->raw_trie.nodes);
    free(t->norm_trie.nodes);
    for (size_t i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (size_t i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re), free(t->pre[i].lit);
    /* a step that failed half-way was not counted but may hold a regex or a String */
    if (t->n_pre < MAX_STEPS) pcre2_code_free(t->pre[t->n_pre].re), free(t->pre[t->n_pre].lit);
    free(t->post_prefix);
    free(t->post_suffix);
    for (size_t i = 0; i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    free(t);
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
    st = mt_tok_load_json(&L, root);
    cJSON_Delete(root);
    if (st) {
        mt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

/* ---- encoding --------------------------------------------------------------------------------- */

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
    mt_sm_free(&e->cache);
    free(e->cache_ids);
}

mt_status mt_tok_enc_oom(enc *e)
{
    return mt_fail(e->err, MT_ERR_OUT_OF_HOST_MEMORY, "mt_tokenizer_encode: out of host memory");
}

static mt_status encode_normalized(enc *e, const char *p, size_t n, int first)
{
    return mt_tok_pre_tokenize(e, 0, p, n, first);
}

/* A piece of the caller's text between added tokens: normalized, then split
 * on the added tokens that match normalized text. */
static mt_status encode_raw(enc *e, const char *p, size_t n, int first)
{
    const mt_tokenizer *t = e->t;
    if (!n) return MT_OK;
    if (t->n_norm) {
        mt_status st = mt_tok_normalize(t, p, n, &e->norm, &e->norm_tmp, &p, &n);
        if (st == MT_ERR_OUT_OF_HOST_MEMORY) return mt_tok_enc_oom(e);
        if (st) return mt_fail(e->err, st, "mt_tokenizer_encode: the normalizer failed on this text");
    }
    return mt_tok_split_added(e, &t->norm_trie, p, n, first, encode_normalized);
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
    size_t bad = mt_utf8_check(text, len);
    if (bad < len)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_tokenizer_encode: the text is not valid UTF-8 at byte %zu (0x%02X)", bad,
                       (unsigned)(unsigned char)text[bad]);
    enc e;
    memset(&e, 0, sizeof e);
    e.t = tok, e.err = err, e.flags = flags, e.ids = ids, e.cap = cap;
    if (flags & MT_ENCODE_ADD_SPECIAL)
        for (size_t i = 0; i < tok->n_post_prefix; i++) emit(&e, tok->post_prefix[i]);
    mt_status st = len ? mt_tok_split_added(&e, &tok->raw_trie, text, len, 1, encode_raw) : MT_OK;
    if (flags & MT_ENCODE_ADD_SPECIAL)
        for (size_t i = 0; i < tok->n_post_suffix; i++) emit(&e, tok->post_suffix[i]);
    enc_free(&e);
    if (st) return st;
    *n_ids = e.n;
    return MT_OK;
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
