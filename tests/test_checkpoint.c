/* Resume checkpoints: bit-identical continuation in a fresh process, a writer
 * killed at any moment leaves the previous checkpoint loadable, bad
 * checkpoints are refused and leave the model as it was. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/model.h"

enum { V = 50, B = 2, S = 12, N_TOK = B * S };

static mt_model_config cfg_of(int precision, int hidden)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = V;
    c.hidden_size = (uint32_t)hidden;
    c.intermediate_size = (uint32_t)(2 * hidden);
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 32;
    c.precision = (uint32_t)precision;
    c.attention_bias = 1;
    return c;
}

static mt_model *make(const mt_model_config *c, uint64_t seed, int threads)
{
    mt_model_config cc = *c;
    cc.seed = seed;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.optimizer_threads = (uint32_t)threads;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, &cc, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

/* The batch at data position pos: a pure function of pos. */
static void batch_at(uint64_t pos, int32_t *tok, int32_t *tg)
{
    uint32_t r = (uint32_t)(pos * 2654435761u + 1);
    for (int i = 0; i < N_TOK; i++) tok[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 16) % V;
    for (int i = 0; i < N_TOK; i++) tg[i] = i % 5 == 0 ? MT_IGNORE_INDEX : tok[(i + 1) % N_TOK];
}

/* Trains steps, taking batches from position *pos on. */
static void train(mt_model *m, int steps, uint64_t *pos)
{
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 5e-3f;
    o.warmup_steps = 2;
    o.total_steps = 8;
    int32_t tok[N_TOK], tg[N_TOK];
    for (int s = 0; s < steps; s++) {
        batch_at((*pos)++, tok, tg);
        mt_batch b;
        mt_batch_init(&b);
        b.micro_batch_size = B, b.seq_len = S, b.num_micro_batches = 1, b.tokens = tok, b.targets = tg;
        cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
    }
}

/* The training state: step, master weights, moments and the bf16 copy (not
 * fp32 and lean modes' gradient blocks, which are scratch between steps).
 * Lean mode: the weights' and the moments' codes and scales. */
static int same_state(const mt_model *a, const mt_model *b)
{
    if (a->step != b->step) return 0;
    for (int u = 0; u < a->layout.n_units; u++) {
        const mt_unit_desc *d = &a->layout.units[u];
        const mt_tile *x = &a->tiles.tile[u], *y = &b->tiles.tile[u];
        if (d->lean) { /* [weight codes | grad | codes of m, v | scales of weights, m, v]: all but the gradients */
            if (memcmp(x->base, y->base, d->weight_bytes) || memcmp(x->base + d->m_off, y->base + d->m_off,
                                                                   d->tile_bytes - d->m_off))
                return 0;
            continue;
        }
        if (memcmp(mt_tile_master(x, d), mt_tile_master(y, d), d->padded * 4) ||
            memcmp(mt_tile_m(x, d), mt_tile_m(y, d), d->padded * 4) ||
            memcmp(mt_tile_v(x, d), mt_tile_v(y, d), d->padded * 4))
            return 0;
        if (d->weight_bytes && memcmp(mt_tile_weights_bf16(x, d), mt_tile_weights_bf16(y, d), d->weight_bytes)) return 0;
    }
    return 1;
}

static int rm_entry(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb, (void)f, (void)w;
    return remove(p);
}

