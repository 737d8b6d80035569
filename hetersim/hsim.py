"""A heterogeneous plan (:mod:`hetersim.hplan`) evaluated: pipelines of stages whose replicas sit
on different device kinds with their own tensor-parallel degree (pure; batch with ``jax.vmap``).

Every replica group of every stage (a *slot*: pipeline ``j``, stage ``s``, group ``r``) is
priced with the stages of :mod:`hetersim.simulate` on its own kind's specs, with its own
``tp``, the stage's layers, the pipeline's depth and the stage's data-parallel group:

* **Micro-batches.** ``N = global_batch / micro_batch`` are shared among the pipeline copies and,
  in every stage, among its replicas (whole micro-batches: ``equal``, ``speed`` or given).
* **Step.** A stage is busy ``max_r n_r * t_r`` per step (``t_r`` a replica's per-micro-batch
  time with its layers, the LM head on the last stage, its point-to-point sends); a pipeline
  takes its busiest stage's time plus fill and drain, ``(sum of stage latencies - the
  busiest's) / vp`` (the 1F1B composition of :mod:`hetersim.simulate`, Narayanan et al. SC'21);
  the job the slowest pipeline's, with its slots' exposed gradient synchronisation, optimizer
  and offload. For one kind and equal stages this is :func:`hetersim.simulate.simulate` exactly.
* **Traffic between kinds.** Two kinds never share a scale-up domain. A data-parallel group
  whose replicas span kinds runs its collectives on the ``cross`` network: each kind's GPUs of
  the group in that kind's own nodes, at every level the slowest of the kinds' links, and the
  nodes joined by the slowest of their scale-out links and of the link the plan names between
  them (NCCL's ring is as fast as its slowest hop). A pipeline send between stages on
  different kinds crosses that outermost link.
* **Memory per stage**: its layers, the embedding on the first stage and the head (and its
  logits) on the last, the micro-batches a stage in position ``i`` of ``P`` holds under 1F1B
  (``min(P - i, n)``), states sharded over the stage's data-parallel group.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp

from .cluster import _any_flags, integer_split
from .layer import layer_costs, p2p_chunk_s
from .outputs import STEP_TERMS
from .pytree import spec
from .simulate import (
    Breakdown,
    PipelineStep,
    breakdown,
    dp_comm_s,
    layer_time,
    moe_layer_time,
    optimizer_offload,
    placement,
    stage_times,
    throughput,
)
from .simulate import flags as stage_flags
from .specs import Calibration, ModelSpec, NetworkSpec, Plan, SystemSpec
from .terms import compute, memory
from .terms import goodput as goodput_terms
from .terms._safe import safe_div
from .terms.flops import total_params
from .types import N_LEVELS, Infeasible
from .units import GiB

BIG = 1.0e30
# Rules the plan's own structure replaces (checked below for the plan as a whole).
_STRUCTURE = int(Infeasible.GPU_COUNT) | int(Infeasible.BATCH_DIVIDE) | int(Infeasible.LAYERS_DIVIDE)


@spec
class HeteroSpec:
    """A heterogeneous plan's arrays (:func:`hetersim.hplan.to_arrays`) and its device kinds."""

    systems: SystemSpec  # every leaf with a leading axis of K device kinds
    cross: NetworkSpec  # traffic between kinds
    pipe_count: Any  # [J] copies of each pipeline (0 = unused)
    pipe_mb: Any  # [J] micro-batches per copy (0 = by the balance)
    stage_count: Any  # [J, S] consecutive identical stages (0 = unused)
    stage_layers: Any  # [J, S] layers per stage (-1 = balanced by speed)
    kind: Any  # [J, S, R] device kind (index into systems)
    tp: Any  # [J, S, R]
    count: Any  # [J, S, R] replicas (0 = unused)
    rep_mb: Any  # [J, S, R] micro-batches per replica (0 = by the balance)
    balance_code: Any  # hplan.BALANCE
    sp_auto: Any  # 1: sequence parallelism on where a replica's tp > 1; 0: the plan's sp


