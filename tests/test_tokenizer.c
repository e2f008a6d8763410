/* Tokenizers, on the small hand-written tokenizer.json files of
 * tests/fixtures/tokenizers:
 *   bytelevel.json      byte-level BPE (Qwen's shape): NFC, the Split regex,
 *                       ByteLevel, added tokens of every kind, a template;
 *   sentencepiece.json  Llama 2's shape: Prepend and Replace, no
 *                       pre-tokenizer, byte fallback, <unk> fused, the
 *                       Replace/ByteFallback/Fuse/Strip decoders;
 *   metaspace.json      the Metaspace pre-tokenizer and decoder;
 *   gemma.json          Gemma 3's shape: Replace of spaces without Prepend,
 *                       a Split on " " MergedWithPrevious, byte fallback,
 *                       added tokens of newlines and "▁▁", a merged token
 *                       that holds ">▁" (no cutting after ">");
 *   split.json          a Split on "-", for its five behaviors and invert;
 *   unsupported.json    a Whitespace pre-tokenizer.
 * Each expected id list is worked out by hand from the fixture's merges
 * (the comments say how), following the Rust tokenizers library. Variants
 * of the fixtures (a field changed) are written to a temporary directory.
 * The real vocabularies are compared with their reference implementation
 * by tests/tokenizers.sh. */
#define _DEFAULT_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "megatrain.h"

#define FIXTURES "tests/fixtures/tokenizers/"

/* ---- a temporary directory per test ---------------------------------------- */

static char tmp_dir[64];

static void make_tmp_dir(void)
{
    strcpy(tmp_dir, "/tmp/mt_tok_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp failed");
}

static void remove_tmp_dir(void)
{
    if (!tmp_dir[0]) return;
    DIR *d = opendir(tmp_dir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
            if (rmdir(p) != 0) unlink(p);
        }
        closedir(d);
    }
    rmdir(tmp_dir);
    tmp_dir[0] = '\0';
}

TestSuite(tokenizer, .init = make_tmp_dir, .fini = remove_tmp_dir, .timeout = 120);

/* ---- helpers ------------------------------------------------------------------ */

static mt_tokenizer *load_ok(const char *path)
{
    mt_tokenizer *t = NULL;
    mt_status st = mt_tokenizer_load(&t, path);
    cr_assert_eq(st, MT_OK, "loading %s: %s (%s)", path, mt_status_str(st), mt_last_errmsg());
    cr_assert_not_null(t);
    cr_assert_str_eq(mt_last_errmsg(), "");
    return t;
}

static cJSON *fixture_json(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, FIXTURES "%s", name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j, "%s is not JSON", path);
    return j;
}

/* Replaces (or adds) obj[key] with the JSON value `json`. */
static void set_json(cJSON *obj, const char *key, const char *json)
{
    cr_assert_not_null(obj, "no object to set %s in", key);
    cJSON *v = cJSON_Parse(json);
    cr_assert_not_null(v, "bad JSON in the test: %s", json);
    if (cJSON_GetObjectItemCaseSensitive(obj, key)) cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
    else cJSON_AddItemToObject(obj, key, v);
}

