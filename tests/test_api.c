/* The public API's contract: status codes and messages for misuse, struct
 * versioning, configuration validation, budgets, the learning-rate schedule. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "megatrain.h"

static mt_model_config tiny_config(void)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 64;
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 128;
    return c;
}

static mt_offload_policy quiet_cpu_policy(void)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.log_level = MT_LOG_ERROR;
    return p;
}

Test(api, version_matches_header)
{
    cr_assert_eq(mt_version_number(), MT_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", MT_VERSION_MAJOR, MT_VERSION_MINOR, MT_VERSION_PATCH);
    cr_assert_str_eq(mt_version_string(), want);
}

Test(api, every_status_has_a_distinct_string)
{
    const char *seen[MT_ERR_INTERNAL + 1];
    for (int s = MT_OK; s <= MT_ERR_INTERNAL; s++) {
        seen[s] = mt_status_str((mt_status)s);
        cr_assert(seen[s] && *seen[s]);
        cr_assert_str_neq(seen[s], "unknown status", "status %d has no string", s);
        for (int t = 0; t < s; t++) cr_assert_str_neq(seen[s], seen[t]);
    }
    cr_assert_str_eq(mt_status_str((mt_status)12345), "unknown status");
    cr_assert_eq(sizeof(mt_status), 4);
}

Test(api, create_with_null_arguments)
{
    mt_model_config c = tiny_config();
    mt_model *m = (mt_model *)0x1;
    cr_assert_eq(mt_model_create(NULL, &c, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "out is NULL"), "message: %s", mt_last_errmsg());
    cr_assert_eq(mt_model_create(&m, NULL, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_null(m, "a failed create sets *out to NULL");
    cr_assert(strstr(mt_last_errmsg(), "mt_model_config is NULL"), "message: %s", mt_last_errmsg());
    mt_model_destroy(NULL); /* a no-op */
    cr_assert_eq(mt_model_num_params(NULL), 0);
    cr_assert_str_eq(mt_model_errmsg(NULL), "model is NULL");
    cr_assert_eq(mt_model_get_config(NULL, &c), MT_ERR_INVALID_ARGUMENT);
}

Test(api, create_and_destroy_a_tiny_model)
{
    mt_model_config c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK, "%s", mt_last_errmsg());
    cr_assert_not_null(m);
    cr_assert_eq(mt_model_backend(m), MT_BACKEND_CPU);
    /* V*C + L*(2C + q*C + 2*kv*C + C*q + 3*F*C) + C + V*C (untied) */
    uint64_t C = 32, V = 64, F = 64, q = 32, kv = 16;
    cr_assert_eq(mt_model_num_params(m), V * C + 2 * (2 * C + q * C + 2 * kv * C + C * q + 3 * F * C) + C + V * C);
    cr_assert_str_eq(mt_model_errmsg(m), "");
    mt_model_config got;
    mt_model_config_init(&got);
    cr_assert_eq(mt_model_get_config(m, &got), MT_OK);
    cr_assert_eq(got.head_dim, 8, "head_dim resolved to hidden / heads");
    cr_assert_eq(got.num_key_value_heads, 2);
    got.struct_size = 4;
    cr_assert_eq(mt_model_get_config(m, &got), MT_ERR_STRUCT_SIZE);
    cr_assert(strstr(mt_model_errmsg(m), "struct_size is 4"), "message: %s", mt_model_errmsg(m));
    mt_model_destroy(m);
}

/* ---- struct versioning ---------------------------------------------------- */

Test(api, struct_size_from_an_older_caller_is_refused)
{
    mt_model_config c = tiny_config();
    mt_model *m = NULL;
    c.struct_size = 8; /* smaller than any released mt_model_config */
    cr_assert_eq(mt_model_create(&m, &c, NULL), MT_ERR_STRUCT_SIZE);
    cr_assert(strstr(mt_last_errmsg(), "mt_model_config.struct_size is 8"), "message: %s", mt_last_errmsg());
    c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    p.struct_size = 0;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_STRUCT_SIZE);
    cr_assert(strstr(mt_last_errmsg(), "mt_offload_policy.struct_size is 0"), "message: %s", mt_last_errmsg());
    cr_assert_null(m);
}

/* A newer caller's struct: ours followed by fields this version lacks. */
typedef struct {
    mt_model_config base;
    uint64_t future_field;
} newer_config;

