/* The memory plan and the backends' allocations are one count: for several
 * models, batch shapes and budgets, mt_plan says exactly what a step then
 * reserves (the backend records what it allocated, by the code that
 * allocates it), and a budget one byte short of the plan is refused.
 * The CUDA half needs a GPU (with MT_REQUIRE_GPU=1 its absence fails). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "gpu.h"

static mt_model_config config_of(int precision, int tied, int bias, int layers)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.arch = bias ? MT_ARCH_QWEN2 : MT_ARCH_LLAMA;
    c.vocab_size = 301;
    c.hidden_size = 128;
    c.intermediate_size = 200;
    c.num_hidden_layers = (uint32_t)layers;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.attention_bias = (uint32_t)bias;
    c.tie_word_embeddings = (uint32_t)tied;
    c.precision = (uint32_t)precision;
    c.max_position_embeddings = 256;
    return c;
}

static mt_offload_policy policy_of(int backend)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = (uint32_t)backend;
    p.optimizer_threads = 2; /* mt_plan and the model then count the same per-thread scratch */
    p.log_level = MT_LOG_ERROR;
    return p;
}

typedef struct shape {
    int n_seq, seq_len, n_micro;
} shape;

static mt_batch batch_of(const shape *s, int32_t *tok)
{
    const size_t n = (size_t)s->n_micro * s->n_seq * s->seq_len;
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)((i * 37 + 11) % 301);
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = (uint32_t)s->n_seq;
    b.seq_len = (uint32_t)s->seq_len;
    b.num_micro_batches = (uint32_t)s->n_micro;
    b.tokens = tok;
    b.targets = tok;
    return b;
}

static mt_batch_shape plan_shape(const shape *s)
{
    mt_batch_shape bs;
    mt_batch_shape_init(&bs);
    bs.micro_batch_size = (uint32_t)s->n_seq;
    bs.seq_len = (uint32_t)s->seq_len;
    bs.num_micro_batches = (uint32_t)s->n_micro;
    return bs;
}

/* One model, one shape: the plan against what a step reserved. Returns the
 * model (the caller destroys it). */
static mt_model *step_and_compare(const mt_model_config *c, const mt_offload_policy *p, const shape *s,
                                  mt_memory_plan *plan)
{
    const mt_batch_shape bs = plan_shape(s);
    mt_memory_plan_init(plan);
    cr_assert_eq(mt_plan(plan, c, p, &bs), MT_OK, "%s", mt_last_errmsg());
    mt_model *m = NULL;
    mt_status st = mt_model_create(&m, c, p);
    if (st == MT_ERR_NO_DEVICE) MT_GPU_MISSING("%s", mt_last_errmsg());
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    int32_t *tok = malloc((size_t)s->n_micro * s->n_seq * s->seq_len * sizeof *tok);
    mt_batch b = batch_of(s, tok);
    mt_optim_config o;
    mt_optim_config_init(&o);
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
    free(tok);
    const mt_be_needs *h = &m->be->held;
    const char *what = p->backend == MT_BACKEND_CUDA ? "CUDA" : "CPU";
    cr_assert_eq(plan->activation_bytes, h->checkpoint_bytes, "%s %dx%dx%d: checkpoints planned %llu, allocated %llu",
                 what, s->n_micro, s->n_seq, s->seq_len, (unsigned long long)plan->activation_bytes,
                 (unsigned long long)h->checkpoint_bytes);
    cr_assert_eq(plan->activations, (uint32_t)h->activations, "%s: placement", what);
    cr_assert_eq(plan->gpu_bytes, h->device_bytes, "%s %dx%dx%d: device bytes planned %llu, allocated %llu", what,
                 s->n_micro, s->n_seq, s->seq_len, (unsigned long long)plan->gpu_bytes,
                 (unsigned long long)h->device_bytes);
    const uint64_t tiles = m->layout.tile_bytes;
    const uint64_t host = plan->host_pinned_bytes + plan->host_pageable_bytes;
    cr_assert_eq(host, tiles + h->host_bytes + h->pinned_bytes, "%s %dx%dx%d: host bytes planned %llu, allocated %llu",
                 what, s->n_micro, s->n_seq, s->seq_len, (unsigned long long)host,
                 (unsigned long long)(tiles + h->host_bytes + h->pinned_bytes));
    cr_assert_eq(plan->activation_bytes + plan->workspace_bytes, h->host_bytes + h->pinned_bytes + h->device_bytes);
    return m;
}

