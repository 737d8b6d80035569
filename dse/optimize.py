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
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dse.inner import InnerSolver
from dse.metrics import METRICS
from dse.pareto import pareto_mask
from dse.search_space import SearchSpace, load_search
from dse.study import CATEGORICAL, PLAN_AXES
from dse.sweep.checkpoints import package_versions
from dse.sweep.dataset import COORD_ATTRS

SAMPLERS = ("auto", "nsga2", "tpe", "random", "grid")
RDB_DIALECTS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")
STATES = ("running", "complete", "pruned", "fail", "waiting")  # optuna TrialState values 0..4
LAYOUT_COLUMNS = (*PLAN_AXES, "dp")
FINGERPRINT_ATTR = "hetersim_fingerprint"
RESULT_ATTR = "hetersim"  # per trial: best layout, its metrics, class, price, power, worker
PRUNED_ATTR = "hetersim_pruned"  # why a search.mix trial was pruned (counts over total or budget)


# --------------------------------------------------------------------------------------------
# Samplers and storage
# --------------------------------------------------------------------------------------------


def check_sampler(name: str) -> None:
    if name not in SAMPLERS:
        raise ValueError(f"--sampler must be one of {', '.join(SAMPLERS)}; got {name!r}")


def make_sampler(name: str, space: SearchSpace, seed: int):
    """The Optuna sampler called ``name`` (``auto``: NSGA-II for several objectives, else TPE)."""
    import optuna

    check_sampler(name)
    if name == "auto":
        name = "nsga2" if len(space.objectives) > 1 else "tpe"
    if name == "nsga2":
        # On the example study (4 outer variables, 384 trials, 10 seeds, corners enqueued) a
        # population of 16 gave the best hypervolume; 8, 12, 24 and 32 did worse.
        return optuna.samplers.NSGAIISampler(population_size=16, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, seed=seed, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if not space.discrete:
        continuous = ", ".join(f"search.{p.name}" for p in space.outer if not p.discrete)
        raise ValueError(f"--sampler grid needs a discrete space; give a step to {continuous}")
    size = space.outer_size or 0
    if size > 1_000_000:
        raise ValueError(f"--sampler grid: the outer grid has {size:,} points; use nsga2, tpe or random")

    class BatchGridSampler(optuna.samplers.GridSampler):
        """GridSampler for ask/tell: :func:`optimize_loop` stops at the grid's size itself
        (``GridSampler.after_trial`` calls ``Study.stop``, which works only inside ``optimize``)."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return BatchGridSampler({p.name: list(p.grid()) for p in space.outer}, seed=seed)


def check_storage(storage: str | None) -> None:
    """A one-line ``ValueError`` for a storage the command cannot use (before any work)."""
    if storage is None:
        return
    if not storage.strip():
        raise ValueError("--storage must be a journal file path or an RDB URL; got an empty string")
    scheme, found, _ = storage.partition("://")
    if found:
        dialect = scheme.split("+", 1)[0].lower()
        if dialect not in RDB_DIALECTS:
            raise ValueError(
                f"--storage: unknown URL scheme {scheme!r}; give a journal file path or an RDB URL "
                "(sqlite:///x.db, postgresql://user@host/db, mysql://...)"
            )
        return
    parent = Path(storage).expanduser().resolve().parent
    if not parent.is_dir():
        raise ValueError(f"--storage {storage}: folder {parent} does not exist")
    if Path(storage).is_dir():
        raise ValueError(f"--storage {storage}: is a folder; give a journal file path")


def open_storage(storage: str | None):
    """In-memory (None), an Optuna RDB URL, or a journal file shared through file locks."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    check_storage(storage)
    if storage is None:
        return optuna.storages.InMemoryStorage()
    if "://" in storage:
        try:
            return optuna.storages.RDBStorage(storage)
        except ImportError as error:
            raise ValueError(f"--storage {redact(storage)}: {error}") from None
        except Exception as error:  # sqlalchemy's errors: bad URL, cannot connect, missing driver
            line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"--storage {redact(storage)}: cannot open ({line})") from None
    return optuna.storages.JournalStorage(JournalFileBackend(str(Path(storage).expanduser())))


