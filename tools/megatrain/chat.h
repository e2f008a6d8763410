/* Chat formats and text generation for megatrain prepare, sample and eval
 * (chat.c). */
#ifndef MEGATRAIN_CHAT_H
#define MEGATRAIN_CHAT_H

#include "cli.h"

/* How a conversation becomes text: the model's own chat template
 * (mt_chat_template, docs/fine-tuning.md). */

/* The template named by --chat-template (a built-in name, chatml, llama3 or
 * mistral, or a template or tokenizer_config.json file), else the one of the
 * tokenizer's folder (tok_path: the folder or its tokenizer.json). NULL when
 * none is named and the folder has none: *why then says so, for the error of
 * the first conversation that needs one. Any other failure exits. */
mt_chat_template *chat_template_open(const char *tok_path, const char *named, char *why, size_t why_len);
/* The folder's eos_token (its tokenizer_config.json) into eos, when eos is empty. */
void chat_eos(const char *tok_path, char *eos, size_t eos_len);
/* A user's message (and an optional system prompt) rendered for the
 * assistant's answer to follow (vars: NULL or a JSON object of variables). */
char *chat_prompt(const mt_chat_template *t, const char *vars, const char *system, const char *user);
/* The conversation's first n messages (a cJSON array), then the header of the
 * assistant's turn to come; malloc'ed. */
struct cJSON;
char *chat_render(const mt_chat_template *t, const char *vars, const struct cJSON *messages, int n);
/* The ids that end an assistant's turn: the first special token of the
 * template's end of turn (t may be NULL) and eos (its text; "" for none);
 * -1 where there is none. */
void chat_stops(const mt_chat_template *t, const char *vars, const mt_tokenizer *tok, const char *eos,
                int32_t stop[2]);

/* Generation: greedy at temperature 0, else sampling from the tokens whose
 * probabilities add up to top_p, with a seeded generator. */
typedef struct gen_options {
    int max_new;
    double temperature, top_p;
    uint64_t seed;
    int32_t stop[2];       /* ids that end the text (-1: none) */
    int echo;              /* print as it goes */
} gen_options;

/* Continues text with m; the new text (without the stop token) is returned,
 * malloc'ed; NULL with a message on failure. */
char *generate(mt_model *m, const mt_tokenizer *t, const char *text, uint32_t encode_flags, const gen_options *o);

#endif
