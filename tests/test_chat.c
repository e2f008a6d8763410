/* Chat templates through the public calls (src/text/chat.c): loading from a
 * folder, a tokenizer_config.json, a .jinja file or a built-in name; the
 * rendering buffer protocol; and what a model learns of a conversation, on
 * the real templates of tests/fixtures/chat_templates (Qwen3, Llama 3,
 * Gemma 3, Llama 2) and on small ones that take each path: {% generation %}
 * blocks, a turn found at its place in the whole, a turn rendered apart
 * (Qwen3's thinking block), a prompt that is not the start of its turn.
 * The expected texts are written out from reading each template; the
 * renderer itself is checked byte for byte against @huggingface/jinja by
 * tests/chat_templates.sh. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "megatrain.h"

#define TEMPLATES "tests/fixtures/chat_templates/"

/* What mt_chat_render_learnt gave: each text with its learnt parts cut out as strings. */
typedef struct learnt {
    int n;
    char *text[8];
    int n_spans[8];
    char *span[8][8];
} learnt;

static int collect(void *user, const char *text, size_t len, const size_t *spans, size_t n_spans)
{
    learnt *l = user;
    cr_assert_lt(l->n, 8);
    cr_assert_eq(strlen(text), len, "the text is NUL-terminated at len");
    l->text[l->n] = strndup(text, len);
    l->n_spans[l->n] = (int)n_spans;
    for (size_t i = 0; i < n_spans && i < 8; i++) {
        cr_assert(spans[2 * i] <= spans[2 * i + 1] && spans[2 * i + 1] <= len, "span %zu inside the text", i);
        l->span[l->n][i] = strndup(text + spans[2 * i], spans[2 * i + 1] - spans[2 * i]);
    }
    l->n++;
    return 0;
}

static void learnt_free(learnt *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->text[i]);
        for (int j = 0; j < l->n_spans[i] && j < 8; j++) free(l->span[i][j]);
    }
}

static mt_chat_template *load(const char *path)
{
    mt_chat_template *t = NULL;
    mt_status st = mt_chat_template_load(&t, path);
    cr_assert_eq(st, MT_OK, "%s: %s", path, mt_last_errmsg());
    return t;
}