@spec
class HeteroBreakdown:
    total: Breakdown  # the job (memory fields: the slot closest to its capacity)
    stage_layers: Any  # [J, S] layers of each stage (the busiest of a group of identical ones)
    slot_microbatches: Any  # [J, S, R] micro-batches per replica and step
    slot_time_s: Any  # [J, S, R] per micro-batch time of a replica of the stage
    slot_busy_s: Any  # [J, S, R] micro-batches x time
    slot_hbm_used_GiB: Any  # [J, S, R]
    slot_infeasible: Any  # [J, S, R] Infeasible flags of each slot
    pipe_step_s: Any  # [J] step time of each pipeline copy (with its synchronisation)


def cross_network(systems: SystemSpec, used, link_bw_GBps=0.0, link_latency_us=0.0) -> NetworkSpec:
    """The network of a group whose ranks sit on several device kinds [K] (``used`` > 0): each
    level at the smallest domain, the slowest bus bandwidth (line rate times bus efficiency) and
    the highest latency of those kinds' own; the outermost also at a link named between them
    (``link_bw_GBps``: its bus bandwidth, efficiency included; 0: none named). The bus bandwidth
    is carried whole in ``bw_GBps`` with ``busbw_eff`` 1, so that no efficiency is applied twice.

    Every kind keeps its nodes: NCCL's ring over such a group runs each node's hops on that
    node's own links and crosses nodes on their NICs, so a collective over it has the phases of
    :mod:`hetersim.terms.comm` inside the nodes and a scale-out phase at the slowest NIC. Two
    kinds never share a domain, so traffic from one kind to another (a pipeline send between
    them) crosses the outermost level (:func:`between_kinds`). A flow that has a NIC to itself
    gains its whole line rate (:func:`hetersim.terms.comm.nic_gain`) only up to the fewest
    GPUs per NIC of the kinds, the least any of its ends can give."""
    net = systems.network
    on = (used > 0)[:, None]

    def worst(a, fn, fill):
        return fn(jnp.where(on, a, fill), axis=0)

    top = N_LEVELS - 1
    bw = worst(net.bw_GBps * net.busbw_eff, jnp.min, BIG)
    bw = bw.at[top].set(jnp.where(link_bw_GBps > 0, jnp.minimum(bw[top], link_bw_GBps), bw[top]))

    def lat(a):
        return worst(a, jnp.max, -BIG).at[top].max(link_latency_us)

    return NetworkSpec(
        domain_gpus=worst(net.domain_gpus, jnp.min, BIG).at[top].set(float(1 << 24)),
        bw_GBps=bw,
        busbw_eff=jnp.ones(N_LEVELS),
        latency_us=lat(net.latency_us),
        ll_latency_us=lat(net.ll_latency_us),
        ll128_latency_us=lat(net.ll128_latency_us),
        gpus_per_nic=jnp.min(jnp.where(used > 0, net.gpus_per_nic, BIG)),
    )


def inner_domains_at_most(net: NetworkSpec, gpus) -> NetworkSpec:
    """``net`` with every inner level's domain at most ``gpus`` GPUs (broadcast over leading axes)."""
    inner = jnp.arange(N_LEVELS) < N_LEVELS - 1
    capped = jnp.minimum(net.domain_gpus, jnp.asarray(gpus)[..., None])
    return dataclasses.replace(net, domain_gpus=jnp.where(inner, capped, net.domain_gpus))


def between_kinds(net: NetworkSpec) -> NetworkSpec:
    """``net`` (a :func:`cross_network`) for traffic from one kind to another: every inner level
    one GPU wide, so a point-to-point send crosses the outermost."""
    return inner_domains_at_most(net, 1.0)


def _kinds_onehot(hs: HeteroSpec, present):
    """[J, S, R, K]: the kind of each slot, kinds with identical specs counted as one (two groups
    of one device kind are one kind: their traffic is priced on their own network)."""
    leaves = [a.reshape(a.shape[0], -1) for a in jax.tree.leaves(hs.systems)]
    K = leaves[0].shape[0]
    same = jnp.ones((K, K), bool)
    for a in leaves:
        same &= jnp.all(a[:, None, :] == a[None, :, :], axis=-1)
    canon = jnp.argmax(same, axis=1)
    return (canon[hs.kind][..., None] == jnp.arange(K)) & present[..., None]


