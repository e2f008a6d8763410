#include "engine/plan.h"
#include "device/device.h"
#include "core/sysinfo.h"

#include <stdio.h>
#include <string.h>

mt_status mt_resolve_backend(mt_err err, const mt_offload_policy *pol, mt_backend *out, char *why, size_t why_len)
{
    char reason[256] = "";
    if (pol->backend == MT_BACKEND_CPU) {
        snprintf(reason, sizeof reason, "the policy asks for the CPU backend");
        *out = MT_BACKEND_CPU;
    } else {
        int n = mt_device_count(reason, sizeof reason);
        if (n > 0 && pol->device >= n)
            snprintf(reason, sizeof reason, "device %d requested, but only %d CUDA device(s) present", pol->device, n);
        if (n > pol->device) {
            *out = MT_BACKEND_CUDA;
            reason[0] = '\0';
        } else if (pol->backend == MT_BACKEND_CUDA) {
            return mt_fail(err, MT_ERR_NO_DEVICE, "the policy asks for the CUDA backend, but %s", reason);
        } else {
            *out = MT_BACKEND_CPU;
        }
    }
    if (why && why_len) snprintf(why, why_len, "%s", reason);
    return MT_OK;
}

static uint64_t act_bytes(const mt_model_config *c) { return c->precision == MT_PRECISION_FP32 ? 4 : 2; }

uint64_t mt_plan_checkpoint_bytes(const mt_model_config *c, uint64_t T)
{
    /* the input of every layer and of the head */
    return ((uint64_t)c->num_hidden_layers + 1) * T * c->hidden_size * act_bytes(c);
}

uint64_t mt_plan_mlp_piece_tokens(uint64_t T, uint64_t F, uint64_t es)
{
    const uint64_t row = F * es;
    if (T * row <= MT_MLP_PIECE_BYTES) return T;
    for (uint64_t pieces = (T * row + MT_MLP_PIECE_BYTES - 1) / MT_MLP_PIECE_BYTES;; pieces++) {
        const uint64_t ft = MT_MIN(T, ((T + pieces - 1) / pieces + 127) / 128 * 128);
        if (ft * row <= MT_MLP_PIECE_BYTES || ft <= 128) return ft;
    }
}

uint64_t mt_plan_layer_work_bytes(const mt_model_config *c, uint64_t T, uint32_t n_micro, mt_backend backend)
{
    const uint64_t C = c->hidden_size, F = c->intermediate_size, H = c->num_attention_heads;
    const uint64_t q = H * c->head_dim, kv = (uint64_t)c->num_key_value_heads * c->head_dim;
    if (backend == MT_BACKEND_CUDA) {
        /* cuda_backend.cu, layout_buffers(): in activation precision the
         * normed inputs, residual, output scratch and output gradient (5C),
         * q and the attention output and their gradients (4q), k, v and
         * theirs (4kv), and one MLP piece's gate, up, activation and their
         * gradients (6F); in fp32 the log-sum-exp and the attention
         * backward's workspace (2H), two norm scales, the normed inputs'
         * gradient (C) and the residual stream's gradient of every
         * micro-batch (n_micro C). */
        const uint64_t es = act_bytes(c), FT = mt_plan_mlp_piece_tokens(T, F, es);
        return es * (T * (5 * C + 4 * q + 4 * kv) + 6 * FT * F) + 4 * T * (2 * H + 2 + C + (uint64_t)n_micro * C);
    }
    /* Saved while one layer's forward is recomputed and differentiated:
     * normed inputs (2C), q k v (q + 2kv), attention output (q), residual (C),
     * gate, up, activation (3F); their gradients need about as much again,
     * with one live at a time per branch (C + q + 2kv + 2F). Kept in fp32. */
    uint64_t saved = 3 * C + 2 * q + 2 * kv + 3 * F;
    uint64_t grads = 2 * C + q + 2 * kv + 2 * F;
    uint64_t lse = H; /* per token */
    return T * (saved + grads + lse) * 4;
}

/* The CPU backend computes the logits in chunks of this many tokens, so the
 * head never holds a T x V tensor. */
#define HEAD_CHUNK_TOKENS 1024