def redact(url: str | None) -> str:
    """A storage URL without its password."""
    return "" if url is None else re.sub(r"(//[^:/@]*):[^@/]*@", r"\1:***@", url)


def fingerprint(space: SearchSpace) -> str:
    return hashlib.sha256(space.text.encode()).hexdigest()[:16]


def corner_points(space: SearchSpace) -> list[dict[str, Any]]:
    """The box's two corners (every range at its low end, every range at its high end) for each
    combination of the categorical variables: the cheapest and the fastest hardware of each kind
    when more of a resource is faster and costs more. A new study starts with them (NSGA-II, TPE)."""
    import itertools

    categorical = [p for p in space.outer if p.choices is not None and p.name in ("gpu", "model")]
    ranges = [p for p in space.outer if p not in categorical]
    out = []
    for combo in itertools.product(*(p.choices or () for p in categorical)):
        base = {p.name: v for p, v in zip(categorical, combo, strict=True)}
        for end in (0, -1):
            out.append({**base, **{p.name: p.grid()[end] if p.discrete else (p.low, p.high)[end] for p in ranges}})
    return out


def open_study(space: SearchSpace, storage: Any, study_name: str, sampler: Any):
    import optuna

    try:
        study = optuna.create_study(
            storage=storage,
            sampler=sampler,
            study_name=study_name,
            directions=space.directions,
            load_if_exists=True,
        )
    except ValueError as error:
        raise ValueError(f"--study-name {study_name}: {error}") from None
    stored = study.user_attrs.get(FINGERPRINT_ATTR)
    if stored is None:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint(space))
        study.set_user_attr("hetersim_study_toml", space.text)
    elif stored != fingerprint(space):
        raise ValueError(
            f"--study-name {study_name}: the storage holds this study for another study file; "
            "use another --study-name or the same file"
        )
    return study


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


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
    trial.set_user_attr(RESULT_ATTR, stored)  # one storage write: journals are shared through a lock
    for name, value in zip(space.constraint_names(), result["constraints"][i], strict=True):
        trial.set_constraint(name, float(value))
    return [float(result[o][i]) for o in space.objectives]


def _limit(space: SearchSpace) -> str:
    mix = space.mix
    assert mix is not None
    return f"{mix.total} GPUs" if mix.total is not None else f"${mix.budget:,.2f}/h"


def _scalar(x: Any) -> float | int:
    x = np.asarray(x)
    return int(x) if np.issubdtype(x.dtype, np.integer) else float(x)