static char *tmpdir(void)
{
    char *d = strdup("/tmp/mt-ckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

static void rmdir_all(char *d)
{
    nftw(d, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(d);
}

/* Training N steps gives the same bits as training k, saving, loading in a
 * fresh process and training N - k. */
static void resume_is_bit_identical_arch(int precision, mt_arch arch)
{
    mt_model_config c = cfg_of(precision, 32);
    c.arch = arch;
    c.attention_bias = arch != MT_ARCH_PHI3; /* Phi-3's fused qkv_proj has none */
    char *dir = tmpdir(), *dir2 = tmpdir();
    mt_model *ref = make(&c, 3, 1); /* one thread: the forked child can free it */
    uint64_t pos_ref = 0;
    train(ref, 6, &pos_ref);

    mt_model *a = make(&c, 3, 2);
    uint64_t pos = 0;
    train(a, 3, &pos);
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    info.data_position = pos;
    info.rng_state[0] = 0xfeedfacecafebeefull;
    cr_assert_eq(mt_checkpoint_save(a, dir, &info), MT_OK, "%s", mt_model_errmsg(a));
    mt_model_destroy(a);

    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* a fresh process: a new model of another seed, loaded, trained on, saved */
        mt_offload_policy p;
        mt_offload_policy_init(&p);
        p.backend = MT_BACKEND_CPU;
        p.log_level = MT_LOG_ERROR;
        mt_model_config cc = c;
        cc.seed = 99;
        mt_model_destroy(ref); /* the parent's, inherited */
        mt_model *m = NULL;
        mt_checkpoint_info got;
        mt_checkpoint_info_init(&got);
        if (mt_model_create(&m, &cc, &p) || mt_checkpoint_load(m, dir, &got)) _exit(2);
        if (got.step != 3 || got.data_position != 3 || got.rng_state[0] != 0xfeedfacecafebeefull) _exit(3);
        uint64_t q = got.data_position;
        train(m, 3, &q);
        got.data_position = q;
        int rc = mt_checkpoint_save(m, dir2, &got) ? 4 : 0;
        mt_model_destroy(m);
        free(dir);
        free(dir2);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the resuming process failed (%d)", status);
    mt_model *b = make(&c, 7, 2);
    mt_checkpoint_info got;
    mt_checkpoint_info_init(&got);
    cr_assert_eq(mt_checkpoint_load(b, dir2, &got), MT_OK, "%s", mt_model_errmsg(b));
    cr_assert_eq(got.data_position, 6);
    cr_assert_eq(mt_model_step_count(b), 6);
    cr_assert(same_state(ref, b), "6 steps straight and 3 + resume + 3 give the same bits");
    mt_model_destroy(ref);
    mt_model_destroy(b);
    rmdir_all(dir);
    rmdir_all(dir2);
}

static void resume_is_bit_identical(int precision) { resume_is_bit_identical_arch(precision, MT_ARCH_LLAMA); }

Test(checkpoint, resume_is_bit_identical_bf16, .timeout = 60) { resume_is_bit_identical(MT_PRECISION_BF16); }
Test(checkpoint, resume_is_bit_identical_fp32, .timeout = 60) { resume_is_bit_identical(MT_PRECISION_FP32); }
/* lean mode: the weights' and the moments' codes and scales; the stochastic rounding's bits follow the step */
Test(checkpoint, resume_is_bit_identical_lean, .timeout = 60) { resume_is_bit_identical(MT_PRECISION_LEAN); }

static void truncate_file(const char *path, off_t keep);

/* A lean checkpoint holds 2.02 bytes of weights (codes and scales) and 2.03 of moments per parameter (the
 * default mode's holds 12); it is refused by a model of another precision, and a damaged one changes nothing. */
Test(checkpoint, lean_checkpoint_size_and_refusals)
{
    mt_model_config c = cfg_of(MT_PRECISION_LEAN, 32);
    char *dir = tmpdir();
    mt_model *m = make(&c, 1, 1), *target = make(&c, 2, 1), *ref = make(&c, 2, 1);
    uint64_t pos = 0;
    train(m, 2, &pos);
    cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK, "%s", mt_model_errmsg(m));
    char path[4200];
    struct stat sm, so;
    snprintf(path, sizeof path, "%s/step-00000002/model.safetensors", dir);
    cr_assert_eq(stat(path, &sm), 0);
    snprintf(path, sizeof path, "%s/step-00000002/optimizer.safetensors", dir);
    cr_assert_eq(stat(path, &so), 0);
    const double P = (double)mt_model_num_params(m); /* and headers of a few KiB */
    cr_assert(sm.st_size >= 2 * P && sm.st_size < 2.05 * P + 16384, "weights: %lld bytes for %.0f parameters",
              (long long)sm.st_size, P);
    cr_assert(so.st_size < 2.1 * P + 16384 && so.st_size > 2 * P, "moments: %lld bytes for %.0f parameters",
              (long long)so.st_size, P);

    mt_model_config b16 = cfg_of(MT_PRECISION_BF16, 32);
    mt_model *bm = make(&b16, 1, 1);
    cr_assert_eq(mt_checkpoint_load(bm, dir, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(bm), "saved in lean, this model is bf16"), "%s", mt_model_errmsg(bm));
    char *dir2 = tmpdir();
    cr_assert_eq(mt_checkpoint_save(bm, dir2, NULL), MT_OK);
    cr_assert_eq(mt_checkpoint_load(target, dir2, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(target), "saved in bf16, this model is lean"), "%s", mt_model_errmsg(target));
    mt_model_destroy(bm);
    rmdir_all(dir2);

    truncate_file(path, so.st_size - 100);
    cr_assert_eq(mt_checkpoint_load(target, dir, NULL), MT_ERR_FORMAT);
    cr_assert(strstr(mt_model_errmsg(target), "optimizer.safetensors"), "%s", mt_model_errmsg(target));
    cr_assert(same_state(target, ref), "a failed load leaves the model as it was");
    mt_model_destroy(m);
    mt_model_destroy(target);
    mt_model_destroy(ref);
    rmdir_all(dir);
}
/* Phi-3: weights and moments of q, k, v and gate, up written and read as the fused matrices */
Test(checkpoint, resume_is_bit_identical_phi3, .timeout = 60)
{
    resume_is_bit_identical_arch(MT_PRECISION_BF16, MT_ARCH_PHI3);
}

Test(checkpoint, layout_and_pruning)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 32);
    char *dir = tmpdir();
    mt_model *m = make(&c, 1, 1);
    uint64_t pos = 0;
    for (int i = 0; i < 4; i++) {
        train(m, 1, &pos);
        cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK, "%s", mt_model_errmsg(m));
    }
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/step-00000004/model.safetensors", dir);
    cr_assert_eq(stat(path, &sb), 0);
    snprintf(path, sizeof path, "%s/step-00000003/optimizer.safetensors", dir);
    cr_assert_eq(stat(path, &sb), 0, "the previous checkpoint is kept");
    snprintf(path, sizeof path, "%s/step-00000002", dir);
    cr_assert_neq(stat(path, &sb), 0, "older ones are pruned");
    snprintf(path, sizeof path, "%s/step-00000003", dir);
    mt_model *old = make(&c, 5, 1);
    cr_assert_eq(mt_checkpoint_load(old, path, NULL), MT_OK, "a step folder loads directly: %s", mt_model_errmsg(old));
    cr_assert_eq(mt_model_step_count(old), 3);
    /* the checkpoint's weights load as a plain model folder too */
    mt_model *plain = make(&c, 6, 1);
    cr_assert_eq(mt_model_load(plain, path), MT_OK, "%s", mt_model_errmsg(plain));
    mt_model_destroy(plain);
    mt_model_destroy(old);
    mt_model_destroy(m);
    rmdir_all(dir);
}

