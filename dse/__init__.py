"""Design-space exploration on top of the :mod:`hetersim` cost model: CLI, studies, sweeps, search.

:func:`open_results` opens a sweep or optimize results file with names for its categorical
columns (``ds.sel(gpu="h200-sxm-141gb")``) or as the labelled grid (``grid=True``); it is
:func:`dse.results.open_results`, loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["open_results"]


def __getattr__(name: str) -> Any:
    if name == "open_results":
        from dse.results import open_results

        return open_results
    raise AttributeError(f"module 'dse' has no attribute {name!r}")
