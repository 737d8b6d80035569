"""``hetersim report``: the command and the plain function behind it.

Bad input raises ``ValueError`` (the CLI prints it on one line and exits 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dse import format as fmt

from .app import app, status, user_errors


def report_command(path: Path, out: Path | None, json_out: bool, validation: bool = True) -> dict[str, Any]:
    """Write the report of results dataset ``path`` into ``out`` (default: ``results/X.nc`` ->
    ``results/X/``) and print where it went, the Pareto set's size and the model's error."""
    from dse.report import build_report

    report = build_report(path, out, validation=validation, progress=status)
    s = report.summary
    if json_out:
        print(fmt.dumps(s))
        return s
    con = fmt.console()
    kept = " kept by a streamed sweep" if s["streamed"] else ""
    con.print(
        f"[bold]{s['study']}[/bold]: {s['n_configs']:,} configurations{kept}, {s['n_feasible']:,} feasible, "
        f"{len(s['pareto'])} in the Pareto set ({', '.join(s['objectives'])})"
    )
    v = s["validation"]
    if v is not None:
        complete = v["mape_step_time_pct_complete"]
        over = f"{complete:.1f} % over the {v['n_complete']} complete runs" if complete is not None else "none complete"
        con.print(f"model error against {v['n_runs']} published runs: MAPE {v['mape_step_time_pct']:.1f} % ({over})")
    elif s["validation_error"]:
        con.print(f"validation could not run: {s['validation_error']}")
    for note in s["notes"]:
        con.print(f"note: {note}")
    con.print(f"{len(s['figures'])} figures (PNG + SVG) -> {report.out_dir}")
    con.print(f"wrote {report.index}")
    return s


@app.command("report")
@user_errors
def report_cmd(
    path: Path = typer.Argument(..., help="Results dataset (.nc) from `hetersim sweep` or `hetersim optimize`."),
    out: Path | None = typer.Option(None, "--out", help="Output folder [default: results/X.nc -> results/X/]."),
    no_validation: bool = typer.Option(False, "--no-validation", help="Skip validation (~1 min, then cached)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (Pareto set, figures, validation) as JSON."),
) -> None:
    """Write an offline HTML report: Pareto fronts, breakdowns, memory, heat maps, validation error."""
    report_command(path, out, as_json, validation=not no_validation)
