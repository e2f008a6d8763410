#!/usr/bin/env python3
"""Training throughput of PyTorch + transformers on one GPU, on the shapes of bench/step.c.

The PyTorch side of the side-by-side benchmark (bench/compare.sh). Same presets,
sequence length, micro-batch, gradient accumulation and tokens per optimizer
step as `build/bench/step`, the same token stream (its LCG, targets = the next
token), the same optimizer settings (AdamW, betas 0.9/0.95, eps 1e-8, weight
decay 0.1 on matrices only, gradient clipping at 1.0, lr 1e-5), and the same
figures: model TFLOP/s = (6 * params * tokens + 12 * layers * heads * head_dim *
seq * tokens) / step time (params: the active ones of a mixture of experts,
every parameter but the experts a token does not use, as bench/step counts), the recompute not counted, median of the timed steps
after the warm-up (the median as bench/step.c takes it: sorted[n // 2]).

    python3 bench/torch_baseline.py --mode gpu --preset 7b --seq-len 4096 \\
        --micro-batch 4 --grad-accum 8 --steps 3 --json out/torch.jsonl

Models are built from a LlamaConfig / Qwen2Config (Qwen3MoeConfig, MixtralConfig
for the mixture-of-experts presets, whose --layers N keeps the first N layers
and whose experts run on transformers' own experts code with the backend
--experts names: grouped_mm, torch's grouped GEMM, by default) with random
weights (nothing is downloaded), attention through SDPA (`attn_implementation="sdpa"`, its
flash kernel: causal, no mask), activation checkpointing of every decoder layer
(non-reentrant), loss = mean cross-entropy over fp32 logits, computed here.

Modes
-----
--mode gpu ("pytorch-gpu"): the whole model on the GPU, the usual "pure bf16"
    recipe: parameters, gradients and AdamW moments in bf16, torch.optim.AdamW
    with fused=True (its CUDA kernel). This is the simplest and fastest thing a
    practitioner does when the model fits. It does less work per optimizer
    step than libmegatrain, which keeps fp32 master weights and fp32 moments
    (14 bytes per parameter against 8 here) and still holds bf16 weights for
    compute; it also loses small updates to bf16 rounding, which a throughput
    benchmark does not see. A model that does not fit is reported with status
    "oom" (exit code 0).

--mode fsdp2 ("pytorch-fsdp2-cpuoffload"): the PyTorch way to keep the state in
    host memory. FSDP2 (`torch.distributed.fsdp.fully_shard`) on a world of one
    GPU, every decoder layer sharded on its own, then the root (embedding, final
    norm, LM head); CPUOffloadPolicy(pin_memory=True): the fp32 parameters (the
    master copy), their fp32 gradients and the AdamW moments stay on the CPU,
    and AdamW runs there on the CPU tensors (the fused CPU kernel when this
    torch has it, else foreach, else the for-loop; the record names the one
    used); MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): each
    layer's parameters travel to the GPU as fp32 and are cast to bf16 there.
    The process group (gloo for CPU tensors, NCCL for CUDA ones) is set up here
    from MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE, filled in when absent
    (127.0.0.1, a free port, 0, 1), so it runs as plain python3. The model is
    built on the meta device, sharded, materialised on the CPU (to_empty, where
    FSDP2 pins each parameter) and initialised in place from the GPU's random
    generator; that setup is timed apart from the steps.

    Gradient accumulation: by default (--grad-sync last) FSDP2 synchronises
    gradients on the last micro-batch only (set_requires_gradient_sync), the
    usual FSDP recipe: the earlier micro-batches accumulate unsharded fp32
    gradients on the GPU (4 bytes per parameter of GPU memory), and the
    gradients go to the host once per step. --grad-sync every sends them to the
    host after each micro-batch (nothing but activations on the GPU, much more
    PCIe traffic and CPU work).

    Host memory: fp32 parameters + fp32 gradients + two fp32 moments = 16 bytes
    per parameter, and torch's pinned-memory allocator rounds every pinned
    block (each parameter, each gradient) up to a power of two. Before building
    anything the run estimates that and, if it exceeds --host-limit-gib
    (default: MemTotal), reports status "oom" instead of being killed by the
    kernel.

Output: one JSON line on stdout (and appended to --json FILE) with the system,
shape, tokens per step, every step's seconds, the median, tokens/s, model
TFLOP/s, peak GPU memory (torch's reserved and allocated maxima), peak host
RSS (getrusage ru_maxrss and VmHWM), setup seconds, versions and a status:
"ok", "oom" (GPU or host memory) or "error" / "killed" with the message. One
human line per step and a summary go to stderr.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import signal
import socket
import sys
import time
import traceback

# name: (arch, vocab, hidden, ffn, layers, heads, kv heads), exactly bench/step.c's table.
# The mixture-of-experts presets add (head_dim, experts, experts a token, expert width) below.
PRESETS = {
    "tiny": ("llama", 8192, 256, 768, 8, 8, 4),
    "1b": ("llama", 32000, 2048, 5632, 22, 32, 4),  # TinyLlama-1.1B
    "1.5b": ("llama", 32000, 2048, 5632, 32, 32, 4),
    "7b": ("llama", 32000, 4096, 11008, 32, 32, 32),  # Llama-2-7B
    "qwen7b": ("qwen2", 152064, 3584, 18944, 28, 28, 4),  # Qwen2.5-7B: q/k/v bias
    "8b": ("llama", 128256, 4096, 14336, 32, 32, 8),  # Llama-3-8B
    # Qwen3-30B-A3B: 128 experts top-8 of width 768, renormalised; head_dim 128 (q width 4096)
    "qwen3-30b-a3b": ("qwen3_moe", 151936, 2048, 6144, 48, 32, 4),
    # Mixtral-8x7B: 8 experts top-2 of width 14336
    "mixtral-8x7b": ("mixtral", 32000, 4096, 14336, 32, 32, 8),
}
MOE = {"qwen3-30b-a3b": (128, 128, 8, 768), "mixtral-8x7b": (0, 8, 2, 14336)}
SYSTEMS = {"gpu": "pytorch-gpu", "fsdp2": "pytorch-fsdp2-cpuoffload"}
GIB = 1 << 30


class Terminated(Exception):
    """SIGTERM (a caller's timeout): still write the record of what was measured."""


class HostMemoryRefused(Exception):
    """The fsdp2 host-memory estimate exceeds the limit: reported as "oom"."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=sorted(SYSTEMS), default="gpu")
    p.add_argument("--preset", choices=list(PRESETS), default="tiny")
    p.add_argument("--layers", type=int, default=0, help="the preset's first N layers (0: all)")
    p.add_argument("--experts", choices=["grouped_mm", "eager", "batched_mm"], default="grouped_mm",
                   help="mixture-of-experts presets: transformers' experts backend (grouped_mm: "
                        "torch's grouped GEMM, its fastest for training)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    p.add_argument("--json", metavar="FILE", help="append the result record to FILE")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 disables")
    p.add_argument("--no-grad-ckpt", action="store_true", help="no activation checkpointing")
    p.add_argument("--optim", choices=["auto", "fused", "foreach", "forloop"], default="auto",
                   help="AdamW implementation; auto: fused, falling back to foreach, then the for-loop")
    p.add_argument("--grad-sync", choices=["last", "every"], default="last",
                   help="fsdp2: synchronise gradients (to the host) on the last micro-batch or every one")
    p.add_argument("--no-pin", action="store_true", help="fsdp2: CPUOffloadPolicy(pin_memory=False)")
    p.add_argument("--host-limit-gib", type=float, default=None,
                   help="fsdp2: refuse (status oom) when the host estimate exceeds this; "
                        "default MemTotal, 0 disables the check")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tag", default="", help="free text copied into the record")
    a = p.parse_args(argv)
    if a.seq_len < 2 or a.layers < 0 or a.micro_batch < 1 or a.grad_accum < 1 or a.steps < 1 or a.warmup < 0:
        p.error("bad arguments")
    return a


def meminfo_bytes(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def vm_hwm_bytes():
    best = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    v = int(line.split()[1]) * 1024
                    best = v if best is None else max(best, v)
    except OSError:
        pass
    return best


def lcg_tokens(n, vocab):
    """bench/step.c's token stream: r = r * 1103515245 + 12345 (mod 2^32), token = (r >> 8) % vocab."""
    out, r = [0] * n, 1
    for i in range(n):
        r = (r * 1103515245 + 12345) & 0xFFFFFFFF
        out[i] = (r >> 8) % vocab
    return out


def median_as_step_c(xs):
    return sorted(xs)[len(xs) // 2]


def pow2ceil(x):
    return 1 << (x - 1).bit_length() if x > 1 else 1


def shape(args):
    """The preset's numbers as bench/step.c takes them, --layers applied."""
    arch, V, C, F, L, H, Hkv = PRESETS[args.preset]
    D, E, K, FE = MOE.get(args.preset, (0, 0, 0, 0))
    return dict(arch=arch, V=V, C=C, F=F, L=args.layers or L, H=H, Hkv=Hkv, D=D or C // H, E=E, K=K, FE=FE)


def make_config(args):
    import transformers

    sh = shape(args)
    arch, V, C, F, L, H, Hkv = (sh[k] for k in ("arch", "V", "C", "F", "L", "H", "Hkv"))
    common = dict(
        vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=Hkv, max_position_embeddings=args.seq_len,
        tie_word_embeddings=False, use_cache=False, hidden_act="silu", initializer_range=0.02,
        attention_dropout=0.0,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False,
                                       mlp_bias=False, **common)
    elif arch == "qwen3_moe":  # every layer sparse, no router loss (bench/step.c trains none)
        cfg = transformers.Qwen3MoeConfig(rms_norm_eps=1e-6, rope_theta=1000000.0, head_dim=sh["D"],
                                          num_experts=sh["E"], num_experts_per_tok=sh["K"],
                                          moe_intermediate_size=sh["FE"], norm_topk_prob=True,
                                          decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False,
                                          use_sliding_window=False, **common)
    elif arch == "mixtral":
        cfg = transformers.MixtralConfig(rms_norm_eps=1e-5, rope_theta=1000000.0, num_local_experts=sh["E"],
                                         num_experts_per_tok=sh["K"], output_router_logits=False,
                                         router_jitter_noise=0.0, sliding_window=None, **common)
    else:
        cfg = transformers.Qwen2Config(rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
                                       **common)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(cfg, dtype):
    """AutoModelForCausalLM.from_config on whatever device context is active."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    except TypeError:  # transformers before `dtype` replaced `torch_dtype`
        return AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation="sdpa")


def set_experts(model, args, rec):
    """transformers' own experts code, with the backend --experts names (its ExpertsInterface)."""
    if not MOE.get(args.preset):
        return
    setter = getattr(model, "set_experts_implementation", None)
    if setter is None:
        if args.experts != "eager":
            raise RuntimeError(f"this transformers has no set_experts_implementation: --experts {args.experts} "
                               "cannot be had (--experts eager runs its per-expert loop)")
    else:
        setter(args.experts)
    get = getattr(model, "get_experts_implementation", None)
    rec["experts"] = get() if get is not None else "eager"


def active_params(P, sh):
    """bench/step.c's count: every parameter but the experts a token does not use, (E - k) of each layer's E."""
    return P - sh["L"] * (sh["E"] - sh["K"]) * 3 * sh["FE"] * sh["C"] if sh["E"] else P


def enable_checkpointing(model, args):
    model.config.use_cache = False
    if not args.no_grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def rope_inv_freq(cfg, device):
    import torch

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    theta = getattr(cfg, "rope_theta", None)
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        theta = rp["rope_theta"]
    return 1.0 / (float(theta) ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))


def adamw_groups(params, wd):
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}]