Test(api, struct_size_from_a_newer_caller)
{
    newer_config nc;
    memset(&nc, 0, sizeof nc);
    nc.base = tiny_config();
    nc.base.struct_size = sizeof nc;
    mt_offload_policy p = quiet_cpu_policy();
    mt_model *m = NULL;
    /* unknown fields left zero: accepted, they mean "default" */
    cr_assert_eq(mt_model_create(&m, &nc.base, &p), MT_OK, "%s", mt_last_errmsg());
    mt_model_destroy(m);
    /* an unknown field set: this library cannot honour it */
    nc.future_field = 1;
    cr_assert_eq(mt_model_create(&m, &nc.base, &p), MT_ERR_STRUCT_SIZE);
    cr_assert(strstr(mt_last_errmsg(), "is not zero"), "message: %s", mt_last_errmsg());
    cr_assert_null(m);
}

Test(api, plan_output_struct_sizes)
{
    mt_model_config c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    plan.struct_size = 12;
    cr_assert_eq(mt_plan(&plan, &c, &p, NULL), MT_ERR_STRUCT_SIZE);
    cr_assert_eq(mt_plan(NULL, &c, &p, NULL), MT_ERR_INVALID_ARGUMENT);
    /* a newer caller's larger output struct: the fields we know are written, the rest untouched */
    struct { mt_memory_plan base; uint64_t future; } big;
    memset(&big, 0, sizeof big);
    big.base.struct_size = sizeof big;
    big.future = 77;
    cr_assert_eq(mt_plan(&big.base, &c, &p, NULL), MT_OK, "%s", mt_last_errmsg());
    cr_assert_gt(big.base.num_params, 0);
    cr_assert_eq(big.future, 77);
    cr_assert_eq(big.base.struct_size, sizeof big, "the caller's size is kept");
}

/* ---- configuration validation ------------------------------------------------ */

typedef struct {
    const char *what;
    void (*mutate)(mt_model_config *);
    const char *needle;
} bad_config;

static void zero_vocab(mt_model_config *c) { c->vocab_size = 0; }
static void zero_hidden(mt_model_config *c) { c->hidden_size = 0; }
static void zero_layers(mt_model_config *c) { c->num_hidden_layers = 0; }
static void zero_heads(mt_model_config *c) { c->num_attention_heads = 0; }
static void kv_not_dividing(mt_model_config *c) { c->num_key_value_heads = 3; }
static void hidden_not_multiple(mt_model_config *c) { c->hidden_size = 30; }
static void odd_head_dim(mt_model_config *c) { c->head_dim = 7; }
static void nan_eps(mt_model_config *c) { c->rms_norm_eps = NAN; }
static void bad_theta(mt_model_config *c) { c->rope_theta = 0; }
static void bad_arch(mt_model_config *c) { c->arch = 99; }
static void bad_precision(mt_model_config *c) { c->precision = 5; }
static void absurd_layers(mt_model_config *c) { c->num_hidden_layers = 1u << 30; }
static void absurd_vocab(mt_model_config *c) { c->vocab_size = 0xffffffffu; }
static void bad_llama3(mt_model_config *c) { c->rope_scaling = MT_ROPE_SCALING_LLAMA3; c->rope_high_freq_factor = 0.5f; }
static void reserved_set(mt_model_config *c) { c->reserved0 = 1; }
static void reserved1_set(mt_model_config *c) { c->reserved1 = 1; }
static void llama_window(mt_model_config *c) { c->sliding_window = 16; }
static void mistral_pattern(mt_model_config *c) { c->arch = MT_ARCH_MISTRAL, c->sliding_window = 16, c->sliding_window_pattern = 2; }
static void pattern_one(mt_model_config *c) { c->arch = MT_ARCH_QWEN2, c->sliding_window = 16, c->sliding_window_pattern = 1; }
static void window_layers_past(mt_model_config *c)
{
    c->arch = MT_ARCH_QWEN3, c->sliding_window = 16, c->max_window_layers = c->num_hidden_layers + 1;
}
static void pattern_without_window(mt_model_config *c) { c->arch = MT_ARCH_QWEN3, c->sliding_window_pattern = 2; }
static void reserved2_set(mt_model_config *c) { c->reserved2 = 1; }
static void llama_softcap(mt_model_config *c) { c->attn_logit_softcapping = 50.0f; }
static void gemma_nan_softcap(mt_model_config *c) { c->arch = MT_ARCH_GEMMA2, c->final_logit_softcapping = NAN; }
static void gemma2_local_base(mt_model_config *c) { c->arch = MT_ARCH_GEMMA2, c->rope_local_base_freq = 10000.0f; }
static void gemma3_scalar(mt_model_config *c) { c->arch = MT_ARCH_GEMMA3, c->query_pre_attn_scalar = -1.0f; }
static void linear_factor(mt_model_config *c) { c->rope_scaling = MT_ROPE_SCALING_LINEAR, c->rope_factor = 0.5f; }
static void dense_experts(mt_model_config *c) { c->num_experts = 8; }
static void moe(mt_model_config *c)
{
    c->arch = MT_ARCH_QWEN3_MOE, c->num_experts = 8, c->num_experts_per_tok = 2, c->moe_intermediate_size = 64;
}
static void moe_no_experts(mt_model_config *c) { moe(c), c->num_experts = 0; }
static void moe_k_past(mt_model_config *c) { moe(c), c->num_experts_per_tok = 9; }
static void moe_no_width(mt_model_config *c) { moe(c), c->moe_intermediate_size = 0; }
static void moe_dense_past(mt_model_config *c) { moe(c), c->mlp_only_layers[0] = 1ull << c->num_hidden_layers; }
static void moe_step_past(mt_model_config *c) { moe(c), c->decoder_sparse_step = c->num_hidden_layers + 1; }
static void moe_aux_nan(mt_model_config *c) { moe(c), c->router_aux_loss_coef = NAN; }
static void mixtral_no_norm(mt_model_config *c) { moe(c), c->arch = MT_ARCH_MIXTRAL; }

