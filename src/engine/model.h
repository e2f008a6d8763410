/* The model handle: configuration, host tiles, the thread pool and the
 * backend state. */
#ifndef MT_MODEL_H
#define MT_MODEL_H

#include "core/internal.h"
#include "model/layout.h"
#include "core/threadpool.h"
#include "memory/tiler.h"
#include "engine/backend.h"
#include "optim/optimizer.h"
#include "engine/timeline.h"

struct mt_model {
    mt_model_config cfg;   /* validated, head_dim resolved */
    mt_offload_policy pol; /* validated */
    mt_backend backend;    /* CPU or CUDA, resolved */
    mt_logger log;
    char errmsg[MT_ERRMSG_MAX];
    mt_layout layout;
    mt_tiles tiles;
    mt_pool *pool;         /* optimizer and CPU-backend threads, created once */
    uint64_t step;         /* optimizer steps taken */
    mt_be *be;             /* created at the first step, evaluation or logits */
    mt_be_shape be_shape;  /* what be is reserved for */
    struct mt_visit *visits; /* the scheduler's visit list and loads (engine.c), sized for this model */
    mt_optimizer opt;      /* AdamW, possibly still running behind the last step */
    uint64_t skipped_logged; /* lean mode: opt.skipped_blocks already reported */
    mt_trace trace;        /* the last step's events (timeline.h) */
    double trace_before;   /* host seconds of that step before the trace's origin */
    double trace_after;    /* and after it */
    int trace_valid;       /* the last step left a whole FULL trace */
    uint32_t mlp_piece_tokens; /* tests: the CUDA backend's MLP tokens per piece (0: its own choice) */
    uint32_t head_chunk_tokens; /* tests: the head's tokens per logits chunk (0: the backend's choice) */
    uint32_t head_dw_tokens;    /* tests: the head's tokens per weight-gradient GEMM (0: the backend's choice) */
    uint32_t keep_layers_cap;  /* tests: at most this many layers keep activations (0: as many as fit) */
    uint32_t host_checkpoints; /* tests: this many activation checkpoints in host memory (0: the backend's rule) */
    uint32_t recomputed_checkpoints; /* tests: this many checkpoints recomputed in the backward (0: the backend's rule) */
    uint32_t expert_gemm;      /* tests and benchmarks: how the CUDA backend runs the experts' backward products
                                * (mt_expert_gemm; 0: its rule by shape) */
    uint64_t host_budget;  /* the host budget of the last reservation: the policy's, or what the machine had
                            * available then beside the tiles */
    char *caller_json;     /* the last mt_checkpoint_load's mt_checkpoint_info.caller_json */
    char *source_dir;      /* the folder of the last mt_model_load: its tokenizer files go with each save */
    int n_ranks;           /* data parallelism: the GPUs of devices (policy.num_devices > 1), else 1 */
    int32_t devices[MT_MAX_DEVICES]; /* the policy's list, copied; pol.devices points here */
    int sim_ranks;         /* tests: the CPU backend as this many ranks of a group (engine/group.c), set before
                            * the first step */
    int force_group;       /* tests: a group even of one rank (on CUDA: NCCL with one GPU) */
};

static inline mt_err mt_model_err(mt_model *m) { return (mt_err){m->errmsg}; }

/* What the backend of model m is asked to hold for shape s (engine/backend.c). */
mt_be_request mt_be_request_of(const mt_model *m, const mt_be_shape *s);

#endif
