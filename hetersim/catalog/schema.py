"""The catalog's schema: its sections, and per section the fields an entry has and their rules."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

Section = Literal["gpus", "links", "models", "memory", "fleets"]
SECTIONS: tuple[Section, ...] = ("gpus", "links", "models", "memory", "fleets")
PACKAGED_FILES: dict[Section, str] = {
    "gpus": "accelerators.toml",
    "links": "links.toml",
    "models": "models.toml",
    "memory": "memory.toml",
    "fleets": "fleets.toml",
}
_SINGULAR: dict[Section, str] = {
    "gpus": "gpu",
    "links": "link",
    "models": "model",
    "memory": "memory device",
    "fleets": "fleet",
}

Entry = dict[str, Any]


class _Invalid(Exception):
    """A value breaks its field's rule (turned into a one-line ValueError by the caller); the
    message, where there is one, replaces the rule in the error."""


# No catalog number comes near this (the largest are FLOP/s in TFLOP/s and capacities in GiB,
# ~1e4); far larger values overflow the model's float32 leaves, so they are refused.
MAX_NUMBER = 1e12
MAX_COUNT = 1 << 30


FieldKind = Literal["number", "integer", "text", "flag", "choice", "ref"]


@dataclass(frozen=True)
class _Field:
    """One field of a section: the rule text for messages and a parser that normalises a value."""

    rule: str
    parse: Callable[[Any], Any]
    kind: FieldKind
    ref_kind: str | None = None  # for kind "ref": the `kind` the named link must have
    required: bool = True  # a new entry must set it

    def optional(self) -> _Field:
        return replace(self, required=False)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(ok: Callable[[float], bool]) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if _is_number(value) and ok(value):
            if abs(value) > MAX_NUMBER:
                raise _Invalid(f"at most {MAX_NUMBER:.0e}")
            return float(value)
        raise _Invalid

    return parse


def _positive_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        if value > MAX_COUNT:
            raise _Invalid(f"a positive integer at most {MAX_COUNT:,}")
        return value
    raise _Invalid


def _count_or_zero(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    raise _Invalid


def _text(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise _Invalid


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _Invalid


def _choice(*options: str) -> _Field:
    def parse(value: Any) -> str:
        if value in options:
            return value
        raise _Invalid

    return _Field(" or ".join(repr(o) for o in options), parse, "choice")


def _link_ref(kind: str, *, optional: bool = False) -> _Field:
    """A field naming an entry of `links` whose `kind` is `kind` (checked once all files are read)."""

    def parse(value: Any) -> str:
        if isinstance(value, str) and (value or optional):
            return value
        raise _Invalid

    rule = f"the key of a {kind} link" + (' or ""' if optional else "")
    return _Field(rule, parse, "ref", ref_kind=kind)


_TEXT = _Field("a non-empty string", _text, "text")
_POSITIVE = _Field("a positive number", _number(lambda v: v > 0), "number")
_NONNEGATIVE = _Field("a number >= 0", _number(lambda v: v >= 0), "number")
_FRACTION = _Field("a number in (0, 1]", _number(lambda v: 0 < v <= 1), "number")
_FRACTION_OR_ZERO = _Field("a number in [0, 1]", _number(lambda v: 0 <= v <= 1), "number")
_COUNT = _Field("a positive integer", _positive_int, "integer")
_COUNT_OR_ZERO = _Field(f"an integer from 0 to {MAX_COUNT:,}", _count_or_zero, "integer")
_FLAG = _Field("true or false", _flag, "flag")

_SCHEMA: dict[Section, dict[str, _Field]] = {
    "gpus": {
        "name": _TEXT,
        "vendor": _TEXT,
        "peak_tflops_bf16": _NONNEGATIVE,
        "peak_tflops_fp16": _NONNEGATIVE,
        "peak_tflops_fp8": _NONNEGATIVE,
        "peak_tflops_fp32": _NONNEGATIVE,
        # Optional: the block-scaled formats (0 / absent: the device has no such tensor-core mode).
        "peak_tflops_mxfp8": _NONNEGATIVE.optional(),
        "peak_tflops_nvfp4": _NONNEGATIVE.optional(),
        # Matmul efficiency: measured best case / peak. Absent, it is derived by catalog.check from
        # a measured figure (measured_gemm_tflops_*) or the sustained clock under the power limit.
        "gemm_eff_bf16": _FRACTION.optional(),
        "gemm_eff_fp8": _FRACTION_OR_ZERO.optional(),
        "gemm_eff_nvfp4": _FRACTION.optional(),
        # Measured figures in the units the standard tools print (checked against the peaks):
        "measured_gemm_tflops_bf16": _POSITIVE.optional(),  # mamf-finder max achievable TFLOPS, bf16 (fp16)
        "measured_gemm_tflops_fp8": _POSITIVE.optional(),  # mamf-finder max achievable TFLOPS, fp8
        "measured_attn_tflops_fwd": _POSITIVE.optional(),  # flash-attention benchmark fwd TFLOPs/s, hdim 128 causal ~4k
        "measured_attn_tflops_bwd": _POSITIVE.optional(),  # the same, backward (2.5x forward FLOPs)
        "boost_clock_MHz": _POSITIVE.optional(),  # the clock the peaks are quoted at
        "sustained_clock_MHz": _POSITIVE.optional(),  # the clock large GEMMs hold under the power limit
        "hbm_capacity_GiB": _POSITIVE,
        "hbm_bw_GBps": _POSITIVE,
        "scaleup_link": _link_ref("scaleup"),
        "scaleup_domain": _COUNT,
        "gpus_per_node": _COUNT,
        "host_link": _link_ref("host"),
        "nic": _link_ref("scaleout"),
        "nics_per_gpu": _POSITIVE,
        "tdp_W": _POSITIVE,
        "price_usd": _POSITIVE.optional(),  # capex per GPU: listed and cited, not read by the model
        "price_usd_per_hour": _POSITIVE,
        # Optional, read by hetersim.build when present:
        "attn_eff_fwd": _FRACTION.optional(),  # flash-attention forward TFLOP/s / bf16 dense peak
        "attn_eff_bwd": _FRACTION.optional(),  # flash-attention backward TFLOP/s / bf16 dense peak
        "sm_count": _COUNT,  # SMs / compute units: GEMM tiles run in waves of this many
        "aliases": _TEXT.optional(),  # other names the key is looked up by, comma-separated
        "attn2_eff_fwd": _FRACTION.optional(),  # FlashAttention-2-class kernel, forward (default: attn_eff_fwd)
        "attn2_eff_bwd": _FRACTION.optional(),  # FlashAttention-2-class kernel, backward (default: attn_eff_bwd)
        "attn_softmax_cost": _POSITIVE.optional(),  # fastest kernel's head-size sensitivity (terms/attention.py)
        "flash_attention": _FLAG.optional(),  # the device runs flash-attention kernels
        "host_dram_GiB": _POSITIVE.optional(),  # host DRAM per node
        "cpu_adam_Gparams_per_s": _POSITIVE.optional(),  # host CPU-Adam throughput per node (measured)
        "host_cores": _COUNT.optional(),  # physical CPU cores per node (CPU-Adam without a measured figure)
        "host_simd": _choice("avx512", "avx2").optional(),  # the host CPUs' widest SIMD (CPU-Adam)
        # Memory tiers (read by hetersim.tiers when present; see hetersim/tiers.py):
        "host_dram_channels": _COUNT.optional(),  # DRAM channels per node (all sockets)
        "host_dram_channel": _TEXT.optional(),  # memory device key of one channel (kind "dram")
        "gpus_per_host_link": _COUNT.optional(),  # GPUs behind one upstream PCIe link / root port
        "host_path_GBps": _POSITIVE.optional(),  # measured GPU<->host bandwidth, all GPUs at once
        "cxl_expander": _TEXT.optional(),  # "DEVICE:COUNT" CXL expanders per node
        "cxl_pool": _TEXT.optional(),  # "DEVICE:NHOSTS[:LEVELS]" CXL pool behind a switch
        "cxl_p2p": _FLAG.optional(),  # GPUs reach CXL memory peer-to-peer (CXL 3.x what-if)
        "cxl_expander_GBps": _POSITIVE.optional(),  # what-if: bandwidth of one expander (overrides the device's)
        "cxl_pool_GBps": _POSITIVE.optional(),  # what-if: bandwidth of the pool (overrides the device's)
        # Goodput (read by hetersim.reliability; see catalog/fleets.toml):
        "fleet": _TEXT.optional(),  # the fleets entry whose failures, restarts and storage apply
        "interrupts_per_Mgpuh": _POSITIVE.optional(),  # what-if: interruptions per 1e6 GPU-hours
        "restart_s": _POSITIVE.optional(),  # what-if: detection and rescheduling per interruption
        "pfs_GBps": _POSITIVE.optional(),  # what-if: parallel file system bandwidth (whole job)
        "nvme_GBps": _POSITIVE.optional(),  # what-if: local NVMe write bandwidth per node
        "nvme_capacity_GiB": _POSITIVE.optional(),  # what-if: local NVMe capacity per node
        "straggler_node_frac": _FRACTION_OR_ZERO.optional(),  # what-if: share of nodes running degraded
        "straggler_slowdown": _NONNEGATIVE.optional(),  # what-if: a degraded node's extra step time (0.1 = 10%)
    },
    "links": {
        "name": _TEXT,
        "kind": _choice("scaleup", "host", "scaleout"),
        "bw_GBps": _POSITIVE,
        "latency_us": _POSITIVE,
        "busbw_eff": _FRACTION.optional(),  # absent: measured_busbw_GBps / bw_GBps
        "measured_busbw_GBps": _POSITIVE.optional(),  # nccl-tests all_reduce_perf busbw at large messages
        # Optional: per-step latency of NCCL's low-latency protocols (absent: Simple only).
        "latency_ll_us": _POSITIVE.optional(),
        "latency_ll128_us": _POSITIVE.optional(),
    },
    "models": {
        "name": _TEXT,
        "layers": _COUNT,
        "hidden": _COUNT,
        "heads": _COUNT,
        "kv_heads": _COUNT,
        "ffn_hidden": _COUNT,
        "vocab": _COUNT,
        "mlp": _choice("gated", "plain"),
        "seq_len": _COUNT,
        "tied_embeddings": _FLAG,
        # Optional, read by hetersim.build when present (defaults follow `mlp`):
        "dropout": _FLAG.optional(),
        "rope": _FLAG.optional(),
        # Optional: the width of one attention head where it is not hidden / heads (Gemma's 256).
        "head_dim": _COUNT.optional(),
        # Optional, mixture of experts (hetersim.build.moe_fields): routed experts, experts per
        # token, one expert's FFN width, shared experts (count, or their total width), leading
        # dense layers (their FFN is ffn_hidden), every moe_every-th of the others is MoE.
        "n_experts": _COUNT.optional(),
        "top_k": _COUNT.optional(),
        "moe_ffn_hidden": _COUNT.optional(),
        "shared_experts": _COUNT_OR_ZERO.optional(),
        "shared_ffn_hidden": _COUNT_OR_ZERO.optional(),
        "dense_layers": _COUNT_OR_ZERO.optional(),
        "moe_every": _COUNT.optional(),
        # Optional, group-limited routing: routed-expert groups and the groups a token may pick
        # (Hugging Face n_group / topk_group; DeepSeek-V3 8 / 4).
        "route_groups": _COUNT.optional(),
        "route_group_topk": _COUNT.optional(),
        # Optional, multi-head latent attention (DeepSeek MLA): head_dim is then qk_nope_head_dim.
        "q_lora_rank": _COUNT_OR_ZERO.optional(),
        "kv_lora_rank": _COUNT_OR_ZERO.optional(),
        "qk_rope_head_dim": _COUNT_OR_ZERO.optional(),
        "v_head_dim": _COUNT.optional(),
        # Optional: multi-token-prediction modules; sliding-window attention (width, share of layers).
        "mtp_layers": _COUNT_OR_ZERO.optional(),
        "sliding_window": _COUNT_OR_ZERO.optional(),
        "sliding_window_share": _FRACTION.optional(),
        # Optional point-wise extras (hetersim.build.moe_fields): the clamp limit of the gated FFN's
        # inputs (GPT-OSS swiglu_limit 7), biases on the experts' linears, YaRN's attention scale.
        "glu_clamp": _NONNEGATIVE.optional(),
        "expert_bias": _FLAG.optional(),
        "rope_attention_scale": _POSITIVE.optional(),
        "aliases": _TEXT.optional(),  # other names the key is looked up by, comma-separated
    },
    "memory": {
        "name": _TEXT,
        "kind": _choice("dram", "cxl-expander", "cxl-pool", "cxl-switch"),
        "bw_GBps": _POSITIVE,
        "latency_ns": _POSITIVE,
        "capacity_GiB": _NONNEGATIVE,
        "link": _link_ref("host", optional=True),
    },
    # A fleet a job runs in: its interruptions by cause over an observed window, the time to detect
    # a failure and replace the node, its storage (hetersim.reliability, hetersim.terms.goodput).
    "fleets": {
        "name": _TEXT,
        "window_days": _POSITIVE,  # the observation window of the interruption counts
        "job_gpus": _COUNT,  # GPUs of the job observed
        "interruptions_gpu": _NONNEGATIVE,  # unexpected interruptions by cause over the window
        "interruptions_host": _NONNEGATIVE,
        "interruptions_network": _NONNEGATIVE,
        "interruptions_software": _NONNEGATIVE,
        "interruptions_maintenance": _NONNEGATIVE,
        "interruptions_unknown": _NONNEGATIVE,
        "restart_s": _POSITIVE,  # detect the failure, replace the node, relaunch (before loading)
        "pfs_GBps": _POSITIVE,  # parallel file system, sustained, shared by the job
        "nvme_GBps": _POSITIVE,  # local NVMe per node, write
        "nvme_capacity_GiB": _POSITIVE,  # local NVMe per node
        "straggler_node_frac": _FRACTION_OR_ZERO.optional(),
        "straggler_slowdown": _NONNEGATIVE.optional(),
    },
}

# Provenance: models carry one `source` string, the other sections a `sources` table mapping a
# field name to where its value comes from. Both are optional on load (a user file need not cite);
# the packaged catalog is held to "every number has a source" by tests/test_catalog.py.
_PROVENANCE: dict[Section, str] = {
    "gpus": "sources",
    "links": "sources",
    "models": "source",
    "memory": "sources",
    "fleets": "sources",
}


def fields(section: Section) -> tuple[str, ...]:
    """The fields a new entry of `section` must set (optional fields and provenance excluded)."""
    return tuple(name for name, spec in _SCHEMA[section].items() if spec.required)


def numeric_fields(section: Section) -> tuple[str, ...]:
    """Fields holding a number, optional ones included (each set one needs a source)."""
    return tuple(name for name, spec in _SCHEMA[section].items() if spec.kind in ("number", "integer"))
