/* The timeline's split of a step (src/engine/timeline.c) on hand-made traces, and
 * the public call's refusals. Times are exact binary fractions where sums
 * are compared exactly; elsewhere the tolerance is 1e-12 s (a few roundings
 * of numbers below 100). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "engine/timeline.h"

TestSuite(timeline);

#define EPS 1e-12

typedef struct fixture {
    mt_trace t;
    mt_trace_visit v[8];
    mt_trace_copy c[8];
    mt_trace_span o[4];
} fixture;

static void init(fixture *f)
{
    memset(f, 0, sizeof *f);
    f->t.level = MT_TRACE_FULL;
    f->t.visit = f->v, f->t.copy = f->c, f->t.opt = f->o;
    f->t.cap_visits = 8, f->t.cap_copies = 8, f->t.cap_opt = 4;
}

static int add_visit(fixture *f, int unit, int phase, double issued, double start, double end, int weights, int ck)
{
    f->v[f->t.n_visits] = (mt_trace_visit){unit, phase, issued, start, end, weights, ck};
    return f->t.n_visits++;
}

static int add_copy(fixture *f, int to_host, int kind, uint64_t bytes, double issued, double start, double end)
{
    f->c[f->t.n_copies] = (mt_trace_copy){to_host, kind, bytes, issued, start, end};
    return f->t.n_copies++;
}

static mt_timeline split(const fixture *f, double before, double after, mt_timeline_visit *vis, uint32_t cap)
{
    mt_timeline tl;
    mt_timeline_init(&tl);
    mt_trace_split(&f->t, before, after, &tl, vis, cap);
    return tl;
}

static double waits(const mt_timeline *tl)
{
    double s = 0;
    for (int k = 0; k < MT_WAIT_COUNT; k++) s += tl->wait_seconds[k];
    return s;
}

Test(timeline, back_to_back_visits_are_all_busy)
{
    fixture f;
    init(&f);
    const int w0 = add_copy(&f, 0, MT_COPY_WEIGHTS, 100, 0, 0, 0.5);
    const int w1 = add_copy(&f, 0, MT_COPY_WEIGHTS, 100, 0, 0.5, 1.0);
    add_visit(&f, 0, MT_PHASE_FORWARD, 0, 0.5, 2.0, w0, -1);
    add_visit(&f, 1, MT_PHASE_FORWARD, 0, 2.0, 4.0, w1, -1);
    mt_timeline_visit vis[2];
    mt_timeline tl = split(&f, 0.25, 4.25, vis, 2);
    cr_assert_eq(tl.struct_size, sizeof tl);
    cr_assert_eq(tl.n_visits, 2u);
    cr_assert_eq(tl.seconds, 4.5);
    cr_assert_eq(tl.busy_seconds, 3.5);
    /* before the first visit: its weights (0.5 s); host time around the GPU span: 0.25 + 0.25 */
    cr_assert_eq(tl.wait_seconds[MT_WAIT_WEIGHTS], 0.5);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_HOST], 0.5);
    cr_assert_eq(tl.busy_seconds + waits(&tl), tl.seconds);
    cr_assert_eq(tl.h2d_bytes, 200u);
    cr_assert_eq(tl.h2d_seconds, 1.0);
    cr_assert_eq(tl.d2h_bytes, 0u);
    /* visits are reported from the step's start (before + device time) */
    cr_assert_eq(vis[1].unit, 1u);
    cr_assert_eq(vis[1].start, 2.25);
    cr_assert_eq(vis[1].end, 4.25);
    cr_assert_eq(vis[1].weights_start, 0.75);
    cr_assert_eq(vis[1].weights_end, 1.25);
    for (int k = 0; k < MT_WAIT_COUNT; k++) cr_assert_eq(vis[1].wait_seconds[k], 0.0);
}

