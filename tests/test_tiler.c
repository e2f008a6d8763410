/* The host tiler and the memory plan: alignment, block placement, seeded
 * initialisation, and the plan's accounting. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/bf16.h"
#include "model/layout.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "model/runner.h"
#include "core/threadpool.h"

static mt_model_config small_config(int precision, int tied, int bias)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 1000;
    c.hidden_size = 96;
    c.intermediate_size = 200; /* not a multiple of the tensor alignment */
    c.num_hidden_layers = 3;
    c.num_attention_heads = 6;
    c.num_key_value_heads = 2;
    c.precision = (uint32_t)precision;
    c.tie_word_embeddings = (uint32_t)tied;
    c.attention_bias = (uint32_t)bias;
    c.initializer_range = 0.05f;
    return c;
}

static mt_model *make(const mt_model_config *c, int threads)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = (uint32_t)threads;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

static int is_norm(mt_tensor_role r)
{
    return r == MT_T_ATTN_NORM || r == MT_T_MLP_NORM || r == MT_T_FINAL_NORM || r == MT_T_Q_NORM || r == MT_T_K_NORM;
}

Test(tiler, blocks_and_tensors_are_aligned_and_disjoint)
{
    for (int prec = 0; prec <= 1; prec++)
        for (int bias = 0; bias <= 1; bias++) {
            mt_model_config c = small_config(prec, 0, bias);
            mt_model *m = make(&c, 1);
            const mt_layout *lo = &m->layout;
            cr_assert_eq(lo->n_units, 5);
            uint64_t params = 0;
            for (int u = 0; u < lo->n_units; u++) {
                const mt_unit_desc *d = &lo->units[u];
                const mt_tile *t = &m->tiles.tile[u];
                cr_assert_eq((uintptr_t)t->base % 4096, 0, "tile %d is 4 KiB aligned", u);
                cr_assert_eq(d->tile_bytes % 4096, 0);
                uint64_t offs[5] = {d->weight_off, d->grad_off, d->master_off, d->m_off, d->v_off};
                uint64_t lens[5] = {d->weight_bytes, d->grad_bytes, d->padded * 4, d->padded * 4, d->padded * 4};
                for (int b = 0; b < 5; b++) {
                    if (!lens[b]) continue;
                    cr_assert_eq(offs[b] % 4096, 0, "unit %d block %d aligned", u, b);
                    cr_assert_leq(offs[b] + lens[b], d->tile_bytes);
                    for (int b2 = 0; b2 < b; b2++)
                        if (lens[b2]) cr_assert(offs[b] >= offs[b2] + lens[b2] || offs[b2] >= offs[b] + lens[b]);
                }
                cr_assert_eq(d->weight_bytes != 0, prec == MT_PRECISION_BF16, "bf16 mode streams a bf16 copy");
                cr_assert_eq(d->grad_bytes != 0, prec == MT_PRECISION_FP32, "fp32 mode has a gradient block");
                uint64_t end = 0;
                for (int i = 0; i < d->n_tensors; i++) {
                    const mt_tensor_desc *td = &d->tensors[i];
                    cr_assert_eq((td->offset * 2) % 256, 0, "%s starts on 256 bytes in bf16", td->name);
                    cr_assert_geq(td->offset, end, "%s does not overlap its predecessor", td->name);
                    end = td->offset + td->numel;
                    params += td->numel;
                }
                cr_assert_leq(end, d->padded);
            }
            cr_assert_eq(params, lo->num_params);
            cr_assert_eq(params, mt_layout_count_params(&m->cfg));
            cr_assert_eq(lo->units[1].n_tensors, bias ? 12 : 9);
            mt_model_destroy(m);
        }
}

Test(tiler, hugging_face_names)
{
    mt_model_config c = small_config(0, 1, 1);
    mt_model *m = make(&c, 1);
    const mt_layout *lo = &m->layout;
    cr_assert_str_eq(lo->units[0].tensors[0].name, "model.embed_tokens.weight");
    cr_assert_str_eq(lo->units[2].tensors[0].name, "model.layers.1.input_layernorm.weight");
    cr_assert_str_eq(lo->units[2].tensors[4].name, "model.layers.1.self_attn.q_proj.bias");
    cr_assert_str_eq(lo->units[3].tensors[11].name, "model.layers.2.mlp.down_proj.weight");
    cr_assert_eq(lo->units[3].tensors[11].rows, 96);
    cr_assert_eq(lo->units[3].tensors[11].cols, 200);
    cr_assert_eq(lo->units[4].n_tensors, 1, "tied: the head holds only the final norm");
    cr_assert_str_eq(lo->units[4].tensors[0].name, "model.norm.weight");
    mt_model_destroy(m);
}

