"""The compiled evaluation of a batch of configurations, shared by sweeps and the bilevel search.

:func:`simulate_batch` runs the cost model over a batch (``jax.vmap`` of
:func:`hetersim.simulate.simulate`, or of :func:`hetersim.cluster.simulate_cluster` when the
system is a mix of GPU kinds); :func:`check_constraints` turns its outputs into what both callers
need from the study's constraints: the violation bits and the ``feasible`` flag of a sweep
dataset, and the relative violations and *class* (:data:`CLASS_NAMES`) by which the inner solver
of :mod:`dse.inner` picks a layout.

A sweep chunk is evaluated by :func:`evaluate_chunk`: one ``jax.jit`` of (decode
``start + arange(chunk)`` into per-factor rows with ``jnp`` gathers, build the batched specs,
simulate, check), compiled once per study shape and reused for every chunk, locally or on Dask
workers (:func:`chunk_task`), with :func:`compiler_options`. What the study shares and that
chooses is compiled in (:class:`Shared`); a chunk of one or two (model, GPU) groups runs a group
at a time with them unbatched (:func:`hardware_groups`), its layer costs once per distinct set of
the axes they read (:mod:`dse.sweep.hoist`); a chunk longer than :data:`BLOCK` runs as blocks of
it; the tables are placed on the device once per tables object.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dse.metrics import DERIVED, INTERVALS, METRICS
from dse.sweep import hoist as hoisting
from dse.sweep.space import CODE_COLUMNS, chunk_indices, columns_plan, digits
from hetersim import planfields
from hetersim.cluster import ClusterSpec, simulate_cluster
from hetersim.fit import intervals
from hetersim.simulate import plan_layer_costs, simulate
from hetersim.specs import Calibration

# A layout's class: the lowest is the best; see dse.inner for how a point picks its layout.
CLASS_NAMES = ("meets constraints", "violates a constraint", "does not run", "does not divide")

_TRACES = 0


def trace_count() -> int:
    """How many times :func:`evaluate_chunk` has been traced in this process (tests use it)."""
    return _TRACES


def simulate_batch(
    model: Any, system: Any, plan: Any, cal: Calibration, *, shared_hardware: bool = False, lc: Any = None
) -> Any:
    """The cost model's outputs for a batch of plans. ``model`` and ``system`` are batched along
    with ``plan`` or, with ``shared_hardware``, one for the whole batch. A :class:`ClusterSpec`
    system (a study of mixes; static, the study's structure) is simulated as a cluster and its
    ``total`` returned. ``lc``: the plans' layer costs where the caller computed them (batched;
    :mod:`dse.sweep.hoist`)."""
    in_axes = (None, None, 0, None) if shared_hardware else (0, 0, 0, None)
    if isinstance(system, ClusterSpec):
        return jax.vmap(simulate_cluster, in_axes=in_axes)(model, system, plan, cal).total
    if lc is not None:
        return jax.vmap(simulate, in_axes=(*in_axes, 0))(model, system, plan, cal, lc)
    return jax.vmap(simulate, in_axes=in_axes)(model, system, plan, cal)


def constraint_value(out: Any, metric: str) -> Any:
    """The value a constraint bounds: a metric, or one of :data:`dse.metrics.DERIVED`."""
    return out.hbm_used_GiB / out.hbm_capacity_GiB if metric in DERIVED else getattr(out, metric)


class Checks(NamedTuple):
    """The study constraints checked over a batch of configurations (JAX arrays).

    ``bits``: int32, bit ``b`` set where constraint ``b`` is violated; ``relative``: constraints x
    batch, the violation relative to the bound (> 0 violates); ``total``: the sum of the positive
    ones; ``cls``: the class (:data:`CLASS_NAMES`: 2 where the configuration does not run, else 1
    where ``total`` > 0, else 0; 3 where it does not divide the GPU count, when that is given);
    ``feasible``: int8, 1 where the configuration runs and no bit is set.
    """

    bits: Any
    relative: Any
    total: Any
    cls: Any
    feasible: Any


def check_constraints(out: Any, kinds: Sequence[tuple[str, str]], limits: Any, divides: Any | None = None) -> Checks:
    """The :class:`Checks` of outputs ``out`` against ``kinds`` (``(metric, sense)`` per
    constraint, static) with bounds ``limits``; ``divides`` (bool per configuration, optional)
    marks the layouts whose ``tp*pp*cp`` divides the GPU count."""
    n = jnp.shape(out.infeasible)[0]
    bits = jnp.zeros(n, jnp.int32)
    relative = []
    for bit, (metric, sense) in enumerate(kinds):
        value = constraint_value(out, metric)
        limit = limits[bit]
        bad = value > limit if sense == "max" else value < limit
        bits = bits | jnp.where(bad, jnp.int32(1 << bit), jnp.int32(0))
        excess = (value - limit) if sense == "max" else (limit - value)
        relative.append(excess / jnp.abs(limit))
    rel = jnp.stack(relative) if relative else jnp.zeros((0, n), jnp.float32)
    total = jnp.sum(jnp.maximum(rel, 0.0), axis=0)
    cls = jnp.where(out.infeasible != 0, 2, jnp.where(total > 0, 1, 0))
    if divides is not None:
        cls = jnp.where(~divides, 3, cls)
    feasible = ((out.infeasible == 0) & (bits == 0)).astype(jnp.int8)
    return Checks(bits=bits, relative=rel, total=total, cls=cls, feasible=feasible)


def factor_radices(factors: Sequence[Mapping[str, Any]]) -> list[int]:
    """Rows per factor of the tables (the mixed radix of the flat configuration index)."""
    return [next(iter(t.values())).shape[0] for t in factors]


def decode_columns(start, tables: Mapping[str, Any], *, chunk: int) -> dict[str, Any]:
    """The columns of configurations ``start .. start+chunk-1``: the flat indices decoded into
    per-factor rows with ``jnp`` gathers (indices past the end repeat the last configuration); a
    factor of one row is that row broadcast (a constant where :class:`Shared` put it back)."""
    factors = tables["factors"]
    radices = factor_radices(factors)
    idx = chunk_indices(start, radices, chunk)
    return {
        c: jnp.broadcast_to(t[c][0], (chunk,)) if r == 1 else t[c][d]
        for t, r, d in zip(factors, radices, digits(idx, radices), strict=True)
        for c in t
    }


# The plan leaves of a study's fixed fields that choose rather than measure (a choice, a switch,
# the offload tiers): :class:`Shared` compiles them in.
CODED_LEAVES = frozenset(
    f.leaf for f in planfields.FIELDS if f.name in planfields.SCALARS and f.kind in ("choice", "bool", "offload")
)


class Shared:
    """What every configuration of a study shares and that chooses rather than measures: the
    coded columns (choices, switches, the model and GPU codes) of factors of one row, and the
    coded fixed plan leaves (:data:`CODED_LEAVES`). :func:`evaluate_chunk` compiles them in as
    constants, so XLA drops the branches the study never takes (the bench: 2.7 -> 3.8-4.2 M
    configurations/s, 9,494 -> 6,765 FLOPs per configuration); numbers (sizes, bandwidths, token
    budgets) stay arguments, so a study that changes only them reuses the compiled chunk. Static
    (hashable) for ``jax.jit``."""

    def __init__(self, tables: Mapping[str, Any]):
        columns = []
        for i, (table, rows) in enumerate(zip(tables["factors"], factor_radices(tables["factors"]), strict=True)):
            if rows == 1:
                columns += [(i, c, np.asarray(v)) for c, v in table.items() if c in CODE_COLUMNS]
        self.columns = tuple(columns)
        self.fixed = tuple((k, np.asarray(v)) for k, v in tables["fixed"].items() if k in CODED_LEAVES)
        self._key = tuple((i, c, v.dtype.str, v.shape, v.tobytes()) for i, c, v in self.columns) + tuple(
            (k, v.dtype.str, v.shape, v.tobytes()) for k, v in self.fixed
        )

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shared) and self._key == other._key

    def runtime(self, tables: Mapping[str, Any]) -> dict[str, Any]:
        """``tables`` without what this holds (the arguments of the compiled chunk)."""
        moved = {(i, c) for i, c, _ in self.columns}
        out = dict(tables)
        out["factors"] = [{c: v for c, v in t.items() if (i, c) not in moved} for i, t in enumerate(tables["factors"])]
        fixed = dict(self.fixed)
        out["fixed"] = {k: v for k, v in tables["fixed"].items() if k not in fixed}
        return out

    def merge(self, tables: Mapping[str, Any]) -> dict[str, Any]:
        """The full tables again, this object's arrays as host constants (inside a trace)."""
        out = dict(tables)
        factors = [dict(t) for t in tables["factors"]]
        for i, c, v in self.columns:
            factors[i][c] = v
        out["factors"] = factors
        out["fixed"] = {**tables["fixed"], **dict(self.fixed)}
        return out


