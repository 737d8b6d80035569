"""Predict published training runs and measure the error.

Builds one configuration per row of a runs CSV (:mod:`hetersim.fit.runs`), evaluates all rows in
one vmapped call and reports the step-time error; :func:`validate_memory` does the same for the
per-GPU memory of ``data/published_memory.csv``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import build, planfields
from ..simulate import simulate
from ..specs import Calibration, ModelSpec
from ..specs.plan import host_plan
from ..types import decimal_digits
from .runs import (
    Row,
    candidates,
    csv_records,
    cxl_defaults,
    default_runs_path,
    measured_step_time,
    read_runs,
    read_text,
    row_inputs,
    row_system,
    source_label,
)

# Rows are evaluated in batches of this many (the last one padded with copies of its last row),
# so one compiled function serves a runs file of any length and the candidate plans as well.
BATCH = 256


def _stack(xs):
    return jax.tree.map(lambda *leaves: np.stack(leaves), *xs)


@jax.jit
def _predict_batch(models, systems, plans, cal: Calibration):
    return jax.vmap(simulate, in_axes=(0, 0, 0, None))(models, systems, plans, cal)


def _predict(models, systems, plans, cal: Calibration):
    """The breakdown of every row of stacked specs, in padded batches of :data:`BATCH` rows."""
    n = len(jax.tree.leaves(plans)[0])
    outs = []
    for start in range(0, n, BATCH):
        idx = np.minimum(np.arange(start, start + BATCH), n - 1)
        batch = jax.tree.map(lambda a, idx=idx: a[idx], (models, systems, plans))
        outs.append(_predict_batch(*batch, cal))
    return jax.tree.map(lambda *parts: jnp.concatenate(parts)[:n], *outs)


class _Distinct:
    """The distinct specs of a batch, each built once (host side, NumPy leaves), and which one
    each row uses: runs files repeat a few models and GPUs over many rows."""

    def __init__(self):
        self.index: dict[Any, int] = {}
        self.specs: list[Any] = []
        self.owner: list[int] = []

    def add(self, key, make, *args) -> Any:
        if key not in self.index:
            self.index[key] = len(self.specs)
            self.specs.append(jax.tree.map(np.asarray, make(*args)))
        self.owner.append(self.index[key])
        return self.specs[self.index[key]]

    def stacked(self, rows) -> Any:
        idx = np.asarray(self.owner)[np.asarray(rows, dtype=int)]
        specs = build.uniform_models(self.specs) if isinstance(self.specs[0], ModelSpec) else self.specs
        return jax.tree.map(lambda a: a[idx], _stack(specs))


@dataclasses.dataclass
class Prepared:
    rows: list[Row]
    models: Any
    systems: Any
    plans: Any
    measured: np.ndarray
    kinds: list[str]
    substituted: list[str]  # "" or "recompute=full" for rows whose assumed value was replaced


def prepare(rows: Sequence[Row], catalog, cal: Calibration, path="runs") -> Prepared:
    """Specs of every row (with assumed values substituted where the row cannot run as written)."""
    models, systems = _Distinct(), _Distinct()
    flat_p, owner, plans_raw = [], [], []
    measured, kinds, devices = [], [], []
    for i, row in enumerate(rows):
        inp = row_inputs(row, catalog, path)
        try:
            model = models.add(tuple(sorted(inp["model"].items())), build.model_spec, inp["model"])
        except ValueError as e:  # the row's model columns contradict each other
            raise ValueError(f"{path}: row {row.id}: {e}") from None
        devices.append(cxl_defaults(inp))
        key = (row.fields["gpu"].strip(), inp["scaleup_domain"], tuple(sorted(devices[-1].items())))
        systems.add(key, row_system, row, inp, catalog, path, devices[-1])
        for cand in candidates(row, inp):
            try:
                flat_p.append(host_plan(**cand))
            except ValueError as e:
                raise ValueError(f"{path}: row {row.id}: {e}") from None
            owner.append(i)
            plans_raw.append(cand)
        st, kind = measured_step_time(row, inp, path, model)
        measured.append(st)
        kinds.append(kind)
    owner = np.array(owner)
    plans = _stack(flat_p)
    flags = np.asarray(_predict(models.stacked(owner), systems.stacked(owner), plans, cal).infeasible)
    pick, substituted = [], []
    for i in range(len(rows)):
        idx = np.flatnonzero(owner == i)
        ok = idx[flags[idx] == 0]
        j = int(ok[0]) if ok.size else int(idx[0])
        pick.append(j)
        changed = [f"{k}={v}" for k, v in plans_raw[j].items() if plans_raw[int(idx[0])][k] != v]
        changed += [f"{k}={v}" for k, v in devices[i].items()]
        substituted.append(",".join(changed))
    every = np.arange(len(rows))
    plans = jax.tree.map(lambda a: a[np.array(pick)], plans)
    return Prepared(
        list(rows), models.stacked(every), systems.stacked(every), plans, np.array(measured), kinds, substituted
    )


def predict(prep: Prepared, cal: Calibration):
    return _predict(prep.models, prep.systems, prep.plans, cal)


def validate(rows: Sequence[Row], catalog, cal: Calibration, path="runs", intervals=None) -> dict[str, Any]:
    """Every row predicted, with its error and 80% interval (``intervals``: an
    :class:`~hetersim.fit.intervals.IntervalModel`, default the stored one)."""
    prep = prepare(rows, catalog, cal, path)
    out = predict(prep, cal)
    measured = prep.measured
    pred = np.asarray(out.step_time_s, dtype=np.float64)
    flags = np.asarray(out.infeasible)
    feasible = flags == 0
    err = np.where(feasible, (pred - measured) / measured * 100.0, 100.0)
    low, high, widened = _interval(rows, catalog, pred, intervals)
    report_rows = []
    for i, row in enumerate(rows):
        report_rows.append(
            dict(
                id=row.id,
                model=row.fields["model"],
                gpu=row.fields["gpu"],
                n_gpus=int(float(row.fields["n_gpus"])),
                layout=_layout(row.fields),
                source=source_label(row.source),
                measured_from=prep.kinds[i],
                measured_step_time_s=float(measured[i]),
                predicted_step_time_s=float(pred[i]),
                predicted_low_s=float(low[i]),
                predicted_high_s=float(high[i]),
                interval_flags=list(widened[i]),
                error_pct=float(err[i]),
                feasible=bool(feasible[i]),
                infeasible_code=int(flags[i]),
                complete=row.complete,
                substituted=prep.substituted[i],
                stack=row.stack.key if row.stack else "",
                stack_profile=planfields.BY_NAME["stack"].options(int(np.asarray(prep.plans.stack_code)[i])).label,
                hbm_used_GiB=float(np.asarray(out.hbm_used_GiB)[i]),
            )
        )
    return summarize(report_rows)


def _interval(rows: Sequence[Row], catalog, pred: np.ndarray, model):
    """The 80% interval of each row's prediction, flagged against what the stored fit had:
    ``(low, high, flags)``, ``flags`` the names of each row's flags."""
    from . import intervals

    model = model if model is not None else intervals.load_intervals()
    flags = intervals.row_flags(rows, catalog, model.evidence)
    low, high = intervals.bounds(model, pred, flags)
    return low, high, [intervals.raised({f: v[i] for f, v in flags.items()}) for i in range(len(rows))]


