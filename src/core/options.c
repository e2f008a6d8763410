/* The public option structs: defaults, size-checked copies, validation, and
 * the learning-rate schedule. */
#include "core/internal.h"

#include <math.h>
#include <string.h>

mt_status mt_copy_in(mt_err err, void *dst, size_t dst_size, const void *src, size_t min_size, const char *what)
{
    if (!src) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    uint32_t size;
    memcpy(&size, src, sizeof size);
    if (size < min_size)
        return mt_fail(err, MT_ERR_STRUCT_SIZE,
                       "%s.struct_size is %u, but the smallest this library accepts is %zu: "
                       "initialise the struct with its _init() function",
                       what, size, min_size);
    if (size > dst_size) {
        const unsigned char *tail = (const unsigned char *)src + dst_size;
        for (size_t i = 0; i < size - dst_size; i++)
            if (tail[i])
                return mt_fail(err, MT_ERR_STRUCT_SIZE,
                               "%s.struct_size is %u, this library (%s) knows the first %zu bytes, and byte %zu "
                               "is not zero: the caller uses a field this version does not have",
                               what, size, mt_version_string(), dst_size, dst_size + i);
    }
    memcpy(dst, src, MT_MIN(size, dst_size));
    memcpy(dst, &(uint32_t){(uint32_t)dst_size}, sizeof(uint32_t));
    return MT_OK;
}

mt_status mt_copy_out(mt_err err, void *dst, const void *src, size_t src_size, size_t min_size, const char *what)
{
    if (!dst) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    uint32_t size;
    memcpy(&size, dst, sizeof size);
    if (size < min_size)
        return mt_fail(err, MT_ERR_STRUCT_SIZE,
                       "%s.struct_size is %u, but the smallest this library accepts is %zu: "
                       "initialise the struct with its _init() function",
                       what, size, min_size);
    memcpy((char *)dst + sizeof size, (const char *)src + sizeof size, MT_MIN(size, src_size) - sizeof size);
    return MT_OK;
}

/* ---- defaults ---------------------------------------------------------- */

void mt_struct_init(void *p, uint32_t size, const void *defaults, size_t known)
{
    if (!p || size < sizeof size) return;
    memset(p, 0, size);
    if (defaults) memcpy(p, defaults, MT_MIN((size_t)size, known));
    memcpy(p, &size, sizeof size);
}

void mt_model_config_init_sized(mt_model_config *p, uint32_t size)
{
    mt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = MT_ARCH_LLAMA;
    c.vocab_size = 32000;
    c.hidden_size = 512;
    c.intermediate_size = 1408;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 2048;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.rope_scaling = MT_ROPE_SCALING_NONE;
    c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_original_max_position = 8192;
    c.precision = MT_PRECISION_BF16;
    c.seed = 1;
    c.initializer_range = 0.02f;
    c.pad_token_id = -1;
    mt_struct_init(p, size, &c, sizeof c);
}

void mt_offload_policy_init_sized(mt_offload_policy *p, uint32_t size)
{
    mt_offload_policy d;
    memset(&d, 0, sizeof d);
    d.backend = MT_BACKEND_AUTO;
    d.weight_slots = 2;
    d.numa_node = -1;
    d.activations = MT_PLACE_AUTO;
    d.pin_host = MT_PIN_AUTO;
    d.log_level = MT_LOG_WARN;
    d.recompute = MT_RECOMPUTE_AUTO;
    mt_struct_init(p, size, &d, sizeof d);
}

void mt_optim_config_init_sized(mt_optim_config *p, uint32_t size)
{
    mt_optim_config o;
    memset(&o, 0, sizeof o);
    o.schedule = MT_LR_COSINE;
    o.lr = 3e-4f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.weight_decay = 0.1f;
    o.grad_clip = 1.0f;
    o.min_lr_ratio = 0.1f;
    o.warmup_steps = 0;
    o.total_steps = 1000;
    mt_struct_init(p, size, &o, sizeof o);
}

