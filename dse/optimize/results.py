"""The results of an optimization: every trial as an ``xarray.Dataset`` along ``trial``, and its summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dse import atomic
from dse.inner import InnerSolver
from dse.metrics import METRICS, cf_attrs
from dse.optimize.storage import fingerprint
from dse.pareto import pareto_mask
from dse.provenance import history
from dse.search_space import SearchSpace
from dse.study import PLAN_AXES
from dse.sweep.checkpoints import package_versions
from dse.sweep.dataset import COORD_ATTRS
from hetersim import planfields
from hetersim.types import Infeasible

STATES = ("running", "complete", "pruned", "fail", "waiting")  # optuna TrialState values 0..4
LAYOUT_COLUMNS = (*PLAN_AXES, "dp")
RESULT_ATTR = "hetersim"  # per trial: best layout, its metrics, class, price, power, worker
CONSTRAINTS_KEY = "constraints"  # the list constraints_func writes (optuna.study._constrained_optimization)
PRUNED_ATTR = "hetersim_pruned"  # why a search.mix trial was pruned (counts over total or budget)

Data = dict[str, tuple[Any, ...]]  # variable name -> (dims, values, attributes)


def output_path(out: str | Path, name: str) -> Path:
    """``out`` itself when it ends in ``.nc``, else ``out/<name>.optimize.nc`` (``t.nc`` names
    ``t.optimize.nc``); ``r.nc/`` is a folder (:func:`dse.atomic.nc_target`)."""
    return atomic.nc_target(out, f"{name.removesuffix('.nc')}.optimize.nc")


def trials_dataset(study: Any, solver: InnerSolver, meta: Mapping[str, Any]):
    """Every trial of ``study`` as an ``xarray.Dataset`` along ``trial``: outer parameters, the best
    layout (codes with CF flags), metrics, constraint values, state, feasibility and Pareto flag."""
    import xarray as xr

    space = solver.space
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    data: Data = {}
    state = np.array([int(t.state) for t in trials], np.int8)
    data["state"] = (("trial",), state, _flags("trial state (optuna)", STATES))
    stored = [t.user_attrs.get(RESULT_ATTR, {}) for t in trials]
    _outer_variables(data, space, trials, stored)
    _layout_variables(data, stored)
    _metric_variables(data, stored)
    names = space.constraint_names()
    cons = _constraint_variables(data, names, trials)
    _selection_variables(data, space, state, cons)

    variables = {k: xr.Variable(dims, arr, attrs) for k, (dims, arr, attrs) in data.items()}
    ds = xr.Dataset(variables, coords={"trial": ("trial", np.array([t.number for t in trials], np.int32))})
    ds.attrs.update(_trials_attrs(space, solver, meta, names))
    return ds


def _outer_variables(data: Data, space: SearchSpace, trials: Sequence[Any], stored: Sequence[Mapping]) -> None:
    """The outer point of each trial (of a ``search.mix``: every kind's count and the total)."""
    if space.mix is not None:
        for kind, name in zip(space.mix.kinds, space.mix.names, strict=True):
            counts = [r.get("mix", {}).get(kind, t.params.get(name, -1)) for r, t in zip(stored, trials, strict=True)]
            attrs = cf_attrs("1", f"GPUs of kind {kind} in the mix")
            data[name] = (("trial",), np.array(counts, np.int32), attrs)
        totals = [sum(r["mix"].values()) if "mix" in r else -1 for r in stored]
        data["n_gpus"] = (("trial",), np.array(totals, np.int32), cf_attrs("1", COORD_ATTRS["n_gpus"][0]))
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
            data[p.name] = (("trial",), arr, cf_attrs(COORD_ATTRS[p.name][1], COORD_ATTRS[p.name][0]))
        else:
            arr = np.array([v if v is not None else np.nan for v in values], np.float64)
            assert p.param is not None
            attrs = cf_attrs(p.param.units, f"searched hardware parameter {p.param.path}")
            data[p.name] = (("trial",), arr, attrs)


def _layout_variables(data: Data, stored: Sequence[Mapping]) -> None:
    """Each trial's best layout (categoricals as codes with CF flags; -1 where none)."""
    layouts = [r.get("layout") for r in stored]
    for c in LAYOUT_COLUMNS:
        long_name, units = COORD_ATTRS[c]
        attrs = cf_attrs(units, f"best layout: {long_name}")
        if planfields.BY_NAME[c].coded:
            labels = planfields.BY_NAME[c].names or ("off", "on")
            codes = [planfields.encode(c, lay[c]) if lay else -1 for lay in layouts]
            data[c] = (("trial",), np.array(codes, np.int8), {**attrs, **_flags(attrs["long_name"], labels)})
        else:
            data[c] = (("trial",), np.array([lay[c] if lay else -1 for lay in layouts], np.int32), attrs)


def _metric_variables(data: Data, stored: Sequence[Mapping]) -> None:
    """Every metric at the best layout, then price, power, layout class and runnable layouts."""
    metrics = [r.get("metrics") for r in stored]
    for name, m in METRICS.items():
        if m.dtype == "i4":
            arr = np.array([mt[name] if mt else -1 for mt in metrics], np.int32)
        else:
            arr = np.array([mt[name] if mt else np.nan for mt in metrics], np.float64)
        data[name] = (("trial",), arr, cf_attrs(m.units, m.long_name))

    extras = (
        ("price_usd_per_hour", "USD/h", "price per GPU-hour (catalog, overrides and price model)", np.float64),
        ("power_kW", "kW", "GPU power of the cluster (n_gpus * tdp_W)", np.float64),
        ("layout_class", "1", "0 meets constraints, 1 violates one, 2 no layout runs, 3 none divides", np.int8),
        ("n_layouts_runnable", "1", "layouts of the inner space that run on this hardware", np.int32),
    )
    for key, units, long_name, dtype in extras:
        fill = np.nan if dtype is np.float64 else -1
        arr = np.array([r.get(key, fill) for r in stored], dtype)
        data[key] = (("trial",), arr, cf_attrs(units, long_name))


def _constraint_variables(data: Data, names: Sequence[str], trials: Sequence[Any]) -> np.ndarray:
    """``constraint_<key>`` per constraint; returns them as trials x constraints (NaN: not set)."""
    cons = np.full((len(trials), len(names)), np.nan)
    for i, t in enumerate(trials):
        cons[i] = trial_constraints(t, names)
    for j, key in enumerate(names):
        long_name = f"constraint {key}: relative violation (> 0 violates)"
        data[f"constraint_{key}"] = (("trial",), cons[:, j], {"units": "1", "long_name": long_name})
    return cons


def trial_constraints(trial: Any, names: Sequence[str]) -> np.ndarray:
    """A trial's constraint values in ``names`` order (NaN: not set): the list under
    :data:`CONSTRAINTS_KEY`, or, in a study written before, Optuna 5's per-name keys."""
    system = trial.system_attrs
    values = system.get(CONSTRAINTS_KEY)
    if values is not None and len(values) == len(names):
        return np.asarray(values, np.float64)
    return np.array([system.get(f"{CONSTRAINTS_KEY}:{key}", np.nan) for key in names], np.float64)


def _selection_variables(data: Data, space: SearchSpace, state: np.ndarray, cons: np.ndarray) -> None:
    """``feasible`` (complete, every constraint met) and ``pareto`` (on the front of the feasible)."""
    complete = state == 1
    feasible = complete & np.all(np.nan_to_num(cons, nan=1.0) <= 0, axis=1)
    data["feasible"] = (
        ("trial",),
        feasible.astype(np.int8),
        _flags("complete and meets every constraint", ("no", "yes")),
    )
    values = np.stack([data[o][1].astype(np.float64) for o in space.objectives], axis=1)
    senses = [METRICS[o].sense for o in space.objectives]
    pareto = np.zeros(len(state), dtype=bool)
    if feasible.any():
        pareto[np.flatnonzero(feasible)[pareto_mask(values[feasible], senses)]] = True
    data["pareto"] = (("trial",), pareto.astype(np.int8), _flags("on the Pareto set of feasible trials", ("no", "yes")))


def _trials_attrs(space: SearchSpace, solver: InnerSolver, meta: Mapping[str, Any], names: Sequence[str]) -> dict:
    return {
        "title": f"HeterSim optimize: {meta.get('study_name', space.name)}",
        "Conventions": "CF-1.8",
        "source": "HeterSim bilevel search (Optuna outer loop, vectorized layout solve per trial)",
        "history": history(),
        "study_name": str(meta.get("study_name", space.name)),
        "study_toml": space.text,
        "objectives": " ".join(space.objectives),
        "objective_senses": " ".join(METRICS[o].sense for o in space.objectives),
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
    """netCDF4 (zlib), written atomically (:mod:`dse.atomic`)."""
    encoding = {k: {"zlib": True, "complevel": 1} for k in ds.data_vars}
    atomic.atomic_write(path, lambda tmp: ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding))


def save_journal(study: Any, path: Path) -> None:
    """Copy an (in-memory) study to a journal file that Optuna can load (``--storage PATH``)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    def write(tmp: Path) -> None:
        tmp.unlink()  # the journal starts a file of its own
        target = optuna.storages.JournalStorage(JournalFileBackend(str(tmp)))
        optuna.copy_study(
            from_study_name=study.study_name,
            from_storage=study._storage,
            to_storage=target,
            to_study_name=study.study_name,
        )

    atomic.atomic_write(path, write)


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
    # Why the complete trials that are not feasible are not: each search constraint they violate
    # (constraint_<key> > 0), and for a trial none of whose layouts runs, the flags of the layout
    # it stored (hetersim.types.Infeasible, by name, as the sweep's summary counts them).
    bad = complete & ~feasible
    cons = {str(k)[len("constraint_") :]: ds[k].values[bad] for k in ds.data_vars if str(k).startswith("constraint_")}
    reasons = {f"constraint {k}": int(np.count_nonzero(~(v <= 0))) for k, v in cons.items() if k != "layout"}
    no_layout = ~(cons["layout"] <= 0) if "layout" in cons else np.ones(int(bad.sum()), bool)
    flags = ds.infeasible.values.astype(np.int64)[bad][no_layout]
    reasons |= Infeasible.counts(flags)
    return {
        "study": ds.attrs["study_name"],
        "objectives": objectives,
        "n_trials": int(len(state)),
        "states": {s: int(np.count_nonzero(state == k)) for k, s in enumerate(STATES) if np.any(state == k)},
        "n_feasible": int(feasible.sum()),
        "infeasible_reasons": {k: v for k, v in reasons.items() if v},
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
