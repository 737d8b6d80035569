"""80% prediction intervals of step time, from the leave-one-source-out residuals.

The honest error sample of the model is what it does on a source it was not fitted to:
:func:`hetersim.fit.calibration.cross_validate` refits the global constants without each source
and predicts that source's rows, giving per row ``e = log(measured / predicted)``. This module
turns that sample into an interval ``[low, high]`` on the step time.

**Evidence classes.** A prediction is an extrapolation along some axes; four flags say which,
each relative to the rows *the fit had* (:class:`Evidence`), so that a held-out source's rows in
the LOSO sample carry exactly the flags a new run would carry against the shipped fit:

* ``device``: the fit had no row on this device nor on one of the same die (SMs, peak and
  measured matmul efficiency: :func:`die`), or its GEMM efficiency in the catalog is not a
  measurement (its source does not start with "measured");
* ``stack``: the run's software stack (:func:`stack_key`) is not one the fit had rows for (a
  published run whose source matches no stack entry counts as such: it is priced with the default
  profile, but what it ran is unknown);
* ``long_context``: the sequence is longer than the longest the fit had;
* ``offload``: states are offloaded to a slower tier;
* ``moe``: a mixture-of-experts model where the fit had dense models only (the calibration is
  fitted to ``published_runs.csv``, which holds none: expert parallelism, its dispatch and grouped
  GEMMs are priced from their sources, but no fitted residual speaks for them).

**Model.** Rows with no flag set are the base: ``center`` is their median residual and
``q_lo``/``q_hi`` the empirical 10th/90th percentiles around it (no normality assumed); ``s0`` is
their RMS deviation. A flag widens the interval; it does not move it. Its evidence is counted in
*sources*, not rows: the residuals of one source share that source's bias (17 torchtitan rows are
one observation of how an unfitted stack behaves, not 17), so a flagged class's variance is the
mean over its sources of each source's mean squared deviation from ``center``, pooled with a prior
by ``G / (G + k)`` for ``G`` sources and ``k`` = :data:`K_PSEUDO` pseudo-sources, the prior being
``2 s0^2`` (a class the fit has no evidence for is taken to be as uncertain again as the base).
The excess over ``s0^2`` is the flag's extra variance, and a prediction's log bounds are
``center + w * (q_lo, q_hi)`` with ``w = sqrt(1 + sum(extra) / s0^2)`` (variances add in log space),
widened where needed so that ``low <= predicted <= high``.

Why no shift: the sources of a class disagree in sign (held out, torchtitan runs are 13% slower
than predicted and the DeepSpeed run 11% faster, both of them "stack without fitted rows"), and
llm-foundry's 216 published MPT runs, under a stack the fit had no rows for, are 7% *faster* than
predicted. A median shift taken over rows was one source's bias applied to every unfitted stack:
it put 40% of those runs inside their intervals; this model puts 82% (``benchmarks/
foundry_tables.py``, a check, never a fit). With one to four sources per class, a class's
direction is not identifiable from the data; its magnitude is.

The formulas take NumPy or ``jax.numpy`` arrays (``xp``), so the sweep computes the bounds
inside its compiled chunk from plan fields and a per-device table; the fitted numbers live in
``catalog/intervals.toml``, written by ``hetersim calibrate --intervals`` with their provenance.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

LEVEL = 0.8  # the interval's nominal coverage
QUANTILES = (0.1, 0.9)  # its empirical quantiles of the base residuals
# Pseudo-sources of prior per class: a class seen in G held-out sources weighs G / (G + K_PSEUDO).
# A design choice, not a fit: one source of evidence weighs as much as the prior (K_PSEUDO = 2
# gave LOSO coverage 74.4% and 84% on llm-foundry's runs against 73.1% / 85% at 1, before the
# DeepSpeed ZeRO-3 memory change moved one residual).
K_PSEUDO = 1.0
FLAGS: dict[str, str] = {
    "device": "device without fitted rows or without a measured GEMM efficiency",
    "stack": "software stack without fitted rows",
    "long_context": "sequence longer than the longest fitted",
    "offload": "states offloaded to a slower memory tier",
    "moe": "mixture-of-experts model where the fit had dense models only",
}
# The stack a row or configuration names none of: the plan field's default (Megatron-Core with
# Transformer Engine, catalog/stacks.toml).
DEFAULT_STACK = "megatron"


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a fit had rows for: device keys, stack keys, the longest sequence, whether any
    mixture-of-experts model."""

    devices: frozenset[str]
    stacks: frozenset[str]
    max_seq_len: float
    moe: bool = False


