"""``hetersim optimize`` (the command) and the plain functions behind it and ``sensitivity``.

Bad input raises ``ValueError`` with one line naming the flag or key (the CLI prints it and exits
2); Ctrl-C during a search fails the trials in flight (a rerun resumes) and exits 130.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from dse import format as fmt
from dse.metrics import display
from hetersim import planfields

from .app import Interrupted, app, check_seed, positive, show_progress, user_errors

MAX_TRIALS = 10**7  # trials a study may hold
MAX_BATCH = 1 << 16  # trials asked and solved in one vectorized call
PARETO_ROWS = 10
LAYOUT_KEYS = ("tp", "pp", "vp", "cp", "dp", "micro_batch", "zero", "recompute", "precision")


# --------------------------------------------------------------------------------------------
# optimize
# --------------------------------------------------------------------------------------------


def optimize_command(
    study: Path,
    trials: int,
    sampler: str,
    seed: int | None,
    out: Path,
    storage: str | None,
    study_name: str | None,
    batch: int,
    json_out: bool,
) -> dict[str, Any]:
    """Search the outer (hardware) space of an optimize study with Optuna, solving every layout
    per trial; write ``out/<name>.optimize.nc`` and print a one-screen summary."""
    from dse.optimize import run_optimize

    try:
        summary = run_optimize(
            study,
            trials,
            sampler=sampler,
            seed=seed,
            out=out,
            storage=storage,
            study_name=study_name,
            batch=batch,
            progress=not json_out and show_progress(),
        )
    except KeyboardInterrupt:
        raise Interrupted("interrupted: the search stopped; its trials in flight are marked failed") from None
    if json_out:
        print(fmt.dumps(summary))
    else:
        print_optimize_summary(fmt.console(), summary)
    return summary


def _days(value: float, units: str) -> str:
    """A metric for the summary: seconds in days, hours or seconds as the report scales them
    (:func:`dse.metrics.display`; a step time in days printed 0.00 d)."""
    if units == "s":
        factor, name = display("s", [value])
        return f"{value:.4g} s" if factor == 1.0 else f"{value / factor:,.2f} {'d' if name == 'days' else name}"
    if units == "USD":
        return f"${value:,.0f}"
    return f"{value:.4g} {units}"


def _layout(t: Mapping[str, Any]) -> str:
    return planfields.layout_label(t, [k for k in LAYOUT_KEYS if k in t])


def _hardware(t: Mapping[str, Any], outer: list[str]) -> str:
    parts = []
    mix = [k for k in outer if k.startswith("n_") and k != "n_gpus" and "gpu" not in t]  # search.mix
    for k in outer:
        if k in ("gpu", "n_gpus", "model") or k in mix:
            continue
        v = t.get(k)
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    head = f"{t.get('n_gpus')}x {t.get('gpu')}"
    if mix:
        head = " + ".join(f"{t.get(k)}x {k[2:]}" for k in mix if t.get(k))
    if "model" in outer:
        head = f"{t.get('model')} on {head}"
    return " ".join([head, *parts])


def print_optimize_summary(con, s: Mapping[str, Any]) -> None:
    states = ", ".join(f"{n} {k}" for k, n in s["states"].items())
    visited = ""
    if s.get("outer_size"):
        share = s["n_distinct_points"] / s["outer_size"]  # trials may revisit a point: the distinct ones
        visited = f" of an outer space of {s['outer_size']:,} ({share:.1%} of it visited)"
    con.print(
        f"[bold]{s['study']}[/bold]: {s['n_trials']:,} trials ({states}, {s['n_distinct_points']:,} distinct points)"
        f"{visited}; {s['n_feasible']:,} feasible, "
        f"{s['n_pareto']:,} on the Pareto set; sampler {s['sampler']}, seed {s['seed']}, storage {s['storage']}"
    )
    con.print(
        f"this run: {s['trials_added']:,} trials, {s['layouts_evaluated']:,} layouts "
        f"({s['layouts_per_point']:,} per trial) in {s['wall_s']:.1f} s -> {s['path']}"
        + (f" (study: {s['journal']})" if s.get("journal") else "")
    )
    if s.get("infeasible_reasons"):
        reasons = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s["infeasible_reasons"].items())
        con.print(f"infeasible trials (a constraint, or the flags of the layout stored where none runs): {reasons}")
    objectives = s["objectives"]
    outer = s["outer"]
    title = f"Pareto set: {min(len(s['pareto']), PARETO_ROWS)} of {s['n_pareto_distinct']} distinct points"
    table = Table(title=title, title_justify="left")
    for column in ("trial", "hardware", "best layout", *objectives):
        table.add_column(column, justify="right" if column in objectives or column == "trial" else "left")
    for t in s["pareto"][:PARETO_ROWS]:
        cells = [_days(t[o], _units(o)) for o in objectives]
        table.add_row(str(t["trial"]), _hardware(t, outer), _layout(t), *cells)
    con.print(table)
    for o, best in s["best"].items():
        if best is None:
            con.print(f"best {o}: no feasible trial")
            continue
        con.print(
            f"best {o}: [bold]{_days(best['value'], best['units'])}[/bold] trial {best['trial']}: "
            f"{_hardware(best, outer)}, {_layout(best)}"
        )


def _units(metric: str) -> str:
    from dse.metrics import METRICS

    return METRICS[metric].units


# --------------------------------------------------------------------------------------------
# sensitivity
# --------------------------------------------------------------------------------------------


def sensitivity_report(built: Mapping[str, Any], *, metric: str = "step_time_s", top: int = 15, json_out: bool = False):
    """Rank every continuous hardware parameter of one configuration (``dse.cli.configuration``'s
    result) by the elasticity of ``metric``: which upgrade buys the most."""
    from dse.metrics import METRICS
    from dse.sensitivity import sensitivity

    if top < 1:
        raise ValueError(f"--top must be a positive integer; got {top}")
    if metric not in METRICS or METRICS[metric].dtype != "f4":
        allowed = ", ".join(m for m, v in METRICS.items() if v.dtype == "f4")
        raise ValueError(f"--metric must be one of {allowed}; got {metric!r}")
    specs, plan, out = built.specs, built.plan, built.breakdown
    model_label, gpu = built.model, built.gpu
    ranked = sensitivity(*specs, metric=metric)
    value = float(getattr(out, metric))
    result = {
        "model": model_label,
        "gpu": gpu,
        "plan": {k: v for k, v in plan.items() if v is not None},
        "metric": metric,
        "units": METRICS[metric].units,
        "value": value,
        "feasible": int(out.infeasible) == 0,
        "parameters": [
            {
                "path": r.path,
                "value": r.value,
                "units": r.units,
                "derivative": r.derivative,
                "elasticity": r.elasticity,
                "change_pct_for_plus_10pct": _plus_10pct(r.elasticity),
            }
            for r in ranked
        ],
    }
    if json_out:
        print(fmt.dumps(result))
    else:
        print_sensitivity(fmt.console(), result, top)
    return result


def _plus_10pct(elasticity: float) -> float:
    """First-order % change of the metric when the parameter grows by 10%."""
    return 10.0 * elasticity


def _u(units: str) -> str:
    return "" if units == "1" else f" {units}"


def print_sensitivity(con, r: Mapping[str, Any], top: int) -> None:
    verdict = "" if r["feasible"] else " [red](the configuration is infeasible)[/]"
    con.print(
        f"[bold]{r['metric']}[/bold] = {r['value']:.4g} {r['units']} for {r['model']} on {r['plan']['n_gpus']}x "
        f"{r['gpu']}{verdict}"
    )
    params = r["parameters"]
    moving = [p for p in params if p["elasticity"] != 0.0]
    t = Table(title=f"Which upgrade buys the most (top {min(top, len(moving))} of {len(params)})", title_justify="left")
    for column, justify in (
        ("#", "right"),
        ("parameter", "left"),
        ("value", "right"),
        (f"d {r['metric']} / d p", "right"),
        ("elasticity", "right"),
        ("+10% ->", "right"),
    ):
        t.add_column(column, justify=justify)
    for i, p in enumerate(moving[:top], 1):
        t.add_row(
            str(i),
            escape(p["path"]),
            f"{p['value']:.4g}{_u(p['units'])}",
            f"{p['derivative']:.3g} {r['units']}/{p['units']}" if p["units"] != "1" else f"{p['derivative']:.3g}",
            f"{p['elasticity']:+.3f}",
            f"{p['change_pct_for_plus_10pct']:+.2f}%",
        )
    con.print(t)
    still = len(params) - len(moving)
    if still:
        con.print(
            f"{still} parameters do not move {r['metric']} here (unused tiers and levels, capacity with slack, ...)"
        )


@app.command("optimize")
@user_errors
def optimize_cmd(
    study: Path = typer.Argument(..., help="Optimize study TOML: a study file with a [search] table."),
    trials: int = typer.Option(200, "--trials", help="Trials the study should hold (a rerun resumes; 0 only writes)."),
    sampler: str = typer.Option(
        "auto", "--sampler", help="auto|nsga2|tpe|random|grid (auto: NSGA-II, or TPE for one objective)."
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="Sampler seed; the same seed reproduces a run [default: 0; with --storage a fresh seed per worker, "
        "so workers sharing a study sample different points (the summary prints it)].",
    ),
    out: str = typer.Option("results", "--out", metavar="PATH", help="Output folder, or a .nc path."),
    storage: str | None = typer.Option(
        None, "--storage", help="Journal file or RDB URL (sqlite:///x.db, postgresql://...) shared by workers."
    ),
    study_name: str | None = typer.Option(None, "--study-name", help="Optuna study name (default: the study's)."),
    batch: int = typer.Option(32, "--batch", help="Trials asked, solved in one vectorized call and told together."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Search the hardware with Optuna, solving every layout of each trial at once; write all trials."""
    positive("--batch", batch, hi=MAX_BATCH)
    if trials > MAX_TRIALS:
        raise ValueError(f"--trials must be an integer from 0 to {MAX_TRIALS:,}; got {trials:,}")
    check_seed(seed)
    if trials == 0 and storage is None:  # nothing to run, nothing stored: a results file of no trial
        raise ValueError("--trials 0 only writes the trials a --storage study holds; give --storage, or --trials > 0")
    optimize_command(study, trials, sampler, seed, out, storage, study_name, batch, as_json)
