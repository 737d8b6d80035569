"""The interval model fitted to leave-one-source-out residuals (``hetersim calibrate --intervals``).

:func:`fit_from_runs` predicts every published run with constants fitted without its source
(:func:`hetersim.fit.calibration.held_out`), flags each row against what *that* fit had
(:func:`row_flags` with the :func:`evidence_of` the other sources), and fits
:func:`hetersim.fit.intervals.fit_intervals` to the residuals. Its coverage is reported two ways:

* **LOSO** (the honest figure): for each source, the interval model is fitted to the other
  sources' residuals only and applied to this source's held-out residuals;
* **in-sample**: the model fitted to all residuals applied to the same residuals.

A row the held-out fit finds infeasible has no residual: it is left out of the interval fit and
counts as not covered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import calibration
from .intervals import FLAGS, K_PSEUDO, LEVEL, IntervalModel, covered, evidence_of, fit_intervals, row_flags


def _subset(flags: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {f: v[mask] for f, v in flags.items()}


def fit_from_runs(runs_path: str | Path | None = None, catalog=None, steps: int = 300, k: float = K_PSEUDO, held=None):
    """Fit the interval model to the held-out residuals of the runs; returns the model, its LOSO
    and in-sample coverage (%), and the metadata :func:`~hetersim.fit.intervals.write_intervals`
    stores. ``held``: :func:`~hetersim.fit.calibration.held_out` of the same runs and steps, when
    the caller has it already."""
    pb, pred, ok = held if held is not None else calibration.held_out(runs_path, catalog, steps)
    labels, measured = pb.labels, pb.prep.measured
    e = np.where(ok, np.log(measured / np.where(ok, pred, 1.0)), np.nan)
    fold_evidence = {lab: evidence_of(pb.rows, pb.feasible & (labels != lab)) for lab in dict.fromkeys(labels)}
    flags = row_flags(pb.rows, pb.catalog, [fold_evidence[lab] for lab in labels])
    deployed = evidence_of(pb.rows, pb.feasible)
    model = fit_intervals(e, flags, deployed, labels, k)
    loso = np.zeros(len(e), bool)
    for lab in fold_evidence:
        mask = labels == lab
        fold_model = fit_intervals(e[~mask], _subset(flags, ~mask), deployed, labels[~mask], k)
        loso[mask] = covered(fold_model, e[mask], _subset(flags, mask))
    in_sample = covered(model, e, flags)
    meta = {
        "date": calibration.today(),
        "data": pb.path.name,
        "level": LEVEL,
        "k_pseudo_sources": k,
        "steps": steps,
        "n_runs": len(e),
        "n_residuals": int(np.isfinite(e).sum()),
        "n_sources": len(fold_evidence),
        "coverage_loso_pct": round(100.0 * loso.mean(), 1),
        "coverage_in_sample_pct": round(100.0 * in_sample.mean(), 1),
        "residual": "log(measured / predicted step time), predicted with constants fitted without the row's source",
    }
    per_source = {
        str(lab): {"n": int((labels == lab).sum()), "coverage_loso_pct": 100.0 * float(loso[labels == lab].mean())}
        for lab in fold_evidence
    }
    return {"model": model, "meta": meta, "per_source": per_source, "residuals": e, "flags": flags, "labels": labels}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What ``hetersim calibrate --intervals`` prints: the coverage and the fitted numbers."""
    m: IntervalModel = result["model"]
    return {
        **result["meta"],
        "base": {"n": m.n_base, "center": m.center, "q_lo": m.q_lo, "q_hi": m.q_hi, "s0": m.s0},
        "classes": {f: {"n": m.n[f], "sources": m.sources[f], "extra_var": m.extra_var[f]} for f in FLAGS},
        "per_source": result["per_source"],
    }
