#!/bin/sh
# The megatrain program as a user drives it: help texts, the demo's
# training with checkpoints, a bit-identical resume, sample, eval, plan,
# info, and clear failures for bad input. Run by `make check`.
set -u
BIN=${BIN:-bin/megatrain}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # description, expected exit status, command...
  what=$1 want=$2; shift 2
  "$@" > "$dir/out" 2>&1; got=$?
  if [ "$got" -eq "$want" ]; then ok; else bad "$what: exit $got, expected $want"; sed 's/^/  | /' "$dir/out" | tail -5; fi
}
has() { # description, text expected in the last output
  if grep -q -- "$2" "$dir/out"; then ok; else bad "$1: output lacks '$2'"; sed 's/^/  | /' "$dir/out" | tail -5; fi
}

expect "no arguments" 2 "$BIN"
for c in prepare train eval sample plan plot sft-data info; do
  expect "$c --help" 0 "$BIN" $c --help
  has "$c --help" "usage: megatrain $c"
done
expect "unknown command" 2 "$BIN" frobnicate
expect "unknown option" 1 "$BIN" train --frobnicate
has "unknown option" "unknown option '--frobnicate'"
expect "bad number" 1 "$BIN" train --steps many
has "bad number" "not an integer"
expect "devices, bad list" 1 "$BIN" train --devices 0,x
has "devices, bad list" "is not a list of device indices"
expect "devices, twice" 1 "$BIN" train --devices 1,0,1
has "devices, twice" "device 1 is listed twice"
expect "devices, uneven" 1 "$BIN" train --devices 0,1 --grad-accum 3
has "devices, uneven" "not a multiple of the 2 devices"
expect "weight fetch, unknown" 1 "$BIN" train --devices 0,1 --weight-fetch halves
has "weight fetch, unknown" "--weight-fetch takes auto, whole or slices, not 'halves'"
expect "devices and --cpu" 1 "$BIN" train --devices 0,1 --cpu
has "devices and --cpu" "pick one"

# A short demo run with checkpoints, and the same run cut in two and resumed.
common="--cpu --threads 1 --log-every 10"
expect "demo, 30 steps" 0 "$BIN" train --steps 30 --save-every 10 --out "$dir/a" $common
has "demo progress" "step    30/30 | loss"
has "demo accuracy" "held-out exact match"
[ -f "$dir/a/checkpoints/latest" ] && ok || bad "no checkpoints/latest"
# the run's checkpoint of step 20, alone in another folder, resumed to 30
mkdir -p "$dir/b/checkpoints" && cp -R "$dir/a/checkpoints/step-00000020" "$dir/b/checkpoints/"
expect "demo, resumed to 30" 0 "$BIN" train --steps 30 --save-every 10 --resume "$dir/b/checkpoints" --out "$dir/b" $common
has "resume" "resumed from $dir/b/checkpoints/step-00000020 at step 20"
has "resume repairs latest" "latest names no checkpoint; the newest complete checkpoint is step 20"
if cmp -s "$dir/a/model.safetensors" "$dir/b/model.safetensors"; then ok; else bad "30 steps and 20 + resume + 10 differ"; fi

expect "sample" 0 "$BIN" sample --model "$dir/a" --cpu "12+34="
has "sample" "^12+34="
expect "sample stdin" 0 sh -c "printf '10+10\n' | '$BIN' sample --model '$dir/a' --cpu"
has "sample stdin" "^10+10="
expect "sample bad problem" 1 "$BIN" sample --model "$dir/a" --cpu "12*34="
has "sample bad problem" "is not a problem"
expect "eval demo" 0 "$BIN" eval --model "$dir/a" --cpu
has "eval demo" "held-out exact match"
expect "sample missing model" 1 "$BIN" sample --model "$dir/none" "1+1="

# Token files: a bad one is refused with its name; a good one trains and evaluates.
printf 'abc' > "$dir/odd.u16"
expect "odd token file" 1 "$BIN" train --data "$dir/odd.u16" --steps 1 --out "$dir/c" $common
has "odd token file" "odd.u16"
python3 - "$dir/tok.u16" <<'PY' 2>/dev/null || awk 'BEGIN{for(i=0;i<20000;i++) printf "%c%c", (i*7)%251, 0}' > "$dir/tok.u16"
import sys, struct
open(sys.argv[1], 'wb').write(b''.join(struct.pack('<H', (i * 7) % 251) for i in range(20000)))
PY
expect "train on tokens" 0 "$BIN" train --data "$dir/tok.u16" --steps 3 --seq-len 64 --micro-batch 2 --layers 2 \
  --hidden 64 --heads 4 --ffn 128 --out "$dir/d" $common
has "train on tokens" "saved the model to $dir/d/"
expect "eval tokens" 0 "$BIN" eval --model "$dir/d" --data "$dir/tok.u16" --seq-len 64 --batches 2 --cpu
has "eval tokens" "held-out loss"
expect "fine-tune a folder" 0 "$BIN" train --model "$dir/d" --data "$dir/tok.u16" --steps 2 --seq-len 64 \
  --micro-batch 2 --out "$dir/e" $common
