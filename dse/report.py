"""``hetersim report``: a self-contained HTML page and its figures from one results dataset.

:func:`write_report` reads a sweep dataset (``dse.sweep`` layout: one ``config`` dimension,
metric variables with ``units``/``long_name``, categorical codes with ``flag_meanings``, the
study in the attributes) and writes into ``out_dir``:

* ``index.html``, which opens offline (figures embedded as base64 PNG, no scripts);
* every figure as ``<name>.png`` and ``<name>.svg``: the Pareto fronts of time to train vs cost
  and vs energy, the step-time breakdown, the memory per GPU and the memory per tier (HBM, host
  DRAM, CXL; used against capacity) of the Pareto configurations,
  heat maps of the best objective over two study axes, and the elasticities when the dataset
  has them.

Results of ``hetersim optimize`` (one record per ``trial``, the same variable names) are read the
same way, and so is the file of a streamed sweep (attribute ``streamed = 1``: only the rows it
kept, the top-k per objective and the Pareto set; the page and its notes say so). The Pareto set
is the feasible configurations that no other feasible configuration of the same model beats in
every study objective (the study's ``objectives`` attribute). A section
whose data the dataset lacks says so instead of failing; a file that is not a results dataset,
or one that lacks a variable the report cannot do without, is a one-line ``ValueError``.
"""

from __future__ import annotations

import base64
import html
import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from dse.metrics import METRICS, STEP_TERM_LABELS
from dse.pareto import pareto_front

REQUIRED = ("feasible", "time_to_train_s", "cost_usd", "energy_kWh")
FRONTS = (("time_to_train_s", "cost_usd"), ("time_to_train_s", "energy_kWh"))
COLUMNS = (
    "model",
    "gpu",
    "n_gpus",
    "tp",
    "pp",
    "vp",
    "cp",
    "dp",
    "micro_batch",
    "global_batch",
    "zero",
    "recompute",
    "sp",
    "precision",
    "seq_len",
    "attention",
    "order",
)
SHORT = {"micro_batch": "mb", "global_batch": "gb", "zero": "z", "seq_len": "seq", "recompute": "rc", "order": "ord"}
# Slower memory tiers (hetersim.types.TIER after HBM): variable prefix and label.
TIERS = (("host_dram", "host DRAM"), ("cxl_expander", "CXL expanders"), ("cxl_pool", "CXL pool"))
MEMORY_PARTS = ("weights_GiB", "grads_GiB", "optimizer_GiB", "activations_GiB", "buffers_GiB")
# Axis pairs for heat maps, most telling first; the first two whose axes both vary are drawn.
HEATMAP_PAIRS = (
    ("tp", "pp"),
    ("n_gpus", "gpu"),
    ("gpu", "model"),
    ("micro_batch", "recompute"),
    ("zero", "recompute"),
    ("pp", "vp"),
    ("tp", "cp"),
    ("gpu", "precision"),
)
MAX_HEATMAPS = 2
MAX_BARS = 30  # configurations in the breakdown and memory figures
MAX_TABLE = 300  # rows of the Pareto table
SENSITIVITY_GROUPS = ("sensitivity", "sensitivities", "elasticity", "elasticities")
# Display units: (values at least this large, divide by, new units).
DISPLAY = {
    "s": ((2 * 86400.0, 86400.0, "days"), (2 * 3600.0, 3600.0, "h")),
    "USD": ((2e6, 1e6, "million USD"), (2e3, 1e3, "thousand USD")),
    "kWh": ((2e6, 1e6, "GWh"), (2e3, 1e3, "MWh")),
}


# --------------------------------------------------------------------------------------------
# Reading the dataset
# --------------------------------------------------------------------------------------------


def open_results(path: str | Path):
    """Open a results dataset, checking it is one; one-line ``ValueError`` otherwise."""
    import xarray as xr

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such results file")
    try:
        ds = xr.open_dataset(path)
    except Exception as error:  # netCDF4/h5netcdf/scipy raise different types for a non-netCDF file
        reason = " ".join(str(error).split())[:200]
        raise ValueError(f"{path}: not a netCDF results dataset ({type(error).__name__}: {reason})") from None
    if "config" not in ds.dims and "trial" in ds.dims:
        ds = ds.rename({"trial": "config"})  # `hetersim optimize` results: one record per trial
    if "config" not in ds.dims:
        ds.close()
        raise ValueError(f"{path}: not a HeterSim results dataset (no 'config' or 'trial' dimension)")
    missing = [v for v in (*REQUIRED, *_objectives(ds)[0]) if v not in ds.variables]
    if missing:
        ds.close()
        raise ValueError(f"{path}: results dataset lacks variable(s) {', '.join(dict.fromkeys(missing))}")
    return ds


