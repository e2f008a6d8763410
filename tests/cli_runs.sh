# Sourced by tests/cli.sh: training runs that must not lose a user's work.
# Signals, checkpoint folders that cannot eat a run, resumes that refuse a
# different run, I/O errors, configuring a model, the metrics log and plot.
# Uses cli.sh's $BIN, $dir, ok, bad, expect and has.

# The demo's model and a shape small enough for seconds-long runs.
demo="--cpu --threads 1 --log-every 1"

# wait_for FILE TEXT: until TEXT is in FILE (30 s at most)
wait_for() {
  i=0
  while ! grep -q -- "$2" "$1" 2>/dev/null; do
    i=$((i + 1))
    [ $i -gt 300 ] && return 1
    sleep 0.1
  done
}

# ---- signals ------------------------------------------------------------------
# The reference: 40 steps uninterrupted.
expect "signals: reference run" 0 "$BIN" train --steps 40 --out "$dir/sref" $demo
# SIGINT in the middle: the step in flight is abandoned, a checkpoint and the
# model are saved, the resume command is printed, the status is 130.
"$BIN" train --steps 40 --out "$dir/sint" $demo > "$dir/sint.log" 2>&1 &
pid=$!
wait_for "$dir/sint.log" "step     5/40" || bad "signals: the run did not get going"
kill -INT $pid
wait $pid
st=$?
cp "$dir/sint.log" "$dir/out"
[ $st -eq 130 ] && ok || bad "SIGINT: exit $st, expected 130"
has "SIGINT" "stopped by SIGINT after step"
# the command names the program as it was run ($BIN), not a `megatrain` that PATH may not have
has "SIGINT" "resume with: $BIN train --steps 40 --out $dir/sint --cpu --threads 1 --log-every 1 --resume $dir/sint/checkpoints"
[ -f "$dir/sint/model.safetensors" ] && ok || bad "SIGINT: no model saved"
[ -f "$dir/sint/checkpoints/latest" ] && ok || bad "SIGINT: no checkpoint"
expect "SIGINT: resumed" 0 "$BIN" train --steps 40 --out "$dir/sint" $demo --resume "$dir/sint/checkpoints"
if cmp -s "$dir/sref/model.safetensors" "$dir/sint/model.safetensors"; then ok; else bad "SIGINT + resume differs from the uninterrupted run"; fi

# SIGTERM (a scheduler's notice): the same, status 143.
"$BIN" train --steps 40 --out "$dir/sterm" $demo > "$dir/sterm.log" 2>&1 &
pid=$!
wait_for "$dir/sterm.log" "step     3/40" || bad "signals: the run did not get going"
kill -TERM $pid
wait $pid
st=$?
[ $st -eq 143 ] && ok || bad "SIGTERM: exit $st, expected 143"
grep -q "stopped by SIGTERM" "$dir/sterm.log" && ok || bad "SIGTERM: no message"

# Two signals: the second stops at once; what is on disk still resumes, bit for bit.
"$BIN" train --steps 40 --save-every 2 --out "$dir/s2" $demo > "$dir/s2.log" 2>&1 &
pid=$!
wait_for "$dir/s2.log" "step     7/40" || bad "signals: the run did not get going"
kill -INT $pid
# the second once the first is taken: two pending SIGINTs would merge into one
wait_for "$dir/s2.log" "megatrain: stopping" || bad "two SIGINTs: the first was not acknowledged"
kill -INT $pid 2>/dev/null
wait $pid
st=$?
[ $st -eq 130 ] && ok || bad "two SIGINTs: exit $st, expected 130"
expect "two SIGINTs: resumed" 0 "$BIN" train --steps 40 --save-every 2 --out "$dir/s2" $demo --resume "$dir/s2/checkpoints"
if cmp -s "$dir/sref/model.safetensors" "$dir/s2/model.safetensors"; then ok; else bad "two SIGINTs + resume differ from the uninterrupted run"; fi
ls "$dir/s2/checkpoints" | grep -q '\.tmp$' && bad "two SIGINTs: .tmp leftovers after the resume" || ok