expect "sample ids" 0 "$BIN" sample --model "$dir/d" --ids 5,12,19 --max-new 4 --cpu
has "sample ids" "^5,12,19 -> [0-9]* [0-9]* [0-9]* [0-9]*$"
expect "sample ids out of range" 1 "$BIN" sample --model "$dir/d" --ids 5,99999 --cpu
has "sample ids out of range" "below the vocabulary size"
expect "plan" 0 "$BIN" plan --layers 8 --hidden 1024 --heads 16 --ffn 2816 --seq-len 2048 --cpu
has "plan" "bytes per parameter"
expect "plan too big" 1 "$BIN" plan --layers 32 --hidden 4096 --heads 32 --ffn 11008 --host-budget 1 --cpu
has "plan too big" "does not fit"
expect "plan a window" 0 "$BIN" plan --model tests/fixtures/mistral_window/model --seq-len 40 --cpu
has "plan a window" "bf16, Mistral"
has "plan a window" "a sliding window of 16 keys from layer 0 on"
expect "plan gemma 3" 0 "$BIN" plan --model tests/fixtures/gemma3_window/model --seq-len 40 --cpu
has "plan gemma 3" "bf16, Gemma 3"
has "plan gemma 3" "a sliding window of 16 keys from layer 0 on, one layer in 3 attending fully"
expect "plan families" 0 "$BIN" plan --families
for a in LlamaForCausalLM Qwen2ForCausalLM MistralForCausalLM Qwen3ForCausalLM Phi3ForCausalLM Gemma2ForCausalLM \
         Gemma3ForCausalLM; do
  has "plan families" "$a"
done
has "plan families" "Qwen3-8B  *8.19 B  *106.8  *14.00  *122.1  *16.00  *46.1  *6.05$"
has "plan families" "gemma-2-9b  *9.24 B  *120.5  *14.00  *137.7  *16.00"
# mixture of experts: every expert counted in the host's state (30.5 B parameters at 14 bytes each)
for a in Qwen3MoeForCausalLM MixtralForCausalLM Qwen2MoeForCausalLM GptOssForCausalLM DeepseekV3ForCausalLM \
         DeepseekV2ForCausalLM Llama4ForCausalLM; do
  has "plan families" "$a"
done
# DeepSeek-V2-Lite (15.71 B) and Llama 4 Scout's text model (107.77 B), as config_load_real_world_* count them
has "plan families" "DeepSeek-V2-Lite  *15.71 B"
has "plan families" "Llama-4-Scout-17B-16E  *107.77 B"
has "plan families" "Qwen3-30B-A3B  *30.53 B  *398.1  *14.00  *455.0  *16.00"
mkdir -p "$dir/q30" && printf '%s' '{"architectures":["Qwen3MoeForCausalLM"],"hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":48,"num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,"max_position_embeddings":40960,"num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":true,"vocab_size":151936}' >"$dir/q30/config.json"
expect "plan moe" 0 "$BIN" plan --config "$dir/q30" --seq-len 4096 --cpu --host-budget 1000
has "plan moe" "30.532 B parameters in 50 units, bf16, Qwen3-MoE"
has "plan moe" "experts:     128 of width 768 in each sparse layer, 8 a token (weights renormalised); load-balancing loss off"
expect "plan families and more" 1 "$BIN" plan --families --cpu
has "plan families and more" "--families takes no other option"
expect "info" 0 "$BIN" info
has "info" "libmegatrain"

# tools/lean-quality.sh over finished logs only summarises them (no data, no training):
# gaps of +1% and -2% give a mean of -0.50% and a standard error of 1.50%
lq="$dir/lq"
for sd in 1 2; do
  mkdir -p "$lq/seed-$sd"
  for p in bf16 lean; do
    case $sd$p in 1lean) h=1.01 ;; 2lean) h=0.98 ;; *) h=1.0 ;; esac
    printf '{"step":1,"loss":5.5}\n{"step":2,"loss":%s,"heldout_loss":%s}\n' "$h" "$h" >"$lq/seed-$sd/$p.jsonl"
  done
done
expect "lean-quality summary" 0 env MEGATRAIN="$BIN" GCIDE="$dir/none" STEPS=2 SEEDS="1 2" sh tools/lean-quality.sh "$lq"
has "lean-quality summary" "seed 1: final held-out loss bf16 1.0000 (step 2), lean 1.0100 (step 2): +1.00%"
has "lean-quality summary" "seed 2: final held-out loss bf16 1.0000 (step 2), lean 0.9800 (step 2): -2.00%"
has "lean-quality summary" "over 2 seeds: mean -0.50%, standard error 1.50% (within 1%)"
has "lean-quality summary" "the lean run of seed 2 is already finished: kept"
if grep -q '"heldout_loss": 0.995' "$lq/lean-mean.jsonl" && [ -s "$lq/lean-quality.svg" ]; then ok; else bad "lean-quality: no mean curve"; fi
# a log cut short is run again, which needs the data
printf '{"step":1,"loss":5.5}\n' >"$lq/seed-2/lean.jsonl"
expect "lean-quality, a run cut short" 2 env MEGATRAIN="$BIN" GCIDE="$dir/none" STEPS=2 SEEDS="1 2" sh tools/lean-quality.sh "$lq"
has "lean-quality, a run cut short" "none not found: install Debian's dict-gcide"

. tests/cli_runs.sh
. tests/cli_text.sh
. tests/cli_guard.sh

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
