#define _GNU_SOURCE
/* Chat templates: the Jinja subset of Hugging Face chat templates (jinja.h).
 *
 * The reference is what transformers' apply_chat_template runs: Python
 * Jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the
 * loopcontrols extension) with transformers' tojson (json.dumps, not HTML
 * safe), raise_exception, strftime_now and {% generation %}. The JavaScript
 * port transformers.js uses, @huggingface/jinja, mirrors it and agrees on
 * what chat templates do; where the two differ (it prints true as "true" and
 * none as "", strips all whitespace in str.strip('\n'), has no string * int,
 * reject or dict(), keeps a set inside a loop for the next iteration) this
 * file follows Python, since that is what the models were trained on. Values
 * print as Python prints them: True, None, 1.0, 1e+16, ['a', 1], {'k': 'v'}.
 *
 * Supported:
 *   tags      if/elif/else, for (else, a filter `if`, tuple targets, break,
 *             continue), set (names, tuples, namespace attributes, block set
 *             with filters), macro (defaults, keyword arguments, recursion),
 *             with, filter, print, generation, raw; comments; whitespace
 *             control ({%- -%} {{- -}} {#- -#}, and + to keep it)
 *   values    none, booleans, 64-bit integers, floats, strings, lists,
 *             tuples, dicts (insertion order), namespaces, macros; the
 *             context arrives as JSON (a whole number is an integer)
 *   operators + - * / // % ** ~, comparisons (chained), in, not in, and,
 *             or, not, a if c else b, attributes, subscripts, slices
 *   filters   abs attr capitalize count d default dictsort e escape first
 *             float indent int items join keys last length list lower map
 *             max min reject rejectattr replace reverse round safe select
 *             selectattr sort string sum title tojson trim unique upper
 *             values
 *   tests     boolean callable defined divisibleby eq equalto even false
 *             float ge gt greaterthan in integer iterable le lower lt
 *             lessthan mapping ne none number odd sameas sequence string
 *             true undefined upper (and == != < <= > >= by name)
 *   methods   str: startswith endswith split rsplit splitlines strip lstrip
 *             rstrip upper lower title capitalize replace find rfind index
 *             rindex count join format isdigit isdecimal isnumeric isalpha
 *             isalnum isspace islower isupper removeprefix removesuffix;
 *             dict: items keys values get copy; list, tuple: count index
 *             copy; loop.cycle
 *   globals   range dict namespace raise_exception strftime_now
 * Undefined values are Jinja2's (falsy, printed as "", iterated as empty, an
 * error in arithmetic), except that an attribute or item of one is undefined
 * too, as in @huggingface/jinja. Python's own limits are kept: range() up to
 * 100000 items, mutating methods (append, update) refused. Departures: a
 * result Python would not fit in 64 bits is an error; case mapping is per
 * code point (plus the common full mappings: ß, the Latin ligatures, İ);
 * dict.items() and range() print as lists; filters run at once where Jinja2
 * has lazy generators (same output, but an error a generator never reached
 * is still an error here); \N{...} escapes and %-formatting are refused.
 *
 * Design. Parsing: the text is lexed as Jinja2's lexer does (its whitespace
 * rules are in the lexer, lex()), then parsed by recursive descent into a
 * tree of nodes with their positions, in an arena the template owns.
 * Rendering walks the tree. Everything a render makes (values, scopes,
 * strings) comes from one arena freed when it ends, so an error anywhere
 * just returns -1 up the calls; the sandbox's values are immutable but for
 * namespaces and iterators, which are shared by reference as in Python. */
#include "text/jinja.h"
#include "text/utf8.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* Limits that keep a hostile template from exhausting the stack or memory. */
#define MAX_NEST 200                   /* parser recursion: brackets, operators, blocks */
#define MAX_CALLS 100                  /* nested macro calls */
#define MAX_DEPTH 200                  /* nesting of values printed, compared or serialized */
#define MAX_RANGE 100000               /* Jinja2's sandbox limit on range() */
#define MAX_VALUE ((size_t)1 << 30)    /* bytes in one string or list */

/* ---- errors ---------------------------------------------------------------------------------- */

typedef struct errbuf {
    char *why;
    size_t len;
    bool set; /* the first error wins: callers up the stack only pass it on */
} errbuf;

static void err_vset(errbuf *e, int line, int col, const char *fmt, va_list ap)
{
    if (e->set) return;
    e->set = true;
    if (!e->why || !e->len) return;
    int k = 0;
    if (line > 0) k = snprintf(e->why, e->len, "line %d, column %d: ", line, col);
    if (k < 0) k = 0;
    if ((size_t)k < e->len) vsnprintf(e->why + k, e->len - (size_t)k, fmt, ap);
}

static int err_set(errbuf *e, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(e, line, col, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- the arena: a template's nodes, a render's values ------------------------------------------- */

typedef struct achunk {
    struct achunk *next;
    size_t used, cap;
    max_align_t data[];
} achunk;

/* Small blocks are carved from 64 KiB chunks; a block over 16 KiB gets a
 * chunk of its own (kept in a list of those), which can grow with realloc:
 * the output and other long strings grow without leaving copies behind.
 * A chunk's used is exact (a block starts aligned), so the end of the last
 * block is known: str_concat appends there. */
typedef struct arena {
    achunk *head, *big;
} arena;

#define ARENA_CHUNK ((size_t)64 << 10)
#define ARENA_BIG (ARENA_CHUNK / 4)
#define ARENA_ALIGN(n) (((n) + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1))

/* A block of n bytes with room for cap (>= n) in a chunk of its own. */
static void *arena_big(arena *a, size_t n, size_t cap)
{
    achunk *b = malloc(sizeof(achunk) + cap);
    if (!b) return NULL;
    b->used = n;
    b->cap = cap;
    b->next = a->big;
    a->big = b;
    return b->data;
}

static void *arena_alloc(arena *a, size_t n)
{
    if (n > MAX_VALUE) return NULL;
    if (!n) n = 1;
    if (n > ARENA_BIG) return arena_big(a, n, n);
    achunk *c = a->head;
    size_t start = c ? ARENA_ALIGN(c->used) : 0;
    if (!c || start + n > c->cap) {
        if (!(c = malloc(sizeof(achunk) + ARENA_CHUNK))) return NULL;
        c->used = 0;
        c->cap = ARENA_CHUNK;
        c->next = a->head;
        a->head = c;
        start = 0;
    }
    c->used = start + n;
    return (char *)c->data + start;
}

/* Grows the block p (old bytes, from arena_alloc) to n bytes: a large one
 * with realloc, a small one in place when it is the chunk's last and there
 * is room, else by copying. */
static void *arena_grow(arena *a, void *p, size_t old, size_t n)
{
    if (n > MAX_VALUE) return NULL;
    if (p && old > ARENA_BIG && n > ARENA_BIG) {
        for (achunk **link = &a->big; *link; link = &(*link)->next) {
            if ((void *)(*link)->data != p) continue;
            achunk *b = realloc(*link, sizeof(achunk) + n);
            if (!b) return NULL;
            b->used = b->cap = n;
            *link = b;
            return b->data;
        }
    }
    achunk *c = a->head;
    if (p && c && n <= ARENA_BIG && (char *)p >= (char *)c->data && (char *)p + old == (char *)c->data + c->used &&
        (size_t)((char *)p - (char *)c->data) + n <= c->cap) {
        c->used = (size_t)((char *)p - (char *)c->data) + n;
        return p;
    }
    void *q = arena_alloc(a, n);
    if (q && p && old) memcpy(q, p, old < n ? old : n);
    return q;
}

static void arena_free(arena *a)
{
    for (int k = 0; k < 2; k++)
        for (achunk *c = k ? a->big : a->head, *next; c; c = next) {
            next = c->next;
            free(c);
        }
    a->head = a->big = NULL;
}

/* ---- UTF-8 and Python's character classes --------------------------------------------------------- */

/* The code point at s (n > 0 bytes left) and its length. Strings here are
 * well-formed (templates and the context are checked), but a stray byte reads
 * as itself rather than running off the end. */
static uint32_t cp_at(const char *s, size_t n, size_t *len)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) return *len = 1, u[0];
    if (!utf8_len(u, n)) return *len = 1, u[0];
    return utf8_decode(u, len);
}

/* The start of the code point that ends at s + n (n > 0). */
static size_t cp_start_before(const char *s, size_t n)
{
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80 && n - i < 4) i--;
    return i;
}

static size_t cp_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* Python's str.isspace(), which is also what \s matches in Jinja2's lexer. */
static bool py_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* The length of the whitespace character at s, 0 when there is none. */
static size_t space_at(const char *s, size_t n)
{
    size_t len;
    uint32_t c = cp_at(s, n, &len);
    return py_isspace(c) ? len : 0;
}

/* n less the whitespace that ends s[0..n). */
static size_t rstrip_space(const char *s, size_t n)
{
    while (n > 0) {
        size_t i = cp_start_before(s, n);
        if (!space_at(s + i, n - i)) break;
        n = i;
    }
    return n;
}

static bool all_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = space_at(s + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

/* Python's line boundaries (str.splitlines): the length of the one at s, 0
 * when there is none (\r\n counts as one). */
static size_t line_break_at(const char *s, size_t n)
{
    size_t len;
    uint32_t c = cp_at(s, n, &len);
    if (c == '\r') return n > 1 && s[1] == '\n' ? 2 : 1;
    if (c == '\n' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 ||
        c == 0x2029)
        return len;
    return 0;
}

static int cp_category(uint32_t c) { return (int)utf8proc_category((utf8proc_int32_t)c); }
static bool cp_isalpha(uint32_t c)
{
    int k = cp_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
static bool cp_isdigit(uint32_t c) { return cp_category(c) == UTF8PROC_CATEGORY_ND; }
static bool cp_isnumeric(uint32_t c)
{
    int k = cp_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
static bool cp_islower(uint32_t c) { return cp_category(c) == UTF8PROC_CATEGORY_LL; }
static bool cp_isupper(uint32_t c) { return cp_category(c) == UTF8PROC_CATEGORY_LU; }
static bool cp_iscased(uint32_t c)
{
    int k = cp_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
static uint32_t cp_upper(uint32_t c) { return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c); }
static uint32_t cp_lower(uint32_t c) { return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c); }
static uint32_t cp_title(uint32_t c) { return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c); }

/* What Python's str.isprintable() refuses, which repr() escapes. */
static bool cp_isprintable(uint32_t c)
{
    if (c == ' ') return true;
    switch (cp_category(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

/* ---- Python's float repr ----------------------------------------------------------------------- */

/* repr(float): the shortest digits that read back as x (the first precision
 * whose correctly rounded %e round-trips is Python's choice too), in fixed
 * notation for exponents -4..15 and with ".0" on whole numbers. buf holds
 * at least 32 bytes; returns the length. json spells nan and inf its own way. */
static size_t fmt_float(double x, char *buf, bool json)
{
    if (isnan(x)) return (size_t)sprintf(buf, "%s", json ? "NaN" : "nan");
    if (isinf(x)) return (size_t)sprintf(buf, "%s", x > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
    if (x == 0) return (size_t)sprintf(buf, "%s", signbit(x) ? "-0.0" : "0.0");
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    const char *p = tmp;
    char *o = buf;
    if (*p == '-') *o++ = *p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = atoi(p + 1) + 1; /* the decimal point sits after this many digits */
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            memcpy(o, digits, (size_t)nd), o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd), o += nd;
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt), o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt)), o += nd - decpt;
        }
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(nd - 1)), o += nd - 1;
        }
        int e = decpt - 1;
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    *o = '\0';
    return (size_t)(o - buf);
}

/* ---- tokens ---------------------------------------------------------------------------------- */

enum {
    TK_EOF,
    TK_TEXT, /* template data, whitespace control applied */
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING, /* escapes decoded */
    TK_INT,
    TK_FLOAT,
    TK_OP,
};

enum {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_GT, OP_GTEQ, OP_LT, OP_LTEQ, OP_ASSIGN,
    OP_DOT, OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON,
};

/* Longest first, as Jinja2's operator regex. */
static const struct {
    const char *s;
    uint8_t op;
} OPS[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GTEQ}, {"<=", OP_LTEQ},
    {"+", OP_ADD}, {"-", OP_SUB}, {"/", OP_DIV}, {"*", OP_MUL}, {"%", OP_MOD}, {"~", OP_TILDE},
    {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN}, {")", OP_RPAREN}, {"{", OP_LBRACE},
    {"}", OP_RBRACE}, {">", OP_GT}, {"<", OP_LT}, {"=", OP_ASSIGN}, {".", OP_DOT}, {":", OP_COLON},
    {"|", OP_PIPE}, {",", OP_COMMA}, {";", OP_SEMICOLON},
};

static const char *op_text(int op)
{
    for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++)
        if (OPS[i].op == op) return OPS[i].s;
    return "?";
}

typedef struct tok {
    uint8_t type, op;
    int line, col;
    const char *p; /* TK_TEXT, TK_NAME, TK_STRING: the text */
    size_t n;
    long long i;
    double f;
} tok;

/* ---- the lexer --------------------------------------------------------------------------------- */

/* Jinja2's lexer with trim_blocks and lstrip_blocks, rule for rule:
 *   - newlines (\r\n, \r, \n) are read as \n, and one that ends the
 *     template is dropped (keep_trailing_newline is off);
 *   - data runs to the first {{, {% or {#; a '-' after the opening strips
 *     all whitespace before the tag, a '+' keeps it, and otherwise (for {%
 *     and {# only) lstrip_blocks drops the spaces between the start of a line
 *     and the tag;
 *   - a '-' before the closing strips all whitespace after the tag; else %}
 *     and #} eat one newline after them (trim_blocks) unless written +%};
 *   - inside a tag, %} and }} close it only outside brackets, so a dict
 *     literal may end in }}.
 * "Whitespace" is Python's (str.isspace), as Jinja2's \s is. */

typedef struct lexer {
    const char *s;
    size_t n;
    size_t *lines; /* the offset where each line starts */
    size_t nlines;
    tok *t;
    size_t nt, cap;
    arena *ar;
    errbuf *err;
} lexer;

static void lex_pos(const lexer *L, size_t off, int *line, int *col)
{
    size_t lo = 0, hi = L->nlines; /* the last line starting at or before off */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (L->lines[mid] <= off) lo = mid;
        else hi = mid;
    }
    *line = (int)lo + 1;
    *col = (int)cp_count(L->s + L->lines[lo], off - L->lines[lo]) + 1;
}

static int lex_fail(lexer *L, size_t off, const char *fmt, ...)
{
    int line, col;
    lex_pos(L, off, &line, &col);
    va_list ap;
    va_start(ap, fmt);
    err_vset(L->err, line, col, fmt, ap);
    va_end(ap);
    return -1;
}

static tok *lex_push(lexer *L, int type, size_t off)
{
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *t = realloc(L->t, cap * sizeof *t);
        if (!t) return err_set(L->err, 0, 0, "out of memory"), NULL;
        L->t = t;
        L->cap = cap;
    }
    tok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    lex_pos(L, off, &t->line, &t->col);
    return t;
}

static int lex_text(lexer *L, size_t from, size_t to)
{
    if (to <= from) return 0;
    tok *t = lex_push(L, TK_TEXT, from);
    if (!t) return -1;
    t->p = L->s + from;
    t->n = to - from;
    return 0;
}

static bool starts(const lexer *L, size_t pos, const char *lit)
{
    size_t k = strlen(lit);
    return pos + k <= L->n && memcmp(L->s + pos, lit, k) == 0;
}

