/* The pieces that the layer templates share (src/model/blocks.c): the
 * working buffers every decoder needs, the embedding and the head, the
 * attention block up to its output projection, and one piece of a gated
 * MLP. A template is its layer's residual structure around these. */
#ifndef MT_MODEL_BLOCKS_H
#define MT_MODEL_BLOCKS_H

#include "model/template.h"

/* The act buffer p advanced by i elements. */
static inline void *mt_at(const mt_dims *d, const void *p, size_t i) { return (char *)p + i * d->es; }

/* The buffers of the Llama layer, embedding and head into out; returns their number. */
int mt_block_work(const mt_dims *d, int want_grad, mt_work_buf *out);

/* The reductions of those pieces (mt_template.reductions), and what kept activations spare them
 * (mt_template.keeps: all but q, k, v with q/k norms, whose backward needs them before the norms). */
int mt_block_reductions(const mt_dims *d, int want_grad, mt_reduction *out);
unsigned mt_block_keeps(const mt_dims *d);

void mt_block_embed_forward(const mt_exec *x, void *const *w, const int32_t *tokens, void *out);
void mt_block_embed_backward(const mt_exec *x, float *gwte, const int32_t *tokens, const float *dy);
void mt_block_head(const mt_exec *x, void *const *w, const void *lm, float *const *gw, float *glm, const void *in,
                   const int32_t *targets, float loss_scale, float *dy);
void mt_block_head_logits(const mt_exec *x, void *const *w, const void *lm, const void *in, float *out);

/* xn1 = rmsnorm(in) with its rstd1, then q, k, v (with q/k norms), RoPE and
 * the attention into a->att and a->lse, skipping in the recompute what the
 * backend says the forward kept (a->qkv_kept, a->att_kept). */
void mt_block_attention(const mt_exec *x, void *const *w, const void *in, int recompute, const mt_layer_acts *a);
/* The attention output as o_proj reads it, (T, d->Qo) act: a->att, or with multi-head latent attention the
 * first Dv of each of its heads, packed into the work buffer attp */
const void *mt_block_attention_out(const mt_exec *x, const mt_layer_acts *a);

/* The backward of the attention block from dya (T, C) act, the gradient of
 * att Wo^T: gradients of Wo, the attention, RoPE, q/k norms and q, k, v
 * (with biases) into gw, and the input norm's input gradient added to dy. */
void mt_block_attention_bwd(const mt_exec *x, void *const *w, float *const *gw, const void *in, const void *dya,
                            float *dy, const mt_layer_acts *a);

/* The roles of a gated MLP's three matrices: the dense layer's, or a shared expert's. */
typedef struct mt_mlp_roles {
    mt_tensor_role gate, up, down;
} mt_mlp_roles;
extern const mt_mlp_roles MT_MLP_DENSE, MT_MLP_SHARED;

/* mt_block_mlp_up and _bwd for the MLP of roles m and width F. The backward of an output scaled by
 * sigmoid(gate_z) (a shared expert's gate; NULL: none) also writes the gradient of gate_z's rows
 * t0 .. t0 + n into gate_dz; accumulate: add the input gradient to dxn's rows rather than
 * overwrite them. */
void mt_block_mlp_up_of(const mt_exec *x, void *const *w, const mt_mlp_roles *m, int F, int t0, int n);
void mt_block_mlp_bwd_of(const mt_exec *x, void *const *w, float *const *gw, const mt_mlp_roles *m, int F,
                         const void *dyp, int t0, int n, const float *gate_z, float *gate_dz, int accumulate);

/* g, u and a = act(g) * u for the n tokens from t0 of xn2: one MLP piece. */
void mt_block_mlp_up(const mt_exec *x, void *const *w, int t0, int n);

/* The piece's backward after mt_block_mlp_up(t0, n), from dyp (n, C) act,
 * the gradient of a Wd^T: the gradients of the three matrices into gw and
 * the input gradient into rows t0 .. t0 + n of dxn (f32, overwritten). */
void mt_block_mlp_bwd(const mt_exec *x, void *const *w, float *const *gw, const void *dyp, int t0, int n);

#endif
