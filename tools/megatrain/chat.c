/* Chat formats, read from a tokenizer's config, and text generation. */
#define _GNU_SOURCE
#include "chat.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const NAMES[] = {"none", "chatml", "llama3", "mistral", "auto"};

chat_format chat_format_named(const char *name)
{
    for (int k = 0; k < 5; k++)
        if (!strcmp(name, NAMES[k])) return (chat_format)k;
    cli_die("--chat-format %s: the formats are chatml, llama3, mistral, none and auto", name);
}

const char *chat_format_name(chat_format f) { return NAMES[f]; }

void chat_config(const char *tok_path, chat_format *f, char *eos, size_t eos_len)
{
    struct stat sb;
    char path[4200];
    if (stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", tok_path);
    } else {
        const char *slash = strrchr(tok_path, '/');
        snprintf(path, sizeof path, "%.*stokenizer_config.json", slash ? (int)(slash - tok_path + 1) : 0, tok_path);
    }
    FILE *file = fopen(path, "r");
    cJSON *j = NULL;
    if (file) {
        char *text = NULL;
        size_t cap = 0;
        if (getdelim(&text, &cap, '\0', file) > 0) j = cJSON_Parse(text);
        free(text);
        fclose(file);
        if (!j) cli_die("%s is not JSON", path);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    const char *tmpl = cJSON_IsString(t) ? t->valuestring : "";
    if (*f == CHAT_AUTO)
        *f = strstr(tmpl, "<|im_start|>")          ? CHAT_CHATML
             : strstr(tmpl, "<|start_header_id|>") ? CHAT_LLAMA3
             : strstr(tmpl, "[INST]")              ? CHAT_MISTRAL
                                                   : CHAT_NONE;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token");
    if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "content"); /* {"content": "</s>", ...} */
    if (!*eos && cJSON_IsString(e)) snprintf(eos, eos_len, "%s", e->valuestring);
    cJSON_Delete(j);
}

char *chat_prompt(chat_format f, const char *system, const char *user)
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
    char *out = chat_render(f, msgs, cJSON_GetArraySize(msgs));
    cJSON_Delete(msgs);
    return out;
}

char *chat_render(chat_format f, const cJSON *messages, int n)
{
    char *out = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out, &len);
    if (!m) cli_die("out of memory");
    if (f == CHAT_LLAMA3) fputs("<|begin_of_text|>", m);
    if (f == CHAT_MISTRAL) fputs("<s>", m);
    const char *system = NULL;
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(messages, i);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, "role"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(r) || !cJSON_IsString(c)) cli_die("a message lacks a role or content string");
        const char *role = r->valuestring, *content = c->valuestring;
        if (f == CHAT_CHATML) fprintf(m, "<|im_start|>%s\n%s<|im_end|>\n", role, content);
        else if (f == CHAT_LLAMA3) fprintf(m, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", role, content);
        else if (f == CHAT_MISTRAL && !strcmp(role, "system")) system = content;
        else if (f == CHAT_MISTRAL && !strcmp(role, "user")) {
            fprintf(m, "[INST] %s%s%s [/INST]", system ? system : "", system ? "\n\n" : "", content);
            system = NULL;
        } else if (f == CHAT_MISTRAL) fprintf(m, "%s</s>", content);
        else cli_die("no chat format to render a conversation in: give --chat-format");
    }
    if (f == CHAT_CHATML) fputs("<|im_start|>assistant\n", m);
    else if (f == CHAT_LLAMA3) fputs("<|start_header_id|>assistant<|end_header_id|>\n\n", m);
    if (fclose(m)) cli_die("out of memory");
    return out;
}

const char *chat_end_of_turn(chat_format f, const char *eos)
{
    return f == CHAT_CHATML ? "<|im_end|>" : f == CHAT_LLAMA3 ? "<|eot_id|>" : eos;
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
