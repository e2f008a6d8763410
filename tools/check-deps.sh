#!/bin/sh
# The source folders depend one way only (docs/architecture.md): a file may
# include headers of its own folder and of the folders before it in
#
#   src/core -> src/device, src/dist -> src/model -> src/memory -> src/optim
#            -> src/io -> src/text -> src/engine -> src/cpu, cuda/
#
# and inside cuda/: runtime -> kernels, gemm -> backend. Only cuda/ sees the
# CUDA toolkit. src/dist (the multi-node bootstrap) needs only src/core: it
# sits beside src/device. src/io reads and writes a view of the model
# (io/hf.h), src/text reads its files with src/io's helpers, and the engine
# uses both. The model handle is the engine's: engine/model.h and
# engine/engine.h are included by src/engine alone, so a backend (src/cpu,
# cuda/) sees only what its request gives it (engine/backend.h). Prints each
# include that points the wrong way; fails if any.
cd "$(dirname "$0")/.." || exit 2
rank() {
  case $1 in
    core) echo 0 ;; device|dist) echo 1 ;; model) echo 2 ;; memory) echo 3 ;; optim) echo 4 ;; io) echo 5 ;;
    text) echo 6 ;; engine) echo 7 ;; cpu|cuda) echo 8 ;; *) echo 99 ;;
  esac
}
cuda_rank() { case $1 in runtime) echo 0 ;; kernels|gemm) echo 1 ;; backend) echo 2 ;; *) echo 99 ;; esac; }
bad=0
for f in src/*/*.c src/*/*.h cuda/*/*.cu cuda/*/*.h; do
  top=${f%%/*}
  dir=$(echo "$f" | cut -d/ -f2)
  if [ "$top" = src ]; then me=$dir; else me=cuda; fi
  for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
    case $inc in
      */*) ;;
      *) continue ;; # a header of the same folder
    esac
    first=${inc%%/*}
    if [ "$first" = cuda ]; then
      sub=$(echo "$inc" | cut -d/ -f2)
      if [ "$me" != cuda ]; then
        echo "$f includes $inc: only cuda/ sees the CUDA side"; bad=1
      elif [ "$(cuda_rank "$sub")" -gt "$(cuda_rank "$dir")" ]; then
        echo "$f includes $inc: cuda/$dir comes before cuda/$sub"; bad=1
      fi
      continue
    fi
    case $inc in
      engine/model.h|engine/engine.h)
        [ "$me" = engine ] || { echo "$f includes $inc: the model handle is visible only inside src/engine"; bad=1; } ;;
    esac
    [ "$first" = "$me" ] && continue
    r_inc=$(rank "$first"); r_me=$(rank "$me")
    if [ "$r_inc" -ge "$r_me" ]; then
      echo "$f includes $inc: src/$first does not come before $me"; bad=1
    fi
  done
  if [ "$top" = src ] && grep -q '^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(cuda\|cublas\|cub/\|nccl\|cudnn\)' "$f"; then
    echo "$f includes a CUDA toolkit header: only cuda/ may"; bad=1
  fi
done
[ $bad = 0 ] && echo "include directions: ok"
exit $bad
