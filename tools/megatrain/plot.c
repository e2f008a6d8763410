/* megatrain plot: the loss curves of training logs (train --log-file) as a
 * standalone SVG, and one summary line per log. */
#define _GNU_SOURCE
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Points drawn per curve: about two per pixel column; more only make the
 * file bigger and the viewer slower. */
#define MAX_DRAWN 2000
#define MAX_MARKERS 200
#define MAX_TICKS 64

static const char plot_help[] =
    "usage: megatrain plot LOG.jsonl [LOG.jsonl ...] -o FILE.svg [options]\n"
    "\n"
    "Draws the loss curves of training logs (megatrain train --log-file) as a\n"
    "standalone SVG: the training loss of every step as a line, the held-out loss\n"
    "where it was measured as a line with points, a colour pair per log. Prints a\n"
    "line per log: the steps covered, the first and last training loss, and the\n"
    "best held-out loss with its step. A step logged twice is taken from its later\n"
    "line; losses that were not finite (null in the log) are left out.\n"
    "\n"
    "options:\n"
    "  -o, --out FILE     the SVG to write (required); replaced whole, never half-written\n"
    "  --title TEXT       the title above the plot (default: the logs' file names)\n"
    "  --log-y            a logarithmic loss axis\n"
    "  --width PX         the image's width (default 800)\n"
    "  --height PX        the image's height (default 500)\n";

typedef struct point { double x, y; } point;

/* One logged step; a loss is NAN where the line has none or it was not finite. */
typedef struct record {
    long long step;
    double loss, heldout;
    size_t line;
} record;

typedef struct run_log {
    const char *path, *name; /* name: what the legend and the title call it */
    record *rec;
    size_t n, cap;
    point *train, *held;     /* the points drawn, in data units */
    size_t n_train, n_held;
} run_log;

typedef struct axis {
    double lo, hi;
    int logarithmic, n, decimals; /* decimals < 0: labels as %g */
    double tick[MAX_TICKS];
} axis;

typedef struct plot {
    const char *out, *title;
    int width, height, log_y;
    run_log *runs;
    int n_runs;
    axis x, y;
    double left, top, pw, ph; /* the plot area, in pixels */
} plot;

/* ---- reading a log ------------------------------------------------------------ */

enum { FIELD_ABSENT, FIELD_NUMBER, FIELD_NONFINITE, FIELD_WRONG };

/* The writer prints NaN and infinities as null; a number beyond a double's
 * range parses as an infinity. */
static int number_field(const cJSON *o, const char *key, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = NAN;
    if (!it) return FIELD_ABSENT;
    if (cJSON_IsNull(it)) return FIELD_NONFINITE;
    if (!cJSON_IsNumber(it)) return FIELD_WRONG;
    if (!isfinite(it->valuedouble)) return FIELD_NONFINITE;
    *v = it->valuedouble;
    return FIELD_NUMBER;
}

static const char not_json[] = "not a JSON object";

/* Fills *r from one line (NUL-terminated at len); returns what is wrong with
 * it, or NULL. Adds the non-finite losses it holds to *nonfinite. Keys other
 * than these three are ignored: the format may grow. */
static const char *parse_line(const char *s, size_t len, record *r, size_t *nonfinite)
{
    cJSON *o = cJSON_ParseWithLengthOpts(s, len + 1, NULL, 1);
    const char *err = NULL;
    double step;
    if (!cJSON_IsObject(o)) err = not_json;
    else if (number_field(o, "step", &step) != FIELD_NUMBER) err = "no numeric \"step\"";
    else if (step < 0 || step > 9007199254740992.0 || step != floor(step)) err = "\"step\" is not a whole number >= 0";
    else {
        const int l = number_field(o, "loss", &r->loss), h = number_field(o, "heldout_loss", &r->heldout);
        if (l == FIELD_ABSENT || l == FIELD_WRONG) err = "no numeric \"loss\"";
        else if (h == FIELD_WRONG) err = "\"heldout_loss\" is not a number";
        *nonfinite += (size_t)(l == FIELD_NONFINITE) + (size_t)(h == FIELD_NONFINITE);
        r->step = (long long)step;
    }
    cJSON_Delete(o);
    return err;
}