def _objectives(ds) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = tuple(str(ds.attrs.get("objectives", "time_to_train_s cost_usd")).split())
    senses = tuple(str(ds.attrs.get("objective_senses", "")).split())
    if len(senses) != len(names):
        senses = tuple(METRICS[n].sense if n in METRICS else "min" for n in names)
    return names, senses


def flag_labels(ds, name: str) -> list[str] | None:
    """Names of a categorical variable's codes (CF ``flag_meanings``), or None."""
    meanings = ds[name].attrs.get("flag_meanings") if name in ds.variables else None
    return str(meanings).split() if meanings is not None else None


def decode(ds, name: str, value: Any) -> Any:
    labels = flag_labels(ds, name)
    if labels is not None and name != "infeasible":
        return labels[int(value)] if 0 <= int(value) < len(labels) else int(value)
    v = np.asarray(value).item()
    return int(v) if isinstance(v, (int, np.integer)) else v


def display(units: str, values: np.ndarray) -> tuple[float, str]:
    """(divisor, units) that make typical ``values`` readable: seconds as days, USD as millions."""
    v = np.abs(np.asarray(values, dtype=float))
    v = v[np.isfinite(v) & (v > 0)]
    typical = float(np.median(v)) if v.size else 0.0
    for at_least, factor, name in DISPLAY.get(units, ()):
        if typical >= at_least:
            return factor, name
    return 1.0, units


def label_of(ds, name: str, factor_units: tuple[float, str] | None = None) -> str:
    """Axis label from a variable's ``long_name`` and ``units`` (converted units when given)."""
    attrs = ds[name].attrs
    long_name = attrs.get("long_name", name)
    units = factor_units[1] if factor_units is not None else attrs.get("units", "")
    return f"{long_name} [{units}]" if units and units != "1" else str(long_name)


@dataclass
class Results:
    """What every section needs, read once: the open dataset, feasibility, groups, varying axes."""

    path: Path
    ds: Any
    feasible: np.ndarray
    objectives: tuple[str, ...]
    senses: tuple[str, ...]
    group: np.ndarray  # model code per configuration (0 when the dataset has one model)
    group_names: list[str]
    varying: list[str]  # columns with more than one value among feasible configurations
    notes: list[str] = field(default_factory=list)

    def values(self, name: str, idx: np.ndarray | None = None) -> np.ndarray:
        var = self.ds[name]
        return np.asarray(var.values if idx is None else var.isel(config=idx).values)

    def layout(self, i: int, with_model: bool = False) -> str:
        """A short label of configuration ``i``: the study axes that vary, tp/pp/dp always."""
        parts = []
        cols = [c for c in COLUMNS if c in self.ds.variables and (c in self.varying or c in ("tp", "pp", "dp"))]
        row = {c: decode(self.ds, c, self.ds[c].values[i]) for c in cols}
        if "n_gpus" in row or "gpu" in row:
            n = row.pop("n_gpus", None)
            g = row.pop("gpu", None)
            parts.append("×".join(str(x) for x in (n, g) if x is not None))
        model = row.pop("model", None)
        if with_model and model is not None:
            parts.insert(0, str(model))
        for c, v in row.items():
            if c in ("recompute", "order"):
                parts.append(f"{SHORT[c]}:{v}")
            elif c in ("precision", "attention"):
                parts.append(str(v))
            elif c == "sp":
                parts.append(f"sp:{v}")
            else:
                parts.append(f"{SHORT.get(c, c)}{v}")
        return " ".join(parts)


def load(path: str | Path) -> Results:
    ds = open_results(path)
    feasible = np.asarray(ds["feasible"].values).astype(bool)
    objectives, senses = _objectives(ds)
    if "model" in ds.variables and len(np.unique(ds["model"].values)) > 1:
        group = np.asarray(ds["model"].values).astype(np.int64)
        names = flag_labels(ds, "model") or [str(k) for k in range(group.max() + 1)]
    else:
        group = np.zeros(ds.sizes["config"], dtype=np.int64)
        names = [str(decode(ds, "model", ds["model"].values[0]))] if "model" in ds.variables else [""]
    varying = [
        c for c in COLUMNS if c in ds.variables and feasible.any() and len(np.unique(ds[c].values[feasible])) > 1
    ]
    r = Results(Path(path), ds, feasible, objectives, senses, group, names, varying)
    if streamed(ds):
        r.notes.append(
            f"streamed sweep: the file keeps {ds.sizes['config']:,} of the {int(ds.attrs['n_configs']):,} "
            f"configurations evaluated (the top {ds.attrs.get('top_k', '?')} per objective and the Pareto set of "
            "each model); the Pareto set is complete, but the heat maps and axes that vary cover the kept rows "
            "only (per-axis summaries over every configuration: the marginal_* variables)"
        )
    return r


def streamed(ds) -> bool:
    """Whether a dataset is the output of a streamed sweep (only the kept rows along ``config``)."""
    return bool(int(ds.attrs.get("streamed", 0)))


