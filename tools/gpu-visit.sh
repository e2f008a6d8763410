#!/bin/bash
# One visit to the GPU test machine: what it is, the GPU test suites, the
# whole suite, the CLI demo on the GPU, compute-sanitizer on a short run, the
# benchmarks; full logs under $OUT (default ./out), a summary last.
# Build on the development machine first (make), copy build/, lib/, bin/ and
# .devdeps/ (the GPU machine's runtime libraries and their env.sh) along, run from the root.
#   tools/gpu-visit.sh                 everything
#   tools/gpu-visit.sh gpu_tests step_7b   only the parts named
#   RUN_TIMEOUT=580 tools/gpu-visit.sh long_7b   each part's time limit (300 s)
#   PREV_STEP=old/step tools/gpu-visit.sh step_7b_prev1 step_7b_now1 step_7b_prev2 step_7b_now2
#                                      the 7B step of an earlier build against this one's
#                                      (step_moe_prev1 .. step_moe_now2: Qwen3-30B-A3B, 12 layers;
#                                      step_mixtral_prev1 ..: Mixtral-8x7B, 5 layers; STEP_ARGS=--lean: lean)
#   PREV_FP=old/fingerprint tools/gpu-visit.sh fingerprint_prev fingerprint fingerprint_cmp
#                                      the bits of short runs (and of three 7B steps) of an
#                                      earlier build against this one's: a refactor must print the same
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
run machine sh -c 'date -u; nvidia-smi; lscpu | head -20; free -g; nproc'
# fixtures that the generator has and tests/fixtures lacks: made here (transformers is on this machine),
# returned as $OUT/fixtures_new.tgz to unpack into tests/fixtures
run fixtures_new sh -c 'for f in $(python3 -c "import sys; sys.path.insert(0, \"tools/fixtures\"); import make_fixtures as m; print(\" \".join(m.FIXTURES))"); do [ -d tests/fixtures/$f ] || python3 tools/fixtures/make_fixtures.py --out "$0/fixtures_new" --only $f || echo "FAILED $f"; done; tar czf "$0/fixtures_new.tgz" -C "$0/fixtures_new" .' "$OUT"
# the parity suites on those new fixtures, unpacked into tests/fixtures (FIXTURES_NEW="name ...": which)
run parity_new sh -c 'tar xzf "$0/fixtures_new.tgz" -C tests/fixtures && for f in $FIXTURES_NEW; do for s in parity cuda_parity parity_bf16_cpu; do MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 4 --verbose --filter "$s/$f*"; done; done' "$OUT"
# fixtures made again over the committed ones (FIXTURES_REMAKE="name ...": a fixture whose generator gained a
# field, as phi3_longrope's bf16_emulation), returned as $OUT/fixtures_remake.tgz to unpack into tests/fixtures
run fixtures_remake sh -c 'for f in $FIXTURES_REMAKE; do python3 tools/fixtures/make_fixtures.py --out "$0/fixtures_remake" --only $f || echo "FAILED $f"; done; tar czf "$0/fixtures_remake.tgz" -C "$0/fixtures_remake" .' "$OUT"
# transformers reads what the library writes, for the families of issue 33: each fixture's folder trained 2 steps
# on random tokens below 96 (bf16, and fp32 for the routed ones) by the CLI on the CPU, then check_roundtrip.py
run roundtrip_families sh -c 'python3 -c "import random, struct; random.seed(1); open(\"$0/tok96.u16\", \"wb\").write(struct.pack(\"<4000H\", *[random.randrange(96) for _ in range(4000)]))" && T="--data $0/tok96.u16 --format u16 --seq-len 24 --micro-batch 2 --steps 2 --cpu" && for f in gpt_oss deepseek_v3 deepseek_v2 llama4 qwen2_moe phi3_longrope gpt_oss_routed deepseek_v3_routed llama4_routed; do [ -d tests/fixtures/$f ] || continue; p=bf16; case $f in *_routed) p=fp32;; esac; bin/megatrain train --model tests/fixtures/$f/model $T --precision $p --out "$0/rt/$f" >/dev/null || echo "FAILED train $f"; done; python3 tools/fixtures/check_roundtrip.py "$0"/rt/*' "$OUT"
# the reference modeling code of the families to come, as the installed transformers has it
run hf_src sh -c 'd=$(python3 -c "import transformers, os; print(os.path.dirname(transformers.__file__))"); python3 -c "import transformers, torch; print(transformers.__version__, torch.__version__)"; cd "$d" && tar czf "$0/hf_src.tgz" modeling_rope_utils.py masking_utils.py integrations/sdpa_attention.py integrations/flex_attention.py models/gpt_oss models/deepseek_v3 models/deepseek_v2 models/llama4 models/qwen2_moe' "$OUT"
run gpu_tests env MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 1 --verbose --filter 'cuda_*/*'
run gpu_backend env MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 1 --verbose --filter 'backend/*'
# the GPU tests of the MoE path, the norms and the head alone (a few minutes, where gpu_tests takes many)
run gpu_tests_moe env MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 1 --verbose --filter '@(cuda_kernels/rmsnorm*|cuda_kernels/moe*|cuda_grouped/*|cuda_backend/moe*|cuda_backend/head*|cuda_backend/mlp*|cuda_backend/qwen3*|cuda_backend/step_matches_cpu_bf16)'
# the bits of the same runs from an earlier build (PREV_FP) and this one
for fp in fingerprint:cuda fingerprint_fx:fixtures,tests/fixtures,cuda fingerprint_7b:7b; do
  [ -n "${PREV_FP:-}" ] && run ${fp%%:*}_prev sh -c "\"$PREV_FP\" $(echo ${fp#*:} | tr , ' ') > \"$OUT/${fp%%:*}_prev.txt\""
  run ${fp%%:*} sh -c "build/bench/fingerprint $(echo ${fp#*:} | tr , ' ') > \"$OUT/${fp%%:*}.txt\""
  [ -n "${PREV_FP:-}" ] && run ${fp%%:*}_cmp cmp "$OUT/${fp%%:*}_prev.txt" "$OUT/${fp%%:*}.txt"