static const shape SHAPES[] = {{1, 16, 1}, {2, 32, 3}, {3, 64, 2}, {1, 256, 1}};

/* Every precision (lean mode's own gradient block included), tied or not, each
 * shape; under `make memcheck` (valgrind, MT_MEMCHECK set) the two smaller
 * shapes, the same allocations: the four took most of four minutes there. */
Test(backend, cpu_plan_is_the_allocation)
{
    static const mt_precision precisions[3] = {MT_PRECISION_BF16, MT_PRECISION_FP32, MT_PRECISION_LEAN};
    const size_t n_shapes = getenv("MT_MEMCHECK") ? 2 : sizeof SHAPES / sizeof *SHAPES;
    for (int prec = 0; prec < 3; prec++)
        for (int tied = 0; tied < 2; tied++)
            for (size_t i = 0; i < n_shapes; i++) {
                const mt_model_config c = config_of(precisions[prec], tied, tied, 2);
                const mt_offload_policy p = policy_of(MT_BACKEND_CPU);
                mt_memory_plan plan;
                mt_model *m = step_and_compare(&c, &p, &SHAPES[i], &plan);
                cr_assert_eq(plan.host_pinned_bytes, 0);
                cr_assert_eq(m->be->held.activations, MT_PLACE_HOST);
                mt_model_destroy(m);
            }
}

/* A host budget of exactly the plan trains; one byte less is refused with
 * the plan's numbers, and the model is as before. */
Test(backend, cpu_host_budget_is_exact)
{
    const mt_model_config c = config_of(MT_PRECISION_BF16, 0, 0, 3);
    mt_offload_policy p = policy_of(MT_BACKEND_CPU);
    const shape s = {2, 32, 2};
    const mt_batch_shape bs = plan_shape(&s);
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    cr_assert_eq(mt_plan(&plan, &c, &p, &bs), MT_OK, "%s", mt_last_errmsg());
    const uint64_t need = plan.host_pageable_bytes;
    int32_t tok[2 * 2 * 32];
    mt_batch b = batch_of(&s, tok);
    mt_optim_config o;
    mt_optim_config_init(&o);
    for (int short_by = 0; short_by <= 1; short_by++) {
        p.host_budget_bytes = need - (uint64_t)short_by;
        mt_model *m = NULL;
        cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK, "%s", mt_last_errmsg());
        const mt_status st = mt_step(m, &b, &o, NULL);
        if (short_by) {
            cr_assert_eq(st, MT_ERR_HOST_BUDGET, "one byte short: %s", mt_model_errmsg(m));
            cr_assert_eq(m->step, 0, "nothing was trained");
        } else {
            cr_assert_eq(st, MT_OK, "%s", mt_model_errmsg(m));
            cr_assert_eq(m->be->held.host_bytes + m->layout.tile_bytes, need);
        }
        mt_model_destroy(m);
    }
}

/* The CUDA backend: generous budgets keep every layer's activations, tight
 * ones fewer, tighter still send the checkpoints to the host; in each the
 * plan is the allocation. */
