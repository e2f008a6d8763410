#include "engine/plan.h"
#include "engine/backend.h"
#include "device/device.h"
#include "core/sysinfo.h"
#include "model/template.h"

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
        int want = pol->device; /* the largest device index asked for */
        for (uint32_t i = 0; pol->num_devices > 1 && i < pol->num_devices; i++) want = MT_MAX(want, pol->devices[i]);
        if (n > 0 && want >= n)
            snprintf(reason, sizeof reason, "device %d requested, but only %d CUDA device(s) present", want, n);
        if (pol->num_devices > 1 && n <= want)
            return mt_fail(err, MT_ERR_NO_DEVICE, "the policy asks for %u GPUs, but %s", pol->num_devices, reason);
        if (n > want) {
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

uint64_t mt_plan_gpu_free(const mt_offload_policy *pol)
{
    uint64_t least = 0;
    const int n = pol->num_devices > 1 ? (int)pol->num_devices : 1;
    for (int r = 0; r < n; r++) {
        size_t fr = 0, tot = 0;
        if (mt_device_mem_info(n > 1 ? pol->devices[r] : pol->device, &fr, &tot) != 0) return 0;
        if (r == 0 || fr < least) least = fr;
    }
    return least;
}

mt_status mt_plan_compute(mt_err err, mt_memory_plan *p, const mt_be_request *r, int with_shape, mt_backend backend)
{
    char b1[32], b2[32];
    const mt_layout *lo = r->layout;
    const mt_offload_policy *pol = r->pol;
    mt_memory_plan_init(p);
    if (backend == MT_BACKEND_CPU && pol->attention == MT_ATTENTION_CUDNN)
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "mt_offload_policy.attention asks for cuDNN, which the CPU backend does not use");
    p->backend = backend;
    p->num_params = lo->num_params;
    p->num_units = (uint32_t)lo->n_units;
    p->weight_slots = pol->weight_slots;
    p->weight_bytes = lo->weight_bytes;
    p->grad_bytes = lo->grad_bytes;
    p->master_bytes = lo->master_bytes;
    p->optim_bytes = lo->optim_bytes;
    for (int i = 0; i < lo->n_units; i++) p->largest_unit_params = MT_MAX(p->largest_unit_params, lo->units[i].numel);
    p->host_budget_bytes = pol->host_budget_bytes ? pol->host_budget_bytes : mt_sys_mem_available();
    p->gpu_budget_bytes = pol->gpu_budget_bytes;
    mt_be_request req = *r;
    if (backend == MT_BACKEND_CUDA && !req.gpu_free) req.gpu_free = mt_plan_gpu_free(pol);
    if (!p->gpu_budget_bytes) p->gpu_budget_bytes = req.gpu_free;

    /* the backend's own count of what it allocates for the batch shape */
    mt_be_needs n;
    memset(&n, 0, sizeof n);
    n.activations = backend == MT_BACKEND_CPU ? MT_PLACE_HOST : MT_PLACE_DEVICE;
    mt_status fits = MT_OK;
    if (with_shape) {
        const mt_be_class *cls = mt_be_class_of(backend, err);
        if (!cls) return MT_ERR_UNSUPPORTED;
        fits = cls->needs(&req, &n, err);
        if (fits && fits != MT_ERR_GPU_BUDGET) return fits;
        if (req.n_ranks > 1) { /* data parallel: device bytes are each GPU's; the host holds every rank's share */
            n.pinned_bytes *= (uint64_t)req.n_ranks;
            n.host_bytes *= (uint64_t)req.n_ranks;
            n.checkpoint_bytes *= (uint64_t)req.n_ranks;
        }
    }
    p->activations = n.activations;
    p->activation_bytes = n.checkpoint_bytes;
    p->host_checkpoints = (uint32_t)n.host_checkpoints;
    p->recomputed_checkpoints = (uint32_t)n.recomputed;
    p->workspace_bytes = n.device_bytes + n.pinned_bytes + n.host_bytes - n.checkpoint_bytes;
    p->gpu_bytes = n.device_bytes;
    /* the tiles: pinned for a GPU's copies unless the policy says never */
    const int pin = backend == MT_BACKEND_CUDA && pol->pin_host != MT_PIN_NEVER;
    p->host_pinned_bytes = (pin ? lo->tile_bytes : 0) + n.pinned_bytes;
    p->host_pageable_bytes = (pin ? 0 : lo->tile_bytes) + n.host_bytes;

    const uint64_t host = p->host_pinned_bytes + p->host_pageable_bytes;
    if (host > p->host_budget_bytes)
        return mt_fail(err, MT_ERR_HOST_BUDGET,
                       "the model needs %s of host memory (%llu parameters at %.1f bytes each%s), but %s %s",
                       mt_fmt_bytes(b1, sizeof b1, host), (unsigned long long)lo->num_params,
                       (double)lo->tile_bytes / (double)lo->num_params, with_shape ? ", plus activations" : "",
                       pol->host_budget_bytes ? "the policy's host budget is" : "the machine has available only",
                       mt_fmt_bytes(b2, sizeof b2, p->host_budget_bytes));
    if (fits) return fits; /* the backend's GPU budget message stands */
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
        (st = mt_shape_import(err, &shape, shape_in)) || (st = mt_template_check(err, &cfg)))
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
    /* a plan is for training: gradient buffers included */
    /* several GPUs: each plans for its share of the micro-batches */
    const int ranks = pol.num_devices > 1 ? (int)pol.num_devices : 1;
    const mt_be_request r = {.cfg = &cfg,
                             .pol = &pol,
                             .layout = &lo,
                             .shape = {(int)shape.micro_batch_size, (int)shape.seq_len,
                                       mt_rank_share((int)shape.num_micro_batches, ranks), 1},
                             .threads = pol.optimizer_threads ? (int)pol.optimizer_threads : mt_sys_ncpus(),
                             .n_ranks = ranks};
    st = mt_plan_compute(err, &p, &r, shape_in != NULL, backend);
    mt_layout_free(&lo);
    /* a plan that does not fit is still filled; after any other failure *out is untouched */
    if (st == MT_OK || st == MT_ERR_HOST_BUDGET || st == MT_ERR_GPU_BUDGET)
        mt_copy_out(err, out, &p, sizeof p, MT_FIRST_SIZE_MEMORY_PLAN, "mt_memory_plan");
    return st;
}
