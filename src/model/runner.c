/* The unit runner (runner.h). */
#include "model/runner.h"

#include <string.h>

mt_status mt_runner_init(mt_runner *r, const mt_model_config *cfg, const mt_layout *layout, const mt_kernels *k,
                         void *kc, int n_seq, int seq_len, int n_micro, const char *backend, mt_err err)
{
    memset(r, 0, sizeof *r);
    r->tpl = mt_template_for(cfg);
    if (!r->tpl) return mt_fail(err, MT_ERR_UNSUPPORTED, "the %s backend has no layer template for this architecture",
                                backend);
    r->cfg = cfg, r->layout = layout, r->k = k, r->kc = kc;
    mt_dims_init(&r->d, cfg, n_seq, seq_len);
    r->d.n_micro = n_micro;
    return MT_OK;
}

int mt_runner_buffers(mt_runner *r, int want_grad, mt_runner_buf *out)
{
    mt_work_buf wb[MT_WORK_MAX_BUFS];
    const int n = r->tpl->work(&r->d, want_grad, wb);
    for (int i = 0; i < n; i++) out[i] = (mt_runner_buf){(void **)((char *)&r->work + wb[i].field), wb[i].elems, wb[i].f32};
    r->state_elems = r->tpl->state_elems ? r->tpl->state_elems(&r->d) : 0;
    if (!r->state_elems) return n;
    out[n] = (mt_runner_buf){(void **)&r->state, (uint64_t)r->d.n_micro * r->state_elems, 1};
    return n + 1;
}

uint64_t mt_runner_state_bytes(const mt_runner *r) { return (uint64_t)r->d.n_micro * r->state_elems * sizeof(float); }

size_t mt_runner_scratch_bytes(const mt_runner *r, int want_grad)
{
    if (!r->k->scratch_bytes || !r->tpl->reductions) return 0;
    mt_reduction red[MT_MAX_REDUCTIONS];
    const int n = r->tpl->reductions(&r->d, want_grad, red);
    size_t most = 0;
    for (int i = 0; i < n; i++) most = MT_MAX(most, r->k->scratch_bytes(&red[i]));
    return most;
}

unsigned mt_runner_keeps(const mt_runner *r) { return r->tpl->keeps ? r->tpl->keeps(&r->d) : 0u; }

mt_layer_acts mt_runner_acts(const mt_runner *r, int unit)
{
    const mt_work *w = &r->work.base;
    const int l = unit - 1;
    return (mt_layer_acts){w->att, w->lse, w->h, 0, 0, w->q, w->k, w->v, 0,
                           mt_config_layer_window(r->cfg, l, r->d.seq_len), mt_config_layer_local_rope(r->cfg, l), l,
                           mt_config_layer_nope(r->cfg, l)};
}

/* What the template runs on for micro-batch mb. */
static mt_exec exec_of(const mt_runner *r, int mb)
{
    float *state = r->state ? r->state + (size_t)mb * r->state_elems : NULL;
    return (mt_exec){r->k, r->kc, &r->d, &r->work.base, state};
}

static const mt_unit_desc *unit_of(const mt_runner *r, int unit) { return &r->layout->units[unit]; }

void mt_run_forward(const mt_runner *r, int unit, int mb, const mt_unit_io *io)
{
    const mt_exec x = exec_of(r, mb);
    void *w[MT_T_ROLE_COUNT];
    mt_bind_unit(w, io->slot, unit_of(r, unit), r->d.es);
    if (unit == 0) r->tpl->embed_forward(&x, w, io->tokens, io->out);
    else r->tpl->layer_forward(&x, w, io->in, io->out, io->acts);
}

void mt_run_backward(const mt_runner *r, int unit, int mb, const mt_unit_io *io)
{
    const mt_exec x = exec_of(r, mb);
    if (unit == 0) { /* the embedding's backward needs no weights; tied, its gradients have their own buffer */
        r->tpl->embed_backward(&x, io->tied_grads ? io->tied_grads : io->grads, io->tokens, io->dy);
        return;
    }
    void *w[MT_T_ROLE_COUNT];
    float *gw[MT_T_ROLE_COUNT];
    mt_bind_unit(w, io->slot, unit_of(r, unit), r->d.es);
    mt_bind_unit_f32(gw, io->grads, unit_of(r, unit));
    r->tpl->layer_forward(&x, w, io->in, NULL, io->acts);
    r->tpl->layer_backward(&x, w, gw, io->in, io->dy, io->acts);
}

/* The head's weights, and the LM matrix: its own or, tied, the embedding's
 * (loaded behind the head's block). */
static const void *bind_head(const mt_runner *r, void *slot, void **w)
{
    const mt_unit_desc *u = unit_of(r, r->layout->n_units - 1);
    mt_bind_unit(w, slot, u, r->d.es);
    return r->cfg->tie_word_embeddings ? (const void *)((char *)slot + u->padded * r->d.es) : w[MT_T_LM_HEAD];
}

void mt_run_head(const mt_runner *r, int mb, const mt_unit_io *io, float loss_scale)
{
    const mt_exec x = exec_of(r, mb);
    void *w[MT_T_ROLE_COUNT];
    float *gw[MT_T_ROLE_COUNT];
    const void *lm = bind_head(r, io->slot, w);
    float *glm = NULL;
    memset(gw, 0, sizeof gw);
    if (io->grads) {
        mt_bind_unit_f32(gw, io->grads, unit_of(r, r->layout->n_units - 1));
        glm = io->tied_grads ? io->tied_grads : gw[MT_T_LM_HEAD];
    }
    r->tpl->head(&x, w, lm, gw, glm, io->in, io->targets, loss_scale, io->grads ? io->dy : NULL);
}

void mt_run_head_logits(const mt_runner *r, int mb, const mt_unit_io *io, float *out)
{
    const mt_exec x = exec_of(r, mb);
    void *w[MT_T_ROLE_COUNT];
    const void *lm = bind_head(r, io->slot, w);
    r->tpl->head_logits(&x, w, lm, io->in, out);
}

int mt_head_dw_rows(int T, int chunk, uint64_t want, uint64_t V, uint64_t es, uint64_t max_bytes)
{
    const uint64_t c = (uint64_t)MT_MAX(chunk, 1);
    uint64_t n = want ? (want + c - 1) / c : max_bytes / (c * MT_MAX(V, (uint64_t)1) * MT_MAX(es, (uint64_t)1));
    n = MT_MAX(n, (uint64_t)1);
    return (int)MT_MIN((uint64_t)MT_MAX(T, 1), n * c);
}

uint64_t mt_mlp_piece_tokens(uint64_t T, uint64_t F, uint64_t es, uint64_t max_bytes)
{
    const uint64_t row = F * es;
    if (T * row <= max_bytes) return T;
    for (uint64_t pieces = (T * row + max_bytes - 1) / max_bytes;; pieces++) {
        const uint64_t ft = MT_MIN(T, ((T + pieces - 1) / pieces + 127) / 128 * 128);
        if (ft * row <= max_bytes || ft <= 128) return ft;
    }
}
