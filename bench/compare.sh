#!/bin/bash
# Side-by-side training throughput on one GPU: libmegatrain (build/bench/step)
# against PyTorch + transformers with the whole model on the GPU and against
# PyTorch FSDP2 with CPU offload (bench/torch_baseline.py), on the same shapes,
# sequence length and tokens per optimizer step. Each run gets a timeout; its
# peak host memory is polled from /proc/PID/status (VmHWM) and the GPU's memory
# in use from nvidia-smi, every 0.5 s. One JSON line per run is appended to
# DIR/results.jsonl, every run's output to DIR/compare.log, and a markdown
# table of all the results in DIR/results.jsonl is printed last (and written to
# DIR/table.md). DIR is $OUT when set (what the GPU machine sends back), else
# out/compare. Run from the repository root, after `make`.
#
#   bench/compare.sh [--systems megatrain,gpu,fsdp2] [--cases 7b:4096:4:8,...]
#                    [--steps N] [--fsdp-steps N] [--warmup N] [--timeout S]
#                    [--budget S] [--host-budget GIB] [--host-limit-gib GIB]
#                    [--torch-mb N] [--out DIR] [--table]
#
# Systems: megatrain (build/bench/step), gpu (pytorch-gpu), fsdp2
# (pytorch-fsdp2-cpuoffload, gradients to the host on the last micro-batch),
# fsdp2-every (the same, gradients to the host after every micro-batch).
# A case is PRESET:SEQ:MICRO_BATCH:GRAD_ACCUM[:TORCH_MICRO_BATCH]: libmegatrain
# runs MICRO_BATCH x GRAD_ACCUM; the PyTorch systems run TORCH_MICRO_BATCH
# (default: --torch-mb, else 2 for qwen7b, else MICRO_BATCH) with the gradient
# accumulation that keeps the tokens per step. Default cases: 1b, 7b and qwen7b
# at 65536 and 131072 tokens per step, sequence 4096, micro-batch 4.
# --budget S stops starting runs once less than a minute of S seconds is left
# and caps each run's timeout by what is left (a GPU-machine visit allows 600 s
# a command). --table only prints the table of DIR/results.jsonl.
set -u

SYSTEMS=megatrain,gpu,fsdp2
CASES=1b:4096:4:4,1b:4096:4:8,7b:4096:4:4,7b:4096:4:8,qwen7b:4096:4:4,qwen7b:4096:4:8
STEPS=3
FSDP_STEPS=2
WARMUP=1
TIMEOUT=
BUDGET=0
HOST_BUDGET=118
HOST_LIMIT=
TORCH_MB=
DIR=${OUT:-out/compare}
TABLE_ONLY=0
PY=${PYTHON:-python3}
STEP_BIN=${STEP_BIN:-build/bench/step}
GPU_INDEX=${GPU_INDEX:-0}

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case $1 in
    --systems) SYSTEMS=$2; shift ;;
    --cases) CASES=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --fsdp-steps) FSDP_STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --host-budget) HOST_BUDGET=$2; shift ;;
    --host-limit-gib) HOST_LIMIT=$2; shift ;;
    --torch-mb) TORCH_MB=$2; shift ;;
    --out) DIR=$2; shift ;;
    --table) TABLE_ONLY=1 ;;
    -h|--help) usage 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; usage 2 ;;
  esac
  shift
done

mkdir -p "$DIR" || exit 1
RESULTS=$DIR/results.jsonl
LOG=$DIR/compare.log
TABLE=$DIR/table.md
[ -f .devdeps/env.sh ] && . ./.devdeps/env.sh
export PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")" && pwd)

