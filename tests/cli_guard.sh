# Sourced by tests/cli.sh after cli_runs.sh and cli_text.sh: runs that guard
# their own folders and inputs. A lock on --out, the checkpoint folder and
# the log; no output over an input; outputs that cannot be written, or have
# no room, refused at start; a log that fills up; damaged document files;
# the vocabulary of a new model; eval's progress. Uses cli.sh's $BIN, $dir,
# ok, bad, expect, has, the token file $dir/tok.u16 and model $dir/d,
# cli_runs.sh's $demo and wait_for, and cli_text.sh's $t.

g="$dir/guard"
mkdir -p "$g"
lacks() { # description, text that must not be in the last output
  if grep -q -- "$2" "$dir/out"; then bad "$1: output has '$2'"; sed 's/^/  | /' "$dir/out" | tail -5; else ok; fi
}
tiny="--seq-len 64 --micro-batch 2 --layers 2 --hidden 64 --heads 4 --ffn 128 --cpu --threads 1"

# ---- one run at a time in a folder, and in a log ---------------------------------------
# Two runs started at the same moment into one --out: one trains, the other is
# refused at start naming the first; a third with its own --out but the
# first's --log-file is refused too.
"$BIN" train --steps 2000 --out "$g/same" --log-file "$g/same.jsonl" $demo > "$g/same1.log" 2>&1 &
p1=$!
"$BIN" train --steps 2000 --out "$g/same" --log-file "$g/same.jsonl" $demo > "$g/same2.log" 2>&1 &
p2=$!
i=0
while kill -0 $p1 2>/dev/null && kill -0 $p2 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $p1 2>/dev/null; then run=$p1 other=$p2 runlog="$g/same1.log" otherlog="$g/same2.log"
else run=$p2 other=$p1 runlog="$g/same2.log" otherlog="$g/same1.log"; fi
wait $other
st=$?
cp "$otherlog" "$dir/out"
[ $st -eq 1 ] && ok || bad "two runs into one --out: the second exited $st, expected 1"
has "two runs into one --out" "\-\-out $g/same is in use by process $run"
lacks "two runs into one --out: the refused run trained" "step "
wait_for "$runlog" "step    *2/2000" || bad "two runs into one --out: the first does not train"
expect "a log in use" 1 "$BIN" train --steps 5 --out "$g/other" --log-file "$g/same.jsonl" $demo
has "a log in use" "\-\-log-file $g/same.jsonl is in use by process $run"
# the library's checkpoint save takes the same lock: a run whose checkpoints go
# into the first run's --out is refused at start, and so is a save into it
expect "checkpoints into a folder in use" 1 "$BIN" train --steps 5 --save-every 1 --checkpoints "$g/same" --out "$g/other" $demo
has "checkpoints into a folder in use" "\-\-checkpoints $g/same is in use by process $run"
kill -INT $run
wait $run
st=$?
[ $st -eq 130 ] && ok || bad "the first run, stopped: exit $st, expected 130"
[ ! -e "$g/same/.megatrain.lock" ] && [ ! -e "$g/same.jsonl.lock" ] && ok || bad "the locks stay after the run"
python3 - "$g/same.jsonl" <<'PY' && ok || bad "the shared log is not the first run's alone"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == list(range(1, len(steps) + 1)), steps
PY
# a lock whose holder died (no flock on it: here a file naming no live process) is taken over
mkdir -p "$g/stale" && echo 999999999 > "$g/stale/.megatrain.lock"
expect "a stale lock" 0 "$BIN" train --steps 2 --out "$g/stale" $demo
has "a stale lock" "lock of process 999999999, which ended without releasing it, is stale: taken over"
[ ! -e "$g/stale/.megatrain.lock" ] && ok || bad "a stale lock: the lock file stays"

# ---- no output over an input --------------------------------------------------------------
cp "$dir/tok.u16" "$g/data.u16" && cp -R "$dir/d" "$g/model"
expect "--log-file over --data" 1 "$BIN" train --data "$g/data.u16" --steps 2 $tiny --out "$g/o1" --log-file "$g/data.u16"
has "--log-file over --data" "\-\-log-file $g/data.u16 is --data $g/data.u16: writing it would destroy an input"
cmp -s "$dir/tok.u16" "$g/data.u16" && ok || bad "--log-file over --data: the data changed"
expect "--log-file over the model" 1 "$BIN" train --model "$g/model" --data "$dir/tok.u16" --steps 2 --seq-len 64 \
  --micro-batch 2 --cpu --threads 1 --out "$g/o2" --log-file "$g/model/model.safetensors"
