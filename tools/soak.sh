#!/usr/bin/env bash
# Soak test of `megatrain train`: a long CPU run of a tiny model, killed again
# and again at random moments and resumed each time, must end bit for bit
# where the same run ends uninterrupted.
#
#   tools/soak.sh [--steps N] [--out DIR] [--seed S] [BIN]
#
# N: optimizer steps (default 20000); DIR: where the runs go (default: a
# temporary folder, removed when every check passed); S: the seed of the kill
# plan (default 1); BIN: the program (default bin/megatrain).
#
# 1. The reference: the whole schedule once, uninterrupted.
# 2. The soak run: the same options, interrupted every N/14 to N/7 steps
#    (1428 to 2857 of 20000) and resumed with --resume each time, until it
#    completes. Most interruptions are SIGKILL (no chance to clean up): some
#    at a random moment (0-999 ms after the log shows the planned step), the
#    others inside a checkpoint save (0-6 ms after the save's step-N.tmp
#    folder appears; the script watches for it in a tight loop). One is a
#    SIGTERM, one is two SIGINTs (the second sent once the process has
#    acknowledged the first, so that it is a second signal). The planned
#    steps and the delays come from awk's srand(seed); the script waits until
#    the log shows the planned step, which lies past the previous kill.
# 3. Memory: VmRSS of each training process is read from /proc every 0.5 s.
#    Of the samples taken while it trains (before the log shows step N: the
#    demo's final accuracy evaluation needs more) and after its first 2 s
#    (warm-up), a segment with at least 10 must have the maximum over its
#    second half within 5% or 1 MiB, whichever is larger, of the maximum over
#    its first half.
# 4. At the end: the final model.safetensors and the final checkpoint's
#    model.safetensors, optimizer.safetensors and config.json are
#    byte-identical to the reference's (cmp), and so are trainer_state.json's
#    step, data_position and rng_state; the log has steps 1..N once each, in
#    order, with the reference's step, loss, lr, grad_norm, tokens and
#    heldout_loss on every line; the checkpoint folder holds only step-NNNNNNNN
#    folders (2 at most) and `latest`, which names the last step; no *.tmp or
#    *.old is left anywhere in the run's folder; each process exited as
#    expected (137 SIGKILL as the shell sees it, 143 SIGTERM, 130 SIGINT,
#    0 at the end); each resume started from the newest complete checkpoint;
#    at least one SIGKILL landed inside a checkpoint save; a resume of the
#    finished run with another --lr is refused (exit 1) and changes nothing;
#    the program and its libmegatrain did not change during the soak.
#
# Prints a summary and `soak: P passed, F failed`; exits 1 on any failure.
set -eu

usage() { echo "usage: tools/soak.sh [--steps N] [--out DIR] [--seed S] [BIN]"; }
steps=20000 out="" seed=1 bin=bin/megatrain
while [ $# -gt 0 ]; do
  case $1 in
    --steps) [ $# -ge 2 ] || { usage >&2; exit 2; }; steps=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || { usage >&2; exit 2; }; out=$2; shift 2 ;;
    --seed) [ $# -ge 2 ] || { usage >&2; exit 2; }; seed=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "soak: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) bin=$1; shift ;;
  esac
done
case $steps in '' | *[!0-9]*) echo "soak: --steps takes a number" >&2; exit 2 ;; esac
case $seed in '' | *[!0-9]*) echo "soak: --seed takes a number" >&2; exit 2 ;; esac
[ "$steps" -ge 200 ] || { echo "soak: --steps must be at least 200" >&2; exit 2; }
[ -x "$bin" ] || { echo "soak: $bin is not an executable (build it first)" >&2; exit 2; }
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/megatrain-soak.XXXXXX")
  keep_out=0
else
  mkdir -p "$out"
  [ -z "$(ls -A "$out")" ] || { echo "soak: $out is not empty" >&2; exit 2; }
  keep_out=1
fi

# The run: the built-in demo (two-digit addition) on a 1-layer model of
# 40 k parameters; 256 tokens per step, 3-4 ms a step on one core.
save_every=$((steps / 80)) # 250 for 20000 steps
shape="--layers 1 --hidden 64 --heads 2 --kv-heads 2 --ffn 128 --seq-len 32 --micro-batch 8"
opts="--steps $steps $shape --save-every $save_every --eval-every $((steps / 20)) --log-every $((steps / 20)) --cpu --threads 1"

passes=0 fails=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
check() { # description, command...: passes when the command succeeds
  local what=$1
  shift
  if "$@"; then ok; else bad "$what"; fi
}