# ---- checkpoint folders that cannot eat a run ----------------------------------
# The issue's case: a folder holding a 40-step run's checkpoints, reused by
# another run, is refused; --restart starts over, and resume works after it.
expect "reused folder: first run" 0 "$BIN" train --steps 40 --save-every 5 --out "$dir/rr" $demo
expect "reused folder: refused" 1 "$BIN" train --steps 7 --seed 9 --save-every 5 --out "$dir/rr" $demo
has "reused folder: refused" "holds the checkpoints of another run (newest: step 40)"
has "reused folder: refused" "pass --restart"
expect "reused folder: --restart" 0 "$BIN" train --steps 7 --seed 9 --save-every 5 --out "$dir/rr" $demo --restart
[ "$(cat "$dir/rr/checkpoints/latest")" = "step-00000007" ] && ok || bad "--restart: latest is $(cat "$dir/rr/checkpoints/latest")"
[ -d "$dir/rr/checkpoints/step-00000007" ] && [ ! -d "$dir/rr/checkpoints/step-00000040" ] && ok ||
  bad "--restart: $(ls "$dir/rr/checkpoints" | tr '\n' ' ')"
expect "reused folder: resumes" 0 "$BIN" train --steps 7 --seed 9 --save-every 5 --out "$dir/rr" $demo --resume "$dir/rr/checkpoints"
has "reused folder: resumes" "resumed from $dir/rr/checkpoints/step-00000007 at step 7"

# --resume of a step folder continues in its parent; later checkpoints are
# refused unless --force, which sets them aside.
expect "resume a step folder: later ones refused" 1 "$BIN" train --steps 40 --save-every 5 --out "$dir/sx" $demo \
  --resume "$dir/s2/checkpoints/step-00000038"
has "resume a step folder" "holds 1 checkpoint(s) after step 38"
expect "resume a step folder: --force" 0 "$BIN" train --steps 40 --save-every 5 --out "$dir/sx" $demo \
  --resume "$dir/s2/checkpoints/step-00000038" --force
has "resume a step folder: --force" "set $dir/s2/checkpoints/step-00000040 aside as $dir/s2/checkpoints/superseded-step-00000040"
[ -d "$dir/s2/checkpoints/step-00000040" ] && [ ! -d "$dir/s2/checkpoints/step-00000038/step-00000040" ] && ok ||
  bad "resume of a step folder: checkpoints not in the parent: $(ls "$dir/s2/checkpoints" | tr '\n' ' ')"
if cmp -s "$dir/sref/model.safetensors" "$dir/sx/model.safetensors"; then ok; else bad "resume from step 38 differs"; fi

# Leftovers of a killed save are cleaned at start; a stale `latest` is
# repaired from the newest complete checkpoint.
mkdir -p "$dir/s2/checkpoints/step-00000099.tmp" && echo junk > "$dir/s2/checkpoints/latest.tmp"
echo step-00000038 > "$dir/s2/checkpoints/latest"
expect "stale latest" 0 "$BIN" train --steps 40 --save-every 2 --out "$dir/s2" $demo --resume "$dir/s2/checkpoints"
has "leftovers removed" "removed 2 leftover(s) of a save that was killed"
has "stale latest" "is older than a complete checkpoint; the newest complete checkpoint is step 40"
[ ! -e "$dir/s2/checkpoints/step-00000099.tmp" ] && [ ! -e "$dir/s2/checkpoints/latest.tmp" ] && ok || bad "leftovers stay"

# ---- resume refuses a different run -----------------------------------------------
base="--steps 40 --save-every 10 $demo"
expect "resume: other lr" 1 "$BIN" train $base --out "$dir/sref2" --resume "$dir/sint/checkpoints" --lr 1e-3
has "resume: other lr" "schedule.lr: 0.003 in the checkpoint's run, 0.001 now"
expect "resume: other steps and batch" 1 "$BIN" train --steps 80 --seq-len 32 $demo --out "$dir/sref2" --resume "$dir/sint/checkpoints"
has "resume: other steps" "schedule.steps: 40 in the checkpoint's run, 80 now"
has "resume: other batch" "batch.seq_len: 64 in the checkpoint's run, 32 now"
expect "resume: other lr, --force" 0 "$BIN" train $base --out "$dir/sref2" --resume "$dir/sint/checkpoints" --lr 1e-3 --force
has "resume: --force" "resuming although the run differs"