has "--log-file over the model" "is --model $g/model/model.safetensors"
cmp -s "$dir/d/model.safetensors" "$g/model/model.safetensors" && ok || bad "--log-file over the model: the model changed"
ln -s "$g/model/config.json" "$g/link.json"
expect "--log-file through a link" 1 "$BIN" train --model "$g/model" --data "$dir/tok.u16" --steps 2 --seq-len 64 \
  --micro-batch 2 --cpu --threads 1 --out "$g/o2" --log-file "$g/link.json"
has "--log-file through a link" "is the same file as --model $g/model/config.json"
expect "--out over --model" 1 "$BIN" train --model "$g/model" --data "$dir/tok.u16" --steps 2 --seq-len 64 \
  --micro-batch 2 --cpu --threads 1 --out "$g/model"
has "--out over --model" "\-\-out $g/model is --model $g/model"
cmp -s "$dir/d/model.safetensors" "$g/model/model.safetensors" && ok || bad "--out over --model: the model changed"
expect "standard output into --data" 1 sh -c "'$BIN' train --data '$g/data.u16' --steps 2 $tiny --out '$g/o3' >> '$g/data.u16'"
has "standard output into --data" "the standard output is --data $g/data.u16"
cmp -s "$dir/tok.u16" "$g/data.u16" && ok || bad "standard output into --data: the data changed"
cp "$t/data/heldout.jsonl" "$g/h.jsonl"
expect "prepare over its input" 1 "$BIN" prepare --tokenizer "$t/data" -o "$g/h.jsonl" "$g/h.jsonl"
has "prepare over its input" "\-o $g/h.jsonl is input $g/h.jsonl"
cmp -s "$t/data/heldout.jsonl" "$g/h.jsonl" && ok || bad "prepare over its input: the input changed"
expect "prepare over its tokenizer" 1 "$BIN" prepare --tokenizer "$t/data/tokenizer.json" -o "$t/data/tokenizer.json" "$g/h.jsonl"
has "prepare over its tokenizer" "is --tokenizer $t/data/tokenizer.json"
mkdir -p "$g/folder.mt"
expect "prepare -o a folder" 1 "$BIN" prepare --tokenizer "$t/data" -o "$g/folder.mt" "$g/h.jsonl"
has "prepare -o a folder" "\-o $g/folder.mt is a folder"
[ ! -e "$g/folder.mt.tmp" ] && ok || bad "prepare -o a folder: left $g/folder.mt.tmp"
expect "prepare -o in no folder" 1 "$BIN" prepare --tokenizer "$t/data" -o "$g/none/x.mt" "$g/h.jsonl"
has "prepare -o in no folder" "the folder $g/none does not exist"
expect "eval into its --jsonl" 1 sh -c "'$BIN' eval --model '$t/tuned' --jsonl '$g/h.jsonl' --cpu >> '$g/h.jsonl'"
has "eval into its --jsonl" "the standard output is --jsonl $g/h.jsonl"
cmp -s "$t/data/heldout.jsonl" "$g/h.jsonl" && ok || bad "eval into its --jsonl: the file changed"
expect "sample into its model" 1 sh -c "'$BIN' sample --model '$g/model' --ids 1,2 --cpu >> '$g/model/config.json'"
has "sample into its model" "the standard output is --model $g/model/config.json"
cmp -s "$dir/d/config.json" "$g/model/config.json" && ok || bad "sample into its model: config.json changed"

