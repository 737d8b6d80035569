"""Collectives priced on the network levels a group actually spans.

A parallel dimension of ``n`` ranks placed with stride ``S`` (the product of the sizes of the
dimensions inside it, see :func:`strides`) has ``clip(D_l / S, 1, n)`` of its ranks inside one
domain of level ``l`` (``D_l`` GPUs). Collectives are hierarchical, as NCCL runs them across
nodes: a ring phase per level over the ``r_l`` ranks that level adds, on the data left after the
phases inside it (the intra-node phase of an all-reduce leaves ``M / r_0`` bytes per rank for the
inter-node phase). Ring all-reduce moves ``2(r-1)/r`` of the buffer per rank and all-gather or
reduce-scatter ``(r-1)/r`` (MODELING_NOTES "Communication"); each ring step costs one latency of
the NCCL protocol (LL, LL128, Simple) that NCCL's own model finds fastest for the message.
Bandwidth per level is ``bw_GBps * busbw_eff``: the measured NCCL bus bandwidth (8xA100 234.9 of
300 GB/s, 8xH200 367.6 of 450 GB/s; inter-node about 73% of the NIC line rate).
"""

from __future__ import annotations

import jax.numpy as jnp

from ..specs import NetworkSpec, Plan
from ..types import N_LEVELS, Order
from ..units import GB, US
from ._safe import pos, safe_div, safe_log2


def strides(plan: Plan):
    """Rank stride of each dimension (tp, cp, dp, pp) under the plan's placement order."""
    tp, cp, dp, pp = plan.tp, plan.cp, plan.dp, plan.pp
    one = jnp.ones_like(tp)
    orders = {
        Order.TP_CP_DP_PP: (one, tp, tp * cp, tp * cp * dp),
        Order.TP_CP_PP_DP: (one, tp, tp * cp * pp, tp * cp),
        Order.TP_PP_CP_DP: (one, tp * pp, tp * pp * cp, tp),
    }
    picks = [jnp.stack(orders[o]) for o in Order]
    return jnp.select([plan.order_code == o for o in Order], picks, picks[0])


def ranks_per_level(net: NetworkSpec, n, stride):
    """Cumulative number of the group's ranks inside one domain of each level (innermost first)."""
    inside = []
    prev = jnp.ones_like(n)
    for level in range(N_LEVELS):
        last = level == N_LEVELS - 1
        k = n if last else jnp.clip(safe_div(net.domain_gpus[level], stride, 1.0), 1.0, n)
        k = jnp.maximum(k, prev)
        inside.append(k)
        prev = k
    return inside


def bus_bw(net: NetworkSpec, level: int, gain=1.0):
    """Bytes per second a GPU moves over ``level`` (0 the innermost, ``N_LEVELS - 1`` the
    scale-out network): its bandwidth times the bus efficiency, the outermost level's ``gain``
    times its per-GPU share (:func:`nic_gain`)."""
    bw = net.bw_GBps[level] * net.busbw_eff[level] * GB
    return bw * gain if level == N_LEVELS - 1 else bw


def _bandwidth_s(net: NetworkSpec, n, stride, nbytes, factor, nic_gain=1.0):
    """Bandwidth time of a hierarchical ring collective; ``factor`` 2 for all-reduce, 1 for AG/RS;
    ``nic_gain``: the outermost level's bandwidth is that many times its per-GPU share
    (:func:`nic_gain`)."""
    t = jnp.zeros_like(nbytes)
    prev = jnp.ones_like(n)
    for level, inside in enumerate(ranks_per_level(net, n, stride)):
        r = safe_div(inside, prev, 1.0)
        data = safe_div(nbytes, prev)
        bw = bus_bw(net, level, nic_gain)
        t = t + factor * safe_div(r - 1.0, r) * safe_div(data, bw)
        prev = inside
    return t


# NCCL's protocols (src/graph/tuning.cc @b6475625). Each collective runs on the protocol NCCL's
# model finds fastest for its size: LL and LL128 cut the per-step latency and pay in bandwidth.
PROTOCOLS = ("ll", "ll128", "simple")
_BASE_US = {"ll": 6.6, "ll128": 14.0, "simple": 8.4}  # baseLat[Ring]: once per collective
# getNetOverhead (x86 Intel host): every intra-node step of a ring that leaves the node costs at
# least this, three times it under Simple.
_NET_OVERHEAD_US = 1.0


def _bw_factor(protocol: str, multi_node, all_reduce: bool):
    """Fraction of Simple's bus bandwidth a protocol reaches: LL 1/4 across nodes or in an
    all-reduce, else 1/3; LL128 0.92 (tuning.cc's model refinements)."""
    if protocol == "ll":
        return 0.25 if all_reduce else jnp.where(multi_node, 0.25, 1.0 / 3.0)
    return 0.92 if protocol == "ll128" else 1.0


def _step_latency_us(net: NetworkSpec, protocol: str):
    return {"ll": net.ll_latency_us, "ll128": net.ll128_latency_us, "simple": net.latency_us}[protocol]