/* A writer killed at any moment leaves a loadable checkpoint: the old one or
 * the new one, never a mixture. The model is large enough (about 1.6 M
 * parameters, 20 MB per checkpoint) for the kills to land mid-write. */
Test(checkpoint, killed_writer_leaves_the_previous_checkpoint, .timeout = 120)
{
    mt_model_config c = cfg_of(MT_PRECISION_FP32, 256);
    char *dir = tmpdir();
    mt_model *m = make(&c, 1, 1); /* one thread: the forked writer needs no pool workers */
    uint64_t pos = 0;
    train(m, 1, &pos);
    cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK, "%s", mt_model_errmsg(m));
    mt_model *old_state = make(&c, 2, 1), *new_state = make(&c, 2, 1), *probe = make(&c, 3, 1);
    cr_assert_eq(mt_checkpoint_load(old_state, dir, NULL), MT_OK);
    train(m, 1, &pos);
    int saw_old = 0, saw_new = 0;
    /* the last writer is not killed: it must finish and leave the new state */
    const int delays_us[] = {0, 200, 500, 1000, 2000, 3000, 5000, 8000, 12000, 20000, 30000, 50000, 80000, 150000, -1};
    for (size_t i = 0; i < sizeof delays_us / sizeof delays_us[0]; i++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            int rc = mt_checkpoint_save(m, dir, NULL) ? 1 : 0;
            /* free what the parent owned, so valgrind's leak check of this process stays meaningful */
            mt_model_destroy(m), mt_model_destroy(old_state), mt_model_destroy(new_state), mt_model_destroy(probe);
            free(dir);
            _exit(rc);
        }
        if (delays_us[i] >= 0) {
            usleep((useconds_t)delays_us[i]);
            kill(pid, SIGKILL);
        }
        int status;
        waitpid(pid, &status, 0);
        cr_assert_eq(mt_checkpoint_load(probe, dir, NULL), MT_OK, "after a kill at %d us: %s", delays_us[i],
                     mt_model_errmsg(probe));
        if (mt_model_step_count(probe) == 1) {
            cr_assert(same_state(probe, old_state), "kill at %d us: the old checkpoint, intact", delays_us[i]);
            saw_old++;
        } else {
            if (!saw_new) {
                cr_assert_eq(mt_checkpoint_load(new_state, dir, NULL), MT_OK);
                cr_assert(same_state(new_state, m), "the new checkpoint is the model's state");
            }
            cr_assert(same_state(probe, new_state), "kill at %d us: the new checkpoint, intact", delays_us[i]);
            saw_new++;
        }
    }
    cr_assert_gt(saw_old, 0, "some kills landed before the new checkpoint was in place");
    cr_assert_gt(saw_new, 0, "some writers finished");
    mt_model_destroy(probe);
    mt_model_destroy(old_state);
    mt_model_destroy(new_state);
    mt_model_destroy(m);
    rmdir_all(dir);
}