static cJSON *get(cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

/* Writes root (then deletes it) to the test directory as `name`; the path, in buf (256 bytes). */
static const char *write_json(char *buf, cJSON *root, const char *name)
{
    snprintf(buf, 256, "%s/%s", tmp_dir, name);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = fopen(buf, "wb");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    return buf;
}

static mt_tokenizer *load_variant(cJSON *root)
{
    char path[256];
    return load_ok(write_json(path, root, "variant.json"));
}

/* Loading root must fail with status st and exactly "<path>: <what>". */
static void expect_refusal(cJSON *root, mt_status st, const char *what)
{
    char path[256], want[1024];
    write_json(path, root, "refused.json");
    mt_tokenizer *t = (mt_tokenizer *)(uintptr_t)1;
    mt_status got = mt_tokenizer_load(&t, path);
    cr_assert_eq(got, st, "status %s, expected %s (%s)", mt_status_str(got), mt_status_str(st), mt_last_errmsg());
    cr_assert_null(t, "a refused load leaves *out NULL");
    snprintf(want, sizeof want, "%s: %s", path, what);
    cr_assert_str_eq(mt_last_errmsg(), want);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* text (len bytes) encodes to want[0..n). */
static void expect_ids_n(const mt_tokenizer *t, const char *text, size_t len, uint32_t flags, const int32_t *want,
                         size_t n)
{
    int32_t got[4096];
    size_t n_got = 0;
    mt_status st = mt_tokenizer_encode(t, text, len, flags, got, 4096, &n_got);
    cr_assert_eq(st, MT_OK, "encoding \"%s\": %s", text, mt_last_errmsg());
    int same = n_got == n;
    for (size_t i = 0; same && i < n; i++) same = got[i] == want[i];
    if (!same) {
        print_ids("got ", got, n_got);
        print_ids("want", want, n);
    }
    cr_assert(same, "encoding \"%s\" (flags %u): %zu ids, expected %zu (both above)", text, flags, n_got, n);
}

#define EXPECT_IDS(t, text, flags, ...)                                              \
    do {                                                                             \
        const int32_t want_[] = {__VA_ARGS__};                                       \
        expect_ids_n(t, text, strlen(text), flags, want_, sizeof want_ / sizeof *want_); \
    } while (0)
#define EXPECT_NO_IDS(t, text, flags) expect_ids_n(t, text, strlen(text), flags, NULL, 0)

/* The decoding of ids, NUL-terminated; free() it. */
static char *decode(const mt_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags)
{
    size_t len = 0;
    mt_status st = mt_tokenizer_decode(t, ids, n, flags, NULL, 0, &len);
    cr_assert_eq(st, MT_OK, "decode: %s", mt_last_errmsg());
    char *s = malloc(len + 1);
    size_t len2 = 0;
    cr_assert_eq(mt_tokenizer_decode(t, ids, n, flags, s, len + 1, &len2), MT_OK);
    cr_assert_eq(len2, len);
    cr_assert_eq(s[len], '\0');
    return s;
}

#define EXPECT_DECODE(t, flags, want, ...)                                      \
    do {                                                                        \
        const int32_t ids_[] = {__VA_ARGS__};                                   \
        char *got_ = decode(t, ids_, sizeof ids_ / sizeof *ids_, flags);        \
        cr_assert_str_eq(got_, want);                                           \
        free(got_);                                                             \
    } while (0)

/* encode then decode gives text back (want: the text decoding must give). */
static void expect_round_trip(const mt_tokenizer *t, const char *text, uint32_t enc_flags, uint32_t dec_flags,
                              const char *want)
{
    int32_t ids[4096];
    size_t n = 0;
    cr_assert_eq(mt_tokenizer_encode(t, text, strlen(text), enc_flags, ids, 4096, &n), MT_OK, "%s", mt_last_errmsg());
    char *back = decode(t, ids, n, dec_flags);
    cr_assert_str_eq(back, want, "round trip of \"%s\"", text);
    free(back);
}

/* ---- loading ---------------------------------------------------------------------- */

Test(tokenizer, loads_a_file_or_a_folder)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    cr_assert_eq(mt_tokenizer_vocab_size(t), 67, "the largest id, 66 (an added token), plus one");
    mt_tokenizer_free(t);

    /* a model folder: its tokenizer.json */
    char path[256];
    write_json(path, fixture_json("bytelevel.json"), "tokenizer.json");
    t = load_ok(tmp_dir);
    cr_assert_eq(mt_tokenizer_vocab_size(t), 67);
    mt_tokenizer_free(t);
    mt_tokenizer_free(NULL);
}

Test(tokenizer, refuses_missing_files_and_bad_json)
{
    mt_tokenizer *t = NULL;
    char path[300], want[700];
    snprintf(path, sizeof path, "%s/none.json", tmp_dir);
    cr_assert_eq(mt_tokenizer_load(&t, path), MT_ERR_IO);
    snprintf(want, sizeof want, "cannot open tokenizer %s: No such file or directory", path);
    cr_assert_str_eq(mt_last_errmsg(), want);
    cr_assert_null(t);

    cr_assert_eq(mt_tokenizer_load(&t, tmp_dir), MT_ERR_IO);
    snprintf(want, sizeof want, "folder %s has no tokenizer.json: No such file or directory", tmp_dir);
    cr_assert_str_eq(mt_last_errmsg(), want);

    snprintf(path, sizeof path, "%s/bad.json", tmp_dir);
    FILE *f = fopen(path, "wb");
    fputs("{\"model\": {\n  \"type\": \"BPE\",,", f);
    fclose(f);
    cr_assert_eq(mt_tokenizer_load(&t, path), MT_ERR_FORMAT);
    snprintf(want, sizeof want, "%s is not valid JSON (error near line 2, column 17)", path);
    cr_assert_str_eq(mt_last_errmsg(), want);

    cr_assert_eq(mt_tokenizer_load(NULL, path), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_load: out is NULL");
    cr_assert_eq(mt_tokenizer_load(&t, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_load: path is NULL");
}

Test(tokenizer, refuses_an_unsupported_pre_tokenizer_by_name)
{
    mt_tokenizer *t = NULL;
    cr_assert_eq(mt_tokenizer_load(&t, FIXTURES "unsupported.json"), MT_ERR_UNSUPPORTED);
    cr_assert_str_eq(mt_last_errmsg(), FIXTURES "unsupported.json: pre_tokenizer type 'Whitespace' is not supported "
                                               "(supported: Split, ByteLevel, Metaspace, Sequence)");
    cr_assert_null(t);
}

/* Every refusal, each with its message. */
Test(tokenizer, refuses_each_unsupported_or_broken_component)
{
    static const char REGEX[] = "{\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
                                "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+\"}";
    char split[512], json[1024];
    snprintf(split, sizeof split, "{\"type\": \"Split\", \"pattern\": %s, \"behavior\": \"%%s\", \"invert\": %%s}",
             REGEX);
    static const char BL[] = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}";
    cJSON *j;

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "type", "\"Unigram\"");
    expect_refusal(j, MT_ERR_UNSUPPORTED, "model type 'Unigram' is not supported (supported: BPE)");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "dropout", "0.1");
    expect_refusal(j, MT_ERR_UNSUPPORTED,
                   "model.dropout is set: BPE dropout samples merges at random, which this library does not do");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "continuing_subword_prefix", "\"##\"");
    expect_refusal(j, MT_ERR_UNSUPPORTED, "model.continuing_subword_prefix is set: not supported (only null or \"\")");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "end_of_word_suffix", "\"</w>\"");
    expect_refusal(j, MT_ERR_UNSUPPORTED, "model.end_of_word_suffix is set: not supported (only null or \"\")");

    j = fixture_json("bytelevel.json");
    cJSON_DeleteItemFromObject(j, "model");
    expect_refusal(j, MT_ERR_FORMAT, "has no \"model\" object");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "vocab", "{}");
    expect_refusal(j, MT_ERR_FORMAT, "model.vocab is empty");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "vocab", "{\"a\": 0, \"x\": -1}");
    expect_refusal(j, MT_ERR_FORMAT, "the id of vocabulary token \"x\" is not a whole number in [0, 33554431]");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "merges", "[\"t h\", \"t x\"]");
    expect_refusal(j, MT_ERR_FORMAT, "model.merges[1] (\"t\" + \"x\") names \"x\", which is not in the vocabulary");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "merges", "[[\"t\", \"a\"]]");
    expect_refusal(j, MT_ERR_FORMAT, "model.merges[0] (\"t\" + \"a\") names \"ta\", which is not in the vocabulary");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "merges", "[\"t h e\"]");
    expect_refusal(j, MT_ERR_FORMAT, "model.merges[0] \"t h e\" is not two tokens separated by one space");

    j = fixture_json("bytelevel.json");
    set_json(get(j, "model"), "merges", "[[\"t\"]]");
    expect_refusal(j, MT_ERR_FORMAT, "model.merges[0] is neither \"a b\" nor [\"a\", \"b\"]");

    j = fixture_json("bytelevel.json");
    set_json(j, "normalizer", "{\"type\": \"Lowercase\"}");
    expect_refusal(j, MT_ERR_UNSUPPORTED,
                   "normalizer type 'Lowercase' is not supported (supported: NFC, Prepend, Replace, Sequence)");

    j = fixture_json("bytelevel.json");
    set_json(j, "normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"NFKC\"}]}");
    expect_refusal(j, MT_ERR_UNSUPPORTED,
                   "normalizer.normalizers[1] type 'NFKC' is not supported "
                   "(supported: NFC, Prepend, Replace, Sequence)");

    j = fixture_json("bytelevel.json");
    set_json(j, "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \" \"}");
    expect_refusal(j, MT_ERR_UNSUPPORTED, "normalizer: a Regex pattern is not supported here (supported: String)");

    j = fixture_json("bytelevel.json");
    snprintf(json, sizeof json, "{\"type\": \"Sequence\", \"pretokenizers\": [%s, %s]}", split, BL);
    char json2[1024];
    snprintf(json2, sizeof json2, json, "Dropped", "false");
    set_json(j, "pre_tokenizer", json2);
    expect_refusal(j, MT_ERR_FORMAT,
                   "pre_tokenizer.pretokenizers[0] (Split): behavior 'Dropped' is not one of Removed, Isolated, "
                   "MergedWithPrevious, MergedWithNext, Contiguous");

    j = fixture_json("bytelevel.json");
    snprintf(json2, sizeof json2, json, "Isolated", "\"yes\"");
    set_json(j, "pre_tokenizer", json2);
    expect_refusal(j, MT_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].invert is not true or false");

    j = fixture_json("bytelevel.json");
    snprintf(json, sizeof json, "{\"type\": \"Sequence\", \"pretokenizers\": [%s, {\"type\": \"Split\", \"pattern\": "
                                "{\"String\": \" \"}, \"behavior\": \"Isolated\", \"invert\": false}]}", BL);
    set_json(j, "pre_tokenizer", json);
    expect_refusal(j, MT_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1]: a Split after the ByteLevel pre-tokenizer is "
                                          "not supported (ByteLevel must come last)");

    j = fixture_json("bytelevel.json");
    set_json(j, "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"ab\", \"prepend_scheme\": \"always\"}");
    expect_refusal(j, MT_ERR_FORMAT, "pre_tokenizer.replacement must be one character, not \"ab\"");

    j = fixture_json("bytelevel.json");
    set_json(j, "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}");
    expect_refusal(j, MT_ERR_FORMAT, "pre_tokenizer.prepend_scheme 'sometimes' is not always, first or never");

    j = fixture_json("bytelevel.json");
    set_json(j, "post_processor", "{\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 1], \"cls\": [\"[CLS]\", 0]}");
    expect_refusal(j, MT_ERR_UNSUPPORTED,
                   "post_processor type 'BertProcessing' is not supported "
                   "(supported: ByteLevel, TemplateProcessing, Sequence)");

    j = fixture_json("bytelevel.json");
    set_json(j, "post_processor", "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"B\", "
                                  "\"type_id\": 0}}], \"special_tokens\": {}}");
    expect_refusal(j, MT_ERR_UNSUPPORTED,
                   "post_processor.single must hold the sequence A once (a single text's template)");

    j = fixture_json("bytelevel.json");
    set_json(j, "post_processor", "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", "
                                  "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
                                  "\"special_tokens\": {}}");
    expect_refusal(j, MT_ERR_FORMAT,
                   "post_processor: special token \"<x>\" of the template has no ids in special_tokens");

    j = fixture_json("bytelevel.json");
    set_json(j, "post_processor", "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", "
                                  "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
                                  "\"special_tokens\": {\"<x>\": {\"id\": \"<x>\", \"ids\": [67]}}}");
    expect_refusal(j, MT_ERR_FORMAT,
                   "post_processor: special token \"<x>\" has id 67, outside the vocabulary (67 ids)");

    j = fixture_json("bytelevel.json");
    set_json(j, "post_processor", "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", "
                                  "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
                                  "\"special_tokens\": {\"<x>\": {\"id\": \"<x>\", \"ids\": [53]}}}");
    expect_refusal(j, MT_ERR_FORMAT, "post_processor: the template's special token id 53 is no token's id");

    /* strings that go into the text, or are looked for in it, must be UTF-8 */
    j = fixture_json("split.json");
    set_json(get(j, "pre_tokenizer"), "pattern", "{\"String\": \"\xFF\"}");
    expect_refusal(j, MT_ERR_FORMAT, "pre_tokenizer.pattern is not valid UTF-8");

    j = fixture_json("sentencepiece.json");
    set_json(get(get(j, "normalizer"), "normalizers")->child, "prepend", "\"\xFF\"");
    expect_refusal(j, MT_ERR_FORMAT, "normalizer.normalizers[0].prepend is not valid UTF-8");

    j = fixture_json("bytelevel.json");
    set_json(j, "decoder", "{\"type\": \"WordPiece\", \"prefix\": \"##\"}");
    expect_refusal(j, MT_ERR_UNSUPPORTED, "decoder type 'WordPiece' is not supported (supported: ByteLevel, Metaspace, "
                                          "Replace, ByteFallback, Fuse, Strip, Sequence)");

    j = fixture_json("sentencepiece.json");
    cJSON_AddItemToArray(get(get(j, "decoder"), "decoders"), cJSON_Parse("{\"type\": \"CTC\"}"));
    expect_refusal(j, MT_ERR_UNSUPPORTED, "decoder.decoders[4] type 'CTC' is not supported (supported: ByteLevel, "
                                          "Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");

    j = fixture_json("sentencepiece.json");
    set_json(j, "decoder", "{\"type\": \"Strip\", \"content\": \"ab\", \"start\": 1, \"stop\": 0}");
    expect_refusal(j, MT_ERR_FORMAT, "decoder.content must be one character, not \"ab\"");

    j = fixture_json("bytelevel.json");
    set_json(j, "added_tokens", "[{\"id\": 60, \"content\": \"\", \"special\": true}]");
    expect_refusal(j, MT_ERR_FORMAT, "added_tokens[0].content is empty");

    j = fixture_json("bytelevel.json");
    set_json(j, "added_tokens", "[{\"id\": 1e9, \"content\": \"<x>\", \"special\": true}]");
    expect_refusal(j, MT_ERR_FORMAT, "added_tokens[0].id is not a whole number in [0, 33554431]");

    j = fixture_json("bytelevel.json");
    snprintf(json, sizeof json, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                                "{\"Regex\": \"(a\"}, \"behavior\": \"Isolated\", \"invert\": false}, %s]}", BL);
    set_json(j, "pre_tokenizer", json);
    char path[256];
    write_json(path, j, "regex.json");
    mt_tokenizer *t = NULL;
    cr_assert_eq(mt_tokenizer_load(&t, path), MT_ERR_UNSUPPORTED);
    char want[400];
    snprintf(want, sizeof want, "%s: pre_tokenizer.pretokenizers[0]: the regex does not compile: ", path);
    cr_assert(!strncmp(mt_last_errmsg(), want, strlen(want)), "%s", mt_last_errmsg());
}