def simulate_plan(model: ModelSpec, hs: HeteroSpec, plan: Plan, cal: Calibration) -> HeteroBreakdown:
    """One heterogeneous plan in, its breakdown out. ``plan`` holds the fields every replica
    shares (micro-batch, sequence, precision, ZeRO, recomputation, stack, ...); its ``tp``, ``pp``,
    ``dp`` and ``n_gpus`` are replaced per slot."""
    st = _structure(hs)
    sys = jax.tree.map(lambda a: a[hs.kind], hs.systems)  # leaves [J, S, R, ...]
    cross = jax.tree.map(lambda a: jnp.broadcast_to(a, (*st.bc, *a.shape)), hs.cross)
    lc, p2p = _costs(model, hs, plan, cal, st, sys, dataclasses.replace(sys, network=between_kinds(cross)))
    split = _layer_split(model, hs, st, lc)
    t_terms, tau, group_sum = _latencies(model, hs, st, lc, p2p, split)
    mb, batch_ok, stage_lat = _share_microbatches(hs, plan, st, tau)
    busy = mb * tau  # [J, S, R]
    stage_busy = jnp.max(busy, axis=2)
    s_star = jnp.argmax(stage_busy, axis=1)  # [J] the busiest stage of each pipeline
    r_star = jnp.argmax(jnp.take_along_axis(busy, s_star[:, None, None], axis=1)[:, 0], axis=1)
    lat_star = jnp.take_along_axis(stage_lat, s_star[:, None], axis=1)[:, 0]
    sums = jnp.max(jnp.where(st.on, group_sum, 0.0), axis=2)  # slowest replica of each group
    bubble = jnp.where(st.depth > 1, (jnp.sum(jnp.where(st.s_on, sums, 0.0), axis=1) - lat_star) / plan.vp, 0.0)
    n_dp, cross_dp, node_cap = _dp_groups(model, hs, st, split)
    sys_x = dataclasses.replace(sys, network=inner_domains_at_most(cross, node_cap[..., None]))
    out = _slots(model, hs, plan, cal, st, sys, sys_x, lc, t_terms, n_dp, split["layers"], mb, cross_dp)
    oc = out["oc"]
    J, S, R = st.bc
    sync = jnp.where(st.on, out["dp"] + oc.optimizer_s + oc.exposed_s, 0.0).reshape(J, S * R)
    pipe_step = jnp.where(st.p_on, jnp.max(stage_busy, axis=1) + bubble + jnp.max(sync, axis=1), 0.0)
    j_star = jnp.argmax(pipe_step)
    i_busy = j_star * S * R + s_star[j_star] * R + r_star[j_star]
    i_sync = j_star * S * R + jnp.argmax(sync[j_star])

    tb, m_b = _at(t_terms, i_busy), _at(mb, i_busy)
    terms = dict(
        compute_s=m_b * tb["compute_s"],
        recompute_s=m_b * tb["recompute_s"],
        tp_comm_s=m_b * tb["tp_s"],
        cp_comm_s=m_b * tb["cp_s"],
        pp_comm_s=m_b * tb["pp_s"],
        dp_comm_s=_at(out["dp"], i_sync),
        ep_comm_s=m_b * tb["ep_s"],
        bubble_s=bubble[j_star],
        optimizer_s=_at(oc.optimizer_s, i_sync),
        offload_s=_at(oc.exposed_s, i_sync),
    )
    assert tuple(terms) == tuple(STEP_TERMS)
    flags = jnp.where(split["ok"], 0, int(Infeasible.LAYERS_DIVIDE)) | jnp.where(
        batch_ok, 0, int(Infeasible.BATCH_DIVIDE)
    )
    # The stages of a mix run 1F1B (the bubble above): a DualPipe point of a mixed sweep is flagged.
    flags = flags | jnp.where(plan.dualpipe > 0, int(Infeasible.SCHEDULE), 0)
    total = _job(model, hs, plan, st, sys, out, terms, m_b, flags)
    return HeteroBreakdown(
        total=total,
        stage_layers=split["layers"],
        slot_microbatches=mb,
        slot_time_s=tau,
        slot_busy_s=busy,
        slot_hbm_used_GiB=jnp.where(st.on, out["mem"].hbm / GiB, 0.0),
        slot_infeasible=jnp.where(st.on, out["flags"], 0),
        pipe_step_s=pipe_step,
    )


