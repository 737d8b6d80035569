"""Fitting the model to published runs: the application around the cost model, not part of it.

* :mod:`~hetersim.fit.runs`: the published-runs CSV read and checked, each row as model inputs;
* :mod:`~hetersim.fit.stacks`: software-stack facts matched to a run by its source;
* :mod:`~hetersim.fit.validation`: predict every run in one vmapped call and report the error;
* :mod:`~hetersim.fit.calibration`: the stored global constants and their fit by gradient descent;
* :mod:`~hetersim.fit.intervals`: 80% prediction intervals of step time from held-out residuals
  (:mod:`~hetersim.fit.interval_fit` fits them);
* :mod:`~hetersim.fit.adam`: the Adam loop the fit and ``dse``'s hardware tuning share.

The model itself (``hetersim.simulate`` and the specs it takes) never imports this package; this is
the one place in ``hetersim`` that compiles with ``jax.jit``.
"""

from .adam import AdamResult, adam
from .calibration import (
    BOUNDS,
    as_spec,
    calibrate,
    calibration_path,
    cross_validate,
    fit,
    load_calibration,
    source_weights,
    write_calibration,
)
from .intervals import IntervalModel, load_intervals
from .runs import REQUIRED_COLUMNS, Row, default_runs_path, read_runs, row_inputs, source_label
from .stacks import Stack, default_stacks_path, load_stacks, stack_for
from .validation import Prepared, default_memory_path, predict, prepare, summarize, validate, validate_memory

__all__ = [
    "BOUNDS",
    "REQUIRED_COLUMNS",
    "AdamResult",
    "IntervalModel",
    "Prepared",
    "Row",
    "Stack",
    "adam",
    "as_spec",
    "calibrate",
    "calibration_path",
    "cross_validate",
    "default_memory_path",
    "default_runs_path",
    "default_stacks_path",
    "fit",
    "load_calibration",
    "load_intervals",
    "load_stacks",
    "predict",
    "prepare",
    "read_runs",
    "row_inputs",
    "source_label",
    "source_weights",
    "stack_for",
    "summarize",
    "validate",
    "validate_memory",
    "write_calibration",
]