/* ---- byte-level BPE ------------------------------------------------------------------ */

Test(tokenizer, merges_lowest_rank_first_then_leftmost)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    /* "hat": "a t" (rank 4), then "h at" (rank 6) */
    EXPECT_IDS(t, "hat", 0, 41);
    /* "that": "t h" (rank 0) first, then "a t": "th" + "at", never "t" + "hat" */
    EXPECT_IDS(t, "that", 0, 35, 38);
    /* "cat": "a t" (rank 4) before "c a" (rank 15): "c" + "at" */
    EXPECT_IDS(t, "cat", 0, 3, 38);
    /* " cat": "Ġ c" (3), "a t" (4), "Ġc at" (5) */
    EXPECT_IDS(t, " cat", 0, 40);
    /* "eee": two equal pairs, the left one merges */
    EXPECT_IDS(t, "eee", 0, 46, 4);
    /* the regex's pieces: words with their space, digits one by one, "'ll", whitespace runs */
    EXPECT_IDS(t, "the cat in the hat.", 0, 36, 40, 44, 37, 42, 13);
    EXPECT_IDS(t, "123", 0, 14, 15, 16);
    EXPECT_IDS(t, "'ll", 0, 48);
    EXPECT_IDS(t, "a  b", 0, 2, 0, 0, 27); /* "a", " ", " b": "\s+(?!\S)" leaves the last space to the word */
    EXPECT_IDS(t, "a\n\nb", 0, 2, 1, 1, 27);
    /* a byte whose character is not in the vocabulary, with no unk_token: dropped, as tokenizers does */
    EXPECT_IDS(t, "axb", 0, 2, 27);
    EXPECT_NO_IDS(t, "", 0);
    mt_tokenizer_free(t);
}

Test(tokenizer, nfc_composes_decomposed_text)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    /* "é" is C3 A9, the characters "Ã" "©"; "caf" + "Ã©" merge last (rank 17) */
    EXPECT_IDS(t, "caf\xC3\xA9", 0, 52);
    EXPECT_IDS(t, "cafe\xCC\x81", 0, 52); /* e + U+0301 */
    expect_round_trip(t, "cafe\xCC\x81", 0, 0, "caf\xC3\xA9");
    mt_tokenizer_free(t);
}

Test(tokenizer, special_tokens_only_with_the_flag)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    EXPECT_IDS(t, "<|im_start|>a<|im_end|>", MT_ENCODE_SPECIAL, 61, 2, 62);
    /* without it, text: "<|", "im", "_start", "|>", "a", "<|", "im", "_end", "|>" */
    EXPECT_IDS(t, "<|im_start|>a<|im_end|>", 0, 19, 21, 7, 22, 23, 9, 10, 2, 24, 10, 21, 20, 2, 19, 21, 7, 22, 23, 4,
               8, 34, 21, 20);
    /* a non-special added token is always one */
    EXPECT_IDS(t, "a<tool>b", 0, 2, 63, 27);
    EXPECT_IDS(t, "a<tool>b", MT_ENCODE_SPECIAL, 2, 63, 27);
    /* "<|im" (non-special) inside "<|im_start|>": the longest match wins, and
     * when that one is passed over (special, no flag) the shorter one is not
     * looked for inside it, as tokenizers' matcher does */
    EXPECT_IDS(t, "<|ima", 0, 64, 2);
    EXPECT_IDS(t, "<|im_start|>", 0, 19, 21, 7, 22, 23, 9, 10, 2, 24, 10, 21, 20);
    EXPECT_IDS(t, "<|im_start|><|im", MT_ENCODE_SPECIAL, 61, 64);
    /* the text between added tokens is pre-tokenized on its own: " the" keeps its space */
    EXPECT_IDS(t, "<|endoftext|> the", MT_ENCODE_SPECIAL, 60, 37);
    mt_tokenizer_free(t);
}

Test(tokenizer, added_token_options)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    /* [MASK]: lstrip and rstrip take the spaces around it */
    EXPECT_IDS(t, "a [MASK] b", MT_ENCODE_SPECIAL, 2, 65, 27);
    EXPECT_IDS(t, "a  \t[MASK]\n b", MT_ENCODE_SPECIAL, 2, 65, 27);
    /* special: text without the flag ("a", " [", "MASK", "]", " b") */
    EXPECT_IDS(t, "a [MASK] b", 0, 2, 0, 28, 30, 31, 32, 33, 29, 0, 27);
    /* <w>: single_word, so not inside a word ("a", "<w", ">b") */
    EXPECT_IDS(t, "a <w> b", 0, 2, 0, 66, 0, 27);
    EXPECT_IDS(t, "<w>", 0, 66);
    EXPECT_IDS(t, "a<w>b", 0, 2, 19, 26, 20, 27);
    EXPECT_IDS(t, "a <w>b", 0, 2, 0, 19, 26, 20, 27);
    mt_tokenizer_free(t);
}

