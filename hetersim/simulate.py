"""``simulate``: one configuration in, one breakdown out, as a short pipeline of named stages.

Each stage is a small pure function of one configuration returning a small pytree:

1. :func:`pipeline_step`: per-micro-batch stage times of the busiest stage and the bubble;
2. :func:`dp_comm_s`: exposed data-parallel / ZeRO / FSDP communication;
3. :func:`optimizer_offload`: the optimizer step and the traffic to slower memory tiers;
4. :func:`placement`: bytes per GPU by category and where they live (HBM or a tier);
5. :func:`flags`: why the configuration cannot run (:class:`hetersim.types.Infeasible` bits);
6. :func:`throughput`: tokens/s, MFU/HFU, time, cost and energy to train from the step time.

:mod:`hetersim.cluster` composes the same stages for mixed clusters. Pure and unbatched: batch
with ``jax.vmap`` and compile once with ``jax.jit`` at the boundary. Nothing raises inside.

Step-time composition (1F1B, Narayanan et al. SC'21 §2.2): with ``m`` micro-batches per step and
per-micro-batch stage times ``t_max`` (the busiest stage, which holds the LM head) and ``t_avg``,
``step = m*t_max + (pp-1)/vp*t_avg + exposed DP + optimizer + exposed offload``. Every term of the
breakdown (:data:`hetersim.outputs.STEP_TERMS`) is a part of that sum, so the terms add up to the
step time exactly.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from . import stacks
from .layer import LayerCosts, layer_costs, p2p_chunk_s
from .outputs import OUTPUTS, STEP_TERMS
from .pytree import spec
from .specs import Calibration, ModelSpec, Plan, SystemSpec
from .terms import comm, compute, memory, offload, schedule, stackrules
from .terms import goodput as goodput_terms
from .terms._safe import not_multiple, pos, safe_div
from .terms.dp import collective_parts, hidden_traffic_s, list_copy_s, param_tensors, zero3_regather
from .terms.flops import model_flops_per_token, total_params
from .types import Infeasible, Recompute
from .units import HOUR, KWH, TFLOP, GiB

__all__ = ["STEP_TERMS", "Breakdown", "simulate"]


class _TierViews:
    """Per-node memory of the slower tiers, one name per tier (index i of the TIER arrays); a
    sweep stores them as metrics (``dse.metrics.METRICS``)."""

    @property
    def host_dram_used_GiB(self):
        return self.tier_used_GiB[..., 1]

    @property
    def cxl_expander_used_GiB(self):
        return self.tier_used_GiB[..., 2]

    @property
    def cxl_pool_used_GiB(self):
        return self.tier_used_GiB[..., 3]

    @property
    def host_dram_capacity_GiB(self):
        return self.tier_capacity_GiB[..., 1]

    @property
    def cxl_expander_capacity_GiB(self):
        return self.tier_capacity_GiB[..., 2]

    @property
    def cxl_pool_capacity_GiB(self):
        return self.tier_capacity_GiB[..., 3]


def _breakdown_class() -> type:
    names = ["step_time_s", *STEP_TERMS, *(k for k in OUTPUTS if k != "step_time_s")]
    doc = "One configuration's results (fields: :data:`hetersim.outputs.STEP_TERMS` and ``OUTPUTS``)."
    namespace = {"__annotations__": dict.fromkeys(names, Any), "__doc__": doc, "__module__": __name__}
    return spec(type("Breakdown", (_TierViews,), namespace))


Breakdown = _breakdown_class()


# --------------------------------------------------------------------------------------------
# Rules shared by the stages
# --------------------------------------------------------------------------------------------


def _flag(cond, bit):
    return jnp.where(cond, jnp.int32(int(bit)), jnp.int32(0))


def micro_batches(plan: Plan):
    """Micro-batches per step and data-parallel replica (at least one)."""
    return jnp.maximum(safe_div(plan.global_batch, plan.micro_batch * plan.dp, 1.0), 1.0)


def layer_time(lc: LayerCosts) -> Any:
    """Seconds one layer adds to its stage per micro-batch (compute, recompute, exposed TP/CP)."""
    return lc.layer_f + lc.layer_b + lc.recomp + lc.tp_f + lc.tp_b + lc.cp_f + lc.cp_b


def layers_split_for_interleaving(layers, chunks):
    """Whether ``chunks = pp*vp`` model chunks of equal size hold the layers, with the embedding
    and the loss each counted as one layer or not: Megatron-LM's interleaved schedule needs the
    layers per pipeline rank (the embedding and loss added under
    ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``)
    divisible by vp (megatron/core/transformer/transformer_block.py ``get_num_layers_to_build``
    @ d98e8a64dd). So LLaMA-3-405B's 126 layers run as pp8 vp8 (128 = 8 x 8 x 2) and 32 layers
    cannot run as pp4 vp3."""
    return ~(not_multiple(layers, chunks) & not_multiple(layers + 1.0, chunks) & not_multiple(layers + 2.0, chunks))


def layout_flags(model: ModelSpec, system: SystemSpec, plan: Plan, n_micro) -> Any:
    """Bits of the layout rules (counts that must divide, a schedule that must exist)."""
    dev = system.device
    f = _flag(jnp.abs(plan.tp * plan.pp * plan.dp * plan.cp - plan.n_gpus) > 0.5, Infeasible.GPU_COUNT)
    f |= _flag(not_multiple(plan.global_batch, plan.micro_batch * plan.dp), Infeasible.BATCH_DIVIDE)
    # A stage chunk with no layer at all is impossible. One-chunk stages may split the layers
    # unevenly (Megatron's decoder_first/last_pipeline_num_layers, torchtitan); an interleaved
    # schedule needs layers_split_for_interleaving.
    layers = memory.stack_layers(model)  # multi-token-prediction layers are pipelined like the others
    f |= _flag(layers < plan.pp * plan.vp, Infeasible.LAYERS_DIVIDE)
    uneven = (plan.vp > 1) & ~layers_split_for_interleaving(layers, plan.pp * plan.vp)
    if model.extra is not None:  # an explicit layout places unequal chunks (read for MoE models only)
        uneven = uneven & ~(plan.pp_layout > 0)
    f |= _flag(uneven, Infeasible.LAYERS_DIVIDE)
    f |= _flag(not_multiple(model.heads, plan.tp) | not_multiple(model.kv_heads, plan.tp), Infeasible.HEADS_DIVIDE)
    f |= _flag(not_multiple(model.hidden, plan.tp) | not_multiple(model.ffn_hidden, plan.tp), Infeasible.HIDDEN_DIVIDE)
    f |= _flag((plan.cp > 1) & not_multiple(plan.seq_len, 2.0 * plan.cp), Infeasible.SEQ_DIVIDE)
    bad_schedule = (plan.vp > 1) & ((plan.pp <= 1) | not_multiple(n_micro, plan.pp))
    bad_schedule = bad_schedule | stackrules.stack_schedule_bad(plan)
    f |= _flag(bad_schedule | (plan.vp < 1) | schedule.dualpipe_bad(plan, n_micro), Infeasible.SCHEDULE)
    f |= _flag(dev.peak_tflops[plan.precision_code] <= 0, Infeasible.PRECISION)
    f |= _flag(~compute.kernel_supported(dev, plan), Infeasible.KERNEL)
    f |= _flag(expert_layout_bad(model, plan), Infeasible.EXPERTS)
    f |= _flag((plan.shard_group > 0) & not_multiple(memory.dp_ranks(plan), plan.shard_group), Infeasible.SHARD_GROUP)
    f |= _flag(stackrules.stack_feature_bad(model, plan), Infeasible.STACK)
    return f


def expert_layout_bad(model: ModelSpec, plan: Plan):
    """Megatron-Core's expert-parallel rules (megatron/training/arguments.py and
    ``ProcessGroupCollection`` under MoE parallel folding): the experts split evenly over ``ep``,
    the expert groups ``etp*ep`` tile the ``tp*cp*dp`` ranks of a stage, ``etp`` splits the expert
    width, MoE with tensor parallelism runs sequence-parallel; a dense model has no experts."""
    moe = model.moe_layers > 0
    dense_bad = ~moe & ((plan.ep > 1) | (plan.etp > 1))
    moe_bad = not_multiple(model.n_experts, plan.ep) | not_multiple(plan.tp * plan.cp * plan.dp, plan.ep * plan.etp)
    moe_bad |= not_multiple(model.moe_ffn_hidden, plan.etp) | ((plan.tp > 1) & (plan.sp <= 0))
    return dense_bad | (moe & moe_bad)


# --------------------------------------------------------------------------------------------
# Stage 1: the pipeline step
# --------------------------------------------------------------------------------------------


@spec
class PipelineStep:
    """Per micro-batch times of the busiest stage (``layers`` of them, plus the LM head)."""

    n_micro: Any
    layers: Any
    compute_s: Any
    recompute_s: Any
    tp_s: Any
    cp_s: Any
    ep_s: Any
    pp_s: Any
    bubble_s: Any  # per step
    fwd_s: Any  # one micro-batch's forward on the stage (the window for weight gathers)
    bwd_s: Any  # and its backward with recomputation (the window for gradient reductions)


def stage_times(lc: LayerCosts, layers, p2p, head, moe_layers=0.0) -> dict[str, Any]:
    """A stage of ``layers`` layers, ``moe_layers`` of them MoE layers: its per-micro-batch terms
    and its forward/backward windows."""
    d = layers - moe_layers
    n = moe_layers
    return dict(
        compute_s=d * (lc.layer_f + lc.layer_b) + n * (lc.moe_f + lc.moe_b) + head,
        recompute_s=d * lc.recomp + n * lc.moe_recomp,
        tp_s=d * (lc.tp_f + lc.tp_b) + n * (lc.moe_tp_f + lc.moe_tp_b),  # recomputed forwards' in ``recomp``
        cp_s=layers * (lc.cp_f + lc.cp_b),
        ep_s=n * (lc.ep_f + lc.ep_b),
        pp_s=p2p,
        fwd_s=d * (lc.layer_f + lc.tp_f) + n * (lc.moe_f + lc.moe_tp_f + lc.ep_f) + layers * lc.cp_f,
        bwd_s=d * (lc.layer_b + lc.recomp + lc.tp_b)
        + n * (lc.moe_b + lc.moe_recomp + lc.moe_tp_b + lc.ep_b)
        + layers * lc.cp_b,
    )


def moe_layer_time(lc: LayerCosts) -> Any:
    """Seconds one MoE layer adds to its stage per micro-batch."""
    return lc.moe_f + lc.moe_b + lc.moe_recomp + lc.moe_tp_f + lc.moe_tp_b + lc.cp_f + lc.cp_b + lc.ep_f + lc.ep_b


def _layout_busiest(model: ModelSpec, plan: Plan, lc: LayerCosts, layers, p2p, head, t) -> dict[str, Any]:
    """The busiest stage under an explicit pipeline layout (``pp_layout``): the Megatron-Bridge
    layouts give every pipeline rank but the last ``layers`` layers (the first rank's first chunk
    the embedding and the model's leading dense layers) and the last rank what is left, with the
    multi-token-prediction layer and the loss: DeepSeek-V3's ``Et*4|(t*4|)*14tmL`` (pp2 vp8: rank 0
    32 layers, 3 of them dense; rank 1 29 + MTP and both heads; pp16: 4 layers a rank, the last 1 +
    MTP), ``Et*8|(t*8|)*6t*5mL`` for pp8 (NVIDIA-NeMo/Megatron-Bridge@5cb3444c43f7
    src/megatron/bridge/recipes/deepseek/deepseek_v3.py ``set_deepseek_v3_pipeline_model_parallel_layout``
    ``layout_map``; recipes/kimi/h100/kimi_k2.py ``_get_kimi_k2_pipeline_layout``, the same shapes
    without MTP). The step runs at the slower of the first and the last
    rank; without a layout the busiest holds ``layers`` MoE layers and the heads (``t``)."""
    total = memory.stack_layers(model)
    # pp > 2: a middle rank holds ``layers`` MoE layers; pp = 2: the first, with the dense ones.
    first_moe = memory.first_stage_moe_layers(model, plan, layers)
    first_moe = jnp.where(plan.pp > 2, memory.moe_stage_layers(model, layers), first_moe)
    first = stage_times(lc, layers, p2p, 0.0, first_moe)
    rest = jnp.clip(total - (plan.pp - 1.0) * layers, 1.0, layers)
    last = stage_times(lc, rest, p2p, head, jnp.minimum(rest, memory.moe_stage_layers(model, rest)))

    def busy(x):
        return x["compute_s"] + x["recompute_s"] + x["tp_s"] + x["cp_s"] + x["ep_s"]

    pick_first = busy(first) >= busy(last)
    laid = {k: jnp.where(pick_first, first[k], last[k]) for k in t}
    return {k: jnp.where((plan.pp_layout > 0) & (plan.pp > 1), laid[k], t[k]) for k in t}


def plan_layer_costs(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration) -> LayerCosts:
    """The layer costs :func:`simulate` prices ``plan`` with (its kernels resolved first), for a
    caller that computes them apart and passes them in (``simulate(..., lc=...)``)."""
    return layer_costs(model, system, compute.resolve_kernels(system.device, plan), cal)


def pipeline_step(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration, lc=None) -> PipelineStep:
    """Stage 1; ``lc``: the plan's :class:`LayerCosts` where the caller has them."""
    lc = layer_costs(model, system, plan, cal) if lc is None else lc
    layers = memory.busiest_stage_layers(model, plan)
    n_moe = memory.moe_stage_layers(model, layers)
    # Each multi-token-prediction module ends in one more LM head and loss (on the last stage).
    head = lc.head * (1.0 + model.mtp_layers)
    p2p = p2p_chunk_s(model, system, plan, cal)
    t = stage_times(lc, layers, p2p, head, n_moe)
    if model.extra is not None:  # an MoE model's explicit pipeline layout (static branch)
        t = _layout_busiest(model, plan, lc, layers, p2p, head, t)
    # Fill and drain: every stage but the busiest runs once outside the steady state, divided
    # by the interleaving depth: (sum of stage times - the busiest) / vp. The busiest stage holds
    # ceil(L/(pp*vp))*vp layers and the LM head; the others share the remaining layers (the MoE
    # ones first).
    total = memory.stack_layers(model)
    moe_total = memory.moe_stage_layers(model, total)
    rest_moe = moe_total - n_moe
    rest_dense = (total - layers) - rest_moe
    others = rest_dense * layer_time(lc) + rest_moe * moe_layer_time(lc) + (plan.pp - 1.0) * t["pp_s"]
    one_f_one_b = others / plan.vp
    bubble = jnp.where(plan.dualpipe > 0, others * schedule.dualpipe_bubble_share(plan, t), one_f_one_b)
    bubble = jnp.where(plan.pp > 1, bubble, 0.0)
    return PipelineStep(n_micro=micro_batches(plan), layers=layers, bubble_s=bubble, **t)


