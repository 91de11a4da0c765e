"""Torch side shared by the stand-ins: the LLaMA-7B forward, parameter
storage laid out as a plan says, the schedule runner and the JSON record.

Torch + CUDA only (no Paddle: no Paddle build runs on Hopper here). The
forward is the product's model as the plan describes it: embedding, 32
decoder layers (RMSNorm, q/k/v/o, causal SDPA, RMSNorm, SiLU-gated MLP),
final norm, LM head and the loss, one sequence of S tokens, bf16, under
``torch.no_grad()``. Weights keep Paddle's ``[in, out]`` layout (``x @ W``).
Each leaf layer fetches its weight through ``hook(unit)`` first, which is
where a forward pre-hook waits for (and, with launch depth, launches) the
collectives that deliver it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import plan as planlib  # noqa: E402

H, I, V, NH = 4096, 11008, 32000, 32
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# --------------------------------------------------------------------------
# The record every script writes
# --------------------------------------------------------------------------
def nccl_version() -> Optional[str]:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v)
    v = int(v)  # older torch: 2xxyy
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def git_head() -> str:
    if os.environ.get("STANDIN_COMMIT"):
        return os.environ["STANDIN_COMMIT"]
    try:
        return subprocess.check_output(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def record(script: str, world: int, **extra) -> dict:
    """Header of every result file: what, when, on what."""
    nccl_env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") and k != "NCCL_VERSION"}
    return {
        "label": "torch+NCCL stand-in of the product's pattern (NOT Paddle)",
        "script": f"benchmarks/standin/{script}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_head(),
        "gpus": world,
        "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl_version(),
        "nccl_env": nccl_env,
        "host": platform.node(),
        **extra,
    }


def write_json(obj: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    print(f"wrote {path}", flush=True)


def median(v: Sequence[float]) -> float:
    return statistics.median(v)


# --------------------------------------------------------------------------
# Storage: parameters as views of the groups' buffers
# --------------------------------------------------------------------------
class Storage:
    """One 1-D buffer per group (what one collective sends), each parameter
    a view of its slot with its shape. ``lay`` is ``plan.layout(...)``."""

    def __init__(self, plan: dict, lay: Sequence[dict], device, seed: int = 0):
        self.plan = plan
        self.buffers: List[torch.Tensor] = []
        self.views: Dict[int, torch.Tensor] = {}
        gen = torch.Generator(device=device).manual_seed(seed)
        for g in lay:
            buf = torch.empty(g["length"], dtype=DTYPES[g["dtype"]], device=device)
            buf.normal_(0.0, 0.02, generator=gen)
            self.buffers.append(buf)
            for i, off, ne in g["slots"]:
                self.views[i] = buf[off:off + ne].view(plan["params"][i]["shape"])
        self.by_unit: Dict[str, torch.Tensor] = {}
        for i, p in enumerate(plan["params"]):
            self.by_unit[p["unit"]] = self.views[i]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)


# --------------------------------------------------------------------------
# The forward
# --------------------------------------------------------------------------
def layers_of(plan: dict) -> int:
    return 1 + max(int(p["unit"][1:].split(".")[0]) for p in plan["params"] if p["unit"].startswith("L"))


def forward(W: Dict[str, torch.Tensor], ids: torch.Tensor, labels: torch.Tensor, layers: int,
            hook: Optional[Callable[[str], None]] = None,
            a2a: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """LLaMA forward of one sequence; ``hook(unit)`` runs before each leaf
    layer uses its weight; ``a2a`` (MoE-like) runs on the MLP's input and
    output of every decoder layer."""

    def w(unit):
        if hook is not None:
            hook(unit)
        t = W[unit]
        return t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16)

    x = F.embedding(ids, w("embed"))
    for i in range(layers):
        x = decoder_layer(x, w, f"L{i}.", a2a)
    h = F.rms_norm(x, (H,), w("final_norm"))
    logits = h @ w("lm_head")
    return F.cross_entropy(logits.float(), labels)


def decoder_layer(x: torch.Tensor, w: Callable[[str], torch.Tensor], p: str,
                  a2a: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """One decoder layer; ``w(name)`` gives the weight of leaf ``p + name``."""
    S = x.shape[0]
    D = H // NH
    h = F.rms_norm(x, (H,), w(p + "norm1"))
    q = (h @ w(p + "q")).view(1, S, NH, D).transpose(1, 2)
    k = (h @ w(p + "k")).view(1, S, NH, D).transpose(1, 2)
    v = (h @ w(p + "v")).view(1, S, NH, D).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(S, H)
    x = x + a @ w(p + "o")
    h = F.rms_norm(x, (H,), w(p + "norm2"))
    if a2a is not None:
        h = a2a(h)
    m = (F.silu(h @ w(p + "gate")) * (h @ w(p + "up"))) @ w(p + "down")
    if a2a is not None:
        m = a2a(m)
    return x + m


def tokens(S: int, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(0, V, (S,), device=device, generator=g)
    labels = torch.randint(0, V, (S,), device=device, generator=g)
    return ids, labels


# --------------------------------------------------------------------------
# One step boundary under a schedule
# --------------------------------------------------------------------------
class Transport:
    """How a group's collective is launched and waited (NCCL work, or a
    copy on a side stream in the one-GPU proxy)."""

    def launch(self, g: int) -> None:
        raise NotImplementedError

    def wait(self, g: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        pass


def boundary(run_forward: Callable, transport: Optional[Transport], n_groups: int,
             needs: Dict[str, List[int]], schedule: str, sync: Callable[[], None]) -> dict:
    """One step boundary followed by the forward; returns ms (device time
    from the boundary to the end of the forward, CUDA events on the compute
    stream) and the host time of the launches made at the boundary.

    ``schedule``: ``none`` (no collective: the forward alone), ``off`` (all
    launched, all waited, then the forward: Paddle's blocking path),
    ``all_at_step`` (all launched at the boundary, each leaf layer waits for
    its groups), ``chainK`` (launch depth K from the pre-hooks)."""
    if transport is not None:
        transport.reset()
    sync()
    cur = torch.cuda.current_stream()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(cur)
    hook = None
    t0 = time.perf_counter()
    if schedule == "none":
        host = 0.0
    elif schedule == "off":
        for g in range(n_groups):
            transport.launch(g)
        host = time.perf_counter() - t0
        for g in range(n_groups):
            transport.wait(g)
    else:
        depth = None if schedule == "all_at_step" else int(schedule[len("chain"):])
        policy = planlib.ChainPolicy(n_groups, needs, depth)
        for g in policy.boundary():
            transport.launch(g)
        host = time.perf_counter() - t0

        def hook(unit):
            before, wait, after = policy.pre_hook(unit)
            for g in before:
                transport.launch(g)
            for g in wait:
                transport.wait(g)
            for g in after:
                transport.launch(g)

    run_forward(hook)
    e1.record(cur)
    torch.cuda.synchronize()
    return {"ms": e0.elapsed_time(e1), "host_issue_ms": 1e3 * host}


def summarize(samples: Sequence[dict], fwd_alone_ms: Optional[float] = None) -> dict:
    ms = [s["ms"] for s in samples]
    out = {"ms": median(ms), "ms_all": [round(x, 4) for x in ms],
           "host_issue_ms": median([s["host_issue_ms"] for s in samples])}
    if fwd_alone_ms is not None:
        out["exposed_ms"] = out["ms"] - fwd_alone_ms
    return out


# --------------------------------------------------------------------------
# NCCL (torchrun) side
# --------------------------------------------------------------------------
def init_dist():
    """(rank, world, device) under torchrun, NCCL backend."""
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    return rank, world, torch.device("cuda", local)


def dist_sync():
    import torch.distributed as dist

    dist.barrier()
    torch.cuda.synchronize()


class NcclTransport(Transport):
    """V1: ``broadcast(buffer, src)`` per group; V2: in-place
    ``all_gather_into_tensor`` of each buffer from this rank's shard."""

    def __init__(self, buffers, kind: str, srcs=None, group=None):
        import torch.distributed as dist

        self.dist, self.buffers, self.kind, self.srcs, self.group = dist, buffers, kind, srcs, group
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.works = [None] * len(buffers)

    def reset(self):
        self.works = [None] * len(self.buffers)

    def launch(self, g):
        buf = self.buffers[g]
        if self.kind == "broadcast":
            self.works[g] = self.dist.broadcast(buf, src=self.srcs[g], group=self.group, async_op=True)
        else:
            shard = buf.numel() // self.world
            mine = buf.narrow(0, self.rank * shard, shard)
            self.works[g] = self.dist.all_gather_into_tensor(buf, mine, group=self.group, async_op=True)

    def wait(self, g):
        self.works[g].wait()


def gather_max(value: float) -> float:
    """Largest ``value`` over the ranks (a boundary is as slow as its slowest rank)."""
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def summarize_ranks(samples: Sequence[dict], fwd_alone_ms: Optional[float] = None) -> dict:
    """``summarize`` of this rank, then the largest median over ranks as
    ``ms`` (``rank_ms`` keeps this rank's own)."""
    out = summarize(samples)
    out["rank_ms"] = out["ms"]
    out["ms"] = gather_max(out["ms"])
    out["host_issue_ms"] = gather_max(out["host_issue_ms"])
    if fwd_alone_ms is not None:
        out["exposed_ms"] = out["ms"] - fwd_alone_ms
    return out