@dataclasses.dataclass(frozen=True)
class IntervalModel:
    center: float
    q_lo: float
    q_hi: float
    s0: float
    n_base: int
    extra_var: dict[str, float]
    n: dict[str, int]  # flagged rows per class
    sources: dict[str, int]  # the held-out sources they come from
    evidence: Evidence


def stack_key(stack: Any) -> str:
    """The software-stack profile a run is priced with (the plan field ``stack``): a published
    run's matched :class:`~hetersim.fit.stacks.Stack` entry (its profile), a profile name, or
    None (the default profile)."""
    if stack is None or stack == "":
        return DEFAULT_STACK
    return str(getattr(stack, "stack", stack))


def device_measured(entry: Mapping[str, Any]) -> bool:
    """Whether the catalog's GEMM efficiency of this device is a measurement (its source says so)."""
    source = str(entry.get("sources", {}).get("gemm_eff_bf16", ""))
    return source.strip().lower().startswith("measured")


def die(entry: Mapping[str, Any]) -> tuple[float, float, float]:
    """A device's compute silicon as the model sees it: SMs, dense 16-bit peak and measured matmul
    efficiency (A100 40 and 80 GB share it; so do H100 SXM and H200, whose catalog entries take
    the one MAMF measurement of that die)."""
    return tuple(float(entry.get(k, 0.0)) for k in ("sm_count", "peak_tflops_bf16", "gemm_eff_bf16"))  # type: ignore[return-value]


@functools.cache
def _fitted_dies(devices: frozenset[str]) -> frozenset[tuple[float, float, float]]:
    """The dies of the fitted devices (packaged catalog entries) whose efficiency is measured."""
    from ..catalog import load_catalog

    gpus = load_catalog().gpus
    return frozenset(die(gpus[k]) for k in devices if k in gpus and device_measured(gpus[k]))


def device_flag(key: str, entry: Mapping[str, Any], evidence: Evidence) -> float:
    """1 where the fit has no evidence of this device's compute: its efficiency is not a
    measurement, or neither it nor a device of the same die (:func:`die`) had fitted rows; a
    device that differs from a fitted one only in memory or links is evidenced by it."""
    if not device_measured(entry):
        return 1.0
    return 0.0 if key in evidence.devices or die(entry) in _fitted_dies(evidence.devices) else 1.0


def stack_flag(stack: Any, evidence: Evidence) -> float:
    return 0.0 if stack_key(stack) in evidence.stacks else 1.0


def long_context_flag(seq_len, evidence: Evidence, xp=np):
    return xp.where(seq_len > evidence.max_seq_len, 1.0, 0.0)


def moe_flag(is_moe, evidence: Evidence, xp=np):
    """1 for a mixture-of-experts model where the fit had none (``is_moe``: bool or 0/1 array)."""
    return xp.where(xp.asarray(is_moe, bool) & (not evidence.moe), 1.0, 0.0)


class Interval(tuple):
    """``(low, high)`` step time of an 80% interval; ``flags`` names the evidence flags
    (:data:`FLAGS`) that widened it, in their order there."""

    flags: tuple[str, ...]

    def __new__(cls, low: float, high: float, flags: Sequence[str] = ()):
        obj = super().__new__(cls, (float(low), float(high)))
        obj.flags = tuple(flags)
        return obj