Test(api, bad_configurations_are_refused_with_a_message)
{
    static const bad_config cases[] = {
        {"vocab 0", zero_vocab, "vocab_size 0"},
        {"hidden 0", zero_hidden, "hidden_size 0"},
        {"layers 0", zero_layers, "num_hidden_layers 0"},
        {"heads 0", zero_heads, "num_attention_heads 0"},
        {"kv heads", kv_not_dividing, "num_key_value_heads 3 must divide"},
        {"hidden % heads", hidden_not_multiple, "not a multiple of num_attention_heads"},
        {"odd head_dim", odd_head_dim, "head_dim 7"},
        {"eps NaN", nan_eps, "rms_norm_eps"},
        {"theta", bad_theta, "rope_theta"},
        {"arch", bad_arch, "arch 99"},
        {"precision", bad_precision, "precision 5"},
        {"absurd layers", absurd_layers, "num_hidden_layers"},
        {"absurd vocab", absurd_vocab, "vocab_size"},
        {"llama3 factors", bad_llama3, "llama3"},
        {"reserved", reserved_set, "reserved0"},
        {"reserved1", reserved1_set, "reserved1"},
        {"Llama window", llama_window, "Llama has no sliding-window attention"},
        {"Mistral pattern", mistral_pattern, "Mistral slides every layer"},
        {"pattern 1", pattern_one, "sliding_window_pattern 1"},
        {"window layers", window_layers_past, "max_window_layers"},
        {"pattern, no window", pattern_without_window, "need a sliding_window"},
        {"reserved2", reserved2_set, "reserved2"},
        {"Llama soft-cap", llama_softcap, "are Gemma's"},
        {"soft-cap NaN", gemma_nan_softcap, "final_logit_softcapping nan"},
        {"Gemma 2 local base", gemma2_local_base, "is Gemma 3's"},
        {"negative scalar", gemma3_scalar, "query_pre_attn_scalar -1"},
        {"linear factor", linear_factor, "linear rope scaling"},
        {"dense with experts", dense_experts, "Qwen3-MoE and Mixtral have experts"},
        {"no experts", moe_no_experts, "num_experts 0"},
        {"k past experts", moe_k_past, "num_experts_per_tok 9"},
        {"expert width 0", moe_no_width, "moe_intermediate_size 0"},
        {"dense layer past", moe_dense_past, "mlp_only_layers names layer 2 of a model of 2"},
        {"sparse step past", moe_step_past, "decoder_sparse_step 3"},
        {"aux coef NaN", moe_aux_nan, "router_aux_loss_coef"},
        {"Mixtral unnormalised", mixtral_no_norm, "Mixtral renormalises"},
    };
    mt_offload_policy p = quiet_cpu_policy();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mt_model_config c = tiny_config();
        cases[i].mutate(&c);
        mt_model *m = (mt_model *)0x1;
        cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT, "%s", cases[i].what);
        cr_assert_null(m, "%s", cases[i].what);
        cr_assert(strstr(mt_last_errmsg(), cases[i].needle), "%s: message '%s' lacks '%s'", cases[i].what,
                  mt_last_errmsg(), cases[i].needle);
        mt_memory_plan plan;
        mt_memory_plan_init(&plan);
        cr_assert_eq(mt_plan(&plan, &c, &p, NULL), MT_ERR_INVALID_ARGUMENT, "%s (mt_plan)", cases[i].what);
    }
}