# --------------------------------------------------------------------------------------------
# Stage 2: data-parallel communication
# --------------------------------------------------------------------------------------------


def dp_comm_s(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration, pipe: PipelineStep, vocab_mats=None):
    """Exposed DP / ZeRO / FSDP communication per step of the stage ``pipe`` describes (its
    layers, and ``vocab_mats`` vocabulary matrices: :func:`memory.local_params`).

    Collectives go out per bucket. Their bandwidth time can hide behind the compute of the pass
    they serve (the backward for gradients, the forward for gathered weights); their latency is
    a synchronisation that cannot.
    """
    net = system.network
    _, s_cp, s_dp, _ = comm.strides(plan)
    n_dp = memory.dp_ranks(plan)
    s_dpg = jnp.minimum(s_dp, jnp.where(plan.cp > 1, s_cp, s_dp))

    root = jnp.where(jnp.asarray(1.0 if vocab_mats is None else vocab_mats) > 0, 1.0, 0.0)

    # Under DualPipe a rank holds two stages and reduces both stages' gradients.
    p_dense = memory.local_params(model, plan, pipe.layers, vocab_mats) * schedule.dualpipe_stages(plan)
    tensors = param_tensors(model, pipe.layers, root)
    n_shard = memory.zero_group(plan)
    dense = collective_parts(net, plan, p_dense, n_dp, n_shard, s_dpg, pipe.layers + root, tensors=tensors)
    n_edp = memory.expert_dp(plan)
    if model.extra is None:
        (ar_bw, ar_lat), (rs_bw, rs_lat), (ag_bw, ag_lat) = dense
        n_edp = jnp.ones_like(n_dp)
    else:
        # Routed experts: their gradients are reduced over the expert-data-parallel group (ranks
        # ep*etp apart), in the same buckets and windows; none where it has one rank.
        moe_units = memory.moe_stage_layers(model, pipe.layers)
        p_exp = memory.expert_local_params(model, plan, pipe.layers) * schedule.dualpipe_stages(plan)
        experts = collective_parts(net, plan, p_exp, n_edp, n_edp, plan.ep * plan.etp, moe_units, hybrid=False)
        on = jnp.where(n_edp > 1, 1.0, 0.0)
        (ar_bw, ar_lat), (rs_bw, rs_lat), (ag_bw, ag_lat) = (
            (d[0] + on * e[0], d[1] + on * e[1]) for d, e in zip(dense, experts, strict=True)
        )
    win_b = cal.dp_overlap * pipe.bwd_s
    win_f = cal.dp_overlap * pipe.fwd_s
    # ZeRO 0-2 reductions hide only where the stack sends them during the passes (dp_overlap).
    ddp = compute.stack_fact(stacks.table().dp_overlap, plan)
    early = compute.stack_fact(stacks.table().chunk_grad_sync, plan)
    # The updated weights' all-gather (ZeRO 1-2) hides in the next forward only where the stack
    # sends it then (param_gather_overlap); else it runs after the optimizer step.
    gather = compute.stack_fact(stacks.table().param_gather_overlap, plan)

    def exposed(comm_s, window):
        return comm.chunked_exposed_s(plan, comm_s, ddp * window, early)

    dp_z0 = exposed(ar_bw, win_b) + ar_lat
    dp_z12 = exposed(rs_bw, win_b) + rs_lat + exposed(ag_bw, gather * win_f) + ag_lat
    # Under full recomputation the recomputed forward gathers the weights again; a stack that
    # releases them after that use (DeepSpeed) gathers once more for the backward (zero3_regather).
    g = zero3_regather(model, plan)
    # Without prefetch (DeepSpeed <= 0.4: torch.cuda.synchronize() before each parameter's
    # all-gather, partition_parameters.py @ 4601885 v0.3.12; "the async version is not async at
    # all", DeepSpeed PR 1188) every gather waits: only the gradients' reduce-scatter still hides.
    z3_pre = pos(ag_bw - win_f) + pos((1.0 + g) * ag_bw + rs_bw - win_b)
    copies = list_copy_s(system.device, cal, plan, p_dense, n_shard, tensors, 2.0 + g)
    z3_wait = (2.0 + g) * ag_bw + pos(rs_bw - win_b) + copies
    z3_mb = jnp.where(plan.zero3_prefetch > 0, z3_pre, z3_wait) + (2.0 + g) * ag_lat + rs_lat
    stage = [plan.zero >= 3, plan.zero >= 1]
    dp = jnp.select(stage, [pipe.n_micro * z3_mb, dp_z12], dp_z0)
    # Every collective's time, hidden or not: what the passes hide still slows them.
    z3_all = (2.0 + g) * (ag_bw + ag_lat) + rs_bw + rs_lat
    total = jnp.select(stage, [pipe.n_micro * z3_all, ag_bw + ag_lat + rs_bw + rs_lat], ar_bw + ar_lat)
    dp = dp + hidden_traffic_s(total, dp)
    dp = jnp.where((n_dp > 1) | (n_edp > 1), dp, 0.0)
    return dp + tied_embedding_sync_s(model, system, plan, vocab_mats)