static char *render(const mt_chat_template *t, const char *msgs, const char *vars, uint32_t flags)
{
    size_t n = 0;
    cr_assert_eq(mt_chat_render(t, msgs, vars, flags, NULL, 0, &n), MT_OK, "%s", mt_last_errmsg());
    char *s = malloc(n + 1);
    size_t n2 = 0;
    cr_assert_eq(mt_chat_render(t, msgs, vars, flags, s, n + 1, &n2), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(n, n2);
    return s;
}

/* A scratch folder under /tmp with files (name, text pairs, NULL-ended). */
static void make_dir(char *dir, size_t size, ...)
{
    snprintf(dir, size, "/tmp/mt_chat_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    va_list ap;
    va_start(ap, size);
    const char *name;
    while ((name = va_arg(ap, const char *))) {
        const char *text = va_arg(ap, const char *);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fputs(text, f);
        fclose(f);
    }
    va_end(ap);
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static const char *const QA2 = "[{\"role\": \"user\", \"content\": \"Q1\"}, {\"role\": \"assistant\", \"content\": \"A1\"}, "
                               "{\"role\": \"user\", \"content\": \"Q2\"}, {\"role\": \"assistant\", \"content\": \"A2\"}]";

TestSuite(chat);

/* ---- loading ----------------------------------------------------------------------------------- */

Test(chat, builtin_chatml_renders_the_old_format)
{
    mt_chat_template *t = load("chatml");
    char *s = render(t, "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}]", NULL,
                     MT_CHAT_ADD_GENERATION_PROMPT);
    cr_assert_str_eq(s, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    mt_chat_template_free(t);
}

Test(chat, builtin_mistral_puts_the_system_prompt_before_the_first_user_turn)
{
    mt_chat_template *t = load("mistral");
    char *s = render(t,
                     "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U\"}, "
                     "{\"role\": \"assistant\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"V\"}]",
                     NULL, 0);
    cr_assert_str_eq(s, "<s>[INST] S\n\nU [/INST]A</s>[INST] V [/INST]");
    free(s);
    /* an unknown role is refused by the template, with its message */
    size_t n = 0;
    cr_assert_eq(mt_chat_render(t, "[{\"role\": \"tool\", \"content\": \"x\"}]", NULL, 0, NULL, 0, &n),
                 MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "role tool: the roles are system, user and assistant"), "%s",
              mt_last_errmsg());
    mt_chat_template_free(t);
}

Test(chat, folder_template_and_its_special_tokens)
{
    /* tokenizer_config.json with a list of named templates (transformers takes "default") and the special
     * tokens as AddedToken objects */
    char dir[64];
    make_dir(dir, sizeof dir, "tokenizer_config.json",
             "{\"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, \"eos_token\": \"<E>\", \"chat_template\": "
             "[{\"name\": \"tool_use\", \"template\": \"tools\"}, {\"name\": \"default\", \"template\": \"{{ bos_token "
             "}}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\"}]}",
             (const char *)NULL);
    mt_chat_template *t = load(dir);
    char *s = render(t, "[{\"role\": \"user\", \"content\": \"x\"}]", NULL, 0);
    cr_assert_str_eq(s, "<B>x<E>");
    free(s);
    /* a variable given at rendering replaces the config's token */
    s = render(t, "[{\"role\": \"user\", \"content\": \"x\"}]", "{\"eos_token\": \"!\"}", 0);
    cr_assert_str_eq(s, "<B>x!");
    free(s);
    mt_chat_template_free(t);
    /* chat_template.jinja beside it wins, as in transformers */
    char path[128];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "w");
    fputs("J{{ eos_token }}", f);
    fclose(f);
    t = load(dir);
    s = render(t, "[]", NULL, 0);
    cr_assert_str_eq(s, "J<E>");
    free(s);
    mt_chat_template_free(t);
    /* and the .jinja file alone, with the config beside it for the tokens */
    t = load(path);
    s = render(t, "[]", NULL, 0);
    cr_assert_str_eq(s, "J<E>");
    free(s);
    mt_chat_template_free(t);
    remove_dir(dir);
}

Test(chat, bad_templates_and_paths_are_refused_by_name)
{
    mt_chat_template *t = (mt_chat_template *)1;
    cr_assert_eq(mt_chat_template_load(&t, "/nonexistent/model"), MT_ERR_IO);
    cr_assert_null(t);
    cr_assert(strstr(mt_last_errmsg(), "/nonexistent/model"), "%s", mt_last_errmsg());
    char dir[64];
    make_dir(dir, sizeof dir, (const char *)NULL);
    cr_assert_eq(mt_chat_template_load(&t, dir), MT_ERR_IO);
    cr_assert(strstr(mt_last_errmsg(), "has no chat template"), "%s", mt_last_errmsg());
    remove_dir(dir);
    make_dir(dir, sizeof dir, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}", (const char *)NULL);
    cr_assert_eq(mt_chat_template_load(&t, dir), MT_ERR_IO);
    cr_assert(strstr(mt_last_errmsg(), "has no chat_template"), "%s", mt_last_errmsg());
    remove_dir(dir);
    make_dir(dir, sizeof dir, "tokenizer_config.json", "{\"chat_template\": \"{{ x | wordcount }}\"}",
             (const char *)NULL);
    cr_assert_eq(mt_chat_template_load(&t, dir), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "line 1, column") && strstr(mt_last_errmsg(), "wordcount"), "%s",
              mt_last_errmsg());
    remove_dir(dir);
    make_dir(dir, sizeof dir, "tokenizer_config.json", "{\"chat_template\": \"{% if %}\"}", (const char *)NULL);
    cr_assert_eq(mt_chat_template_load(&t, dir), MT_ERR_FORMAT);
    remove_dir(dir);
    make_dir(dir, sizeof dir, "tokenizer_config.json", "{\"chat_template\": ", (const char *)NULL);
    cr_assert_eq(mt_chat_template_load(&t, dir), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_errmsg(), "not valid JSON"), "%s", mt_last_errmsg());
    remove_dir(dir);
    cr_assert_eq(mt_chat_template_load(NULL, "chatml"), MT_ERR_INVALID_ARGUMENT);
}