Test(api, bad_policies_are_refused)
{
    mt_model_config c = tiny_config();
    mt_model *m = NULL;
    mt_offload_policy p = quiet_cpu_policy();
    p.weight_slots = 1;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "weight_slots 1"), "message: %s", mt_last_errmsg());
    p = quiet_cpu_policy();
    p.backend = 9;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    p = quiet_cpu_policy();
    p.numa_node = -7;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    p = quiet_cpu_policy();
    p.device = -1;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    p = quiet_cpu_policy();
    p.recompute = 2;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "recompute 2"), "message: %s", mt_last_errmsg());
    p = quiet_cpu_policy();
    p.timeline = 3;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    p = quiet_cpu_policy();
    p.attention = 3;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "attention 3"), "message: %s", mt_last_errmsg());
    p = quiet_cpu_policy();
    p.attention_flags = 2;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "attention_flags"), "message: %s", mt_last_errmsg());
    /* the CPU backend has no cuDNN to give */
    p = quiet_cpu_policy();
    p.attention = MT_ATTENTION_CUDNN;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "cuDNN"), "message: %s", mt_last_errmsg());
    cr_assert_null(m);
}

/* A caller built against the first mt_offload_policy, which ended at
 * abort_user_data, gets the defaults of the fields added since. */
Test(api, policy_of_the_first_size_is_accepted)
{
    mt_model_config c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    p.recompute = 12345; /* beyond the caller's struct_size: never read */
    p.struct_size = (uint32_t)offsetof(mt_offload_policy, recompute);
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK, "%s", mt_last_errmsg());
    mt_model_destroy(m);
}

/* ---- the *_init functions ---------------------------------------------------- */

#define CANARY 0xA5

/* A caller's struct at the start of a buffer whose other bytes are the
 * caller's neighbours: the library must not touch them. */
typedef union {
    mt_offload_policy pol;
    mt_step_stats stats;
    uint64_t align;
    unsigned char bytes[512];
} init_buf;

static void canary_fill(init_buf *b) { memset(b->bytes, CANARY, sizeof b->bytes); }

/* struct_size is `size` and no byte past the caller's `size` bytes changed. */
static void assert_written_exactly(const init_buf *b, uint32_t size)
{
    uint32_t got;
    memcpy(&got, b->bytes, sizeof got);
    cr_assert_eq(got, size, "struct_size %u, the caller's size is %u", got, size);
    for (size_t i = size; i < sizeof b->bytes; i++)
        cr_assert_eq(b->bytes[i], CANARY, "byte %zu past the caller's %u-byte struct was written", i, size);
}

/* The inline mt_X_init is mt_X_init_sized with the caller's sizeof; every
 * byte is written (two different fillings end equal). */