def _layout(f: Mapping[str, str]) -> str:
    names = ("tp", "pp", "vp", "dp", "cp", "ep", "etp", "zero", "shard_group", "micro_batch", "global_batch")
    names = tuple(k for k in names if k in f)  # ep, etp: mixture-of-experts runs only; shard_group where given
    values = {k: int(float(f[k])) if f[k] else planfields.DEFAULTS[k] for k in names}  # whole: check_rows
    omit = ("vp", "cp", "ep", "etp", "zero", "shard_group")
    return planfields.layout_label(values, names, sep="-", omit_defaults=omit)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    abs_err = np.array([abs(r["error_pct"]) for r in rows])
    complete = np.array([r["complete"] for r in rows])
    per_source: dict[str, dict[str, float]] = {}
    for label in dict.fromkeys(r["source"] for r in rows):
        e = np.array([abs(r["error_pct"]) for r in rows if r["source"] == label])
        per_source[label] = {"n": int(e.size), "mape_pct": float(e.mean()), "max_abs_error_pct": float(e.max())}
    per_stack: dict[str, dict[str, float]] = {}
    for label in dict.fromkeys(r.get("stack_profile", "") for r in rows):
        e = np.array([abs(r["error_pct"]) for r in rows if r.get("stack_profile", "") == label])
        per_stack[label] = {"n": int(e.size), "mape_pct": float(e.mean()), "max_abs_error_pct": float(e.max())}
    inside = [r["feasible"] and r["predicted_low_s"] <= r["measured_step_time_s"] <= r["predicted_high_s"]
              for r in rows if "predicted_low_s" in r]  # fmt: skip
    return {
        "per_stack": per_stack,
        "n_runs": len(rows),
        "mape_step_time_pct": float(abs_err.mean()),
        "coverage_pct": 100.0 * float(np.mean(inside)) if inside else float("nan"),
        "mape_step_time_pct_complete": float(abs_err[complete].mean()) if complete.any() else float("nan"),
        "n_complete": int(complete.sum()),
        "max_abs_error_pct": float(abs_err.max()),
        "n_infeasible": int(sum(not r["feasible"] for r in rows)),
        "per_source": per_source,
        "rows": rows,
    }


