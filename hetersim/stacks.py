"""Software-stack profiles (``catalog/stacks.toml``): what the framework running a plan does.

The plan field ``stack`` (:class:`hetersim.types.Stack`) names a profile. A profile is a set of
categorical facts, each with its source: the attention and loss kernels a plan with ``attention =
auto`` / ``loss = auto`` runs, whether its element-wise work is fused (by hand-written kernels, or
by a compiler that fuses any point-wise op) or runs as eager PyTorch ops, how it launches the
routed experts' GEMMs of a mixture-of-experts layer, which pipeline schedules it has,
whether its tensor-parallel collectives, pipeline sends and data-parallel gradient reductions
overlap compute. The traced model reads
them as small per-stack arrays indexed by ``plan.stack_code`` (:func:`table`). Nothing here
imports JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from importlib import resources
from pathlib import Path

import numpy as np

from . import tomltext
from .types import Attention, Loss, Stack

__all__ = [
    "ELEMENTWISE",
    "EXPERTS",
    "PIPELINES",
    "Profile",
    "StackTable",
    "load_profiles",
    "profile",
    "switches",
    "table",
]

# How a stack runs its element-wise work: hand-fused kernels (Transformer Engine, Megatron's fusions),
# eager PyTorch ops one by one, a fusing compiler (TorchInductor, XLA), or pre-2021 Megatron-LM with
# its optional fusions left off (apex's fused LayerNorm, but every bias add, dropout, residual add
# and attention mask its own PyTorch op).
ELEMENTWISE = ("fused", "eager", "compiled", "unfused")
# How a stack runs the routed experts' GEMMs: one cuBLAS GEMM per local expert on Transformer
# Engine's compute streams, one grouped kernel per matrix over every local expert, one GEMM per
# expert from a Python loop on one stream, or not at all (a stack with no mixture-of-experts layer).
EXPERTS = ("streams", "grouped", "loop", "none")
# The true/false facts, each a field of Profile and a 0/1 array of StackTable.
_SWITCHES = (
    "tp_comm_overlap",
    "p2p_overlap",
    "p2p_scatter_gather",
    "dp_overlap",
    "param_gather_overlap",
    "cp_torch_ring",
    "op_level_sac",
    "chunk_grad_sync",
    "fsdp_units",
    "p2p_full_grads",
    "p2p_mask",
    "kept_logits",
    "pipeline_zero1",
    "context_parallel",
    "fp8",
    "bf16",
    "expert_parallel",
)
# The pipeline schedules a stack has: an interleaved one (model chunks, vp > 1) besides 1F1B,
# 1F1B only (pp > 1, vp 1), or no pipeline parallelism at all (pp 1).
PIPELINES = ("interleaved", "1f1b", "none")
_FACTS = ("attention", "loss", "elementwise", "experts", "pipeline", *_SWITCHES)
_KEYS = {"name", "sources", *_FACTS}


@dataclasses.dataclass(frozen=True)
class Profile:
    key: str
    name: str
    attention: str
    loss: str
    elementwise: str
    experts: str
    pipeline: str
    tp_comm_overlap: bool
    p2p_overlap: bool
    p2p_scatter_gather: bool
    dp_overlap: bool
    param_gather_overlap: bool
    cp_torch_ring: bool
    op_level_sac: bool
    chunk_grad_sync: bool
    fsdp_units: bool
    p2p_full_grads: bool
    p2p_mask: bool
    kept_logits: bool
    pipeline_zero1: bool
    context_parallel: bool
    fp8: bool
    bf16: bool
    expert_parallel: bool
    sources: dict[str, str]


@dataclasses.dataclass(frozen=True)
class StackTable:
    """One entry per :class:`Stack` code, in code order."""

    attention: np.ndarray  # Attention code of each stack's kernel
    loss: np.ndarray  # Loss code
    eager: np.ndarray  # 1.0 where element-wise work runs as eager PyTorch ops
    compiled: np.ndarray  # 1.0 where a fusing compiler (TorchInductor, XLA) fuses any point-wise op
    unfused: np.ndarray  # 1.0 where Megatron's bias, dropout and softmax fusions are off
    grouped_experts: np.ndarray  # 1.0 where the routed experts' GEMMs run as one grouped kernel per matrix
    expert_loop: np.ndarray  # 1.0 where they run one GEMM per expert from a loop on one stream
    no_experts: np.ndarray  # 1.0 where the stack has no mixture-of-experts layer
    no_pipeline: np.ndarray  # 1.0 where the stack has no pipeline parallelism (pp must be 1)
    no_interleaving: np.ndarray  # 1.0 where it has no interleaved schedule (vp must be 1)
    tp_comm_overlap: np.ndarray  # 1.0 where forward TP collectives overlap GEMMs
    p2p_overlap: np.ndarray  # 1.0 where pipeline sends overlap compute
    p2p_scatter_gather: np.ndarray  # 1.0 where each TP rank sends 1/tp of a stage's activation
    dp_overlap: np.ndarray  # 1.0 where data-parallel gradient reductions overlap the backward
    param_gather_overlap: np.ndarray  # 1.0 where ZeRO 1-2 gather the updated weights during the next forward
    cp_torch_ring: np.ndarray  # 1.0 where ring attention passes repeated K/V heads and fp32 dK/dV
    op_level_sac: np.ndarray  # 1.0 where selective recomputation is torchtitan's op-level policy
    chunk_grad_sync: np.ndarray  # 1.0 where an interleaved pipeline reduces each chunk's gradients early
    fsdp_units: np.ndarray  # 1.0 where sharded data parallelism gathers and reduces one FSDP unit at a time
    p2p_full_grads: np.ndarray  # 1.0 where every TP rank sends a stage's whole activation gradient back
    p2p_mask: np.ndarray  # 1.0 where each micro-batch's send carries the s x s attention mask
    kept_logits: np.ndarray  # 1.0 where a pipeline's last stage keeps two micro-batches' fp32 logits
    pipeline_zero1: np.ndarray  # 1.0 where the pipeline engine runs ZeRO stages 0-1 only
    context_parallel: np.ndarray  # 1.0 where the stack splits a sequence over ranks (cp > 1)
    fp8: np.ndarray  # 1.0 where it trains with 8-bit (or narrower) GEMMs: fp8, mxfp8, nvfp4
    bf16: np.ndarray  # 1.0 where it trains in bf16
    expert_parallel: np.ndarray  # 1.0 where it shards the routed experts over ranks (ep > 1)


def default_path() -> Path:
    return Path(str(resources.files("hetersim") / "catalog" / "stacks.toml"))


def read_stacks_file(path: Path) -> dict:
    """A stacks TOML file (profiles here, published runs' source entries in ``data/``), with
    one-line errors naming it."""
    try:
        return tomltext.loads(path.read_text(encoding="utf-8-sig"))  # an editor's byte-order mark read past
    except OSError as e:
        raise ValueError(f"{path}: cannot read stacks file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text (UTF-8) stacks file") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None


def check_table(path: Path, key: str, entry, allowed) -> str:
    """``entry`` is a table whose keys are all ``allowed``; returns the ``where`` of its errors."""
    where = f"{path}: stack {key}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a table")
    unknown = sorted(set(entry) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    return where


def _choice(where: str, key: str, value, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{where}: {key} must be one of {', '.join(options)}; got {value!r}")
    return value


def _profile(path: Path, key: str, entry) -> Profile:
    where = check_table(path, key, entry, _KEYS)
    missing = [k for k in _FACTS if k not in entry]
    if missing:
        raise ValueError(f"{where}: missing {missing[0]!r}")
    sources = entry.get("sources") or {}
    unsourced = [k for k in _FACTS if not str(sources.get(k, "")).strip()]
    if unsourced:
        raise ValueError(f"{where}: sources.{unsourced[0]} is missing; every fact names its source")
    for k in _SWITCHES:
        if not isinstance(entry[k], bool):
            raise ValueError(f"{where}: {k} must be true or false; got {entry[k]!r}")
    fused = tuple(n for n in Attention.names() if n != Attention.AUTO.label)
    return Profile(
        key=key,
        name=str(entry.get("name", key)),
        attention=_choice(where, "attention", entry["attention"], fused),
        loss=_choice(where, "loss", entry["loss"], tuple(n for n in Loss.names() if n != Loss.AUTO.label)),
        elementwise=_choice(where, "elementwise", entry["elementwise"], ELEMENTWISE),
        experts=_choice(where, "experts", entry["experts"], EXPERTS),
        pipeline=_choice(where, "pipeline", entry["pipeline"], PIPELINES),
        **{k: entry[k] for k in _SWITCHES},
        sources={str(k): str(v) for k, v in sources.items()},
    )


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    """Every :class:`Stack`'s profile; one-line ``ValueError`` naming the file, stack and key."""
    path = Path(path) if path is not None else default_path()
    data = read_stacks_file(path)
    unknown = sorted(set(data) - set(Stack.names()))
    if unknown:
        raise ValueError(f"{path}: unknown stack {unknown[0]!r}; allowed: {', '.join(Stack.names())}")
    missing = [s for s in Stack.names() if s not in data]
    if missing:
        raise ValueError(f"{path}: stack {missing[0]!r} has no profile")
    return {key: _profile(path, key, data[key]) for key in Stack.names()}


@functools.cache
def _packaged() -> dict[str, Profile]:
    return load_profiles()


def profile(stack: str | int) -> Profile:
    """The packaged profile of a stack, by name or code."""
    name = Stack(stack).label if isinstance(stack, int) else stack
    return _packaged()[name]


def switches(prof: Profile) -> dict[str, bool]:
    """A profile's true/false facts, by name, in their declared order."""
    return {k: getattr(prof, k) for k in _SWITCHES}


@functools.cache
def table() -> StackTable:
    """The packaged profiles as per-stack arrays (the traced model's view)."""
    rows = [_packaged()[name] for name in Stack.names()]
    return StackTable(
        attention=np.array([Attention.parse(p.attention, "attention").value for p in rows], np.int32),
        loss=np.array([Loss.parse(p.loss, "loss").value for p in rows], np.int32),
        eager=np.array([float(p.elementwise == "eager") for p in rows], np.float32),
        compiled=np.array([float(p.elementwise == "compiled") for p in rows], np.float32),
        unfused=np.array([float(p.elementwise == "unfused") for p in rows], np.float32),
        grouped_experts=np.array([float(p.experts == "grouped") for p in rows], np.float32),
        expert_loop=np.array([float(p.experts == "loop") for p in rows], np.float32),
        no_experts=np.array([float(p.experts == "none") for p in rows], np.float32),
        no_pipeline=np.array([float(p.pipeline == "none") for p in rows], np.float32),
        no_interleaving=np.array([float(p.pipeline != "interleaved") for p in rows], np.float32),
        **{k: np.array([float(getattr(p, k)) for p in rows], np.float32) for k in _SWITCHES},
    )
