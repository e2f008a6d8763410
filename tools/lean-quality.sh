#!/bin/sh
# The lean mode's quality against the default one: the same model (113.7 M
# parameters), data, seed and schedule trained with --precision bf16 (14 bytes
# of host state a parameter) and --precision lean (6.05), on the GNU
# Collaborative International Dictionary of English (Debian's dict-gcide, 40 MB
# of English) read as bytes (a vocabulary of 256). Each run trains on 640
# steps of 32768 tokens (21 M tokens) and measures the loss on held-out
# windows (the file's last 1%, never trained on) every 32 steps. For each
# seed the script draws the pair's curves into OUTDIR/seed-<s>/lean-quality.svg
# and prints their final held-out losses and relative difference; over
# several seeds, also the mean difference and its standard error (one pair's
# difference is about as noisy as the 1% bound: docs/lean-optimizer.md), and
# draws the mean curves of the seeds (OUTDIR/bf16-mean.jsonl and
# lean-mean.jsonl) into OUTDIR/lean-quality.svg. A run whose log already
# reaches the last step's held-out loss is kept, not run again: a second call
# with more seeds runs only the new ones, and one over finished logs (copied
# together from several visits, say) only summarises them.
#
#   tools/lean-quality.sh [OUTDIR]         (default: lean-quality)
#
# Environment: GCIDE, the dictionary (default /usr/share/dictd/gcide.dict.dz,
# from `apt-get install dict-gcide`); MEGATRAIN, the CLI (default
# bin/megatrain); STEPS (640); SEEDS, the pairs' seeds ("1" by default; "1 2 3
# 4" for four pairs; a seed sets a pair's initial weights and order of
# windows; SEED=n is SEEDS=n); RUN_TIMEOUT, the seconds a run may take
# (default: no limit). Needs a GPU to finish in minutes (about 1.4e16 FLOPs a
# run, 53 s on an H200) and python3 to turn the text into tokens.
set -eu
OUT=${1:-lean-quality}
GCIDE=${GCIDE:-/usr/share/dictd/gcide.dict.dz}
MEGATRAIN=${MEGATRAIN:-bin/megatrain}
STEPS=${STEPS:-640}
SEEDS=${SEEDS:-${SEED:-1}}
mkdir -p "$OUT"
TOK="$OUT/gcide.u16"
tokenize() {
    # every byte of the text is a token (UTF-8 bytes of accented entries included)
    gzip -dc "$GCIDE" | python3 -c '
import sys
from array import array
a = array("H")
a.extend(sys.stdin.buffer.read())  # each byte an element, widened
assert a.itemsize == 2 and sys.byteorder == "little"
open(sys.argv[1] + ".tmp", "wb").write(a.tobytes())
print(f"lean-quality: {len(a)} tokens (bytes) of dictionary text", file=sys.stderr)' "$TOK" &&
        mv "$TOK.tmp" "$TOK"
}
# finished: the log's last line is step STEPS with its held-out loss
finished() {
    [ -f "$1" ] && tail -n 1 "$1" | grep -q "^{\"step\":$STEPS,.*\"heldout_loss\":[0-9]"
}
limit=""
[ -n "${RUN_TIMEOUT:-}" ] && limit="timeout $RUN_TIMEOUT"
# one pair a seed: seed-<s>/bf16.jsonl and seed-<s>/lean.jsonl
for s in $SEEDS; do
    mkdir -p "$OUT/seed-$s"
    for p in bf16 lean; do
        if finished "$OUT/seed-$s/$p.jsonl"; then
            echo "lean-quality: the $p run of seed $s is already finished: kept" >&2
            continue
        fi
        if [ ! -f "$TOK" ]; then
            if [ ! -f "$GCIDE" ]; then
                echo "lean-quality: $GCIDE not found: install Debian's dict-gcide (apt-get install dict-gcide) or set GCIDE" >&2
                exit 2
            fi
            tokenize
        fi
        rm -f "$OUT/seed-$s/$p.jsonl" # a log cut short starts again
        $limit "$MEGATRAIN" train --data "$TOK" --format u16 --vocab 256 --layers 12 --hidden 768 --heads 12 \
            --kv-heads 12 --ffn 3072 --seq-len 1024 --micro-batch 16 --grad-accum 2 --steps "$STEPS" --lr 1e-3 \
            --warmup 32 --seed "$s" --eval-every 32 --eval-batches 8 --log-every 32 --precision "$p" \
            --log-file "$OUT/seed-$s/$p.jsonl" --out "$OUT/seed-$s/model-$p" ||
            echo "lean-quality: the $p run of seed $s stopped early" >&2
        rm -rf "$OUT/seed-$s/model-$p"
    done
    "$MEGATRAIN" plot "$OUT/seed-$s/bf16.jsonl" "$OUT/seed-$s/lean.jsonl" -o "$OUT/seed-$s/lean-quality.svg" \
        --title "113.7 M parameters, dict-gcide bytes, seed $s: bf16 (14 B/param) and lean (6.05 B/param)"
done
python3 - "$OUT" $SEEDS <<'PY'
import json, math, sys
out, seeds = sys.argv[1], sys.argv[2:]
def records(path):
    by_step = {}
    for r in map(json.loads, open(path)):
        by_step[r["step"]] = r  # a step logged twice (a resumed run): its later line
    return by_step
def final(path):
    held = [(s, r["heldout_loss"]) for s, r in sorted(records(path).items()) if r.get("heldout_loss") is not None]
    return held[-1] if held else (None, float("nan"))
if len(seeds) > 1:  # each precision's mean curve over the seeds, at the steps every log has
    for p in ("bf16", "lean"):
        logs = [records(f"{out}/seed-{s}/{p}.jsonl") for s in seeds]
        with open(f"{out}/{p}-mean.jsonl", "w") as f:
            for step in sorted(set.intersection(*(set(l) for l in logs))):
                row = {"step": step}
                for key in ("loss", "heldout_loss"):
                    vals = [l[step].get(key) for l in logs]
                    if all(v is not None for v in vals):
                        row[key] = sum(vals) / len(vals)
                f.write(json.dumps(row) + "\n")
gaps = []
for s in seeds:
    (sb, b), (sl, l) = final(f"{out}/seed-{s}/bf16.jsonl"), final(f"{out}/seed-{s}/lean.jsonl")
    gaps.append((l - b) / b)
    print(f"seed {s}: final held-out loss bf16 {b:.4f} (step {sb}), lean {l:.4f} (step {sl}): {100 * gaps[-1]:+.2f}%")
n = len(gaps)
mean = sum(gaps) / n
if n > 1:
    se = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (n - 1) / n)
    print(f"lean against bf16 over {n} seeds: mean {100 * mean:+.2f}%, standard error {100 * se:.2f}% "
          f"({'within' if abs(mean) <= 0.01 else 'NOT within'} 1%)")
else:
    print(f"lean against bf16: {100 * mean:+.2f}% ({'within' if abs(mean) <= 0.01 else 'NOT within'} 1%)")
PY
set -- $SEEDS
if [ $# -gt 1 ]; then
    "$MEGATRAIN" plot "$OUT/bf16-mean.jsonl" "$OUT/lean-mean.jsonl" -o "$OUT/lean-quality.svg" \
        --title "113.7 M parameters, dict-gcide bytes, mean of $# seeds: bf16 (14 B/param) and lean (6.05 B/param)"
fi
