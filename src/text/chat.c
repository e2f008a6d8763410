/* Chat templates, the public side: a model's template loaded from its folder
 * (chat_template.jinja, or tokenizer_config.json's chat_template), rendered
 * as transformers' apply_chat_template renders it (jinja.c does the
 * rendering), and the parts of a rendered conversation that a model learns.
 *
 * What is learnt follows TRL's assistant-only loss. A template with
 * {% generation %} blocks says it itself: the blocks' output, as
 * transformers' return_assistant_tokens_mask takes it. Any other template is
 * asked by rendering prefixes of the conversation: for the assistant's turn
 * at message k, the prompt A = render(messages[:k], add_generation_prompt)
 * and B = render(messages[:k + 1]); the turn adds B past A (its content, the
 * end-of-turn marker and whatever the template puts between them, such as
 * Qwen3's empty thinking block). The conversation is rendered whole and each
 * turn's addition is found at its place there. A template may render a turn
 * differently once later messages follow (Qwen3 drops the thinking block of
 * every turn before the last user message): such a turn is not at its place
 * in the whole, and it becomes a text of its own, B, in which it is the one
 * learnt part. So every learnt token is one the model writes, after exactly
 * the prompt its template gives it for that turn. */
#define _GNU_SOURCE
#include "core/internal.h"
#include "io/fileio.h"
#include "text/jinja.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct mt_chat_template {
    mt_jinja *jinja;
    cJSON *tokens;  /* {"bos_token": ..., "eos_token": ..., ...}: the tokenizer_config.json's, as transformers passes
                       them to the template */
    char *source;
};

/* Templates for folders without one, by name: the formats the command-line
 * program wrote by hand before it ran the model's own templates. */
static const struct {
    const char *name, *source;
} BUILTIN[] = {
    {"chatml", "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
               "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
               "{% endif %}"},
    {"llama3", "{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
               "'<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}{% if "
               "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
    {"mistral", "{{ '<s>' }}{% set ns = namespace(system='') %}{% for message in messages %}{% if message['role'] == "
                "'system' %}{% set ns.system = message['content'] %}{% elif message['role'] == 'user' %}{{ '[INST] ' }}"
                "{% if ns.system %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}{{ message['content'] + "
                "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + (eos_token if eos_token "
                "is defined else '</s>') }}{% else %}{{ raise_exception('role ' + message['role'] + ': the roles are "
                "system, user and assistant') }}{% endif %}{% endfor %}"},
};

void mt_chat_template_free(mt_chat_template *t)
{
    if (!t) return;
    mt_jinja_free(t->jinja);
    cJSON_Delete(t->tokens);
    free(t->source);
    free(t);
}

/* The special tokens of a tokenizer_config.json that transformers passes to a template: each a string or an
 * AddedToken object {"content": ...}. */
static cJSON *special_tokens_of(const cJSON *config)
{
    static const char *const NAMES[] = {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                                        "mask_token"};
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, NAMES[i]);
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(v) && !cJSON_AddStringToObject(o, NAMES[i], v->valuestring)) {
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

/* The template of a tokenizer_config.json: its chat_template string, or from a list of {name, template} the one
 * named "default" (transformers' choice when none is asked for). */
static mt_status template_of_config(mt_err err, const char *path, const cJSON *config, const char **src)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(config, "chat_template");
    if (cJSON_IsString(t)) {
        *src = t->valuestring;
        return MT_OK;
    }
    if (cJSON_IsArray(t)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, t)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name"),
                        *text = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(text)) {
                *src = text->valuestring;
                return MT_OK;
            }
        }
        return mt_fail(err, MT_ERR_FORMAT, "%s: chat_template is a list without a template named \"default\"", path);
    }
    if (t && !cJSON_IsNull(t)) return mt_fail(err, MT_ERR_FORMAT, "%s: chat_template is not a string", path);
    return mt_fail(err, MT_ERR_IO, "%s has no chat_template", path);
}

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

