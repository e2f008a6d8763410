/* A program built against the 0.1.0 header (megatrain-0.1.0.h beside this
 * file, as released), run against the library of today: every struct passes
 * 0.1.0's size, and every call must work as it did. tools/abi-check.sh runs
 * it against the library that `make` built and against one whose structs
 * grew, as the ABI rules allow (docs/abi.md).
 *
 *     old_caller DIR      (DIR: a scratch folder for a checkpoint and a token file)
 *
 * Prints one line per check and "old-caller: N passed, 0 failed" at the end;
 * exits 1 at the first failure. */
#include "megatrain-0.1.0.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed;

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "old-caller: FAILED %s (line %d): ", #cond, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\nold-caller: %d passed, 1 failed\n", passed);                 \
            exit(1);                                                                        \
        }                                                                                   \
        passed++;                                                                           \
    } while (0)

static int stop_now(void *user_data)
{
    (void)user_data;
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: old_caller DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    CHECK(mt_version_number() / 10000 == MT_VERSION_MAJOR, "library %s", mt_version_string());
    CHECK(mt_version_number() >= MT_VERSION_NUMBER, "library %s is older than 0.1.0", mt_version_string());

    mt_model_config cfg;
    mt_model_config_init(&cfg);
    CHECK(cfg.struct_size == 96 && cfg.vocab_size == 32000, "config defaults (size %u)", cfg.struct_size);
    cfg.vocab_size = 64;
    cfg.hidden_size = 32;
    cfg.intermediate_size = 48;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = 32;
    mt_offload_policy pol;
    mt_offload_policy_init(&pol);
    CHECK(pol.weight_slots == 2 && pol.numa_node == -1, "policy defaults");
    pol.backend = MT_BACKEND_CPU;
    pol.optimizer_threads = 2;

    mt_batch_shape shape;
    mt_batch_shape_init(&shape);
    shape.seq_len = 16;
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    CHECK(mt_plan(&plan, &cfg, &pol, &shape) == MT_OK, "mt_plan: %s", mt_last_errmsg());
    CHECK(plan.struct_size == sizeof plan && plan.num_params > 0 && plan.num_units == 4, "plan %llu params",
          (unsigned long long)plan.num_params);

    mt_model *m = NULL;
    CHECK(mt_model_create(&m, &cfg, &pol) == MT_OK, "mt_model_create: %s", mt_last_errmsg());
    CHECK(mt_model_num_params(m) == plan.num_params, "params");
    mt_model_config got;
    mt_model_config_init(&got);
    CHECK(mt_model_get_config(m, &got) == MT_OK && got.hidden_size == 32 && got.head_dim == 8, "get_config");

    enum { N = 2 * 16 };
    int32_t tok[N], tg[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 7) % 64, tg[i] = ((i + 1) * 7) % 64;
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = 2;
    b.seq_len = 16;
    b.num_micro_batches = 1;
    b.tokens = tok;
    b.targets = tg;
    mt_optim_config opt;
    mt_optim_config_init(&opt);
    CHECK(opt.struct_size == 48 && opt.beta2 == 0.95f, "optim defaults");
    opt.lr = 1e-2f;
    opt.total_steps = 10;
    double first = 0, last = 0;
    for (int s = 0; s < 5; s++) {
        mt_step_stats st;
        mt_step_stats_init(&st);
        CHECK(mt_step(m, &b, &opt, &st) == MT_OK, "mt_step: %s", mt_model_errmsg(m));
        CHECK(st.step == (uint64_t)s + 1 && st.tokens == N && st.target_tokens == N, "step stats");
        if (s == 0) first = st.loss;
        last = st.loss;
    }
    CHECK(last < first, "the loss fell: %g -> %g", first, last);
    mt_eval_stats es;
    mt_eval_stats_init(&es);
    CHECK(mt_eval(m, &b, &es) == MT_OK && es.loss > 0 && es.tokens == N, "mt_eval: %s", mt_model_errmsg(m));

    char path[4096];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    info.data_position = 77;
    info.rng_state[3] = 5;
    CHECK(mt_checkpoint_save(m, path, &info) == MT_OK, "mt_checkpoint_save: %s", mt_model_errmsg(m));
    mt_checkpoint_info back;
    mt_checkpoint_info_init(&back);
    CHECK(mt_checkpoint_load(m, path, &back) == MT_OK, "mt_checkpoint_load: %s", mt_model_errmsg(m));
    CHECK(back.step == 5 && back.data_position == 77 && back.rng_state[3] == 5, "checkpoint info");

    mt_timeline tl;
    mt_timeline_init(&tl);
    CHECK(mt_model_timeline(m, &tl, NULL, 0) == MT_ERR_UNSUPPORTED, "timeline on the CPU backend");
    mt_model_destroy(m);

    /* the abort callback, a 0.1 field */
    pol.abort_callback = stop_now;
    CHECK(mt_model_create(&m, &cfg, &pol) == MT_OK, "mt_model_create: %s", mt_last_errmsg());
    CHECK(mt_step(m, &b, &opt, NULL) == MT_ERR_ABORTED, "abort: %s", mt_model_errmsg(m));
    CHECK(mt_model_step_count(m) == 0, "no step after an abort");
    mt_model_destroy(m);

    /* token data */
    snprintf(path, sizeof path, "%s/tokens.u16", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    for (uint16_t i = 0; i < 200; i++) {
        uint16_t v = (uint16_t)(i % 50);
        fwrite(&v, 2, 1, f);
    }
    fclose(f);
    mt_dataset_options dopt;
    mt_dataset_options_init(&dopt);
    dopt.format = MT_TOKENS_U16;
    dopt.vocab_size = 64;
    dopt.seq_len = 16;
    dopt.heldout_fraction = 0.1f;
    mt_dataset *ds = NULL;
    CHECK(mt_dataset_open(&ds, path, &dopt) == MT_OK, "mt_dataset_open: %s", mt_last_errmsg());
    CHECK(mt_dataset_num_tokens(ds) == 200, "tokens");
    CHECK(mt_dataset_read(ds, MT_SPLIT_TRAIN, 0, 2, tok, tg) == MT_OK, "mt_dataset_read");
    mt_dataset_close(ds);

    /* refusals keep their statuses */
    mt_optim_config small = opt;
    small.struct_size = 8;
    CHECK(mt_lr_at(&small, 0) != mt_lr_at(&small, 0), "a size below the first release is refused (NaN)");
    cfg.num_attention_heads = 7;
    CHECK(mt_model_create(&m, &cfg, &pol) == MT_ERR_INVALID_ARGUMENT && m == NULL, "a bad config");

    printf("old-caller: %d passed, 0 failed (0.1.0 header, library %s)\n", passed, mt_version_string());
    return 0;
}
