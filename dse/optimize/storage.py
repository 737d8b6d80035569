"""The outer loop's Optuna side: samplers, storage (memory, journal file, RDB) and the study."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import threading
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dse.atomic import check_target
from dse.search_space import SearchSpace
from dse.sweep.checkpoints import warn

SAMPLERS = ("auto", "nsga2", "tpe", "random", "grid")
RDB_DIALECTS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")
FINGERPRINT_ATTR = "hetersim_fingerprint"
CONSTRAINT_NAMES_ATTR = "hetersim_constraints"  # names of the trials' constraint values, in order
# A worker killed while its trials run (SIGKILL, a lost machine) cannot fail them; they would stay
# RUNNING, and count towards --trials, forever. Each worker beats every HEARTBEAT_S seconds for the
# trials it holds; a rerun or another worker fails trials whose last beat is GRACE_S old, or whose
# worker on this host is gone. RDB storages use Optuna's own heartbeat (fail_stale_trials); other
# storages (the journal file) the system attributes below.
HEARTBEAT_S = 20
GRACE_S = 120
WORKER_ATTR = "hetersim_worker"  # "host:pid" of the worker that asked the trial
BEAT_ATTR = "hetersim_heartbeat"  # its last beat, seconds since the epoch


@contextlib.contextmanager
def experimental_ok():
    """Optuna features this project uses knowingly and Optuna marks experimental (multivariate TPE,
    constant_liar and constraints_func in Optuna 4, RDB heartbeats, metric names): their
    ExperimentalWarning at every use is no news to the user, so it stays off stderr."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def check_sampler(name: str) -> None:
    if name not in SAMPLERS:
        raise ValueError(f"--sampler must be one of {', '.join(SAMPLERS)}; got {name!r}")


def make_sampler(name: str, space: SearchSpace, seed: int):
    """The Optuna sampler called ``name`` (``auto``: NSGA-II for several objectives, else TPE)."""
    import optuna

    check_sampler(name)
    if name == "auto":
        name = "nsga2" if len(space.objectives) > 1 else "tpe"
    with experimental_ok():
        if name == "nsga2":
            # On the example study (4 outer variables, 384 trials, 10 seeds, corners enqueued) a
            # population of 16 gave the best hypervolume; 8, 12, 24 and 32 did worse.
            return optuna.samplers.NSGAIISampler(population_size=16, seed=seed, **_constraints_kwargs())
        if name == "tpe":
            kw = _constraints_kwargs()
            return optuna.samplers.TPESampler(multivariate=True, seed=seed, constant_liar=True, **kw)
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
    if storage.endswith(("/", os.sep)):
        raise ValueError(f"--storage {storage}: names a folder; give a journal file path")
    parent = Path(storage).expanduser().resolve().parent
    if not parent.is_dir():
        raise ValueError(f"--storage {storage}: folder {parent} does not exist")
    if Path(storage).is_dir():
        raise ValueError(f"--storage {storage}: is a folder; give a journal file path")
    check_target(Path(storage).expanduser(), "--storage")  # a device, or a folder no file can be made in
    _check_journal(Path(storage).expanduser(), storage)


