/* Pre-tokenizers: their regexes (Oniguruma's rewritten for PCRE2), loading
 * them (Split, ByteLevel, Metaspace, Sequence), and running them on a
 * piece of text, depth first, down to the model. */
#define _GNU_SOURCE
#include "text/load.h"

#include <stdio.h>
#include <string.h>

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

static mt_status compile_regex(loader *L, const char *pattern, pcre2_code **out, const char *where)
{
    tbuf pat = {0};
    if (translate_regex(pattern, &pat)) {
        tbuf_free(&pat);
        return mt_tok_oom(L);
    }
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat.p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    tbuf_free(&pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED,
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

/* ---- loading: pre-tokenizers ------------------------------------------------------------------ */

#define PRE_SUPPORTED "Split, ByteLevel, Metaspace, Sequence"

/* tokenizers' SplitDelimiterBehavior names, in the order of split_behavior */
static const char *const BEHAVIORS[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
#define N_BEHAVIORS (sizeof BEHAVIORS / sizeof *BEHAVIORS)

mt_status mt_tok_load_pre_tokenizer(loader *L, const cJSON *o, const char *where, int depth)
{
    mt_tokenizer *t = L->t;
    if (jnull(o)) return MT_OK;
    const char *type = jtype(o);
    if (!type) return mt_tok_fail(L, MT_ERR_FORMAT, "%s has no type", where);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "pretokenizers");
        if (!cJSON_IsArray(list)) return mt_tok_fail(L, MT_ERR_FORMAT, "%s.pretokenizers is not an array", where);
        if (depth >= MAX_NESTING) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: Sequences nest too deep", where);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, list)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", where, i++);
            mt_status st = mt_tok_load_pre_tokenizer(L, x, sub, depth + 1);
            if (st) return st;
        }
        return MT_OK;
    }
    if (t->byte_level)
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED,
                     "%s: a %s after the ByteLevel pre-tokenizer is not supported (ByteLevel must come last)", where,
                     type);
    if (t->n_pre == MAX_STEPS) return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", where, MAX_STEPS);
    pre_step *s = &t->pre[t->n_pre];
    memset(s, 0, sizeof *s);
    mt_status st;
    if (!strcmp(type, "Split")) {
        s->kind = PRE_SPLIT;
        const char *behavior = NULL;
        int invert = 0;
        if ((st = mt_tok_jstr(L, o, "behavior", &behavior, where)) || (st = mt_tok_jbool(L, o, "invert", 0, &invert, where)))
            return st;
        size_t b = 0;
        while (b < N_BEHAVIORS && strcmp(behavior, BEHAVIORS[b]) != 0) b++;
        if (b == N_BEHAVIORS) /* tokenizers itself has no other */
            return mt_tok_fail(L, MT_ERR_FORMAT,
                               "%s (Split): behavior '%s' is not one of Removed, Isolated, MergedWithPrevious, "
                               "MergedWithNext, Contiguous",
                               where, behavior);
        s->behavior = (split_behavior)b;
        s->invert = invert;
        const cJSON *p = jget(o, "pattern");
        const cJSON *re = cJSON_IsObject(p) ? jget(p, "Regex") : NULL;
        const cJSON *str = cJSON_IsObject(p) ? jget(p, "String") : NULL;
        if (cJSON_IsString(re)) {
            if ((st = compile_regex(L, re->valuestring, &s->re, where))) return st;
        } else if (cJSON_IsString(str) && str->valuestring[0]) {
            /* a String is found with memmem: what tokenizers' escaped regex finds, and PCRE2's
             * JIT would scan for it in vector words that reach past the end of the caller's text */
            s->lit_len = strlen(str->valuestring);
            if (mt_utf8_check(str->valuestring, s->lit_len) != s->lit_len)
                return mt_tok_fail(L, MT_ERR_FORMAT, "%s.pattern is not valid UTF-8", where);
            if (!(s->lit = strdup(str->valuestring))) return mt_tok_oom(L);
        } else {
            return mt_tok_fail(L, MT_ERR_FORMAT, "%s.pattern is neither {\"Regex\": ...} nor {\"String\": ...}", where);
        }
    } else if (!strcmp(type, "ByteLevel")) {
        s->kind = PRE_BYTE_LEVEL;
        s->behavior = SPLIT_ISOLATED;
        int use_regex;
        /* tokenizers' defaults: add_prefix_space true, use_regex true */
        if ((st = mt_tok_jbool(L, o, "add_prefix_space", 1, &s->add_prefix_space, where)) ||
            (st = mt_tok_jbool(L, o, "use_regex", 1, &use_regex, where)))
            return st;
        if (use_regex && (st = compile_regex(L, GPT2_REGEX, &s->re, where))) return st;
        t->byte_level = 1;
    } else if (!strcmp(type, "Metaspace")) {
        s->kind = PRE_METASPACE;
        if ((st = mt_tok_jchar(L, o, "replacement", s->rep, &s->rep_len, where)) || (st = mt_tok_jscheme(L, o, &s->scheme, where)) ||
            (st = mt_tok_jbool(L, o, "split", 1, &s->split, where)))
            return st;
    } else {
        return mt_tok_fail(L, MT_ERR_UNSUPPORTED, "%s type '%s' is not supported (supported: " PRE_SUPPORTED ")", where,
                     type);
    }
    t->n_pre++;
    return MT_OK;
}