def _active(study: Any) -> int:
    """Trials that count towards ``--trials``: every one not failed."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    return len(study.get_trials(deepcopy=False, states=states))


def _finished(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def optimize_loop(study: Any, solver: InnerSolver, trials: int, on_batch=None) -> int:
    """Ask, solve, tell in batches until the study holds ``trials`` trials; return how many this
    call added. Trials asked but not told when an exception (Ctrl-C) stops the loop are failed."""
    import optuna
    from optuna.trial import TrialState

    space = solver.space
    grid_size = math.prod(len(p.grid()) for p in space.outer) if space.discrete else None
    grid_cap = grid_size if isinstance(study.sampler, optuna.samplers.GridSampler) else None
    added = 0
    while True:
        target = trials if grid_cap is None else min(trials, grid_cap)
        n = min(solver.batch, target - _active(study))
        if n <= 0:
            return added
        asked: list[Any] = []
        told = 0
        try:
            for _ in range(n):
                asked.append(study.ask())
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
            for trial in asked:
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        added += n
        if on_batch is not None:
            on_batch(n)


def run_optimize(
    study_path: str | Path,
    trials: int,
    sampler: str = "auto",
    seed: int = 0,
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
    space = load_search(study_path)
    name = study_name or space.name
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
        raise ValueError(f"--study-name must be letters, digits, '.', '_' or '-'; got {name!r}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler_obj = make_sampler(sampler, space, seed)
    solver = InnerSolver(space, batch=batch, cal=cal)
    study = open_study(space, open_storage(storage), name, sampler_obj)

    corners = corner_points(space)
    evolving = isinstance(sampler_obj, optuna.samplers.NSGAIISampler | optuna.samplers.TPESampler)
    if not study.trials and evolving and len(corners) <= batch:
        for params in corners[:trials]:
            study.enqueue_trial(params, skip_if_exists=True)

    t0 = time.perf_counter()
    before = _finished(study)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("optimize {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not progress,
    )
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


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


def output_path(out: str | Path, name: str) -> Path:
    """``out`` itself when it ends in ``.nc``, else ``out/<name>.optimize.nc``."""
    out = Path(out)
    return out if out.suffix == ".nc" else out / f"{name}.optimize.nc"


def trials_dataset(study: Any, solver: InnerSolver, meta: Mapping[str, Any]):
    """Every trial of ``study`` as an ``xarray.Dataset`` along ``trial``: outer parameters, the best
    layout (codes with CF flags), metrics, constraint values, state, feasibility and Pareto flag."""
    import xarray as xr

    space = solver.space
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    n = len(trials)
    data: dict[str, tuple[Any, ...]] = {}

    state = np.array([int(t.state) for t in trials], np.int8)
    data["state"] = (("trial",), state, _flags("trial state (optuna)", STATES))

    stored = [t.user_attrs.get(RESULT_ATTR, {}) for t in trials]
    if space.mix is not None:
        for kind, name in zip(space.mix.kinds, space.mix.names, strict=True):
            counts = [r.get("mix", {}).get(kind, t.params.get(name, -1)) for r, t in zip(stored, trials, strict=True)]
            attrs = {"long_name": f"GPUs of kind {kind} in the mix", "units": "1"}
            data[name] = (("trial",), np.array(counts, np.int32), attrs)
        totals = [sum(r["mix"].values()) if "mix" in r else -1 for r in stored]
        data["n_gpus"] = (("trial",), np.array(totals, np.int32), {"long_name": COORD_ATTRS["n_gpus"][0], "units": "1"})
    for p in space.outer:
        values = [t.params.get(p.name) for t in trials]
        if space.mix is not None and p.name != "model":
            continue  # written above, with the derived last kind
        if p.name in ("gpu", "model"):
            labels = list(p.choices or ())
            codes = np.array([labels.index(v) if v is not None else -1 for v in values], np.int8)
            data[p.name] = (("trial",), codes, _flags(COORD_ATTRS[p.name][0], labels))
        elif p.kind == "int":
            arr = np.array([v if v is not None else -1 for v in values], np.int32)
            data[p.name] = (("trial",), arr, {"long_name": COORD_ATTRS[p.name][0], "units": "1"})
        else:
            arr = np.array([v if v is not None else np.nan for v in values], np.float64)
            assert p.param is not None
            attrs = {"long_name": f"searched hardware parameter {p.param.path}", "units": p.param.units}
            data[p.name] = (("trial",), arr, attrs)

    layouts = [r.get("layout") for r in stored]
    for c in LAYOUT_COLUMNS:
        long_name, units = COORD_ATTRS[c]
        attrs = {"long_name": f"best layout: {long_name}", "units": units}
        if c in CATEGORICAL or c == "sp":
            labels = CATEGORICAL.get(c, ("off", "on"))
            codes = [(labels.index(lay[c]) if c in CATEGORICAL else int(lay[c])) if lay else -1 for lay in layouts]
            data[c] = (("trial",), np.array(codes, np.int8), {**attrs, **_flags(attrs["long_name"], labels)})
        else:
            data[c] = (("trial",), np.array([lay[c] if lay else -1 for lay in layouts], np.int32), attrs)

    metrics = [r.get("metrics") for r in stored]
    for name, m in METRICS.items():
        if m.dtype == "i4":
            arr = np.array([mt[name] if mt else -1 for mt in metrics], np.int32)
        else:
            arr = np.array([mt[name] if mt else np.nan for mt in metrics], np.float64)
        data[name] = (("trial",), arr, {"units": m.units, "long_name": m.long_name})

    extras = (
        ("price_usd_per_hour", "USD/h", "price per GPU-hour (catalog, overrides and price model)", np.float64),
        ("power_kW", "kW", "GPU power of the cluster (n_gpus * tdp_W)", np.float64),
        ("layout_class", "1", "0 meets constraints, 1 violates one, 2 no layout runs, 3 none divides", np.int8),
        ("n_layouts_runnable", "1", "layouts of the inner space that run on this hardware", np.int32),
    )
    for key, units, long_name, dtype in extras:
        fill = np.nan if dtype is np.float64 else -1
        arr = np.array([r.get(key, fill) for r in stored], dtype)
        data[key] = (("trial",), arr, {"units": units, "long_name": long_name})

    names = space.constraint_names()
    cons = np.full((n, len(names)), np.nan)
    for i, t in enumerate(trials):
        for j, key in enumerate(names):
            cons[i, j] = t.constraints.get(key, np.nan)
    for j, key in enumerate(names):
        long_name = f"constraint {key}: relative violation (> 0 violates)"
        data[f"constraint_{key}"] = (("trial",), cons[:, j], {"units": "1", "long_name": long_name})

    complete = state == 1
    feasible = complete & np.all(np.nan_to_num(cons, nan=1.0) <= 0, axis=1)
    data["feasible"] = (
        ("trial",),
        feasible.astype(np.int8),
        _flags("complete and meets every constraint", ("no", "yes")),
    )
    values = np.stack([data[o][1].astype(np.float64) for o in space.objectives], axis=1)
    senses = [METRICS[o].sense for o in space.objectives]
    pareto = np.zeros(n, dtype=bool)
    if feasible.any():
        pareto[np.flatnonzero(feasible)[pareto_mask(values[feasible], senses)]] = True
    data["pareto"] = (("trial",), pareto.astype(np.int8), _flags("on the Pareto set of feasible trials", ("no", "yes")))

    variables = {k: xr.Variable(dims, arr, attrs) for k, (dims, arr, attrs) in data.items()}
    ds = xr.Dataset(variables, coords={"trial": ("trial", np.array([t.number for t in trials], np.int32))})
    ds.attrs.update(
        {
            "title": f"HeterSim optimize: {meta.get('study_name', space.name)}",
            "Conventions": "CF-1.8",
            "source": "HeterSim bilevel search (Optuna outer loop, vectorized layout solve per trial)",
            "study_name": str(meta.get("study_name", space.name)),
            "study_toml": space.text,
            "objectives": " ".join(space.objectives),
            "objective_senses": " ".join(senses),
            "constraints": " ".join(names),
            "search_space": _json(space.describe()),
            "outer_variables": " ".join(_outer_names(space)),
            "sampler": str(meta.get("sampler", "")),
            "seed": int(meta.get("seed", 0)),
            "storage": str(meta.get("storage", "")),
            "batch": int(meta.get("batch", solver.batch)),
            "layouts_per_point": solver.n_layouts,
            "outer_size": -1 if space.outer_size is None else space.outer_size,
            "fingerprint": fingerprint(space),
            **{f"{k}_version": v for k, v in package_versions().items()},
            "optuna_version": _optuna_version(),
        }
    )
    return ds


def _outer_names(space: SearchSpace) -> list[str]:
    """The dataset's outer variables: every kind's count for a ``search.mix`` (the last derived)."""
    if space.mix is None:
        return [p.name for p in space.outer]
    return [p.name for p in space.outer if p.name == "model"] + list(space.mix.names)


def _flags(long_name: str, labels: Sequence[str]) -> dict[str, Any]:
    return {
        "long_name": long_name,
        "units": "1",
        "flag_values": np.arange(len(labels), dtype=np.int8),
        "flag_meanings": " ".join(str(x).replace(" ", "_") for x in labels),
    }


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, sort_keys=True)


def _optuna_version() -> str:
    import optuna

    return optuna.__version__


def write_atomic(ds: Any, path: Path) -> None:
    """netCDF4 (zlib) at a temporary name in the same folder, then ``os.replace``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    encoding = {k: {"zlib": True, "complevel": 1} for k in ds.data_vars}
    try:
        ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_journal(study: Any, path: Path) -> None:
    """Copy an (in-memory) study to a journal file that Optuna can load (``--storage PATH``)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        target = optuna.storages.JournalStorage(JournalFileBackend(str(tmp)))
        optuna.copy_study(
            from_study_name=study.study_name,
            from_storage=study._storage,
            to_storage=target,
            to_study_name=study.study_name,
        )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def describe_trial(ds: Any, i: int) -> dict[str, Any]:
    """Outer point and best layout of row ``i`` with names for codes."""
    out: dict[str, Any] = {"trial": int(ds.trial.values[i])}
    skip = {"state", "feasible", "pareto", "layout_class"}
    for name, var in ds.data_vars.items():
        if name in METRICS or name.startswith("constraint_") or name in skip:
            continue
        value = var.values[i]
        if "flag_meanings" in var.attrs and int(value) >= 0:
            value = var.attrs["flag_meanings"].split()[int(value)]
        elif np.issubdtype(np.asarray(value).dtype, np.integer):
            value = int(value)
        else:
            value = float(value)
        out[name] = value
    return out


def summarize(ds: Any) -> dict[str, Any]:
    """Counts per state, feasible and Pareto trials, the best trial per objective, the Pareto set."""
    state = ds.state.values
    objectives = ds.attrs["objectives"].split()
    feasible = ds.feasible.values.astype(bool)
    best: dict[str, Any] = {}
    for o in objectives:
        if not feasible.any():
            best[o] = None
            continue
        v = ds[o].values.astype(np.float64)
        sense = METRICS[o].sense
        i = int(np.argmin(np.where(feasible, v if sense == "min" else -v, np.inf)))
        best[o] = {"value": float(v[i]), "units": METRICS[o].units, "sense": sense, **describe_trial(ds, i)}
    outer = ds.attrs["outer_variables"].split()
    pareto = np.flatnonzero(ds.pareto.values.astype(bool))
    pareto = pareto[np.argsort(ds[objectives[0]].values[pareto], kind="stable")]
    front, seen = [], set()
    for i in pareto:  # one row per distinct outer point (a sampler may propose a point again)
        row = describe_trial(ds, int(i))
        key = tuple(row[k] for k in outer)
        if key not in seen:
            seen.add(key)
            front.append({**row, **{o: float(ds[o].values[i]) for o in objectives}})
    complete = state == 1
    distinct = {tuple(ds[k].values[i].item() for k in outer) for i in np.flatnonzero(complete)}
    return {
        "study": ds.attrs["study_name"],
        "objectives": objectives,
        "n_trials": int(len(state)),
        "states": {s: int(np.count_nonzero(state == k)) for k, s in enumerate(STATES) if np.any(state == k)},
        "n_feasible": int(feasible.sum()),
        "n_pareto": int(len(pareto)),
        "n_pareto_distinct": len(front),
        "n_distinct_points": len(distinct),
        "outer": outer,
        "sampler": ds.attrs["sampler"],
        "seed": int(ds.attrs["seed"]),
        "storage": ds.attrs["storage"],
        "best": best,
        "pareto": front,
    }
