"""What a sweep found, read back from its dataset: the best feasible configuration per objective."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dse.metrics import METRICS
from dse.sweep.space import COLUMNS
from hetersim.types import Infeasible

SUMMARY_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "mfu", "hbm_used_GiB", "time_to_train_s", "cost_usd")


def describe(ds, index: int) -> dict[str, Any]:
    """Configuration ``index`` of a sweep dataset with categorical codes turned into names."""
    out: dict[str, Any] = {}
    for c in COLUMNS:
        var = ds[c]
        value = int(var.isel(config=index).values)
        if "flag_meanings" in var.attrs:
            value = var.attrs["flag_meanings"].split()[value]
        out[c] = value
    return out


def varied_fields(ds) -> list[str]:
    """The plan fields (beyond model, GPU and GPU count) that take more than one value over the
    dataset's configurations: a streamed file's from its per-axis summaries (``marginal_<field>``
    dimensions, one entry per value of every configuration evaluated), not the few it kept."""
    out = []
    for c in COLUMNS[3:]:
        if f"marginal_{c}" in ds.sizes:
            n = ds.sizes[f"marginal_{c}"]
        else:
            n = np.unique(ds[c].values).size if c in ds else 0
        if n > 1:
            out.append(c)
    return out


def summarize(path: str | Path) -> dict[str, Any]:
    """Size, feasible count, infeasibility reasons and the best feasible configuration per objective
    (of a streamed file: counts over every configuration evaluated, from its attributes; ``index``
    is the flat index, as in a full dataset)."""
    import xarray as xr

    with xr.open_dataset(path) as ds:
        streamed = bool(ds.attrs.get("streamed", 0))
        feasible = ds["feasible"].values.astype(bool)
        flags = ds["infeasible"].values
        if streamed:
            reasons = json.loads(ds.attrs["infeasible_reasons"])
        else:
            reasons = Infeasible.counts(flags)
        best: dict[str, Any] = {}
        for name in ds.attrs["objectives"].split():
            values = ds[name].values.astype(np.float64)
            sense = METRICS[name].sense
            if not feasible.any():
                best[name] = None
                continue
            masked = np.where(feasible, values if sense == "min" else -values, np.inf)
            i = int(np.argmin(masked))
            best[name] = {
                "value": float(values[i]),
                "units": METRICS[name].units,
                "sense": sense,
                "index": int(ds["config"].values[i]) if streamed else i,
                "config": describe(ds, i),
                "metrics": {m: float(ds[m].isel(config=i).values) for m in SUMMARY_METRICS},
            }
        out = {
            "study": ds.attrs["study_name"],
            "varied": varied_fields(ds),
            "path": str(path),
            "n_configs": int(ds.attrs["n_configs"]) if streamed else int(ds.sizes["config"]),
            "cross_product_size": int(ds.attrs["cross_product_size"]),
            "n_feasible": int(ds.attrs["n_feasible"]) if streamed else int(feasible.sum()),
            "infeasible_reasons": {k: v for k, v in reasons.items() if v},
            "best": best,
        }
        if streamed:
            out.update(streamed=True, n_kept=int(ds.sizes["config"]), top_k=int(ds.attrs["top_k"]))
        return out
