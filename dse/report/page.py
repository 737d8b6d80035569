"""The report's text: the Pareto table, the validation section, the overview, the page itself."""

from __future__ import annotations

import html
import json
import platform
import tomllib
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

import numpy as np

from dse.metrics import display, display_units
from dse.report.results import COLUMNS, Results, decode, streamed
from hetersim.units import DAY

MAX_TABLE = 300  # rows of the Pareto table


def esc(text: Any) -> str:
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
        units = display_units(r.ds[key].attrs) if key in r.ds.variables else ""
        unit = f"<br><span class=u>[{esc(units)}]</span>" if units and units != "1" else ""
        head.append(f'<th title="{esc(title)}">{esc(key)}{unit}</th>')
    if "time_to_train_s" in keys:
        head.insert(keys.index("time_to_train_s") + 1, "<th>time to train<br><span class=u>[days]</span></th>")
    body = []
    for row in records[:MAX_TABLE]:
        cells = [f"<td>{esc(_fmt(row[k]))}</td>" for k in keys]
        if "time_to_train_s" in keys:
            cells.insert(keys.index("time_to_train_s") + 1, f"<td>{row['time_to_train_s'] / DAY:.1f}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p>First {MAX_TABLE} of {len(records)} rows.</p>" if len(records) > MAX_TABLE else ""
    return f"<div class=scroll><table><tr>{''.join(head)}</tr>{''.join(body)}</table></div>{more}"


def section_validation(v: Mapping[str, Any] | None, error: str | None) -> str:
    head = "<h2>How far to trust it: validation against published runs</h2>"
    if error is not None:
        return head + f"<p>Validation could not run: {esc(error)}</p>"
    if v is None:
        return head + "<p>Validation skipped.</p>"
    complete = v.get("mape_step_time_pct_complete")
    complete_text = (
        f"; over the {v['n_complete']} runs whose sources state every setting it is <b>{complete:.1f} %</b>"
        if complete is not None
        else " (none of them states every setting)"
    )
    kind = "mixture-of-experts " if str(v.get("runs_path", "")).endswith("moe_runs.csv") else ""
    text = (
        f"<p>The cost model as installed now predicts the step time of {v['n_runs']} published {kind}training runs "
        f"with a mean absolute percentage error (MAPE) of <b>{v['mape_step_time_pct']:.1f} %</b>{complete_text}. "
        f"The largest error is {v['max_abs_error_pct']:.0f} % ({v['n_infeasible']} runs the model deems "
        "infeasible count as 100 %). Read time, cost and energy to within about that error; rankings between "
        "close configurations are less certain than the gaps in the figures suggest.</p>"
    )
    rows = "".join(
        f"<tr><td>{esc(label)}</td><td>{s['n']}</td><td>{s['mape_pct']:.1f}</td><td>{s['max_abs_error_pct']:.1f}</td></tr>"
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
    """Configurations flagged by each reason: over every configuration a streamed sweep evaluated
    (its ``infeasible_reasons`` attribute), else over the file's rows."""
    if streamed(r.ds) and "infeasible_reasons" in r.ds.attrs:
        counts = json.loads(str(r.ds.attrs["infeasible_reasons"]))
        return {str(k): int(v) for k, v in counts.items() if v}
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


def token_budget(ds) -> float | None:
    """The study's ``train_tokens``: from a sweep's ``fixed_plan``, else from the study file an
    optimize dataset carries (``study_toml``); None when neither has it."""
    fixed = json.loads(ds.attrs.get("fixed_plan", "{}") or "{}")
    if "train_tokens" not in fixed:
        try:
            fixed = tomllib.loads(str(ds.attrs.get("study_toml", ""))).get("plan", {})
        except tomllib.TOMLDecodeError:
            return None
    value = fixed.get("train_tokens") if isinstance(fixed, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _overview(r: Results, pareto: np.ndarray) -> str:
    attrs = r.ds.attrs
    tokens = token_budget(r.ds)
    reasons = _infeasible_counts(r)
    items = {
        "dataset": str(r.path),
        "configurations": f"{r.ds.sizes['config']:,} ({int(r.feasible.sum()):,} feasible)",
        "not feasible because": ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in reasons.items()) or "–",
        "objectives": ", ".join(f"{s} {o}" for o, s in zip(r.objectives, r.senses, strict=True)),
        "constraints": attrs.get("constraints", "{}"),
        "token budget": f"{tokens:.4g} tokens" if tokens is not None else "–",
        "axes that vary": ", ".join(r.varying) or "–",
        "Pareto set": f"{len(pareto)} configurations (per model, over the objectives)",
    }
    if streamed(r.ds):
        items["configurations"] = (
            f"{int(attrs['n_configs']):,} evaluated ({int(attrs['n_feasible']):,} feasible) by a streamed sweep; "
            f"the file keeps {r.ds.sizes['config']:,} (the top {attrs.get('top_k', '?')} per objective and the "
            "Pareto set)"
        )
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items.items())
    return f"<dl>{rows}</dl>"


def best_lines(r: Results, records: list[dict[str, Any]]) -> str:
    """One sentence per model and objective: the best Pareto configuration."""
    lines = []
    for name, sense in zip(r.objectives, r.senses, strict=True):
        for gname in r.group_names:
            rows = [row for row in records if len(r.group_names) == 1 or row.get("model") == gname]
            if not rows:
                continue
            best = (min if sense == "min" else max)(rows, key=lambda row: row[name])
            factor, units = display(display_units(r.ds[name].attrs), np.array([best[name]]))
            who = f"{gname}: " if len(r.group_names) > 1 else ""
            lines.append(
                f"<li>{esc(who)}{'lowest' if sense == 'min' else 'highest'} {esc(name)}: "
                f"<b>{best[name] / factor:.4g} {esc(units)}</b> with {esc(r.layout(best['config']))} "
                f"(#{best['#']})</li>"
            )
    return f"<ul>{''.join(lines)}</ul>" if lines else ""


def _fmt_metric(r: Results, name: str, value: float) -> str:
    factor, units = display(display_units(r.ds[name].attrs), np.array([value]))
    return f"{value / factor:.4g} {units}"


def answer_summary(r: Results, records: list[dict[str, Any]]) -> str:
    """The answer first: per GPU kind its best feasible configuration on the first objective, the
    trade-off between the Pareto set's extremes, and the verdict (which kind and layout wins)."""
    if not r.feasible.any():
        reasons = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in _infeasible_counts(r).items())
        why = f": {reasons} (a configuration may have several reasons)" if reasons else " (the file records no reason)"
        return f"<h2>The answer</h2><p><b>No configuration of this study is feasible</b>{esc(why)}.</p>"
    first, sense = r.objectives[0], r.senses[0]
    pick = np.nanargmin if sense == "min" else np.nanargmax
    values = r.values(first).astype(float)
    lines = []
    if "gpu" in r.ds.variables and "config" in r.ds[first].dims:
        gpus = r.values("gpu")
        for code in np.unique(gpus[r.feasible]):
            idx = np.flatnonzero(r.feasible & (gpus == code))
            best = int(idx[pick(values[idx])])
            lines.append(
                f"<li>{esc(decode(r.ds, 'gpu', code))}: best {esc(first)} "
                f"<b>{esc(_fmt_metric(r, first, values[best]))}</b> with {esc(r.layout(best))}</li>"
            )
    feasible = np.flatnonzero(r.feasible)
    winner = int(feasible[pick(values[feasible])])
    verdict = f"<p><b>Verdict</b>: {esc(r.layout(winner, with_model=True))} gives the best {esc(first)}"
    verdict += f" ({esc(_fmt_metric(r, first, values[winner]))}).</p>"
    trade = ""
    if len(r.objectives) > 1 and len(records) > 1:
        other = r.objectives[1]
        a = (min if sense == "min" else max)(records, key=lambda row: row[first])
        b = (min if r.senses[1] == "min" else max)(records, key=lambda row: row[other])
        if a["config"] != b["config"]:
            trade = (
                f"<p><b>Trade-off</b>: the best {esc(first)} ({esc(_fmt_metric(r, first, a[first]))}) comes at "
                f"{esc(other)} {esc(_fmt_metric(r, other, a[other]))}; the best {esc(other)} "
                f"({esc(_fmt_metric(r, other, b[other]))}) at {esc(first)} {esc(_fmt_metric(r, first, b[first]))}; "
                f"{len(records)} Pareto configurations lie between.</p>"
            )
        else:
            trade = f"<p><b>Trade-off</b>: none: one configuration is best in both {esc(first)} and {esc(other)}.</p>"
    per_gpu = f"<ul>{''.join(lines)}</ul>" if lines else ""
    return f"<h2>The answer</h2>{verdict}{trade}{per_gpu}"


