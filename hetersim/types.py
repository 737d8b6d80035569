"""Discrete options: ``Literal`` names at the edges, small integer codes inside traced code.

The order of each tuple *is* the code: ``RECOMPUTE.index("full") == 2``. Results files store the
codes with CF ``flag_values``/``flag_meanings`` built from these tuples.
"""

from __future__ import annotations

import enum
from typing import Literal

Recompute = Literal["none", "selective", "full"]
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
PRECISION: tuple[Precision, ...] = ("bf16", "fp16", "fp8", "fp32")

# "flash": the fastest fused attention kernel of the device (FlashAttention-3 / cuDNN on Hopper,
# FlashAttention-2 on Ampere); "materialized": an s x s score matrix (pre-2023 Megatron-LM);
# "flash2": FlashAttention-2-class kernels (PyTorch SDPA's default flash backend), which on
# Hopper and newer reach about half of the fastest kernel.
Attention = Literal["flash", "materialized", "flash2"]
ATTENTION: tuple[Attention, ...] = ("flash", "materialized", "flash2")

# Memory tiers a state can live on. Index 0 is the device's own HBM ("no offload").
Tier = Literal["hbm", "host-dram", "cxl-expander", "cxl-pool"]
TIER: tuple[Tier, ...] = ("hbm", "host-dram", "cxl-expander", "cxl-pool")
N_TIERS = len(TIER)

OffloadState = Literal["optimizer", "grads", "params", "activations"]
OFFLOAD_STATE: tuple[OffloadState, ...] = ("optimizer", "grads", "params", "activations")

# Rank placement: which parallel dimension is innermost (closest ranks). Megatron's default
# order is tp-cp-dp-pp (tensor innermost, pipeline outermost).
Order = Literal["tp-cp-dp-pp", "tp-cp-pp-dp", "tp-pp-cp-dp"]
ORDER: tuple[Order, ...] = ("tp-cp-dp-pp", "tp-cp-pp-dp", "tp-pp-cp-dp")

# Network levels, innermost first. A level whose domain is no larger than the one inside it
# is inactive (it adds no hop): that is how a fixed-size array holds fewer real levels.
N_LEVELS = 3
LEVEL_NAMES = ("scale-up", "intermediate", "scale-out")

ZERO_STAGES = (0, 1, 2, 3)


def code(options: tuple[str, ...], value: str, what: str) -> int:
    """Return the integer code of ``value`` or raise a one-line ``ValueError``."""
    try:
        return options.index(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {', '.join(options)}; got {value!r}") from None


class Infeasible(enum.IntFlag):
    """Why a configuration cannot run (bit flags, after jax-md's PartitionErrorCode)."""

    NONE = 0
    GPU_COUNT = 1  # tp*pp*dp*cp does not equal the GPU count
    BATCH_DIVIDE = 2  # global batch not a multiple of micro_batch * dp
    LAYERS_DIVIDE = 4  # layers not divisible by pp * vp
    HEADS_DIVIDE = 8  # heads or kv heads not divisible by tp
    SEQ_DIVIDE = 16  # sequence not divisible by 2 * cp (load-balanced causal CP)
    SCHEDULE = 32  # interleaving needs pp > 1 and micro-batches a multiple of pp
    HBM_CAPACITY = 64  # does not fit in device memory
    PRECISION = 128  # the device has no such precision
    TIER_CAPACITY = 256  # an offload tier is over-full
    TIER_MISSING = 512  # offload to a tier the node does not have
    HIDDEN_DIVIDE = 1024  # hidden / ffn / vocab not divisible by tp

    @classmethod
    def describe(cls, value: int) -> list[str]:
        """Human-readable reasons for a flag word."""
        return [REASONS[f] for f in cls if f and (int(value) & int(f))]


REASONS = {
    Infeasible.GPU_COUNT: "tp*pp*dp*cp does not equal the number of GPUs",
    Infeasible.BATCH_DIVIDE: "global batch is not a multiple of micro_batch*dp",
    Infeasible.LAYERS_DIVIDE: "layers are not divisible by pp*vp",
    Infeasible.HEADS_DIVIDE: "attention heads or KV heads are not divisible by tp",
    Infeasible.SEQ_DIVIDE: "sequence length is not divisible by 2*cp",
    Infeasible.SCHEDULE: "interleaving (vp>1) needs pp>1 and a number of micro-batches divisible by pp",
    Infeasible.HBM_CAPACITY: "does not fit in HBM",
    Infeasible.PRECISION: "the device has no peak for this precision",
    Infeasible.TIER_CAPACITY: "an offload tier is over-full",
    Infeasible.TIER_MISSING: "offload to a memory tier this node does not have",
    Infeasible.HIDDEN_DIVIDE: "hidden, FFN or vocabulary size is not divisible by tp",
}
