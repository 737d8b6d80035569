"""The validation section's numbers, cached: ``hetersim validate`` takes about a minute, and its
answer only changes with the packaged inputs (published runs, catalog, calibration) or the model.

The cache is one JSON file per fingerprint in ``$XDG_CACHE_HOME/hetersim`` (``~/.cache/hetersim``
without it), written atomically; a file that cannot be read is recomputed and rewritten, and a
folder that cannot be written only costs the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from dse import format as fmt

# What the page reads (dse.report.page.section_validation); a cached file without one is stale.
KEYS = (
    "n_runs",
    "n_complete",
    "n_infeasible",
    "mape_step_time_pct",
    "mape_step_time_pct_complete",
    "max_abs_error_pct",
    "per_source",
    "runs_path",
)


def runs_path(moe: bool = False) -> Path:
    """The published runs a report is judged against: the dense runs, or for a study of
    mixture-of-experts models the packaged MoE runs (``data/moe_runs.csv``)."""
    from hetersim.fit import default_runs_path

    return default_runs_path().with_name("moe_runs.csv") if moe else default_runs_path()


def compute(moe: bool = False) -> dict[str, Any]:
    """The model's step-time error against the published runs (``hetersim validate``), uncached."""
    from hetersim.catalog import load_catalog
    from hetersim.fit import as_spec, load_calibration, read_runs, validate

    report = validate(read_runs(runs_path(moe)), load_catalog(), as_spec(load_calibration()))
    return {**{k: v for k, v in report.items() if k != "rows"}, "runs_path": runs_path(moe).name}


def inputs(moe: bool = False) -> list[Path]:
    """What the answer depends on: the published runs, every catalog TOML (calibration.toml among
    them) and the model's source, which a version number misses in a development install."""
    import hetersim
    from hetersim.catalog import CATALOG_DIR

    package = Path(hetersim.__file__).resolve().parent
    data = [runs_path(moe)] + ([package / "data" / "moe_run_configs.csv"] if moe else [])
    return [*data, *sorted(CATALOG_DIR.glob("*.toml")), *sorted(package.rglob("*.py"))]


def fingerprint(paths: list[Path] | None = None) -> str:
    """SHA-256 over the package version and each input's name and bytes (a missing one counts)."""
    h = hashlib.sha256()
    try:
        h.update(metadata.version("hetersim").encode())
    except metadata.PackageNotFoundError:
        h.update(b"no version")
    for path in inputs() if paths is None else paths:
        h.update(str(path.name).encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"missing")
        h.update(b"\0")
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hetersim"


def validation_summary(folder: str | Path | None = None, moe: bool = False) -> dict[str, Any]:
    """:func:`compute`, read from the cache in ``folder`` (default :func:`cache_dir`) when the
    inputs have not changed since it was written; ``moe``: against the MoE runs."""
    name = f"validation-{'moe-' if moe else ''}{fingerprint(inputs(moe))}.json"
    path = Path(folder if folder is not None else cache_dir()) / name
    try:
        cached = json.loads(path.read_text())
        if isinstance(cached, dict) and all(k in cached for k in KEYS):
            return cached
    except (OSError, ValueError):
        pass
    summary = json.loads(fmt.dumps(compute(moe)))  # the same plain values a cache hit returns
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fmt.write_json_atomic(path, summary)
    except OSError:
        pass
    return summary