def render_page(r: Results, pareto: np.ndarray, body: Sequence[str], v: Mapping[str, Any] | None) -> str:
    attrs = r.ds.attrs
    name = attrs.get("study_name", r.path.stem)
    versions = _versions(r.ds)
    version_rows = "".join(
        f"<tr><td>{esc(pkg)}</td><td>{esc(versions['dataset'].get(pkg, '–'))}</td>"
        f"<td>{esc(versions['report'].get(pkg, '–'))}</td></tr>"
        for pkg in dict.fromkeys([*versions["dataset"], *versions["report"]])
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in r.notes) or "<li>none</li>"
    calibration = attrs.get("calibration", "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>HeterSim report: {esc(name)}</title>
<style>{CSS}</style></head>
<body>
<h1>HeterSim report: {esc(name)}</h1>
<p>{esc(attrs.get("study_description", ""))}</p>
{_overview(r, pareto)}
{"".join(body)}
<h2>Study file</h2>
<pre>{esc(attrs.get("study_toml", "(not in the dataset)"))}</pre>
<h2>Versions and calibration</h2>
<table><tr><th>package</th><th>dataset written with</th><th>report written with</th></tr>{version_rows}</table>
<p>Calibration used by the sweep: <code>{esc(calibration or "(not in the dataset)")}</code></p>
<p>Dataset fingerprint: <code>{esc(attrs.get("fingerprint", "–"))}</code>; page written by
<code>hetersim report</code>.</p>
<h2>Notes</h2><ul class=note>{notes}</ul>
</body></html>
"""