Test(timeline, a_late_copy_is_a_weights_wait)
{
    fixture f;
    init(&f);
    const int w = add_copy(&f, 0, MT_COPY_WEIGHTS, 1 << 20, 0.0, 1.0, 3.0); /* started late: the stream was busy */
    add_visit(&f, 1, MT_PHASE_FORWARD, 0, 0.0, 1.0, -1, -1);
    add_visit(&f, 2, MT_PHASE_FORWARD, 0.5, 3.0, 4.0, w, -1);
    mt_timeline_visit vis[2];
    mt_timeline tl = split(&f, 0, 4, vis, 2);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_WEIGHTS], 2.0);
    cr_assert_eq(vis[1].wait_seconds[MT_WAIT_WEIGHTS], 2.0);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_OPTIMIZER], 0.0);
    cr_assert_eq(tl.busy_seconds, 2.0);
    cr_assert_eq(tl.busy_seconds + waits(&tl), tl.seconds);
}

Test(timeline, the_host_waiting_for_the_optimizer)
{
    fixture f;
    init(&f);
    /* visit 1 ends at 1; the host waited for the optimizer from 0.5 to 2, issued
     * the copy at once (it started when issued) and the visit at 2.5 */
    f.o[f.t.n_opt++] = (mt_trace_span){0.5, 2.0};
    const int w = add_copy(&f, 0, MT_COPY_WEIGHTS, 64, 2.0, 2.0, 3.0);
    add_visit(&f, 1, MT_PHASE_FORWARD, 0, 0.0, 1.0, -1, -1);
    add_visit(&f, 2, MT_PHASE_FORWARD, 2.5, 3.0, 4.0, w, -1);
    mt_timeline tl = split(&f, 0, 4, NULL, 0);
    /* 1 .. 2 the host waited for the optimizer, 2 .. 2.5 it issued (launch),
     * 2.5 .. 3 the copy it held back */
    cr_assert_float_eq(tl.wait_seconds[MT_WAIT_OPTIMIZER], 1.5, EPS);
    cr_assert_float_eq(tl.wait_seconds[MT_WAIT_LAUNCH], 0.5, EPS);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_WEIGHTS], 0.0);
    cr_assert_float_eq(tl.busy_seconds + waits(&tl), tl.seconds, EPS);
}

Test(timeline, a_copy_queued_behind_others_is_not_the_optimizers)
{
    fixture f;
    init(&f);
    /* the same wait for the optimizer, but the copy then queued behind another
     * (it started 0.5 s after being issued): the stream, not the host, held it */
    f.o[f.t.n_opt++] = (mt_trace_span){0.0, 0.25};
    const int w = add_copy(&f, 0, MT_COPY_WEIGHTS, 64, 0.25, 0.75, 2.0);
    add_visit(&f, 1, MT_PHASE_FORWARD, 0, 0.0, 1.0, -1, -1);
    add_visit(&f, 2, MT_PHASE_FORWARD, 0.25, 2.0, 3.0, w, -1);
    mt_timeline tl = split(&f, 0, 3, NULL, 0);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_WEIGHTS], 1.0);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_OPTIMIZER], 0.0);
}

Test(timeline, checkpoints_after_weights_then_launch)
{
    fixture f;
    init(&f);
    const int w = add_copy(&f, 0, MT_COPY_WEIGHTS, 64, 0, 0, 1.5);
    const int ck = add_copy(&f, 0, MT_COPY_CHECKPOINT, 32, 0, 1.5, 2.5);
    const int g = add_copy(&f, 1, MT_COPY_GRADIENTS, 16, 0, 3.0, 3.5);
    add_visit(&f, 3, MT_PHASE_BACKWARD, 0, 0.0, 1.0, -1, -1);
    add_visit(&f, 2, MT_PHASE_BACKWARD, 0, 2.75, 4.0, w, ck);
    (void)g;
    mt_timeline_visit vis[2];
    mt_timeline tl = split(&f, 0, 4.5, vis, 2);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_WEIGHTS], 0.5);      /* 1 .. 1.5 */
    cr_assert_eq(tl.wait_seconds[MT_WAIT_CHECKPOINTS], 1.0);  /* 1.5 .. 2.5 */
    cr_assert_eq(tl.wait_seconds[MT_WAIT_LAUNCH], 0.25);      /* 2.5 .. 2.75: nothing left to wait for */
    cr_assert_eq(tl.wait_seconds[MT_WAIT_HOST], 0.5);         /* 4 .. 4.5 */
    cr_assert_eq(tl.busy_seconds + waits(&tl), tl.seconds);
    cr_assert_eq(vis[1].phase, (uint32_t)MT_PHASE_BACKWARD);
    cr_assert_eq(vis[1].wait_seconds[MT_WAIT_CHECKPOINTS], 1.0);
    cr_assert_eq(tl.d2h_bytes, 16u);
    cr_assert_eq(tl.d2h_seconds, 0.5);
    cr_assert_eq(tl.h2d_bytes, 96u);
}

