/* The Jinja renderer (src/text/jinja.h) against a reference: for every file
 * that tools/chat-template-reference.mjs writes (one per model: the chat
 * template's text, a fixed "now" and the cases, each a context and what
 * transformers.js's apply_chat_template renders from it, or the error with
 * which it refuses), parses the template once, renders every case's context
 * with the file's now_unix, and requires the reference's output byte for
 * byte, or a refusal where the reference refused.
 *
 *   chat_template_check REFERENCE.json...
 *
 * Runs with TZ set to a zone eleven hours behind UTC: strftime_now must read
 * now_unix in UTC, whatever the local zone. Prints each failure (the first
 * differing byte, with both sides around it escaped), a line per model, then
 * "chat-templates: N passed, M failed"; exits 1 when any failed, 2 when a
 * file is not a reference file. */
#define _POSIX_C_SOURCE 200112L
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megatrain.h"
#include "text/jinja.h"

/* failures shown in full per model; the rest get one line each */
#define FULL_REPORTS 10

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

/* The length of the UTF-8 sequence at s[i..n), or 0 where it is not a
 * whole, well-formed one. */
static size_t utf8_len(const unsigned char *s, size_t i, size_t n)
{
    unsigned char c = s[i];
    size_t k = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (!k || i + k > n) return 0;
    for (size_t j = 1; j < k; j++)
        if ((s[i + j] & 0xc0) != 0x80) return 0;
    return k;
}

/* s[from..to) of a text of n bytes, escaped: printable ASCII and whole UTF-8
 * sequences as they are, \n \r \t \\ \" and \xNN for the rest; "..." marks a
 * cut. */
static void show(FILE *out, const char *text, size_t n, size_t from, size_t to)
{
    const unsigned char *s = (const unsigned char *)text;
    fputs(from > 0 ? "...\"" : "\"", out);
    for (size_t i = from; i < to;) {
        unsigned char c = s[i];
        size_t k = c >= 0x80 ? utf8_len(s, i, to) : 0;
        if (k) {
            fwrite(s + i, 1, k, out);
            i += k;
            continue;
        }
        if (c == '\n') fputs("\\n", out);
        else if (c == '\r') fputs("\\r", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '\\') fputs("\\\\", out);
        else if (c == '"') fputs("\\\"", out);
        else if (c < 0x20 || c >= 0x7f) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
        i++;
    }
    fputs(to < n ? "\"..." : "\"", out);
}

/* Where a window of about `before` bytes before `at` starts: not inside a
 * UTF-8 sequence. */
static size_t window_start(const char *s, size_t at, size_t before)
{
    size_t from = at > before ? at - before : 0;
    while (from > 0 && ((unsigned char)s[from] & 0xc0) == 0x80) from--;
    return from;
}

static size_t window_end(const char *s, size_t n, size_t at, size_t after)
{
    size_t to = at + after < n ? at + after : n;
    while (to < n && ((unsigned char)s[to] & 0xc0) == 0x80) to++;
    return to;
}

/* The first bytes of a text, for a side that has no counterpart. */
static void show_head(FILE *out, const char *label, const char *s, size_t n)
{
    fprintf(out, "    %s (%zu bytes): ", label, n);
    show(out, s, n, 0, window_end(s, n, 0, 120));
    fputc('\n', out);
}

static void report_diff(FILE *out, const char *got, size_t got_n, const char *want, size_t want_n)
{
    size_t at = 0;
    while (at < got_n && at < want_n && got[at] == want[at]) at++;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at; i++) {
        if (want[i] == '\n') line++, col = 1;
        else col++;
    }
    fprintf(out, "    got %zu bytes, want %zu; first difference at byte %zu (line %zu, column %zu)%s\n", got_n,
            want_n, at, line, col,
            at == got_n ? ": the output stops early" : at == want_n ? ": the output goes on" : "");
    /* the same window of both, from a common start */
    size_t from = window_start(want, at, 40);
    fputs("    got  ", out);
    show(out, got, got_n, from, window_end(got, got_n, at, 40));
    fputs("\n    want ", out);
    show(out, want, want_n, from, window_end(want, want_n, at, 40));
    fputc('\n', out);
}

/* The ids of a rendering against the reference's (transformers' apply_chat_template(tokenize=True): the whole
 * text with its special tokens, no post-processor); 0 when they are the same. */
static int check_ids(const mt_tokenizer *tok, const char *text, size_t n, const cJSON *want, const char *model,
                     const char *name)
{
    size_t n_ids = 0;
    if (mt_tokenizer_encode(tok, text, n, MT_ENCODE_SPECIAL, NULL, 0, &n_ids) != MT_OK) {
        fprintf(stderr, "FAIL %s, %s: the tokenizer refuses the rendering: %s\n", model, name, mt_last_errmsg());
        return 1;
    }
    int32_t *ids = malloc((n_ids + 1) * sizeof *ids);
    if (!ids || mt_tokenizer_encode(tok, text, n, MT_ENCODE_SPECIAL, ids, n_ids, &n_ids) != MT_OK) {
        free(ids);
        fprintf(stderr, "FAIL %s, %s: encoding failed\n", model, name);
        return 1;
    }
    const size_t want_n = (size_t)cJSON_GetArraySize(want);
    size_t at = 0;
    const cJSON *w = want->child;
    while (at < n_ids && at < want_n && w && cJSON_IsNumber(w) && (int32_t)w->valuedouble == ids[at]) at++, w = w->next;
    const int bad = at != n_ids || at != want_n;
    if (bad)
        fprintf(stderr, "FAIL %s, %s: %zu ids, the reference %zu; the first difference at id %zu (%d against %d)\n",
                model, name, n_ids, want_n, at, at < n_ids ? ids[at] : -1,
                w && cJSON_IsNumber(w) ? (int)w->valuedouble : -1);
    free(ids);
    return bad;
}

