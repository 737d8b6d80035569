"""Discrete options: ``Literal`` names at the edges, small integer codes inside traced code.

Each option is an :class:`enum.IntEnum` (jax-md's habit): traced code compares against
``Recompute.FULL``, never ``2``; its names in code order are the tuples (``RECOMPUTE``) that the
edges (CLI, study files, results' CF ``flag_values``/``flag_meanings``) use, and the ``Literal``
types (``RecomputeName``) annotate the functions that take a name.
"""

from __future__ import annotations

import enum
import math
from typing import Literal


class Choice(enum.IntEnum):
    """A discrete option: its code inside traced code, its name at the edges.

    A member's name is its option written in upper case with ``-`` as ``_``
    (``Order.TP_CP_DP_PP`` is ``"tp-cp-dp-pp"``); the member's value is the code.
    """

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(m.label for m in cls)

    @classmethod
    def parse(cls, value: str, what: str):
        """The member named ``value``, or a one-line ``ValueError`` naming ``what``."""
        return cls(code(cls.names(), value, what))


RecomputeName = Literal["none", "selective", "full"]


class Recompute(Choice):
    NONE = 0
    SELECTIVE = 1
    FULL = 2


PrecisionName = Literal["bf16", "fp16", "fp8", "fp32", "mxfp8", "nvfp4"]


# "fp8": FP8 GEMMs with per-tensor scaling (Transformer Engine's delayed or current scaling);
# "mxfp8": OCP microscaling FP8, one 8-bit scale per 32 elements, applied by the tensor cores of
# Blackwell and newer (NVIDIA publishes no separate peak: the FP8 rate); "nvfp4": NVIDIA's 4-bit
# format, an FP8 scale per 16 elements, Blackwell's FP4 rate. All three keep 16-bit activations.
class Precision(Choice):
    BF16 = 0
    FP16 = 1
    FP8 = 2
    FP32 = 3
    MXFP8 = 4
    NVFP4 = 5


# Bytes per element of a GEMM input in each precision, block scales included (MXFP8: 1 + 1/32,
# NVFP4: 1/2 + 1/16; OCP Microscaling Formats spec v1.0 §5; NVIDIA "Introducing NVFP4", 2025).
GEMM_INPUT_BYTES = {Precision.FP8: 1.0, Precision.MXFP8: 1.0 + 1.0 / 32.0, Precision.NVFP4: 0.5 + 1.0 / 16.0}
LOW_PRECISION = tuple(GEMM_INPUT_BYTES)


# "flash": the fastest fused attention kernel of the device (FlashAttention-3 / cuDNN on Hopper,
# FlashAttention-2 on Ampere); "materialized": an s x s score matrix (pre-2023 Megatron-LM);
# "flash2": FlashAttention-2-class kernels (PyTorch SDPA's default flash backend), which on
# Hopper and newer reach about half of the fastest kernel; "flash1": FlashAttention-1-class
# kernels (the FlashAttention v1 CUDA kernels and their Triton port, flash_attn_triton.py, which
# llm-foundry ran in 2023), at a fixed share of the FlashAttention-2 rate
# (hetersim.terms.attention.FLASH1_VS_FA2); "auto": the plan's software stack's kernel
# (catalog/stacks.toml), or materialized where the device has no fused kernel.
AttentionName = Literal["flash", "materialized", "flash2", "auto", "flash1"]


class Attention(Choice):
    FLASH = 0
    MATERIALIZED = 1
    FLASH2 = 2
    AUTO = 3
    FLASH1 = 4


# The loss kernel: "materialized" computes the LM head's logits for every token and runs the
# cross-entropy over an fp32 copy (Megatron's vocab-parallel cross-entropy); "chunked" fuses the
# LM head GEMM and the cross-entropy over chunks of tokens and never holds all the logits
# (Liger-Kernel's fused linear cross-entropy, torchtune's chunked cross-entropy); "fused" holds
# every logit in 16 bits and runs the cross-entropy in one kernel that writes the gradient in
# place, with no fp32 copy (flash-attn's xentropy CrossEntropyLoss, llm-foundry's MPT default).
# "auto": the plan's software stack's loss kernel.
LossName = Literal["materialized", "chunked", "auto", "fused"]