mt_status mt_chat_template_load(mt_chat_template **out, const char *path)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!out) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_chat_template_load: out is NULL");
    *out = NULL;
    if (!path) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_chat_template_load: path is NULL");
    if (strlen(path) + sizeof "/tokenizer_config.json" > 4096)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "path too long: %s", path);

    /* Where the template and the special tokens are: a folder's chat_template.jinja (transformers reads it before
     * tokenizer_config.json's), else its tokenizer_config.json; a .jinja file, with a tokenizer_config.json beside
     * it for the tokens; a tokenizer_config.json; or a built-in name. */
    char jinja_path[4096] = "", config_path[4096] = "";
    const char *builtin = NULL;
    if (is_dir(path)) {
        mt_path_join(jinja_path, sizeof jinja_path, path, "chat_template.jinja");
        mt_path_join(config_path, sizeof config_path, path, "tokenizer_config.json");
        if (!exists(jinja_path)) jinja_path[0] = '\0';
        if (!exists(config_path)) config_path[0] = '\0';
        if (!jinja_path[0] && !config_path[0])
            return mt_fail(err, MT_ERR_IO, "folder %s has no chat template (neither chat_template.jinja nor "
                                           "tokenizer_config.json)", path);
    } else if (exists(path)) {
        const size_t n = strlen(path);
        const char *slash = strrchr(path, '/');
        const int dir_len = slash ? (int)(slash - path + 1) : 0;
        if (n >= 5 && !strcmp(path + n - 5, ".json")) {
            snprintf(config_path, sizeof config_path, "%s", path);
        } else {
            snprintf(jinja_path, sizeof jinja_path, "%s", path);
            snprintf(config_path, sizeof config_path, "%.*stokenizer_config.json", dir_len, path);
            if (!exists(config_path)) config_path[0] = '\0';
        }
    } else {
        for (size_t i = 0; i < sizeof BUILTIN / sizeof *BUILTIN; i++)
            if (!strcmp(path, BUILTIN[i].name)) builtin = BUILTIN[i].source;
        if (!builtin)
            return mt_fail(err, MT_ERR_IO, "cannot open chat template %s: %s (nor is it a built-in template: chatml, "
                                           "llama3, mistral)", path, strerror(errno));
    }

    mt_chat_template *t = calloc(1, sizeof *t);
    if (!t) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory loading chat template %s", path);
    cJSON *config = NULL;
    mt_status st = MT_OK;
    const char *src = builtin;
    size_t src_len = 0;
    if (config_path[0] && (st = mt_parse_json_file(err, config_path, &config))) goto fail;
    if (jinja_path[0]) {
        if ((st = mt_read_small_file(err, jinja_path, &t->source, &src_len))) goto fail;
        src = t->source;
    } else if (!builtin) {
        if ((st = template_of_config(err, config_path, config, &src))) goto fail;
        src_len = strlen(src);
        if (!(t->source = strdup(src))) goto oom;
        src = t->source;
    } else {
        src_len = strlen(src);
    }
    if (!(t->tokens = config ? special_tokens_of(config) : cJSON_CreateObject())) goto oom;
    char why[512];
    if (!(t->jinja = mt_jinja_parse(src, src_len, why, sizeof why))) {
        st = mt_fail(err, strstr(why, "not supported") ? MT_ERR_UNSUPPORTED : MT_ERR_FORMAT,
                     "chat template of %s: %s", path, why);
        goto fail;
    }
    cJSON_Delete(config);
    *out = t;
    return MT_OK;
oom:
    st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory loading chat template %s", path);
fail:
    cJSON_Delete(config);
    mt_chat_template_free(t);
    return st;
}

/* ---- rendering ------------------------------------------------------------------------------ */

/* The context of a rendering: the template's special tokens, the caller's variables over them, then messages (the
 * first n of msgs, referenced, not copied) and add_generation_prompt. */
typedef struct render_ctx {
    cJSON *ctx, *msgs; /* msgs: an array whose items are references to the caller's */
} render_ctx;

