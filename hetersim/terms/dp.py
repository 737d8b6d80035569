"""Data-parallel collectives: how many carry a stage's parameters and gradients, and what ZeRO-3
gathers again under full recomputation (used by :func:`hetersim.simulate.dp_comm_s`)."""

from __future__ import annotations

import jax.numpy as jnp

from .. import stacks
from ..specs import ModelSpec, Plan
from ..types import Recompute
from ..units import US
from . import comm, compute, memory
from ._safe import pos, safe_div
from .flops import layer_params

# While a collective runs beside compute it takes SMs and HBM bandwidth from it: compute kernels
# overlapped with communication ran 18.9% slower on average (40.0% at most) than alone, measured
# with GPT and LLaMA training on 4 A100, H100, MI250 and MI210 (Lee et al. 2025, "Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power
# Implications", arXiv 2507.03114, abstract). So the data-parallel traffic a pass hides still costs
# this share of the time it runs hidden.
OVERLAP_SLOWDOWN = 0.189

# Host time to issue one short copy on a CUDA stream: back-to-back launches of a 2.9 us kernel,
# without synchronising in between, take 3.8 us each (A. Gray, "Getting Started with CUDA Graphs",
# NVIDIA Technical Blog, 2019; CUDA.jl's graph guide measures the same order, 260 us for 80
# broadcast kernels). Per-rank copies of a tensor-list collective are launch-bound (list_copy_s).
COPY_LAUNCH_US = 3.8


def dp_bucket_params(plan: Plan, n_dp, grads: bool = False):
    """Parameters per data-parallel collective.

    Megatron-LM's DDP default bucket is ``max(40M, 1M * dp)`` parameters (larger DP groups get
    larger buckets so that collectives stay bandwidth-bound). ZeRO-3 gathers parameters in
    prefetch buckets of 50M and reduces gradients in buckets of 500M (DeepSpeed defaults
    ``stage3_prefetch_bucket_size`` and ``reduce_bucket_size``). ``bucket_Mparams`` > 0 overrides.
    """
    z3 = 500e6 if grads else 50e6
    auto = jnp.where(plan.zero >= 3, z3, jnp.maximum(40e6, 1e6 * n_dp))
    return jnp.where(plan.bucket_Mparams > 0, plan.bucket_Mparams * 1e6, auto)


def param_tensors(m: ModelSpec, layers, root):
    """Parameter tensors of a stage of ``layers`` transformer layers and ``root`` (0/1) embedding
    and final-norm modules, as Megatron-LM's modules hold them: per layer four matrices (fused QKV,
    the output projection, the MLP's first -- gate and up fused -- and second), a bias on each in a
    GPT-style model (``gated`` 0; none in LLaMA's), and two norms (LayerNorm: weight and bias;
    RMSNorm: weight); at the root the word embedding, a GPT's learned positions, the final norm
    and an untied LM head."""
    gpt = 1.0 - m.gated
    per_layer = 4.0 + 4.0 * gpt + 2.0 * (1.0 + gpt)
    at_root = 1.0 + gpt + (1.0 + gpt) + (1.0 - m.tied_embeddings)
    return layers * per_layer + root * at_root


def dp_collectives(plan: Plan, p_local, n_dp, units, tensors=None):
    """(all-gathers, reduce-scatters or all-reduces) that carry ``p_local`` parameters over ``n_dp``
    ranks per pass: one per bucket (:func:`dp_bucket_params`) or, where the stack shards data
    parallelism by FSDP units (its ``fsdp_units``, at ZeRO 2 and 3, no ``bucket_Mparams`` given),
    one per unit: ``units``, the stage's transformer blocks and its root module. DeepSpeed <= 0.4's
    ZeRO-3 (:func:`memory.legacy_zero3`) runs one of each per parameter tensor (``tensors``), whatever
    its size: ``fetch_sub_module`` gathers a module's parameters with ``_all_gather(params,
    async_op=True)``, one ``_allgather_param`` each, and ``_reduce_scatter_gradients`` one
    ``_reduce_scatter_gradient`` per parameter (deepspeedai/DeepSpeed @ 4601885
    deepspeed/runtime/zero/stage3.py l.357-406, partition_parameters.py l.596-636, 702-770; the
    same through v0.4.5)."""
    per_unit = (compute.stack_fact(stacks.table().fsdp_units, plan) > 0) & (plan.zero >= 2) & (plan.bucket_Mparams <= 0)
    n_ag = jnp.maximum(jnp.ceil(p_local / dp_bucket_params(plan, n_dp)), 1.0)
    n_rs = jnp.maximum(jnp.ceil(p_local / dp_bucket_params(plan, n_dp, grads=True)), 1.0)
    n_ag, n_rs = jnp.where(per_unit, units, n_ag), jnp.where(per_unit, units, n_rs)
    if tensors is None:
        return n_ag, n_rs
    legacy = memory.legacy_zero3(plan)
    return jnp.where(legacy, tensors, n_ag), jnp.where(legacy, tensors, n_rs)


