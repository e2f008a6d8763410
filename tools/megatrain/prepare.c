/* megatrain prepare: text, chat and instruction data into a document token
 * file (MT_TOKENS_DOCS, docs/data.md) that carries the loss mask: only the
 * tokens a model should learn to write are targets. The library's
 * mt_doc_writer writes the file, a document at a time. */
#define _GNU_SOURCE
#include "chat.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char prepare_help[] =
    "usage: megatrain prepare --tokenizer DIR|FILE [--chat-format F] [--text-lines] -o OUT INPUT...\n"
    "\n"
    "Tokenizes INPUT files into a document token file for `megatrain train --data OUT`:\n"
    "  .jsonl  one document per line: {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}\n"
    "          (only the assistant's turns, with their end-of-turn token, are learnt),\n"
    "          {\"prompt\": ..., \"completion\": ...} (only the completion and EOS are learnt)\n"
    "          or {\"text\": ...} (all of it, and EOS)\n"
    "  other   plain text: the whole file one document (--text-lines: each line one), all learnt\n"
    "\n"
    "options:\n"
    "  --tokenizer DIR|FILE  a Hugging Face tokenizer.json, or the model folder holding it (and\n"
    "                        its tokenizer_config.json, which names the chat format and EOS)\n"
    "  --chat-format F       how messages become text: chatml (Qwen), llama3, mistral, or auto\n"
    "                        (default: from tokenizer_config.json's chat_template)\n"
    "  --eos TOKEN           the end-of-sequence token (default: tokenizer_config.json's eos_token)\n"
    "  --text-lines          plain text files hold one document per line\n"
    "  --show N              print the first N documents as the model sees them, what it learns\n"
    "                        between [[ and ]]\n"
    "  -o, --out FILE        the token file to write (replaced atomically)\n";

/* ---- tokenizing ------------------------------------------------------------------------ */

/* A document is built as text in pieces, each a target or not; it is then
 * tokenized whole, as transformers tokenizes a rendered chat template (a
 * SentencePiece tokenizer marks only the text's start, and merges may cross
 * a piece's edge), and each token takes the flag of the piece it comes
 * from: the text up to each edge where the flag changes is tokenized too,
 * and its ids must be the start of the whole's (at these edges, special
 * tokens and newlines, they are; else the document is refused). */
typedef struct prep {
    mt_tokenizer *tok;
    chat_format chat;
    const char *eos;       /* the EOS token's text, or NULL */
    char *text;            /* the document being built */
    size_t len, cap;
    size_t *edge;          /* text offsets where the target flag changes */
    int *edge_target;      /* the flag of the text before each edge */
    size_t n_edges, cap_edges;
    int last_target;
    int32_t *ids, *prefix;
    size_t ids_cap, prefix_cap;
    uint8_t *flags;        /* the document's target flags, one per id */
    size_t flags_cap;
    mt_doc_writer *out;
    int n_show, shown;     /* --show: how many documents to print, how many were */
    char *show_text;
    size_t show_cap;
    const char *where;     /* "file:line" of the document being read */
} prep;

static void add_text(prep *p, const char *text, int target)
{
    const size_t n = strlen(text);
    if (!n) return;
    if (p->len && target != p->last_target) {
        if (p->n_edges == p->cap_edges &&
            (!(p->edge = realloc(p->edge, (p->cap_edges = p->cap_edges ? 2 * p->cap_edges : 64) * sizeof *p->edge)) ||
             !(p->edge_target = realloc(p->edge_target, p->cap_edges * sizeof *p->edge_target))))
            cli_die("out of memory");
        p->edge[p->n_edges] = p->len;
        p->edge_target[p->n_edges++] = p->last_target;
    }
    if (p->len + n + 1 > p->cap && !(p->text = realloc(p->text, p->cap = 2 * (p->len + n + 1)))) cli_die("out of memory");
    memcpy(p->text + p->len, text, n + 1);
    p->len += n;
    p->last_target = target;
}

