"""Element-wise work of one layer on one GPU: norms, residual adds, rotary embedding, activation
functions, FP8 casts and dropout, priced by the HBM bytes it moves and the kernels it launches,
as the plan's stack runs it (hand-fused kernels, eager PyTorch ops, a fusing compiler, or pre-2021
Megatron-LM with its optional fusions off); the GEMMs and attention are in
:mod:`hetersim.terms.compute`."""

from __future__ import annotations

import jax.numpy as jnp

from .. import stacks
from ..specs import ModelSpec, Plan
from .compute import (
    NORM_BYTES,
    NORM_KERNELS,
    ROPE_BYTES,
    ROPE_KERNELS,
    SWIGLU_BYTES,
    SWIGLU_KERNELS,
    UNFUSED_BDA,
    UNFUSED_BIAS_ACT,
    _by_fusion,
    act_bytes,
    eager,
    low_precision,
    stack_fact,
    stream_s,
    tokens,
    unfused,
)
from .flops import kv_width, q_width

# Point-wise extras of some models, which hand-fused stacks run as eager ops and a fusing compiler
# (the stack's ``elementwise = compiled``) folds into its kernels at no cost; (forward, backward):
# * the gated FFN's inputs clamped (GPT-OSS ``swiglu_limit``): with activation_func_clamp_value set,
#   Megatron-Core splits the FFN input, clamps both halves and concatenates them again before its
#   fused quick-GeGLU (NVIDIA/Megatron-LM@d98e8a64 megatron/core/fusions/fused_bias_geglu.py
#   weighted_bias_quick_geglu_impl). Forward: two clamps (read 2, write 2 bytes per ffn element
#   each) and the cat of both halves (read and write 2 x 2): 16 bytes, 3 kernels. Backward: the
#   cat's gradient splits into views; each clamp's reads the gradient and its saved input and writes
#   (2 x 6); the split of the FFN output concatenates the halves' gradients (4 + 4): 20 bytes, 3 kernels.
# * a rotary embedding with an attention scale (YaRN's mscale != 1): Transformer Engine's fused RoPE
#   has none, so Megatron-Core runs it unfused (megatron/core/models/common/embeddings/rope_utils.py
#   @ d98e8a64: "mscale ... is not supported by TE's fused RoPE. Using unfused implementation"): the
#   eager rotary embedding's bytes and kernels over the fused one's (ROPE_BYTES, ROPE_KERNELS) in
#   each pass, its backward the same ops on the gradient.
# The experts' bias is priced in hetersim.terms.moe.
CLAMP_BYTES = (16.0, 20.0)
CLAMP_KERNELS = (3.0, 3.0)


def compiled(plan: Plan):
    """1.0 where the plan's stack compiles its element-wise work with a fusing compiler."""
    return stack_fact(stacks.table().compiled, plan)


def clamp_s(dev, cal, m: ModelSpec, plan: Plan, elements, backward: bool, fused_kernel=0.0):
    """The gated FFN's input clamp over ``elements`` ffn elements (its output's), one pass, where it
    runs as its own kernels: the model clamps, the stack does not compile and (``fused_kernel``) no
    fused expert kernel takes it in. Zero for a model without (nothing traced for a dense one)."""
    if m.extra is None:
        return 0.0
    share = m.glu_clamp * (1.0 - compiled(plan)) * (1.0 - fused_kernel)
    nbytes = share * act_bytes(plan) / 2.0 * elements * CLAMP_BYTES[backward]
    return stream_s(dev, cal, nbytes, share * CLAMP_KERNELS[backward])


def rope_unfused_s(dev, cal, m: ModelSpec, plan: Plan):
    """One pass of a scaled rotary embedding (YaRN) that a hand-fused stack runs unfused, beyond the
    fused kernel it would otherwise run (an eager stack pays the eager bytes anyway; a compiler
    fuses it)."""
    if m.extra is None:
        return 0.0
    share = m.rope * m.rope_scaled * (1.0 - eager(plan)) * (1.0 - compiled(plan))
    width = (q_width(m) + kv_width(m)) / plan.tp
    nbytes = share * act_bytes(plan) / 2.0 * tokens(plan) * width * (ROPE_BYTES[1] - ROPE_BYTES[0])
    return stream_s(dev, cal, nbytes, share * (ROPE_KERNELS[1] - ROPE_KERNELS[0]))