def pareto_set(r: Results) -> np.ndarray:
    """Indices of the Pareto set: per model, the feasible configurations no other beats in every
    study objective; ordered by model, then along the front (best first objective first)."""
    out = []
    values = np.stack([r.values(o).astype(np.float64) for o in r.objectives], axis=1)
    for g in np.unique(r.group[r.feasible]):
        idx = np.flatnonzero(r.feasible & (r.group == g))
        out.append(idx[pareto_front(values[idx], r.senses)])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def shown(idx: np.ndarray, limit: int) -> np.ndarray:
    """At most ``limit`` of ``idx``, spread evenly (both ends kept)."""
    if len(idx) <= limit:
        return idx
    return idx[np.unique(np.round(np.linspace(0, len(idx) - 1, limit)).astype(int))]


# --------------------------------------------------------------------------------------------
# Sections: each returns its HTML, saves its figures through Figures and notes what it skipped
# --------------------------------------------------------------------------------------------


@dataclass
class Figures:
    out_dir: Path
    paths: dict[str, dict[str, Path]] = field(default_factory=dict)

    def add(self, fig, name: str, caption: str) -> str:
        from dse import report_figures as rf

        self.paths[name] = rf.save(fig, self.out_dir, name)
        data = base64.b64encode(self.paths[name]["png"].read_bytes()).decode("ascii")
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{_e(caption)}">'
            f'<figcaption>{_e(caption)} (<a href="{name}.svg">SVG</a>, <a href="{name}.png">PNG</a>)'
            "</figcaption></figure>"
        )


def _letter(k: int) -> str:
    """a, b, ..., z, aa, ab, ...: tags of front points that are not in the Pareto table."""
    out = ""
    k += 1
    while k:
        k, rem = divmod(k - 1, 26)
        out = chr(ord("a") + rem) + out
    return out


def section_fronts(r: Results, pareto: np.ndarray, figs: Figures) -> str:
    """Tags: ``#n`` is row n of the Pareto table; letters mark points on this front only."""
    from dse import report_figures as rf

    number = {int(i): k + 1 for k, i in enumerate(pareto)}

    parts = ["<h2>Pareto fronts</h2>"]
    if not r.feasible.any():
        return parts[0] + "<p>No feasible configuration: there is no front to draw.</p>"
    color_var = "gpu" if "gpu" in r.varying else None
    color = r.values(color_var).astype(np.int64) if color_var else np.zeros(len(r.feasible), dtype=np.int64)
    color_names = (flag_labels(r.ds, color_var) if color_var else None) or ["feasible"]
    for xname, yname in FRONTS:
        extra: list[int] = []
        x_all, y_all = r.values(xname).astype(np.float64), r.values(yname).astype(np.float64)
        fx = display(r.ds[xname].attrs.get("units", ""), x_all[r.feasible])
        fy = display(r.ds[yname].attrs.get("units", ""), y_all[r.feasible])
        panels, counts = [], []
        for g in np.unique(r.group[r.feasible]):
            idx = np.flatnonzero(r.feasible & (r.group == g))
            x, y = x_all[idx] / fx[0], y_all[idx] / fy[0]
            front = pareto_front(np.stack([x, y], axis=1))
            tagged = rf.pick_labels(len(front))
            tags, keys = ["" for _ in front], ["" for _ in front]
            for k in tagged:
                i = int(idx[front[k]])
                tags[k] = f"#{number[i]}" if i in number else _letter(len(extra))
                keys[k] = r.layout(i)
                if i not in number:
                    extra.append(i)
            title = r.group_names[g] if len(r.group_names) > 1 else ""
            panels.append(rf.FrontPanel(title, x, y, color[idx], front, tags, keys))
            counts.append(f"{title + ': ' if title else ''}{len(front)} on the front of {len(idx):,} feasible")
            if len(front) > len(tagged):
                counts[-1] += f" ({len(tagged)} tagged)"
        fig = rf.front_figure(panels, label_of(r.ds, xname, fx), label_of(r.ds, yname, fy), color_names)
        what = f"{r.ds[xname].attrs.get('long_name', xname)} vs {r.ds[yname].attrs.get('long_name', yname)}"
        caption = f"Pareto front, {what}; " + "; ".join(counts)
        caption += ". #n: row n of the Pareto table; letters: on this front but not in the Pareto set."
        parts.append(figs.add(fig, f"front_{yname.split('_')[0]}", caption))
    infeasible = int((~r.feasible).sum())
    if infeasible:
        parts.append(f"<p>{infeasible:,} configurations that cannot run or break a study constraint are not drawn.</p>")
    return "\n".join(parts)


def _bar_rows(r: Results, idx: np.ndarray) -> list[str]:
    with_model = len(r.group_names) > 1
    return [f"#{k + 1} {r.layout(int(i), with_model)}" for k, i in enumerate(idx)]