static size_t skip_space(const lexer *L, size_t pos)
{
    size_t k;
    while (pos < L->n && (k = space_at(L->s + pos, L->n - pos))) pos += k;
    return pos;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at i: the end of the match, or i. */
static size_t lex_digits(const lexer *L, size_t i)
{
    size_t j = i;
    if (j >= L->n || !is_digit(L->s[j])) return i;
    while (j < L->n && is_digit(L->s[j])) j++;
    while (j + 1 < L->n && L->s[j] == '_' && is_digit(L->s[j + 1])) {
        j++;
        while (j < L->n && is_digit(L->s[j])) j++;
    }
    return j;
}

/* Jinja2's float_re at pos: the length, 0 when it does not match. */
static size_t lex_float_len(const lexer *L, size_t pos)
{
    if (pos > 0 && L->s[pos - 1] == '.') return 0;
    size_t j = lex_digits(L, pos);
    if (j == pos) return 0;
    /* (\.digits)? e[+-]? digits */
    size_t k = j;
    if (k < L->n && L->s[k] == '.') {
        size_t f = lex_digits(L, k + 1);
        if (f > k + 1) k = f;
    }
    if (k < L->n && (L->s[k] == 'e' || L->s[k] == 'E')) {
        size_t e = k + 1;
        if (e < L->n && (L->s[e] == '+' || L->s[e] == '-')) e++;
        size_t d = lex_digits(L, e);
        if (d > e) return d - pos;
    }
    /* \.digits */
    if (j < L->n && L->s[j] == '.') {
        size_t f = lex_digits(L, j + 1);
        if (f > j + 1) return f - pos;
    }
    return 0;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Jinja2's integer_re at pos (binary, octal, hex, decimal, zeros): the
 * length and the value. */
static int lex_int(lexer *L, size_t pos, size_t *len, long long *val)
{
    const char *s = L->s;
    int base = 10;
    size_t j = pos;
    if (s[pos] == '0' && pos + 1 < L->n) {
        char b = s[pos + 1];
        base = b == 'b' || b == 'B' ? 2 : b == 'o' || b == 'O' ? 8 : b == 'x' || b == 'X' ? 16 : 10;
        if (base != 10) {
            /* (_?digit)+ */
            size_t k = pos + 2;
            for (;;) {
                size_t d = k < L->n && s[k] == '_' ? k + 1 : k;
                int v = d < L->n ? hex_val(s[d]) : -1;
                if (v < 0 || v >= base) break;
                k = d + 1;
            }
            if (k == pos + 2) base = 10; /* "0b" alone: a zero, then a name */
            else j = k;
        }
    }
    if (base == 10) {
        j = pos + 1;
        bool zero = s[pos] == '0';
        for (;;) {
            size_t d = j < L->n && s[j] == '_' ? j + 1 : j;
            if (d >= L->n || !is_digit(s[d]) || (zero && s[d] != '0')) break;
            j = d + 1;
        }
    }
    unsigned long long v = 0;
    for (size_t k = base == 10 ? pos : pos + 2; k < j; k++) {
        if (s[k] == '_') continue;
        unsigned d = (unsigned)hex_val(s[k]);
        if (v > (unsigned long long)(LLONG_MAX - d) / (unsigned)base)
            return lex_fail(L, pos, "integer literal %.*s is too large (integers here are 64-bit)", (int)(j - pos),
                            s + pos);
        v = v * (unsigned)base + d;
    }
    *len = j - pos;
    *val = (long long)v;
    return 0;
}

static bool name_start(uint32_t c) { return c == '_' || (c < 0x80 ? ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') : cp_isalpha(c)); }
static bool name_char(uint32_t c)
{
    if (name_start(c) || (c >= '0' && c <= '9')) return true;
    if (c < 0x80) return false;
    int k = cp_category(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_PC || k == UTF8PROC_CATEGORY_NL;
}

static void put_cp(char **o, uint32_t c)
{
    *o += mt_utf8_encode(c, *o);
}

/* A string literal at pos (its quote): decoded as Python's unicode-escape
 * codec decodes it, which is what Jinja2 does. */
static int lex_string(lexer *L, size_t pos, size_t *end)
{
    const char *s = L->s;
    char q = s[pos];
    size_t i = pos + 1;
    bool escapes = false;
    while (i < L->n && s[i] != q) {
        if (s[i] == '\\') {
            escapes = true;
            if (++i >= L->n) break;
        }
        i++;
    }
    if (i >= L->n) return lex_fail(L, pos, "unterminated string");
    *end = i + 1;
    tok *t = lex_push(L, TK_STRING, pos);
    if (!t) return -1;
    if (!escapes) {
        t->p = s + pos + 1;
        t->n = i - pos - 1;
        return 0;
    }
    /* decoding never lengthens: \x41 is 4 bytes for at most 2, \u for at most 3, \U for at most 4 */
    char *o = arena_alloc(L->ar, i - pos);
    if (!o) return err_set(L->err, 0, 0, "out of memory");
    t->p = o;
    for (size_t k = pos + 1; k < i;) {
        if (s[k] != '\\') {
            *o++ = s[k++];
            continue;
        }
        char c = s[k + 1];
        size_t at = k;
        k += 2;
        switch (c) {
        case '\\': *o++ = '\\'; break;
        case '\'': *o++ = '\''; break;
        case '"': *o++ = '"'; break;
        case 'a': *o++ = '\a'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'v': *o++ = '\v'; break;
        case '\n': break; /* a line continuation */
        case 'x': case 'u': case 'U': {
            int want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int d = 0; d < want; d++, k++) {
                int h = k < i ? hex_val(s[k]) : -1;
                if (h < 0) return lex_fail(L, at, "truncated \\%c escape in a string", c);
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF) return lex_fail(L, at, "illegal Unicode character in a string");
            if (v >= 0xD800 && v <= 0xDFFF) return lex_fail(L, at, "a surrogate code point in a string is not supported");
            put_cp(&o, v);
            break;
        }
        case 'N':
            return lex_fail(L, at, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                uint32_t v = (uint32_t)(c - '0');
                for (int d = 0; d < 2 && k < i && s[k] >= '0' && s[k] <= '7'; d++) v = v * 8 + (uint32_t)(s[k++] - '0');
                put_cp(&o, v);
            } else { /* an unknown escape stays as written */
                *o++ = '\\';
                k--;
            }
        }
    }
    t->n = (size_t)(o - t->p);
    return 0;
}

/* The tokens inside {% %} or {{ }}, from pos to the closing tag. */
static int lex_tag(lexer *L, size_t *ppos, bool block, bool *line_starting)
{
    const char *s = L->s;
    size_t pos = *ppos;
    char expect[MAX_NEST]; /* the closing brackets due */
    int depth = 0;
    for (;;) {
        pos = skip_space(L, pos);
        if (pos >= L->n) return lex_fail(L, pos, "unexpected end of template (a tag is not closed by '%s')", block ? "%}" : "}}");
        if (depth == 0) {
            size_t at = pos;
            bool end = false;
            if (block) {
                if (starts(L, pos, "+%}")) pos += 3, end = true;
                else if (starts(L, pos, "-%}")) pos = skip_space(L, pos + 3), end = true;
                else if (starts(L, pos, "%}")) {
                    pos += 2;
                    if (pos < L->n && s[pos] == '\n') pos++;
                    end = true;
                }
            } else {
                if (starts(L, pos, "-}}")) pos = skip_space(L, pos + 3), end = true;
                else if (starts(L, pos, "}}")) pos += 2, end = true;
            }
            if (end) {
                if (!lex_push(L, block ? TK_BLOCK_END : TK_VAR_END, at)) return -1;
                *line_starting = s[pos - 1] == '\n';
                *ppos = pos;
                return 0;
            }
        }
        size_t len;
        uint32_t c = cp_at(s + pos, L->n - pos, &len);
        if ((len = lex_float_len(L, pos))) {
            tok *t = lex_push(L, TK_FLOAT, pos);
            if (!t) return -1;
            char buf[128];
            size_t k = 0;
            for (size_t j = pos; j < pos + len && k < sizeof buf - 1; j++)
                if (s[j] != '_') buf[k++] = s[j];
            buf[k] = '\0';
            t->f = strtod(buf, NULL);
            pos += len;
        } else if (c < 0x80 && is_digit((char)c)) {
            long long v = 0;
            if (lex_int(L, pos, &len, &v)) return -1;
            tok *t = lex_push(L, TK_INT, pos);
            if (!t) return -1;
            t->i = v;
            pos += len;
        } else if (name_start(c)) {
            size_t j = pos + len;
            while (j < L->n) {
                size_t k;
                uint32_t d = cp_at(s + j, L->n - j, &k);
                if (!name_char(d)) break;
                j += k;
            }
            tok *t = lex_push(L, TK_NAME, pos);
            if (!t) return -1;
            t->p = s + pos;
            t->n = j - pos;
            pos = j;
        } else if (c == '\'' || c == '"') {
            if (lex_string(L, pos, &pos)) return -1;
        } else {
            size_t o = 0;
            while (o < sizeof OPS / sizeof OPS[0] && !starts(L, pos, OPS[o].s)) o++;
            if (o == sizeof OPS / sizeof OPS[0]) return lex_fail(L, pos, "unexpected character '%.*s'", (int)len, s + pos);
            int op = OPS[o].op;
            if (op == OP_LBRACE || op == OP_LPAREN || op == OP_LBRACKET) {
                if (depth == MAX_NEST) return lex_fail(L, pos, "brackets nested too deeply");
                expect[depth++] = op == OP_LBRACE ? '}' : op == OP_LPAREN ? ')' : ']';
            } else if (op == OP_RBRACE || op == OP_RPAREN || op == OP_RBRACKET) {
                if (!depth) return lex_fail(L, pos, "unexpected '%c'", s[pos]);
                if (expect[--depth] != s[pos]) return lex_fail(L, pos, "unexpected '%c', expected '%c'", s[pos], expect[depth]);
            }
            tok *t = lex_push(L, TK_OP, pos);
            if (!t) return -1;
            t->op = (uint8_t)op;
            pos += strlen(OPS[o].s);
        }
    }
}

/* {%[-+]?\s*raw\s*(-%}\s*|%}) at pos: its end (no trim_blocks after it, as
 * in Jinja2), or 0. */
static size_t raw_begin_end(const lexer *L, size_t pos)
{
    size_t p = pos + 2;
    if (p < L->n && (L->s[p] == '-' || L->s[p] == '+')) p++;
    p = skip_space(L, p);
    if (!starts(L, p, "raw")) return 0;
    p = skip_space(L, p + 3);
    if (starts(L, p, "-%}")) return skip_space(L, p + 3);
    if (starts(L, p, "%}")) return p + 2;
    return 0;
}

/* {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?) at pos: its end, or 0. */
static size_t raw_end_end(const lexer *L, size_t pos)
{
    size_t p = pos + 2;
    if (p < L->n && (L->s[p] == '-' || L->s[p] == '+')) p++;
    p = skip_space(L, p);
    if (!starts(L, p, "endraw")) return 0;
    p = skip_space(L, p + 6);
    if (starts(L, p, "+%}")) return p + 3;
    if (starts(L, p, "-%}")) return skip_space(L, p + 3);
    if (starts(L, p, "%}")) return p + 2 + (p + 2 < L->n && L->s[p + 2] == '\n');
    return 0;
}

/* The end of the data before a tag whose whitespace control is sign ('-',
 * '+' or 0); lstrip applies to {% and {# (lstrip), not to {{. */
static size_t data_end(const lexer *L, size_t from, size_t to, char sign, bool lstrip, bool line_starting)
{
    if (sign == '-') return from + rstrip_space(L->s + from, to - from);
    if (sign == '+' || !lstrip) return to;
    size_t l = to;
    while (l > from && L->s[l - 1] != '\n') l--;
    bool newline = l > from;
    if ((newline || line_starting) && l < to && all_space(L->s + l, to - l)) return l;
    return to;
}

static int lex(lexer *L)
{
    const char *s = L->s;
    size_t pos = 0;
    bool line_starting = true;
    while (pos < L->n) {
        size_t q = pos;
        for (;;) {
            const char *b = memchr(s + q, '{', L->n - q);
            if (!b) {
                q = L->n;
                break;
            }
            q = (size_t)(b - s);
            if (q + 1 < L->n && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) break;
            q++;
        }
        if (q >= L->n) {
            if (lex_text(L, pos, L->n)) return -1;
            break;
        }
        char kind = s[q + 1];
        char sign = q + 2 < L->n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t raw_at = kind == '%' ? raw_begin_end(L, q) : 0;
        if (lex_text(L, pos, data_end(L, pos, q, sign, kind != '{', line_starting))) return -1;
        if (raw_at) {
            bool ls = s[raw_at - 1] == '\n';
            size_t e = raw_at, end = 0;
            for (;; e++) {
                const char *b = memchr(s + e, '{', L->n - e);
                if (!b) return lex_fail(L, q, "missing end of raw directive");
                e = (size_t)(b - s);
                if (e + 1 < L->n && s[e + 1] == '%' && (end = raw_end_end(L, e))) break;
            }
            char esign = e + 2 < L->n && (s[e + 2] == '-' || s[e + 2] == '+') ? s[e + 2] : 0;
            if (lex_text(L, raw_at, data_end(L, raw_at, e, esign, true, ls))) return -1;
            line_starting = s[end - 1] == '\n';
            pos = end;
            continue;
        }
        if (kind == '#') {
            size_t body = q + 2 + (sign != 0), e = body;
            for (;; e++) {
                const char *h = memchr(s + e, '#', L->n - e);
                if (!h) return lex_fail(L, q, "missing end of comment tag");
                e = (size_t)(h - s);
                if (e + 1 < L->n && s[e + 1] == '}') break;
            }
            char esign = e > body && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
            pos = e + 2;
            if (esign == '-') pos = skip_space(L, pos);
            else if (!esign && pos < L->n && s[pos] == '\n') pos++;
            line_starting = s[pos - 1] == '\n';
            continue;
        }
        if (!lex_push(L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, q)) return -1;
        pos = q + 2 + (sign != 0);
        if (lex_tag(L, &pos, kind == '%', &line_starting)) return -1;
    }
    return lex_push(L, TK_EOF, L->n) ? 0 : -1;
}

/* ---- the tree ---------------------------------------------------------------------------------- */

enum {
    /* statements */
    N_TEXT,        /* s */
    N_OUTPUT,      /* kids: the expressions printed ({{ }}, print) */
    N_IF,          /* a: test, kids: body, kids2: else (an elif is an N_IF there) */
    N_FOR,         /* a: target, b: iterable, c: filter or NULL, kids: body, kids2: else */
    N_SET,         /* a: target, b: value */
    N_SETBLOCK,    /* a: target, c: filters on N_BLOCKVAL or NULL, kids: body */
    N_MACRO,       /* s: name, kids: N_PARAMs, kids2: body */
    N_GENERATION,  /* kids: body */
    N_BREAK,
    N_CONTINUE,
    N_WITH,        /* kids: N_PARAMs (a: target, b: value), kids2: body */
    N_FILTERBLOCK, /* c: filters on N_BLOCKVAL, kids: body */
    /* expressions */
    N_CONST,    /* op: C_*, i, f, s */
    N_NAME,     /* s */
    N_LIST,     /* kids */
    N_TUPLE,    /* kids */
    N_DICT,     /* kids: keys, kids2: values */
    N_GETATTR,  /* a.s; op 1: a namespace reference being assigned */
    N_GETITEM,  /* a[b] */
    N_SLICE,    /* a[b:c:d], each of b, c, d NULL when left out */
    N_CALL,     /* a(kids), keyword arguments as N_KW */
    N_KW,       /* s=a */
    N_FILTER,   /* a|s(kids), id: F_* */
    N_TEST,     /* a is [not] s(kids), id: T_*, op: negated */
    N_NOT,      /* not a */
    N_NEG,      /* -a */
    N_POS,      /* +a */
    N_BIN,      /* a op b, op: OP_ADD .. OP_TILDE */
    N_AND,      /* a and b */
    N_OR,       /* a or b */
    N_CMP,      /* a, then kids[i] compared by ops[i] (chained) */
    N_COND,     /* b if a else c (c NULL: undefined) */
    N_BLOCKVAL, /* the rendered body of a filter block or a block set */
    N_PARAM,    /* a macro's parameter: s, a: default or NULL; with's: a = b */
};

enum { C_NONE, C_TRUE, C_FALSE, C_INT, C_FLOAT, C_STR };
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct node node;
struct node {
    uint8_t kind, op;
    int line, col;
    int id;
    node *a, *b, *c, *d;
    node **kids, **kids2;
    size_t nkids, nkids2;
    uint8_t *ops;
    const char *s;
    size_t slen;
    long long i;
    double f;
};

struct mt_jinja {
    arena ar; /* the nodes, the normalized text they point into, decoded strings */
    node **body;
    size_t nbody;
    int generation; /* it has {% generation %} blocks */
};

/* ---- filters and tests, resolved by name when parsing ----------------------------------------------- */

enum {
    F_ABS, F_ATTR, F_CAPITALIZE, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT, F_INDENT, F_INT, F_ITEMS,
    F_JOIN, F_KEYS, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE,
    F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM,
    F_UNIQUE, F_UPPER, F_VALUES,
};

typedef struct named {
    const char *name;
    int id;
} named;

static const named FILTERS[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"capitalize", F_CAPITALIZE}, {"count", F_LENGTH}, {"d", F_DEFAULT},
    {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", F_ESCAPE}, {"escape", F_ESCAPE}, {"first", F_FIRST},
    {"float", F_FLOAT}, {"indent", F_INDENT}, {"int", F_INT}, {"items", F_ITEMS}, {"join", F_JOIN},
    {"keys", F_KEYS}, {"last", F_LAST}, {"length", F_LENGTH}, {"list", F_LIST}, {"lower", F_LOWER},
    {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN}, {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR},
    {"replace", F_REPLACE}, {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", F_SAFE}, {"select", F_SELECT},
    {"selectattr", F_SELECTATTR}, {"sort", F_SORT}, {"string", F_STRING}, {"sum", F_SUM}, {"title", F_TITLE},
    {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"unique", F_UNIQUE}, {"upper", F_UPPER}, {"values", F_VALUES},
};

enum {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_EVEN, T_FALSE, T_FLOAT, T_GE, T_GT, T_IN, T_INTEGER,
    T_ITERABLE, T_LE, T_LOWER, T_LT, T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS, T_SEQUENCE, T_STRING,
    T_TRUE, T_UNDEFINED, T_UPPER,
};

static const named TESTS[] = {
    {"boolean", T_BOOLEAN}, {"callable", T_CALLABLE}, {"defined", T_DEFINED}, {"divisibleby", T_DIVISIBLEBY},
    {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ}, {"even", T_EVEN}, {"false", T_FALSE}, {"float", T_FLOAT},
    {"ge", T_GE}, {">=", T_GE}, {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT}, {"in", T_IN},
    {"integer", T_INTEGER}, {"iterable", T_ITERABLE}, {"le", T_LE}, {"<=", T_LE}, {"lower", T_LOWER},
    {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"mapping", T_MAPPING}, {"ne", T_NE}, {"!=", T_NE},
    {"none", T_NONE}, {"number", T_NUMBER}, {"odd", T_ODD}, {"sameas", T_SAMEAS}, {"sequence", T_SEQUENCE},
    {"string", T_STRING}, {"true", T_TRUE}, {"undefined", T_UNDEFINED}, {"upper", T_UPPER},
};

static bool same(const char *s, size_t n, const char *lit) { return strlen(lit) == n && memcmp(s, lit, n) == 0; }

static int lookup(const named *table, size_t count, const char *s, size_t n)
{
    for (size_t i = 0; i < count; i++)
        if (same(s, n, table[i].name)) return table[i].id;
    return -1;
}

#define FILTER_ID(s, n) lookup(FILTERS, sizeof FILTERS / sizeof FILTERS[0], s, n)
#define TEST_ID(s, n) lookup(TESTS, sizeof TESTS / sizeof TESTS[0], s, n)

/* ---- the parser: Jinja2's grammar, by recursive descent ------------------------------------------------ */

typedef struct parser {
    tok *t;
    size_t pos;
    arena *ar;
    errbuf *err;
    int nest;                /* recursion depth */
    int loops;               /* for loops around the statement (break, continue) */
    int captures;            /* macros, set blocks and filter blocks around it */
    const node *macro;       /* the macro being parsed */
    const char *const *ends; /* the end tags the innermost block waits for */
    int generation;          /* a {% generation %} block was parsed */
} parser;

typedef struct nlist {
    node **v;
    size_t n, cap;
} nlist;

static tok *cur(parser *P) { return &P->t[P->pos]; }
static tok *peek(parser *P, size_t k)
{
    size_t i = P->pos;
    while (k-- && P->t[i].type != TK_EOF) i++;
    return &P->t[i];
}
static bool is_op(const tok *t, int op) { return t->type == TK_OP && t->op == op; }
static bool is_name(const tok *t, const char *name) { return t->type == TK_NAME && same(t->p, t->n, name); }

static const char *tok_desc(const tok *t, char *buf, size_t len)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_NAME: snprintf(buf, len, "'%.*s'", (int)(t->n < 64 ? t->n : 64), t->p); return buf;
    case TK_STRING: return "a string";
    case TK_INT: return "an integer";
    case TK_FLOAT: return "a float";
    default: snprintf(buf, len, "'%s'", op_text(t->op)); return buf;
    }
}

static void *pfail(parser *P, const tok *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(P->err, t->line, t->col, fmt, ap);
    va_end(ap);
    return NULL;
}

static void *unexpected(parser *P, const tok *t, const char *wanted)
{
    char buf[96];
    if (wanted) return pfail(P, t, "expected %s, got %s", wanted, tok_desc(t, buf, sizeof buf));
    return pfail(P, t, "unexpected %s", tok_desc(t, buf, sizeof buf));
}

static node *mk(parser *P, int kind, const tok *at)
{
    node *n = arena_alloc(P->ar, sizeof *n);
    if (!n) return err_set(P->err, 0, 0, "out of memory"), NULL;
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static int nl_add(parser *P, nlist *l, node *x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        node **v = arena_grow(P->ar, l->v, l->cap * sizeof *v, cap * sizeof *v);
        if (!v) return err_set(P->err, 0, 0, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

static bool expect_op(parser *P, int op)
{
    if (is_op(cur(P), op)) return P->pos++, true;
    char want[16];
    snprintf(want, sizeof want, "'%s'", op_text(op));
    unexpected(P, cur(P), want);
    return false;
}

static bool expect_end(parser *P, int type)
{
    if (cur(P)->type == type) return P->pos++, true;
    unexpected(P, cur(P), type == TK_BLOCK_END ? "end of statement '%}'" : "end of print statement '}}'");
    return false;
}

static bool enter(parser *P)
{
    if (++P->nest <= MAX_NEST) return true;
    pfail(P, cur(P), "the template nests too deeply");
    return false;
}

static node *parse_expression(parser *P, bool condexpr);
static node *parse_primary(parser *P, bool with_ns);
static node *parse_postfix(parser *P, node *n);
static node *parse_filter(parser *P, node *n, bool start_inline);
static int parse_body(parser *P, const char *const *ends, const tok *opener, nlist *out);

static bool in_list(const tok *t, const char *const *names)
{
    if (t->type != TK_NAME || !names) return false;
    for (; *names; names++)
        if (same(t->p, t->n, *names)) return true;
    return false;
}

/* Comma-separated expressions: one, or a tuple. simplified: primaries only
 * (assignment targets); extra_end: names that end the list (for's "in"). */
static node *parse_tuple(parser *P, bool simplified, bool condexpr, const char *const *extra_end, bool explicit_parens,
                         bool with_ns)
{
    tok *start = cur(P);
    nlist args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && !expect_op(P, OP_COMMA)) return NULL;
        tok *t = cur(P);
        if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || is_op(t, OP_RPAREN) || in_list(t, extra_end)) break;
        node *e = simplified ? parse_primary(P, with_ns) : parse_expression(P, condexpr);
        if (!e || nl_add(P, &args, e)) return NULL;
        if (!is_op(cur(P), OP_COMMA)) break;
        is_tuple = true;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) return unexpected(P, cur(P), "an expression");
    }
    node *n = mk(P, N_TUPLE, start);
    if (!n) return NULL;
    n->kids = args.v;
    n->nkids = args.n;
    return n;
}

static node *parse_call_args(parser *P, node *n)
{
    if (!expect_op(P, OP_LPAREN)) return NULL;
    nlist args = {0};
    bool kw = false;
    while (!is_op(cur(P), OP_RPAREN)) {
        if (args.n) {
            if (!expect_op(P, OP_COMMA)) return NULL;
            if (is_op(cur(P), OP_RPAREN)) break;
        }
        tok *t = cur(P);
        if (is_op(t, OP_MUL) || is_op(t, OP_POW))
            return pfail(P, t, "argument unpacking ('*' and '**') is not supported");
        node *a;
        if (t->type == TK_NAME && is_op(peek(P, 1), OP_ASSIGN)) {
            P->pos += 2;
            a = mk(P, N_KW, t);
            if (!a || !(a->a = parse_expression(P, true))) return NULL;
            a->s = t->p;
            a->slen = t->n;
            kw = true;
        } else {
            if (kw) return pfail(P, t, "a positional argument follows keyword arguments");
            if (!(a = parse_expression(P, true))) return NULL;
        }
        if (nl_add(P, &args, a)) return NULL;
    }
    if (!expect_op(P, OP_RPAREN)) return NULL;
    n->kids = args.v;
    n->nkids = args.n;
    return n;
}

static node *parse_call(parser *P, node *callee)
{
    if (callee->kind == N_NAME) {
        static const char *const unsupported[] = {"lipsum", "cycler", "joiner", NULL};
        for (const char *const *u = unsupported; *u; u++)
            if (same(callee->s, callee->slen, *u)) {
                err_set(P->err, callee->line, callee->col, "function '%s' is not supported", *u);
                return NULL;
            }
    }
    node *n = mk(P, N_CALL, cur(P));
    if (!n) return NULL;
    if (callee->kind == N_NAME || callee->kind == N_GETATTR) n->line = callee->line, n->col = callee->col;
    n->a = callee;
    return parse_call_args(P, n);
}

/* [a:b:c] or [a]: one subscript. */
static node *parse_subscribed(parser *P, node *obj, const tok *open)
{
    node *start = NULL;
    if (!is_op(cur(P), OP_COLON)) {
        node *e = parse_expression(P, true);
        if (!e) return NULL;
        if (!is_op(cur(P), OP_COLON)) {
            node *n = mk(P, N_GETITEM, open);
            if (!n) return NULL;
            n->a = obj;
            n->b = e;
            return n;
        }
        start = e;
    }
    P->pos++; /* the first ':' */
    node *n = mk(P, N_SLICE, open);
    if (!n) return NULL;
    n->a = obj;
    n->b = start;
    tok *t = cur(P);
    if (!is_op(t, OP_COLON) && !is_op(t, OP_RBRACKET) && !is_op(t, OP_COMMA) && !(n->c = parse_expression(P, true)))
        return NULL;
    if (is_op(cur(P), OP_COLON)) {
        P->pos++;
        t = cur(P);
        if (!is_op(t, OP_RBRACKET) && !is_op(t, OP_COMMA) && !(n->d = parse_expression(P, true))) return NULL;
    }
    return n;
}

static node *parse_subscript(parser *P, node *obj)
{
    tok *t = cur(P);
    P->pos++;
    if (t->type == TK_OP && t->op == OP_DOT) {
        tok *a = cur(P);
        P->pos++;
        if (a->type == TK_NAME) {
            node *n = mk(P, N_GETATTR, a);
            if (!n) return NULL;
            n->a = obj;
            n->s = a->p;
            n->slen = a->n;
            return n;
        }
        if (a->type != TK_INT) return unexpected(P, a, "a name or a number");
        node *k = mk(P, N_CONST, a), *n = mk(P, N_GETITEM, a);
        if (!k || !n) return NULL;
        k->op = C_INT;
        k->i = a->i;
        n->a = obj;
        n->b = k;
        return n;
    }
    /* '[' */
    node *n = parse_subscribed(P, obj, t);
    if (!n) return NULL;
    if (is_op(cur(P), OP_COMMA)) {
        if (n->kind == N_SLICE) return pfail(P, cur(P), "a tuple of slices is not supported");
        /* x[a, b]: the item whose key is the tuple (a, b) */
        nlist items = {0};
        if (nl_add(P, &items, n->b)) return NULL;
        while (is_op(cur(P), OP_COMMA)) {
            P->pos++;
            if (is_op(cur(P), OP_RBRACKET)) break;
            node *e = parse_expression(P, true);
            if (!e || nl_add(P, &items, e)) return NULL;
        }
        node *tup = mk(P, N_TUPLE, t);
        if (!tup) return NULL;
        tup->kids = items.v;
        tup->nkids = items.n;
        n->b = tup;
    }
    return expect_op(P, OP_RBRACKET) ? n : NULL;
}

static node *parse_postfix(parser *P, node *n)
{
    while (n) {
        tok *t = cur(P);
        if (is_op(t, OP_DOT) || is_op(t, OP_LBRACKET)) n = parse_subscript(P, n);
        else if (is_op(t, OP_LPAREN)) n = parse_call(P, n);
        else break;
    }
    return n;
}

static node *parse_test(parser *P, node *operand)
{
    P->pos++; /* is */
    bool negated = false;
    if (is_name(cur(P), "not")) P->pos++, negated = true;
    tok *name = cur(P);
    if (name->type != TK_NAME) return unexpected(P, name, "the name of a test");
    P->pos++;
    if (is_op(cur(P), OP_DOT)) return pfail(P, name, "dotted test names are not supported");
    int id = TEST_ID(name->p, name->n);
    if (id < 0) return pfail(P, name, "test '%.*s' is not supported", (int)name->n, name->p);
    node *n = mk(P, N_TEST, name);
    if (!n) return NULL;
    n->a = operand;
    n->s = name->p;
    n->slen = name->n;
    n->id = id;
    n->op = negated;
    tok *t = cur(P);
    if (is_op(t, OP_LPAREN)) return parse_call_args(P, n);
    /* one argument without parentheses: x is divisibleby 3, x is sameas none */
    bool arg = t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT ||
               is_op(t, OP_LBRACKET) || is_op(t, OP_LBRACE);
    if (arg && (is_name(t, "else") || is_name(t, "or") || is_name(t, "and"))) arg = false;
    if (arg) {
        if (is_name(t, "is")) return pfail(P, t, "tests cannot be chained with 'is'");
        node *a = parse_postfix(P, parse_primary(P, false));
        if (!a) return NULL;
        n->kids = arena_alloc(P->ar, sizeof *n->kids);
        if (!n->kids) return err_set(P->err, 0, 0, "out of memory"), NULL;
        n->kids[0] = a;
        n->nkids = 1;
    }
    return n;
}

static node *parse_filter(parser *P, node *n, bool start_inline)
{
    while (n && (is_op(cur(P), OP_PIPE) || start_inline)) {
        if (!start_inline) P->pos++;
        start_inline = false;
        tok *name = cur(P);
        if (name->type != TK_NAME) return unexpected(P, name, "the name of a filter");
        P->pos++;
        if (is_op(cur(P), OP_DOT)) return pfail(P, name, "dotted filter names are not supported");
        int id = FILTER_ID(name->p, name->n);
        if (id < 0) return pfail(P, name, "filter '%.*s' is not supported", (int)name->n, name->p);
        node *f = mk(P, N_FILTER, name);
        if (!f) return NULL;
        f->a = n;
        f->s = name->p;
        f->slen = name->n;
        f->id = id;
        if (is_op(cur(P), OP_LPAREN) && !parse_call_args(P, f)) return NULL;
        n = f;
    }
    return n;
}

static node *parse_filter_expr(parser *P, node *n)
{
    while (n) {
        tok *t = cur(P);
        if (is_op(t, OP_PIPE)) n = parse_filter(P, n, false);
        else if (is_name(t, "is")) n = parse_test(P, n);
        else if (is_op(t, OP_LPAREN)) n = parse_call(P, n);
        else break;
    }
    return n;
}

static node *parse_list_or_dict(parser *P, bool dict)
{
    tok *open = cur(P);
    P->pos++;
    int close = dict ? OP_RBRACE : OP_RBRACKET;
    node *n = mk(P, dict ? N_DICT : N_LIST, open);
    if (!n) return NULL;
    nlist keys = {0}, values = {0};
    while (!is_op(cur(P), close)) {
        if (keys.n && !expect_op(P, OP_COMMA)) return NULL;
        if (is_op(cur(P), close)) break;
        node *k = parse_expression(P, true);
        if (!k || nl_add(P, &keys, k)) return NULL;
        if (dict) {
            node *v;
            if (!expect_op(P, OP_COLON) || !(v = parse_expression(P, true)) || nl_add(P, &values, v)) return NULL;
        }
    }
    P->pos++;
    n->kids = keys.v;
    n->nkids = keys.n;
    n->kids2 = values.v;
    n->nkids2 = values.n;
    return n;
}

/* The names a macro may not use: Jinja2 fills them in from the call. */
static bool macro_special(const parser *P, const char *s, size_t n)
{
    if (!P->macro || !(same(s, n, "caller") || same(s, n, "varargs") || same(s, n, "kwargs"))) return false;
    for (size_t i = 0; i < P->macro->nkids; i++)
        if (P->macro->kids[i]->slen == n && !memcmp(P->macro->kids[i]->s, s, n)) return false;
    return true;
}

static node *parse_primary(parser *P, bool with_ns)
{
    tok *t = cur(P);
    node *n;
    switch (t->type) {
    case TK_NAME:
        P->pos++;
        if (!(n = mk(P, N_CONST, t))) return NULL;
        if (is_name(t, "true") || is_name(t, "True")) return n->op = C_TRUE, n;
        if (is_name(t, "false") || is_name(t, "False")) return n->op = C_FALSE, n;
        if (is_name(t, "none") || is_name(t, "None")) return n->op = C_NONE, n;
        if (macro_special(P, t->p, t->n))
            return pfail(P, t, "'%.*s' in a macro is not supported", (int)t->n, t->p);
        n->kind = N_NAME;
        n->s = t->p;
        n->slen = t->n;
        if (with_ns && is_op(cur(P), OP_DOT)) {
            P->pos++;
            tok *a = cur(P);
            if (a->type != TK_NAME) return unexpected(P, a, "a name");
            P->pos++;
            node *ref = mk(P, N_GETATTR, t);
            if (!ref) return NULL;
            ref->a = n;
            ref->s = a->p;
            ref->slen = a->n;
            ref->op = 1;
            return ref;
        }
        return n;
    case TK_STRING: {
        /* adjacent strings are one: "a" "b" */
        size_t total = 0, k = P->pos;
        for (; P->t[k].type == TK_STRING; k++) total += P->t[k].n;
        if (!(n = mk(P, N_CONST, t))) return NULL;
        n->op = C_STR;
        if (k == P->pos + 1) {
            n->s = t->p;
            n->slen = t->n;
        } else {
            char *s = arena_alloc(P->ar, total);
            if (!s) return err_set(P->err, 0, 0, "out of memory"), NULL;
            size_t o = 0;
            for (size_t j = P->pos; j < k; j++) memcpy(s + o, P->t[j].p, P->t[j].n), o += P->t[j].n;
            n->s = s;
            n->slen = total;
        }
        P->pos = k;
        return n;
    }
    case TK_INT:
    case TK_FLOAT:
        P->pos++;
        if (!(n = mk(P, N_CONST, t))) return NULL;
        n->op = t->type == TK_INT ? C_INT : C_FLOAT;
        n->i = t->i;
        n->f = t->f;
        return n;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            P->pos++;
            if (!enter(P)) return NULL;
            n = parse_tuple(P, false, true, NULL, true, false);
            P->nest--;
            return n && expect_op(P, OP_RPAREN) ? n : NULL;
        }
        if (t->op == OP_LBRACKET || t->op == OP_LBRACE) {
            if (!enter(P)) return NULL;
            n = parse_list_or_dict(P, t->op == OP_LBRACE);
            P->nest--;
            return n;
        }
        /* fall through */
    default:
        return unexpected(P, t, NULL);
    }
}

static node *parse_unary(parser *P, bool with_filter)
{
    if (!enter(P)) return NULL;
    tok *t = cur(P);
    node *n;
    if (is_op(t, OP_SUB) || is_op(t, OP_ADD)) {
        P->pos++;
        if (!(n = mk(P, t->op == OP_SUB ? N_NEG : N_POS, t)) || !(n->a = parse_unary(P, false))) return NULL;
    } else {
        n = parse_primary(P, false);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->nest--;
    return n;
}

static node *binary(parser *P, int kind, int op, const tok *at, node *a, node *b)
{
    if (!a || !b) return NULL;
    node *n = mk(P, kind, at);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

/* Jinja2's precedence, loosest first: if-else, or, and, not, comparisons,
 * + -, ~, * / // %, ** (left-associative, as Jinja2 has it), unary - +,
 * then filters and tests, then . [] (). */
static node *parse_pow(parser *P)
{
    node *n = parse_unary(P, true);
    while (n && is_op(cur(P), OP_POW)) {
        tok *t = cur(P);
        P->pos++;
        n = binary(P, N_BIN, OP_POW, t, n, parse_unary(P, true));
    }
    return n;
}

static node *parse_math2(parser *P)
{
    node *n = parse_pow(P);
    for (tok *t; n && (t = cur(P))->type == TK_OP &&
                 (t->op == OP_MUL || t->op == OP_DIV || t->op == OP_FLOORDIV || t->op == OP_MOD);) {
        P->pos++;
        n = binary(P, N_BIN, t->op, t, n, parse_pow(P));
    }
    return n;
}

static node *parse_concat(parser *P)
{
    node *n = parse_math2(P);
    for (tok *t; n && is_op(t = cur(P), OP_TILDE);) {
        P->pos++;
        n = binary(P, N_BIN, OP_TILDE, t, n, parse_math2(P));
    }
    return n;
}

static node *parse_math1(parser *P)
{
    node *n = parse_concat(P);
    for (tok *t; n && (is_op(t = cur(P), OP_ADD) || is_op(t, OP_SUB));) {
        P->pos++;
        n = binary(P, N_BIN, t->op, t, n, parse_concat(P));
    }
    return n;
}

static node *parse_compare(parser *P)
{
    node *first = parse_math1(P);
    if (!first) return NULL;
    nlist rhs = {0};
    uint8_t ops[64];
    node *n = NULL;
    for (;;) {
        tok *t = cur(P);
        int op = -1;
        if (t->type == TK_OP) {
            switch (t->op) {
            case OP_EQ: op = CMP_EQ; break;
            case OP_NE: op = CMP_NE; break;
            case OP_LT: op = CMP_LT; break;
            case OP_LTEQ: op = CMP_LE; break;
            case OP_GT: op = CMP_GT; break;
            case OP_GTEQ: op = CMP_GE; break;
            }
            if (op >= 0) P->pos++;
        } else if (is_name(t, "in")) {
            op = CMP_IN;
            P->pos++;
        } else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = CMP_NOTIN;
            P->pos += 2;
        }
        if (op < 0) break;
        if (rhs.n == sizeof ops) return pfail(P, t, "too many chained comparisons");
        if (!n && !(n = mk(P, N_CMP, t))) return NULL;
        node *r = parse_math1(P);
        if (!r || nl_add(P, &rhs, r)) return NULL;
        ops[rhs.n - 1] = (uint8_t)op;
    }
    if (!n) return first;
    n->a = first;
    n->kids = rhs.v;
    n->nkids = rhs.n;
    if (!(n->ops = arena_alloc(P->ar, rhs.n))) return err_set(P->err, 0, 0, "out of memory"), NULL;
    memcpy(n->ops, ops, rhs.n);
    return n;
}

static node *parse_not(parser *P)
{
    tok *t = cur(P);
    if (!is_name(t, "not")) return parse_compare(P);
    P->pos++;
    if (!enter(P)) return NULL;
    node *n = mk(P, N_NOT, t);
    if (n && !(n->a = parse_not(P))) n = NULL;
    P->nest--;
    return n;
}

static node *parse_and(parser *P)
{
    node *n = parse_not(P);
    for (tok *t; n && is_name(t = cur(P), "and");) {
        P->pos++;
        n = binary(P, N_AND, 0, t, n, parse_not(P));
    }
    return n;
}

static node *parse_or(parser *P)
{
    node *n = parse_and(P);
    for (tok *t; n && is_name(t = cur(P), "or");) {
        P->pos++;
        n = binary(P, N_OR, 0, t, n, parse_and(P));
    }
    return n;
}

static node *parse_expression(parser *P, bool condexpr)
{
    if (!enter(P)) return NULL;
    node *n = parse_or(P);
    while (condexpr && n && is_name(cur(P), "if")) {
        tok *t = cur(P);
        P->pos++;
        node *c = mk(P, N_COND, t);
        if (!c || !(c->a = parse_or(P))) return NULL;
        c->b = n;
        if (is_name(cur(P), "else")) {
            P->pos++;
            if (!(c->c = parse_expression(P, true))) return NULL;
        }
        n = c;
    }
    P->nest--;
    return n;
}

/* ---- statements ------------------------------------------------------------------------------ */

static bool assignable(const node *n, bool with_ns)
{
    if (n->kind == N_NAME) return true;
    if (n->kind == N_GETATTR) return with_ns && n->op == 1;
    if (n->kind != N_TUPLE) return false;
    for (size_t i = 0; i < n->nkids; i++)
        if (!assignable(n->kids[i], false)) return false;
    return true;
}

static node *parse_target(parser *P, const char *const *extra_end, bool with_ns)
{
    tok *t = cur(P);
    node *n = parse_tuple(P, true, false, extra_end, false, with_ns);
    if (n && !assignable(n, with_ns)) return pfail(P, t, "cannot assign to this expression");
    return n;
}

static node *body_node(parser *P, int kind, const tok *at, const char *const *ends, nlist *body)
{
    node *n = mk(P, kind, at);
    if (!n || !expect_end(P, TK_BLOCK_END) || parse_body(P, ends, at, body)) return NULL;
    return n;
}

/* After parse_body: the end tag's name is current; consumes it and the %}. */
static bool end_tag(parser *P)
{
    P->pos++;
    return expect_end(P, TK_BLOCK_END);
}

static node *parse_if(parser *P, tok *at)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    node *root = mk(P, N_IF, at), *n = root;
    if (!root) return NULL;
    for (;;) {
        nlist body = {0};
        if (!(n->a = parse_tuple(P, false, false, NULL, false, false))) return NULL;
        if (!expect_end(P, TK_BLOCK_END) || parse_body(P, ends, at, &body)) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
        tok *t = cur(P);
        P->pos++;
        if (is_name(t, "elif")) {
            node *e = mk(P, N_IF, t);
            if (!e || !(n->kids2 = arena_alloc(P->ar, sizeof *n->kids2))) return err_set(P->err, 0, 0, "out of memory"), NULL;
            n->kids2[0] = e;
            n->nkids2 = 1;
            n = e;
            continue;
        }
        if (is_name(t, "else")) {
            nlist alt = {0};
            if (!expect_end(P, TK_BLOCK_END) || parse_body(P, endif, at, &alt) || !end_tag(P)) return NULL;
            n->kids2 = alt.v;
            n->nkids2 = alt.n;
            return root;
        }
        return expect_end(P, TK_BLOCK_END) ? root : NULL; /* endif */
    }
}

static node *parse_for(parser *P, tok *at)
{
    static const char *const in[] = {"in", NULL}, *const recursive[] = {"recursive", NULL};
    static const char *const ends[] = {"endfor", "else", NULL}, *const endfor[] = {"endfor", NULL};
    node *n = mk(P, N_FOR, at);
    if (!n || !(n->a = parse_target(P, in, false))) return NULL;
    if (!is_name(cur(P), "in")) return unexpected(P, cur(P), "'in'");
    P->pos++;
    if (!(n->b = parse_tuple(P, false, false, recursive, false, false))) return NULL;
    if (is_name(cur(P), "if")) {
        P->pos++;
        if (!(n->c = parse_expression(P, true))) return NULL;
    }
    if (is_name(cur(P), "recursive")) return pfail(P, cur(P), "recursive loops are not supported");
    nlist body = {0}, alt = {0};
    P->loops++;
    if (!expect_end(P, TK_BLOCK_END) || parse_body(P, ends, at, &body)) return NULL;
    P->loops--;
    if (is_name(cur(P), "else")) {
        P->pos++;
        if (!expect_end(P, TK_BLOCK_END) || parse_body(P, endfor, at, &alt)) return NULL;
    }
    if (!end_tag(P)) return NULL;
    n->kids = body.v;
    n->nkids = body.n;
    n->kids2 = alt.v;
    n->nkids2 = alt.n;
    return n;
}

static node *parse_set(parser *P, tok *at)
{
    static const char *const endset[] = {"endset", NULL};
    node *target = parse_target(P, NULL, true);
    if (!target) return NULL;
    if (is_op(cur(P), OP_ASSIGN)) {
        P->pos++;
        node *n = mk(P, N_SET, at);
        if (!n || !(n->b = parse_tuple(P, false, true, NULL, false, false)) || !expect_end(P, TK_BLOCK_END)) return NULL;
        n->a = target;
        return n;
    }
    node *n = mk(P, N_SETBLOCK, at);
    if (!n) return NULL;
    n->a = target;
    if (is_op(cur(P), OP_PIPE)) {
        node *v = mk(P, N_BLOCKVAL, at);
        if (!v || !(n->c = parse_filter(P, v, false))) return NULL;
    }
    nlist body = {0};
    P->captures++;
    if (!expect_end(P, TK_BLOCK_END) || parse_body(P, endset, at, &body) || !end_tag(P)) return NULL;
    P->captures--;
    n->kids = body.v;
    n->nkids = body.n;
    return n;
}

static node *parse_macro(parser *P, tok *at)
{
    static const char *const endmacro[] = {"endmacro", NULL};
    tok *name = cur(P);
    if (name->type != TK_NAME) return unexpected(P, name, "the macro's name");
    P->pos++;
    node *n = mk(P, N_MACRO, at);
    if (!n || !expect_op(P, OP_LPAREN)) return NULL;
    n->s = name->p;
    n->slen = name->n;
    nlist params = {0};
    while (!is_op(cur(P), OP_RPAREN)) {
        if (params.n && !expect_op(P, OP_COMMA)) return NULL;
        tok *p = cur(P);
        if (p->type != TK_NAME) return unexpected(P, p, "a parameter name");
        P->pos++;
        node *param = mk(P, N_PARAM, p);
        if (!param) return NULL;
        param->s = p->p;
        param->slen = p->n;
        if (is_op(cur(P), OP_ASSIGN)) {
            P->pos++;
            if (!(param->a = parse_expression(P, true))) return NULL;
        } else if (params.n && params.v[params.n - 1]->a) {
            return pfail(P, p, "a parameter without a default follows one with a default");
        }
        if (nl_add(P, &params, param)) return NULL;
    }
    P->pos++;
    n->kids = params.v;
    n->nkids = params.n;
    const node *outer = P->macro;
    int loops = P->loops;
    P->macro = n;
    P->loops = 0;
    P->captures++;
    nlist body = {0};
    if (!expect_end(P, TK_BLOCK_END) || parse_body(P, endmacro, at, &body) || !end_tag(P)) return NULL;
    P->captures--;
    P->loops = loops;
    P->macro = outer;
    n->kids2 = body.v;
    n->nkids2 = body.n;
    return n;
}

static node *parse_with(parser *P, tok *at)
{
    static const char *const endwith[] = {"endwith", NULL};
    node *n = mk(P, N_WITH, at);
    if (!n) return NULL;
    nlist pairs = {0}, body = {0};
    while (cur(P)->type != TK_BLOCK_END) {
        if (pairs.n && !expect_op(P, OP_COMMA)) return NULL;
        node *p = mk(P, N_PARAM, cur(P));
        if (!p || !(p->a = parse_target(P, NULL, false)) || !expect_op(P, OP_ASSIGN) ||
            !(p->b = parse_expression(P, true)) || nl_add(P, &pairs, p))
            return NULL;
    }
    if (!expect_end(P, TK_BLOCK_END) || parse_body(P, endwith, at, &body) || !end_tag(P)) return NULL;
    n->kids = pairs.v;
    n->nkids = pairs.n;
    n->kids2 = body.v;
    n->nkids2 = body.n;
    return n;
}

static node *parse_statement(parser *P)
{
    tok *at = cur(P); /* the tag's name */
    if (at->type != TK_NAME) return unexpected(P, at, "a tag name");
    P->pos++;
    if (is_name(at, "if")) return parse_if(P, at);
    if (is_name(at, "for")) return parse_for(P, at);
    if (is_name(at, "set")) return parse_set(P, at);
    if (is_name(at, "macro")) return parse_macro(P, at);
    if (is_name(at, "with")) return parse_with(P, at);
    if (is_name(at, "break") || is_name(at, "continue")) {
        if (!P->loops) return pfail(P, at, "'%.*s' outside a loop", (int)at->n, at->p);
        node *n = mk(P, is_name(at, "break") ? N_BREAK : N_CONTINUE, at);
        return n && expect_end(P, TK_BLOCK_END) ? n : NULL;
    }
    if (is_name(at, "print")) {
        node *n = mk(P, N_OUTPUT, at);
        nlist exprs = {0};
        while (n && cur(P)->type != TK_BLOCK_END) {
            node *e;
            if ((exprs.n && !expect_op(P, OP_COMMA)) || !(e = parse_expression(P, true)) || nl_add(P, &exprs, e))
                return NULL;
        }
        if (!n) return NULL;
        n->kids = exprs.v;
        n->nkids = exprs.n;
        P->pos++;
        return n;
    }
    if (is_name(at, "filter")) {
        static const char *const endfilter[] = {"endfilter", NULL};
        node *n = mk(P, N_FILTERBLOCK, at), *v = mk(P, N_BLOCKVAL, at);
        if (!n || !v || !(n->c = parse_filter(P, v, true))) return NULL;
        nlist body = {0};
        P->captures++;
        if (!expect_end(P, TK_BLOCK_END) || parse_body(P, endfilter, at, &body) || !end_tag(P)) return NULL;
        P->captures--;
        n->kids = body.v;
        n->nkids = body.n;
        return n;
    }
    if (is_name(at, "generation")) {
        static const char *const endgeneration[] = {"endgeneration", NULL};
        /* Its byte range is known only when it writes to the output itself. */
        if (P->captures)
            return pfail(P, at, "a 'generation' block inside a macro, a set block or a filter block is not supported");
        int loops = P->loops;
        P->loops = 0;
        nlist body = {0};
        node *n = body_node(P, N_GENERATION, at, endgeneration, &body);
        if (!n || !end_tag(P)) return NULL;
        P->loops = loops;
        P->generation = 1;
        n->kids = body.v;
        n->nkids = body.n;
        return n;
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "call", "autoescape",
                                              "do", "trans", "pluralize", NULL};
    if (in_list(at, unsupported)) return pfail(P, at, "tag '%.*s' is not supported", (int)at->n, at->p);
    if (P->ends && P->ends[0]) {
        char want[128] = "";
        for (const char *const *e = P->ends; *e; e++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", e == P->ends ? "" : e[1] ? ", " : " or ", *e);
        return pfail(P, at, "unexpected tag '%.*s' (expected %s)", (int)at->n, at->p, want);
    }
    if ((at->n > 3 && !memcmp(at->p, "end", 3)) || is_name(at, "else") || is_name(at, "elif"))
        return pfail(P, at, "unexpected tag '%.*s'", (int)at->n, at->p);
    return pfail(P, at, "unknown tag '%.*s'", (int)at->n, at->p);
}

/* Statements and data up to one of the end tags (whose name is then the
 * current token), or to the end of the template when ends is NULL. */
static int parse_body(parser *P, const char *const *ends, const tok *opener, nlist *out)
{
    const char *const *outer = P->ends;
    if (!enter(P)) return -1;
    P->ends = ends;
    for (;;) {
        tok *t = cur(P);
        node *n = NULL;
        if (t->type == TK_EOF) {
            if (!ends) break;
            const char *close = ends[0];
            for (const char *const *e = ends; *e; e++)
                if (!strncmp(*e, "end", 3)) close = *e;
            pfail(P, t, "unexpected end of template: the '%.*s' tag at line %d, column %d is not closed (expected '%s')",
                  (int)opener->n, opener->p, opener->line, opener->col, close);
            return -1;
        }
        if (t->type == TK_TEXT) {
            if (!(n = mk(P, N_TEXT, t))) return -1;
            n->s = t->p;
            n->slen = t->n;
            P->pos++;
        } else if (t->type == TK_VAR_BEGIN) {
            P->pos++;
            node *e = parse_tuple(P, false, true, NULL, false, false);
            if (!e || !expect_end(P, TK_VAR_END) || !(n = mk(P, N_OUTPUT, t))) return -1;
            if (!(n->kids = arena_alloc(P->ar, sizeof *n->kids))) return err_set(P->err, 0, 0, "out of memory");
            n->kids[0] = e;
            n->nkids = 1;
        } else if (t->type == TK_BLOCK_BEGIN) {
            if (ends && in_list(peek(P, 1), ends)) {
                P->pos++;
                break;
            }
            P->pos++;
            if (!(n = parse_statement(P))) return -1;
        } else {
            unexpected(P, t, NULL);
            return -1;
        }
        if (nl_add(P, out, n)) return -1;
    }
    P->ends = outer;
    P->nest--;
    return 0;
}

/* ---- values ------------------------------------------------------------------------------------ */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC, V_METHOD, V_LOOP };

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jmethod jmethod;
typedef struct jloop jloop;

typedef struct jv {
    uint8_t k;
    union {
        bool b;
        long long i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s; /* V_STR; V_UNDEF: the name it was looked up by (p NULL when none), for messages */
        jlist *l;
        jdict *d; /* V_DICT, V_NS */
        jmacro *m;
        int fn; /* V_FUNC: G_* */
        jmethod *bm;
        jloop *loop;
    } u;
} jv;

/* A list, a tuple, or an iterator: Jinja2's select, reject, map, unique,
 * items and reverse filters return Python iterators, which are true even
 * when empty, have no length or index and are used up by what goes through
 * them; lazy lists keep those traits, so that a template does here what it
 * does in transformers (the items are computed at once, not on demand). */
enum { EAGER, LAZY_GENERATOR, LAZY_REVERSE };

struct jlist {
    jv *v;
    size_t n, cap;
    bool tuple;
    uint8_t lazy; /* EAGER or the kind of iterator */
    size_t pos;   /* an iterator's next item */
};

struct jdict { /* insertion-ordered; a linear search is what a chat message's few keys need */
    jv *k, *v;
    size_t n, cap;
};

typedef struct scope scope;

struct jmacro {
    const node *def;
    scope *closure; /* the scope it was defined in: what its body sees besides its arguments */
};

struct jmethod {
    jv self;
    const char *name;
    size_t len;
};

struct jloop {
    size_t index0;
    const jlist *items;
};

/* The global functions. */
enum { G_RANGE, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME };
static const named GLOBALS[] = {
    {"range", G_RANGE}, {"dict", G_DICT}, {"namespace", G_NAMESPACE}, {"raise_exception", G_RAISE},
    {"strftime_now", G_STRFTIME},
};

typedef struct var {
    const char *name;
    size_t len;
    jv v;
} var;

struct scope {
    scope *parent;
    var *vars;
    size_t n, cap;
};

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool heap; /* the result: malloc'd and handed to the caller, not in the arena */
} sbuf;

