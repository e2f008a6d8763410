# Sourced by tests/cli.sh: from text to a fine-tuned model. The demo's data
# and tokenizer (sft-data), prepare and its loss mask, training a new model
# with a tokenizer, sample and eval with text, the tokenizer saved with the
# model. Uses cli.sh's $BIN, $dir, ok, bad, expect and has.

t="$dir/sft"
expect "sft-data" 0 "$BIN" sft-data "$t/data" --conversations 200 --heldout 20
has "sft-data" "byte-level BPE"
[ -f "$t/data/tokenizer.json" ] && [ -f "$t/data/tokenizer_config.json" ] && ok || bad "sft-data: no tokenizer"
[ "$(wc -l < "$t/data/train.jsonl")" -eq 200 ] && ok || bad "sft-data: train.jsonl"

# the mask: only what the assistant's turns add to the template's rendering is learnt (content, <|im_end|> and
# the newline the template puts after it)
expect "prepare" 0 "$BIN" prepare --tokenizer "$t/data" -o "$t/train.mt" --show 1 "$t/data/train.jsonl"
has "prepare" "200 documents"
has "prepare" "chat template of the tokenizer folder"
python3 - "$dir/out" "$t/data/train.jsonl" <<'PY' && ok || bad "prepare --show: the learnt spans"
import json, re, sys
out = open(sys.argv[1]).read()
doc = out.split("--- document 1:")[1].split("\n", 1)[1]
learnt = re.findall(r"\[\[(.*?)\]\]", doc, re.S)
first = json.loads(open(sys.argv[2]).readline())
want = [m["content"] + "<|im_end|>\n" for m in first["messages"] if m["role"] == "assistant"]
assert learnt == want, (learnt, want)
assert re.sub(r"\[\[|\]\]", "", doc).startswith("<|im_start|>user\n" + first["messages"][0]["content"] + "<|im_end|>\n")
PY
printf '%s\n' '{"prompt": "Q: 2+2", "completion": " 4"}' '{"text": "plain"}' '' > "$t/mixed.jsonl"
expect "prepare: prompt/completion and text" 0 "$BIN" prepare --tokenizer "$t/data/tokenizer.json" -o "$t/mixed.mt" --show 2 "$t/mixed.jsonl"
has "prepare: completion" "Q: 2+2\[\[ 4<|endoftext|>\]\]"
has "prepare: text" "\[\[plain<|endoftext|>\]\]"
# the file the library's writer made: the layout of docs/data.md, with the
# documents, tokens and learnt tokens prepare reported
python3 - "$t/mixed.mt" "$dir/out" <<'PY' && ok || bad "prepare: the document file's layout"
import re, struct, sys
b = open(sys.argv[1], "rb").read()
out = open(sys.argv[2]).read()
magic, version, width, n, d, vocab, flags = struct.unpack_from("<8sIIQQII", b)
assert (magic, version, width, flags) == (b"MTTOKENS", 1, 2, 1) and not any(b[40:64]), b[:64]
docs, toks, learnt, v = map(int, re.search(r"(\d+) documents, (\d+) tokens, (\d+) of them learnt .*vocabulary (\d+)", out).groups())
assert (d, n, vocab) == (docs, toks, v), (d, n, vocab)
tok_end = 64 + (n * width + 7) // 8 * 8
ends = struct.unpack_from("<%dQ" % d, b, tok_end)
lens = [int(x) for x in re.findall(r"--- document \d+: (\d+) tokens", out)]
assert [e - s for s, e in zip((0,) + ends, ends)] == lens, (ends, lens)
mask = b[tok_end + 8 * d:]
assert len(mask) == (n + 7) // 8 and sum(bin(x).count("1") for x in mask) == learnt
PY
printf '%s\n' '{"prompt": "x", "completion": " y"}' '{"messages": [{"role": "robot", "content": "hi"}]}' > "$t/bad.jsonl"
expect "prepare: no assistant turn" 1 "$BIN" prepare --tokenizer "$t/data" -o "$t/bad.mt" "$t/bad.jsonl"
has "prepare: no assistant turn" "bad.jsonl:2: the conversation has no assistant turn"
[ ! -e "$t/bad.mt" ] && [ ! -e "$t/bad.mt.tmp" ] && ok || bad "prepare: a refused input left a file"
printf '%s\n' '{"messages": [' > "$t/broken.jsonl"
expect "prepare: broken JSON" 1 "$BIN" prepare --tokenizer "$t/data" -o "$t/bad.mt" "$t/broken.jsonl"
has "prepare: broken JSON" "broken.jsonl:1: not a JSON object"
mkdir -p "$t/bare" && cp "$t/data/tokenizer.json" "$t/bare/"
expect "prepare: no chat template" 1 "$BIN" prepare --tokenizer "$t/bare" -o "$t/bad.mt" "$t/data/train.jsonl"
has "prepare: no chat template" "train.jsonl:1: folder .*bare has no chat template .*give --chat-template"
expect "prepare: a named template" 0 "$BIN" prepare --tokenizer "$t/bare" --chat-template chatml --eos "<|endoftext|>" -o "$t/named.mt" "$t/data/train.jsonl"
cmp -s "$t/named.mt" "$t/train.mt" && ok || bad "prepare: the built-in chatml differs from the folder's template"
printf '%s\n' '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}' > "$t/one.jsonl"
expect "prepare: a bad template" 1 "$BIN" prepare --tokenizer "$t/bare" --chat-template "$t/data/train.jsonl" -o "$t/bad.mt" "$t/one.jsonl"
expect "prepare: bad --chat-vars" 1 "$BIN" prepare --tokenizer "$t/data" --chat-vars '[1]' -o "$t/bad.mt" "$t/one.jsonl"
has "prepare: bad --chat-vars" "chat-vars is not a JSON object"