def _ring(net: NetworkSpec, n, stride):
    """Hops of a ring of all ``n`` ranks per level (those that stay inside a domain of the level but
    cross one of the level below; a ring enters and leaves each domain once), and whether the ring
    leaves its scale-up domain. Both are the same under every protocol."""
    inside = ranks_per_level(net, n, stride)
    hops, prev_hops = [], jnp.zeros_like(n)
    for k in inside:
        h = safe_div(n, k, 1.0) * (k - 1.0) - prev_hops
        hops.append(h)
        prev_hops = prev_hops + h
    return hops, inside[0] < n


def _steps_s(net: NetworkSpec, ring, protocol: str):
    """One pass of ``ring`` (from :func:`_ring`), each hop priced at the protocol's step latency of
    the level it crosses; intra-node steps of a multi-node ring cost at least the net overhead."""
    hops, multi = ring
    lat = _step_latency_us(net, protocol)
    floor = _NET_OVERHEAD_US * (3.0 if protocol == "simple" else 1.0)
    t = jnp.zeros_like(hops[0])
    for level, h in enumerate(hops):
        step = lat[level]
        if level < N_LEVELS - 1:
            step = jnp.where(multi, jnp.maximum(step, floor), step)
        t = t + h * step * US
    return t


def _base_s(n, protocol: str):
    """The protocol's fixed cost per collective (none for a group of one)."""
    return jnp.where(n > 1, _BASE_US[protocol], 0.0) * US


def ring_latency_s(net: NetworkSpec, n, stride, protocol: str = "simple"):
    """Latency of one pass around a ring of all ``n`` ranks: ``n - 1`` hops, each priced at the
    protocol's step latency of the level it crosses, plus the protocol's fixed cost."""
    return _base_s(n, protocol) + _steps_s(net, _ring(net, n, stride), protocol)


def tree_latency_s(net: NetworkSpec, n, stride):
    """Latency of a double binary tree (NCCL's all-reduce at scale): 2*log2(r) steps per level."""
    t = jnp.zeros_like(n)
    prev = jnp.ones_like(n)
    for level, inside in enumerate(ranks_per_level(net, n, stride)):
        r = safe_div(inside, prev, 1.0)
        t = t + 2.0 * safe_log2(r) * net.latency_us[level] * US
        prev = inside
    return t


def _fastest(candidates):
    """The (bandwidth, latency) pair with the least total, elementwise."""
    best_bw, best_lat = candidates[0]
    for bw, lat in candidates[1:]:
        better = bw + lat < best_bw + best_lat
        best_bw, best_lat = jnp.where(better, bw, best_bw), jnp.where(better, lat, best_lat)
    return best_bw, best_lat


def all_reduce_parts(net: NetworkSpec, n, stride, nbytes, count=1.0, nic_gain=1.0):
    """(bandwidth seconds, latency seconds) of ``count`` all-reduces totalling ``nbytes``: the
    fastest of a ring under each protocol (two passes, one fixed cost) and a tree, as NCCL's
    tuner picks (``nic_gain``: :func:`_bandwidth_s`)."""
    bw = _bandwidth_s(net, n, stride, nbytes, 2.0, nic_gain)
    ring = _ring(net, n, stride)
    cands = [(bw, count * tree_latency_s(net, n, stride))]
    for p in PROTOCOLS:
        lat = _base_s(n, p) + 2.0 * _steps_s(net, ring, p)
        cands.append((bw / _bw_factor(p, ring[1], True), count * lat))
    return _fastest(cands)


def all_gather_parts(net: NetworkSpec, n, stride, nbytes, count=1.0):
    """(bandwidth seconds, latency seconds) of ``count`` all-gathers or reduce-scatters of a
    buffer of ``nbytes`` (full, gathered size). NCCL runs these as rings only, so latency grows
    linearly with the ranks; each runs on the fastest protocol for its size."""
    bw = _bandwidth_s(net, n, stride, nbytes, 1.0)
    ring = _ring(net, n, stride)
    lats = {p: _base_s(n, p) + _steps_s(net, ring, p) for p in PROTOCOLS}
    return _fastest([(bw / _bw_factor(p, ring[1], False), count * lats[p]) for p in PROTOCOLS])


def all_reduce_s(net: NetworkSpec, n, stride, nbytes, count=1.0, nic_gain=1.0):
    """Seconds for ``count`` all-reduces totalling ``nbytes`` over ``n`` ranks of stride ``stride``
    (``nic_gain``: :func:`_bandwidth_s`)."""
    return sum(all_reduce_parts(net, n, stride, nbytes, count, nic_gain))


def all_gather_s(net: NetworkSpec, n, stride, nbytes, count=1.0):
    """All-gather (or reduce-scatter) of a buffer of ``nbytes`` in ``count`` collectives."""
    return sum(all_gather_parts(net, n, stride, nbytes, count))


reduce_scatter_s = all_gather_s