# Appends one JSON line to $RESULTS: the record the run wrote (torch systems) or
# one parsed from its output (megatrain), or one saying why there is none, with
# the polled peaks added.
record() { # system preset seq mb ga rc why hwm_kib gpu_mib wall out_file json_file
  "$PY" - "$@" >> "$RESULTS" <<'EOF'
import json, re, sys
system, preset, seq, mb, ga, rc, why, hwm, gpu, wall, out, js = sys.argv[1:13]
seq, mb, ga, rc, hwm, gpu = int(seq), int(mb), int(ga), int(rc), int(hwm), int(gpu)
text = open(out, errors="replace").read()
rec = None
if js:
    try:
        lines = [l for l in open(js).read().splitlines() if l.strip()]
        rec = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        rec = None
if system == "libmegatrain":
    rec = {"system": system, "preset": preset, "seq_len": seq, "micro_batch": mb, "grad_accum": ga,
           "tokens_per_step": seq * mb * ga, "status": "error"}
    steps = [(int(a), float(b), float(c)) for a, b, c in
             re.findall(r"^step (\d+): ([\d.]+) s .*?loss ([-\d.naif]+)", text, re.M)]
    rec["warmup_seconds"] = [t for s, t, _ in steps if s == 0]
    rec["step_seconds"] = [t for s, t, _ in steps if s > 0]
    rec["losses"] = [l for _, _, l in steps]
    m = re.search(r"^\S+ (bf16|fp32), ([\d.]+) B parameters, .*?K=(\d+): median ([\d.]+) s, ([\d.]+) tokens/s, "
                  r"([\d.]+) model TFLOP/s", text, re.M)
    if m:
        rec.update(precision=m.group(1), params=round(float(m.group(2)) * 1e9), slots=int(m.group(3)),
                   median_step_s=float(m.group(4)), tokens_per_s=float(m.group(5)),
                   model_tflops=float(m.group(6)), status="ok")
if rec is None:
    rec = {"system": system, "preset": preset, "seq_len": seq, "micro_batch": mb, "grad_accum": ga,
           "tokens_per_step": seq * mb * ga, "status": "error"}
if rec.get("status") != "ok" or why:
    if why:
        rec["status"] = why
    elif rc != 0 and rec.get("status") in ("ok", "error"):
        rec["status"] = "error" if rc < 128 else f"killed (signal {rc - 128})"
    if "error" not in rec and rec["status"] != "ok":
        tail = [l for l in text.splitlines() if l.strip()][-3:]
        rec["error"] = f"exit code {rc}: " + " | ".join(tail)[-600:]
rec["exit_code"] = rc
rec["run_wall_seconds"] = float(wall)
if hwm > 0:
    rec["polled_host_hwm_bytes"] = hwm * 1024
if gpu > 0:
    rec["polled_gpu_used_bytes"] = gpu * (1 << 20)
print(json.dumps(rec))
EOF
}

table() {
  "$PY" - "$RESULTS" <<'EOF' | tee "$TABLE"
import json, sys
rows = []
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []
for l in lines:
    try:
        rows.append(json.loads(l))
    except ValueError:
        pass
G = float(1 << 30)
def f(v, fmt):
    return fmt % v if isinstance(v, (int, float)) else "-"
print("| system | shape | tokens/step | median step s | tokens/s | model TFLOP/s | peak host RSS GiB | peak GPU GiB | status |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for r in rows:
    host = max([r.get(k) or 0 for k in ("peak_host_rss_bytes", "peak_host_hwm_bytes", "polled_host_hwm_bytes")])
    gpu = r.get("polled_gpu_used_bytes") or r.get("peak_gpu_reserved_bytes")
    shape = "%s s%s %sx%s" % (r.get("preset"), r.get("seq_len"), r.get("micro_batch"), r.get("grad_accum"))
    status = r.get("status", "?")
    if status != "ok" and r.get("error"):
        status += ": " + r["error"].replace("|", "/")[:120]
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r.get("system"), shape, r.get("tokens_per_step", "-"), f(r.get("median_step_s"), "%.3f"),
        f(r.get("tokens_per_s"), "%.0f"), f(r.get("model_tflops"), "%.1f"), f(host / G if host else None, "%.1f"),
        f(gpu / G if gpu else None, "%.1f"), status))
EOF
}

if [ "$TABLE_ONLY" = 1 ]; then table; exit 0; fi

