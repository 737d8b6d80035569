"""Bilevel search: Optuna chooses the hardware, every layout is solved at once for each choice.

Optuna is the *outer* loop only. Trials are asked ``batch`` at a time; the batch's outer points
(GPU kind, GPU count, hardware parameter overrides, see :mod:`dse.search_space`) go to
:class:`dse.inner.InnerSolver`, which evaluates every layout of the study for all of them in one
compiled call and returns each point's best layout; then the batch is told. Each trial reports
the study's objectives at its best layout, and its constraints with ``trial.set_constraint``
(Optuna 5; > 0 violates, relative to the bound): ``layout`` (1 when no layout runs), one per
study constraint, and ``max_power_kW`` when the search bounds the cluster power.

Storage is in memory by default (written next to the results at the end as a journal file), or a
journal file or an RDB URL that several processes share: ``--trials N`` is the size the study
should reach, so a rerun resumes where it stopped and each worker stops when the study is full
(concurrent workers may overshoot by up to one batch each). Every trial's best layout and metrics
are stored with it (user attribute ``hetersim``), so the results dataset is built from the storage
alone. A new NSGA-II or TPE study starts with the corners of the box (:func:`corner_points`).

Modules: :mod:`dse.optimize.storage` (samplers, storage, the Optuna study),
:mod:`dse.optimize.loop` (ask, solve, tell; :func:`run_optimize`), :mod:`dse.optimize.results`
(the trials dataset, its summary, the files written).
"""

from dse.optimize.loop import complete_mix, optimize_loop, record, run_optimize, suggest
from dse.optimize.results import (
    LAYOUT_COLUMNS,
    PRUNED_ATTR,
    RESULT_ATTR,
    STATES,
    describe_trial,
    output_path,
    save_journal,
    summarize,
    trials_dataset,
    write_atomic,
)
from dse.optimize.storage import (
    FINGERPRINT_ATTR,
    RDB_DIALECTS,
    SAMPLERS,
    check_sampler,
    check_storage,
    corner_points,
    fingerprint,
    make_sampler,
    open_storage,
    open_study,
    redact,
)

__all__ = [
    "FINGERPRINT_ATTR",
    "LAYOUT_COLUMNS",
    "PRUNED_ATTR",
    "RDB_DIALECTS",
    "RESULT_ATTR",
    "SAMPLERS",
    "STATES",
    "check_sampler",
    "check_storage",
    "complete_mix",
    "corner_points",
    "describe_trial",
    "fingerprint",
    "make_sampler",
    "open_storage",
    "open_study",
    "optimize_loop",
    "output_path",
    "record",
    "redact",
    "run_optimize",
    "save_journal",
    "suggest",
    "summarize",
    "trials_dataset",
    "write_atomic",
]