static void add_record(run_log *r, const record *rec)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 1024;
        record *grown = realloc(r->rec, r->cap * sizeof *grown);
        if (!grown) cli_die("out of memory");
        r->rec = grown;
    }
    r->rec[r->n++] = *rec;
}

/* Every line of r->path into r->rec, in file order; exits on a bad line. */
static void read_log(run_log *r)
{
    FILE *f = fopen(r->path, "r");
    if (!f) cli_die("plot: %s: %s", r->path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, lineno = 0, nonfinite = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        size_t len = (size_t)got;
        const int complete = line[len - 1] == '\n';
        lineno++;
        while (len && strchr(" \t\r\n", line[len - 1])) len--;
        line[len] = '\0';
        if (strspn(line, " \t") == len) continue; /* an empty line */
        record rec = {.line = lineno};
        const char *err = strlen(line) != len ? "a NUL byte in the line" : parse_line(line, len, &rec, &nonfinite);
        if (err == not_json && !complete) {
            /* a run still writing: its last line is not all there yet */
            fprintf(stderr, "megatrain: warning: %s:%zu: the last line is incomplete; left out\n", r->path, lineno);
            break;
        }
        if (err) {
            fclose(f);
            free(line);
            cli_die("plot: %s:%zu: %s", r->path, lineno, err);
        }
        add_record(r, &rec);
    }
    const int failed = ferror(f), e = errno;
    fclose(f);
    free(line);
    if (failed) cli_die("plot: reading %s: %s", r->path, strerror(e));
    if (nonfinite)
        fprintf(stderr, "megatrain: warning: %s: %zu non-finite loss%s (null) left out\n", r->path, nonfinite,
                nonfinite == 1 ? "" : "es");
}

static int by_step_then_line(const void *pa, const void *pb)
{
    const record *a = pa, *b = pb;
    if (a->step != b->step) return a->step < b->step ? -1 : 1;
    return a->line < b->line ? -1 : a->line > b->line;
}

/* Sorts by step; of a step logged more than once the later line wins (a
 * resumed run writes its steps again). Logs are almost always in order
 * already, which costs one pass. */
static void order_steps(run_log *r)
{
    size_t i = 1;
    while (i < r->n && r->rec[i].step > r->rec[i - 1].step) i++;
    if (i >= r->n) return;
    qsort(r->rec, r->n, sizeof *r->rec, by_step_then_line);
    size_t k = 0;
    for (i = 0; i < r->n; i++)
        if (i + 1 == r->n || r->rec[i + 1].step != r->rec[i].step) r->rec[k++] = r->rec[i];
    r->n = k;
}

/* ---- the summary line ---------------------------------------------------------- */

typedef struct summary {
    const record *first, *last, *best; /* training loss; best held-out */
    size_t n;                          /* steps with a finite training loss */
} summary;

static summary summarize(const run_log *r)
{
    summary s = {0};
    for (size_t i = 0; i < r->n; i++) {
        const record *q = &r->rec[i];
        if (isfinite(q->loss)) {
            if (!s.first) s.first = q;
            s.last = q, s.n++;
        }
        if (isfinite(q->heldout) && (!s.best || q->heldout < s.best->heldout)) s.best = q;
    }
    return s;
}

static void print_summary(const run_log *r, const summary *s)
{
    if (s->n == 1) printf("%s: step %lld (1 logged), training loss %.4f", r->path, s->first->step, s->first->loss);
    else printf("%s: steps %lld-%lld (%zu logged), training loss %.4f -> %.4f", r->path, s->first->step,
                s->last->step, s->n, s->first->loss, s->last->loss);
    if (s->best) printf(", best held-out %.4f at step %lld\n", s->best->heldout, s->best->step);
    else printf(", no held-out loss\n");
}

/* ---- the points drawn ------------------------------------------------------------- */

/* The bucket of x when [x0, ...] is cut into n of width 1 / scale. */
static size_t bucket_of(double x, double x0, double scale, size_t n)
{
    const size_t b = (size_t)((x - x0) * scale);
    return b < n ? b : n - 1;
}

