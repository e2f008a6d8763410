/* Trains a small model on a repeating token pattern through the C API: the
 * reference run that the C++, Rust and Go examples repeat call for call.
 * Every line after the first is the same in all four, and `make check`
 * compares them (tools/install-check.sh).
 *
 *     cc train.c $(pkg-config --cflags --libs megatrain) -o train
 *
 * Exits 0 when the loss fell to under half its first value. */
#include <megatrain.h>
#include <stdio.h>

#define N_SEQ 4
#define SEQ_LEN 32
#define STEPS 60

int main(void)
{
    printf("libmegatrain %s from C\n", mt_version_string());

    mt_model_config cfg;
    mt_model_config_init(&cfg);
    cfg.vocab_size = 32;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 128;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = 64;
    cfg.precision = MT_PRECISION_FP32;
    mt_offload_policy pol;
    mt_offload_policy_init(&pol);
    pol.backend = MT_BACKEND_CPU;

    /* a refusal first: 7 query heads, which the default 8 key/value heads do not divide */
    mt_model_config bad;
    mt_model_config_init(&bad);
    bad.num_attention_heads = 7;
    mt_model *model = NULL;
    mt_status st = mt_model_create(&model, &bad, &pol);
    if (st == MT_OK || model || !*mt_last_errmsg()) {
        fprintf(stderr, "a bad config was not refused with a message (%d)\n", (int)st);
        return 1;
    }
    printf("refused as expected: %s: %s\n", mt_status_str(st), mt_last_errmsg());

    if ((st = mt_model_create(&model, &cfg, &pol)) != MT_OK) {
        fprintf(stderr, "mt_model_create: %s: %s\n", mt_status_str(st), mt_last_errmsg());
        return 1;
    }
    printf("%llu parameters\n", (unsigned long long)mt_model_num_params(model));

    /* 4 sequences of 32 tokens of a period-7 pattern, each starting elsewhere in it */
    static const int32_t pattern[7] = {3, 17, 5, 29, 11, 2, 23};
    int32_t tokens[N_SEQ * SEQ_LEN], targets[N_SEQ * SEQ_LEN];
    for (int s = 0; s < N_SEQ; s++)
        for (int t = 0; t < SEQ_LEN; t++) {
            tokens[s * SEQ_LEN + t] = pattern[(s + t) % 7];
            targets[s * SEQ_LEN + t] = pattern[(s + t + 1) % 7];
        }
    mt_batch batch;
    mt_batch_init(&batch);
    batch.micro_batch_size = N_SEQ;
    batch.seq_len = SEQ_LEN;
    batch.num_micro_batches = 1;
    batch.tokens = tokens;
    batch.targets = targets;
    mt_optim_config opt;
    mt_optim_config_init(&opt);
    opt.lr = 3e-3f;
    opt.total_steps = STEPS;

    double first = 0, last = 0;
    for (int i = 0; i < STEPS; i++) {
        mt_step_stats stats;
        mt_step_stats_init(&stats);
        if ((st = mt_step(model, &batch, &opt, &stats)) != MT_OK) {
            fprintf(stderr, "mt_step: %s: %s\n", mt_status_str(st), mt_model_errmsg(model));
            mt_model_destroy(model);
            return 1;
        }
        if (i == 0) first = stats.loss;
        last = stats.loss;
        if (i % 20 == 0 || i == STEPS - 1)
            printf("step %2llu: loss %.6f, grad norm %.6f, lr %.6f\n", (unsigned long long)stats.step, stats.loss,
                   stats.grad_norm, (double)stats.lr);
    }
    mt_model_destroy(model);
    if (!(last < 0.5 * first)) {
        fprintf(stderr, "the loss did not fall to half: %.4f -> %.4f\n", first, last);
        return 1;
    }
    printf("learned: loss %.6f -> %.6f\n", first, last);
    return 0;
}
