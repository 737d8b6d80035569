"""Host-side construction of specs from catalog entries and plain options.

This is the edge where names (``"full"``, ``"h100-sxm-80gb"``) become codes and numbers, and
where user input is validated with one-line ``ValueError``s. Nothing here is traced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import tiers
from .pytree import as_arrays
from .specs import Calibration, DeviceSpec, ModelSpec, NetworkSpec, Plan, SystemSpec
from .types import (
    ATTENTION,
    N_LEVELS,
    OFFLOAD_STATE,
    ORDER,
    PRECISION,
    RECOMPUTE,
    TIER,
    code,
)

# A scale-out fabric spans every GPU of the job: its domain is "everything".
WHOLE_CLUSTER = 1.0e9


def model_spec(entry: Mapping[str, Any]) -> ModelSpec:
    """A :class:`ModelSpec` from a catalog model entry (or a dict of the same fields)."""
    mlp = entry.get("mlp", "gated")
    if mlp not in ("gated", "plain"):
        raise ValueError(f"model mlp must be one of gated, plain; got {mlp!r}")
    gated = mlp == "gated"
    return as_arrays(
        ModelSpec(
            layers=float(entry["layers"]),
            hidden=float(entry["hidden"]),
            heads=float(entry["heads"]),
            kv_heads=float(entry.get("kv_heads", entry["heads"])),
            ffn_hidden=float(entry["ffn_hidden"]),
            vocab=float(entry["vocab"]),
            gated=float(gated),
            # LLaMA-family models train without dropout and with rotary embeddings; GPT-3-style
            # (plain MLP) models in Megatron/NeMo use dropout 0.1 and learned/rotary positions.
            dropout=float(entry.get("dropout", not gated)),
            rope=float(entry.get("rope", gated)),
            tied_embeddings=float(bool(entry.get("tied_embeddings", False))),
        )
    )


def device_spec(gpu: Mapping[str, Any]) -> DeviceSpec:
    peaks = [float(gpu.get(f"peak_tflops_{p}", 0.0)) for p in PRECISION]
    eff_bf16 = float(gpu["gemm_eff_bf16"])
    eff_fp8 = float(gpu.get("gemm_eff_fp8", 0.0) or eff_bf16)
    # fp16 tensor cores run at the bf16 rate where both exist; fp32 GEMMs are not MAMF-measured,
    # take the bf16 efficiency.
    effs = [eff_bf16, eff_bf16, eff_fp8, eff_bf16]
    return as_arrays(
        DeviceSpec(
            peak_tflops=np.array(peaks),
            gemm_eff=np.array(effs),
            attn_eff_fwd=float(gpu["attn_eff_fwd"]),
            attn_eff_bwd=float(gpu["attn_eff_bwd"]),
            # FlashAttention-2-class kernels: the device's own figure where measured, else the
            # fastest kernel's (FlashAttention-2 is the fastest kernel on Ampere).
            sm_count=float(gpu.get("sm_count", 0.0)),
            attn2_eff_fwd=float(gpu.get("attn2_eff_fwd") or gpu["attn_eff_fwd"]),
            attn2_eff_bwd=float(gpu.get("attn2_eff_bwd") or gpu["attn_eff_bwd"]),
            hbm_capacity_GiB=float(gpu["hbm_capacity_GiB"]),
            hbm_bw_GBps=float(gpu["hbm_bw_GBps"]),
            tdp_W=float(gpu["tdp_W"]),
            price_usd_per_hour=float(gpu.get("price_usd_per_hour", 0.0)),
        )
    )


def _lat(link: Mapping[str, Any], protocol: str) -> float:
    """A link's per-step latency under an NCCL protocol; Simple's where the link gives none."""
    return float(link.get(f"latency_{protocol}_us", link["latency_us"]))


def network_spec(
    gpu: Mapping[str, Any],
    links: Mapping[str, Mapping[str, Any]],
    scaleup_domain: float | None = None,
    overrides: Mapping[str, float] | None = None,
) -> NetworkSpec:
    """Levels: the GPU's scale-up fabric, an inactive intermediate level, the scale-out NICs."""
    up = links[gpu["scaleup_link"]]
    nic = links[gpu["nic"]]
    dom = float(scaleup_domain or gpu.get("scaleup_domain", 8))
    nic_bw = float(nic["bw_GBps"]) * float(gpu.get("nics_per_gpu", 1.0))
    o = dict(overrides or {})
    net = NetworkSpec(
        domain_gpus=np.array([dom, dom, WHOLE_CLUSTER]),
        bw_GBps=np.array(
            [o.get("scaleup_bw_GBps", up["bw_GBps"]), up["bw_GBps"], o.get("scaleout_bw_GBps", nic_bw)], float
        ),
        busbw_eff=np.array([up["busbw_eff"], up["busbw_eff"], nic["busbw_eff"]], float),
        latency_us=np.array([up["latency_us"], up["latency_us"], nic["latency_us"]], float),
        ll_latency_us=np.array([_lat(up, "ll"), _lat(up, "ll"), _lat(nic, "ll")], float),
        ll128_latency_us=np.array([_lat(up, "ll128"), _lat(up, "ll128"), _lat(nic, "ll128")], float),
    )
    assert net.domain_gpus.shape == (N_LEVELS,)
    return as_arrays(net)