#define ASSERT_INIT_IS_SIZED(T)                                                                               \
    do {                                                                                                      \
        union { T s; unsigned char b[sizeof(T)]; } x, y;                                                     \
        memset(&x, 0x5A, sizeof x);                                                                           \
        memset(&y, 0xC3, sizeof y);                                                                           \
        T##_init(&x.s);                                                                                       \
        T##_init_sized(&y.s, (uint32_t)sizeof y.s);                                                           \
        cr_assert_eq(memcmp(x.b, y.b, sizeof x.b), 0, #T "_init and " #T "_init_sized differ");              \
        cr_assert_eq(x.s.struct_size, sizeof(T), #T);                                                         \
    } while (0)

Test(api, init_is_init_sized_with_the_callers_size)
{
    ASSERT_INIT_IS_SIZED(mt_model_config);
    ASSERT_INIT_IS_SIZED(mt_offload_policy);
    ASSERT_INIT_IS_SIZED(mt_optim_config);
    ASSERT_INIT_IS_SIZED(mt_batch_shape);
    ASSERT_INIT_IS_SIZED(mt_memory_plan);
    ASSERT_INIT_IS_SIZED(mt_batch);
    ASSERT_INIT_IS_SIZED(mt_step_stats);
    ASSERT_INIT_IS_SIZED(mt_eval_stats);
    ASSERT_INIT_IS_SIZED(mt_timeline);
    ASSERT_INIT_IS_SIZED(mt_checkpoint_info);
    ASSERT_INIT_IS_SIZED(mt_dataset_options);
}

/* For sizes smaller than, equal to and larger than the library's: exactly
 * `size` bytes written, the defaults' first bytes, zeros past them. */
#define ASSERT_INIT_SIZED_WRITES_EXACTLY(T)                                                                   \
    do {                                                                                                      \
        T full;                                                                                               \
        T##_init(&full);                                                                                      \
        const uint32_t sizes[] = {4, 8, (uint32_t)sizeof(T) / 2 / 4 * 4, (uint32_t)sizeof(T),                 \
                                  (uint32_t)sizeof(T) + 8, (uint32_t)sizeof(T) + 40};                         \
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {                                         \
            const uint32_t size = sizes[k];                                                                   \
            init_buf b;                                                                                       \
            canary_fill(&b);                                                                                  \
            T##_init_sized((T *)b.bytes, size);                                                               \
            assert_written_exactly(&b, size);                                                                 \
            const size_t known = size < sizeof(T) ? size : sizeof(T);                                         \
            cr_assert_eq(memcmp(b.bytes + 4, (const unsigned char *)&full + 4, known - 4), 0,                 \
                         #T ": the first %u bytes are not the defaults'", size);                              \
            for (size_t i = known; i < size; i++)                                                             \
                cr_assert_eq(b.bytes[i], 0, #T ": byte %zu of a %u-byte struct is not zero", i, size);        \
        }                                                                                                     \
        init_buf b;                                                                                           \
        canary_fill(&b);                                                                                      \
        for (uint32_t size = 0; size < 4; size++) {                                                           \
            T##_init_sized((T *)b.bytes, size);                                                               \
            for (size_t i = 0; i < sizeof b.bytes; i++)                                                       \
                cr_assert_eq(b.bytes[i], CANARY, #T ": a %u-byte size wrote byte %zu", size, i);              \
        }                                                                                                     \
        T##_init_sized(NULL, (uint32_t)sizeof(T));                                                            \
    } while (0)

Test(api, init_sized_writes_exactly_the_callers_size)
{
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_model_config);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_offload_policy);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_optim_config);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_batch_shape);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_memory_plan);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_batch);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_step_stats);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_eval_stats);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_timeline);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_checkpoint_info);
    ASSERT_INIT_SIZED_WRITES_EXACTLY(mt_dataset_options);
}

/* A caller built against the first mt_offload_policy (it ended at
 * abort_user_data) initialises its struct through the newer library: the
 * library writes none of the caller's neighbouring bytes, and never reads
 * them as recompute or reserved1. */
Test(api, policy_init_of_the_first_size)
{
    const uint32_t first = (uint32_t)offsetof(mt_offload_policy, recompute);
    init_buf b;
    canary_fill(&b);
    mt_offload_policy_init_sized(&b.pol, first);
    assert_written_exactly(&b, first);
    cr_assert_eq(b.pol.backend, MT_BACKEND_AUTO);
    cr_assert_eq(b.pol.device, 0);
    cr_assert_eq(b.pol.weight_slots, 2);
    cr_assert_eq(b.pol.gpu_budget_bytes, 0);
    cr_assert_eq(b.pol.host_budget_bytes, 0);
    cr_assert_eq(b.pol.numa_node, -1);
    cr_assert_eq(b.pol.optimizer_threads, 0);
    cr_assert_eq(b.pol.activations, MT_PLACE_AUTO);
    cr_assert_eq(b.pol.pin_host, MT_PIN_AUTO);
    cr_assert_null(b.pol.log_callback);
    cr_assert_eq(b.pol.log_level, MT_LOG_WARN);
    cr_assert_eq(b.pol.timeline, 0);
    cr_assert_null(b.pol.abort_callback);
    cr_assert_null(b.pol.abort_user_data);
    b.pol.backend = MT_BACKEND_CPU;
    b.pol.log_level = MT_LOG_ERROR;
    mt_model_config c = tiny_config();
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &b.pol), MT_OK, "%s", mt_last_errmsg());
    mt_model_destroy(m);
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    cr_assert_eq(mt_plan(&plan, &c, &b.pol, NULL), MT_OK, "%s", mt_last_errmsg());
    assert_written_exactly(&b, first);
}

