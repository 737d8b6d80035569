"""The outer loop's Optuna side: samplers, storage (memory, journal file, RDB) and the study."""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path
from typing import Any

from dse.search_space import SearchSpace

SAMPLERS = ("auto", "nsga2", "tpe", "random", "grid")
RDB_DIALECTS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")
FINGERPRINT_ATTR = "hetersim_fingerprint"
CONSTRAINT_NAMES_ATTR = "hetersim_constraints"  # names of the trials' constraint values, in order


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
        return optuna.samplers.NSGAIISampler(population_size=16, seed=seed, **_constraints_kwargs())
    if name == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, seed=seed, constant_liar=True, **_constraints_kwargs())
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


def _constraints_kwargs() -> dict[str, Any]:
    """Optuna 5's samplers read each trial's stored constraints themselves (``constraints_func`` is
    deprecated there); Optuna 4's read them only through ``constraints_func``."""
    import optuna

    return {} if hasattr(optuna.trial.Trial, "set_constraint") else {"constraints_func": stored_constraints}


def stored_constraints(trial: Any) -> tuple[float, ...]:
    """The constraint values :func:`dse.optimize.loop.set_constraints` stored with a trial."""
    return tuple(trial.system_attrs.get("constraints") or ())


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
        study.set_user_attr(CONSTRAINT_NAMES_ATTR, space.constraint_names())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(space.objectives))  # plots and trials_dataframe say which is which
    elif stored != fingerprint(space):
        raise ValueError(
            f"--study-name {study_name}: the storage holds this study for another study file; "
            "use another --study-name or the same file"
        )
    return study