/* ---- encoding: pre-tokenizers -------------------------------------------------------------------- */

/* The next match of re in p[0, n) at or after pos: 1 and its bounds, 0 when none. */
static int regex_next(enc *e, const pcre2_code *re, const char *p, size_t n, size_t pos, size_t *ms, size_t *me,
                      mt_status *st)
{
    if (!e->md && !(e->md = pcre2_match_data_create(1, NULL))) return *st = mt_tok_enc_oom(e), 0;
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
            if (!e->mctx || !e->jit_stack) return *st = mt_tok_enc_oom(e), 0;
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

/* The next occurrence of a String pattern in p[0, n) at or after pos, as regex_next. */
static int literal_next(const pre_step *ps, const char *p, size_t n, size_t pos, size_t *ms, size_t *me)
{
    const char *hit = n - pos >= ps->lit_len ? memmem(p + pos, n - pos, ps->lit, ps->lit_len) : NULL;
    if (!hit) return 0;
    *ms = (size_t)(hit - p), *me = *ms + ps->lit_len;
    return 1;
}

/* A Split's pieces, built as tokenizers' NormalizedString::split folds the
 * segments of a text (each match, and the text between matches; invert
 * swaps which is which): Isolated keeps every segment a piece, Removed
 * drops the matches, MergedWithPrevious joins a match to the segment before
 * it, MergedWithNext to the one after it, and Contiguous joins runs of
 * matches. Segments come left to right; the piece being built goes down to
 * the next step once no later segment can join it. Empty pieces are dropped,
 * but an empty segment still counts as the previous one. */
typedef struct splitter {
    enc *e;
    size_t k;
    const char *p;
    int first;
    split_behavior behavior;
    size_t ps, pe;  /* the piece being built: p[ps, pe) */
    int have;       /* there is one (perhaps empty) */
    int prev_match; /* the last segment was a match */
} splitter;

static mt_status split_flush(splitter *s)
{
    if (!s->have || s->pe == s->ps) return MT_OK;
    return mt_tok_pre_tokenize(s->e, s->k + 1, s->p + s->ps, s->pe - s->ps, s->first && s->ps == 0);
}

/* The next segment, p[a, b). */
static mt_status split_segment(splitter *s, size_t a, size_t b, int match)
{
    int join;
    switch (s->behavior) {
    case SPLIT_MERGED_WITH_PREVIOUS:
        join = match && !s->prev_match;
        break;
    case SPLIT_MERGED_WITH_NEXT: /* tokenizers folds from the right: a match takes the non-match after it */
        join = !match && s->prev_match;
        break;
    case SPLIT_CONTIGUOUS:
        join = match == s->prev_match;
        break;
    default:
        join = 0;
        break;
    }
    s->prev_match = match;
    if (join && s->have) {
        s->pe = b;
        return MT_OK;
    }
    mt_status st = split_flush(s);
    s->have = !(match && s->behavior == SPLIT_REMOVED);
    s->ps = a, s->pe = b;
    return st;
}

/* tokenizers' Split (and ByteLevel's regex, Isolated) on one piece. The
 * matches are those tokenizers' Oniguruma binding iterates: after an empty
 * match the next search starts one character on, and an empty match where
 * the last match taken ended is passed over. */
static mt_status split_regex(enc *e, size_t k, const pre_step *ps, const char *p, size_t n, int first)
{
    splitter s = {e, k, p, first, ps->behavior, 0, 0, 0, 0};
    size_t pos = 0, prev = 0, ms, me;
    int taken = 0; /* a match was taken, ending at prev */
    mt_status st = MT_OK;
    while (pos <= n &&
           (ps->lit ? literal_next(ps, p, n, pos, &ms, &me) : regex_next(e, ps->re, p, n, pos, &ms, &me, &st))) {
        if (me == ms) {
            size_t clen = me < n ? utf8_len((const unsigned char *)p + me, n - me) : 1;
            pos = me + (clen ? clen : 1);
            if (taken && me == prev) continue;
        } else {
            pos = me;
        }
        if (ms > prev && (st = split_segment(&s, prev, ms, ps->invert))) return st;
        if ((st = split_segment(&s, ms, me, !ps->invert))) return st;
        prev = me;
        taken = 1;
    }
    if (st) return st;
    if (prev < n && (st = split_segment(&s, prev, n, ps->invert))) return st;
    return split_flush(&s);
}

/* Metaspace: spaces become the replacement, which is prepended as the scheme
 * says, and (split) each replacement starts a new piece. */
static mt_status metaspace(enc *e, size_t k, const pre_step *ps, const char *p, size_t n, int first)
{
    tbuf *b = &e->depth[k];
    b->n = 0;
    const int starts = n >= ps->rep_len && memcmp(p, ps->rep, ps->rep_len) == 0;
    const int prepend = ps->scheme == SCHEME_ALWAYS ? !starts : ps->scheme == SCHEME_FIRST ? !starts && first : 0;
    if (prepend && tbuf_put(b, ps->rep, ps->rep_len)) return mt_tok_enc_oom(e);
    if (tbuf_reserve(b, n * ps->rep_len)) return mt_tok_enc_oom(e);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') memcpy(b->p + b->n, ps->rep, ps->rep_len), b->n += ps->rep_len;
        else b->p[b->n++] = p[i];
    }
    if (tbuf_pad(b)) return mt_tok_enc_oom(e); /* the next step's regex reads past the end */
    if (!ps->split) return mt_tok_pre_tokenize(e, k + 1, b->p, b->n, first);
    size_t cur = 0;
    for (size_t i = 1; i + ps->rep_len <= b->n; i++) {
        if (memcmp(b->p + i, ps->rep, ps->rep_len) != 0) continue;
        mt_status st = mt_tok_pre_tokenize(e, k + 1, b->p + cur, i - cur, first && cur == 0);
        if (st) return st;
        cur = i;
        i += ps->rep_len - 1;
    }
    return mt_tok_pre_tokenize(e, k + 1, b->p + cur, b->n - cur, first && cur == 0);
}