def list_copy_s(dev, cal, plan: Plan, p_local, n_shard, tensors, gathers):
    """Seconds per micro-batch that DeepSpeed <= 0.4's ZeRO-3 (:func:`memory.legacy_zero3`) spends around
    its collectives besides the transfers, none elsewhere.

    Each parameter's gather zero-fills a buffer of the whole parameter (``torch.zeros``), cuts it
    into one view per rank and calls ``torch.distributed.all_gather`` with that list; each gradient
    goes to ``torch.distributed.reduce_scatter`` as a list of per-rank views (DeepSpeed @ 4601885
    partition_parameters.py l.607-629, 741-766). PyTorch's NCCL process group runs a tensor-list
    collective on a flat buffer and copies it out to (or in from) the list one rank at a time:
    ``outputTensors[i][j].copy_(outputFlattened[i][j])`` per rank after the all-gather,
    ``inputFlattened[i][j].copy_(inputTensors[i][j])`` before the reduce-scatter
    (pytorch/pytorch @ 6f583bb56 torch/lib/c10d/ProcessGroupNCCL.cpp ``allgather``,
    ``reduce_scatter``). So a collective over ``n_shard`` ranks issues ``n_shard`` copies, and
    with the device synchronised before every gather nothing hides them: the copies take the
    longer of their launches, :data:`COPY_LAUNCH_US` each, and their bytes (the gathered weights
    read and written once more, the gradients once), and the zero fill its bytes.
    ``gathers``: the weights' gathers per micro-batch."""
    launches = (gathers + 1.0) * tensors * n_shard * COPY_LAUNCH_US * US
    weights = p_local * memory.WEIGHT_BYTES
    copies = 2.0 * (gathers * weights + p_local * memory.grad_wire_bytes(plan))
    fill = compute.stream_s(dev, cal, gathers * weights, 0.0)
    t = jnp.maximum(launches, compute.stream_s(dev, cal, copies, 0.0)) + fill
    return jnp.where(memory.legacy_zero3(plan) & (n_shard > 1), t, 0.0)


def collective_parts(net, plan: Plan, p_local, n_all, n_shard, stride, units, hybrid: bool = True, tensors=None):
    """(all-reduce, reduce-scatter, all-gather) (bandwidth, latency) pairs that carry ``p_local``
    parameters over ``n_all`` data-parallel ranks ``stride`` apart, in buckets or, under FSDP, in
    ``units`` (:func:`dp_collectives`; ``tensors``: the stage's parameter tensors, which DeepSpeed
    <= 0.4's ZeRO-3 gathers one by one). Plain data parallelism all-reduces the gradients over all
    of them. ZeRO reduce-scatters gradients and all-gathers weights inside a shard group of
    ``n_shard`` adjacent ranks; where that is fewer than all (hybrid sharding: PyTorch FSDP's
    HYBRID_SHARD, FSDP2's replicate x shard mesh), each rank then all-reduces its reduced shard
    with the same shard of the other groups (``n_all / n_shard`` ranks, ``stride * n_shard``
    apart), which the reduce-scatter pair carries (``hybrid`` False: ``n_shard`` is ``n_all``)."""
    grad_bytes = p_local * memory.grad_wire_bytes(plan)
    n_ag, n_rs = dp_collectives(plan, p_local, n_all, units, tensors)
    rs_bw, rs_lat = comm.all_gather_parts(net, n_shard, stride, grad_bytes, n_rs)
    if hybrid:
        rep = comm.all_reduce_parts(net, n_all / n_shard, stride * n_shard, grad_bytes / n_shard, n_rs)
        rs_bw, rs_lat = rs_bw + rep[0], rs_lat + rep[1]
    return (
        comm.all_reduce_parts(net, n_all, stride, grad_bytes, n_rs),
        (rs_bw, rs_lat),
        comm.all_gather_parts(net, n_shard, stride, p_local * memory.WEIGHT_BYTES, n_ag),
    )


def zero3_regather(model: ModelSpec, plan: Plan):
    """Fraction of a layer's weights that ZeRO-3 gathers a third time under full recomputation.

    The recomputed forward of a layer uses its weights in forward order and the backward right
    after uses them in reverse, so a weight with ``S`` parameters after it in the layer is reused
    ``2 S`` parameters later. FSDP keeps what the recompute gathered for the backward
    (``reuse_Mparams`` 0, the default); DeepSpeed ZeRO-3 releases a weight after each use unless
    it is reused within ``stage3_max_reuse_distance`` parameters (``reuse_Mparams``, DeepSpeed's
    default 1000), so the weights with ``S`` above half that distance are gathered again.
    """
    p_layer = layer_params(model) / plan.tp
    frac = jnp.clip(safe_div(p_layer - memory.reuse_kept_params(plan), p_layer), 0.0, 1.0)
    return jnp.where((plan.reuse_Mparams > 0) & (plan.recompute_code == Recompute.FULL), frac, 0.0)


def hidden_traffic_s(total_s, exposed_s):
    """Compute time lost to data-parallel traffic that runs hidden: :data:`OVERLAP_SLOWDOWN` of the
    part of ``total_s`` (the collectives' time) that ``exposed_s`` leaves behind the passes."""
    return OVERLAP_SLOWDOWN * pos(total_s - exposed_s)
