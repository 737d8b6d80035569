"""Global calibration constants: stored values, and their fit by gradient descent.

The model has a handful of efficiency constants that no spec sheet gives (a kernel's fixed cost,
how much of the HBM bandwidth element-wise kernels reach, how much communication the software
hides). They are global — one value for every device, model and layout — and
``hetersim calibrate`` fits them to the published runs by gradient descent through the
differentiable model (Adam on the absolute log error of step time, averaged per source, then over
sources: see :func:`source_weights`). The result is stored in
``catalog/calibration.toml`` with the date, the data and the error it reached. Each constant is
kept inside physical bounds by a sigmoid, so the fit cannot wander into nonsense.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import tomllib
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..build import calibration_spec
from ..catalog import load_catalog
from ..specs import Calibration
from . import runs, validation
from .adam import adam

# name: (lower, upper, unit / meaning)
BOUNDS: dict[str, tuple[float, float, str]] = {
    # A CUDA kernel launch costs a few microseconds; with its tail a kernel's fixed cost stays
    # within 1-10 us.
    "kernel_overhead_us": (1.0, 10.0, "us per kernel launch (launch latency + tail)"),
    # Streaming kernels reach 80-92% of HBM peak (measured STREAM-triad on H100: about 3.0-3.1 of
    # 3.35 TB/s); the fit may not wander outside what such kernels measure.
    "mem_bw_eff": (0.8, 0.92, "fraction of HBM bandwidth reached by element-wise kernels"),
    "tp_overlap": (0.0, 0.95, "fraction of tensor-parallel traffic hidden"),
    "dp_overlap": (0.0, 1.0, "fraction of the backward/forward window usable to hide DP traffic"),
    "pp_overlap": (0.0, 0.95, "fraction of pipeline point-to-point traffic hidden"),
    "gemm_shape_eff": (0.7, 1.0, "training-shaped GEMM rate / best-case (MAMF) rate"),
    "fp8_scaling_eff": (0.5, 1.0, "FP8 GEMM rate with per-tensor scaling / FP8 best-case rate"),
}


def calibration_path() -> Path:
    return Path(str(resources.files("hetersim") / "catalog" / "calibration.toml"))


def load_calibration(path: str | Path | None = None) -> dict[str, float]:
    """The stored calibration values (``[values]`` table of ``calibration.toml``)."""
    path = Path(path) if path else calibration_path()
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read calibration ({e})") from None
    values = doc.get("values", {})
    missing = [k for k in BOUNDS if k not in values]
    if missing:
        raise ValueError(f"{path}: [values] lacks {', '.join(missing)}")
    return {k: float(values[k]) for k in BOUNDS}


def _to_unconstrained(values: Mapping[str, float]) -> jnp.ndarray:
    out = []
    for k, (lo, hi, _) in BOUNDS.items():
        x = np.clip((values[k] - lo) / (hi - lo), 1e-4, 1 - 1e-4)
        out.append(np.log(x / (1 - x)))
    return jnp.array(out, jnp.float32)


def _to_values(z: jnp.ndarray) -> Calibration:
    vals = {}
    for i, (k, (lo, hi, _)) in enumerate(BOUNDS.items()):
        vals[k] = lo + (hi - lo) * jax.nn.sigmoid(z[i])
    return Calibration(**vals)


def _l1(r):
    return jnp.sqrt(r * r + 1e-4)


LOSS = _l1


def source_weights(labels: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row weights that give every source the same total weight: ``mask / n_rows(source)``.

    A source is one measurement campaign on one software stack; its rows share that stack's
    habits and the way the numbers were taken, so they are not independent evidence. With equal
    row weights the largest campaigns (17 torchtitan runs, 16 of Narayanan's) would set the
    global constants for everyone; weighted per source, each campaign counts once. Measured on
    held-out sources (leave-one-source-out, 400 steps, 2026-11-30): 10.65% MAPE over the rows
    and 9.2% averaged over sources, against 10.72% and 9.4% with equal row weights.
    """
    mask = np.asarray(mask, np.float64)
    w = np.zeros_like(mask)
    for label in dict.fromkeys(labels):
        sel = labels == label
        n = mask[sel].sum()
        if n > 0:
            w[sel] = mask[sel] / n
    return w


def fitter(
    predict: Callable[[Calibration], Any],
    measured: np.ndarray,
    start: Mapping[str, float],
    steps: int = 400,
    lr: float = 0.05,
) -> Callable[[np.ndarray], tuple[dict[str, float], list[float]]]:
    """:func:`fit` for one problem, compiled once for any ``mask``: the leave-one-source-out fits
    differ only in their row weights, so they share one program (each fold compiling its own took
    about 6 s of a fold's 6 s on 2 cores)."""
    meas = jnp.asarray(measured, jnp.float32)

    def loss(z, w):
        pred, _ = predict(_to_values(z))
        r = jnp.log(jnp.maximum(pred, 1e-9) / meas)
        return jnp.sum(w * LOSS(r)) / jnp.sum(w)

    run = jax.jit(lambda z0, w: adam(jax.value_and_grad(lambda z: loss(z, w)), z0, steps, lr))
    z0 = _to_unconstrained(start)

    def solve(mask: np.ndarray) -> tuple[dict[str, float], list[float]]:
        result = run(z0, jnp.asarray(mask, jnp.float32))
        cal = _to_values(result.x)
        return {k: float(getattr(cal, k)) for k in BOUNDS}, [float(h) for h in np.asarray(result.history)]

    return solve