/* Thins points sorted by x to at most max (even): the x range is cut into
 * max / 2 equal buckets, each keeping its lowest and its highest point in x
 * order, so a one-step spike stays as tall as it was. */
static size_t downsample(const point *in, size_t n, point *out, size_t max)
{
    if (n <= max) {
        if (n) memcpy(out, in, n * sizeof *in);
        return n;
    }
    const size_t buckets = max / 2;
    const double x0 = in[0].x, scale = (double)buckets / (in[n - 1].x - x0);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const size_t b = bucket_of(in[i].x, x0, scale, buckets);
        size_t lo = i, hi = i;
        for (i++; i < n && bucket_of(in[i].x, x0, scale, buckets) == b; i++) {
            if (in[i].y < in[lo].y) lo = i;
            if (in[i].y > in[hi].y) hi = i;
        }
        out[k++] = in[lo < hi ? lo : hi];
        if (lo != hi) out[k++] = in[lo < hi ? hi : lo];
    }
    return k;
}

/* One loss of a log as points to draw: the finite values (on a logarithmic
 * axis, the positive ones), thinned. Returns how many were <= 0 on a
 * logarithmic axis. */
static size_t make_series(const run_log *r, int heldout, int log_y, point **out, size_t *n_out)
{
    point *all = malloc((r->n ? r->n : 1) * sizeof *all);
    *out = malloc((r->n < MAX_DRAWN ? (r->n ? r->n : 1) : MAX_DRAWN) * sizeof **out);
    if (!all || !*out) cli_die("out of memory");
    size_t n = 0, nonpositive = 0;
    for (size_t i = 0; i < r->n; i++) {
        const double v = heldout ? r->rec[i].heldout : r->rec[i].loss;
        if (!isfinite(v)) continue;
        if (log_y && v <= 0) {
            nonpositive++;
            continue;
        }
        all[n++] = (point){(double)r->rec[i].step, v};
    }
    *n_out = downsample(all, n, *out, MAX_DRAWN);
    free(all);
    return nonpositive;
}

/* ---- axes ---------------------------------------------------------------------------- */

/* A 1, 2 or 5 times a power of ten near span / target. */
static double nice_step(double span, int target)
{
    const double raw = span / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static int decimals_of(double step) { return step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9); }

static void add_tick(axis *a, double v)
{
    if (a->n < MAX_TICKS) a->tick[a->n++] = v;
}

/* A linear axis widened to the nice ticks around [lo, hi]. */
static void linear_axis(axis *a, double lo, double hi, int target, int whole)
{
    double st = nice_step(hi - lo, target);
    if (whole && st < 1) st = 1;
    const double k0 = floor(lo / st + 1e-9), k1 = ceil(hi / st - 1e-9);
    a->lo = k0 * st, a->hi = k1 * st, a->logarithmic = 0, a->n = 0, a->decimals = decimals_of(st);
    for (double k = k0; k <= k1; k++) add_tick(a, k == 0 ? 0 : k * st);
}

/* A logarithmic axis over exactly [lo, hi]: a range of decades is ticked at
 * powers of ten, a shorter one at 1, 2 and 5 times them, else at every digit,
 * whichever first gives three ticks; a range narrower still at linear 1-2-5
 * steps. Widening it to the next ticks would waste much of the height. */
static void log_axis(axis *a, double lo, double hi, int target)
{
    static const double digits[3][9] = {{1}, {1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
    static const int n_digits[3] = {1, 3, 9};
    const int e0 = (int)floor(log10(lo)), e1 = (int)ceil(log10(hi));
    a->lo = lo, a->hi = hi, a->logarithmic = 1, a->decimals = -1;
    for (int s = 0; s < 3; s++) {
        const int every = s == 0 ? (e1 - e0 + target - 1) / target : 1; /* thin a range of many decades */
        a->n = 0;
        for (int e = e0; e <= e1; e++)
            for (int d = 0; d < n_digits[s]; d++) {
                const double v = digits[s][d] * pow(10, e);
                if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9) && (e - e0) % (every ? every : 1) == 0)
                    add_tick(a, v);
            }
        if (a->n >= 3) return;
    }
    const double st = nice_step(hi - lo, target);
    a->n = 0, a->decimals = decimals_of(st);
    for (double k = ceil(lo / st - 1e-9); k * st <= hi * (1 + 1e-9); k++) add_tick(a, k * st);
}

