/* A step's timeline: what the backend's events and the engine's clock
 * recorded (mt_trace), and the split of the step's wall time into the
 * compute stream's busy time and the causes of its idle time (mt_trace_split).
 *
 * Times are seconds from the step's origin: the moment the engine started
 * the trace, when the compute stream was idle, so that an event recorded on
 * it then completes at once and host and device clocks share that zero.
 * Device times come from cudaEventElapsedTime against the origin event;
 * host times from the engine's monotonic clock minus the origin's. */
#ifndef MT_TIMELINE_H
#define MT_TIMELINE_H

#include "core/internal.h"

enum { MT_COPY_WEIGHTS, MT_COPY_CHECKPOINT, MT_COPY_GRADIENTS };
enum { MT_TRACE_OFF, MT_TRACE_MARKS, MT_TRACE_FULL };

typedef struct mt_trace_visit {
    int unit, phase;  /* mt_phase */
    double issued;    /* host: the engine began issuing it */
    double start;     /* device: the compute stream began it (after its waits) */
    double end;       /* device: the compute stream finished it */
    int weights;      /* the weight copy it waited for, or -1 */
    int checkpoint;   /* the checkpoint copy it waited for, or -1 */
} mt_trace_visit;

typedef struct mt_trace_copy {
    int to_host;      /* 0: host-to-device stream, 1: device-to-host */
    int kind;         /* MT_COPY_* */
    uint64_t bytes;
    double issued;    /* host: the backend issued it */
    double start, end;/* device */
} mt_trace_copy;

typedef struct mt_trace_span {
    double from, to;  /* host: an interval the engine spent waiting for the optimizer */
} mt_trace_span;

typedef struct mt_trace {
    int level;             /* MT_TRACE_* */
    double origin;         /* host clock at the origin */
    double head_start;     /* device: the head's first micro-batch began (MARKS and FULL) */
    int n_visits, n_copies, n_opt;
    int cap_visits, cap_copies, cap_opt;
    mt_trace_visit *visit;
    mt_trace_copy *copy;
    mt_trace_span *opt;
} mt_trace;

/* Sizes the arrays for a step of n_visits visits and n_copies copies (FULL) and clears the counts. */
int mt_trace_reset(mt_trace *t, int level, int n_visits, int n_copies);
void mt_trace_free(mt_trace *t);

/* Splits a step of wall time [-before, after] around the origin (before:
 * host seconds from the step's entry to the origin; after: from the origin
 * to the step's return) into out (its struct_size already set; every field
 * else is written) and, where visits is not NULL, the first cap visits. */
void mt_trace_split(const mt_trace *t, double before, double after, mt_timeline *out, mt_timeline_visit *visits,
                    uint32_t cap);

#endif