/* A caller built against a newer header: the tail this library does not
 * know is zeroed, which it accepts. */
Test(api, policy_init_of_a_newer_callers_size)
{
    const uint32_t newer = (uint32_t)sizeof(mt_offload_policy) + 24;
    init_buf b;
    canary_fill(&b);
    mt_offload_policy_init_sized(&b.pol, newer);
    assert_written_exactly(&b, newer);
    for (size_t i = sizeof(mt_offload_policy); i < newer; i++) cr_assert_eq(b.bytes[i], 0, "tail byte %zu", i);
    cr_assert_eq(b.pol.weight_slots, 2);
    cr_assert_eq(b.pol.recompute, MT_RECOMPUTE_AUTO);
    b.pol.backend = MT_BACKEND_CPU;
    b.pol.log_level = MT_LOG_ERROR;
    mt_model_config c = tiny_config();
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &b.pol), MT_OK, "%s", mt_last_errmsg());
    mt_model_destroy(m);
}

/* A size below the first release is written and then refused, with the
 * size in the message. */
Test(api, policy_init_of_a_size_below_the_first_release)
{
    init_buf b;
    canary_fill(&b);
    mt_offload_policy_init_sized(&b.pol, 8);
    assert_written_exactly(&b, 8);
    mt_model_config c = tiny_config();
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &b.pol), MT_ERR_STRUCT_SIZE);
    cr_assert(strstr(mt_last_errmsg(), "mt_offload_policy.struct_size is 8"), "message: %s", mt_last_errmsg());
    cr_assert_null(m);
}

/* The output struct mt_step_stats (its first release is its size today):
 * mt_step writes up to the caller's size and keeps its struct_size. */
Test(api, step_stats_init_sized)
{
    mt_model_config c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK, "%s", mt_last_errmsg());
    enum { S = 8 };
    int32_t tok[S], tg[S];
    for (int i = 0; i < S; i++) tok[i] = (i * 7 + 3) % 64;
    for (int i = 0; i < S; i++) tg[i] = tok[(i + 1) % S];
    mt_batch batch;
    mt_batch_init(&batch);
    batch.micro_batch_size = 1;
    batch.seq_len = S;
    batch.num_micro_batches = 1;
    batch.tokens = tok;
    batch.targets = tg;
    mt_optim_config o;
    mt_optim_config_init(&o);

    const uint32_t first = (uint32_t)sizeof(mt_step_stats);
    init_buf b;
    canary_fill(&b);
    mt_step_stats_init_sized(&b.stats, first);
    assert_written_exactly(&b, first);
    for (size_t i = 4; i < first; i++) cr_assert_eq(b.bytes[i], 0, "byte %zu", i);
    cr_assert_eq(mt_step(m, &batch, &o, &b.stats), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert_eq(b.stats.step, 1);
    cr_assert_eq(b.stats.tokens, S);
    assert_written_exactly(&b, first);

    const uint32_t newer = first + 16;
    canary_fill(&b);
    mt_step_stats_init_sized(&b.stats, newer);
    assert_written_exactly(&b, newer);
    cr_assert_eq(mt_step(m, &batch, &o, &b.stats), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert_eq(b.stats.step, 2);
    assert_written_exactly(&b, newer);
    for (size_t i = first; i < newer; i++) cr_assert_eq(b.bytes[i], 0, "tail byte %zu", i);

    canary_fill(&b);
    mt_step_stats_init_sized(&b.stats, 8);
    cr_assert_eq(mt_step(m, &batch, &o, &b.stats), MT_ERR_STRUCT_SIZE);
    cr_assert(strstr(mt_model_errmsg(m), "mt_step_stats.struct_size is 8"), "message: %s", mt_model_errmsg(m));
    cr_assert_eq(mt_model_step_count(m), 2, "a refused step changes nothing");
    assert_written_exactly(&b, 8);
    mt_model_destroy(m);
}

/* ---- budgets -------------------------------------------------------------------- */

static unsigned long vm_size_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %lu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

/* A refused model must not have mapped its tiles: the address space grows by
 * far less than the tiles' size (a little slack for the allocator and, under
 * valgrind, the tool's own bookkeeping). */
#define NOTHING_MAPPED_SLACK_KB (16ul << 10)

Test(api, host_budget_too_small_is_refused_before_allocating)
{
    mt_model_config c = tiny_config();
    c.vocab_size = 32000;
    c.hidden_size = 1024; /* two 32000 x 1024 matrices: ~900 MiB of tiles */
    mt_offload_policy p = quiet_cpu_policy();
    p.host_budget_bytes = 100 << 20;
    mt_model *m = (mt_model *)0x1;
    unsigned long before = vm_size_kb();
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_HOST_BUDGET);
    cr_assert_lt(vm_size_kb(), before + NOTHING_MAPPED_SLACK_KB, "nothing was mapped (VmSize %lu -> %lu kB)", before,
                 vm_size_kb());
    cr_assert_null(m);
    cr_assert(strstr(mt_last_errmsg(), "host budget is 100.00 MiB"), "message: %s", mt_last_errmsg());
    cr_assert(strstr(mt_last_errmsg(), "needs"), "message: %s", mt_last_errmsg());
}