# The node's host side and memory tiers: host DRAM always, CXL expanders and a CXL pool from the
# options or from the GPU entry's fields of those names.
host_spec = tiers.host_spec


def system_spec(
    gpu, links, scaleup_domain=None, memory=None, *, cxl_expander=None, cxl_pool=None, cxl_p2p=None
) -> SystemSpec:
    """Device, network and host specs of one GPU entry; the CXL options as for :func:`host_spec`."""
    cxl = dict(cxl_expander=cxl_expander, cxl_pool=cxl_pool, cxl_p2p=cxl_p2p)
    return SystemSpec(
        device=device_spec(gpu),
        network=network_spec(gpu, links, scaleup_domain),
        host=host_spec(gpu, links, memory, **cxl),
    )


def _positive(name: str, value: Any, integer: bool = True) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number; got {value!r}") from None
    if not np.isfinite(v) or v <= 0 or (integer and v != int(v)):
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}; got {value!r}")
    return v


def plan_spec(
    *,
    n_gpus: int,
    tp: int = 1,
    pp: int = 1,
    vp: int = 1,
    cp: int = 1,
    dp: int | None = None,
    sp: bool = False,
    zero: int = 0,
    micro_batch: int = 1,
    global_batch: int,
    seq_len: int,
    train_tokens: float = 2.0e12,
    recompute: str = "none",
    precision: str = "bf16",
    attention: str = "flash",
    order: str = "tp-cp-dp-pp",
    offload: Mapping[str, str] | None = None,
    cpu_optimizer: bool | None = None,
    bucket_Mparams: float = 0.0,
    reuse_Mparams: float = 0.0,
) -> Plan:
    """A :class:`Plan` from plain options; ``dp`` defaults to ``n_gpus / (tp*pp*cp)``.

    ``offload`` maps a state (``optimizer``, ``grads``, ``params``, ``activations``) to a tier
    (``host-dram``, ``cxl-expander``, ``cxl-pool``). ``cpu_optimizer`` defaults to True when the
    optimizer states are offloaded (DeepSpeed ZeRO-Offload's CPU-Adam).
    """
    n = _positive("n_gpus", n_gpus)
    tp, pp, vp, cp = (_positive(k, v) for k, v in (("tp", tp), ("pp", pp), ("vp", vp), ("cp", cp)))
    if dp is None:
        dp = n / (tp * pp * cp)
        if dp != int(dp) or dp < 1:
            raise ValueError(f"--gpus {int(n)} is not divisible by tp*pp*cp = {int(tp * pp * cp)}")
    dp = _positive("dp", dp)
    if bucket_Mparams < 0:
        raise ValueError(f"bucket_Mparams must be >= 0 (0 = default); got {bucket_Mparams!r}")
    if reuse_Mparams < 0:
        raise ValueError(f"reuse_Mparams must be >= 0 (0 = FSDP, keeps gathered weights); got {reuse_Mparams!r}")
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be one of 0, 1, 2, 3; got {zero!r}")
    tiers = np.zeros(len(OFFLOAD_STATE))
    for state, tier in (offload or {}).items():
        s = code(OFFLOAD_STATE, state, "offload state")
        tiers[s] = code(TIER, tier, f"offload tier for {state}")
    if cpu_optimizer is None:
        cpu_optimizer = tiers[0] > 0
    return as_arrays(
        Plan(
            n_gpus=n,
            tp=tp,
            pp=pp,
            vp=vp,
            dp=dp,
            cp=cp,
            sp=float(bool(sp)),
            zero=float(zero),
            micro_batch=_positive("micro_batch", micro_batch),
            global_batch=_positive("global_batch", global_batch),
            seq_len=_positive("seq_len", seq_len),
            train_tokens=_positive("train_tokens", train_tokens, integer=False),
            recompute_code=code(RECOMPUTE, recompute, "recompute"),
            precision_code=code(PRECISION, precision, "precision"),
            attention_code=code(ATTENTION, attention, "attention"),
            order_code=code(ORDER, order, "order"),
            offload_tier_code=tiers.astype(np.int32),
            cpu_optimizer=float(bool(cpu_optimizer)),
            bucket_Mparams=float(bucket_Mparams),
            reuse_Mparams=float(reuse_Mparams),
        )
    )


def calibration_spec(values: Mapping[str, float]) -> Calibration:
    return as_arrays(Calibration(**{k: float(values[k]) for k in Calibration.__dataclass_fields__}))
