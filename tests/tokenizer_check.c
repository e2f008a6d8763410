/* The tokenizer against a reference: for every case of the files that
 * tools/tokenizer-reference.mjs writes (one per model), encodes the text
 * with the case's flags and requires the reference's ids exactly; decodes
 * those ids and requires the reference's text, with and without
 * MT_DECODE_SKIP_SPECIAL; and, where the case says the text round-trips,
 * requires decoding to give it back. Also checks the buffer-size protocol
 * on every case (a first call with no room reports the count).
 *
 *   tokenizer_check REFERENCE.json...
 *
 * Prints each failure with the first differing position, then
 * "tokenizers: N passed, M failed"; exits 1 when any failed. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatrain.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) p[n] = '\0', *len = (size_t)n;
    return p;
}

/* A short printable rendering of s for messages. */
static void show(char *out, size_t size, const char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') o += (size_t)snprintf(out + o, size - o, "\\n");
        else if (c == '\r') o += (size_t)snprintf(out + o, size - o, "\\r");
        else if (c == '\t') o += (size_t)snprintf(out + o, size - o, "\\t");
        else if (c < 0x20) o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o] = '\0';
}

static const char *tok_name(const mt_tokenizer *t, int32_t id)
{
    const char *s = mt_tokenizer_id_to_token(t, id);
    return s ? s : "(none)";
}

static void print_ids(const char *label, const mt_tokenizer *t, const int32_t *ids, size_t n, size_t at)
{
    size_t from = at > 3 ? at - 3 : 0, to = at + 4 < n ? at + 4 : n;
    fprintf(stderr, "    %s [%zu..%zu):", label, from, to);
    for (size_t i = from; i < to; i++) fprintf(stderr, " %d \"%s\"", ids[i], tok_name(t, ids[i]));
    fprintf(stderr, "%s\n", to < n ? " ..." : "");
}

/* Decodes ids and compares with want; 0 when equal. */
static int check_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags, const char *want,
                        const char *what, const char *label)
{
    size_t len = 0;
    mt_status st = mt_tokenizer_decode(t, ids, n, flags, NULL, 0, &len);
    if (st) {
        fprintf(stderr, "FAIL %s: decode: %s\n", label, mt_last_errmsg());
        return 1;
    }
    char *text = malloc(len + 1);
    size_t len2 = 0;
    st = mt_tokenizer_decode(t, ids, n, flags, text, len + 1, &len2);
    int bad = st || len2 != len || text[len] != '\0';
    size_t wn = strlen(want);
    if (!bad && (len != wn || memcmp(text, want, wn) != 0)) {
        size_t at = 0;
        while (at < len && at < wn && text[at] == want[at]) at++;
        char a[200], b[200];
        size_t from = at > 20 ? at - 20 : 0;
        show(a, sizeof a, text + from, (len - from) < 60 ? len - from : 60);
        show(b, sizeof b, want + from, (wn - from) < 60 ? wn - from : 60);
        fprintf(stderr, "FAIL %s: decoding %s differs at byte %zu:\n    got  \"%s\"\n    want \"%s\"\n", label,
                what, at, a, b);
        bad = 1;
    } else if (bad) {
        fprintf(stderr, "FAIL %s: decode into a buffer of the reported size failed\n", label);
    }
    free(text);
    return bad;
}