Test(chat, render_reports_the_length_and_refuses_bad_json)
{
    mt_chat_template *t = load("chatml");
    const char *msgs = "[{\"role\": \"user\", \"content\": \"Hello\"}]";
    size_t n = 0;
    char small[8];
    cr_assert_eq(mt_chat_render(t, msgs, NULL, 0, small, sizeof small, &n), MT_OK);
    cr_assert_eq(n, strlen("<|im_start|>user\nHello<|im_end|>\n"));
    cr_assert_eq(memcmp(small, "<|im_sta", 8), 0, "the first cap bytes");
    cr_assert_eq(mt_chat_render(t, "{\"role\": \"user\"}", NULL, 0, NULL, 0, &n), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "not a JSON array"), "%s", mt_last_errmsg());
    cr_assert_eq(mt_chat_render(t, msgs, "[1]", 0, NULL, 0, &n), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_chat_render(t, msgs, NULL, 4, NULL, 0, &n), MT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mt_chat_render(NULL, msgs, NULL, 0, NULL, 0, &n), MT_ERR_INVALID_ARGUMENT);
    mt_chat_template_free(t);
}

/* ---- what is learnt ------------------------------------------------------------------------------ */

Test(chat, chatml_turns_are_learnt_in_the_whole)
{
    mt_chat_template *t = load("chatml");
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, NULL, collect, &l), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(l.n, 1, "one text: every turn is at its place in the whole");
    cr_assert_str_eq(l.text[0], "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                                "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\nA2<|im_end|>\n");
    cr_assert_eq(l.n_spans[0], 2);
    cr_assert_str_eq(l.span[0][0], "A1<|im_end|>\n");
    cr_assert_str_eq(l.span[0][1], "A2<|im_end|>\n");
    learnt_free(&l);
    mt_chat_template_free(t);
}

/* Qwen3: the last turn after the last user message gets an (empty) thinking block, the earlier ones do not. The
 * last is learnt in the whole, thinking block included; the first is rendered as the last turn of its own text. */
Test(chat, qwen3_renders_earlier_turns_apart_with_their_thinking_block)
{
    mt_chat_template *t = load(TEMPLATES "qwen3.jinja");
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, NULL, collect, &l), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(l.n, 2);
    cr_assert_str_eq(l.text[0], "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                                "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                                "A2<|im_end|>\n");
    cr_assert_eq(l.n_spans[0], 1);
    cr_assert_str_eq(l.span[0][0], "<think>\n\n</think>\n\nA2<|im_end|>\n");
    cr_assert_str_eq(l.text[1], "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                                "A1<|im_end|>\n");
    cr_assert_eq(l.n_spans[1], 1);
    cr_assert_str_eq(l.span[1][0], "<think>\n\n</think>\n\nA1<|im_end|>\n");
    learnt_free(&l);
    /* with enable_thinking false the empty block is the prompt's, and the turn adds only its answer */
    learnt m = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, "{\"enable_thinking\": false}", collect, &m), MT_OK, "%s",
                 mt_last_errmsg());
    cr_assert_eq(m.n, 2);
    cr_assert_str_eq(m.span[0][0], "A2<|im_end|>\n");
    cr_assert_str_eq(m.span[1][0], "A1<|im_end|>\n");
    learnt_free(&m);
    /* a reasoning turn keeps its thinking in the whole even before the last user message: learnt there */
    learnt r = {0};
    cr_assert_eq(mt_chat_render_learnt(t,
                                       "[{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", "
                                       "\"content\": \"<think>\\nhm\\n</think>\\n\\nA\"}]",
                                       NULL, collect, &r),
                 MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(r.n, 1);
    cr_assert_str_eq(r.span[0][0], "<think>\nhm\n</think>\n\nA<|im_end|>\n");
    learnt_free(&r);
    char eot[32];
    size_t n = 0;
    cr_assert_eq(mt_chat_end_of_turn(t, NULL, eot, sizeof eot, &n), MT_OK, "%s", mt_last_errmsg());
    cr_assert_str_eq(eot, "<|im_end|>\n");
    mt_chat_template_free(t);
}

