/* Documents packed into sequences (mt_batch.positions): a packed batch gives
 * the loss and gradients of its documents run one by one, on the CPU and on
 * the GPU; positions that do not describe documents are refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "gpu.h"

enum { V = 173, NSEQ = 2, SEQ = 80, N = NSEQ * SEQ };

/* the documents of each sequence: their first tokens (a 1-token document,
 * ones longer than a 64-row attention block, one cut by the end) */
static const int STARTS[NSEQ][5] = {{0, 21, 22, 70, -1}, {0, 7, 75, -1, -1}};

static mt_model_config config_of(int precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.arch = MT_ARCH_QWEN2; /* q/k/v biases too */
    c.vocab_size = V;
    c.hidden_size = 128;
    c.intermediate_size = 160;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.attention_bias = 1;
    c.max_position_embeddings = 128;
    c.precision = (uint32_t)precision;
    c.initializer_range = 0.05f;
    c.seed = 11;
    return c;
}

static mt_model *make(int precision, int backend)
{
    const mt_model_config c = config_of(precision);
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = (uint32_t)backend;
    p.optimizer_threads = 2;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    const mt_status st = mt_model_create(&m, &c, &p);
    if (st == MT_ERR_NO_DEVICE) MT_GPU_MISSING("%s", mt_last_errmsg());
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    return m;
}

typedef struct packed {
    int32_t tok[N], tg[N], pos[N];
    int doc_first[16], doc_len[16], n_docs;
    uint64_t n_targets;
} packed;

static void pack(packed *p)
{
    unsigned s = 5;
    p->n_docs = 0;
    p->n_targets = 0;
    for (int i = 0; i < N; i++) p->tok[i] = (int32_t)((s = s * 1103515245u + 12345u) >> 16) % V;
    for (int q = 0; q < NSEQ; q++)
        for (int d = 0; d < 5 && STARTS[q][d] >= 0; d++) {
            const int a = STARTS[q][d], e = d + 1 < 5 && STARTS[q][d + 1] >= 0 ? STARTS[q][d + 1] : SEQ;
            p->doc_first[p->n_docs] = q * SEQ + a, p->doc_len[p->n_docs++] = e - a;
            for (int i = a; i < e; i++) {
                const int t = q * SEQ + i;
                p->pos[t] = i - a;
                /* the next token of the document; none after its last */
                p->tg[t] = i + 1 < e ? p->tok[t + 1] : MT_IGNORE_INDEX;
                p->n_targets += p->tg[t] != MT_IGNORE_INDEX;
            }
        }
}

/* The packed batch: one micro-batch of NSEQ sequences, with positions. */
static mt_batch batch_of(packed *p)
{
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = NSEQ, b.seq_len = SEQ, b.num_micro_batches = 1;
    b.tokens = p->tok, b.targets = p->tg, b.positions = p->pos;
    return b;
}

/* Every gradient of the model in fp32 (fp32 mode: the tile's gradient block). */
static void add_grads(double *acc, const mt_model *m)
{
    size_t k = 0;
    for (int u = 0; u < m->layout.n_units; u++) {
        const mt_unit_desc *d = &m->layout.units[u];
        const float *g = mt_tile_grad_f32(&m->tiles.tile[u], d);
        for (int i = 0; i < d->n_tensors; i++)
            for (uint64_t e = 0; e < d->tensors[i].numel; e++) acc[k++] += g[d->tensors[i].offset + e];
    }
}

/* The packed batch against its documents one at a time (each with the
 * packed batch's target count, so that the parts sum to the whole), in
 * fp32 on one backend: the same sums in other orders (attention blocks,
 * the accumulation of each weight's gradient over tokens), so the loss
 * agrees to 1e-6 relative and each gradient to 1e-5 of the largest
 * (fp32 unit roundoff 6e-8, times sums of a few hundred terms). */
static void packed_equals_separate(int backend)
{
    packed p;
    pack(&p);
    mt_model *m = make(MT_PRECISION_FP32, backend);
    const size_t np = m->layout.num_params;
    double *whole = calloc(np, sizeof *whole), *parts = calloc(np, sizeof *parts);
    cr_assert(whole && parts);
    mt_batch b = batch_of(&p);
    double loss, norm, loss_parts = 0, n2;
    cr_assert_eq(mt_engine_grads(m, &b, p.n_targets, &loss, &norm, NULL), MT_OK, "%s", mt_model_errmsg(m));
    add_grads(whole, m);
    for (int d = 0; d < p.n_docs; d++) {
        mt_batch one;
        mt_batch_init(&one);
        one.micro_batch_size = 1, one.seq_len = (uint32_t)p.doc_len[d], one.num_micro_batches = 1;
        one.tokens = p.tok + p.doc_first[d], one.targets = p.tg + p.doc_first[d];
        double l;
        cr_assert_eq(mt_engine_grads(m, &one, p.n_targets, &l, &n2, NULL), MT_OK, "%s", mt_model_errmsg(m));
        loss_parts += l;
        add_grads(parts, m);
    }
    cr_assert(fabs(loss - loss_parts) <= 1e-6 * loss, "packed loss %.9g, documents %.9g", loss, loss_parts);
    double big = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < np; i++) big = fmax(big, fabs(whole[i]));
    for (size_t i = 0; i < np; i++)
        if (fabs(whole[i] - parts[i]) > worst) worst = fabs(whole[i] - parts[i]), at = i;
    cr_log_info("packed loss %.9g, documents %.9g; gradients differ by %.3g of the largest (at %zu)", loss, loss_parts,
                worst / big, at);
    cr_assert(big > 0 && worst <= 1e-5 * big, "gradient %zu: packed %.9g, documents %.9g (largest %.3g)", at, whole[at],
              parts[at], big);
    free(whole), free(parts);
    mt_model_destroy(m);
}

