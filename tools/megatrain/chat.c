/* Chat templates as the command-line program uses them, and text generation. */
#define _GNU_SOURCE
#include "chat.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *folder_of(const char *tok_path, char *dir, size_t size)
{
    struct stat sb;
    if (stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(dir, size, "%s", tok_path);
    } else {
        const char *slash = strrchr(tok_path, '/');
        snprintf(dir, size, "%.*s", slash ? (int)(slash - tok_path) : 1, slash ? tok_path : ".");
    }
    return dir;
}

mt_chat_template *chat_template_open(const char *tok_path, const char *named, char *why, size_t why_len)
{
    char dir[4200];
    const char *from = named ? named : folder_of(tok_path, dir, sizeof dir);
    mt_chat_template *t = NULL;
    const mt_status st = mt_chat_template_load(&t, from);
    if (st == MT_OK) return t;
    /* a folder without a template is an error only for the conversations that need one */
    if (!named && st == MT_ERR_IO && strstr(mt_last_errmsg(), "chat")) {
        snprintf(why, why_len, "%s: give --chat-template NAME|FILE (chatml, llama3, mistral, or a template file)",
                 mt_last_errmsg());
        return NULL;
    }
    cli_die("%s", mt_last_errmsg());
}

void chat_eos(const char *tok_path, char *eos, size_t eos_len)
{
    char dir[4200], path[4300];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", folder_of(tok_path, dir, sizeof dir));
    FILE *file = fopen(path, "r");
    if (!file) return;
    char *text = NULL;
    size_t cap = 0;
    cJSON *j = getdelim(&text, &cap, '\0', file) > 0 ? cJSON_Parse(text) : NULL;
    free(text);
    fclose(file);
    if (!j) cli_die("%s is not JSON", path);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token");
    if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "content"); /* {"content": "</s>", ...} */
    if (!*eos && cJSON_IsString(e)) snprintf(eos, eos_len, "%s", e->valuestring);
    cJSON_Delete(j);
}

/* mt_chat_render's text, malloc'ed, with the generation prompt. */
static char *render_json(const mt_chat_template *t, const char *vars, const char *msgs)
{
    size_t n = 0;
    if (mt_chat_render(t, msgs, vars, MT_CHAT_ADD_GENERATION_PROMPT, NULL, 0, &n) != MT_OK)
        cli_die("%s", mt_last_errmsg());
    char *out = malloc(n + 1);
    if (!out) cli_die("out of memory");
    if (mt_chat_render(t, msgs, vars, MT_CHAT_ADD_GENERATION_PROMPT, out, n + 1, &n) != MT_OK)
        cli_die("%s", mt_last_errmsg());
    return out;
}

char *chat_prompt(const mt_chat_template *t, const char *vars, const char *system, const char *user)
{
    /* the conversation of one question, rendered as any other */
    cJSON *msgs = cJSON_CreateArray(), *m;
    if (!msgs) cli_die("out of memory");
    if (system && (!(m = cJSON_CreateObject()) || !cJSON_AddStringToObject(m, "role", "system") ||
                   !cJSON_AddStringToObject(m, "content", system) || !cJSON_AddItemToArray(msgs, m)))
        cli_die("out of memory");
    if (!(m = cJSON_CreateObject()) || !cJSON_AddStringToObject(m, "role", "user") ||
        !cJSON_AddStringToObject(m, "content", user) || !cJSON_AddItemToArray(msgs, m))
        cli_die("out of memory");
    char *out = chat_render(t, vars, msgs, cJSON_GetArraySize(msgs));
    cJSON_Delete(msgs);
    return out;
}

char *chat_render(const mt_chat_template *t, const char *vars, const cJSON *messages, int n)
{
    cJSON *first = cJSON_CreateArray();
    if (!first) cli_die("out of memory");
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_Duplicate(cJSON_GetArrayItem(messages, i), 1);
        if (!c || !cJSON_AddItemToArray(first, c)) cli_die("out of memory");
    }
    char *msgs = cJSON_PrintUnformatted(first);
    if (!msgs) cli_die("out of memory");
    char *out = render_json(t, vars, msgs);
    free(msgs);
    cJSON_Delete(first);
    return out;
}

/* Whether id is an added token marked special: text without MT_DECODE_SKIP_SPECIAL, none with it. */
static int is_special(const mt_tokenizer *tok, int32_t id)
{
    size_t with = 0, without = 0;
    return mt_tokenizer_decode(tok, &id, 1, 0, NULL, 0, &with) == MT_OK &&
           mt_tokenizer_decode(tok, &id, 1, MT_DECODE_SKIP_SPECIAL, NULL, 0, &without) == MT_OK && with && !without;
}