class Loss(Choice):
    MATERIALIZED = 0
    CHUNKED = 1
    AUTO = 2
    FUSED = 3


# The dtype gradients cross the data-parallel collectives in: "auto" the stack's and the plan's
# (memory.grad_bytes: fp32 for Megatron DDP's main_grad and FSDP2's reduce_dtype, the model's
# 16-bit dtype for the distributed optimizer and DeepSpeed), or forced: "fp32" (DeepSpeed's
# fp32_allreduce, Megatron's accumulate_allreduce_grads_in_fp32 with the distributed optimizer)
# or "model" (Megatron's --grad-reduce-in-bf16; DeepSpeed's communication_data_type = fp16/bf16).
class GradReduce(Choice):
    AUTO = 0
    FP32 = 1
    MODEL = 2


# The dtype of Adam's two moments: "fp32" (every stack's default) or "bf16", Megatron-Core's
# precision-aware optimizer (use_precision_aware_optimizer with exp_avg_dtype = exp_avg_sq_dtype =
# bf16, Transformer Engine's FusedAdam: NVIDIA/Megatron-LM@d98e8a64
# megatron/core/optimizer/optimizer_config.py), which the Megatron-Bridge DeepSeek-V3 performance
# recipes set (src/megatron/bridge/perf_recipes/deepseek/common.py
# _enable_deepseek_precision_aware_optimizer @067f987) and DeepSeek-V3 trained with (report §3.3.3).
MomentsName = Literal["fp32", "bf16"]


class Moments(Choice):
    FP32 = 0
    BF16 = 1


# How MoE tokens reach their experts' ranks: "alltoall" one NCCL all-to-all of every token copy
# (Megatron-Core's MoEAlltoAllTokenDispatcher, its default moe_token_dispatcher_type); "deepep"
# hierarchical: each token crosses the scale-out network once per destination node and fans out
# over NVLink there (DeepEP's internode kernels, deepseek-ai/DeepEP README; Megatron-Core's flex
# dispatcher with the deepep or hybridep backend).
class Dispatcher(Choice):
    ALLTOALL = 0
    DEEPEP = 1


# The software stack that runs the plan (profiles with their sources: catalog/stacks.toml):
# "megatron" Megatron-Core with Transformer Engine (NeMo 2.x, Megatron-Bridge), the default;
# "megatron-legacy" Megatron-LM before Megatron-Core and Transformer Engine (2020-22 papers);
# "torchtitan" torchtitan in eager mode, "torchtitan-compile" with torch.compile,
# "torchtitan-async-tp" with torch.compile and async tensor parallelism;
# "deepspeed" DeepSpeed ZeRO and its pipeline engine (Megatron-DeepSpeed);
# "fsdp" PyTorch FSDP / FSDP2 frameworks running eager Hugging Face-style modules
# (HF Accelerate / Trainer, llm-foundry / Composer); "maxtext" JAX/MaxText on NVIDIA GPUs;
# "llm-foundry" llm-foundry / Composer as in its 2023 MPT benchmark tables (Triton FlashAttention);
# "deepspeed-2020" DeepSpeed 0.3's pipeline engine with DeepSpeedExamples' Megatron-LM v1.1.5
# (the 3D-parallelism example AMP and the ZeRO-Offload tutorial ran).
StackName = Literal[
    "megatron",
    "megatron-legacy",
    "torchtitan",
    "torchtitan-compile",
    "deepspeed",
    "fsdp",
    "maxtext",
    "llm-foundry",
    "torchtitan-async-tp",
    "deepspeed-2020",
]


class Stack(Choice):
    MEGATRON = 0
    MEGATRON_LEGACY = 1
    TORCHTITAN = 2
    TORCHTITAN_COMPILE = 3
    DEEPSPEED = 4
    FSDP = 5
    MAXTEXT = 6
    LLM_FOUNDRY = 7
    TORCHTITAN_ASYNC_TP = 8
    DEEPSPEED_2020 = 9


# Memory tiers a state can live on. Index 0 is the device's own HBM ("no offload").
TierName = Literal["hbm", "host-dram", "cxl-expander", "cxl-pool"]


class Tier(Choice):
    HBM = 0
    HOST_DRAM = 1
    CXL_EXPANDER = 2
    CXL_POOL = 3