done
run tests build/tests/mt_tests --jobs 8
# attention: the library's kernels, cuDNN through the library (deterministic and
# not), and PyTorch's cuDNN and flash backends on the same shapes, one visit
ATT="--S 4096,32768 --D 64,128 --bh 128 --H 32"
run attn_kernels build/bench/cuda_attention $ATT
# the Hopper kernels (issue 36): their tests first, in a short time (a hang in a new kernel costs the limit),
# then their speed beside cuDNN's at the targets' lengths; MLA's and Gemma's head sizes (forward only)
RUN_TIMEOUT=40 run sm90_tests env MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 4 --verbose --filter 'cuda_attention/sm90*'
run attn_sm90 build/bench/cuda_attention --impl sm90 --S 4096,32768 --D 64,128 --bh 128 --H 32 --iters 10
run attn_sm90_long build/bench/cuda_attention --impl sm90 --S 131072 --D 128 --bh 32 --H 32 --iters 3
run attn_sm90_wide build/bench/cuda_attention --impl sm90 --S 4096 --D 192,256 --bh 128 --H 32 --iters 10
run attn_cudnn build/bench/cuda_attention --impl cudnn $ATT
run attn_cudnn_nondet build/bench/cuda_attention --impl cudnn --nondeterministic $ATT
# the same through the cuDNN that PyTorch ships (often newer than the system's)
TORCH_CUDNN='$(python3 -c "import nvidia.cudnn, os; print(list(nvidia.cudnn.__path__)[0])")/lib'
run attn_cudnn_torchlib sh -c "export LD_LIBRARY_PATH=$TORCH_CUDNN:\$LD_LIBRARY_PATH; build/bench/cuda_attention --impl cudnn $ATT; build/bench/cuda_attention --impl cudnn --nondeterministic $ATT"
run attn_torch python3 bench/torch_attention.py $ATT --backend cudnn,flash
run attn_torch_det python3 bench/torch_attention.py $ATT --backend cudnn --deterministic
# the models' own shapes: Qwen2.5-7B (28 heads, 4 KV heads) at 4 x 4096, and one long sequence
run attn_qwen sh -c 'for i in kernels cudnn; do build/bench/cuda_attention --impl $i --S 4096 --D 128 --bh 112 --H 28 --Hkv 4; done; build/bench/cuda_attention --impl cudnn --nondeterministic --S 4096 --D 128 --bh 112 --H 28 --Hkv 4'
run attn_long sh -c 'for i in kernels cudnn; do build/bench/cuda_attention --impl $i --S 65536,131072 --D 128 --bh 32 --H 32 --iters 3; done; build/bench/cuda_attention --impl cudnn --nondeterministic --S 65536,131072 --D 128 --bh 32 --H 32 --iters 3'
run documents env MT_REQUIRE_GPU=1 build/tests/mt_tests --jobs 1 --verbose --filter 'documents/*'
run demo bin/megatrain train --out "$OUT/demo-model"
run sanitizer sh -c "compute-sanitizer --tool memcheck --leak-check full bin/megatrain train --steps 3 --log-every 1 --out $OUT/san && compute-sanitizer --tool racecheck bin/megatrain train --steps 2 --log-every 1 --out $OUT/san"
run profile_layer tools/profile-layer.sh
run adamw build/bench/adamw --params 1G --threads 8,12,16 --iters 5
run cpu_step build/bench/cpu_step --threads 16
run step_1b build/bench/step --preset 1b --seq-len 2048 --micro-batch 4 --grad-accum 2 --steps 3 --host-budget 110
run step_7b build/bench/step --preset 7b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline --timeline-csv "$OUT/step_7b_visits.csv"
# the same 7B step with the bench/step of an earlier commit (PREV_STEP=path, built
# on the development machine), before and after this build's, for a change
# that must not cost speed: measured on one day, interleaved against drift
for i in 1 2; do
  [ -n "${PREV_STEP:-}" ] && run step_7b_prev$i "$PREV_STEP" --preset 7b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline
  run step_7b_now$i build/bench/step --preset 7b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline
done
# the Qwen3-30B-A3B shape (12 of its 48 layers: 113 GB of host state) the same way
for i in 1 2; do
  [ -n "${PREV_STEP:-}" ] && run step_moe_prev$i "$PREV_STEP" --preset qwen3-30b-a3b --layers 12 --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 118 --timeline ${STEP_ARGS:-}
  run step_moe_now$i build/bench/step --preset qwen3-30b-a3b --layers 12 --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 118 --timeline ${STEP_ARGS:-}
  # Mixtral-8x7B at 5 layers (98 GiB pinned; 6 would need 116.95 of the 118)
  [ -n "${PREV_STEP:-}" ] && run step_mixtral_prev$i "$PREV_STEP" --preset mixtral-8x7b --layers 5 --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 118 --timeline ${STEP_ARGS:-}
  run step_mixtral_now$i build/bench/step --preset mixtral-8x7b --layers 5 --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 118 --timeline ${STEP_ARGS:-}
done
# the GPT-OSS-20B shape with as many layers as the host holds (megatrain plan: 22 layers 108.5 GiB pinned, 23
# 113.2, 24 117.8 of a 118 GiB budget), lean, issue 33 part 7
for L in 23 24; do
  run gptoss_$L build/bench/step --preset gpt-oss-20b --layers $L --lean --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 118 --timeline
