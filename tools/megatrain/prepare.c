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
#include <sys/stat.h>

static const char prepare_help[] =
    "usage: megatrain prepare --tokenizer DIR|FILE [--chat-template NAME|FILE] [--text-lines] -o OUT INPUT...\n"
    "\n"
    "Tokenizes INPUT files into a document token file for `megatrain train --data OUT`:\n"
    "  .jsonl  one document per line: {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (and\n"
    "          \"tools\" where the template takes them), rendered by the model's chat template; only\n"
    "          what the assistant's turns add is learnt (their content and end-of-turn marker),\n"
    "          {\"prompt\": ..., \"completion\": ...} (only the completion and EOS are learnt)\n"
    "          or {\"text\": ...} (all of it, and EOS)\n"
    "  other   plain text: the whole file one document (--text-lines: each line one), all learnt\n"
    "\n"
    "options:\n"
    "  --tokenizer DIR|FILE     a Hugging Face tokenizer.json, or the model folder holding it (and\n"
    "                           its chat_template.jinja or tokenizer_config.json: the chat template, EOS)\n"
    "  --chat-template NAME|FILE  the template for a folder without one: chatml (Qwen), llama3,\n"
    "                           mistral, or a .jinja or tokenizer_config.json file\n"
    "  --chat-vars JSON         variables for the template, e.g. '{\"enable_thinking\": false}'\n"
    "  --eos TOKEN              the end-of-sequence token (default: tokenizer_config.json's eos_token)\n"
    "  --text-lines             plain text files hold one document per line\n"
    "  --show N                 print the first N documents as the model sees them, what it learns\n"
    "                           between [[ and ]]\n"
    "  -o, --out FILE           the token file to write (replaced atomically)\n";

/* ---- tokenizing ------------------------------------------------------------------------ */

/* A document is its text and the byte ranges of it that are learnt. It is
 * tokenized whole, as transformers tokenizes a rendered chat template (a
 * SentencePiece tokenizer marks only the text's start, and merges may cross
 * a range's edge), and a token is learnt when its text overlaps a learnt
 * range, as transformers' assistant mask takes it (char_to_token of the
 * range's first and last characters, and the tokens between). A token's
 * place is found by tokenizing the text up to the range's edge: the ids it
 * shares with the whole end where the edge is, or in the token across it. */
typedef struct prep {
    mt_tokenizer *tok;
    mt_chat_template *chat;
    char chat_why[512];    /* why there is no template, for the first conversation */
    const char *chat_name; /* what the template is, for the summary */
    cJSON *vars;           /* --chat-vars, or NULL */
    const char *eos;       /* the EOS token's text, or NULL */
    char *text;            /* the document being built */
    size_t len, cap;
    size_t *span;          /* learnt byte ranges: pairs (start, end) */
    size_t n_spans, cap_spans;
    int32_t *ids, *prefix;
    size_t ids_cap, prefix_cap;
    uint8_t *flags;        /* the document's target flags, one per id */
    size_t flags_cap;
    mt_doc_writer *out;
    int n_show, shown;     /* --show: how many documents to print, how many were */
    uint64_t n_convs, n_chat_texts; /* conversations, and the texts the template gave of them */
    char *show_text;
    size_t show_cap;
    const char *where;     /* "file:line" of the document being read */
} prep;

static void add_bytes(prep *p, const char *text, size_t n, int target)
{
    if (!n) return;
    if (target) {
        if (p->n_spans && p->span[2 * p->n_spans - 1] == p->len) {
            p->span[2 * p->n_spans - 1] += n; /* one range with the one before it */
        } else {
            if (p->n_spans == p->cap_spans &&
                !(p->span = realloc(p->span, 2 * (p->cap_spans = p->cap_spans ? 2 * p->cap_spans : 16) * sizeof *p->span)))
                cli_die("out of memory");
            p->span[2 * p->n_spans] = p->len;
            p->span[2 * p->n_spans++ + 1] = p->len + n;
        }
    }
    if (p->len + n + 1 > p->cap && !(p->text = realloc(p->text, p->cap = 2 * (p->len + n + 1)))) cli_die("out of memory");
    memcpy(p->text + p->len, text, n);
    p->len += n;
    p->text[p->len] = '\0';
}