def _at(tree, i):
    """Slot ``i`` of the flattened ``[J, S, R]`` leading axes of every leaf."""
    return jax.tree.map(lambda a: a.reshape(-1, *a.shape[3:])[i], tree)


def _structure(hs: HeteroSpec) -> SimpleNamespace:
    """Which pipelines, stages and slots exist, where each stage group starts, which groups hold
    the first and the last stage, replicas per stage and the kinds of each stage."""
    J, S, R = hs.kind.shape
    p_on = hs.pipe_count > 0
    s_on = (hs.stage_count > 0) & p_on[:, None]
    on = (hs.count > 0) & s_on[..., None]
    counts = jnp.where(s_on, hs.stage_count, 0.0)
    depth = jnp.sum(counts, axis=1)  # [J] stages per pipeline
    start = jnp.cumsum(counts, axis=1) - counts
    return SimpleNamespace(
        bc=(J, S, R),
        p_on=p_on,
        s_on=s_on,
        on=on,
        depth=depth,
        depth3=jnp.broadcast_to(depth[:, None, None], (J, S, R)),
        start=start,
        first=s_on & (start == 0),
        last=s_on & (start + hs.stage_count >= depth[:, None]),
        reps=jnp.sum(jnp.where(on, hs.count, 0.0), axis=2),  # [J, S]
        kinds=jnp.any(_kinds_onehot(hs, on), axis=2),  # [J, S, K]
        speed=hs.balance_code == 1,
    )


def _slot_plan(plan: Plan, hs: HeteroSpec, tp, n_dp, pp) -> Plan:
    sp = jnp.where(hs.sp_auto > 0, jnp.where(tp > 1, 1.0, 0.0), plan.sp)
    return dataclasses.replace(plan, tp=tp, pp=pp, dp=n_dp, n_gpus=tp * plan.cp * pp * n_dp, sp=sp)


def _costs(model, hs, plan, cal, st, sys, sys_x):
    """Per-layer costs of every slot (its kind, TP and the stage's data-parallel group at that
    position over the copies) and its pipeline sends, over the network between kinds at a
    boundary between stages on different kinds."""
    n_dp_pos = jnp.sum(hs.pipe_count[:, None] * st.reps, axis=0)  # [S]

    def costs(system, system_x, tp, n_dp, pp):
        p = compute.resolve_kernels(system.device, _slot_plan(plan, hs, tp, n_dp, pp))
        return (
            layer_costs(model, system, p, cal),
            p2p_chunk_s(model, system, p, cal),
            p2p_chunk_s(model, system_x, p, cal),
        )

    n_dp3 = jnp.broadcast_to(n_dp_pos[None, :, None], st.bc)
    lc, p2p_own, p2p_x = jax.vmap(jax.vmap(jax.vmap(costs)))(sys, sys_x, hs.tp, n_dp3, st.depth3)

    def shifted(a, by):  # a[:, s + by], False past either end
        pad = jnp.zeros_like(a[:, :1])
        return jnp.concatenate([a[:, 1:], pad], axis=1) if by > 0 else jnp.concatenate([pad, a[:, :-1]], axis=1)

    def differs(by):
        return shifted(st.s_on, by) & jnp.any(shifted(st.kinds, by) != st.kinds, axis=-1)

    boundary = (jnp.sum(st.kinds, axis=-1) > 1) | differs(1) | differs(-1)
    p2p = jnp.where(boundary[..., None], jnp.maximum(p2p_own, p2p_x), p2p_own)
    return lc, jnp.where(st.depth3 > 1, p2p, 0.0)


