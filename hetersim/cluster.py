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

from .layer import layer_costs, p2p_chunk_s
from .outputs import STEP_TERMS
from .pytree import spec
from .simulate import Breakdown, layer_time, micro_batches, simulate, stage_times, throughput
from .specs import Calibration, ModelSpec, Plan, SystemSpec
from .terms import memory
from .terms._safe import safe_div
from .types import HETERO_MODES as MODES
from .types import MAX_GROUPS, FieldError, Infeasible
from .units import HOUR, KWH

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


def _per_group(fn, systems, *args):
    return jax.vmap(fn, in_axes=(None, 0, None, None))(args[0], systems, args[1], args[2])


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


def balanced_split(model: ModelSpec, stages, cost, fixed):
    """Layers per stage in each group (:func:`integer_split` of the layers over the stages), or
    the user's fixed split. Returns (base layers per stage, stages with one extra, valid)."""
    present = stages > 0
    base, extra = integer_split(model.layers, stages, cost)
    use_fixed = jnp.any(fixed > 0)
    base = jnp.where(use_fixed, fixed * present, base)
    extra = jnp.where(use_fixed, 0.0, extra)
    valid = jnp.abs(jnp.sum(stages * base + extra) - model.layers) < 0.5
    valid &= jnp.all(jnp.where(present, base >= 1.0, True))
    return base, extra, valid


def _take(tree, i):
    return jax.tree.map(lambda a: a[i], tree)


def simulate_cluster(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cal: Calibration) -> ClusterBreakdown:
    """One configuration of a mixed cluster in, its breakdown out (pure; batch with vmap)."""
    gpus = cluster.gpus
    present = gpus > 0
    per_stage = plan.tp * plan.cp * jnp.where(cluster.mode_code == PIPELINE, plan.dp, plan.pp)
    units = jnp.where(present, safe_div(gpus, per_stage), 0.0)  # stages or replicas per group
    units_ok = jnp.all(jnp.abs(units - jnp.round(units)) < 1e-6)
    n_gpus_ok = jnp.abs(jnp.sum(gpus) - plan.n_gpus) < 0.5
    flags = jnp.where(units_ok & n_gpus_ok, 0, int(Infeasible.GPU_COUNT)).astype(jnp.int32)

    lc = jax.vmap(layer_costs, in_axes=(None, 0, None, None))(model, cluster.systems, plan, cal)
    cost = layer_time(lc)
    p2p = jax.vmap(p2p_chunk_s, in_axes=(None, 0, None, None))(model, cluster.systems, plan, cal)
    out = jax.lax.cond(
        cluster.mode_code == PIPELINE,
        lambda: _pipeline(model, cluster, plan, cal, units, lc, cost, p2p),
        lambda: _data(model, cluster, plan, cal, units, lc, cost),
    )
    flags = flags | jnp.where(units_ok & n_gpus_ok & (jnp.sum(units) > 0), 0, int(Infeasible.GPU_COUNT))
    total = dataclasses.replace(out.total, infeasible=out.total.infeasible | flags.astype(jnp.int32))
    return dataclasses.replace(out, total=total)


def _group_sims(model, cluster, plan, cal, models):
    return jax.vmap(simulate, in_axes=(0, 0, None, None))(models, cluster.systems, plan, cal)


def _pipeline(model, cluster, plan, cal, stages, lc, cost, p2p):
    present = stages > 0
    # Activations cross from one kind to the next over the link both groups share: price every
    # stage's point-to-point at the slowest group's rate (exact for the stages at a boundary,
    # conservative inside a group).
    p2p = jnp.where(present, jnp.max(jnp.where(present, p2p, 0.0)), 0.0)
    base, extra, valid = balanced_split(model, stages, cost, cluster.layers_fixed)
    stage_layers = base + (extra > 0)
    last = jnp.max(jnp.where(present, jnp.arange(MAX_GROUPS), -1))
    head = jnp.where(jnp.arange(MAX_GROUPS) == last, lc.head, 0.0)
    t_stage = jnp.where(present, stage_layers * cost + p2p + head, 0.0)  # busiest stage of each group
    t_max = jnp.max(t_stage)
    g_max = jnp.argmax(t_stage)
    total_stage = jnp.sum(stages * (base * cost + p2p) + extra * cost) + lc.head[jnp.maximum(last, 0)]
    n_micro = micro_batches(plan)
    bubble = jnp.where(plan.pp > 1, (total_stage - t_max) / plan.vp, 0.0)

    # Per group: DP traffic, optimizer, offload and memory of a stage with that group's layers.
    models = jax.vmap(lambda n: dataclasses.replace(model, layers=n * plan.pp))(stage_layers)
    sims = _group_sims(model, cluster, plan, cal, models)
    fit = jnp.where(present, sims.hbm_used_GiB / sims.hbm_capacity_GiB, 0.0)
    g_mem = jnp.argmax(fit)
    g_flags = jnp.where(present, sims.infeasible, 0)
    g_flags = g_flags & ~(int(Infeasible.LAYERS_DIVIDE) | int(Infeasible.GPU_COUNT))
    flags = _any_flags(g_flags) | jnp.where(valid, 0, int(Infeasible.LAYERS_DIVIDE))

    dp = jnp.max(jnp.where(present, sims.dp_comm_s, 0.0))
    opt = jnp.max(jnp.where(present, sims.optimizer_s, 0.0))
    off = jnp.max(jnp.where(present, sims.offload_s, 0.0))
    t = stage_times(_take(lc, g_max), stage_layers[g_max], p2p[g_max], head[g_max])
    terms = dict(
        compute_s=n_micro * t["compute_s"],
        recompute_s=n_micro * t["recompute_s"],
        tp_comm_s=n_micro * t["tp_s"],
        cp_comm_s=n_micro * t["cp_s"],
        pp_comm_s=n_micro * t["pp_s"],
        dp_comm_s=dp,
        bubble_s=bubble,
        optimizer_s=opt,
        offload_s=off,
    )
    total = _totals(model, cluster, plan, sims, g_mem, terms, flags)
    return ClusterBreakdown(
        total=total,
        group_stages=stages,
        group_layers=jnp.where(present, stage_layers, 0.0),
        group_microbatches=jnp.where(present, n_micro, 0.0),
        group_stage_time_s=t_stage,
        group_hbm_used_GiB=jnp.where(present, sims.hbm_used_GiB, 0.0),
        group_infeasible=g_flags,
    )