def layer_elementwise_bytes(m: ModelSpec, plan: Plan):
    """HBM bytes moved by one layer's element-wise kernels in the forward, per rank.

    Per token: two norms, two bias-dropout-residual adds (read 2h, write h: 6h bytes each, plus a
    1-byte dropout mask per element in models trained with dropout) — replicated over
    tensor-parallel ranks unless sequence parallelism shards them; rotary embedding on q and k;
    the activation function; FP8 casts of the four GEMM inputs (read 2 bytes, write 1). The norm,
    rotary and SwiGLU bytes depend on whether the stack fuses them (``NORM_BYTES`` ...).
    """
    e = act_bytes(plan) / 2.0  # 1 for 16-bit, 2 for fp32
    ea = eager(plan)
    T = plan.micro_batch * plan.seq_len / plan.cp
    h, f, t = m.hidden, m.ffn_hidden, plan.tp
    sp_div = jnp.where(plan.sp > 0, t, 1.0)
    bda = 6.0 + unfused(plan) * m.dropout * UNFUSED_BDA[0]  # each bias-dropout-residual add
    hidden_ops = (2.0 * _by_fusion(NORM_BYTES, ea) * h + 2.0 * bda * h + m.dropout * 2.0 * h) / sp_div
    rope = m.rope * _by_fusion(ROPE_BYTES, ea) * (q_width(m) + kv_width(m)) / t
    act_fn = act_fn_bytes(m, plan) * f / t
    fp8 = jnp.where(low_precision(plan), 3.0 * (3.0 * h + f) / t, 0.0)
    return T * (e * (hidden_ops + rope + act_fn) + fp8 + ring_merge_bytes(m, plan)[0])


def ring_merge_bytes(m: ModelSpec, plan: Plan):
    """(forward, backward) HBM bytes per token of one layer for PyTorch's ring attention's own
    bookkeeping (the stack fact cp_torch_ring; torch/distributed/tensor/experimental/_attention.py,
    PyTorch 2.6: _templated_ring_attention, _SDPAMerger, _templated_ring_attention_backward,
    _partial_update), on the busiest rank; 0 without it or without context parallelism. Per ring
    step the forward copies K and V into one buffer to pass on (torch.cat), merges the step's
    output into an fp32 running output (``out - sigmoid(block_lse - lse) * (out - block_out)``,
    convert_to_f32 = True), and where the round-robin balance has a step update only the second
    half of the queries rebuilds the whole fp32 output with torch.cat. The backward zeroes fp32
    dQ, dK, dV, adds each step's gradients into them (dK, dV through _partial_update on the steps
    that use half of K, V: a torch.cat of both full fp32 tensors) and concatenates dK and dV into
    the fp32 buffer it sends on. One read or write per tensor an operation touches (what a fusing
    compiler leaves; eager PyTorch moves more), K and V repeated to the query heads. Priced with
    the layer's element-wise kernels (one pass through HBM, no tensor-core work): folded into
    their byte count, the term costs the sweep almost nothing."""
    a, f, n = act_bytes(plan), 4.0, plan.cp
    fwd = (n - 1.0) * (4.0 * a + (2.0 * f + a) / 2.0 + 2.0 * f) + 2.0 * (a + f)
    bwd = 3.0 * f + 2.0 * (2.0 * f + a) + (n - 1.0) * (5.0 * a + 6.0 * f) + n * (6.0 * f + a) + 3.0 * (f + a)
    width = jnp.where(n > 1, stack_fact(stacks.table().cp_torch_ring, plan), 0.0) * q_width(m) / plan.tp
    return width * fwd, width * bwd


def mlp_elementwise_bytes(m: ModelSpec, plan: Plan):
    """The dense MLP's share of :func:`layer_elementwise_bytes`: its activation function and, in
    FP8, the casts of its two GEMM inputs."""
    e = act_bytes(plan) / 2.0
    T, h, f, t = tokens(plan), m.hidden, m.ffn_hidden, plan.tp
    fp8 = jnp.where(low_precision(plan), 3.0 * (h + f) / t, 0.0)
    return T * (e * act_fn_bytes(m, plan) * f / t + fp8)


def mlp_elementwise_kernels(m: ModelSpec, plan: Plan):
    return act_fn_kernels(m, plan) + jnp.where(low_precision(plan), 2.0, 0.0)