static void truncate_file(const char *path, off_t keep)
{
    cr_assert_eq(truncate(path, keep), 0);
}

Test(checkpoint, bad_checkpoints_are_refused_and_change_nothing)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 32);
    char *dir = tmpdir();
    mt_model *m = make(&c, 1, 1), *target = make(&c, 2, 1), *ref = make(&c, 2, 1);
    uint64_t pos = 0;
    train(m, 2, &pos);
    cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK);
    char path[4200];

    cr_assert_eq(mt_checkpoint_load(target, "/nonexistent/megatrain", NULL), MT_ERR_IO);
    cr_assert(strstr(mt_model_errmsg(target), "not a checkpoint"), "%s", mt_model_errmsg(target));

    mt_model_config other = cfg_of(MT_PRECISION_BF16, 64);
    mt_model *wide = make(&other, 1, 1);
    cr_assert_eq(mt_checkpoint_load(wide, dir, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(wide), "hidden_size 32, this model has 64"), "%s", mt_model_errmsg(wide));
    mt_model_destroy(wide);

    mt_model_config f32 = cfg_of(MT_PRECISION_FP32, 32);
    mt_model *fm = make(&f32, 1, 1);
    cr_assert_eq(mt_checkpoint_load(fm, dir, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(fm), "saved in bf16"), "%s", mt_model_errmsg(fm));
    mt_model_destroy(fm);

    snprintf(path, sizeof path, "%s/step-00000002/optimizer.safetensors", dir);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    truncate_file(path, sb.st_size - 100);
    cr_assert_eq(mt_checkpoint_load(target, dir, NULL), MT_ERR_FORMAT);
    cr_assert(strstr(mt_model_errmsg(target), "optimizer.safetensors"), "%s", mt_model_errmsg(target));
    cr_assert(same_state(target, ref), "a failed load leaves the model as it was");

    snprintf(path, sizeof path, "%s/step-00000002/trainer_state.json", dir);
    FILE *fp = fopen(path, "w");
    fputs("{\"format\": \"something else\"}", fp);
    fclose(fp);
    cr_assert_eq(mt_checkpoint_load(target, dir, NULL), MT_ERR_FORMAT);
    snprintf(path, sizeof path, "%s/latest", dir);
    fp = fopen(path, "w");
    fputs("../../etc\n", fp);
    fclose(fp);
    cr_assert_eq(mt_checkpoint_load(target, dir, NULL), MT_ERR_FORMAT);
    cr_assert(same_state(target, ref));
    cr_assert_eq(mt_checkpoint_save(NULL, dir, NULL), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_checkpoint_load(target, NULL, NULL), MT_ERR_INVALID_ARGUMENT);
    mt_model_destroy(m);
    mt_model_destroy(target);
    mt_model_destroy(ref);
    rmdir_all(dir);
}

