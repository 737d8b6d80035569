"""The space of a sweep: a product of factors, and how a flat index decodes into a configuration.

The space is a cross product of *factors*, each a small table of rows (one column per plan
field: a plain axis is a one-column factor; ``n_gpus, tp, pp, cp, micro_batch, global_batch``
form one factor holding only the rows whose ``dp = n_gpus / (tp*pp*cp)`` is an integer and whose
global batch is a multiple of ``micro_batch * dp``, the cheap integer rules the host applies).
Configuration ``i`` is the mixed-radix decoding of ``i`` over the factors' lengths (:func:`digits`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dse.metrics import constraint_metric
from dse.study import Study, fixed_plan
from hetersim import build, planfields
from hetersim.cluster import ClusterSpec, cluster_spec
from hetersim.fit import intervals
from hetersim.specs import ModelSpec, Plan, SystemSpec
from hetersim.types import STACK

DEFAULT_CHUNK = 16384  # fastest measured on the 2-core CPU (benchmarks/bench_sweep.py)
MAX_CONFIGS = 2**31 - 1  # configurations are indexed by int32 inside the compiled function

# Every plan field a configuration takes from the space, in coordinate order (from the registry,
# hetersim.planfields). ``model`` and ``gpu`` are indices into the study's lists; choices are
# hetersim.types codes; ``sp`` is -1 (on when tp > 1), 0 or 1 in the tables and 0 or 1 in the results.
COLUMNS = ("model", "gpu", *planfields.COLUMNS)
CODE_COLUMNS = ("model", "gpu", *(f.name for f in planfields.FIELDS if f.coded))
# Plan leaves shared by all configurations of a study (the registry's scalars).
FIXED_FIELDS = tuple(planfields.BY_NAME[k].leaf for k in planfields.SCALARS)
LAYOUT_COLUMNS = planfields.LAYOUT
# Axes other than the layout: one factor each.
SINGLE_AXES = tuple(a for a in planfields.AXES if a not in planfields.LAYOUT)


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
    memory: dict[str, dict[str, Any]] | None = None  # the catalog's memory devices (None: packaged)
    fleets: dict[str, dict[str, Any]] | None = None  # the catalog's fleets (None: packaged)

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
        return _stack(build.uniform_models([build.model_spec(e) for e in self.model_entries.values()]))

    @functools.cached_property
    def systems(self) -> SystemSpec | ClusterSpec:
        """One system per GPU kind, or one :class:`ClusterSpec` per mix when the study has mixes."""
        if self.clusters:
            return _stack([self.cluster(label) for label in self.clusters])
        return _stack([self.system(k) for k in self.gpu_entries])

    def system(self, key: str) -> SystemSpec:
        """One GPU kind's specs, its host tiers and fleet from the study's catalog."""
        return build.system_spec(self.gpu_entries[key], self.links, memory=self.memory, fleets=self.fleets)

    def cluster(self, label: str) -> ClusterSpec:
        groups = [(self.gpu_entries[k], c) for k, c in self.clusters[label]]
        return cluster_spec(groups, self.links, self.hetero, memory=self.memory, fleets=self.fleets)

    @functools.cached_property
    def base_plan(self) -> Plan:
        """A plan carrying the fixed fields (its layout fields are placeholders)."""
        return build.plan_spec(n_gpus=1, global_batch=1, seq_len=1, **self.fixed)

    @property
    def kinds(self) -> tuple[tuple[str, str], ...]:
        """The static part of the constraints: ``(metric, sense)`` per bit."""
        return tuple((metric, sense) for _, metric, sense in self.constraints)

    def fixed_arrays(self) -> dict[str, np.ndarray]:
        """The plan fields every configuration shares (:data:`FIXED_FIELDS`), as host arrays."""
        return {k: np.asarray(getattr(self.base_plan, k)) for k in FIXED_FIELDS}

    def tables(self) -> dict[str, Any]:
        """The arrays :func:`dse.sweep.evaluate.evaluate_chunk` takes (host NumPy; JAX moves them once per call)."""
        factors = [
            {c: v.astype(np.int32 if c in CODE_COLUMNS else np.float32) for c, v in t.items()} for _, t in self.factors
        ]
        return {
            "factors": factors,
            "models": jax.tree.map(np.asarray, self.models),
            "systems": jax.tree.map(np.asarray, self.systems),
            "fixed": self.fixed_arrays(),
            "limits": np.asarray(self.limits, np.float32).reshape(len(self.limits)),
            "interval": self.interval_table(),
        }

    def interval_table(self, model: Any = None) -> dict[str, Any]:
        """What :func:`dse.sweep.evaluate.step_time_interval` takes: the stored interval model's
        numbers (:func:`hetersim.fit.intervals.params`) and, per code of the ``gpu`` column, its
        device flag (a mix: flagged when any of its kinds is), per code of the plan's ``stack``
        its stack flag, and the flag a mixture-of-experts model takes."""
        model = model if model is not None else intervals.load_intervals()
        ev = model.evidence
        kinds = {k: [k] for k in self.gpu_entries} if not self.clusters else {
            label: [k for k, _ in groups] for label, groups in self.clusters.items()}  # fmt: skip
        device = [max(intervals.device_flag(k, self.gpu_entries[k], ev) for k in ks) for ks in kinds.values()]
        as32 = lambda tree: jax.tree.map(lambda v: np.float32(v), tree)  # noqa: E731
        return {
            "params": as32(intervals.params(model)),
            "device": np.asarray(device, np.float32),
            "stack": np.asarray([intervals.stack_flag(name, ev) for name in STACK], np.float32),
            "max_seq_len": np.float32(ev.max_seq_len),
            "moe": np.float32(intervals.moe_flag(True, ev)),  # a mixture-of-experts model's flag
        }

    def coords(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Each column's value for configurations ``start..stop-1`` (``sp`` resolved to 0/1)."""
        return self.coords_at(np.arange(start, stop, dtype=np.int64))

    def coords_at(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Each column's value for the configurations of flat indices ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        out = {}
        for (_, table), digit in zip(self.factors, digits(idx, self.radices), strict=True):
            for c, v in table.items():
                out[c] = v[digit]
        out["sp"] = planfields.resolve_sp(out["sp"], out["tp"]).astype(np.int64)
        return {c: out[c].astype(np.int8 if c in CODE_COLUMNS else np.int32) for c in COLUMNS}

    def labels(self, column: str) -> tuple[str, ...]:
        """Names of a categorical column's codes."""
        if column == "model":
            return tuple(self.model_entries)
        if column == "gpu":
            return tuple(self.clusters) if self.clusters else tuple(self.gpu_entries)
        if column == "sp" or planfields.BY_NAME[column].kind == "bool":
            return ("off", "on")
        return planfields.CHOICES[column]

    def plan_kwargs(self, index: int) -> tuple[str, str, dict[str, Any]]:
        """(model key, gpu key, :func:`hetersim.build.plan_spec` keywords) of configuration ``index``."""
        row = {c: int(v[0]) for c, v in self.coords(index, index + 1).items()}
        kw: dict[str, Any] = {c: planfields.decode(c, row[c]) for c in planfields.COLUMNS}
        kw.update(self.fixed)
        return self.labels("model")[row["model"]], self.labels("gpu")[row["gpu"]], kw

    def specs(self, index: int) -> tuple[ModelSpec, SystemSpec | ClusterSpec, Plan]:
        """The one-configuration specs of ``index``, built by :mod:`hetersim.build` from names
        (the second is a :class:`ClusterSpec`, for :func:`simulate_cluster`, in a study of mixes)."""
        model, gpu, kw = self.plan_kwargs(index)
        system = self.cluster(gpu) if self.clusters else self.system(gpu)
        return build.model_spec(self.model_entries[model]), system, build.plan_spec(**kw)


def _stack(specs: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *specs)


def columns_plan(col: Mapping[str, Any], fixed: Mapping[str, Any], *, n_gpus, dp) -> Plan:
    """A batched :class:`Plan` from per-configuration plan columns (choices as codes, ``sp`` < 0
    meaning on whenever tp > 1) and the study's fixed leaves, broadcast to the batch."""
    batch = jnp.shape(col["tp"])[0]
    leaves = {k: jnp.broadcast_to(v, (batch, *jnp.shape(v))) for k, v in fixed.items()}
    leaves.update(n_gpus=jnp.broadcast_to(n_gpus, (batch,)), dp=dp)
    for name in planfields.AXES:
        leaves[planfields.BY_NAME[name].leaf] = col[name]
    leaves["sp"] = planfields.resolve_sp(col["sp"], col["tp"], xp=jnp).astype(jnp.float32)
    return Plan(**leaves)


def chunk_indices(start, radices: Sequence[int], chunk: int) -> Any:
    """Flat indices ``start .. start+chunk-1`` of a space of mixed radix ``radices``; those past its
    end repeat the last configuration (the caller trims them)."""
    return jnp.minimum(start + jnp.arange(chunk, dtype=jnp.int32), math.prod(radices) - 1)


def digits(idx, radices: Sequence[int]) -> list[Any]:
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
    for name in SINGLE_AXES:
        codes = [planfields.encode(name, v) for v in axes[name]]
        factors.append((name, {name: np.array(codes, dtype=np.int64)}))
    fixed = fixed_plan(study.scalars)
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
        memory=study.memory,
        fleets=study.fleets,
    )


def chunk_size(requested: int, size: int) -> int:
    """The chunk a sweep uses: ``requested``, or the next power of two at or above a smaller
    space's size (so a small study does not pay for a mostly padded chunk)."""
    if requested < 1:
        raise ValueError(f"--chunk must be a positive integer; got {requested}")
    return min(requested, max(256, 1 << max(size - 1, 1).bit_length()))
