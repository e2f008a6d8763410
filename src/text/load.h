/* Loading a tokenizer.json, as the files of src/text share it: the loader
 * (the file's name for messages, the tokenizer being built), its JSON
 * helpers, each of which names what is wrong with the file, and each
 * component's loader (model, normalizer, added tokens, pre-tokenizer,
 * decoder), which lives beside the code that runs that component. */
#ifndef MT_TEXT_LOAD_H
#define MT_TEXT_LOAD_H

#include "text/tokenizer.h"

#include <cjson/cJSON.h>

typedef struct loader {
    mt_err err;
    const char *path;
    mt_tokenizer *t;
} loader;

/* Every refusal names the file, then says what is wrong. */
mt_status mt_tok_fail(loader *L, mt_status st, const char *fmt, ...) MT_PRINTF(3, 4);
mt_status mt_tok_oom(loader *L);

static inline const cJSON *jget(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }
static inline int jnull(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A component's "type", or NULL. */
static inline const char *jtype(const cJSON *o)
{
    const cJSON *t = jget(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* A boolean, def when absent or null. */
mt_status mt_tok_jbool(loader *L, const cJSON *o, const char *key, int def, int *out, const char *where);
/* A required string; cJSON strings end at their NUL. */
mt_status mt_tok_jstr(loader *L, const cJSON *o, const char *key, const char **out, const char *where);
/* A whole number in [0, max]. */
mt_status mt_tok_jcount(loader *L, const cJSON *v, double max, int64_t *out, const char *what);
/* One character, as tokenizers' `char` fields (Metaspace's replacement). */
mt_status mt_tok_jchar(loader *L, const cJSON *o, const char *key, char out[4], size_t *len, const char *where);
/* Metaspace's prepend_scheme (and the older add_prefix_space). */
mt_status mt_tok_jscheme(loader *L, const cJSON *o, prepend_scheme *out, const char *where);
/* A copy of a pattern's {"String": s}; Regex patterns are named and refused. */
mt_status mt_tok_jstring_pattern(loader *L, const cJSON *o, char **out, size_t *len, const char *where);
/* A copy of a string that goes into text (so it must be UTF-8). */
mt_status mt_tok_jstrdup(loader *L, const cJSON *o, const char *key, char **out, size_t *len, const char *where);
/* The model vocabulary's id of tok, -1 when it has none. */
mt_status mt_tok_vocab_id(loader *L, const char *tok, int32_t *id);

/* Each component, from its part of the file (bpe.c, normalize.c, added.c, pretokenize.c, decode.c). */
mt_status mt_tok_load_model(loader *L, const cJSON *model);
mt_status mt_tok_load_normalizer(loader *L, const cJSON *o, const char *where, int depth);
mt_status mt_tok_load_added_tokens(loader *L, const cJSON *list);
mt_status mt_tok_load_pre_tokenizer(loader *L, const cJSON *o, const char *where, int depth);
mt_status mt_tok_load_decoder(loader *L, const cJSON *o, const char *where, int depth);

/* The whole file into L->t (load.c): every component, then the tables built from them. */
mt_status mt_tok_load_json(loader *L, const cJSON *root);

#endif