# Where checkpoints are written (hetersim.terms.goodput): a peer node's host DRAM over the
# scale-out network (Gemini, Wang et al. SOSP'23), the node's own memory tiers (each with a replica
# on a peer node, so a checkpoint survives the loss of its node), a CXL pool outside the host, the
# node's local NVMe drives, or the cluster's parallel file system.
CheckpointTierName = Literal["pfs", "nvme", "host-dram", "cxl-expander", "cxl-pool", "gpu-peers"]


class CheckpointTier(Choice):
    PFS = 0
    NVME = 1
    HOST_DRAM = 2
    CXL_EXPANDER = 3
    CXL_POOL = 4
    GPU_PEERS = 5


# Checkpoint writes: training waits for them (sync) or only for the copy to host DRAM (async).
CheckpointModeName = Literal["sync", "async"]


class CheckpointMode(Choice):
    SYNC = 0
    ASYNC = 1


OffloadStateName = Literal["optimizer", "grads", "params", "activations"]


class OffloadState(Choice):
    OPTIMIZER = 0
    GRADS = 1
    PARAMS = 2
    ACTIVATIONS = 3


# Rank placement: which parallel dimension is innermost (closest ranks). Megatron's default
# order is tp-cp-dp-pp (tensor innermost, pipeline outermost).
OrderName = Literal["tp-cp-dp-pp", "tp-cp-pp-dp", "tp-pp-cp-dp"]


class Order(Choice):
    TP_CP_DP_PP = 0
    TP_CP_PP_DP = 1
    TP_PP_CP_DP = 2


# The option names in code order (``RECOMPUTE.index("full") == Recompute.FULL``).
RECOMPUTE: tuple[RecomputeName, ...] = Recompute.names()  # type: ignore[assignment]
PRECISION: tuple[PrecisionName, ...] = Precision.names()  # type: ignore[assignment]
ATTENTION: tuple[AttentionName, ...] = Attention.names()  # type: ignore[assignment]
STACK: tuple[StackName, ...] = Stack.names()  # type: ignore[assignment]
TIER: tuple[TierName, ...] = Tier.names()  # type: ignore[assignment]
N_TIERS = len(TIER)
OFFLOAD_STATE: tuple[OffloadStateName, ...] = OffloadState.names()  # type: ignore[assignment]
ORDER: tuple[OrderName, ...] = Order.names()  # type: ignore[assignment]
CHECKPOINT_TIER: tuple[CheckpointTierName, ...] = CheckpointTier.names()  # type: ignore[assignment]

# Mixed clusters (hetersim.cluster): at most this many device groups, split across kinds by
# pipeline stages or by data-parallel replicas.
MAX_GROUPS = 4
HETERO_MODES = ("pipeline", "data")

# Network levels, innermost first. A level whose domain is no larger than the one inside it
# is inactive (it adds no hop): that is how a fixed-size array holds fewer real levels.
N_LEVELS = 3
LEVEL_NAMES = ("scale-up", "intermediate", "scale-out")

ZERO_STAGES = (0, 1, 2, 3)


class FieldError(ValueError):
    """A one-line error about input fields: ``template`` names them as ``{0}``, ``{1}``, ...

    ``str(error)`` names the fields as they are called in Python (``n_gpus``); an edge that
    calls them otherwise (the CLI's ``--gpus``) formats :meth:`named` with its own names.
    """

    def __init__(self, template: str, *fields: str) -> None:
        self.template, self.fields = template, fields
        super().__init__(template.format(*fields))

    def named(self, names: dict[str, str]) -> str:
        return self.template.format(*(names.get(f, f) for f in self.fields))


