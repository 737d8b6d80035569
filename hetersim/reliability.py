"""Failures, restarts and storage of the fleet a job runs in, host side: catalog -> HostSpec leaves.

A GPU entry names its fleet (``fleet = "meta-llama3-h100"``, the default; catalog/fleets.toml)
and may override any of its figures (``interrupts_per_Mgpuh``, ``restart_s``, ``pfs_GBps``,
``nvme_GBps``, ``nvme_capacity_GiB``, ``straggler_node_frac``, ``straggler_slowdown``), from a
catalog file, a study's ``[hardware.set]`` or the CLI's ``--set``. The traced cost of failures and
checkpoints is :mod:`hetersim.terms.goodput`. Nothing here is traced; bad input is a one-line
``ValueError``.

**Rates from counts.** A fleet entry holds the unexpected interruptions of one observed job by
cause (the Llama 3 paper's Table 5 for ``meta-llama3-h100``). Every cause is taken to scale with
the job's size (GPUs, their hosts, NICs and the switches under them), so the rate is per GPU-hour:
``count / (job_gpus * window_days * 24)``, and a job of ``N`` GPUs is interrupted on average every
``1e6 / (N * interrupts_per_Mgpuh)`` hours (its mean time between interruptions).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

DEFAULT_FLEET = "meta-llama3-h100"
CAUSES = ("gpu", "host", "network", "software", "maintenance", "unknown")
# The hardware causes of the Llama 3 paper's "78% ... attributed to confirmed hardware issues"
# (GPU, host and network components; §3.3.4).
HARDWARE_CAUSES = ("gpu", "host", "network")
HOST_FIELDS = (
    "interrupts_per_Mgpuh",
    "restart_s",
    "nvme_GBps",
    "nvme_capacity_GiB",
    "pfs_GBps",
    "straggler_node_frac",
    "straggler_slowdown",
)


@functools.cache
def _packaged_fleets() -> dict[str, dict[str, Any]]:
    from .catalog import load_catalog

    return load_catalog().fleets


def fleet_entry(gpu: Mapping[str, Any], fleets: Mapping[str, Mapping[str, Any]] | None = None):
    """The fleets entry a GPU entry names (``fleet``, default :data:`DEFAULT_FLEET`)."""
    fleets = _packaged_fleets() if fleets is None else fleets
    key = str(gpu.get("fleet", DEFAULT_FLEET))
    if key not in fleets:
        raise ValueError(f"fleet: unknown fleet {key!r}; known: {', '.join(sorted(fleets))}")
    return fleets[key]


def gpu_hours(entry: Mapping[str, Any]) -> float:
    """GPU-hours of the observation behind a fleet's counts."""
    return float(entry["job_gpus"]) * float(entry["window_days"]) * 24.0


def rates_per_Mgpuh(entry: Mapping[str, Any]) -> dict[str, float]:
    """Unexpected interruptions per 1e6 GPU-hours, by cause (:data:`CAUSES`)."""
    hours = gpu_hours(entry)
    return {c: float(entry[f"interruptions_{c}"]) / hours * 1e6 for c in CAUSES}


def interrupts_per_Mgpuh(entry: Mapping[str, Any]) -> float:
    return sum(rates_per_Mgpuh(entry).values())


def expected_interruptions(rate_per_Mgpuh: float, n_gpus: float, hours: float) -> float:
    """Interruptions a job of ``n_gpus`` GPUs expects over ``hours`` of wall time."""
    return rate_per_Mgpuh * 1e-6 * n_gpus * hours


def job_mtbi_h(rate_per_Mgpuh: float, n_gpus: float) -> float:
    """The job's mean time between interruptions, hours."""
    return 1e6 / (rate_per_Mgpuh * n_gpus)


def _positive(what: str, value: Any) -> float:
    v = float(value)
    if not v > 0 or v != v or v == float("inf"):
        raise ValueError(f"{what} must be a positive number; got {value!r}")
    return v


def host_fields(gpu: Mapping[str, Any], fleets: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, float]:
    """The goodput leaves of :class:`~hetersim.specs.HostSpec` for a GPU entry: its fleet's
    figures, each overridden by the entry's own field of the same name where it has one."""
    entry = fleet_entry(gpu, fleets)
    base = {
        "interrupts_per_Mgpuh": interrupts_per_Mgpuh(entry),
        "restart_s": float(entry["restart_s"]),
        "nvme_GBps": float(entry["nvme_GBps"]),
        "nvme_capacity_GiB": float(entry["nvme_capacity_GiB"]),
        "pfs_GBps": float(entry["pfs_GBps"]),
        "straggler_node_frac": float(entry.get("straggler_node_frac", 0.0)),
        "straggler_slowdown": float(entry.get("straggler_slowdown", 0.0)),
    }
    out = {k: float(gpu.get(k, v)) for k, v in base.items()}
    for k in ("interrupts_per_Mgpuh", "restart_s", "nvme_GBps", "nvme_capacity_GiB", "pfs_GBps"):
        _positive(k, out[k])
    frac = out["straggler_node_frac"]
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"straggler_node_frac must be a number in [0, 1]; got {frac!r}")
    if not out["straggler_slowdown"] >= 0.0:
        raise ValueError(f"straggler_slowdown must be >= 0; got {out['straggler_slowdown']!r}")
    return out


# Checkpoint tiers that are memory tiers of the node (hetersim.types.Tier): the node must have them.
_MEMORY_TIER = {"host-dram": "host-dram", "cxl-expander": "cxl-expander", "cxl-pool": "cxl-pool"}
_ADD_TIER = {"cxl-expander": "cxl_expander DEVICE:COUNT", "cxl-pool": "cxl_pool DEVICE:NHOSTS"}


def check_checkpoint_tier(host: Any, tier: str) -> None:
    """Reject checkpoints to a memory tier this node does not have (the CLI edge; inside the model
    the same case is the ``TIER_MISSING`` flag)."""
    import numpy as np

    from .types import TIER

    if tier in _MEMORY_TIER and np.asarray(host.tier_present)[TIER.index(_MEMORY_TIER[tier])] <= 0:
        raise ValueError(f"checkpoint_tier {tier}: this node has no {tier} tier (add {_ADD_TIER[tier]})")
