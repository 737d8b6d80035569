"""Per-layer, per-micro-batch costs of one transformer layer on one device kind.

``simulate`` composes these into a stage and a step for a homogeneous cluster; ``cluster``
composes them per device group for mixed clusters. All times are seconds on one GPU.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from . import stacks
from .pytree import spec
from .specs import Calibration, ModelSpec, Plan, SystemSpec
from .terms import comm, compute, elementwise, moe
from .terms._safe import pos
from .types import Attention, Recompute, Stack

# Share of the tensor-parallel traffic that PyTorch's async TP (torchtitan's
# experimental.enable_async_tensor_parallel: micro-pipelined collective matmuls over symmetric
# memory) hides, measured: torchtitan's benchmark of it against vanilla TP, bf16, torch.compile, on
# H100 (500 W, 8 per NVLink host) gives 1.09x on Llama 3.1 70B (FSDP 32, TP 8, full AC, local batch
# 16) and 1.10x on 8B (FSDP 8, TP 8, op-level AC, local batch 12) (pytorch/torchtitan @ b5bcd76c6
# benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md). Of the traffic this model exposes in
# those two runs under vanilla TP (17% and 18% of the step), hiding 0.499 and 0.502 gives those
# speedups: half of it, not the share Transformer Engine's userbuffers hide (the calibrated
# tp_overlap). Each of the tp steps of a decomposed matmul is a smaller GEMM, and the copies take
# SMs from it.
ASYNC_TP_HIDDEN = 0.5
# Bytes per element of the attention mask a stack sends down the pipeline (p2p_mask): DeepSpeed 0.3
# casts the boolean mask to half to send it (DachengLi1/AMP @ 72eeea4 DeepSpeed/deepspeed/runtime/
# pipe/engine.py l.808-813: "NCCL does not like to send torch.BoolTensor types").
MASK_BYTES = 2.0


@spec
class LayerCosts:
    layer_f: Any  # forward compute of one layer (GEMMs, attention, element-wise)
    layer_b: Any  # backward compute of one layer
    recomp: Any  # recomputation added to one layer's backward
    tp_f: Any  # exposed tensor-parallel communication, forward
    tp_b: Any  # exposed tensor-parallel communication, backward
    cp_f: Any  # exposed context-parallel communication, forward
    cp_b: Any  # exposed context-parallel communication, backward
    head: Any  # LM head, loss and embedding (forward + backward) on the stage that holds them
    # An MoE layer (same attention, the MoE block instead of the dense FFN; zero-cost terms for a
    # dense model, which has none): compute, recomputation, exposed TP and expert-parallel traffic.
    moe_f: Any
    moe_b: Any
    moe_recomp: Any
    moe_tp_f: Any
    moe_tp_b: Any
    ep_f: Any
    ep_b: Any


def layer_costs(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration) -> LayerCosts:
    dev, net = system.device, system.network
    plan = compute.resolve_kernels(dev, plan)
    s_tp, s_cp, _, _ = comm.strides(plan)
    T = plan.micro_batch * plan.seq_len / plan.cp
    act = compute.act_bytes(plan)

    attn_shapes = compute.attn_gemm_shapes(model, plan)
    mlp_shapes = compute.mlp_gemm_shapes(model, plan)
    attn_gemm_f = compute.gemms_fwd_s(dev, cal, plan, attn_shapes)
    attn_gemm_b = compute.gemms_bwd_s(dev, cal, plan, attn_shapes)
    gemm_f = attn_gemm_f + compute.gemms_fwd_s(dev, cal, plan, mlp_shapes)
    gemm_b = attn_gemm_b + compute.gemms_bwd_s(dev, cal, plan, mlp_shapes)
    attn_f = compute.attention_fwd_s(dev, cal, model, plan)
    attn_b = compute.attention_bwd_s(dev, cal, model, plan)
    ew_f = elementwise.layer_elementwise_fwd_s(dev, cal, model, plan)
    ew_b = elementwise.layer_elementwise_bwd_s(dev, cal, model, plan)
    act_fn_s = elementwise.activation_fn_s(dev, cal, model, plan)
    layer_f = gemm_f + attn_f + ew_f
    layer_b = gemm_b + attn_b + ew_b
    if model.extra is not None:  # point-wise extras a hand-fused stack runs apart (GPT-OSS)
        x_f, x_b, clamp_f = _dense_extras(dev, cal, model, plan)
        layer_f, layer_b, act_fn_s = layer_f + x_f, layer_b + x_b, act_fn_s + clamp_f

    # Tensor parallel: per layer 2 all-gathers + 2 reduce-scatters with SP (2 all-reduces
    # without) of the b*s*h activation in the forward, the same again in the backward.
    tp_bytes = T * model.hidden * act
    tp_pass = 2.0 * comm.all_reduce_s(net, plan.tp, s_tp, tp_bytes, 1.0)
    # Forward: the collectives sit between dependent GEMMs; a fraction ``tp_overlap`` is hidden
    # where the stack splits GEMMs to overlap them (Transformer Engine's userbuffers; the stack's
    # tp_comm_overlap, on a device that runs Transformer Engine), none where its collectives block.
    # Backward: Megatron overlaps the input all-gather and the gradient reduce-scatter
    # (all-reduce without SP) with the weight-gradient GEMMs, which do not depend on them
    # (Korthikanti et al. 2022 §4.2.2; Megatron's LinearWithGradAccumulationAndAsyncCommunication).
    te_overlap = compute.stack_fact(stacks.table().tp_comm_overlap, plan) * compute.runs_transformer_engine(dev)
    tp_hidden = jnp.where(plan.stack_code == Stack.TORCHTITAN_ASYNC_TP, ASYNC_TP_HIDDEN, cal.tp_overlap) * te_overlap
    tp_f = jnp.where(plan.tp > 1, (1.0 - tp_hidden) * tp_pass, 0.0)
    tp_b = jnp.where(plan.tp > 1, _tp_bwd_s(plan, tp_pass, gemm_b, tp_hidden), 0.0)

    cp_f, cp_b = _cp_exposed(model, net, plan, s_cp, T, act, attn_f, attn_b)

    # Recomputation during the backward: the whole forward (full) or the attention core
    # (selective); with flash attention selective recomputation also rebuilds the activation
    # function's output, which it does not store (memory.layer_activation_bytes).
    rc = plan.recompute_code
    selective = attn_f + jnp.where(plan.attention_code != Attention.MATERIALIZED, act_fn_s, 0.0)
    # torchtitan's op-level policy instead: every second matmul and all element-wise ops.
    op_sac = compute.op_sac_recompute_s(model, gemm_f, ew_f)
    selective = jnp.where(compute.stack_fact(stacks.table().op_level_sac, plan) > 0, op_sac, selective)
    if model.extra is not None:  # MLA's up projections instead of the attention core (mla_up_proj)
        mla_up = compute.mla_up_proj_fwd_s(dev, cal, model, plan)
        selective = jnp.where(compute.mla_up_recompute(model, plan), mla_up, selective)
    recomp = jnp.where(
        rc == Recompute.FULL, layer_f + tp_f + cp_f, jnp.where(rc == Recompute.SELECTIVE, selective, 0.0)
    )
    head = compute.head_s(dev, cal, model, plan)

    if model.extra is None:  # a dense model has no MoE layer: none of its terms are traced
        m = dict.fromkeys(("moe_f", "moe_b", "moe_recomp", "moe_tp_f", "moe_tp_b", "ep_f", "ep_b"), 0.0)
    else:
        parts = dict(attn_gemm_f=attn_gemm_f, attn_gemm_b=attn_gemm_b, attn_f=attn_f, attn_b=attn_b, cp_f=cp_f)
        m = _moe_layer(model, system, plan, cal, parts, tp_pass, tp_hidden)
    return LayerCosts(layer_f, layer_b, recomp, tp_f, tp_b, cp_f, cp_b, head, **m)


def _tp_bwd_s(plan: Plan, tp_pass, gemm_b, tp_hidden):
    """Exposed tensor-parallel traffic of one layer's backward; ``tp_pass`` the forward's (one
    all-reduce per block, or its all-gather and reduce-scatter with SP).

    Megatron overlaps the input gradient's all-reduce (reduce-scatter with SP) and, with SP, the
    all-gather of the stored input shard again for the weight gradient with the GEMMs that do not
    wait for them (Korthikanti et al. 2022 §4.2.2; megatron/core/tensor_parallel/layers.py
    LinearWithGradAccumulationAndAsyncCommunication.backward): the block's all-reduce worth of
    traffic hides behind the weight-gradient GEMMs. With SP the row-parallel output's gradient is
    all-gathered first (the backward of the forward's reduce-scatter,
    megatron/core/tensor_parallel/mappings.py _ReduceScatterToSequenceParallelRegion.backward, a
    blocking _gather_along_first_dim): half an all-reduce per block, before the GEMMs that need it,
    hidden only by the stack's GEMM-split overlap (``tp_hidden``, as in the forward)."""
    ag_dy = jnp.where(plan.sp > 0, 0.5 * (1.0 - tp_hidden) * tp_pass, 0.0)
    return ag_dy + pos(tp_pass - 0.5 * gemm_b)