/* One case; 0 when it passes. */
static int check_case(const mt_tokenizer *t, const cJSON *c, const char *model)
{
    const cJSON *name = cJSON_GetObjectItem(c, "name"), *text = cJSON_GetObjectItem(c, "text");
    const cJSON *flags = cJSON_GetObjectItem(c, "flags"), *ids = cJSON_GetObjectItem(c, "ids");
    const cJSON *dec = cJSON_GetObjectItem(c, "decoded"), *dec_skip = cJSON_GetObjectItem(c, "decoded_skip");
    const cJSON *rt = cJSON_GetObjectItem(c, "roundtrip");
    if (!cJSON_IsString(name) || !cJSON_IsString(text) || !cJSON_IsNumber(flags) || !cJSON_IsArray(ids) ||
        !cJSON_IsString(dec) || !cJSON_IsString(dec_skip)) {
        fprintf(stderr, "FAIL %s: a case of the reference file lacks a field\n", model);
        return 1;
    }
    char label[256];
    snprintf(label, sizeof label, "%s, %s, flags %d", model, name->valuestring, flags->valueint);
    const size_t want_n = (size_t)cJSON_GetArraySize(ids);
    int32_t *want = malloc((want_n + 1) * sizeof *want);
    size_t k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, ids) want[k++] = x->valueint;

    /* cJSON strings end at NUL; no reference text holds one */
    const char *s = text->valuestring;
    size_t n_ids = 0;
    int bad = 0;
    mt_status st = mt_tokenizer_encode(t, s, strlen(s), (uint32_t)flags->valueint, NULL, 0, &n_ids);
    int32_t *got = malloc((n_ids + 1) * sizeof *got);
    size_t n2 = 0;
    if (st) {
        fprintf(stderr, "FAIL %s: encode: %s\n", label, mt_last_errmsg());
        bad = 1;
    } else if ((st = mt_tokenizer_encode(t, s, strlen(s), (uint32_t)flags->valueint, got, n_ids, &n2)) || n2 != n_ids) {
        fprintf(stderr, "FAIL %s: the count with no room (%zu) and with room (%zu) differ\n", label, n_ids, n2);
        bad = 1;
    } else {
        size_t at = 0;
        while (at < n_ids && at < want_n && got[at] == want[at]) at++;
        if (at < n_ids || at < want_n) {
            fprintf(stderr, "FAIL %s: %zu ids, the reference %zu; first difference at %zu\n", label, n_ids, want_n, at);
            print_ids("got ", t, got, n_ids, at);
            print_ids("want", t, want, want_n, at);
            bad = 1;
        }
    }
    /* the reference's ids decode as the reference decodes them */
    bad |= check_decode(t, want, want_n, 0, dec->valuestring, "the reference ids", label);
    bad |= check_decode(t, want, want_n, MT_DECODE_SKIP_SPECIAL, dec_skip->valuestring,
                        "the reference ids, skipping special tokens", label);
    if (cJSON_IsObject(rt)) {
        const cJSON *rt_text = cJSON_GetObjectItem(rt, "text");
        const int skip = cJSON_IsTrue(cJSON_GetObjectItem(rt, "skip_special"));
        if (!bad)
            bad |= check_decode(t, got, n_ids, skip ? MT_DECODE_SKIP_SPECIAL : 0, rt_text->valuestring,
                                "the ids back to the text", label);
    }
    free(want);
    free(got);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: tokenizer_check REFERENCE.json...\n");
        return 2;
    }
    int passed = 0, failed = 0;
    for (int a = 1; a < argc; a++) {
        size_t len = 0;
        char *json = read_file(argv[a], &len);
        cJSON *root = json ? cJSON_ParseWithLength(json, len) : NULL;
        free(json);
        const cJSON *model = cJSON_GetObjectItem(root, "model"), *path = cJSON_GetObjectItem(root, "tokenizer");
        const cJSON *cases = cJSON_GetObjectItem(root, "cases");
        if (!cJSON_IsString(model) || !cJSON_IsString(path) || !cJSON_IsArray(cases)) {
            fprintf(stderr, "tokenizer_check: %s is not a reference file\n", argv[a]);
            cJSON_Delete(root);
            return 2;
        }
        mt_tokenizer *t = NULL;
        if (mt_tokenizer_load(&t, path->valuestring) != MT_OK) {
            fprintf(stderr, "FAIL %s: %s\n", model->valuestring, mt_last_errmsg());
            failed++;
            cJSON_Delete(root);
            continue;
        }
        int p = 0, f = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, cases)
        {
            if (check_case(t, c, model->valuestring)) f++;
            else p++;
        }
        printf("%s: %d passed, %d failed (vocabulary of %u ids)\n", model->valuestring, p, f,
               mt_tokenizer_vocab_size(t));
        passed += p, failed += f;
        mt_tokenizer_free(t);
        cJSON_Delete(root);
    }
    printf("tokenizers: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