def _layer_split(model, hs, st, lc) -> dict[str, Any]:
    """Layers of each stage: given, or balanced by speed over the stages (a stage's per-layer
    cost: its replicas' share of the micro-batches times their per-layer time)."""
    lt = layer_time(lc)
    total = memory.stack_layers(model)
    if model.extra is None:
        per_layer = lt
    else:  # the mean of the model's dense and MoE layers
        n_moe = memory.moe_stage_layers(model, total)
        per_layer = safe_div(n_moe * moe_layer_time(lc) + (total - n_moe) * lt, total)
    cost_speed = safe_div(1.0, jnp.sum(jnp.where(st.on, safe_div(hs.count, per_layer), 0.0), axis=2))
    cost_equal = safe_div(jnp.max(jnp.where(st.on, per_layer, 0.0), axis=2), st.reps)
    cost = jnp.where(st.speed, cost_speed, cost_equal)
    base, extra = jax.vmap(integer_split, in_axes=(None, 0, 0))(total, jnp.where(st.s_on, hs.stage_count, 0.0), cost)
    balanced = jnp.any(st.s_on & (hs.stage_layers < 0), axis=1, keepdims=True)
    base = jnp.where(balanced, base, jnp.maximum(hs.stage_layers, 0.0))
    extra = jnp.where(balanced, extra, 0.0)
    held = jnp.where(st.s_on, hs.stage_count * base + extra, 0.0)  # layers of each group of stages
    covered = jnp.abs(jnp.sum(held, axis=1) - total) < 0.5
    ok = jnp.all(jnp.where(st.p_on, covered, True)) & jnp.all(jnp.where(st.s_on & balanced, base >= 1.0, True))
    # A stage without layers holds parameters only as the first (embedding) or the last (head):
    # a middle one has none, and its optimizer cannot be built (PyTorch's Optimizer raises
    # "optimizer got an empty parameter list", torch/optim/optimizer.py Optimizer.__init__).
    empty = jnp.where(base < 0.5, hs.stage_count - extra, 0.0)  # stages of the group with no layer
    allowed = jnp.where(st.first, 1.0, 0.0) + jnp.where(st.last, 1.0, 0.0)
    ok = ok & jnp.all(jnp.where(st.s_on, empty <= allowed, True))
    layers = jnp.where(st.s_on, base + (extra > 0), 0.0)  # the busiest stage of each group
    return dict(base=base, extra=extra, layers=layers, held=held, ok=ok, lt=lt, total=total)


def _latencies(model, hs, st, lc, p2p, split):
    """Per micro-batch terms and time of each slot's stage (the head and MTP heads on the last),
    and the sum of the latencies of a group's stages (``base`` layers each, ``extra`` one more)."""

    def times(lc, layers, p2p, head):
        t = stage_times(lc, layers, p2p, lc.head * head, memory.moe_stage_layers(model, layers))
        return t, t["compute_s"] + t["recompute_s"] + t["tp_s"] + t["cp_s"] + t["ep_s"] + t["pp_s"]

    tv = jax.vmap(jax.vmap(jax.vmap(times)))
    head_mult = jnp.where(st.last, 1.0 + model.mtp_layers, 0.0)
    b = jnp.broadcast_to
    t_terms, tau = tv(lc, b(split["layers"][..., None], st.bc), p2p, b(head_mult[..., None], st.bc))
    _, tau_base = tv(lc, b(split["base"][..., None], st.bc), p2p, jnp.zeros(st.bc))
    head_s = jnp.where(st.last[..., None], lc.head * (1.0 + model.mtp_layers), 0.0)
    group_sum = hs.stage_count[..., None] * tau_base + split["extra"][..., None] * split["lt"] + head_s
    return t_terms, jnp.where(st.on, tau, 0.0), group_sum