START=$SECONDS
# run_one SYSTEM PRESET SEQ MB GA LIMIT JSON_FILE COMMAND...: runs COMMAND with a timeout, polling its memory.
run_one() {
  local system=$1 preset=$2 seq=$3 mb=$4 ga=$5 limit=$6 js=$7
  shift 7
  local why="" tmp
  if [ "$BUDGET" -gt 0 ]; then
    local left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt 60 ]; then
      echo "== skip $system $preset s$seq ${mb}x$ga: ${left} s of the budget left" | tee -a "$LOG" >&2
      tmp=$(mktemp -d)
      : > "$tmp/out"
      record "$system" "$preset" "$seq" "$mb" "$ga" 0 "skipped (budget)" 0 0 0 "$tmp/out" ""
      rm -rf "$tmp"
      return
    fi
    [ $((left - 15)) -lt "$limit" ] && limit=$((left - 15))
  fi
  tmp=$(mktemp -d)
  echo "== $system $preset s$seq ${mb}x$ga (timeout ${limit} s): $*" | tee -a "$LOG" >&2
  local smi=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" -lms 500 \
      > "$tmp/gpu" 2>/dev/null &
    smi=$!
  fi
  local t0=$SECONDS hwm=0 v term_at=0
  "$@" > "$tmp/out" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    v=$(awk '/^(VmHWM|VmRSS):/ { if ($2 > m) m = $2 } END { print m + 0 }' "/proc/$pid/status" 2>/dev/null)
    [ -n "$v" ] && [ "$v" -gt "$hwm" ] && hwm=$v
    if [ "$term_at" = 0 ] && [ $((SECONDS - t0)) -ge "$limit" ]; then
      why="timeout (${limit} s)"
      kill -TERM "$pid" 2>/dev/null
      term_at=$SECONDS
    elif [ "$term_at" != 0 ] && [ $((SECONDS - term_at)) -ge 20 ]; then
      kill -KILL "$pid" 2>/dev/null
    fi
    sleep 0.5
  done
  wait "$pid"
  local rc=$? wall=$((SECONDS - t0))
  local gpu=0
  if [ -n "$smi" ]; then
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    gpu=$(awk '$1 + 0 > m { m = $1 + 0 } END { print m + 0 }' "$tmp/gpu")
  fi
  cat "$tmp/out" >> "$LOG"
  grep -E 'median|tokens/s|Error|error|Killed' "$tmp/out" | tail -n 3 >&2
  record "$system" "$preset" "$seq" "$mb" "$ga" "$rc" "$why" "$hwm" "$gpu" "$wall" "$tmp/out" "$js"
  tail -n 1 "$RESULTS" | "$PY" -c 'import json, sys
r = json.loads(sys.stdin.read())
m, t = r.get("median_step_s"), r.get("model_tflops")
print("   -> %s: %s, median %s s, %s model TFLOP/s" % (r["system"], r["status"],
      "%.3f" % m if m else "-", "%.1f" % t if t else "-"))' >&2
  rm -rf "$tmp"
}

for c in ${CASES//,/ }; do
  IFS=: read -r preset seq mb ga tmb <<< "$c"
  if [ -z "$preset" ] || [ -z "$seq" ] || [ -z "$mb" ] || [ -z "$ga" ]; then
    echo "compare.sh: bad case '$c' (PRESET:SEQ:MICRO_BATCH:GRAD_ACCUM[:TORCH_MICRO_BATCH])" >&2
    continue
  fi
  tokens=$((seq * mb * ga))
  if [ -z "$tmb" ]; then
    if [ -n "$TORCH_MB" ]; then tmb=$TORCH_MB; elif [ "$preset" = qwen7b ]; then tmb=2; else tmb=$mb; fi
  fi
  if [ $((tokens % (seq * tmb))) -ne 0 ]; then
    echo "compare.sh: case $c: $tokens tokens are not a multiple of $tmb x $seq" >&2
    continue
  fi
  tga=$((tokens / (seq * tmb)))
  for s in ${SYSTEMS//,/ }; do
    js=$(mktemp)
    case $s in
      megatrain)
        run_one libmegatrain "$preset" "$seq" "$mb" "$ga" "${TIMEOUT:-420}" "" \
          "$STEP_BIN" --preset "$preset" --seq-len "$seq" --micro-batch "$mb" --grad-accum "$ga" \
          --steps "$STEPS" --host-budget "$HOST_BUDGET" ;;
      gpu)
        run_one pytorch-gpu "$preset" "$seq" "$tmb" "$tga" "${TIMEOUT:-420}" "$js" \
          "$PY" "$HERE/torch_baseline.py" --mode gpu --preset "$preset" --seq-len "$seq" \
          --micro-batch "$tmb" --grad-accum "$tga" --steps "$STEPS" --warmup "$WARMUP" --json "$js" ;;
      fsdp2|fsdp2-every)
        sync=last
        [ "$s" = fsdp2-every ] && sync=every
        run_one pytorch-fsdp2-cpuoffload "$preset" "$seq" "$tmb" "$tga" "${TIMEOUT:-540}" "$js" \
          "$PY" "$HERE/torch_baseline.py" --mode fsdp2 --grad-sync "$sync" --preset "$preset" \
          --seq-len "$seq" --micro-batch "$tmb" --grad-accum "$tga" --steps "$FSDP_STEPS" \
          --warmup "$WARMUP" --json "$js" ${HOST_LIMIT:+--host-limit-gib "$HOST_LIMIT"} ;;
      *) echo "compare.sh: unknown system $s (megatrain, gpu, fsdp2, fsdp2-every)" >&2 ;;
    esac
    rm -f "$js"
  done
done
echo "== results: $RESULTS, log: $LOG" >&2
table