Test(tokenizer, template_with_add_special)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    EXPECT_IDS(t, "hat", MT_ENCODE_ADD_SPECIAL, 61, 41, 62);
    EXPECT_IDS(t, "", MT_ENCODE_ADD_SPECIAL, 61, 62);
    EXPECT_IDS(t, "<|endoftext|>", MT_ENCODE_ADD_SPECIAL | MT_ENCODE_SPECIAL, 61, 60, 62);
    mt_tokenizer_free(t);
}

Test(tokenizer, ignore_merges_takes_whole_tokens)
{
    cJSON *j = fixture_json("bytelevel.json");
    cJSON_AddItemToObject(get(get(j, "model"), "vocab"), "that", cJSON_CreateNumber(53));
    set_json(get(j, "model"), "ignore_merges", "true");
    mt_tokenizer *t = load_variant(j);
    EXPECT_IDS(t, "that", 0, 53);
    EXPECT_IDS(t, " that", 0, 0, 35, 38); /* "Ġthat" is not a token: BPE */
    mt_tokenizer_free(t);

    j = fixture_json("bytelevel.json");
    cJSON_AddItemToObject(get(get(j, "model"), "vocab"), "that", cJSON_CreateNumber(53));
    t = load_variant(j);
    EXPECT_IDS(t, "that", 0, 35, 38); /* without ignore_merges, BPE never reaches "that" */
    mt_tokenizer_free(t);
}

Test(tokenizer, byte_level_pre_tokenizer_options)
{
    /* GPT-2's: ByteLevel alone, its own regex, a space in front */
    cJSON *j = fixture_json("bytelevel.json");
    set_json(j, "pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}");
    mt_tokenizer *t = load_variant(j);
    EXPECT_IDS(t, "the cat", 0, 37, 40);
    EXPECT_IDS(t, "hat", 0, 42);
    EXPECT_IDS(t, " hat", 0, 42);
    EXPECT_IDS(t, "'ll", 0, 0, 11, 12, 12); /* GPT-2's regex cuts " 'll" into " '" and "ll" */
    mt_tokenizer_free(t);

    /* Split with a String pattern */
    j = fixture_json("bytelevel.json");
    set_json(j, "pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                                 "{\"String\": \"at\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
                                 "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}");
    t = load_variant(j);
    EXPECT_IDS(t, "hat", 0, 6, 38);          /* "h", "at" */
    EXPECT_IDS(t, " cat", 0, 39, 38);        /* " c", "at" */
    mt_tokenizer_free(t);
}

Test(tokenizer, regex_whitespace_is_oniguruma_s)
{
    /* tokenizers compiles Split regexes with Oniguruma, whose \s has U+0085
     * (NEL) but not U+180E or U+FEFF: " \u0085" is whitespace, the others
     * are not (PCRE2's \s has U+180E, JavaScript's U+FEFF and not U+0085) */
    cJSON *j = fixture_json("bytelevel.json");
    set_json(j, "pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                                 "{\"Regex\": \"\\\\s+|\\\\S+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                                 "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}");
    /* merges that join characters across the places where a piece could end, so the ends show in the ids */
    set_json(get(j, "model"), "vocab", "{\"a\": 0, \"\\u0120\": 1, \"\\u00c2\": 2, \"\\u0142\": 3, \"\\u00e1\": 4, "
                                       "\"\\u0120\\u00c2\": 7, \"a\\u00e1\": 10, \"\\u00ef\": 11, \"a\\u00ef\": 12}");
    set_json(get(j, "model"), "merges", "[\"Ġ Â\", \"a á\", \"a ï\"]");
    mt_tokenizer *t = load_variant(j);
    /* U+0085 is C2 85: "Â" and byte 0x85's character, not in this vocabulary (dropped) */
    EXPECT_IDS(t, "a \xC2\x85", 0, 0, 7); /* "a", " \u0085" */
    /* U+180E is E1 A0 8E: "á", "ł" (0xA0's character) and 0x8E's (dropped); one
     * piece with the "a" ("a á" merged), where PCRE2's own \s would make it
     * a piece of its own: "a", "á", "ł" */
    EXPECT_IDS(t, "a\xE1\xA0\x8E", 0, 10, 3);
    /* U+FEFF (EF BB BF: "ï" and two dropped) is not whitespace either: "aï" */
    EXPECT_IDS(t, "a\xEF\xBB\xBF", 0, 12);
    mt_tokenizer_free(t);
}

Test(tokenizer, round_trips)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    static const char *const texts[] = {"the cat in the hat.", "that hat", "  a\n\nb  ", "caf\xC3\xA9", "123 'll",
                                        "<|im_start|>a<|im_end|>", "[MASK] <w> <tool>", ""};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        expect_round_trip(t, texts[i], 0, 0, texts[i]);
        /* except that [MASK] takes the space after it */
        const char *back = strcmp(texts[i], "[MASK] <w> <tool>") ? texts[i] : "[MASK]<w> <tool>";
        expect_round_trip(t, texts[i], MT_ENCODE_SPECIAL, 0, back);
    }
    /* the template's tokens come back, and go with MT_DECODE_SKIP_SPECIAL */
    expect_round_trip(t, "hat", MT_ENCODE_ADD_SPECIAL, 0, "<|im_start|>hat<|im_end|>");
    expect_round_trip(t, "hat", MT_ENCODE_ADD_SPECIAL, MT_DECODE_SKIP_SPECIAL, "hat");
    mt_tokenizer_free(t);
}

Test(tokenizer, decodes_bytes_and_skips_specials)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    EXPECT_DECODE(t, 0, "a cat", 2, 40);
    EXPECT_DECODE(t, 0, "a  cat", 2, 0, 40);
    EXPECT_DECODE(t, 0, "\xC3\xA9", 17, 18);
    /* bytes that are not UTF-8 become U+FFFD, one per maximal invalid run */
    EXPECT_DECODE(t, 0, "\xEF\xBF\xBD", 17);
    EXPECT_DECODE(t, 0, "\xEF\xBF\xBD" "a", 17, 2);
    EXPECT_DECODE(t, 0, "<|im_start|>a<tool><|im_end|>", 61, 2, 63, 62);
    EXPECT_DECODE(t, MT_DECODE_SKIP_SPECIAL, "a<tool>", 61, 2, 63, 62); /* <tool> is not special */
    EXPECT_DECODE(t, MT_DECODE_SKIP_SPECIAL, "", 60);
    size_t len = 7;
    cr_assert_eq(mt_tokenizer_decode(t, NULL, 0, 0, NULL, 0, &len), MT_OK);
    cr_assert_eq(len, 0);
    mt_tokenizer_free(t);
}

Test(tokenizer, decoder_null_joins_with_spaces)
{
    cJSON *j = fixture_json("bytelevel.json");
    set_json(j, "decoder", "null");
    mt_tokenizer *t = load_variant(j);
    EXPECT_DECODE(t, 0, "a \xC4\xA0 b", 2, 0, 27); /* the tokens as spelled ("Ġ"), as tokenizers does */
    mt_tokenizer_free(t);
}

/* ---- the vocabulary -------------------------------------------------------------------- */

Test(tokenizer, vocabulary_lookups)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    cr_assert_eq(mt_tokenizer_token_to_id(t, "\xC4\xA0the"), 37); /* "Ġthe" */
    cr_assert_eq(mt_tokenizer_token_to_id(t, "<|im_start|>"), 61);
    cr_assert_eq(mt_tokenizer_token_to_id(t, "<w>"), 66);
    cr_assert_eq(mt_tokenizer_token_to_id(t, "nope"), -1);
    cr_assert_eq(mt_tokenizer_token_to_id(t, NULL), -1);
    cr_assert_eq(mt_tokenizer_token_to_id(NULL, "a"), -1);
    cr_assert_str_eq(mt_tokenizer_id_to_token(t, 45), "\xC3\x83\xC2\xA9"); /* "Ã©" */
    cr_assert_str_eq(mt_tokenizer_id_to_token(t, 61), "<|im_start|>");
    cr_assert_null(mt_tokenizer_id_to_token(t, 53)); /* a gap: no token has that id */
    cr_assert_null(mt_tokenizer_id_to_token(t, 67));
    cr_assert_null(mt_tokenizer_id_to_token(t, -1));
    cr_assert_null(mt_tokenizer_id_to_token(NULL, 0));
    cr_assert_eq(mt_tokenizer_vocab_size(NULL), 0);
    mt_tokenizer_free(t);
}

