/* A safetensors file as the model loader reads it: the header is validated
 * (mt_st_add_file), names indexed (mt_st_index) and, when both pass, every
 * tensor converted to fp32 and bf16 (mt_st_read), which reads every byte
 * its data_offsets claim. */
#include "fuzz.h"
#include "io/safetensors.h"
#include "core/threadpool.h"

static mt_pool *pool;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    pool = mt_pool_create(1, NULL);
    return pool ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch();
    fuzz_write(dir, "x.safetensors", data, size);
    char msg[MT_ERRMSG_MAX] = "";
    mt_err err = {msg};
    mt_st_set s = {0};
    mt_status st = mt_st_add_file(err, &s, dir, "x.safetensors");
    if (!st) st = mt_st_index(err, &s);
    fuzz_expect_message(st, msg, "mt_st_add_file/mt_st_index");
    if (!st) {
        for (size_t i = 0; i < s.n; i++) {
            const mt_st_tensor *t = &s.t[i];
            if (t->numel > (1u << 20)) continue; /* the data is in the file: the input's size bounds it */
            float *f = malloc((t->numel ? t->numel : 1) * sizeof *f);
            uint16_t *b = malloc((t->numel ? t->numel : 1) * sizeof *b);
            if (!f || !b) abort();
            mt_st_read_req r = {t, f, b};
            if (mt_st_read(err, pool, &r, 1)) fuzz_expect_message(MT_ERR_FORMAT, msg, "mt_st_read");
            free(f);
            free(b);
            if (mt_st_find(&s, t->name) != t) {
                fprintf(stderr, "mt_st_find does not find %s after mt_st_index\n", t->name);
                abort();
            }
        }
    }
    mt_st_free(&s);
    return 0;
}
