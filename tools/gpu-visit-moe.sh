#!/bin/bash
# The mixture-of-experts part of a visit to the GPU test machine (Qwen3-MoE,
# Mixtral): the MoE kernels and backend tests, the transformers fixtures made
# and checked, compute-sanitizer on MoE steps, the 30B-A3B and 8x7B shapes'
# steps; full logs under $OUT (default ./out), a summary last. Set up as for
# tools/gpu-visit.sh (build here, copy build/, lib/, bin/, .devdeps/ along;
# run from the root).
#   tools/gpu-visit-moe.sh                      everything
#   tools/gpu-visit-moe.sh fixtures parity_cpu  only the parts named
# The fixtures part writes tests/fixtures/qwen3_moe, mixtral and their _routed
# variants (copy them back and commit them); the parity parts read them (the
# _routed ones are the bf16 and CUDA suites' MoE fixtures: docs/parity.md).
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
  summary+=("$(printf '%-16s rc=%-3d %6.1fs' "$name" "$rc" "$(awk -v a=$t0 -v b=$t1 'BEGIN{print b-a}')")")
}
T=build/tests/mt_tests
run moe_kernels env MT_REQUIRE_GPU=1 $T --jobs 1 --verbose --filter 'cuda_kernels/moe*'
run moe_backend env MT_REQUIRE_GPU=1 $T --jobs 1 --verbose --filter 'cuda_backend/moe*'
run moe_cpu $T --jobs 4 --filter 'moe*/*'
run fixtures python3 tools/fixtures/make_fixtures.py --out tests/fixtures --only qwen3_moe mixtral qwen3_moe_routed mixtral_routed
for f in qwen3_moe mixtral qwen3_moe_routed mixtral_routed; do
  run parity_cpu_$f $T --jobs 1 --verbose --filter "parity/$f"
  run parity_bf16_$f $T --jobs 1 --verbose --filter "parity_bf16_cpu/$f"
  run cuda_parity_$f env MT_REQUIRE_GPU=1 $T --jobs 1 --verbose --filter "cuda_parity/${f}_*"
done
# transformers reads back what the library writes (the experts as per-expert tensors): each fixture
# trained 2 steps on random tokens below 96, in bf16 and fp32, then check_roundtrip.py on the folders
python3 -c "import random, struct; random.seed(1); open('$OUT/tok96.u16', 'wb').write(struct.pack('<4000H', *[random.randrange(96) for _ in range(4000)]))"
TRAIN="--data $OUT/tok96.u16 --format u16 --seq-len 24 --micro-batch 2 --steps 2"
run roundtrip sh -c "bin/megatrain train --model tests/fixtures/qwen3_moe/model $TRAIN --out $OUT/rt_qwen3_moe \
  && bin/megatrain train --model tests/fixtures/mixtral/model $TRAIN --fp32 --out $OUT/rt_mixtral \
  && python3 tools/fixtures/check_roundtrip.py $OUT/rt_qwen3_moe $OUT/rt_mixtral tests/fixtures/qwen3_moe/model tests/fixtures/mixtral/model"
run sanitizer sh -c "compute-sanitizer --tool memcheck $T --jobs 1 --filter 'cuda_backend/moe_qwen3_moe_step_matches_cpu_bf16' \
  && compute-sanitizer --tool racecheck $T --jobs 1 --filter 'cuda_kernels/moe_route'"
# 12 of Qwen3-30B-A3B's 48 layers fit a 125 GiB host (8.7 GB a layer, 8.7 GB of embedding and head);
# 5 of Mixtral-8x7B's 32 (19.7 GB a layer)
RUN_TIMEOUT=${RUN_TIMEOUT:-580} run step_30b_a3b build/bench/step --preset qwen3-30b-a3b --layers 12 --seq-len 4096 \
  --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline
RUN_TIMEOUT=${RUN_TIMEOUT:-580} run step_8x7b build/bench/step --preset mixtral-8x7b --layers 5 --seq-len 4096 \
  --micro-batch 1 --grad-accum 4 --steps 3 --host-budget 118 --timeline
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
