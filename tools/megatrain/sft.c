/* The fine-tuning demo's data: word problems with worked answers as chat
 * conversations (JSONL), and a small byte-level BPE tokenizer trained on
 * them, written as Hugging Face files. `megatrain sft-data DIR`, then
 * prepare, train and eval as a user would (tools/sft-demo.sh). */
#define _GNU_SOURCE
#include "chat.h"
#include "run.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t next_u64(uint64_t *s)
{ /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int pick(uint64_t *rng, int n) { return (int)(next_u64(rng) % (uint64_t)n); }

/* ---- the problems ------------------------------------------------------------------------ */

static const char *const NAMES[] = {"Ann", "Ben", "Cara", "Dev", "Emma", "Finn", "Gia", "Hugo", "Iris", "Jon",
                                    "Kai", "Lena", "Max", "Nora", "Omar", "Pia"};
static const char *const THINGS[] = {"apples", "books", "coins", "pens", "shells", "stamps", "cards", "marbles",
                                     "stickers", "plums"};

/* One problem: the user's question and the assistant's worked answer. The
 * sums and differences split by a hash of (operation, x, y): one in twenty
 * is held out, so a held-out problem's arithmetic is never trained on. */
static void problem(uint64_t *rng, int heldout, char *q, size_t qn, char *a, size_t an)
{
    const char *who = NAMES[pick(rng, 16)], *what = THINGS[pick(rng, 10)];
    int x, y, add;
    do {
        x = 10 + pick(rng, 50), y = 10 + pick(rng, 50), add = pick(rng, 2);
        if (!add && x < y) {
            int t = x;
            x = y, y = t;
        }
    } while ((next_u64(&(uint64_t){(uint64_t)(add * 10000 + x * 100 + y)}) % 20 == 0) != heldout);
    if (add) {
        snprintf(q, qn, "%s has %d %s and gets %d more. How many now?", who, x, what, y);
        snprintf(a, an, "%d + %d = %d.", x, y, x + y);
    } else {
        snprintf(q, qn, "%s has %d %s and gives away %d. How many are left?", who, x, what, y);
        snprintf(a, an, "%d - %d = %d.", x, y, x - y);
    }
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if (*s == '\n') fputs("\\n", f);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* n conversations of `turns` problems each, one JSON object a line; the
 * text of all of them, as the tokenizer will see it, into corpus. */
static void write_conversations(const char *path, int n, int turns, int heldout, uint64_t *rng, FILE *corpus)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) cli_die("cannot write %s: %s", tmp, strerror(errno));
    for (int c = 0; c < n; c++) {
        fputs("{\"messages\": [", f);
        for (int t = 0; t < turns; t++) {
            char q[256], a[256];
            problem(rng, heldout, q, sizeof q, a, sizeof a);
            fprintf(f, "%s{\"role\": \"user\", \"content\": ", t ? ", " : "");
            json_string(f, q);
            fputs("}, {\"role\": \"assistant\", \"content\": ", f);
            json_string(f, a);
            fputs("}", f);
            if (corpus) fprintf(corpus, "user\n%s\nassistant\n%s\n", q, a);
        }
        fputs("]}\n", f);
    }
    if (fclose(f) || rename(tmp, path)) cli_die("cannot write %s: %s", path, strerror(errno));
}

/* ---- a byte-level BPE tokenizer, trained on the corpus ------------------------------------- */

/* GPT-2's map of bytes to printable characters, as byte-level BPE spells
 * its vocabulary: printable Latin-1 bytes stand for themselves, the others
 * for U+0100 on. UTF-8 of the byte's character into out (<= 3 bytes). */
