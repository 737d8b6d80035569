"""``hetersim export``: a results dataset as a CSV or Parquet table, with names for codes.

Bad input raises ``ValueError`` (the CLI prints it on one line and exits 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dse import format as fmt

from .app import app, user_errors


def export_command(
    path: Path, csv: str | Path | None, parquet: str | Path | None, json_out: bool = False
) -> dict[str, Any]:
    """Write the table of :func:`dse.results.to_frame` to ``csv`` and/or ``parquet`` (atomically)."""
    from dse import atomic
    from dse.results import to_frame

    csv, parquet = (
        atomic.file_path(t, f) if t is not None else None for t, f in ((csv, "--csv"), (parquet, "--parquet"))
    )
    if csv is None and parquet is None:
        raise ValueError("give --csv PATH and/or --parquet PATH")
    if csv is not None and parquet is not None and csv.resolve() == parquet.resolve():
        raise ValueError(f"--csv and --parquet both name {csv}; give each table its own file")
    for target, flag in ((csv, "--csv"), (parquet, "--parquet")):
        if target is not None and target.resolve() == path.resolve():
            raise ValueError(f"{flag} {target} is the results file being read; give the table its own file")
    if parquet is not None:
        try:
            import pyarrow  # noqa: F401
        except ImportError as error:
            found = "" if isinstance(error, ModuleNotFoundError) else f" (installed, but: {error})"
            raise ValueError(f"--parquet needs pyarrow: pip install 'hetersim[parquet]'{found}") from None
    for target, flag in ((csv, "--csv"), (parquet, "--parquet")):  # both, before anything is written
        if target is not None:  # a missing folder is made, as for every command's output
            atomic.check_target(target, flag)
            if atomic.is_netcdf(target):  # a results file, which the table would replace
                raise ValueError(f"{flag} {target}: exists and is a results file (netCDF); give the table its own file")
    frame = to_frame(path)
    if frame.empty and not int(frame.attrs.get("streamed", 0)):  # as report: a streamed sweep may keep none
        raise ValueError(f"{path}: holds no configurations to export")
    written = []
    for target, write in (
        (csv, lambda tmp: frame.to_csv(tmp, index=False)),
        (parquet, lambda tmp: frame.to_parquet(tmp, index=False)),
    ):
        if target is None:
            continue
        atomic.atomic_write(target, write)
        written.append(str(target))
    out = {"path": str(path), "rows": len(frame), "columns": len(frame.columns), "written": written}
    if json_out:
        print(fmt.dumps(out))
    else:
        for w in written:
            fmt.console().print(f"wrote {w} ({len(frame):,} rows x {len(frame.columns)} columns)")
    return out


@app.command("export")
@user_errors
def export_cmd(
    path: Path = typer.Argument(..., help="Results dataset (.nc) from `hetersim sweep` or `hetersim optimize`."),
    csv: str | None = typer.Option(None, "--csv", help="Write a CSV table here."),
    parquet: str | None = typer.Option(None, "--parquet", help="Write a Parquet table here (needs pyarrow)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Export a results dataset as a table: one row per configuration (or trial), names for codes."""
    export_command(path, csv, parquet, as_json)