typedef struct rctx {
    arena ar;
    errbuf err;
    sbuf *out;       /* the output, or a macro's or a block's while it renders */
    size_t *spans;   /* generation blocks: start, end pairs */
    size_t nspans, capspans;
    long long now;
    int calls;       /* macro calls under way */
    jv blockval;     /* what N_BLOCKVAL reads */
} rctx;

static jv v_undef(const char *name, size_t n)
{
    jv v = {.k = V_UNDEF};
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}
static jv v_none(void) { return (jv){.k = V_NONE}; }
static jv v_bool(bool b) { return (jv){.k = V_BOOL, .u.b = b}; }
static jv v_int(long long i) { return (jv){.k = V_INT, .u.i = i}; }
static jv v_float(double f) { return (jv){.k = V_FLOAT, .u.f = f}; }
static jv v_str(const char *p, size_t n)
{
    jv v = {.k = V_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
#define V_LIT(lit) v_str(lit, sizeof lit - 1)

static int oom(rctx *r) { return err_set(&r->err, 0, 0, "out of memory"); }

static int rfail(rctx *r, const node *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(&r->err, at ? at->line : 0, at ? at->col : 0, fmt, ap);
    va_end(ap);
    return -1;
}

/* An error about an undefined value: Jinja2's UndefinedError. */
static int undefined_fail(rctx *r, const node *at, const jv *v)
{
    if (v->u.s.p) return rfail(r, at, "'%.*s' is undefined", (int)v->u.s.n, v->u.s.p);
    return rfail(r, at, "the value is undefined");
}

static void *ralloc(rctx *r, size_t n)
{
    void *p = arena_alloc(&r->ar, n);
    if (!p) oom(r);
    return p;
}

static jlist *new_list(rctx *r, size_t cap, bool tuple)
{
    jlist *l = ralloc(r, sizeof *l);
    if (!l) return NULL;
    l->n = 0;
    l->cap = cap;
    l->tuple = tuple;
    l->lazy = EAGER;
    l->pos = 0;
    l->v = NULL;
    if (cap && !(l->v = ralloc(r, cap * sizeof *l->v))) return NULL;
    return l;
}

static int list_add(rctx *r, jlist *l, jv x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *v = arena_grow(&r->ar, l->v, l->cap * sizeof *v, cap * sizeof *v);
        if (!v) return oom(r);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

static jv v_list(jlist *l)
{
    jv v = {.k = V_LIST};
    v.u.l = l;
    return v;
}

static jdict *new_dict(rctx *r)
{
    jdict *d = ralloc(r, sizeof *d);
    if (d) memset(d, 0, sizeof *d);
    return d;
}

static jv v_dict(jdict *d, int kind)
{
    jv v = {.k = (uint8_t)kind};
    v.u.d = d;
    return v;
}

/* ---- output buffers ------------------------------------------------------------------------------ */

static int sb_put(rctx *r, sbuf *b, const char *s, size_t n)
{
    if (n > MAX_VALUE - b->n) return err_set(&r->err, 0, 0, "the output would exceed 1 GiB");
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        if (cap > MAX_VALUE) cap = MAX_VALUE;
        char *p = b->heap ? realloc(b->p, cap + 1) : arena_grow(&r->ar, b->p, b->cap, cap);
        if (!p) return oom(r);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int sb_lit(rctx *r, sbuf *b, const char *s) { return sb_put(r, b, s, strlen(s)); }
static int sb_cp(rctx *r, sbuf *b, uint32_t c)
{
    char u[4];
    return sb_put(r, b, u, mt_utf8_encode(c, u));
}

static jv sb_value(const sbuf *b) { return v_str(b->p ? b->p : "", b->n); }

/* ---- what Python makes of values: type names, truth, str(), repr() ---------------------------------------- */

static const char *type_name(const jv *v)
{
    switch (v->k) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST:
        return v->u.l->lazy ? (v->u.l->lazy == LAZY_REVERSE ? "list_reverseiterator" : "generator")
                            : v->u.l->tuple ? "tuple" : "list";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_MACRO: return "Macro";
    case V_LOOP: return "LoopContext";
    default: return "builtin_function_or_method";
    }
}

static bool truthy(const jv *v)
{
    switch (v->k) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0;
    case V_STR: return v->u.s.n != 0;
    case V_LIST: return v->u.l->lazy || v->u.l->n != 0;
    case V_DICT: return v->u.d->n != 0;
    default: return true;
    }
}

static bool is_num(const jv *v) { return v->k == V_INT || v->k == V_FLOAT || v->k == V_BOOL; }
static double num_f(const jv *v)
{
    return v->k == V_FLOAT ? v->u.f : v->k == V_INT ? (double)v->u.i : v->k == V_BOOL ? v->u.b : 0;
}
static long long num_i(const jv *v) { return v->k == V_INT ? v->u.i : v->k == V_BOOL ? v->u.b : 0; } /* int or bool */

/* repr() of a string: Python's choice of quotes and escapes. */
static int put_repr_str(rctx *r, sbuf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (sb_put(r, b, &q, 1)) return -1;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t c = cp_at(s + i, n - i, &len);
        char esc[16];
        const char *e = NULL;
        if (c == '\\') e = "\\\\";
        else if (c == (uint32_t)q) e = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (!cp_isprintable(c)) {
            snprintf(esc, sizeof esc, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)c);
            e = esc;
        }
        if (e ? sb_lit(r, b, e) : sb_put(r, b, s + i, len)) return -1;
        i += len;
    }
    return sb_put(r, b, &q, 1);
}