def _share_microbatches(hs, plan, st, tau):
    """Micro-batches per replica: over the pipeline copies, then in every stage over its replicas
    (``equal``, by ``speed`` or as given). Returns (per replica, whether the shares add up, each
    stage's latency)."""
    n_total = jnp.maximum(safe_div(plan.global_batch, plan.micro_batch, 1.0), 1.0)
    speed = st.speed
    stage_lat = jnp.max(tau, axis=2)  # [J, S]
    rate = jnp.sum(jnp.where(st.on, safe_div(hs.count, tau), 0.0), axis=2)
    period = jnp.where(speed, safe_div(1.0, rate), safe_div(stage_lat, st.reps))
    pipe_period = jnp.max(jnp.where(st.s_on, period, 0.0), axis=1)
    copies = jnp.sum(jnp.where(st.p_on, hs.pipe_count, 0.0))
    given = jnp.all(jnp.where(st.p_on, hs.pipe_mb > 0, True))
    pb, pe = integer_split(n_total, jnp.where(st.p_on, hs.pipe_count, 0.0), jnp.where(speed, pipe_period, 1.0))
    equal = safe_div(n_total, copies)
    n_pipe = jnp.where(st.p_on, jnp.where(given, hs.pipe_mb, jnp.where(speed, pb + (pe > 0), equal)), 0.0)
    ok = jnp.where(given, jnp.abs(jnp.sum(hs.pipe_mb * hs.pipe_count) - n_total) < 0.5, True)
    ok &= speed | given | (jnp.abs(equal - jnp.round(equal)) < 1e-6)

    def split_stage(n, count, tau_r, mine, present):
        b, e = integer_split(n, count, tau_r)
        eq = safe_div(n, jnp.sum(count))
        use = jnp.all(jnp.where(present, mine > 0, True))
        m = jnp.where(use, mine, jnp.where(speed, b + (e > 0), eq))
        good = jnp.where(use, jnp.abs(jnp.sum(jnp.where(present, mine * count, 0.0)) - n) < 0.5, True)
        good &= speed | use | (jnp.abs(eq - jnp.round(eq)) < 1e-6)
        return jnp.where(present, m, 0.0), good

    mb, stage_ok = jax.vmap(jax.vmap(split_stage, in_axes=(None, 0, 0, 0, 0)))(
        n_pipe, jnp.where(st.on, hs.count, 0.0), jnp.where(st.on, tau, BIG), hs.rep_mb, st.on
    )
    ok &= jnp.all(jnp.where(st.s_on, stage_ok, True)) & jnp.all(jnp.where(st.on, mb >= 1.0, True))
    return mb, ok, stage_lat


def _dp_groups(model, hs, st, split):
    """The data-parallel group of each stage's layers: every copy's replicas of the stages holding
    its first layer (the embedding at 0 / the head at the end for a stage without layers), whether
    that group spans two kinds, and then the most GPUs of the group one node can hold (each kind's
    GPUs of the group sit on that kind's own nodes)."""
    held, total = split["held"], split["total"]
    hi = jnp.cumsum(held, axis=1)
    lo = hi - held
    onehot = _kinds_onehot(hs, st.on)  # [J, S, R, K]
    gpus = (hs.pipe_count[:, None, None] * hs.count * hs.tp)[..., None] * onehot

    def group_of(x):
        ends = ((x == 0.0) & st.first) | ((x >= total) & st.last)
        inside = st.s_on & jnp.where(held > 0, (lo <= x) & (x < hi), (x == lo) & ends)
        n = jnp.sum(jnp.where(inside, hs.pipe_count[:, None] * st.reps, 0.0))
        per_kind = jnp.sum(jnp.where(inside[..., None, None], gpus, 0.0), axis=(0, 1, 2))  # [K]
        return n, jnp.any(jnp.where(inside[..., None], st.kinds, False), axis=(0, 1)), per_kind

    n_dp, kinds, per_kind = jax.vmap(jax.vmap(group_of))(lo + jnp.where(held > 0, 0.5, 0.0))
    node_cap = jnp.min(jnp.where(per_kind > 0, per_kind, BIG), axis=-1)
    return jnp.where(st.s_on, jnp.maximum(n_dp, 1.0), 1.0), jnp.sum(kinds, axis=-1) > 1, node_cap