void chat_stops(const mt_chat_template *t, const char *vars, const mt_tokenizer *tok, const char *eos,
                int32_t stop[2])
{
    stop[0] = eos && *eos ? mt_tokenizer_token_to_id(tok, eos) : -1;
    stop[1] = -1;
    if (!t) return;
    size_t n = 0;
    if (mt_chat_end_of_turn(t, vars, NULL, 0, &n) != MT_OK) cli_die("%s", mt_last_errmsg());
    char *end = malloc(n + 1);
    int32_t ids[64];
    size_t n_ids = 0;
    if (!end) cli_die("out of memory");
    if (mt_chat_end_of_turn(t, vars, end, n + 1, &n) != MT_OK ||
        mt_tokenizer_encode(tok, end, n, MT_ENCODE_SPECIAL, ids, 64, &n_ids) != MT_OK)
        cli_die("%s", mt_last_errmsg());
    for (size_t i = 0; i < n_ids && i < 64; i++)
        if (is_special(tok, ids[i])) {
            stop[1] = ids[i];
            break;
        }
    free(end);
}

/* ---- generation -------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct cand {
    float p;
    int32_t id;
} cand;

static int by_p(const void *a, const void *b)
{
    const float x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The next id from one position's logits. */
static int32_t pick(const float *logits, uint32_t V, const gen_options *o, uint64_t *rng, cand *c)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = (int32_t)v;
    if (o->temperature <= 0) return best;
    double sum = 0;
    for (uint32_t v = 0; v < V; v++) {
        c[v].id = (int32_t)v;
        c[v].p = (float)exp((logits[v] - logits[best]) / o->temperature);
        sum += c[v].p;
    }
    qsort(c, V, sizeof *c, by_p);
    double keep = 0; /* the smallest set of the likeliest tokens that reaches top_p */
    uint32_t k = 0;
    while (k < V && (k == 0 || keep < o->top_p * sum)) keep += c[k++].p;
    double r = (double)(splitmix(rng) >> 11) * 0x1.0p-53 * keep;
    for (uint32_t i = 0; i < k; i++)
        if ((r -= c[i].p) < 0) return c[i].id;
    return c[k - 1].id;
}

char *generate(mt_model *m, const mt_tokenizer *t, const char *text, uint32_t encode_flags, const gen_options *o)
{
    mt_model_config cfg;
    mt_model_config_init(&cfg);
    mt_model_get_config(m, &cfg);
    size_t n = 0;
    if (mt_tokenizer_encode(t, text, strlen(text), encode_flags, NULL, 0, &n) != MT_OK) {
        fprintf(stderr, "megatrain: %s\n", mt_last_errmsg());
        return NULL;
    }
    const size_t first = n, cap = n + (size_t)o->max_new;
    int32_t *ids = malloc(cap * sizeof *ids);
    float *logits = malloc(cfg.vocab_size * sizeof *logits);
    cand *c = malloc(cfg.vocab_size * sizeof *c);
    size_t text_cap = 256, printed = 0, len = 0;
    char *out = malloc(text_cap);
    if (!ids || !logits || !c || !out) cli_die("out of memory");
    mt_tokenizer_encode(t, text, strlen(text), encode_flags, ids, cap, &n);
    uint64_t rng = o->seed;
    out[0] = '\0';
    for (int k = 0; k < o->max_new && n < cfg.max_position_embeddings; k++) {
        if (mt_model_logits(m, ids, 1, (uint32_t)n, logits) != MT_OK) {
            fprintf(stderr, "megatrain: %s\n", mt_model_errmsg(m));
            free(out), out = NULL;
            break;
        }
        const int32_t id = pick(logits, cfg.vocab_size, o, &rng, c);
        if (id == o->stop[0] || id == o->stop[1]) break;
        ids[n++] = id;
        /* the text of everything new, decoded whole: a character may take
         * several tokens, and only complete ones are printed */
        if (mt_tokenizer_decode(t, ids + first, n - first, MT_DECODE_SKIP_SPECIAL, out, text_cap, &len) == MT_OK &&
            len >= text_cap) {
            out = realloc(out, text_cap = 2 * len + 1);
            if (!out) cli_die("out of memory");
            mt_tokenizer_decode(t, ids + first, n - first, MT_DECODE_SKIP_SPECIAL, out, text_cap, &len);
        }
        if (o->echo && len > printed && !strstr(out + printed, "\xEF\xBF\xBD")) {
            fwrite(out + printed, 1, len - printed, stdout);
            fflush(stdout);
            printed = len;
        }
    }
    if (out && o->echo && len > printed) fwrite(out + printed, 1, len - printed, stdout);
    free(ids);
    free(logits);
    free(c);
    return out;
}
