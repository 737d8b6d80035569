"""Collectives priced on the network levels a group actually spans.

A parallel dimension of ``n`` ranks placed with stride ``S`` (the product of the sizes of the
dimensions inside it, see :func:`strides`) has ``clip(D_l / S, 1, n)`` of its ranks inside one
domain of level ``l`` (``D_l`` GPUs). Collectives are hierarchical, as NCCL runs them across
nodes: a ring phase per level over the ``r_l`` ranks that level adds, on the data left after the
phases inside it (the intra-node phase of an all-reduce leaves ``M / r_0`` bytes per rank for the
inter-node phase). Ring all-reduce moves ``2(r-1)/r`` of the buffer per rank and all-gather or
reduce-scatter ``(r-1)/r`` (MODELING_NOTES "Communication"); each ring step costs one latency.
Bandwidth per level is ``bw_GBps * busbw_eff``: the measured NCCL bus bandwidth (8xA100 234.9 of
300 GB/s, 8xH200 367.6 of 450 GB/s; inter-node about 73% of the NIC line rate).
"""

from __future__ import annotations

import jax.numpy as jnp

from ..specs import NetworkSpec, Plan
from ..types import N_LEVELS
from ..units import GB, US
from ._safe import safe_div, safe_log2


def strides(plan: Plan):
    """Rank stride of each dimension (tp, cp, dp, pp) under the plan's placement order."""
    tp, cp, dp, pp = plan.tp, plan.cp, plan.dp, plan.pp
    one = jnp.ones_like(tp)
    orders = [  # types.ORDER
        (one, tp, tp * cp, tp * cp * dp),  # tp-cp-dp-pp
        (one, tp, tp * cp * pp, tp * cp),  # tp-cp-pp-dp
        (one, tp * pp, tp * pp * cp, tp),  # tp-pp-cp-dp
    ]
    picks = [jnp.stack(o) for o in orders]
    return jnp.select([plan.order_code == i for i in range(len(orders))], picks, picks[0])


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


def _bandwidth_s(net: NetworkSpec, n, stride, nbytes, factor):
    """Bandwidth time of a hierarchical ring collective; ``factor`` 2 for all-reduce, 1 for AG/RS."""
    t = jnp.zeros_like(nbytes)
    prev = jnp.ones_like(n)
    for level, inside in enumerate(ranks_per_level(net, n, stride)):
        r = safe_div(inside, prev, 1.0)
        data = safe_div(nbytes, prev)
        bw = net.bw_GBps[level] * net.busbw_eff[level] * GB
        t = t + factor * safe_div(r - 1.0, r) * safe_div(data, bw)
        prev = inside
    return t


def ring_latency_s(net: NetworkSpec, n, stride):
    """Latency of one pass around a ring of all ``n`` ranks: ``n - 1`` hops, each priced at the
    latency of the level it crosses (a ring enters and leaves each domain of a level once)."""
    t = jnp.zeros_like(n)
    prev_hops = jnp.zeros_like(n)
    for level, inside in enumerate(ranks_per_level(net, n, stride)):
        # Hops that stay inside a domain of this level but cross one of the level below.
        hops = safe_div(n, inside, 1.0) * (inside - 1.0) - prev_hops
        t = t + hops * net.latency_us[level] * US
        prev_hops = prev_hops + hops
    return t


def tree_latency_s(net: NetworkSpec, n, stride):
    """Latency of a double binary tree (NCCL's all-reduce at scale): 2*log2(r) steps per level."""
    t = jnp.zeros_like(n)
    prev = jnp.ones_like(n)
    for level, inside in enumerate(ranks_per_level(net, n, stride)):
        r = safe_div(inside, prev, 1.0)
        t = t + 2.0 * safe_log2(r) * net.latency_us[level] * US
        prev = inside
    return t


def all_reduce_parts(net: NetworkSpec, n, stride, nbytes, count=1.0):
    """(bandwidth seconds, latency seconds) of ``count`` all-reduces totalling ``nbytes``."""
    lat = jnp.minimum(2.0 * ring_latency_s(net, n, stride), tree_latency_s(net, n, stride))
    return _bandwidth_s(net, n, stride, nbytes, 2.0), count * lat


def all_gather_parts(net: NetworkSpec, n, stride, nbytes, count=1.0):
    """(bandwidth seconds, latency seconds) of ``count`` all-gathers or reduce-scatters."""
    return _bandwidth_s(net, n, stride, nbytes, 1.0), count * ring_latency_s(net, n, stride)


def all_reduce_s(net: NetworkSpec, n, stride, nbytes, count=1.0):
    """Seconds for ``count`` all-reduces totalling ``nbytes`` over ``n`` ranks of stride ``stride``.

    Latency: the cheaper of a ring (two passes) and a tree, as NCCL's tuner picks.
    """
    lat = jnp.minimum(2.0 * ring_latency_s(net, n, stride), tree_latency_s(net, n, stride))
    return _bandwidth_s(net, n, stride, nbytes, 2.0) + count * lat


def all_gather_s(net: NetworkSpec, n, stride, nbytes, count=1.0):
    """All-gather (or reduce-scatter) of a buffer of ``nbytes`` (full, gathered size) in ``count``
    collectives. NCCL runs these as rings only, so latency grows linearly with the ranks."""
    return _bandwidth_s(net, n, stride, nbytes, 1.0) + count * ring_latency_s(net, n, stride)


reduce_scatter_s = all_gather_s


def p2p_s(net: NetworkSpec, stride, nbytes, count=1.0):
    """Point-to-point transfer between ranks ``stride`` apart, on the innermost level holding both."""
    t = None
    for level in reversed(range(N_LEVELS)):
        bw = net.bw_GBps[level] * net.busbw_eff[level] * GB
        tl = safe_div(nbytes, bw) + count * net.latency_us[level] * US
        if t is None:
            t = tl
        else:
            t = jnp.where(stride < net.domain_gpus[level], tl, t)
    return t