def nic_gain(net: NetworkSpec, flows):
    """How many times the outermost level's per-GPU bandwidth a flow gets where only ``flows`` of a
    node's GPUs cross its NICs at once.

    The outermost ``bw_GBps`` is a NIC's line rate split over the ``gpus_per_nic`` GPUs behind it,
    right when all of them send together (a data-parallel collective, in which every GPU takes
    part). A NIC's line rate is shared by the flows that cross it, not by the GPUs that could:
    where fewer send at once, each gets ``gpus_per_nic / flows`` times that share, up to the whole
    NIC (a flow runs on one NIC: NCCL gives a pair of ranks the NIC nearest the GPU). Between
    pipeline stages ``stride`` ranks apart the stage ending a node sends its ``stride`` ranks'
    activations across (a node holds consecutive ranks); likewise the ranks of a ring of stride
    ``stride``. AMP's p3.8xlarge (one 10 Gbps NIC for 4 V100) sends a pipeline of one rank per
    stage at the NIC's full 10 Gbps, not at 2.5."""
    return jnp.clip(safe_div(net.gpus_per_nic, flows, 1.0), 1.0, jnp.maximum(net.gpus_per_nic, 1.0))


def p2p_s(net: NetworkSpec, stride, nbytes, count=1.0, n=2.0):
    """Point-to-point transfer between neighbours ``stride`` apart in a chain (or ring) of ``n``
    ranks, on the innermost level whose domain holds the whole chain: the chain spans
    ``(n - 1) * stride`` ranks, and where that crosses a domain of a level some neighbour pair
    sends across the next one -- the slowest send paces every step (a pipeline's stages, a
    ring's steps). ``n = 2``: one pair."""
    span = (jnp.maximum(n, 2.0) - 1.0) * stride
    gain = nic_gain(net, stride)  # ``stride`` flows per node share its NICs
    t = None
    for level in reversed(range(N_LEVELS)):
        bw = bus_bw(net, level, gain)
        tl = safe_div(nbytes, bw) + count * net.latency_us[level] * US
        if t is None:
            t = tl
        else:
            t = jnp.where(span < net.domain_gpus[level], tl, t)
    return t


def all_to_all_s(net: NetworkSpec, n, stride, nbytes):
    """An all-to-all in which each of ``n`` ranks (stride ``stride``) sends ``nbytes`` in total,
    ``1/n`` of it to each rank (itself included).

    NCCL runs it as grouped send/receive to every peer at once (``ncclGroupStart`` around
    ``ncclSend``/``ncclRecv``: PyTorch's ``all_to_all_single``), so the traffic to peers in the
    same domain and to peers beyond it moves concurrently, each over its own level: the share of
    the peers first reached at level ``l`` over that level's bus bandwidth, the slowest level
    setting the time. One latency of the outermost level the group spans, and the protocol's
    fixed cost.
    """
    inside = ranks_per_level(net, n, stride)
    t = jnp.zeros_like(nbytes)
    lat = jnp.zeros_like(nbytes)
    prev = jnp.ones_like(n)
    for level, k in enumerate(inside):
        share = safe_div(k - prev, n)
        bw = bus_bw(net, level)
        t = jnp.maximum(t, share * safe_div(nbytes, bw))
        lat = jnp.where(k > prev, net.latency_us[level] * US, lat)
        prev = k
    return jnp.where(n > 1, t + lat + _BASE_US["simple"] * US, 0.0)


def chunked_exposed_s(plan: Plan, comm_s, window_s, early):
    """What of ``comm_s`` of a stage's gradient reductions (or weight gathers) stays exposed when
    they hide behind ``window_s``, one micro-batch's backward (forward) of the stage.

    Without interleaving they start as the last micro-batch's backward reaches each bucket and hide
    behind that backward. With ``vp`` model chunks a stage reduces each chunk's gradients as soon as
    that chunk's last micro-batch has run its backward (Megatron-Core's interleaved schedule calls
    ``grad_sync_func[chunk]`` then, megatron/core/pipeline_parallel/schedules.py
    ``forward_backward_pipelining_with_interleaving`` @ d98e8a64) and gathers a chunk's weights
    while the previous chunk runs its forward (``param_sync_func``). The schedule runs the chunks'
    micro-batches in groups of ``pp`` (``microbatch_group_size_per_vp_stage``, default ``pp``), so
    the first chunk to finish does with ``pp * (vp - 1)`` chunk-passes of its stage still to run,
    each ``1/vp`` of a micro-batch's pass: the reductions hide behind ``(1 + pp (vp - 1)) / vp``
    micro-batch passes, and the last chunk's own share, ``1/vp`` of them, behind its last pass
    only. ``early`` (0/1): the stack reduces chunks early (the profile's ``chunk_grad_sync``); else
    every reduction waits for the last micro-batch and hides behind its one pass."""
    vp = jnp.maximum(plan.vp, 1.0)
    early = (plan.pp > 1) & (early > 0)
    spread = jnp.where(early, (1.0 + plan.pp * (vp - 1.0)) / vp, 1.0)
    vp = jnp.where(early, vp, 1.0)
    return jnp.maximum(pos(comm_s - spread * window_s), pos(comm_s - window_s) / vp)