def section_breakdown(r: Results, pareto: np.ndarray, figs: Figures) -> str:
    from dse import report_figures as rf

    head = "<h2>Step-time breakdown of the Pareto configurations</h2>"
    terms = [t for t in STEP_TERM_LABELS if t in r.ds.variables]
    absent = [t for t in STEP_TERM_LABELS if t not in r.ds.variables]
    if not len(pareto):
        return head + "<p>No Pareto configuration.</p>"
    if not terms:
        r.notes.append("step-time breakdown: the dataset has none of the step-time term variables")
        return head + "<p>Not available: the dataset has no step-time term variables.</p>"
    idx = shown(pareto, MAX_BARS)
    parts = [(r.ds[t].attrs.get("long_name", t).removesuffix(" per step"), r.values(t, idx)) for t in terms]
    xlabel = "time per training step [s]"
    fig = rf.stacked_bars(_bar_rows(r, idx), parts, xlabel, "Where a training step's time goes", shares=True)
    caption = "Step time of the Pareto configurations, stacked by term (exposed communication only)"
    caption += _subset_note(idx, pareto)
    out = head + figs.add(fig, "breakdown", caption)
    if absent:
        note = f"step-time terms not in the dataset: {', '.join(absent)}"
        r.notes.append(note)
        out += f"<p>{_e(note)}.</p>"
    return out


def section_memory(r: Results, pareto: np.ndarray, figs: Figures) -> str:
    from dse import report_figures as rf

    head = "<h2>Memory per GPU of the Pareto configurations</h2>"
    if not len(pareto):
        return head + "<p>No Pareto configuration.</p>"
    present = [m for m in MEMORY_PARTS if m in r.ds.variables]
    if not present:
        r.notes.append("memory: the dataset has no memory variables")
        return head + "<p>Not available: the dataset has no memory variables.</p>"
    idx = shown(pareto, MAX_BARS)
    notes = []
    parts = [(r.ds[m].attrs.get("long_name", m).removesuffix(" per GPU"), r.values(m, idx)) for m in present]
    missing = [m for m in MEMORY_PARTS if m not in r.ds.variables]
    if missing and "hbm_used_GiB" in r.ds.variables:
        rest = r.values("hbm_used_GiB", idx) - sum(v for _, v in parts)
        parts.append(("other (" + ", ".join(m.removesuffix("_GiB") for m in missing) + ")", np.maximum(rest, 0.0)))
        notes.append(
            f"{', '.join(missing)} not in the dataset: shown as HBM used minus the other parts "
            "(the model's HBM total is exactly their sum)"
        )
    elif missing:
        notes.append(f"{', '.join(missing)} not in the dataset: not shown")
    markers = []
    capacity = _hbm_capacity(r, idx)
    if capacity is not None:
        markers.append(("HBM capacity", capacity))
        limit = _constraints(r.ds).get("max_hbm_frac")
        if isinstance(limit, int | float):
            markers.append((f"constraint max_hbm_frac = {limit:g}", capacity * float(limit)))
    else:
        notes.append("HBM capacity unknown (no hbm_capacity_GiB variable and no catalog entries in the attributes)")
    fig = rf.stacked_bars(_bar_rows(r, idx), parts, "memory per GPU [GiB]", "What each GPU holds in HBM", markers)
    caption = "HBM per GPU of the Pareto configurations, by what it holds, against the HBM capacity"
    out = head + figs.add(fig, "memory", caption + _subset_note(idx, pareto))
    for note in notes:
        r.notes.append("memory: " + note)
        out += f"<p>{_e(note)}.</p>"
    return out


def section_memory_tiers(r: Results, pareto: np.ndarray, figs: Figures) -> str:
    """Used vs capacity per memory tier: HBM per GPU, then each slower tier per node."""
    from dse import report_figures as rf

    head = "<h2>Memory per tier of the Pareto configurations</h2>"
    if not len(pareto):
        return head + "<p>No Pareto configuration.</p>"
    names = [f"{t}_{w}_GiB" for t, _ in TIERS for w in ("used", "capacity")]
    missing = [n for n in names if n not in r.ds.variables]
    if "hbm_used_GiB" not in r.ds.variables:
        missing.append("hbm_used_GiB")
    if missing:
        note = f"the dataset has no per-tier memory variables ({', '.join(missing)}; older sweeps lack them)"
        r.notes.append("memory per tier: not available, " + note)
        return head + f"<p>Not available: {_e(note)}.</p>"
    idx = shown(pareto, MAX_BARS)
    panels: list[tuple[str, np.ndarray, np.ndarray | None]] = [
        ("HBM per GPU [GiB]", r.values("hbm_used_GiB", idx), _hbm_capacity(r, idx))
    ]
    absent = []
    for key, label in TIERS:
        if not np.any(r.values(f"{key}_capacity_GiB") > 0):
            absent.append(label)
            continue
        panels.append(
            (f"{label} per node [GiB]", r.values(f"{key}_used_GiB", idx), r.values(f"{key}_capacity_GiB", idx))
        )
    fig = rf.tier_bars(_bar_rows(r, idx), panels, "Memory used against capacity, per tier")
    caption = "Memory of the Pareto configurations per tier, used (colour) against capacity (grey): HBM per GPU, "
    caption += "the slower tiers per node (a CXL pool: this node's share)"
    out = head + figs.add(fig, "memory_tiers", caption + _subset_note(idx, pareto))
    if absent:
        note = f"no configuration has {', '.join(absent)} (zero capacity everywhere): not drawn"
        r.notes.append("memory per tier: " + note)
        out += f"<p>{_e(note[0].upper() + note[1:])}.</p>"
    return out