# ---- I/O errors do not end a run ----------------------------------------------------
# An --out or --checkpoints that cannot be written is refused at start, before
# any step (tests/cli_guard.sh). One that stops being writable mid-run: the
# model goes under $TMPDIR, and the message says where.
mkdir -p "$dir/tmp" "$dir/gone"
TMPDIR="$dir/tmp" "$BIN" train --steps 40 --out "$dir/gone/model" $demo > "$dir/gone.log" 2>&1 &
pid=$!
wait_for "$dir/gone.log" "step     3/40" || bad "unwritable --out: the run did not get going"
rm -rf "$dir/gone" && echo "not a folder" > "$dir/gone"
wait $pid
st=$?
cp "$dir/gone.log" "$dir/out"
[ $st -eq 1 ] && ok || bad "unwritable --out: exit $st, expected 1"
has "unwritable --out" "could not be saved to $dir/gone/model"
has "unwritable --out" "saved the model to $dir/tmp/megatrain-rescue-"
ls "$dir"/tmp/megatrain-rescue-*/model.safetensors > /dev/null 2>&1 && ok || bad "no rescued model"
# Checkpoints that cannot be written: each failure is reported and the run
# goes on; once the folder can be written again, the next interval saves.
mkdir -p "$dir/blocker"
"$BIN" train --steps 60 --save-every 20 --checkpoints "$dir/blocker/ck" --out "$dir/io" $demo > "$dir/io.log" 2>&1 &
pid=$!
wait_for "$dir/io.log" "step     2/60" || bad "checkpoints: the run did not get going"
rm -rf "$dir/blocker" && echo "not a folder" > "$dir/blocker"
wait_for "$dir/io.log" "checkpoint of step 20 could not be written" || bad "checkpoint failure not reported"
rm -f "$dir/blocker" && mkdir -p "$dir/blocker"
wait $pid
st=$?
[ $st -eq 0 ] && ok || { bad "a failed checkpoint ended the run: exit $st"; tail -3 "$dir/io.log"; }
[ -f "$dir/blocker/ck/latest" ] && ok || bad "no checkpoint after the folder came back"
grep -q "step    60/60" "$dir/io.log" && ok || bad "the run did not reach its last step"

# ---- configuring a model -------------------------------------------------------------
python3 - "$dir/tok32.u32" "$dir/tok300.u16" <<'PY'
import struct, sys
open(sys.argv[1], 'wb').write(b''.join(struct.pack('<I', 1 + (i * 7) % 250) for i in range(8000)))
open(sys.argv[2], 'wb').write(b''.join(struct.pack('<H', (i * 13) % 300) for i in range(8000)))
PY
small="--steps 2 --seq-len 32 --micro-batch 2 --layers 1 --hidden 32 --heads 2 --ffn 64 $demo"
expect "uint32 ids read as uint16" 1 "$BIN" train --data "$dir/tok32.u32" --vocab 256 $small --out "$dir/f0"
has "uint32 ids read as uint16" "looks like raw uint32"
expect "--format u32" 0 "$BIN" train --data "$dir/tok32.u32" --format u32 --vocab 256 $small --out "$dir/f1"
expect "--format bogus" 1 "$BIN" train --data "$dir/tok32.u32" --format u64 $small --out "$dir/f1"
has "--format bogus" "the token formats are auto, u16, u32 and llmc"
expect "--vocab" 0 "$BIN" train --data "$dir/tok300.u16" --vocab 300 $small --out "$dir/v300"
grep -q '"vocab_size":[[:space:]]*300' "$dir/v300/config.json" && ok || bad "--vocab 300 not in config.json"
expect "the default vocabulary" 0 "$BIN" train --data "$dir/tok300.u16" $small --out "$dir/v32k"
cp "$dir/v300/config.json" "$dir/my-model.json"
expect "--config FILE" 0 "$BIN" train --data "$dir/tok300.u16" --config "$dir/my-model.json" $small --out "$dir/cfg"
grep -q '"vocab_size":[[:space:]]*300' "$dir/cfg/config.json" && ok || bad "--config: vocab_size not taken"
echo '{"architectures": ["GPT2LMHeadModel"]}' > "$dir/gpt2.json"
expect "--config of another family" 1 "$BIN" train --data "$dir/tok300.u16" --config "$dir/gpt2.json" $small --out "$dir/cfg2"
has "--config of another family" "$dir/gpt2.json"
expect "plan a config.json" 0 "$BIN" plan --config "$dir/my-model.json" --seq-len 64 --cpu
has "plan a config.json" "parameters"
expect "plan a GPU anywhere" 0 "$BIN" plan --model "$dir/v300/config.json" --seq-len 4096 --gpu-memory 80
has "plan a GPU anywhere" "CUDA backend"
has "plan a GPU anywhere" "budget 80.00 GiB"
# a head size the CUDA attention cannot run (12): an error, and no plan printed
expect "plan a head size the GPU cannot run" 1 "$BIN" plan --layers 2 --hidden 36 --heads 3 --ffn 64 --vocab 100 --seq-len 64 --gpu-memory 80
has "plan a head size the GPU cannot run" "head_dim"
expect "plan a GPU too small" 1 "$BIN" plan --layers 32 --hidden 4096 --heads 32 --ffn 11008 --seq-len 4096 --gpu-memory 4
has "plan a GPU too small" "does not fit"