def tied_embedding_sync_s(model: ModelSpec, system: SystemSpec, plan: Plan, vocab_mats=None):
    """The all-reduce of a tied embedding's gradient between the first and the last pipeline
    stage, which each hold a copy, after the pipeline drains: Megatron-LM's
    ``backward-embedding-all-reduce`` in train_step (NVIDIA/Megatron-LM megatron/training.py @
    v2.5; Megatron-Core's ``_allreduce_embedding_grads`` in finalize_model_grads) and DeepSpeed's
    ``ReduceTiedGrads`` at the end of the batch (deepspeedai/DeepSpeed deepspeed/runtime/pipe/
    schedule.py @ edaa72212). Two ranks ``pp - 1`` stages apart, ``vocab x hidden / tp``
    gradients each; none without a pipeline, an untied head or a stage without a vocabulary
    matrix (``vocab_mats`` 0). Only the first stage's ``s_pp`` ranks of a node send it across the
    NICs (:func:`hetersim.terms.comm.nic_gain`)."""
    _, _, _, s_pp = comm.strides(plan)
    nbytes = model.vocab * model.hidden / plan.tp * memory.grad_bytes(plan)  # the gradient itself, in place
    net = system.network
    t = comm.all_reduce_s(net, 2.0, (plan.pp - 1.0) * s_pp, nbytes, nic_gain=comm.nic_gain(net, s_pp))
    holds = True if vocab_mats is None else jnp.asarray(vocab_mats) > 0
    return jnp.where((plan.pp > 1) & (model.tied_embeddings > 0) & holds, t, 0.0)


