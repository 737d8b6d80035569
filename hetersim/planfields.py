"""The one registry of plan fields: each field of a plan declared once.

A :class:`PlanField` says what a field is (its kind, default, units, long name, short label, the
range a value may take), where it may appear (a study axis, a layout column the host filters on)
and how a name becomes a leaf. Everything else is generated from :data:`FIELDS`: the
:class:`Plan` pytree, :func:`plan_spec` (the host-side builder with one-line errors naming the
field), the sweep's columns and coordinate attributes, the study axes and defaults, the
optimizer's encoding, the report's columns, the layout label (:func:`layout_label`), the derived
data-parallel size (:func:`derived_dp`) and sequence parallelism (:func:`resolve_sp`).

Adding a plan field is adding one :class:`PlanField` here, plus the physics that reads it.
Nothing here imports JAX (study files are parsed with it); the :class:`Plan` pytree and its
builder :func:`plan_spec` are generated from it in :mod:`hetersim.specs.plan`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .planhelp import (
    _DISP_NAME,
    _DUALPIPE_HELP,
    _DUALPIPE_NAME,
    _EP_ALIAS,
    _EPO_ALIAS,
    _EPO_HELP,
    _EPO_NAME,
    _ETP_ALIAS,
    _FP8A_HELP,
    _FRAG_HELP,
    _FRAG_NAME,
    _FUSED_HELP,
    _FUSED_NAME,
    _GR_HELP,
    _GR_NAME,
    _IMB_HELP,
    _IMB_NAME,
    _LAYOUT_HELP,
    _LAYOUT_NAME,
    _MLA_HELP,
    _MLA_NAME,
    _MOM_HELP,
    _MOM_NAME,
    _SG_HELP,
    _SG_NAME,
    _Z3P,
    _Z3P_NAME,
)
from .types import (
    Attention,
    CheckpointMode,
    CheckpointTier,
    Choice,
    Dispatcher,
    GradReduce,
    Loss,
    Moments,
    OffloadState,
    Order,
    Precision,
    Recompute,
    Stack,
    Tier,
)

Kind = Literal["int", "float", "bool", "choice", "offload"]
AUTO = "auto"
REQUIRED = object()  # default of a field every plan must give

# Upper bounds: far above any machine or run (the largest trainings use ~1e5 GPUs, batches of
# ~1e4 sequences, ~1e13 tokens) and far below what float32 leaves turn into inf or lose to
# rounding, so an absurd value is a one-line error instead of an overflow.
MAX_GPUS = 1 << 20
MAX_BATCH = 1 << 24  # sequences
MAX_SEQ_LEN = 1 << 27  # tokens
MAX_TRAIN_TOKENS = 1e16
MAX_MPARAMS = 1e7  # 1e13 parameters


@dataclasses.dataclass(frozen=True)
class PlanField:
    """One plan field.

    ``kind``: ``int`` (a positive integer unless ``lo`` says otherwise), ``float``, ``bool``,
    ``choice`` (a name of ``options``, stored as its code in the leaf ``<name>_code``) or
    ``offload`` (a mapping state -> tier, stored as a code per :class:`OffloadState`).
    ``default``: a value, :data:`REQUIRED`, or :data:`AUTO` (derived from other fields by the
    field's rule: :func:`derived_dp`, :func:`resolve_sp`, ``cpu_optimizer`` on when the
    optimizer states are offloaded). ``axis``: a study may give a list of values (a sweep axis);
    ``layout``: one of the integer columns the host filters on before evaluating (``dp`` must be
    whole, the global batch a multiple of ``micro_batch * dp``); ``label``: the prefix in a
    layout label such as ``tp8-pp4``; ``flag``: the CLI option that sets it; ``aliases``: the
    same option under Megatron-LM / NeMo's names (``--tensor-model-parallel-size``; for a boolean,
    the flag that turns it on); ``switches``: value-less flags that set the field to one value
    (Megatron's ``--use-distributed-optimizer`` is ZeRO stage 1). Megatron's names are those of
    ``megatron/training/arguments.py``; a Megatron argument list is read through them
    (:mod:`hetersim.recipe`).
    """

    name: str
    kind: Kind
    default: Any
    long_name: str
    units: str = "1"
    label: str = ""
    axis: bool = False
    layout: bool = False
    options: type[Choice] | None = None
    lo: float = 1.0
    hi: float = math.inf
    flag: str = ""
    auto_rule: str = ""
    zero_means: str = ""  # what a 0 means where 0 is allowed
    help: str = ""  # the CLI's help text, where the long name is not enough
    off_flag: str = ""  # a boolean's negative CLI flag (``--no-sp``)
    aliases: tuple[str, ...] = ()  # Megatron-LM / NeMo spellings of the flag
    switches: tuple[tuple[str, Any], ...] = ()  # (value-less flag, the value it sets)

    @property
    def leaf(self) -> str:
        """The :class:`Plan` leaf that holds the field."""
        return {"choice": f"{self.name}_code", "offload": "offload_tier_code"}.get(self.kind, self.name)

    @property
    def names(self) -> tuple[str, ...]:
        """A choice's option names in code order."""
        return self.options.names() if self.options is not None else ()

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def coded(self) -> bool:
        """Stored as small integer codes in sweep tables (choices, and ``sp`` with -1 = auto)."""
        return self.kind in ("choice", "bool") and self.axis


FIELDS: tuple[PlanField, ...] = (
    PlanField(
        "n_gpus", "int", REQUIRED, "number of GPUs", layout=True, hi=MAX_GPUS, flag="--gpus", help="Number of GPUs."
    ),
    PlanField(
        "tp",
        "int",
        1,
        "tensor-parallel size",
        label="tp",
        axis=True,
        layout=True,
        hi=MAX_GPUS,
        aliases=("--tensor-model-parallel-size",),
    ),
    PlanField(
        "pp",
        "int",
        1,
        "pipeline-parallel size",
        label="pp",
        axis=True,
        layout=True,
        hi=MAX_GPUS,
        aliases=("--pipeline-model-parallel-size",),
    ),
    PlanField(
        "cp",
        "int",
        1,
        "context-parallel size",
        label="cp",
        axis=True,
        layout=True,
        hi=MAX_GPUS,
        aliases=("--context-parallel-size",),
    ),
    PlanField(
        "micro_batch",
        "int",
        1,
        "micro-batch size",
        "sequences",
        label="mb",
        axis=True,
        layout=True,
        hi=MAX_BATCH,
        aliases=("--micro-batch-size",),
    ),
    PlanField(
        "global_batch",
        "int",
        REQUIRED,
        "global batch size",
        "sequences",
        label="gb",
        axis=True,
        layout=True,
        hi=MAX_BATCH,
        aliases=("--global-batch-size",),
    ),
    PlanField(
        "dp",
        "int",
        AUTO,
        "data-parallel size, n_gpus / (tp*pp*cp)",
        label="dp",
        hi=MAX_GPUS,
        auto_rule="n_gpus / (tp*pp*cp)",
        help="Data-parallel size (default: gpus/(tp*pp*cp)).",
    ),
    PlanField(
        "vp",
        "int",
        1,
        "virtual pipeline chunks per stage",
        label="vp",
        axis=True,
        hi=MAX_GPUS,
        help="Virtual pipeline chunks per stage (interleaved 1F1B when > 1).",
        aliases=("--virtual-pipeline-model-parallel-size",),
    ),
    PlanField("dualpipe", "bool", False, _DUALPIPE_NAME, axis=True, help=_DUALPIPE_HELP),
    # Expert parallelism (Megatron-Core "MoE parallel folding", arXiv 2504.14960): a stage's tp*cp*dp
    # ranks regrouped for the MoE layers as etp*ep*edp (edp = tp*cp*dp / (ep*etp)).
    PlanField("ep", "int", 1, "expert-parallel size", label="ep", axis=True, hi=MAX_GPUS, aliases=_EP_ALIAS),
    PlanField("etp", "int", 1, "expert tensor-parallel size", label="etp", axis=True, hi=MAX_GPUS, aliases=_ETP_ALIAS),
    PlanField("ep_overlap", "bool", False, _EPO_NAME, label="epo", axis=True, help=_EPO_HELP, aliases=_EPO_ALIAS),
    PlanField("dispatcher", "choice", "alltoall", _DISP_NAME, label="disp", axis=True, options=Dispatcher),
    PlanField("moe_imbalance", "float", 1.0, _IMB_NAME, hi=1.0e3, help=_IMB_HELP),
    PlanField("mla_up_proj", "bool", False, _MLA_NAME, help=_MLA_HELP),
    PlanField("fused_experts", "bool", False, _FUSED_NAME, help=_FUSED_HELP),
    PlanField("fp8_attention", "bool", False, "attention kernel in FP8 (fp8_dot_product_attention)", help=_FP8A_HELP),
    PlanField("pp_layout", "bool", False, _LAYOUT_NAME, help=_LAYOUT_HELP),
    PlanField(
        "zero",
        "int",
        0,
        "ZeRO stage (3 = FSDP)",
        label="z",
        axis=True,
        lo=0,
        hi=3,
        help="ZeRO stage 0-3.",
        # Megatron's distributed optimizer shards the optimizer state over the data-parallel ranks,
        # "as described in ZeRO" (Megatron-LM README, "Distributed Optimizer"; its
        # docs/source/distrib_optimizer.md at 40ce7c8a): stage 1.
        switches=(("--use-distributed-optimizer", 1),),
    ),
    PlanField(
        "recompute",
        "choice",
        "none",
        "activation recomputation",
        label="rc",
        axis=True,
        options=Recompute,
        aliases=("--recompute-granularity",),
    ),
    PlanField(
        "sp",
        "bool",
        AUTO,
        "sequence parallelism",
        label="sp",
        axis=True,
        auto_rule="on when tp > 1",
        off_flag="--no-sp",
        help="Sequence parallelism (default: on when tp > 1).",
        aliases=("--sequence-parallel",),
    ),
    PlanField("precision", "choice", "bf16", "training precision", axis=True, options=Precision),
    PlanField(
        "seq_len",
        "int",
        REQUIRED,
        "sequence length",
        "tokens",
        label="seq",
        axis=True,
        hi=MAX_SEQ_LEN,
        help="Sequence length (default: the model's).",
        aliases=("--seq-length",),
    ),
    PlanField(
        "stack",
        "choice",
        Stack.MEGATRON.label,
        "software stack (catalog/stacks.toml)",
        label="stack",
        axis=True,
        options=Stack,
        help="Software stack running the plan: its attention and loss kernels, fusion and overlaps.",
    ),
    PlanField(
        "attention",
        "choice",
        Attention.AUTO.label,
        "attention kernel (auto: the stack's)",
        label="attn",
        axis=True,
        options=Attention,
    ),
    PlanField(
        "loss",
        "choice",
        Loss.AUTO.label,
        "loss kernel (all logits, chunked or one-pass fused cross-entropy, or auto: the stack's)",
        label="loss",
        axis=True,
        options=Loss,
    ),
    PlanField(
        "order",
        "choice",
        Order.TP_CP_DP_PP.label,
        "rank placement, innermost first",
        label="ord",
        axis=True,
        options=Order,
    ),
    PlanField(
        "train_tokens",
        "float",
        2.0e12,
        "token budget to train",
        "tokens",
        hi=MAX_TRAIN_TOKENS,
        help="Token budget for time/cost/energy.",
    ),
    # Goodput (hetersim.terms.goodput): where checkpoints go, how often, and whether training waits.
    PlanField(
        "checkpoint_tier",
        "choice",
        CheckpointTier.PFS.label,
        "where checkpoints are written",
        label="ckpt",
        axis=True,
        options=CheckpointTier,
        help="Checkpoint target: pfs, nvme, host-dram, cxl-expander, cxl-pool (the node's tiers keep a "
        "replica on a peer node), gpu-peers (a peer node's host DRAM).",
    ),
    PlanField(
        "checkpoint_every",
        "int",
        0,
        "checkpoint interval",
        "steps",
        label="every",
        axis=True,
        lo=0,
        hi=1e9,
        zero_means="the Young/Daly optimum",
        help="Checkpoint every N training steps, a whole number (0: the Young/Daly optimum).",
        # Megatron-LM's name: "Number of iterations between persistent checkpoint saves"
        # (megatron/training/arguments.py, --save-interval).
        aliases=("--save-interval",),
    ),
    PlanField(
        "checkpoint_mode",
        "choice",
        CheckpointMode.SYNC.label,
        "checkpoint writes: sync (training waits) or async (training waits for the copy to host DRAM)",
        label="ckpt-mode",
        axis=True,
        options=CheckpointMode,
        help="Checkpoint writes: sync, training waits for the write; async, training waits only for "
        "the copy to host DRAM and the write overlaps training (torch DCP async_save, Megatron async save).",
        # Megatron-LM's switch: --async-save, "Apply async checkpointing save" (arguments.py).
        switches=(("--async-save", "async"),),
    ),
    PlanField(
        "offload",
        "offload",
        None,
        "memory tier of each offloaded state",
        help="STATE:TIER, repeatable; states "
        + "|".join(OffloadState.names())
        + ", tiers "
        + "|".join(Tier.names()[1:]),
    ),
    PlanField(
        "cpu_optimizer",
        "bool",
        AUTO,
        "optimizer step on the host CPU (DeepSpeed CPU-Adam)",
        auto_rule="on when the optimizer states are offloaded",
        off_flag="--gpu-optimizer",
        help="Offloaded optimizer: step on the host CPU (DeepSpeed CPU-Adam; default) or stream states to the GPU.",
    ),
    PlanField(
        "bucket_Mparams",
        "float",
        0.0,
        "DP/ZeRO collective granularity",
        "1e6",
        lo=0.0,
        hi=MAX_MPARAMS,
        zero_means="default",
        help="DP/ZeRO bucket in 1e6 parameters (0: the stack's default).",
    ),
    PlanField(
        "reuse_Mparams",
        "float",
        0.0,
        "ZeRO-3 reuse distance (DeepSpeed)",
        "1e6",
        lo=0.0,
        hi=MAX_MPARAMS,
        zero_means="FSDP, keeps gathered weights",
        help="ZeRO-3 reuse distance in 1e6 parameters (DeepSpeed's stage3_max_reuse_distance; 0: FSDP).",
    ),
    PlanField("fragmentation", "float", 0.0, _FRAG_NAME, "1", lo=0.0, hi=0.9, help=_FRAG_HELP),
    PlanField(
        "shard_group", "int", 0, _SG_NAME, label="sg", axis=True, lo=0, hi=MAX_GPUS, zero_means="all", help=_SG_HELP
    ),
    PlanField("zero3_prefetch", "bool", True, _Z3P_NAME, help=_Z3P, off_flag="--no-zero3-prefetch"),
    PlanField("grad_reduce", "choice", "auto", _GR_NAME, label="gr", axis=True, options=GradReduce, help=_GR_HELP),
    PlanField("moments", "choice", "fp32", _MOM_NAME, label="mom", axis=True, options=Moments, help=_MOM_HELP),
)
BY_NAME: dict[str, PlanField] = {f.name: f for f in FIELDS}

# Fields a study may sweep (lists are axes), in the order of a sweep's coordinates.
AXES: tuple[str, ...] = tuple(f.name for f in FIELDS if f.axis)
# Integer columns the host filters on, with ``dp`` derived from them.
LAYOUT: tuple[str, ...] = tuple(f.name for f in FIELDS if f.layout)
# Every column of one configuration of a sweep after ``model`` and ``gpu``: the axes, n_gpus, dp.
COLUMNS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.axis or f.layout or f.name == "dp")
# Fields that are scalars of a whole study (never axes).
SCALARS: tuple[str, ...] = tuple(f.name for f in FIELDS if not (f.axis or f.layout or f.name == "dp"))
CHOICES: dict[str, tuple[str, ...]] = {f.name: f.names for f in FIELDS if f.kind == "choice"}
DEFAULTS: dict[str, Any] = {f.name: f.default for f in FIELDS if f.default is not REQUIRED}