static void add_text(prep *p, const char *text, int target) { add_bytes(p, text, strlen(text), target); }

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

/* Of the whole's n ids, how many lie wholly before byte edge, and whether the next one crosses it: the ids of
 * text[0, edge) that the whole shares. */
static size_t ids_before(prep *p, size_t edge, size_t n, int *crossed)
{
    const size_t m = encode(p, edge, &p->prefix, &p->prefix_cap);
    size_t c = 0;
    while (c < m && c < n && p->prefix[c] == p->ids[c]) c++;
    *crossed = c < m;
    return c;
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
    memset(p->flags, 0, n);
    for (size_t s = 0; s < p->n_spans; s++) {
        const size_t start = p->span[2 * s], end = p->span[2 * s + 1];
        if (start >= end) continue;
        int crossed;
        const size_t first = start ? ids_before(p, start, n, &crossed) : 0;
        size_t last = end < p->len ? ids_before(p, end, n, &crossed) : n;
        if (end < p->len && crossed && last < n) last++; /* the token across the range's end */
        if (first < last) memset(p->flags + first, 1, last - first);
    }
    if (mt_doc_writer_append(p->out, p->ids, p->flags, n) != MT_OK || mt_doc_writer_end_document(p->out) != MT_OK)
        cli_die("%s: %s", p->where, mt_last_errmsg());
    if (n && p->shown < p->n_show) show(p, p->ids, p->flags, n);
    p->len = 0;
    p->n_spans = 0;
}

/* One text of a conversation from mt_chat_render_learnt: a document. */
static int on_chat_text(void *user, const char *text, size_t len, const size_t *spans, size_t n_spans)
{
    prep *p = user;
    p->n_chat_texts++;
    size_t at = 0;
    for (size_t s = 0; s < n_spans; s++) {
        const size_t a = spans[2 * s] > at ? spans[2 * s] : at, b = spans[2 * s + 1];
        add_bytes(p, text + at, a - at, 0);
        if (b > a) add_bytes(p, text + a, b - a, 1);
        if (b > at) at = b;
    }
    add_bytes(p, text + at, len - at, 0);
    end_document(p);
    return 0;
}

static const char *str_member(const cJSON *o, const char *name, int required, const char *where)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v && !required) return NULL;
    if (!cJSON_IsString(v)) cli_die("%s: \"%s\" %s", where, name, v ? "is not a string" : "is missing");
    return v->valuestring;
}

/* One conversation, by the model's chat template: a document for the whole (and one for each turn that the
 * template renders differently once later messages follow), what the assistant's turns add learnt. */
static void add_messages(prep *p, const cJSON *msgs, const cJSON *tools)
{
    if (!p->chat) cli_die("%s: %s", p->where, p->chat_why);
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)) cli_die("%s: \"messages\" is not a non-empty array", p->where);
    cJSON *vars = p->vars ? cJSON_Duplicate(p->vars, 1) : cJSON_CreateObject();
    if (!vars || (tools && !cJSON_AddItemToObject(vars, "tools", cJSON_Duplicate(tools, 1)))) cli_die("out of memory");
    char *m = cJSON_PrintUnformatted(msgs), *v = cJSON_PrintUnformatted(vars);
    if (!m || !v) cli_die("out of memory");
    if (mt_chat_render_learnt(p->chat, m, v, on_chat_text, p) != MT_OK) cli_die("%s: %s", p->where, mt_last_errmsg());
    p->n_convs++;
    free(m);
    free(v);
    cJSON_Delete(vars);
}