# --------------------------------------------------------------------------------------------
# Stages 3 and 4: optimizer and offload; where the bytes live
# --------------------------------------------------------------------------------------------


def optimizer_offload(
    model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration, pipe: PipelineStep, states, vocab_mats=None
):
    """The optimizer step and the offload traffic (:func:`hetersim.terms.offload.offload_cost`) of
    the stage ``pipe`` describes; ``states``: the (weights, grads, optimizer) bytes per GPU of
    :func:`memory.state_bytes`."""
    weights, grads, opt = states
    opt_params = memory.optimizer_params(model, plan, pipe.layers, vocab_mats)
    _, acts_mb = offload.activation_offload_bytes(model, plan, pipe.n_micro, pipe.layers)
    return offload.offload_cost(
        system.host,
        plan,
        n_micro=pipe.n_micro,
        layers=pipe.layers,
        weights=weights,
        grads=grads,
        opt=opt,
        opt_params=opt_params,
        grad_elem_bytes=memory.grad_bytes(plan),
        acts_mb=acts_mb,
        t_fwd=pipe.fwd_s,
        t_bwd=pipe.bwd_s,
        gpu_opt_s=compute.optimizer_gpu_s(system.device, cal, opt_params, memory.optimizer_bytes(plan)),
    )


@spec
class Placement:
    """Bytes per GPU in HBM by category, and per node on each tier."""

    weights: Any
    grads: Any
    opt: Any
    acts: Any
    bufs: Any
    hbm: Any
    tier_used_GiB: Any  # [N_TIERS] per node, index 0 = HBM of one GPU
    tier_capacity_GiB: Any  # [N_TIERS]