# --------------------------------------------------------------------------------------------
# Derived rules, written once
# --------------------------------------------------------------------------------------------


def derived_dp(n_gpus, tp, pp, cp):
    """Data-parallel size ``n_gpus / (tp*pp*cp)`` (a float; whole only for a valid layout)."""
    return n_gpus / (tp * pp * cp)


def resolve_cpu_optimizer(value, optimizer_offloaded: bool):
    """``cpu_optimizer`` unset (``None`` / ``"auto"``): on when the optimizer states are offloaded."""
    return optimizer_offloaded if value in (AUTO, None) else value


def resolve_sp(sp, tp, xp=np):
    """Sequence parallelism: ``sp`` < 0 (or ``"auto"``/``None``) means on when ``tp > 1``.

    Works on Python values and on NumPy or JAX arrays of codes (``xp`` the array module).
    """
    if sp is None or isinstance(sp, str):
        if sp not in (None, AUTO):
            raise ValueError(f"sp must be true, false or {AUTO!r}; got {sp!r}")
        return bool(tp > 1)
    if np.ndim(sp) == 0 and not hasattr(sp, "aval"):
        return bool(tp > 1) if sp < 0 else bool(sp)
    return xp.where(xp.asarray(sp) < 0, xp.asarray(tp) > 1, xp.asarray(sp) > 0)


