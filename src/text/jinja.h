/* Chat templates: a renderer of the Jinja subset that Hugging Face chat
 * templates (tokenizer_config.json's chat_template, chat_template.jinja) use.
 *
 * It renders what transformers' apply_chat_template renders: Python Jinja2
 * with trim_blocks and lstrip_blocks, in an immutable sandbox, with the
 * loop controls, transformers' tojson, raise_exception, strftime_now and the
 * {% generation %} tag. Whatever a template uses that is not implemented is
 * refused with its line and column, at parse time where it can be known then
 * (a tag, a filter, a test, a global function), else when it runs (a method
 * of a value). jinja.c lists what is supported.
 *
 * A parsed template is read-only: any number of threads may render it at
 * once. */
#ifndef MT_TEXT_JINJA_H
#define MT_TEXT_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct mt_jinja mt_jinja; /* a parsed template */

/* Parses src (len bytes, UTF-8). NULL with why = "line L, column C: <what>"
 * for a syntax error or any construct the renderer does not implement (it is
 * named: "filter 'wordcount' is not supported"), or "out of memory". */
mt_jinja *mt_jinja_parse(const char *src, size_t len, char *why, size_t why_len);

void mt_jinja_free(mt_jinja *t); /* NULL ok */

/* Whether the template has {% generation %} blocks (outside comments and strings), which mark what a model
 * learns. */
int mt_jinja_has_generation(const mt_jinja *t);

/* Renders with the variables of ctx (a cJSON object: messages, tools,
 * add_generation_prompt, bos_token, eos_token, enable_thinking, any others;
 * NULL for none), strftime_now using the UTC time now_unix (seconds). Returns
 * a malloc'd NUL-terminated string (its length in *out_len if not NULL), or
 * NULL with why: raise_exception's message as "raise_exception: <msg>", or
 * "line L, column C: <what>" for a run-time error (a filter applied to the
 * wrong type, an unknown method, ...). */
char *mt_jinja_render(const mt_jinja *t, const cJSON *ctx, long long now_unix, size_t *out_len, char *why,
                      size_t why_len);

/* mt_jinja_render that also returns the byte ranges of the output that
 * {% generation %} blocks produced (the assistant's tokens a loss mask
 * keeps): *spans holds *n_spans pairs (start, end), end exclusive, in the
 * order the blocks ended (transformers' order), malloc'd (NULL when there are
 * none). 0, or -1 with why as mt_jinja_render; *out is malloc'd and
 * NUL-terminated (out and out_len may be NULL when only the spans are
 * wanted). A generation block inside a macro, a set block or a filter block
 * is refused when parsing: its bytes' place in the output is not known. */
int mt_jinja_render_spans(const mt_jinja *t, const cJSON *ctx, long long now_unix, char **out, size_t *out_len,
                          size_t **spans, size_t *n_spans, char *why, size_t why_len);

#endif