pid="" sampler=""
cleanup() {
  [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
  [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
}
trap 'cleanup; exit 1' INT TERM
trap cleanup EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

# "VmRSS-in-kB step" of process $1 every 0.5 s into file $2, the step from log $3;
# from 0.5 s after its start until it is gone
sample_rss() {
  local r
  while sleep 0.5 && r=$(awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null) && [ -n "$r" ]; do
    echo "$r $(last_step "$3")" >> "$2"
  done
}

# start RUNDIR SEGMENT [extra options]: a training process in the background
start() {
  local dir=$1 n=$2
  shift 2
  # shellcheck disable=SC2086
  "$bin" train $opts --out "$dir/model" --checkpoints "$dir/checkpoints" --log-file "$dir/log.jsonl" "$@" \
    > "$dir/seg-$n.out" 2>&1 &
  pid=$!
  : > "$dir/seg-$n.rss"
  sample_rss "$pid" "$dir/seg-$n.rss" "$dir/log.jsonl" &
  sampler=$!
  seg_t0=$(now)
}

# finish: waits for the process; sets st (its exit status as the shell sees it)
finish() {
  st=0
  wait "$pid" 2>/dev/null || st=$? # (no "Killed" notice)
  wait "$sampler" || true
  pid="" sampler=""
}

# the step of the log's last complete line (empty if none)
last_step() { tail -n 1 "$1" 2>/dev/null | sed -n 's/^{"step":\([0-9][0-9]*\),.*/\1/p'; }

# wait_step LOG K: until the log shows step K or later (0), or the process ends (1)
wait_step() {
  local s
  while kill -0 "$pid" 2>/dev/null; do
    s=$(last_step "$1")
    if [ -n "$s" ] && [ "$s" -ge "$2" ]; then return 0; fi
    if [ $((SECONDS - seg_start)) -gt "$limit" ]; then
      bad "the process took more than $limit s: killed"
      kill -KILL "$pid" 2>/dev/null || true
      return 1
    fi
    sleep 0.05
  done
  return 1
}

# wait_file PATH SECONDS: until PATH exists (0) or the process ends or time runs out (1); a tight loop of builtins
wait_file() {
  local i=0 end=$((SECONDS + $2))
  while [ ! -e "$1" ]; do
    i=$((i + 1))
    if [ $((i % 2000)) -eq 0 ]; then
      kill -0 "$pid" 2>/dev/null || return 1
      [ "$SECONDS" -le "$end" ] || return 1
    fi
  done
}

# wait_text FILE TEXT: until TEXT is in FILE (0), 5 s at most (1)
wait_text() {
  local i=0
  while ! grep -q -- "$2" "$1" 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 500 ] || return 1
    sleep 0.01
  done
}

# segment_start: what segment $seg of the soak run started from ("step 0" for
# the first), checking that a resume took the newest complete checkpoint
segment_start() {
  local from cleaned
  if [ "$seg" -eq 1 ]; then
    from_txt="step 0"
    return
  fi
  from=$(sed -n 's/^resumed from .* at step \([0-9]*\)$/\1/p' "$run/seg-$seg.out")
  cleaned=$(sed -n 's/^removed \([0-9]*\) leftover.*/\1/p' "$run/seg-$seg.out")
  check "segment $seg: resumed at step '$from', expected the newest complete checkpoint, step $expect_from" \
    [ "$from" = "$expect_from" ]
  from_txt="resumed at step $from${cleaned:+ (removed $cleaned leftover(s) of a killed save)}"
}

# rss_stats FILE: "MIN-MAX verdict" in MB of the samples taken while training
# (before the log shows the last step: the demo's final evaluation of its
# accuracy needs more), after the warm-up (of all of them when that leaves
# none); verdict: "N samples, flat", "..., GROWS(A->B MB)" or "..., too short
# to judge"
rss_stats() {
  awk -v last="$steps" 'function mb(k) { return sprintf("%.1f", k / 1024) }
    $2 == "" || $2 < last { v[++m] = $1 }
    END {
      if (m == 0) { print "- no samples"; exit }
      w = 3                               # the first 2 s: warm-up
      n = m - w
      first = n > 0 ? w + 1 : 1
      lo = v[first]; hi = v[first]
      for (i = first; i <= m; i++) { if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i] }
      verdict = m " samples, too short to judge"
      if (n >= 10) {
        h = int(n / 2); a = 0; b = 0
        for (i = w + 1; i <= w + h; i++) if (v[i] > a) a = v[i]
        for (i = w + h + 1; i <= m; i++) if (v[i] > b) b = v[i]
        allow = a * 0.05; if (allow < 1024) allow = 1024
        verdict = m " samples, " ((b - a <= allow) ? "flat" : "GROWS(" mb(a) "->" mb(b) " MB)")
      }
      print mb(lo) "-" mb(hi), verdict
    }' "$1"
}

