"""The checks of a study file that look across its sections: plan values no point can use, study-wide
fields that change nothing, constraints no configuration can meet. Each problem is a
:class:`StudyError` naming the file and key (a one-line ``ValueError``). Nothing here imports JAX."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from dse.metrics import DERIVED, METRICS, constraint_keys, constraint_metric
from hetersim import planfields

# Study-wide fields that do nothing at a point without pipeline stages, ZeRO-3, experts or MLA.
INERT_SCALARS = ("cpu_optimizer", "pp_layout", "zero3_prefetch", "reuse_Mparams", "mla_up_proj", "fused_experts")
INERT_SCALARS += ("moe_imbalance", "fp8_attention")
AT_EVERY = ("pp", "zero", "precision", "ep")  # the axes an inert study-wide field is checked at
# Metrics that are shares (unit 1: MFU, HFU, goodput, HBM used / capacity): a bound above 1 is none.
SHARES = tuple(n for n, m in {**METRICS, **DERIVED}.items() if m.units == "1" and n != "infeasible")


class StudyError(ValueError):
    """A problem with a study file: its origin, the key (None: the whole file) and what is wrong."""

    def __init__(self, origin: str, key: str | None, message: str) -> None:
        self.origin, self.key, self.message = origin, key, message
        where = f"study file {origin}" if key is None else f"study file {origin}: {key}"
        super().__init__(f"{where}: {message}")


def _err(origin: str, key: str | None, message: str) -> StudyError:
    return StudyError(origin, key, message)


def _experts(models: Mapping) -> dict[str, int]:
    return {name: int(m.get("n_experts", 0) or 0) for name, m in models.items()}


def _check_possible(origin: str, axes: Mapping[str, tuple[Any, ...]], models: Mapping) -> None:
    """Values that no combination of the other axes can use: a parallel size that divides no GPU
    count, an expert-parallel size that divides no model's experts, a micro-batch above every batch."""
    n_gpus = axes["n_gpus"]
    for key in ("tp", "pp", "cp", "ep", "etp"):
        for v in axes[key]:
            if not any(n % v == 0 for n in n_gpus):
                ns = ", ".join(map(str, n_gpus))
                raise _err(origin, f"plan.{key}", f"{v} divides none of hardware.n_gpus ({ns})")
    experts = {name: e for name, e in _experts(models).items() if e > 1}
    for v in axes["ep"] if experts else ():  # without experts: _check_unused_axes
        if not any(e % v == 0 for e in experts.values()):
            counts = ", ".join(f"{name}: {e}" for name, e in experts.items())
            raise _err(origin, "plan.ep", f"{v} divides the experts of none of the study's models ({counts})")
    for b in axes["micro_batch"]:
        if b > max(axes["global_batch"]):
            raise _err(origin, "plan.micro_batch", f"{b} is larger than every plan.global_batch")


def _check_unused_axes(origin: str, axes: Mapping[str, tuple[Any, ...]], models: Mapping) -> None:
    """Axes no point can use: expert options without MoE models (else data), shard_group at ZeRO 0,
    DualPipe without an even pipeline."""
    experts, default = any(e > 1 for e in _experts(models).values()), planfields.DEFAULTS["dispatcher"]
    moe = f"needs a mixture-of-experts model; the study's models ({', '.join(models)}) have no experts"
    wide = [] if experts else [(k, v, "1", moe) for k in ("ep", "etp") for v in axes[k] if v > 1]
    wide += [] if experts or not any(axes["ep_overlap"]) else [("ep_overlap", True, "false", moe)]
    wide += [] if experts else [("dispatcher", v, default, moe) for v in axes["dispatcher"] if v != default]
    zero0 = "shards the ZeRO / FSDP states; every point has plan.zero 0"
    wide += [] if any(axes["zero"]) else [("shard_group", v, "0", zero0) for v in axes["shard_group"] if v]
    even = any(p >= 2 and p % 2 == 0 for p in axes["pp"]) and 1 in axes["vp"]  # DualPipe's two stages a rank
    pipes = f"needs an even plan.pp >= 2 and plan.vp 1; the study has pp {list(axes['pp'])}, vp {list(axes['vp'])}"
    wide += [] if even or True not in axes["dualpipe"] else [("dualpipe", "true", "false", pipes)]
    if wide:
        key, value, use, why = wide[0]
        raise _err(origin, f"plan.{key}", f"{value} {why} (use {use})")


def _check_inert(origin: str, axes: Mapping[str, tuple[Any, ...]], scalars: dict[str, Any], models: Mapping) -> dict:
    """A plan field the study fixes that changes nothing at any of its points (``pp_layout`` with
    pp 1 only, ``fused_experts`` without an MoE model: :func:`hetersim.api.check_inert`, one field
    at a time) is the user's own contradiction; one that some points use leaves the rest as data.
    Returns ``scalars``."""
    from hetersim.api import check_inert
    from hetersim.types import FieldError

    offload = dict(scalars.get("offload") or {})
    for name in [n for n in INERT_SCALARS if n in scalars]:
        alone = {name: scalars[name], "offload": offload if name == "cpu_optimizer" else {}}
        error: FieldError | None = None
        for model, *point in itertools.product(models.values(), *(axes[k] for k in AT_EVERY)):
            try:
                check_inert(model, alone, {**alone, **dict(zip(AT_EVERY, point, strict=True))})
                break
            except FieldError as e:
                error = e
        else:
            if error is not None:
                where = "at every point of the study: " + ", ".join(f"plan.{k} {list(axes[k])}" for k in AT_EVERY)
                raise _err(origin, f"plan.{name}", f"{error.named({f: f'plan.{f}' for f in error.fields})} ({where})")
    return scalars


def _number(origin: str, key: str, value: Any) -> float:
    """A positive finite number (a constraint's bound)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise _err(origin, key, f"must be a positive number; got {value!r}")
    return float(value)


def _constraints(origin: str, table: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in table.items():
        found = constraint_metric(key)
        if found is None:
            allowed = ", ".join(constraint_keys())
            message = f"unknown constraint; allowed: max_<metric> or min_<metric>: {allowed}"
            raise _err(origin, f"constraints.{key}", message)
        metric, _ = found
        v = _number(origin, f"constraints.{key}", value)
        if metric in SHARES and v > 1.0:  # no configuration reaches a min above 1; a max above 1 bounds nothing
            raise _err(origin, f"constraints.{key}", f"must be in (0, 1] ({metric} is a share); got {value!r}")
        out[key] = v
    for key, low in out.items():
        metric, sense = constraint_metric(key)  # type: ignore[misc]
        high = out.get(f"max_{metric}")
        if sense == "min" and high is not None and low > high:
            message = f"{low:g} is above constraints.max_{metric} ({high:g}); no configuration can meet both"
            raise _err(origin, f"constraints.{key}", message)
    return out
