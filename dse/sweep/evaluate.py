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
workers (:func:`chunk_task`). Where the process has several devices of the default backend (on a
CPU: one per host core, :func:`use_host_cores`), the chunk is split evenly across them with
``shard_map``, each device evaluating its consecutive slice of the same indices (the numbers are
those of one device: every configuration is computed alone).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dse.metrics import DERIVED, INTERVALS, METRICS
from dse.sweep.space import columns_plan, digits
from hetersim.cluster import ClusterSpec, simulate_cluster
from hetersim.fit import intervals
from hetersim.simulate import simulate
from hetersim.specs import Calibration

# A layout's class: the lowest is the best; see dse.inner for how a point picks its layout.
CLASS_NAMES = ("meets constraints", "violates a constraint", "does not run", "does not divide")

_TRACES = 0
MIN_SHARD = 1024  # fewest configurations per device worth splitting a chunk for
AXIS = "configs"  # the mesh axis a chunk is split along


def trace_count() -> int:
    """How many times :func:`evaluate_chunk` has been traced in this process (tests use it)."""
    return _TRACES


def simulate_batch(model: Any, system: Any, plan: Any, cal: Calibration, *, shared_hardware: bool = False) -> Any:
    """The cost model's outputs for a batch of plans. ``model`` and ``system`` are batched along
    with ``plan`` or, with ``shared_hardware``, one for the whole batch. A :class:`ClusterSpec`
    system (a study of mixes; static, the study's structure) is simulated as a cluster and its
    ``total`` returned."""
    in_axes = (None, None, 0, None) if shared_hardware else (0, 0, 0, None)
    if isinstance(system, ClusterSpec):
        return jax.vmap(simulate_cluster, in_axes=in_axes)(model, system, plan, cal).total
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


def decode_columns(start, tables: Mapping[str, Any], *, chunk: int) -> dict[str, Any]:
    """The columns of configurations ``start .. start+chunk-1``: the flat indices decoded into
    per-factor rows with ``jnp`` gathers (indices past the end repeat the last configuration)."""
    factors = tables["factors"]
    radices = [next(iter(t.values())).shape[0] for t in factors]
    idx = jnp.minimum(start + jnp.arange(chunk, dtype=jnp.int32), math.prod(radices) - 1)
    return {c: t[c][d] for t, d in zip(factors, digits(idx, radices), strict=True) for c in t}


def decode_chunk(start, tables: Mapping[str, Any], *, chunk: int) -> tuple[Any, Any, Any]:
    """The batched (model, system, plan) specs of configurations ``start .. start+chunk-1``."""
    return specs_of(decode_columns(start, tables, chunk=chunk), tables)