def placement(
    model: ModelSpec, system: SystemSpec, plan: Plan, n_micro, states, layers=None, inflight=None, logits_on=1.0
) -> Placement:
    """Model states, activations and buffers, less what is offloaded to a slower tier (of the
    busiest stage, or of a stage of ``layers`` layers holding ``inflight`` micro-batches, with the
    LM head's logits where ``logits_on``)."""
    host = system.host
    on = plan.offload_tier_code > 0
    weights, grads, opt = states
    acts_off, _ = offload.activation_offload_bytes(model, plan, n_micro, layers, inflight)
    acts_tier = jnp.where(on[memory.ACT], acts_off, 0.0)
    acts = memory.activation_bytes(model, plan, n_micro, layers, inflight) - acts_tier
    bufs = memory.buffer_bytes(model, plan, logits_on, n_micro)
    bufs = bufs + jnp.where(on[memory.PARAM], offload.param_staging_bytes(model, plan), 0.0)
    weights_hbm = jnp.where(on[memory.PARAM], 0.0, weights)
    grads_hbm = jnp.where(on[memory.GRAD], 0.0, grads)
    opt_hbm = jnp.where(on[memory.OPT], 0.0, opt)
    # The caching allocator reserves what is allocated and what fragmentation leaves unusable.
    hbm = safe_div(weights_hbm + grads_hbm + opt_hbm + acts + bufs, 1.0 - plan.fragmentation)
    placed = offload.placed_bytes(plan, weights, grads, opt, acts_tier)
    tier_used = (placed * offload.gpus_sharing(host, plan) / GiB).at[0].set(hbm / GiB)
    tier_cap = offload.tier_capacity_GiB(host).at[0].set(system.device.hbm_capacity_GiB)
    return Placement(weights_hbm, grads_hbm, opt_hbm, acts, bufs, hbm, tier_used, tier_cap)