def _slots(model, hs, plan, cal, st, sys, sys_x, lc, t_terms, n_dp, layers, mb, cross_dp):
    """Every slot's synchronisation, optimizer, offload, memory and flags (the stages of
    :func:`hetersim.simulate.simulate` on the slot's stage)."""
    inflight = jnp.minimum(jnp.broadcast_to((st.depth[:, None] - st.start)[..., None], st.bc), mb)
    inflight = inflight * (1.0 + (st.depth3 - 1.0) / (st.depth3 * plan.vp) * (plan.vp > 1))
    # Vocabulary matrices of a group's busiest stage: the embedding on the first, the head on the
    # last; both (one when tied) where one stage is the whole pipeline.
    alone = st.first & st.last & (hs.stage_count <= 1)
    vocab = jnp.where(alone, 2.0 - model.tied_embeddings, jnp.where(st.first | st.last, 1.0, 0.0))

    def rest(system, system_x, t, tp, n_dp_, pp, layers_, m, infl, vocab_, last_, cross_):
        p = compute.resolve_kernels(system.device, _slot_plan(plan, hs, tp, n_dp_, pp))
        pipe = PipelineStep(n_micro=m, layers=layers_, bubble_s=0.0, **t)
        sys_dp = jax.tree.map(lambda a, b: jnp.where(cross_, b, a), system, system_x)
        dp = dp_comm_s(model, sys_dp, p, cal, pipe, vocab_)
        states = memory.state_bytes(model, p, layers_, vocab_)
        oc = optimizer_offload(model, system, p, cal, pipe, states, vocab_)
        mem = placement(model, system, p, m, states, layers_, infl, jnp.where(last_, 1.0, 0.0))
        f = stage_flags(model, system, p, m, mem) & ~_STRUCTURE
        return dict(dp=dp, states=states, oc=oc, mem=mem, flags=f.astype(jnp.int32), plan=p)

    def b3(x):
        return jnp.broadcast_to(x[..., None], st.bc)

    args = (hs.tp, b3(n_dp), st.depth3, b3(layers), mb, inflight, b3(vocab), b3(st.last), b3(cross_dp))
    return jax.vmap(jax.vmap(jax.vmap(rest)))(sys, sys_x, t_terms, *args)


def _job(model, hs, plan, st, sys, out, terms, n_micro, flags) -> Breakdown:
    """Job-level rates over every slot's GPUs; memory, goodput and flags of the slot nearest its
    capacity (any slot's flags count)."""
    step = sum(terms.values())
    gpus = jnp.where(st.on, hs.count * hs.tp * plan.cp * hs.pipe_count[:, None, None] * hs.stage_count[..., None], 0.0)
    dev = sys.device
    n_gpus = jnp.sum(gpus)
    usd = jnp.sum(gpus * dev.price_usd_per_hour)
    power = jnp.sum(gpus * dev.tdp_W)
    peak = jnp.sum(gpus * dev.peak_tflops[..., plan.precision_code])
    job_plan = dataclasses.replace(plan, n_gpus=n_gpus)
    rates = throughput(model, job_plan, step, n_gpus=n_gpus, peak_tflops=peak, usd_per_hour=usd, power_W=power)
    mem = out["mem"]
    i_mem = jnp.argmax(jnp.where(st.on, safe_div(mem.hbm / GiB, dev.hbm_capacity_GiB), -1.0).reshape(-1))
    system_m = _at(sys, i_mem)
    plan_m = dataclasses.replace(_at(out["plan"], i_mem), n_gpus=n_gpus)
    gp, gp_flags = goodput_terms.goodput(
        model, system_m, plan_m, _at(out["states"], i_mem), step_s=step, time_to_train_s=rates.time_to_train_s,
        usd_per_hour=usd, power_W=power,
    )  # fmt: skip
    flags = flags | _any_flags(jnp.where(st.on, out["flags"], 0).reshape(-1)) | gp_flags
    flags |= jnp.where(n_gpus > 0, 0, int(Infeasible.GPU_COUNT))
    mem_m = _at(mem, i_mem)
    need = goodput_terms.memory_tier_need_GiB(plan_m, gp)
    over = (mem_m.tier_used_GiB + need > mem_m.tier_capacity_GiB) & (need > 0) & (system_m.host.tier_present > 0)
    flags |= jnp.where(jnp.any(over), int(Infeasible.TIER_CAPACITY), 0)
    return breakdown(
        terms,
        rates,
        mem_m,
        _at(out["oc"], i_mem),
        gp,
        hbm_capacity_GiB=system_m.device.hbm_capacity_GiB,
        n_micro=n_micro,
        params=total_params(model),
        infeasible=flags.astype(jnp.int32),
    )