class Optimizer:
    """AdamW with a fallback chain of implementations, settled on the first step."""

    KW = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False, "fused": False}}

    def __init__(self, params, args):
        self.params, self.args = params, args
        self.chain = ["fused", "foreach", "forloop"] if args.optim == "auto" else [args.optim]
        self.steps = 0
        self.opt = None
        self.impl = None
        self._build()

    def _build(self):
        import torch

        while self.chain:
            impl = self.chain.pop(0)
            try:
                self.opt = torch.optim.AdamW(adamw_groups(self.params, self.args.weight_decay), lr=self.args.lr,
                                             betas=(0.9, 0.95), eps=1e-8, **self.KW[impl])
                self.impl = impl
                return
            except (RuntimeError, ValueError, TypeError) as e:
                log(f"AdamW {impl} unavailable here ({e}); trying the next one")
        raise RuntimeError("no AdamW implementation could be built")

    def step(self):
        while True:
            try:
                self.opt.step()
                break
            except Exception as e:  # only the first step may fall back, and never on OOM
                if self.steps > 0 or not self.chain or is_oom(e):
                    raise
                log(f"AdamW {self.impl} failed on the first step ({type(e).__name__}: {e}); trying the next one")
                self.opt = None
                self._build()
        self.steps += 1
        self.opt.zero_grad(set_to_none=True)