/* The fraction of the axis' length at which v lies. */
static double axis_frac(const axis *a, double v)
{
    return a->logarithmic ? log(v / a->lo) / log(a->hi / a->lo) : (v - a->lo) / (a->hi - a->lo);
}

static double px_x(const plot *p, double v) { return p->left + axis_frac(&p->x, v) * p->pw; }
static double px_y(const plot *p, double v) { return p->top + (1 - axis_frac(&p->y, v)) * p->ph; }

static int clamp_int(double v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : (int)v; }

/* The plot area and both axes from the points drawn. */
static void layout(plot *p)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < p->n_runs; i++)
        for (int h = 0; h < 2; h++) {
            const run_log *r = &p->runs[i];
            const point *pt = h ? r->held : r->train;
            for (size_t k = 0, n = h ? r->n_held : r->n_train; k < n; k++) {
                x0 = fmin(x0, pt[k].x), x1 = fmax(x1, pt[k].x);
                y0 = fmin(y0, pt[k].y), y1 = fmax(y1, pt[k].y);
            }
        }
    p->left = 64, p->top = p->title[0] ? 40 : 16;
    p->pw = p->width - p->left - 20, p->ph = p->height - p->top - 46;
    if (x1 - x0 < 1) x0 -= 1, x1 += 1;
    linear_axis(&p->x, x0, x1, clamp_int(p->pw / 100, 2, 12), 1);
    const int target = clamp_int(p->ph / 45, 2, 12);
    if (p->log_y) {
        /* a margin of 3% of the height above and below the curves */
        const double pad = y1 > y0 ? exp(0.03 * (log(y1) - log(y0))) : 1.5;
        log_axis(&p->y, y0 / pad, y1 * pad, target);
    } else {
        double pad = (y1 - y0) * 0.03;
        if (pad < 1e-9 * fmax(1, fabs(y1))) pad = fabs(y1) > 0 ? fabs(y1) * 0.1 : 1;
        linear_axis(&p->y, y0 >= 0 && y0 - pad < 0 ? 0 : y0 - pad, y1 + pad, target, 0);
    }
}

/* ---- SVG ------------------------------------------------------------------------------- */

/* The length of the UTF-8 character at s if XML allows it, else 0. */
static int xml_char(const unsigned char *s)
{
    if (s[0] < 0x80) return s[0] >= 0x20 || s[0] == '\t' || s[0] == '\n';
    const int n = s[0] >= 0xc2 && s[0] <= 0xdf   ? 2
                  : s[0] >= 0xe0 && s[0] <= 0xef ? 3
                  : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4
                                                 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    /* overlong forms, surrogates, beyond U+10FFFF, and U+FFFE and U+FFFF */
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) || (s[0] == 0xf0 && s[1] < 0x90) ||
        (s[0] == 0xf4 && s[1] >= 0x90) || (s[0] == 0xef && s[1] == 0xbf && s[2] >= 0xbe))
        return 0;
    return n;
}

/* Characters in s as svg_text writes them (a byte XML refuses counts as one). */
static size_t text_len(const char *s)
{
    size_t n = 0;
    for (const unsigned char *u = (const unsigned char *)s; *u; n++) {
        const int k = xml_char(u);
        u += k ? k : 1;
    }
    return n;
}

/* s as XML text: escaped, with bytes that are not characters XML allows (a
 * file name need not be UTF-8) as '?', cut to max characters with an ellipsis. */
static void svg_text(FILE *f, const char *s, size_t max)
{
    const size_t n = text_len(s), keep = n <= max ? n : max ? max - 1 : 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < keep; i++) {
        const int k = xml_char(u);
        if (!k) fputc('?', f);
        else if (*u == '&') fputs("&amp;", f);
        else if (*u == '<') fputs("&lt;", f);
        else if (*u == '>') fputs("&gt;", f);
        else if (*u == '"') fputs("&quot;", f);
        else fwrite(u, 1, (size_t)k, f);
        u += k ? k : 1;
    }
    if (keep < n) fputs("\xe2\x80\xa6", f);
}