static void add_eos(prep *p)
{
    if (!p->eos) cli_die("%s: the tokenizer names no EOS token to end a document with: give --eos TOKEN", p->where);
    add_text(p, p->eos, 1);
}

/* The ids of text[0, len) into *ids (grown as needed); their number. */
static size_t encode(prep *p, size_t len, int32_t **ids, size_t *cap)
{
    size_t n = 0;
    mt_status st = mt_tokenizer_encode(p->tok, p->text, len, MT_ENCODE_SPECIAL, *ids, *cap, &n);
    if (st == MT_OK && n > *cap) {
        *cap = n + n / 2 + 16;
        if (!(*ids = realloc(*ids, *cap * sizeof **ids))) cli_die("out of memory");
        st = mt_tokenizer_encode(p->tok, p->text, len, MT_ENCODE_SPECIAL, *ids, *cap, &n);
    }
    if (st != MT_OK) cli_die("%s: %s", p->where, mt_last_errmsg());
    return n;
}

/* A document as the model sees it, each run of learnt tokens between [[ ]]. */
static void show(prep *p, const int32_t *ids, const uint8_t *flags, size_t n)
{
    printf("--- document %d: %llu tokens\n", ++p->shown, (unsigned long long)n);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && flags[j] == flags[i]) j++;
        size_t len = 0;
        if (mt_tokenizer_decode(p->tok, ids + i, j - i, 0, p->show_text, p->show_cap, &len) == MT_OK &&
            len >= p->show_cap) {
            if (!(p->show_text = realloc(p->show_text, p->show_cap = len + 1))) cli_die("out of memory");
            mt_tokenizer_decode(p->tok, ids + i, j - i, 0, p->show_text, p->show_cap, &len);
        }
        printf("%s%.*s%s", flags[i] ? "[[" : "", (int)len, p->show_text ? p->show_text : "", flags[i] ? "]]" : "");
        i = j;
    }
    printf("\n");
}

static void end_document(prep *p)
{
    if (!p->len) return;
    const size_t n = encode(p, p->len, &p->ids, &p->ids_cap);
    if (n > p->flags_cap && !(p->flags = realloc(p->flags, p->flags_cap = n))) cli_die("out of memory");
    size_t from = 0;
    for (size_t e = 0; e <= p->n_edges; e++) {
        size_t to = n;
        int target = p->last_target;
        if (e < p->n_edges) {
            to = encode(p, p->edge[e], &p->prefix, &p->prefix_cap);
            target = p->edge_target[e];
            if (to > n || to < from || memcmp(p->prefix, p->ids, to * sizeof *p->ids))
                cli_die("%s: the text before byte %zu of the rendered document tokenizes differently alone than in "
                        "the whole, so its learnt part cannot be marked: is the chat format the tokenizer's?",
                        p->where, p->edge[e]);
        }
        memset(p->flags + from, target, to - from);
        from = to;
    }
    if (mt_doc_writer_append(p->out, p->ids, p->flags, n) != MT_OK || mt_doc_writer_end_document(p->out) != MT_OK)
        cli_die("%s: %s", p->where, mt_last_errmsg());
    if (n && p->shown < p->n_show) show(p, p->ids, p->flags, n);
    p->len = 0;
    p->n_edges = 0;
}

static const char *str_member(const cJSON *o, const char *name, int required, const char *where)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v && !required) return NULL;
    if (!cJSON_IsString(v)) cli_die("%s: \"%s\" %s", where, name, v ? "is not a string" : "is missing");
    return v->valuestring;
}

/* One conversation in the chat format: every role's header and content, the
 * assistant's content and end-of-turn token alone as targets. */