def encode(name: str, value: Any) -> int:
    """The table code of an axis value (a choice's name, ``sp``'s auto/bool, an integer)."""
    f = BY_NAME[name]
    if f.kind == "choice":
        return f.options.parse(value, name).value  # type: ignore[union-attr]
    if name == "sp":  # -1 auto, 0 off, 1 on
        return -1 if value in (AUTO, None) else int(bool(value))
    if f.kind == "bool":
        return int(bool(value))
    return int(value)


def decode(name: str, code: Any) -> Any:
    """The plain value of a table code (the inverse of :func:`encode`; ``sp`` -1 stays -1)."""
    f = BY_NAME[name]
    if f.kind == "choice":
        return f.names[int(code)]
    if name == "sp":
        return int(code) if int(code) < 0 else bool(code)
    if f.kind == "bool":
        return bool(code)
    return int(code)


def token(name: str, value: Any) -> str:
    """One field of a layout label: ``tp8``, ``mb2``, ``rc:full``, ``bf16``, ``sp`` / ``no-sp``."""
    f = BY_NAME[name]
    label = f.label or name
    if f.kind == "bool":
        return label if value else f"no-{label}"
    if f.kind == "choice":
        return f"{label}:{value}" if f.label else str(value)
    return f"{label}{_plain(value)}"