static void add_record(prep *p, const char *line)
{
    cJSON *j = cJSON_Parse(line);
    if (!cJSON_IsObject(j)) cli_die("%s: not a JSON object", p->where);
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const char *prompt = str_member(j, "prompt", 0, p->where), *text = str_member(j, "text", 0, p->where);
    if (msgs) {
        add_messages(p, msgs, cJSON_GetObjectItemCaseSensitive(j, "tools"));
        cJSON_Delete(j);
        return; /* its documents are written */
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
    const char *chat_named = NULL, *chat_vars = NULL;
    char eos[256] = "";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            fputs(prepare_help, stdout);
            return 0;
        } else if (cli_opt(argc, argv, &i, "--tokenizer", &v)) tok_path = v;
        else if (cli_opt(argc, argv, &i, "--out", &v) || cli_opt(argc, argv, &i, "-o", &v)) out = v;
        else if (cli_opt(argc, argv, &i, "--eos", &v)) snprintf(eos, sizeof eos, "%s", v);
        else if (cli_opt(argc, argv, &i, "--chat-template", &v) || cli_opt(argc, argv, &i, "--chat-format", &v))
            chat_named = v;
        else if (cli_opt(argc, argv, &i, "--chat-vars", &v)) chat_vars = v;
        else if (cli_flag(argv, i, "--text-lines")) text_lines = 1;
        else if (cli_opt(argc, argv, &i, "--show", &v)) n_show = (int)cli_int("--show", v, 0, 1 << 20);
        else if (argv[i][0] == '-') cli_die("prepare: unknown option '%s' (see megatrain prepare --help)", argv[i]);
        else if (n_inputs == 256) cli_die("prepare: at most 256 input files");
        else inputs[n_inputs++] = argv[i];
    }
    if (!tok_path) cli_die("prepare: give the tokenizer with --tokenizer DIR|FILE");
    if (!out) cli_die("prepare: give the output file with -o FILE");
    if (!n_inputs) cli_die("prepare: give at least one input file");
    /* before any work: -o is a file this command may write, and none it reads */
    cli_inputs in = {0};
    cli_input_add(&in, "--tokenizer", tok_path);
    struct stat sb;
    if (stat(tok_path, &sb) == 0 && !S_ISDIR(sb.st_mode)) { /* a tokenizer.json: the config files beside it */
        static const char *const beside[] = {"tokenizer_config.json", "chat_template.jinja"};
        const char *slash = strrchr(tok_path, '/');
        for (int i = 0; i < 2; i++) {
            char path[4200];
            snprintf(path, sizeof path, "%.*s%s", slash ? (int)(slash - tok_path + 1) : 0, tok_path, beside[i]);
            cli_input_add(&in, "--tokenizer", path);
        }
    }
    cli_input_add(&in, "--chat-template", chat_named);
    for (int i = 0; i < n_inputs; i++) cli_input_add(&in, "input", inputs[i]);
    cli_std_check(&in);
    if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)) cli_die("prepare: -o %s is a folder; give the token file to write", out);
    cli_output_check(&in, "-o", out);
    cli_inputs_free(&in);
    cli_probe_file("prepare: -o", out);
    prep p = {0};
    if (mt_tokenizer_load(&p.tok, tok_path) != MT_OK) cli_die("%s", mt_last_errmsg());
    chat_eos(tok_path, eos, sizeof eos);
    p.chat = chat_template_open(tok_path, chat_named, p.chat_why, sizeof p.chat_why);
    p.chat_name = chat_named ? chat_named : "of the tokenizer folder";
    if (chat_vars && !cJSON_IsObject(p.vars = cJSON_Parse(chat_vars)))
        cli_die("prepare: --chat-vars is not a JSON object: %s", chat_vars);
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
    /* a turn rendered apart is a document of its own: say so, or the count of documents surprises */
    if (p.n_chat_texts > p.n_convs)
        printf("%llu of the conversations' assistant turns are documents of their own: the template renders them "
               "otherwise once later messages follow (docs/fine-tuning.md)\n",
               (unsigned long long)(p.n_chat_texts - p.n_convs));
    printf("%s: %llu documents, %llu tokens, %llu of them learnt (%.1f%%), vocabulary %u, chat template %s%s%s\n", out,
           (unsigned long long)n_docs, (unsigned long long)n_tok, (unsigned long long)n_targets,
           100.0 * (double)n_targets / (double)n_tok, vocab, p.chat ? p.chat_name : "none", *eos ? ", EOS " : "", eos);
    mt_tokenizer_free(p.tok);
    free(p.ids);
    free(p.prefix);
    free(p.flags);
    free(p.text);
    free(p.span);
    mt_chat_template_free(p.chat);
    cJSON_Delete(p.vars);
    free(p.show_text);
    return 0; /* the writer, finished, is freed at exit */
}