static mt_status ctx_make(mt_err err, const mt_chat_template *t, const cJSON *vars, render_ctx *rc)
{
    rc->msgs = NULL;
    if (!(rc->ctx = cJSON_Duplicate(t->tokens, 1))) goto oom;
    const cJSON *v;
    cJSON_ArrayForEach(v, vars)
    {
        cJSON *c = cJSON_Duplicate(v, 1);
        if (!c) goto oom;
        cJSON_DeleteItemFromObjectCaseSensitive(rc->ctx, v->string);
        cJSON_AddItemToObject(rc->ctx, v->string, c);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(rc->ctx, "messages");
    cJSON_DeleteItemFromObjectCaseSensitive(rc->ctx, "add_generation_prompt");
    if (!(rc->msgs = cJSON_AddArrayToObject(rc->ctx, "messages"))) goto oom;
    if (!cJSON_AddBoolToObject(rc->ctx, "add_generation_prompt", 0)) goto oom;
    return MT_OK;
oom:
    cJSON_Delete(rc->ctx);
    rc->ctx = NULL;
    return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory rendering a chat template");
}

/* Sets the context's messages to the first n of all (references) and add_generation_prompt. */
static mt_status ctx_set(mt_err err, render_ctx *rc, const cJSON *all, int n, int agp)
{
    while (cJSON_GetArraySize(rc->msgs) > 0) cJSON_DeleteItemFromArray(rc->msgs, 0);
    const cJSON *m = all ? all->child : NULL;
    for (int i = 0; i < n && m; i++, m = m->next)
        if (!cJSON_AddItemReferenceToArray(rc->msgs, (cJSON *)m))
            return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory rendering a chat template");
    cJSON_ReplaceItemInObjectCaseSensitive(rc->ctx, "add_generation_prompt", cJSON_CreateBool(agp));
    return MT_OK;
}

static mt_status render(mt_err err, const mt_chat_template *t, const render_ctx *rc, char **out, size_t *len,
                        size_t **spans, size_t *n_spans)
{
    char why[1024];
    int rc2;
    if (spans) {
        rc2 = mt_jinja_render_spans(t->jinja, rc->ctx, (long long)time(NULL), out, len, spans, n_spans, why,
                                    sizeof why);
    } else {
        *out = mt_jinja_render(t->jinja, rc->ctx, (long long)time(NULL), len, why, sizeof why);
        rc2 = *out ? 0 : -1;
    }
    if (rc2 == 0) return MT_OK;
    if (!strcmp(why, "out of memory"))
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory rendering a chat template");
    /* raise_exception is the template refusing the conversation; anything else a template fault at run time */
    return mt_fail(err, strncmp(why, "raise_exception", 15) ? MT_ERR_FORMAT : MT_ERR_INVALID_ARGUMENT,
                   "chat template: %s", why);
}

/* The caller's JSON: messages an array, variables NULL or an object. */
static mt_status parse_args(mt_err err, const char *fn, const char *messages, const char *variables, cJSON **msgs,
                            cJSON **vars)
{
    *msgs = *vars = NULL;
    if (!messages) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s: messages is NULL", fn);
    size_t where = 0;
    if (!(*msgs = mt_json_parse(messages, strlen(messages), &where)) || !cJSON_IsArray(*msgs)) {
        cJSON_Delete(*msgs);
        *msgs = NULL;
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s: messages is not a JSON array (at byte %zu)", fn, where);
    }
    if (variables && (!(*vars = mt_json_parse(variables, strlen(variables), &where)) || !cJSON_IsObject(*vars))) {
        cJSON_Delete(*msgs);
        cJSON_Delete(*vars);
        *msgs = *vars = NULL;
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s: variables is not a JSON object (at byte %zu)", fn, where);
    }
    return MT_OK;
}

/* n bytes of s into the caller's text (at most cap of them, and a NUL where there is room), n into *len. */
static void copy_text(const char *s, size_t n, char *text, size_t cap, size_t *len)
{
    *len = n;
    if (!cap) return;
    memcpy(text, s, n < cap ? n : cap);
    if (n < cap) text[n] = '\0';
}

mt_status mt_chat_render(const mt_chat_template *t, const char *messages, const char *variables, uint32_t flags,
                         char *text, size_t cap, size_t *len)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!t || !len || (cap && !text))
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_chat_render: %s is NULL",
                       !t ? "the template" : !len ? "len" : "text");
    if (flags & ~(uint32_t)MT_CHAT_ADD_GENERATION_PROMPT)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_chat_render: unknown flags 0x%x", flags);
    cJSON *msgs, *vars;
    mt_status st = parse_args(err, "mt_chat_render", messages, variables, &msgs, &vars);
    if (st) return st;
    render_ctx rc;
    char *out = NULL;
    size_t n = 0;
    if (!(st = ctx_make(err, t, vars, &rc))) {
        if (!(st = ctx_set(err, &rc, msgs, cJSON_GetArraySize(msgs), (flags & MT_CHAT_ADD_GENERATION_PROMPT) != 0)))
            st = render(err, t, &rc, &out, &n, NULL, NULL);
        cJSON_Delete(rc.ctx);
    }
    if (!st) copy_text(out, n, text, cap, len);
    free(out);
    cJSON_Delete(msgs);
    cJSON_Delete(vars);
    return st;
}