Test(api, model_larger_than_the_machine_is_refused)
{
    mt_model_config c = tiny_config();
    c.vocab_size = 128000;
    c.hidden_size = 65536;
    c.intermediate_size = 200000;
    c.num_attention_heads = 512;
    c.num_key_value_heads = 64;
    c.num_hidden_layers = 2000; /* ~ 100 T parameters */
    mt_offload_policy p = quiet_cpu_policy();
    mt_model *m = NULL;
    unsigned long before = vm_size_kb();
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_HOST_BUDGET);
    cr_assert_lt(vm_size_kb(), before + NOTHING_MAPPED_SLACK_KB);
    cr_assert(strstr(mt_last_errmsg(), "the machine has available only"), "message: %s", mt_last_errmsg());
    cr_assert(strstr(mt_last_errmsg(), "PiB"), "message names the bytes: %s", mt_last_errmsg());
}

Test(api, cuda_backend_without_a_gpu)
{
    mt_model_config c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    p.backend = MT_BACKEND_AUTO;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK, "%s", mt_last_errmsg());
    mt_backend chosen = mt_model_backend(m);
    mt_model_destroy(m);
    if (chosen == MT_BACKEND_CUDA) cr_skip_test("a GPU is present: nothing to refuse");
    p.backend = MT_BACKEND_CUDA;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_ERR_NO_DEVICE);
    cr_assert(strstr(mt_last_errmsg(), "CUDA backend"), "message: %s", mt_last_errmsg());
}

/* A plan for a GPU with a given budget is arithmetic: the same numbers on a
 * machine with or without one, for the CUDA backend (device memory counted,
 * tiles pinned); without a budget it needs the device to ask. A library
 * built without CUDA says it cannot plan for it. */
Test(api, plan_for_a_gpu_anywhere)
{
    mt_model_config c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    p.backend = MT_BACKEND_CUDA;
    p.gpu_budget_bytes = 80ull << 30;
    mt_batch_shape s;
    mt_batch_shape_init(&s);
    s.seq_len = 64;
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
#ifndef MT_HAVE_CUDA
    /* without the CUDA backend there is nobody to ask what it would allocate */
    cr_assert_eq(mt_plan(&plan, &c, &p, &s), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "built without CUDA"), "%s", mt_last_errmsg());
    return;