# --- memory ------------------------------------------------------------------------------------

MEMORY_COLUMNS = ("source", "model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "micro_batch", "seq_len",
                  "recompute", "sp", "component", "value", "unit", "notes")  # fmt: skip


def default_memory_path() -> Path:
    return Path(str(resources.files("hetersim") / "data" / "published_memory.csv"))


def _component(out, i: int, component: str) -> float | None:
    c = component.lower()
    if c.startswith("params+grads+optimizer"):
        return float(out.weights_GiB[i] + out.grads_GiB[i] + out.optimizer_GiB[i])
    if c == "activations":
        return float(out.activations_GiB[i])
    if c.startswith("peak memory"):
        return float(out.hbm_used_GiB[i])
    return None


# The units a measured-memory row may give: GiB per GPU (scored) or a share of a baseline (a
# relative figure, listed as skipped); the largest GiB per GPU taken as real.
MEMORY_UNITS = ("GiB/GPU", "% of baseline")
MAX_MEMORY_GIB = 1e6
MEMORY_COMPONENTS = ("params+grads+optimizer", "activations", "peak memory")  # what _component prices


def memory_records(path: Path, runs_path=None) -> list[dict[str, str]]:
    """The rows of a published-memory CSV, its header and each row's cells checked, and each row in
    GiB matched to a run of ``runs_path`` (one-line errors naming the file, line and column)."""
    recs = list(csv_records(read_text(path, "memory")))
    if not recs or any(c not in recs[0] for c in MEMORY_COLUMNS):
        raise ValueError(f"{path}: not a published-memory CSV, expected columns: {', '.join(MEMORY_COLUMNS)}")
    for k, rec in enumerate(recs, start=2):
        _check_memory_row(f"{path}: line {k}", rec)
    runs = None
    for k, rec in enumerate(recs, start=2):  # a measurement in GiB is scored against its run or refused, never dropped
        if rec["unit"].strip() == "GiB/GPU":
            runs = runs if runs is not None else read_runs(runs_path or default_runs_path())
            if not any(_same_config(r.fields, rec) for r in runs):
                layout = ", ".join(f"{c} {rec[c].strip()}" for c in ("n_gpus", "tp", "pp", "cp", "seq_len"))
                where = runs_path or default_runs_path()
                raise ValueError(f"{path}: line {k}: no run of {rec['model']!r} with {layout} in {where}")
    return recs