Test(backend, cuda_plan_is_the_allocation)
{
    const uint64_t MiB = 1 << 20;
    const uint64_t budgets[] = {8192 * MiB, 0 /* just above the bare need: found below */};
    for (int prec = 0; prec < 2; prec++)
        for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++)
            for (size_t j = 0; j < sizeof budgets / sizeof *budgets; j++)
                for (int place = 0; place < 2; place++) {
                    const mt_model_config c = config_of(prec ? MT_PRECISION_FP32 : MT_PRECISION_BF16, 0, i % 2, 4);
                    mt_offload_policy p = policy_of(MT_BACKEND_CUDA);
                    p.activations = place ? MT_PLACE_HOST : MT_PLACE_AUTO;
                    p.gpu_budget_bytes = budgets[j] ? budgets[j] : 8192 * MiB;
                    if (!budgets[j]) { /* the least that keeps nothing, plus a few layers' worth */
                        p.recompute = MT_RECOMPUTE_FULL;
                        mt_memory_plan bare;
                        mt_memory_plan_init(&bare);
                        const mt_batch_shape bs = plan_shape(&SHAPES[i]);
                        cr_assert_eq(mt_plan(&bare, &c, &p, &bs), MT_OK, "%s", mt_last_errmsg());
                        p.recompute = MT_RECOMPUTE_AUTO;
                        p.gpu_budget_bytes = bare.gpu_bytes + 3 * (uint64_t)SHAPES[i].n_micro * SHAPES[i].n_seq *
                                                                  SHAPES[i].seq_len * c.hidden_size * 4;
                    }
                    mt_memory_plan plan;
                    mt_model *m = step_and_compare(&c, &p, &SHAPES[i], &plan);
                    cr_assert_leq(plan.gpu_bytes, p.gpu_budget_bytes);
                    if (place) cr_assert_eq(plan.activations, MT_PLACE_HOST, "the policy's placement");
                    mt_model_destroy(m);
                }
}

#ifdef MT_HAVE_CUDA
#include "cuda/kernels/attention.h"
#include "cuda/kernels/cudnn_attention.h"

static mt_status plan_of(const mt_model_config *c, const mt_offload_policy *p, const shape *s, mt_memory_plan *out)
{
    mt_memory_plan_init(out);
    const mt_batch_shape bs = plan_shape(s);
    return mt_plan(out, c, p, &bs);
}

/* Without a GPU: a CUDA plan counts cuDNN's attention workspace where cuDNN
 * would run (bf16, cuDNN loadable): the deterministic backward's S x S
 * matrix per head, less without it; a budget that holds the kernels' plan but
 * not cuDNN's backward runs the kernels (AUTO) or is refused (CUDNN);
 * fp32 with CUDNN is refused, naming fp32. */