#endif
    /* head_dim 12 (not a multiple of 8): the CUDA backend's attention cannot
     * run it, and its plan says so */
    c.head_dim = 12;
    cr_assert_eq(mt_plan(&plan, &c, &p, &s), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "head_dim"), "%s", mt_last_errmsg());
    c.head_dim = 0; /* hidden / heads: 8 */
    cr_assert_eq(mt_plan(&plan, &c, &p, &s), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(plan.backend, MT_BACKEND_CUDA);
    cr_assert_gt(plan.gpu_bytes, 0);
    cr_assert_eq(plan.gpu_budget_bytes, 80ull << 30);
    cr_assert_eq(plan.activations, MT_PLACE_DEVICE);
    cr_assert_gt(plan.host_pinned_bytes, plan.master_bytes, "the tiles are pinned for a GPU");
    cr_assert_eq(plan.host_pageable_bytes, 0);
    p.gpu_budget_bytes = 1024; /* far too small: the GPU budget is what refuses it */
    cr_assert_eq(mt_plan(&plan, &c, &p, &s), MT_ERR_GPU_BUDGET);
    cr_assert(strstr(mt_last_errmsg(), "policy's GPU budget"), "%s", mt_last_errmsg());
}

/* ---- logging ------------------------------------------------------------------ */

typedef struct { int lines; int saw_backend; } log_count;

static void count_log(mt_log_level level, const char *text, void *user)
{
    log_count *lc = user;
    cr_assert(level >= MT_LOG_INFO);
    lc->lines++;
    if (strstr(text, "backend: CPU")) lc->saw_backend = 1;
}

Test(api, log_callback_says_which_backend)
{
    mt_model_config c = tiny_config();
    mt_offload_policy p = quiet_cpu_policy();
    log_count lc = {0, 0};
    p.log_callback = count_log;
    p.log_user_data = &lc;
    p.log_level = MT_LOG_INFO;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK);
    cr_assert(lc.saw_backend, "the log names the backend chosen");
    mt_model_destroy(m);
    lc = (log_count){0, 0};
    p.log_level = MT_LOG_WARN;
    cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK);
    cr_assert_eq(lc.lines, 0, "INFO lines are filtered at WARN");
    mt_model_destroy(m);
}

/* ---- learning-rate schedule ------------------------------------------------------ */

Test(api, lr_schedule_values)
{
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-3f;
    o.warmup_steps = 10;
    o.total_steps = 110;
    o.min_lr_ratio = 0.1f;
    o.schedule = MT_LR_COSINE;
    /* warm-up: (step + 1) / warmup * lr */
    cr_assert_float_eq(mt_lr_at(&o, 0), 1e-4f, 1e-9f);
    cr_assert_float_eq(mt_lr_at(&o, 4), 5e-4f, 1e-9f);
    cr_assert_float_eq(mt_lr_at(&o, 9), 1e-3f, 1e-9f);
    /* cosine: lr at its start, the midpoint between lr and the floor halfway, the floor at the end */
    cr_assert_float_eq(mt_lr_at(&o, 10), 1e-3f, 1e-9f);
    cr_assert_float_eq(mt_lr_at(&o, 60), 0.5f * (1e-3f + 1e-4f), 1e-9f);
    cr_assert_float_eq(mt_lr_at(&o, 35), 1e-4f + 0.9e-3f * 0.5f * (1.0f + cosf(0.25f * 3.14159265f)), 1e-8f);
    cr_assert_float_eq(mt_lr_at(&o, 110), 1e-4f, 1e-9f);
    cr_assert_float_eq(mt_lr_at(&o, 1000000), 1e-4f, 1e-9f);
    /* monotone after warm-up */
    for (uint64_t s = 10; s < 110; s++) cr_assert_leq(mt_lr_at(&o, s + 1), mt_lr_at(&o, s));
    o.schedule = MT_LR_CONSTANT;
    cr_assert_float_eq(mt_lr_at(&o, 3), 4e-4f, 1e-9f);
    cr_assert_eq(mt_lr_at(&o, 11), 1e-3f);
    cr_assert_eq(mt_lr_at(&o, 99999), 1e-3f);
    o.warmup_steps = 0;
    cr_assert_eq(mt_lr_at(&o, 0), 1e-3f);
    /* invalid configs give NaN */
    o.beta1 = 1.0f;
    cr_assert(isnan(mt_lr_at(&o, 0)));
    cr_assert(isnan(mt_lr_at(NULL, 0)));
    mt_optim_config_init(&o);
    o.struct_size = 3;
    cr_assert(isnan(mt_lr_at(&o, 0)));
}
