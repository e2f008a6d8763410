/* UTF-8 for the tokenizer: validation, encoding, the lossy repair decoders
 * need, the character classes of added tokens, GPT-2's byte-level alphabet.
 * The per-character helpers (utf8_len, utf8_decode) are inline in utf8.h. */
#include "text/utf8.h"

#include <utf8proc.h>

/* At an ill-formed sequence: how many bytes one U+FFFD replaces, the
 * "maximal subpart" rule of Rust's String::from_utf8_lossy (and of the
 * WHATWG decoder): a valid prefix of a sequence counts as one. */
static size_t utf8_bad_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0xC2 || c > 0xF4) return 1;
    size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (n < 2 || s[1] < lo || s[1] > hi) return 1;
    size_t i = 2;
    while (i < need && i < n && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

/* The offset of the first ill-formed byte of s, or n when s is UTF-8. */
size_t mt_utf8_check(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) { /* ASCII runs, 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_len(s + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

size_t mt_utf8_encode(uint32_t c, char *out)
{
    if (c < 0x80) return out[0] = (char)c, 1;
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Appends s with every ill-formed sequence replaced by U+FFFD. */
int mt_utf8_put_lossy(tbuf *b, const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        size_t bad = mt_utf8_check(text + i, n - i);
        if (tbuf_put(b, text + i, bad)) return -1;
        i += bad;
        if (i >= n) break;
        if (tbuf_put(b, "\xEF\xBF\xBD", 3)) return -1;
        i += utf8_bad_len(s + i, n - i);
    }
    return 0;
}

/* Unicode's White_Space property: what Rust's \s and Oniguruma's \s match
 * (used for added tokens' lstrip and rstrip). */
int mt_is_white_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Rust regex's \w, which decides an added token's single_word: letters,
 * marks, decimal digits, connector punctuation, letter numbers and the
 * joiners (Alphabetic's few symbols aside). */
int mt_is_word_char(uint32_t c)
{
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* The code point that ends at s + n (n > 0, well-formed text). */
uint32_t mt_utf8_last(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = n - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    size_t len;
    return utf8_decode(s + i, &len);
}

/* bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the 68
 * others for U+0100 onwards in byte order. */
void mt_byte_level_alphabet(uint32_t cp[256])
{
    uint32_t next = 256;
    for (unsigned b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? b : next++;
    }
}