/* ---- what a model learns ------------------------------------------------------------------- */

static int starts_with(const char *s, size_t n, const char *prefix, size_t m) { return n >= m && !memcmp(s, prefix, m); }

static const char *role_of(const cJSON *m)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(r) ? r->valuestring : "";
}

/* A turn rendered apart: its text and its learnt span. */
typedef struct apart {
    char *text;
    size_t len, span[2];
} apart;

static mt_status learnt_by_prefixes(mt_err err, const mt_chat_template *t, render_ctx *rc, const cJSON *msgs,
                                    const char *whole, size_t whole_len, mt_chat_text_fn fn, void *user)
{
    const int n = cJSON_GetArraySize(msgs);
    size_t *spans = malloc((size_t)(2 * n + 2) * sizeof *spans);
    apart *aparts = calloc((size_t)n + 1, sizeof *aparts);
    size_t n_spans = 0, n_apart = 0;
    mt_status st = MT_OK;
    if (!spans || !aparts) {
        st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory rendering a chat template");
        goto done;
    }
    int k = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, k++) {
        if (strcmp(role_of(m), "assistant")) continue;
        char *a = NULL, *b = NULL;
        size_t a_len = 0, b_len = 0;
        if ((st = ctx_set(err, rc, msgs, k, 1)) || (st = render(err, t, rc, &a, &a_len, NULL, NULL)) ||
            (st = ctx_set(err, rc, msgs, k + 1, 0)) || (st = render(err, t, rc, &b, &b_len, NULL, NULL))) {
            free(a);
            free(b);
            goto done;
        }
        if (!starts_with(b, b_len, a, a_len)) {
            free(a);
            free(b);
            st = mt_fail(err, MT_ERR_UNSUPPORTED,
                         "chat template: the prompt it renders for the assistant's turn at message %d (the messages "
                         "before it, with add_generation_prompt) is not the start of its rendering with the turn, so "
                         "what the turn adds cannot be told; a template with {%% generation %%} blocks marks it",
                         k);
            goto done;
        }
        const size_t add = b_len - a_len;
        if (starts_with(whole, whole_len, a, a_len) && starts_with(whole + a_len, whole_len - a_len, b + a_len, add)) {
            if (add) {
                spans[2 * n_spans] = a_len;
                spans[2 * n_spans++ + 1] = b_len;
            }
            free(b);
        } else {
            aparts[n_apart++] = (apart){b, b_len, {a_len, b_len}};
        }
        free(a);
    }
    /* the whole conversation when anything in it is learnt, then the turns rendered apart, in order */
    if (n_spans && fn(user, whole, whole_len, spans, n_spans)) {
        st = mt_fail(err, MT_ERR_ABORTED, "mt_chat_render_learnt: stopped by the callback");
        goto done;
    }
    for (size_t i = 0; i < n_apart; i++)
        if (aparts[i].span[1] > aparts[i].span[0] && fn(user, aparts[i].text, aparts[i].len, aparts[i].span, 1)) {
            st = mt_fail(err, MT_ERR_ABORTED, "mt_chat_render_learnt: stopped by the callback");
            goto done;
        }
