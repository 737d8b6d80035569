"""Running a sweep: every chunk of a study's space, locally or on Dask, checkpointed, into one file.

Each finished chunk is checkpointed to ``<out>.chunks/`` (:mod:`dse.sweep.checkpoints`), so an
interrupted sweep resumes where it stopped; the final dataset is written to netCDF4 (zlib)
atomically (:mod:`dse.atomic`; :mod:`dse.sweep.dataset`), or, for a streamed sweep,
only what :class:`dse.sweep.stream.Reducer` keeps (:func:`dse.sweep.stream.write_streamed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dse import atomic
from dse.study import Study, load_study
from dse.sweep.checkpoints import Checkpoints, checkpoint_folder, fingerprint, warn
from dse.sweep.dataset import write_dataset
from dse.sweep.evaluate import chunk_task, evaluate_chunk
from dse.sweep.space import DEFAULT_CHUNK, MAX_CONFIGS, Space, chunk_size, space_from_study
from dse.sweep.stream import DEFAULT_TOP_K, Reducer, stream_fingerprint, write_streamed
from hetersim import build
from hetersim.fit.calibration import load_calibration
from hetersim.specs import Calibration

STREAM_THRESHOLD = 10**8  # spaces this large are streamed unless --no-stream
STREAM_CHECKPOINT_S = 30.0  # seconds between checkpoints of a streamed sweep's reduced state


def output_path(out: str | Path, study_name: str) -> Path:
    """``out`` itself when it ends in ``.nc``, else ``out/<study name>.nc`` (a name that ends in
    ``.nc`` already is the file's name: ``t.nc``, never ``t.nc.nc``); ``r.nc/`` is a folder
    (:func:`dse.atomic.nc_target`)."""
    return atomic.nc_target(out, f"{study_name.removesuffix('.nc')}.nc")


def run_sweep(
    study_path: str | Path | None,
    out_dir: str | Path,
    chunk: int = DEFAULT_CHUNK,
    scheduler: str | None = None,
    workers: int = 0,
    progress: bool = True,
    on_chunk: Callable[[int], None] | None = None,
    stream: bool | None = None,
    top_k: int = DEFAULT_TOP_K,
) -> Path:
    """Evaluate every configuration of a study and write ``<out_dir>/<name>.nc``; return its path.

    ``study_path`` None is the packaged default study. ``scheduler`` (a Dask scheduler address)
    or ``workers`` (> 0: a local Dask cluster of that many processes) run the chunks as Dask
    tasks; otherwise they run here. Finished chunks are kept in ``<name>.nc.chunks/`` until the
    dataset is written, so a rerun after Ctrl-C or a crash computes only what is missing.
    ``on_chunk(index)`` is called after each chunk is checkpointed (streamed: folded in).

    ``stream`` True keeps only the ``top_k`` best feasible configurations per objective, the
    Pareto set and per-axis summaries (:class:`Reducer`, :func:`write_streamed`) instead of every
    row; None (the default) streams spaces of at least :data:`STREAM_THRESHOLD` configurations.
    A streamed sweep checkpoints its reduced state every :data:`STREAM_CHECKPOINT_S` seconds and
    on Ctrl-C (``<name>.nc.chunks/state.npz``); a rerun resumes from it.
    """
    _check_options(scheduler, workers, top_k)
    job = _prepare(study_path, out_dir, chunk)
    check_output(job.path)
    if scheduler is not None:  # the scheduler answers before any file is written or work announced
        _connect(scheduler).close()
    if stream is None:
        stream = job.space.size >= STREAM_THRESHOLD
    from rich.console import Console

    console = Console(stderr=True)
    bar = _progress(console, progress)  # rich.progress imported before the manifest is written
    job.path.parent.mkdir(parents=True, exist_ok=True)
    sink: _FullSink | _StreamSink = _StreamSink(job, top_k) if stream else _FullSink(job)
    done = sink.done()
    todo = [i for i in range(job.n_chunks) if i not in done]
    resumed = sum(job.rows(i) for i in done)
    payload = (job.tables, job.cal, job.chunk, job.space.kinds, job.space.size)
    local = scheduler is None and not workers
    try:
        with bar:
            if local and todo:
                compile_phase(bar, payload)
            # Added after the compilation, so its elapsed time and rate count evaluation only.
            task = bar.add_task(f"sweep {job.study.name}", total=job.space.size, completed=resumed, resumed=resumed)

            def finish(index: int, arrays: Mapping[str, np.ndarray]) -> None:
                sink.add(index, arrays)
                bar.advance(task, job.rows(index))
                if on_chunk is not None:
                    on_chunk(index)

            if local:
                _run_local(payload, todo, finish)
            else:
                _run_dask(payload, todo, scheduler, workers, finish)
    except KeyboardInterrupt:
        n_done = sink.interrupted()
        console.print(
            f"interrupted: {n_done} of {job.n_chunks} chunks kept in {sink.ckpt.folder}; "
            "run the same command again to resume",
            soft_wrap=True,  # one line, whatever the terminal's width
        )
        raise SweepInterrupted from None
    sink.write()
    sink.ckpt.clear()
    return job.path


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during the chunks, after the finished ones were kept and the user was told."""


def check_output(path: Path) -> None:
    """The dataset ``path`` and its checkpoint folder can be written (``--out``), before any work."""
    atomic.check_nc_target(path, "--out")
    atomic.check_folder(checkpoint_folder(path), "--out")


def _check_options(scheduler: str | None, workers: int, top_k: int) -> None:
    if workers < 0:
        raise ValueError(f"--workers must be >= 0; got {workers}")
    if scheduler is not None and workers:
        raise ValueError("give --scheduler ADDRESS or --workers N, not both")
    if top_k < 1:
        raise ValueError(f"--top-k must be a positive integer; got {top_k}")


@dataclass(frozen=True, eq=False)
class _Job:
    """A sweep's setup: the study and its space, the chunking, the compiled function's inputs."""

    study: Study
    space: Space
    chunk: int
    cal: Calibration
    tables: dict[str, Any]
    path: Path
    fp: str

    @property
    def n_chunks(self) -> int:
        return -(-self.space.size // self.chunk)

    def rows(self, index: int) -> int:
        """Real configurations in chunk ``index`` (the last one may be short)."""
        return min(self.chunk, self.space.size - index * self.chunk)


def _prepare(study_path: str | Path | None, out_dir: str | Path, chunk: int) -> _Job:
    study = load_study(study_path)
    space = space_from_study(study)
    if space.size == 0:
        raise ValueError(
            f"study file {study.origin}: no configuration passes the host rules (n_gpus divisible by tp*pp*cp, "
            "global_batch a multiple of micro_batch*dp)"
        )
    if space.size > MAX_CONFIGS:
        too_many = f"{space.size:,} configurations; split it (at most {MAX_CONFIGS:,})"
        raise ValueError(f"study file {study.origin}: {too_many}")
    chunk = chunk_size(chunk, space.size)
    cal = build.calibration_spec(load_calibration())
    tables = space.tables()
    fp = fingerprint(study.text, space, tables, cal, chunk)
    return _Job(study, space, chunk, cal, tables, output_path(out_dir, study.name), fp)


class _FullSink:
    """Every row: one checkpoint file per finished chunk, then :func:`write_dataset` from them."""

    def __init__(self, job: _Job):
        self.job = job
        self.ckpt = Checkpoints(checkpoint_folder(job.path), job.fp, job.n_chunks, rows=job.rows)

    def done(self) -> set[int]:
        return self.ckpt.done()

    def add(self, index: int, arrays: Mapping[str, np.ndarray]) -> None:
        n = self.job.rows(index)
        self.ckpt.save(index, {k: np.asarray(v)[:n] for k, v in arrays.items()})

    def interrupted(self) -> int:
        """Chunks kept for a rerun."""
        return len(self.ckpt.done())

    def write(self) -> None:
        job = self.job
        write_dataset(job.path, job.study, job.space, self.ckpt, job.chunk, job.fp, job.cal)


class _StreamSink:
    """Streamed: each chunk folded into the reduced state, checkpointed every
    :data:`STREAM_CHECKPOINT_S` seconds and on Ctrl-C, then :func:`write_streamed`."""

    def __init__(self, job: _Job, top_k: int):
        self.job = job
        self.reducer = Reducer(job.space, job.study.objectives, job.chunk, top_k)
        self.ckpt = Checkpoints(checkpoint_folder(job.path), stream_fingerprint(job.fp, top_k), job.n_chunks)
        self.state = self._resume()  # replaced whole after each chunk
        self.saved = time.monotonic()

    def _resume(self):
        try:
            return self.reducer.from_arrays(self.ckpt.load_state())
        except (KeyError, ValueError, IndexError) as error:  # a state of another shape: start over
            warn(f"{self.ckpt.state_path}: not this sweep's state ({type(error).__name__}); starting over")
            self.ckpt.state_path.unlink(missing_ok=True)
            return self.reducer.empty()

    def done(self) -> set[int]:
        return set(np.flatnonzero(self.state.done).tolist())

    def add(self, index: int, arrays: Mapping[str, np.ndarray]) -> None:
        self.state = self.reducer.add(self.state, index, arrays)
        if time.monotonic() - self.saved >= STREAM_CHECKPOINT_S:
            self.ckpt.save_state(self.reducer.to_arrays(self.state))
            self.saved = time.monotonic()

    def interrupted(self) -> int:
        self.ckpt.save_state(self.reducer.to_arrays(self.state))
        return int(self.state.done.sum())

    def write(self) -> None:
        job = self.job
        write_streamed(job.path, job.study, job.space, self.reducer, self.state, job.chunk, job.fp, job.cal)


def compile_phase(bar, payload: tuple[Any, ...]) -> float:
    """Compile the chunk function as its own row of the progress display ("compiling…", then
    "compiled in N s"); return the seconds. The chunks then call :func:`evaluate_chunk`, which
    finds this compilation in JAX's cache (tracing included)."""
    tables, cal, chunk, kinds, _ = payload
    row = bar.add_task("compiling…", total=None, phase=True)
    t0 = time.perf_counter()
    evaluate_chunk.lower(np.int32(0), tables, cal, chunk=chunk, kinds=kinds).compile()
    seconds = time.perf_counter() - t0
    bar.update(row, description=f"compiled in {seconds:.1f} s", total=1, completed=1)
    bar.stop_task(row)
    return seconds


def _run_local(payload: tuple[Any, ...], todo: Sequence[int], finish: Callable[[int, Any], None]) -> None:
    """Dispatch chunk ``i+1`` before pulling chunk ``i`` to the host, so the two overlap."""
    tables, cal, chunk, kinds, _ = payload
    pending = None
    for index in todo:
        out = evaluate_chunk(np.int32(index * chunk), tables, cal, chunk=chunk, kinds=kinds)
        if pending is not None:
            finish(*pending)
        pending = (index, out)
    if pending is not None:
        finish(*pending)


def _run_dask(
    payload: tuple[Any, ...],
    todo: Sequence[int],
    scheduler: str | None,
    workers: int,
    finish: Callable[[int, Any], None],
) -> None:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ValueError("--scheduler/--workers need Dask: pip install 'hetersim[dask]'") from None
    cluster = None
    if scheduler is None:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        with _connect(scheduler) if cluster is None else Client(cluster) as client:
            [shared] = client.scatter([payload], broadcast=True)
            futures = [client.submit(chunk_task, shared, i, pure=False) for i in todo]
            try:
                for future in as_completed(futures):
                    finish(*future.result())
            except BaseException:
                client.cancel(futures)
                raise
    finally:
        if cluster is not None:
            cluster.close()


def _connect(scheduler: str):
    """A Dask client of the scheduler at ``scheduler``; one line naming it where none answers (Dask
    retries until its connect timeout, ``distributed.comm.timeouts.connect``)."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ValueError("--scheduler/--workers need Dask: pip install 'hetersim[dask]'") from None
    try:
        return Client(scheduler)
    except OSError as error:
        raise ValueError(f"--scheduler {scheduler}: no Dask scheduler answered ({error})") from None
    except ValueError as error:  # distributed's address parser: "missing port number in address ..."
        raise ValueError(f"--scheduler {scheduler}: not an address such as tcp://host:8786 ({error})") from None


def _progress(console, enabled: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            speed = task.speed
            if speed is None and task.elapsed:
                speed = (task.completed - task.fields.get("resumed", 0)) / task.elapsed
            return Text("" if not speed or task.fields.get("phase") else f"{speed:,.0f} configs/s")

    class Count(MofNCompleteColumn):  # nothing to count in a phase row (compiling)
        def render(self, task) -> Text:
            return Text("") if task.fields.get("phase") else super().render(task)

    class Remaining(TimeRemainingColumn):
        def render(self, task) -> Text:
            return Text("") if task.fields.get("phase") else super().render(task)

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        Count(),
        Rate(),
        TimeElapsedColumn(),
        Remaining(),
        console=console,
        disable=not enabled,
    )