def _constraints(ds) -> dict[str, Any]:
    """The study's constraints from the attributes (a JSON object in sweep results), or {}."""
    try:
        value = json.loads(str(ds.attrs.get("constraints", "{}")) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _hbm_capacity(r: Results, idx: np.ndarray) -> np.ndarray | None:
    if "hbm_capacity_GiB" in r.ds.variables:
        return r.values("hbm_capacity_GiB", idx).astype(float)
    try:
        gpus = json.loads(r.ds.attrs["catalog_entries"])["gpus"]
        names = flag_labels(r.ds, "gpu") or []
        return np.array([float(gpus[names[int(c)]]["hbm_capacity_GiB"]) for c in r.values("gpu", idx)])
    except (KeyError, ValueError, IndexError, TypeError):
        return None


def _subset_note(idx: np.ndarray, pareto: np.ndarray) -> str:
    if len(idx) < len(pareto):
        return f"; {len(idx)} of the {len(pareto)} Pareto configurations, spread along the front; #n as in the table."
    return "; #n as in the table."


def section_heatmaps(r: Results, figs: Figures) -> str:
    from dse import report_figures as rf

    head = "<h2>Best objective over two study axes</h2>"
    pairs = [p for p in HEATMAP_PAIRS if p[0] in r.varying and p[1] in r.varying]
    if len(pairs) < MAX_HEATMAPS:
        extra = [c for c in r.varying if c not in ("dp", "global_batch")]
        pairs += [(a, b) for i, a in enumerate(extra) for b in extra[i + 1 :] if (a, b) not in pairs]
    pairs = pairs[:MAX_HEATMAPS]
    if not pairs:
        return head + "<p>Not available: fewer than two study axes vary among the feasible configurations.</p>"
    out = [head]
    for a, b in pairs:
        for name, sense in zip(r.objectives[:2], r.senses[:2], strict=False):
            v = r.values(name).astype(np.float64)
            scale = display(r.ds[name].attrs.get("units", ""), v[r.feasible])
            per_group = "model" not in (a, b) and len(r.group_names) > 1
            groups = np.unique(r.group[r.feasible]) if per_group else [None]
            panels = []
            for g in groups:
                sel = r.feasible if g is None else r.feasible & (r.group == g)
                grid, rows, cols = _best_grid(r, a, b, v / scale[0], sel, sense)
                panels.append(rf.HeatPanel(r.group_names[g] if g is not None else "", grid, rows, cols))
            fig = rf.heatmap_figure(
                panels,
                r.ds[b].attrs.get("long_name", b),
                r.ds[a].attrs.get("long_name", a),
                label_of(r.ds, name, scale),
                sense,
            )
            best = "lowest" if sense == "min" else "highest"
            caption = f"{best} {r.ds[name].attrs.get('long_name', name)} among feasible configurations, per {a} × {b}"
            out.append(figs.add(fig, f"heatmap_{a}_{b}_{name}", caption + "; – : no feasible configuration."))
    return "\n".join(out)


def _best_grid(r: Results, a: str, b: str, v: np.ndarray, sel: np.ndarray, sense: str):
    """Best ``v`` over ``sel`` per (a, b) cell: (grid, row labels, column labels)."""
    av, bv = r.values(a), r.values(b)
    ua, ia = np.unique(av, return_inverse=True)
    ub, ib = np.unique(bv, return_inverse=True)
    cell = ia.reshape(-1) * len(ub) + ib.reshape(-1)
    grid = np.full(len(ua) * len(ub), np.inf)
    signed = v if sense == "min" else -v
    np.minimum.at(grid, cell[sel], signed[sel])
    grid = np.where(np.isinf(grid), np.nan, grid if sense == "min" else -grid).reshape(len(ua), len(ub))
    return grid, [str(decode(r.ds, a, x)) for x in ua], [str(decode(r.ds, b, x)) for x in ub]


def sensitivity_items(r: Results, pareto: np.ndarray) -> list[tuple[str, float]]:
    """Elasticities as (label, value): ``elasticity_*`` variables of the dataset or of a
    sensitivity group, reduced over the Pareto configurations (median) when they run along
    ``config``."""
    import xarray as xr

    sources = [r.ds]
    try:
        import netCDF4

        with netCDF4.Dataset(r.path) as nc:
            groups = [g for g in nc.groups if g.lower() in SENSITIVITY_GROUPS]
        for g in groups:
            with xr.open_dataset(r.path, group=g) as gds:
                sources.append(gds.load())
    except (ImportError, OSError):
        pass
    items: list[tuple[str, float]] = []
    for k, src in enumerate(sources):
        names = [v for v in src.data_vars if str(v).startswith("elasticity_") or (k > 0 and src[v].dtype.kind == "f")]
        for name in names:
            da = src[name]
            if "config" in da.dims:
                if da.sizes["config"] == len(r.feasible) and len(pareto):
                    da = da.isel(config=pareto)
                da = da.median("config")
            for pos in np.ndindex(da.shape):
                label = str(name).removeprefix("elasticity_")
                if pos:
                    coords = [f"{d}={_coord(da, d, i)}" for d, i in zip(da.dims, pos, strict=True)]
                    label += " [" + ", ".join(coords) + "]"
                value = float(da.values[pos])
                if np.isfinite(value):
                    items.append((label, value))
    return items


def _coord(da, dim: str, i: int) -> str:
    return str(da[dim].values[i]) if dim in da.coords else str(i)


def section_sensitivity(r: Results, pareto: np.ndarray, figs: Figures) -> str:
    from dse import report_figures as rf

    head = "<h2>Sensitivities</h2>"
    items = sensitivity_items(r, pareto)
    if not items:
        r.notes.append("sensitivities: not available in this dataset")
        return head + (
            "<p>Sensitivities: not available. The dataset has no <code>elasticity_*</code> variables "
            "and no sensitivity group.</p>"
        )
    items = sorted(items, key=lambda kv: -abs(kv[1]))[:40]
    fig = rf.signed_bars(
        [k for k, _ in items],
        np.array([v for _, v in items]),
        "elasticity (d ln metric / d ln input)",
        "Elasticities (median over the Pareto configurations where given per configuration)",
    )
    caption = "Elasticities: the % change of a metric per 1 % change of an input, largest first"
    return head + figs.add(fig, "sensitivity", caption)


# --------------------------------------------------------------------------------------------
# Tables and text
# --------------------------------------------------------------------------------------------


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float | np.floating):
        v = float(v)
        if not np.isfinite(v):
            return "–"
        return f"{v:.4g}"
    return str(v)


