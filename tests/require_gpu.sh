#!/bin/sh
# MT_REQUIRE_GPU=1 (tests/gpu.h) makes a GPU test that finds no GPU fail
# instead of skip. This checks the switch on the GPU suites (cuda_*: the
# attention, the kernels, the backend and its parity tests):
# - without a GPU usable by this build (no device, no driver, a CUDA=0
#   build): without the switch the suites pass, their GPU tests skipping;
#   with it every one of those skips is a failure that says no GPU was found,
#   and the tests that need no GPU still pass;
# - with a GPU: the suites pass with the switch (a test that needs two GPUs
#   may still skip on a machine with one).
# Whether there is a GPU is asked of the suite itself: cuda_kernels/sumsq,
# which exists in every build, runs or skips.
# Run by `make check` after the suite.
# usage: tests/require_gpu.sh [MT_TESTS]   (default build/tests/mt_tests)
# MT_REQUIRE_GPU_FILTER replaces the suites' filter (default 'cuda_*/*').
set -eu
LC_ALL=C
export LC_ALL
BIN=${1:-build/tests/mt_tests}
FILTER=${MT_REQUIRE_GPU_FILTER:-cuda_*/*}
PROBE='cuda_kernels/sumsq'
SAYS='MT_REQUIRE_GPU=1 but this test found no GPU'

[ -x "$BIN" ] || { echo "require_gpu: $BIN is missing (run make first)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
bad() { echo "require_gpu: FAIL: $*"; fails=$((fails + 1)); }
show() { grep -v 'Test is disabled' "$1" | sed 's/^/  | /' | tail -"${2:-8}"; }

# suite OUT [ENV...]: the suite under FILTER with the environment given,
# verbose (skips are listed), output to $dir/OUT; its exit status in $rc.
suite() {
  out="$dir/$1"
  shift
  rc=0
  env -u MT_REQUIRE_GPU "$@" "$BIN" --jobs 1 --verbose --filter "$FILTER" > "$out" 2>&1 || rc=$?
}
# synthesis FILE FIELD: a number of Criterion's last line (Tested, Passing, Failing, Crashing)
synthesis() { sed -n "s/.*Synthesis:.* $2: \([0-9]*\).*/\1/p" "$1" | tail -1; }
# skips FILE: the tests that skipped for a reason (not those the filter left out)
skips() { grep '^\[SKIP\]' "$1" | grep -vc 'Test is disabled' || true; }

# Is there a GPU? The probe runs (passes) or skips; anything else is broken.
probe_rc=0
env -u MT_REQUIRE_GPU "$BIN" --jobs 1 --verbose --filter "$PROBE" > "$dir/probe" 2>&1 || probe_rc=$?
if [ "$probe_rc" -ne 0 ] || [ "$(synthesis "$dir/probe" Failing)" != 0 ]; then
  echo "require_gpu: the probe $PROBE failed (exit $probe_rc)"
  show "$dir/probe"
  exit 1
fi
if grep -q "^\[SKIP\] ${PROBE%%/*}::${PROBE#*/}:" "$dir/probe"; then
  gpu=0
  why=$(sed -n "s/^\[SKIP\] ${PROBE%%/*}::${PROBE#*/}: //p" "$dir/probe")
  echo "require_gpu: no GPU for this build ($why)"
elif [ "$(synthesis "$dir/probe" Passing)" = 1 ]; then
  gpu=1
  echo "require_gpu: a GPU is present"
else
  echo "require_gpu: the probe $PROBE neither ran nor skipped"
  show "$dir/probe"
  exit 1
fi

if [ "$gpu" = 0 ]; then
  # without the switch: a pass, the GPU tests skipping
  suite plain
  skipped=$(skips "$dir/plain")
  ran=$(synthesis "$dir/plain" Tested)
  if [ "$rc" -ne 0 ]; then bad "without MT_REQUIRE_GPU the suites failed (exit $rc)"; show "$dir/plain"; fi
  if [ "$skipped" -eq 0 ]; then bad "without MT_REQUIRE_GPU no test under '$FILTER' skipped"; show "$dir/plain"; fi
  # with it: a failure for each of those skips, each saying why
  suite required MT_REQUIRE_GPU=1
  failed=$(synthesis "$dir/required" Failing)
  passed=$(synthesis "$dir/required" Passing)
  said=$(grep -cF "$SAYS" "$dir/required" || true)
  left=$(skips "$dir/required")
  if [ "$rc" -eq 0 ]; then bad "with MT_REQUIRE_GPU=1 the suites passed"; show "$dir/required"; fi
  if [ "$failed" != "$skipped" ]; then bad "with MT_REQUIRE_GPU=1, $failed failures for $skipped skips"; fi
  if [ "$said" != "$skipped" ]; then bad "with MT_REQUIRE_GPU=1, $said failures say '$SAYS', not $skipped"; fi
  if [ "$left" -ne 0 ]; then
    bad "with MT_REQUIRE_GPU=1, $left tests still skip:"
    grep '^\[SKIP\]' "$dir/required" | grep -v 'Test is disabled' | sed 's/^/  | /'
  fi
  if [ "$passed" != "$ran" ]; then bad "with MT_REQUIRE_GPU=1, $passed tests pass, not the $ran that need no GPU"; fi
  [ "$fails" -eq 0 ] &&
    echo "require_gpu: ok: '$FILTER' passes with $skipped skips, and with MT_REQUIRE_GPU=1 fails them all ($SAYS)"
else
  suite required MT_REQUIRE_GPU=1
  if [ "$rc" -ne 0 ]; then bad "with MT_REQUIRE_GPU=1 on a GPU machine the suites failed (exit $rc)"; show "$dir/required" 20; fi
  if grep -qF "$SAYS" "$dir/required"; then bad "a test found no GPU on a GPU machine"; grep -F "$SAYS" "$dir/required"; fi
  [ "$fails" -eq 0 ] && echo "require_gpu: ok: '$FILTER' passes with MT_REQUIRE_GPU=1" \
    "($(synthesis "$dir/required" Passing) tests, $(skips "$dir/required") skipped)"
fi
[ "$fails" -eq 0 ]