/* Characters of text of size font that fit in px: the average sans-serif
 * glyph is about 0.6 em wide, and no font is embedded to measure with. */
static size_t fit_chars(double px, double font) { return px > 0 ? (size_t)(px / (0.6 * font)) : 0; }

/* Steps as 0, 500, 20k, 1.5M. */
static void fmt_step(char *buf, size_t n, double v)
{
    if (fabs(v) >= 1e6 && fmod(v, 1e5) == 0) snprintf(buf, n, "%gM", v / 1e6);
    else if (fabs(v) >= 1e4 && fmod(v, 1e2) == 0) snprintf(buf, n, "%gk", v / 1e3);
    else snprintf(buf, n, "%.0f", v);
}

static void fmt_loss(char *buf, size_t n, const axis *a, double v)
{
    if (a->decimals >= 0) snprintf(buf, n, "%.*f", a->decimals, v);
    else snprintf(buf, n, "%g", v);
}

static void write_axes(FILE *f, const plot *p)
{
    const double bottom = p->top + p->ph, right = p->left + p->pw;
    char label[32];
    fprintf(f, "<g stroke=\"#e6e6e6\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n");
    for (int i = 0; i < p->x.n; i++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", px_x(p, p->x.tick[i]), p->top,
                px_x(p, p->x.tick[i]), bottom);
    for (int i = 0; i < p->y.n; i++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", p->left, px_y(p, p->y.tick[i]), right,
                px_y(p, p->y.tick[i]));
    fprintf(f, "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\" "
               "shape-rendering=\"crispEdges\"/>\n", p->left, p->top, p->pw, p->ph);
    fprintf(f, "<g fill=\"#444\">\n");
    for (int i = 0; i < p->x.n; i++) {
        fmt_step(label, sizeof label, p->x.tick[i]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px_x(p, p->x.tick[i]),
                bottom + 16, label);
    }
    for (int i = 0; i < p->y.n; i++) {
        fmt_loss(label, sizeof label, &p->y, p->y.tick[i]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" dy=\"0.35em\" text-anchor=\"end\">%s</text>\n", p->left - 6,
                px_y(p, p->y.tick[i]), label);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">step</text>\n",
            p->left + p->pw / 2, p->height - 10);
    fprintf(f, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">%s</text>\n",
            p->top + p->ph / 2, p->log_y ? "loss (log scale)" : "loss");
    fprintf(f, "</g>\n");
}

/* A colour pair per log: training, held-out. */
static const char *const colours[][2] = {
    {"#1f77b4", "#ff7f0e"}, {"#2ca02c", "#d62728"}, {"#9467bd", "#8c564b"}, {"#17becf", "#e377c2"},
    {"#7f7f7f", "#bcbd22"},
};
#define N_COLOURS (int)(sizeof colours / sizeof colours[0])

/* Markers on a held-out curve only while they stay apart. */
static int held_markers(const run_log *r) { return r->n_held <= MAX_MARKERS; }

