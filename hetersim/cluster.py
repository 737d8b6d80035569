"""Heterogeneous clusters: several device kinds in one training job.

A cluster is a fixed number (``MAX_GROUPS``) of device groups — each a :class:`SystemSpec` of
one kind with its own network levels and memory tiers — and a GPU count per group (0 = unused),
so that mixes batch under ``jax.vmap``. Tensor- and context-parallel groups stay inside one
kind; what crosses kinds is the pipeline (``mode = pipeline``: stages on different kinds, each
kind's stages holding as many layers as balance the stage times) or data parallelism
(``mode = data``: replicas on different kinds taking as many micro-batches as let them finish
together).

Step time of a pipeline with unequal stages (1F1B, interleaving ``vp``):
``m * t_max + (sum of stage times - t_max) / vp`` — the slowest stage sets the steady state,
every stage contributes to fill and drain. For equal stages this is the homogeneous formula of
:mod:`hetersim.simulate`, so a "mix" of identical groups reproduces the homogeneous cluster.
Per-group data-parallel traffic, optimizer, offload and memory come from :func:`simulate` on that
group's system with the layers its stages hold.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .pytree import spec
from .simulate import Breakdown
from .specs import Calibration, ModelSpec, Plan, SystemSpec
from .terms._safe import safe_div
from .types import HETERO_MODES as MODES
from .types import MAX_GROUPS, FieldError, Infeasible

BIG = 1.0e30
PIPELINE = MODES.index("pipeline")  # mode_code of stages on kinds; the other is data-parallel replicas


@spec
class ClusterSpec:
    systems: SystemSpec  # every leaf with a leading axis of MAX_GROUPS
    gpus: Any  # [MAX_GROUPS] GPUs of each group, 0 = unused
    mode_code: Any  # MODES
    layers_fixed: Any  # [MAX_GROUPS] layers per stage fixed by the user; all 0 = balance


@spec
class ClusterBreakdown:
    total: Breakdown  # the job as a whole (memory fields: the group closest to its capacity)
    group_stages: Any  # [G] pipeline stages (pipeline mode) or replicas (data mode) per group
    group_layers: Any  # [G] layers per stage (pipeline mode; the busiest stage of the group)
    group_microbatches: Any  # [G] micro-batches per replica and step (data mode)
    group_stage_time_s: Any  # [G] per micro-batch stage time (pipeline) or step time (data)
    group_hbm_used_GiB: Any  # [G]
    group_infeasible: Any  # [G] Infeasible flags of each group


def integer_split(total, units, cost):
    """Split ``total`` items over groups of ``units`` identical units, each item on a unit of
    group g costing ``cost[g]``, to minimise the busiest unit: proportional shares floored (at
    least one per unit), then the remainder one item per unit, cheapest ``(n+1)*cost`` first.

    Returns (items per unit, units of each group holding one extra item).
    """
    present = units > 0
    inv = jnp.where(present, safe_div(1.0, cost), 0.0)
    cont = safe_div(total * inv, jnp.sum(units * inv))
    base = jnp.where(present, jnp.maximum(jnp.floor(cont + 1e-6), 1.0), 0.0)
    rem = total - jnp.sum(units * base)
    key = jnp.where(present, (base + 1.0) * cost, BIG)
    order = jnp.argsort(key)
    before = jnp.cumsum(units[order]) - units[order]
    extra_sorted = jnp.clip(rem - before, 0.0, units[order])
    extra = jnp.zeros_like(units).at[order].set(extra_sorted)
    return base, extra


def as_hetero(cluster: ClusterSpec, plan: Plan):
    """The :class:`hetersim.hsim.HeteroSpec` a mix means (traced; shape ``[G, G, 1]``).

    ``pipeline``: one pipeline whose stages run group by group, each group's ``units`` stages
    holding ``dp`` replicas of its kind, layers balanced by speed (or the fixed split).
    ``data``: one pipeline of ``pp`` stages per group, copied ``units`` times, micro-batches
    balanced by speed."""
    from .hsim import HeteroSpec, cross_network

    G = MAX_GROUPS
    present = cluster.gpus > 0
    pipe = cluster.mode_code == PIPELINE
    per_unit = plan.tp * plan.cp * jnp.where(pipe, plan.dp, plan.pp)
    units = jnp.where(present, safe_div(cluster.gpus, per_unit), 0.0)
    row0 = jnp.zeros(G).at[0].set(1.0)
    fixed = jnp.any(cluster.layers_fixed > 0)
    # pipeline: [0, g] is group g's stages; data: [g, 0] is group g's pipeline.
    stage_count = jnp.where(pipe, row0[:, None] * units[None, :], jnp.zeros((G, G)).at[:, 0].set(plan.pp))
    stage_layers = jnp.where(
        pipe & fixed, row0[:, None] * cluster.layers_fixed[None, :] + (1.0 - row0[:, None]) * -1.0, -1.0
    )
    kind = jnp.where(
        pipe, jnp.broadcast_to(jnp.arange(G)[None, :], (G, G)), jnp.broadcast_to(jnp.arange(G)[:, None], (G, G))
    )
    count = jnp.where(pipe, row0[:, None] * jnp.where(present, plan.dp, 0.0)[None, :], jnp.ones((G, G)))
    pipe_count = jnp.where(pipe, row0 * jnp.where(jnp.any(present), 1.0, 0.0), units)
    cross = cross_network(cluster.systems, cluster.gpus)
    return HeteroSpec(
        systems=cluster.systems,
        cross=cross,
        pipe_count=pipe_count,
        pipe_mb=jnp.zeros(G),
        stage_count=stage_count,
        stage_layers=stage_layers,
        kind=kind.astype(jnp.int32)[..., None],
        tp=jnp.full((G, G, 1), plan.tp),
        count=count[..., None],
        rep_mb=jnp.zeros((G, G, 1)),
        balance_code=jnp.where(pipe, 0, 1).astype(jnp.int32),
        sp_auto=jnp.asarray(0.0),
    ), units


def simulate_cluster(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cal: Calibration) -> ClusterBreakdown:
    """One configuration of a mixed cluster in, its breakdown out (pure; batch with vmap): the
    heterogeneous plan of :func:`as_hetero` evaluated by :func:`hetersim.hsim.simulate_plan`."""
    from .hsim import simulate_plan

    hs, units = as_hetero(cluster, plan)
    out = simulate_plan(model, hs, plan, cal)
    present = cluster.gpus > 0
    units_ok = jnp.all(jnp.abs(units - jnp.round(units)) < 1e-6) & (jnp.sum(units) > 0)
    n_gpus_ok = jnp.abs(jnp.sum(cluster.gpus) - plan.n_gpus) < 0.5
    flags = jnp.where(units_ok & n_gpus_ok, 0, int(Infeasible.GPU_COUNT))
    total = dataclasses.replace(out.total, infeasible=out.total.infeasible | flags.astype(jnp.int32))
    pipe = cluster.mode_code == PIPELINE

    def per_group(a_pipe, a_data):
        return jnp.where(present, jnp.where(pipe, a_pipe, a_data), 0.0)

    return ClusterBreakdown(
        total=total,
        group_stages=units,
        group_layers=per_group(out.stage_layers[0], out.stage_layers[:, 0]),
        group_microbatches=per_group(out.slot_microbatches[0, :, 0], out.slot_microbatches[:, 0, 0]),
        group_stage_time_s=per_group(out.slot_time_s[0, :, 0], out.pipe_step_s),
        group_hbm_used_GiB=per_group(out.slot_hbm_used_GiB[0, :, 0], out.slot_hbm_used_GiB[:, 0, 0]),
        group_infeasible=jnp.where(
            present, jnp.where(pipe, out.slot_infeasible[0, :, 0], out.slot_infeasible[:, 0, 0]), 0
        ),
    )


def cluster_spec(groups, links, mode: str = "pipeline", layers_fixed=None, *, memory=None, fleets=None) -> ClusterSpec:
    """A :class:`ClusterSpec` from ``[(gpu_entry, count), ...]`` (host side, validated).

    ``layers_fixed`` gives the layers per stage of each group (pipeline mode) instead of the
    balanced split; ``memory`` and ``fleets`` are a catalog's (the packaged ones when None), as
    for :func:`hetersim.build.system_spec`.
    """
    import numpy as np

    from . import build

    if mode not in MODES:
        raise ValueError(f"hetero must be one of {', '.join(MODES)}; got {mode!r}")
    if not groups:
        raise ValueError("cluster needs at least one group KIND:COUNT")
    if len(groups) > MAX_GROUPS:
        raise ValueError(f"cluster has {len(groups)} groups; at most {MAX_GROUPS} are supported")
    systems, counts = [], []
    for entry, count in groups:
        if not isinstance(count, int) or count <= 0:
            raise ValueError(f"cluster count for {entry.get('name', '?')} must be a positive integer; got {count!r}")
        # Two kinds never share a scale-up (NVLink) domain: a group smaller than its kind's domain
        # has a domain of its own GPUs only, so traffic to the other kind crosses the scale-out NICs.
        domain = min(float(entry.get("scaleup_domain", 8)), float(count))
        systems.append(build.system_spec(entry, links, scaleup_domain=domain, memory=memory, fleets=fleets))
        counts.append(float(count))
    while len(systems) < MAX_GROUPS:
        systems.append(systems[0])
        counts.append(0.0)
    fixed = np.zeros(MAX_GROUPS)
    if layers_fixed is not None:
        if len(layers_fixed) != len(groups) or any(int(x) <= 0 for x in layers_fixed):
            raise FieldError("{0} needs one positive integer per {1} group", "layers_per_stage", "cluster")
        fixed[: len(groups)] = [float(x) for x in layers_fixed]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *systems)
    return ClusterSpec(
        systems=stacked,
        gpus=jnp.asarray(counts, jnp.float32),
        mode_code=jnp.asarray(MODES.index(mode), jnp.int32),
        layers_fixed=jnp.asarray(fixed, jnp.float32),
    )


def check_plan(cluster_groups, plan_opts: dict, mode: str) -> None:
    """Host-side checks with one-line errors: every group holds whole stages (pipeline) or whole
    replicas (data), so tensor- and context-parallel groups never span two kinds."""
    tp, cp = plan_opts.get("tp", 1), plan_opts.get("cp", 1)
    pp, dp = plan_opts.get("pp", 1), plan_opts.get("dp")
    for entry, count in cluster_groups:
        unit = tp * cp * (dp if mode == "pipeline" else pp)
        what = "tp*cp*dp GPUs per pipeline stage" if mode == "pipeline" else "tp*cp*pp GPUs per replica"
        if unit and count % unit:
            raise ValueError(
                f"cluster group {entry.get('name', '?')}:{count} does not hold whole stages or replicas "
                f"({what} = {unit}); a tensor- or context-parallel group cannot span two device kinds"
            )


def _any_flags(flags):
    """The OR of a vector of flag words (``jnp.bitwise_or.reduce``, which jax 0.4.27 lacks)."""
    return jax.lax.reduce(flags, jnp.zeros((), flags.dtype), jax.lax.bitwise_or, (0,))