Test(timeline, the_host_issuing_late_is_launch)
{
    fixture f;
    init(&f);
    add_visit(&f, 1, MT_PHASE_FORWARD, 0, 0.0, 1.0, -1, -1);
    add_visit(&f, 2, MT_PHASE_FORWARD, 1.75, 1.75, 2.0, -1, -1);
    mt_timeline tl = split(&f, 0, 2, NULL, 0);
    cr_assert_eq(tl.wait_seconds[MT_WAIT_LAUNCH], 0.75);
    cr_assert_eq(tl.busy_seconds, 1.25);
}

Test(timeline, clock_skew_never_gives_negative_times)
{
    fixture f;
    init(&f);
    /* a start a hair before the previous end (two clocks): no negative gap, no double count */
    add_visit(&f, 1, MT_PHASE_FORWARD, 0, 0.0, 1.0, -1, -1);
    add_visit(&f, 2, MT_PHASE_FORWARD, 0, 1.0 - 1e-9, 2.0, -1, -1);
    mt_timeline_visit vis[2];
    mt_timeline tl = split(&f, 0, 2, vis, 2);
    for (int k = 0; k < MT_WAIT_COUNT; k++) cr_assert_geq(tl.wait_seconds[k], 0.0);
    cr_assert_float_eq(tl.busy_seconds, 2.0, EPS);
    cr_assert_geq(vis[1].start, vis[0].end);
}

Test(timeline, more_visits_than_the_callers_array)
{
    fixture f;
    init(&f);
    for (int i = 0; i < 5; i++) add_visit(&f, i, MT_PHASE_FORWARD, 0, i, i + 1, -1, -1);
    mt_timeline_visit vis[3];
    memset(vis, 0xff, sizeof vis);
    mt_timeline tl = split(&f, 0, 5, vis, 2);
    cr_assert_eq(tl.n_visits, 5u);
    cr_assert_eq(vis[1].unit, 1u);
    cr_assert_eq(vis[2].unit, 0xffffffffu, "wrote past cap");
}

/* ---- the public call -------------------------------------------------------------- */

static mt_model *tiny(int timeline, mt_status *st)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.vocab_size = 64, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2;
    c.num_attention_heads = 2, c.num_key_value_heads = 1, c.max_position_embeddings = 32;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.timeline = (uint32_t)timeline;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    *st = mt_model_create(&m, &c, &p);
    return m;
}

Test(timeline, refused_where_there_is_none)
{
    mt_status st;
    cr_assert_null(tiny(2, &st));
    cr_assert_eq(st, MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "timeline"), "%s", mt_last_errmsg());
    mt_model *m = tiny(1, &st);
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    mt_timeline tl;
    mt_timeline_init(&tl);
    cr_assert_eq(mt_model_timeline(m, &tl, NULL, 0), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_model_errmsg(m), "CUDA"), "%s", mt_model_errmsg(m));
    cr_assert_eq(mt_model_timeline(m, NULL, NULL, 0), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_model_timeline(NULL, &tl, NULL, 0), MT_ERR_INVALID_ARGUMENT);
    tl.struct_size = 4;
    cr_assert_eq(mt_model_timeline(m, &tl, NULL, 0), MT_ERR_STRUCT_SIZE);
    mt_model_destroy(m);
}

