"""The report's sections with figures: each returns its HTML, saves its figures through
:class:`Figures` and notes in :attr:`Results.notes` what it skipped."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse.metrics import STEP_TERM_LABELS, display, display_units
from dse.pareto import pareto_front
from dse.report.page import esc
from dse.report.results import Results, decode, flag_labels, label_of, shown

FRONTS = (("time_to_train_s", "cost_usd"), ("time_to_train_s", "energy_kWh"))
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
SENSITIVITY_GROUPS = ("sensitivity", "sensitivities", "elasticity", "elasticities")


@dataclass
class Figures:
    out_dir: Path
    paths: dict[str, dict[str, Path]] = field(default_factory=dict)

    def add(self, fig, name: str, caption: str) -> str:
        from dse.report import figures as rf

        self.paths[name] = rf.save(fig, self.out_dir, name)
        data = base64.b64encode(self.paths[name]["png"].read_bytes()).decode("ascii")
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{esc(caption)}">'
            f'<figcaption>{esc(caption)} (<a href="{name}.svg">SVG</a>, <a href="{name}.png">PNG</a>)'
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
    from dse.report import figures as rf

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
        fx = display(display_units(r.ds[xname].attrs), x_all[r.feasible])
        fy = display(display_units(r.ds[yname].attrs), y_all[r.feasible])
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
    from dse.report import figures as rf

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
        out += f"<p>{esc(note)}.</p>"
    return out


def section_memory(r: Results, pareto: np.ndarray, figs: Figures) -> str:
    from dse.report import figures as rf

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
        out += f"<p>{esc(note)}.</p>"
    return out


def section_memory_tiers(r: Results, pareto: np.ndarray, figs: Figures) -> str:
    """Used vs capacity per memory tier: HBM per GPU, then each slower tier per node."""
    from dse.report import figures as rf

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
        return head + f"<p>Not available: {esc(note)}.</p>"
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
        out += f"<p>{esc(note[0].upper() + note[1:])}.</p>"
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
    from dse.report import figures as rf

    head = "<h2>Best objective over two study axes</h2>"
    pairs = [p for p in HEATMAP_PAIRS if p[0] in r.varying and p[1] in r.varying]
    if len(pairs) < MAX_HEATMAPS:
        extra = [c for c in r.varying if c not in ("dp", "global_batch")]
        pairs += [(a, b) for i, a in enumerate(extra) for b in extra[i + 1 :] if {a, b} not in map(set, pairs)]
    pairs = pairs[:MAX_HEATMAPS]
    if not pairs:
        return head + "<p>Not available: fewer than two study axes vary among the feasible configurations.</p>"
    out = [head]
    for a, b in pairs:
        for name, sense in zip(r.objectives[:2], r.senses[:2], strict=False):
            v = r.values(name).astype(np.float64)
            scale = display(display_units(r.ds[name].attrs), v[r.feasible])
            per_group = "model" not in (a, b) and len(r.group_names) > 1
            groups = np.unique(r.group[r.feasible]) if per_group else [None]
            panels, unsampled = [], False
            for g in groups:
                sel = r.feasible if g is None else r.feasible & (r.group == g)
                grid, rows, cols, sampled = _best_grid(r, a, b, v / scale[0], sel, sense)
                unsampled = unsampled or not sampled.all()
                panels.append(rf.HeatPanel(r.group_names[g] if g is not None else "", grid, rows, cols, sampled))
            fig = rf.heatmap_figure(
                panels,
                r.ds[b].attrs.get("long_name", b),
                r.ds[a].attrs.get("long_name", a),
                label_of(r.ds, name, scale),
                sense,
            )
            best = "lowest" if sense == "min" else "highest"
            caption = f"{best} {r.ds[name].attrs.get('long_name', name)} among feasible configurations, per {a} × {b}"
            caption += "; – : no feasible configuration"
            caption += "; not sampled: the search tried no configuration there." if unsampled else "."
            out.append(figs.add(fig, f"heatmap_{a}_{b}_{name}", caption))
    return "\n".join(out)


def _best_grid(r: Results, a: str, b: str, v: np.ndarray, sel: np.ndarray, sense: str):
    """Best ``v`` over ``sel`` per (a, b) cell: (grid, row labels, column labels, sampled), where
    ``sampled`` marks the cells with any record (feasible or not). Records with no value on an
    axis (-1: a trial with no runnable layout) are in no cell."""
    av, bv = r.values(a).astype(np.float64), r.values(b).astype(np.float64)
    valid = np.isfinite(av) & np.isfinite(bv) & (av >= 0) & (bv >= 0)
    ua, ia = np.unique(av[valid], return_inverse=True)
    ub, ib = np.unique(bv[valid], return_inverse=True)
    cell = ia.reshape(-1) * len(ub) + ib.reshape(-1)
    grid = np.full(len(ua) * len(ub), np.inf)
    signed = (v if sense == "min" else -v)[valid]
    np.minimum.at(grid, cell[sel[valid]], signed[sel[valid]])
    sampled = np.bincount(cell, minlength=len(ua) * len(ub)).reshape(len(ua), len(ub)) > 0
    grid = np.where(np.isinf(grid), np.nan, grid if sense == "min" else -grid).reshape(len(ua), len(ub))
    rows, cols = [str(decode(r.ds, a, _plain(x))) for x in ua], [str(decode(r.ds, b, _plain(x))) for x in ub]
    return grid, rows, cols, sampled


def _plain(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


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
    from dse.report import figures as rf

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