_cross_network_jit = jax.jit(cross_network)


def padded_shape(hplan) -> tuple[int, int, int]:
    """A shape ``(J, S, R)`` that holds the plan, rounded up (at least 2 pipelines, stages in
    fours, 2 replica groups) so that small plans share one compiled program."""
    from .hplan import plan_shape

    J, S, R = plan_shape([hplan])
    return max(J, 2), -(-S // 4) * 4, max(R, 2)


def hetero_spec(hplan, catalog, cluster: dict[str, int] | None = None, shape=None, kinds=None) -> HeteroSpec:
    """A :class:`HeteroSpec` of one :class:`hetersim.hplan.HeteroPlan` (host side): the device
    kinds in the plan's order of first use, each with a scale-up domain no larger than the GPUs
    of that kind in the cluster (two kinds never share one); the cross network from the kinds'
    scale-out links and the plan's ``link``."""
    import numpy as np

    from . import build
    from . import hplan as hp
    from .planfields import AUTO

    used_kinds = hplan.kinds()
    kinds = list(kinds) if kinds is not None else used_kinds  # a fixed order batches plans alike
    cluster = cluster or hplan.gpus()
    systems = []
    memory, fleets = catalog.memory, catalog.fleets
    for k in kinds:
        entry = catalog.gpu(k)
        domain = min(float(entry.get("scaleup_domain", 8)), float(cluster.get(k, 1)))
        systems.append(build.system_spec(entry, catalog.links, scaleup_domain=domain, memory=memory, fleets=fleets))
    # Stacked on the host and put on the device once per leaf: an eager jnp.stack compiles a
    # program per leaf shape (about 0.5 s of a repeated `hetersim evaluate --plan`), and the cross
    # network is one jitted program instead of a score of eager operations.
    stacked = jax.tree.map(lambda *xs: jnp.asarray(np.stack([np.asarray(x) for x in xs])), *systems)
    link_bw = link_lat = 0.0
    if hplan.link:
        link = catalog.link(hplan.link)
        if link["kind"] != "scaleout":  # kinds sit on different nodes: their traffic crosses the NICs
            raise ValueError(f"link {hplan.link!r} between kinds is a {link['kind']} link; name a scaleout link")
        link_bw, link_lat = float(link["bw_GBps"]) * float(link.get("busbw_eff", 1.0)), float(link["latency_us"])
    used = jnp.asarray([1.0 if k in used_kinds else 0.0 for k in kinds])
    cross = _cross_network_jit(stacked, used, link_bw, link_lat)
    arrays = {k: np.asarray(v)[0] for k, v in hp.to_arrays([hplan], kinds, shape).items()}
    sp = hplan.options.get("sp", AUTO)
    return HeteroSpec(
        systems=stacked,
        cross=cross,
        sp_auto=jnp.asarray(1.0 if sp in (AUTO, None) else 0.0),
        **{k: jnp.asarray(v) for k, v in arrays.items()},
    )


def common_plan(hplan, seq_len: int) -> Plan:
    """The plan fields every replica shares, as a :class:`Plan` (tp, pp, dp, n_gpus placeholders
    that :func:`simulate_plan` replaces per slot)."""
    from . import build

    opts = {k: v for k, v in hplan.options.items()}
    if opts.get("dualpipe"):
        raise ValueError("dualpipe: a heterogeneous plan's stages run 1F1B (DualPipe is priced for one device kind)")
    opts.setdefault("seq_len", seq_len)
    cp = opts.pop("cp", 1)  # the placeholder group is one replica's context-parallel ranks
    return build.plan_spec(n_gpus=cp, tp=1, pp=1, cp=cp, **{k: v for k, v in opts.items()})
