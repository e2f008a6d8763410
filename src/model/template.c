/* Which template a family uses, and binding a unit's tensors. */
#include "model/template.h"

#include <string.h>

const mt_template *mt_template_for(const mt_model_config *cfg)
{
    switch (cfg->arch) {
    case MT_ARCH_LLAMA:
    case MT_ARCH_QWEN2:
    case MT_ARCH_MISTRAL: return &mt_template_llama;
    default: return NULL;
    }
}

void mt_bind_unit(void **w, void *block, const mt_unit_desc *u, size_t es)
{
    memset(w, 0, MT_T_ROLE_COUNT * sizeof *w);
    for (int i = 0; i < u->n_tensors; i++) w[u->tensors[i].role] = (char *)block + u->tensors[i].offset * es;
}

void mt_bind_unit_f32(float **w, float *block, const mt_unit_desc *u)
{
    memset(w, 0, MT_T_ROLE_COUNT * sizeof *w);
    for (int i = 0; i < u->n_tensors; i++) w[u->tensors[i].role] = block + u->tensors[i].offset;
}
