#!/bin/sh
# The lean mode's quality against the default one: the same model (113.7 M
# parameters), data, seed and schedule trained with --precision bf16 (14 bytes
# of host state a parameter) and --precision lean (6.05), on the GNU
# Collaborative International Dictionary of English (Debian's dict-gcide, 40 MB
# of English) read as bytes (a vocabulary of 256). Each run trains on 640
# steps of 32768 tokens (21 M tokens) and measures the loss on held-out
# windows (the file's last 1%, never trained on) every 32 steps; the script
# draws both curves into one SVG and prints the final held-out losses and
# their relative difference (docs/lean-optimizer.md: within 1%).
#
#   tools/lean-quality.sh [OUTDIR]         (default: lean-quality)
#
# Environment: GCIDE, the dictionary (default /usr/share/dictd/gcide.dict.dz,
# from `apt-get install dict-gcide`); MEGATRAIN, the CLI (default
# bin/megatrain); STEPS (640), SEED (1: the initial weights and the order of
# the windows), RUN_TIMEOUT (seconds a run may take, default none). Needs a GPU to finish in minutes (about 1.4e16 FLOPs a run) and
# python3 to turn the text into tokens.
set -eu
OUT=${1:-lean-quality}
GCIDE=${GCIDE:-/usr/share/dictd/gcide.dict.dz}
MEGATRAIN=${MEGATRAIN:-bin/megatrain}
STEPS=${STEPS:-640}
SEED=${SEED:-1}
if [ ! -f "$GCIDE" ]; then
    echo "lean-quality: $GCIDE not found: install Debian's dict-gcide (apt-get install dict-gcide) or set GCIDE" >&2
    exit 2
fi
mkdir -p "$OUT"
TOK="$OUT/gcide.u16"
if [ ! -f "$TOK" ]; then
    # every byte of the text is a token (UTF-8 bytes of accented entries included)
    gzip -dc "$GCIDE" | python3 -c '
import sys
from array import array
a = array("H")
a.extend(sys.stdin.buffer.read())  # each byte an element, widened
assert a.itemsize == 2 and sys.byteorder == "little"
open(sys.argv[1], "wb").write(a.tobytes())
print(f"lean-quality: {len(a)} tokens (bytes) of dictionary text", file=sys.stderr)' "$TOK"
fi
limit=""
[ -n "${RUN_TIMEOUT:-}" ] && limit="timeout $RUN_TIMEOUT"
for p in bf16 lean; do
    $limit "$MEGATRAIN" train --data "$TOK" --format u16 --vocab 256 --layers 12 --hidden 768 --heads 12 \
        --kv-heads 12 --ffn 3072 --seq-len 1024 --micro-batch 16 --grad-accum 2 --steps "$STEPS" --lr 1e-3 \
        --warmup 32 --seed "$SEED" --eval-every 32 --eval-batches 8 --log-every 32 --precision "$p" \
        --log-file "$OUT/$p.jsonl" --out "$OUT/model-$p" || echo "lean-quality: the $p run stopped early" >&2
done
"$MEGATRAIN" plot "$OUT/bf16.jsonl" "$OUT/lean.jsonl" -o "$OUT/lean-quality.svg" \
    --title "113.7 M parameters, dict-gcide bytes: bf16 (14 B/param) and lean (6.05 B/param)"
python3 - "$OUT/bf16.jsonl" "$OUT/lean.jsonl" <<'PY'
import json, sys
last = []
for path in sys.argv[1:]:
    held = [(r["step"], r["heldout_loss"]) for r in map(json.loads, open(path)) if r.get("heldout_loss") is not None]
    last.append(held[-1] if held else (None, float("nan")))
    print(f"{path}: final held-out loss {last[-1][1]:.4f} at step {last[-1][0]}")
(sb, b), (sl, l) = last
rel = (l - b) / b
print(f"lean against bf16: {100 * rel:+.2f}% ({'within' if abs(rel) <= 0.01 else 'NOT within'} 1%)")
PY
