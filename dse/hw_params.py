"""The continuous hardware parameters of a :class:`hetersim.specs.SystemSpec`, by name.

A parameter is one scalar leaf (or one element of an array leaf) of a system spec, named by a
path such as ``device.hbm_bw_GBps``, ``device.peak_tflops[bf16]`` or
``network.bw_GBps[scale-out]``; the common ones also have the catalog's short names
(``hbm_bw_GBps``, ``peak_tflops_fp8``, ``scaleout_bw_GBps``). Search spaces
(:mod:`dse.search_space`), sensitivities and continuous tuning (:mod:`dse.sensitivity`) all name
parameters this way. Structural leaves (level domain sizes, GPUs per node, which tiers exist)
and HBM's unused slot of the host tier arrays are not parameters.

:func:`get` and :func:`set_values` read and write them on NumPy or JAX specs, batched or not
(the element index addresses the last axis), so the same code serves the host and traced code.
The table is read from the spec dataclasses, so a field added to a spec becomes a parameter.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetersim.types import LEVEL_NAMES, PRECISION, TIER


@dataclass(frozen=True)
class Param:
    """One continuous hardware parameter: ``group.field`` and an element index (or None)."""

    path: str
    group: str  # "device" | "network" | "host"
    field: str
    index: int | None
    units: str


def _units(field: str) -> str:
    for suffix, units in (("_GBps", "GB/s"), ("_GiB", "GiB"), ("_us", "us"), ("_ns", "ns"), ("_W", "W")):
        if field.endswith(suffix):
            return units
    units = {"peak_tflops": "TFLOP/s", "price_usd_per_hour": "USD/h", "cpu_adam_Gparams_per_s": "Gparams/s"}
    units |= {"restart_s": "s", "interrupts_per_Mgpuh": "1/(1e6 GPU h)"}
    return units.get(field, "1")


# Leaves that describe the structure of the system (counts, presence), not a rate or a size: never
# parameters.
STRUCTURAL = (
    "network.domain_gpus",
    "network.gpus_per_nic",
    "host.gpus_per_node",
    "host.tier_present",
    "host.tier_hosts",
)


def _labels(group: str, field: str) -> tuple[tuple[str, ...] | None, bool]:
    """(element labels or None for a scalar, skip the first element) of a spec field, by the
    specs' conventions: per-precision device arrays, per-level network arrays, per-tier host
    arrays (index 0, HBM, is the device's)."""
    if group == "device":
        return (PRECISION, False) if field in ("peak_tflops", "gemm_eff") else (None, False)
    if group == "network":
        return LEVEL_NAMES, False
    return (TIER, True) if "tier" in field else (None, False)


@functools.cache
def params() -> dict[str, Param]:
    """Every continuous hardware parameter, by path, in spec order."""
    from hetersim.specs import DeviceSpec, HostSpec, NetworkSpec

    out: dict[str, Param] = {}
    for group, cls in (("device", DeviceSpec), ("network", NetworkSpec), ("host", HostSpec)):
        for f in dataclasses.fields(cls):
            if f"{group}.{f.name}" in STRUCTURAL:
                continue
            labels, skip_first = _labels(group, f.name)
            if labels is None:
                out[f"{group}.{f.name}"] = Param(f"{group}.{f.name}", group, f.name, None, _units(f.name))
                continue
            for i, label in enumerate(labels):
                if not (skip_first and i == 0):
                    path = f"{group}.{f.name}[{label}]"
                    out[path] = Param(path, group, f.name, i, _units(f.name))
    return out


# Short names (the catalog's, where it has one) for the parameters people vary most.
ALIASES: dict[str, str] = {
    **{f"peak_tflops_{p}": f"device.peak_tflops[{p}]" for p in PRECISION},
    **{f"gemm_eff_{p}": f"device.gemm_eff[{p}]" for p in PRECISION},
    **{f: f"device.{f}" for f in ("attn_eff_fwd", "attn_eff_bwd", "hbm_capacity_GiB", "hbm_bw_GBps", "tdp_W")},
    "price_usd_per_hour": "device.price_usd_per_hour",
    "scaleup_bw_GBps": "network.bw_GBps[scale-up]",
    "scaleout_bw_GBps": "network.bw_GBps[scale-out]",
    "scaleup_latency_us": "network.latency_us[scale-up]",
    "scaleout_latency_us": "network.latency_us[scale-out]",
    "scaleup_busbw_eff": "network.busbw_eff[scale-up]",
    "scaleout_busbw_eff": "network.busbw_eff[scale-out]",
    "host_dram_GiB": "host.tier_capacity_GiB[host-dram]",
    "host_bw_GBps": "host.tier_path_GBps[host-dram]",
    "cpu_adam_Gparams_per_s": "host.cpu_adam_Gparams_per_s",
    "cxl_pool_GBps": "host.tier_shared_GBps[cxl-pool]",
    "pfs_GBps": "host.pfs_GBps",
    "interrupts_per_Mgpuh": "host.interrupts_per_Mgpuh",
    "restart_s": "host.restart_s",
}


def resolve(name: str, what: str = "hardware parameter") -> Param:
    """The parameter called ``name`` (a path or a short name), or a one-line ``ValueError``."""
    param = params().get(ALIASES.get(name, name))
    if param is None:
        short = ", ".join(ALIASES)
        raise ValueError(
            f"{what} {name!r} is not a continuous hardware parameter; use a short name ({short}) or a path"
        )
    return param


def names() -> list[str]:
    """Every parameter path, in spec order."""
    return list(params())


def get(system: Any, param: Param) -> Any:
    """The parameter's value(s): one per configuration of a batched spec."""
    leaf = getattr(getattr(system, param.group), param.field)
    return leaf if param.index is None else leaf[..., param.index]


def set_values(system: Any, values: Mapping[Param, Any]) -> Any:
    """A copy of ``system`` with each parameter set (NumPy arrays or JAX arrays, batched or not)."""
    groups: dict[str, dict[str, Any]] = {}
    for param, value in values.items():
        fields = groups.setdefault(param.group, {})
        leaf = fields.get(param.field, getattr(getattr(system, param.group), param.field))
        if param.index is None:
            fields[param.field] = _like(leaf, value)
        elif hasattr(leaf, "at"):  # JAX
            fields[param.field] = leaf.at[..., param.index].set(value)
        else:
            leaf = leaf.copy()
            leaf[..., param.index] = value
            fields[param.field] = leaf
    return dataclasses.replace(system, **{g: dataclasses.replace(getattr(system, g), **f) for g, f in groups.items()})


def _like(leaf: Any, value: Any) -> Any:
    if hasattr(leaf, "at"):
        import jax.numpy as jnp

        return jnp.broadcast_to(jnp.asarray(value, leaf.dtype), leaf.shape)
    import numpy as np

    return np.broadcast_to(np.asarray(value, leaf.dtype), leaf.shape).copy()