mt_status mt_plan_compute(mt_err err, mt_memory_plan *p, const mt_model_config *cfg, const mt_offload_policy *pol,
                          const mt_batch_shape *shape, mt_backend backend, const mt_layout *lo)
{
    char b1[32], b2[32];
    mt_memory_plan_init(p);
    p->backend = backend;
    p->num_params = lo->num_params;
    p->num_units = (uint32_t)lo->n_units;
    p->weight_slots = pol->weight_slots;
    p->weight_bytes = lo->weight_bytes;
    p->grad_bytes = lo->grad_bytes;
    p->master_bytes = lo->master_bytes;
    p->optim_bytes = lo->optim_bytes;
    for (int i = 0; i < lo->n_units; i++) p->largest_unit_params = MT_MAX(p->largest_unit_params, lo->units[i].numel);

    const uint64_t slot_elem = cfg->precision == MT_PRECISION_FP32 ? 4 : 2;
    uint64_t workspace = 0, checkpoints = 0;
    if (shape) {
        const uint64_t T = (uint64_t)shape->micro_batch_size * shape->seq_len;
        checkpoints = mt_plan_checkpoint_bytes(cfg, T) * shape->num_micro_batches;
        /* a logits chunk in fp32, and on the GPU its gradient in activation precision */
        const uint64_t chunk = backend == MT_BACKEND_CUDA
                                   ? MT_MIN(T, MT_MAX(1, MT_LOGITS_CHUNK_BYTES / ((uint64_t)cfg->vocab_size * 4)))
                                   : MT_MIN(T, HEAD_CHUNK_TOKENS);
        workspace = (uint64_t)pol->weight_slots * lo->largest_unit_padded * slot_elem /* weight slots */
                  + 2 * lo->largest_unit_padded * 4                                  /* fp32 gradient accumulators */
                  + (backend == MT_BACKEND_CUDA && slot_elem == 2 ? 2 * lo->largest_unit_padded * 2 : 0) /* bf16 staging */
                  + mt_plan_layer_work_bytes(cfg, T, shape->num_micro_batches, backend)
                  + chunk * cfg->vocab_size * (backend == MT_BACKEND_CUDA ? 4 + slot_elem : 4);
    }
    p->activation_bytes = checkpoints;
    p->workspace_bytes = workspace;

    uint64_t gpu_budget = pol->gpu_budget_bytes;
    if (backend == MT_BACKEND_CUDA && gpu_budget == 0) {
        size_t fr = 0, tot = 0;
        if (mt_device_mem_info(pol->device, &fr, &tot) == 0) gpu_budget = fr;
    }
    p->gpu_budget_bytes = gpu_budget;
    p->host_budget_bytes = pol->host_budget_bytes ? pol->host_budget_bytes : mt_sys_mem_available();

    if (backend == MT_BACKEND_CPU) {
        /* The CPU backend's "device" is host memory too. */
        p->activations = MT_PLACE_HOST;
        p->host_pageable_bytes = lo->tile_bytes + workspace + checkpoints;
    } else {
        /* checkpoints on the device, or all but the last two units' in pinned
         * host memory with two device rows to stage them (cuda_backend.cu) */
        const uint64_t per_unit = checkpoints / ((uint64_t)cfg->num_hidden_layers + 1);
        int on_device = pol->activations == MT_PLACE_DEVICE || cfg->num_hidden_layers < 2 ||
                        (pol->activations == MT_PLACE_AUTO && workspace + checkpoints <= gpu_budget);
        p->activations = on_device ? MT_PLACE_DEVICE : MT_PLACE_HOST;
        const int pin = pol->pin_host != MT_PIN_NEVER;
        p->host_pinned_bytes =
            (pin ? lo->tile_bytes : 0) + (on_device ? 0 : per_unit * ((uint64_t)cfg->num_hidden_layers - 1));
        p->host_pageable_bytes = pin ? 0 : lo->tile_bytes;
        p->gpu_bytes = workspace + (on_device ? checkpoints : 2 * per_unit);
    }

    const uint64_t host = p->host_pinned_bytes + p->host_pageable_bytes;
    if (host > p->host_budget_bytes)
        return mt_fail(err, MT_ERR_HOST_BUDGET,
                       "the model needs %s of host memory (%llu parameters at %.1f bytes each%s), but %s %s",
                       mt_fmt_bytes(b1, sizeof b1, host), (unsigned long long)lo->num_params,
                       (double)lo->tile_bytes / (double)lo->num_params, shape ? ", plus activations" : "",
                       pol->host_budget_bytes ? "the policy's host budget is" : "the machine has available only",
                       mt_fmt_bytes(b2, sizeof b2, p->host_budget_bytes));
    if (backend == MT_BACKEND_CUDA && p->gpu_bytes > gpu_budget)
        return mt_fail(err, MT_ERR_GPU_BUDGET, "the plan needs %s of GPU memory, but the %s is %s",
                       mt_fmt_bytes(b1, sizeof b1, p->gpu_bytes),
                       pol->gpu_budget_bytes ? "policy's GPU budget" : "device's free memory",
                       mt_fmt_bytes(b2, sizeof b2, gpu_budget));
    return MT_OK;
}

mt_status mt_plan(mt_memory_plan *out, const mt_model_config *cfg_in, const mt_offload_policy *pol_in,
                  const mt_batch_shape *shape_in)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_plan: out is NULL");
    mt_model_config cfg;
    mt_offload_policy pol;
    mt_batch_shape shape;
    mt_status st;
    uint32_t out_size;
    memcpy(&out_size, out, sizeof out_size);
    if (out_size < MT_FIRST_SIZE_MEMORY_PLAN)
        return mt_fail(err, MT_ERR_STRUCT_SIZE, "mt_memory_plan.struct_size is %u, but the smallest accepted is %d: "
                       "initialise it with mt_memory_plan_init()", out_size, MT_FIRST_SIZE_MEMORY_PLAN);
    if ((st = mt_config_import(err, &cfg, cfg_in)) || (st = mt_policy_import(err, &pol, pol_in)) ||
        (st = mt_shape_import(err, &shape, shape_in)))
        return st;
    /* A plan is arithmetic: asked for the CUDA backend with a GPU budget, it
     * plans for that GPU whether or not this machine has one. */
    mt_backend backend = MT_BACKEND_CUDA;
    if (!(pol.backend == MT_BACKEND_CUDA && pol.gpu_budget_bytes) &&
        (st = mt_resolve_backend(err, &pol, &backend, NULL, 0)))
        return st;
    mt_layout lo;
    if (mt_layout_build(&lo, &cfg)) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of memory for the layout");
    mt_memory_plan p;
    st = mt_plan_compute(err, &p, &cfg, &pol, shape_in ? &shape : NULL, backend, &lo);
    mt_layout_free(&lo);
    mt_copy_out(err, out, &p, sizeof p, MT_FIRST_SIZE_MEMORY_PLAN, "mt_memory_plan");
    return st;
}