def raised(flags: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the flags set (> 0) in a mapping of 0/1 scalars."""
    return tuple(f for f in FLAGS if float(flags.get(f, 0.0)) > 0)


def params(model: IntervalModel) -> dict[str, Any]:
    """The numbers :func:`log_bounds` uses, as a plain mapping (a pytree the sweep passes to its
    compiled chunk as arrays, so a refit never recompiles)."""
    return {
        "center": model.center,
        "q_lo": model.q_lo,
        "q_hi": model.q_hi,
        "s0": model.s0,
        "extra_var": dict(model.extra_var),
    }


def log_bounds(model: IntervalModel | Mapping[str, Any], flags: Mapping[str, Any], xp=np):
    """``(lo, hi)`` bounds of ``log(measured / predicted)``, ``lo <= 0 <= hi``; ``flags`` maps each
    name of :data:`FLAGS` to 0/1 (scalars or arrays that broadcast); ``model`` may be its
    :func:`params`."""
    p = params(model) if isinstance(model, IntervalModel) else model
    center = p["center"]
    w = xp.sqrt(1.0 + sum(p["extra_var"][f] * flags[f] for f in FLAGS) / p["s0"] ** 2)
    return xp.minimum(center + w * p["q_lo"], 0.0), xp.maximum(center + w * p["q_hi"], 0.0)


def bounds(model: IntervalModel | Mapping[str, Any], step_time_s, flags: Mapping[str, Any], xp=np):
    """``(low, high)`` step time of the interval around the prediction ``step_time_s``."""
    lo, hi = log_bounds(model, flags, xp)
    return step_time_s * xp.exp(lo), step_time_s * xp.exp(hi)


def fit_intervals(
    e: np.ndarray,
    flags: Mapping[str, np.ndarray],
    evidence: Evidence,
    sources: Sequence[Any] | np.ndarray | None = None,
    k: float = K_PSEUDO,
) -> IntervalModel:
    """The :class:`IntervalModel` of residuals ``e = log(measured / predicted)`` (finite rows only)
    with their 0/1 ``flags`` and the ``sources`` they were held out with (default: every row a
    source of its own); ``evidence`` is what the deployed fit had (it travels with the model)."""
    e = np.asarray(e, np.float64)
    src = np.arange(e.size) if sources is None else np.asarray(sources)
    if src.shape != e.shape:
        raise ValueError(f"fit_intervals: {src.size} sources for {e.size} residuals")
    ok = np.isfinite(e)
    x = {f: np.asarray(flags[f], np.float64)[ok] for f in FLAGS}
    e, src = e[ok], src[ok]
    base = sum(x.values()) == 0
    if base.sum() < 10:  # too few rows without any flag: take the whole sample as the base
        base = np.ones_like(e, bool)
    center = float(np.median(e[base]))
    d = e[base] - center
    q_lo, q_hi = (float(q) for q in np.quantile(d, QUANTILES))
    s0 = max(float(np.sqrt(np.mean(d * d))), 1e-3)
    extra, n, n_src = {}, {}, {}
    for f in FLAGS:
        on = x[f] > 0
        groups = list(dict.fromkeys(src[on].tolist()))
        n[f], n_src[f] = int(on.sum()), len(groups)
        share = n_src[f] / (n_src[f] + k)
        # each source's mean squared deviation from the center, averaged over the sources
        var_on = float(np.mean([np.mean((e[on & (src == g)] - center) ** 2) for g in groups])) if groups else 0.0
        pooled = share * var_on + (1.0 - share) * 2.0 * s0**2
        extra[f] = max(pooled - s0**2, 0.0)
    return IntervalModel(center, q_lo, q_hi, s0, int(base.sum()), extra, n, n_src, evidence)


def covered(model: IntervalModel, e: np.ndarray, flags: Mapping[str, np.ndarray]) -> np.ndarray:
    """Whether each residual lies inside its interval (a non-finite residual never does)."""
    lo, hi = log_bounds(model, {f: np.asarray(flags[f], np.float64) for f in FLAGS})
    e = np.asarray(e, np.float64)
    return np.isfinite(e) & (lo <= e) & (e <= hi)


# --- published runs ------------------------------------------------------------------------------


def _offloaded(row) -> bool:
    return row.fields.get("offload", "").strip().lower() not in ("", "none")


def _moe_row(row) -> bool:
    """A runs-file row of a mixture-of-experts model (more than one routed expert)."""
    try:
        return float((row.fields.get("n_experts") or "").strip() or 0) > 1
    except ValueError:
        return False


def evidence_of(rows: Sequence[Any], mask: np.ndarray) -> Evidence:
    """What a fit on the rows of ``mask`` had: their devices, stacks and longest sequence."""
    used = [r for r, m in zip(rows, mask, strict=True) if m]
    return Evidence(
        devices=frozenset(r.fields["gpu"].strip() for r in used),
        stacks=frozenset(stack_key(r.stack) for r in used if r.stack is not None),
        max_seq_len=max((float(r.fields["seq_len"]) for r in used), default=0.0),
        moe=any(_moe_row(r) for r in used),
    )


def row_flags(rows: Sequence[Any], catalog, evidence: Evidence | Sequence[Evidence]) -> dict[str, np.ndarray]:
    """The 0/1 evidence flags (:data:`~hetersim.fit.intervals.FLAGS`) of each run against
    ``evidence`` (one for all rows, or one per row)."""
    evs = [evidence] * len(rows) if isinstance(evidence, Evidence) else list(evidence)
    out = {f: np.zeros(len(rows)) for f in FLAGS}
    for i, (row, ev) in enumerate(zip(rows, evs, strict=True)):
        key = row.fields["gpu"].strip()
        out["device"][i] = device_flag(key, catalog.gpu(key), ev)
        # A row whose source matches no stack entry is priced with the default profile, but what
        # it ran is unknown to the fit: that is a stack without fitted rows.
        out["stack"][i] = 1.0 if row.stack is None else stack_flag(row.stack, ev)
        out["long_context"][i] = float(long_context_flag(float(row.fields["seq_len"]), ev))
        out["offload"][i] = float(_offloaded(row))
        out["moe"][i] = float(moe_flag(_moe_row(row), ev))
    return out


# --- the stored model ----------------------------------------------------------------------------


def intervals_path() -> Path:
    return Path(str(resources.files("hetersim") / "catalog" / "intervals.toml"))


def load_intervals(path: str | Path | None = None) -> IntervalModel:
    """The stored interval model (``catalog/intervals.toml``); one-line ``ValueError`` if unreadable."""
    path = Path(path) if path else intervals_path()
    try:
        doc = tomllib.loads(path.read_text())
        base, ev, cls = doc["base"], doc["evidence"], doc["class"]
        return IntervalModel(
            center=float(base["center"]),
            q_lo=float(base["q_lo"]),
            q_hi=float(base["q_hi"]),
            s0=float(base["s0"]),
            n_base=int(base["n"]),
            extra_var={f: float(cls[f]["extra_var"]) for f in FLAGS},
            n={f: int(cls[f]["n"]) for f in FLAGS},
            sources={f: int(cls[f]["sources"]) for f in FLAGS},
            evidence=Evidence(
                frozenset(ev["devices"]), frozenset(ev["stacks"]), float(ev["max_seq_len"]), bool(ev["moe"])
            ),
        )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the interval model ({type(e).__name__}: {e})") from None


def fitted_runs_name(path: str | Path | None = None) -> str:
    """The name of the runs file the stored interval model was fitted to (its ``[fit] data``);
    empty where the file or the key is missing."""
    path = Path(path) if path else intervals_path()
    try:
        return str(tomllib.loads(path.read_text())["fit"]["data"])
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return ""


def _toml(v: Any) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list | tuple | frozenset):
        return "[" + ", ".join(_toml(x) for x in sorted(v)) + "]"
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def write_intervals(path: str | Path, model: IntervalModel, meta: Mapping[str, Any]) -> None:
    """Write ``intervals.toml`` (the fitted numbers, the evidence and the provenance) atomically."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; give the interval TOML file to write")
    ev = model.evidence
    lines = [
        "# 80% prediction intervals of step time (hetersim.fit.intervals).",
        "# Written by `hetersim calibrate --intervals`; do not edit by hand: rerun it.",
        "",
        "[fit]",
        *(f"{k} = {_toml(v)}" for k, v in meta.items()),
        "",
        "[evidence]  # what the shipped fit had rows for",
        f"devices = {_toml(ev.devices)}",
        f"stacks = {_toml(ev.stacks)}",
        f"max_seq_len = {ev.max_seq_len:.0f}",
        f"moe = {'true' if ev.moe else 'false'}",
        "",
        "[base]  # residuals log(measured / predicted) of held-out rows with no flag set",
        f"n = {model.n_base}",
        f"center = {model.center:.6g}  # median",
        f"q_lo = {model.q_lo:.6g}  # 10th percentile - center",
        f"q_hi = {model.q_hi:.6g}  # 90th percentile - center",
        f"s0 = {model.s0:.6g}  # RMS deviation from center",
    ]
    for f, meaning in FLAGS.items():
        lines += ["", f"[class.{f}]  # {meaning}", f"n = {model.n[f]}", f"sources = {model.sources[f]}"]
        lines += [f"extra_var = {model.extra_var[f]:.6g}"]
    from .calibration import write_atomic

    write_atomic(path, "\n".join(lines) + "\n")