/* str(v), or repr(v) (what lists and dicts print their items as). */
static int put_value(rctx *r, sbuf *b, const jv *v, bool repr, int depth)
{
    char num[40];
    if (depth > MAX_DEPTH) return err_set(&r->err, 0, 0, "a value nests too deeply to print (is a namespace inside itself?)");
    switch (v->k) {
    case V_UNDEF: return repr ? sb_lit(r, b, "Undefined") : 0;
    case V_NONE: return sb_lit(r, b, "None");
    case V_BOOL: return sb_lit(r, b, v->u.b ? "True" : "False");
    case V_INT: return sb_put(r, b, num, (size_t)snprintf(num, sizeof num, "%lld", v->u.i));
    case V_FLOAT: return sb_put(r, b, num, fmt_float(v->u.f, num, false));
    case V_STR: return repr ? put_repr_str(r, b, v->u.s.p, v->u.s.n) : sb_put(r, b, v->u.s.p, v->u.s.n);
    case V_LIST: {
        const jlist *l = v->u.l;
        if (l->lazy) return sb_lit(r, b, "<") || sb_lit(r, b, type_name(v)) || sb_lit(r, b, " object>");
        if (sb_lit(r, b, l->tuple ? "(" : "[")) return -1;
        for (size_t i = 0; i < l->n; i++)
            if ((i && sb_lit(r, b, ", ")) || put_value(r, b, &l->v[i], true, depth + 1)) return -1;
        return sb_lit(r, b, l->tuple ? (l->n == 1 ? ",)" : ")") : "]");
    }
    case V_DICT:
    case V_NS: {
        const jdict *d = v->u.d;
        if (sb_lit(r, b, v->k == V_NS ? "<Namespace {" : "{")) return -1;
        for (size_t i = 0; i < d->n; i++)
            if ((i && sb_lit(r, b, ", ")) || put_value(r, b, &d->k[i], true, depth + 1) || sb_lit(r, b, ": ") ||
                put_value(r, b, &d->v[i], true, depth + 1))
                return -1;
        return sb_lit(r, b, v->k == V_NS ? "}>" : "}");
    }
    case V_MACRO:
        return sb_lit(r, b, "<Macro '") || sb_put(r, b, v->u.m->def->s, v->u.m->def->slen) || sb_lit(r, b, "'>");
    case V_FUNC:
        return sb_lit(r, b, "<built-in function ") || sb_lit(r, b, GLOBALS[v->u.fn].name) || sb_lit(r, b, ">");
    case V_METHOD:
        return sb_lit(r, b, "<built-in method ") || sb_put(r, b, v->u.bm->name, v->u.bm->len) ||
               sb_lit(r, b, " of ") || sb_lit(r, b, type_name(&v->u.bm->self)) || sb_lit(r, b, " object>");
    case V_LOOP:
        return sb_put(r, b, num, (size_t)snprintf(num, sizeof num, "<LoopContext %zu/%zu>", v->u.loop->index0 + 1,
                                                  v->u.loop->items->n));
    }
    return 0;
}

/* str(v) as a value: strings as they are, others printed into the arena. */
static int to_str(rctx *r, const jv *v, jv *out)
{
    if (v->k == V_STR) return *out = *v, 0;
    sbuf b = {0};
    if (put_value(r, &b, v, false, 0)) return -1;
    *out = sb_value(&b);
    return 0;
}

/* ---- equality and order, as Python has them -------------------------------------------------------- */

static bool py_eq(const jv *a, const jv *b, int depth)
{
    if (depth > MAX_DEPTH) return false;
    if (is_num(a) && is_num(b)) {
        if (a->k == V_FLOAT || b->k == V_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->k != b->k) return false;
    switch (a->k) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case V_LIST: {
        const jlist *x = a->u.l, *y = b->u.l;
        if (x->lazy || y->lazy) return x == y;
        if (x->tuple != y->tuple || x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++)
            if (!py_eq(&x->v[i], &y->v[i], depth + 1)) return false;
        return true;
    }
    case V_DICT: {
        const jdict *x = a->u.d, *y = b->u.d;
        if (x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++) {
            size_t j = 0;
            while (j < y->n && !py_eq(&x->k[i], &y->k[j], depth + 1)) j++;
            if (j == y->n || !py_eq(&x->v[i], &y->v[j], depth + 1)) return false;
        }
        return true;
    }
    case V_NS: return a->u.d == b->u.d;
    case V_MACRO: return a->u.m == b->u.m;
    case V_FUNC: return a->u.fn == b->u.fn;
    case V_METHOD: return a->u.bm == b->u.bm;
    case V_LOOP: return a->u.loop == b->u.loop;
    }
    return false;
}

/* a < b: numbers, strings (code point order, which is UTF-8's byte order),
 * lists and tuples (item by item); anything else is Python's TypeError. */
static int py_lt(rctx *r, const node *at, const char *op, const jv *a, const jv *b, bool *lt, int depth)
{
    if (depth > MAX_DEPTH) return rfail(r, at, "values nest too deeply to compare");
    if (is_num(a) && is_num(b)) {
        if (a->k == V_FLOAT || b->k == V_FLOAT) *lt = num_f(a) < num_f(b);
        else *lt = num_i(a) < num_i(b);
        return 0;
    }
    if (a->k == V_UNDEF) return undefined_fail(r, at, a);
    if (b->k == V_UNDEF) return undefined_fail(r, at, b);
    if (a->k == V_STR && b->k == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        *lt = c < 0 || (c == 0 && a->u.s.n < b->u.s.n);
        return 0;
    }
    if (a->k == V_LIST && b->k == V_LIST && a->u.l->tuple == b->u.l->tuple && !a->u.l->lazy && !b->u.l->lazy) {
        const jlist *x = a->u.l, *y = b->u.l;
        for (size_t i = 0; i < x->n && i < y->n; i++)
            if (!py_eq(&x->v[i], &y->v[i], depth + 1)) return py_lt(r, at, op, &x->v[i], &y->v[i], lt, depth + 1);
        *lt = x->n < y->n;
        return 0;
    }
    return rfail(r, at, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a), type_name(b));
}

static bool hashable(const jv *v)
{
    if (v->k == V_LIST && v->u.l->lazy) return true; /* by identity */
    if (v->k == V_LIST) {
        if (!v->u.l->tuple) return false;
        for (size_t i = 0; i < v->u.l->n; i++)
            if (!hashable(&v->u.l->v[i])) return false;
        return true;
    }
    return v->k != V_DICT;
}

/* The index of key k in d, or -1 (a Python dict's lookup: 1, 1.0 and True are one key). */
static long dict_find(const jdict *d, const jv *k)
{
    for (size_t i = 0; i < d->n; i++)
        if (py_eq(&d->k[i], k, 0)) return (long)i;
    return -1;
}

static long dict_find_str(const jdict *d, const char *s, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].k == V_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, s, n)) return (long)i;
    return -1;
}

/* Sets d[k] = v: a new key goes last, an old one keeps its place. */
static int dict_set(rctx *r, jdict *d, jv k, jv v)
{
    long i = dict_find(d, &k);
    if (i >= 0) return d->v[i] = v, 0;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *nk = arena_grow(&r->ar, d->k, d->cap * sizeof *nk, cap * sizeof *nk);
        jv *nv = nk ? arena_grow(&r->ar, d->v, d->cap * sizeof *nv, cap * sizeof *nv) : NULL;
        if (!nv) return oom(r);
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 0;
}

/* ---- JSON: transformers' tojson, which is json.dumps ----------------------------------------------- */

typedef struct jsonopt {
    bool ensure_ascii, sort_keys;
    const char *indent; /* NULL: all on one line */
    size_t indent_len;
    jv item_sep, key_sep;
} jsonopt;

static int put_json_str(rctx *r, sbuf *b, const char *s, size_t n, bool ascii)
{
    if (sb_lit(r, b, "\"")) return -1;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t c = cp_at(s + i, n - i, &len);
        char esc[16];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20 || (ascii && c >= 0x80 && c < 0x10000)) {
                snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c);
                e = esc;
            } else if (ascii && c >= 0x10000) {
                uint32_t v = c - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (unsigned)(v >> 10), 0xDC00 + (unsigned)(v & 0x3FF));
                e = esc;
            }
        }
        if (e ? sb_lit(r, b, e) : sb_put(r, b, s + i, len)) return -1;
        i += len;
    }
    return sb_lit(r, b, "\"");
}

static int json_newline(rctx *r, sbuf *b, const jsonopt *o, int level)
{
    if (sb_lit(r, b, "\n")) return -1;
    for (int i = 0; i < level; i++)
        if (sb_put(r, b, o->indent, o->indent_len)) return -1;
    return 0;
}

/* json.dumps turns a dict's keys into strings: these are the ones it takes. */
static int json_key(rctx *r, const node *at, const jv *k, sbuf *b, const jsonopt *o)
{
    char num[40];
    switch (k->k) {
    case V_STR: return put_json_str(r, b, k->u.s.p, k->u.s.n, o->ensure_ascii);
    case V_INT: snprintf(num, sizeof num, "%lld", k->u.i); break;
    case V_FLOAT: fmt_float(k->u.f, num, true); break;
    case V_BOOL: snprintf(num, sizeof num, "%s", k->u.b ? "true" : "false"); break;
    case V_NONE: snprintf(num, sizeof num, "null"); break;
    default: return rfail(r, at, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
    }
    return put_json_str(r, b, num, strlen(num), false);
}

static int put_json(rctx *r, const node *at, sbuf *b, const jv *v, const jsonopt *o, int level)
{
    char num[40];
    if (level > MAX_DEPTH) return rfail(r, at, "tojson: circular reference detected");
    switch (v->k) {
    case V_NONE: return sb_lit(r, b, "null");
    case V_BOOL: return sb_lit(r, b, v->u.b ? "true" : "false");
    case V_INT: return sb_put(r, b, num, (size_t)snprintf(num, sizeof num, "%lld", v->u.i));
    case V_FLOAT: return sb_put(r, b, num, fmt_float(v->u.f, num, true));
    case V_STR: return put_json_str(r, b, v->u.s.p, v->u.s.n, o->ensure_ascii);
    case V_LIST: {
        const jlist *l = v->u.l;
        if (l->lazy) return rfail(r, at, "tojson: object of type %s is not JSON serializable", type_name(v));
        if (!l->n) return sb_lit(r, b, "[]");
        if (sb_lit(r, b, "[") || (o->indent && json_newline(r, b, o, level + 1))) return -1;
        for (size_t i = 0; i < l->n; i++) {
            if (i && (sb_put(r, b, o->item_sep.u.s.p, o->item_sep.u.s.n) || (o->indent && json_newline(r, b, o, level + 1))))
                return -1;
            if (put_json(r, at, b, &l->v[i], o, level + 1)) return -1;
        }
        return (o->indent && json_newline(r, b, o, level)) || sb_lit(r, b, "]");
    }
    case V_DICT: {
        const jdict *d = v->u.d;
        if (!d->n) return sb_lit(r, b, "{}");
        size_t *order = ralloc(r, d->n * sizeof *order);
        if (!order) return -1;
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) { /* insertion sort, stable: dicts are small */
            for (size_t i = 1; i < d->n; i++) {
                for (size_t j = i; j > 0; j--) {
                    bool lt;
                    const jv *x = &d->k[order[j]], *y = &d->k[order[j - 1]];
                    if (!((x->k == V_STR && y->k == V_STR) || (is_num(x) && is_num(y))))
                        return rfail(r, at, "tojson: sort_keys cannot order keys of types '%s' and '%s'", type_name(x),
                                     type_name(y));
                    if (py_lt(r, at, "<", x, y, &lt, 0)) return -1;
                    if (!lt) break;
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
            }
        }
        if (sb_lit(r, b, "{") || (o->indent && json_newline(r, b, o, level + 1))) return -1;
        for (size_t i = 0; i < d->n; i++) {
            if (i && (sb_put(r, b, o->item_sep.u.s.p, o->item_sep.u.s.n) || (o->indent && json_newline(r, b, o, level + 1))))
                return -1;
            if (json_key(r, at, &d->k[order[i]], b, o) || sb_put(r, b, o->key_sep.u.s.p, o->key_sep.u.s.n) ||
                put_json(r, at, b, &d->v[order[i]], o, level + 1))
                return -1;
        }
        return (o->indent && json_newline(r, b, o, level)) || sb_lit(r, b, "}");
    }
    default:
        return rfail(r, at, "tojson: object of type %s is not JSON serializable", type_name(v));
    }
}

/* ---- the context: cJSON in, values out --------------------------------------------------------------- */

static int from_json(rctx *r, const cJSON *j, jv *out, int depth)
{
    if (depth > 1000) return err_set(&r->err, 0, 0, "the context nests too deeply");
    if (cJSON_IsNull(j)) *out = v_none();
    else if (cJSON_IsBool(j)) *out = v_bool(cJSON_IsTrue(j));
    else if (cJSON_IsNumber(j)) {
        /* JSON does not say 1 from 1.0 once parsed: a whole number is an integer, as JavaScript reads it */
        double x = j->valuedouble;
        if (isfinite(x) && x == floor(x) && fabs(x) < 9.2e18) *out = v_int((long long)x);
        else *out = v_float(x);
    } else if (cJSON_IsString(j)) {
        size_t n = strlen(j->valuestring);
        if (mt_utf8_check(j->valuestring, n) != n) return err_set(&r->err, 0, 0, "a string of the context is not UTF-8");
        *out = v_str(j->valuestring, n);
    } else if (cJSON_IsArray(j)) {
        jlist *l = new_list(r, (size_t)cJSON_GetArraySize(j), false);
        if (!l) return -1;
        for (const cJSON *c = j->child; c; c = c->next) {
            jv x;
            if (from_json(r, c, &x, depth + 1) || list_add(r, l, x)) return -1;
        }
        *out = v_list(l);
    } else if (cJSON_IsObject(j)) {
        jdict *d = new_dict(r);
        if (!d) return -1;
        for (const cJSON *c = j->child; c; c = c->next) {
            jv x;
            if (!c->string) return err_set(&r->err, 0, 0, "the context has a member without a name");
            size_t n = strlen(c->string);
            if (mt_utf8_check(c->string, n) != n) return err_set(&r->err, 0, 0, "a key of the context is not UTF-8");
            if (from_json(r, c, &x, depth + 1) || dict_set(r, d, v_str(c->string, n), x)) return -1;
        }
        *out = v_dict(d, V_DICT);
    } else {
        return err_set(&r->err, 0, 0, "the context holds a value that is not JSON");
    }
    return 0;
}

/* ---- scopes ---------------------------------------------------------------------------------------- */

/* A scope per template, macro call, loop iteration and with block, as
 * Jinja2 has them: a set inside a loop is gone at the next iteration, one
 * inside an if is not. */
static scope *new_scope(rctx *r, scope *parent)
{
    scope *s = ralloc(r, sizeof *s);
    if (s) memset(s, 0, sizeof *s), s->parent = parent;
    return s;
}

static jv *scope_find(scope *s, const char *name, size_t n)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (s->vars[i].len == n && !memcmp(s->vars[i].name, name, n)) return &s->vars[i].v;
    return NULL;
}

static int scope_set(rctx *r, scope *s, const char *name, size_t n, jv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->vars[i].len == n && !memcmp(s->vars[i].name, name, n)) return s->vars[i].v = v, 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        var *vars = arena_grow(&r->ar, s->vars, s->cap * sizeof *vars, cap * sizeof *vars);
        if (!vars) return oom(r);
        s->vars = vars;
        s->cap = cap;
    }
    s->vars[s->n++] = (var){name, n, v};
    return 0;
}

/* ---- arguments ----------------------------------------------------------------------------------- */

typedef struct args {
    jv *pos;
    size_t npos;
    const node **kw; /* N_KW nodes: their names */
    jv *kwv;
    size_t nkw;
} args;

static int eval(rctx *r, scope *sc, const node *e, jv *out);

static int eval_args(rctx *r, scope *sc, node *const *kids, size_t n, args *a)
{
    memset(a, 0, sizeof *a);
    if (!n) return 0;
    if (!(a->pos = ralloc(r, n * sizeof *a->pos)) || !(a->kwv = ralloc(r, n * sizeof *a->kwv)) ||
        !(a->kw = ralloc(r, n * sizeof *a->kw)))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (kids[i]->kind == N_KW) {
            a->kw[a->nkw] = kids[i];
            if (eval(r, sc, kids[i]->a, &a->kwv[a->nkw++])) return -1;
        } else if (eval(r, sc, kids[i], &a->pos[a->npos++])) {
            return -1;
        }
    }
    return 0;
}

/* Binds arguments to the parameters names[] (NULL-terminated) as Python
 * does: positional ones in order, then keywords by name. */
static int bind(rctx *r, const node *at, const char *what, const args *a, const char *const *names, jv *slot,
                bool *have)
{
    size_t nn = 0;
    while (names[nn]) have[nn++] = false;
    if (a->npos > nn) return rfail(r, at, "%s takes at most %zu argument%s (%zu given)", what, nn, nn == 1 ? "" : "s", a->npos);
    for (size_t i = 0; i < a->npos; i++) slot[i] = a->pos[i], have[i] = true;
    for (size_t k = 0; k < a->nkw; k++) {
        const node *kw = a->kw[k];
        size_t i = 0;
        while (i < nn && !same(kw->s, kw->slen, names[i])) i++;
        if (i == nn) return rfail(r, at, "%s got an unexpected keyword argument '%.*s'", what, (int)kw->slen, kw->s);
        if (have[i]) return rfail(r, at, "%s got multiple values for argument '%s'", what, names[i]);
        slot[i] = a->kwv[k];
        have[i] = true;
    }
    return 0;
}

static int no_kwargs(rctx *r, const node *at, const char *what, const args *a)
{
    if (!a->nkw) return 0;
    return rfail(r, at, "%s takes no keyword arguments", what);
}

/* ---- strings by code point -------------------------------------------------------------------------- */

typedef struct cps {
    const char *s;
    size_t n, count;
    size_t *off; /* where each code point starts (and n at [count]); NULL for ASCII */
} cps;

static int cps_init(rctx *r, cps *c, const char *s, size_t n)
{
    c->s = s;
    c->n = n;
    c->off = NULL;
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) return c->count = n, 0;
    c->count = cp_count(s, n);
    if (!(c->off = ralloc(r, (c->count + 1) * sizeof *c->off))) return -1;
    size_t k = 0;
    for (i = 0; i < n;) {
        size_t len;
        cp_at(s + i, n - i, &len);
        c->off[k++] = i;
        i += len;
    }
    c->off[k] = n;
    return 0;
}

static size_t cps_at(const cps *c, size_t i) { return c->off ? c->off[i] : i; }

/* CPython's PySlice_AdjustIndices: clamps start and stop, returns the length. */
static long long slice_adjust(long long len, long long *start, long long *stop, long long step)
{
    if (*start < 0) {
        *start += len;
        if (*start < 0) *start = step < 0 ? -1 : 0;
    } else if (*start >= len) {
        *start = step < 0 ? len - 1 : len;
    }
    if (*stop < 0) {
        *stop += len;
        if (*stop < 0) *stop = step < 0 ? -1 : 0;
    } else if (*stop >= len) {
        *stop = step < 0 ? len - 1 : len;
    }
    if (step < 0) return *stop < *start ? (*start - *stop - 1) / (-step) + 1 : 0;
    return *start < *stop ? (*stop - *start - 1) / step + 1 : 0;
}

/* ---- attributes and items ------------------------------------------------------------------------ */

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
    "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
    "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
    "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill", NULL};
static const char *const DICT_METHODS[] = {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem",
                                           "setdefault", "update", "values", NULL};
static const char *const LIST_METHODS[] = {"append", "clear", "copy", "count", "extend", "index", "insert", "pop",
                                           "remove", "reverse", "sort", NULL};
static const char *const TUPLE_METHODS[] = {"count", "index", NULL};
static const char *const LOOP_METHODS[] = {"cycle", "changed", NULL};

static bool in_names(const char *const *names, const char *s, size_t n)
{
    for (; *names; names++)
        if (same(s, n, *names)) return true;
    return false;
}

static int bound_method(rctx *r, const jv *self, const char *name, size_t n, jv *out)
{
    jmethod *m = ralloc(r, sizeof *m);
    if (!m) return -1;
    m->self = *self;
    m->name = name;
    m->len = n;
    out->k = V_METHOD;
    out->u.bm = m;
    return 0;
}

/* obj.name: Jinja2's sandboxed getattr, an attribute (a method) first, then
 * an item; for a dict, .items is the method even if a key says otherwise. */
static int get_attr(rctx *r, const jv *obj, const char *name, size_t n, jv *out)
{
    if (obj->k == V_UNDEF) return *out = *obj, 0; /* keeps the name that was undefined */
    *out = v_undef(name, n);
    if (n && name[0] == '_') return 0; /* the sandbox hides private attributes */
    switch (obj->k) {
    case V_DICT: {
        if (in_names(DICT_METHODS, name, n)) return bound_method(r, obj, name, n, out);
        long i = dict_find_str(obj->u.d, name, n);
        if (i >= 0) *out = obj->u.d->v[i];
        return 0;
    }
    case V_NS: {
        long i = dict_find_str(obj->u.d, name, n);
        if (i >= 0) *out = obj->u.d->v[i];
        return 0;
    }
    case V_STR:
        return in_names(STR_METHODS, name, n) ? bound_method(r, obj, name, n, out) : 0;
    case V_LIST:
        if (obj->u.l->lazy) return 0;
        return in_names(obj->u.l->tuple ? TUPLE_METHODS : LIST_METHODS, name, n) ? bound_method(r, obj, name, n, out) : 0;
    case V_LOOP: {
        const jloop *L = obj->u.loop;
        size_t i = L->index0, len = L->items->n;
        if (in_names(LOOP_METHODS, name, n)) return bound_method(r, obj, name, n, out);
        if (same(name, n, "index")) *out = v_int((long long)i + 1);
        else if (same(name, n, "index0")) *out = v_int((long long)i);
        else if (same(name, n, "revindex")) *out = v_int((long long)(len - i));
        else if (same(name, n, "revindex0")) *out = v_int((long long)(len - i - 1));
        else if (same(name, n, "first")) *out = v_bool(i == 0);
        else if (same(name, n, "last")) *out = v_bool(i + 1 == len);
        else if (same(name, n, "length")) *out = v_int((long long)len);
        else if (same(name, n, "previtem")) { if (i > 0) *out = L->items->v[i - 1]; }
        else if (same(name, n, "nextitem")) { if (i + 1 < len) *out = L->items->v[i + 1]; }
        else if (same(name, n, "depth")) *out = v_int(1);
        else if (same(name, n, "depth0")) *out = v_int(0);
        return 0;
    }
    default:
        return 0;
    }
}

/* obj[key]: Jinja2's getitem, an item first, then (for a string key) an
 * attribute; anything Python would raise TypeError or LookupError for is
 * undefined. */