def _cp_exposed(model: ModelSpec, net, plan: Plan, s_cp, T, act, attn_f, attn_b):
    """Exposed context-parallel traffic (forward, backward) of one layer: ring attention passes K and
    V around the cp ranks in the forward, and K, V, dK, dV in the backward, overlapped with the
    attention blocks it feeds; ``T`` tokens on the rank, ``act`` bytes per activation, ``s_cp``
    the context-parallel stride (as :func:`layer_costs` has them)."""
    # MLA passes its up-projected keys and values (a*(d + d_r) and a*d_v per token).
    # PyTorch's ring attention (torchtitan; the stack fact cp_torch_ring) passes K/V repeated to
    # the query heads and the backward's dK/dV in fp32. Its default all-gather rotation fetches all
    # other ranks' K/V while only the first step (the local block, 1/cp of the attention) runs,
    # and waits for it at the second (PyTorch PR 132820; torchtitan's default rotate method
    # "allgather", torchtitan/config_manager.py @ 9dec370); each step's dK/dV reach the next rank
    # while that rank computes one step. Transformer Engine's ring sends every step's K/V while the
    # step before computes: the whole pass hides it.
    torch_ring = compute.stack_fact(stacks.table().cp_torch_ring, plan)
    kv_width = 2.0 * jnp.where(torch_ring > 0, model.heads, model.kv_heads) * model.head_dim
    if model.extra is not None:
        mla = model.heads * (model.head_dim + model.rope_head_dim + model.v_head_dim)
        kv_width = jnp.where(model.kv_lora_rank > 0, mla, kv_width)
    kv_bytes = T * kv_width / plan.tp * act
    ring_step = comm.p2p_s(net, s_cp, kv_bytes, n=plan.cp)
    dkv_step = comm.p2p_s(net, s_cp, kv_bytes * jnp.where(torch_ring > 0, 4.0 / act, 1.0), n=plan.cp)
    ring_f = pos((plan.cp - 1.0) * ring_step - attn_f)
    ring_b = pos((plan.cp - 1.0) * (ring_step + dkv_step) - attn_b)
    step_f, step_b = attn_f / plan.cp, attn_b / plan.cp
    gather_f = pos((plan.cp - 1.0) * ring_step - step_f)
    gather_b = pos((plan.cp - 1.0) * ring_step - step_b) + (plan.cp - 1.0) * pos(dkv_step - step_b)
    # Compiled (torchtitan's torch.compile of each block, fullgraph=True, torchtitan/parallelisms/
    # parallelize_llama.py @ 9dec370 l.303), the ring is traced into the block's graph, where a
    # functional collective waits as soon as it is issued (torch/distributed/_functional_collectives.py
    # _maybe_wrap_tensor: "if _are_we_tracing(): return wait_tensor(self)") and TorchInductor moves
    # no wait past compute by default (torch/_inductor/config.py reorder_for_compute_comm_overlap =
    # False): the K/V all-gather of the forward and of the backward and the backward's cp dK/dV
    # sends (one per ring step, the last returning the sums to their owner) are all exposed.
    traced = (torch_ring > 0) & (elementwise.compiled(plan) > 0)
    gather_f = jnp.where(traced, (plan.cp - 1.0) * ring_step, gather_f)
    gather_b = jnp.where(traced, (plan.cp - 1.0) * ring_step + plan.cp * dkv_step, gather_b)
    cp_f = jnp.where(plan.cp > 1, jnp.where(torch_ring > 0, gather_f, ring_f), 0.0)
    cp_b = jnp.where(plan.cp > 1, jnp.where(torch_ring > 0, gather_b, ring_b), 0.0)
    return cp_f, cp_b