# the deterministic fields of each log line: step loss lr grad_norm tokens heldout_loss
log_fields() {
  awk '{
    line = $0; out = ""
    n = split("step loss lr grad_norm tokens heldout_loss", k, " ")
    for (i = 1; i <= n; i++) {
      v = "-"
      if (match(line, "\"" k[i] "\":[^,}]*")) v = substr(line, RSTART + length(k[i]) + 3, RLENGTH - length(k[i]) - 3)
      out = out (i > 1 ? " " : "") v
    }
    print out
  }' "$1"
}

# the library's fields of trainer_state.json: step, data_position, rng_state
state_fields() {
  [ -f "$1" ] || { echo "(no $1)"; return 0; }
  tr -d ' \t\n' < "$1" | grep -o '"\(step\|data_position\)":"[0-9]*"\|"rng_state":\[[^]]*\]'
}

# the newest step-NNNNNNNN folder in $1 (its number), -1 if none
newest_step() {
  local n=-1 d s
  for d in "$1"/step-*; do
    s=${d##*/step-}
    case $s in '' | *[!0-9]*) continue ;; esac
    [ -d "$d" ] || continue
    s=$((10#$s))
    [ "$s" -gt "$n" ] && n=$s
  done
  echo "$n"
}

# how many step-NNNNNNNN folders $1 holds
step_folders() { find "$1" -mindepth 1 -maxdepth 1 -type d -name 'step-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]' | wc -l; }

# what a kill left in checkpoint folder $1: where in the save protocol it landed
landing() {
  local ck=$1 tmp latest newest n
  tmp=$(find "$ck" -maxdepth 1 -name 'step-*.tmp' | sed -n '1s,.*/,,p')
  newest=$(newest_step "$ck")
  latest=$(sed -n 's/^step-0*\([0-9]\)/\1/p' "$ck/latest" 2>/dev/null) || true
  n=$(step_folders "$ck")
  if [ -n "$tmp" ]; then echo "in a save: writing $tmp"
  elif [ -e "$ck/latest.tmp" ]; then echo "in a save: step-$(printf %08d "$newest") in place, writing latest.tmp"
  elif [ "${latest:-0}" != "$newest" ]; then echo "in a save: step-$(printf %08d "$newest") in place, latest not yet replaced"
  elif [ "$n" -gt 2 ]; then echo "in a save: latest replaced, older checkpoints not yet pruned"
  else echo "between saves"
  fi
}

# the kill plan: for each interruption, the gap in steps after the previous
# one, its delay (ms) and its kind; kinds in the order
# kill save term save int2 kill save kill save ...
gap_lo=$((steps / 14)) gap_hi=$((steps / 7))
plan=$(awk -v seed="$seed" -v lo="$gap_lo" -v hi="$gap_hi" 'BEGIN {
  srand(seed)
  split("kill save term save int2", first, " ")
  for (i = 1; i <= 40; i++) {
    kind = i <= 5 ? first[i] : (i % 2 ? "save" : "kill")
    gap = lo + int(rand() * (hi - lo + 1))
    delay = kind == "save" ? int(rand() * 7) : int(rand() * 1000)
    print gap, delay, kind
  }
}')

# the program and the library it loads must not change while the soak runs
lib=$(ldd "$bin" 2>/dev/null | sed -n 's/.*libmegatrain[^ ]* => \([^ ]*\) .*/\1/p')
program_sum() { cksum "$bin" ${lib:+"$lib"} | awk '{ print $1 }' | tr '\n' ' '; }
sum0=$(program_sum)
limit=$((steps / 25 + 120)) # seconds a segment may take (3-4 ms a step; 10x margin)
t_all=$(now)
echo "soak: $steps steps of megatrain train $shape --cpu --threads 1 (the demo), --save-every $save_every, seed $seed"
echo "soak: runs in $out"

# ---- 1. the reference ------------------------------------------------------------------
ref=$out/reference
mkdir -p "$ref"
SECONDS=0 seg_start=0
start "$ref" 1
wait_step "$ref/log.jsonl" "$steps" || true
finish
t_ref=$(secs "$seg_t0" "$(now)")
check "reference: exit $st, expected 0" [ "$st" -eq 0 ]
read -r range verdict <<< "$(rss_stats "$ref/seg-1.rss")"
echo "reference: steps 1-$steps, exit $st, ${t_ref} s, RSS $range MB ($verdict)"
case $verdict in *GROWS*) bad "reference: the resident set grows: $verdict" ;; *short*) ;; *) ok ;; esac
[ "$st" -eq 0 ] || { tail -n 5 "$ref/seg-1.out"; echo "soak: $passes passed, $fails failed"; exit 1; }