static int exists(const char *dir, const char *name)
{
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

/* A folder that held another run's later checkpoints (steps 35 and 40): a new
 * run's saves at steps 1..7 keep what `latest` names and the one before it,
 * and leave the other run's folders and foreign files alone; numbers of nine
 * digits sort as numbers. */
Test(checkpoint, pruning_never_removes_latest_or_later_runs)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 32);
    char *dir = tmpdir();
    const char *foreign[] = {"step-00000035", "step-00000040", "step-123456789", "notes.txt", "step-7x"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, foreign[i]);
        if (strstr(foreign[i], ".txt")) {
            FILE *f = fopen(path, "w");
            cr_assert_not_null(f);
            fclose(f);
        } else {
            cr_assert_eq(mkdir(path, 0755), 0);
        }
    }
    mt_model *m = make(&c, 1, 1);
    uint64_t pos = 0;
    for (int i = 0; i < 7; i++) {
        train(m, 1, &pos);
        cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK, "%s", mt_model_errmsg(m));
    }
    cr_assert(exists(dir, "step-00000007"), "the checkpoint just written");
    cr_assert(exists(dir, "step-00000006"), "the one before it");
    cr_assert(!exists(dir, "step-00000005") && !exists(dir, "step-00000001"), "older ones of this run are removed");
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++)
        cr_assert(exists(dir, foreign[i]), "%s is left alone", foreign[i]);
    mt_model *back = make(&c, 9, 1);
    cr_assert_eq(mt_checkpoint_load(back, dir, NULL), MT_OK, "%s", mt_model_errmsg(back));
    cr_assert_eq(mt_model_step_count(back), 7, "latest names the new run's step 7");
    mt_model_destroy(back);
    mt_model_destroy(m);
    rmdir_all(dir);
}

/* The caller's JSON travels in trainer_state.json and comes back on load,
 * owned by the model; keys of the library's and non-objects are refused
 * before anything is written; a 0.1-sized info (no caller_json) still works. */
Test(checkpoint, caller_json_round_trip)
{
    mt_model_config c = cfg_of(MT_PRECISION_FP32, 32);
    char *dir = tmpdir();
    mt_model *m = make(&c, 1, 1);
    uint64_t pos = 0;
    train(m, 2, &pos);
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    info.caller_json = "{\"step\": 3}";
    cr_assert_eq(mt_checkpoint_save(m, dir, &info), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "\"step\""), "%s", mt_model_errmsg(m));
    info.caller_json = "[1, 2]";
    cr_assert_eq(mt_checkpoint_save(m, dir, &info), MT_ERR_INVALID_ARGUMENT);
    info.caller_json = "{\"run\": {\"lr\": 0.001}";
    cr_assert_eq(mt_checkpoint_save(m, dir, &info), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "not valid JSON"), "%s", mt_model_errmsg(m));
    cr_assert(!exists(dir, "latest"), "nothing written by a refused save");
    info.caller_json = "{\"run\": {\"lr\": 0.001, \"data\": \"tokens.bin\"}, \"log_history\": [{\"step\": 1}]}";
    info.data_position = 11;
    cr_assert_eq(mt_checkpoint_save(m, dir, &info), MT_OK, "%s", mt_model_errmsg(m));

    mt_model *b = make(&c, 2, 1);
    mt_checkpoint_info got;
    mt_checkpoint_info_init(&got);
    got.caller_json = "not touched on the way in";
    cr_assert_eq(mt_checkpoint_load(b, dir, &got), MT_OK, "%s", mt_model_errmsg(b));
    cr_assert_eq(got.data_position, 11);
    cr_assert_str_eq(got.caller_json,
                     "{\"run\":{\"lr\":0.001,\"data\":\"tokens.bin\"},\"log_history\":[{\"step\":1}]}");
    /* a checkpoint without caller JSON gives NULL, and the old string is freed */
    mt_checkpoint_info plain;
    mt_checkpoint_info_init(&plain);
    train(m, 1, &pos);
    cr_assert_eq(mt_checkpoint_save(m, dir, &plain), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert_eq(mt_checkpoint_load(b, dir, &got), MT_OK, "%s", mt_model_errmsg(b));
    cr_assert_null(got.caller_json);
    /* a caller of 0.1 passes 56 bytes and gets nothing past them */
    struct {
        mt_checkpoint_info info;
        uint64_t canary;
    } old;
    memset(&old, 0xab, sizeof old);
    old.info.struct_size = 56;
    cr_assert_eq(mt_checkpoint_load(b, dir, &old.info), MT_OK, "%s", mt_model_errmsg(b));
    cr_assert_eq(old.info.step, 3);
    unsigned char tail[8];
    memcpy(tail, &old.info.caller_json, 8);
    for (int i = 0; i < 8; i++) cr_assert_eq(tail[i], 0xab, "byte %d past a 0.1 caller's struct was written", 56 + i);
    mt_model_destroy(b);
    mt_model_destroy(m);
    rmdir_all(dir);
}