Test(tiler, initialisation_follows_the_seed_not_the_thread_count)
{
    mt_model_config c = small_config(MT_PRECISION_BF16, 0, 1);
    mt_model *a = make(&c, 1), *b = make(&c, 2);
    c.seed = 2;
    mt_model *d = make(&c, 2);
    for (int u = 0; u < a->layout.n_units; u++) {
        const mt_unit_desc *ud = &a->layout.units[u];
        cr_assert_eq(memcmp(mt_tile_master(&a->tiles.tile[u], ud), mt_tile_master(&b->tiles.tile[u], ud), ud->padded * 4), 0,
                     "unit %d identical for 1 and 2 threads", u);
        cr_assert_neq(memcmp(mt_tile_master(&a->tiles.tile[u], ud), mt_tile_master(&d->tiles.tile[u], ud), ud->padded * 4), 0,
                      "unit %d differs for another seed", u);
    }
    mt_model_destroy(a);
    mt_model_destroy(b);
    mt_model_destroy(d);
}

Test(tiler, initial_values)
{
    mt_model_config c = small_config(MT_PRECISION_BF16, 0, 1);
    mt_model *m = make(&c, 2);
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        const mt_tile *t = &m->tiles.tile[u];
        const float *master = mt_tile_master(t, d), *mm = mt_tile_m(t, d), *vv = mt_tile_v(t, d);
        const uint16_t *w = mt_tile_weights_bf16(t, d);
        for (int i = 0; i < d->n_tensors; i++) {
            const mt_tensor_desc *td = &d->tensors[i];
            double sum = 0, sq = 0;
            for (uint64_t k = 0; k < td->numel; k++) {
                float x = master[td->offset + k];
                cr_assert_eq(w[td->offset + k], mt_f32_to_bf16(x), "bf16 copy is the RNE rounding of the master");
                cr_assert_eq(mm[td->offset + k], 0.0f);
                cr_assert_eq(vv[td->offset + k], 0.0f);
                sum += x;
                sq += (double)x * x;
            }
            if (is_norm(td->role)) {
                cr_assert_eq(sum, (double)td->numel, "%s starts at ones", td->name);
            } else if (td->cols == 1) {
                cr_assert_eq(sq, 0.0, "%s (bias) starts at zero", td->name);
            } else {
                /* N(0, 0.05^2) over >= 9600 samples: the sample std is within 5% of 0.05
                 * (its standard error is 0.05/sqrt(2n) < 0.4%), the mean within 5 standard errors */
                double n = (double)td->numel, mean = sum / n, sd = sqrt(sq / n - mean * mean);
                cr_assert(fabs(sd - 0.05) < 0.05 * 0.05, "%s std %g", td->name, sd);
                cr_assert(fabs(mean) < 5 * 0.05 / sqrt(n), "%s mean %g", td->name, mean);
            }
        }
    }
    mt_model_destroy(m);
}

Test(tiler, plan_accounting)
{
    mt_model_config c = small_config(MT_PRECISION_BF16, 0, 0);
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    mt_memory_plan host_only, with_batch;
    mt_memory_plan_init(&host_only);
    mt_memory_plan_init(&with_batch);
    cr_assert_eq(mt_plan(&host_only, &c, &p, NULL), MT_OK, "%s", mt_last_errmsg());
    mt_batch_shape s;
    mt_batch_shape_init(&s);
    s.micro_batch_size = 4;
    s.seq_len = 256;
    s.num_micro_batches = 3;
    cr_assert_eq(mt_plan(&with_batch, &c, &p, &s), MT_OK, "%s", mt_last_errmsg());
    mt_layout lo;
    mt_model_config resolved;
    cr_assert_eq(mt_config_import((mt_err){0}, &resolved, &c), MT_OK);
    cr_assert_eq(mt_layout_build(&lo, &resolved), 0);
    cr_assert_eq(host_only.num_params, lo.num_params);
    cr_assert_eq(host_only.backend, MT_BACKEND_CPU);
    cr_assert_eq(host_only.host_pinned_bytes, 0, "the CPU backend pins nothing");
    cr_assert_eq(host_only.gpu_bytes, 0);
    cr_assert_eq(host_only.host_pageable_bytes, lo.tile_bytes);
    /* bf16 mode: 2 + 4 + 8 bytes per (padded) parameter, nothing for gradients */
    cr_assert_eq(host_only.grad_bytes, 0);
    cr_assert_eq(host_only.master_bytes, 2 * host_only.weight_bytes);
    cr_assert_eq(host_only.optim_bytes, 2 * host_only.master_bytes);
    cr_assert_eq(with_batch.activation_bytes, (uint64_t)(3 + 1) * 4 * 256 * 96 * 4 * 3,
                 "checkpoints: (layers + 1) x tokens x hidden x fp32 (the CPU backend's type) x micro-batches");
    cr_assert_gt(with_batch.workspace_bytes, 0);
    cr_assert_eq(with_batch.host_pageable_bytes, lo.tile_bytes + with_batch.activation_bytes + with_batch.workspace_bytes);
    mt_layout_free(&lo);

    mt_model_config f = small_config(MT_PRECISION_FP32, 0, 0);
    mt_memory_plan pf;
    mt_memory_plan_init(&pf);
    cr_assert_eq(mt_plan(&pf, &f, &p, NULL), MT_OK);
    cr_assert_eq(pf.weight_bytes, 0, "fp32 mode streams the master weights");
    cr_assert_eq(pf.grad_bytes, pf.master_bytes);
}