Test(documents, packed_equals_separate_cpu) { packed_equals_separate(MT_BACKEND_CPU); }

/* A batch without positions after a packed one of the same shape sees one
 * document a sequence again: its loss and gradient norm are those of a
 * model that never saw positions (the same bits). */
static void unpacked_after_packed(int backend)
{
    packed p;
    pack(&p);
    mt_model *a = make(MT_PRECISION_FP32, backend), *b = make(MT_PRECISION_FP32, backend);
    mt_batch x = batch_of(&p);
    double la, na, lb, nb, l0, n0;
    cr_assert_eq(mt_engine_grads(a, &x, p.n_targets, &l0, &n0, NULL), MT_OK, "%s", mt_model_errmsg(a));
    x.positions = NULL;
    cr_assert_eq(mt_engine_grads(a, &x, p.n_targets, &la, &na, NULL), MT_OK, "%s", mt_model_errmsg(a));
    cr_assert_eq(mt_engine_grads(b, &x, p.n_targets, &lb, &nb, NULL), MT_OK, "%s", mt_model_errmsg(b));
    cr_assert(la == lb && na == nb, "after a packed batch: loss %.17g norm %.17g, fresh: %.17g %.17g", la, na, lb, nb);
    cr_assert(l0 != la, "the packed batch's loss (%.17g) differs from the unpacked one's", l0);
    mt_model_destroy(a);
    mt_model_destroy(b);
}

Test(documents, unpacked_after_packed_cpu) { unpacked_after_packed(MT_BACKEND_CPU); }

#ifdef MT_HAVE_CUDA
Test(documents, packed_equals_separate_cuda) { packed_equals_separate(MT_BACKEND_CUDA); }
Test(documents, unpacked_after_packed_cuda) { unpacked_after_packed(MT_BACKEND_CUDA); }

/* bf16 on the GPU against the CPU on the same packed batch: the bounds of
 * tests/test_cuda_backend.c (bf16 rounding noise; a wrong mask gives errors
 * of order 100%): loss within 1%, gradient norm within 2%. */
Test(documents, packed_bf16_gpu_matches_cpu)
{
    packed p;
    pack(&p);
    mt_model *g = make(MT_PRECISION_BF16, MT_BACKEND_CUDA), *c = make(MT_PRECISION_BF16, MT_BACKEND_CPU);
    mt_batch b = batch_of(&p);
    double lg, ng, lc, nc;
    cr_assert_eq(mt_engine_grads(g, &b, p.n_targets, &lg, &ng, NULL), MT_OK, "%s", mt_model_errmsg(g));
    cr_assert_eq(mt_engine_grads(c, &b, p.n_targets, &lc, &nc, NULL), MT_OK, "%s", mt_model_errmsg(c));
    cr_assert(fabs(lg - lc) <= 1e-2 * lc, "loss %.7f (GPU) vs %.7f (CPU)", lg, lc);
    cr_assert(fabs(ng - nc) <= 2e-2 * nc, "norm %.6f (GPU) vs %.6f (CPU)", ng, nc);
    mt_model_destroy(g);
    mt_model_destroy(c);
}
#endif

/* Positions that do not describe documents: a sequence that does not start
 * one, a jump; each refused with a message naming the entry, the model
 * unchanged (no step taken). */
Test(documents, bad_positions_are_refused)
{
    packed p;
    pack(&p);
    mt_model *m = make(MT_PRECISION_BF16, MT_BACKEND_CPU);
    mt_batch b = batch_of(&p);
    mt_optim_config o;
    mt_optim_config_init(&o);
    p.pos[SEQ] = 3; /* the second sequence's first token */
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "positions[80] is 3"), "%s", mt_model_errmsg(m));
    p.pos[SEQ] = 0;
    p.pos[40] = p.pos[39] + 2;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "positions[40]"), "%s", mt_model_errmsg(m));
    cr_assert_eq(m->step, 0);
    p.pos[40] = p.pos[39] + 1;
    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert_eq(m->step, 1);
    mt_model_destroy(m);
}