def is_oom(e):
    import torch

    if isinstance(e, (torch.cuda.OutOfMemoryError, HostMemoryRefused, MemoryError)):
        return True
    return "out of memory" in str(e).lower()


def local_tensor(t):
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def clip_local(params, max_norm):
    """Gradient clipping on the (local) gradient tensors; for a world of one GPU the local norm is the norm."""
    import torch

    grads = [local_tensor(p.grad) for p in params if p.grad is not None]
    if not grads:
        return
    total = torch.stack([g.norm(2.0) for g in grads]).norm(2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)


def setup_gpu(args, cfg, rec, dev):
    import torch

    with torch.device(dev):
        model = build_model(cfg, torch.bfloat16)
    params = list(model.parameters())
    for p in params:  # every parameter bf16; buffers (RoPE frequencies) stay as built
        if p.dtype != torch.bfloat16:
            p.data = p.data.to(torch.bfloat16)
    rec["params"] = sum(p.numel() for p in params)
    set_experts(model, args, rec)
    model.train()
    enable_checkpointing(model, args)
    rec["precision"] = "bf16 parameters, gradients and AdamW moments"
    return model, params, lambda: torch.nn.utils.clip_grad_norm_(params, args.grad_clip, foreach=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_estimate(params, pin):
    """fp32 parameters and gradients (pinned: power-of-two blocks) + fp32 AdamW m and v."""
    est = 0
    for p in params:
        nb = p.numel() * 4
        est += (2 * pow2ceil(nb) if pin else 2 * nb) + 2 * nb
    return est


def setup_fsdp2(args, cfg, rec, dev):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if os.environ["WORLD_SIZE"] != "1":
        raise RuntimeError("this benchmark measures one GPU: WORLD_SIZE must be 1")

    with torch.device("meta"):
        model = build_model(cfg, torch.float32)
    set_experts(model, args, rec)
    params = list(model.parameters())
    rec["params"] = sum(p.numel() for p in params)
    pin = not args.no_pin
    est = host_estimate(params, pin)
    limit = args.host_limit_gib * GIB if args.host_limit_gib is not None else meminfo_bytes("MemTotal")
    rec["host_estimate_bytes"] = est
    rec["host_limit_bytes"] = limit
    log(f"host estimate {est / GIB:.1f} GiB (fp32 params + grads{' pinned, power-of-two blocks' if pin else ''}"
        f", AdamW m + v), limit {limit / GIB if limit else float('nan'):.1f} GiB")
    if limit and est > limit:
        raise HostMemoryRefused(f"host: estimated {est / GIB:.1f} GiB > limit {limit / GIB:.1f} GiB "
                                "(--host-limit-gib 0 tries anyway)")

    dist.init_process_group(backend="cpu:gloo,cuda:nccl")
    mesh = init_device_mesh("cuda", (1,))
    model.train()
    enable_checkpointing(model, args)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=pin)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=off)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=off)

    t = time.perf_counter()
    model.to_empty(device="cpu")  # FSDP2 re-pins each sharded parameter here
    rec["materialize_seconds"] = time.perf_counter() - t
    t = time.perf_counter()
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            loc = local_tensor(p)
            if loc.ndim >= 2:
                loc.copy_(torch.empty(loc.shape, dtype=loc.dtype, device=dev).normal_(0.0, 0.02, generator=gen))
            elif "norm" in name:
                loc.fill_(1.0)
            else:
                loc.zero_()
        # Buffers are not FSDP's: the RoPE frequencies were garbage after to_empty; rebuild them on the GPU.
        inv = rope_inv_freq(cfg, dev)
        for mod in model.modules():
            for bname, buf in list(mod._buffers.items()):
                if buf is None:
                    continue
                if bname.endswith("inv_freq"):
                    mod._buffers[bname] = inv.clone()
                else:
                    raise RuntimeError(f"unexpected buffer {bname} in {type(mod).__name__}: cannot initialise it")
            if "original_inv_freq" in mod.__dict__ and torch.is_tensor(mod.__dict__["original_inv_freq"]):
                mod.__dict__["original_inv_freq"] = inv.clone()
    torch.cuda.synchronize()
    rec["init_seconds"] = time.perf_counter() - t
    rec["precision"] = "fp32 master parameters, gradients and AdamW moments on the host; bf16 compute"
    rec["grad_sync"] = args.grad_sync
    rec["pin_memory"] = pin
    return model, params_after_shard(model), None