static int get_item(rctx *r, const jv *obj, const jv *key, jv *out)
{
    if (obj->k == V_UNDEF) return *out = *obj, 0;
    bool skey = key->k == V_STR;
    *out = skey ? v_undef(key->u.s.p, key->u.s.n) : v_undef(NULL, 0);
    switch (obj->k) {
    case V_DICT:
    case V_NS: {
        long i = hashable(key) ? dict_find(obj->u.d, key) : -1;
        if (i >= 0) return *out = obj->u.d->v[i], 0;
        break;
    }
    case V_LIST:
    case V_STR:
        if (obj->k == V_LIST && obj->u.l->lazy) break; /* an iterator has no items by index */
        if (key->k == V_INT || key->k == V_BOOL) {
            long long i = num_i(key);
            if (obj->k == V_LIST) {
                long long len = (long long)obj->u.l->n;
                if (i < 0) i += len;
                if (i >= 0 && i < len) *out = obj->u.l->v[i];
                return 0;
            }
            cps c;
            if (cps_init(r, &c, obj->u.s.p, obj->u.s.n)) return -1;
            long long len = (long long)c.count;
            if (i < 0) i += len;
            if (i >= 0 && i < len) *out = v_str(c.s + cps_at(&c, (size_t)i), cps_at(&c, (size_t)i + 1) - cps_at(&c, (size_t)i));
            return 0;
        }
        break;
    default:
        break;
    }
    if (skey && obj->k != V_NS) return get_attr(r, obj, key->u.s.p, key->u.s.n, out);
    return 0;
}

static bool slice_index(const jv *v, long long *i, bool *given)
{
    *given = false;
    if (v->k == V_NONE) return true;
    if (v->k != V_INT && v->k != V_BOOL) return false;
    *i = num_i(v);
    *given = true;
    return true;
}

static int eval_slice(rctx *r, scope *sc, const node *e, jv *out)
{
    jv obj, b = v_none(), c = v_none(), d = v_none();
    if (eval(r, sc, e->a, &obj) || (e->b && eval(r, sc, e->b, &b)) || (e->c && eval(r, sc, e->c, &c)) ||
        (e->d && eval(r, sc, e->d, &d)))
        return -1;
    long long start = 0, stop = 0, step = 1;
    bool has_start, has_stop, has_step;
    if (obj.k == V_UNDEF) return *out = obj, 0;
    /* Jinja2 slices with Python's own subscript (no getitem fallback): what
     * cannot be sliced is an error */
    if (obj.k == V_DICT) return rfail(r, e, "unhashable type: 'slice'");
    if (obj.k != V_STR && (obj.k != V_LIST || obj.u.l->lazy))
        return rfail(r, e, "'%s' object is not subscriptable", type_name(&obj));
    if (!slice_index(&b, &start, &has_start) || !slice_index(&c, &stop, &has_stop) || !slice_index(&d, &step, &has_step))
        return rfail(r, e, "slice indices must be integers or None or have an __index__ method");
    if (!has_step) step = 1;
    if (step == 0) return rfail(r, e, "slice step cannot be zero");
    if (!has_start) start = step < 0 ? LLONG_MAX : 0;
    if (!has_stop) stop = step < 0 ? LLONG_MIN : LLONG_MAX;
    if (obj.k == V_LIST) {
        const jlist *l = obj.u.l;
        long long k = slice_adjust((long long)l->n, &start, &stop, step);
        jlist *nl = new_list(r, (size_t)k, l->tuple);
        if (!nl) return -1;
        for (long long i = 0, j = start; i < k; i++, j += step) nl->v[nl->n++] = l->v[j];
        *out = v_list(nl);
    } else if (obj.k == V_STR) {
        cps cs;
        if (cps_init(r, &cs, obj.u.s.p, obj.u.s.n)) return -1;
        long long k = slice_adjust((long long)cs.count, &start, &stop, step);
        if (step == 1) {
            size_t from = cps_at(&cs, (size_t)start), to = k ? cps_at(&cs, (size_t)(start + k)) : from;
            return *out = v_str(cs.s + from, to - from), 0;
        }
        sbuf sb = {0};
        for (long long i = 0, j = start; i < k; i++, j += step)
            if (sb_put(r, &sb, cs.s + cps_at(&cs, (size_t)j), cps_at(&cs, (size_t)j + 1) - cps_at(&cs, (size_t)j)))
                return -1;
        *out = sb_value(&sb);
    }
    return 0;
}

/* ---- operators ------------------------------------------------------------------------------------- */

static int int_overflow(rctx *r, const node *at)
{
    return rfail(r, at, "integer overflow (integers here are 64-bit)");
}

/* Python's float divmod: the floor quotient and the remainder with the divisor's sign. */
static void float_divmod(double x, double y, double *div, double *mod)
{
    double m = fmod(x, y), d = (x - m) / y;
    if (m != 0) {
        if ((y < 0) != (m < 0)) {
            m += y;
            d -= 1.0;
        }
    } else {
        m = copysign(0.0, y);
    }
    if (d != 0) {
        double f = floor(d);
        if (d - f > 0.5) f += 1.0;
        d = f;
    } else {
        d = copysign(0.0, x / y);
    }
    *div = d;
    *mod = m;
}

static int repeat(rctx *r, const node *at, const jv *seq, long long times, jv *out)
{
    if (times < 0) times = 0;
    if (seq->k == V_STR) {
        if (seq->u.s.n && (unsigned long long)times > MAX_VALUE / seq->u.s.n)
            return rfail(r, at, "the repeated string would exceed 1 GiB");
        size_t n = seq->u.s.n * (size_t)times;
        char *p = ralloc(r, n);
        if (!p) return -1;
        for (long long i = 0; i < times; i++) memcpy(p + (size_t)i * seq->u.s.n, seq->u.s.p, seq->u.s.n);
        return *out = v_str(p, n), 0;
    }
    const jlist *l = seq->u.l;
    if (l->n && (unsigned long long)times > MAX_VALUE / sizeof(jv) / l->n)
        return rfail(r, at, "the repeated list would exceed 1 GiB");
    jlist *nl = new_list(r, l->n * (size_t)times, l->tuple);
    if (!nl) return -1;
    for (long long i = 0; i < times; i++)
        for (size_t j = 0; j < l->n; j++) nl->v[nl->n++] = l->v[j];
    *out = v_list(nl);
    return 0;
}

/* a + b of strings. When a ends where the arena's free space starts, b is
 * written there and the result shares a's bytes (values never change, so no
 * one can tell), and a long result is given room to grow: a template that
 * accumulates text ({% set ns.s = ns.s ~ x %} in a loop) then costs memory
 * in proportion to the text, not to its square. */
static int str_concat(rctx *r, const node *at, const jv *a, const jv *b, jv *out)
{
    size_t an = a->u.s.n, bn = b->u.s.n, n = an + bn;
    if (bn > MAX_VALUE - an) return rfail(r, at, "the string would exceed 1 GiB");
    for (int k = 0; k < 2 && an; k++) {
        achunk *c = k ? r->ar.big : r->ar.head;
        char *end = c ? (char *)c->data + c->used : NULL;
        if (c && a->u.s.p + an == end && bn <= c->cap - c->used) {
            memcpy(end, b->u.s.p, bn);
            c->used += bn;
            return *out = v_str(a->u.s.p, n), 0;
        }
    }
    char *p = n > ARENA_BIG ? arena_big(&r->ar, n, n < MAX_VALUE / 2 ? 2 * n : MAX_VALUE) : arena_alloc(&r->ar, n);
    if (!p) return oom(r);
    memcpy(p, a->u.s.p, an);
    memcpy(p + an, b->u.s.p, bn);
    *out = v_str(p, n);
    return 0;
}

static int binop(rctx *r, const node *at, int op, const jv *a, const jv *b, jv *out)
{
    if (op == OP_TILDE) { /* str(a) + str(b), undefined as "" */
        jv x, y;
        if (to_str(r, a, &x) || to_str(r, b, &y)) return -1;
        return str_concat(r, at, &x, &y, out);
    }
    if (a->k == V_UNDEF) return undefined_fail(r, at, a);
    if (b->k == V_UNDEF) return undefined_fail(r, at, b);
    const char *sym = op_text(op);
    if (is_num(a) && is_num(b)) {
        bool fl = a->k == V_FLOAT || b->k == V_FLOAT;
        double x = num_f(a), y = num_f(b);
        long long i = num_i(a), j = num_i(b), k;
        switch (op) {
        case OP_ADD:
            if (fl) return *out = v_float(x + y), 0;
            if ((j > 0 && i > LLONG_MAX - j) || (j < 0 && i < LLONG_MIN - j)) return int_overflow(r, at);
            return *out = v_int(i + j), 0;
        case OP_SUB:
            if (fl) return *out = v_float(x - y), 0;
            if ((j < 0 && i > LLONG_MAX + j) || (j > 0 && i < LLONG_MIN + j)) return int_overflow(r, at);
            return *out = v_int(i - j), 0;
        case OP_MUL:
            if (fl) return *out = v_float(x * y), 0;
            if (i && j) {
                bool over = i > 0 ? (j > 0 ? i > LLONG_MAX / j : j < LLONG_MIN / i)
                                  : (j > 0 ? i < LLONG_MIN / j : i < LLONG_MAX / j);
                if (over) return int_overflow(r, at);
            }
            return *out = v_int(i * j), 0;
        case OP_DIV:
            if (y == 0) return rfail(r, at, "division by zero");
            return *out = v_float(x / y), 0;
        case OP_FLOORDIV:
        case OP_MOD:
            if (fl) {
                if (y == 0) return rfail(r, at, op == OP_MOD ? "float modulo by zero" : "float floor division by zero");
                double d, m;
                float_divmod(x, y, &d, &m);
                return *out = v_float(op == OP_MOD ? m : d), 0;
            }
            if (j == 0) return rfail(r, at, "integer division or modulo by zero");
            if (i == LLONG_MIN && j == -1) {
                if (op == OP_MOD) return *out = v_int(0), 0;
                return int_overflow(r, at);
            }
            k = i % j;
            if (op == OP_MOD) return *out = v_int(k != 0 && (k < 0) != (j < 0) ? k + j : k), 0;
            return *out = v_int(i / j - (k != 0 && (k < 0) != (j < 0))), 0;
        case OP_POW:
            if (!fl && j >= 0) {
                long long acc = 1, base = i;
                for (long long e = j; e; e >>= 1) {
                    if (e & 1) {
                        jv p;
                        if (binop(r, at, OP_MUL, &(jv){.k = V_INT, .u.i = acc}, &(jv){.k = V_INT, .u.i = base}, &p))
                            return -1;
                        acc = p.u.i;
                    }
                    if (e > 1) {
                        jv p;
                        if (binop(r, at, OP_MUL, &(jv){.k = V_INT, .u.i = base}, &(jv){.k = V_INT, .u.i = base}, &p))
                            return -1;
                        base = p.u.i;
                    }
                }
                return *out = v_int(acc), 0;
            }
            if (x == 0 && y < 0) return rfail(r, at, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) return rfail(r, at, "a negative number to a fractional power (a complex number) is not supported");
            {
                double p = pow(x, y);
                if (isinf(p) && isfinite(x) && isfinite(y)) return rfail(r, at, "numerical result out of range");
                return *out = v_float(p), 0;
            }
        }
    }
    if (op == OP_ADD) {
        if (a->k == V_STR && b->k == V_STR) return str_concat(r, at, a, b, out);
        if (a->k == V_LIST && b->k == V_LIST && a->u.l->tuple == b->u.l->tuple) {
            jlist *l = new_list(r, a->u.l->n + b->u.l->n, a->u.l->tuple);
            if (!l) return -1;
            for (size_t i = 0; i < a->u.l->n; i++) l->v[l->n++] = a->u.l->v[i];
            for (size_t i = 0; i < b->u.l->n; i++) l->v[l->n++] = b->u.l->v[i];
            return *out = v_list(l), 0;
        }
        if (a->k == V_STR || (a->k == V_LIST && b->k == V_LIST))
            return rfail(r, at, "can only concatenate %s (not \"%s\") to %s", type_name(a), type_name(b), type_name(a));
    }
    if (op == OP_MUL) {
        if ((a->k == V_STR || a->k == V_LIST) && (b->k == V_INT || b->k == V_BOOL)) return repeat(r, at, a, num_i(b), out);
        if ((b->k == V_STR || b->k == V_LIST) && (a->k == V_INT || a->k == V_BOOL)) return repeat(r, at, b, num_i(a), out);
        if (a->k == V_STR || a->k == V_LIST)
            return rfail(r, at, "can't multiply sequence by non-int of type '%s'", type_name(b));
    }
    if (op == OP_MOD && a->k == V_STR) return rfail(r, at, "string formatting with '%%' is not supported");
    return rfail(r, at, "unsupported operand type(s) for %s: '%s' and '%s'", op == OP_POW ? "** or pow()" : sym,
                 type_name(a), type_name(b));
}

/* item in container */
static int contains(rctx *r, const node *at, const jv *container, const jv *item, bool *res)
{
    *res = false;
    switch (container->k) {
    case V_UNDEF: return 0; /* iterating an undefined value finds nothing */
    case V_STR:
        if (item->k != V_STR)
            return rfail(r, at, "'in <string>' requires string as left operand, not %s", type_name(item));
        *res = !item->u.s.n || memmem(container->u.s.p, container->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        return 0;
    case V_LIST: {
        jlist *l = container->u.l;
        size_t i = l->lazy ? l->pos : 0;
        while (i < l->n && !*res) *res = py_eq(&l->v[i++], item, 0);
        if (l->lazy) l->pos = i;
        return 0;
    }
    case V_DICT:
        if (!hashable(item)) return rfail(r, at, "unhashable type: '%s'", type_name(item));
        *res = dict_find(container->u.d, item) >= 0;
        return 0;
    default:
        return rfail(r, at, "argument of type '%s' is not iterable", type_name(container));
    }
}

static int compare(rctx *r, const node *at, int op, const jv *a, const jv *b, bool *res)
{
    bool lt;
    switch (op) {
    case CMP_EQ: *res = py_eq(a, b, 0); return 0;
    case CMP_NE: *res = !py_eq(a, b, 0); return 0;
    case CMP_LT: return py_lt(r, at, "<", a, b, res, 0);
    case CMP_GT: return py_lt(r, at, ">", b, a, res, 0);
    case CMP_LE:
        if (py_lt(r, at, "<=", a, b, &lt, 0)) return -1;
        *res = lt || py_eq(a, b, 0);
        return 0;
    case CMP_GE:
        if (py_lt(r, at, ">=", b, a, &lt, 0)) return -1;
        *res = lt || py_eq(a, b, 0);
        return 0;
    case CMP_IN: return contains(r, at, b, a, res);
    default:
        if (contains(r, at, b, a, res)) return -1;
        *res = !*res;
        return 0;
    }
}

/* The items a for loop, join, list() and friends go through: a list's items,
 * a dict's keys, a string's characters; nothing for undefined. */
static int iterate(rctx *r, const node *at, const jv *v, const jlist **out)
{
    switch (v->k) {
    case V_LIST: {
        jlist *l = v->u.l;
        if (!l->lazy) return *out = l, 0;
        jlist *rest = new_list(r, 0, false); /* what is left, and the iterator is used up */
        if (!rest) return -1;
        rest->v = l->v + l->pos;
        rest->n = rest->cap = l->n - l->pos;
        l->pos = l->n;
        *out = rest;
        return 0;
    }
    case V_UNDEF: {
        jlist *l = new_list(r, 0, false);
        return l ? (*out = l, 0) : -1;
    }
    case V_DICT: {
        jlist *l = new_list(r, v->u.d->n, false);
        if (!l) return -1;
        for (size_t i = 0; i < v->u.d->n; i++) l->v[l->n++] = v->u.d->k[i];
        *out = l;
        return 0;
    }
    case V_STR: {
        cps c;
        if (cps_init(r, &c, v->u.s.p, v->u.s.n)) return -1;
        jlist *l = new_list(r, c.count, false);
        if (!l) return -1;
        for (size_t i = 0; i < c.count; i++) l->v[l->n++] = v_str(c.s + cps_at(&c, i), cps_at(&c, i + 1) - cps_at(&c, i));
        *out = l;
        return 0;
    }
    default:
        return rfail(r, at, "'%s' object is not iterable", type_name(v));
    }
}

/* Binds a loop or set target: a name, or a tuple that unpacks the value. */
static int assign(rctx *r, scope *sc, const node *target, const jv *v)
{
    if (target->kind == N_NAME) return scope_set(r, sc, target->s, target->slen, *v);
    if (target->kind == N_GETATTR) { /* set ns.attr = v */
        jv *ns = scope_find(sc, target->a->s, target->a->slen);
        if (!ns || ns->k != V_NS) return rfail(r, target, "cannot assign attribute on non-namespace object");
        return dict_set(r, ns->u.d, v_str(target->s, target->slen), *v);
    }
    const jlist *items;
    if (v->k != V_LIST && v->k != V_STR && v->k != V_DICT)
        return rfail(r, target, "cannot unpack non-iterable %s object", type_name(v));
    if (iterate(r, target, v, &items)) return -1;
    if (items->n > target->nkids)
        return rfail(r, target, "too many values to unpack (expected %zu)", target->nkids);
    if (items->n < target->nkids)
        return rfail(r, target, "not enough values to unpack (expected %zu, got %zu)", target->nkids, items->n);
    for (size_t i = 0; i < target->nkids; i++)
        if (assign(r, sc, target->kids[i], &items->v[i])) return -1;
    return 0;
}

/* ---- string operations, as Python's str has them ------------------------------------------------------ */

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE, CASE_JTITLE };

/* The full case mappings (Unicode's SpecialCasing) that text is likely to
 * meet, which the simple per code point ones get wrong: upper and title of
 * ß and the Latin ligatures, lower of İ. want: 'u' upper, 't' title, 'l'
 * lower. */
static const char *special_case(uint32_t c, char want)
{
    static const struct {
        uint32_t c;
        const char *upper, *title, *lower;
    } table[] = {
        {0xDF, "SS", "Ss", NULL},         {0x130, NULL, NULL, "i\xCC\x87"}, {0x149, "\xCA\xBCN", "\xCA\xBCN", NULL},
        {0x1F0, "J\xCC\x8C", "J\xCC\x8C", NULL}, {0xFB00, "FF", "Ff", NULL}, {0xFB01, "FI", "Fi", NULL},
        {0xFB02, "FL", "Fl", NULL},       {0xFB03, "FFI", "Ffi", NULL},     {0xFB04, "FFL", "Ffl", NULL},
        {0xFB05, "ST", "St", NULL},       {0xFB06, "ST", "St", NULL},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].c == c) return want == 'u' ? table[i].upper : want == 't' ? table[i].title : table[i].lower;
    return NULL;
}

/* Case mapping per code point (utf8proc's simple mappings, and the few full
 * ones of special_case); Python's final sigma rule is not applied. */
static int str_case(rctx *r, const char *s, size_t n, int mode, jv *out)
{
    sbuf b = {0};
    bool prev_cased = false, word_start = true;
    for (size_t i = 0, k = 0; i < n; k++) {
        size_t len;
        uint32_t c = cp_at(s + i, n - i, &len), o = c;
        char want = 0;
        switch (mode) {
        case CASE_UPPER: want = 'u'; break;
        case CASE_LOWER: want = 'l'; break;
        case CASE_CAPITALIZE: want = k == 0 ? 't' : 'l'; break;
        case CASE_TITLE: /* str.title(): a cased character after a cased one is lowered */
            want = prev_cased ? 'l' : 't';
            prev_cased = cp_iscased(c);
            break;
        default: /* Jinja2's title filter: words start after spaces, - ( { [ < */
            if (py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
                word_start = true;
            } else {
                want = word_start ? 'u' : 'l';
                word_start = false;
            }
        }
        const char *full = want ? special_case(c, want) : NULL;
        if (full) {
            if (sb_lit(r, &b, full)) return -1;
            i += len;
            continue;
        }
        if (want) o = want == 'u' ? cp_upper(c) : want == 't' ? cp_title(c) : cp_lower(c);
        if (sb_cp(r, &b, o)) return -1;
        i += len;
    }
    *out = sb_value(&b);
    return 0;
}

static bool in_chars(uint32_t c, const jv *chars)
{
    if (!chars) return py_isspace(c);
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t len;
        if (cp_at(chars->u.s.p + i, chars->u.s.n - i, &len) == c) return true;
        i += len;
    }
    return false;
}

/* str.strip(chars) and its one-sided forms; chars NULL: whitespace. */
static jv str_strip(const jv *s, const jv *chars, bool left, bool right)
{
    const char *p = s->u.s.p;
    size_t from = 0, to = s->u.s.n;
    while (left && from < to) {
        size_t len;
        uint32_t c = cp_at(p + from, to - from, &len);
        if (!in_chars(c, chars)) break;
        from += len;
    }
    while (right && to > from) {
        size_t i = cp_start_before(p + from, to - from) + from, len;
        if (!in_chars(cp_at(p + i, to - i, &len), chars)) break;
        to = i;
    }
    return v_str(p + from, to - from);
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn)
{
    return nn ? memmem(h, hn, nd, nn) : h;
}

static const char *rfind_bytes(const char *h, size_t hn, const char *nd, size_t nn)
{
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

/* str.split / str.rsplit: sep NULL splits on runs of whitespace. */
static int str_split(rctx *r, const node *at, const jv *s, const jv *sep, long long maxsplit, bool from_right, jv *out)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    jlist *l = new_list(r, 0, false);
    if (!l) return -1;
    if (maxsplit < 0) maxsplit = LLONG_MAX;
    if (sep && !sep->u.s.n) return rfail(r, at, "empty separator");
    if (!from_right) {
        size_t i = 0;
        if (!sep) {
            for (;;) {
                size_t k;
                while (i < n && (k = space_at(p + i, n - i))) i += k;
                if (i >= n) break;
                if (maxsplit-- == 0) {
                    if (list_add(r, l, v_str(p + i, n - i))) return -1;
                    break;
                }
                size_t j = i;
                for (j = i; j < n;) {
                    if (space_at(p + j, n - j)) break;
                    cp_at(p + j, n - j, &k);
                    j += k;
                }
                if (list_add(r, l, v_str(p + i, j - i))) return -1;
                i = j;
            }
        } else {
            for (;;) {
                const char *hit = maxsplit-- > 0 ? find_bytes(p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
                if (!hit) {
                    if (list_add(r, l, v_str(p + i, n - i))) return -1;
                    break;
                }
                if (list_add(r, l, v_str(p + i, (size_t)(hit - p) - i))) return -1;
                i = (size_t)(hit - p) + sep->u.s.n;
            }
        }
        *out = v_list(l);
        return 0;
    }
    /* from the right: collect backwards, then reverse */
    size_t e = n;
    if (!sep) {
        for (;;) {
            while (e > 0) {
                size_t b = cp_start_before(p, e);
                if (!space_at(p + b, e - b)) break;
                e = b;
            }
            if (e == 0) break;
            if (maxsplit-- == 0) {
                if (list_add(r, l, v_str(p, e))) return -1;
                break;
            }
            size_t b = e;
            while (b > 0) {
                size_t c = cp_start_before(p, b);
                if (space_at(p + c, b - c)) break;
                b = c;
            }
            if (list_add(r, l, v_str(p + b, e - b))) return -1;
            e = b;
        }
    } else {
        for (;;) {
            const char *hit = maxsplit-- > 0 ? rfind_bytes(p, e, sep->u.s.p, sep->u.s.n) : NULL;
            if (!hit) {
                if (list_add(r, l, v_str(p, e))) return -1;
                break;
            }
            size_t after = (size_t)(hit - p) + sep->u.s.n;
            if (list_add(r, l, v_str(p + after, e - after))) return -1;
            e = (size_t)(hit - p);
        }
    }
    for (size_t i = 0; i < l->n / 2; i++) {
        jv t = l->v[i];
        l->v[i] = l->v[l->n - 1 - i];
        l->v[l->n - 1 - i] = t;
    }
    *out = v_list(l);
    return 0;
}

static int str_replace(rctx *r, const jv *s, const jv *old, const jv *new, long long count, jv *out)
{
    if (count < 0) count = LLONG_MAX;
    sbuf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    if (!old->u.s.n) { /* the new text between every character and at both ends */
        for (size_t k; count > 0 && i <= n; count--) {
            if (sb_put(r, &b, new->u.s.p, new->u.s.n)) return -1;
            if (i == n) {
                i++;
                break;
            }
            cp_at(p + i, n - i, &k);
            if (sb_put(r, &b, p + i, k)) return -1;
            i += k;
        }
        if (i < n && sb_put(r, &b, p + i, n - i)) return -1;
        return *out = sb_value(&b), 0;
    }
    for (; count > 0; count--) {
        const char *hit = find_bytes(p + i, n - i, old->u.s.p, old->u.s.n);
        if (!hit) break;
        if (sb_put(r, &b, p + i, (size_t)(hit - p) - i) || sb_put(r, &b, new->u.s.p, new->u.s.n)) return -1;
        i = (size_t)(hit - p) + old->u.s.n;
    }
    if (sb_put(r, &b, p + i, n - i)) return -1;
    *out = sb_value(&b);
    return 0;
}

/* The byte range of s[start:end] (code point indices, slice rules; absent
 * ones are none); false when start lies past the end, where find() fails. */
static int str_range(rctx *r, const node *at, const char *what, const cps *c, const jv *start, const jv *end,
                     size_t *from, size_t *to, bool *ok)
{
    long long len = (long long)c->count, s = 0, e = len;
    if (start && start->k != V_NONE) {
        if (start->k != V_INT && start->k != V_BOOL) return rfail(r, at, "%s: slice indices must be integers or None", what);
        s = num_i(start);
    }
    if (end && end->k != V_NONE) {
        if (end->k != V_INT && end->k != V_BOOL) return rfail(r, at, "%s: slice indices must be integers or None", what);
        e = num_i(end);
    }
    if (s < 0 && (s += len) < 0) s = 0;
    if (e < 0 && (e += len) < 0) e = 0;
    if (e > len) e = len;
    *ok = s <= len && s <= e;
    if (!*ok) return 0;
    *from = cps_at(c, (size_t)s);
    *to = cps_at(c, (size_t)e);
    return 0;
}

/* Python's int(str, base): whitespace around, a sign, digits with single
 * underscores between them, a prefix matching the base. */
static bool parse_int(const char *s, size_t n, int base, long long *out)
{
    size_t i = 0;
    while (i < n && space_at(s + i, n - i)) i += space_at(s + i, n - i);
    n = i + rstrip_space(s + i, n - i);
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i + 1 < n && s[i] == '0') {
        char p = (char)(s[i + 1] | 0x20);
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) base = pb, i += 2;
        if (i < n && s[i] == '_' && pb && base == pb) i++;
    }
    if (base == 0) {
        base = 10;
        if (i + 1 < n && s[i] == '0') { /* "010" is not an int for base 0 */
            for (size_t k = i; k < n; k++)
                if (s[k] != '0' && s[k] != '_') return false;
        }
    }
    if (i >= n) return false;
    unsigned long long v = 0;
    bool digit = false;
    for (; i < n; i++) {
        if (s[i] == '_') {
            if (!digit || i + 1 >= n || s[i + 1] == '_') return false;
            continue;
        }
        char c = (char)(s[i] | 0x20);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (9223372036854775808ull - (unsigned)d) / (unsigned)base) return false;
        v = v * (unsigned)base + (unsigned)d;
        digit = true;
    }
    if (!neg && v > (unsigned long long)LLONG_MAX) return false;
    *out = neg ? (long long)(0 - v) : (long long)v;
    return true;
}

