/* Model folders and checkpoints share these: the tensor lists of a model in
 * safetensors terms, and config.json. */
#ifndef MT_HF_H
#define MT_HF_H

#include "core/internal.h"
#include "core/threadpool.h"
#include "model/layout.h"
#include "memory/tiler.h"
#include "io/safetensors.h"

/* A model as its files (folders and checkpoints) read and write it: the
 * fields of the engine's model handle they need, which only src/engine
 * sees (src/engine/files.c makes one of a model and keeps what a load
 * changed). source_dir and caller_json are the model's, malloc'ed: a load
 * frees the old string and leaves a new one. */
typedef struct mt_model_files {
    const mt_model_config *cfg;
    const mt_layout *layout;
    const mt_tiles *tiles;
    mt_pool *pool;
    uint64_t step;     /* optimizer steps taken */
    uint64_t seed;     /* lean mode: the stochastic rounding's seed */
    char *source_dir;  /* the folder of the last mt_model_load, or NULL */
    char *caller_json; /* the last checkpoint load's caller members, or NULL */
} mt_model_files;

/* 1 for norms and biases, 2 for matrices: the shape transformers uses. */
int mt_tensor_ndim(const mt_tensor_desc *t);
size_t mt_tensor_count(const mt_model_files *m);
/* config.json text of cfg (cJSON_free it), with the token ids (bos, eos, pad) of source_dir's
 * config.json when the model came from a folder (source_dir non-NULL). */
char *mt_config_json_text(const mt_model_config *cfg, const char *source_dir);
/* Writes dir/config.json durably. */
mt_status mt_write_config(mt_err err, const mt_model_config *cfg, const char *source_dir, const char *dir);

/* which: 0 the master weights (HF names), 1 AdamW m ("<name>.exp_avg"),
 * 2 AdamW v ("<name>.exp_avg_sq"). Tensors fused in the checkpoint are one
 * request of several parts; *count gets the number of requests. */
mt_st_write_req *mt_tensor_write_list(const mt_model_files *m, int which, int dtype, char (*names)[128], size_t *count);
mt_status mt_save_tensors(mt_err err, const mt_model_files *m, const char *path, int which, int dtype);
/* Validates that s holds every tensor of the kinds which[0..n_which) with its
 * exact shape and nothing else, then (unless dry_run) converts them into the
 * tiles (and, with write_bf16, the weights' bf16 copies). Nothing is written
 * when validation fails. */
mt_status mt_load_tensors(mt_err err, const mt_model_files *m, mt_st_set *s, const int *which, int n_which, const char *where,
                          int write_bf16, int dry_run);

/* A Hugging Face folder of the model: model.safetensors, config.json and,
 * when it came from a folder, that folder's tokenizer files
 * (mt_model_save). */
mt_status mt_hf_save(mt_err err, const mt_model_files *m, const char *dir);
/* The weights of a folder into the tiles, the moments zeroed; on success
 * m->step is 0 and m->source_dir dir (mt_model_load). */
mt_status mt_hf_load(mt_err err, mt_model_files *m, const char *dir);

/* A resume checkpoint into dir (mt_checkpoint_save), and the latest one of
 * dir back into the model, setting m's step, seed and caller_json
 * (mt_checkpoint_load; src/io/checkpoint.c). */
mt_status mt_ck_save(mt_err err, const mt_model_files *m, const char *dir, const mt_checkpoint_info *info);
mt_status mt_ck_load(mt_err err, mt_model_files *m, const char *dir, mt_checkpoint_info *info_out);

#endif