def params_after_shard(model):
    return list(model.parameters())


def run(args, rec):
    import torch
    import torch.nn.functional as F
    import transformers

    rec["torch"] = torch.__version__
    rec["transformers"] = transformers.__version__
    rec["cuda"] = torch.version.cuda
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    rec["gpu"] = torch.cuda.get_device_name(dev)
    rec["cpu_threads"] = torch.get_num_threads()
    torch.manual_seed(args.seed)

    sh = shape(args)
    arch, V, L = sh["arch"], sh["V"], sh["L"]
    S, B, M = args.seq_len, args.micro_batch, args.grad_accum
    n = M * B * S
    cfg = make_config(args)

    t0 = time.perf_counter()
    if args.mode == "gpu":
        model, params, clip = setup_gpu(args, cfg, rec, dev)
    else:
        model, params, _ = setup_fsdp2(args, cfg, rec, dev)
        clip = lambda: clip_local(params, args.grad_clip)  # noqa: E731
    opt = Optimizer(params, args)
    tok = lcg_tokens(n, V)
    x = torch.tensor(tok, dtype=torch.long).view(M, B, S).to(dev)
    y = torch.tensor(tok[1:] + tok[:1], dtype=torch.long).view(M, B, S).to(dev)
    torch.cuda.synchronize()
    rec["setup_seconds"] = time.perf_counter() - t0
    P = active_params(rec["params"], sh)  # all of them for a dense model
    rec["active_params"] = P
    flop = 6.0 * P * n + 12.0 * L * sh["H"] * sh["D"] * S * n
    active = f" ({P / 1e9:.2f} B active, experts {rec['experts']})" if sh["E"] else ""
    log(f"{SYSTEMS[args.mode]}: {args.preset} ({arch}), {rec['params'] / 1e9:.2f} B parameters{active}, "
        f"{M} x {B} x {S} = {n} tokens per step, setup {rec['setup_seconds']:.1f} s, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, {rec['gpu']}")

    fsdp = args.mode == "fsdp2"

    def train_step():
        total = torch.zeros((), device=dev, dtype=torch.float32)
        for m in range(M):
            if fsdp:
                model.set_requires_gradient_sync(args.grad_sync == "every" or m == M - 1)
            logits = model(input_ids=x[m], use_cache=False).logits
            loss = F.cross_entropy(logits.float().view(-1, V), y[m].reshape(-1))
            del logits
            (loss / M).backward()
            total += loss.detach()
        if args.grad_clip > 0:
            with torch.no_grad():
                clip()
        opt.step()
        return total / M

    rec["warmup_seconds"], rec["step_seconds"], rec["losses"] = [], [], []
    for s in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = train_step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        loss = float(loss.item())
        timed = s >= args.warmup
        (rec["step_seconds"] if timed else rec["warmup_seconds"]).append(dt)
        rec["losses"].append(loss)
        rec["optimizer"] = f"AdamW {opt.impl}"
        log(f"step {s}{'' if timed else ' (warm-up)'}: {dt:.3f} s, loss {loss:.4f}, {n / dt:.0f} tokens/s, "
            f"{flop / dt / 1e12:.1f} model TFLOP/s, GPU peak {torch.cuda.max_memory_reserved() / GIB:.1f} GiB "
            f"reserved")
    med = median_as_step_c(rec["step_seconds"])
    rec["median_step_s"] = med
    rec["tokens_per_s"] = n / med
    rec["model_tflops"] = flop / med / 1e12
    log(f"{args.preset} {SYSTEMS[args.mode]}, {rec['params'] / 1e9:.2f} B parameters{active}, {M} x {B} x {S} = {n} tokens per step: "
        f"median {med:.3f} s, {n / med:.0f} tokens/s, {flop / med / 1e12:.1f} model TFLOP/s")


