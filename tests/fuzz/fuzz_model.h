/* A tiny model for the targets that load into one (a 2-layer GQA Llama with
 * q/k/v biases on the CPU backend, small enough that its files make short
 * inputs), and a copy of its tiles to check that a load that fails leaves
 * the model as it was. */
#ifndef MT_FUZZ_MODEL_H
#define MT_FUZZ_MODEL_H

#include "fuzz.h"
#include "engine/model.h"

static inline mt_model *fuzz_model_create(mt_precision precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 16;
    c.hidden_size = 8;
    c.intermediate_size = 12;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.attention_bias = 1;
    c.precision = precision;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = 1;
    mt_model *m;
    if (mt_model_create(&m, &c, &p) != MT_OK) {
        fprintf(stderr, "fuzz: cannot create the model: %s\n", mt_last_errmsg());
        abort();
    }
    return m;
}

typedef struct fuzz_snapshot {
    unsigned char *bytes;
    uint64_t step;
} fuzz_snapshot;

static inline fuzz_snapshot fuzz_snapshot_take(const mt_model *m)
{
    uint64_t n = 0;
    for (int i = 0; i < m->tiles.n; i++) n += m->tiles.tile[i].bytes;
    fuzz_snapshot s = {malloc(n), m->step};
    if (!s.bytes) abort();
    uint64_t off = 0;
    for (int i = 0; i < m->tiles.n; off += m->tiles.tile[i].bytes, i++)
        memcpy(s.bytes + off, m->tiles.tile[i].base, m->tiles.tile[i].bytes);
    return s;
}

/* Aborts when the model's tiles or step differ from the snapshot. */
static inline void fuzz_snapshot_check(const fuzz_snapshot *s, const mt_model *m, const char *what)
{
    uint64_t off = 0;
    for (int i = 0; i < m->tiles.n; off += m->tiles.tile[i].bytes, i++)
        if (memcmp(s->bytes + off, m->tiles.tile[i].base, m->tiles.tile[i].bytes)) {
            fprintf(stderr, "%s failed but changed tile %d\n", what, i);
            abort();
        }
    if (m->step != s->step) {
        fprintf(stderr, "%s failed but changed the step count\n", what);
        abort();
    }
}

#endif