done:
    for (size_t i = 0; aparts && i < n_apart; i++) free(aparts[i].text);
    free(aparts);
    free(spans);
    return st;
}

mt_status mt_chat_render_learnt(const mt_chat_template *t, const char *messages, const char *variables,
                                mt_chat_text_fn fn, void *user)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!t || !fn)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_chat_render_learnt: %s is NULL", !t ? "the template" : "fn");
    cJSON *msgs, *vars;
    mt_status st = parse_args(err, "mt_chat_render_learnt", messages, variables, &msgs, &vars);
    if (st) return st;
    int assistant = 0;
    for (const cJSON *m = msgs->child; m; m = m->next) assistant |= !strcmp(role_of(m), "assistant");
    render_ctx rc = {0};
    char *whole = NULL;
    size_t whole_len = 0, *spans = NULL, n_spans = 0;
    if (!assistant) {
        st = mt_fail(err, MT_ERR_INVALID_ARGUMENT, "the conversation has no assistant turn: nothing to learn");
    } else if (!(st = ctx_make(err, t, vars, &rc)) && !(st = ctx_set(err, &rc, msgs, cJSON_GetArraySize(msgs), 0))) {
        if (mt_jinja_has_generation(t->jinja)) {
            st = render(err, t, &rc, &whole, &whole_len, &spans, &n_spans);
            if (!st && !n_spans)
                st = mt_fail(err, MT_ERR_INVALID_ARGUMENT, "chat template: its {%% generation %%} blocks marked "
                                                           "nothing in this conversation");
            if (!st && fn(user, whole, whole_len, spans, n_spans))
                st = mt_fail(err, MT_ERR_ABORTED, "mt_chat_render_learnt: stopped by the callback");
        } else if (!(st = render(err, t, &rc, &whole, &whole_len, NULL, NULL))) {
            st = learnt_by_prefixes(err, t, &rc, msgs, whole, whole_len, fn, user);
        }
    }
    cJSON_Delete(rc.ctx);
    free(whole);
    free(spans);
    cJSON_Delete(msgs);
    cJSON_Delete(vars);
    return st;
}

/* The text a rendered assistant turn ends with after its content: a probe conversation, its turn's content a
 * marker, rendered by prefixes as above; what follows the marker in the turn's addition. */
mt_status mt_chat_end_of_turn(const mt_chat_template *t, const char *variables, char *text, size_t cap, size_t *len)
{
    static const char MARK[] = "mt-end-of-turn-probe";
    static const char PROBE[] = "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": "
                                "\"mt-end-of-turn-probe\"}]";
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!t || !len || (cap && !text))
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_chat_end_of_turn: %s is NULL",
                       !t ? "the template" : !len ? "len" : "text");
    cJSON *msgs, *vars;
    mt_status st = parse_args(err, "mt_chat_end_of_turn", PROBE, variables, &msgs, &vars);
    if (st) return st;
    render_ctx rc;
    char *b = NULL;
    size_t b_len = 0;
    if (!(st = ctx_make(err, t, vars, &rc))) {
        if (!(st = ctx_set(err, &rc, msgs, 2, 0)) && !(st = render(err, t, &rc, &b, &b_len, NULL, NULL))) {
            const char *at = memmem(b, b_len, MARK, sizeof MARK - 1);
            if (!at) {
                st = mt_fail(err, MT_ERR_UNSUPPORTED, "chat template: an assistant turn's content does not appear in "
                                                      "its rendering, so its end cannot be found");
            } else {
                const size_t from = (size_t)(at - b) + sizeof MARK - 1;
                copy_text(b + from, b_len - from, text, cap, len);
            }
        }
        cJSON_Delete(rc.ctx);
    }
    free(b);
    cJSON_Delete(msgs);
    cJSON_Delete(vars);
    return st;
}
