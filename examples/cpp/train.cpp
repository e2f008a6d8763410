/* Trains a small model on a repeating token pattern through the C++ wrapper
 * (megatrain.hpp): the run of examples/c/train.c, call for call. Every line
 * after the first is the same as that example's.
 *
 *     c++ -std=c++17 train.cpp $(pkg-config --cflags --libs megatrain) -o train
 *
 * Exits 0 when the loss fell to under half its first value. */
#include <megatrain.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {
constexpr std::uint32_t n_seq = 4;
constexpr std::uint32_t seq_len = 32;
constexpr std::uint32_t steps = 60;
} // namespace

int main()
{
    std::printf("libmegatrain %s from C++\n", mt_version_string());

    mt::model_config cfg;
    cfg.vocab_size = 32;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 128;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = 64;
    cfg.precision = MT_PRECISION_FP32;
    mt::offload_policy pol;
    pol.backend = MT_BACKEND_CPU;

    // a refusal first: 7 query heads, which the default 8 key/value heads do not divide
    mt::model_config bad;
    bad.num_attention_heads = 7;
    try {
        mt::model refused(bad, pol);
        std::fprintf(stderr, "a bad config was not refused\n");
        return 1;
    } catch (const mt::error &e) {
        if (!*e.message()) {
            std::fprintf(stderr, "a bad config was refused without a message (%d)\n", static_cast<int>(e.status()));
            return 1;
        }
        std::printf("refused as expected: %s: %s\n", mt_status_str(e.status()), e.message());
    }

    double first = 0, last = 0;
    try {
        mt::model model(cfg, pol);
        std::printf("%llu parameters\n", static_cast<unsigned long long>(model.num_params()));

        // 4 sequences of 32 tokens of a period-7 pattern, each starting elsewhere in it
        static const std::int32_t pattern[7] = {3, 17, 5, 29, 11, 2, 23};
        std::vector<std::int32_t> tokens(n_seq * seq_len), targets(n_seq * seq_len);
        for (std::uint32_t s = 0; s < n_seq; s++)
            for (std::uint32_t t = 0; t < seq_len; t++) {
                tokens[s * seq_len + t] = pattern[(s + t) % 7];
                targets[s * seq_len + t] = pattern[(s + t + 1) % 7];
            }
        mt::batch batch;
        batch.micro_batch_size = n_seq;
        batch.seq_len = seq_len;
        batch.num_micro_batches = 1;
        batch.tokens = tokens.data();
        batch.targets = targets.data();
        mt::optim_config opt;
        opt.lr = 3e-3f;
        opt.total_steps = steps;

        for (std::uint32_t i = 0; i < steps; i++) {
            const mt_step_stats stats = model.step(batch, opt);
            if (i == 0) first = stats.loss;
            last = stats.loss;
            if (i % 20 == 0 || i == steps - 1)
                std::printf("step %2llu: loss %.6f, grad norm %.6f, lr %.6f\n",
                            static_cast<unsigned long long>(stats.step), stats.loss, stats.grad_norm,
                            static_cast<double>(stats.lr));
        }
    } catch (const mt::error &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    if (!(last < 0.5 * first)) {
        std::fprintf(stderr, "the loss did not fall to half: %.4f -> %.4f\n", first, last);
        return 1;
    }
    std::printf("learned: loss %.6f -> %.6f\n", first, last);
    return 0;
}