# ---- 2. the soak run ----------------------------------------------------------------------
run=$out/soak
ck=$run/checkpoints
mkdir -p "$run"
t_run=$(now)
seg=1 reached=0 kills=0 in_save=0 sigkills=0 done_=0 aborted=0
start "$run" $seg
seg_start=$SECONDS
summary=""
while read -r gap delay kind; do
  target=$((reached + gap))
  [ $((target + gap_lo / 2)) -le "$steps" ] || break
  if ! wait_step "$run/log.jsonl" "$target"; then
    finish
    segment_start
    if [ "$st" -eq 0 ] && [ "$(last_step "$run/log.jsonl")" = "$steps" ]; then
      done_=1
      summary="$summary
segment $seg: $from_txt, to the end before the kill planned at step $target; exit 0"
      break
    fi
    bad "segment $seg: the process ended (exit $st) before step $target"
    tail -n 5 "$run/seg-$seg.out"
    aborted=1
    break
  fi
  how=""
  case $kind in
    kill)
      sleep "$(printf '0.%03d' "$delay")"
      kill -KILL "$pid" 2>/dev/null || true
      want=137 how="SIGKILL after ${delay} ms" ;;
    save)
      now_step=$(last_step "$run/log.jsonl")
      next=$(((now_step / save_every + 1) * save_every))
      if wait_file "$ck/step-$(printf %08d "$next").tmp" 30; then
        sleep "0.00$delay"
        how="SIGKILL ${delay} ms after the save of step $next began"
      else
        how="SIGKILL (the save of step $next was not seen)"
      fi
      kill -KILL "$pid" 2>/dev/null || true
      want=137 ;;
    term)
      sleep "$(printf '0.%03d' "$delay")"
      kill -TERM "$pid" 2>/dev/null || true
      want=143 how="SIGTERM after ${delay} ms" ;;
    int2)
      sleep "$(printf '0.%03d' "$delay")"
      kill -INT "$pid" 2>/dev/null || true
      # the second once the first is acknowledged, so that it is a second signal
      wait_text "$run/seg-$seg.out" "megatrain: stopping" || bad "segment $seg: the first SIGINT was not acknowledged"
      kill -INT "$pid" 2>/dev/null || true
      want=130 how="SIGINT after ${delay} ms, then SIGINT again" ;;
  esac
  finish
  segment_start
  kills=$((kills + 1))
  reached=$(last_step "$run/log.jsonl")
  where=$(landing "$ck")
  newest=$(newest_step "$ck")
  if [ "$want" -eq 137 ]; then
    sigkills=$((sigkills + 1))
    case $where in "in a save"*) in_save=$((in_save + 1)) ;; esac
  fi
  check "segment $seg ($how): exit $st, expected $want" [ "$st" -eq "$want" ]
  case $kind in
    term)
      check "SIGTERM: no 'stopped by SIGTERM after step $reached'" grep -q "stopped by SIGTERM after step $reached of" "$run/seg-$seg.out"
      check "SIGTERM: the checkpoint is of step $newest, the last logged step is $reached" [ "$newest" = "$reached" ]
      check "SIGTERM: the model was not saved" grep -q "saved the model to" "$run/seg-$seg.out"
      check "SIGTERM: no resume command printed" grep -q "resume with: $bin train .* --resume $ck\$" "$run/seg-$seg.out" ;;
    int2)
      check "two SIGINTs: the second did not stop at once" grep -q "second signal: stopping now" "$run/seg-$seg.out" ;;
  esac
  read -r range verdict <<< "$(rss_stats "$run/seg-$seg.rss")"
  case $verdict in *GROWS*) bad "segment $seg: the resident set grows: $verdict" ;; *short*) ;; *) ok ;; esac
  summary="$summary
segment $seg: $from_txt, to step $reached; $how; exit $st; $where; newest checkpoint: step $newest; RSS $range MB ($verdict)"
  # resume, with the same options
  seg=$((seg + 1))
  start "$run" $seg --resume "$ck"
  seg_start=$SECONDS
  expect_from=$newest