def _data(model, cluster, plan, cal, replicas, lc, cost):
    present = replicas > 0
    stage_l = memory.busiest_stage_layers(model, plan)
    t_mb = stage_l * cost + lc.head  # per micro-batch time of a replica's busiest stage
    total_mb = jnp.maximum(safe_div(plan.global_batch, plan.micro_batch, 1.0), 1.0)
    base, extra = integer_split(total_mb, replicas, t_mb)
    m = jnp.where(present, base + (extra > 0), 0.0)  # micro-batches of each group's busiest replica

    # Each group runs as a homogeneous job whose collectives span every replica (dp of the plan)
    # but that takes only its own micro-batches.
    def one(sys, mg):
        return simulate(model, sys, dataclasses.replace(plan, global_batch=mg * plan.micro_batch * plan.dp), cal)

    sims = jax.vmap(one)(cluster.systems, m)
    step_g = jnp.where(present, sims.step_time_s, 0.0)
    g = jnp.argmax(step_g)
    slow = _take(sims, g)
    fit = jnp.where(present, sims.hbm_used_GiB / sims.hbm_capacity_GiB, 0.0)
    g_mem = jnp.argmax(fit)
    g_flags = jnp.where(present, sims.infeasible, 0) & ~int(Infeasible.GPU_COUNT) & ~int(Infeasible.BATCH_DIVIDE)
    flags = _any_flags(g_flags)
    # Replicas finish their micro-batches, then synchronise gradients together: the step is the
    # slowest group's (each group's exposed DP traffic depends on its own backward window).
    terms = {k: getattr(slow, k) for k in STEP_TERMS}
    total = _totals(model, cluster, plan, sims, g_mem, terms, flags)
    return ClusterBreakdown(
        total=total,
        group_stages=replicas,
        group_layers=jnp.where(present, stage_l, 0.0),
        group_microbatches=m,
        group_stage_time_s=step_g,
        group_hbm_used_GiB=jnp.where(present, sims.hbm_used_GiB, 0.0),
        group_infeasible=g_flags,
    )


def _totals(model, cluster, plan, sims, g_mem, terms, flags) -> Breakdown:
    """Job-level metrics from the step terms (:func:`hetersim.simulate.throughput` over every
    group's GPUs); memory fields of the group nearest its capacity."""
    dev = cluster.systems.device
    gpus = cluster.gpus
    step = sum(terms.values())
    rates = throughput(
        model,
        plan,
        step,
        n_gpus=jnp.sum(gpus),
        peak_tflops=jnp.sum(gpus * dev.peak_tflops[:, plan.precision_code]),
        usd_per_hour=jnp.sum(gpus * dev.price_usd_per_hour),
        power_W=jnp.sum(gpus * dev.tdp_W),
    )
    mem = _take(sims, g_mem)
    # Goodput terms are those of the group nearest its capacity; the effective time, cost and
    # energy are the job's time to train over that goodput.
    eff = jnp.where(mem.goodput > 0, rates.time_to_train_s / jnp.where(mem.goodput > 0, mem.goodput, 1.0), 0.0)
    return dataclasses.replace(
        mem,
        step_time_s=step,
        **terms,
        **{k: getattr(rates, k) for k in rates.__dataclass_fields__},
        n_microbatches=micro_batches(plan),
        infeasible=flags.astype(jnp.int32),
        effective_time_s=eff,
        effective_cost_usd=eff / HOUR * jnp.sum(gpus * dev.price_usd_per_hour),
        effective_energy_kWh=eff * jnp.sum(gpus * dev.tdp_W) / KWH,
    )


def cluster_spec(groups, links, mode: str = "pipeline", layers_fixed=None) -> ClusterSpec:
    """A :class:`ClusterSpec` from ``[(gpu_entry, count), ...]`` (host side, validated).

    ``layers_fixed`` gives the layers per stage of each group (pipeline mode) instead of the
    balanced split.
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
        systems.append(build.system_spec(entry, links, scaleup_domain=domain))
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
