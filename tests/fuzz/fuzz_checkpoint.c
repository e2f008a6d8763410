/* A checkpoint folder as mt_checkpoint_load reads it: config.json and
 * model.safetensors are a real save of the model; the input is
 * trainer_state.json, then "\n--\n", then optimizer.safetensors (the real one
 * when that part is empty). A load that fails must leave the model as it was. */
#include "fuzz_model.h"

static mt_model *model;
static fuzz_snapshot before;
static unsigned char *real_opt;
static size_t real_opt_n;
static char ck[512];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    model = fuzz_model_create(MT_PRECISION_FP32);
    snprintf(ck, sizeof ck, "%s/ck", fuzz_scratch());
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    if (mt_checkpoint_save(model, ck, &info) != MT_OK) {
        fprintf(stderr, "fuzz: cannot save a checkpoint: %s\n", mt_model_errmsg(model));
        abort();
    }
    /* the step folder itself, so that the input's state file is the one read */
    size_t n;
    unsigned char *name = fuzz_read(ck, "latest", &n);
    const size_t len = strlen(ck);
    snprintf(ck + len, sizeof ck - len, "/%.*s", (int)strcspn((char *)name, "\n"), (char *)name);
    free(name);
    real_opt = fuzz_read(ck, "optimizer.safetensors", &real_opt_n);
    before = fuzz_snapshot_take(model);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_part part[2];
    fuzz_split(data, size, part);
    fuzz_write(ck, "trainer_state.json", part[0].p, part[0].n);
    if (part[1].n) fuzz_write(ck, "optimizer.safetensors", part[1].p, part[1].n);
    else fuzz_write(ck, "optimizer.safetensors", real_opt, real_opt_n);
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    mt_status st = mt_checkpoint_load(model, ck, &info);
    fuzz_expect_message(st, mt_model_errmsg(model), "mt_checkpoint_load");
    if (st) {
        fuzz_snapshot_check(&before, model, "mt_checkpoint_load");
    } else {
        free(before.bytes);
        before = fuzz_snapshot_take(model);
    }
    return 0;
}