/* Python's float(str). */
static bool parse_float(const char *s, size_t n, double *out)
{
    size_t i = 0;
    while (i < n && space_at(s + i, n - i)) i += space_at(s + i, n - i);
    n = i + rstrip_space(s + i, n - i);
    char buf[512];
    size_t k = 0, j = i;
    if (j < n && (s[j] == '+' || s[j] == '-')) buf[k++] = s[j++];
    static const char *const words[] = {"inf", "infinity", "nan"};
    for (int w = 0; w < 3; w++)
        if (n - j == strlen(words[w]) && !strncasecmp(s + j, words[w], n - j)) {
            double v = w == 2 ? NAN : INFINITY;
            *out = k && buf[0] == '-' ? -v : v;
            return true;
        }
    /* digits [. digits] [e [sign] digits], underscores only between digits */
    bool mant = false, prev_digit = false;
    int part = 0; /* 0 integer, 1 fraction, 2 exponent */
    for (; j < n; j++) {
        char c = s[j];
        if (k >= sizeof buf - 1) return false;
        if (is_digit(c)) {
            buf[k++] = c;
            if (part < 2) mant = true;
            prev_digit = true;
        } else if (c == '_') {
            if (!prev_digit || j + 1 >= n || !is_digit(s[j + 1])) return false;
        } else if (c == '.' && part == 0) {
            buf[k++] = c;
            part = 1;
            prev_digit = false;
        } else if ((c == 'e' || c == 'E') && part < 2 && mant) {
            buf[k++] = 'e';
            part = 2;
            prev_digit = false;
            if (j + 1 < n && (s[j + 1] == '+' || s[j + 1] == '-')) buf[k++] = s[++j];
            if (j + 1 >= n || !is_digit(s[j + 1])) return false;
        } else {
            return false;
        }
    }
    if (!mant) return false;
    buf[k] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

/* ---- dotted attribute paths (map, sort, join, selectattr: attribute='a.b') ------------------------------- */

static int attr_path(rctx *r, const jv *item, const jv *path, jv *out)
{
    *out = *item;
    const char *p = path->u.s.p;
    size_t n = path->u.s.n;
    for (size_t i = 0; i <= n;) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        jv key = v_str(p + i, j - i), k2;
        bool digits = j > i;
        for (size_t d = i; d < j; d++) digits = digits && is_digit(p[d]);
        long long idx;
        if (digits && parse_int(p + i, j - i, 10, &idx)) key = v_int(idx);
        if (get_item(r, out, &key, &k2)) return -1;
        *out = k2;
        i = j + 1;
    }
    return 0;
}

/* Python's stable sort of items by keys[], which may fail to compare. */
static int sort_order(rctx *r, const node *at, const jv *keys, size_t n, bool reverse, size_t *order)
{
    size_t *tmp = ralloc(r, (n ? n : 1) * sizeof *tmp);
    if (!tmp) return -1;
    for (size_t i = 0; i < n; i++) order[i] = i;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                bool lt;
                /* take from the right only when it is strictly first: equal keys keep their order */
                if (reverse ? py_lt(r, at, "<", &keys[order[a]], &keys[order[b]], &lt, 0)
                            : py_lt(r, at, "<", &keys[order[b]], &keys[order[a]], &lt, 0))
                    return -1;
                tmp[k++] = lt ? order[b++] : order[a++];
            }
            while (a < mid) tmp[k++] = order[a++];
            while (b < hi) tmp[k++] = order[b++];
        }
        memcpy(order, tmp, n * sizeof *order);
    }
    return 0;
}

/* A sort key: the item or its attribute, lowered when case does not count. */
static int item_key(rctx *r, const jv *item, const jv *attribute, bool case_sensitive, jv *out)
{
    if (attribute && attribute->k != V_NONE) {
        if (attribute->k == V_INT) {
            if (get_item(r, item, attribute, out)) return -1;
        } else {
            jv path;
            if (to_str(r, attribute, &path) || attr_path(r, item, &path, out)) return -1;
        }
    } else {
        *out = *item;
    }
    if (!case_sensitive && out->k == V_STR) return str_case(r, out->u.s.p, out->u.s.n, CASE_LOWER, out);
    return 0;
}

/* ---- tests ---------------------------------------------------------------------------------------- */

static int test_apply(rctx *r, const node *at, int id, const char *name, const jv *v, const args *a, bool *res)
{
    char what[48];
    snprintf(what, sizeof what, "test '%s'", name);
    jv other = v_undef(NULL, 0);
    bool one = id == T_DIVISIBLEBY || id == T_EQ || id == T_NE || id == T_LT || id == T_LE || id == T_GT ||
               id == T_GE || id == T_IN || id == T_SAMEAS;
    if (one) {
        static const char *const names[] = {"other", NULL};
        bool have;
        if (bind(r, at, what, a, names, &other, &have)) return -1;
        if (!have) return rfail(r, at, "%s needs an argument", what);
    } else if (a->npos || a->nkw) {
        return rfail(r, at, "%s takes no arguments", what);
    }
    switch (id) {
    case T_BOOLEAN: *res = v->k == V_BOOL; return 0;
    case T_CALLABLE: *res = v->k == V_MACRO || v->k == V_FUNC || v->k == V_METHOD; return 0;
    case T_DEFINED: *res = v->k != V_UNDEF; return 0;
    case T_UNDEFINED: *res = v->k == V_UNDEF; return 0;
    case T_NONE: *res = v->k == V_NONE; return 0;
    case T_TRUE: *res = v->k == V_BOOL && v->u.b; return 0;
    case T_FALSE: *res = v->k == V_BOOL && !v->u.b; return 0;
    case T_STRING: *res = v->k == V_STR; return 0;
    case T_NUMBER: *res = is_num(v); return 0; /* Python's Number takes bool too */
    case T_INTEGER: *res = v->k == V_INT; return 0;
    case T_FLOAT: *res = v->k == V_FLOAT; return 0;
    case T_MAPPING: *res = v->k == V_DICT; return 0;
    case T_ITERABLE: *res = v->k == V_STR || v->k == V_LIST || v->k == V_DICT || v->k == V_UNDEF; return 0;
    case T_SEQUENCE:
        *res = v->k == V_STR || (v->k == V_LIST && !v->u.l->lazy) || v->k == V_DICT || v->k == V_UNDEF;
        return 0;
    case T_SAMEAS:
        if (v->k != other.k) *res = false;
        else if (v->k == V_LIST || v->k == V_DICT || v->k == V_NS) *res = v->u.l == other.u.l;
        else *res = py_eq(v, &other, 0);
        return 0;
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: { /* value % 2 == 1, value % 2 == 0, value % num == 0 */
        jv m, two = v_int(2), want = v_int(id == T_ODD);
        if (binop(r, at, OP_MOD, v, id == T_DIVISIBLEBY ? &other : &two, &m)) return -1;
        *res = py_eq(&m, &want, 0);
        return 0;
    }
    case T_LOWER:
    case T_UPPER: {
        jv s;
        if (to_str(r, v, &s)) return -1;
        bool any = false, bad = false;
        for (size_t i = 0; i < s.u.s.n;) {
            size_t len;
            uint32_t c = cp_at(s.u.s.p + i, s.u.s.n - i, &len);
            if (id == T_LOWER ? cp_islower(c) : cp_isupper(c)) any = true;
            else if (cp_iscased(c)) bad = true;
            i += len;
        }
        *res = any && !bad;
        return 0;
    }
    case T_IN: return contains(r, at, &other, v, res);
    default: {
        static const int cmp_of[] = {[T_EQ] = CMP_EQ, [T_NE] = CMP_NE, [T_LT] = CMP_LT, [T_LE] = CMP_LE,
                                     [T_GT] = CMP_GT, [T_GE] = CMP_GE};
        return compare(r, at, cmp_of[id], v, &other, res);
    }
    }
}

/* A test named at run time (select('odd'), selectattr('x', 'defined')). */
static int test_by_name(rctx *r, const node *at, const jv *name, const jv *v, const args *a, bool *res)
{
    if (name->k != V_STR) return rfail(r, at, "a test's name must be a string");
    int id = TEST_ID(name->u.s.p, name->u.s.n);
    if (id < 0) return rfail(r, at, "test '%.*s' is not supported", (int)name->u.s.n, name->u.s.p);
    char buf[48];
    snprintf(buf, sizeof buf, "%.*s", (int)(name->u.s.n < 40 ? name->u.s.n : 40), name->u.s.p);
    return test_apply(r, at, id, buf, v, a, res);
}

/* ---- filters -------------------------------------------------------------------------------------- */

static int filter_apply(rctx *r, const node *at, int id, const char *name, const jv *v, const args *a, jv *out);

static int want_str(rctx *r, const node *at, const char *what, const char *param, const jv *x)
{
    if (x->k == V_STR) return 0;
    return rfail(r, at, "%s: %s must be a string, not %s", what, param, type_name(x));
}

static int want_int(rctx *r, const node *at, const char *what, const char *param, const jv *x)
{
    if (x->k == V_INT || x->k == V_BOOL) return 0;
    return rfail(r, at, "%s: %s must be an integer, not %s", what, param, type_name(x));
}

/* select, reject, selectattr, rejectattr */
static int filter_select(rctx *r, const node *at, const char *what, const jv *v, const args *a, bool attr, bool keep,
                         jv *out)
{
    const jlist *items;
    if (no_kwargs(r, at, what, a) || iterate(r, at, v, &items)) return -1;
    size_t first = 0;
    const jv *attribute = NULL, *test = NULL;
    if (attr) {
        if (a->npos < 1) return rfail(r, at, "%s needs an attribute name", what);
        attribute = &a->pos[first++];
        if (want_str(r, at, what, "the attribute", attribute)) return -1;
    }
    if (a->npos > first) test = &a->pos[first++];
    args rest = {.pos = a->pos + first, .npos = a->npos - first};
    jlist *l = new_list(r, 0, false);
    if (!l) return -1;
    for (size_t i = 0; i < items->n; i++) {
        jv x = items->v[i];
        if (attribute && attr_path(r, &items->v[i], attribute, &x)) return -1;
        bool ok = truthy(&x);
        if (test && test_by_name(r, at, test, &x, &rest, &ok)) return -1;
        if (ok == keep && list_add(r, l, items->v[i])) return -1;
    }
    *out = v_list(l);
    return 0;
}

static int filter_map(rctx *r, const node *at, const jv *v, const args *a, jv *out)
{
    const jlist *items;
    if (iterate(r, at, v, &items)) return -1;
    jlist *l = new_list(r, items->n, false);
    if (!l) return -1;
    if (!a->npos) { /* map(attribute='x', default=y) */
        static const char *const names[] = {"attribute", "default", NULL};
        jv slot[2];
        bool have[2];
        if (bind(r, at, "filter 'map'", a, names, slot, have)) return -1;
        if (!have[0]) return rfail(r, at, "filter 'map' needs a filter name or attribute=");
        if (want_str(r, at, "filter 'map'", "attribute", &slot[0])) return -1;
        for (size_t i = 0; i < items->n; i++) {
            jv x;
            if (attr_path(r, &items->v[i], &slot[0], &x)) return -1;
            if (x.k == V_UNDEF && have[1]) x = slot[1];
            l->v[l->n++] = x;
        }
        return *out = v_list(l), 0;
    }
    const jv *fname = &a->pos[0];
    if (want_str(r, at, "filter 'map'", "the filter name", fname)) return -1;
    int id = FILTER_ID(fname->u.s.p, fname->u.s.n);
    if (id < 0) return rfail(r, at, "filter '%.*s' is not supported", (int)fname->u.s.n, fname->u.s.p);
    char buf[48];
    snprintf(buf, sizeof buf, "%.*s", (int)(fname->u.s.n < 40 ? fname->u.s.n : 40), fname->u.s.p);
    args rest = *a;
    rest.pos++;
    rest.npos--;
    for (size_t i = 0; i < items->n; i++)
        if (filter_apply(r, at, id, buf, &items->v[i], &rest, &l->v[l->n++])) return -1;
    *out = v_list(l);
    return 0;
}

static int filter_round(rctx *r, const node *at, const jv *v, const jv *prec, const jv *method, jv *out)
{
    const char *what = "filter 'round'";
    long long p = 0;
    if (prec) {
        if (want_int(r, at, what, "precision", prec)) return -1;
        p = num_i(prec);
    }
    int m = 0;
    if (method) {
        if (want_str(r, at, what, "method", method)) return -1;
        if (same(method->u.s.p, method->u.s.n, "ceil")) m = 1;
        else if (same(method->u.s.p, method->u.s.n, "floor")) m = 2;
        else if (!same(method->u.s.p, method->u.s.n, "common"))
            return rfail(r, at, "%s: method must be 'common', 'ceil' or 'floor'", what);
    }
    if (!is_num(v)) return rfail(r, at, "%s: type %s doesn't define __round__ method", what, type_name(v));
    if (p > 400) p = 400;
    if (p < -400) p = -400;
    double scale = pow(10.0, (double)p);
    if (m) { /* math.ceil / math.floor of value * 10**precision, over 10**precision: a float */
        double x = num_f(v) * scale;
        return *out = v_float((m == 1 ? ceil(x) : floor(x)) / scale), 0;
    }
    if (v->k != V_FLOAT) { /* round(int, n) is an int, rounded half to even at n < 0 */
        long long i = num_i(v);
        if (p >= 0) return *out = v_int(i), 0;
        if (p < -18) return *out = v_int(0), 0;
        long long unit = 1;
        for (long long k = 0; k < -p; k++) unit *= 10;
        long long q = i / unit, rem = i % unit;
        if (rem < 0) rem += unit, q--;
        if (2 * rem > unit || (2 * rem == unit && (q & 1))) q++;
        jv res;
        if (binop(r, at, OP_MUL, &(jv){.k = V_INT, .u.i = q}, &(jv){.k = V_INT, .u.i = unit}, &res)) return -1;
        return *out = res, 0;
    }
    double x = v->u.f;
    if (!isfinite(x) || p > 308) return *out = v_float(x), 0;
    if (p >= 0) { /* the correctly rounded decimal, half to even, as Python's round does */
        char buf[512];
        snprintf(buf, sizeof buf, "%.*f", (int)p, x);
        return *out = v_float(strtod(buf, NULL)), 0;
    }
    double unit = pow(10.0, (double)-p), y = rint(x / unit) * unit;
    return *out = v_float(y), 0;
}

static int filter_indent(rctx *r, const node *at, const jv *s, const jv *slot, const bool *have, jv *out)
{
    const char *ind = "    ";
    size_t ilen = 4;
    if (have[0]) {
        if (slot[0].k == V_STR) {
            ind = slot[0].u.s.p;
            ilen = slot[0].u.s.n;
        } else {
            if (want_int(r, at, "filter 'indent'", "width", &slot[0])) return -1;
            long long w = num_i(&slot[0]);
            ilen = w > 0 ? (size_t)(w < 4096 ? w : 4096) : 0;
            char *spaces = ralloc(r, ilen + 1);
            if (!spaces) return -1;
            memset(spaces, ' ', ilen);
            ind = spaces;
        }
    }
    bool first = have[1] && truthy(&slot[1]), blank = have[2] && truthy(&slot[2]);
    /* Jinja2's: the lines of (s + "\n").splitlines(), joined by "\n", each
     * but the first indented unless empty (blank: even then), the first too
     * with first. */
    sbuf t = {0}, b = {0};
    if (sb_put(r, &t, s->u.s.p, s->u.s.n) || sb_lit(r, &t, "\n")) return -1;
    for (size_t i = 0, line = 0; i < t.n; line++) {
        size_t j = i, k = 0;
        while (j < t.n && !(k = line_break_at(t.p + j, t.n - j))) {
            size_t len;
            cp_at(t.p + j, t.n - j, &len);
            j += len;
        }
        if (line && sb_lit(r, &b, "\n")) return -1;
        if ((line ? blank || j > i : first) && sb_put(r, &b, ind, ilen)) return -1;
        if (sb_put(r, &b, t.p + i, j - i)) return -1;
        i = j + k;
    }
    *out = sb_value(&b);
    return 0;
}

