"""What a sweep stores per configuration: metric names, units, labels and which way is better.

Pure data, no JAX: study files are validated against these names (objectives, constraints) and
the sweep writes one netCDF variable per entry with its ``units`` and ``long_name``.

``Metric.units`` is the short spelling people read (``GiB``, ``tokens/s``, ``USD``); files get the
UDUNITS-2 spelling of it (:func:`cf_attrs`: ``2^30 byte``, ``s-1`` with the quantity in the long
name, ``1`` plus ``currency = "USD"``), which CF checkers, ``cf_units`` and pint-xarray (through
cf-xarray) accept, and readers turn it back into the short one (:func:`display_units`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from hetersim.outputs import INTERVALS as INTERVAL_LABELS
from hetersim.outputs import STEP_TERMS
from hetersim.units import DAY, HOUR

Sense = Literal["min", "max"]

# Breakdown terms of the step time: the model's one table (hetersim.outputs, no JAX).
STEP_TERM_LABELS = STEP_TERMS


@dataclass(frozen=True)
class Metric:
    units: str
    long_name: str
    sense: Sense = "min"  # which way is better when the metric is an objective
    dtype: str = "f4"  # netCDF type


METRICS: dict[str, Metric] = {
    "step_time_s": Metric("s", "training step time"),
    **{name: Metric("s", f"{label} per step") for name, label in STEP_TERM_LABELS.items()},
    "tokens_per_s": Metric("tokens/s", "training throughput", "max"),
    "tokens_per_s_per_gpu": Metric("tokens/s/GPU", "training throughput per GPU", "max"),
    "mfu": Metric("1", "model FLOPs utilization", "max"),
    "hfu": Metric("1", "hardware FLOPs utilization (with recomputation)", "max"),
    "model_tflops_per_gpu": Metric("TFLOP/s", "model FLOP/s per GPU", "max"),
    "hbm_used_GiB": Metric("GiB", "HBM used per GPU"),
    "weights_GiB": Metric("GiB", "weights in HBM per GPU"),
    "grads_GiB": Metric("GiB", "gradients in HBM per GPU"),
    "optimizer_GiB": Metric("GiB", "optimizer states in HBM per GPU"),
    "activations_GiB": Metric("GiB", "stored activations per GPU"),
    # Slower memory tiers, per node (hetersim.types.TIER; the pool: this node's share of it).
    "host_dram_used_GiB": Metric("GiB", "offloaded state in host DRAM per node"),
    "host_dram_capacity_GiB": Metric("GiB", "host DRAM capacity per node"),
    "cxl_expander_used_GiB": Metric("GiB", "offloaded state in CXL expanders per node"),
    "cxl_expander_capacity_GiB": Metric("GiB", "CXL expander capacity per node"),
    "cxl_pool_used_GiB": Metric("GiB", "offloaded state in the CXL memory pool per node"),
    "cxl_pool_capacity_GiB": Metric("GiB", "CXL memory pool capacity per node (its share of the pool)"),
    "offload_traffic_s": Metric("s", "transfers to and from memory tiers per step, hidden or not"),
    "offload_bw_needed_GBps": Metric("GB/s", "per-GPU tier bandwidth that would hide all offload traffic"),
    "time_to_train_s": Metric("s", "time to train the token budget"),
    "cost_usd": Metric("USD", "cost to train the token budget (on-demand GPU-hours)"),
    "energy_kWh": Metric("kWh", "GPU energy to train the token budget (at TDP)"),
    # Goodput (hetersim.terms.goodput): failures, restarts, checkpoints on a tier, stragglers.
    "goodput": Metric("1", "share of wall time spent on useful training", "max"),
    "effective_time_s": Metric("s", "wall time to train with failures, restarts, checkpoints and stragglers"),
    "effective_cost_usd": Metric("USD", "cost of the effective time to train (on-demand GPU-hours)"),
    "effective_energy_kWh": Metric("kWh", "GPU energy of the effective time to train (at TDP)"),
    "checkpoint_overhead_s": Metric("s", "checkpoint time training waits for, per step"),
    "checkpoint_interval_s": Metric("s", "training time between checkpoints"),
    "checkpoint_tier_GiB": Metric("GiB", "room per node the checkpoints need on their tier"),
    "infeasible": Metric("1", "why the configuration cannot run (hetersim.types.Infeasible bit flags)", "min", "i4"),
}

# The step time's 80% prediction interval (hetersim.fit.intervals): two variables of a sweep
# dataset beside step_time_s, computed with it in the compiled chunk; not a breakdown field.
INTERVALS: dict[str, Metric] = {name: Metric("s", label) for name, label in INTERVAL_LABELS.items()}

# Derived quantities a constraint may bound besides the metrics above.
DERIVED = {"hbm_frac": Metric("1", "HBM used / HBM capacity")}

CONSTRAINT_PREFIXES = ("max_", "min_")

# Short units -> (UDUNITS-2 units, what the long name adds, extra attributes). Units not listed
# here are written as they are (``s``, ``1``, ``kW``, ``W``, ``us``, ``ns``, ``1e6`` parse as they are).
CF_UNITS: dict[str, tuple[str, str, dict[str, str]]] = {
    "GiB": ("2^30 byte", "", {}),
    "GB/s": ("Gbyte/s", "", {}),
    "kWh": ("kW h", "", {}),
    "TFLOP/s": ("1e12 s-1", "floating-point operations per second", {}),
    "Gparams/s": ("1e9 s-1", "parameters per second", {}),
    "tokens/s": ("s-1", "tokens per second", {}),
    "tokens/s/GPU": ("s-1", "tokens per second per GPU", {}),
    "USD": ("1", "", {"currency": "USD"}),
    "USD/h": ("h-1", "", {"currency": "USD"}),
    "sequences": ("1", "sequences", {}),
    "tokens": ("1", "tokens", {}),
    "steps": ("1", "training steps", {}),
}


def cf_attrs(units: str, long_name: str) -> dict[str, str]:
    """``units`` and ``long_name`` (plus ``currency`` where it applies) as a netCDF file writes them:
    ``units`` in a spelling UDUNITS-2 accepts, the counted quantity named in ``long_name``."""
    cf, quantity, extra = CF_UNITS.get(units, (units, "", {}))
    if quantity and quantity not in long_name:
        long_name = f"{long_name} ({quantity})"
    return {"units": cf, "long_name": long_name, **extra}


# Display units: (values at least this large, divide by, new units).
DISPLAY = {
    "s": ((2 * DAY, DAY, "days"), (2 * HOUR, HOUR, "h")),
    "USD": ((2e6, 1e6, "million USD"), (2e3, 1e3, "thousand USD")),
    "kWh": ((2e6, 1e6, "GWh"), (2e3, 1e3, "MWh")),
}


def display(units: str, values) -> tuple[float, str]:
    """(divisor, units) that make typical ``values`` readable: seconds as days, USD as millions."""
    v = np.abs(np.asarray(values, dtype=float))
    v = v[np.isfinite(v) & (v > 0)]
    typical = float(np.median(v)) if v.size else 0.0
    for at_least, factor, name in DISPLAY.get(units, ()):
        if typical >= at_least:
            return factor, name
    return 1.0, units


def display_units(attrs) -> str:
    """The short units of a variable's attributes (the inverse of :func:`cf_attrs`; the units of a
    file written before it pass through)."""
    units = str(attrs.get("units", ""))
    currency = attrs.get("currency")
    long_name = str(attrs.get("long_name", ""))
    for short, (cf, quantity, extra) in CF_UNITS.items():
        if cf == units and (not quantity or f"({quantity})" in long_name) and extra.get("currency") == currency:
            return short
    return units


def constraint_metric(key: str) -> tuple[str, Sense] | None:
    """``"max_hbm_frac"`` -> ``("hbm_frac", "max")``; None when ``key`` bounds no known metric."""
    for prefix in CONSTRAINT_PREFIXES:
        name = key.removeprefix(prefix)
        if key.startswith(prefix) and (name in METRICS or name in DERIVED) and name != "infeasible":
            return name, prefix[:-1]  # type: ignore[return-value]
    return None


def constraint_keys() -> list[str]:
    names = [n for n in (*METRICS, *DERIVED) if n != "infeasible"]
    return [p + n for n in names for p in CONSTRAINT_PREFIXES]
