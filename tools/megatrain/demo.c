/* The built-in demo: addition problems "385+47=432" in a 13-character
 * vocabulary, generated deterministically from a seed. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

int demo_tok(char c)
{
    const char *p = strchr(DEMO_VOCAB, c);
    return c && p ? (int)(p - DEMO_VOCAB) : -1;
}

char demo_chr(int id) { return id >= 0 && id < DEMO_V ? DEMO_VOCAB[id] : '?'; }

static uint64_t next_u64(uint64_t *s)
{ /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int demo_data_make(demo_data *d, int lo, int hi, int n_heldout, uint64_t seed)
{
    memset(d, 0, sizeof *d);
    int span = hi - lo + 1, n = span * span;
    if (n_heldout >= n) return -1;
    demo_problem *all = malloc((size_t)n * sizeof *all);
    if (!all) return -1;
    for (int i = 0; i < n; i++) all[i] = (demo_problem){lo + i / span, lo + i % span};
    for (int i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)(next_u64(&seed) % (uint64_t)(i + 1));
        demo_problem t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    d->heldout = all;
    d->n_heldout = n_heldout;
    d->train = all + n_heldout;
    d->n_train = n - n_heldout;
    return 0;
}

void demo_data_free(demo_data *d)
{
    free(d->heldout);
    memset(d, 0, sizeof *d);
}

/* "a+b=" into buf; returns its length. */
static int prompt_of(const demo_problem *p, char *buf, size_t n) { return snprintf(buf, n, "%d+%d=", p->a, p->b); }

void demo_fill_batch(const demo_data *d, uint64_t *rng, int n_seq, int seq_len, int32_t *tokens, int32_t *targets)
{
    demo_fill_from(d->train, d->n_train, rng, n_seq, seq_len, tokens, targets);
}

void demo_fill_from(const demo_problem *set, int n_set, uint64_t *rng, int n_seq, int seq_len, int32_t *tokens,
                    int32_t *targets)
{
    for (int s = 0; s < n_seq; s++) {
        int32_t *tok = tokens + (size_t)s * seq_len, *tg = targets + (size_t)s * seq_len;
        int pos = 0;
        for (;;) {
            const demo_problem *p = &set[next_u64(rng) % (uint64_t)n_set];
            char text[48];
            int plen = prompt_of(p, text, sizeof text);
            int len = plen + snprintf(text + plen, sizeof text - (size_t)plen, "%d\n", p->a + p->b);
            if (pos + len > seq_len) break;
            for (int i = 0; i < len; i++) tok[pos + i] = demo_tok(text[i]);
            /* predict the answer and its newline: the targets at positions plen-1 .. len-2 */
            for (int i = 0; i < len; i++) tg[pos + i] = (i >= plen - 1 && i < len - 1) ? tok[pos + i + 1] : MT_IGNORE_INDEX;
            pos += len;
        }
        for (; pos < seq_len; pos++) {
            tok[pos] = demo_tok('\n');
            tg[pos] = MT_IGNORE_INDEX;
        }
    }
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy decoding of up to max_new tokens for n prompts of equal length,
 * all at once; stops each at its newline. out[i] gets the answer text. */
#define MAX_ANSWER 8
static int decode(mt_model *m, int32_t *ctx, int n, int plen, char (*out)[MAX_ANSWER + 1])
{
    float *logits = malloc((size_t)n * DEMO_V * sizeof *logits);
    int32_t *grow = malloc((size_t)n * (plen + MAX_ANSWER) * sizeof *grow);
    int *done = calloc((size_t)n, sizeof *done);
    if (!logits || !grow || !done) {
        free(logits), free(grow), free(done);
        return -1;
    }
    for (int i = 0; i < n; i++) out[i][0] = '\0';
    int len = plen, rc = 0;
    memcpy(grow, ctx, (size_t)n * plen * sizeof *grow);
    for (int step = 0; step < MAX_ANSWER; step++) {
        mt_status st = mt_model_logits(m, grow, (uint32_t)n, (uint32_t)len, logits);
        if (st != MT_OK) {
            fprintf(stderr, "megatrain: %s\n", mt_model_errmsg(m));
            rc = -1;
            break;
        }
        int32_t *next = malloc((size_t)n * (len + 1) * sizeof *next);
        if (!next) { rc = -1; break; }
        int live = 0;
        for (int i = 0; i < n; i++) {
            int t = argmax(logits + (size_t)i * DEMO_V, DEMO_V);
            memcpy(next + (size_t)i * (len + 1), grow + (size_t)i * len, (size_t)len * sizeof *next);
            next[(size_t)i * (len + 1) + len] = t;
            if (done[i]) continue;
            if (demo_chr(t) == '\n') { done[i] = 1; continue; }
            size_t k = strlen(out[i]);
            out[i][k] = demo_chr(t);
            out[i][k + 1] = '\0';
            live++;
        }
        free(grow);
        grow = next;
        len++;
        if (!live) break;
    }
    free(logits), free(grow), free(done);
    return rc;
}

int demo_accuracy(mt_model *m, const demo_problem *p, int n, int *n_done)
{
    int right = 0;
    *n_done = 0;
    /* group prompts by length so each group decodes as one batch */
    for (int plen = 4; plen <= 24; plen++) {
        int cnt = 0;
        char buf[48];
        for (int i = 0; i < n; i++) cnt += prompt_of(&p[i], buf, sizeof buf) == plen;
        if (!cnt) continue;
        int32_t *ctx = malloc((size_t)cnt * plen * sizeof *ctx);
        int *idx = malloc((size_t)cnt * sizeof *idx);
        char(*ans)[MAX_ANSWER + 1] = malloc((size_t)cnt * sizeof *ans);
        if (!ctx || !idx || !ans) {
            free(ctx), free(idx), free(ans);
            return -1;
        }
        int k = 0;
        for (int i = 0; i < n; i++)
            if (prompt_of(&p[i], buf, sizeof buf) == plen) {
                for (int j = 0; j < plen; j++) ctx[(size_t)k * plen + j] = demo_tok(buf[j]);
                idx[k++] = i;
            }
        if (decode(m, ctx, cnt, plen, ans) == 0)
            for (k = 0; k < cnt; k++) {
                char want[16];
                snprintf(want, sizeof want, "%d", p[idx[k]].a + p[idx[k]].b);
                right += strcmp(ans[k], want) == 0;
                (*n_done)++;
            }
        free(ctx), free(idx), free(ans);
    }
    return right;
}

int demo_answer(mt_model *m, const char *prompt, char *out, size_t out_len)
{
    int plen = (int)strlen(prompt);
    int32_t ctx[64];
    if (plen == 0 || plen > 48) return -1;
    for (int i = 0; i < plen; i++)
        if ((ctx[i] = demo_tok(prompt[i])) < 0) return -1;
    char ans[1][MAX_ANSWER + 1];
    if (decode(m, ctx, 1, plen, ans)) return -1;
    snprintf(out, out_len, "%s", ans[0]);
    return 0;
}