def whole_number(value: object, low: int) -> bool:
    """``value`` is a whole number of at least ``low``: an int, or a finite float with no fraction
    (a TOML or JSON ``inf`` or ``nan`` is not), never a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value == int(value) and value >= low


def decimal_digits(text: str) -> bool:
    """``text`` is written with the digits 0-9 only: ``str.isdigit`` also takes superscripts, which
    ``int`` refuses, and other scripts' digits, which ``int`` reads as numbers."""
    return text.isascii() and text.isdigit()


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
    LAYERS_DIVIDE = 4  # a stage (chunk) without layers in the middle; vp > 1: layers (+1, +2) not divisible by pp * vp
    HEADS_DIVIDE = 8  # heads or kv heads not divisible by tp
    SEQ_DIVIDE = 16  # sequence not divisible by 2 * cp (load-balanced causal CP)
    SCHEDULE = 32  # interleaving needs pp > 1 and micro-batches a multiple of pp; DualPipe, the stack's own rules
    HBM_CAPACITY = 64  # does not fit in device memory
    PRECISION = 128  # the device has no such precision
    TIER_CAPACITY = 256  # an offload tier is over-full
    TIER_MISSING = 512  # offload to a tier the node does not have
    HIDDEN_DIVIDE = 1024  # hidden / ffn / vocab not divisible by tp
    KERNEL = 2048  # the device cannot run the plan's attention kernel
    EXPERTS = 4096  # an expert-parallel layout that cannot be placed (see REASONS)
    NO_PROGRESS = 8192  # failures, restarts and checkpoints take all the wall time (goodput 0)
    SHARD_GROUP = 16384  # a hybrid-sharding group that does not divide the data-parallel ranks
    STACK = 32768  # the plan's stack lacks what it asks: cp > 1, FP8-class, bf16, experts, ep > 1

    @classmethod
    def describe(cls, value: int) -> list[str]:
        """Human-readable reasons for a flag word."""
        return [REASONS[f] for f in cls if f and (int(value) & int(f))]

    @classmethod
    def counts(cls, flags) -> dict[str, int]:
        """How many of the flag words ``flags`` (an integer array) carry each reason, by lower-case name."""
        return {f.name.lower(): int(((flags & int(f)) != 0).sum()) for f in cls if f}


REASONS = {
    Infeasible.GPU_COUNT: "tp*pp*dp*cp does not equal the number of GPUs",
    Infeasible.BATCH_DIVIDE: "global batch is not a multiple of micro_batch*dp",
    Infeasible.LAYERS_DIVIDE: "fewer layers than pp*vp, or (vp>1) layers, layers+1, layers+2 not divisible by pp*vp, "
    "or a middle pipeline stage without layers (no parameters: PyTorch's optimizer refuses an empty parameter list)",
    Infeasible.HEADS_DIVIDE: "attention heads or KV heads are not divisible by tp",
    Infeasible.SEQ_DIVIDE: "sequence length is not divisible by 2*cp",
    Infeasible.SCHEDULE: "interleaving (vp>1) needs pp>1 and a number of micro-batches divisible by pp; DualPipe "
    "an even pp, vp 1, an even number of at least 2*pp micro-batches and one device kind; the stack must have "
    "the pipeline (catalog/stacks.toml pipeline: none means pp 1, 1f1b means vp 1) and run it with the plan's ZeRO "
    "stage (pipeline_zero1: DeepSpeed's pipeline engine, ZeRO 0-1 only)",
    Infeasible.HBM_CAPACITY: "does not fit in HBM",
    Infeasible.PRECISION: "the device has no peak for this precision",
    Infeasible.TIER_CAPACITY: "an offload tier is over-full",
    Infeasible.TIER_MISSING: "offload to a memory tier this node does not have",
    Infeasible.HIDDEN_DIVIDE: "hidden, FFN or vocabulary size is not divisible by tp",
    Infeasible.KERNEL: "the device cannot run this attention kernel (use attention = materialized)",
    Infeasible.EXPERTS: "expert layout: ep must divide n_experts, ep*etp must divide tp*cp*dp, etp the expert "
    "width, ep = etp = 1 for a dense model, and an MoE model with tp > 1 needs sequence parallelism",
    Infeasible.NO_PROGRESS: "failures, restarts and checkpoints leave no time for training (goodput 0)",
    Infeasible.SHARD_GROUP: "shard_group must divide the data-parallel ranks dp*cp (hybrid sharding)",
    Infeasible.STACK: "the stack cannot run the plan: it has no context parallelism (cp>1), no FP8-class training "
    "(fp8, mxfp8, nvfp4), no bf16, no mixture-of-experts layer or no expert parallelism (ep>1) "
    "(catalog/stacks.toml context_parallel, fp8, bf16, experts, expert_parallel)",
}
