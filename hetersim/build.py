"""Host-side construction of specs from catalog entries and plain options.

This is the edge where names (``"full"``, ``"h100-sxm-80gb"``) become codes and numbers, and
where user input is validated with one-line ``ValueError``s. Nothing here is traced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import tiers
from .pytree import as_arrays, replace
from .specs import Calibration, DeviceSpec, ModelExtra, ModelSpec, NetworkSpec, SystemSpec
from .specs import plan as _plan
from .terms.attention import FA2_SOFTMAX_COST
from .types import N_LEVELS, PRECISION

# A scale-out fabric spans every GPU of the job: its domain is "everything".
WHOLE_CLUSTER = 1.0e9


def model_spec(entry: Mapping[str, Any]) -> ModelSpec:
    """A :class:`ModelSpec` from a catalog model entry (or a dict of the same fields)."""
    mlp = entry.get("mlp", "gated")
    if mlp not in ("gated", "plain"):
        raise ValueError(f"model mlp must be one of gated, plain; got {mlp!r}")
    gated = mlp == "gated"
    moe = moe_fields(entry)
    return as_arrays(
        ModelSpec(
            layers=float(entry["layers"]),
            hidden=float(entry["hidden"]),
            heads=float(entry["heads"]),
            kv_heads=float(entry.get("kv_heads", entry["heads"])),
            head_dim=float(entry.get("head_dim") or entry["hidden"] / entry["heads"]),
            ffn_hidden=float(entry["ffn_hidden"]),
            vocab=float(entry["vocab"]),
            gated=float(gated),
            # LLaMA-family models train without dropout and with rotary embeddings; GPT-3-style
            # (plain MLP) models in Megatron/NeMo use dropout 0.1 and learned/rotary positions.
            dropout=float(entry.get("dropout", not gated)),
            rope=float(entry.get("rope", gated)),
            tied_embeddings=float(bool(entry.get("tied_embeddings", False))),
            extra=ModelExtra(**moe) if has_extra(moe) else None,
        )
    )


def has_extra(fields: Mapping[str, float]) -> bool:
    """Whether a model has experts, latent attention, multi-token prediction or sliding windows
    (else its ModelSpec carries no ``extra`` and its traced graph none of their terms)."""
    keys = ("n_experts", "kv_lora_rank", "mtp_layers", "swa_window", "glu_clamp", "expert_bias", "rope_scaled")
    return any(fields[k] > 0 for k in keys)


def uniform_models(models: Sequence[ModelSpec]) -> list[ModelSpec]:
    """``models`` with one tree structure, to stack: where some have an ``extra`` and some not, the
    dense ones get an all-zero one (their values; same step times)."""
    if all(m.extra is None for m in models) or all(m.extra is not None for m in models):
        return list(models)
    out = []
    for m in models:
        if m.extra is None:
            zero = {k: 0.0 for k in ModelExtra.__dataclass_fields__}
            zero.update(moe_every=1.0, v_head_dim=float(np.asarray(m.head_dim)))
            m = replace(m, extra=as_arrays(ModelExtra(**zero)))
        out.append(m)
    return out


def _count(entry: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = entry.get(key)
    return float(default if value is None else value)


def moe_fields(entry: Mapping[str, Any]) -> dict[str, float]:
    """The mixture-of-experts, latent-attention, multi-token-prediction and sliding-window leaves
    of a model entry (all zero for a dense LLaMA-style model); one-line errors for an entry that
    contradicts itself.

    ``dense_layers`` leading layers keep a dense FFN (DeepSeek's ``first_k_dense_replace``); of the
    rest every ``moe_every``-th is an MoE layer (Megatron's ``moe_layer_freq``; Llama 4 Maverick 2).
    ``shared_ffn_hidden`` is the shared experts' total width, ``shared_experts * moe_ffn_hidden``
    where the entry gives only the count. ``glu_clamp`` (the clamp limit of the gated FFN's inputs,
    0: none), ``expert_bias`` (the experts' linears carry biases) and ``rope_attention_scale``
    (YaRN's mscale, 1: none) become 0/1 leaves: what they cost depends on the stack.
    """
    name = entry.get("name", "(unnamed)")
    layers = float(entry["layers"])
    n_exp = _count(entry, "n_experts")
    top_k = _count(entry, "top_k", 1.0 if n_exp > 0 else 0.0)
    moe_ffn = _count(entry, "moe_ffn_hidden")
    _refuse_inert(entry, name, n_exp)
    if n_exp == 1:
        n_exp = 0.0  # one expert, top-1: the dense FFN
    if n_exp > 0:
        if moe_ffn <= 0:
            raise ValueError(f"model {name}: n_experts = {n_exp:g} needs moe_ffn_hidden (the FFN width of one expert)")
        if not 1 <= top_k <= n_exp:
            raise ValueError(f"model {name}: top_k must be between 1 and n_experts = {n_exp:g}; got {top_k:g}")
    shared = _count(entry, "shared_ffn_hidden", _count(entry, "shared_experts") * moe_ffn)
    every = _count(entry, "moe_every", 1.0)
    dense = _count(entry, "dense_layers")
    if every < 1 or dense >= layers and n_exp > 0:
        raise ValueError(
            f"model {name}: needs moe_every >= 1 and dense_layers < layers = {layers:g}; got {every:g}, {dense:g}"
        )
    moe_layers = float((layers - dense) // every) if n_exp > 0 else 0.0
    if n_exp > 0 and moe_layers < 1:  # priced as dense, the experts named
        raise ValueError(f"model {name}: moe_every = {every:g} past dense_layers = {dense:g} leaves no MoE layer "
                         f"of the {layers:g}")  # fmt: skip
    if n_exp > 0 and "shared_experts" in entry and not _count(entry, "shared_experts") and shared > 0:
        raise ValueError(f"model {name}: shared_experts = 0 contradicts shared_ffn_hidden = {shared:g}")
    kv_lora = _count(entry, "kv_lora_rank")
    head_dim = float(entry.get("head_dim") or entry["hidden"] / entry["heads"])
    window = _count(entry, "sliding_window")
    groups, group_topk = _route_groups(entry, name, n_exp)
    return dict(
        n_experts=n_exp,
        top_k=top_k if n_exp > 0 else 0.0,
        moe_ffn_hidden=moe_ffn if n_exp > 0 else 0.0,
        shared_ffn_hidden=shared if n_exp > 0 else 0.0,
        moe_layers=moe_layers,
        moe_every=every,
        q_lora_rank=_count(entry, "q_lora_rank") if kv_lora > 0 else 0.0,
        kv_lora_rank=kv_lora,
        rope_head_dim=_count(entry, "qk_rope_head_dim") if kv_lora > 0 else 0.0,
        v_head_dim=_count(entry, "v_head_dim", head_dim) if kv_lora > 0 else head_dim,
        mtp_layers=_count(entry, "mtp_layers"),
        swa_window=window,
        swa_share=_count(entry, "sliding_window_share", 1.0 if window > 0 else 0.0),
        glu_clamp=1.0 if _count(entry, "glu_clamp") > 0 else 0.0,
        expert_bias=1.0 if n_exp > 0 and bool(entry.get("expert_bias", False)) else 0.0,
        rope_scaled=1.0 if abs(_count(entry, "rope_attention_scale", 1.0) - 1.0) > 1e-6 else 0.0,
        route_groups=groups,
        route_group_topk=group_topk,
    )


# Fields that mean something only beside another: routing and expert fields with experts, the
# latent-attention ranks and head widths with ``kv_lora_rank`` (DeepSeek's MLA). Given beside none,
# they would be priced as nothing: refused instead (their "unset" values pass).
_NEEDS_EXPERTS = ("top_k", "moe_ffn_hidden", "shared_experts", "shared_ffn_hidden", "dense_layers", "expert_bias")
_NEEDS_MLA = ("q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def _refuse_inert(entry, name: str, n_exp: float) -> None:
    """A one-line error for an expert field in a dense entry or an MLA field without MLA."""
    given = [k for k in _NEEDS_EXPERTS if entry.get(k) not in (None, 0, False)]
    given += ["moe_every"] if entry.get("moe_every") not in (None, 1) else []
    if n_exp == 0 and given:
        key = given[0]
        raise ValueError(f"model {name}: {key} = {entry[key]!r} needs n_experts (a dense model has no experts)")
    mla = [k for k in _NEEDS_MLA if entry.get(k) not in (None, 0)]
    if _count(entry, "kv_lora_rank") == 0 and mla:
        raise ValueError(f"model {name}: {mla[0]} = {entry[mla[0]]!r} needs kv_lora_rank (multi-head latent attention)")


def _route_groups(entry: Mapping[str, Any], name: str, n_exp: float) -> tuple[float, float]:
    """(groups, groups a token may pick) of group-limited routing; (0, 0) where it is off (no
    groups, one group, or every group allowed, as Hugging Face's ``n_group = topk_group = 1``)."""
    groups, topk = _count(entry, "route_groups"), _count(entry, "route_group_topk")
    if groups <= 1 or n_exp <= 0:
        return 0.0, 0.0
    if n_exp % groups or not 1 <= topk <= groups:
        raise ValueError(
            f"model {name}: route_groups must divide n_experts = {n_exp:g} and route_group_topk be "
            f"between 1 and route_groups; got {groups:g}, {topk:g}"
        )
    reach = topk * n_exp / groups  # the experts a token's groups hold
    if _count(entry, "top_k") > reach:
        raise ValueError(f"model {name}: top_k = {_count(entry, 'top_k'):g} is more than the {reach:g} experts "
                         f"its route_group_topk = {topk:g} of route_groups = {groups:g} hold")  # fmt: skip
    return (0.0, 0.0) if topk >= groups else (groups, topk)


def device_spec(gpu: Mapping[str, Any]) -> DeviceSpec:
    peaks = [float(gpu.get(f"peak_tflops_{p}", 0.0)) for p in PRECISION]
    eff_bf16 = float(gpu["gemm_eff_bf16"])
    eff_fp8 = float(gpu.get("gemm_eff_fp8", 0.0) or eff_bf16)
    # fp16 tensor cores run at the bf16 rate where both exist; fp32 GEMMs are not MAMF-measured,
    # take the bf16 efficiency; the block-scaled formats take the FP8 one unless measured.
    eff_nvfp4 = float(gpu.get("gemm_eff_nvfp4", 0.0) or eff_fp8)
    effs = [eff_bf16, eff_bf16, eff_fp8, eff_bf16, eff_fp8, eff_nvfp4]
    assert len(effs) == len(PRECISION)
    # Fused attention kernels: none where the entry says the device runs none (V100) or gives no
    # measured utilisation; a plan asking for one there is flagged (Infeasible.KERNEL).
    fused = bool(gpu.get("flash_attention", True))
    fwd, bwd = (float(gpu.get(k, 0.0)) if fused else 0.0 for k in ("attn_eff_fwd", "attn_eff_bwd"))
    return as_arrays(
        DeviceSpec(
            peak_tflops=np.array(peaks),
            gemm_eff=np.array(effs),
            attn_eff_fwd=fwd,
            attn_eff_bwd=bwd,
            # FlashAttention-2-class kernels: the device's own figure where measured, else the
            # fastest kernel's (FlashAttention-2 is the fastest kernel on Ampere).
            sm_count=float(gpu.get("sm_count", 0.0)),
            attn2_eff_fwd=float(gpu.get("attn2_eff_fwd") or fwd) if fused else 0.0,
            attn2_eff_bwd=float(gpu.get("attn2_eff_bwd") or bwd) if fused else 0.0,
            attn_softmax_cost=float(gpu.get("attn_softmax_cost", FA2_SOFTMAX_COST)),
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
    nics_per_gpu = float(gpu.get("nics_per_gpu", 1.0))
    nic_bw = float(nic["bw_GBps"]) * nics_per_gpu
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
        gpus_per_nic=np.float64(max(1.0, 1.0 / nics_per_gpu)),
    )
    assert net.domain_gpus.shape == (N_LEVELS,)
    return as_arrays(net)


# The node's host side and memory tiers: host DRAM always, CXL expanders and a CXL pool from the
# options or from the GPU entry's fields of those names.
host_spec = tiers.host_spec


def system_spec(
    gpu, links, scaleup_domain=None, memory=None, *, cxl_expander=None, cxl_pool=None, cxl_p2p=None, fleets=None
) -> SystemSpec:
    """Device, network and host specs of one GPU entry; the CXL options, ``memory`` and ``fleets``
    (a catalog's, the packaged ones when None) as for :func:`host_spec`."""
    cxl = dict(cxl_expander=cxl_expander, cxl_pool=cxl_pool, cxl_p2p=cxl_p2p, fleets=fleets)
    return SystemSpec(
        device=device_spec(gpu),
        network=network_spec(gpu, links, scaleup_domain),
        host=host_spec(gpu, links, memory, **cxl),
    )


# Plans are built by the registry of plan fields (hetersim.specs.plan).
plan_spec = _plan.plan_spec


def calibration_spec(values: Mapping[str, float]) -> Calibration:
    return as_arrays(Calibration(**{k: float(values[k]) for k in Calibration.__dataclass_fields__}))