def act_fn_bytes(m: ModelSpec, plan: Plan):
    """Forward bytes per ffn element of the activation function (16-bit), with the bias add
    before GeLU where the stack leaves it unfused (:data:`UNFUSED_BIAS_ACT`)."""
    plain = 4.0 + unfused(plan) * m.dropout * UNFUSED_BIAS_ACT[0]
    return jnp.where(m.gated > 0, _by_fusion(SWIGLU_BYTES, eager(plan)), plain)


def act_fn_kernels(m: ModelSpec, plan: Plan):
    """Forward kernels of the activation function (:func:`act_fn_bytes`)."""
    plain = 1.0 + unfused(plan) * m.dropout * UNFUSED_BIAS_ACT[1]
    return jnp.where(m.gated > 0, _by_fusion(SWIGLU_KERNELS, eager(plan)), plain)


def activation_fn_s(dev, cal, m, plan):
    """The MLP activation function alone (recomputed under selective recomputation)."""
    T = plan.micro_batch * plan.seq_len / plan.cp
    nbytes = T * act_bytes(plan) / 2.0 * act_fn_bytes(m, plan) * m.ffn_hidden / plan.tp
    return stream_s(dev, cal, nbytes, act_fn_kernels(m, plan))


def elementwise_kernels_fwd(m: ModelSpec, plan: Plan):
    """Element-wise kernels per layer in the forward: 2 norms, 2 residual adds (3 ops each where a
    stack leaves Megatron's bias-dropout-add unfused), rotary embedding, the activation function;
    FP8 adds a cast (with transpose and amax) before each of the four GEMMs."""
    ea = eager(plan)
    bda = 1.0 + unfused(plan) * m.dropout * UNFUSED_BDA[1]  # each bias-dropout-residual add
    ops = (
        2.0 * _by_fusion(NORM_KERNELS, ea) + 2.0 * bda + m.rope * _by_fusion(ROPE_KERNELS, ea) + act_fn_kernels(m, plan)
    )
    return ops + jnp.where(low_precision(plan), 4.0, 0.0)


def layer_elementwise_fwd_s(dev, cal, m, plan):
    return stream_s(dev, cal, layer_elementwise_bytes(m, plan), elementwise_kernels_fwd(m, plan))


def _attn_elementwise(m: ModelSpec, plan: Plan):
    """(forward bytes, kernels) of a layer's element-wise kernels outside its FFN (norms,
    residuals, rotary embedding, FP8 casts of the attention GEMMs' inputs)."""
    nbytes = layer_elementwise_bytes(m, plan) - mlp_elementwise_bytes(m, plan)
    return nbytes, elementwise_kernels_fwd(m, plan) - mlp_elementwise_kernels(m, plan)


def attn_elementwise_fwd_s(dev, cal, m, plan):
    """The element-wise kernels of a layer outside its FFN: what an MoE layer keeps of a dense
    layer's (:func:`_attn_elementwise`)."""
    return stream_s(dev, cal, *_attn_elementwise(m, plan))


def _elementwise_bwd_s(dev, cal, m: ModelSpec, plan: Plan, fwd_bytes, fwd_kernels):
    """The backward of element-wise kernels of ``fwd_bytes`` and ``fwd_kernels`` in the forward:
    it reads the saved input and the incoming gradient and writes the outgoing gradient, about
    twice the forward's bytes in twice its kernels (and FP8 casts the incoming gradient of each
    GEMM); PyTorch's ring attention's bookkeeping its own backward (:func:`ring_merge_bytes`),
    not twice its forward."""
    fwd, bwd = ring_merge_bytes(m, plan)
    return stream_s(dev, cal, 2.0 * fwd_bytes + tokens(plan) * (bwd - 2.0 * fwd), 2.0 * fwd_kernels)


def layer_elementwise_bwd_s(dev, cal, m, plan):
    """The backward of a layer's element-wise kernels (:func:`_elementwise_bwd_s`)."""
    return _elementwise_bwd_s(dev, cal, m, plan, layer_elementwise_bytes(m, plan), elementwise_kernels_fwd(m, plan))


def attn_elementwise_bwd_s(dev, cal, m, plan):
    """The backward of :func:`attn_elementwise_fwd_s`."""
    return _elementwise_bwd_s(dev, cal, m, plan, *_attn_elementwise(m, plan))
