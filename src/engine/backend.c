/* The backend factory: which classes this library has, and a model's request. */
#include "engine/backend.h"
#include "engine/model.h"

const mt_be_class *mt_be_class_of(mt_backend kind, mt_err err)
{
    switch (kind) {
    case MT_BACKEND_CPU: return &mt_cpu_be_class;
    case MT_BACKEND_CUDA:
#ifdef MT_HAVE_CUDA
        return &mt_cuda_be_class;
#else
        mt_fail(err, MT_ERR_UNSUPPORTED, "this library was built without CUDA: it has no CUDA backend to plan for or run");
        return NULL;
#endif
    default: mt_fail(err, MT_ERR_INVALID_ARGUMENT, "no backend of kind %d", (int)kind); return NULL;
    }
}

mt_be_request mt_be_request_of(const mt_model *m, const mt_be_shape *s)
{
    const mt_be_request r = {.cfg = &m->cfg,
                             .pol = &m->pol,
                             .layout = &m->layout,
                             .shape = *s,
                             .threads = mt_pool_size(m->pool),
                             .mlp_piece_tokens = m->mlp_piece_tokens,
                             .head_chunk_tokens = m->head_chunk_tokens,
                             .head_dw_tokens = m->head_dw_tokens,
                             .keep_layers_cap = m->keep_layers_cap,
                             .host_checkpoints = m->host_checkpoints,
                             .recomputed_checkpoints = m->recomputed_checkpoints,
                             .expert_gemm = m->expert_gemm,
                             .host_budget = m->host_budget,
                             .n_ranks = 1,
                             .tiles = &m->tiles,
                             .log = &m->log,
                             .pool = m->pool};
    return r;
}
