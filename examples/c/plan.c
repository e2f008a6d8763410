/* Prints the memory plan of a Llama-2-7B-shaped model and, if the machine can
 * hold it, creates a small model. Builds against an installed libmegatrain:
 *
 *     cc plan.c $(pkg-config --cflags --libs megatrain) -o plan
 */
#include <megatrain.h>
#include <stdio.h>

static double gib(uint64_t b) { return (double)b / (1u << 30); }

int main(void)
{
    if (mt_version_number() / 10000 != MT_VERSION_MAJOR) {
        fprintf(stderr, "libmegatrain %s does not match this program's header\n", mt_version_string());
        return 1;
    }
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    cfg.vocab_size = 32000;
    cfg.hidden_size = 4096;
    cfg.intermediate_size = 11008;
    cfg.num_hidden_layers = 32;
    cfg.num_attention_heads = 32;
    cfg.num_key_value_heads = 32;

    mt_offload_policy pol;
    mt_offload_policy_init(&pol);
    mt_batch_shape shape;
    mt_batch_shape_init(&shape);
    shape.micro_batch_size = 4;
    shape.seq_len = 4096;
    shape.num_micro_batches = 8;

    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    mt_status st = mt_plan(&plan, &cfg, &pol, &shape);
    printf("Llama-2-7B shape: %.2f B parameters, %s backend\n", plan.num_params / 1e9,
           plan.backend == MT_BACKEND_CUDA ? "CUDA" : "CPU");
    printf("  host pinned %.1f GiB, host pageable %.1f GiB, GPU %.1f GiB\n", gib(plan.host_pinned_bytes),
           gib(plan.host_pageable_bytes), gib(plan.gpu_bytes));
    if (st != MT_OK) printf("  does not fit here: %s\n", mt_last_errmsg());

    cfg.hidden_size = 256;
    cfg.intermediate_size = 688;
    cfg.num_hidden_layers = 4;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 4;
    mt_model *model = NULL;
    st = mt_model_create(&model, &cfg, &pol);
    if (st != MT_OK) {
        fprintf(stderr, "mt_model_create: %s: %s\n", mt_status_str(st), mt_last_errmsg());
        return 1;
    }
    printf("created a %.1f M-parameter model\n", mt_model_num_params(model) / 1e6);
    mt_model_destroy(model);
    return 0;
}
