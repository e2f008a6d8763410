#!/bin/sh
# The fine-tuning demo, end to end as a user runs it (`make demo-sft`):
#   1. megatrain sft-data: conversations of word problems with worked
#      answers (JSONL) and a byte-level BPE tokenizer learnt from them;
#   2. megatrain prepare: the conversations into a token file whose loss mask
#      keeps only the assistant's answers;
#   3. megatrain train: a small new model, one conversation to a window;
#   4. megatrain eval --jsonl: exact match on held-out problems, whose
#      arithmetic the model never saw, and one answer through sample --chat.
#
#     tools/sft-demo.sh [DIR]      (default megatrain-sft; BIN picks the program)
set -eu
BIN=${BIN:-bin/megatrain}
dir=${1:-megatrain-sft}
STEPS=${STEPS:-1200}
run() {
  echo "+ $*"
  "$@"
}
run "$BIN" sft-data "$dir/data"
run "$BIN" prepare --tokenizer "$dir/data" -o "$dir/train.mt" "$dir/data/train.jsonl"
run "$BIN" train --data "$dir/train.mt" --tokenizer "$dir/data" --layers 4 --hidden 128 --heads 4 --ffn 384 \
  --seq-len 192 --micro-batch 16 --steps "$STEPS" --lr 3e-3 --warmup 50 --eval-every 300 --log-every 100 \
  --log-file "$dir/run.jsonl" --out "$dir/model" --cpu --restart
run "$BIN" eval --model "$dir/model" --jsonl "$dir/data/heldout.jsonl" --cpu
run "$BIN" sample --model "$dir/model" --chat --cpu "Nora has 38 stamps and gets 27 more. How many now?"
