/* tokenizer.json as mt_tokenizer_load reads it, then "\n--\n", then a text.
 * A tokenizer that loads encodes the text with each flag set, and must:
 * refuse it with a message exactly when it is not UTF-8; count the same ids
 * with no room as it writes with room; give only ids it can spell; and
 * decode them, with and without MT_DECODE_SKIP_SPECIAL, into UTF-8 of the
 * length it reports. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF). */
static int is_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return 0;
        i += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_part part[2];
    fuzz_split(data, size, part);
    const char *dir = fuzz_scratch();
    fuzz_write(dir, "tokenizer.json", part[0].p, part[0].n);
    mt_tokenizer *t = (mt_tokenizer *)(uintptr_t)1;
    mt_status st = mt_tokenizer_load(&t, dir);
    fuzz_expect_message(st, mt_last_errmsg(), "mt_tokenizer_load");
    if (st) {
        if (t) abort();
        return 0;
    }
    const char *text = (const char *)part[1].p;
    const int valid = is_utf8(part[1].p, part[1].n);
    for (uint32_t flags = 0; flags < 4; flags++) {
        size_t n = 0, n2 = 0;
        st = mt_tokenizer_encode(t, text, part[1].n, flags, NULL, 0, &n);
        fuzz_expect_message(st, mt_last_errmsg(), "mt_tokenizer_encode");
        if ((st == MT_ERR_INVALID_ARGUMENT) == valid) {
            fprintf(stderr, "mt_tokenizer_encode: %s for %s text\n", mt_status_str(st), valid ? "UTF-8" : "non-UTF-8");
            abort();
        }
        if (st) continue;
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        if (!ids || mt_tokenizer_encode(t, text, part[1].n, flags, ids, n, &n2) != MT_OK || n2 != n) abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= mt_tokenizer_vocab_size(t) || !mt_tokenizer_id_to_token(t, ids[i]))
                abort();
        for (uint32_t skip = 0; skip < 2; skip++) {
            size_t len = 0, len2 = 0;
            if (mt_tokenizer_decode(t, ids, n, skip, NULL, 0, &len) != MT_OK) abort();
            char *out = malloc(len + 1);
            if (!out || mt_tokenizer_decode(t, ids, n, skip, out, len + 1, &len2) != MT_OK || len2 != len ||
                out[len] != '\0' || !is_utf8((const uint8_t *)out, len))
                abort();
            free(out);
        }
        free(ids);
    }
    mt_tokenizer_free(t);
    return 0;
}