static void write_curve(FILE *f, const plot *p, const point *pt, size_t n, const char *colour, double width,
                        int markers, int dashed)
{
    if (n > 1) {
        fprintf(f, "<polyline stroke=\"%s\" stroke-width=\"%.1f\"%s points=\"", colour, width,
                dashed ? " stroke-dasharray=\"6 3\"" : "");
        for (size_t k = 0; k < n; k++) fprintf(f, "%s%.1f,%.1f", k ? " " : "", px_x(p, pt[k].x), px_y(p, pt[k].y));
        fprintf(f, "\"/>\n");
    }
    if (!markers && n != 1) return;
    fprintf(f, "<g fill=\"%s\" stroke=\"white\" stroke-width=\"0.8\">\n", colour);
    for (size_t k = 0; k < n; k++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", px_x(p, pt[k].x), px_y(p, pt[k].y));
    fprintf(f, "</g>\n");
}

/* Training curves first, so the sparser held-out ones stay visible on top.
 * Logs beyond the palette reuse it with dashed lines. */
static void write_curves(FILE *f, const plot *p)
{
    fprintf(f, "<clipPath id=\"area\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n",
            p->left - 5, p->top - 5, p->pw + 10, p->ph + 10);
    fprintf(f, "<g clip-path=\"url(#area)\" fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\">\n");
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < p->n_runs; i++) {
            const run_log *r = &p->runs[i];
            const char *c = colours[i % N_COLOURS][h];
            if (h) write_curve(f, p, r->held, r->n_held, c, 1.8, held_markers(r), i >= N_COLOURS);
            else write_curve(f, p, r->train, r->n_train, c, 1.2, 0, i >= N_COLOURS);
        }
    fprintf(f, "</g>\n");
}

/* ---- the legend ----------------------------------------------------------------------- */

#define LEGEND_ROW 17
#define LEGEND_PAD 8
#define LEGEND_SWATCH 24

typedef struct legend {
    int rows;
    size_t name_chars; /* of a log's name, as cut to fit */
    double x, y, w, h;
} legend;

/* How many of the curves' pixels fall in the box: points and, for sparse
 * held-out lines, places along their segments. */
static size_t covered(const plot *p, double x, double y, double w, double h)
{
    size_t hits = 0;
    for (int i = 0; i < p->n_runs; i++)
        for (int s = 0; s < 2; s++) {
            const point *pt = s ? p->runs[i].held : p->runs[i].train;
            const size_t n = s ? p->runs[i].n_held : p->runs[i].n_train;
            for (size_t k = 0; k < n; k++) {
                const point a = {px_x(p, pt[k].x), px_y(p, pt[k].y)};
                const point b = k + 1 < n ? (point){px_x(p, pt[k + 1].x), px_y(p, pt[k + 1].y)} : a;
                for (int t = 0; t < 4 && (t == 0 || k + 1 < n); t++) {
                    const double sx = a.x + t / 4.0 * (b.x - a.x), sy = a.y + t / 4.0 * (b.y - a.y);
                    hits += sx >= x - 4 && sx <= x + w + 4 && sy >= y - 4 && sy <= y + h + 4;
                }
            }
        }
    return hits;
}

/* The legend's size, and the corner of the plot area where it hides the
 * least of the curves (a falling loss leaves the top right empty). */
static legend place_legend(const plot *p)
{
    legend g = {0};
    size_t longest = 0;
    for (int i = 0; i < p->n_runs; i++) {
        g.rows += 1 + (p->runs[i].n_held > 0);
        if (text_len(p->runs[i].name) > longest) longest = text_len(p->runs[i].name);
    }
    const size_t fixed = p->n_runs > 1 ? strlen(" training") : strlen("held-out loss");
    const size_t room = fit_chars(p->pw * 0.6 - 2 * LEGEND_PAD - LEGEND_SWATCH - 6, 11);
    g.name_chars = p->n_runs > 1 ? (room > fixed + 4 ? room - fixed : 4) : 0;
    const size_t chars = fixed + (longest < g.name_chars ? longest : g.name_chars);
    g.w = 2 * LEGEND_PAD + LEGEND_SWATCH + 6 + chars * 0.6 * 11;
    g.h = 2 * LEGEND_PAD + g.rows * LEGEND_ROW - 5;
    const double inset = 10, l = p->left + inset, r = p->left + p->pw - inset - g.w;
    const double t = p->top + inset, b = p->top + p->ph - inset - g.h;
    const double corners[4][2] = {{r, t}, {l, b}, {l, t}, {r, b}};
    size_t best = (size_t)-1;
    for (int c = 0; c < 4; c++) {
        const size_t hits = covered(p, corners[c][0], corners[c][1], g.w, g.h);
        if (hits < best) best = hits, g.x = corners[c][0], g.y = corners[c][1];
    }
    return g;
}

