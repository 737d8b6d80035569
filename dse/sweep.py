"""Vectorized sweeps: every configuration of a study, in fixed-size chunks, into one netCDF file.

The space is a cross product of *factors*, each a small table of rows (one column per plan
field: a plain axis is a one-column factor; ``n_gpus, tp, pp, cp, micro_batch, global_batch``
form one factor holding only the rows whose ``dp = n_gpus / (tp*pp*cp)`` is an integer and whose
global batch is a multiple of ``micro_batch * dp``, the cheap integer rules the host applies).
Configuration ``i`` is the mixed-radix decoding of ``i`` over the factors' lengths.

A chunk is evaluated by :func:`evaluate_chunk`: one ``jax.jit`` of (decode ``start + arange(chunk)``
into per-factor rows with ``jnp`` gathers, build the batched specs, ``jax.vmap(simulate)``),
compiled once per study shape and reused for every chunk, locally or on Dask workers. Each
finished chunk is checkpointed to ``<out>.chunks/``, so an interrupted sweep resumes where it
stopped; the final dataset is written to netCDF4 (zlib) through a temporary file and
``os.replace``. See ``studies/README.md`` for the study format.

A space of :data:`STREAM_THRESHOLD` configurations or more (or any, with ``stream=True``) is
*streamed* instead: each chunk is folded on the host by :class:`Reducer` into the top-k feasible
configurations per objective, the Pareto set of each model and per-axis summaries, and only those
are written (:func:`write_streamed`); the reduced state is checkpointed to the same folder.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dse.metrics import DERIVED, METRICS, constraint_metric
from dse.pareto import pareto_mask
from dse.study import CATEGORICAL, PLAN_AXES, Study, load_study
from hetersim import build
from hetersim.cluster import ClusterSpec, cluster_spec, simulate_cluster
from hetersim.fit.calibration import load_calibration
from hetersim.simulate import simulate
from hetersim.specs import Calibration, ModelSpec, Plan, SystemSpec
from hetersim.types import Infeasible

DEFAULT_CHUNK = 16384  # fastest measured on the 2-core CPU (benchmarks/bench_sweep.py)
COMPRESSION_LEVEL = 1  # zlib: level 1 writes ~2x faster than 4 for files a few % larger
MAX_CONFIGS = 2**31 - 1  # configurations are indexed by int32 inside the compiled function
STREAM_THRESHOLD = 10**8  # spaces this large are streamed unless --no-stream
DEFAULT_TOP_K = 100
MAX_FRONT = 20_000  # Pareto points kept per model; a larger front is thinned (Reducer.select)
STREAM_CHECKPOINT_S = 30.0  # seconds between checkpoints of a streamed sweep's reduced state
ANCHORS = 16  # front points a chunk is screened against with three or more objectives
BLOCK_KEYS = 1 << 12  # most keys of one block of factors in a streamed sweep's marginals
PARETO_BIT = 1  # kept_because: bit 0 the Pareto set, bit 1 + i the top-k of objective i

# Every plan field a configuration takes from the space, in coordinate order. ``model`` and
# ``gpu`` are indices into the study's lists; categoricals are hetersim.types codes; ``sp`` is
# -1 (on when tp > 1), 0 or 1 in the tables and 0 or 1 in the results.
COLUMNS = ("model", "gpu", "n_gpus", *PLAN_AXES[:5], "dp", *PLAN_AXES[5:])
CODE_COLUMNS = ("model", "gpu", "recompute", "sp", "precision", "attention", "order")
# Plan fields shared by all configurations of a study.
FIXED_FIELDS = ("train_tokens", "offload_tier_code", "cpu_optimizer", "bucket_Mparams", "reuse_Mparams")
LAYOUT_COLUMNS = ("n_gpus", "tp", "pp", "cp", "micro_batch", "global_batch")

COORD_ATTRS = {
    "model": ("model (catalog key)", "1"),
    "gpu": ("accelerator (catalog key)", "1"),
    "n_gpus": ("number of GPUs", "1"),
    "tp": ("tensor-parallel size", "1"),
    "pp": ("pipeline-parallel size", "1"),
    "cp": ("context-parallel size", "1"),
    "micro_batch": ("micro-batch size", "sequences"),
    "global_batch": ("global batch size", "sequences"),
    "dp": ("data-parallel size, n_gpus / (tp*pp*cp)", "1"),
    "vp": ("virtual pipeline chunks per stage", "1"),
    "zero": ("ZeRO stage (3 = FSDP)", "1"),
    "recompute": ("activation recomputation", "1"),
    "sp": ("sequence parallelism", "1"),
    "precision": ("training precision", "1"),
    "seq_len": ("sequence length", "tokens"),
    "attention": ("attention kernel", "1"),
    "order": ("rank placement, innermost first", "1"),
}
EXTRA_VARIABLES = {
    "constraint_violation": ("which study constraints the configuration violates (bit flags)", "i4"),
    "feasible": ("1 when the configuration runs (infeasible == 0) and meets every constraint", "i1"),
}


def variables() -> list[str]:
    """Data variables of a sweep dataset, in file order."""
    return [*METRICS, *EXTRA_VARIABLES]


# --------------------------------------------------------------------------------------------
# The space
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Space:
    """A product of factors plus everything a configuration needs besides its row.

    ``factors``: ``(name, {column: int64 values})`` tables, every column of :data:`COLUMNS` in
    exactly one; ``models``/``systems``: specs stacked along a leading axis indexed by the
    ``model``/``gpu`` codes; ``fixed``: plan fields every configuration shares;
    ``constraints``: ``(key, metric, sense)`` with ``limits`` their bounds.
    """

    factors: tuple[tuple[str, dict[str, np.ndarray]], ...]
    model_entries: dict[str, dict[str, Any]]
    gpu_entries: dict[str, dict[str, Any]]
    links: dict[str, dict[str, Any]]
    fixed: dict[str, Any] = field(default_factory=dict)  # plan_spec keywords shared by all
    constraints: tuple[tuple[str, str, str], ...] = ()
    limits: tuple[float, ...] = ()
    clusters: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # mixes on the gpu axis
    hetero: str = "pipeline"

    def __post_init__(self) -> None:
        seen = [c for _, table in self.factors for c in table]
        if sorted(seen) != sorted(COLUMNS):
            raise ValueError(f"space factors must hold each of {', '.join(COLUMNS)} once; got {', '.join(seen)}")
        for name, table in self.factors:
            if len({len(v) for v in table.values()}) != 1:
                raise ValueError(f"space factor {name!r}: columns of different lengths")

    @functools.cached_property
    def radices(self) -> tuple[int, ...]:
        return tuple(len(next(iter(t.values()))) for _, t in self.factors)

    @property
    def size(self) -> int:
        return math.prod(self.radices)

    @functools.cached_property
    def models(self) -> ModelSpec:
        return _stack([build.model_spec(e) for e in self.model_entries.values()])

    @functools.cached_property
    def systems(self) -> SystemSpec | ClusterSpec:
        """One system per GPU kind, or one :class:`ClusterSpec` per mix when the study has mixes."""
        if self.clusters:
            return _stack([self.cluster(label) for label in self.clusters])
        return _stack([build.system_spec(e, self.links) for e in self.gpu_entries.values()])

    def cluster(self, label: str) -> ClusterSpec:
        groups = [(self.gpu_entries[k], c) for k, c in self.clusters[label]]
        return cluster_spec(groups, self.links, self.hetero)

    @functools.cached_property
    def base_plan(self) -> Plan:
        """A plan carrying the fixed fields (its layout fields are placeholders)."""
        return build.plan_spec(n_gpus=1, global_batch=1, seq_len=1, **self.fixed)

    @property
    def kinds(self) -> tuple[tuple[str, str], ...]:
        """The static part of the constraints: ``(metric, sense)`` per bit."""
        return tuple((metric, sense) for _, metric, sense in self.constraints)

    def tables(self) -> dict[str, Any]:
        """The arrays :func:`evaluate_chunk` takes (host NumPy; JAX moves them once per call)."""
        factors = [
            {c: v.astype(np.int32 if c in CODE_COLUMNS else np.float32) for c, v in t.items()} for _, t in self.factors
        ]
        fixed = {k: np.asarray(getattr(self.base_plan, k)) for k in FIXED_FIELDS}
        return {
            "factors": factors,
            "models": jax.tree.map(np.asarray, self.models),
            "systems": jax.tree.map(np.asarray, self.systems),
            "fixed": fixed,
            "limits": np.asarray(self.limits, np.float32).reshape(len(self.limits)),
        }

    def coords(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Each column's value for configurations ``start..stop-1`` (``sp`` resolved to 0/1)."""
        return self.coords_at(np.arange(start, stop, dtype=np.int64))

    def coords_at(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Each column's value for the configurations of flat indices ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        out = {}
        for (_, table), digit in zip(self.factors, _digits(idx, self.radices), strict=True):
            for c, v in table.items():
                out[c] = v[digit]
        out["sp"] = np.where(out["sp"] < 0, out["tp"] > 1, out["sp"]).astype(np.int64)
        return {c: out[c].astype(np.int8 if c in CODE_COLUMNS else np.int32) for c in COLUMNS}

    def labels(self, column: str) -> tuple[str, ...]:
        """Names of a categorical column's codes."""
        if column == "model":
            return tuple(self.model_entries)
        if column == "gpu":
            return tuple(self.clusters) if self.clusters else tuple(self.gpu_entries)
        if column == "sp":
            return ("off", "on")
        return CATEGORICAL[column]

    def plan_kwargs(self, index: int) -> tuple[str, str, dict[str, Any]]:
        """(model key, gpu key, :func:`hetersim.build.plan_spec` keywords) of configuration ``index``."""
        row = {c: int(v[0]) for c, v in self.coords(index, index + 1).items()}
        kw: dict[str, Any] = {c: row[c] for c in ("n_gpus", "tp", "pp", "vp", "cp", "dp", "zero", "micro_batch")}
        kw.update(global_batch=row["global_batch"], seq_len=row["seq_len"], sp=bool(row["sp"]))
        for c in CATEGORICAL:
            kw[c] = CATEGORICAL[c][row[c]]
        kw.update(self.fixed)
        return self.labels("model")[row["model"]], self.labels("gpu")[row["gpu"]], kw

    def specs(self, index: int) -> tuple[ModelSpec, SystemSpec | ClusterSpec, Plan]:
        """The one-configuration specs of ``index``, built by :mod:`hetersim.build` from names
        (the second is a :class:`ClusterSpec`, for :func:`simulate_cluster`, in a study of mixes)."""
        model, gpu, kw = self.plan_kwargs(index)
        system = self.cluster(gpu) if self.clusters else build.system_spec(self.gpu_entries[gpu], self.links)
        return build.model_spec(self.model_entries[model]), system, build.plan_spec(**kw)


def _stack(specs: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *specs)


def columns_plan(col: Mapping[str, Any], fixed: Mapping[str, Any], *, n_gpus, dp) -> Plan:
    """A batched :class:`Plan` from per-configuration plan columns (categorical ones as codes,
    ``sp`` < 0 meaning on whenever tp > 1) and the study's fixed fields, broadcast to the batch."""
    batch = jnp.shape(col["tp"])[0]
    fixed = {k: jnp.broadcast_to(v, (batch, *jnp.shape(v))) for k, v in fixed.items()}
    return Plan(
        n_gpus=jnp.broadcast_to(n_gpus, (batch,)),
        tp=col["tp"],
        pp=col["pp"],
        vp=col["vp"],
        dp=dp,
        cp=col["cp"],
        sp=jnp.where(col["sp"] < 0, col["tp"] > 1, col["sp"] > 0).astype(jnp.float32),
        zero=col["zero"],
        micro_batch=col["micro_batch"],
        global_batch=col["global_batch"],
        seq_len=col["seq_len"],
        train_tokens=fixed["train_tokens"],
        recompute_code=col["recompute"],
        precision_code=col["precision"],
        attention_code=col["attention"],
        order_code=col["order"],
        offload_tier_code=fixed["offload_tier_code"],
        cpu_optimizer=fixed["cpu_optimizer"],
        bucket_Mparams=fixed["bucket_Mparams"],
        reuse_Mparams=fixed["reuse_Mparams"],
    )


def _digits(idx, radices: Sequence[int]) -> list[Any]:
    """Mixed-radix digits of ``idx`` (NumPy or JAX integers), most significant first."""
    out = []
    for r in reversed(radices):
        out.append(idx % r)
        idx = idx // r
    return out[::-1]


def layout_rows(axes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """The rows of ``n_gpus x tp x pp x cp x micro_batch x global_batch`` that pass the host's
    integer rules, in lexicographic order, with their ``dp``."""
    rows = []
    for n, tp, pp, cp, mb, gb in itertools.product(*(axes[c] for c in LAYOUT_COLUMNS)):
        dp, rest = divmod(n, tp * pp * cp)
        if rest == 0 and dp >= 1 and gb % (mb * dp) == 0:
            rows.append((n, tp, pp, cp, mb, gb, dp))
    table = np.array(rows, dtype=np.int64).reshape(len(rows), len(LAYOUT_COLUMNS) + 1)
    return {c: table[:, i] for i, c in enumerate((*LAYOUT_COLUMNS, "dp"))}


def space_from_study(study: Study) -> Space:
    axes = study.axes
    factors: list[tuple[str, dict[str, np.ndarray]]] = [
        ("model", {"model": np.arange(len(axes["model"]))}),
        ("gpu", {"gpu": np.arange(len(axes["gpu"]))}),
        ("layout", layout_rows(axes)),
    ]
    for name in ("vp", "zero", "recompute", "sp", "precision", "seq_len", "attention", "order"):
        values = axes[name]
        if name in CATEGORICAL:
            codes = [CATEGORICAL[name].index(v) for v in values]
        elif name == "sp":
            codes = [-1 if v == "auto" else int(v) for v in values]
        else:
            codes = list(values)
        factors.append((name, {name: np.array(codes, dtype=np.int64)}))
    fixed: dict[str, Any] = {
        "train_tokens": study.train_tokens,
        "bucket_Mparams": study.bucket_Mparams,
        "reuse_Mparams": study.reuse_Mparams,
    }
    if study.offload:
        fixed["offload"] = dict(study.offload)
    if study.cpu_optimizer is not None:
        fixed["cpu_optimizer"] = study.cpu_optimizer
    constraints = []
    for key in study.constraints:
        metric, sense = constraint_metric(key)  # type: ignore[misc]
        constraints.append((key, metric, sense))
    return Space(
        factors=tuple(factors),
        model_entries=study.models,
        gpu_entries=study.gpus,
        links=study.links,
        fixed=fixed,
        constraints=tuple(constraints),
        limits=tuple(study.constraints.values()),
        clusters=dict(study.clusters),
        hetero=study.hetero,
    )


# --------------------------------------------------------------------------------------------
# The compiled chunk
# --------------------------------------------------------------------------------------------

_TRACES = 0


def trace_count() -> int:
    """How many times :func:`evaluate_chunk` has been traced in this process (tests use it)."""
    return _TRACES


_batched_simulate = jax.vmap(simulate, in_axes=(0, 0, 0, None))
_batched_cluster = jax.vmap(simulate_cluster, in_axes=(0, 0, 0, None))


@functools.partial(jax.jit, static_argnames=("chunk", "kinds"))
def evaluate_chunk(start, tables: Mapping[str, Any], cal: Calibration, *, chunk: int, kinds: tuple) -> dict[str, Any]:
    """Metrics of configurations ``start .. start+chunk-1`` (indices past the end repeat the
    last configuration; the caller trims them). ``kinds`` are the constraints' ``(metric, sense)``."""
    global _TRACES
    _TRACES += 1  # runs at trace time only: counts compilations
    factors = tables["factors"]
    radices = [next(iter(t.values())).shape[0] for t in factors]
    idx = jnp.minimum(start + jnp.arange(chunk, dtype=jnp.int32), math.prod(radices) - 1)
    col = {c: t[c][d] for t, d in zip(factors, _digits(idx, radices), strict=True) for c in t}

    model = jax.tree.map(lambda a: a[col["model"]], tables["models"])
    system = jax.tree.map(lambda a: a[col["gpu"]], tables["systems"])
    plan = columns_plan(col, tables["fixed"], n_gpus=col["n_gpus"], dp=col["dp"])
    if isinstance(system, ClusterSpec):  # static: the study's structure, not a traced value
        out = _batched_cluster(model, system, plan, cal).total
    else:
        out = _batched_simulate(model, system, plan, cal)

    result = {name: getattr(out, name) for name in METRICS}
    violation = jnp.zeros(chunk, jnp.int32)
    for bit, (metric, sense) in enumerate(kinds):
        value = out.hbm_used_GiB / out.hbm_capacity_GiB if metric in DERIVED else getattr(out, metric)
        limit = tables["limits"][bit]
        bad = value > limit if sense == "max" else value < limit
        violation = violation | jnp.where(bad, jnp.int32(1 << bit), jnp.int32(0))
    result["constraint_violation"] = violation
    result["feasible"] = ((out.infeasible == 0) & (violation == 0)).astype(jnp.int8)
    return result


def chunk_task(payload: tuple[Any, ...], index: int) -> tuple[int, dict[str, np.ndarray]]:
    """Evaluate chunk ``index`` (a Dask task: each worker process compiles once and reuses it).

    ``payload`` is ``(tables, calibration, chunk, kinds, size)`` as built by :func:`run_sweep`.
    """
    tables, cal, chunk, kinds, size = payload
    out = evaluate_chunk(np.int32(index * chunk), tables, cal, chunk=chunk, kinds=kinds)
    n = min(chunk, size - index * chunk)
    return index, {k: np.asarray(v)[:n] for k, v in out.items()}


def chunk_size(requested: int, size: int) -> int:
    """The chunk a sweep uses: ``requested``, or the next power of two at or above a smaller
    space's size (so a small study does not pay for a mostly padded chunk)."""
    if requested < 1:
        raise ValueError(f"--chunk must be a positive integer; got {requested}")
    return min(requested, max(256, 1 << max(size - 1, 1).bit_length()))


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


def package_versions() -> dict[str, str]:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "unknown"

    names = ("hetersim", "jax", "jaxlib", "numpy", "xarray", "netCDF4")
    return {"python": platform.python_version(), **{n: version(n) for n in names}}


def _source_digest() -> str:
    """Digest of the cost model's source, so checkpoints of other code are never reused."""
    h = hashlib.sha256()
    root = Path(build.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def fingerprint(study_text: str, space: Space, tables: Any, cal: Calibration, chunk: int) -> str:
    h = hashlib.sha256()
    h.update(study_text.encode())
    meta = {"chunk": chunk, "size": space.size, "radices": space.radices, "kinds": space.kinds, "v": package_versions()}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for leaf in jax.tree.leaves((tables, cal)):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    h.update(_source_digest().encode())
    return h.hexdigest()


class Checkpoints:
    """``<out>.chunks/``: one ``chunk_NNNNNN.npz`` per finished chunk and a ``manifest.json``
    naming the fingerprint they belong to. Files are written to a temporary name and renamed."""

    def __init__(self, folder: Path, fp: str, n_chunks: int):
        self.folder = folder
        self.n_chunks = n_chunks
        manifest = folder / "manifest.json"
        if folder.is_dir():
            try:
                old = json.loads(manifest.read_text()).get("fingerprint")
            except (OSError, ValueError):
                old = None
            if old != fp:
                self.clear()
        folder.mkdir(parents=True, exist_ok=True)
        if not manifest.is_file():
            _atomic_write_bytes(manifest, json.dumps({"fingerprint": fp, "n_chunks": n_chunks}).encode())

    def path(self, index: int) -> Path:
        return self.folder / f"chunk_{index:06d}.npz"

    def done(self) -> set[int]:
        return {i for i in range(self.n_chunks) if self.path(i).is_file()}

    def save(self, index: int, arrays: Mapping[str, np.ndarray]) -> None:
        _atomic_savez(self.path(index), arrays)

    def load(self, index: int) -> dict[str, np.ndarray]:
        with np.load(self.path(index)) as data:
            return {k: data[k] for k in data.files}

    @property
    def state_path(self) -> Path:
        return self.folder / "state.npz"

    def save_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The reduced state of a streamed sweep (one file, replaced atomically)."""
        _atomic_savez(self.state_path, arrays)

    def load_state(self) -> dict[str, np.ndarray] | None:
        if not self.state_path.is_file():
            return None
        with np.load(self.state_path) as data:
            return {k: data[k] for k in data.files}

    def clear(self) -> None:
        """Remove the folder and what this module writes in it."""
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            if path.name.startswith(("manifest.json", "chunk_", "state.npz")):
                path.unlink()
        self.folder.rmdir()


def _atomic_savez(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    tmp = path.with_suffix(".npz.tmp")
    try:
        with tmp.open("wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def output_path(out: str | Path, study_name: str) -> Path:
    """``out`` itself when it ends in ``.nc``, else ``out/<study name>.nc``."""
    out = Path(out)
    return out if out.suffix == ".nc" else out / f"{study_name}.nc"


def checkpoint_folder(path: Path) -> Path:
    return path.with_name(path.name + ".chunks")


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
    if workers < 0:
        raise ValueError(f"--workers must be >= 0; got {workers}")
    if scheduler is not None and workers:
        raise ValueError("give --scheduler ADDRESS or --workers N, not both")
    if top_k < 1:
        raise ValueError(f"--top-k must be a positive integer; got {top_k}")
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
    if stream is None:
        stream = space.size >= STREAM_THRESHOLD
    chunk = chunk_size(chunk, space.size)
    cal = build.calibration_spec(load_calibration())
    tables = space.tables()
    path = output_path(out_dir, study.name)
    fp = fingerprint(study.text, space, tables, cal, chunk)
    n_chunks = -(-space.size // chunk)

    path.parent.mkdir(parents=True, exist_ok=True)
    if stream:
        reducer = Reducer(space, study.objectives, chunk, top_k)
        ckpt = Checkpoints(checkpoint_folder(path), stream_fingerprint(fp, top_k), n_chunks)
        state = [reducer.from_arrays(ckpt.load_state())]  # replaced whole after each chunk
        saved = [time.monotonic()]
        done = set(np.flatnonzero(state[0].done).tolist())
    else:
        ckpt = Checkpoints(checkpoint_folder(path), fp, n_chunks)
        done = ckpt.done()
    todo = [i for i in range(n_chunks) if i not in done]
    resumed = sum(min(chunk, space.size - i * chunk) for i in done)

    from rich.console import Console

    console = Console(stderr=True)
    bar = _progress(console, progress)
    task = bar.add_task(f"sweep {study.name}", total=space.size, completed=resumed, resumed=resumed)

    def finish(index: int, arrays: Mapping[str, np.ndarray]) -> None:
        n = min(chunk, space.size - index * chunk)
        if stream:
            state[0] = reducer.add(state[0], index, arrays)
            if time.monotonic() - saved[0] >= STREAM_CHECKPOINT_S:
                ckpt.save_state(reducer.to_arrays(state[0]))
                saved[0] = time.monotonic()
        else:
            ckpt.save(index, {k: np.asarray(v)[:n] for k, v in arrays.items()})
        bar.advance(task, n)
        if on_chunk is not None:
            on_chunk(index)

    payload = (tables, cal, chunk, space.kinds, space.size)
    try:
        with bar:
            if scheduler is not None or workers:
                _run_dask(payload, todo, scheduler, workers, finish)
            else:
                _run_local(payload, todo, finish)
    except KeyboardInterrupt:
        if stream:
            ckpt.save_state(reducer.to_arrays(state[0]))
            n_done = int(state[0].done.sum())
        else:
            n_done = len(ckpt.done())
        console.print(
            f"interrupted: {n_done} of {n_chunks} chunks kept in {ckpt.folder}; run the same command again to resume"
        )
        raise

    if stream:
        write_streamed(path, study, space, reducer, state[0], chunk, fp, cal)
    else:
        write_dataset(path, study, space, ckpt, chunk, fp, cal)
    ckpt.clear()
    return path


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
        with Client(scheduler or cluster) as client:
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
            return Text("" if not speed else f"{speed:,.0f} configs/s")

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        Rate(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )


# --------------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------------


def write_dataset(
    path: Path, study: Study, space: Space, ckpt: Checkpoints, chunk: int, fp: str, cal: Calibration
) -> None:
    """Stream the checkpoints into a netCDF4 file (zlib) at a temporary name, then rename it.

    One ``config`` dimension; the columns are coordinates along it (categoricals as small int
    codes with CF ``flag_values``/``flag_meanings``); one variable per metric with ``units`` and
    ``long_name``. Memory stays one chunk, whatever the size of the space.
    """
    import netCDF4

    size = space.size
    tmp = path.with_name(f".{path.name}.tmp")
    rows = min(size, 1 << 16)
    opts = dict(zlib=True, complevel=COMPRESSION_LEVEL, shuffle=True, chunksizes=(rows,))
    try:
        with netCDF4.Dataset(tmp, "w", format="NETCDF4") as nc:
            nc.createDimension("config", size)
            _define_config_variables(nc, space, opts)
            for var in nc.variables.values():
                # HDF5 keeps a chunk cache per variable (64 MiB by default in netCDF-C); writing in
                # order needs only the chunk being filled.
                var.set_var_chunk_cache(size=2 * rows * var.dtype.itemsize, nelems=7, preemption=1.0)
            for index in range(ckpt.n_chunks):
                lo, hi = index * chunk, min(size, (index + 1) * chunk)
                for c, values in space.coords(lo, hi).items():
                    nc[c][lo:hi] = values
                for name, values in ckpt.load(index).items():
                    nc[name][lo:hi] = values
            nc.setncatts(dataset_attrs(study, space, chunk, fp, cal))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _define_config_variables(nc, space: Space, opts: Mapping[str, Any], extra_coords: str = "") -> None:
    """The columns and the variables of :func:`variables` along ``config``, with their attributes."""
    coords = space.coords(0, 0)
    for c in COLUMNS:
        var = nc.createVariable(c, coords[c].dtype, ("config",), **opts)
        _column_attrs(var, space, c)
    coord_names = " ".join((*COLUMNS, *extra_coords.split()))
    for name in variables():
        if name in METRICS:
            m = METRICS[name]
            var = nc.createVariable(name, m.dtype, ("config",), **opts)
            var.units, var.long_name = m.units, m.long_name
            if name == "infeasible":
                flags = [f for f in Infeasible if f]
                var.flag_masks = np.array([int(f) for f in flags], np.int32)
                var.flag_meanings = " ".join(f.name.lower() for f in flags)
        else:
            long_name, dtype = EXTRA_VARIABLES[name]
            var = nc.createVariable(name, dtype, ("config",), **opts)
            var.units, var.long_name = "1", long_name
            if name == "constraint_violation" and space.constraints:
                var.flag_masks = np.array([1 << b for b in range(len(space.constraints))], np.int32)
                var.flag_meanings = " ".join(key for key, _, _ in space.constraints)
            if name == "feasible":
                var.flag_values = np.array([0, 1], np.int8)
                var.flag_meanings = "no yes"
        var.coordinates = coord_names


def _column_attrs(var, space: Space, c: str) -> None:
    long_name, units = COORD_ATTRS[c]
    var.long_name, var.units = long_name, units
    if c in CODE_COLUMNS:
        labels = space.labels(c)
        var.flag_values = np.arange(len(labels), dtype=np.int8)
        var.flag_meanings = " ".join(labels)


def dataset_attrs(study: Study, space: Space, chunk: int, fp: str, cal: Calibration) -> dict[str, Any]:
    entries = {
        "models": study.models,
        "gpus": study.gpus,
    }
    attrs: dict[str, Any] = {
        "title": f"HeterSim sweep: {study.name}",
        "Conventions": "CF-1.8",
        "source": "HeterSim analytical cost model (hetersim.simulate)",
        "study_name": study.name,
        "study_description": study.description,
        "study_toml": study.text,
        "objectives": " ".join(study.objectives),
        "objective_senses": " ".join(METRICS[o].sense for o in study.objectives),
        "constraints": json.dumps(study.constraints),
        "calibration": json.dumps({k: float(v) for k, v in vars(cal).items()}),
        "catalog_entries": json.dumps(entries, sort_keys=True),
        "fixed_plan": json.dumps(space.fixed, sort_keys=True),
        "sp_rule": "sp = on when tp > 1" if "auto" in study.axes["sp"] else "sp as given",
        "n_configs": space.size,
        "cross_product_size": study.cross_product_size,
        "chunk": chunk,
        "fingerprint": fp,
    }
    attrs.update({f"{k}_version": v for k, v in package_versions().items()})
    return attrs


# --------------------------------------------------------------------------------------------
# Streaming: the top-k per objective, the Pareto set and per-axis summaries instead of every row
# --------------------------------------------------------------------------------------------


def stream_fingerprint(fp: str, top_k: int) -> str:
    """Checkpoints of a streamed sweep: the full sweep's fingerprint plus what the reduction keeps."""
    return hashlib.sha256(f"{fp} stream top_k={top_k} max_front={MAX_FRONT}".encode()).hexdigest()


@dataclass(frozen=True)
class StreamState:
    """What a streamed sweep keeps. :meth:`Reducer.add` returns a new one (nothing is changed in
    place), so Ctrl-C between chunks always leaves a consistent state to checkpoint.

    ``rows``: ``index`` (flat) and every variable of :func:`variables` for the kept rows;
    ``kept``: their ``kept_because`` bits; per group of :attr:`Reducer.groups`, ``feasible``
    configurations per key and ``best`` (objectives x keys, in "smaller is better" form, +inf
    where no feasible configuration); ``reasons``: configurations per :class:`Infeasible` flag;
    ``done``: finished chunks; ``thinned``: fronts cut to :data:`MAX_FRONT`.
    """

    rows: dict[str, np.ndarray]
    kept: np.ndarray
    feasible: tuple[np.ndarray, ...]
    best: tuple[np.ndarray, ...]
    reasons: np.ndarray
    done: np.ndarray
    thinned: int = 0


class Reducer:
    """Folds evaluated chunks into a :class:`StreamState` on the host (NumPy).

    * Top-k: per objective, the ``k`` best feasible configurations, ties broken by the lower flat
      index (so the result does not depend on the order chunks finish in). A chunk contributes
      only rows at least as good as the current k-th.
    * Pareto set: per model (as ``hetersim report`` draws it), the feasible configurations no
      other feasible configuration of that model beats in every objective (equal points all
      kept, as :func:`dse.pareto.pareto_mask` does). A chunk's rows are first screened against the
      kept front (exactly with one or two objectives, against :data:`ANCHORS` of its points with
      more), and the survivors merged with it by :func:`pareto_mask`. A front of more than
      :data:`MAX_FRONT` points is thinned to that many, spread evenly along the first objective
      (both ends kept); the file then says ``pareto_thinned > 0`` and the kept front is a subset
      (a later point dominated only by a dropped one may be kept too).
    * Marginals: feasible configurations and the best value of each objective per key of a few
      *groups*: *blocks* of consecutive factors whose lengths multiply to at most
      :data:`BLOCK_KEYS` (key: the block's mixed-radix digit, so one ``bincount`` and one
      ``fmin.at`` per objective serve several axes), and ``sp`` as resolved (0/1).
      :meth:`marginals` reduces them to each column at the end; configuration counts per value
      need no accumulation (every factor row occurs ``size / length`` times).
    """

    def __init__(self, space: Space, objectives: Sequence[str], chunk: int, k: int):
        self.space, self.chunk, self.k = space, chunk, k
        self.objectives = tuple(objectives)
        self.sign = np.array([-1.0 if METRICS[o].sense == "max" else 1.0 for o in self.objectives])
        self.n_chunks = -(-space.size // chunk)
        self.flags = np.array([int(f) for f in Infeasible if f], np.int64)
        self.factor_of = {c: f for f, (_, table) in enumerate(space.factors) for c in table}
        blocks: list[list[int]] = []
        for f, r in enumerate(space.radices):
            if blocks and math.prod(space.radices[g] for g in blocks[-1]) * r <= BLOCK_KEYS:
                blocks[-1].append(f)
            else:
                blocks.append([f])
        self.blocks = tuple(tuple(b) for b in blocks)
        self.block_of = {f: (b, i) for b, block in enumerate(self.blocks) for i, f in enumerate(block)}
        self.groups = (*(math.prod(space.radices[f] for f in b) for b in self.blocks), 2)  # keys per group

    # -- state ---------------------------------------------------------------------------------

    def empty(self) -> StreamState:
        rows = {"index": np.zeros(0, np.int64)}
        for name in variables():
            dtype = METRICS[name].dtype if name in METRICS else EXTRA_VARIABLES[name][1]
            rows[name] = np.zeros(0, np.dtype(dtype))
        return StreamState(
            rows=rows,
            kept=np.zeros(0, np.int32),
            feasible=tuple(np.zeros(n, np.int64) for n in self.groups),
            best=tuple(np.full((len(self.objectives), n), np.inf) for n in self.groups),
            reasons=np.zeros(len(self.flags), np.int64),
            done=np.zeros(self.n_chunks, bool),
        )

    def to_arrays(self, state: StreamState) -> dict[str, np.ndarray]:
        out = {f"row_{k}": v for k, v in state.rows.items()}
        out.update(kept=state.kept, reasons=state.reasons, done=state.done, thinned=np.int64(state.thinned))
        for g in range(len(self.groups)):
            out.update({f"feasible_{g}": state.feasible[g], f"best_{g}": state.best[g]})
        return out

    def from_arrays(self, arrays: Mapping[str, np.ndarray] | None) -> StreamState:
        """The state saved by :meth:`to_arrays` (an empty one for None)."""
        if arrays is None:
            return self.empty()
        n = range(len(self.groups))
        return StreamState(
            rows={k.removeprefix("row_"): v for k, v in arrays.items() if k.startswith("row_")},
            kept=arrays["kept"],
            feasible=tuple(arrays[f"feasible_{g}"] for g in n),
            best=tuple(arrays[f"best_{g}"] for g in n),
            reasons=arrays["reasons"],
            done=arrays["done"].astype(bool),
            thinned=int(arrays["thinned"]),
        )

    # -- one chunk -----------------------------------------------------------------------------

    def values(self, arrays: Mapping[str, np.ndarray], pick: np.ndarray | None = None) -> np.ndarray:
        """Objectives x rows, negated where larger is better (so smaller is better everywhere)."""
        cols = [np.asarray(arrays[o] if pick is None else arrays[o][pick], np.float64) for o in self.objectives]
        return np.stack(cols) * self.sign[:, None]

    def digit(self, f: int, index: np.ndarray) -> np.ndarray:
        """Factor ``f``'s row of flat indices ``index``."""
        stride = math.prod(self.space.radices[f + 1 :])
        return (index // stride) % self.space.radices[f]

    def models(self, index: np.ndarray) -> np.ndarray:
        f = self.factor_of["model"]
        return self.space.factors[f][1]["model"][self.digit(f, index)]

    def add(self, state: StreamState, index: int, arrays: Mapping[str, Any]) -> StreamState:
        """``state`` with chunk ``index`` (its evaluated ``arrays``, padded or not) folded in."""
        lo = index * self.chunk
        n = min(self.chunk, self.space.size - lo)
        fpos = np.flatnonzero(np.asarray(arrays["feasible"])[:n])
        v = self.values({o: np.asarray(arrays[o]) for o in self.objectives}, fpos)

        keys = _host_digits(lo, n, self.groups[:-1])
        keys.append(self._sp(keys))
        feasible, best = [], []
        for g, (key, size) in enumerate(zip(keys, self.groups, strict=True)):
            b = state.best[g].copy()
            kf = key[fpos]
            feasible.append(state.feasible[g] + np.bincount(kf, minlength=size))
            for j in range(len(v)):
                np.fmin.at(b[j], kf, v[j])
            best.append(b)
        flags = np.asarray(arrays["infeasible"])[:n]
        per_value = np.bincount(flags[flags != 0])
        seen = np.flatnonzero(per_value)
        reasons = state.reasons + ((seen[:, None] & self.flags) != 0).astype(np.int64).T @ per_value[seen]
        done = state.done.copy()
        done[index] = True
        counts = dict(feasible=tuple(feasible), best=tuple(best), reasons=reasons, done=done)

        cand = self._candidates(state, v, lo + fpos)
        if not cand.any():
            return replace(state, **counts)
        pick = fpos[cand]
        new = {"index": (lo + pick).astype(np.int64), **{name: np.asarray(arrays[name])[pick] for name in variables()}}
        rows = {name: np.concatenate([state.rows[name], new[name]]) for name in state.rows}
        kept, thinned = self.select(rows)
        keep = kept != 0
        return StreamState(
            rows={name: r[keep] for name, r in rows.items()},
            kept=kept[keep],
            thinned=state.thinned + thinned,
            **counts,
        )

    def _factor_digit(self, keys: Sequence[np.ndarray], f: int) -> np.ndarray:
        b, i = self.block_of[f]
        if self.space.radices[f] == 1:
            return np.zeros(len(keys[b]), np.int64)
        inner = math.prod(self.space.radices[g] for g in self.blocks[b][i + 1 :])
        return (keys[b] // inner) % self.space.radices[f]

    def _sp(self, keys: Sequence[np.ndarray]) -> np.ndarray:
        """``sp`` as the sweep resolves it (on when tp > 1 for the code -1), per row."""
        ft, fs = self.factor_of["tp"], self.factor_of["sp"]
        tp = self.space.factors[ft][1]["tp"][self._factor_digit(keys, ft)]
        code = self.space.factors[fs][1]["sp"][self._factor_digit(keys, fs)]
        return np.where(code < 0, tp > 1, code).astype(np.int64)

    def _candidates(self, state: StreamState, v: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Which feasible rows of a chunk may enter the kept set: those at least as good as the
        current k-th of some objective, and those the kept front of their model does not dominate."""
        cand = np.zeros(v.shape[1], bool)
        if not len(cand):
            return cand
        kept_v = self.values(state.rows)
        for j in range(len(v)):
            mine = (state.kept & (1 << (1 + j))) != 0
            ok = ~np.isnan(v[j])
            if np.count_nonzero(mine) >= self.k:
                ok &= v[j] <= kept_v[j][mine].max()
            if np.count_nonzero(ok) > self.k:
                ok &= v[j] <= np.partition(v[j][ok], self.k - 1)[self.k - 1]
            cand |= ok
        models = self.models(index)
        kept_models = self.models(state.rows["index"])
        on_front = (state.kept & PARETO_BIT) != 0
        for m in np.flatnonzero(np.bincount(models)):
            sel = models == m
            front = kept_v[:, on_front & (kept_models == m)]
            cand[sel] |= _maybe_front(v[:, sel].T, front.T)
        return cand

    def select(self, rows: Mapping[str, np.ndarray]) -> tuple[np.ndarray, int]:
        """``kept_because`` bits of candidate ``rows`` (0: drop it) and how many fronts were thinned."""
        v = self.values(rows)
        index = rows["index"]
        kept = np.zeros(len(index), np.int32)
        for j in range(len(v)):
            ok = np.flatnonzero(~np.isnan(v[j]))
            best = ok[np.lexsort((index[ok], v[j][ok]))][: self.k]
            kept[best] |= 1 << (1 + j)
        thinned = 0
        models = self.models(index)
        for m in np.unique(models):
            sel = np.flatnonzero(models == m)
            on = sel[pareto_mask(v[:, sel].T)]
            if len(on) > MAX_FRONT:
                on = on[np.lexsort((index[on], v[0][on]))]
                on = on[np.unique(np.round(np.linspace(0, len(on) - 1, MAX_FRONT)).astype(np.int64))]
                thinned += 1
            kept[on] |= PARETO_BIT
        return kept, thinned

    # -- results -------------------------------------------------------------------------------

    def n_feasible(self, state: StreamState) -> int:
        return int(state.feasible[0].sum())

    def marginals(self, state: StreamState) -> dict[str, tuple[np.ndarray, ...]]:
        """Per column: (values, configurations, feasible configurations, best per objective in the
        metric's own sense (NaN where none is feasible), objectives x values)."""
        radices, size, n_obj = self.space.radices, self.space.size, len(self.objectives)
        per_row = {}  # factor -> (configurations, feasible, best) per row of the factor
        for b, block in enumerate(self.blocks):
            shape = tuple(radices[f] for f in block)
            feasible = state.feasible[b].reshape(shape)
            best = state.best[b].reshape(n_obj, *shape)
            for i, f in enumerate(block):
                other = tuple(a for a in range(len(block)) if a != i)
                count = np.full(radices[f], size // radices[f], np.int64)
                per_row[f] = (
                    count,
                    feasible.sum(axis=other),
                    np.fmin.reduce(best, axis=tuple(a + 1 for a in other)) if other else best,
                )
        # sp as resolved: each (tp row, sp row) pair occurs size / (their lengths) times.
        ft, fs = self.factor_of["tp"], self.factor_of["sp"]
        tp, code = self.space.factors[ft][1]["tp"], self.space.factors[fs][1]["sp"]
        if ft == fs:
            resolved = np.where(code < 0, tp > 1, code)
            sp_count = np.bincount(resolved, minlength=2) * (size // radices[ft])
        else:
            resolved = np.where(code[None, :] < 0, tp[:, None] > 1, code[None, :])
            sp_count = np.bincount(resolved.reshape(-1), minlength=2) * (size // (radices[ft] * radices[fs]))
        out = {}
        coords = self.space.coords(0, 0)
        for c in COLUMNS:
            if c == "sp":
                values = np.flatnonzero(sp_count)
                count, feasible, best = sp_count[values], state.feasible[-1][values], state.best[-1][:, values]
            else:
                f = self.factor_of[c]
                values, inv = np.unique(self.space.factors[f][1][c], return_inverse=True)
                inv = inv.reshape(-1)
                count = np.zeros(len(values), np.int64)
                feasible = np.zeros(len(values), np.int64)
                best = np.full((n_obj, len(values)), np.inf)
                np.add.at(count, inv, per_row[f][0])
                np.add.at(feasible, inv, per_row[f][1])
                for j in range(n_obj):
                    np.fmin.at(best[j], inv, per_row[f][2][j])
            best = np.where(np.isinf(best), np.nan, best * self.sign[:, None])
            out[c] = (values.astype(coords[c].dtype), count, feasible, best)
        return out


def _host_digits(start: int, n: int, radices: Sequence[int]) -> list[np.ndarray]:
    """Mixed-radix digits of ``start .. start+n-1`` (NumPy; division only, which is faster than %)."""
    q = np.arange(start, start + n, dtype=np.int64)
    out = []
    for r in reversed(radices):
        if r == 1:
            out.append(np.zeros(n, np.int64))
            continue
        nq = q // r
        out.append(q - nq * r)
        q = nq
    return out[::-1]


def _maybe_front(points: np.ndarray, front: np.ndarray) -> np.ndarray:
    """Which of ``points`` (n x k, smaller is better) no row of ``front`` (a Pareto front) is known
    to dominate: exact for k <= 2, against :data:`ANCHORS` front points for more. NaN rows: False."""
    ok = ~np.isnan(points).any(axis=1)
    if not len(front) or not ok.any():
        return ok
    k = points.shape[1]
    if k == 1:
        return ok & (points[:, 0] <= front[:, 0].min())
    if k == 2:
        # Along a front sorted by x, y falls: the last point with x <= px has the least y of them.
        order = np.lexsort((front[:, 1], front[:, 0]))
        fx, fy = front[order, 0], front[order, 1]
        j = np.searchsorted(fx, points[:, 0], side="right") - 1
        qx, qy = fx[np.maximum(j, 0)], fy[np.maximum(j, 0)]
        dominated = (j >= 0) & (qy <= points[:, 1]) & ((qx < points[:, 0]) | (qy < points[:, 1]))
        return ok & ~dominated
    spread = np.round(np.linspace(0, len(front) - 1, min(len(front), ANCHORS))).astype(np.int64)
    dominated = np.zeros(len(points), bool)
    for q in front[np.unique(np.r_[spread, front.argmin(axis=0)])]:
        dominated |= (q <= points).all(axis=1) & (q < points).any(axis=1)
    return ok & ~dominated


def write_streamed(
    path: Path,
    study: Study,
    space: Space,
    reducer: Reducer,
    state: StreamState,
    chunk: int,
    fp: str,
    cal: Calibration,
) -> None:
    """The netCDF file of a streamed sweep (temporary name, then renamed).

    ``config`` holds only the kept rows, ordered by flat index (the ``config`` coordinate), with
    the columns and variables of a full dataset plus ``kept_because``; per column ``c`` a
    dimension ``marginal_c`` (its values) with ``n_configs_by_c``, ``n_feasible_by_c`` and
    ``best_<objective>_by_c`` over every configuration evaluated.
    """
    import netCDF4

    order = np.argsort(state.rows["index"], kind="stable")
    index = state.rows["index"][order]
    tmp = path.with_name(f".{path.name}.tmp")
    opts = dict(zlib=True, complevel=COMPRESSION_LEVEL, shuffle=True)
    try:
        with netCDF4.Dataset(tmp, "w", format="NETCDF4") as nc:
            nc.createDimension("config", len(index))
            var = nc.createVariable("config", "i8", ("config",), **opts)
            var.long_name = "flat index of the configuration in the study's space (mixed radix over its factors)"
            var.units = "1"
            _define_config_variables(nc, space, opts)
            kept = nc.createVariable("kept_because", "i4", ("config",), **opts)
            kept.long_name, kept.units = "why the streamed sweep kept the configuration (bit flags)", "1"
            kept.flag_masks = np.array([1 << b for b in range(1 + len(reducer.objectives))], np.int32)
            kept.flag_meanings = " ".join(["pareto", *(f"top_k_{o}" for o in reducer.objectives)])
            kept.coordinates = " ".join(COLUMNS)
            if len(index):
                nc["config"][:] = index
                for c, values in space.coords_at(index).items():
                    nc[c][:] = values
                for name in variables():
                    nc[name][:] = state.rows[name][order]
                kept[:] = state.kept[order]
            for c, (values, count, feasible, best) in reducer.marginals(state).items():
                dim = f"marginal_{c}"
                nc.createDimension(dim, len(values))
                var = nc.createVariable(dim, values.dtype, (dim,))
                _column_attrs(var, space, c)
                var[:] = values
                for name, data, long_name in (
                    (f"n_configs_by_{c}", count, f"configurations per {c}"),
                    (f"n_feasible_by_{c}", feasible, f"feasible configurations per {c}"),
                ):
                    var = nc.createVariable(name, "i8", (dim,))
                    var.long_name, var.units = long_name, "1"
                    var[:] = data
                for j, o in enumerate(reducer.objectives):
                    m = METRICS[o]
                    var = nc.createVariable(f"best_{o}_by_{c}", "f4", (dim,))
                    word = "lowest" if m.sense == "min" else "highest"
                    var.long_name = f"{word} {m.long_name} among feasible configurations, per {c}"
                    var.units = m.units
                    var[:] = best[j].astype(np.float32)
            attrs = dataset_attrs(study, space, chunk, fp, cal)
            reasons = {f.name.lower(): int(c) for f, c in zip([f for f in Infeasible if f], state.reasons, strict=True)}
            attrs.update(
                streamed=1,
                top_k=reducer.k,
                n_kept=len(index),
                n_feasible=reducer.n_feasible(state),
                infeasible_reasons=json.dumps({k: v for k, v in reasons.items() if v}),
                pareto_scope="per model",
                pareto_max_points=MAX_FRONT,
                pareto_thinned=state.thinned,
            )
            nc.setncatts(attrs)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------

SUMMARY_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "mfu", "hbm_used_GiB", "time_to_train_s", "cost_usd")


def describe(ds, index: int) -> dict[str, Any]:
    """Configuration ``index`` of a sweep dataset with categorical codes turned into names."""
    out: dict[str, Any] = {}
    for c in COLUMNS:
        var = ds[c]
        value = int(var.isel(config=index).values)
        if "flag_meanings" in var.attrs:
            value = var.attrs["flag_meanings"].split()[value]
        out[c] = value
    return out


def summarize(path: str | Path) -> dict[str, Any]:
    """Size, feasible count, infeasibility reasons and the best feasible configuration per objective
    (of a streamed file: counts over every configuration evaluated, from its attributes; ``index``
    is the flat index, as in a full dataset)."""
    import xarray as xr

    with xr.open_dataset(path) as ds:
        streamed = bool(ds.attrs.get("streamed", 0))
        feasible = ds["feasible"].values.astype(bool)
        flags = ds["infeasible"].values
        if streamed:
            reasons = json.loads(ds.attrs["infeasible_reasons"])
        else:
            reasons = {f.name.lower(): int(np.count_nonzero(flags & int(f))) for f in Infeasible if f}
        best: dict[str, Any] = {}
        for name in ds.attrs["objectives"].split():
            values = ds[name].values.astype(np.float64)
            sense = METRICS[name].sense
            if not feasible.any():
                best[name] = None
                continue
            masked = np.where(feasible, values if sense == "min" else -values, np.inf)
            i = int(np.argmin(masked))
            best[name] = {
                "value": float(values[i]),
                "units": METRICS[name].units,
                "sense": sense,
                "index": int(ds["config"].values[i]) if streamed else i,
                "config": describe(ds, i),
                "metrics": {m: float(ds[m].isel(config=i).values) for m in SUMMARY_METRICS},
            }
        out = {
            "study": ds.attrs["study_name"],
            "path": str(path),
            "n_configs": int(ds.attrs["n_configs"]) if streamed else int(ds.sizes["config"]),
            "cross_product_size": int(ds.attrs["cross_product_size"]),
            "n_feasible": int(ds.attrs["n_feasible"]) if streamed else int(feasible.sum()),
            "infeasible_reasons": {k: v for k, v in reasons.items() if v},
            "best": best,
        }
        if streamed:
            out.update(streamed=True, n_kept=int(ds.sizes["config"]), top_k=int(ds.attrs["top_k"]))
        return out
