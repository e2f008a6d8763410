/* Chat formats and text generation for megatrain prepare, sample and eval
 * (chat.c). */
#ifndef MEGATRAIN_CHAT_H
#define MEGATRAIN_CHAT_H

#include "cli.h"

/* How a conversation becomes text: the templates of the families the library
 * trains (Qwen's ChatML, Llama 3's headers, Mistral's [INST]). */
typedef enum chat_format { CHAT_NONE, CHAT_CHATML, CHAT_LLAMA3, CHAT_MISTRAL, CHAT_AUTO } chat_format;

/* "chatml", "llama3", "mistral", "none" or "auto"; exits on another name. */
chat_format chat_format_named(const char *name);
const char *chat_format_name(chat_format f);
/* tokenizer_config.json beside a tokenizer (tok_path: the tokenizer.json or
 * its folder): resolves CHAT_AUTO from its chat_template (CHAT_NONE when it
 * has none that is known) and fills an empty eos from its eos_token. */
void chat_config(const char *tok_path, chat_format *f, char *eos, size_t eos_len);
/* A user's message (and an optional system prompt) rendered for the
 * assistant's answer to follow; the text that ends the answer. */
char *chat_prompt(chat_format f, const char *system, const char *user);
/* The conversation's first n messages (a cJSON array of {role, content}),
 * then the header of the assistant's turn to come; malloc'ed. */
struct cJSON;
char *chat_render(chat_format f, const struct cJSON *messages, int n);
const char *chat_end_of_turn(chat_format f, const char *eos);

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