# ---- how the run goes -----------------------------------------------------------------
expect "log file and held-out loss" 0 "$BIN" train --steps 20 --save-every 10 --eval-every 5 --log-file "$dir/run.jsonl" \
  --out "$dir/lg" $demo
[ "$(wc -l < "$dir/run.jsonl")" -eq 20 ] && ok || bad "--log-file: $(wc -l < "$dir/run.jsonl") lines, expected 20"
[ "$(grep -c heldout_loss "$dir/run.jsonl")" -eq 4 ] && ok || bad "--eval-every 5: $(grep -c heldout_loss "$dir/run.jsonl") held-out losses"
python3 - "$dir/run.jsonl" "$dir/lg/checkpoints/step-00000020/trainer_state.json" <<'PY' && ok || bad "the log's records"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, 21)), [r["step"] for r in rows]
for r in rows:
    assert {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "seconds", "elapsed"} <= r.keys(), r
    assert r["loss"] > 0 and r["tokens"] == 1024
assert [r["step"] for r in rows if "heldout_loss" in r] == [5, 10, 15, 20]
state = json.load(open(sys.argv[2]))
hist = state["log_history"]
assert [h["step"] for h in hist if "heldout_loss" in h] == [5, 10, 15, 20], hist
assert state["run"]["batch"] == {"seq_len": 64, "micro_batch": 16, "grad_accum": 1}, state["run"]
PY
# a resume trims the steps after its checkpoint from the log and writes them again
sed -n '1,13p' "$dir/run.jsonl" > "$dir/run13.jsonl"
cp "$dir/run13.jsonl" "$dir/lg/partial.jsonl"
echo '{"step": 14, "loss": 99}' >> "$dir/lg/partial.jsonl"
rm -rf "$dir/lg2" && mkdir -p "$dir/lg2/checkpoints" && cp -R "$dir/lg/checkpoints/step-00000010" "$dir/lg2/checkpoints/"
expect "log file on resume" 0 "$BIN" train --steps 20 --save-every 10 --eval-every 5 --log-file "$dir/lg/partial.jsonl" \
  --out "$dir/lg2" $demo --resume "$dir/lg2/checkpoints"
python3 - "$dir/run.jsonl" "$dir/lg/partial.jsonl" <<'PY' && ok || bad "the resumed log"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in b] == list(range(1, 21)), [r["step"] for r in b]
assert [r["loss"] for r in a] == [r["loss"] for r in b], "the losses of the resumed steps"
PY
expect "plot" 0 "$BIN" plot "$dir/run.jsonl" -o "$dir/loss.svg"
grep -q "<svg" "$dir/loss.svg" && ok || bad "plot: no SVG"