def _dense_extras(dev, cal, model: ModelSpec, plan: Plan):
    """(forward, backward, the clamp alone) of a dense layer's point-wise extras that a hand-fused
    stack runs apart: the scaled rotary embedding and the FFN input's clamp
    (:func:`hetersim.terms.elementwise.rope_unfused_s`, :func:`~hetersim.terms.elementwise.clamp_s`)."""
    rope = elementwise.rope_unfused_s(dev, cal, model, plan)
    ffn = compute.tokens(plan) * model.ffn_hidden / plan.tp
    clamp_f = elementwise.clamp_s(dev, cal, model, plan, ffn, False)
    return rope + clamp_f, rope + elementwise.clamp_s(dev, cal, model, plan, ffn, True), clamp_f


def _moe_layer(model, system, plan, cal, parts, tp_pass, tp_hidden) -> dict[str, Any]:
    """An MoE layer's terms (the ``moe_*`` and ``ep_*`` fields of :class:`LayerCosts`): the attention
    part of the dense layer (``parts``), then router, permutation, the routed experts' grouped GEMMs
    and the shared experts (:mod:`hetersim.terms.moe`)."""
    dev, net = system.device, system.network
    attn_gemm_f, attn_gemm_b = parts["attn_gemm_f"], parts["attn_gemm_b"]
    attn_f, attn_b, cp_f = parts["attn_f"], parts["attn_b"], parts["cp_f"]
    rc = plan.recompute_code
    attn_ew_f = elementwise.attn_elementwise_fwd_s(dev, cal, model, plan)
    shared = moe.shared_shapes(model, plan)
    router = [(moe.local_tokens(plan), model.n_experts, model.hidden, jnp.where(moe.is_moe(model), 1.0, 0.0))]
    block_ew_f = moe.block_elementwise_fwd_s(dev, cal, model, plan)
    moe_gemm_f = compute.gemms_fwd_s(dev, cal, plan, shared + router) + moe.experts_fwd_s(dev, cal, model, plan)
    moe_gemm_b = compute.gemms_bwd_s(dev, cal, plan, shared + router) + moe.experts_bwd_s(dev, cal, model, plan)
    rope_x = elementwise.rope_unfused_s(dev, cal, model, plan)
    extras_f = rope_x + moe.experts_extras_s(dev, cal, model, plan, backward=False)
    extras_b = rope_x + moe.experts_extras_s(dev, cal, model, plan, backward=True)
    moe_f = attn_gemm_f + attn_f + attn_ew_f + moe_gemm_f + block_ew_f + extras_f
    attn_ew_b = elementwise.attn_elementwise_bwd_s(dev, cal, model, plan)
    moe_b = attn_gemm_b + attn_b + attn_ew_b + 2.0 * block_ew_f + moe_gemm_b + extras_b
    # Tensor parallel: the attention block's collectives, and the shared experts' where there are
    # any (the routed experts run on sequence-parallel tokens and need none).
    tp_share = 0.5 * (1.0 + jnp.where(model.shared_ffn_hidden > 0, 1.0, 0.0))
    moe_tp_f = jnp.where(plan.tp > 1, (1.0 - tp_hidden) * tp_share * tp_pass, 0.0)
    moe_tp_b = jnp.where(plan.tp > 1, _tp_bwd_s(plan, tp_share * tp_pass, attn_gemm_b + moe_gemm_b, tp_hidden), 0.0)
    # Dispatch and combine sit between dependent steps of the layer: exposed in both passes,
    # unless the stack runs Megatron-Core's 1F1B all-to-all overlap (overlap_moe_expert_parallel_comm:
    # one micro-batch's forward and another's backward are merged, each one's all-to-all running
    # under the other's compute; megatron/core/pipeline_parallel/combined_1f1b.py), which leaves
    # only what the other pass's compute cannot cover.
    ep_pass = jnp.where(moe.is_moe(model), moe.ep_comm_s(net, model, plan), 0.0)
    overlap = plan.ep_overlap > 0
    ep_f = jnp.where(overlap, moe.overlapped_ep_s(dev, plan, ep_pass, moe_b), ep_pass)
    ep_b = jnp.where(overlap, moe.overlapped_ep_s(dev, plan, ep_pass, moe_f), ep_pass)
    moe_selective = attn_f + jnp.where(
        plan.attention_code != Attention.MATERIALIZED, moe.moe_act_fn_s(dev, cal, model, plan), 0.0
    )
    moe_selective = jnp.where(
        compute.mla_up_recompute(model, plan), compute.mla_up_proj_fwd_s(dev, cal, model, plan), moe_selective
    )
    moe_recomp = jnp.where(
        rc == Recompute.FULL,
        moe_f + moe_tp_f + cp_f + ep_f,
        jnp.where(rc == Recompute.SELECTIVE, moe_selective, 0.0),
    )
    return dict(
        moe_f=moe_f, moe_b=moe_b, moe_recomp=moe_recomp, moe_tp_f=moe_tp_f, moe_tp_b=moe_tp_b, ep_f=ep_f, ep_b=ep_b
    )


