/* Model folders and checkpoints share these: the tensor lists of a model in
 * safetensors terms, and config.json. */
#ifndef MT_HF_H
#define MT_HF_H

#include "engine/model.h"
#include "io/safetensors.h"

/* 1 for norms and biases, 2 for matrices: the shape transformers uses. */
int mt_tensor_ndim(const mt_tensor_desc *t);
size_t mt_tensor_count(const mt_model *m);
/* config.json text of cfg (cJSON_free it), with the token ids (bos, eos, pad) of source_dir's
 * config.json when the model came from a folder (source_dir non-NULL). */
char *mt_config_json_text(const mt_model_config *cfg, const char *source_dir);
/* Writes dir/config.json durably. */
mt_status mt_write_config(mt_err err, const mt_model_config *cfg, const char *source_dir, const char *dir);

/* which: 0 the master weights (HF names), 1 AdamW m ("<name>.exp_avg"),
 * 2 AdamW v ("<name>.exp_avg_sq"). Tensors fused in the checkpoint are one
 * request of several parts; *count gets the number of requests. */
mt_st_write_req *mt_tensor_write_list(const mt_model *m, int which, int dtype, char (*names)[128], size_t *count);
mt_status mt_save_tensors(mt_err err, const mt_model *m, const char *path, int which, int dtype);
/* Validates that s holds every tensor of the kinds which[0..n_which) with its
 * exact shape and nothing else, then (unless dry_run) converts them into the
 * tiles (and, with write_bf16, the weights' bf16 copies). Nothing is written
 * when validation fails. */
mt_status mt_load_tensors(mt_err err, mt_model *m, mt_st_set *s, const int *which, int n_which, const char *where,
                          int write_bf16, int dry_run);

#endif