def decode_chunk(start, tables: Mapping[str, Any], *, chunk: int) -> tuple[Any, Any, Any]:
    """The batched (model, system, plan) specs of configurations ``start .. start+chunk-1``."""
    return specs_of(decode_columns(start, tables, chunk=chunk), tables)


def specs_of(col: Mapping[str, Any], tables: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    model, system = pick(tables["models"], col["model"]), pick(tables["systems"], col["gpu"])
    return model, system, decoded_plan(col, tables["fixed"])


def pick(stacked: Any, code) -> Any:
    """Row(s) ``code`` of a stacked spec: one model or system (a scalar code), or one per
    configuration (a column of codes)."""
    return jax.tree.map(lambda a: a[code], stacked)


def decoded_plan(col: Mapping[str, Any], fixed: Mapping[str, Any]) -> Any:
    """The batched plan of decoded columns (:func:`dse.sweep.space.columns_plan`)."""
    return columns_plan(col, fixed, n_gpus=col["n_gpus"], dp=col["dp"])


# XLA's CPU backend hands some reductions to YNNPACK (a "ynn fusion", jaxlib 0.10); the one that
# takes the largest bandwidth need over the memory tiers then makes XLA materialize its four
# [chunk, N_TIERS] operands as fusions that each recompute, for every tier, the
# per-configuration terms behind them (a third or more of a chunk's kernel time in a profile).
# Without YNNPACK fusions the bench's chunk ran 1.3-1.4x faster (1.16 -> 1.60 M configurations/s,
# medians of 4 interleaved rounds on the 2-core CPU) with the same outputs bit for bit.
# XLA's fast-math mode with NaNs, infinities, exact division and exact library functions all
# honoured leaves it free to reassociate sums and products and to fuse multiply-adds, no more:
# the bench 7.0 -> 8.4-8.8 M configurations/s (5,966 -> 5,068 FLOPs per configuration), the
# studies' datasets within 7e-6 relative of before (float32 rounding), flags and codes the same.
# XLA's CPU code generator prefers 256-bit vectors (``xla_cpu_prefer_vector_width``, default
# 256, xla/debug_options_flags.cc), which also sets how many elements its element-wise loops take
# per iteration; the chunk's fusions are bound by arithmetic, and with 512 the bench ran 1.3x
# faster on the 2-core AMD EPYC (medians 8.9-9.6 -> 12.2-12.7 M configurations/s, interleaved
# rounds), the outputs bit for bit the same. With the instruction set capped at AVX2
# (``xla_cpu_max_isa``, as on a CPU without AVX-512) it gained as much: 9.4 M/s at 256 against
# 11.9-12.8 M/s at 512, LLVM then running each 512-bit operation as two 256-bit ones.
CPU_COMPILER_OPTIONS = {
    "xla_cpu_prefer_vector_width": 512,
    "xla_cpu_experimental_ynn_fusion_type": "",
    "xla_cpu_enable_fast_math": True,
    "xla_cpu_fast_math_honor_nans": True,
    "xla_cpu_fast_math_honor_infs": True,
    "xla_cpu_fast_math_honor_division": True,
    "xla_cpu_fast_math_honor_functions": True,
}


@functools.cache
def compiler_options() -> dict[str, Any]:
    """The XLA options the chunk function compiles with: :data:`CPU_COMPILER_OPTIONS` on a CPU
    backend whose XLA has them (a one-line program is compiled with them to find out; this
    starts JAX), else none."""
    if jax.default_backend() != "cpu":
        return {}
    try:
        jax.jit(lambda x: x + 1, compiler_options=CPU_COMPILER_OPTIONS).lower(np.float32(0)).compile()
    except Exception:  # noqa: BLE001 - an older JAX (no compiler_options) or XLA (no such option)
        return {}
    return dict(CPU_COMPILER_OPTIONS)


def jit(fn: Any, **kwargs: Any) -> Any:
    """``jax.jit(fn, **kwargs)`` with :func:`compiler_options` (the chunk function and the stages
    ``hetersim bench --split`` times)."""
    options = compiler_options()
    return jax.jit(fn, **kwargs, **({"compiler_options": options} if options else {}))


# A chunk whose configurations share one model and one GPU (or mix) is evaluated with them
# unbatched, so what depends only on them is computed once per chunk, not per configuration.
# Studies put model and GPU outermost (dse.sweep.space.space_from_study), so a chunk holds one
# such group, or two where it straddles a boundary (evaluated once per group and merged).
MAX_GROUP_PASSES = 2
# On the CPU, a chunk longer than this (and a multiple of it) is evaluated as blocks of this many
# configurations, one compiled program called in turn, and joined: XLA's CPU code for a longer
# batch keeps more intermediates (6.5 against 4.6 KB per configuration) and streams them
# through memory instead of cache (the bench: 3.1 M/s at 262,144 as one program). A GPU takes
# the whole chunk at once.
BLOCK = 16384


def hardware_groups(tables: Mapping[str, Any], chunk: int) -> int | None:
    """The configurations per (model, GPU) group when every chunk of ``chunk`` configurations
    falls in at most :data:`MAX_GROUP_PASSES` groups (model and GPU the outermost factors, and a
    group at least a chunk long or few groups); None otherwise (each configuration then gathers
    its own model and GPU)."""
    factors = tables["factors"]
    lead = _hardware_lead(factors)
    if {c for t in factors[:lead] for c in t} != {"model", "gpu"}:
        return None
    radices = factor_radices(factors)
    inner, groups = math.prod(radices[lead:]), math.prod(radices[:lead])
    return inner if inner >= chunk or groups <= MAX_GROUP_PASSES else None


def _hardware_lead(factors: Sequence[Mapping[str, Any]]) -> int:
    """How many leading factors hold only the model and GPU columns."""
    lead = 0
    while lead < len(factors) and set(factors[lead]) <= {"model", "gpu"}:
        lead += 1
    return lead


def chunk_groups(tables: Mapping[str, Any], start: int, chunk: int, inner: int) -> list[tuple[int, np.ndarray]]:
    """(first position in the chunk, [model code, GPU code]) of each group the configurations
    ``start .. start+chunk-1`` fall in (indices past the end repeat the last configuration)."""
    factors = tables["factors"]
    radices = factor_radices(factors)
    size = math.prod(radices)
    lead = _hardware_lead(factors)
    out = []
    for g in range(min(start, size - 1) // inner, (min(start + chunk, size) - 1) // inner + 1):
        rows = digits(g, radices[:lead])
        codes = {c: int(np.asarray(t[c])[r]) for t, r in zip(factors[:lead], rows, strict=True) for c in t}
        out.append((max(g * inner - start, 0), np.array([codes["model"], codes["gpu"]], np.int32)))
    return out


@functools.partial(jax.jit, static_argnames="chunk")
def _merge(first: Any, second: Any, split, *, chunk: int) -> Any:
    """``first`` before position ``split`` of the chunk, ``second`` from it on."""
    keep = jnp.arange(chunk) < split
    return jax.tree.map(lambda a, b: jnp.where(keep, a, b), first, second)


class _ChunkFunction:
    """:func:`evaluate_chunk`: the jitted functions are made at their first call or ``lower``,
    since :func:`compiler_options` compiles (importing this module must not: the command line
    sets up the compilation cache first, :func:`hetersim.compile_cache.enable`). The tables are
    split into their :class:`Shared` part, compiled in, and the rest, passed as arguments; a
    study whose chunks hold one or two (model, GPU) groups (:func:`hardware_groups`) is
    evaluated a group at a time with them unbatched."""

    @functools.cached_property
    def jitted(self) -> Any:
        return jit(_evaluate_chunk, static_argnames=("chunk", "kinds", "shared"))

    @functools.cached_property
    def grouped(self) -> Any:
        return jit(_evaluate_group, static_argnames=("chunk", "kinds", "shared", "hoist"))

    def __call__(self, start, tables: Mapping[str, Any], cal: Calibration, *, chunk: int, kinds: tuple) -> Any:
        key = (id(tables), chunk, kinds)
        hit = self._recent.get(key)
        if hit is None or hit[0] is not tables:  # the same tables object, not a new one at its address
            if len(self._recent) >= 8:
                self._recent.clear()
            hit = self._recent[key] = (tables, self._stage(tables, chunk, kinds, None))
        return hit[1](start, tables, cal)

    @functools.cached_property
    def _recent(self) -> dict[tuple, tuple[Any, _Staged]]:
        """The staged function of the last tables called with (a sweep calls with one object)."""
        return {}

    def lower(self, start, tables: Mapping[str, Any], cal: Calibration, *, chunk: int, kinds: tuple) -> Any:
        return self._stage(tables, chunk, kinds, (start, cal))

    def _stage(self, tables: Mapping[str, Any], chunk: int, kinds: tuple, lower: tuple | None) -> _Staged:
        shared = Shared(tables)
        block = BLOCK if chunk > BLOCK and chunk % BLOCK == 0 and jax.default_backend() == "cpu" else chunk
        inner = hardware_groups(tables, block)
        jitted = self.jitted if inner is None else self.grouped
        static = {"chunk": block, "kinds": kinds, "shared": shared}
        if inner is not None:
            static["hoist"] = hoisting.ENABLED
        if lower is None:
            return _Staged(functools.partial(jitted, **static), shared, chunk, block, inner)
        start, cal = lower
        head = () if inner is None else (chunk_groups(tables, int(start), block, inner)[0][1],)
        lowered = jitted.lower(start, *head, shared.runtime(tables), cal, **static)
        return _Staged(lowered, shared, chunk, block, inner)


class _Staged:
    """The chunk function, jitted, lowered or compiled (JAX's object, whose other attributes it
    passes on), called with the full tables as :func:`evaluate_chunk` is: it splits off the
    :class:`Shared` part; a chunk longer than :data:`BLOCK` runs as blocks of it, joined; and,
    grouped, each block runs once per (model, GPU) group it holds, merged."""

    def __init__(self, staged: Any, shared: Shared, chunk: int, block: int, inner: int | None):
        self._staged, self._shared, self._inner = staged, shared, inner
        self._chunk, self._block = chunk, block
        self._placed: tuple[Any, Any] | None = None
        self._cal: tuple[Any, Any] | None = None
        self._codes: dict[tuple[int, int], Any] = {}

    def _runtime(self, tables: Mapping[str, Any]) -> Any:
        """The tables' arguments of the compiled program, placed on the device once per tables
        object (a sweep's chunks share one): moving the host arrays at every call took a fifth
        of a 16,384-configuration chunk's time."""
        if self._placed is None or self._placed[0] is not tables:
            self._placed = (tables, jax.device_put(self._shared.runtime(tables)))
        return self._placed[1]

    @property
    def block(self) -> int:
        """Configurations per call of the compiled program (:data:`BLOCK`, or the whole chunk)."""
        return self._block

    def compile(self) -> _Staged:
        """Compile (and the joins of blocks and groups, so no chunk pays for them)."""
        compiled = self._staged.compile()
        shapes = getattr(compiled, "out_info", None)  # older JAX: the joins compile at first use
        zeros = None if shapes is None else jax.tree.map(lambda o: jnp.zeros(o.shape, o.dtype), shapes)
        if zeros is not None and self._inner is not None:
            jax.block_until_ready(_merge(zeros, zeros, np.int32(0), chunk=self._block))
        if zeros is not None and self._chunk > self._block:
            jax.block_until_ready(_join([zeros] * (self._chunk // self._block)))
        staged = _Staged(compiled, self._shared, self._chunk, self._block, self._inner)
        staged._placed, staged._cal, staged._codes = self._placed, self._cal, self._codes
        return staged

    def __call__(self, start, tables: Mapping[str, Any], cal: Calibration) -> Any:
        runtime = self._runtime(tables)
        if self._cal is None or self._cal[0] is not cal:
            self._cal = (cal, jax.device_put(cal))
        cal = self._cal[1]
        blocks = [self._run_block(int(start) + b, tables, runtime, cal) for b in range(0, self._chunk, self._block)]
        return blocks[0] if len(blocks) == 1 else _join(blocks)

    def _run_block(self, start: int, tables: Mapping[str, Any], runtime: Mapping[str, Any], cal: Calibration) -> Any:
        if self._inner is None:
            return self._staged(np.int32(start), runtime, cal)
        out = None
        for split, hardware in chunk_groups(tables, start, self._block, self._inner):
            codes = (int(hardware[0]), int(hardware[1]))
            if codes not in self._codes:
                self._codes[codes] = jax.device_put(hardware)
            part = self._staged(np.int32(start), self._codes[codes], runtime, cal)
            out = part if out is None else _merge(out, part, np.int32(split), chunk=self._block)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._staged, name)


@jax.jit
def _join(blocks: list[Any]) -> Any:
    """The outputs of consecutive blocks as one chunk's."""
    return jax.tree.map(lambda *parts: jnp.concatenate(parts), *blocks)


evaluate_chunk = _ChunkFunction()


def _evaluate_chunk(
    start, tables: Mapping[str, Any], cal: Calibration, *, chunk: int, kinds: tuple, shared: Shared
) -> dict[str, Any]:
    """Metrics of configurations ``start .. start+chunk-1`` (indices past the end repeat the
    last configuration; the caller trims them). ``kinds`` are the constraints' ``(metric, sense)``.
    Compiled once per shape and :class:`Shared` part (``jax.jit``, with :func:`compiler_options`)."""
    global _TRACES
    _TRACES += 1  # runs at trace time only: counts compilations
    tables = shared.merge(tables)
    col = decode_columns(start, tables, chunk=chunk)
    model, system, plan = specs_of(col, tables)
    out = simulate_batch(model, system, plan, cal)
    return chunk_outputs(out, model, plan, col["gpu"], tables, kinds)


def _evaluate_group(
    start,
    hardware,
    tables: Mapping[str, Any],
    cal: Calibration,
    *,
    chunk: int,
    kinds: tuple,
    shared: Shared,
    hoist: bool = True,
) -> dict[str, Any]:
    """:func:`_evaluate_chunk` with every configuration on the model and GPU of ``hardware``
    (their codes, int32 [2]), unbatched: what depends on them alone is computed once, and with
    ``hoist`` the layer costs once per distinct set of the axes they read (:mod:`dse.sweep.hoist`)."""
    global _TRACES
    _TRACES += 1
    tables = shared.merge(tables)
    col = decode_columns(start, tables, chunk=chunk)
    model, system = pick(tables["models"], hardware[0]), pick(tables["systems"], hardware[1])
    plan = decoded_plan(col, tables["fixed"])

    def layer_costs_of(c: Mapping[str, Any]) -> Any:
        batch = jax.vmap(plan_layer_costs, in_axes=(None, None, 0, None))
        return batch(model, system, decoded_plan(c, tables["fixed"]), cal)

    lc = None
    if hoist and not isinstance(system, ClusterSpec):  # a mix prices its layers per kind (hetersim.cluster)
        factors = tables["factors"]
        in_group = (col["model"] == hardware[0]) & (col["gpu"] == hardware[1])
        lc = hoisting.hoisted_layer_costs(
            start,
            col,
            factors,
            factor_radices(factors),
            layer_costs_of,
            in_group,
            chunk=chunk,
            lead=_hardware_lead(factors),
        )
    out = simulate_batch(model, system, plan, cal, shared_hardware=True, lc=lc)
    return chunk_outputs(out, model, plan, jnp.broadcast_to(hardware[1], (chunk,)), tables, kinds)


def chunk_outputs(out: Any, model: Any, plan: Any, gpu, tables: Mapping[str, Any], kinds: tuple) -> dict[str, Any]:
    """What a chunk returns from the model's outputs ``out``: the metrics, the step-time interval,
    the constraint bits and the feasible flag (the last stage of :func:`evaluate_chunk`)."""
    checks = check_constraints(out, kinds, tables["limits"])
    result = {name: getattr(out, name) for name in METRICS}
    result.update(step_time_interval(out.step_time_s, model, plan, gpu, tables["interval"]))
    result["constraint_violation"] = checks.bits
    result["feasible"] = checks.feasible
    return result


def step_time_interval(step_time_s, model: Any, plan: Any, gpu, table: Mapping[str, Any]) -> dict[str, Any]:
    """The 80% interval of each configuration's step time (:mod:`hetersim.fit.intervals`), from
    its model, its plan, its device's and its stack's rows of ``table``
    (:func:`dse.sweep.space.interval_table`): a few element-wise operations per configuration."""
    flags = {
        "device": table["device"][gpu],
        "stack": table["stack"][plan.stack_code],
        "long_context": jnp.where(plan.seq_len > table["max_seq_len"], 1.0, 0.0),
        "offload": jnp.where(jnp.any(plan.offload_tier_code > 0, axis=-1), 1.0, 0.0),
        "moe": jnp.where(model.moe_layers > 0, table["moe"], 0.0),
    }
    low, high = intervals.bounds(table["params"], step_time_s, flags, xp=jnp)
    return dict(zip(INTERVALS, (low, high), strict=True))


def chunk_task(payload: tuple[Any, ...], index: int) -> tuple[int, dict[str, np.ndarray]]:
    """Evaluate chunk ``index`` (a Dask task: each worker process compiles once and reuses it).

    ``payload`` is ``(tables, calibration, chunk, kinds, size)`` as built by
    :func:`dse.sweep.run.run_sweep`.
    """
    tables, cal, chunk, kinds, size = payload
    out = evaluate_chunk(np.int32(index * chunk), tables, cal, chunk=chunk, kinds=kinds)
    n = min(chunk, size - index * chunk)
    return index, {k: np.asarray(v)[:n] for k, v in out.items()}