def layout_label(
    values: Mapping[str, Any], names: Sequence[str] | None = None, sep: str = " ", omit_defaults: Sequence[str] = ()
) -> str:
    """The short label of a layout (``tp8 pp4 dp16 mb1 rc:full``): one :func:`token` per field of
    ``names`` (default: every field in ``values``, in registry order), fields of ``omit_defaults``
    left out where they hold their default. The one formatter every report and table uses."""
    if names is None:
        names = [f.name for f in FIELDS if f.name in values and f.kind != "offload"]
    shown = [n for n in names if not (n in omit_defaults and values[n] == BY_NAME[n].default)]
    return sep.join(token(n, values[n]) for n in shown)


def _plain(v: Any) -> Any:
    if isinstance(v, float | np.floating) and v == int(v):
        return int(v)
    return v


# --------------------------------------------------------------------------------------------
# The builder
# --------------------------------------------------------------------------------------------


def _number(f: PlanField, value: Any) -> float:
    integer = f.kind == "int"
    try:
        # true is no number, nor is text ("2048": a file that writes it so is refused as for every other field)
        v = math.nan if isinstance(value, bool | str) and f.kind != "bool" else float(value)
    except (TypeError, ValueError):
        v = math.nan
    ok = math.isfinite(v) and v >= f.lo and v <= f.hi and (v > 0 or f.lo <= 0) and (not integer or v == int(v))
    if not ok:
        raise ValueError(f"{f.name} must be {rule(f.name)}; got {value!r}")
    return v