done <<< "$plan"
if [ "$done_" -eq 0 ] && [ "$aborted" -eq 0 ]; then
  wait_step "$run/log.jsonl" "$steps" || true
  finish
  segment_start
  check "segment $seg (the last): exit $st, expected 0" [ "$st" -eq 0 ]
  [ "$st" -eq 0 ] || tail -n 5 "$run/seg-$seg.out"
  read -r range verdict <<< "$(rss_stats "$run/seg-$seg.rss")"
  case $verdict in *GROWS*) bad "segment $seg: the resident set grows: $verdict" ;; *short*) ;; *) ok ;; esac
  summary="$summary
segment $seg: $from_txt, to step $(last_step "$run/log.jsonl") (the end); exit $st; RSS $range MB ($verdict)"
fi
t_soak=$(secs "$t_run" "$(now)")

# ---- 3. the checks ---------------------------------------------------------------------------
# a resume with other settings is refused and changes nothing (the comparisons below run after it)
st=0
# shellcheck disable=SC2086
"$bin" train $opts --out "$run/model" --checkpoints "$ck" --log-file "$run/log.jsonl" --resume "$ck" --lr 1e-3 \
  > "$run/refused.out" 2>&1 || st=$?
check "a resume with another --lr: exit $st, expected 1" [ "$st" -eq 1 ]
check "a resume with another --lr: no 'schedule.lr' difference reported" grep -q "schedule.lr: " "$run/refused.out"
if cmp -s "$ref/model/model.safetensors" "$run/model/model.safetensors"; then ok; else bad "model.safetensors differs from the reference's"; fi
final=$(printf 'step-%08d' "$steps")
for f in model.safetensors optimizer.safetensors config.json; do
  if cmp -s "$ref/checkpoints/$final/$f" "$ck/$final/$f"; then ok; else bad "checkpoint $final/$f differs from the reference's"; fi
done
if [ "$(state_fields "$ref/checkpoints/$final/trainer_state.json")" = "$(state_fields "$ck/$final/trainer_state.json")" ]; then ok
else bad "trainer_state.json: step, data_position or rng_state differ from the reference's"; fi
for d in "$ref" "$run"; do
  name=${d##*/}
  got=$(awk -v n="$steps" 'BEGIN { k = 0 }
    { if (match($0, /^\{"step":[0-9]+,/)) s = substr($0, 9, RLENGTH - 9) + 0; else s = -1
      k++; if (s != k) { print "line " k " is step " s; exit } }
    END { if (k != n) print k " lines, expected " n }' "$d/log.jsonl")
  check "$name log: $got" [ -z "$got" ]
  left=$(find "$d/checkpoints" -mindepth 1 -maxdepth 1 ! -name latest \
    ! \( -type d -name 'step-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]' \) | sed 's,.*/,,' | tr '\n' ' ')
  check "$name checkpoints: leftovers: $left" [ -z "$left" ]
  n=$(step_folders "$d/checkpoints")
  check "$name checkpoints: $n step folders, at most 2 kept" [ "$n" -le 2 ]
  check "$name checkpoints: latest is '$(cat "$d/checkpoints/latest")', not $final" [ "$(cat "$d/checkpoints/latest")" = "$final" ]
  stray=$(find "$d" \( -name '*.tmp' -o -name '*.old' \) | tr '\n' ' ')
  check "$name: leftovers: $stray" [ -z "$stray" ]
done
diffs=$(log_fields "$ref/log.jsonl" | paste -d'|' - <(log_fields "$run/log.jsonl") | awk -F'|' '$1 != $2 { n++; if (n == 1) first = $0 } END { if (n) print n " lines differ, first: " first }')
check "the soak log's step, loss, lr, grad_norm, tokens or heldout_loss differ from the reference's: $diffs" [ -z "$diffs" ]
check "no SIGKILL landed inside a checkpoint save" [ "$in_save" -gt 0 ]
check "$bin or its libmegatrain changed while the soak ran" [ "$(program_sum)" = "$sum0" ]

t_total=$(secs "$t_all" "$(now)")
echo "soak run: $kills interruptions ($sigkills SIGKILL, $in_save of them inside a checkpoint save), $seg segments, ${t_soak} s$summary"
echo "final model, final checkpoint and log: $(if [ "$fails" -eq 0 ]; then echo "identical to the reference's"; else echo "see the failures above"; fi)"
echo "wall time: ${t_total} s (reference ${t_ref} s, soak run ${t_soak} s)"
echo "soak: $passes passed, $fails failed"
if [ "$fails" -eq 0 ] && [ "$keep_out" -eq 0 ]; then rm -rf "$out"; fi
[ "$fails" -eq 0 ]