static int filter_escape(rctx *r, const jv *s, jv *out)
{
    sbuf b = {0};
    for (size_t i = 0; i < s->u.s.n; i++) {
        char c = s->u.s.p[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
        if (e ? sb_lit(r, &b, e) : sb_put(r, &b, &c, 1)) return -1;
    }
    *out = sb_value(&b);
    return 0;
}

static int filter_tojson(rctx *r, const node *at, const jv *v, const jv *slot, const bool *have, jv *out)
{
    const char *what = "filter 'tojson'";
    jsonopt o = {.item_sep = V_LIT(", "), .key_sep = V_LIT(": ")};
    o.ensure_ascii = have[0] && truthy(&slot[0]);
    if (have[1] && slot[1].k != V_NONE) {
        if (slot[1].k == V_STR) {
            o.indent = slot[1].u.s.p;
            o.indent_len = slot[1].u.s.n;
        } else {
            if (want_int(r, at, what, "indent", &slot[1])) return -1;
            long long w = num_i(&slot[1]);
            o.indent_len = w > 0 ? (size_t)(w < 4096 ? w : 4096) : 0;
            char *sp = ralloc(r, o.indent_len + 1);
            if (!sp) return -1;
            memset(sp, ' ', o.indent_len);
            o.indent = sp;
        }
        o.item_sep = V_LIT(",");
    }
    if (have[2] && slot[2].k != V_NONE) {
        const jv *s = &slot[2];
        if (s->k != V_LIST || s->u.l->n != 2 || s->u.l->v[0].k != V_STR || s->u.l->v[1].k != V_STR)
            return rfail(r, at, "%s: separators must be a pair of strings", what);
        o.item_sep = s->u.l->v[0];
        o.key_sep = s->u.l->v[1];
    }
    o.sort_keys = have[3] && truthy(&slot[3]);
    sbuf b = {0};
    if (put_json(r, at, &b, v, &o, 0)) return -1;
    *out = sb_value(&b);
    return 0;
}

/* max or min: the first item whose key is largest or smallest */
static int filter_extreme(rctx *r, const node *at, const jv *v, const jv *slot, const bool *have, bool max, jv *out)
{
    const jlist *items;
    if (iterate(r, at, v, &items)) return -1;
    *out = v_undef(NULL, 0);
    jv best_key;
    for (size_t i = 0; i < items->n; i++) {
        jv k;
        if (item_key(r, &items->v[i], have[1] ? &slot[1] : NULL, have[0] && truthy(&slot[0]), &k)) return -1;
        bool better = i == 0;
        if (!better && py_lt(r, at, "<", max ? &best_key : &k, max ? &k : &best_key, &better, 0)) return -1;
        if (better) {
            best_key = k;
            *out = items->v[i];
        }
    }
    return 0;
}

/* The result of a filter that Jinja2 writes as a generator. */
static int make_lazy(int rc, jv *out)
{
    if (!rc && out->k == V_LIST) out->u.l->lazy = LAZY_GENERATOR;
    return rc;
}

static int filter_apply(rctx *r, const node *at, int id, const char *name, const jv *v, const args *a, jv *out)
{
    char what[48];
    snprintf(what, sizeof what, "filter '%s'", name);
    jv slot[4], s;
    bool have[4];
    static const char *const none[] = {NULL};
#define BIND(...)                                                                                                     \
    do {                                                                                                              \
        static const char *const names_[] = {__VA_ARGS__, NULL};                                                      \
        if (bind(r, at, what, a, names_, slot, have)) return -1;                                                      \
    } while (0)
    switch (id) {
    case F_ABS:
        if (bind(r, at, what, a, none, slot, have)) return -1;
        if (v->k == V_FLOAT) return *out = v_float(fabs(v->u.f)), 0;
        if (v->k == V_INT || v->k == V_BOOL) {
            long long i = num_i(v);
            if (i == LLONG_MIN) return int_overflow(r, at);
            return *out = v_int(i < 0 ? -i : i), 0;
        }
        return rfail(r, at, "bad operand type for abs(): '%s'", type_name(v));
    case F_ATTR:
        BIND("name");
        if (!have[0]) return rfail(r, at, "%s needs an attribute name", what);
        if (to_str(r, &slot[0], &s)) return -1;
        if (v->k == V_DICT && !in_names(DICT_METHODS, s.u.s.p, s.u.s.n)) /* attributes only, not items */
            return *out = v_undef(s.u.s.p, s.u.s.n), 0;
        return get_attr(r, v, s.u.s.p, s.u.s.n, out);
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
    case F_TITLE:
        if (bind(r, at, what, a, none, slot, have) || to_str(r, v, &s)) return -1;
        return str_case(r, s.u.s.p, s.u.s.n,
                        id == F_CAPITALIZE ? CASE_CAPITALIZE : id == F_LOWER ? CASE_LOWER : id == F_UPPER ? CASE_UPPER : CASE_JTITLE,
                        out);
    case F_DEFAULT:
        BIND("default_value", "boolean");
        if (v->k == V_UNDEF || (have[1] && truthy(&slot[1]) && !truthy(v))) *out = have[0] ? slot[0] : V_LIT("");
        else *out = *v;
        return 0;
    case F_DICTSORT: {
        BIND("case_sensitive", "by", "reverse");
        if (v->k != V_DICT) return rfail(r, at, "%s needs a mapping, not %s", what, type_name(v));
        int pos = 0;
        if (have[1]) {
            if (want_str(r, at, what, "by", &slot[1])) return -1;
            if (same(slot[1].u.s.p, slot[1].u.s.n, "value")) pos = 1;
            else if (!same(slot[1].u.s.p, slot[1].u.s.n, "key"))
                return rfail(r, at, "%s: you can only sort by either 'key' or 'value'", what);
        }
        const jdict *d = v->u.d;
        jv *keys = ralloc(r, (d->n ? d->n : 1) * sizeof *keys);
        size_t *order = ralloc(r, (d->n ? d->n : 1) * sizeof *order);
        jlist *l = new_list(r, d->n, false);
        if (!keys || !order || !l) return -1;
        for (size_t i = 0; i < d->n; i++)
            if (item_key(r, pos ? &d->v[i] : &d->k[i], NULL, have[0] && truthy(&slot[0]), &keys[i])) return -1;
        if (sort_order(r, at, keys, d->n, have[2] && truthy(&slot[2]), order)) return -1;
        for (size_t i = 0; i < d->n; i++) {
            jlist *pair = new_list(r, 2, true);
            if (!pair) return -1;
            pair->v[0] = d->k[order[i]];
            pair->v[1] = d->v[order[i]];
            pair->n = 2;
            l->v[l->n++] = v_list(pair);
        }
        return *out = v_list(l), 0;
    }
    case F_ESCAPE:
        if (bind(r, at, what, a, none, slot, have) || to_str(r, v, &s)) return -1;
        return filter_escape(r, &s, out);
    case F_FIRST:
    case F_LAST: {
        if (bind(r, at, what, a, none, slot, have)) return -1;
        const jlist *items;
        if (v->k == V_UNDEF) return *out = *v, 0;
        *out = v_undef(NULL, 0);
        if (v->k == V_LIST && v->u.l->lazy) { /* next(iterator) takes one item; reversed(iterator) fails */
            if (id == F_LAST) return rfail(r, at, "'%s' object is not reversible", type_name(v));
            if (v->u.l->pos < v->u.l->n) *out = v->u.l->v[v->u.l->pos++];
            return 0;
        }
        if (iterate(r, at, v, &items)) return -1;
        if (items->n) *out = items->v[id == F_FIRST ? 0 : items->n - 1];
        return 0;
    }
    case F_FLOAT: {
        BIND("default");
        double f;
        if (v->k == V_UNDEF) return undefined_fail(r, at, v); /* float(Undefined) raises */
        if (v->k == V_STR ? parse_float(v->u.s.p, v->u.s.n, &f) : is_num(v) ? (f = num_f(v), true) : false)
            return *out = v_float(f), 0;
        *out = have[0] ? slot[0] : v_float(0.0);
        return 0;
    }
    case F_INT: {
        BIND("default", "base");
        long long base = 10, i;
        double f;
        if (have[1]) {
            if (want_int(r, at, what, "base", &slot[1])) return -1;
            base = num_i(&slot[1]);
            if (base != 0 && (base < 2 || base > 36)) return rfail(r, at, "%s: base must be 0 or 2..36", what);
        }
        if (v->k == V_UNDEF) return undefined_fail(r, at, v);
        if (v->k == V_INT || v->k == V_BOOL) return *out = v_int(num_i(v)), 0;
        if (v->k == V_STR && parse_int(v->u.s.p, v->u.s.n, (int)base, &i)) return *out = v_int(i), 0;
        /* then int(float(value)) */
        bool ok = v->k == V_FLOAT ? (f = v->u.f, true) : v->k == V_STR ? parse_float(v->u.s.p, v->u.s.n, &f) : false;
        if (ok && isfinite(f) && fabs(f) < 9.2e18) return *out = v_int((long long)f), 0;
        *out = have[0] ? slot[0] : v_int(0);
        return 0;
    }
    case F_INDENT:
        BIND("width", "first", "blank");
        if (v->k == V_UNDEF) return undefined_fail(r, at, v);
        if (v->k != V_STR) return rfail(r, at, "%s needs a string, not %s", what, type_name(v));
        return filter_indent(r, at, v, slot, have, out);
    case F_ITEMS:
    case F_KEYS:
    case F_VALUES: {
        if (bind(r, at, what, a, none, slot, have)) return -1;
        if (v->k == V_UNDEF && id == F_ITEMS) {
            jlist *l = new_list(r, 0, false);
            if (l) l->lazy = LAZY_GENERATOR;
            return l ? (*out = v_list(l), 0) : -1;
        }
        if (v->k != V_DICT) return rfail(r, at, "%s needs a mapping, not %s", what, type_name(v));
        const jdict *d = v->u.d;
        jlist *l = new_list(r, d->n, false);
        if (!l) return -1;
        for (size_t i = 0; i < d->n; i++) {
            if (id == F_ITEMS) {
                jlist *pair = new_list(r, 2, true);
                if (!pair) return -1;
                pair->v[0] = d->k[i];
                pair->v[1] = d->v[i];
                pair->n = 2;
                l->v[l->n++] = v_list(pair);
            } else {
                l->v[l->n++] = id == F_KEYS ? d->k[i] : d->v[i];
            }
        }
        if (id == F_ITEMS) l->lazy = LAZY_GENERATOR; /* Jinja2's items filter is a generator, dict.items() a view */
        return *out = v_list(l), 0;
    }
    case F_JOIN: {
        BIND("d", "attribute");
        const jlist *items;
        jv sep = V_LIT("");
        if ((have[0] && to_str(r, &slot[0], &sep)) || iterate(r, at, v, &items)) return -1;
        sbuf b = {0};
        for (size_t i = 0; i < items->n; i++) {
            jv x = items->v[i], xs;
            if (have[1] && slot[1].k != V_NONE && item_key(r, &items->v[i], &slot[1], true, &x)) return -1;
            if ((i && sb_put(r, &b, sep.u.s.p, sep.u.s.n)) || to_str(r, &x, &xs) || sb_put(r, &b, xs.u.s.p, xs.u.s.n))
                return -1;
        }
        return *out = sb_value(&b), 0;
    }
    case F_LENGTH:
        if (bind(r, at, what, a, none, slot, have)) return -1;
        switch (v->k) {
        case V_STR: return *out = v_int((long long)cp_count(v->u.s.p, v->u.s.n)), 0;
        case V_LIST:
            if (v->u.l->lazy) break;
            return *out = v_int((long long)v->u.l->n), 0;
        case V_DICT: return *out = v_int((long long)v->u.d->n), 0;
        case V_UNDEF: return *out = v_int(0), 0;
        default: break;
        }
        return rfail(r, at, "object of type '%s' has no len()", type_name(v));
    case F_LIST:
    case F_REVERSE: {
        if (bind(r, at, what, a, none, slot, have)) return -1;
        const jlist *items;
        if (iterate(r, at, v, &items)) return -1;
        jlist *l = new_list(r, items->n, false);
        if (!l) return -1;
        for (size_t i = 0; i < items->n; i++) l->v[l->n++] = items->v[id == F_REVERSE ? items->n - 1 - i : i];
        if (id == F_REVERSE && v->k == V_STR) {
            sbuf b = {0};
            for (size_t i = 0; i < l->n; i++)
                if (sb_put(r, &b, l->v[i].u.s.p, l->v[i].u.s.n)) return -1;
            return *out = sb_value(&b), 0;
        }
        /* reversed() of a list or a dict; anything else became a list first */
        if (id == F_REVERSE && ((v->k == V_LIST && !v->u.l->lazy) || v->k == V_DICT)) l->lazy = LAZY_REVERSE;
        return *out = v_list(l), 0;
    }
    case F_MAP: return make_lazy(filter_map(r, at, v, a, out), out);
    case F_MAX:
    case F_MIN:
        BIND("case_sensitive", "attribute");
        return filter_extreme(r, at, v, slot, have, id == F_MAX, out);
    case F_SELECT: return make_lazy(filter_select(r, at, what, v, a, false, true, out), out);
    case F_REJECT: return make_lazy(filter_select(r, at, what, v, a, false, false, out), out);
    case F_SELECTATTR: return make_lazy(filter_select(r, at, what, v, a, true, true, out), out);
    case F_REJECTATTR: return make_lazy(filter_select(r, at, what, v, a, true, false, out), out);
    case F_REPLACE: {
        BIND("old", "new", "count");
        jv old, new;
        if (!have[0] || !have[1]) return rfail(r, at, "%s needs the old and the new string", what);
        if (to_str(r, v, &s) || to_str(r, &slot[0], &old) || to_str(r, &slot[1], &new)) return -1;
        long long count = -1;
        if (have[2] && slot[2].k != V_NONE) {
            if (want_int(r, at, what, "count", &slot[2])) return -1;
            count = num_i(&slot[2]);
        }
        return str_replace(r, &s, &old, &new, count, out);
    }
    case F_ROUND:
        BIND("precision", "method");
        return filter_round(r, at, v, have[0] ? &slot[0] : NULL, have[1] ? &slot[1] : NULL, out);
    case F_SAFE:
        if (bind(r, at, what, a, none, slot, have)) return -1;
        return *out = *v, 0;
    case F_SORT:
    case F_UNIQUE: {
        if (id == F_SORT) BIND("reverse", "case_sensitive", "attribute");
        else BIND("case_sensitive", "attribute");
        const jlist *items;
        if (iterate(r, at, v, &items)) return -1;
        bool cs = id == F_SORT ? have[1] && truthy(&slot[1]) : have[0] && truthy(&slot[0]);
        const jv *attribute = id == F_SORT ? (have[2] ? &slot[2] : NULL) : (have[1] ? &slot[1] : NULL);
        size_t n = items->n;
        jv *keys = ralloc(r, (n ? n : 1) * sizeof *keys);
        jlist *l = new_list(r, n, false);
        if (!keys || !l) return -1;
        for (size_t i = 0; i < n; i++)
            if (item_key(r, &items->v[i], attribute, cs, &keys[i])) return -1;
        if (id == F_UNIQUE) {
            for (size_t i = 0; i < n; i++) {
                if (!hashable(&keys[i])) return rfail(r, at, "unhashable type: '%s'", type_name(&keys[i]));
                size_t j = 0;
                while (j < i && !py_eq(&keys[j], &keys[i], 0)) j++;
                if (j == i) l->v[l->n++] = items->v[i];
            }
            l->lazy = LAZY_GENERATOR;
            return *out = v_list(l), 0;
        }
        size_t *order = ralloc(r, (n ? n : 1) * sizeof *order);
        if (!order || sort_order(r, at, keys, n, have[0] && truthy(&slot[0]), order)) return -1;
        for (size_t i = 0; i < n; i++) l->v[l->n++] = items->v[order[i]];
        return *out = v_list(l), 0;
    }
    case F_STRING:
        if (bind(r, at, what, a, none, slot, have)) return -1;
        return to_str(r, v, out);
    case F_SUM: {
        BIND("attribute", "start");
        const jlist *items;
        if (iterate(r, at, v, &items)) return -1;
        jv acc = have[1] ? slot[1] : v_int(0);
        for (size_t i = 0; i < items->n; i++) {
            jv x = items->v[i];
            if (have[0] && slot[0].k != V_NONE && item_key(r, &items->v[i], &slot[0], true, &x)) return -1;
            if (binop(r, at, OP_ADD, &acc, &x, &acc)) return -1;
        }
        return *out = acc, 0;
    }
    case F_TOJSON:
        BIND("ensure_ascii", "indent", "separators", "sort_keys");
        return filter_tojson(r, at, v, slot, have, out);
    case F_TRIM:
        BIND("chars");
        if (to_str(r, v, &s)) return -1;
        if (have[0] && slot[0].k != V_NONE && want_str(r, at, what, "chars", &slot[0])) return -1;
        return *out = str_strip(&s, have[0] && slot[0].k != V_NONE ? &slot[0] : NULL, true, true), 0;
    }
#undef BIND
    return rfail(r, at, "%s is not supported", what);
}

/* ---- methods ---------------------------------------------------------------------------------------- */

static int str_format(rctx *r, const node *at, const jv *fmt, const args *a, jv *out)
{
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n, auto_index = 0;
    sbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '}') {
            if (i + 1 < n && p[i + 1] == '}') i++;
            else return rfail(r, at, "str.format(): single '}' encountered in format string");
            if (sb_put(r, &b, "}", 1)) return -1;
            continue;
        }
        if (c != '{') {
            if (sb_put(r, &b, &c, 1)) return -1;
            continue;
        }
        if (i + 1 < n && p[i + 1] == '{') {
            if (sb_put(r, &b, "{", 1)) return -1;
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && p[j] != '}' && p[j] != '!' && p[j] != ':' && p[j] != '.' && p[j] != '[' && p[j] != '{') j++;
        if (j >= n) return rfail(r, at, "str.format(): expected '}' before end of string");
        if (p[j] == '.' || p[j] == '[' || p[j] == '{' || p[j] == ':')
            return rfail(r, at, "str.format(): only {}, {0}, {name} and !r / !s fields are supported");
        const char *field = p + i + 1;
        size_t flen = j - i - 1;
        bool repr = false;
        if (p[j] == '!') {
            if (j + 2 >= n || (p[j + 1] != 'r' && p[j + 1] != 's') || p[j + 2] != '}')
                return rfail(r, at, "str.format(): only {}, {0}, {name} and !r / !s fields are supported");
            repr = p[j + 1] == 'r';
            j += 2;
        }
        const jv *x = NULL;
        long long idx;
        if (!flen) {
            if (auto_index >= a->npos) return rfail(r, at, "str.format(): replacement index %zu out of range", auto_index);
            x = &a->pos[auto_index++];
        } else if (parse_int(field, flen, 10, &idx) && is_digit(field[0])) {
            if (idx < 0 || (size_t)idx >= a->npos) return rfail(r, at, "str.format(): replacement index %lld out of range", idx);
            x = &a->pos[idx];
        } else {
            for (size_t k = 0; k < a->nkw && !x; k++)
                if (a->kw[k]->slen == flen && !memcmp(a->kw[k]->s, field, flen)) x = &a->kwv[k];
            if (!x) return rfail(r, at, "str.format(): no argument named '%.*s'", (int)flen, field);
        }
        if (put_value(r, &b, x, repr, 0)) return -1;
        i = j;
    }
    *out = sb_value(&b);
    return 0;
}

static int str_method(rctx *r, const node *at, const jv *self, const char *name, size_t nlen, const args *a, jv *out)
{
    char what[48];
    snprintf(what, sizeof what, "str.%.*s()", (int)nlen, name);
    jv slot[3];
    bool have[3];
#define M(lit) same(name, nlen, lit)
#define BIND(...)                                                                                                     \
    do {                                                                                                              \
        static const char *const names_[] = {__VA_ARGS__, NULL};                                                      \
        if (bind(r, at, what, a, names_, slot, have)) return -1;                                                      \
    } while (0)
    static const char *const none[] = {NULL};
    if (M("startswith") || M("endswith")) {
        BIND("prefix", "start", "end");
        if (!have[0]) return rfail(r, at, "%s takes at least 1 argument", what);
        const jv *pre = &slot[0];
        if (pre->k != V_STR && !(pre->k == V_LIST && pre->u.l->tuple))
            return rfail(r, at, "%s: the first argument must be str or a tuple of str, not %s", what, type_name(pre));
        cps c;
        size_t from, to;
        bool ok;
        if (cps_init(r, &c, self->u.s.p, self->u.s.n) ||
            str_range(r, at, what, &c, have[1] ? &slot[1] : NULL, have[2] ? &slot[2] : NULL, &from, &to, &ok))
            return -1;
        size_t np = pre->k == V_STR ? 1 : pre->u.l->n;
        bool hit = false;
        for (size_t i = 0; i < np && ok && !hit; i++) {
            const jv *x = pre->k == V_STR ? pre : &pre->u.l->v[i];
            if (x->k != V_STR) return rfail(r, at, "%s: a tuple for it must hold only strings", what);
            size_t len = x->u.s.n;
            if (len <= to - from)
                hit = !memcmp(self->u.s.p + (M("startswith") ? from : to - len), x->u.s.p, len);
        }
        return *out = v_bool(hit), 0;
    }
    if (M("split") || M("rsplit")) {
        BIND("sep", "maxsplit");
        const jv *sep = have[0] && slot[0].k != V_NONE ? &slot[0] : NULL;
        if (sep && want_str(r, at, what, "sep", sep)) return -1;
        long long maxsplit = -1;
        if (have[1]) {
            if (want_int(r, at, what, "maxsplit", &slot[1])) return -1;
            maxsplit = num_i(&slot[1]);
        }
        return str_split(r, at, self, sep, maxsplit, M("rsplit"), out);
    }
    if (M("splitlines")) {
        BIND("keepends");
        bool keep = have[0] && truthy(&slot[0]);
        jlist *l = new_list(r, 0, false);
        if (!l) return -1;
        const char *p = self->u.s.p;
        size_t n = self->u.s.n;
        for (size_t i = 0; i < n;) {
            size_t j = i, k = 0;
            while (j < n && !(k = line_break_at(p + j, n - j))) {
                size_t len;
                cp_at(p + j, n - j, &len);
                j += len;
            }
            if (list_add(r, l, v_str(p + i, j - i + (keep ? k : 0)))) return -1;
            i = j + k;
        }
        return *out = v_list(l), 0;
    }
    if (M("strip") || M("lstrip") || M("rstrip")) {
        BIND("chars");
        const jv *chars = have[0] && slot[0].k != V_NONE ? &slot[0] : NULL;
        if (chars && want_str(r, at, what, "chars", chars)) return -1;
        return *out = str_strip(self, chars, !M("rstrip"), !M("lstrip")), 0;
    }
    if (M("upper") || M("lower") || M("title") || M("capitalize")) {
        if (bind(r, at, what, a, none, slot, have)) return -1;
        return str_case(r, self->u.s.p, self->u.s.n,
                        M("upper") ? CASE_UPPER : M("lower") ? CASE_LOWER : M("title") ? CASE_TITLE : CASE_CAPITALIZE, out);
    }
    if (M("replace")) {
        BIND("old", "new", "count");
        if (!have[0] || !have[1]) return rfail(r, at, "%s takes at least 2 arguments", what);
        if (want_str(r, at, what, "old", &slot[0]) || want_str(r, at, what, "new", &slot[1])) return -1;
        long long count = -1;
        if (have[2]) {
            if (want_int(r, at, what, "count", &slot[2])) return -1;
            count = num_i(&slot[2]);
        }
        return str_replace(r, self, &slot[0], &slot[1], count, out);
    }
    if (M("find") || M("rfind") || M("index") || M("rindex") || M("count")) {
        BIND("sub", "start", "end");
        if (!have[0]) return rfail(r, at, "%s takes at least 1 argument", what);
        if (want_str(r, at, what, "sub", &slot[0])) return -1;
        cps c;
        size_t from, to;
        bool ok;
        if (cps_init(r, &c, self->u.s.p, self->u.s.n) ||
            str_range(r, at, what, &c, have[1] ? &slot[1] : NULL, have[2] ? &slot[2] : NULL, &from, &to, &ok))
            return -1;
        const jv *sub = &slot[0];
        if (M("count")) {
            long long k = 0;
            if (ok && !sub->u.s.n) k = (long long)cp_count(self->u.s.p + from, to - from) + 1;
            else if (ok)
                for (size_t i = from; i < to;) {
                    const char *h = find_bytes(self->u.s.p + i, to - i, sub->u.s.p, sub->u.s.n);
                    if (!h) break;
                    k++;
                    i = (size_t)(h - self->u.s.p) + sub->u.s.n;
                }
            return *out = v_int(k), 0;
        }
        bool right = M("rfind") || M("rindex");
        const char *h = !ok ? NULL
                        : right ? rfind_bytes(self->u.s.p + from, to - from, sub->u.s.p, sub->u.s.n)
                                : find_bytes(self->u.s.p + from, to - from, sub->u.s.p, sub->u.s.n);
        if (!h && (M("index") || M("rindex"))) return rfail(r, at, "%s: substring not found", what);
        return *out = v_int(h ? (long long)cp_count(self->u.s.p, (size_t)(h - self->u.s.p)) : -1), 0;
    }
    if (M("join")) {
        BIND("iterable");
        if (!have[0]) return rfail(r, at, "%s takes exactly one argument", what);
        const jlist *items;
        if (iterate(r, at, &slot[0], &items)) return -1;
        sbuf b = {0};
        for (size_t i = 0; i < items->n; i++) {
            const jv *x = &items->v[i];
            if (x->k != V_STR)
                return rfail(r, at, "%s: sequence item %zu: expected str instance, %s found", what, i, type_name(x));
            if ((i && sb_put(r, &b, self->u.s.p, self->u.s.n)) || sb_put(r, &b, x->u.s.p, x->u.s.n)) return -1;
        }
        return *out = sb_value(&b), 0;
    }
    if (M("format")) return str_format(r, at, self, a, out);
    if (M("removeprefix") || M("removesuffix")) {
        BIND("affix");
        if (!have[0]) return rfail(r, at, "%s takes exactly one argument", what);
        if (want_str(r, at, what, "its argument", &slot[0])) return -1;
        size_t k = slot[0].u.s.n, n = self->u.s.n;
        bool pre = M("removeprefix");
        if (k <= n && !memcmp(self->u.s.p + (pre ? 0 : n - k), slot[0].u.s.p, k))
            return *out = v_str(self->u.s.p + (pre ? k : 0), n - k), 0;
        return *out = *self, 0;
    }
    if (M("isdigit") || M("isdecimal") || M("isnumeric") || M("isalpha") || M("isalnum") || M("isspace") ||
        M("islower") || M("isupper")) {
        if (bind(r, at, what, a, none, slot, have)) return -1;
        bool all = self->u.s.n > 0, lower = M("islower"), upper = M("isupper"), any = false;
        for (size_t i = 0; i < self->u.s.n;) {
            size_t len;
            uint32_t c = cp_at(self->u.s.p + i, self->u.s.n - i, &len);
            if (lower || upper) {
                if (lower ? cp_islower(c) : cp_isupper(c)) any = true;
                else if (cp_iscased(c)) all = false;
            } else {
                bool ok = M("isdigit") || M("isdecimal") ? cp_isdigit(c)
                          : M("isnumeric")              ? cp_isnumeric(c)
                          : M("isalpha")                ? cp_isalpha(c)
                          : M("isalnum")                ? cp_isalpha(c) || cp_isnumeric(c)
                                                        : py_isspace(c);
                all = all && ok;
            }
            i += len;
        }
        return *out = v_bool((lower || upper) ? any && all : all), 0;
    }
#undef BIND
#undef M
    return rfail(r, at, "str method '%.*s' is not supported", (int)nlen, name);
}

static int call_method(rctx *r, const node *at, const jmethod *m, const args *a, jv *out)
{
    const jv *self = &m->self;
    const char *name = m->name;
    size_t n = m->len;
    char what[48];
    jv slot[3];
    bool have[3];
    static const char *const none[] = {NULL};
    if (self->k == V_STR) return str_method(r, at, self, name, n, a, out);
    snprintf(what, sizeof what, "%s.%.*s()", type_name(self), (int)n, name);
    if (self->k == V_DICT) {
        const jdict *d = self->u.d;
        if (same(name, n, "get")) {
            static const char *const names[] = {"key", "default", NULL};
            if (bind(r, at, what, a, names, slot, have)) return -1;
            if (!have[0]) return rfail(r, at, "%s takes at least 1 argument", what);
            long i = hashable(&slot[0]) ? dict_find(d, &slot[0]) : -1;
            *out = i >= 0 ? d->v[i] : have[1] ? slot[1] : v_none();
            return 0;
        }
        if (same(name, n, "items") || same(name, n, "keys") || same(name, n, "values")) {
            int id = same(name, n, "items") ? F_ITEMS : same(name, n, "keys") ? F_KEYS : F_VALUES;
            if (bind(r, at, what, a, none, slot, have) ||
                filter_apply(r, at, id, name[0] == 'i' ? "items" : name[0] == 'k' ? "keys" : "values", self, a, out))
                return -1;
            out->u.l->lazy = EAGER;
            return 0;
        }
        if (same(name, n, "copy")) {
            if (bind(r, at, what, a, none, slot, have)) return -1;
            jdict *c = new_dict(r);
            if (!c) return -1;
            for (size_t i = 0; i < d->n; i++)
                if (dict_set(r, c, d->k[i], d->v[i])) return -1;
            return *out = v_dict(c, V_DICT), 0;
        }
    } else if (self->k == V_LIST) {
        const jlist *l = self->u.l;
        if (same(name, n, "count") || same(name, n, "index")) {
            static const char *const names[] = {"value", NULL};
            if (bind(r, at, what, a, names, slot, have)) return -1;
            if (!have[0]) return rfail(r, at, "%s takes exactly one argument", what);
            long long k = 0;
            for (size_t i = 0; i < l->n; i++) {
                if (!py_eq(&l->v[i], &slot[0], 0)) continue;
                if (same(name, n, "index")) return *out = v_int((long long)i), 0;
                k++;
            }
            if (same(name, n, "index")) return rfail(r, at, "%s: the value is not in the %s", what, type_name(self));
            return *out = v_int(k), 0;
        }
        if (same(name, n, "copy")) {
            if (bind(r, at, what, a, none, slot, have)) return -1;
            jlist *c = new_list(r, l->n, false);
            if (!c) return -1;
            for (size_t i = 0; i < l->n; i++) c->v[c->n++] = l->v[i];
            return *out = v_list(c), 0;
        }
    } else if (self->k == V_LOOP && same(name, n, "cycle")) {
        if (no_kwargs(r, at, what, a)) return -1;
        if (!a->npos) return rfail(r, at, "loop.cycle(): no items for cycling given");
        return *out = a->pos[self->u.loop->index0 % a->npos], 0;
    }
    static const char *const mutating[] = {"append", "clear", "extend", "insert", "pop", "popitem", "remove",
                                           "reverse", "setdefault", "sort", "update", NULL};
    if (in_names(mutating, name, n))
        return rfail(r, at, "%s method '%.*s' is not supported: values cannot be changed in a chat template",
                     type_name(self), (int)n, name);
    return rfail(r, at, "%s method '%.*s' is not supported", type_name(self), (int)n, name);
}

