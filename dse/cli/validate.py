"""``hetersim validate`` and ``hetersim calibrate``: the model against measured runs."""

from pathlib import Path

import typer

from dse import atomic
from dse import format as fmt
from hetersim.catalog import load_catalog

from .app import app, positive, status, user_errors

MAX_STEPS = 1_000_000  # gradient steps of one calibration
VALIDATION_KEYS = (
    "n_runs",
    "coverage_pct",
    "mape_step_time_pct",
    "mape_step_time_pct_complete",
    "max_abs_error_pct",
    "per_source",
)


@app.command("validate")
@user_errors
def validate_cmd(
    runs: Path | None = typer.Option(None, "--runs", help="Runs CSV (default: the packaged published runs)."),
    memory: Path | None = typer.Option(None, "--memory", help="Measured-memory CSV to validate as well."),
    json_out: str | None = typer.Option(None, "--out", help="Also write the report as JSON to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of tables."),
    worst: int = typer.Option(5, "--worst", help="How many of the worst rows to list again."),
    catalog_files: list[Path] = typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable."),
    stacks_file: Path | None = typer.Option(
        None, "--stacks", help="Software-stack facts TOML matched by each row's source (default: the packaged one)."
    ),
) -> None:
    """Predict published training runs and report the step-time error."""
    from hetersim.fit import validation
    from hetersim.fit.intervals import fitted_runs_name
    from hetersim.fit.runs import check_rows, default_runs_path, read_runs
    from hetersim.fit.stacks import load_stacks

    if worst < 0:
        raise ValueError(f"--worst must be a non-negative integer; got {worst}")
    if json_out is not None:
        json_out = atomic.check_own_output(json_out, "--out", "JSON", reads=(runs, memory, stacks_file, *catalog_files))
    catalog = load_catalog(catalog_files)
    path = runs or default_runs_path()
    rows = read_runs(path, load_stacks(stacks_file))
    check_rows(rows, catalog, str(path))
    validate_memory = getattr(validation, "validate_memory", None)
    if memory is not None and validate_memory is None:
        raise ValueError("--memory: this version has no memory validation (hetersim.fit.validation.validate_memory)")
    if memory is not None:  # a file that cannot be read is refused before the work is announced
        validation.memory_records(memory)
    from hetersim.api import default_calibration

    cal = default_calibration()
    status(f"validating the model against {len(rows)} published runs ({path.name})")
    report = validation.validate(rows, catalog, cal, path=str(path))
    memory_report = validate_memory(memory, catalog, cal) if memory is not None else None

    doc = {key: report[key] for key in VALIDATION_KEYS}
    doc.update({k: v for k, v in report.items() if k not in doc})
    doc["runs_path"] = str(path)
    # The stored intervals were fitted to one runs file's held-out residuals ([fit] data): on that
    # file their coverage is in-sample, on any other a check.
    report["coverage_in_sample"] = doc["coverage_in_sample"] = path.name == fitted_runs_name()
    if memory_report is not None:
        doc["memory"] = memory_report
    if json_out is not None:
        fmt.write_json_atomic(json_out, doc)
    if as_json:
        typer.echo(fmt.dumps(doc))
        return
    con = fmt.console()
    fmt.print_validation(con, report, worst)
    if memory_report is not None:
        fmt.print_summary(con, "Memory validation", memory_report)
    if json_out is not None:
        con.print(f"wrote {json_out}")


@app.command("calibrate")
@user_errors
def calibrate_cmd(
    runs: Path | None = typer.Option(None, "--runs", help="Runs CSV (default: the packaged published runs)."),
    steps: int = typer.Option(300, "--steps", help="Gradient steps."),
    out: str | None = typer.Option(None, "--out", help="Calibration TOML to write (default: the packaged one)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Fit and report, write nothing."),
    catalog_files: list[Path] = typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted values and MAPE as JSON."),
    cross_validate: bool = typer.Option(
        False, "--cross-validate", help="Leave one source out at a time: fit on the rest, report the held-out error."
    ),
    intervals: bool = typer.Option(
        False,
        "--intervals",
        help="Fit the 80% prediction intervals to the leave-one-source-out residuals "
        "and write them (--out, default: the packaged intervals.toml).",
    ),
) -> None:
    """Fit the global calibration constants to the published runs; print MAPE before and after."""
    from hetersim.fit import calibration
    from hetersim.fit.runs import check_rows, read_runs, source_label

    positive("--steps", steps, hi=MAX_STEPS)
    if out is not None and dry_run:
        raise ValueError("--dry-run writes nothing; give --out without it, or leave --out out")
    if out is not None and cross_validate:
        raise ValueError("--cross-validate reports the held-out error and writes nothing; leave --out out")
    if out is not None:
        out = atomic.check_own_output(out, "--out", "TOML", reads=(runs, *catalog_files))
    if intervals and cross_validate:
        raise ValueError("--intervals already runs the leave-one-source-out fits; give one of it or --cross-validate")
    catalog = load_catalog(catalog_files)
    if runs is not None:  # a file with a mistake is refused before the work is announced
        rows = read_runs(runs)
        check_rows(rows, catalog, str(runs))
        sources = len({source_label(r.source) for r in rows}) if intervals or cross_validate else 2
        if sources < 2:
            flag = "--intervals" if intervals else "--cross-validate"
            raise ValueError(f"{flag}: leaving one source out needs runs of two sources or more; {runs} has {sources}")
    if intervals:
        return _intervals(runs, catalog, steps, out, dry_run, as_json)
    status(f"calibrating: {steps} gradient steps" + (", leaving one source out at a time" if cross_validate else ""))
    if cross_validate:
        cv = calibration.cross_validate(runs, catalog, steps=steps)
        if as_json:
            typer.echo(fmt.dumps(cv))
        else:
            fmt.print_summary(fmt.console(), "Leave-one-source-out cross-validation", cv)
        return
    start = calibration.load_calibration()
    result = calibration.calibrate(runs, catalog, steps=steps, start=start)
    path = out or calibration.calibration_path()
    if not dry_run:
        calibration.write_calibration(path, result["values"], result["meta"])
    summary = {
        "mape_before_pct": result["before"]["mape_step_time_pct"],
        "mape_after_pct": result["after"]["mape_step_time_pct"],
        "final_loss": result["history"][-1] if result["history"] else None,
        "start_values": start,
        "values": result["values"],
        "written": None if dry_run else str(path),
    }
    if as_json:
        typer.echo(fmt.dumps(summary))
    else:
        fmt.print_summary(fmt.console(), "Calibration", summary)


def _intervals(runs: Path | None, catalog, steps: int, out: Path | None, dry_run: bool, as_json: bool) -> None:
    """``calibrate --intervals``: fit, write (unless a dry run), print coverage and the numbers."""
    from hetersim.fit import interval_fit
    from hetersim.fit.intervals import intervals_path, write_intervals

    result = interval_fit.fit_from_runs(runs, catalog, steps=steps)
    summary = interval_fit.summary(result)
    if not dry_run:
        path = out or intervals_path()
        write_intervals(path, result["model"], result["meta"])
        summary["written"] = str(path)
    if as_json:
        typer.echo(fmt.dumps(summary))
    else:
        fmt.print_summary(fmt.console(), "Prediction intervals (leave-one-source-out residuals)", summary)