def _check_memory_row(where: str, rec: Mapping[str, str]) -> None:
    """A measured-memory row's unit, and for a row in GiB its value, micro-batch, recompute mode and
    sequence parallelism, as the model will read them."""
    unit, raw = (rec.get("unit") or "").strip(), (rec.get("value") or "").strip()
    if unit not in MEMORY_UNITS:
        raise ValueError(f"{where}: column unit must be one of {', '.join(MEMORY_UNITS)}; got {unit!r}")
    if unit != "GiB/GPU":
        return
    try:
        value = float(raw) if raw.isascii() else float("nan")
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_MEMORY_GIB:  # NaN fails too
        raise ValueError(f"{where}: column value must be a number of GiB > 0 and <= {MAX_MEMORY_GIB:g}; got {raw!r}")
    for col in ("micro_batch", "n_gpus", "tp", "pp", "cp", "seq_len"):  # what a row is matched to its run by
        cell = (rec.get(col) or "").strip()
        if not (decimal_digits(cell) and 0 < int(cell) <= planfields.BY_NAME[col].hi):
            raise ValueError(f"{where}: column {col} must be {planfields.rule(col)}; got {cell!r}")
    component = (rec.get("component") or "").strip().lower()
    if not component.startswith(MEMORY_COMPONENTS):
        allowed = ", ".join(MEMORY_COMPONENTS)
        raise ValueError(f"{where}: column component must start with one of {allowed}; got {rec.get('component')!r}")
    recompute = (rec.get("recompute") or "").strip()
    modes = planfields.BY_NAME["recompute"].names
    if recompute and recompute not in modes:
        raise ValueError(f"{where}: column recompute must be one of {', '.join(modes)} (or empty); got {recompute!r}")
    sp = (rec.get("sp") or "").strip()
    if sp not in ("", "True", "False"):
        raise ValueError(f"{where}: column sp must be True or False (or empty); got {sp!r}")


def validate_memory(path: str | Path | None, catalog, cal: Calibration, runs_path=None) -> dict[str, Any]:
    """Compare per-GPU memory with ``published_memory.csv``.

    Each memory row is matched to the run of ``published_runs.csv`` with the same model, GPU
    count, tp, pp, cp and sequence length; its recompute mode, sequence parallelism and
    micro-batch replace the run's. Rows whose value is not a number or not in GiB per GPU (relative
    figures) are listed as skipped; a row in GiB that matches no run is refused by
    :func:`memory_records`.
    """
    path = Path(path) if path else default_memory_path()
    recs = memory_records(path, runs_path)
    runs = read_runs(runs_path or default_runs_path())
    results, skipped = [], []
    for k, rec in enumerate(recs, start=2):
        try:
            value = float(rec["value"])
        except ValueError:
            skipped.append(f"line {k}: value {rec['value'][:30]!r} is not a number")
            continue
        if rec["unit"].strip() != "GiB/GPU":  # a share of a baseline, never scored as GiB
            skipped.append(f"line {k}: unit {rec['unit'].strip()!r} is a relative figure")
            continue
        match = next(r for r in runs if _same_config(r.fields, rec))  # memory_records matched every row in GiB
        inp = row_inputs(match, catalog, str(path))
        plan = dict(inp["plan"], micro_batch=int(rec["micro_batch"]))
        per_step = plan["micro_batch"] * plan["dp"]
        plan["global_batch"] = max(plan["global_batch"] // per_step, 1) * per_step
        if rec["recompute"].strip():
            plan["recompute"] = rec["recompute"].strip()
        if rec["sp"].strip():
            plan["sp"] = rec["sp"].strip() == "True"
        if "optimizer_sharding=false" in rec["notes"]:
            plan["zero"] = 0
        model = build.model_spec(inp["model"])
        system = row_system(None, inp, catalog, "memory", cxl_defaults(inp))
        out = _predict(_stack([model]), _stack([system]), _stack([build.plan_spec(**plan)]), cal)
        pred = _component(out, 0, rec["component"])
        if pred is None:
            skipped.append(f"line {k}: component {rec['component']!r} is not modelled")
            continue
        results.append(
            dict(
                model=rec["model"],
                layout=planfields.layout_label(rec, ("tp", "pp", "dp", "cp"), sep="-"),
                recompute=plan["recompute"],
                component=rec["component"],
                measured_GiB=value,
                predicted_GiB=pred,
                error_pct=(pred - value) / value * 100.0,
            )  # fmt: skip
        )
    errs = np.array([abs(r["error_pct"]) for r in results]) if results else np.array([np.nan])
    return {"n": len(results), "mape_pct": float(np.mean(errs)), "rows": results, "skipped": skipped}


def _same_config(run: Mapping[str, str], mem: Mapping[str, str]) -> bool:
    def num(x):
        try:
            return float(x)
        except ValueError:
            return None

    same = all(num(run[c]) == num(mem[c]) for c in ("n_gpus", "tp", "pp", "cp", "seq_len"))
    return same and run["model"].strip().lower().startswith(mem["model"].strip().lower())
