#!/bin/bash
# Per-kernel GPU times of one training step of one decoder layer of a preset
# shape, with Nsight Compute (ncu; on the GPU machine pass the clocks through,
# --clock-control none, as its notes say). Prints every kernel in launch
# order (name, grid, microseconds) and the totals by kernel name; the raw
# CSV is left in $OUT/profile-layer.csv. Run from the repository root after
# `make`, on the GPU machine:
#
#   tools/profile-layer.sh [bench/step arguments...]
#
# default: --preset 7b --layers 1 --seq-len 4096 --micro-batch 4 --grad-accum 1
# (one micro-batch of 16384 tokens: the layer's kernels at the 7B shape).
# ncu replays each kernel to measure it, so a step takes a minute or two.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
[ -f .devdeps/env.sh ] && . ./.devdeps/env.sh
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--preset 7b --layers 1 --seq-len 4096 --micro-batch 4 --grad-accum 1)
csv="$OUT/profile-layer.csv"
ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$csv" \
  build/bench/step "${args[@]}" --steps 1 --warmup 0 --host-budget 30 > "$OUT/profile-layer.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "profile-layer: ncu or the step failed (rc $rc); see $OUT/profile-layer.log" >&2
  tail -5 "$OUT/profile-layer.log" >&2
  exit $rc
fi
python3 - "$csv" <<'EOF'
import csv, sys, collections
rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]  # ncu prints its own lines before the CSV
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1e3 if unit == "ns" else v * 1e3 if unit == "ms" else v if unit in ("us", "usecond") else v / 1e3
    rows.append((int(r["ID"]), r["Kernel Name"], r.get("Grid Size", ""), us))
rows.sort()
total = sum(r[3] for r in rows)
print(f"{'id':>4}  {'us':>9}  {'grid':<16} kernel")
for i, name, grid, us in rows:
    print(f"{i:>4}  {us:9.1f}  {grid:<16} {name[:100]}")
by = collections.defaultdict(lambda: [0, 0.0])
for _, name, _, us in rows:
    key = name.split("(")[0][:90]
    by[key][0] += 1
    by[key][1] += us
print(f"\n{len(rows)} kernels, {total / 1e3:.2f} ms in all; by name:")
for key, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"  {us / 1e3:8.2f} ms  {100 * us / total:5.1f}%  x{n:<3} {key}")
EOF