def p2p_chunk_s(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration):
    """Exposed pipeline point-to-point time per micro-batch and stage: the activation forward
    and its gradient backward, once per model chunk."""
    _, _, _, s_pp = comm.strides(plan)
    T = plan.micro_batch * plan.seq_len / plan.cp
    # Each TP rank sends 1/tp where sequence parallelism has split the activation or the stack
    # scatters it (p2p_scatter_gather: Megatron-LM's scatter/gather, DeepSpeed's partitioning).
    split = (plan.sp > 0) | (compute.stack_fact(stacks.table().p2p_scatter_gather, plan) > 0)
    nbytes = T * model.hidden * compute.act_bytes(plan) / jnp.where(split, plan.tp, 1.0)
    # DeepSpeed 0.3's engine sends the gradient whole from every TP rank (p2p_full_grads), and
    # Megatron-LM v1.1.5's pipe passes the [1, 1, s, s] fp16 attention mask beside each
    # micro-batch's activation (p2p_mask): MASK_BYTES per mask element, whatever the micro-batch.
    whole = (compute.stack_fact(stacks.table().p2p_full_grads, plan) > 0) & (plan.sp <= 0)  # SP splits it at its source
    grad_bytes = jnp.where(whole, T * model.hidden * compute.act_bytes(plan), nbytes)
    has_mask = compute.stack_fact(stacks.table().p2p_mask, plan)
    send = comm.p2p_s(system.network, s_pp, nbytes + has_mask * MASK_BYTES * plan.seq_len**2, 1.0 + has_mask, plan.pp)
    p2p = plan.vp * (send + comm.p2p_s(system.network, s_pp, grad_bytes, n=plan.pp))
    # A stack whose pipeline sends block (DeepSpeed's engine) hides none of it.
    hidden = cal.pp_overlap * compute.stack_fact(stacks.table().p2p_overlap, plan)
    return jnp.where(plan.pp > 1, (1.0 - hidden) * p2p, 0.0)
