#!/bin/sh
# megatrain plot: sample training logs drawn as SVG. Checks the exit
# statuses, that each SVG is well-formed XML with two curves per log and the
# legend's names, the summary lines' numbers, that a step logged twice is
# taken from its later line, that a million-step log's spikes survive the
# thinning, that broken logs are refused with file and line, and that no
# temporary file is left beside the output.
# usage: tests/plot.sh [MEGATRAIN]   (default bin/megatrain)
set -eu
LC_ALL=C
export LC_ALL
BIN=${1:-bin/megatrain}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out="$dir/svg"
mkdir "$out"
passes=0 fails=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
# run STATUS COMMAND...: stdout to $dir/stdout, stderr to $dir/stderr
run() {
  want=$1
  shift
  got=0
  "$@" > "$dir/stdout" 2> "$dir/stderr" || got=$?
  if [ "$got" -eq "$want" ]; then ok; else bad "$*: exit $got, expected $want"; sed 's/^/  | /' "$dir/stderr" | tail -5; fi
}
# has FILE TEXT: the file holds the text (as is, not a pattern)
has() {
  if grep -qF -- "$2" "$1"; then ok; else bad "$(basename "$1") lacks '$2'"; sed 's/^/  | /' "$1" | tail -3; fi
}
# count FILE PATTERN EXPECTED: lines matching
count() {
  n=$(grep -c -- "$2" "$1" || true)
  [ "$n" -eq "$3" ] && ok || bad "$(basename "$1"): $n lines with '$2', expected $3"
}
# points FILE N: the number of points of the file's Nth curve
points() { grep '<polyline' "$1" | sed -n "$2p" | tr ' ' '\n' | grep -c ',' || true; }

if command -v xmllint > /dev/null 2>&1; then
  xml_check() { xmllint --noout "$1"; }
elif command -v python3 > /dev/null 2>&1; then
  xml_check() { python3 -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' "$1"; }
else
  echo "plot: neither xmllint nor python3 is here: the SVGs are not checked for well-formed XML"
  xml_check() { :; }
fi
# svg FILE: exists, and is well-formed XML with an <svg> root
svg() {
  if [ -s "$1" ] && xml_check "$1" && grep -q '^<svg ' "$1" && tail -n 1 "$1" | grep -q '^</svg>$'; then ok
  else bad "$(basename "$1") is missing or not a well-formed SVG"; fi
}

# make_log FIRST LAST OFFSET [LOSS200]: steps FIRST..LAST of a falling loss
# (with a spike at step 137), the held-out loss every 50 steps (lowest at
# step 200, rising after it); LOSS200 replaces the held-out loss of step 200.
# The lines look like the train command's, with a key it does not write.
make_log() {
  awk -v first="$1" -v last="$2" -v off="$3" -v h200="${4:-}" 'BEGIN {
    for (s = first; s <= last; s++) {
      l = (s == 137 ? 6.5 : 2 + 3 * exp(-s / 80) + 0.05 * sin(1.7 * s)) + off
      printf "{\"step\":%d,\"loss\":%.4f,\"lr\":0.003,\"grad_norm\":1.25,\"tokens\":1024,", s, l
      printf "\"tokens_per_s\":12345.6,\"seconds\":0.083,\"elapsed\":%.3f", s * 0.083
      if (s % 50 == 0) {
        h = 2.3 + 3 * exp(-s / 100) + (s > 200 ? (s - 200) * 0.004 : 0) + off
        printf ",\"heldout_loss\":%.4f", (s == 200 && h200 != "") ? h200 : h
      }
      if (s % 97 == 0) printf ",\"later_key\":{\"a\":[1,null,\"x\"]}"
      print "}"
    }
  }'
}

make_log 1 300 0 > "$dir/run.jsonl"
# a run resumed at step 150 whose log still held steps 151-200: those lines
# are written again, and the later ones count (not the first held-out 1.0)
{ make_log 1 200 0.3 1.0; echo; make_log 151 300 0.3; } > "$dir/resumed.jsonl"

# ---- help and options ------------------------------------------------------------
run 0 "$BIN" plot --help
for t in "usage: megatrain plot" "-o, --out FILE" "--title TEXT" "--log-y" "--width PX" "--height PX"; do
  has "$dir/stdout" "$t"
done
run 1 "$BIN" plot "$dir/run.jsonl" -o "$out/x.svg" --frobnicate
has "$dir/stderr" "unknown option '--frobnicate'"
run 1 "$BIN" plot "$dir/run.jsonl"
has "$dir/stderr" "-o FILE"
run 1 "$BIN" plot -o "$out/x.svg"
run 1 "$BIN" plot "$dir/run.jsonl" -o "$out/x.svg" --width 12
has "$dir/stderr" "--width"

# ---- one log -------------------------------------------------------------------------
run 0 "$BIN" plot "$dir/run.jsonl" -o "$out/run.svg"
svg "$out/run.svg"
count "$out/run.svg" '<polyline' 2
count "$out/run.svg" '<circle' 7
has "$out/run.svg" ">training loss</text>"
has "$out/run.svg" ">held-out loss</text>"
has "$out/run.svg" ">run.jsonl</text>"
has "$out/run.svg" ">step</text>"
has "$out/run.svg" ">loss</text>"
[ "$(points "$out/run.svg" 1)" -eq 300 ] && ok || bad "run.svg: $(points "$out/run.svg" 1) training points, expected 300"
[ "$(points "$out/run.svg" 2)" -eq 6 ] && ok || bad "run.svg: $(points "$out/run.svg" 2) held-out points, expected 6"
has "$dir/stdout" "run.jsonl: steps 1-300 (300 logged), training loss 5.0123 -> 2.1142, best held-out 2.7060 at step 200"
count "$dir/stdout" . 1
[ ! -s "$dir/stderr" ] && ok || bad "one log: unexpected messages: $(cat "$dir/stderr")"
# the same output again: replaced
run 0 "$BIN" plot "$dir/run.jsonl" -o "$out/run.svg" --width 640 --height 400 --title 'loss of "a" & <b>'
svg "$out/run.svg"
has "$out/run.svg" 'width="640" height="400"'
has "$out/run.svg" ">loss of &quot;a&quot; &amp; &lt;b&gt;</text>"