/* One case; 0 when it passes. */
static int check_case(const mt_jinja *t, const mt_tokenizer *tok, const cJSON *c, long long now, const char *model,
                      int full)
{
    const cJSON *name = cJSON_GetObjectItem(c, "name"), *ctx = cJSON_GetObjectItem(c, "context");
    const cJSON *want = cJSON_GetObjectItem(c, "output"), *err = cJSON_GetObjectItem(c, "error");
    if (!cJSON_IsString(name) || !cJSON_IsObject(ctx) || (!cJSON_IsString(want) && !cJSON_IsString(err))) {
        fprintf(stderr, "FAIL %s: a case of the reference file lacks a field\n", model);
        return 1;
    }
    char why[512] = "";
    size_t got_n = 0;
    char *got = mt_jinja_render(t, ctx, now, &got_n, why, sizeof why);
    int bad = 0;
    if (cJSON_IsString(err)) {
        if (got) {
            fprintf(stderr, "FAIL %s, %s: the reference refuses (%s); the renderer gives %zu bytes\n", model,
                    name->valuestring, err->valuestring, got_n);
            if (full) show_head(stderr, "got", got, got_n);
            bad = 1;
        }
    } else if (!got) {
        fprintf(stderr, "FAIL %s, %s: the renderer refuses: %s\n", model, name->valuestring,
                why[0] ? why : "(no reason given)");
        if (full) show_head(stderr, "want", want->valuestring, strlen(want->valuestring));
        bad = 1;
    } else {
        /* cJSON strings end at NUL; no reference output holds one */
        size_t want_n = strlen(want->valuestring);
        if (got_n != want_n || memcmp(got, want->valuestring, want_n) != 0) {
            fprintf(stderr, "FAIL %s, %s: the output differs\n", model, name->valuestring);
            if (full) report_diff(stderr, got, got_n, want->valuestring, want_n);
            bad = 1;
        } else if (tok) {
            /* transformers.js's ids and the Rust library's: both, where the reference has them */
            if (cJSON_IsArray(cJSON_GetObjectItem(c, "ids")))
                bad |= check_ids(tok, got, got_n, cJSON_GetObjectItem(c, "ids"), model, name->valuestring);
            if (cJSON_IsArray(cJSON_GetObjectItem(c, "ids_tokenizers")))
                bad |= check_ids(tok, got, got_n, cJSON_GetObjectItem(c, "ids_tokenizers"), model,
                                 name->valuestring);
        }
    }
    free(got);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: chat_template_check REFERENCE.json...\n");
        return 2;
    }
    /* UTC-11, no zone file needed: a renderer reading local time gives the
     * day before for the reference's early-morning now */
    setenv("TZ", "XST+11", 1);
    tzset();
    int passed = 0, failed = 0;
    for (int a = 1; a < argc; a++) {
        size_t len = 0;
        char *json = read_file(argv[a], &len);
        cJSON *root = json ? cJSON_ParseWithLength(json, len) : NULL;
        free(json);
        const cJSON *model = cJSON_GetObjectItem(root, "model"), *tmpl = cJSON_GetObjectItem(root, "template");
        const cJSON *now = cJSON_GetObjectItem(root, "now_unix"), *cases = cJSON_GetObjectItem(root, "cases");
        if (!cJSON_IsString(model) || !cJSON_IsString(tmpl) || !cJSON_IsNumber(now) || !cJSON_IsArray(cases)) {
            fprintf(stderr, "chat_template_check: %s is not a reference file\n", argv[a]);
            cJSON_Delete(root);
            return 2;
        }
        const char *m = model->valuestring;
        const int n_cases = cJSON_GetArraySize(cases);
        char why[512] = "";
        mt_jinja *t = mt_jinja_parse(tmpl->valuestring, strlen(tmpl->valuestring), why, sizeof why);
        if (!t) {
            fprintf(stderr, "FAIL %s: the template does not parse: %s\n", m, why[0] ? why : "(no reason given)");
            printf("%s: 0 passed, %d failed (the template does not parse)\n", m, n_cases);
            fflush(stdout);
            failed += n_cases;
            cJSON_Delete(root);
            continue;
        }
        /* the token ids too, where the reference gives its tokenizer */
        const cJSON *tok_path = cJSON_GetObjectItem(root, "tokenizer");
        mt_tokenizer *tok = NULL;
        if (cJSON_IsString(tok_path) && mt_tokenizer_load(&tok, tok_path->valuestring) != MT_OK) {
            fprintf(stderr, "FAIL %s: the tokenizer does not load: %s\n", m, mt_last_errmsg());
            printf("%s: 0 passed, %d failed (the tokenizer does not load)\n", m, n_cases);
            fflush(stdout);
            failed += n_cases;
            mt_jinja_free(t);
            cJSON_Delete(root);
            continue;
        }
        int p = 0, f = 0, refusals = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, cases)
        {
            refusals += cJSON_IsString(cJSON_GetObjectItem(c, "error"));
            if (check_case(t, tok, c, (long long)now->valuedouble, m, f < FULL_REPORTS)) f++;
            else p++;
        }
        printf("%s: %d passed, %d failed (%d cases, %d of them refusals%s)\n", m, p, f, n_cases, refusals,
               tok ? "; the ids too" : "");
        mt_tokenizer_free(tok);
        fflush(stdout);
        passed += p, failed += f;
        mt_jinja_free(t);
        cJSON_Delete(root);
    }
    printf("chat-templates: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