# ---- outputs that cannot be written, or have no room, refused at start -------------------
echo "not a folder" > "$g/file"
expect "--out under a file" 1 "$BIN" train --steps 30 --out "$g/file/model" $demo
has "--out under a file" "\-\-out $g/file/model: $g/file is in the way: not a folder"
lacks "--out under a file: it trained first" "step "
expect "--out a file" 1 "$BIN" train --data "$dir/tok.u16" --steps 2 $tiny --out "$g/file"
has "--out a file" "\-\-out $g/file: $g/file is in the way"
expect "--checkpoints under a file" 1 "$BIN" train --steps 30 --save-every 5 --checkpoints "$g/file/ck" --out "$g/o4" $demo
has "--checkpoints under a file" "\-\-checkpoints $g/file/ck: $g/file is in the way"
lacks "--checkpoints under a file: it trained first" "step "
expect "--log-file under a file" 1 "$BIN" train --steps 30 --log-file "$g/file/log.jsonl" --out "$g/o4" $demo
has "--log-file under a file" "log.jsonl cannot be written"
# a model whose checkpoint needs more room than any disk has (200 T parameters,
# planned, never allocated): refused before anything is made
expect "no room for a checkpoint" 1 "$BIN" train --data "$dir/tok.u16" --steps 2 --seq-len 64 --micro-batch 2 \
  --layers 2000 --hidden 65536 --heads 512 --ffn 262144 --save-every 1 --cpu --out "$g/huge"
has "no room for a checkpoint" "the model (.* TiB) and a checkpoint of it need .* TiB, but its file system has .* free"
# a log on a full disk: reported once, the run goes on and saves its model, the status says the log is short
expect "a full log" 1 "$BIN" train --data "$dir/tok.u16" --steps 3 $tiny --out "$g/full" --log-file /dev/full
[ "$(grep -c "cannot write to --log-file" "$dir/out")" -eq 1 ] && ok || bad "a full log: not reported once"
has "a full log" "log-file /dev/full lacks steps 1 to 3"
has "a full log" "saved the model to $g/full/"

# ---- SIGINT before the first step leaves --out as it was -----------------------------------
cp -R "$dir/a" "$g/kept" && rm -rf "$g/kept/checkpoints"
"$BIN" train --steps 30 --micro-batch 64 --out "$g/kept" $demo > "$g/kept.log" 2>&1 &
pid=$!
wait_for "$g/kept.log" "megatrain demo" || bad "SIGINT before a step: no start"
kill -INT $pid
wait $pid
st=$?
cp "$g/kept.log" "$dir/out"
[ $st -eq 130 ] && ok || bad "SIGINT before a step: exit $st, expected 130"
has "SIGINT before a step" "no step was taken: nothing is saved"
cmp -s "$dir/a/model.safetensors" "$g/kept/model.safetensors" && ok || bad "SIGINT before a step: --out was replaced"

# ---- document files: a damaged magic is not read as raw tokens -------------------------------
cp "$t/train.mt" "$g/damaged.mt"
printf 'X' | dd of="$g/damaged.mt" bs=1 seek=3 conv=notrunc 2>/dev/null
for v in 65536 32000; do
  expect "damaged document file, vocab $v" 1 "$BIN" train --data "$g/damaged.mt" --vocab $v $tiny --steps 1 --out "$g/dm"
  has "damaged document file, vocab $v" "starts like a megatrain document file, but its magic is 'MTTXKENS', not 'MTTOKENS'"
done
expect "damaged document file, read raw on request" 0 "$BIN" train --data "$g/damaged.mt" --format u16 --vocab 65536 \
  $tiny --steps 1 --out "$g/dm"

