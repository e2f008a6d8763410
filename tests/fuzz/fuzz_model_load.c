/* model.safetensors of a Hugging Face folder as mt_model_load reads it into
 * a model: the input is the file; a load that fails must leave every byte of
 * the model's tiles as it was. Seeds: the model's own save (make fuzz-seeds
 * writes it into the corpus). */
#include "fuzz_model.h"

static mt_model *model;
static fuzz_snapshot before;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    model = fuzz_model_create(MT_PRECISION_BF16);
    before = fuzz_snapshot_take(model);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch();
    fuzz_write(dir, "model.safetensors", data, size);
    mt_status st = mt_model_load(model, dir);
    fuzz_expect_message(st, mt_model_errmsg(model), "mt_model_load");
    if (st) {
        fuzz_snapshot_check(&before, model, "mt_model_load");
    } else { /* a good file: what it held is the model now */
        free(before.bytes);
        before = fuzz_snapshot_take(model);
    }
    return 0;
}