done
# the CPU AdamW (2 G parameters, bf16 gradients as the bf16 step gives them; the Qwen3-30B-A3B step updates 8.1 G):
# what the MoE step's optimizer idle is made of
run adamw_2g build/bench/adamw --params 2G --threads 8,16 --iters 3 --grad bf16
run step_moe_csv build/bench/step --preset qwen3-30b-a3b --layers 12 --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 118 --timeline --timeline-csv "$OUT/step_moe_visits.csv"
# the MoE steps against PyTorch with transformers' own experts (grouped_mm), the whole model on the GPU, same
# layers and tokens; and the per-kernel times of one Qwen3-30B-A3B micro-batch (docs/benchmarks.md)
MOE_ARGS="--seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2"
run torch_moe sh -c "python3 bench/torch_baseline.py --mode gpu --preset qwen3-30b-a3b --layers 12 $MOE_ARGS; python3 bench/torch_baseline.py --mode gpu --preset mixtral-8x7b --layers 5 $MOE_ARGS"
run step_mixtral build/bench/step --preset mixtral-8x7b --layers 5 $MOE_ARGS --host-budget 118 --timeline
run profile_moe tools/profile-layer.sh --preset qwen3-30b-a3b --layers 1 --seq-len 4096 --micro-batch 4 --grad-accum 1
# the same for Mixtral (one layer) and DeepSeek-V2-Lite (its dense layer and one MoE layer); the lean kernel at
# 16 threads on this host (docs/moe.md)
run profile_mixtral tools/profile-layer.sh --preset mixtral-8x7b --layers 1 --seq-len 4096 --micro-batch 4 --grad-accum 1
run profile_dsv2 tools/profile-layer.sh --preset deepseek-v2-lite --layers 2 --seq-len 4096 --micro-batch 4 --grad-accum 1
run lean_16 build/bench/lean --params 512M --threads 16 --iters 3 --isa avx512
# the experts' GEMMs of one layer and micro-batch: the grouped Hopper kernels against the per-expert loop
# (docs/moe.md), at each MoE preset's shape
run grouped_bench build/bench/cuda_grouped_gemm
# the 7B step with each attention: the kernels, cuDNN (the default), cuDNN's non-deterministic backward
run step_7b_kernels build/bench/step --preset 7b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline --attention kernels
run step_7b_nondet build/bench/step --preset 7b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline --nondeterministic
# the Qwen3-8B shape (norms of q and k; no q/k/v kept)
run step_qwen3_8b build/bench/step --preset qwen3-8b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline
# the kernels with a sliding window of 4096 against none, one sequence of 32768 per B x H
run attn_window sh -c 'for w in 0 4096; do build/bench/cuda_attention --S 32768 --D 128 --bh 32 --H 32 --iters 5 --window $w; done'
run step_qwen7b build/bench/step --preset qwen7b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 3 --host-budget 118 --timeline
run step_7b_full build/bench/step --preset 7b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 118 --recompute full --timeline
run step_2gib build/bench/step --preset 1.5b --seq-len 2048 --micro-batch 1 --grad-accum 8 --steps 3 --host-budget 110 --gpu-budget 2 --timeline --timeline-csv "$OUT/step_2gib_visits.csv"
run step_8b build/bench/step --preset 8b --seq-len 4096 --micro-batch 4 --grad-accum 8 --steps 2 --host-budget 121 --timeline
run compare_1b_131k bench/compare.sh --systems megatrain,gpu,fsdp2 --cases 1b:4096:4:8 --out "$OUT/compare"
# the 131072-token 7B rows of the table on the day of the rest (their last runs were on 11-29)
run compare_131k bench/compare.sh --systems megatrain,gpu --cases 7b:4096:4:8,qwen7b:4096:4:8 --steps 2 --budget "$((${RUN_TIMEOUT:-300} - 10))" --out "$OUT/compare"
run long_7b build/bench/step --preset 7b --seq-len 262144 --micro-batch 1 --grad-accum 1 --steps 1 --warmup 0 --host-budget 118 --timeline
rm -rf "$OUT/demo-model" "$OUT/san"
echo "== summary =="
printf '%s\n' "${summary[@]}"
grep -h 'Synthesis' "$OUT/gpu_tests.log" "$OUT/tests.log"
grep -h 'FAIL\|Assertion' "$OUT/gpu_tests.log" | head -20
grep -h 'held-out\|trained in\|backend' "$OUT/demo.log" 2>/dev/null
grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|LEAK SUMMARY' "$OUT/sanitizer.log" | head
grep -h -A5 'Gparam' "$OUT/adamw.log" | head -8
grep -h 'tokens/s\|median step' "$OUT"/cpu_step.log "$OUT"/step_*.log 2>/dev/null
for f in "$OUT"/attn_*.log; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
grep -h 'kernels, .* ms in all' "$OUT"/profile_layer.log 2>/dev/null