static void add_messages(prep *p, const cJSON *msgs)
{
    if (p->chat == CHAT_NONE)
        cli_die("%s: messages need a chat format, and the tokenizer's config names none: give --chat-format "
                "chatml, llama3 or mistral",
                p->where);
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)) cli_die("%s: \"messages\" is not a non-empty array", p->where);
    int learnt = 0;
    const char *system = NULL;
    if (p->chat == CHAT_LLAMA3) add_text(p, "<|begin_of_text|>", 0);
    if (p->chat == CHAT_MISTRAL) add_text(p, "<s>", 0);
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const char *role = str_member(m, "role", 1, p->where), *content = str_member(m, "content", 1, p->where);
        const int assistant = !strcmp(role, "assistant");
        if (strcmp(role, "system") && strcmp(role, "user") && !assistant)
            cli_die("%s: role \"%s\": the roles are system, user and assistant", p->where, role);
        char head[256];
        switch (p->chat) {
        case CHAT_CHATML:
            snprintf(head, sizeof head, "<|im_start|>%s\n", role);
            add_text(p, head, 0);
            add_text(p, content, assistant);
            add_text(p, "<|im_end|>", assistant);
            add_text(p, "\n", 0);
            break;
        case CHAT_LLAMA3:
            snprintf(head, sizeof head, "<|start_header_id|>%s<|end_header_id|>\n\n", role);
            add_text(p, head, 0);
            add_text(p, content, assistant);
            add_text(p, "<|eot_id|>", assistant);
            break;
        case CHAT_MISTRAL: /* [INST] user [/INST]assistant</s>; a system turn goes before the next user turn */
            if (!strcmp(role, "system")) {
                system = content;
            } else if (!assistant) {
                add_text(p, "[INST] ", 0);
                if (system) {
                    add_text(p, system, 0);
                    add_text(p, "\n\n", 0);
                    system = NULL;
                }
                add_text(p, content, 0);
                add_text(p, " [/INST]", 0);
            } else {
                add_text(p, content, 1);
                add_eos(p);
            }
            break;
        case CHAT_NONE:
        case CHAT_AUTO: break;
        }
        learnt |= assistant;
    }
    if (!learnt) cli_die("%s: the conversation has no assistant turn: nothing to learn", p->where);
}

static void add_record(prep *p, const char *line)
{
    cJSON *j = cJSON_Parse(line);
    if (!cJSON_IsObject(j)) cli_die("%s: not a JSON object", p->where);
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const char *prompt = str_member(j, "prompt", 0, p->where), *text = str_member(j, "text", 0, p->where);
    if (msgs) {
        add_messages(p, msgs);
    } else if (prompt) {
        add_text(p, prompt, 0);
        add_text(p, str_member(j, "completion", 1, p->where), 1);
        add_eos(p);
    } else if (text) {
        add_text(p, text, 1);
        add_eos(p);
    } else {
        cli_die("%s: a record has \"messages\", \"prompt\" and \"completion\", or \"text\"", p->where);
    }
    cJSON_Delete(j);
    end_document(p);
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static void add_file(prep *p, const char *path, int text_lines)
{
    FILE *f = fopen(path, "r");
    if (!f) cli_die("cannot open %s: %s", path, strerror(errno));
    const int jsonl = has_suffix(path, ".jsonl") || has_suffix(path, ".json");
    char *line = NULL, where[4200];
    size_t cap = 0;
    ssize_t len;
    long no = 0;
    char *whole = NULL;
    size_t whole_len = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        no++;
        snprintf(where, sizeof where, "%s:%ld", path, no);
        p->where = where;
        if (jsonl) {
            if (strspn(line, " \t\r\n") == (size_t)len) continue;
            add_record(p, line);
        } else if (text_lines) {
            line[strcspn(line, "\r\n")] = '\0';
            if (!*line) continue;
            add_text(p, line, 1);
            add_eos(p);
            end_document(p);
        } else {
            if (!(whole = realloc(whole, whole_len + (size_t)len + 1))) cli_die("out of memory");
            memcpy(whole + whole_len, line, (size_t)len + 1);
            whole_len += (size_t)len;
        }
    }
    if (ferror(f)) cli_die("reading %s: %s", path, strerror(errno));
    fclose(f);
    free(line);
    if (!jsonl && !text_lines && whole_len) {
        snprintf(where, sizeof where, "%s", path);
        p->where = where;
        add_text(p, whole, 1);
        add_eos(p);
        end_document(p);
    }
    free(whole);
}