/* The MLP pieces (model/runner.h; the CUDA backend caps them at 2 GiB): one
 * piece while the (tokens, F) buffers fit the cap, else equal pieces of a
 * multiple of 128 tokens, each within the cap, no more of them than pieces of
 * the widest aligned size, covering T. */
Test(tiler, mlp_pieces_cover_the_tokens_within_the_cap)
{
    const uint64_t Ts[] = {1, 4096, 16384, 97000, 131072, 262144, 1048576, 1u << 24};
    const uint64_t Fs[] = {200, 11008, 14336, 18944};
    const uint64_t cap = (uint64_t)2 << 30;
    for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++)
        for (size_t j = 0; j < sizeof Fs / sizeof *Fs; j++)
            for (uint64_t es = 2; es <= 4; es += 2) {
                const uint64_t T = Ts[i], row = Fs[j] * es, ft = mt_mlp_piece_tokens(T, Fs[j], es, cap);
                cr_assert(ft >= 1 && ft <= T, "T %llu F %llu: piece %llu", (unsigned long long)T,
                          (unsigned long long)Fs[j], (unsigned long long)ft);
                if (T * row <= cap) {
                    cr_assert_eq(ft, T, "fits whole: one piece");
                    continue;
                }
                /* the most pieces: as many as the largest aligned piece within the cap needs */
                const uint64_t widest = cap / row / 128 * 128;
                const uint64_t pieces = (T + ft - 1) / ft, most = (T + widest - 1) / widest;
                cr_assert(ft % 128 == 0 && ft * row <= cap, "T %llu F %llu es %llu: piece %llu",
                          (unsigned long long)T, (unsigned long long)Fs[j], (unsigned long long)es,
                          (unsigned long long)ft);
                cr_assert(pieces <= most, "T %llu: %llu pieces where %llu would do", (unsigned long long)T,
                          (unsigned long long)pieces, (unsigned long long)most);
            }
}

/* The head's tokens per weight-gradient GEMM (model/runner.h): whole chunks
 * within the byte cap (the CUDA backend's 512 MiB of dlogits: 4 chunks of
 * Qwen3's 441 tokens at vocabulary 151936 in bf16, all of a 7B micro-batch of
 * 16384 tokens in 2 groups), at least one chunk, never past T; a test's count
 * rounded up to whole chunks. */
Test(tiler, head_gradient_groups_are_whole_chunks_within_the_cap)
{
    const uint64_t cap = (uint64_t)512 << 20;
    cr_assert_eq(mt_head_dw_rows(16384, 441, 0, 151936, 2, cap), 4 * 441);
    cr_assert_eq(mt_head_dw_rows(16384, 2097, 0, 32000, 2, cap), 4 * 2097);
    cr_assert_eq(mt_head_dw_rows(16384, 2097, 0, 32000, 4, cap), 2 * 2097, "fp32 dlogits: half as many");
    cr_assert_eq(mt_head_dw_rows(1000, 300, 0, 32000, 2, cap), 1000, "never past T");
    cr_assert_eq(mt_head_dw_rows(16384, 441, 0, 151936, 2, 0), 441, "no cap: one chunk");
    cr_assert_eq(mt_head_dw_rows(16384, 441, 0, 1u << 30, 4, cap), 441, "a chunk past the cap: still one");
    cr_assert_eq(mt_head_dw_rows(58, 5, 15, 37, 4, 0), 15);
    cr_assert_eq(mt_head_dw_rows(58, 5, 16, 37, 4, 0), 20, "a test's count rounded up to whole chunks");
    cr_assert_eq(mt_head_dw_rows(58, 5, 1000, 37, 4, 0), 58);
    for (int T = 1; T < 3000; T += 97)
        for (int chunk = 1; chunk <= T; chunk += 61) {
            const int g = mt_head_dw_rows(T, chunk, 0, 151936, 2, cap);
            cr_assert(g >= chunk && g <= T && (g % chunk == 0 || g == T), "T %d chunk %d: %d", T, chunk, g);
            cr_assert((uint64_t)g * 151936 * 2 <= cap || g == chunk, "T %d chunk %d: %d rows past the cap", T, chunk, g);
        }
}

