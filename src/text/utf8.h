/* Text as bytes, for the tokenizer: growable byte buffers, UTF-8
 * (validation, decoding, encoding, lossy repair), the two character classes
 * added tokens need, and GPT-2's byte-level alphabet. What the encoder calls
 * per byte or per character is inline here, so that the tokenizer's files
 * cost no call where one file cost none. */
#ifndef MT_TEXT_UTF8_H
#define MT_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable byte buffers ---------------------------------------------------- */

typedef struct tbuf {
    char *p;
    size_t n, cap;
} tbuf;

static inline int tbuf_reserve(tbuf *b, size_t extra)
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

static inline int tbuf_put(tbuf *b, const void *s, size_t n)
{
    if (tbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* Bytes after a buffer's text that tbuf_pad() defines. */
#define TBUF_PAD 64

/* Zeroes the TBUF_PAD bytes after b's text (growing b as need be) without
 * counting them. PCRE2's JIT scans for a literal in whole vector words, some
 * of which reach past the subject's end: in a buffer of ours those bytes
 * must hold something, or valgrind reports a jump on uninitialised memory.
 * -1 when out of memory. */
static inline int tbuf_pad(tbuf *b)
{
    if (tbuf_reserve(b, TBUF_PAD)) return -1;
    memset(b->p + b->n, 0, TBUF_PAD);
    return 0;
}

static inline void tbuf_free(tbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- UTF-8 ------------------------------------------------------------------- */

/* The length of the well-formed sequence at s (n > 0 bytes available), or 0
 * when it is ill-formed (Unicode's table 3-7: no overlongs, surrogates or
 * code points above U+10FFFF). */
static inline size_t utf8_len(const unsigned char *s, size_t n)
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

/* The code point at s (well-formed), its length in *len. */
static inline uint32_t utf8_decode(const unsigned char *s, size_t *len)
{
    unsigned c = s[0];
    if (c < 0x80) return *len = 1, c;
    if (c < 0xE0) return *len = 2, ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    if (c < 0xF0) return *len = 3, ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    return *len = 4, ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

/* The offset of the first ill-formed byte of s, or n when s is UTF-8. */
size_t mt_utf8_check(const char *text, size_t n);
/* Writes code point c as UTF-8 into out (room for 4 bytes); its length. */
size_t mt_utf8_encode(uint32_t c, char *out);
/* Appends s with every ill-formed sequence replaced by U+FFFD; -1 when out of memory. */
int mt_utf8_put_lossy(tbuf *b, const char *text, size_t n);
/* Unicode's White_Space property (added tokens' lstrip and rstrip). */
int mt_is_white_space(uint32_t c);
/* Rust regex's \w (added tokens' single_word). */
int mt_is_word_char(uint32_t c);
/* The code point that ends at s + n (n > 0, well-formed text). */
uint32_t mt_utf8_last(const char *text, size_t n);

/* ---- GPT-2's byte-level alphabet ------------------------------------------------ */

/* bytes_to_unicode(): each byte's code point. */
void mt_byte_level_alphabet(uint32_t cp[256]);

#define BYTE_LEVEL_CP_END 0x144 /* 256 + 68: one past the alphabet's largest code point */

/* U+2581, SentencePiece's word boundary */
#define METASPACE_CHAR "\xE2\x96\x81"

#endif
