/* Creating and destroying models: plan, allocate, initialise. */
#include "engine/model.h"
#include "core/bf16.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "core/rng.h"
#include "core/sysinfo.h"
#include "model/template.h"
#include "optim/q16.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- weight initialisation ------------------------------------------------- */

#define INIT_CHUNK (1u << 20) /* elements per parallel task: whole blocks of the lean mode's weight codes */
_Static_assert(INIT_CHUNK % MT_Q16_BLOCK == 0, "an initialisation task encodes whole blocks");

typedef struct init_job {
    const mt_model_config *cfg;
    const mt_unit_desc *unit;
    const mt_tile *tile;
    uint64_t stream_base; /* distinct per unit */
    size_t n_tasks;
    size_t task_tensor[MT_MAX_UNIT_TENSORS + 1]; /* first task of each tensor */
} init_job;

/* Matrices ~ N(0, initializer_range), norms 1 (Gemma's 0), biases and
 * DeepSeek-V3's e_score_correction_bias 0, and
 * the embedding's padding row (pad_token_id) 0, as transformers'
 * _init_weights does. */
static void init_task(void *ctx, size_t task, int thread)
{
    (void)thread;
    const init_job *j = ctx;
    int ti = 0;
    while (j->task_tensor[ti + 1] <= task) ti++;
    const mt_tensor_desc *t = &j->unit->tensors[ti];
    uint64_t lo = (uint64_t)(task - j->task_tensor[ti]) * INIT_CHUNK, hi = MT_MIN(lo + INIT_CHUNK, t->numel);
    float *master = mt_tile_master(j->tile, j->unit); /* NULL in lean mode */
    uint16_t *w = mt_tile_weights_bf16(j->tile, j->unit); /* NULL in fp32 and lean modes */
    const int is_norm = mt_role_is_norm(t->role), is_bias = mt_role_is_bias(t->role) || mt_role_is_frozen(t->role);
    const int pad = t->role == MT_T_EMBED ? j->cfg->pad_token_id : -1; /* -1: none */
    const uint64_t pad_lo = pad >= 0 ? (uint64_t)pad * j->cfg->hidden_size : 0;
    const uint64_t pad_hi = pad >= 0 ? pad_lo + j->cfg->hidden_size : 0;
    const double std = j->cfg->initializer_range;
    const float norm = mt_family_norm_init(mt_config_family(j->cfg)); /* Gemma's norms scale by 1 + w */
    float x[MT_Q16_BLOCK];
    for (uint64_t b = lo; b < hi; b += MT_Q16_BLOCK) { /* lean mode's tensors start at a block */
        const size_t n = (size_t)MT_MIN((uint64_t)MT_Q16_BLOCK, hi - b);
        for (size_t i = 0; i < n; i++)
            x[i] = is_norm ? norm : is_bias ? 0.0f
                 : b + i >= pad_lo && b + i < pad_hi ? 0.0f
                 : (float)(std * mt_rng_normal(j->cfg->seed, j->stream_base + (uint64_t)ti, b + i));
        const uint64_t e = t->offset + b;
        if (master) memcpy(master + e, x, n * sizeof *x);
        for (size_t i = 0; w && i < n; i++) w[e + i] = mt_f32_to_bf16(x[i]);
        if (j->unit->lean) /* finite values: it cannot fail */
            mt_q16_encode(x, n, mt_tile_wq(j->tile, j->unit) + e, mt_tile_sw(j->tile, j->unit) + e / MT_Q16_BLOCK);
    }
}

static void init_weights(mt_model *m)
{
    for (int u = 0; u < m->layout.n_units; u++) {
        init_job j = {.cfg = &m->cfg, .unit = &m->layout.units[u], .tile = &m->tiles.tile[u],
                      .stream_base = (uint64_t)u * 64};
        for (int t = 0; t < j.unit->n_tensors; t++) {
            j.task_tensor[t] = j.n_tasks;
            j.n_tasks += (j.unit->tensors[t].numel + INIT_CHUNK - 1) / INIT_CHUNK;
        }
        j.task_tensor[j.unit->n_tensors] = j.n_tasks;
        mt_pool_run(m->pool, j.n_tasks, init_task, &j);
    }
}

/* ---- create / destroy ------------------------------------------------------------ */

static int pool_threads(const mt_offload_policy *pol, int node, int *cpus, int max)
{
    int n = mt_sys_node_cpus(node, cpus, max);
    if (pol->optimizer_threads && (int)pol->optimizer_threads < n) n = (int)pol->optimizer_threads;
    return n;
}