Test(backend, cuda_plan_counts_cudnn_attention)
{
    const uint64_t MiB = 1 << 20;
    const shape s = {2, 1024, 2};
    mt_model_config c = config_of(MT_PRECISION_BF16, 0, 0, 2);
    c.max_position_embeddings = 1024;
    mt_offload_policy p = policy_of(MT_BACKEND_CUDA);
    p.gpu_budget_bytes = 8192 * MiB;
    p.recompute = MT_RECOMPUTE_FULL; /* nothing kept: the plans differ by the attention alone */
    mt_memory_plan kern, aut, nondet;
    p.attention = MT_ATTENTION_KERNELS;
    cr_assert_eq(plan_of(&c, &p, &s, &kern), MT_OK, "%s", mt_last_errmsg());
    p.attention = MT_ATTENTION_AUTO;
    cr_assert_eq(plan_of(&c, &p, &s, &aut), MT_OK, "%s", mt_last_errmsg());
    p.attention_flags = MT_ATTENTION_NONDETERMINISTIC;
    cr_assert_eq(plan_of(&c, &p, &s, &nondet), MT_OK, "%s", mt_last_errmsg());
    p.attention_flags = 0;
    char why[256] = "";
    const size_t version = mt_cudnn_attn_probe(why, sizeof why);
    const int H = (int)c.num_attention_heads, Hkv = (int)c.num_key_value_heads, D = (int)(c.hidden_size / c.num_attention_heads);
    const size_t kws = mt_cuattn_workspace_bytes(s.n_seq, s.seq_len, H, Hkv, D);
    if (!version) { /* no cuDNN here: AUTO is the kernels, CUDNN is refused with the reason */
        cr_log_info("no cuDNN: %s", why);
        cr_assert_eq(aut.gpu_bytes, kern.gpu_bytes);
        p.attention = MT_ATTENTION_CUDNN;
        mt_memory_plan x;
        cr_assert_eq(plan_of(&c, &p, &s, &x), MT_ERR_UNSUPPORTED);
        return;
    }
    const size_t det = mt_cudnn_attn_backward_workspace_bound(s.n_seq, s.seq_len, H, Hkv, D, 1),
                 nd = mt_cudnn_attn_backward_workspace_bound(s.n_seq, s.seq_len, H, Hkv, D, 0);
    cr_log_info("cuDNN %zu: kernels %llu, cuDNN %llu, non-deterministic %llu bytes", version,
                (unsigned long long)kern.gpu_bytes, (unsigned long long)aut.gpu_bytes, (unsigned long long)nondet.gpu_bytes);
    /* the attention workspace is one buffer, the larger need, 256-byte aligned */
    cr_assert_leq(aut.gpu_bytes - kern.gpu_bytes, det - kws + 256);
    cr_assert_geq(aut.gpu_bytes - kern.gpu_bytes + 256, det - kws);
    cr_assert_leq(nondet.gpu_bytes - kern.gpu_bytes, nd - kws + 256);
    cr_assert_geq(nondet.gpu_bytes - kern.gpu_bytes + 256, nd - kws);
    /* room for the kernels' plan and cuDNN's forward, not its backward */
    p.gpu_budget_bytes = kern.gpu_bytes + mt_cudnn_attn_forward_workspace_bound(s.n_seq, s.seq_len, H, Hkv, D);
    mt_memory_plan tight;
    cr_assert_eq(plan_of(&c, &p, &s, &tight), MT_OK, "%s", mt_last_errmsg());
    cr_assert_leq(tight.gpu_bytes, p.gpu_budget_bytes);
    p.attention = MT_ATTENTION_CUDNN;
    cr_assert_eq(plan_of(&c, &p, &s, &tight), MT_ERR_GPU_BUDGET, "%s", mt_last_errmsg());
    /* fp32: cuDNN's fused attention has none */
    c.precision = MT_PRECISION_FP32;
    p.gpu_budget_bytes = 8192 * MiB;
    cr_assert_eq(plan_of(&c, &p, &s, &tight), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "fp32"), "%s", mt_last_errmsg());
}

/* The policies of the recompute test below: a 16-layer model whose 17
 * checkpoints (rows of 1 MiB: 2 x 1024 tokens of 256 bf16) do not all fit the
 * GPU budget (room for 8); *host_short also has a host budget two rows short
 * of the host checkpoints that leaves. */