def _rule(f: PlanField) -> str:
    """The range of a numeric field in words (``a positive integer <= 1,048,576``, ``one of 0, 1, 2, 3``)."""
    if f.kind == "int" and f.hi - f.lo <= 8:
        return f"one of {', '.join(str(int(x)) for x in range(int(f.lo), int(f.hi) + 1))}"
    bound = "" if math.isinf(f.hi) else f" <= {_bound(f.hi)}"
    if f.kind == "int" and f.lo > 0:
        return f"a positive integer{bound}"
    what = "an integer" if f.kind == "int" else "a number"
    return f"{what} >= {f.lo:g}" + (f" and{bound}" if bound else "")


def _bound(hi: float) -> str:
    return f"{hi:g}" if hi != int(hi) else f"{int(hi):,}" if hi < 1e9 else f"{hi:.0e}"


def rule(name: str) -> str:
    """The range of plan field ``name`` in words, as in its error messages."""
    return _rule(BY_NAME[name]) + (f" (0 = {BY_NAME[name].zero_means})" if BY_NAME[name].zero_means else "")


def _offload_codes(offload: Mapping[str, str] | None) -> np.ndarray:
    tiers = np.zeros(len(OffloadState), dtype=np.int32)
    for state, tier in (offload or {}).items():
        s = OffloadState.parse(state, "offload state")
        tiers[s] = Tier.parse(tier, f"offload tier for {state}")
    return tiers