def _check_journal(path: Path, storage: str) -> None:
    """An existing journal must be Optuna's, one JSON record a line, before anything is appended
    to it: optuna replays a foreign file with an assertion error, or after appending to it. A last
    line that opens a record without its newline is one another worker is writing: left to the replay."""
    if not path.is_file():
        return
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n") and raw.lstrip().startswith(b"{"):
                break
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            if not isinstance(record, dict) or "op_code" not in record:
                message = f"not an Optuna journal file (line {number} is no journal record)"
                raise ValueError(f"--storage {storage}: {message}")


def _drop_cut_record(path: Path, storage: str) -> None:
    """A journal whose last record has no newline while this process holds Optuna's own lock on
    it: no worker is writing (Optuna appends whole records under that lock,
    ``JournalFileBackend.append_logs``), so a crash cut that record short. Optuna's replay skips it
    (``read_logs``), then appends the next record onto it, which makes one line of two and a
    journal the next replay refuses. The cut record is dropped, with a warning."""
    from optuna.storages.journal import JournalFileSymlinkLock

    if not path.is_file() or path.stat().st_size == 0:
        return
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        with path.open("rb+") as handle:
            size = handle.seek(0, os.SEEK_END)
            end = size
            while end > 0:  # back to the last newline, a block at a time
                start = max(0, end - 65536)
                handle.seek(start)
                block = handle.read(end - start)
                if start + len(block) == size and block.endswith(b"\n"):
                    return
                found = block.rfind(b"\n")
                if found >= 0:
                    end = start + found + 1
                    break
                end = start
            handle.truncate(end)
    finally:
        lock.release()
    warn(f"--storage {storage}: dropped its last record, cut short by a crash ({size - end} bytes)")


def open_storage(storage: str | None):
    """In-memory (None), an Optuna RDB URL, or a journal file shared through file locks."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    check_storage(storage)
    if storage is None:
        return optuna.storages.InMemoryStorage()
    if "://" in storage:
        try:
            with experimental_ok():
                return optuna.storages.RDBStorage(storage, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
        except ImportError:  # Optuna's "Please install appropriate one." names no driver
            scheme = storage.partition("://")[0]
            raise ValueError(
                f"--storage {redact(storage)}: SQLAlchemy's driver for {scheme!r} is not installed; install it "
                "(mysql: mysqlclient or PyMySQL, postgresql: psycopg2), or give sqlite:///FILE or a journal file"
            ) from None
        except Exception as error:  # sqlalchemy's errors: bad URL, cannot connect, missing driver
            line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"--storage {redact(storage)}: cannot open ({line})") from None
    path = Path(storage).expanduser()
    _drop_cut_record(path, storage)
    try:  # the journal is replayed here: a damaged or foreign file fails now, named
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    except (ValueError, UnicodeDecodeError) as error:  # json's errors are ValueErrors
        line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"--storage {storage}: not an Optuna journal file ({line})") from None


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _optuna_heartbeat(storage: Any) -> bool:
    from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

    return isinstance(storage, BaseHeartbeat) and is_heartbeat_enabled(storage)


def _gone(worker: str) -> bool:
    """Whether ``host:pid`` names a process of this host that no longer runs."""
    host, _, pid = str(worker).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process of another user
        return False
    return False


def fail_stale_trials(study: Any, now: float | None = None) -> list[int]:
    """Fail the RUNNING trials of workers that are gone (killed, or silent for :data:`GRACE_S`);
    return their numbers. Trials another worker still beats for are left alone."""
    import optuna
    from optuna.trial import TrialState

    storage = study._storage
    if _optuna_heartbeat(storage):
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        return sorted(before - after)
    now = time.time() if now is None else now
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker, beat = trial.system_attrs.get(WORKER_ATTR), trial.system_attrs.get(BEAT_ATTR)
        if beat is None:  # its worker died between ask and its first beat: judged by its start
            start = trial.datetime_start
            beat = start.timestamp() if start is not None else now
        if worker == worker_id() or not ((worker is not None and _gone(worker)) or now - float(beat) > GRACE_S):
            continue
        try:
            if storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                failed.append(trial.number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker finished or failed it first
    return failed


class Heartbeat:
    """Beats for the trials this worker holds, every :data:`HEARTBEAT_S` seconds, from a thread.
    ``hold(trials)`` adds asked trials (and marks them with this worker), ``release()`` drops all."""

    def __init__(self, study: Any, interval: float = HEARTBEAT_S):
        self.storage = study._storage
        self.native = _optuna_heartbeat(self.storage)
        self.interval = interval
        self.ids: list[int] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hetersim-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def hold(self, trials: Iterable[Any]) -> None:
        """Beat for ``trials`` too (call right after ``ask``: a worker killed before leaves a trial
        only the grace period can fail)."""
        ids = [t._trial_id for t in trials]
        now = time.time()
        for trial_id in ids:
            if self.native:
                self.storage.record_heartbeat(trial_id)
            else:
                self.storage.set_trial_system_attr(trial_id, WORKER_ATTR, worker_id())
                self.storage.set_trial_system_attr(trial_id, BEAT_ATTR, now)
        with self.lock:
            self.ids.extend(ids)

    def release(self) -> None:
        with self.lock:
            self.ids = []

    def beat(self) -> None:
        with self.lock:
            ids = list(self.ids)
        now = time.time()
        for trial_id in ids:
            try:
                if self.native:
                    self.storage.record_heartbeat(trial_id)
                else:
                    self.storage.set_trial_system_attr(trial_id, BEAT_ATTR, now)
            except Exception:  # a trial told meanwhile refuses attributes; the next beat skips it
                pass

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            self.beat()


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

    # A study the storage holds is loaded, never created again: Optuna's create_study with
    # load_if_exists appends a create record before it finds the name taken, and a run refused
    # below must leave a journal that workers share as it was.
    held = study_name in optuna.get_all_study_names(storage)  # names only: no trial is read
    try:
        if held:
            study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
        else:
            directions = space.directions  # load_if_exists: another worker may create it first
            study = optuna.create_study(
                storage=storage, sampler=sampler, study_name=study_name, directions=directions, load_if_exists=True
            )
    except ValueError as error:
        raise ValueError(f"--study-name {study_name}: {error}") from None
    stored = study.user_attrs.get(FINGERPRINT_ATTR)
    if stored is None:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint(space))
        study.set_user_attr("hetersim_study_toml", space.text)
        study.set_user_attr(CONSTRAINT_NAMES_ATTR, space.constraint_names())
        with experimental_ok():
            study.set_metric_names(list(space.objectives))  # plots and trials_dataframe say which is which
    elif stored != fingerprint(space):
        raise ValueError(
            f"--study-name {study_name}: the storage holds this study for another study file; "
            "use another --study-name or the same file"
        )
    return study
