/* A token file as mt_dataset_open maps and validates it, in each format,
 * then every window read from both splits. The input's first 4 bytes choose
 * the options (format, seq_len, vocab_size, held-out share); the rest is the
 * file. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    mt_dataset_options o;
    mt_dataset_options_init(&o);
    o.format = data[0] % 4;
    o.seq_len = 1 + data[1] % 64;
    o.vocab_size = data[2] < 128 ? 0 : (uint32_t)data[2] << 8;
    o.heldout_fraction = (float)(data[3] % 6) * 0.1f;
    const char *dir = fuzz_scratch();
    fuzz_write(dir, "tokens.bin", data + 4, size - 4);
    char path[256];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    mt_dataset *ds;
    mt_status st = mt_dataset_open(&ds, path, &o);
    fuzz_expect_message(st, mt_last_errmsg(), "mt_dataset_open");
    if (st) {
        if (ds) abort(); /* the contract: *out is NULL on failure */
        return 0;
    }
    int32_t tok[64 * 2], tgt[64 * 2];
    for (int split = 0; split < 2; split++) {
        const uint64_t n = mt_dataset_num_windows(ds, (mt_split)split);
        for (uint64_t w = 0; w < n + 2 && w < 512; w += 2) {
            st = mt_dataset_read(ds, (mt_split)split, w, 2, tok, tgt);
            fuzz_expect_message(st, mt_last_errmsg(), "mt_dataset_read");
            for (uint32_t i = 0; !st && i < 2 * o.seq_len; i++)
                if (tok[i] < 0 || tgt[i] < 0 || (o.vocab_size && (tok[i] >= (int32_t)o.vocab_size ||
                                                                  tgt[i] >= (int32_t)o.vocab_size))) {
                    fprintf(stderr, "mt_dataset_read gave token %d / target %d past vocab %u\n", tok[i], tgt[i],
                            o.vocab_size);
                    abort();
                }
        }
    }
    mt_dataset_close(ds);
    return 0;
}
