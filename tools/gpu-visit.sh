#!/bin/bash
# One visit to the GPU test machine: what it is, the benchmarks, the test
# suite, the CLI demo; full logs under $OUT (default ./out), a summary last.
# Build on the development machine first (make), copy build/, lib/, bin/ and
# .devdeps/ along (see ../shared/scripts/device-deps.sh), run from the root.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
[ -f .devdeps/env.sh ] && . ./.devdeps/env.sh
summary=()
run() { # name, command...
  local name=$1; shift
  local t0=$(date +%s.%N)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$? t1=$(date +%s.%N)
  summary+=("$(printf '%-14s rc=%-3d %6.1fs' "$name" "$rc" "$(awk -v a=$t0 -v b=$t1 'BEGIN{print b-a}')")")
}
run machine sh -c 'date -u; nvidia-smi; lscpu; free -g; nproc; cat /proc/meminfo | head -5'
run adamw build/bench/adamw --params 1G --threads 1,2,4,8,12,16 --iters 5
run adamw_isa sh -c 'for i in scalar avx2 avx512 avx512bf16; do build/bench/adamw --params 1G --threads 16 --iters 5 --isa $i; done'
run cpu_gemm build/bench/cpu_gemm
[ -x build/bench/cpu_step ] && run cpu_step build/bench/cpu_step
run tests build/tests/mt_tests --jobs 8
[ -x bin/megatrain ] && run demo bin/megatrain train --out "$OUT/demo-model"
rm -rf "$OUT/demo-model"
echo "== summary =="
printf '%s\n' "${summary[@]}"
grep -h -A12 'Gparam' "$OUT/adamw.log" | head -20
grep -h 'Synthesis' "$OUT/tests.log"
grep -h 'held-out\|trained in' "$OUT/demo.log" 2>/dev/null
