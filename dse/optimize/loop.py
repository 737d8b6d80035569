"""The loop of a bilevel search: ask a batch of trials, solve their layouts at once, tell them."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dse import atomic
from dse.inner import InnerSolver
from dse.metrics import METRICS
from dse.optimize.results import (
    CONSTRAINTS_KEY,
    LAYOUT_COLUMNS,
    PRUNED_ATTR,
    RESULT_ATTR,
    output_path,
    save_journal,
    summarize,
    trials_dataset,
    write_atomic,
)
from dse.optimize.storage import (
    Heartbeat,
    check_sampler,
    check_storage,
    corner_points,
    fail_stale_trials,
    make_sampler,
    open_storage,
    open_study,
    redact,
)
from dse.search_space import SearchSpace, load_search
from dse.study import NAME_RE


def suggest(trial: Any, space: SearchSpace) -> dict[str, Any]:
    """The trial's outer point (every outer variable suggested, in :attr:`SearchSpace.outer` order)."""
    point: dict[str, Any] = {}
    for p in space.outer:
        if p.choices is not None:
            point[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        elif p.kind == "int":
            point[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        else:
            point[p.name] = trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)
    return point


def complete_mix(space: SearchSpace, point: dict[str, Any]) -> dict[str, Any] | None:
    """A ``search.mix`` trial's full outer point (the last kind's count derived, the mix's label
    and total added); None when no feasible mix has those counts (over the total or budget).
    Other points are returned as they are."""
    mix = space.mix
    if mix is None:
        return point
    counts = mix.complete([point[name] for name in mix.names[:-1]])
    if counts is None:
        return None
    return {**point, **mix.point(counts)}


def record(trial: Any, solver: InnerSolver, point: Mapping[str, Any], result: Mapping[str, np.ndarray], i: int):
    """Store the best layout and its metrics with the trial and set its constraints; return its values."""
    space = solver.space
    layout = solver.layout(int(result["index"][i]), int(point["n_gpus"]))
    stored = {
        **({"mix": {k: int(c) for k, c in point["mix"].items()}} if "mix" in point else {}),
        "layout": layout,
        "metrics": {name: _scalar(result[name][i]) for name in METRICS},
        "layout_class": int(result["cls"][i]),
        "n_layouts_runnable": int(result["n_runnable"][i]),
        "price_usd_per_hour": float(result["price_usd_per_hour"][i]),
        "power_kW": float(result["power_kW"][i]),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
    }
    trial.set_user_attr(RESULT_ATTR, stored)  # the whole record, read back by trials_dataset
    for key, value in flat_attrs(stored, layout).items():  # sortable columns in Optuna's own tools
        trial.set_user_attr(key, value)
    set_constraints(trial, [float(v) for v in result["constraints"][i]])
    return [float(result[o][i]) for o in space.objectives]


# Flat user attributes of every trial, besides the whole record (optuna-dashboard sorts and filters
# by them; each is one more storage write, about 4 ms on a journal file, so a few).
FLAT_LAYOUT = ("tp", "pp", "dp")
FLAT_METRICS = ("step_time_s", "mfu", "hbm_used_GiB")


def flat_attrs(stored: Mapping[str, Any], layout: Mapping[str, Any]) -> dict[str, Any]:
    """The layout (its label and tp, pp, dp), step time, MFU, HBM and layout class as scalars."""
    from hetersim import planfields

    out: dict[str, Any] = {"layout": planfields.layout_label(layout, names=[c for c in LAYOUT_COLUMNS if c in layout])}
    out.update({c: _plain(layout[c]) for c in FLAT_LAYOUT})
    out.update({name: stored["metrics"][name] for name in FLAT_METRICS})
    out["layout_class"] = stored["layout_class"]
    return out


def set_constraints(trial: Any, values: list[float]) -> None:
    """Store the constraint values under the key ``constraints_func`` writes (``constraints``, a list
    in :meth:`SearchSpace.constraint_names` order): what optuna-dashboard, ``study.best_trials``,
    ``optuna.visualization`` and the samplers read, in Optuna 4 and 5 alike (Optuna 5's
    ``FrozenTrial.constraints`` shows them as ``"0"``, ``"1"``, ...; the names are the study's user
    attribute ``hetersim_constraints``)."""
    trial.storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_KEY, values)


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _limit(space: SearchSpace) -> str:
    mix = space.mix
    assert mix is not None
    return f"{mix.total} GPUs" if mix.total is not None else f"${mix.budget:,.2f}/h"