/* Saving one step again replaces its checkpoint, as often as need be, and
 * leaves no step-N.old behind. */
Test(checkpoint, saving_a_step_again_replaces_it)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 32);
    char *dir = tmpdir();
    mt_model *m = make(&c, 1, 1);
    for (int i = 0; i < 3; i++) cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK, "save %d: %s", i, mt_model_errmsg(m));
    cr_assert(exists(dir, "step-00000000"));
    cr_assert(!exists(dir, "step-00000000.old"), "the replaced checkpoint is removed");
    mt_model_destroy(m);
    rmdir_all(dir);
}

/* Takes dir/.megatrain.lock as a writer would (flock, its pid): the fd. */
static int hold_lock(const char *dir, long pid)
{
    char path[4200], text[32];
    snprintf(path, sizeof path, "%s/.megatrain.lock", dir);
    const int fd = open(path, O_RDWR | O_CREAT, 0644);
    cr_assert(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0, "lock %s", path);
    const int n = snprintf(text, sizeof text, "%ld\n", pid);
    cr_assert(ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)n, 0) == n);
    return fd;
}

/* One writer at a time: a save into a folder another process has locked
 * fails, names that process and writes nothing; a lock that names the caller
 * (held around a whole run) lets its saves through; the save's own lock is
 * released, its file removed. */
Test(checkpoint, saves_take_the_folders_lock, .timeout = 60)
{
    mt_model_config c = cfg_of(MT_PRECISION_BF16, 32);
    char *dir = tmpdir();
    int ready[2], done[2];
    cr_assert(pipe(ready) == 0 && pipe(done) == 0);
    const pid_t child = fork(); /* before the model: a child that _exits holding a copy of it leaks it */
    cr_assert(child >= 0);
    if (child == 0) { /* another writer: holds the lock until told */
        hold_lock(dir, (long)getpid());
        char b = 1;
        (void)!write(ready[1], &b, 1);
        (void)!read(done[0], &b, 1);
        _exit(0);
    }
    char b;
    cr_assert(read(ready[0], &b, 1) == 1);
    mt_model *m = make(&c, 1, 1);
    cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_ERR_IO);
    char pid[32];
    snprintf(pid, sizeof pid, "process %ld", (long)child);
    cr_assert(strstr(mt_model_errmsg(m), pid), "the message names the holder: %s", mt_model_errmsg(m));
    cr_assert(!exists(dir, "step-00000000") && !exists(dir, "step-00000000.tmp") && !exists(dir, "latest"),
              "a refused save writes nothing");
    (void)!write(done[1], &b, 1);
    int status;
    waitpid(child, &status, 0);
    /* the holder is gone (its file stays, stale): the next save takes it over and removes it */
    cr_assert(exists(dir, ".megatrain.lock"));
    cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert(exists(dir, "step-00000000") && !exists(dir, ".megatrain.lock"));
    /* the caller's own lock, around a run */
    const int fd = hold_lock(dir, (long)getpid());
    cr_assert_eq(mt_checkpoint_save(m, dir, NULL), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert(exists(dir, ".megatrain.lock"), "the caller's lock is the caller's to release");
    close(fd);
    mt_model_destroy(m);
    rmdir_all(dir);
}
