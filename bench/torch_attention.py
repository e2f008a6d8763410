#!/usr/bin/env python3
"""PyTorch's fused attention on the shapes of build/bench/cuda_attention: the peer.

    python3 bench/torch_attention.py --S 4096,32768 --D 128 --bh 128 --H 32 \\
        --backend cudnn,flash [--deterministic]

Same layout as the library's kernels (B, S, H, D) storage seen as (B, H, S, D)
by a transpose (no copy), bf16, causal, random inputs of std 1, scale
1/sqrt(D); the same FLOP counts (forward 4*B*H*S*S*D/2, backward 2.5 times
that) and the same timing: the host clock around each call followed by a
synchronisation, the median of --iters calls after 3 warm-ups. The backward is
timed alone: torch.autograd.grad of the forward's output against a fixed dO,
minus nothing (the forward it needs runs before the timer starts, once per
timed call, with its graph kept).

--deterministic sets torch.use_deterministic_algorithms(True) (and
torch.backends.cudnn.deterministic) so that the comparison with the library's
deterministic cuDNN backward is like for like where PyTorch honours it.
Backends: cudnn (SDPBackend.CUDNN_ATTENTION), flash (SDPBackend.FLASH_ATTENTION).
Grouped heads (--Hkv < H) use enable_gqa=True where the backend takes it.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def ints(s):
    return [int(x) for x in s.split(",") if x]


def median_time(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    t.sort()
    return t[len(t) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--S", type=ints, default=[4096, 32768])
    ap.add_argument("--D", type=ints, default=[128])
    ap.add_argument("--bh", type=int, default=128)
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--Hkv", type=int, default=0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backend", default="cudnn,flash")
    ap.add_argument("--deterministic", action="store_true")
    a = ap.parse_args()
    Hkv = a.Hkv or a.H
    B = a.bh // a.H
    if a.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
    names = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"bf16, B*H = {a.bh} (H {a.H}, Hkv {Hkv}), median of {a.iters} calls"
          f"{', deterministic' if a.deterministic else ''}")
    print(f"{'backend':>8} {'D':>5} {'S':>6} | {'fwd ms':>9} {'TFLOP/s':>9} | {'bwd ms':>9} {'TFLOP/s':>9}")
    g = torch.Generator(device="cuda").manual_seed(1000)
    for be in a.backend.split(","):
        for D in a.D:
            for S in a.S:
                def mk(h):
                    return torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16,
                                       generator=g).transpose(1, 2).requires_grad_()
                try:
                    q, k, v = mk(a.H), mk(Hkv), mk(Hkv)
                    do = torch.randn(B, S, a.H, D, device="cuda", dtype=torch.bfloat16,
                                     generator=g).transpose(1, 2)
                    kw = {"is_causal": True, "scale": 1.0 / math.sqrt(D)}
                    if Hkv != a.H:
                        kw["enable_gqa"] = True
                    with sdpa_kernel(names[be]):
                        def fwd():
                            with torch.no_grad():
                                F.scaled_dot_product_attention(q, k, v, **kw)

                        tf = median_time(fwd, a.iters)
                        ts = []
                        for i in range(a.iters + 3):
                            o = F.scaled_dot_product_attention(q, k, v, **kw)
                            torch.cuda.synchronize()
                            t0 = time.perf_counter()
                            torch.autograd.grad(o, (q, k, v), do)
                            torch.cuda.synchronize()
                            if i >= 3:
                                ts.append(time.perf_counter() - t0)
                            del o
                        ts.sort()
                        tb = ts[len(ts) // 2]
                    flop = 4.0 * a.bh * S * S * D / 2
                    print(f"{be:>8} {D:>5} {S:>6} | {tf * 1e3:9.3f} {flop / tf * 1e-12:9.1f} | "
                          f"{tb * 1e3:9.3f} {2.5 * flop / tb * 1e-12:9.1f}", flush=True)
                except Exception as e:  # a backend that refuses the shape: say so, go on
                    print(f"{be:>8} {D:>5} {S:>6} | refused: {str(e).splitlines()[0][:120]}", flush=True)
                finally:
                    q = k = v = do = None
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