def resolve(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = [k for k in options if k not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown plan field {unknown[0]!r}; allowed: {', '.join(BY_NAME)}")
    values = {**DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    for f in FIELDS:
        if f.default is REQUIRED and values.get(f.name) is None:
            raise ValueError(f"{f.name} is required")
    for name in ("n_gpus", "tp", "pp", "cp"):
        values[name] = _number(BY_NAME[name], values[name])
    if values["dp"] in (AUTO, None):
        dp = derived_dp(values["n_gpus"], values["tp"], values["pp"], values["cp"])
        if dp != int(dp) or dp < 1:
            group = int(values["tp"] * values["pp"] * values["cp"])
            raise ValueError(f"n_gpus {int(values['n_gpus'])} is not divisible by tp*pp*cp = {group}")
        values["dp"] = dp
    values["sp"] = resolve_sp(values["sp"], values["tp"])
    offload = _offload_codes(values["offload"])
    values["cpu_optimizer"] = resolve_cpu_optimizer(values["cpu_optimizer"], bool(offload[OffloadState.OPTIMIZER] > 0))
    values["offload"] = offload
    return values


def leaf_value(f: PlanField, value: Any) -> Any:
    if f.kind == "choice":
        return f.options.parse(value, f.name).value  # type: ignore[union-attr]
    if f.kind == "offload":
        return value
    if f.kind == "bool":
        if not isinstance(value, bool | int | np.bool_):
            raise ValueError(f"{f.name} must be true or false; got {value!r}")
        return float(bool(value))
    return _number(f, value)
