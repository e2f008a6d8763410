/* Writes the seed inputs of the fuzz targets into DIR/<target>/ (what
 * tests/fuzz/corpus holds): the tiny model's own files (fuzz_model.h), the
 * configs of the parity fixtures, token files of each format, and the small
 * tokenizer.json files of tests/fixtures/tokenizers with a text.
 *   build/fuzz/seeds DIR [FIXTURE_CONFIG.json ...] */
#include "fuzz_model.h"

#include <errno.h>

static void put(const char *dir, const char *target, const char *name, const void *p, size_t n)
{
    char sub[512];
    snprintf(sub, sizeof sub, "%s/%s", dir, target);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST) {
        perror(sub);
        exit(1);
    }
    fuzz_write(sub, name, p, n);
}

static void put_tokens(const char *dir, const char *name, const uint8_t opts[4], const void *p, size_t n)
{
    uint8_t *b = malloc(n + 4);
    if (!b) abort();
    memcpy(b, opts, 4);
    memcpy(b + 4, p, n);
    put(dir, "tokens", name, b, n + 4);
    free(b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [FIXTURE_CONFIG.json ...]\n", argv[0]);
        return 2;
    }
    const char *out = argv[1];
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        perror(out);
        return 1;
    }
    const char *tmp = fuzz_scratch();
    size_t n, n2;
    for (int prec = 0; prec < 2; prec++) {
        mt_model *m = fuzz_model_create(prec ? MT_PRECISION_FP32 : MT_PRECISION_BF16);
        const char *tag = prec ? "fp32" : "bf16";
        char dir[300], name[64];
        snprintf(dir, sizeof dir, "%s/%s", tmp, tag);
        if (mt_model_save(m, dir) != MT_OK) {
            fprintf(stderr, "seeds: %s\n", mt_model_errmsg(m));
            return 1;
        }
        unsigned char *st = fuzz_read(dir, "model.safetensors", &n);
        snprintf(name, sizeof name, "tiny_%s.safetensors", tag);
        put(out, "safetensors", name, st, n);
        if (!prec) put(out, "model_load", name, st, n); /* fuzz_model_load's model is bf16 */
        free(st);
        unsigned char *cfg = fuzz_read(dir, "config.json", &n);
        snprintf(name, sizeof name, "tiny_%s.json", tag);
        put(out, "config", name, cfg, n);
        free(cfg);
        if (prec) { /* fuzz_checkpoint's model is fp32 */
            mt_checkpoint_info info;
            mt_checkpoint_info_init(&info);
            info.data_position = 12345;
            info.rng_state[0] = 0xfedcba9876543210ull;
            snprintf(dir, sizeof dir, "%s/ck", tmp);
            if (mt_checkpoint_save(m, dir, &info) != MT_OK) {
                fprintf(stderr, "seeds: %s\n", mt_model_errmsg(m));
                return 1;
            }
            snprintf(dir, sizeof dir, "%s/ck/step-00000000", tmp);
            unsigned char *state = fuzz_read(dir, "trainer_state.json", &n);
            unsigned char *opt = fuzz_read(dir, "optimizer.safetensors", &n2);
            put(out, "checkpoint", "state", state, n);
            unsigned char *both = malloc(n + 4 + n2);
            if (!both) abort();
            memcpy(both, state, n);
            memcpy(both + n, "\n--\n", 4);
            memcpy(both + n + 4, opt, n2);
            put(out, "checkpoint", "state_and_optimizer", both, n + 4 + n2);
            free(both);
            free(state);
            free(opt);
        }
        mt_model_destroy(m);
    }
    for (int i = 2; i < argc; i++) { /* named after their path: tests_fixtures_NAME_model_config.json */
        char name[256];
        snprintf(name, sizeof name, "%s", argv[i]);
        for (char *c = name; *c; c++)
            if (*c == '/') *c = '_';
        unsigned char *cfg = fuzz_read(argv[i][0] == '/' ? "" : ".", argv[i], &n);
        put(out, "config", name, cfg, n);
        free(cfg);
    }
    /* token files: options (format, seq_len - 1, vocab / 256 if >= 128, held-out tenths), then the file */
    uint16_t u16[200];
    uint32_t u32[200];
    for (int i = 0; i < 200; i++) u16[i] = (uint16_t)(i * 7 % 251), u32[i] = (uint32_t)(i * 7 % 251);
    put_tokens(out, "raw_u16", (const uint8_t[4]){1, 7, 0, 1}, u16, sizeof u16);
    put_tokens(out, "raw_u32", (const uint8_t[4]){2, 15, 0, 2}, u32, sizeof u32);
    put_tokens(out, "auto_u16_vocab", (const uint8_t[4]){0, 3, 255, 0}, u16, sizeof u16);
    for (int version = 1; version <= 2; version++) {
        uint8_t file[1024 + sizeof u32];
        int32_t hdr[256] = {20240520, version, 200};
        memcpy(file, hdr, sizeof hdr);
        const size_t body = version == 1 ? sizeof u16 : sizeof u32;
        memcpy(file + 1024, version == 1 ? (const void *)u16 : (const void *)u32, body);
        put_tokens(out, version == 1 ? "llmc_v1" : "llmc_v2", (const uint8_t[4]){3, 9, 0, 1}, file, 1024 + body);
    }
    /* tokenizers: each small tokenizer.json that loads, then a text that reaches their added tokens,
     * byte fallback and unknown characters */
    static const char *const tokenizers[] = {"bytelevel", "sentencepiece", "metaspace", "gemma", "split"};
    static const char text[] = "the cat <|im_start|>in [MASK] the <w> hat\xc3\xa9 123\n\thello  world \xe2\x82\xac "
                               "\xf0\x9f\x98\x80<s>hi there</s>";
    for (size_t i = 0; i < sizeof tokenizers / sizeof *tokenizers; i++) {
        char name[128];
        snprintf(name, sizeof name, "tests/fixtures/tokenizers/%s.json", tokenizers[i]);
        unsigned char *json = fuzz_read(".", name, &n);
        unsigned char *both = malloc(n + 4 + sizeof text - 1);
        if (!both) abort();
        memcpy(both, json, n);
        memcpy(both + n, "\n--\n", 4);
        memcpy(both + n + 4, text, sizeof text - 1);
        put(out, "tokenizer", tokenizers[i], both, n + 4 + sizeof text - 1);
        free(both);
        free(json);
    }
    printf("seeds: written under %s\n", out);
    return 0;
}
