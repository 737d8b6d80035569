"""``simulate``: one configuration in, one breakdown out.

Composes the cost terms of :mod:`hetersim.terms` into a :class:`Breakdown`. Pure and
unbatched: batch it with ``jax.vmap`` and compile it once with ``jax.jit`` at the boundary.
Nothing raises inside: a configuration that does not divide or does not fit gets bits in
``infeasible`` (:class:`hetersim.types.Infeasible`) and keeps finite metrics.

Step-time composition (1F1B, Narayanan et al. SC'21 §2.2): with ``m`` micro-batches per step and
per-micro-batch stage times ``t_max`` (the busiest stage, which holds the LM head) and ``t_avg``,
``step = m*t_max + (pp-1)/vp*t_avg + exposed DP + optimizer + exposed offload``. Every term of the
breakdown is a part of that sum, so the terms add up to the step time exactly.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .pytree import spec
from .specs import Calibration, ModelSpec, Plan, SystemSpec
from .terms import comm, compute, memory
from .terms._safe import pos, safe_div
from .terms.flops import model_flops_per_token, total_params
from .types import Infeasible
from .units import GB, HOUR, KWH, GiB

STEP_TERMS = (
    "compute_s",
    "recompute_s",
    "tp_comm_s",
    "cp_comm_s",
    "pp_comm_s",
    "dp_comm_s",
    "bubble_s",
    "optimizer_s",
    "offload_s",
)


@spec
class Breakdown:
    step_time_s: Any
    compute_s: Any  # forward + backward of the busiest stage (GEMMs, attention, element-wise)
    recompute_s: Any  # activation recomputation
    tp_comm_s: Any  # exposed tensor-parallel communication
    cp_comm_s: Any  # exposed context-parallel (ring attention) communication
    pp_comm_s: Any  # exposed pipeline point-to-point communication
    dp_comm_s: Any  # exposed data-parallel / ZeRO / FSDP communication
    bubble_s: Any  # pipeline fill and drain
    optimizer_s: Any  # optimizer step (on GPU, or CPU-side update when offloaded)
    offload_s: Any  # exposed traffic to and from slower memory tiers
    tokens_per_s: Any
    tokens_per_s_per_gpu: Any
    mfu: Any  # model FLOPs (causal, no recompute) / (step time * n * dense peak of precision)
    hfu: Any  # hardware FLOPs (with recompute) / same
    model_tflops_per_gpu: Any
    weights_GiB: Any
    grads_GiB: Any
    optimizer_GiB: Any
    activations_GiB: Any
    buffers_GiB: Any
    hbm_used_GiB: Any
    hbm_capacity_GiB: Any
    tier_used_GiB: Any  # [N_TIERS] per node, index 0 = HBM of one GPU
    tier_capacity_GiB: Any  # [N_TIERS] per node
    n_microbatches: Any
    params: Any
    time_to_train_s: Any
    cost_usd: Any
    energy_kWh: Any
    infeasible: Any  # Infeasible bit flags


def _flag(cond, bit):
    return jnp.where(cond, jnp.int32(int(bit)), jnp.int32(0))


def _not_multiple(a, b):
    """True where ``a`` is not an integer multiple of ``b`` (float-safe)."""
    q = safe_div(a, b)
    return (b <= 0) | (jnp.abs(q - jnp.round(q)) > 1e-4) | (q < 1.0 - 1e-4)


def feasibility(model: ModelSpec, system: SystemSpec, plan: Plan, n_micro) -> Any:
    dev = system.device
    f = _flag(jnp.abs(plan.tp * plan.pp * plan.dp * plan.cp - plan.n_gpus) > 0.5, Infeasible.GPU_COUNT)
    f |= _flag(_not_multiple(plan.global_batch, plan.micro_batch * plan.dp), Infeasible.BATCH_DIVIDE)
    # Megatron and torchtitan both split layers unevenly when they do not divide; only a stage
    # chunk with no layer at all is impossible.
    f |= _flag(model.layers < plan.pp * plan.vp, Infeasible.LAYERS_DIVIDE)
    f |= _flag(_not_multiple(model.heads, plan.tp) | _not_multiple(model.kv_heads, plan.tp), Infeasible.HEADS_DIVIDE)
    f |= _flag(
        _not_multiple(model.hidden, plan.tp) | _not_multiple(model.ffn_hidden, plan.tp), Infeasible.HIDDEN_DIVIDE
    )
    f |= _flag((plan.cp > 1) & _not_multiple(plan.seq_len, 2.0 * plan.cp), Infeasible.SEQ_DIVIDE)
    bad_schedule = (plan.vp > 1) & ((plan.pp <= 1) | _not_multiple(n_micro, plan.pp))
    f |= _flag(bad_schedule | (plan.vp < 1), Infeasible.SCHEDULE)
    f |= _flag(dev.peak_tflops[plan.precision_code] <= 0, Infeasible.PRECISION)
    return f


def stage_layers(model: ModelSpec, plan: Plan):
    """Layers on the busiest pipeline stage: ``ceil(L / (pp*vp)) * vp`` (uneven splits put the
    remainder on some stages)."""
    chunks = plan.pp * plan.vp
    return jnp.ceil(model.layers / chunks - 1e-6) * plan.vp


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


def simulate(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration) -> Breakdown:
    dev, net, host = system.device, system.network, system.host
    n_micro = jnp.maximum(safe_div(plan.global_batch, plan.micro_batch * plan.dp, 1.0), 1.0)
    s_tp, s_cp, s_dp, s_pp = comm.strides(plan)
    T = plan.micro_batch * plan.seq_len / plan.cp
    act = compute.act_bytes(plan)

    # --- one layer, one micro-batch, one GPU -------------------------------------------------
    gemm_f = compute.layer_gemm_fwd_s(dev, cal, model, plan)
    gemm_b = compute.layer_gemm_bwd_s(dev, cal, model, plan)
    attn_f = compute.attention_fwd_s(dev, cal, model, plan)
    attn_b = compute.attention_bwd_s(dev, cal, model, plan)
    ew_f = compute.layer_elementwise_fwd_s(dev, cal, model, plan)
    ew_b = compute.layer_elementwise_bwd_s(dev, cal, model, plan)
    act_fn_s = compute.activation_fn_s(dev, cal, model, plan)
    layer_f = gemm_f + attn_f + ew_f
    layer_b = gemm_b + attn_b + ew_b

    # Tensor parallel: per layer 2 all-gathers + 2 reduce-scatters with SP (2 all-reduces
    # without) of the b*s*h activation in the forward, the same again in the backward.
    tp_bytes = T * model.hidden * act
    tp_pass = 2.0 * comm.all_reduce_s(net, plan.tp, s_tp, tp_bytes, 1.0)
    tp_pass = jnp.where(plan.tp > 1, tp_pass, 0.0)
    # Forward: the collectives sit between dependent GEMMs; a fraction ``tp_overlap`` is hidden
    # where the stack splits GEMMs to overlap them (Transformer Engine's userbuffers).
    # Backward: Megatron overlaps the input all-gather and the gradient reduce-scatter
    # (all-reduce without SP) with the weight-gradient GEMMs, which do not depend on them
    # (Korthikanti et al. 2022 §4.2.2; Megatron's LinearWithGradAccumulationAndAsyncCommunication).
    tp_f = (1.0 - cal.tp_overlap) * tp_pass
    tp_b = pos(tp_pass - 0.5 * gemm_b)
    tp_f = jnp.where(plan.tp > 1, tp_f, 0.0)
    tp_b = jnp.where(plan.tp > 1, tp_b, 0.0)

    # Context parallel: ring attention passes K and V around the cp ranks in the forward, and
    # K, V, dK, dV in the backward, overlapped with the attention blocks it feeds.
    kv_bytes = 2.0 * T * model.hidden * model.kv_heads / model.heads / plan.tp * act
    ring_step = comm.p2p_s(net, s_cp, kv_bytes)
    cp_f = jnp.where(plan.cp > 1, pos((plan.cp - 1.0) * ring_step - attn_f), 0.0)
    cp_b = jnp.where(plan.cp > 1, pos(2.0 * (plan.cp - 1.0) * ring_step - attn_b), 0.0)

    # Recomputation during the backward: the whole forward (full) or the attention core
    # (selective, Megatron's core-attention checkpointing).
    rc = plan.recompute_code
    recomp = jnp.where(rc == 2, layer_f + tp_f + cp_f, jnp.where(rc == 1, attn_f + act_fn_s, 0.0))

    layers_stage = stage_layers(model, plan)
    head = compute.head_s(dev, cal, model, plan)
    per_layer_compute = layer_f + layer_b
    stage_compute = layers_stage * per_layer_compute + head
    stage_recompute = layers_stage * recomp
    stage_tp = layers_stage * (tp_f + tp_b) * jnp.where(rc == 2, 1.5, 1.0)
    stage_cp = layers_stage * (cp_f + cp_b)

    # Pipeline point-to-point: activation forward, gradient backward, once per model chunk.
    p2p_bytes = T * model.hidden * act / jnp.where(plan.sp > 0, plan.tp, 1.0)
    p2p = 2.0 * plan.vp * comm.p2p_s(net, s_pp, p2p_bytes)
    stage_pp = jnp.where(plan.pp > 1, (1.0 - cal.pp_overlap) * p2p, 0.0)

    t_max = stage_compute + stage_recompute + stage_tp + stage_cp + stage_pp
    t_avg = (model.layers / plan.pp) * (per_layer_compute + recomp + (stage_tp + stage_cp) / layers_stage)
    t_avg = t_avg + head / plan.pp + stage_pp
    bubble = (plan.pp - 1.0) / plan.vp * t_avg

    # --- data parallel / ZeRO -----------------------------------------------------------------
    p_local = memory.local_params(model, plan)
    n_dp = memory.zero_group(plan)
    s_dpg = jnp.minimum(s_dp, jnp.where(plan.cp > 1, s_cp, s_dp))
    grad_bytes = p_local * memory.grad_bytes(plan)
    w_bytes = p_local * memory.WEIGHT_BYTES
    t_fwd_mb = layers_stage * (layer_f + tp_f + cp_f)
    t_bwd_mb = layers_stage * (layer_b + recomp + tp_b + cp_b)
    # Collectives go out per bucket. Their bandwidth time can hide behind the compute of the
    # pass they serve (the backward for gradients, the forward for gathered weights); their
    # latency is a synchronisation that cannot.
    n_ag = jnp.maximum(jnp.ceil(p_local / dp_bucket_params(plan, n_dp)), 1.0)
    n_rs = jnp.maximum(jnp.ceil(p_local / dp_bucket_params(plan, n_dp, grads=True)), 1.0)
    ar_bw, ar_lat = comm.all_reduce_parts(net, n_dp, s_dpg, grad_bytes, n_rs)
    rs_bw, rs_lat = comm.all_gather_parts(net, n_dp, s_dpg, grad_bytes, n_rs)
    ag_bw, ag_lat = comm.all_gather_parts(net, n_dp, s_dpg, w_bytes, n_ag)
    win_b = cal.dp_overlap * t_bwd_mb
    win_f = cal.dp_overlap * t_fwd_mb
    dp_z0 = pos(ar_bw - win_b) + ar_lat
    dp_z12 = pos(rs_bw - win_b) + rs_lat + pos(ag_bw - win_f) + ag_lat
    dp_z3 = n_micro * (pos(ag_bw - win_f) + pos(ag_bw + rs_bw - win_b) + 2.0 * ag_lat + rs_lat)
    dp = jnp.select([plan.zero >= 3, plan.zero >= 1], [dp_z3, dp_z12], dp_z0)
    dp = jnp.where(n_dp > 1, dp, 0.0)

    # --- optimizer and offload ------------------------------------------------------------------
    weights, grads, opt = memory.state_bytes(model, plan)
    opt_params = p_local / jnp.where(plan.zero >= 1, n_dp, 1.0)
    off = plan.offload_tier_code
    opt_off = off[memory.OPT] > 0
    grad_off = off[memory.GRAD] > 0
    gpu_opt = compute.optimizer_gpu_s(dev, cal, opt_params)
    # Host CPU-Adam (DeepSpeed ZeRO-Offload): the node's CPU updates the shards of all its GPUs.
    cpu_rate = host.cpu_adam_Gparams_per_s * 1e9 / jnp.minimum(host.gpus_per_node, plan.n_gpus)
    cpu_rate = cpu_rate / host.cpu_adam_tier_slowdown[off[memory.OPT]]
    cpu_opt = safe_div(opt_params, cpu_rate, 1e9)
    optimizer_s = jnp.where(opt_off & (plan.cpu_optimizer > 0), cpu_opt, gpu_opt)
    path = host.tier_path_GBps[off[memory.OPT]] * GB
    # Gradients stream to the tier during the backward (hidden behind it where it can be) and
    # updated 16-bit weights come back after the update.
    d2h = jnp.where(opt_off | grad_off, safe_div(opt_params * 2.0, path), 0.0)
    h2d = jnp.where(opt_off & (plan.cpu_optimizer > 0), safe_div(opt_params * 2.0, path), 0.0)
    # Optimizer states streamed through the GPU (no CPU optimizer): read and write 12 bytes.
    stream = jnp.where(opt_off & (plan.cpu_optimizer <= 0), safe_div(opt_params * 24.0, path), 0.0)
    offload = pos(d2h - win_b) + h2d + stream

    step = n_micro * t_max + bubble + dp + optimizer_s + offload

    # --- memory -------------------------------------------------------------------------------
    acts = memory.activation_bytes(model, plan, n_micro)
    bufs = memory.buffer_bytes(model, plan)
    weights_hbm = weights
    grads_hbm = jnp.where(grad_off, 0.0, grads)
    opt_hbm = jnp.where(opt_off, 0.0, opt)
    hbm = weights_hbm + grads_hbm + opt_hbm + acts + bufs
    per_node = jnp.minimum(host.gpus_per_node, plan.n_gpus)
    tier_used = jnp.zeros_like(host.tier_capacity_GiB)
    tier_used = tier_used.at[off[memory.OPT]].add(jnp.where(opt_off, opt * per_node, 0.0) / GiB)
    tier_used = tier_used.at[off[memory.GRAD]].add(jnp.where(grad_off, grads * per_node, 0.0) / GiB)
    tier_used = tier_used.at[0].set(hbm / GiB)
    tier_cap = host.tier_capacity_GiB.at[0].set(dev.hbm_capacity_GiB)

    flags = feasibility(model, system, plan, n_micro)
    flags |= _flag(hbm / GiB > dev.hbm_capacity_GiB, Infeasible.HBM_CAPACITY)
    over_tier = jnp.any((tier_used[1:] > host.tier_capacity_GiB[1:]) & (host.tier_present[1:] > 0))
    flags |= _flag(over_tier, Infeasible.TIER_CAPACITY)
    missing = jnp.any((off > 0) & (host.tier_present[off] <= 0))
    flags |= _flag(missing, Infeasible.TIER_MISSING)

    # --- throughput, utilisation, cost ---------------------------------------------------------
    tokens = plan.global_batch * plan.seq_len
    tok_s = safe_div(tokens, step)
    peak = dev.peak_tflops[plan.precision_code] * 1e12
    mflops = model_flops_per_token(model, plan.seq_len) * tokens
    attn_share = 6.0 * plan.seq_len * model.hidden * model.layers / model_flops_per_token(model, plan.seq_len)
    layer_share = 1.0 - 6.0 * model.vocab * model.hidden / model_flops_per_token(model, plan.seq_len)
    recomp_frac = jnp.where(rc == 2, layer_share / 3.0, jnp.where(rc == 1, attn_share / 3.0, 0.0))
    denom = step * plan.n_gpus * peak
    mfu = safe_div(mflops, denom)
    hfu = safe_div(mflops * (1.0 + recomp_frac), denom)
    ttt = safe_div(plan.train_tokens, tok_s)

    return Breakdown(
        step_time_s=step,
        compute_s=n_micro * stage_compute,
        recompute_s=n_micro * stage_recompute,
        tp_comm_s=n_micro * stage_tp,
        cp_comm_s=n_micro * stage_cp,
        pp_comm_s=n_micro * stage_pp,
        dp_comm_s=dp,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        offload_s=offload,
        tokens_per_s=tok_s,
        tokens_per_s_per_gpu=safe_div(tok_s, plan.n_gpus),
        mfu=mfu,
        hfu=hfu,
        model_tflops_per_gpu=safe_div(mflops, step * plan.n_gpus) / 1e12,
        weights_GiB=weights_hbm / GiB,
        grads_GiB=grads_hbm / GiB,
        optimizer_GiB=opt_hbm / GiB,
        activations_GiB=acts / GiB,
        buffers_GiB=bufs / GiB,
        hbm_used_GiB=hbm / GiB,
        hbm_capacity_GiB=dev.hbm_capacity_GiB,
        tier_used_GiB=tier_used,
        tier_capacity_GiB=tier_cap,
        n_microbatches=n_micro,
        params=total_params(model),
        time_to_train_s=ttt,
        cost_usd=ttt / HOUR * plan.n_gpus * dev.price_usd_per_hour,
        energy_kWh=ttt * plan.n_gpus * dev.tdp_W / KWH,
        infeasible=flags,
    )