static void legend_row(FILE *f, const plot *p, const legend *g, int row, const char *colour, int held, int marker,
                       const char *name)
{
    const double y = g->y + LEGEND_PAD + row * LEGEND_ROW + 6, x = g->x + LEGEND_PAD;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%s\"/>\n", x, y,
            x + LEGEND_SWATCH, y, colour, held ? "1.8" : "1.5");
    if (marker)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.8\"/>\n",
                x + LEGEND_SWATCH / 2.0, y, colour);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" dy=\"0.35em\">", x + LEGEND_SWATCH + 6, y);
    if (p->n_runs > 1) {
        svg_text(f, name, g->name_chars);
        fputs(held ? " held-out" : " training", f);
    } else {
        fputs(held ? "held-out loss" : "training loss", f);
    }
    fputs("</text>\n", f);
}

static void write_legend(FILE *f, const plot *p)
{
    const legend g = place_legend(p);
    fprintf(f, "<g fill=\"#333\">\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"3\" fill=\"white\" "
               "fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n", g.x, g.y, g.w, g.h);
    int row = 0;
    for (int i = 0; i < p->n_runs; i++) {
        const run_log *r = &p->runs[i];
        legend_row(f, p, &g, row++, colours[i % N_COLOURS][0], 0, 0, r->name);
        if (r->n_held) legend_row(f, p, &g, row++, colours[i % N_COLOURS][1], 1, held_markers(r), r->name);
    }
    fprintf(f, "</g>\n");
}

static void write_svg(FILE *f, const plot *p)
{
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", p->width, p->height, p->width, p->height);
    fputs("<title>", f);
    svg_text(f, p->title[0] ? p->title : "loss", (size_t)-1);
    fputs("</title>\n", f);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    if (p->title[0]) {
        fprintf(f, "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\" "
                   "fill=\"#222\">", p->width / 2.0);
        svg_text(f, p->title, fit_chars(p->width - 20, 14));
        fputs("</text>\n", f);
    }
    write_axes(f, p);
    write_curves(f, p);
    write_legend(f, p);
    fputs("</svg>\n", f);
}

/* Writes to a temporary file beside the output and renames it into place:
 * a reader never sees half a plot, and a failure leaves the old one. */
static int save_svg(const plot *p)
{
    const size_t n = strlen(p->out) + 8;
    char *tmp = malloc(n);
    if (!tmp) cli_die("out of memory");
    snprintf(tmp, n, "%s.XXXXXX", p->out);
    const int fd = mkstemp(tmp);
    int e = errno, ok = fd >= 0;
    FILE *f = NULL;
    if (ok) {
        const mode_t mask = umask(0);
        umask(mask);
        if (fchmod(fd, 0666 & ~mask) != 0 || !(f = fdopen(fd, "w"))) ok = 0, e = errno; /* not mkstemp's 0600 */
    }
    if (f) {
        write_svg(f, p);
        if (ferror(f) || fflush(f) != 0 || fsync(fd) != 0) ok = 0, e = errno ? errno : EIO;
        if (fclose(f) != 0 && ok) ok = 0, e = errno;
    } else if (fd >= 0) {
        close(fd);
    }
    if (ok && rename(tmp, p->out) != 0) ok = 0, e = errno;
    if (!ok) {
        if (fd >= 0) unlink(tmp);
        fprintf(stderr, "megatrain: plot: cannot write %s: %s\n", p->out, strerror(e));
    }
    free(tmp);
    return !ok;
}

/* ---- the command --------------------------------------------------------------------------- */

/* Returns 1 for --help; the logs go to p->runs, which has room for argc. */
static int parse_plot(int argc, char **argv, plot *p)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return 1;
        else if (cli_opt(argc, argv, &i, "-o", &v) || cli_opt(argc, argv, &i, "--out", &v)) p->out = v;
        else if (cli_opt(argc, argv, &i, "--title", &v)) p->title = v;
        else if (cli_opt(argc, argv, &i, "--width", &v)) p->width = (int)cli_int("--width", v, 200, 20000);
        else if (cli_opt(argc, argv, &i, "--height", &v)) p->height = (int)cli_int("--height", v, 150, 20000);
        else if (cli_flag(argv, i, "--log-y")) p->log_y = 1;
        else if (argv[i][0] == '-' && argv[i][1])
            cli_die("plot: unknown option '%s' (see megatrain plot --help)", argv[i]);
        else p->runs[p->n_runs++].path = argv[i];
    }
    return 0;
}