mt_status mt_model_create(mt_model **out, const mt_model_config *cfg, const mt_offload_policy *pol)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_model_create: out is NULL");
    *out = NULL;
    mt_model *m = calloc(1, sizeof *m);
    if (!m) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the model handle");
    mt_optimizer_init(&m->opt);
    mt_status st;
    char why[256], b1[32];
    if ((st = mt_config_import(err, &m->cfg, cfg)) || (st = mt_policy_import(err, &m->pol, pol)) ||
        (st = mt_template_check(err, &m->cfg)))
        goto fail;
    m->log = (mt_logger){m->pol.log_callback, m->pol.log_user_data, (mt_log_level)m->pol.log_level};
    m->n_ranks = 1;
    if (m->pol.num_devices > 1) { /* the caller's list is read only here */
        memcpy(m->devices, m->pol.devices, m->pol.num_devices * sizeof *m->devices);
        m->pol.devices = m->devices;
        m->n_ranks = (int)m->pol.num_devices;
    }
    if ((st = mt_resolve_backend(err, &m->pol, &m->backend, why, sizeof why))) goto fail;
    if (m->backend == MT_BACKEND_CUDA) {
        char name[128];
        mt_device_name(m->pol.device, name, sizeof name);
        if (m->n_ranks > 1) {
            char list[256] = "";
            for (int r = 0, k = 0; r < m->n_ranks && k < (int)sizeof list - 12; r++)
                k += snprintf(list + k, sizeof list - (size_t)k, "%s%d", r ? ", " : "", m->devices[r]);
            mt_log(&m->log, MT_LOG_INFO, "backend: CUDA on %d devices (%s), data parallel; device %d: %s", m->n_ranks,
                   list, m->pol.device, name);
        } else {
            mt_log(&m->log, MT_LOG_INFO, "backend: CUDA on device %d, %s", m->pol.device, name);
        }
    } else {
        mt_log(&m->log, MT_LOG_INFO, "backend: CPU (%s)", why);
    }

    if (mt_layout_build(&m->layout, &m->cfg)) {
        st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the model layout");
        goto fail;
    }
    mt_memory_plan plan;
    const mt_be_request host_only = {.cfg = &m->cfg, .pol = &m->pol, .layout = &m->layout, .n_ranks = 1};
    if ((st = mt_plan_compute(err, &plan, &host_only, 0, m->backend))) goto fail;

    int node = m->pol.numa_node;
    if (node < 0 && m->backend == MT_BACKEND_CUDA) node = mt_device_numa_node(m->pol.device);
    int cpus[1024];
    int nthreads = pool_threads(&m->pol, node, cpus, 1024);
    m->pool = mt_pool_create(nthreads, cpus);
    if (!m->pool) {
        st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "cannot start %d optimizer threads", nthreads);
        goto fail;
    }
    if ((st = mt_tiles_map(&m->tiles, &m->layout, node, err))) goto fail;
    mt_optimizer_bind(&m->opt, m->pool, &m->layout, &m->tiles, m->cfg.seed);
    init_weights(m);
    const int pin = m->pol.pin_host == MT_PIN_ALWAYS || (m->pol.pin_host == MT_PIN_AUTO && m->backend == MT_BACKEND_CUDA);
    if (pin && (st = mt_tiles_pin(&m->tiles, m->pol.pin_host == MT_PIN_ALWAYS, &m->log, err))) goto fail;
    mt_log(&m->log, MT_LOG_INFO, "model: %llu parameters in %d units, %s of host tiles (%s%s), %d threads",
           (unsigned long long)m->layout.num_params, m->layout.n_units,
           mt_fmt_bytes(b1, sizeof b1, m->layout.tile_bytes), m->tiles.pinned ? "pinned" : "pageable",
           m->tiles.numa_node >= 0 ? ", NUMA-bound" : "", mt_pool_size(m->pool));
    *out = m;
    return MT_OK;
fail:
    mt_model_destroy(m);
    return st;
}

void mt_model_destroy(mt_model *m)
{
    if (!m) return;
    mt_optimizer_fini(&m->opt);
    mt_engine_fini(m);
    mt_tiles_free(&m->tiles);
    mt_pool_destroy(m->pool);
    mt_layout_free(&m->layout);
    free(m->caller_json);
    free(m->source_dir);
    free(m);
}

const char *mt_model_errmsg(const mt_model *m) { return m ? m->errmsg : "model is NULL"; }

mt_status mt_model_get_config(const mt_model *m, mt_model_config *out)
{
    if (!m) return MT_ERR_INVALID_ARGUMENT;
    mt_model *mm = (mt_model *)m; /* only its message buffer changes */
    return mt_copy_out(mt_model_err(mm), out, &m->cfg, sizeof m->cfg, MT_FIRST_SIZE_MODEL_CONFIG, "mt_model_config");
}

uint64_t mt_model_num_params(const mt_model *m) { return m ? m->layout.num_params : 0; }

mt_backend mt_model_backend(const mt_model *m) { return m ? m->backend : MT_BACKEND_CPU; }