/* Whether BPE may cut p before the "▁" at q (q > 0, split_words): the
 * character before it is not in glue. A character outside the vocabulary
 * becomes <0xXX> tokens or the unknown token, whose spellings a glued token
 * might hold, so it is only cut after when nothing is glued. */
static int may_cut(const mt_tokenizer *t, const char *p, size_t q)
{
    if (!t->n_glue) return 1;
    const uint32_t c = mt_utf8_last(p, q);
    for (size_t g = 0; g < t->n_glue; g++)
        if (t->glue[g] == c) return 0;
    if (c < 0x80) return t->ascii_id[c] >= 0;
    char s[4];
    const size_t len = mt_utf8_encode(c, s);
    return sm_find(&t->vocab, s, len, hash_bytes(s, len)) >= 0;
}

/* Step k of the pre-tokenizer on one piece (first: it starts the text), down to the model. */
mt_status mt_tok_pre_tokenize(enc *e, size_t k, const char *p, size_t n, int first)
{
    const mt_tokenizer *t = e->t;
    if (!n) return MT_OK;
    if (k == t->n_pre && t->split_words) {
        size_t cur = 0;
        for (const char *hit = memmem(p, n, METASPACE_CHAR, 3); hit;
             hit = memmem(hit + 3, n - (size_t)(hit + 3 - p), METASPACE_CHAR, 3)) {
            size_t q = (size_t)(hit - p);
            if (q <= cur || (q >= 3 && memcmp(p + q - 3, METASPACE_CHAR, 3) == 0) || !may_cut(t, p, q)) continue;
            mt_status st = mt_tok_model_word(e, p + cur, q - cur);
            if (st) return st;
            cur = q;
        }
        return mt_tok_model_word(e, p + cur, n - cur);
    }
    if (k == t->n_pre) return mt_tok_model_word(e, p, n);
    const pre_step *ps = &t->pre[k];
    switch (ps->kind) {
    case PRE_SPLIT:
        return split_regex(e, k, ps, p, n, first);
    case PRE_METASPACE:
        return metaspace(e, k, ps, p, n, first);
    case PRE_BYTE_LEVEL:
        /* the last step: its pieces go to the model as raw bytes */
        if (ps->add_prefix_space && p[0] != ' ') {
            tbuf *b = &e->depth[k];
            b->n = 0;
            if (tbuf_put(b, " ", 1) || tbuf_put(b, p, n) || tbuf_pad(b)) return mt_tok_enc_oom(e);
            p = b->p, n = b->n;
        }
        if (ps->re) return split_regex(e, k, ps, p, n, first);
        return mt_tok_pre_tokenize(e, k + 1, p, n, first);
    }
    return MT_OK;
}