def fit(
    predict: Callable[[Calibration], Any],
    measured: np.ndarray,
    mask: np.ndarray,
    start: Mapping[str, float],
    steps: int = 400,
    lr: float = 0.05,
) -> tuple[dict[str, float], list[float]]:
    """Adam (:func:`hetersim.fit.adam.adam`) on the ``mask``-weighted mean of
    ``sqrt(log(pred/meas)^2 + eps)`` (``mask`` is 0/1 or row weights, e.g. :func:`source_weights`);
    returns the values after the last step and the loss history.
    ``predict(cal)`` returns (step_time_s, feasible) arrays for all rows."""
    return fitter(predict, measured, start, steps, lr)(mask)


def write_calibration(path: str | Path, values: Mapping[str, float], meta: Mapping[str, Any]) -> None:
    """Write ``calibration.toml`` (values, bounds, provenance) atomically."""
    path = Path(path)
    lines = [
        "# Global calibration constants of the HeterSim cost model.",
        "# Written by `hetersim calibrate`; do not edit by hand: rerun the fit.",
        "",
        "[fit]",
    ]
    for k, v in meta.items():
        lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
    lines += ["", "[values]"]
    for k, v in values.items():
        lines.append(f"{k} = {float(v):.6g}  # {BOUNDS[k][2]}; bounds [{BOUNDS[k][0]}, {BOUNDS[k][1]}]")
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; give the calibration TOML file to write")
    write_atomic(path, "\n".join(lines) + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it: a reader sees the old file or
    the new one, never half of one, and a failed write leaves nothing behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a missing folder is made, as dse.atomic does
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def today() -> str:
    return _dt.date.today().isoformat()


def as_spec(values: Mapping[str, float]) -> Calibration:
    return calibration_spec(values)


@dataclasses.dataclass
class _Problem:
    """The runs a fit works on: rows, their prepared specs, which are feasible under the starting
    constants, their source labels, and the prediction the fit differentiates."""

    catalog: Any
    path: Path
    rows: list
    prep: Any
    cal0: Calibration
    feasible: np.ndarray
    labels: np.ndarray

    def predict(self, cal: Calibration):
        out = validation.predict(self.prep, cal)
        return out.step_time_s, out.infeasible


def _problem(runs_path, catalog, start: Mapping[str, float]) -> _Problem:
    catalog = catalog or load_catalog()
    path = Path(runs_path) if runs_path else runs.default_runs_path()
    rows = runs.read_runs(path)
    cal0 = as_spec(start)
    prep = validation.prepare(rows, catalog, cal0, str(path))
    feasible = np.asarray(validation.predict(prep, cal0).infeasible) == 0
    labels = np.array([runs.source_label(r.source) for r in rows])
    return _Problem(catalog, path, rows, prep, cal0, feasible, labels)


def calibrate(
    runs_path: str | Path | None = None,
    catalog=None,
    steps: int = 300,
    start: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Fit the constants to the runs of ``runs_path`` (default: the packaged published runs).

    Rows the model judges infeasible under the starting values are left out of the fit (they
    count as 100% error in ``validate`` whatever the constants). Returns the fitted values, the
    loss history and the validation summaries before and after.
    """
    start = dict(start or load_calibration())
    pb = _problem(runs_path, catalog, start)
    weights = source_weights(pb.labels, pb.feasible)
    values, history = fit(pb.predict, pb.prep.measured, weights, start, steps=steps)
    before = validation.validate(pb.rows, pb.catalog, pb.cal0, str(pb.path))
    after = validation.validate(pb.rows, pb.catalog, as_spec(values), str(pb.path))
    meta = {
        "date": today(),
        "data": pb.path.name,
        "n_runs": len(pb.rows),
        "n_fitted": int(pb.feasible.sum()),
        "steps": steps,
        "loss": "mean over sources of the mean |log(predicted / measured step time)| of its runs",
        "final_loss": round(history[-1], 5),
        "mape_step_time_pct": round(after["mape_step_time_pct"], 2),
    }
    return {"values": values, "history": history, "before": before, "after": after, "meta": meta}


def held_out(runs_path: str | Path | None = None, catalog=None, steps: int = 300):
    """Leave-one-source-out predictions: for each source, the constants fitted without its runs
    predict its rows. Returns the problem (rows, labels, measured, which rows the fit may use)
    and, per row, the held-out predicted step time and whether it is feasible."""
    start = load_calibration()
    pb = _problem(runs_path, catalog, start)
    pred = np.full(len(pb.rows), np.nan)
    ok = np.zeros(len(pb.rows), bool)
    solve = fitter(pb.predict, pb.prep.measured, start, steps=steps)
    for label in dict.fromkeys(pb.labels):
        train = pb.feasible & (pb.labels != label)
        values, _ = solve(source_weights(pb.labels, train))
        p, flags = pb.predict(as_spec(values))
        mask = pb.labels == label
        pred[mask] = np.asarray(p, np.float64)[mask]
        ok[mask] = (np.asarray(flags) == 0)[mask]
    return pb, pred, ok


def cross_validate(runs_path: str | Path | None = None, catalog=None, steps: int = 300, held=None) -> dict[str, Any]:
    """Leave-one-source-out: fit the constants without a source's runs, predict that source.

    The honest estimate of how the model does on published runs it was not fitted to. Returns
    per held-out source its MAPE, and the MAPE over all rows predicted while held out. ``held``:
    the result of :func:`held_out` for the same runs and steps, when the caller has it already.
    """
    pb, pred, ok = held if held is not None else held_out(runs_path, catalog, steps)
    measured, labels = pb.prep.measured, pb.labels
    held_err = np.where(ok, np.abs(pred - measured) / measured * 100.0, 100.0)
    per_source = {}
    for label in dict.fromkeys(labels):
        mask = labels == label
        per_source[str(label)] = {"n": int(mask.sum()), "mape_pct": float(held_err[mask].mean())}
    return {"mape_step_time_pct": float(np.mean(held_err)), "per_source": per_source, "steps": steps}