# --------------------------------------------------------------------------------------------
# Stage 5: feasibility
# --------------------------------------------------------------------------------------------


def flags(model: ModelSpec, system: SystemSpec, plan: Plan, n_micro, mem: Placement) -> Any:
    """Layout rules plus capacity: HBM, every present tier, and tiers the node lacks."""
    host = system.host
    f = layout_flags(model, system, plan, n_micro)
    f |= _flag(mem.hbm / GiB > system.device.hbm_capacity_GiB, Infeasible.HBM_CAPACITY)
    used, cap = mem.tier_used_GiB, mem.tier_capacity_GiB
    f |= _flag(jnp.any((used[1:] > cap[1:]) & (host.tier_present[1:] > 0)), Infeasible.TIER_CAPACITY)
    on = plan.offload_tier_code > 0
    f |= _flag(jnp.any(on & (host.tier_present[plan.offload_tier_code] <= 0)), Infeasible.TIER_MISSING)
    return f


# --------------------------------------------------------------------------------------------
# Stage 6: throughput, utilisation, time, cost and energy
# --------------------------------------------------------------------------------------------


@spec
class Throughput:
    tokens_per_s: Any
    tokens_per_s_per_gpu: Any
    mfu: Any
    hfu: Any
    model_tflops_per_gpu: Any
    time_to_train_s: Any
    cost_usd: Any
    energy_kWh: Any