/* ---- the calling conventions ------------------------------------------------------------- */

Test(tokenizer, buffer_size_protocol)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    const char *text = "the cat in the hat.";
    size_t n = 99;
    cr_assert_eq(mt_tokenizer_encode(t, text, strlen(text), 0, NULL, 0, &n), MT_OK);
    cr_assert_eq(n, 6);
    int32_t ids[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    cr_assert_eq(mt_tokenizer_encode(t, text, strlen(text), 0, ids, 4, &n), MT_OK, "too small is not an error");
    cr_assert_eq(n, 6, "*n_ids says how many the text needs");
    cr_assert(ids[0] == 36 && ids[3] == 37 && ids[4] == -7, "the first cap ids are written, nothing past them");
    cr_assert_eq(mt_tokenizer_encode(t, text, strlen(text), 0, ids, 6, &n), MT_OK);
    cr_assert(n == 6 && ids[5] == 13 && ids[6] == -7);

    const int32_t cat[] = {2, 40}; /* "a", "Ġcat" */
    char buf[8];
    size_t len = 0;
    memset(buf, 'x', sizeof buf);
    cr_assert_eq(mt_tokenizer_decode(t, cat, 2, 0, buf, 3, &len), MT_OK);
    cr_assert(len == 5 && !memcmp(buf, "a cxx", 5), "3 bytes written, no NUL, the length is the whole text's");
    memset(buf, 'x', sizeof buf);
    cr_assert_eq(mt_tokenizer_decode(t, cat, 2, 0, buf, 5, &len), MT_OK);
    cr_assert(len == 5 && !memcmp(buf, "a catx", 6), "exactly the text: no room for the NUL");
    cr_assert_eq(mt_tokenizer_decode(t, cat, 2, 0, buf, 6, &len), MT_OK);
    cr_assert_str_eq(buf, "a cat");
    mt_tokenizer_free(t);
}

