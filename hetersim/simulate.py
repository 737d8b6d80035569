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

from .layer import layer_costs, p2p_chunk_s
from .pytree import spec
from .specs import Calibration, ModelSpec, Plan, SystemSpec
from .terms import comm, compute, memory, offload
from .terms._safe import pos, safe_div
from .terms.flops import layer_params, model_flops_per_token, total_params
from .types import Infeasible
from .units import HOUR, KWH, GiB

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
    offload_traffic_s: Any  # transfer time to and from slower tiers, hidden or not (offload_s is exposed)
    tier_bw_GBps: Any  # [N_TIERS] read bandwidth one GPU gets to each tier (index 0 unused)
    tier_bw_needed_GBps: Any  # [N_TIERS] per-GPU bandwidth that would hide each tier's traffic
    offload_bw_needed_GBps: Any  # the largest of tier_bw_needed_GBps

    # Per-node memory of the slower tiers, one name per tier (index i of the TIER arrays); a
    # sweep stores them as metrics (dse.metrics.METRICS).
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
    half = 0.5 * plan.reuse_Mparams * 1e6
    frac = jnp.clip(safe_div(p_layer - half, p_layer), 0.0, 1.0)
    return jnp.where((plan.reuse_Mparams > 0) & (plan.recompute_code == 2), frac, 0.0)


def simulate(model: ModelSpec, system: SystemSpec, plan: Plan, cal: Calibration) -> Breakdown:
    dev, net, host = system.device, system.network, system.host
    n_micro = jnp.maximum(safe_div(plan.global_batch, plan.micro_batch * plan.dp, 1.0), 1.0)
    _, s_cp, s_dp, _ = comm.strides(plan)
    lc = layer_costs(model, system, plan, cal)
    layer_f, layer_b, recomp = lc.layer_f, lc.layer_b, lc.recomp
    tp_f, tp_b, cp_f, cp_b, head = lc.tp_f, lc.tp_b, lc.cp_f, lc.cp_b, lc.head
    rc = plan.recompute_code

    layers_stage = memory.busiest_stage_layers(model, plan)
    per_layer_compute = layer_f + layer_b
    stage_compute = layers_stage * per_layer_compute + head
    stage_recompute = layers_stage * recomp
    stage_tp = layers_stage * (tp_f + tp_b)  # recomputed forwards' traffic is in ``recomp``
    stage_cp = layers_stage * (cp_f + cp_b)

    stage_pp = p2p_chunk_s(model, system, plan, cal)

    t_max = stage_compute + stage_recompute + stage_tp + stage_cp + stage_pp
    # Fill and drain: every stage but the busiest runs once outside the steady state, divided
    # by the interleaving depth: (sum of stage times - the busiest) / vp. The busiest stage holds
    # ceil(L/(pp*vp))*vp layers and the LM head; the others share the remaining layers.
    per_layer = safe_div(t_max - head - stage_pp, layers_stage)
    others = (model.layers - layers_stage) * per_layer + (plan.pp - 1.0) * stage_pp
    bubble = jnp.where(plan.pp > 1, others / plan.vp, 0.0)

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
    # Under full recomputation the recomputed forward gathers the weights again; a stack that
    # releases them after that use (DeepSpeed) gathers once more for the backward (see zero3_regather).
    g = zero3_regather(model, plan)
    dp_z3 = n_micro * (pos(ag_bw - win_f) + pos((1.0 + g) * ag_bw + rs_bw - win_b) + (2.0 + g) * ag_lat + rs_lat)
    dp = jnp.select([plan.zero >= 3, plan.zero >= 1], [dp_z3, dp_z12], dp_z0)
    dp = jnp.where(n_dp > 1, dp, 0.0)

    # --- optimizer and offload (hetersim.terms.offload) ------------------------------------------
    weights, grads, opt = memory.state_bytes(model, plan)
    opt_params = p_local / jnp.where(plan.zero >= 1, n_dp, 1.0)
    on = plan.offload_tier_code > 0
    acts_off, acts_off_mb = offload.activation_offload_bytes(model, plan, n_micro)
    oc = offload.offload_cost(
        host,
        plan,
        n_micro=n_micro,
        layers=layers_stage,
        weights=weights,
        grads=grads,
        opt=opt,
        opt_params=opt_params,
        grad_elem_bytes=memory.grad_bytes(plan),
        acts_mb=acts_off_mb,
        t_fwd=t_fwd_mb,
        t_bwd=t_bwd_mb,
        gpu_opt_s=compute.optimizer_gpu_s(dev, cal, opt_params),
    )
    optimizer_s = oc.optimizer_s
    offload_s = oc.exposed_s

    step = n_micro * t_max + bubble + dp + optimizer_s + offload_s

    # --- memory -------------------------------------------------------------------------------
    acts = memory.activation_bytes(model, plan, n_micro)
    bufs = memory.buffer_bytes(model, plan)
    weights_hbm = jnp.where(on[memory.PARAM], 0.0, weights)
    grads_hbm = jnp.where(on[memory.GRAD], 0.0, grads)
    opt_hbm = jnp.where(on[memory.OPT], 0.0, opt)
    acts_tier = jnp.where(on[memory.ACT], acts_off, 0.0)
    acts = acts - acts_tier
    bufs = bufs + jnp.where(on[memory.PARAM], offload.param_staging_bytes(model, plan), 0.0)
    hbm = weights_hbm + grads_hbm + opt_hbm + acts + bufs
    per_node = offload.gpus_sharing(host, plan)
    placed = offload.placed_bytes(plan, weights, grads, opt, acts_tier)
    tier_used = (placed * per_node / GiB).at[0].set(hbm / GiB)
    tier_cap = offload.tier_capacity_GiB(host).at[0].set(dev.hbm_capacity_GiB)

    flags = feasibility(model, system, plan, n_micro)
    flags |= _flag(hbm / GiB > dev.hbm_capacity_GiB, Infeasible.HBM_CAPACITY)
    over_tier = jnp.any((tier_used[1:] > tier_cap[1:]) & (host.tier_present[1:] > 0))
    flags |= _flag(over_tier, Infeasible.TIER_CAPACITY)
    missing = jnp.any(on & (host.tier_present[plan.offload_tier_code] <= 0))
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
        offload_s=offload_s,
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
        offload_traffic_s=oc.traffic_s,
        tier_bw_GBps=oc.bw_GBps,
        tier_bw_needed_GBps=oc.bw_needed_GBps,
        offload_bw_needed_GBps=jnp.max(oc.bw_needed_GBps),
    )