def metric_names(r: Results) -> list[str]:
    skip = {*COLUMNS, "feasible"}
    return [str(n) for n, v in r.ds.data_vars.items() if n not in skip and v.dims == ("config",)]


def pareto_records(r: Results, pareto: np.ndarray) -> list[dict[str, Any]]:
    """The Pareto set as plain rows: index, every parameter (decoded) and every metric."""
    params = [c for c in COLUMNS if c in r.ds.variables]
    metrics = metric_names(r)
    data = {n: r.values(n, pareto) for n in (*params, *metrics)} if len(pareto) else {}
    rows = []
    for k, i in enumerate(pareto):
        row: dict[str, Any] = {"#": k + 1, "config": int(i)}
        if streamed(r.ds):
            row["index"] = int(r.ds["config"].values[i])  # flat index in the study's space
        row.update({c: decode(r.ds, c, data[c][k]) for c in params})
        row.update({m: np.asarray(data[m][k]).item() for m in metrics})
        rows.append(row)
    return rows


def pareto_table(r: Results, records: list[dict[str, Any]]) -> str:
    if not records:
        return "<p>No feasible configuration, so no Pareto set.</p>"
    keys = list(records[0])
    head = []
    for key in keys:
        title = r.ds[key].attrs.get("long_name", key) if key in r.ds.variables else key
        units = r.ds[key].attrs.get("units", "") if key in r.ds.variables else ""
        unit = f"<br><span class=u>[{_e(units)}]</span>" if units and units != "1" else ""
        head.append(f'<th title="{_e(title)}">{_e(key)}{unit}</th>')
    if "time_to_train_s" in keys:
        head.insert(keys.index("time_to_train_s") + 1, "<th>time to train<br><span class=u>[days]</span></th>")
    body = []
    for row in records[:MAX_TABLE]:
        cells = [f"<td>{_e(_fmt(row[k]))}</td>" for k in keys]
        if "time_to_train_s" in keys:
            cells.insert(keys.index("time_to_train_s") + 1, f"<td>{row['time_to_train_s'] / 86400:.1f}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p>First {MAX_TABLE} of {len(records)} rows.</p>" if len(records) > MAX_TABLE else ""
    return f"<div class=scroll><table><tr>{''.join(head)}</tr>{''.join(body)}</table></div>{more}"


def validation_summary() -> dict[str, Any]:
    """The model's step-time error against the published runs (``hetersim validate``)."""
    from hetersim.catalog import load_catalog
    from hetersim.fit import as_spec, default_runs_path, load_calibration, read_runs, validate

    report = validate(read_runs(default_runs_path()), load_catalog(), as_spec(load_calibration()))
    return {k: v for k, v in report.items() if k != "rows"}


def section_validation(v: Mapping[str, Any] | None, error: str | None) -> str:
    head = "<h2>How far to trust it: validation against published runs</h2>"
    if error is not None:
        return head + f"<p>Validation could not run: {_e(error)}</p>"
    if v is None:
        return head + "<p>Validation skipped.</p>"
    text = (
        f"<p>The cost model as installed now predicts the step time of {v['n_runs']} published training runs with a "
        f"mean absolute percentage error (MAPE) of <b>{v['mape_step_time_pct']:.1f} %</b>; over the "
        f"{v['n_complete']} runs whose sources state every setting it is <b>{v['mape_step_time_pct_complete']:.1f} %"
        f"</b>. The largest error is {v['max_abs_error_pct']:.0f} % ({v['n_infeasible']} runs the model deems "
        "infeasible count as 100 %). Read time, cost and energy to within about that error; rankings between "
        "close configurations are less certain than the gaps in the figures suggest.</p>"
    )
    rows = "".join(
        f"<tr><td>{_e(label)}</td><td>{s['n']}</td><td>{s['mape_pct']:.1f}</td><td>{s['max_abs_error_pct']:.1f}</td></tr>"
        for label, s in v["per_source"].items()
    )
    table = f"<table><tr><th>source</th><th>runs</th><th>MAPE %</th><th>max |error| %</th></tr>{rows}</table>"
    return head + text + table


def _versions(ds) -> dict[str, dict[str, str]]:
    dataset = {k.removesuffix("_version"): str(v) for k, v in ds.attrs.items() if k.endswith("_version")}
    now = {"python": platform.python_version()}
    for pkg in ("hetersim", "jax", "numpy", "xarray", "netCDF4", "matplotlib"):
        try:
            now[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            now[pkg] = "not installed"
    return {"dataset": dataset, "report": now}


def _infeasible_counts(r: Results) -> dict[str, int]:
    if "infeasible" not in r.ds.variables:
        return {}
    attrs = r.ds["infeasible"].attrs
    flags = r.values("infeasible").astype(np.int64)
    masks = np.asarray(attrs.get("flag_masks", []), dtype=np.int64).reshape(-1)
    names = str(attrs.get("flag_meanings", "")).split()
    counts = {n: int(np.count_nonzero(flags & m)) for m, n in zip(masks, names, strict=False)}
    if "constraint_violation" in r.ds.variables:
        counts["study constraints"] = int(np.count_nonzero(r.values("constraint_violation")))
    return {k: v for k, v in counts.items() if v}


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1150px;
padding:0 1em;color:#1d1d1f;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}table{border-collapse:collapse;font-size:12px;margin:.5em 0}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}th{background:#f5f5f7}
td:first-child,th:first-child{text-align:left}.scroll{overflow-x:auto;max-width:100%}.u{font-weight:normal;color:#777}
pre{background:#f5f5f7;padding:.8em;overflow-x:auto;font-size:12px}.note{color:#8a4b00}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 1em}dt{font-weight:600}dd{margin:0}
"""


def _overview(r: Results, pareto: np.ndarray) -> str:
    attrs = r.ds.attrs
    fixed = json.loads(attrs.get("fixed_plan", "{}") or "{}")
    reasons = _infeasible_counts(r)
    items = {
        "dataset": str(r.path),
        "configurations": f"{r.ds.sizes['config']:,} ({int(r.feasible.sum()):,} feasible)",
        "not feasible because": ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in reasons.items()) or "–",
        "objectives": ", ".join(f"{s} {o}" for o, s in zip(r.objectives, r.senses, strict=True)),
        "constraints": attrs.get("constraints", "{}"),
        "token budget": f"{fixed['train_tokens']:.4g} tokens" if "train_tokens" in fixed else "–",
        "axes that vary": ", ".join(r.varying) or "–",
        "Pareto set": f"{len(pareto)} configurations (per model, over the objectives)",
    }
    if streamed(r.ds):
        items["configurations"] = (
            f"{int(attrs['n_configs']):,} evaluated ({int(attrs['n_feasible']):,} feasible) by a streamed sweep; "
            f"the file keeps {r.ds.sizes['config']:,} (the top {attrs.get('top_k', '?')} per objective and the "
            "Pareto set)"
        )
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items.items())
    return f"<dl>{rows}</dl>"


def _best_lines(r: Results, records: list[dict[str, Any]]) -> str:
    """One sentence per model and objective: the best Pareto configuration."""
    lines = []
    for name, sense in zip(r.objectives, r.senses, strict=True):
        for gname in r.group_names:
            rows = [row for row in records if len(r.group_names) == 1 or row.get("model") == gname]
            if not rows:
                continue
            best = (min if sense == "min" else max)(rows, key=lambda row: row[name])
            factor, units = display(r.ds[name].attrs.get("units", ""), np.array([best[name]]))
            who = f"{gname}: " if len(r.group_names) > 1 else ""
            lines.append(
                f"<li>{_e(who)}{'lowest' if sense == 'min' else 'highest'} {_e(name)}: "
                f"<b>{best[name] / factor:.4g} {_e(units)}</b> with {_e(r.layout(best['config']))} (#{best['#']})</li>"
            )
    return f"<ul>{''.join(lines)}</ul>" if lines else ""


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


@dataclass
class Report:
    index: Path
    out_dir: Path
    figures: dict[str, dict[str, Path]]
    summary: dict[str, Any]


def default_out_dir(nc_path: str | Path) -> Path:
    """``results/X.nc`` -> ``results/X/``."""
    p = Path(nc_path)
    return p.with_suffix("") if p.suffix == ".nc" else p.with_name(p.name + "_report")


def build_report(nc_path: str | Path, out_dir: str | Path | None = None, *, validation: bool = True) -> Report:
    """Write the report of ``nc_path`` into ``out_dir`` (default: beside it, named after it) and
    return what was written with a JSON-able summary. ``validation`` False skips the model's
    validation run (a few seconds of JAX) and says so in the page."""
    r = load(nc_path)
    try:
        out = Path(out_dir) if out_dir is not None else default_out_dir(nc_path)
        if out.exists() and not out.is_dir():
            raise ValueError(f"{out}: exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        figs = Figures(out)
        pareto = pareto_set(r)
        records = pareto_records(r, pareto)
        v, v_error = None, None
        if validation:
            try:
                v = validation_summary()
            except (ValueError, OSError) as error:
                v_error = str(error)
        body = [
            section_validation(v, v_error),
            section_fronts(r, pareto, figs),
            "<h2>The Pareto set</h2>",
            f"<p>Every parameter and metric of the {len(records)} Pareto configurations "
            "(hover a column name for its long name).</p>",
            _best_lines(r, records),
            pareto_table(r, records),
            section_breakdown(r, pareto, figs),
            section_memory(r, pareto, figs),
            section_memory_tiers(r, pareto, figs),
            section_heatmaps(r, figs),
            section_sensitivity(r, pareto, figs),
        ]
        page = _page(r, pareto, body, v)
        index = out / "index.html"
        tmp = out / ".index.html.tmp"
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(index)
        summary = {
            "study": r.ds.attrs.get("study_name", r.path.stem),
            "dataset": str(r.path),
            "index": str(index),
            "figures": {k: {f: str(p) for f, p in v.items()} for k, v in figs.paths.items()},
            "n_configs": int(r.ds.sizes["config"]),
            "n_feasible": int(r.feasible.sum()),
            "streamed": streamed(r.ds),
            "objectives": list(r.objectives),
            "pareto": records,
            "validation": v,
            "validation_error": v_error,
            "notes": r.notes,
        }
        return Report(index, out, figs.paths, summary)
    finally:
        r.ds.close()


def write_report(nc_path: str | Path, out_dir: str | Path | None = None, *, validation: bool = True) -> Path:
    """Write ``index.html`` and the figures (PNG and SVG) of a results dataset; return the page's path."""
    return build_report(nc_path, out_dir, validation=validation).index


def _page(r: Results, pareto: np.ndarray, body: Sequence[str], v: Mapping[str, Any] | None) -> str:
    attrs = r.ds.attrs
    name = attrs.get("study_name", r.path.stem)
    versions = _versions(r.ds)
    version_rows = "".join(
        f"<tr><td>{_e(pkg)}</td><td>{_e(versions['dataset'].get(pkg, '–'))}</td>"
        f"<td>{_e(versions['report'].get(pkg, '–'))}</td></tr>"
        for pkg in dict.fromkeys([*versions["dataset"], *versions["report"]])
    )
    notes = "".join(f"<li>{_e(n)}</li>" for n in r.notes) or "<li>none</li>"
    calibration = attrs.get("calibration", "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>HeterSim report: {_e(name)}</title>
<style>{CSS}</style></head>
<body>
<h1>HeterSim report: {_e(name)}</h1>
<p>{_e(attrs.get("study_description", ""))}</p>
{_overview(r, pareto)}
{"".join(body)}
<h2>Study file</h2>
<pre>{_e(attrs.get("study_toml", "(not in the dataset)"))}</pre>
<h2>Versions and calibration</h2>
<table><tr><th>package</th><th>dataset written with</th><th>report written with</th></tr>{version_rows}</table>
<p>Calibration used by the sweep: <code>{_e(calibration or "(not in the dataset)")}</code></p>
<p>Dataset fingerprint: <code>{_e(attrs.get("fingerprint", "–"))}</code>; page written by
<code>hetersim report</code>.</p>
<h2>Notes</h2><ul class=note>{notes}</ul>
</body></html>
"""
