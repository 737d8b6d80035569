"""Vectorized sweeps: every configuration of a study, in fixed-size chunks, into one netCDF file.

The engine, one module per job:

* :mod:`dse.sweep.space`: the space, a cross product of factors (:class:`Space`,
  :func:`space_from_study`, :func:`layout_rows`); configuration ``i`` is the mixed-radix decoding
  of ``i`` over the factors' lengths; the chunk size.
* :mod:`dse.sweep.evaluate`: one ``jax.jit`` per study shape that decodes a chunk of flat
  indices, builds the batched specs, simulates them and checks the study constraints
  (:func:`evaluate_chunk`; the simulation and constraint checks shared with :mod:`dse.inner`).
* :mod:`dse.sweep.run`: :func:`run_sweep`, chunks run here or as Dask tasks, with progress.
* :mod:`dse.sweep.checkpoints`: finished chunks in ``<out>.chunks/`` so an interrupted sweep
  resumes, valid for one fingerprint.
* :mod:`dse.sweep.dataset`: the netCDF schema (coordinates, variables, attributes) and the
  writer of a full dataset.
* :mod:`dse.sweep.stream`: a streamed sweep keeps only the top-k per objective, the Pareto set
  and per-axis summaries (:class:`Reducer`).
* :mod:`dse.sweep.summary`: the best configurations, read back from a dataset.

See ``studies/README.md`` for the study format. The names below are the package's interface.
"""

from dse.sweep.checkpoints import package_versions
from dse.sweep.dataset import COORD_ATTRS, EXTRA_VARIABLES, variables
from dse.sweep.evaluate import chunk_task, evaluate_chunk, trace_count
from dse.sweep.run import run_sweep
from dse.sweep.space import (
    CODE_COLUMNS,
    COLUMNS,
    DEFAULT_CHUNK,
    FIXED_FIELDS,
    Space,
    columns_plan,
    layout_rows,
    space_from_study,
)
from dse.sweep.stream import DEFAULT_TOP_K, Reducer
from dse.sweep.summary import summarize

__all__ = [
    "CODE_COLUMNS",
    "COLUMNS",
    "COORD_ATTRS",
    "DEFAULT_CHUNK",
    "DEFAULT_TOP_K",
    "EXTRA_VARIABLES",
    "FIXED_FIELDS",
    "Reducer",
    "Space",
    "chunk_task",
    "columns_plan",
    "evaluate_chunk",
    "layout_rows",
    "package_versions",
    "run_sweep",
    "space_from_study",
    "summarize",
    "trace_count",
    "variables",
]
