"""Writing the report: the page and its figures into a folder, with a JSON-able summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dse import atomic
from dse.report.goodput import goodput_rows, section_goodput
from dse.report.page import (
    answer_summary,
    best_lines,
    pareto_records,
    pareto_table,
    render_page,
    section_validation,
)
from dse.report.results import load, pareto_set, streamed
from dse.report.sections import (
    Figures,
    section_breakdown,
    section_fronts,
    section_heatmaps,
    section_memory,
    section_memory_tiers,
    section_sensitivity,
)
from dse.report.validation import validation_summary


@dataclass
class Report:
    index: Path
    out_dir: Path
    figures: dict[str, dict[str, Path]]
    summary: dict[str, Any]


def default_out_dir(nc_path: str | Path) -> Path:
    """``results/X.nc`` -> ``results/X/`` (a path with no name of its own, ``.``, is resolved first)."""
    p = Path(nc_path) if Path(nc_path).name else Path(nc_path).resolve()
    if not p.name:  # the root folder
        return p / "report"
    return p.with_suffix("") if p.suffix == ".nc" else p.with_name(p.name + "_report")


def build_report(
    nc_path: str | Path,
    out_dir: str | Path | None = None,
    *,
    validation: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Write the report of ``nc_path`` into ``out_dir`` (default: beside it, named after it) and
    return what was written with a JSON-able summary. ``validation`` False skips the model's
    validation run (a minute of JAX the first time, then read from the cache of
    :mod:`dse.report.validation`) and says so in the page; ``progress`` hears each stage
    once the dataset has been read."""
    progress = progress or (lambda _message: None)
    out = Path(out_dir) if out_dir is not None else default_out_dir(nc_path)
    atomic.check_folder(out, "--out")
    index = out / "index.html"
    if index.is_dir():  # found before any figure is drawn into the folder
        raise ValueError(f"--out {out}: {index} is a folder, where the report writes its page; give another --out")
    r = load(nc_path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        figs = Figures(out)
        pareto = pareto_set(r)
        records = pareto_records(r, pareto)
        v, v_error = None, None
        if validation:
            progress("validating the model against the published runs (cached once done; --no-validation skips it)")
            try:
                v = validation_summary(moe=_has_experts(r))
            except (ValueError, OSError) as error:
                v_error = str(error)
        progress(f"drawing the figures of {int(r.ds.sizes['config']):,} configurations into {out}")
        body = [
            answer_summary(r, records),
            section_validation(v, v_error),
            section_fronts(r, pareto, figs),
            "<h2>The Pareto set</h2>",
            f"<p>Every parameter and metric of the {len(records)} Pareto configurations "
            "(hover a column name for its long name).</p>",
            best_lines(r, records),
            pareto_table(r, records),
            section_breakdown(r, pareto, figs),
            section_memory(r, pareto, figs),
            section_memory_tiers(r, pareto, figs),
            section_heatmaps(r, figs),
            section_goodput(r),
            section_sensitivity(r, pareto, figs),
        ]
        page = render_page(r, pareto, body, v)
        atomic.write_text(index, page)
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
            "goodput": goodput_rows(r),
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


def _has_experts(r) -> bool:
    """Whether the study's models include a mixture-of-experts one (its report then quotes the
    MoE validation)."""
    from hetersim.catalog import load_catalog

    catalog = load_catalog()
    for name in r.group_names:
        try:
            if int(catalog.model(str(name)).get("n_experts") or 0) > 1:
                return True
        except ValueError:
            continue
    return False