def finish_memory(rec):
    rec["peak_host_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hwm = vm_hwm_bytes()
    if hwm is not None:
        rec["peak_host_hwm_bytes"] = hwm
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rec["peak_gpu_reserved_bytes"] = torch.cuda.max_memory_reserved()
            rec["peak_gpu_allocated_bytes"] = torch.cuda.max_memory_allocated()
            rec["gpu_total_bytes"] = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            stats = getattr(torch.cuda, "host_memory_stats", None)
            if stats is not None:
                hs = stats()
                for k in ("reserved_bytes.peak", "allocated_bytes.peak", "reserved_bytes.current"):
                    if k in hs:
                        rec["host_pinned_" + k.replace(".", "_")] = hs[k]
    except Exception as e:  # memory figures are best effort
        rec["memory_stats_error"] = f"{type(e).__name__}: {e}"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sh = shape(args)
    arch, V, C, F, L, H, Hkv = (sh[k] for k in ("arch", "V", "C", "F", "L", "H", "Hkv"))
    n = args.grad_accum * args.micro_batch * args.seq_len
    rec = {
        "system": SYSTEMS[args.mode], "mode": args.mode, "preset": args.preset, "arch": arch,
        "vocab": V, "hidden": C, "ffn": F, "layers": L, "heads": H, "kv_heads": Hkv,
        "seq_len": args.seq_len, "micro_batch": args.micro_batch, "grad_accum": args.grad_accum,
        "tokens_per_step": n, "warmup": args.warmup, "steps": args.steps,
        "grad_ckpt": not args.no_grad_ckpt, "grad_clip": args.grad_clip, "lr": args.lr,
        "head_dim": sh["D"], "experts_total": sh["E"], "experts_per_token": sh["K"], "expert_width": sh["FE"],
        "attention": "sdpa", "status": "error",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(), "python": platform.python_version(),
    }
    if args.tag:
        rec["tag"] = args.tag
    rec["host_mem_total_bytes"] = meminfo_bytes("MemTotal")

    def on_term(signum, frame):
        raise Terminated(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    code = 0
    t0 = time.perf_counter()
    try:
        run(args, rec)
        rec["status"] = "ok"
    except Terminated as e:
        rec["status"], rec["error"] = "killed", f"terminated ({e}) after {time.perf_counter() - t0:.0f} s"
        code = 1
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        try:
            oom = is_oom(e)
        except Exception:
            oom = isinstance(e, (HostMemoryRefused, MemoryError))
        rec["status"], rec["error"] = ("oom" if oom else "error"), msg[:2000]
        code = 0 if oom else 1
    rec["wall_seconds"] = time.perf_counter() - t0
    finish_memory(rec)
    line = json.dumps(rec, sort_keys=False)
    print(line, flush=True)
    if args.json:
        d = os.path.dirname(args.json)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(args.json, "a") as f:
            f.write(line + "\n")
    if args.mode == "fsdp2" and rec["status"] == "ok":
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: freeing tens of GiB of pinned memory one block at a time, or an
    # NCCL communicator left mid-collective by an error, can take minutes or hang.
    os._exit(code)


if __name__ == "__main__":
    main()
