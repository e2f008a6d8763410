/* config.json as mt_config_load reads it (the Llama, Qwen2 and Mistral
 * fields, rope scaling in both transformers 4 and 5 spellings); a config it
 * accepts must also make a model plan (mt_plan), which checks the shape. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch();
    fuzz_write(dir, "config.json", data, size);
    mt_model_config c;
    mt_model_config_init(&c);
    mt_status st = mt_config_load(&c, dir);
    fuzz_expect_message(st, mt_last_errmsg(), "mt_config_load");
    if (!st) {
        mt_offload_policy p;
        mt_offload_policy_init(&p);
        p.backend = MT_BACKEND_CPU;
        mt_memory_plan plan;
        mt_memory_plan_init(&plan);
        st = mt_plan(&plan, &c, &p, NULL);
        fuzz_expect_message(st, mt_last_errmsg(), "mt_plan");
    }
    return 0;
}