# ---- two logs, one resumed over itself -----------------------------------------------
run 0 "$BIN" plot "$dir/run.jsonl" "$dir/resumed.jsonl" -o "$out/two.svg"
svg "$out/two.svg"
count "$out/two.svg" '<polyline' 4
for t in "run.jsonl training" "run.jsonl held-out" "resumed.jsonl training" "resumed.jsonl held-out" \
  "run.jsonl, resumed.jsonl"; do
  has "$out/two.svg" ">$t</text>"
done
[ "$(points "$out/two.svg" 2)" -eq 300 ] && ok || bad "two.svg: $(points "$out/two.svg" 2) points of the resumed log, expected 300"
has "$dir/stdout" "run.jsonl: steps 1-300 (300 logged), training loss 5.0123 -> 2.1142, best held-out 2.7060 at step 200"
has "$dir/stdout" "resumed.jsonl: steps 1-300 (300 logged), training loss 5.3123 -> 2.4142, best held-out 3.0060 at step 200"
count "$dir/stdout" . 2

run 0 "$BIN" plot "$dir/run.jsonl" "$dir/resumed.jsonl" --log-y -o "$out/log.svg"
svg "$out/log.svg"
count "$out/log.svg" '<polyline' 4
has "$out/log.svg" ">loss (log scale)</text>"

# ---- a million steps: thinned, the spike kept --------------------------------------------
awk 'BEGIN { for (s = 1; s <= 1000000; s++) {
  printf "{\"step\":%d,\"loss\":%.4f", s, s == 654321 ? 100 : 2 + 3 * exp(-s / 200000) + 0.1 * sin(s)
  if (s % 1000 == 0) printf ",\"heldout_loss\":%.4f", 2.2 + 3 * exp(-s / 200000)
  print "}" } }' > "$dir/big.jsonl"
run 0 "$BIN" plot "$dir/big.jsonl" -o "$out/big.svg"
svg "$out/big.svg"
n=$(points "$out/big.svg" 1)
[ "$n" -gt 1000 ] && [ "$n" -le 2000 ] && ok || bad "big.svg: $n training points, expected 1000-2000"
has "$out/big.svg" ">100</text>" # the loss axis reaches the spike's 100
has "$dir/stdout" "big.jsonl: steps 1-1000000 (1000000 logged)"

# ---- logs with gaps and non-finite losses ------------------------------------------------
{
  echo '{"step":1,"loss":4.5,"heldout_loss":4.75}'
  echo
  echo '{"step":2,"loss":null}'
  printf '{"step":3,"loss":4.25,"heldout_loss":null}\r\n'
  echo '   '
  echo '{"step":4,"loss":4.0,"heldout_loss":4.5}'
} > "$dir/nulls.jsonl"
run 0 "$BIN" plot "$dir/nulls.jsonl" -o "$out/nulls.svg"
svg "$out/nulls.svg"
has "$dir/stdout" "nulls.jsonl: steps 1-4 (3 logged), training loss 4.5000 -> 4.0000, best held-out 4.5000 at step 4"
count "$dir/stderr" "nulls.jsonl" 1
has "$dir/stderr" "2 non-finite losses"

# ---- broken logs --------------------------------------------------------------------------
{ make_log 1 3 0; echo '{"step": 4, "loss": '; make_log 5 9 0; } > "$dir/broken.jsonl"
run 1 "$BIN" plot "$dir/run.jsonl" "$dir/broken.jsonl" -o "$out/broken.svg"
has "$dir/stderr" "broken.jsonl:4:"
[ ! -e "$out/broken.svg" ] && ok || bad "broken.svg was written"
printf '{"step":1,"loss":3}\n{"step":2,"lr":0.1}\n' > "$dir/noloss.jsonl"
run 1 "$BIN" plot "$dir/noloss.jsonl" -o "$out/noloss.svg"
has "$dir/stderr" "noloss.jsonl:2:"
printf '{"step":1,"loss":3}\n[1, 2]\n' > "$dir/array.jsonl"
run 1 "$BIN" plot "$dir/array.jsonl" -o "$out/array.svg"
has "$dir/stderr" "array.jsonl:2:"
: > "$dir/empty.jsonl"
run 1 "$BIN" plot "$dir/empty.jsonl" -o "$out/empty.svg"
has "$dir/stderr" "empty.jsonl"
run 1 "$BIN" plot "$dir/missing.jsonl" -o "$out/missing.svg"
has "$dir/stderr" "missing.jsonl"
cp "$dir/run.jsonl" "$dir/copy.jsonl"
run 1 "$BIN" plot "$dir/copy.jsonl" -o "$dir/copy.jsonl"
has "$dir/stderr" "would overwrite the log"
cmp -s "$dir/run.jsonl" "$dir/copy.jsonl" && ok || bad "-o a log: the log was changed"
run 1 "$BIN" plot "$dir/run.jsonl" -o "$dir/no/such/dir/x.svg"
has "$dir/stderr" "$dir/no/such/dir/x.svg"

# ---- nothing but the plots beside them --------------------------------------------------
left=$(cd "$out" && ls -A | tr '\n' ' ')
[ "$left" = "big.svg log.svg nulls.svg run.svg two.svg " ] && ok || bad "the output folder holds: $left"

echo "plot: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