# a new model with the tokenizer, a few steps; the folder carries the tokenizer
small="--layers 1 --hidden 32 --heads 2 --ffn 64 --seq-len 160 --micro-batch 4 --steps 3 --cpu --threads 1"
expect "train on a document file" 0 "$BIN" train --data "$t/train.mt" --tokenizer "$t/data" $small --out "$t/model"
has "train on a document file" "200 documents, one to a window"
has "train on a document file" "of the training positions are padding"
cmp -s "$t/data/tokenizer.json" "$t/model/tokenizer.json" && cmp -s "$t/data/tokenizer_config.json" "$t/model/tokenizer_config.json" &&
  ok || bad "the tokenizer was not saved with the new model"
python3 - "$t/data/tokenizer.json" "$t/model/config.json" <<'PY' && ok || bad "the vocabulary is not the tokenizer's"
import json, sys
t = json.load(open(sys.argv[1]))
ids = [*t["model"]["vocab"].values(), *(a["id"] for a in t["added_tokens"])]
assert json.load(open(sys.argv[2]))["vocab_size"] == max(ids) + 1
PY
# fine-tuning that folder: mt_model_save carries its tokenizer along
expect "fine-tune the folder" 0 "$BIN" train --model "$t/model" --data "$t/train.mt" --seq-len 160 --micro-batch 4 \
  --steps 2 --cpu --threads 1 --out "$t/tuned"
cmp -s "$t/data/tokenizer.json" "$t/tuned/tokenizer.json" && ok || bad "the tokenizer did not follow the model"

# a folder whose template is its own file (chat_template.jinja, as transformers saves it): prepare reads it, and
# train --tokenizer carries it to the new model, whose sample --chat then renders with it
printf '%s' "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}" > "$t/bare/chat_template.jinja"
expect "prepare: chat_template.jinja" 0 "$BIN" prepare --tokenizer "$t/bare" --eos "<|endoftext|>" -o "$t/jinja.mt" "$t/data/train.jsonl"
cmp -s "$t/jinja.mt" "$t/train.mt" && ok || bad "prepare: chat_template.jinja renders otherwise than the config's template"
expect "train: a tokenizer with chat_template.jinja" 0 "$BIN" train --data "$t/jinja.mt" --tokenizer "$t/bare" $small --steps 1 --out "$t/jinja-model"
cmp -s "$t/bare/chat_template.jinja" "$t/jinja-model/chat_template.jinja" && ok || bad "chat_template.jinja did not follow the model"
expect "sample --chat with chat_template.jinja" 0 "$BIN" sample --model "$t/jinja-model" --chat --max-new 2 --cpu "hi"

# text in, text out
expect "sample --chat" 0 "$BIN" sample --model "$t/tuned" --chat --max-new 8 --cpu "Ann has 12 pens and gets 30 more. How many now?"
expect "sample, sampled" 0 "$BIN" sample --model "$t/tuned" --temperature 0.8 --top-p 0.9 --seed 5 --max-new 12 --cpu "Ann has"
cp "$dir/out" "$t/s1"
expect "sample, the same seed" 0 "$BIN" sample --model "$t/tuned" --temperature 0.8 --top-p 0.9 --seed 5 --max-new 12 --cpu "Ann has"
cmp -s "$dir/out" "$t/s1" && ok || bad "sampling with one seed differs"
head -c 7 "$dir/out" | grep -q "^Ann has" && ok || bad "sample: the prompt is not printed first"
expect "eval --jsonl" 0 "$BIN" eval --model "$t/tuned" --jsonl "$t/data/heldout.jsonl" --show 1 --cpu
has "eval --jsonl" "exact match: .* (.* of 20 answers"