# ---- the vocabulary of a new model: --vocab, else the tokenizer's, else --config's ---------------
n_ids=$(python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print(max([*t['model']['vocab'].values(), *(a['id'] for a in t['added_tokens'])]) + 1)" "$t/data/tokenizer.json")
printf '%s' '{"architectures":["LlamaForCausalLM"],"vocab_size":5000,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":2,"max_position_embeddings":64}' > "$g/cfg5000.json"
vsmall="--steps 1 --seq-len 64 --micro-batch 2 --cpu --threads 1"
vocab_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$1/config.json" 2>/dev/null; }
expect "vocab: --tokenizer" 0 "$BIN" train --data "$t/train.mt" --tokenizer "$t/data" --layers 1 --hidden 32 --heads 2 --ffn 64 $vsmall --out "$g/v1"
[ "$(vocab_of "$g/v1")" = "$n_ids" ] && ok || bad "vocab: --tokenizer gave $(vocab_of "$g/v1"), not $n_ids"
expect "vocab: --config and --tokenizer" 0 "$BIN" train --data "$t/train.mt" --config "$g/cfg5000.json" --tokenizer "$t/data" $vsmall --out "$g/v2"
[ "$(vocab_of "$g/v2")" = "$n_ids" ] && ok || bad "vocab: --config and --tokenizer gave $(vocab_of "$g/v2"), not the tokenizer's $n_ids"
has "vocab: --config and --tokenizer" "the vocabulary is the tokenizer's $n_ids ids, not the 5000 of --config"
expect "vocab: --tokenizer and --vocab" 0 "$BIN" train --data "$t/train.mt" --tokenizer "$t/data" --vocab 700 --layers 1 --hidden 32 --heads 2 --ffn 64 $vsmall --out "$g/v3"
[ "$(vocab_of "$g/v3")" = 700 ] && ok || bad "vocab: --tokenizer and --vocab 700 gave $(vocab_of "$g/v3")"
expect "vocab: --config, --tokenizer and --vocab" 0 "$BIN" train --data "$t/train.mt" --config "$g/cfg5000.json" --tokenizer "$t/data" --vocab 700 $vsmall --out "$g/v4"
[ "$(vocab_of "$g/v4")" = 700 ] && ok || bad "vocab: --config, --tokenizer and --vocab 700 gave $(vocab_of "$g/v4")"
expect "vocab: --config and --vocab" 0 "$BIN" train --data "$t/train.mt" --config "$g/cfg5000.json" --vocab 700 $vsmall --out "$g/v5"
[ "$(vocab_of "$g/v5")" = 700 ] && ok || bad "vocab: --config and --vocab 700 gave $(vocab_of "$g/v5")"
expect "vocab: --config" 0 "$BIN" train --data "$t/train.mt" --config "$g/cfg5000.json" $vsmall --out "$g/v6"
[ "$(vocab_of "$g/v6")" = 5000 ] && ok || bad "vocab: --config gave $(vocab_of "$g/v6")"
expect "vocab: --vocab below the tokenizer's" 1 "$BIN" train --data "$t/train.mt" --tokenizer "$t/data" --vocab 100 --layers 1 --hidden 32 --heads 2 --ffn 64 $vsmall --out "$g/v7"
has "vocab: --vocab below the tokenizer's" "\-\-vocab 100 is smaller than the tokenizer's $n_ids ids"
expect "vocab: --model and --vocab" 1 "$BIN" train --model "$dir/d" --data "$dir/tok.u16" --vocab 700 $vsmall --out "$g/v8"
has "vocab: --model and --vocab" "\-\-model brings its own shape and vocabulary"

# ---- eval --jsonl: --max-new and a progress line --------------------------------------------------
expect "eval --jsonl --max-new" 0 "$BIN" eval --model "$t/tuned" --jsonl "$t/data/heldout.jsonl" --max-new 2 --show 0 --cpu
has "eval --jsonl --max-new" "eval: answer 1 of 20, "
has "eval --jsonl --max-new" "eval: answer 20 of 20, "
has "eval --jsonl --max-new" "exact match: .* (.* of 20 answers"

# ---- small messages ------------------------------------------------------------------------------
printf '%s' '{"architectures":["LlamaForCausalLM"],"vocab_size":300,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":1000000000000,"num_attention_heads":2,"num_key_value_heads":2,"max_position_embeddings":64}' > "$g/layers.json"
expect "10^12 layers" 1 "$BIN" plan --config "$g/layers.json" --cpu
has "10^12 layers" "\"num_hidden_layers\" is 1000000000000, above the largest this library reads (4294967295)"
# a model whose norm weights are NaN: the step's message names the step once
cp -R "$dir/d" "$g/nan" && python3 - "$g/nan/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
n = struct.unpack_from('<Q', b)[0]
h = json.loads(b[8:8 + n])
k = next(k for k in h if k != '__metadata__' and 'norm' in k)
s, e = h[k]['data_offsets']
b[8 + n + s:8 + n + e] = b'\xff' * (e - s)
open(sys.argv[1], 'wb').write(b)
PY
expect "a non-finite step" 1 "$BIN" train --model "$g/nan" --data "$dir/tok.u16" --steps 2 --seq-len 64 --micro-batch 2 \
  --cpu --threads 1 --out "$g/nanout"
has "a non-finite step" "megatrain: step 1: loss"
lacks "a non-finite step" "step 1: step 1:"
# a small model's size in K, not "0.0 M"
expect "parameters of a small model" 0 "$BIN" train --data "$dir/tok.u16" --steps 1 --seq-len 32 --micro-batch 2 --layers 1 \
  --hidden 32 --heads 2 --ffn 64 --vocab 256 --cpu --threads 1 --out "$g/small"
has "parameters of a small model" "training 26.7 K parameters on"
