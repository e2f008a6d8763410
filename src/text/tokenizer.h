/* The tokenizer as the files of src/text share it: struct mt_tokenizer
 * (what loading builds and encoding and decoding read), its pipeline steps,
 * added tokens, the shared cache's slots, the per-call encoding workspace,
 * and the functions one stage of the encoder calls in another. The overview
 * of the whole is at the top of tokenizer.c. */
#ifndef MT_TEXT_TOKENIZER_H
#define MT_TEXT_TOKENIZER_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "core/internal.h"
#include "text/hashmap.h"
#include "text/utf8.h"

#include <pcre2.h>
#include <stdatomic.h>

/* The largest id accepted: a typo in a file must not size the id tables. */
#define MAX_TOKEN_ID ((1u << 25) - 1)
/* Normalizer, pre-tokenizer, post-processor and decoder steps after flattening Sequences. */
#define MAX_STEPS 16
#define MAX_NESTING 8
/* Characters a merged token holds before a "▁" (split_words): past this many, words are not cut. */
#define MAX_GLUE 16
/* The per-call cache of pre-token -> ids: words longer than this are rarely
 * seen twice (tokenizers caches below 256 too), and the table stops growing
 * at CACHE_MAX_ENTRIES so one call's memory stays proportional to its text. */
#define CACHE_MAX_WORD 256
#define CACHE_MAX_ENTRIES (1u << 18)
/* The JIT stack a regex may grow to on pathological text (long runs that
 * backtrack); the default 32 KiB machine stack serves ordinary text. */
#define JIT_STACK_MAX ((size_t)64 << 20)

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

/* ---- pipeline steps ----------------------------------------------------------------- */

typedef enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE } norm_kind;

typedef struct norm_step {
    norm_kind kind;
    char *a, *b; /* Prepend: a; Replace: pattern a, content b */
    size_t alen, blen;
} norm_step;

typedef enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE } pre_kind;
typedef enum { SCHEME_ALWAYS, SCHEME_FIRST, SCHEME_NEVER } prepend_scheme;
/* tokenizers' SplitDelimiterBehavior: what becomes of the matches */
typedef enum {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_WITH_PREVIOUS,
    SPLIT_MERGED_WITH_NEXT,
    SPLIT_CONTIGUOUS
} split_behavior;

typedef struct pre_step {
    pre_kind kind;
    pcre2_code *re;          /* Split with a Regex pattern; ByteLevel with use_regex */
    char *lit;               /* Split with a String pattern */
    size_t lit_len;
    split_behavior behavior; /* Split (ByteLevel's regex: Isolated) */
    int invert;              /* Split: the text between matches is what the behavior acts on */
    int add_prefix_space;    /* ByteLevel */
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

    /* Not byte-level: BPE of a text is BPE of its pieces cut before a "▁"
     * that follows another character, when no merge can join the two: when
     * no token a merge makes holds that character followed by "▁". The
     * pieces are words, which the cache then serves (Llama 2 and Gemma 3 have
     * no pre-tokenizer that cuts: without this their BPE runs over whole
     * texts). The few characters that some merged token does hold before a
     * "▁" (Gemma 3 has one, ">▁</") are in glue: the text is not cut after
     * them. */
    int split_words;
    uint32_t glue[MAX_GLUE];
    size_t n_glue;

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

static inline void emit(enc *e, int32_t id)
{
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
}

mt_status mt_tok_enc_oom(enc *e);

/* ---- encoding: the stages, each calling the next ------------------------------------------------ */

/* The normalizer's steps over s; the result in *out, *out_n: s itself when
 * no step changes it (ASCII under NFC, say), else one of the buffers a, b. */
mt_status mt_tok_normalize(const mt_tokenizer *t, const char *s, size_t n, tbuf *a, tbuf *b, const char **out,
                           size_t *out_n);
/* Step k of the pre-tokenizer on one piece (first: it starts the text), down to the model. */
mt_status mt_tok_pre_tokenize(enc *e, size_t k, const char *p, size_t n, int first);
/* The model (BPE) on one pre-token; its ids emitted. */
mt_status mt_tok_model_word(enc *e, const char *w, size_t n);

typedef mt_status (*piece_fn)(enc *e, const char *p, size_t n, int first);

/* Splits p on the added tokens of tr; the text between them goes to `text`. */
mt_status mt_tok_split_added(enc *e, const trie *tr, const char *p, size_t n, int first, piece_fn text);

#endif