def specs_of(col: Mapping[str, Any], tables: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    model = jax.tree.map(lambda a: a[col["model"]], tables["models"])
    system = jax.tree.map(lambda a: a[col["gpu"]], tables["systems"])
    return model, system, columns_plan(col, tables["fixed"], n_gpus=col["n_gpus"], dp=col["dp"])


def use_host_cores(environ: Mapping[str, str] | None = None) -> int:
    """Make each host core a JAX CPU device, so that :func:`evaluate_chunk` spreads a chunk over
    them (XLA runs one chunk's kernels one after another, on one core); return the CPU devices
    asked for. ``HETERSIM_CPU_DEVICES`` overrides the count (1: one device, as JAX has by default).

    It only takes effect before JAX has run anything in this process (``hetersim sweep`` and
    ``hetersim bench`` call it first) and where JAX has the ``jax_num_cpu_devices`` option; it is
    a no-op otherwise. Only the CPU backend changes: the other computations still run on the
    first device."""
    env = os.environ if environ is None else environ
    try:
        n = int(env.get("HETERSIM_CPU_DEVICES", "") or len(os.sched_getaffinity(0)))
    except (ValueError, AttributeError):  # a bad value; no sched_getaffinity (macOS)
        n = os.cpu_count() or 1
    n = max(1, n)
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except (AttributeError, RuntimeError, ValueError):  # an older JAX, or JAX has started already
        return 1
    return n


def chunk_mesh(chunk: int) -> Any | None:
    """The mesh a chunk of ``chunk`` configurations is split over: every local device of the
    default backend, when there are several and each gets an equal share of at least
    :data:`MIN_SHARD`; else None (one device)."""
    devices = jax.local_devices()
    n = len(devices)
    if n < 2 or chunk % n or chunk // n < MIN_SHARD:
        return None
    return jax.sharding.Mesh(np.asarray(devices), (AXIS,))


def _shard_map(fn: Any, mesh: Any, in_specs: Any, out_specs: Any) -> Any:
    """``jax.shard_map`` (newer JAX), else ``jax.experimental.shard_map.shard_map`` (the floor)."""
    sm = getattr(jax, "shard_map", None)
    if sm is None:
        from jax.experimental.shard_map import shard_map as sm
    return sm(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


@functools.partial(jax.jit, static_argnames=("chunk", "kinds"))
def evaluate_chunk(start, tables: Mapping[str, Any], cal: Calibration, *, chunk: int, kinds: tuple) -> dict[str, Any]:
    """Metrics of configurations ``start .. start+chunk-1`` (indices past the end repeat the
    last configuration; the caller trims them). ``kinds`` are the constraints' ``(metric, sense)``.
    Split over the devices of :func:`chunk_mesh`, if any."""
    global _TRACES
    _TRACES += 1  # runs at trace time only: counts compilations
    mesh = chunk_mesh(chunk)
    if mesh is None:
        return _evaluate(start, tables, cal, chunk=chunk, kinds=kinds)
    share = chunk // mesh.size
    P = jax.sharding.PartitionSpec

    def part(start, tables, cal):
        first = start + jax.lax.axis_index(AXIS).astype(jnp.int32) * share
        return _evaluate(first, tables, cal, chunk=share, kinds=kinds)

    return _shard_map(part, mesh, in_specs=(P(), P(), P()), out_specs=P(AXIS))(start, tables, cal)


def _evaluate(start, tables: Mapping[str, Any], cal: Calibration, *, chunk: int, kinds: tuple) -> dict[str, Any]:
    """:func:`evaluate_chunk` on one device."""
    col = decode_columns(start, tables, chunk=chunk)
    model, system, plan = specs_of(col, tables)
    out = simulate_batch(model, system, plan, cal)
    return chunk_outputs(out, plan, col["gpu"], tables, kinds)


def chunk_outputs(out: Any, plan: Any, gpu, tables: Mapping[str, Any], kinds: tuple) -> dict[str, Any]:
    """What a chunk returns from the model's outputs ``out``: the metrics, the step-time interval,
    the constraint bits and the feasible flag (the last stage of :func:`evaluate_chunk`)."""
    checks = check_constraints(out, kinds, tables["limits"])
    result = {name: getattr(out, name) for name in METRICS}
    result.update(step_time_interval(out.step_time_s, plan, gpu, tables["interval"]))
    result["constraint_violation"] = checks.bits
    result["feasible"] = checks.feasible
    return result


def step_time_interval(step_time_s, plan: Any, gpu, table: Mapping[str, Any]) -> dict[str, Any]:
    """The 80% interval of each configuration's step time (:mod:`hetersim.fit.intervals`), from
    its plan, its device's and its stack's rows of ``table`` (:func:`dse.sweep.space.interval_table`):
    a few element-wise operations per configuration."""
    flags = {
        "device": table["device"][gpu],
        "stack": table["stack"][plan.stack_code],
        "long_context": jnp.where(plan.seq_len > table["max_seq_len"], 1.0, 0.0),
        "offload": jnp.where(jnp.any(plan.offload_tier_code > 0, axis=-1), 1.0, 0.0),
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