static void short_policies(mt_model_config *c, shape *s, mt_offload_policy *roomy, mt_offload_policy *host_short,
                           uint64_t *row)
{
    *c = config_of(MT_PRECISION_BF16, 0, 0, 16);
    c->hidden_size = 256;
    c->max_position_embeddings = 1024;
    *s = (shape){2, 1024, 1};
    mt_offload_policy p = policy_of(MT_BACKEND_CUDA);
    p.attention = MT_ATTENTION_KERNELS; /* the same workspace with or without cuDNN on the machine */
    p.recompute = MT_RECOMPUTE_FULL;
    p.gpu_budget_bytes = (uint64_t)8192 << 20;
    mt_memory_plan all;
    cr_assert_eq(plan_of(c, &p, s, &all), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(all.host_checkpoints + all.recomputed_checkpoints, 0);
    *row = all.activation_bytes / 17;
    cr_assert_eq(*row, (uint64_t)2 * 1024 * 256 * 2);
    p.gpu_budget_bytes = all.gpu_bytes - 9 * *row; /* room for 8 of the 17 checkpoints */
    *roomy = p;
    mt_memory_plan a;
    cr_assert_eq(plan_of(c, &p, s, &a), MT_OK, "%s", mt_last_errmsg());
    p.host_budget_bytes = a.host_pinned_bytes - 2 * *row; /* two host checkpoints short */
    *host_short = p;
}

/* Without a GPU: when the checkpoints fit neither the GPU budget nor, for
 * what that leaves, the host budget, a CUDA plan keeps fewer and the backward
 * recomputes them: the least number that fits both (each one more frees a
 * row but the spare takes one, so a host two rows short needs 3), with the
 * memory of what it keeps; a host budget that holds no checkpoint at all and
 * a GPU that cannot take what is left is refused, naming the host. */
Test(backend, cuda_plan_recomputes_checkpoints_the_host_cannot_take)
{
    mt_model_config c;
    shape s;
    mt_offload_policy roomy, p;
    uint64_t row;
    short_policies(&c, &s, &roomy, &p, &row);
    mt_memory_plan a, b;
    cr_assert_eq(plan_of(&c, &roomy, &s, &a), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(a.recomputed_checkpoints, 0, "a roomy host: nothing recomputed");
    cr_assert_eq(a.host_checkpoints, 9, "%u on the host", a.host_checkpoints);
    cr_assert_eq(plan_of(&c, &p, &s, &b), MT_OK, "%s", mt_last_errmsg());
    cr_log_info("host checkpoints %u -> %u, recomputed %u; GPU %llu of %llu, host %llu of %llu", a.host_checkpoints,
                b.host_checkpoints, b.recomputed_checkpoints, (unsigned long long)b.gpu_bytes,
                (unsigned long long)p.gpu_budget_bytes, (unsigned long long)b.host_pinned_bytes,
                (unsigned long long)p.host_budget_bytes);
    cr_assert_eq(b.recomputed_checkpoints, 3);
    cr_assert_leq(b.host_pinned_bytes + b.host_pageable_bytes, p.host_budget_bytes);
    cr_assert_leq(b.gpu_bytes, p.gpu_budget_bytes);
    /* the rows it holds: L + 1 less the recomputed, plus the spare */
    cr_assert_eq(b.host_checkpoints, 7);
    cr_assert_eq(b.activation_bytes, (17 - 3 + 1) * row);
    /* fewer checkpoints change neither the tiles nor the working set (the spare row aside) */
    cr_assert_eq(b.host_pinned_bytes - b.host_checkpoints * row, a.host_pinned_bytes - a.host_checkpoints * row);
    cr_assert_eq(b.gpu_bytes - (b.activation_bytes - b.host_checkpoints * row),
                 a.gpu_bytes - (a.activation_bytes - a.host_checkpoints * row));
    cr_assert_eq(b.workspace_bytes, a.workspace_bytes);
    /* no host room at all: even 8 recomputed leave 10 rows for room for 8, refused */
    p.host_budget_bytes = a.host_pinned_bytes - a.host_checkpoints * row;
    cr_assert_eq(plan_of(&c, &p, &s, &b), MT_ERR_HOST_BUDGET, "%s", mt_last_errmsg());
    cr_assert(strstr(mt_last_errmsg(), "host memory"), "%s", mt_last_errmsg());
}

/* On the GPU: that plan is what a step reserves, 3 checkpoints recomputed. */
Test(backend, cuda_plan_with_recomputed_checkpoints_is_the_allocation)
{
    mt_model_config c;
    shape s;
    mt_offload_policy roomy, p;
    uint64_t row;
    short_policies(&c, &s, &roomy, &p, &row);
    mt_memory_plan plan;
    mt_model *m = step_and_compare(&c, &p, &s, &plan);
    cr_assert_eq(m->be->held.recomputed, 3);
    cr_assert_eq(m->be->held.host_checkpoints, 7);
    mt_model_destroy(m);
}
#endif