def _scalar(x: Any) -> float | int:
    x = np.asarray(x)
    return int(x) if np.issubdtype(x.dtype, np.integer) else float(x)


def _active(study: Any) -> int:
    """Trials that count towards ``--trials``: every one asked and not failed. A waiting one (a
    corner enqueued by :func:`_enqueue_corners`) counts once a worker asks it: counted before, it
    would leave ``--trials`` at or below the number of corners with nothing asked at all."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return len(study.get_trials(deepcopy=False, states=states))


def _finished(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def optimize_loop(study: Any, solver: InnerSolver, trials: int, on_batch=None) -> int:
    """Ask, solve, tell in batches until the study holds ``trials`` trials; return how many this
    call added. Trials asked but not told when an exception (Ctrl-C) stops the loop are failed;
    the trials in flight carry this worker's heartbeat, so that a worker killed outright leaves
    trials the next batch of any worker fails (:func:`~dse.optimize.storage.fail_stale_trials`)."""
    with Heartbeat(study) as heartbeat:
        return _loop(study, solver, trials, on_batch, heartbeat)


def _loop(study: Any, solver: InnerSolver, trials: int, on_batch, heartbeat: Heartbeat) -> int:
    import optuna
    from optuna.trial import TrialState

    space = solver.space
    grid_size = math.prod(len(p.grid()) for p in space.outer) if space.discrete else None
    grid_cap = grid_size if isinstance(study.sampler, optuna.samplers.GridSampler) else None
    added = 0
    while True:
        fail_stale_trials(study)
        target = trials if grid_cap is None else min(trials, grid_cap)
        n = min(solver.batch, target - _active(study))
        if n <= 0:
            return added
        asked: list[Any] = []
        told = 0
        try:
            for _ in range(n):
                asked.append(study.ask())
                heartbeat.hold(asked[-1:])
            points = [complete_mix(space, suggest(t, space)) for t in asked]
            for trial, point in zip(asked, points, strict=True):
                if point is None:  # search.mix: the suggested counts leave no feasible mix
                    trial.set_user_attr(PRUNED_ATTR, f"no mix of {_limit(space)} has these counts")
            asked_ok = [t for t, p in zip(asked, points, strict=True) if p is not None]
            points_ok = [p for p in points if p is not None]
            result = solver.solve(points_ok) if points_ok else {}
            for trial in (t for t, p in zip(asked, points, strict=True) if p is None):
                study.tell(trial, state=TrialState.PRUNED)
                told += 1
            for i, (trial, point) in enumerate(zip(asked_ok, points_ok, strict=True)):
                values = record(trial, solver, point, result, i)
                study.tell(trial, values)
                told += 1
        except BaseException:
            heartbeat.release()
            for trial in asked:
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        heartbeat.release()
        added += n
        if on_batch is not None:
            on_batch(n)


def run_optimize(
    study_path: str | Path,
    trials: int,
    sampler: str = "auto",
    seed: int | None = 0,
    out: str | Path = "results",
    storage: str | None = None,
    study_name: str | None = None,
    batch: int = 32,
    progress: bool = True,
    cal: Any = None,
) -> dict[str, Any]:
    """Run (or resume, or join) an optimization; write the trials dataset; return its summary."""
    import optuna

    if trials < 0:
        raise ValueError(f"--trials must be >= 0; got {trials}")
    if batch < 1:
        raise ValueError(f"--batch must be a positive integer; got {batch}")
    check_sampler(sampler)
    check_storage(storage)
    if storage is not None and "://" not in storage and Path(storage).resolve() == Path(out).resolve():
        raise ValueError(f"--storage {storage} and --out {out} name one path; the journal is a file beside the results")
    space = load_search(study_path)
    if study_name is not None and not study_name.strip():
        raise ValueError("--study-name must not be empty (leave it out for the study's name)")
    name = study_name or space.name
    if not NAME_RE.match(name):
        raise ValueError(f"--study-name must be at most 200 letters, digits, '.', '_' or '-'; got {name!r}")
    atomic.check_nc_target(output_path(out, name), "--out")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seed = worker_seed(seed, storage)
    sampler_obj = make_sampler(sampler, space, seed)
    solver = InnerSolver(space, batch=batch, cal=cal)
    try:
        stored = _export_only(storage, name) if trials == 0 and storage is not None else open_storage(storage)
        study = open_study(space, stored, name, sampler_obj)
    except AssertionError:  # optuna's journal replay met records it cannot place
        raise ValueError(f"--storage {storage}: not an Optuna journal file (its records cannot be replayed)") from None
    _enqueue_corners(study, space, sampler_obj, trials, batch)

    t0 = time.perf_counter()
    before = _finished(study)
    bar = _progress(progress)
    with bar:
        task = bar.add_task(name, total=max(trials, before), completed=min(before, trials))
        added = optimize_loop(study, solver, trials, on_batch=lambda n: bar.advance(task, n))
    wall = time.perf_counter() - t0

    meta = {
        "sampler": sampler if sampler != "auto" else f"auto ({type(sampler_obj).__name__})",
        "seed": seed,
        "storage": redact(storage) if storage else "memory",
        "study_name": name,
        "batch": batch,
    }
    ds = trials_dataset(study, solver, meta)
    path = output_path(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(ds, path)
    journal = None
    if storage is None:
        journal = path.with_name(f"{name}.optuna.log")
        save_journal(study, journal)
    summary = summarize(ds)
    summary.update(
        path=str(path),
        journal=str(journal) if journal else None,
        wall_s=wall,
        trials_added=added,
        layouts_evaluated=solver.evaluated,
        layouts_per_point=solver.n_layouts,
        outer_size=space.outer_size,
    )
    return summary


def _export_only(storage: str, name: str) -> Any:
    """The storage a run of no trials writes from, opened without creating or adding anything:
    refused where the journal file does not exist or holds no trial of study ``name``."""
    import optuna

    if "://" not in storage and not Path(storage).expanduser().exists():
        raise ValueError(f"--storage {storage}: no such journal file (--trials 0 only writes what a storage holds)")
    stored = open_storage(storage)
    if not any(s.study_name == name and s.n_trials for s in optuna.get_all_study_summaries(stored, False)):
        raise ValueError(f"--storage {redact(storage)} holds no trial of study {name!r}; run it with --trials > 0")
    return stored


def worker_seed(seed: int | None, storage: str | None) -> int:
    """``seed``, or when None: 0 for a study in memory (a run reproduces), a fresh seed per worker
    for a shared storage (workers that join one study then sample different points)."""
    if seed is not None:
        return seed
    return 0 if storage is None else int.from_bytes(os.urandom(4), "little") >> 1


def _enqueue_corners(study: Any, space: SearchSpace, sampler: Any, trials: int, batch: int) -> None:
    """A new NSGA-II or TPE study starts with the corners of the box (when one batch holds them)."""
    import optuna

    corners = corner_points(space)
    evolving = isinstance(sampler, optuna.samplers.NSGAIISampler | optuna.samplers.TPESampler)
    if not study.trials and evolving and len(corners) <= batch:
        for params in corners[:trials]:
            study.enqueue_trial(params, skip_if_exists=True)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("optimize {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )
