"""Compute time of one transformer layer, the LM head and the optimizer on one GPU.

GEMM time follows a roofline with a fixed per-kernel cost: ``max(F / (P * e * q), B / W) + t_k``,
where ``e`` is the measured best-case matmul efficiency of the device (MAMF tables), ``q`` the
wave-quantization efficiency of the GEMM's output tiles on the device's SMs, ``B`` the bytes the
GEMM reads and writes and ``W`` the HBM bandwidth reached by streaming kernels. Tile waves and
the fixed cost make efficiency depend on the shape: small GEMMs (small hidden, high TP) reach less.
Attention uses flash-attention kernels (no s x s score matrix) unless the plan asks for the
materialised form; FLOPs of the attention backward are 2.5x the forward (FlashAttention-2 paper,
Dao 2023, §4.1 benchmark convention). Element-wise work (norms, residuals, activation functions,
rotary embedding, FP8 casts, dropout) is priced by the bytes it moves
(:mod:`hetersim.terms.elementwise`; the per-op byte table is here).
"""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp

from .. import stacks
from ..pytree import replace
from ..specs import Calibration, DeviceSpec, ModelSpec, Plan
from ..types import GEMM_INPUT_BYTES, LOW_PRECISION, Attention, Loss, Precision, Recompute
from ..units import GB, TFLOP, US
from . import attention
from ._safe import safe_div
from .flops import attention_keys, core_width, kv_width, n_mlp_matrices, q_width, window_keys
from .tiles import tile_waves


def low_precision(plan: Plan):
    """True in the 8- and 4-bit GEMM precisions (fp8, mxfp8, nvfp4): 16-bit activations, GEMM
    inputs cast before each GEMM and saved in the low precision for the weight gradients."""
    code = plan.precision_code
    return functools.reduce(operator.or_, (code == p for p in LOW_PRECISION))


def gemm_input_bytes(plan: Plan):
    """Bytes per GEMM input element (:data:`hetersim.types.GEMM_INPUT_BYTES`; else the activations')."""
    out = act_bytes(plan)
    for prec, nbytes in GEMM_INPUT_BYTES.items():
        out = jnp.where(plan.precision_code == prec, nbytes, out)
    return out


def act_bytes(plan: Plan):
    """Bytes per activation element: 4 in fp32 training, else 2 (FP8 runs keep bf16 activations)."""
    return jnp.where(plan.precision_code == Precision.FP32, 4.0, 2.0)


def gemm_rate(dev: DeviceSpec, cal: Calibration, plan: Plan):
    """FLOP/s a training GEMM reaches in the plan's precision: dense peak x the device's measured
    best-case matmul efficiency x the calibrated share of it that training shapes reach (and,
    in FP8, the share left after per-tensor scaling)."""
    idx = plan.precision_code
    # The calibrated FP8 factor applies to the block-scaled formats too: no separate measurement.
    fp8 = jnp.where(low_precision(plan), cal.fp8_scaling_eff, 1.0)
    return dev.peak_tflops[idx] * dev.gemm_eff[idx] * cal.gemm_shape_eff * fp8 * TFLOP


def gemm_s(dev: DeviceSpec, cal: Calibration, plan: Plan, M, N, K, count=1.0, kernels=None, concurrent=None):
    """Seconds of ``count`` GEMMs (M x K) @ (K x N) issued as ``kernels`` launches (default one
    per GEMM; a batched GEMM is one launch), ``concurrent`` of them sharing the SMs at a time
    (default ``count / kernels``: the GEMMs of one launch)."""
    flops = 2.0 * M * N * K
    in_bytes = gemm_input_bytes(plan)
    nbytes = in_bytes * (M * K + K * N) + act_bytes(plan) * M * N
    kernels = count if kernels is None else kernels
    concurrent = count / kernels if concurrent is None else concurrent
    busy, waves = tile_waves(dev, M, N, concurrent)
    t_flops = safe_div(flops * waves, gemm_rate(dev, cal, plan) * busy, 1e9)
    t_mem = safe_div(nbytes, dev.hbm_bw_GBps * GB * cal.mem_bw_eff)
    return count * jnp.maximum(t_flops, t_mem) + kernels * cal.kernel_overhead_us * US


def stream_s(dev: DeviceSpec, cal: Calibration, nbytes, kernels):
    """Memory-bound kernels moving ``nbytes`` through HBM."""
    return safe_div(nbytes, dev.hbm_bw_GBps * GB * cal.mem_bw_eff) + kernels * cal.kernel_overhead_us * US


def tokens(plan: Plan):
    """Tokens of one micro-batch on one rank of a context-parallel group."""
    return plan.micro_batch * plan.seq_len / plan.cp


def attn_gemm_shapes(m: ModelSpec, plan: Plan):
    """(M, N, K, present) of the forward attention-projection GEMMs of one layer on one
    tensor-parallel rank; ``present`` 0 drops a GEMM the attention kind has not.

    Ordinary attention: the fused QKV projection and the output projection. MLA (Megatron-Core
    ``MLASelfAttention``): the query down projection (or the direct query projection where
    ``q_lora_rank`` is 0), query up, joint key/value down with the rotary key, key/value up and
    the output; the down projections are not split over tensor-parallel ranks (their outputs are
    the small latents)."""
    T = tokens(plan)
    h, t, a = m.hidden, plan.tp, m.heads
    one = jnp.ones_like(T)
    if m.extra is None:  # no latent attention: the two GEMMs of ordinary attention
        return [(T, (q_width(m) + 2.0 * kv_width(m)) / t, h, one), (T, h, q_width(m) / t, one)]
    mla = m.kv_lora_rank > 0
    q_direct = a * (m.head_dim + m.rope_head_dim) / t
    g1 = jnp.where(mla, jnp.where(m.q_lora_rank > 0, m.q_lora_rank, q_direct), (q_width(m) + 2.0 * kv_width(m)) / t)
    return [
        (T, g1, h, one),  # fused QKV, or MLA's query down (direct) projection
        (T, q_direct, m.q_lora_rank, jnp.where(mla & (m.q_lora_rank > 0), 1.0, 0.0)),  # MLA query up
        (T, m.kv_lora_rank + m.rope_head_dim, h, jnp.where(mla, 1.0, 0.0)),  # MLA key/value down
        (T, a * (m.head_dim + m.v_head_dim) / t, m.kv_lora_rank, jnp.where(mla, 1.0, 0.0)),  # MLA kv up
        (T, h, a * m.v_head_dim / t, one),  # attention output projection
    ]


def mla_up_recompute(m: ModelSpec, plan: Plan):
    """True where selective recomputation runs Megatron-Core's ``mla_up_proj`` recompute module
    instead of its default (the attention core): MLA's query and key/value up projections and
    RoPE run again in the backward from the stored latents, and the up-projected query, key and
    value are not stored (``MLASelfAttention``: ``recompute_up_proj`` wraps the up projections in
    a ``CheckpointWithoutOutput`` whose output is discarded once the attention core has used it;
    Megatron-LM ``megatron/core/transformer/multi_latent_attention.py``, README "recompute
    modules", NVIDIA/Megatron-LM@d98e8a64). Only a model with MLA reads it (static branch)."""
    selective = plan.recompute_code == Recompute.SELECTIVE
    return selective & (plan.mla_up_proj > 0) & (m.kv_lora_rank > 0)


def mla_up_proj_fwd_s(dev, cal, m: ModelSpec, plan: Plan):
    """The recomputed part of the ``mla_up_proj`` module: the query and key/value up-projection
    GEMMs (:func:`attn_gemm_shapes`) and RoPE on the query's and the key's rotary parts."""
    shapes = attn_gemm_shapes(m, plan)
    up = gemms_fwd_s(dev, cal, plan, [shapes[1], shapes[3]])
    rope_width = (m.heads / plan.tp + 1.0) * m.rope_head_dim  # rotary query heads, the shared rotary key
    rope_bytes = tokens(plan) * act_bytes(plan) / 2.0 * _by_fusion(ROPE_BYTES, eager(plan)) * rope_width
    return up + stream_s(dev, cal, rope_bytes, 2.0 * _by_fusion(ROPE_KERNELS, eager(plan)))


def mlp_gemm_shapes(m: ModelSpec, plan: Plan, width=None, T=None):
    """(M, N, K, present) of a dense MLP's forward GEMMs (width ``ffn_hidden`` unless given) on
    one tensor-parallel rank."""
    T = tokens(plan) if T is None else T
    f = m.ffn_hidden if width is None else width
    h, t = m.hidden, plan.tp
    present = jnp.where(f > 0, 1.0, 0.0)
    return [
        (T, (n_mlp_matrices(m) - 1.0) * f / t, h, present),  # MLP up (+ gate, fused)
        (T, h, f / t, present),  # MLP down
    ]


def layer_gemm_shapes(m: ModelSpec, plan: Plan):
    """(M, N, K, present) of the forward GEMMs of one dense layer on one tensor-parallel rank."""
    return attn_gemm_shapes(m, plan) + mlp_gemm_shapes(m, plan)


def gemms_fwd_s(dev, cal, plan, shapes, count=1.0, kernels=None, concurrent=None):
    """Forward GEMMs of ``shapes`` (M, N, K, present), each ``count`` times in ``kernels`` launches,
    ``concurrent`` at a time (:func:`gemm_s`)."""
    return sum(p * gemm_s(dev, cal, plan, M, N, K, count, kernels, concurrent) for (M, N, K, p) in shapes)


def gemms_bwd_s(dev, cal, plan, shapes, count=1.0, kernels=None, concurrent=None):
    """Backward: a data-gradient and a weight-gradient GEMM per forward GEMM."""
    total = 0.0
    for M, N, K, p in shapes:
        dgrad = gemm_s(dev, cal, plan, M, K, N, count, kernels, concurrent)
        total = total + p * (dgrad + gemm_s(dev, cal, plan, K, N, M, count, kernels, concurrent))
    return total


def layer_gemm_fwd_s(dev, cal, m, plan):
    return gemms_fwd_s(dev, cal, plan, layer_gemm_shapes(m, plan))


def layer_gemm_bwd_s(dev, cal, m, plan):
    return gemms_bwd_s(dev, cal, plan, layer_gemm_shapes(m, plan))


def attention_flops_fwd(m: ModelSpec, plan: Plan):
    """Forward FLOPs of QK^T and PV on one rank; causal masking skips half the blocks.

    With context parallelism each rank holds s/cp queries against the whole sequence's keys
    (load-balanced ring attention).
    """
    b, s = plan.micro_batch, plan.seq_len
    keys = attention_keys(m, s)  # sliding-window layers see fewer keys
    return 2.0 * b * (s / plan.cp) * s * core_width(m) / plan.tp * 0.5 * keys


def stack_fact(values, plan: Plan):
    """A fact of the plan's software stack (:func:`hetersim.stacks.table`): one compare-and-select
    per stack, element-wise work that fuses with its consumers (a gather from the table would
    not, and costs a pass over the batch per fact)."""
    out = jnp.asarray(values[0])
    for code in range(1, len(values)):
        out = jnp.where(plan.stack_code == code, values[code], out)
    return out


def runs_transformer_engine(dev, xp=jnp):
    """1.0 where the device can run Transformer Engine, else 0.0. TE supports Ampere and newer
    NVIDIA GPUs ("Hardware: Blackwell, Hopper, Grace Hopper/Blackwell, Ada, Ampere",
    NVIDIA/TransformerEngine@d0067d0d README.rst), the generations with bf16 tensor cores: a device
    without a bf16 peak (V100, T4 and other pre-Ampere cards) runs Megatron-Core's local layers,
    without TE's userbuffers overlap of the tensor-parallel collectives. ``xp``: ``numpy`` to
    read it outside a traced computation (compiles nothing)."""
    return xp.where(xp.asarray(dev.peak_tflops)[..., Precision.BF16] > 0, 1.0, 0.0)


def _kernel_eff(code, fastest, fa2, xp=jnp):
    """Reference utilisation of fused attention kernel ``code`` from the device's figures: its
    fastest kernel's, the FA2-class figure, or for FA1-class kernels a fixed share of that
    (:data:`hetersim.terms.attention.FLASH1_VS_FA2`)."""
    return xp.where(
        code == Attention.FLASH2, fa2, xp.where(code == Attention.FLASH1, attention.FLASH1_VS_FA2 * fa2, fastest)
    )


def kernel_ok(dev, code, xp=jnp):
    """The device runs attention kernel ``code``: materialised everywhere, a fused kernel only
    where the device has a measured utilisation for it (FlashAttention needs Ampere or newer), in
    both passes. ``xp``: ``numpy`` outside a traced computation."""
    fastest = xp.minimum(xp.asarray(dev.attn_eff_fwd), xp.asarray(dev.attn_eff_bwd))
    fa2 = xp.minimum(xp.asarray(dev.attn2_eff_fwd), xp.asarray(dev.attn2_eff_bwd))
    return (code == Attention.MATERIALIZED) | (_kernel_eff(code, fastest, fa2, xp) > 0)


def fallback_attention(dev, code, auto, xp=jnp):
    """Attention kernel ``code`` where the device runs it; where it cannot and the kernel was the
    stack's choice (``auto``), materialised attention, as the stacks fall back (Transformer
    Engine's UnfusedDotProductAttention, SDPA's math backend). ``xp``: ``numpy`` outside a traced
    computation."""
    return xp.where(auto & ~kernel_ok(dev, code, xp), int(Attention.MATERIALIZED), code)


def resolve_kernels(dev, plan: Plan) -> Plan:
    """The plan with ``auto`` kernels replaced by its stack's (idempotent): an auto attention
    kernel the device cannot run falls back to materialised attention, as the stacks do (Transformer
    Engine's UnfusedDotProductAttention, SDPA's math backend); an explicitly asked-for one stays
    and is flagged."""
    t = stacks.table()
    auto = plan.attention_code == Attention.AUTO
    att = jnp.where(auto, stack_fact(t.attention, plan), plan.attention_code)
    att = fallback_attention(dev, att, auto)
    loss = jnp.where(plan.loss_code == Loss.AUTO, stack_fact(t.loss, plan), plan.loss_code)
    return replace(plan, attention_code=att.astype(jnp.int32), loss_code=loss.astype(jnp.int32))


def kernel_supported(dev, plan):
    """False where the plan's fused attention kernel has no utilisation on the device (e.g.
    FlashAttention on a V100, which needs Ampere or newer): such a plan is flagged, never
    priced at a zero rate. Materialised attention runs everywhere."""
    return kernel_ok(dev, resolve_kernels(dev, plan).attention_code)


def _materialized(dev, plan):
    """Attention runs materialised: asked for, or the fused kernel does not exist on the device
    (then the plan is flagged, and its time stays that of the kernel the device can run). The
    plan's kernels are resolved already (:func:`resolve_kernels`, at ``simulate`` and
    ``layer_costs``)."""
    return ~kernel_ok(dev, plan.attention_code) | (plan.attention_code == Attention.MATERIALIZED)


def attention_peak(dev, plan):
    """The rate a fused attention kernel's utilisation applies to: the 16-bit tensor-core peak
    (the kernels are measured in bf16; fp16 where the device has no bf16; FP8 runs keep 16-bit
    attention), in an fp32 run never above the fp32 peak (its attention cannot run faster than
    fp32 math)."""
    bf16, fp16 = dev.peak_tflops[Precision.BF16], dev.peak_tflops[Precision.FP16]
    peak16 = jnp.where(bf16 > 0, bf16, fp16)
    fp32 = plan.precision_code == Precision.FP32
    return jnp.where(fp32, jnp.minimum(peak16, dev.peak_tflops[Precision.FP32]), peak16) * TFLOP


def attention_eff(dev, m: ModelSpec, plan: Plan, fastest, fa2, keys_per_call=None):
    """Utilisation of the plan's fused kernel at its shape: the catalog's figure at the reference
    shape, moved by the keys per kernel call (``s / cp``: ring attention runs one call per ring
    step; a sliding-window layer's window) and the head size (:mod:`hetersim.terms.attention`);
    never above the peak."""
    ref = _kernel_eff(plan.attention_code, fastest, fa2)
    code = plan.attention_code
    cost = jnp.where(code == Attention.FLASH2, attention.FA2_SOFTMAX_COST, dev.attn_softmax_cost)
    cost = jnp.where(code == Attention.FLASH1, attention.FA1_SOFTMAX_COST, cost)
    keys = plan.seq_len / plan.cp if keys_per_call is None else keys_per_call
    shape = attention.seq_factor(keys) * attention.head_dim_factor(m.head_dim, cost)
    return jnp.minimum(ref * shape, 1.0)


def full_length_attention_s(dev, m: ModelSpec, plan: Plan, flops, fastest, fa2):
    """``flops`` of attention at the fused kernel's rate for calls over the whole (local) sequence."""
    return safe_div(flops, attention_peak(dev, plan) * attention_eff(dev, m, plan, fastest, fa2), 1e9)


def fused_attention_s(dev, m: ModelSpec, plan: Plan, flops, fastest, fa2):
    """``flops`` of attention at the fused kernel's rate (:func:`attention_eff`). A model with
    sliding-window layers runs their share of the FLOPs at the rate of a call of ``window`` keys
    per query, not of the sequence: a query block meets a few key blocks, so the fixed cost per
    query row weighs as at a short sequence (NVIDIA's cuDNN SDPA benchmark at GPT-OSS's windowed
    shape, d 64, window 128, seq 4096, GB200 BF16: 161 TFLOP/s forward, 182 backward,
    window-aware FLOPs; NVIDIA/cudnn-frontend@3929da2ef4c1
    benchmark/sdpa_benchmark_training/results/gpt_oss/gb200/gpt_oss_20260424_100011.csv)."""
    if m.extra is None:  # no windowed layers: nothing of what follows is traced
        return full_length_attention_s(dev, m, plan, flops, fastest, fa2)
    peak = attention_peak(dev, plan)
    eff = attention_eff(dev, m, plan, fastest, fa2)
    windowed = safe_div(m.swa_share * window_keys(m, plan.seq_len), attention_keys(m, plan.seq_len), 0.0)  # FLOP share
    keys = jnp.minimum(m.swa_window, plan.seq_len / plan.cp)
    eff_w = attention_eff(dev, m, plan, fastest, fa2, keys_per_call=keys)
    return safe_div(flops * (1.0 - windowed), peak * eff, 1e9) + safe_div(flops * windowed, peak * eff_w, 1e9)


def attention_fwd_s(dev, cal, m, plan):
    flops = attention_flops_fwd(m, plan)
    flash = fused_attention_s(dev, m, plan, flops, dev.attn_eff_fwd, dev.attn2_eff_fwd) + cal.kernel_overhead_us * US
    return jnp.where(_materialized(dev, plan), _materialized_s(dev, cal, m, plan, 1.0), flash)


def attention_bwd_s(dev, cal, m, plan):
    flops = 2.5 * attention_flops_fwd(m, plan)
    flash = fused_attention_s(dev, m, plan, flops, dev.attn_eff_bwd, dev.attn2_eff_bwd)
    if m.extra is not None:  # windowed layers: an FP8 backward computes them at full length
        flash = jnp.where(fp8_attention(plan), jnp.maximum(fp8_windowed_bwd_s(dev, m, plan, flops), flash), flash)
    flash = flash + 2.0 * cal.kernel_overhead_us * US
    return jnp.where(_materialized(dev, plan), _materialized_s(dev, cal, m, plan, 2.0), flash)


def fp8_attention(plan: Plan):
    """True where the plan runs its attention kernel in FP8 (``fp8_attention``), which Transformer
    Engine does only inside an FP8 recipe: a 16-bit run keeps 16-bit attention."""
    return (plan.fp8_attention > 0) & low_precision(plan)


def fp8_windowed_bwd_s(dev, m: ModelSpec, plan: Plan, flops):
    """Backward of a model with sliding-window layers whose attention runs in FP8: cuDNN's FP8 and
    MXFP8 SDPA backward ignores the window and runs the whole causal sequence. NVIDIA's SDPA
    benchmark at GPT-OSS's windowed shape (head dimension 64, window 128, GB200; cuDNN 9.22 and
    9.27): BF16 0.24 / 0.47 / 0.91 / 1.82 / 3.69 ms at 2k / 4k / 8k / 16k / 32k tokens (linear
    in the sequence, the window's work), FP8 0.54 / 1.73 / 6.18 / 23.2 / 90.3 ms and MXFP8 0.64 /
    2.08 / 7.43 / 27.9 / 108 ms (quadratic: the full causal square), while the forward takes the
    BF16 time in every precision (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/
    gpt_oss/gb200/gpt_oss_20260424_100011.csv @ 60e572b7 and gpt_oss_20260813_110803.csv @
    20dc1089). So every layer's backward is priced as a full-length layer's, at the rate the
    catalog gives a full-length kernel call: the measured FP8 kernel is slower still (2.08 ms is
    about 660 TFLOP/s of full causal work at 4k, the model's BF16 rate for that shape is higher),
    which is not taken, as no such figure exists for the full-attention layers it would also
    price. ``flops``: the plan's backward attention FLOPs with the windows."""
    full = safe_div(flops, attention_keys(m, plan.seq_len), 0.0)  # every layer attends s/2 keys
    return full_length_attention_s(dev, m, plan, full, dev.attn_eff_bwd, dev.attn2_eff_bwd)


# Forward HBM bytes per element (16-bit activations) and kernels of each element-wise op, fused
# (one kernel, 16-bit in and out: Transformer Engine / Megatron fusions, TorchInductor) or eager
# (PyTorch ops one by one), read off the eager code:
# * RMSNorm (torchtitan models/norms.py RMSNorm, transformers LlamaRMSNorm): x.float() (read 2,
#   write 4), pow(2) (4+4), mean(-1) (read 4), x * rsqrt(var + eps) (4+4), type_as (4+2),
#   * weight (2+2) = 36 bytes in 6 full-size kernels plus 2 per-row ones (add, rsqrt);
# * rotary embedding on q and k (torchtitan apply_rotary_emb): float() (2+4), complex multiply
#   (4+4), type_as (4+2) = 20 bytes in 3 kernels per tensor;
# * SwiGLU silu(w1 x) * w3 x: silu (2+2) and mul (4+2) = 10 bytes per ffn element in 2 kernels;
#   GeLU reads and writes the element either way (4 bytes, 1 kernel);
# * residual adds read two and write one element (6 bytes, 1 kernel) either way.
NORM_BYTES = (4.0, 36.0)
NORM_KERNELS = (1.0, 8.0)
ROPE_BYTES = (4.0, 20.0)
ROPE_KERNELS = (1.0, 6.0)
SWIGLU_BYTES = (6.0, 10.0)
SWIGLU_KERNELS = (1.0, 2.0)


def _by_fusion(values, eager):
    return jnp.where(eager > 0, values[1], values[0])


def eager(plan: Plan):
    """1.0 where the plan's stack runs its element-wise work as eager PyTorch ops."""
    return stack_fact(stacks.table().eager, plan)


# Megatron-LM v1.1.5 with its optional fusions off (the stack's ``elementwise = unfused``; the
# profile's source cites the flags and lines): what its eager ops move beyond the fused kernels,
# (bytes per element, kernels) in the forward; the backward follows :func:`_elementwise_bwd_s`.
# * Each bias-dropout-add as three ops, ``residual + dropout(x + bias)`` (megatron/model/
#   transformer.py l.374-376): the bias add (read 2, write 2) and the dropout's own pass (read 2,
#   write 2) before the residual add the fused count has: per hidden element, twice a layer.
# * The MLP's bias add before GeLU (l.103-108; read 2, write 2): per ffn element.
# * In materialised attention, the scores' ``masked_fill_`` before the softmax (megatron/model/
#   gpt2_model.py l.41-43; read 2, write 2; the [s, s] mask is shared by every head): per score.
# The bias and dropout ops are those of a GPT-style model (the model's ``dropout`` flag: linear
# biases and dropout); the mask pass is any materialised attention's.
UNFUSED_BDA = (8.0, 2.0)
UNFUSED_BIAS_ACT = (4.0, 1.0)
UNFUSED_MASK = (4.0, 1.0)


def unfused(plan: Plan):
    """1.0 where the plan's stack leaves Megatron's bias, dropout and softmax fusions off."""
    return stack_fact(stacks.table().unfused, plan)


def _materialized_s(dev, cal, m, plan, passes):
    """Attention with an s x s score matrix (pre-flash Megatron): two batched GEMMs per head and
    a fused scale-mask-softmax plus dropout over ``b*a/t*s^2`` elements (no causal skipping).

    Bytes per score element in the forward: softmax reads and writes it (2+2), dropout reads it,
    writes it and a 1-byte mask (2+2+1): 9 bytes; the backward moves about twice that. A stack
    with Megatron's fusions off masks the scores in a pass of their own (:data:`UNFUSED_MASK`).
    """
    b, s, a = plan.micro_batch, plan.seq_len, m.heads
    sq = s / plan.cp
    d = m.head_dim
    heads = a / plan.tp
    gem = gemm_s(dev, cal, plan, sq, s, d, count=b * heads, kernels=1.0)
    gem = gem + gemm_s(dev, cal, plan, sq, d, s, count=b * heads, kernels=1.0)
    elems = b * heads * sq * s
    un = unfused(plan)
    ew = stream_s(dev, cal, elems * (4.0 + 5.0 * m.dropout + un * UNFUSED_MASK[0]), 2.0 + un * UNFUSED_MASK[1])
    return passes * (gem + ew)


def op_sac_recompute_s(m: ModelSpec, gemm_f, elementwise_f):
    """One layer's recomputation under torchtitan's op-level selective policy (the stack fact
    ``op_level_sac``): it saves the output of every matmul but every second one of the block and
    of the attention kernel, and recomputes the rest (pytorch/torchtitan @ f6a9daa13
    torchtitan/parallelisms/parallelize_llama.py ``_apply_ac_to_transformer_block``). In forward
    order the block's matmuls are q, k, v, o, w1, w3, w2 (plain MLP: w1, w2), so the key
    projection, the output projection and the sixth (w3; plain: w2) run again, and so does every
    element-wise op (``elementwise_f``, the layer's element-wise forward); the attention kernel
    does not. The three matmuls are priced at their FLOP share of the layer's forward GEMM time
    ``gemm_f`` (``(g + q + f) / (2q + 2g + n f)``: q, g the query and key widths, f the FFN width,
    n its matrices), which reuses terms the layer has already computed (pricing them as GEMMs of
    their own cost the sweep about 15%). The all-gathers that feed the recomputed matmuls under
    tensor parallelism are not priced."""
    q, g, f = q_width(m), kv_width(m), m.ffn_hidden
    share = (g + q + f) / (2.0 * q + 2.0 * g + n_mlp_matrices(m) * f)
    return share * gemm_f + elementwise_f


def head_s(dev, cal, m, plan):
    """LM head GEMM (forward + both backward GEMMs) and the fp32 vocab-parallel cross-entropy,
    which writes, reads and rewrites ``b*s*V/t`` fp32 logits (4+4+4 bytes forward, 8 backward);
    plus the embedding lookup and its gradient scatter."""
    T = plan.micro_batch * plan.seq_len / plan.cp
    h, V, t = m.hidden, m.vocab, plan.tp
    g = gemm_s(dev, cal, plan, T, V / t, h)
    g = g + gemm_s(dev, cal, plan, T, h, V / t) + gemm_s(dev, cal, plan, h, V / t, T)
    # The chunked fused loss reads each chunk's 16-bit logits once and writes their gradient in
    # place (Liger-Kernel's fused linear cross-entropy): 4 bytes per logit instead of 20; the
    # one-pass fused loss does the same over all of them (flash-attn's xentropy kernel).
    one_pass = (plan.loss_code == Loss.CHUNKED) | (plan.loss_code == Loss.FUSED)
    loss_bytes = jnp.where(one_pass, 4.0, 20.0)
    loss = stream_s(dev, cal, T * V / t * loss_bytes, 4.0)
    embed = stream_s(dev, cal, 3.0 * T * h * act_bytes(plan), 2.0)
    return g + loss + embed


def optimizer_gpu_s(dev, cal, params_local, state_bytes):
    """Adam on the GPU (fused, multi-tensor): per parameter it reads its state (fp32 master weight,
    m and v: ``state_bytes``, 12) and the fp32 gradient and writes the state and the 16-bit weight:
    30 bytes with fp32 states."""
    return stream_s(dev, cal, (2.0 * state_bytes + 6.0) * params_local, 4.0)