/* The Llama 3 template of the tokenizer packages (the first release's) ends every rendering with the assistant's
 * header, add_generation_prompt or not: a turn then adds its answer, <|eot_id|> and the next header, and its end of
 * turn is that text, whose first special token, <|eot_id|>, stops generation. */
Test(chat, llama3_trims_the_content_and_learns_the_eot)
{
    mt_chat_template *t = load(TEMPLATES "llama3.jinja");
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t,
                                       "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": "
                                       "\"U\"}, {\"role\": \"assistant\", \"content\": \"  A \\n\"}]",
                                       "{\"bos_token\": \"<|begin_of_text|>\"}", collect, &l),
                 MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.text[0], "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    cr_assert_str_eq(l.span[0][0], "A<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    learnt_free(&l);
    char eot[64];
    size_t n = 0;
    cr_assert_eq(mt_chat_end_of_turn(t, "{\"bos_token\": \"<|begin_of_text|>\"}", eot, sizeof eot, &n), MT_OK, "%s",
                 mt_last_errmsg());
    cr_assert_str_eq(eot, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    mt_chat_template_free(t);
}

Test(chat, gemma3_learns_the_model_turns_and_refuses_what_its_template_refuses)
{
    mt_chat_template *t = load(TEMPLATES "gemma3.jinja");
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, "{\"bos_token\": \"<bos>\"}", collect, &l), MT_OK, "%s",
                 mt_last_errmsg());
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.text[0], "<bos><start_of_turn>user\nQ1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
                                "<start_of_turn>user\nQ2<end_of_turn>\n<start_of_turn>model\nA2<end_of_turn>\n");
    cr_assert_str_eq(l.span[0][0], "A1<end_of_turn>\n");
    cr_assert_str_eq(l.span[0][1], "A2<end_of_turn>\n");
    learnt_free(&l);
    char eot[32];
    size_t n = 0;
    cr_assert_eq(mt_chat_end_of_turn(t, "{\"bos_token\": \"<bos>\"}", eot, sizeof eot, &n), MT_OK);
    cr_assert_str_eq(eot, "<end_of_turn>\n");
    /* two user turns in a row: the template's raise_exception, as transformers raises it */
    learnt r = {0};
    cr_assert_eq(mt_chat_render_learnt(t,
                                       "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": "
                                       "\"b\"}, {\"role\": \"assistant\", \"content\": \"c\"}]",
                                       NULL, collect, &r),
                 MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "Conversation roles must alternate"), "%s", mt_last_errmsg());
    cr_assert_eq(r.n, 0);
    mt_chat_template_free(t);
}

Test(chat, llama2_learns_the_answer_and_eos)
{
    mt_chat_template *t = load(TEMPLATES "llama2.jinja");
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}", collect, &l),
                 MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.text[0], "<s>[INST] Q1 [/INST] A1 </s><s>[INST] Q2 [/INST] A2 </s>");
    cr_assert_eq(l.n_spans[0], 2);
    cr_assert_str_eq(l.span[0][0], " A1 </s>");
    cr_assert_str_eq(l.span[0][1], " A2 </s>");
    learnt_free(&l);
    mt_chat_template_free(t);
}