/* "-o run.jsonl" for "-o run.svg" would replace a log with its plot. */
static void refuse_log_as_output(const plot *p)
{
    struct stat o, l;
    if (stat(p->out, &o) != 0) return;
    for (int i = 0; i < p->n_runs; i++)
        if (stat(p->runs[i].path, &l) == 0 && l.st_dev == o.st_dev && l.st_ino == o.st_ino)
            cli_die("plot: -o %s would overwrite the log %s", p->out, p->runs[i].path);
}

/* Legend names: the files' base names, or the paths as given where two logs
 * share a base name (run1/log.jsonl, run2/log.jsonl). */
static void name_runs(plot *p)
{
    int clash = 0;
    for (int i = 0; i < p->n_runs; i++) {
        const char *slash = strrchr(p->runs[i].path, '/');
        p->runs[i].name = slash && slash[1] ? slash + 1 : p->runs[i].path;
        for (int j = 0; j < i; j++) clash |= !strcmp(p->runs[i].name, p->runs[j].name);
    }
    for (int i = 0; clash && i < p->n_runs; i++) p->runs[i].name = p->runs[i].path;
}

/* The default title: the logs' names, comma-separated. */
static char *default_title(const plot *p)
{
    size_t n = 1;
    for (int i = 0; i < p->n_runs; i++) n += strlen(p->runs[i].name) + 2;
    char *t = malloc(n);
    if (!t) cli_die("out of memory");
    t[0] = '\0';
    for (int i = 0; i < p->n_runs; i++) {
        if (i) strcat(t, ", ");
        strcat(t, p->runs[i].name);
    }
    return t;
}

/* Reads, checks and summarises every log; then the points to draw. */
static void load_runs(plot *p)
{
    for (int i = 0; i < p->n_runs; i++) {
        run_log *r = &p->runs[i];
        read_log(r);
        order_steps(r);
        if (!r->n) cli_die("plot: %s: no log lines in it", r->path);
        if (!summarize(r).n) cli_die("plot: %s: no line with a finite training loss", r->path);
    }
    for (int i = 0; i < p->n_runs; i++) {
        const summary s = summarize(&p->runs[i]);
        print_summary(&p->runs[i], &s);
    }
    size_t drawn = 0;
    for (int i = 0; i < p->n_runs; i++) {
        run_log *r = &p->runs[i];
        const size_t left_out = make_series(r, 0, p->log_y, &r->train, &r->n_train) +
                                make_series(r, 1, p->log_y, &r->held, &r->n_held);
        if (left_out)
            fprintf(stderr, "megatrain: warning: %s: %zu loss%s <= 0 left off the logarithmic axis\n", r->path,
                    left_out, left_out == 1 ? "" : "es");
        drawn += r->n_train + r->n_held;
    }
    if (!drawn) cli_die("plot: --log-y: no loss above 0 to draw");
}

int cmd_plot(int argc, char **argv)
{
    plot p = {.width = 800, .height = 500};
    if (!(p.runs = calloc((size_t)argc, sizeof *p.runs))) cli_die("out of memory");
    if (parse_plot(argc, argv, &p)) {
        fputs(plot_help, stdout);
        free(p.runs);
        return 0;
    }
    if (!p.n_runs) cli_die("plot: no log given (see megatrain plot --help)");
    if (!p.out) cli_die("plot: give the SVG to write with -o FILE");
    refuse_log_as_output(&p);
    name_runs(&p);
    load_runs(&p);
    char *title = p.title ? NULL : default_title(&p);
    if (title) p.title = title;
    layout(&p);
    const int rc = save_svg(&p);
    for (int i = 0; i < p.n_runs; i++) {
        free(p.runs[i].rec);
        free(p.runs[i].train);
        free(p.runs[i].held);
    }
    free(p.runs);
    free(title);
    return rc;
}