Test(tokenizer, refuses_bad_arguments_and_invalid_utf8)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    int32_t ids[8];
    size_t n = 5;
    static const struct {
        const char *text;
        size_t len;
        const char *msg;
    } bad[] = {
        {"ab\xC3(", 4, "mt_tokenizer_encode: the text is not valid UTF-8 at byte 2 (0xC3)"},
        {"\xC0\xAF", 2, "mt_tokenizer_encode: the text is not valid UTF-8 at byte 0 (0xC0)"},         /* overlong */
        {"a\xED\xA0\x80", 4, "mt_tokenizer_encode: the text is not valid UTF-8 at byte 1 (0xED)"},   /* surrogate */
        {"ab\xF4\x90\x80\x80", 6, "mt_tokenizer_encode: the text is not valid UTF-8 at byte 2 (0xF4)"}, /* > U+10FFFF */
        {"abc\xE2\x82", 5, "mt_tokenizer_encode: the text is not valid UTF-8 at byte 3 (0xE2)"},    /* cut short */
        {"\x80", 1, "mt_tokenizer_encode: the text is not valid UTF-8 at byte 0 (0x80)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(mt_tokenizer_encode(t, bad[i].text, bad[i].len, 0, ids, 8, &n), MT_ERR_INVALID_ARGUMENT);
        cr_assert_str_eq(mt_last_errmsg(), bad[i].msg);
        cr_assert_eq(n, 0);
    }
    /* U+0000 is UTF-8 (its character is not in this vocabulary: dropped) */
    cr_assert_eq(mt_tokenizer_encode(t, "a\0b", 3, 0, ids, 8, &n), MT_OK);
    cr_assert(n == 2 && ids[0] == 2 && ids[1] == 27);

    cr_assert_eq(mt_tokenizer_encode(NULL, "a", 1, 0, ids, 8, &n), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_encode: tokenizer is NULL");
    cr_assert_eq(mt_tokenizer_encode(t, "a", 1, 0, ids, 8, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_encode: n_ids is NULL");
    cr_assert_eq(mt_tokenizer_encode(t, NULL, 1, 0, ids, 8, &n), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_encode: text is NULL");
    cr_assert_eq(mt_tokenizer_encode(t, NULL, 0, 0, NULL, 0, &n), MT_OK, "no text at all is the empty text");
    cr_assert_eq(mt_tokenizer_encode(t, "a", 1, 0, NULL, 8, &n), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_encode: ids is NULL but cap is 8");
    cr_assert_eq(mt_tokenizer_encode(t, "a", 1, 4, ids, 8, &n), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_encode: flags 0x4 hold bits that are not mt_encode_flag values");

    char text[16];
    size_t len = 3;
    const int32_t out_of_range[] = {2, 67};
    cr_assert_eq(mt_tokenizer_decode(t, out_of_range, 2, 0, text, 16, &len), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: ids[1] = 67 is not in the vocabulary (ids 0 to 66)");
    cr_assert_eq(len, 0);
    const int32_t negative[] = {-1};
    cr_assert_eq(mt_tokenizer_decode(t, negative, 1, 0, text, 16, &len), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: ids[0] = -1 is not in the vocabulary (ids 0 to 66)");
    const int32_t gap[] = {53};
    cr_assert_eq(mt_tokenizer_decode(t, gap, 1, 0, text, 16, &len), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: ids[0] = 53 is not in the vocabulary "
                                       "(ids 0 to 66, but this one has no token)");
    cr_assert_eq(mt_tokenizer_decode(t, gap, 1, 2, text, 16, &len), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: flags 0x2 hold bits that are not mt_decode_flag values");
    cr_assert_eq(mt_tokenizer_decode(t, gap, 1, 0, text, 16, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: len is NULL");
    cr_assert_eq(mt_tokenizer_decode(t, NULL, 1, 0, text, 16, &len), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: ids is NULL");
    cr_assert_eq(mt_tokenizer_decode(t, gap, 0, 0, NULL, 4, &len), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: text is NULL but cap is 4");
    cr_assert_eq(mt_tokenizer_decode(NULL, gap, 1, 0, text, 16, &len), MT_ERR_INVALID_ARGUMENT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_decode: tokenizer is NULL");
    mt_tokenizer_free(t);
}

/* ---- SentencePiece-style BPE ----------------------------------------------------------------- */

Test(tokenizer, sentencepiece_words_and_template)
{
    mt_tokenizer *t = load_ok(FIXTURES "sentencepiece.json");
    /* "▁hello▁world": "▁ h", "e l", "▁h el", "l o", "▁hel lo";
     * "▁ w", "o r", "▁w or", "l d", "▁wor ld" */
    EXPECT_IDS(t, "hello world", 0, 20, 25);
    EXPECT_IDS(t, "hello world", MT_ENCODE_ADD_SPECIAL, 1, 20, 25);
    EXPECT_NO_IDS(t, "", 0);
    EXPECT_IDS(t, "", MT_ENCODE_ADD_SPECIAL, 1);
    /* "▁hello▁▁world": "▁", then "▁world" ("▁ w" ranks before "▁ ▁") */
    EXPECT_IDS(t, "hello  world", 0, 20, 8, 25);
    /* the normalizer runs on each piece between special tokens: "hello" gets its "▁" */
    EXPECT_IDS(t, "<s>hello", MT_ENCODE_SPECIAL, 1, 20);
    EXPECT_IDS(t, "hello</s>", MT_ENCODE_SPECIAL, 20, 2);
    mt_tokenizer_free(t);
}

Test(tokenizer, byte_fallback_and_unknown)
{
    mt_tokenizer *t = load_ok(FIXTURES "sentencepiece.json");
    /* "€" (E2 82 AC) is not a token: its bytes are */
    EXPECT_IDS(t, "hello \xE2\x82\xAC", 0, 20, 8, 5, 6, 7);
    EXPECT_IDS(t, "hello\n", 0, 20, 3);
    /* an emoji's first byte F0 has no <0xF0>: <unk>, and fuse_unk makes one of two */
    EXPECT_IDS(t, "\xF0\x9F\x98\x80\xF0\x9F\x98\x80", 0, 8, 0);
    EXPECT_IDS(t, "\xF0\x9F\x98\x80h\xF0\x9F\x98\x80", 0, 8, 0, 9, 0);
    /* as tokenizers: a waiting <unk> goes after the bytes of a fallback that follows it */
    EXPECT_IDS(t, "\xF0\x9F\x98\x80\xE2\x82\xAC", 0, 8, 5, 6, 7, 0);
    /* special tokens as text: "<", "s", ">" are unknown, fused: "▁", <unk>, then "hello" without "▁" */
    EXPECT_IDS(t, "<s>hello", 0, 8, 0, 9, 17, 19);
    mt_tokenizer_free(t);

    /* an unk_token that is not in the vocabulary fails the encode that needs it */
    cJSON *j = fixture_json("sentencepiece.json");
    set_json(get(j, "model"), "unk_token", "\"<nope>\"");
    t = load_variant(j);
    EXPECT_IDS(t, "hello", 0, 20);
    size_t n = 0;
    cr_assert_eq(mt_tokenizer_encode(t, "\xF0\x9F\x98\x80", 4, 0, NULL, 0, &n), MT_ERR_FORMAT);
    cr_assert_str_eq(mt_last_errmsg(), "mt_tokenizer_encode: the text needs the unknown token \"<nope>\", "
                                       "which is not in the vocabulary");
    mt_tokenizer_free(t);
}

Test(tokenizer, sentencepiece_decoders)
{
    mt_tokenizer *t = load_ok(FIXTURES "sentencepiece.json");
    EXPECT_DECODE(t, 0, "<s> hello world", 1, 20, 25);
    EXPECT_DECODE(t, MT_DECODE_SKIP_SPECIAL, "hello world", 1, 20, 25);
    EXPECT_DECODE(t, 0, "hello \xE2\x82\xAC", 20, 8, 5, 6, 7);
    /* a run of byte tokens that is not UTF-8: one U+FFFD per byte, as tokenizers' ByteFallback */
    EXPECT_DECODE(t, 0, "\xEF\xBF\xBD\xEF\xBF\xBD", 8, 5, 6);
    EXPECT_DECODE(t, 0, "\xEF\xBF\xBD hello", 5, 20);
    expect_round_trip(t, "hello world", 0, 0, "hello world");
    expect_round_trip(t, "  hello\tworld \xE2\x82\xAC\n", 0, 0, "  hello\tworld \xE2\x82\xAC\n");
    expect_round_trip(t, "hello", MT_ENCODE_ADD_SPECIAL, MT_DECODE_SKIP_SPECIAL, "hello");
    mt_tokenizer_free(t);
}

/* Without a pre-tokenizer, BPE runs over whole texts; cutting them before
 * each "▁" (which is faster) must give the same ids, and is only done when
 * no merge can join a character to a following "▁". */
Test(tokenizer, sentencepiece_merges_across_words)
{
    cJSON *j = fixture_json("sentencepiece.json");
    cJSON_AddItemToObject(get(get(j, "model"), "vocab"), "o\xE2\x96\x81", cJSON_CreateNumber(27));
    cJSON_InsertItemInArray(get(get(j, "model"), "merges"), 0, cJSON_CreateString("o \xE2\x96\x81"));
    mt_tokenizer *t = load_variant(j);
    /* "o ▁" first: "▁hel", "l", "o▁", "w", "or", "ld" */
    EXPECT_IDS(t, "hello world", 0, 18, 11, 27, 13, 22, 24);
    mt_tokenizer_free(t);
}

/* ---- Metaspace ------------------------------------------------------------------------------ */

Test(tokenizer, metaspace_pre_tokenizer)
{
    mt_tokenizer *t = load_ok(FIXTURES "metaspace.json");
    EXPECT_IDS(t, "hi there", 0, 9, 17);
    EXPECT_IDS(t, "hi  there", 0, 9, 2, 17); /* each "▁" starts a piece: "▁hi", "▁", "▁there" */
    /* prepend_scheme first: only the piece at the start of the text gets "▁" */
    EXPECT_IDS(t, "<s>hi", MT_ENCODE_SPECIAL, 1, 15);
    EXPECT_IDS(t, "<s>hi", 0, 2, 0, 0, 0, 15); /* "▁<s>hi": "<", "s", ">" unknown, not fused */
    EXPECT_DECODE(t, 0, "hi there", 9, 17);
    EXPECT_DECODE(t, 0, " hi", 2, 9); /* the first token's "▁" goes, as in tokenizers */
    mt_tokenizer_free(t);

    cJSON *j = fixture_json("metaspace.json");
    set_json(get(j, "pre_tokenizer"), "prepend_scheme", "\"always\"");
    t = load_variant(j);
    EXPECT_IDS(t, "<s>hi", MT_ENCODE_SPECIAL, 1, 9);
    mt_tokenizer_free(t);

    j = fixture_json("metaspace.json");
    set_json(get(j, "pre_tokenizer"), "prepend_scheme", "\"never\"");
    set_json(get(j, "decoder"), "prepend_scheme", "\"never\"");
    t = load_variant(j);
    EXPECT_IDS(t, "hi", 0, 15);
    EXPECT_DECODE(t, 0, " hi there", 9, 17);
    mt_tokenizer_free(t);

    /* the older spelling: add_prefix_space false is never */
    j = fixture_json("metaspace.json");
    cJSON_DeleteItemFromObject(get(j, "pre_tokenizer"), "prepend_scheme");
    set_json(get(j, "pre_tokenizer"), "add_prefix_space", "false");
    t = load_variant(j);
    EXPECT_IDS(t, "hi", 0, 15);
    mt_tokenizer_free(t);

    /* split false: one piece */
    j = fixture_json("metaspace.json");
    set_json(get(j, "pre_tokenizer"), "split", "false");
    t = load_variant(j);
    EXPECT_IDS(t, "hi there", 0, 9, 17); /* BPE of "▁hi▁there" as a whole: the same here */
    mt_tokenizer_free(t);
}

/* ---- Split: behaviors, invert, empty matches ------------------------------------------------- */

/* split.json with the Split's pattern, behavior and invert set. */
static mt_tokenizer *load_split(const char *pattern, const char *behavior, int invert)
{
    cJSON *j = fixture_json("split.json");
    cJSON *pre = get(j, "pre_tokenizer");
    set_json(pre, "pattern", pattern);
    cJSON_ReplaceItemInObjectCaseSensitive(pre, "behavior", cJSON_CreateString(behavior));
    set_json(pre, "invert", invert ? "true" : "false");
    return load_variant(j);
}

/* tokenizers' NormalizedString::split on "a-b--c", split on "-". Its
 * segments are "a" "-" "b" "-" "-" "c" (matches: each "-"). Every piece of
 * more than one character here is one merge of split.json, so the ids show
 * the pieces: a 0, b 1, c 2, - 3, a- 4, b- 5, -b 6, -c 7, -- 8. */
Test(tokenizer, split_behaviors)
{
    static const struct {
        const char *behavior;
        int invert;
        int32_t want[6];
        size_t n;
    } cases[] = {
        /* the matches go */
        {"Removed", 0, {0, 1, 2}, 3},
        /* every segment a piece */
        {"Isolated", 0, {0, 3, 1, 3, 3, 2}, 6},
        /* a match joins the piece before it, unless that piece ends in a
         * match: "a-", "b-", "-", "c" */
        {"MergedWithPrevious", 0, {4, 5, 3, 2}, 4},
        /* tokenizers folds from the right: a match joins the piece after it
         * unless that one starts with a match: "a", "-b", "-", "-c" */
        {"MergedWithNext", 0, {0, 6, 3, 7}, 4},
        /* runs of matches are one piece: "a", "-", "b", "--", "c" */
        {"Contiguous", 0, {0, 3, 1, 8, 2}, 5},
        /* invert: "a", "b" and "c" are the matches, each "-" a segment between */
        {"Removed", 1, {3, 3, 3}, 3},
        {"Isolated", 1, {0, 3, 1, 3, 3, 2}, 6},
        /* "a"; "-" then "b" joins it; "-"; "-" then "c" joins it */
        {"MergedWithPrevious", 1, {0, 6, 3, 7}, 4},
        /* "a" takes the "-" after it, "b" too; the second "-" stays alone */
        {"MergedWithNext", 1, {4, 5, 3, 2}, 4},
        /* the two "-" segments in a row are one piece, as two matches would be */
        {"Contiguous", 1, {0, 3, 1, 8, 2}, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mt_tokenizer *t = load_split("{\"String\": \"-\"}", cases[i].behavior, cases[i].invert);
        int32_t got[8];
        size_t n = 0;
        cr_assert_eq(mt_tokenizer_encode(t, "a-b--c", 6, 0, got, 8, &n), MT_OK, "%s", mt_last_errmsg());
        int same = n == cases[i].n && !memcmp(got, cases[i].want, n * sizeof *got);
        if (!same) print_ids("got ", got, n);
        cr_assert(same, "%s%s: other ids", cases[i].behavior, cases[i].invert ? ", invert" : "");
        mt_tokenizer_free(t);
    }

    /* a Regex pattern the same way; the pieces of the text's start and end */
    mt_tokenizer *t = load_split("{\"Regex\": \"-+\"}", "MergedWithPrevious", 0);
    EXPECT_IDS(t, "-a-", 0, 3, 4);       /* "-" (no piece before it), "a-" */
    EXPECT_IDS(t, "a--b", 0, 4, 3, 1);   /* "a--" one piece: "a -" ranks before "- -", so "a-", "-"; then "b" */
    mt_tokenizer_free(t);
    t = load_split("{\"Regex\": \"-+\"}", "MergedWithNext", 0);
    EXPECT_IDS(t, "-a-", 0, 3, 0, 3);    /* "-a" is not a token: "-", "a"; then "-" (no piece after it) */
    EXPECT_IDS(t, "b-c", 0, 1, 7);
    mt_tokenizer_free(t);
}

/* Empty matches, as tokenizers gets them from its Oniguruma binding: a
 * search after an empty match starts one character on, and an empty match
 * where the last match taken ended is passed over. */
Test(tokenizer, split_empty_matches)
{
    /* "-*" on "a-b": empty at 0, "-" at 1, the empty match at 2 (where "-"
     * ended) passed over, empty at 3. Segments: (empty match) "a" "-" "b"
     * (empty match). MergedWithNext: "-" takes "b" after it (an empty match
     * at 2 would have come between them): "a", "-b" */
    mt_tokenizer *t = load_split("{\"Regex\": \"-*\"}", "MergedWithNext", 0);
    EXPECT_IDS(t, "a-b", 0, 0, 6);
    mt_tokenizer_free(t);
    /* "-|(?=c)" on "a-bc": "-" at 1, then the empty match before "c" at 3,
     * which is taken (the last match ended at 2): "-" takes "b", the empty
     * match takes "c": "a", "-b", "c" */
    t = load_split("{\"Regex\": \"-|(?=c)\"}", "MergedWithNext", 0);
    EXPECT_IDS(t, "a-bc", 0, 0, 6, 2);
    mt_tokenizer_free(t);
    /* Isolated drops empty pieces: the same pieces as "-" alone */
    t = load_split("{\"Regex\": \"-*\"}", "Isolated", 0);
    EXPECT_IDS(t, "a-b--c", 0, 0, 3, 1, 8, 2);
    mt_tokenizer_free(t);
}

/* ---- Gemma 3's shape ------------------------------------------------------------------------- */

Test(tokenizer, gemma_words_bytes_and_added_tokens)
{
    mt_tokenizer *t = load_ok(FIXTURES "gemma.json");
    /* spaces become "▁", with none in front ("Replace" without "Prepend");
     * the Split on " " then finds no space, so the whole text goes to BPE:
     * "hello" ("h e", "l l", "he ll", "hell o") and "▁world" */
    EXPECT_IDS(t, "hello world", 0, 27, 32);
    EXPECT_IDS(t, " hello", 0, 11, 27);
    EXPECT_IDS(t, "hello world", MT_ENCODE_ADD_SPECIAL, 2, 27, 32);
    EXPECT_IDS(t, "", MT_ENCODE_ADD_SPECIAL, 2);
    /* byte fallback; "ö" (C3 B6) has no byte tokens: <unk>, one for a run */
    EXPECT_IDS(t, "hello \xE2\x82\xAC", 0, 27, 11, 8, 9, 10);
    EXPECT_IDS(t, "\xC3\xB6\xC3\xB6h", 0, 3, 12);
    /* newline runs are added tokens, the longest first */
    EXPECT_IDS(t, "hello\n\n\nworld", 0, 27, 6, 5, 16, 29, 31);
    /* "▁▁" is an added token matched in the raw text only: typed, it is
     * one; two spaces are normalized to "▁▁" after added tokens are
     * found, so BPE gets them ("▁", then "▁world") */
    EXPECT_IDS(t, "hello\xE2\x96\x81\xE2\x96\x81world", 0, 27, 7, 16, 29, 31);
    EXPECT_IDS(t, "hello  world", 0, 27, 11, 32);
    /* special tokens only with the flag; as text, "<", "b", "o", "s", ">"
     * ("b" and "s" are unknown) */
    EXPECT_IDS(t, "<bos>hello", MT_ENCODE_SPECIAL, 2, 27);
    EXPECT_IDS(t, "<start_of_turn>hello\n", MT_ENCODE_SPECIAL, 4, 27, 5);
    EXPECT_IDS(t, "<bos>hello", 0, 22, 3, 15, 3, 21, 27);
    mt_tokenizer_free(t);
}

/* With no pre-tokenizer that cuts, BPE runs over the text between added
 * tokens, which is cut before each "▁" that follows another character
 * unless a merged token holds that character before a "▁": here ">▁</", so
 * the text is not cut after ">". */
Test(tokenizer, gemma_merges_across_a_space)
{
    mt_tokenizer *t = load_ok(FIXTURES "gemma.json");
    /* "x>▁</y": "▁ <", "▁< /", then "> ▁</" joins across the space (cut
     * there, it would be "x", ">", "▁</", "y") */
    EXPECT_IDS(t, "x> </y", 0, 19, 35, 20);
    EXPECT_IDS(t, "x </y", 0, 19, 34, 20); /* "x" is not glued: cut, the same ids */
    EXPECT_IDS(t, "hello world x> </y", 0, 27, 32, 11, 19, 35, 20);
    mt_tokenizer_free(t);

    /* the same file without the glued merge: cut everywhere, the same ids as BPE of the whole */
    cJSON *j = fixture_json("gemma.json");
    cJSON_DeleteItemFromArray(get(get(j, "model"), "merges"), 11);
    t = load_variant(j);
    EXPECT_IDS(t, "x> </y", 0, 19, 21, 34, 20);
    mt_tokenizer_free(t);
}

Test(tokenizer, gemma_decoders_and_round_trips)
{
    mt_tokenizer *t = load_ok(FIXTURES "gemma.json");
    EXPECT_DECODE(t, 0, "<bos>hello world", 2, 27, 32);
    EXPECT_DECODE(t, MT_DECODE_SKIP_SPECIAL, "hello world", 2, 27, 32);
    EXPECT_DECODE(t, 0, " hello \xE2\x82\xAC", 11, 27, 11, 8, 9, 10); /* no Strip: the first space stays */
    EXPECT_DECODE(t, 0, "hello  world", 27, 7, 16, 29, 31);          /* the added "▁▁" decodes as spaces too */
    static const char *const texts[] = {"hello world", "  hello  world \n\n\n", "x> </y \xE2\x82\xAC", ""};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        expect_round_trip(t, texts[i], 0, 0, texts[i]);
        expect_round_trip(t, texts[i], MT_ENCODE_ADD_SPECIAL, MT_DECODE_SKIP_SPECIAL, texts[i]);
    }
    expect_round_trip(t, "<bos>hello", MT_ENCODE_SPECIAL, 0, "<bos>hello");
    mt_tokenizer_free(t);
}

/* Gemma 3's Split (" ", MergedWithPrevious) where there are spaces to find:
 * without the normalizer, "hello " is a piece, and " " is unknown. */
Test(tokenizer, gemma_split_without_normalizer)
{
    cJSON *j = fixture_json("gemma.json");
    set_json(j, "normalizer", "null");
    mt_tokenizer *t = load_variant(j);
    EXPECT_IDS(t, "hello world", 0, 27, 3, 16, 29, 31); /* "hello ", "world": no "▁world" */
    mt_tokenizer_free(t);
}

/* ---- DeepSeek-V3's shape: Splits in a row, an empty normalizer ----------------------------------- */

Test(tokenizer, splits_in_a_row)
{
    cJSON *j = fixture_json("bytelevel.json");
    set_json(j, "normalizer", "{\"type\": \"Sequence\", \"normalizers\": []}");
    /* numbers in threes first, then runs of digits: each Split on the pieces of the one before */
    set_json(j, "pre_tokenizer",
             "{\"type\": \"Sequence\", \"pretokenizers\": ["
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Isolated\", "
             "\"invert\": false},"
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}+| ?\\\\p{L}+|\\\\s+\"}, "
             "\"behavior\": \"Isolated\", \"invert\": false},"
             "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}]}");
    cJSON *vocab = get(get(j, "model"), "vocab");
    cJSON_AddItemToObject(vocab, "12", cJSON_CreateNumber(53));
    cJSON_AddItemToObject(vocab, "123", cJSON_CreateNumber(54));
    cJSON_AddItemToArray(get(get(j, "model"), "merges"), cJSON_CreateString("1 2"));
    cJSON_AddItemToArray(get(get(j, "model"), "merges"), cJSON_CreateString("12 3"));
    mt_tokenizer *t = load_variant(j);
    /* "3123": "312" and "3", so "3", "12", "3" (whole, BPE would make "3", "123") */
    EXPECT_IDS(t, "3123", 0, 16, 53, 16);
    EXPECT_IDS(t, "123 the", 0, 54, 37);
    /* <w> is normalized: looked for after the (empty) normalizer, as tokenizers does */
    EXPECT_IDS(t, "<w>", 0, 66);
    expect_round_trip(t, "3123 the cat", 0, 0, "3123 the cat");
    mt_tokenizer_free(t);
}

/* ignore_merges looks the whole pre-token up: a text without a
 * pre-tokenizer is not cut into words first */
Test(tokenizer, ignore_merges_without_a_pre_tokenizer)
{
    cJSON *j = fixture_json("sentencepiece.json");
    cJSON_AddItemToObject(get(get(j, "model"), "vocab"), "\xE2\x96\x81hello\xE2\x96\x81world", cJSON_CreateNumber(27));
    set_json(get(j, "model"), "ignore_merges", "true");
    mt_tokenizer *t = load_variant(j);
    EXPECT_IDS(t, "hello world", 0, 27);
    EXPECT_IDS(t, "hello  world", 0, 20, 8, 25); /* "▁hello▁▁world" is not a token: BPE */
    mt_tokenizer_free(t);
}

/* ---- long texts and threads ---------------------------------------------------------------- */

Test(tokenizer, long_runs)
{
    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    const size_t n = 200000;
    char *text = malloc(n);
    int32_t *ids = malloc(n * sizeof *ids);
    size_t got = 0;
    memset(text, ' ', n); /* one piece of spaces: "Ġ Ġ" pairs them */
    cr_assert_eq(mt_tokenizer_encode(t, text, n, 0, ids, n, &got), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(got, n / 2);
    cr_assert(ids[0] == 49 && ids[n / 2 - 1] == 49);
    memset(text, 'e', n); /* one word: "e e" pairs them, left first */
    cr_assert_eq(mt_tokenizer_encode(t, text, n, 0, ids, n, &got), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(got, n / 2);
    for (size_t i = 0; i < n / 2; i++) cr_assert_eq(ids[i], 46);
    free(text);
    free(ids);
    mt_tokenizer_free(t);
}

typedef struct {
    const mt_tokenizer *t;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n_want;
    int ok;
} thread_job;

static void *encode_job(void *arg)
{
    thread_job *j = arg;
    int32_t *ids = malloc(j->n_want * sizeof *ids + 1);
    j->ok = 1;
    for (int r = 0; r < 3; r++) {
        size_t n = 0;
        if (mt_tokenizer_encode(j->t, j->text, j->len, 0, ids, j->n_want, &n) != MT_OK || n != j->n_want ||
            memcmp(ids, j->want, n * sizeof *ids) != 0)
            j->ok = 0;
    }
    free(ids);
    return NULL;
}

/* Threads encoding at once share the tokenizer's cache of words: many
 * distinct words make them write the same slots while others read. Each
 * thread must get the ids of a tokenizer that no other thread touched. */
Test(tokenizer, threads_share_one_tokenizer)
{
    static const char letters[] = "acefhinstlowbdmr";
    const size_t n_words = 30000;
    char *text = malloc(n_words * 14);
    size_t len = 0;
    uint64_t x = 88172645463325252ull;
    for (size_t w = 0; w < n_words; w++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t wl = 1 + x % 12;
        text[len++] = ' ';
        for (size_t k = 0; k < wl; k++) text[len++] = letters[(x >> (4 * k + 8)) & 15];
    }
    mt_tokenizer *fresh = load_ok(FIXTURES "bytelevel.json");
    size_t n = 0;
    cr_assert_eq(mt_tokenizer_encode(fresh, text, len, 0, NULL, 0, &n), MT_OK);
    int32_t *want = malloc(n * sizeof *want);
    cr_assert_eq(mt_tokenizer_encode(fresh, text, len, 0, want, n, &n), MT_OK);
    mt_tokenizer_free(fresh);

    mt_tokenizer *t = load_ok(FIXTURES "bytelevel.json");
    pthread_t th[4];
    thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, text, len, want, n, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert(jobs[i].ok, "thread %d got different ids", i);
    }
    mt_tokenizer_free(t);
    free(want);
    free(text);
}

/* (?i:...) folds case over Unicode, as Oniguruma does: "'ſ" (long s) is
 * one piece with "(?i:'s)" (transformers.js's ASCII rewrite makes it two) */
Test(tokenizer, regex_case_folding_is_unicode)
{
    cJSON *j = fixture_json("bytelevel.json");
    set_json(j, "pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                                 "{\"Regex\": \"(?i:'s)|\\\\S\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                                 "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}");
    /* "ſ" is C5 BF: the characters "Å" and "¿" */
    set_json(get(j, "model"), "vocab",
             "{\"'\": 0, \"\\u00c5\": 1, \"\\u00bf\": 2, \"'\\u00c5\": 3, \"'\\u00c5\\u00bf\": 4}");
    set_json(get(j, "model"), "merges", "[\"' \\u00c5\", \"'\\u00c5 \\u00bf\"]");
    mt_tokenizer *t = load_variant(j);
    EXPECT_IDS(t, "'\xC5\xBF", 0, 4);     /* one piece: "'", "Å", "¿" all merge */
    EXPECT_IDS(t, "x'\xC5\xBF", 0, 4);    /* "x" is dropped (not in the vocabulary) */
    mt_tokenizer_free(t);
}

/* A vocabulary without merges: every character is its own token. */
Test(tokenizer, no_merges)
{
    cJSON *j = fixture_json("metaspace.json");
    cJSON_DeleteItemFromObject(get(j, "model"), "merges");
    mt_tokenizer *t = load_variant(j);
    EXPECT_IDS(t, "hi", 0, 2, 3, 4);
    mt_tokenizer_free(t);
}