def recompute_share(model: ModelSpec, plan: Plan):
    """Hardware FLOPs added by recomputation / model FLOPs (HFU = MFU * (1 + this))."""
    per_token = model_flops_per_token(model, plan.seq_len)
    attn_share = 6.0 * plan.seq_len * model.heads * model.head_dim * model.layers / per_token
    layer_share = 1.0 - 6.0 * model.vocab * model.hidden / per_token
    rc = plan.recompute_code
    if model.extra is not None:  # mla_up_proj rebuilds the up projections (6 = 3 passes, as above)
        a, d, dr, dv = model.heads, model.head_dim, model.rope_head_dim, model.v_head_dim
        up = 6.0 * (model.q_lora_rank * a * (d + dr) + model.kv_lora_rank * a * (d + dv)) * model.layers
        attn_share = jnp.where(compute.mla_up_recompute(model, plan), up / per_token, attn_share)
    return jnp.select([rc == Recompute.FULL, rc == Recompute.SELECTIVE], [layer_share / 3.0, attn_share / 3.0], 0.0)


def throughput(model: ModelSpec, plan: Plan, step, *, n_gpus, peak_tflops, usd_per_hour, power_W) -> Throughput:
    """Job-level rates from the step time; ``peak_tflops``, ``usd_per_hour`` and ``power_W``
    are the whole job's (summed over its GPUs)."""
    tokens = plan.global_batch * plan.seq_len
    tok_s = safe_div(tokens, step)
    mflops = model_flops_per_token(model, plan.seq_len) * tokens
    mfu = safe_div(mflops, step * peak_tflops * TFLOP)
    ttt = safe_div(plan.train_tokens, tok_s)
    return Throughput(
        tokens_per_s=tok_s,
        tokens_per_s_per_gpu=safe_div(tok_s, n_gpus),
        mfu=mfu,
        hfu=mfu * (1.0 + recompute_share(model, plan)),
        model_tflops_per_gpu=safe_div(mflops, step * n_gpus) / TFLOP,
        time_to_train_s=ttt,
        cost_usd=ttt / HOUR * usd_per_hour,
        energy_kWh=ttt * power_W / KWH,
    )


# --------------------------------------------------------------------------------------------
# The pipeline of stages
# --------------------------------------------------------------------------------------------