/* ---- the command ---------------------------------------------------------------------------- */

/* cli_die exits without unwinding: the writer being filled is freed at exit,
 * which removes its temporary, so a refused input leaves no file behind. */
static mt_doc_writer *unfinished;
static void drop_unfinished(void) { mt_doc_writer_free(unfinished); }

int cmd_prepare(int argc, char **argv)
{
    const char *tok_path = NULL, *out = NULL, *inputs[256];
    int n_inputs = 0, text_lines = 0, n_show = 0;
    chat_format chat = CHAT_AUTO;
    char eos[256] = "";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            fputs(prepare_help, stdout);
            return 0;
        } else if (cli_opt(argc, argv, &i, "--tokenizer", &v)) tok_path = v;
        else if (cli_opt(argc, argv, &i, "--out", &v) || cli_opt(argc, argv, &i, "-o", &v)) out = v;
        else if (cli_opt(argc, argv, &i, "--eos", &v)) snprintf(eos, sizeof eos, "%s", v);
        else if (cli_opt(argc, argv, &i, "--chat-format", &v)) chat = chat_format_named(v);
        else if (cli_flag(argv, i, "--text-lines")) text_lines = 1;
        else if (cli_opt(argc, argv, &i, "--show", &v)) n_show = (int)cli_int("--show", v, 0, 1 << 20);
        else if (argv[i][0] == '-') cli_die("prepare: unknown option '%s' (see megatrain prepare --help)", argv[i]);
        else if (n_inputs == 256) cli_die("prepare: at most 256 input files");
        else inputs[n_inputs++] = argv[i];
    }
    if (!tok_path) cli_die("prepare: give the tokenizer with --tokenizer DIR|FILE");
    if (!out) cli_die("prepare: give the output file with -o FILE");
    if (!n_inputs) cli_die("prepare: give at least one input file");
    prep p = {0};
    if (mt_tokenizer_load(&p.tok, tok_path) != MT_OK) cli_die("%s", mt_last_errmsg());
    chat_config(tok_path, &chat, eos, sizeof eos);
    p.chat = chat;
    if (*eos && mt_tokenizer_token_to_id(p.tok, eos) < 0)
        cli_die("prepare: the EOS token \"%s\" is not in the tokenizer's vocabulary", eos);
    p.eos = *eos ? eos : NULL;
    const uint32_t vocab = mt_tokenizer_vocab_size(p.tok);
    p.n_show = n_show;
    if (mt_doc_writer_create(&p.out, out, vocab) != MT_OK) cli_die("%s", mt_last_errmsg());
    unfinished = p.out;
    atexit(drop_unfinished);
    for (int i = 0; i < n_inputs; i++) add_file(&p, inputs[i], text_lines);
    const uint64_t n_docs = mt_doc_writer_num_documents(p.out), n_tok = mt_doc_writer_num_tokens(p.out),
                   n_targets = mt_doc_writer_num_targets(p.out);
    if (!n_docs) cli_die("prepare: the inputs hold no document");
    if (!n_targets) cli_die("prepare: the documents hold no token to learn");
    if (mt_doc_writer_finish(p.out) != MT_OK) cli_die("%s", mt_last_errmsg());
    printf("%s: %llu documents, %llu tokens, %llu of them learnt (%.1f%%), vocabulary %u, chat format %s%s%s\n", out,
           (unsigned long long)n_docs, (unsigned long long)n_tok, (unsigned long long)n_targets,
           100.0 * (double)n_targets / (double)n_tok, vocab, chat_format_name(p.chat), *eos ? ", EOS " : "", eos);
    mt_tokenizer_free(p.tok);
    free(p.ids);
    free(p.prefix);
    free(p.flags);
    free(p.text);
    free(p.edge);
    free(p.edge_target);
    free(p.show_text);
    return 0; /* the writer, finished, is freed at exit */
}