static int byte_char(int b, char *out)
{
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int n = 0;
        for (int k = 0; k < b; k++) n += !((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Words of the corpus as the tokenizer's pre-tokenizer splits ASCII text: a
 * letter run with the one space or mark before it, each digit alone, runs of
 * other marks with a space before them, newlines. Each word is a list of
 * symbol ids (bytes 0..255, then the merges' new symbols). */
typedef struct word {
    int *sym;
    int n;
    long count;
} word;

typedef struct words {
    word *w;
    int n, cap;
} words;

static void add_word(words *ws, const unsigned char *s, int len)
{
    for (int i = 0; i < ws->n; i++)
        if (ws->w[i].n == len) {
            int same = 1;
            for (int k = 0; k < len && same; k++) same = ws->w[i].sym[k] == s[k];
            if (same) {
                ws->w[i].count++;
                return;
            }
        }
    if (ws->n == ws->cap && !(ws->w = realloc(ws->w, (size_t)(ws->cap = ws->cap ? 2 * ws->cap : 256) * sizeof *ws->w)))
        cli_die("out of memory");
    word *w = &ws->w[ws->n++];
    if (!(w->sym = malloc((size_t)len * sizeof *w->sym))) cli_die("out of memory");
    for (int k = 0; k < len; k++) w->sym[k] = s[k];
    w->n = len;
    w->count = 1;
}

static void split_words(words *ws, const unsigned char *t, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        if (isdigit(t[j])) j++;
        else if (isalpha(t[j]) || (j + 1 < n && !isdigit(t[j]) && t[j] != '\n' && isalpha(t[j + 1]))) {
            j++;
            while (j < n && isalpha(t[j])) j++;
        } else if (t[j] == '\n') {
            while (j < n && t[j] == '\n') j++;
        } else {
            if (t[j] == ' ') j++;
            while (j < n && !isalnum(t[j]) && !isspace(t[j])) j++;
            if (j == i) j++;
        }
        add_word(ws, t + i, (int)(j - i));
        i = j;
    }
}

/* The most frequent adjacent pair of symbols over the words; 0 when none
 * occurs twice. */
static long best_pair(const words *ws, int n_sym, int *a, int *b, long *counts)
{
    memset(counts, 0, (size_t)n_sym * n_sym * sizeof *counts);
    long best = 0;
    for (int i = 0; i < ws->n; i++)
        for (int k = 0; k + 1 < ws->w[i].n; k++) {
            long *c = &counts[(size_t)ws->w[i].sym[k] * n_sym + ws->w[i].sym[k + 1]];
            *c += ws->w[i].count;
            if (*c > best || (*c == best && (size_t)(c - counts) < (size_t)*a * n_sym + *b)) {
                best = *c;
                *a = ws->w[i].sym[k], *b = ws->w[i].sym[k + 1];
            }
        }
    return best;
}

#define N_MERGES 384

/* tokenizer.json: byte-level BPE over the corpus's words with N_MERGES
 * merges, the special tokens of ChatML, and tokenizer_config.json naming
 * the chat format and the end of a document. */
static void write_tokenizer(const char *dir, const char *corpus, size_t corpus_len)
{
    words ws = {0};
    split_words(&ws, (const unsigned char *)corpus, corpus_len);
    const int max_sym = 256 + N_MERGES;
    char (*spell)[64] = calloc((size_t)max_sym, sizeof *spell);
    long *counts = malloc((size_t)max_sym * max_sym * sizeof *counts);
    int (*merge)[2] = malloc(N_MERGES * sizeof *merge);
    if (!spell || !counts || !merge) cli_die("out of memory");
    for (int b = 0; b < 256; b++) spell[b][byte_char(b, spell[b])] = '\0';
    int n_sym = 256, n_merges = 0;
    while (n_merges < N_MERGES) {
        int a = max_sym, b = max_sym;
        if (best_pair(&ws, max_sym, &a, &b, counts) < 2) break;
        const size_t la = strlen(spell[a]), lb = strlen(spell[b]);
        if (la + lb >= sizeof spell[0]) break;
        memcpy(spell[n_sym], spell[a], la);
        memcpy(spell[n_sym] + la, spell[b], lb + 1);
        merge[n_merges][0] = a, merge[n_merges][1] = b;
        for (int i = 0; i < ws.n; i++) { /* apply the merge to every word */
            word *w = &ws.w[i];
            int o = 0;
            for (int k = 0; k < w->n; k++)
                if (k + 1 < w->n && w->sym[k] == a && w->sym[k + 1] == b) w->sym[o++] = n_sym, k++;
                else w->sym[o++] = w->sym[k];
            w->n = o;
        }
        n_sym++, n_merges++;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) cli_die("out of memory");
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [\n", f);
    static const char *const special[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++)
        fprintf(f,
                "    {\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                "\"normalized\": false, \"special\": true}%s\n",
                n_sym + i, special[i], i < 2 ? "," : "");
    fputs("  ],\n  \"normalizer\": null,\n", f);
    fputs("  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
          "\"use_regex\": true},\n",
          f);
    fputs("  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
          "\"use_regex\": true},\n",
          f);
    fputs("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
          "\"use_regex\": true},\n",
          f);
    fputs("  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
          "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
          "    \"vocab\": {",
          f);
    for (int s = 0; s < n_sym; s++) {
        fprintf(f, "%s", s ? ", " : "");
        json_string(f, spell[s]);
        fprintf(f, ": %d", s);
    }
    fputs("},\n    \"merges\": [", f);
    for (int m = 0; m < n_merges; m++) {
        char pair[130];
        snprintf(pair, sizeof pair, "%s %s", spell[merge[m][0]], spell[merge[m][1]]);
        fputs(m ? ", " : "", f);
        json_string(f, pair);
    }
    fputs("]\n  }\n}\n", f);
    fclose(f);
    if (run_write_atomic(path, text)) cli_die("cannot write %s: %s", path, strerror(errno));
    free(text);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (run_write_atomic(path,
                         "{\n  \"chat_template\": \"{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                         "'\\\\n' + message['content'] + '<|im_end|>' + '\\\\n'}}{% endfor %}{% if add_generation_prompt "
                         "%}{{ '<|im_start|>assistant\\\\n' }}{% endif %}\",\n  \"eos_token\": \"<|endoftext|>\",\n"
                         "  \"pad_token\": \"<|endoftext|>\",\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n"))
        cli_die("cannot write %s: %s", path, strerror(errno));
    printf("%s/tokenizer.json: byte-level BPE, %d merges learnt from the problems, %d ids with ChatML's special "
           "tokens\n",
           dir, n_merges, n_sym + 3);
    for (int i = 0; i < ws.n; i++) free(ws.w[i].sym);
    free(ws.w);
    free(spell);
    free(counts);
    free(merge);
}

int cmd_sft_data(int argc, char **argv)
{
    const char *dir = NULL;
    int n_train = 4000, n_heldout = 200, turns = 5;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            puts("usage: megatrain sft-data DIR [--conversations N] [--heldout N] [--turns N] [--seed N]\n\n"
                 "Writes the fine-tuning demo's data into DIR: train.jsonl, conversations of word problems\n"
                 "with worked answers ({\"messages\": [...]}; default 4000 of 5 problems, --turns), and\n"
                 "heldout.jsonl (200 problems whose arithmetic is never trained on), and a byte-level BPE\n"
                 "tokenizer learnt from them (tokenizer.json, and tokenizer_config.json with the ChatML chat\n"
                 "format). tools/sft-demo.sh runs the rest: megatrain prepare, train and eval.");
            return 0;
        } else if (cli_opt(argc, argv, &i, "--conversations", &v)) n_train = (int)cli_int("--conversations", v, 1, 10000000);
        else if (cli_opt(argc, argv, &i, "--heldout", &v)) n_heldout = (int)cli_int("--heldout", v, 1, 1000000);
        else if (cli_opt(argc, argv, &i, "--turns", &v)) turns = (int)cli_int("--turns", v, 1, 64);
        else if (cli_opt(argc, argv, &i, "--seed", &v)) seed = (uint64_t)cli_int("--seed", v, 0, INT64_MAX);
        else if (argv[i][0] == '-') cli_die("sft-data: unknown option '%s'", argv[i]);
        else dir = argv[i];
    }
    if (!dir) cli_die("sft-data: give the folder to write");
    char part[4200]; /* mkdir -p */
    for (const char *p = dir; (p = strchr(p + 1, '/')) || 1; ) {
        snprintf(part, sizeof part, "%.*s", p ? (int)(p - dir) : (int)strlen(dir), dir);
        if (*part && mkdir(part, 0755) && errno != EEXIST) cli_die("cannot create %s: %s", part, strerror(errno));
        if (!p) break;
    }
    char path[4200], *corpus = NULL;
    size_t corpus_len = 0;
    FILE *c = open_memstream(&corpus, &corpus_len);
    if (!c) cli_die("out of memory");
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 7, held_rng = rng ^ 0x5bd1e995u;
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    write_conversations(path, n_train, turns, 0, &rng, c);
    snprintf(path, sizeof path, "%s/heldout.jsonl", dir);
    write_conversations(path, n_heldout, 1, 1, &held_rng, NULL);
    fclose(c);
    write_tokenizer(dir, corpus, corpus_len);
    free(corpus);
    printf("%s/train.jsonl: %d conversations of %d problems; %s/heldout.jsonl: %d problems whose arithmetic is "
           "never in training\n", dir, n_train, turns, dir, n_heldout);
    return 0;
}
