#!/bin/bash
# Several GPUs of one host (issue 20) on a machine of the nvidia-h200-x2 kind
# or larger: the CUDA tests (the group of two GPUs against one, the group of
# one over NCCL, fetching in slices against fetching whole), then the 7B
# shape at 131072 tokens per GPU on 1 and on G GPUs, the weights fetched
# whole and in slices (model TFLOP/s per GPU against the one-GPU figure: the
# faster of the two should become MT_FETCH_AUTO's choice). Logs under $OUT (default ./out),
# a summary last. Set up as for tools/gpu-visit.sh; NCCL must be loadable:
# the CUDA toolkit's libnccl.so.2, or PyTorch's (this script adds the first
# nvidia/nccl/lib of python3's site-packages to LD_LIBRARY_PATH when found).
#   tools/gpu-visit-multi.sh [G]           (default: every GPU)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
[ -f .devdeps/env.sh ] && . ./.devdeps/env.sh
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
G=${1:-$(nvidia-smi -L | wc -l)}
devs=$(seq -s, 0 $((G - 1)))
summary=()
run() { # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  summary+=("$(printf '%-16s rc=%-3d %5ds  %s' "$name" $? $(( $(date +%s) - t0 )) "$(tail -1 "$OUT/$name.log")")")
}
run tests 300 env MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 2 --filter 'cuda_backend/*'
SHAPE="--preset 7b --seq-len 4096 --micro-batch 4 --steps 3 --host-budget 110 --timeline"
run step_7b_1gpu 300 build/bench/step $SHAPE --grad-accum 8
run "step_7b_${G}gpu" 300 build/bench/step $SHAPE --grad-accum $((8 * G)) --devices "$devs" --weight-fetch whole
run "step_7b_${G}gpu_slices" 300 build/bench/step $SHAPE --grad-accum $((8 * G)) --devices "$devs" --weight-fetch slices
# with 3 slots the all-gather, queued behind the reduce-scatter, has a visit's time to finish (docs/benchmarks.md)
run "step_7b_${G}gpu_slices_k3" 300 build/bench/step $SHAPE --grad-accum $((8 * G)) --devices "$devs" --weight-fetch slices --slots 3
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