Test(timeline, the_cpu_backend_splits_its_step_by_host_time)
{
    mt_status st;
    mt_model *m = tiny(0, &st);
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    int32_t tok[64], tg[64];
    for (int i = 0; i < 64; i++) tok[i] = i, tg[i] = (i + 1) % 64;
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = 2, b.seq_len = 16, b.num_micro_batches = 2, b.tokens = tok, b.targets = tg;
    mt_optim_config o;
    mt_optim_config_init(&o);
    mt_step_stats s;
    mt_step_stats_init(&s);
    cr_assert_eq(mt_step(m, &b, &o, &s), MT_OK, "%s", mt_model_errmsg(m));
    cr_assert_gt(s.forward_seconds, 0.0);
    cr_assert_gt(s.backward_seconds, 0.0);
    cr_assert_geq(s.optimizer_seconds, 0.0);
    cr_assert_float_eq(s.forward_seconds + s.backward_seconds + s.optimizer_seconds, s.seconds, 1e-9);
    mt_model_destroy(m);
}

/* What a caller built against 0.1 receives: the same numbers in 0.1's
 * layout (wait arrays of 5), which src/core/abi.c asserts matches the 0.1.0
 * header; its struct_size is kept. */
Test(timeline, the_0_1_layout_carries_the_same_numbers)
{
    mt_timeline tl;
    mt_timeline_init(&tl);
    tl.n_visits = 3;
    tl.step = 42;
    tl.seconds = 2.5;
    tl.busy_seconds = 1.25;
    for (int k = 0; k < MT_WAIT_COUNT; k++) tl.wait_seconds[k] = 0.25 * (k + 1);
    tl.h2d_seconds = 0.5;
    tl.d2h_seconds = 0.75;
    tl.h2d_bytes = 1ull << 40;
    tl.d2h_bytes = 12345;
    mt_timeline_visit v[3];
    memset(v, 0, sizeof v);
    for (int i = 0; i < 3; i++) {
        v[i] = (mt_timeline_visit){(uint32_t)i, MT_PHASE_BACKWARD, i, i + 0.5, i - 1.0, i - 0.5, {0}};
        for (int k = 0; k < MT_WAIT_COUNT; k++) v[i].wait_seconds[k] = i + k / 8.0;
    }
    mt_timeline_0_1 old;
    mt_timeline_visit_0_1 ov[4];
    memset(&old, 0xff, sizeof old);
    memset(ov, 0xff, sizeof ov);
    old.struct_size = MT_SIZE_TIMELINE_0_1;
    mt_timeline_to_0_1(&old, &tl, ov, v, 3);
    cr_assert_eq(old.struct_size, MT_SIZE_TIMELINE_0_1);
    cr_assert_eq(old.n_visits, 3);
    cr_assert_eq(old.step, 42);
    cr_assert_eq(old.seconds, 2.5);
    cr_assert_eq(old.busy_seconds, 1.25);
    for (int k = 0; k < MT_WAITS_0_1; k++) cr_assert_eq(old.wait_seconds[k], 0.25 * (k + 1));
    cr_assert_eq(old.h2d_seconds, 0.5);
    cr_assert_eq(old.d2h_seconds, 0.75);
    cr_assert_eq(old.h2d_bytes, 1ull << 40);
    cr_assert_eq(old.d2h_bytes, 12345);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ov[i].unit, (uint32_t)i);
        cr_assert_eq(ov[i].phase, MT_PHASE_BACKWARD);
        cr_assert_eq(ov[i].start, (double)i);
        cr_assert_eq(ov[i].end, i + 0.5);
        cr_assert_eq(ov[i].weights_start, i - 1.0);
        cr_assert_eq(ov[i].weights_end, i - 0.5);
        for (int k = 0; k < MT_WAITS_0_1; k++) cr_assert_eq(ov[i].wait_seconds[k], i + k / 8.0);
    }
    unsigned char untouched[sizeof ov[3]];
    memset(untouched, 0xff, sizeof untouched);
    cr_assert_eq(memcmp(&ov[3], untouched, sizeof untouched), 0, "nothing past n visits is written");
}