Test(chat, generation_blocks_say_what_is_learnt)
{
    char dir[64];
    make_dir(dir, sizeof dir, "chat_template.jinja",
             "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
             "</a>{% endgeneration %}{% else %}{{ m.content }}</u>{% endif %}{% endfor %}",
             (const char *)NULL);
    mt_chat_template *t = load(dir);
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, NULL, collect, &l), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.text[0], "<user>Q1</u><assistant>A1</a><user>Q2</u><assistant>A2</a>");
    cr_assert_eq(l.n_spans[0], 2);
    cr_assert_str_eq(l.span[0][0], "A1</a>");
    cr_assert_str_eq(l.span[0][1], "A2</a>");
    learnt_free(&l);
    mt_chat_template_free(t);
    remove_dir(dir);
}

Test(chat, a_prompt_that_is_not_the_start_of_its_turn_is_refused)
{
    char dir[64];
    make_dir(dir, sizeof dir, "chat_template.jinja",
             "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}",
             (const char *)NULL);
    mt_chat_template *t = load(dir);
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, NULL, collect, &l), MT_ERR_UNSUPPORTED);
    cr_assert(strstr(mt_last_errmsg(), "message 1"), "%s", mt_last_errmsg());
    cr_assert_eq(l.n, 0);
    mt_chat_template_free(t);
    remove_dir(dir);
}

static int stop_at_first(void *user, const char *text, size_t len, const size_t *spans, size_t n_spans)
{
    (void)text, (void)len, (void)spans, (void)n_spans;
    ++*(int *)user;
    return 1;
}

Test(chat, no_assistant_turn_and_a_stopping_callback)
{
    mt_chat_template *t = load("chatml");
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, "[{\"role\": \"user\", \"content\": \"Q\"}]", NULL, collect, &l),
                 MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_last_errmsg(), "no assistant turn"), "%s", mt_last_errmsg());
    int calls = 0;
    cr_assert_eq(mt_chat_render_learnt(t, QA2, NULL, stop_at_first, &calls), MT_ERR_ABORTED);
    cr_assert_eq(calls, 1);
    cr_assert_eq(mt_chat_render_learnt(t, QA2, NULL, NULL, NULL), MT_ERR_INVALID_ARGUMENT);
    mt_chat_template_free(t);
}

/* GPT-OSS (harmony): the last answer ends with <|return|>, the earlier ones, as history, with <|end|>; so the
 * earlier one is learnt apart, as the last turn of its own text. Its system message carries the date
 * (strftime_now), so only the texts' ends are compared. */
Test(chat, gpt_oss_learns_each_answer_ending_in_return)
{
    mt_chat_template *t = load(TEMPLATES "gpt_oss.jinja");
    learnt l = {0};
    cr_assert_eq(mt_chat_render_learnt(t, QA2, NULL, collect, &l), MT_OK, "%s", mt_last_errmsg());
    cr_assert_eq(l.n, 2);
    const char *end0 = "<|start|>user<|message|>Q1<|end|><|start|>assistant<|channel|>final<|message|>A1<|end|>"
                       "<|start|>user<|message|>Q2<|end|><|start|>assistant<|channel|>final<|message|>A2<|return|>";
    const char *end1 = "<|start|>user<|message|>Q1<|end|><|start|>assistant<|channel|>final<|message|>A1<|return|>";
    cr_assert(strlen(l.text[0]) > strlen(end0) && !strcmp(l.text[0] + strlen(l.text[0]) - strlen(end0), end0), "%s",
              l.text[0]);
    cr_assert(strlen(l.text[1]) > strlen(end1) && !strcmp(l.text[1] + strlen(l.text[1]) - strlen(end1), end1), "%s",
              l.text[1]);
    cr_assert_eq(l.n_spans[0], 1);
    cr_assert_str_eq(l.span[0][0], "<|channel|>final<|message|>A2<|return|>");
    cr_assert_str_eq(l.span[1][0], "<|channel|>final<|message|>A1<|return|>");
    learnt_free(&l);
    char eot[32];
    size_t n = 0;
    cr_assert_eq(mt_chat_end_of_turn(t, NULL, eot, sizeof eot, &n), MT_OK, "%s", mt_last_errmsg());
    cr_assert_str_eq(eot, "<|return|>");
    mt_chat_template_free(t);
}