/* The plan of the CUDA backend counts its buffers as the backend lays them
 * out: a 262144-token sequence of the Llama-2-7B shape (the MLP in three
 * pieces) keeps its checkpoints on a 139 GiB GPU, so the host holds the
 * tiles alone, within 118 GiB. Counting the whole MLP at once in fp32, as
 * the CPU backend does, would send the checkpoints to the host (62 GiB more
 * pinned) and fail the host budget. */
Test(tiler, cuda_plan_of_a_long_sequence)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 32000, c.hidden_size = 4096, c.intermediate_size = 11008, c.num_hidden_layers = 32;
    c.num_attention_heads = 32, c.num_key_value_heads = 32, c.max_position_embeddings = 262144;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.gpu_budget_bytes = (uint64_t)139 << 30;
    p.host_budget_bytes = (uint64_t)118 << 30;
    mt_model_config rc;
    mt_offload_policy rp;
    char msg[MT_ERRMSG_MAX] = "";
    mt_err err = {msg};
    cr_assert_eq(mt_config_import(err, &rc, &c), MT_OK, "%s", msg);
    cr_assert_eq(mt_policy_import(err, &rp, &p), MT_OK, "%s", msg);
    mt_layout lo;
    cr_assert_eq(mt_layout_build(&lo, &rc), 0);
    mt_batch_shape s;
    mt_batch_shape_init(&s);
    s.micro_batch_size = 1, s.seq_len = 262144, s.num_micro_batches = 1;
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    const mt_be_request r = {.cfg = &rc, .pol = &rp, .layout = &lo, .shape = {1, 262144, 1, 1}, .threads = 1, .n_ranks = 1};
#ifndef MT_HAVE_CUDA
    cr_assert_eq(mt_plan_compute(err, &plan, &r, 1, MT_BACKEND_CUDA), MT_ERR_UNSUPPORTED, "%s", msg);
    cr_assert(strstr(msg, "built without CUDA"), "%s", msg);
    mt_layout_free(&lo);
    return;
#endif
    cr_assert_eq(mt_plan_compute(err, &plan, &r, 1, MT_BACKEND_CUDA), MT_OK, "%s", msg);
    cr_assert_eq(plan.activations, MT_PLACE_DEVICE);
    cr_assert_geq(plan.host_pinned_bytes, lo.tile_bytes);
    cr_assert_lt(plan.host_pinned_bytes - lo.tile_bytes, (uint64_t)16 << 20,
                 "the host holds the tiles (and the tokens on their way in) only");
    cr_assert_eq(plan.activation_bytes, (uint64_t)33 * 262144 * 4096 * 2, "33 checkpoints of 2 GiB");
    cr_assert_leq(plan.gpu_bytes, p.gpu_budget_bytes);
    mt_layout_free(&lo);
}

/* ---- thread pool ------------------------------------------------------------ */

typedef struct { int *hits; int threads_seen[8]; } pool_ctx;

static void mark(void *ctx, size_t task, int thread)
{
    pool_ctx *c = ctx;
    __atomic_add_fetch(&c->hits[task], 1, __ATOMIC_RELAXED);
    __atomic_store_n(&c->threads_seen[thread], 1, __ATOMIC_RELAXED);
}

Test(threadpool, every_task_runs_once)
{
    for (int n = 1; n <= 4; n++) {
        mt_pool *p = mt_pool_create(n, NULL);
        cr_assert_not_null(p);
        cr_assert_eq(mt_pool_size(p), n);
        for (int round = 0; round < 50; round++) {
            size_t tasks = (size_t)(round * 7 % 23);
            int hits[23] = {0};
            pool_ctx c = {hits, {0}};
            mt_pool_run(p, tasks, mark, &c);
            for (size_t t = 0; t < 23; t++) cr_assert_eq(hits[t], t < tasks ? 1 : 0);
        }
        mt_pool_destroy(p);
    }
    int hits[5] = {0};
    pool_ctx c = {hits, {0}};
    mt_pool_run(NULL, 5, mark, &c);
    for (int t = 0; t < 5; t++) cr_assert_eq(hits[t], 1);
    mt_pool_destroy(NULL);
}

Test(threadpool, split_range_covers_exactly)
{
    const size_t ns[] = {0, 1, 63, 64, 65, 1000, 4097};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t parts = 1; parts <= 5; parts++) {
            size_t prev = 0;
            for (size_t k = 0; k < parts; k++) {
                size_t lo, hi;
                mt_split_range(ns[i], parts, k, 64, &lo, &hi);
                cr_assert_eq(lo, prev);
                cr_assert_leq(lo, hi);
                if (hi < ns[i]) cr_assert_eq(hi % 64, 0);
                prev = hi;
            }
            cr_assert_eq(prev, ns[i]);
        }
}
