"""The report's goodput section: per checkpoint tier and mode, the best feasible configuration's
goodput, effective days and dollars, and the break-even price of a checkpoint tier against the
parallel file system (what the run saves by checkpointing there instead, per node it spans).

A study that prices the CXL pool at 0 (its nodes' GPU-hour price unchanged) reads the saving as
the most the pool may cost: per node attached to it per run, and per node-hour of the run's
effective time; a pool shared by ``H`` hosts may cost ``H`` times that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dse.report.page import esc
from dse.report.results import Results, decode
from hetersim.units import DAY, HOUR

KEYS = ("model", "gpu", "n_gpus")
BASELINE = "pfs"
DEFAULT_GPUS_PER_NODE = 8  # where the catalog does not know the GPU (a study's own catalog file)


def _gpus_per_node(gpu: str) -> int:
    from hetersim.catalog import load_catalog

    try:
        return int(load_catalog().gpu(gpu).get("gpus_per_node", DEFAULT_GPUS_PER_NODE))
    except ValueError:
        return DEFAULT_GPUS_PER_NODE


def goodput_rows(r: Results) -> list[dict[str, Any]]:
    """One row per (model, gpu, n_gpus, checkpoint tier, mode): the feasible configuration of
    least effective cost and its goodput figures, with the break-even price against the file
    system's best row of the same mode. Empty where the dataset has no goodput."""
    ds = r.ds
    need = ("goodput", "effective_cost_usd", "effective_time_s", "checkpoint_tier", "checkpoint_mode")
    if any(v not in ds.variables for v in need):
        return []
    feasible = np.asarray(r.feasible, bool)
    cols = {k: np.asarray(ds[k].values) for k in (*KEYS, "checkpoint_tier", "checkpoint_mode") if k in ds.variables}
    cost = np.asarray(ds["effective_cost_usd"].values, float)
    best: dict[tuple, int] = {}
    for i in np.flatnonzero(feasible):
        key = tuple(
            decode(ds, k, cols[k][i]) if k in cols else None for k in (*KEYS, "checkpoint_tier", "checkpoint_mode")
        )
        if key not in best or cost[i] < cost[best[key]]:
            best[key] = i
    rows = []
    for key, i in sorted(best.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        model, gpu, n_gpus, tier, mode = key
        f = lambda name, i=i: float(ds[name].values[i])  # noqa: E731
        row = dict(model=model, gpu=gpu, n_gpus=n_gpus, checkpoint_tier=tier, checkpoint_mode=mode)
        row.update(
            goodput=f("goodput"),
            time_to_train_days=f("time_to_train_s") / DAY,
            effective_days=f("effective_time_s") / DAY,
            effective_cost_usd=f("effective_cost_usd"),
            checkpoint_interval_s=f("checkpoint_interval_s") if "checkpoint_interval_s" in ds else float("nan"),
            checkpoint_overhead_s=f("checkpoint_overhead_s") if "checkpoint_overhead_s" in ds else float("nan"),
            checkpoint_tier_GiB=f("checkpoint_tier_GiB") if "checkpoint_tier_GiB" in ds else float("nan"),
        )
        rows.append(row)
    for row in rows:
        base = [
            b
            for b in rows
            if b["checkpoint_tier"] == BASELINE and all(b[k] == row[k] for k in (*KEYS, "checkpoint_mode"))
        ]
        if not base or row["checkpoint_tier"] == BASELINE:
            row["saving_usd"] = row["breakeven_usd_per_node"] = row["breakeven_usd_per_node_hour"] = float("nan")
            continue
        saving = base[0]["effective_cost_usd"] - row["effective_cost_usd"]
        nodes = max(float(row["n_gpus"] or 0) / _gpus_per_node(str(row["gpu"])), 1.0)
        row["saving_usd"] = saving
        row["breakeven_usd_per_node"] = saving / nodes
        row["breakeven_usd_per_node_hour"] = saving / nodes / (row["effective_days"] * DAY / HOUR)
    return rows


def section_goodput(r: Results) -> str:
    rows = goodput_rows(r)
    if not rows:
        return ""
    head = (
        "<tr><th>model</th><th>GPU</th><th>GPUs</th><th>checkpoints to</th><th>mode</th>"
        "<th>goodput</th><th>days to train</th><th>effective days</th><th>effective M USD</th>"
        "<th>interval s</th><th>waits s/step</th><th>GiB/node on tier</th>"
        "<th>saves vs pfs, M USD</th><th>break-even USD/node/run</th><th>USD/node-hour</th></tr>"
    )

    def num(v: float, fmt: str) -> str:
        return "–" if not np.isfinite(v) else format(v, fmt)

    body = []
    for x in rows:
        cells = [
            esc(x["model"]),
            esc(x["gpu"]),
            esc(x["n_gpus"]),
            esc(x["checkpoint_tier"]),
            esc(x["checkpoint_mode"]),
            f"{100 * x['goodput']:.2f} %",
            num(x["time_to_train_days"], ".1f"),
            num(x["effective_days"], ".1f"),
            num(x["effective_cost_usd"] / 1e6, ".2f"),
            num(x["checkpoint_interval_s"], ".3g"),
            num(x["checkpoint_overhead_s"], ".3g"),
            num(x["checkpoint_tier_GiB"], ".3g"),
            num(x["saving_usd"] / 1e6, ".2f"),
            num(x["breakeven_usd_per_node"], ",.0f"),
            num(x["breakeven_usd_per_node_hour"], ".3f"),
        ]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        "<h2>Goodput by checkpoint tier</h2>"
        "<p>Per checkpoint tier and mode, the feasible configuration of least effective cost "
        "(failures, restarts and checkpoints included; hetersim/terms/goodput.py). The break-even "
        "price is what checkpointing there saves over the parallel file system, per node of the "
        "job: the most a tier that the study prices at 0 may cost per node, per run and per "
        "node-hour.</p>"
        f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"
    )
