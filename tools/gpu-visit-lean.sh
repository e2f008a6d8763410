#!/bin/bash
# The lean mode's part of a visit to the GPU test machine: its CUDA tests, its
# quality against the default mode (tools/lean-quality.sh: pairs of runs of a
# 113.7 M model on dict-gcide, about a minute each on an H200, four seeds; the mean
# of six is in docs/lean-optimizer.md), the
# Qwen2.5-14B shape and the 7B shape at 131072 tokens a step, and the largest
# lean model the machine holds; full logs under $OUT (default ./out), a
# summary last. Set up as for tools/gpu-visit.sh (build here, copy build/,
# lib/, bin/, .devdeps/ along; run from the root); the quality part needs
# Debian's dict-gcide text: GCIDE=path/to/gcide.dict.dz (the GPU machine has
# no package manager: copy the file along).
#   tools/gpu-visit-lean.sh                    everything
#   tools/gpu-visit-lean.sh quality step_14b   only the parts named
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
[ -f .devdeps/env.sh ] && . ./.devdeps/env.sh
summary=()
want=" $* "
run() { # name, command...
  local name=$1; shift
  [ "$want" = "  " ] || [[ "$want" == *" $name "* ]] || return 0
  local t0=$(date +%s.%N)
  timeout "${RUN_TIMEOUT:-300}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$? t1=$(date +%s.%N)
  summary+=("$(printf '%-14s rc=%-3d %6.1fs' "$name" "$rc" "$(awk -v a=$t0 -v b=$t1 'BEGIN{print b-a}')")")
}
run tests env MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 4 --verbose --filter 'cuda_backend/*lean*'
# four pairs (about 7.5 minutes): one pair's gap is as noisy as the 1% bound; finished runs
# are kept, so another visit with OUT's lean-quality/ copied back and more SEEDS adds pairs
RUN_TIMEOUT=${RUN_TIMEOUT:-580} run quality env GCIDE="${GCIDE:-/usr/share/dictd/gcide.dict.dz}" \
  SEEDS="${SEEDS:-1 2 3 4}" sh tools/lean-quality.sh "$OUT/lean-quality"
STEP="--seq-len 4096 --micro-batch 4 --grad-accum 8 --host-budget 118 --timeline"
run step_14b build/bench/step --preset qwen14b --lean --steps 3 $STEP
run step_7b build/bench/step --preset 7b --lean --steps 3 $STEP
# the 14B layer shape with 62 layers: 18.6 B parameters, 104.6 GiB of tiles by the plan (the default
# mode's largest, the 8.03 B Llama-3-8B shape, held 104.7 GiB)
RUN_TIMEOUT=${RUN_TIMEOUT:-580} run largest build/bench/step --preset qwen14b --layers 62 --lean --steps 2 \
  --seq-len 4096 --micro-batch 4 --grad-accum 8 --host-budget 120 --timeline
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