/* ---- global functions ---------------------------------------------------------------------------------- */

static int call_strftime(rctx *r, const node *at, const jv *fmt, jv *out)
{
    if (fmt->k != V_STR) return rfail(r, at, "strftime_now(): the format must be a string, not %s", type_name(fmt));
    time_t t = (time_t)r->now;
    struct tm tm;
    if ((long long)t != r->now || !gmtime_r(&t, &tm)) return rfail(r, at, "strftime_now(): the time is out of range");
    /* What Python's datetime does itself before the C library's strftime:
     * %f (microseconds) and, for the naive datetime transformers makes, %z
     * and %Z (empty). */
    sbuf f = {0};
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '%' && i + 1 < n) {
            char c = p[i + 1];
            if (c == 'f') {
                if (sb_lit(r, &f, "000000")) return -1;
                i++;
                continue;
            }
            if (c == 'z' || c == 'Z') {
                i++;
                continue;
            }
            if (c == ':' && i + 2 < n && p[i + 2] == 'z') {
                i += 2;
                continue;
            }
            if (sb_put(r, &f, p + i, 2)) return -1;
            i++;
            continue;
        }
        if (p[i] == '\0') return rfail(r, at, "strftime_now(): embedded null character");
        if (sb_put(r, &f, p + i, 1)) return -1;
    }
    if (sb_put(r, &f, "", 1)) return -1;
    if (f.n == 1) return *out = V_LIT(""), 0;
    locale_t c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); /* English names, whatever the process' locale */
    if (c_locale == (locale_t)0) return oom(r);
    for (size_t cap = 256; cap <= 65536; cap *= 4) {
        char *buf = ralloc(r, cap);
        if (!buf) break;
        size_t k = strftime_l(buf, cap, f.p, &tm, c_locale);
        if (k) {
            freelocale(c_locale);
            return *out = v_str(buf, k), 0;
        }
    }
    freelocale(c_locale);
    if (r->err.set) return -1;
    return *out = V_LIT(""), 0; /* a format that makes nothing (strftime cannot tell it from no room) */
}

static int dict_from(rctx *r, const node *at, const char *what, const args *a, int kind, jv *out)
{
    if (a->npos > 1) return rfail(r, at, "%s expected at most 1 argument, got %zu", what, a->npos);
    jdict *d = new_dict(r);
    if (!d) return -1;
    if (a->npos) {
        const jv *src = &a->pos[0];
        if (src->k == V_DICT || src->k == V_NS) {
            for (size_t i = 0; i < src->u.d->n; i++)
                if (dict_set(r, d, src->u.d->k[i], src->u.d->v[i])) return -1;
        } else if (src->k == V_LIST) {
            for (size_t i = 0; i < src->u.l->n; i++) {
                const jv *pair = &src->u.l->v[i];
                const jlist *kv;
                if (pair->k != V_LIST && pair->k != V_STR) return rfail(r, at, "%s: item %zu is not a pair", what, i);
                if (iterate(r, at, pair, &kv)) return -1;
                if (kv->n != 2) return rfail(r, at, "%s: item %zu has length %zu; 2 is required", what, i, kv->n);
                if (!hashable(&kv->v[0])) return rfail(r, at, "unhashable type: '%s'", type_name(&kv->v[0]));
                if (dict_set(r, d, kv->v[0], kv->v[1])) return -1;
            }
        } else {
            return rfail(r, at, "%s: '%s' object is not iterable", what, type_name(src));
        }
    }
    for (size_t i = 0; i < a->nkw; i++)
        if (dict_set(r, d, v_str(a->kw[i]->s, a->kw[i]->slen), a->kwv[i])) return -1;
    *out = v_dict(d, kind);
    return 0;
}

static int call_global(rctx *r, const node *at, int fn, const args *a, jv *out)
{
    switch (fn) {
    case G_RANGE: {
        if (no_kwargs(r, at, "range()", a)) return -1;
        if (a->npos < 1 || a->npos > 3) return rfail(r, at, "range() takes 1 to 3 arguments (%zu given)", a->npos);
        long long v[3];
        for (size_t i = 0; i < a->npos; i++) {
            if (a->pos[i].k != V_INT && a->pos[i].k != V_BOOL)
                return rfail(r, at, "range(): '%s' object cannot be interpreted as an integer", type_name(&a->pos[i]));
            v[i] = num_i(&a->pos[i]);
        }
        long long start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], step = a->npos == 3 ? v[2] : 1;
        if (step == 0) return rfail(r, at, "range() arg 3 must not be zero");
        double count = step > 0 ? (stop > start ? ceil(((double)stop - (double)start) / (double)step) : 0)
                                : (stop < start ? ceil(((double)start - (double)stop) / (double)-step) : 0);
        if (count > MAX_RANGE) return rfail(r, at, "range too big: the sandbox allows at most %d items", MAX_RANGE);
        jlist *l = new_list(r, (size_t)count, false);
        if (!l) return -1;
        for (long long x = start; step > 0 ? x < stop : x > stop; x += step) {
            l->v[l->n++] = v_int(x);
            if (l->n == (size_t)count) break;
        }
        return *out = v_list(l), 0;
    }
    case G_DICT: return dict_from(r, at, "dict()", a, V_DICT, out);
    case G_NAMESPACE: return dict_from(r, at, "namespace()", a, V_NS, out);
    case G_RAISE: {
        jv msg = V_LIT("");
        if (a->npos && to_str(r, &a->pos[0], &msg)) return -1;
        return err_set(&r->err, 0, 0, "raise_exception: %.*s", (int)(msg.u.s.n < 4000 ? msg.u.s.n : 4000), msg.u.s.p);
    }
    default: {
        static const char *const names[] = {"format", NULL};
        jv fmt;
        bool have;
        if (bind(r, at, "strftime_now()", a, names, &fmt, &have)) return -1;
        if (!have) return rfail(r, at, "strftime_now() takes exactly one argument");
        return call_strftime(r, at, &fmt, out);
    }
    }
}

/* ---- expressions -------------------------------------------------------------------------------------- */

static int exec_body(rctx *r, scope *sc, node *const *body, size_t n);

/* Renders a body into a string of its own: a macro's, a block set's. */
static int capture(rctx *r, scope *sc, node *const *body, size_t n, jv *out)
{
    sbuf buf = {0}, *saved = r->out;
    r->out = &buf;
    int rc = exec_body(r, sc, body, n);
    r->out = saved;
    if (rc < 0) return -1;
    *out = sb_value(&buf);
    return 0;
}

static int call_macro(rctx *r, const node *at, const jmacro *m, const args *a, jv *out)
{
    const node *def = m->def;
    int name_len = (int)def->slen;
    if (r->calls >= MAX_CALLS) return rfail(r, at, "macro calls nest deeper than %d", MAX_CALLS);
    size_t np = def->nkids;
    if (a->npos > np) return rfail(r, at, "macro '%.*s' takes not more than %zu argument(s)", name_len, def->s, np);
    scope *ms = new_scope(r, m->closure);
    jv *vals = ralloc(r, (np ? np : 1) * sizeof *vals);
    bool *have = ralloc(r, np ? np : 1);
    if (!ms || !vals || !have) return -1;
    for (size_t i = 0; i < np; i++) have[i] = i < a->npos, vals[i] = i < a->npos ? a->pos[i] : v_none();
    for (size_t k = 0; k < a->nkw; k++) {
        const node *kw = a->kw[k];
        size_t i = 0;
        while (i < np && !(def->kids[i]->slen == kw->slen && !memcmp(def->kids[i]->s, kw->s, kw->slen))) i++;
        if (i == np)
            return rfail(r, at, "macro '%.*s' takes no keyword argument '%.*s'", name_len, def->s, (int)kw->slen, kw->s);
        if (have[i])
            return rfail(r, at, "macro '%.*s' got multiple values for argument '%.*s'", name_len, def->s, (int)kw->slen, kw->s);
        vals[i] = a->kwv[k];
        have[i] = true;
    }
    for (size_t i = 0; i < np; i++)
        if (have[i] && scope_set(r, ms, def->kids[i]->s, def->kids[i]->slen, vals[i])) return -1;
    /* defaults are evaluated in the macro's scope, where the arguments given are already bound */
    for (size_t i = 0; i < np; i++) {
        if (have[i]) continue;
        const node *p = def->kids[i];
        jv x = v_undef(p->s, p->slen);
        if ((p->a && eval(r, ms, p->a, &x)) || scope_set(r, ms, p->s, p->slen, x)) return -1;
    }
    r->calls++;
    int rc = capture(r, ms, def->kids2, def->nkids2, out);
    r->calls--;
    return rc;
}

static int call_value(rctx *r, const node *at, const jv *f, const args *a, jv *out)
{
    switch (f->k) {
    case V_MACRO: return call_macro(r, at, f->u.m, a, out);
    case V_FUNC: return call_global(r, at, f->u.fn, a, out);
    case V_METHOD: return call_method(r, at, f->u.bm, a, out);
    case V_UNDEF: return undefined_fail(r, at, f);
    default: return rfail(r, at, "'%s' object is not callable", type_name(f));
    }
}

static int eval_call(rctx *r, scope *sc, const node *e, jv *out)
{
    const node *c = e->a;
    jv f;
    if (c->kind == N_GETATTR) { /* a method: say so when the object has none of that name */
        jv obj;
        if (eval(r, sc, c->a, &obj) || get_attr(r, &obj, c->s, c->slen, &f)) return -1;
        if (f.k == V_UNDEF && obj.k != V_UNDEF && obj.k != V_DICT && obj.k != V_NS)
            return rfail(r, c, "%s has no method '%.*s'", type_name(&obj), (int)c->slen, c->s);
    } else if (eval(r, sc, c, &f)) {
        return -1;
    }
    args a;
    if (eval_args(r, sc, e->kids, e->nkids, &a)) return -1;
    return call_value(r, e, &f, &a, out);
}

static int eval(rctx *r, scope *sc, const node *e, jv *out)
{
    switch (e->kind) {
    case N_CONST:
        switch (e->op) {
        case C_NONE: *out = v_none(); break;
        case C_TRUE: *out = v_bool(true); break;
        case C_FALSE: *out = v_bool(false); break;
        case C_INT: *out = v_int(e->i); break;
        case C_FLOAT: *out = v_float(e->f); break;
        default: *out = v_str(e->s, e->slen);
        }
        return 0;
    case N_NAME: {
        jv *v = scope_find(sc, e->s, e->slen);
        if (v) return *out = *v, 0;
        int g = lookup(GLOBALS, sizeof GLOBALS / sizeof GLOBALS[0], e->s, e->slen);
        if (g >= 0) return out->k = V_FUNC, out->u.fn = g, 0;
        return *out = v_undef(e->s, e->slen), 0;
    }
    case N_LIST:
    case N_TUPLE: {
        jlist *l = new_list(r, e->nkids, e->kind == N_TUPLE);
        if (!l) return -1;
        for (size_t i = 0; i < e->nkids; i++)
            if (eval(r, sc, e->kids[i], &l->v[l->n++])) return -1;
        return *out = v_list(l), 0;
    }
    case N_DICT: {
        jdict *d = new_dict(r);
        if (!d) return -1;
        for (size_t i = 0; i < e->nkids; i++) {
            jv k, v;
            if (eval(r, sc, e->kids[i], &k) || eval(r, sc, e->kids2[i], &v)) return -1;
            if (!hashable(&k)) return rfail(r, e->kids[i], "unhashable type: '%s'", type_name(&k));
            if (dict_set(r, d, k, v)) return -1;
        }
        return *out = v_dict(d, V_DICT), 0;
    }
    case N_GETATTR: {
        jv obj;
        return eval(r, sc, e->a, &obj) || get_attr(r, &obj, e->s, e->slen, out);
    }
    case N_GETITEM: {
        jv obj, key;
        return eval(r, sc, e->a, &obj) || eval(r, sc, e->b, &key) || get_item(r, &obj, &key, out);
    }
    case N_SLICE: return eval_slice(r, sc, e, out);
    case N_CALL: return eval_call(r, sc, e, out);
    case N_FILTER: {
        jv v;
        args a;
        if (eval(r, sc, e->a, &v) || eval_args(r, sc, e->kids, e->nkids, &a)) return -1;
        char name[48];
        snprintf(name, sizeof name, "%.*s", (int)(e->slen < 40 ? e->slen : 40), e->s);
        return filter_apply(r, e, e->id, name, &v, &a, out);
    }
    case N_TEST: {
        jv v;
        args a;
        bool res;
        if (eval(r, sc, e->a, &v) || eval_args(r, sc, e->kids, e->nkids, &a)) return -1;
        char name[48];
        snprintf(name, sizeof name, "%.*s", (int)(e->slen < 40 ? e->slen : 40), e->s);
        if (test_apply(r, e, e->id, name, &v, &a, &res)) return -1;
        return *out = v_bool(e->op ? !res : res), 0;
    }
    case N_NOT: {
        jv v;
        if (eval(r, sc, e->a, &v)) return -1;
        return *out = v_bool(!truthy(&v)), 0;
    }
    case N_NEG:
    case N_POS: {
        jv v;
        if (eval(r, sc, e->a, &v)) return -1;
        if (v.k == V_UNDEF) return undefined_fail(r, e, &v);
        if (v.k == V_FLOAT) return *out = v_float(e->kind == N_NEG ? -v.u.f : v.u.f), 0;
        if (v.k == V_INT || v.k == V_BOOL) {
            long long i = num_i(&v);
            if (e->kind == N_NEG && i == LLONG_MIN) return int_overflow(r, e);
            return *out = v_int(e->kind == N_NEG ? -i : i), 0;
        }
        return rfail(r, e, "bad operand type for unary %c: '%s'", e->kind == N_NEG ? '-' : '+', type_name(&v));
    }
    case N_BIN: {
        jv a, b;
        return eval(r, sc, e->a, &a) || eval(r, sc, e->b, &b) || binop(r, e, e->op, &a, &b, out);
    }
    case N_AND:
    case N_OR: { /* the deciding operand itself, as Python's and / or */
        if (eval(r, sc, e->a, out)) return -1;
        if (truthy(out) == (e->kind == N_OR)) return 0;
        return eval(r, sc, e->b, out);
    }
    case N_CMP: {
        jv left, right;
        if (eval(r, sc, e->a, &left)) return -1;
        for (size_t i = 0; i < e->nkids; i++) {
            bool res;
            if (eval(r, sc, e->kids[i], &right) || compare(r, e, e->ops[i], &left, &right, &res)) return -1;
            if (!res) return *out = v_bool(false), 0;
            left = right;
        }
        return *out = v_bool(true), 0;
    }
    case N_COND: {
        jv t;
        if (eval(r, sc, e->a, &t)) return -1;
        if (truthy(&t)) return eval(r, sc, e->b, out);
        if (e->c) return eval(r, sc, e->c, out);
        return *out = v_undef(NULL, 0), 0;
    }
    case N_BLOCKVAL:
        return *out = r->blockval, 0;
    default:
        return rfail(r, e, "this expression cannot be evaluated here");
    }
}

/* ---- statements ------------------------------------------------------------------------------------- */

enum { RC_OK = 0, RC_BREAK = 1, RC_CONTINUE = 2 };

static int emit(rctx *r, const jv *v)
{
    if (v->k == V_STR) return sb_put(r, r->out, v->u.s.p, v->u.s.n);
    return put_value(r, r->out, v, false, 0);
}

/* The filters of a filter block or a block set, on its rendered body. */
static int filter_body(rctx *r, scope *sc, const node *filters, const jv *body, jv *out)
{
    jv saved = r->blockval;
    r->blockval = *body;
    int rc = eval(r, sc, filters, out);
    r->blockval = saved;
    return rc;
}

static int exec_for(rctx *r, scope *sc, const node *st)
{
    jv it;
    const jlist *items;
    if (eval(r, sc, st->b, &it) || iterate(r, st->b, &it, &items)) return -1;
    if (st->c) { /* the loop's if: only the items it keeps count, for loop.length too */
        jlist *kept = new_list(r, items->n, false);
        if (!kept) return -1;
        for (size_t i = 0; i < items->n; i++) {
            scope *fs = new_scope(r, sc);
            jv keep;
            if (!fs || assign(r, fs, st->a, &items->v[i]) || eval(r, fs, st->c, &keep)) return -1;
            if (truthy(&keep)) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    /* Jinja2 runs the else block when no iteration reached the end of the
     * body: with no items, and also when each one broke or continued. */
    bool completed = false;
    for (size_t i = 0; i < items->n; i++) {
        scope *is = new_scope(r, sc);
        jloop *L = ralloc(r, sizeof *L);
        if (!is || !L) return -1;
        L->index0 = i;
        L->items = items;
        jv lv = {.k = V_LOOP, .u.loop = L};
        if (scope_set(r, is, "loop", 4, lv) || assign(r, is, st->a, &items->v[i])) return -1;
        int rc = exec_body(r, is, st->kids, st->nkids);
        if (rc < 0) return -1;
        if (rc == RC_BREAK) break;
        completed = completed || rc == RC_OK;
    }
    if (!completed && st->nkids2) {
        scope *es = new_scope(r, sc);
        return es ? exec_body(r, es, st->kids2, st->nkids2) : -1; /* a break there is the outer loop's */
    }
    return RC_OK;
}

static int exec_stmt(rctx *r, scope *sc, const node *st)
{
    switch (st->kind) {
    case N_TEXT: return sb_put(r, r->out, st->s, st->slen) ? -1 : RC_OK;
    case N_OUTPUT:
        for (size_t i = 0; i < st->nkids; i++) {
            jv v;
            if (eval(r, sc, st->kids[i], &v) || emit(r, &v)) return -1;
        }
        return RC_OK;
    case N_IF: {
        jv t;
        if (eval(r, sc, st->a, &t)) return -1;
        return truthy(&t) ? exec_body(r, sc, st->kids, st->nkids) : exec_body(r, sc, st->kids2, st->nkids2);
    }
    case N_FOR: return exec_for(r, sc, st);
    case N_SET: {
        jv v;
        return eval(r, sc, st->b, &v) || assign(r, sc, st->a, &v) ? -1 : RC_OK;
    }
    case N_SETBLOCK: {
        jv v;
        if (capture(r, sc, st->kids, st->nkids, &v) || (st->c && filter_body(r, sc, st->c, &v, &v))) return -1;
        return assign(r, sc, st->a, &v) ? -1 : RC_OK;
    }
    case N_FILTERBLOCK: {
        jv v;
        return capture(r, sc, st->kids, st->nkids, &v) || filter_body(r, sc, st->c, &v, &v) || emit(r, &v) ? -1 : RC_OK;
    }
    case N_MACRO: {
        jmacro *m = ralloc(r, sizeof *m);
        if (!m) return -1;
        m->def = st;
        m->closure = sc;
        jv v = {.k = V_MACRO, .u.m = m};
        return scope_set(r, sc, st->s, st->slen, v) ? -1 : RC_OK;
    }
    case N_WITH: {
        scope *ws = new_scope(r, sc);
        if (!ws) return -1;
        jv *vals = ralloc(r, (st->nkids ? st->nkids : 1) * sizeof *vals);
        if (!vals) return -1;
        for (size_t i = 0; i < st->nkids; i++) /* all values first, in the outer scope */
            if (eval(r, sc, st->kids[i]->b, &vals[i])) return -1;
        for (size_t i = 0; i < st->nkids; i++)
            if (assign(r, ws, st->kids[i]->a, &vals[i])) return -1;
        return exec_body(r, ws, st->kids2, st->nkids2);
    }
    case N_GENERATION: {
        size_t start = r->out->n;
        int rc = exec_body(r, sc, st->kids, st->nkids);
        if (rc < 0) return -1;
        if (r->nspans + 2 > r->capspans) {
            size_t cap = r->capspans ? r->capspans * 2 : 16;
            size_t *s = arena_grow(&r->ar, r->spans, r->capspans * sizeof *s, cap * sizeof *s);
            if (!s) return oom(r);
            r->spans = s;
            r->capspans = cap;
        }
        r->spans[r->nspans++] = start;
        r->spans[r->nspans++] = r->out->n;
        return rc;
    }
    case N_BREAK: return RC_BREAK;
    case N_CONTINUE: return RC_CONTINUE;
    default: return rfail(r, st, "this statement cannot run here");
    }
}

static int exec_body(rctx *r, scope *sc, node *const *body, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = exec_stmt(r, sc, body[i]);
        if (rc) return rc;
    }
    return RC_OK;
}

/* ---- the API ------------------------------------------------------------------------------------------ */

mt_jinja *mt_jinja_parse(const char *src, size_t len, char *why, size_t why_len)
{
    errbuf err = {why, why_len, false};
    if (why && why_len) why[0] = '\0';
    if (!src && len) return err_set(&err, 0, 0, "no template"), NULL;
    mt_jinja *t = calloc(1, sizeof *t);
    if (!t) return err_set(&err, 0, 0, "out of memory"), NULL;
    lexer L = {.ar = &t->ar, .err = &err};
    parser P = {.ar = &t->ar, .err = &err};
    /* newlines read as \n, and the one that ends the template dropped, as Jinja2 does */
    char *s = arena_alloc(&t->ar, len + 1);
    if (!s) goto oom;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = '\0';
    L.s = s;
    L.n = n;
    L.nlines = 1;
    for (size_t i = 0; i < n; i++) L.nlines += s[i] == '\n';
    if (!(L.lines = malloc(L.nlines * sizeof *L.lines))) goto oom;
    L.lines[0] = 0;
    for (size_t i = 0, k = 1; i < n; i++)
        if (s[i] == '\n') L.lines[k++] = i + 1;
    size_t bad = mt_utf8_check(s, n);
    if (bad < n) {
        lex_fail(&L, bad, "the template is not valid UTF-8");
        goto fail;
    }
    if (lex(&L)) goto fail;
    P.t = L.t;
    nlist body = {0};
    if (parse_body(&P, NULL, NULL, &body)) goto fail;
    t->body = body.v;
    t->nbody = body.n;
    t->generation = P.generation;
    free(L.t);
    free(L.lines);
    return t;
oom:
    err_set(&err, 0, 0, "out of memory");
fail:
    free(L.t);
    free(L.lines);
    mt_jinja_free(t);
    return NULL;
}

int mt_jinja_has_generation(const mt_jinja *t) { return t && t->generation; }

void mt_jinja_free(mt_jinja *t)
{
    if (!t) return;
    arena_free(&t->ar);
    free(t);
}

static int render(const mt_jinja *t, const cJSON *ctx, long long now_unix, char **out, size_t *out_len,
                  size_t **spans, size_t *n_spans, char *why, size_t why_len)
{
    rctx R = {.err = {why, why_len, false}, .now = now_unix};
    rctx *r = &R;
    sbuf result = {.heap = true}; /* room for the NUL: sb_put's realloc adds a byte */
    int rc = -1;
    *out = NULL;
    if (out_len) *out_len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    if (why && why_len) why[0] = '\0';
    if (!t) {
        err_set(&r->err, 0, 0, "no template");
        return -1;
    }
    if (ctx && !cJSON_IsObject(ctx)) {
        err_set(&r->err, 0, 0, "the context must be a JSON object");
        return -1;
    }
    scope *root = new_scope(r, NULL);
    if (!root) goto done;
    if (ctx)
        for (const cJSON *c = ctx->child; c; c = c->next) {
            jv v;
            if (!c->string) continue;
            if (from_json(r, c, &v, 0) || scope_set(r, root, c->string, strlen(c->string), v)) goto done;
        }
    r->out = &result;
    if (exec_body(r, root, t->body, t->nbody) < 0) goto done;
    size_t *sp = NULL;
    if ((!result.p && !(result.p = malloc(1))) || (spans && r->nspans && !(sp = malloc(r->nspans * sizeof *sp)))) {
        oom(r);
        goto done;
    }
    result.p[result.n] = '\0';
    *out = result.p;
    result.p = NULL;
    if (out_len) *out_len = result.n;
    if (sp) memcpy(sp, r->spans, r->nspans * sizeof *sp);
    if (spans) *spans = sp;
    if (n_spans) *n_spans = r->nspans / 2;
    rc = 0;
done:
    free(result.p);
    arena_free(&r->ar);
    return rc;
}

char *mt_jinja_render(const mt_jinja *t, const cJSON *ctx, long long now_unix, size_t *out_len, char *why,
                      size_t why_len)
{
    char *out;
    return render(t, ctx, now_unix, &out, out_len, NULL, NULL, why, why_len) ? NULL : out;
}

int mt_jinja_render_spans(const mt_jinja *t, const cJSON *ctx, long long now_unix, char **out, size_t *out_len,
                          size_t **spans, size_t *n_spans, char *why, size_t why_len)
{
    char *tmp;
    if (!out) out = &tmp;
    int rc = render(t, ctx, now_unix, out, out_len, spans, n_spans, why, why_len);
    if (!rc && out == &tmp) free(tmp);
    return rc;
}
