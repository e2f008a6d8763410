/* The split of a step's time (see timeline.h and docs/timeline.md).
 *
 * The compute stream runs the visits in the order the engine issued them.
 * The idle time before visit i, from the end of visit i-1 (or the origin)
 * to its start, is explained from the front, one cause after another:
 *
 *   1. the host had not issued the visit yet: time the engine spent in the
 *      optimizer's wait counts as OPTIMIZER, the rest as LAUNCH;
 *   2. then its weights were still on their way: WEIGHTS, or OPTIMIZER when
 *      the copy itself waited for the host (it started at once when issued)
 *      and the host had just been waiting for the optimizer to finish that unit;
 *   3. then its activation checkpoint was on its way: CHECKPOINTS (likewise);
 *   4. what is left (event latency) is LAUNCH.
 *
 * Host work before the origin and after the last visit is HOST. So busy plus
 * the waits add up to the step's wall time. */
#include "engine/timeline.h"

#include <stdlib.h>
#include <string.h>

#define SLACK 1e-3 /* a copy that started within 1 ms of being issued found its stream idle */

int mt_trace_reset(mt_trace *t, int level, int n_visits, int n_copies)
{
    t->level = level;
    t->n_visits = t->n_copies = t->n_opt = 0;
    t->head_start = 0;
    if (level < MT_TRACE_FULL) return 0;
    const int n_opt = n_visits + 8; /* at most one wait per weight copy */
    if (n_visits > t->cap_visits) {
        void *p = realloc(t->visit, (size_t)n_visits * sizeof *t->visit);
        if (!p) return -1;
        t->visit = p, t->cap_visits = n_visits;
    }
    if (n_copies > t->cap_copies) {
        void *p = realloc(t->copy, (size_t)n_copies * sizeof *t->copy);
        if (!p) return -1;
        t->copy = p, t->cap_copies = n_copies;
    }
    if (n_opt > t->cap_opt) {
        void *p = realloc(t->opt, (size_t)n_opt * sizeof *t->opt);
        if (!p) return -1;
        t->opt = p, t->cap_opt = n_opt;
    }
    return 0;
}

void mt_trace_free(mt_trace *t)
{
    free(t->visit);
    free(t->copy);
    free(t->opt);
    memset(t, 0, sizeof *t);
}

/* Seconds of [a, b] that the engine spent waiting for the optimizer. */
static double opt_overlap(const mt_trace *t, double a, double b)
{
    double s = 0;
    for (int i = 0; i < t->n_opt; i++) {
        double lo = MT_MAX(a, t->opt[i].from), hi = MT_MIN(b, t->opt[i].to);
        if (hi > lo) s += hi - lo;
    }
    return s;
}

/* The copy waited for the host, which had just been waiting for the optimizer. */
static int held_by_optimizer(const mt_trace *t, const mt_trace_copy *c)
{
    if (c->start - c->issued > SLACK) return 0;
    for (int i = 0; i < t->n_opt; i++)
        if (t->opt[i].to <= c->issued + SLACK && t->opt[i].to >= c->issued - SLACK) return 1;
    return 0;
}

/* The part of [*at, until] that a copy still on its way explains. */
static void wait_for_copy(const mt_trace *t, int ci, int cause, double *at, double until, double *w)
{
    if (ci < 0 || ci >= t->n_copies) return;
    const mt_trace_copy *c = &t->copy[ci];
    const double e = MT_MIN(c->end, until);
    if (e <= *at) return;
    w[held_by_optimizer(t, c) ? MT_WAIT_OPTIMIZER : cause] += e - *at;
    *at = e;
}

void mt_trace_split(const mt_trace *t, double before, double after, mt_timeline *out, mt_timeline_visit *visits,
                    uint32_t cap)
{
    const uint32_t size = out->struct_size;
    memset(out, 0, sizeof *out);
    out->struct_size = size;
    out->n_visits = (uint32_t)t->n_visits;
    out->seconds = before + after;
    double prev = 0;
    for (int i = 0; i < t->n_visits; i++) {
        const mt_trace_visit *v = &t->visit[i];
        double w[MT_WAIT_COUNT] = {0};
        const double g1 = MT_MAX(v->start, prev);
        double at = prev;
        if (v->issued > at) { /* 1 */
            const double h = MT_MIN(v->issued, g1), o = opt_overlap(t, at, h);
            w[MT_WAIT_OPTIMIZER] += o;
            w[MT_WAIT_LAUNCH] += h - at - o;
            at = h;
        }
        wait_for_copy(t, v->weights, MT_WAIT_WEIGHTS, &at, g1, w);       /* 2 */
        wait_for_copy(t, v->checkpoint, MT_WAIT_CHECKPOINTS, &at, g1, w); /* 3 */
        w[MT_WAIT_LAUNCH] += g1 - at;                                     /* 4 */
        const double end = MT_MAX(v->end, g1);
        out->busy_seconds += end - g1;
        for (int k = 0; k < MT_WAIT_COUNT; k++) out->wait_seconds[k] += w[k];
        if (visits && (uint32_t)i < cap) {
            mt_timeline_visit *o = &visits[i];
            memset(o, 0, sizeof *o);
            o->unit = (uint32_t)v->unit;
            o->phase = (uint32_t)v->phase;
            o->start = before + g1;
            o->end = before + end;
            const int ci = v->weights;
            o->weights_start = ci >= 0 && ci < t->n_copies ? before + t->copy[ci].start : -1;
            o->weights_end = ci >= 0 && ci < t->n_copies ? before + t->copy[ci].end : -1;
            memcpy(o->wait_seconds, w, sizeof w);
        }
        prev = end;
    }
    out->wait_seconds[MT_WAIT_HOST] = before + MT_MAX(after - prev, 0.0);
    for (int i = 0; i < t->n_copies; i++) {
        const mt_trace_copy *c = &t->copy[i];
        const double d = MT_MAX(c->end - c->start, 0.0);
        if (c->to_host) out->d2h_seconds += d, out->d2h_bytes += c->bytes;
        else out->h2d_seconds += d, out->h2d_bytes += c->bytes;
    }
}