void mt_batch_shape_init_sized(mt_batch_shape *p, uint32_t size)
{
    mt_batch_shape s;
    memset(&s, 0, sizeof s);
    s.micro_batch_size = 1;
    s.seq_len = 1024;
    s.num_micro_batches = 1;
    mt_struct_init(p, size, &s, sizeof s);
}

void mt_memory_plan_init_sized(mt_memory_plan *p, uint32_t size) { mt_struct_init(p, size, NULL, 0); }

/* ---- validation ---------------------------------------------------------- */

/* mt_config_import lives in src/model/config.c: its rules depend on the
 * family (src/model/family.h), which this folder cannot see. */

mt_status mt_policy_import(mt_err err, mt_offload_policy *p, const mt_offload_policy *src)
{
    mt_offload_policy_init(p);
    if (!src) return MT_OK; /* NULL policy: the defaults */
    mt_status st = mt_copy_in(err, p, sizeof *p, src, MT_FIRST_SIZE_OFFLOAD_POLICY, "mt_offload_policy");
    if (st) return st;
#define BAD(...) mt_fail(err, MT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (p->backend > MT_BACKEND_CUDA) return BAD("mt_offload_policy.backend %u is not an mt_backend value", p->backend);
    if (p->device < 0) return BAD("mt_offload_policy.device %d is negative", p->device);
    if (p->weight_slots < 2 || p->weight_slots > MT_MAX_WEIGHT_SLOTS)
        return BAD("mt_offload_policy.weight_slots %u is outside [2, %d]", p->weight_slots, MT_MAX_WEIGHT_SLOTS);
    if (p->numa_node < -1) return BAD("mt_offload_policy.numa_node %d: use -1 for automatic", p->numa_node);
    if (p->optimizer_threads > 4096)
        return BAD("mt_offload_policy.optimizer_threads %u is absurd", p->optimizer_threads);
    if (p->activations > MT_PLACE_HOST)
        return BAD("mt_offload_policy.activations %u is not an mt_placement value", p->activations);
    if (p->pin_host > MT_PIN_NEVER) return BAD("mt_offload_policy.pin_host %u is not an mt_pinning value", p->pin_host);
    if (p->log_level > MT_LOG_ERROR + 1) return BAD("mt_offload_policy.log_level %u is not an mt_log_level", p->log_level);
    if (p->timeline > 1) return BAD("mt_offload_policy.timeline %u is not 0 or 1", p->timeline);
    if (p->recompute > MT_RECOMPUTE_FULL)
        return BAD("mt_offload_policy.recompute %u is not an mt_recompute value", p->recompute);
    if (p->reserved1) return BAD("mt_offload_policy.reserved1 must be zero");
    if (p->attention > MT_ATTENTION_CUDNN)
        return BAD("mt_offload_policy.attention %u is not an mt_attention value", p->attention);
    if (p->attention_flags & ~MT_ATTENTION_NONDETERMINISTIC)
        return BAD("mt_offload_policy.attention_flags 0x%x has unknown bits", p->attention_flags);
    if (p->weight_fetch > MT_FETCH_SLICES)
        return BAD("mt_offload_policy.weight_fetch %u is not an mt_weight_fetch (0 auto, 1 whole, 2 slices)",
                   p->weight_fetch);
    if (p->num_devices > MT_MAX_DEVICES)
        return BAD("mt_offload_policy.num_devices %u: at most %d GPUs of one host", p->num_devices, MT_MAX_DEVICES);
    if (p->num_devices > 1) {
        if (p->backend == MT_BACKEND_CPU)
            return BAD("mt_offload_policy.num_devices %u asks for several GPUs, but the backend is the CPU",
                       p->num_devices);
        if (!p->devices) return BAD("mt_offload_policy.devices is NULL, with num_devices %u", p->num_devices);
        for (uint32_t i = 0; i < p->num_devices; i++) {
            if (p->devices[i] < 0) return BAD("mt_offload_policy.devices[%u] is %d, negative", i, p->devices[i]);
            for (uint32_t j = 0; j < i; j++)
                if (p->devices[j] == p->devices[i])
                    return BAD("mt_offload_policy.devices lists device %d twice (entries %u and %u)", p->devices[i],
                               j, i);
        }
        p->device = p->devices[0]; /* rank 0's: what the library reports and plans for */
    } else {
        p->devices = NULL; /* not read */
    }
#undef BAD
    return MT_OK;
}