def step_terms(pipe: PipelineStep, dp, oc) -> dict[str, Any]:
    """The step terms (:data:`STEP_TERMS`) of a stage's per-micro-batch times."""
    m = pipe.n_micro
    terms = dict(
        compute_s=m * pipe.compute_s,
        recompute_s=m * pipe.recompute_s,
        tp_comm_s=m * pipe.tp_s,
        cp_comm_s=m * pipe.cp_s,
        pp_comm_s=m * pipe.pp_s,
        dp_comm_s=dp,
        ep_comm_s=m * pipe.ep_s,
        bubble_s=pipe.bubble_s,
        optimizer_s=oc.optimizer_s,
        offload_s=oc.exposed_s,
    )
    assert tuple(terms) == tuple(STEP_TERMS)
    return terms


def breakdown(terms, rates: Throughput, mem: Placement, oc, gp, *, hbm_capacity_GiB, n_micro, params, infeasible):
    """Assemble a :class:`Breakdown` (the step time is the sum of ``terms``; ``gp`` the
    :class:`hetersim.terms.goodput.Goodput` terms)."""
    return Breakdown(
        step_time_s=sum(terms.values()),
        **terms,
        **{k: getattr(rates, k) for k in Throughput.__dataclass_fields__},
        **{k: getattr(gp, k) for k in goodput_terms.FIELDS},
        weights_GiB=mem.weights / GiB,
        grads_GiB=mem.grads / GiB,
        optimizer_GiB=mem.opt / GiB,
        activations_GiB=mem.acts / GiB,
        buffers_GiB=mem.bufs / GiB,
        hbm_used_GiB=mem.hbm / GiB,
        hbm_capacity_GiB=hbm_capacity_GiB,
        tier_used_GiB=mem.tier_used_GiB,
        tier_capacity_GiB=mem.tier_capacity_GiB,
        n_microbatches=n_micro,
        params=params,
        infeasible=infeasible,
        offload_traffic_s=oc.traffic_s,
        tier_bw_GBps=oc.bw_GBps,
        tier_bw_needed_GBps=oc.bw_needed_GBps,
        offload_bw_needed_GBps=jnp.max(oc.bw_needed_GBps),
    )


def simulate(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration, lc=None) -> Breakdown:
    """One configuration's :class:`Breakdown`; ``lc``: its :func:`plan_layer_costs`, where the
    caller computed them (a sweep, once per distinct set of the fields they read)."""
    dev = system.device
    plan = compute.resolve_kernels(dev, plan)
    pipe = pipeline_step(model, system, plan, cal, lc)
    dp = dp_comm_s(model, system, plan, cal, pipe)
    states = memory.state_bytes(model, plan)
    oc = optimizer_offload(model, system, plan, cal, pipe, states)
    mem = placement(model, system, plan, pipe.n_micro, states)
    terms = step_terms(pipe, dp, oc)
    rates = throughput(
        model,
        plan,
        sum(terms.values()),
        n_gpus=plan.n_gpus,
        peak_tflops=plan.n_gpus * dev.peak_tflops[plan.precision_code],
        usd_per_hour=plan.n_gpus * dev.price_usd_per_hour,
        power_W=plan.n_gpus * dev.tdp_W,
    )
    gp, gp_flags = goodput_terms.goodput(
        model,
        system,
        plan,
        states,
        step_s=sum(terms.values()),
        time_to_train_s=rates.time_to_train_s,
        usd_per_hour=plan.n_gpus * dev.price_usd_per_hour,
        power_W=plan.n_gpus * dev.tdp_W,
    )
    return breakdown(
        terms,
        rates,
        mem,
        oc,
        gp,
        hbm_capacity_GiB=dev.hbm_capacity_GiB,
        n_micro=pipe.n_micro,
        params=total_params(model),
        infeasible=flags(model, system, plan, pipe.n_micro, mem) | gp_flags | checkpoint_room(system, plan, mem, gp),
    )


def checkpoint_room(system: SystemSpec, plan: Plan, mem: Placement, gp) -> Any:
    """``TIER_CAPACITY`` where a memory tier cannot hold its offloaded state and the checkpoints."""
    need = goodput_terms.memory_tier_need_GiB(plan, gp)
    over = (mem.tier_used_GiB + need > mem.tier_capacity_GiB) & (need > 0) & (system.host.tier_present > 0)
    return _flag(jnp.any(over), Infeasible.TIER_CAPACITY)