mt_status mt_optim_import(mt_err err, mt_optim_config *o, const mt_optim_config *src)
{
    mt_optim_config_init(o);
    mt_status st = mt_copy_in(err, o, sizeof *o, src, MT_FIRST_SIZE_OPTIM_CONFIG, "mt_optim_config");
    if (st) return st;
#define BAD(...) mt_fail(err, MT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (o->schedule > MT_LR_COSINE) return BAD("mt_optim_config.schedule %u is not an mt_lr_schedule", o->schedule);
    if (!(o->lr >= 0.0f) || !isfinite(o->lr)) return BAD("lr %g must be finite and >= 0", (double)o->lr);
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f)) return BAD("beta1 %g is outside [0, 1)", (double)o->beta1);
    if (!(o->beta2 >= 0.0f && o->beta2 < 1.0f)) return BAD("beta2 %g is outside [0, 1)", (double)o->beta2);
    if (!(o->eps > 0.0f) || !isfinite(o->eps)) return BAD("eps %g must be positive and finite", (double)o->eps);
    if (!(o->weight_decay >= 0.0f) || !isfinite(o->weight_decay))
        return BAD("weight_decay %g must be finite and >= 0", (double)o->weight_decay);
    if (!(o->grad_clip >= 0.0f) || !isfinite(o->grad_clip))
        return BAD("grad_clip %g must be finite and >= 0 (0 disables clipping)", (double)o->grad_clip);
    if (!(o->min_lr_ratio >= 0.0f && o->min_lr_ratio <= 1.0f))
        return BAD("min_lr_ratio %g is outside [0, 1]", (double)o->min_lr_ratio);
    if (o->schedule == MT_LR_COSINE && o->total_steps == 0) return BAD("a cosine schedule needs total_steps > 0");
    if (o->reserved0) return BAD("mt_optim_config.reserved0 must be zero");
#undef BAD
    return MT_OK;
}

mt_status mt_shape_import(mt_err err, mt_batch_shape *s, const mt_batch_shape *src)
{
    mt_batch_shape_init(s);
    if (!src) return MT_OK;
    mt_status st = mt_copy_in(err, s, sizeof *s, src, MT_FIRST_SIZE_BATCH_SHAPE, "mt_batch_shape");
    if (st) return st;
    if (s->micro_batch_size == 0 || s->seq_len == 0 || s->num_micro_batches == 0)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_batch_shape needs micro_batch_size, seq_len and num_micro_batches > 0 (got %u, %u, %u)",
                       s->micro_batch_size, s->seq_len, s->num_micro_batches);
    if ((uint64_t)s->micro_batch_size * s->seq_len > (1u << 30))
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "a micro-batch of %u x %u tokens is absurd",
                       s->micro_batch_size, s->seq_len);
    return MT_OK;
}

/* ---- learning-rate schedule -------------------------------------------------- */

/* Linear warm-up from lr/warmup to lr over warmup_steps (step 0 gets
 * lr/warmup, as the common `(step+1)/warmup` ramp), then constant or a cosine
 * decay from lr to lr*min_lr_ratio at total_steps, constant after. */
float mt_lr_at(const mt_optim_config *src, uint64_t step)
{
    mt_optim_config o;
    mt_err none = {0};
    if (mt_optim_import(none, &o, src) != MT_OK) return NAN;
    if (step < o.warmup_steps) return o.lr * (float)((double)(step + 1) / (double)o.warmup_steps);
    if (o.schedule == MT_LR_CONSTANT) return o.lr;
    uint64_t decay = o.total_steps > o.warmup_steps ? o.total_steps - o.warmup_steps : 0;
    double progress = decay ? (double)(step - o.warmup_steps) / (double)decay : 1.0;
    if (progress > 1.0) progress = 1.0;
    double floor_lr = (double)o.lr * o.min_lr_ratio;
    double cosv = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
    return (float)(floor_lr + ((double)o.lr - floor_lr) * cosv);
}
