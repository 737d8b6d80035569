"""Bytes each GPU holds, by category (mixed-precision Adam; Korthikanti et al. 2022)."""

from __future__ import annotations

import jax.numpy as jnp

from .. import stacks
from ..specs import ModelSpec, Plan
from ..types import Attention, GradReduce, Loss, Moments, Precision, Recompute, Stack
from ..units import GiB
from . import compute, moe, schedule
from .flops import dense_mlp_params, expert_params, kv_width, layer_params, n_mlp_matrices, q_width

WEIGHT_BYTES = 2.0  # 16-bit working weights (fp32 training: 4)
GRAD_BYTES = 4.0  # fp32 gradient buffer: Megatron DDP main_grad (zero 0), FSDP2 reduce_dtype (bf16 zero 3)
GRAD_BYTES_DIST_OPT = 2.0  # Megatron's distributed optimizer keeps its grad buffer in the parameter
# dtype by default (DistributedDataParallelConfig.grad_reduce_in_fp32 = False)
OPTIMIZER_BYTES = 12.0  # fp32 master weights, Adam m and v
# Megatron-Core's precision-aware optimizer (``moments = bf16``): m and v in bf16, 2 bytes each
# (exp_avg_dtype / exp_avg_sq_dtype); in bf16 training without a non-delayed FP8 recipe Transformer
# Engine's FusedAdam keeps the fp32 master weight as the 16 bits the bf16 weight lacks
# (store_param_remainders, default True: the distributed optimizer allocates the master shard as
# int16 where bf16 and use_precision_aware_optimizer_no_fp8_or_ds_fp8; with an FP8 recipe
# Megatron-Core keeps an fp32 master. NVIDIA/Megatron-LM@d98e8a64
# megatron/core/optimizer/optimizer_config.py l.187-208 and 407-414, distrib_optimizer.py
# l.1007-1013). The model's ``fp8`` is taken as current scaling (an fp32 master).
BF16_MOMENTS_BYTES = 4.0
MASTER_REMAINDER_BYTES = 2.0
# CUDA context, cuBLAS workspace, NCCL channel buffers. An estimate: neither fitted (calibration.toml
# holds only the constants of hetersim.fit.calibration.BOUNDS) nor measured in this repository.
RUNTIME_RESERVED_GiB = 1.5

# Indices of OFFLOAD_STATE in Plan.offload_tier_code.
OPT, GRAD, PARAM, ACT = 0, 1, 2, 3


def busiest_stage_layers(m: ModelSpec, plan: Plan):
    """Layers on the busiest pipeline stage: ``ceil(L / (pp*vp)) * vp`` (uneven splits put the
    remainder on some stages)."""
    return jnp.ceil(stack_layers(m) / (plan.pp * plan.vp) - 1e-6) * plan.vp


def stack_layers(m: ModelSpec):
    """Transformer layers the pipeline splits: the model's and its multi-token-prediction modules'
    (one layer each, placed like the others)."""
    return m.layers + m.mtp_layers


def moe_stage_layers(m: ModelSpec, layers):
    """MoE layers among a stage's ``layers``: all of them up to the model's MoE layers where those
    are contiguous, every ``moe_every``-th where they interleave with dense ones (a stage of
    consecutive layers; the busiest stage is the one with the most MoE layers)."""
    if m.extra is None:
        return 0.0
    mtp = jnp.where(m.moe_layers > 0, m.mtp_layers, 0.0)  # an MoE model's MTP layer is an MoE layer
    return jnp.minimum(jnp.ceil(layers / m.moe_every - 1e-6), m.moe_layers + mtp)


def first_stage_moe_layers(m: ModelSpec, plan: Plan, layers):
    """MoE layers among the first pipeline stage's ``layers`` (the stage that holds the most
    micro-batches' activations): its share of the model's leading dense layers (DeepSeek-V3's
    ``first_k_dense_replace`` = 3, Kimi-K2's 1) are not MoE layers. Megatron-Core gives model chunk
    ``k`` of pipeline rank 0 the layers from ``k * pp * c`` on, ``c`` layers per chunk
    (megatron/core/transformer/transformer_layer.py ``get_transformer_layer_offset`` @ d98e8a64dd;
    the Megatron-Bridge DeepSeek-V3 layouts ``Et*4|(t*4|)*14tmL`` put the embedding and layers 0-3
    first), so the leading dense layers fill rank 0's first chunks. Interleaved dense layers
    (``moe_every`` > 1) keep :func:`moe_stage_layers`."""
    busiest = moe_stage_layers(m, layers)
    if m.extra is None:
        return busiest
    chunk = jnp.maximum(layers / plan.vp, 1.0)
    leading = jnp.maximum(m.layers - m.moe_layers * m.moe_every, 0.0)
    rounds = jnp.floor(leading / (plan.pp * chunk) + 1e-6)  # pipeline rounds wholly dense
    rest = leading - rounds * plan.pp * chunk
    dense_here = jnp.minimum(rounds, plan.vp) * chunk + jnp.where(rounds < plan.vp, jnp.minimum(rest, chunk), 0.0)
    first = jnp.clip(layers - dense_here, 0.0, busiest)
    return jnp.where(m.moe_every > 1.0, busiest, first)


def local_params(m: ModelSpec, plan: Plan, layers=None, vocab_mats=None):
    """Parameters on the busiest pipeline stage's tensor-parallel rank (or on a stage of
    ``layers`` layers holding ``vocab_mats`` vocabulary matrices) that are not routed experts
    (those: :func:`expert_local_params`).

    With pp > 1 the first stage holds the embedding and the last the LM head (one vocabulary
    matrix each; the busiest stage is counted with one); with pp == 1 one rank holds both (one
    matrix when they are tied). An MoE layer's shared experts and router are split like a dense
    MLP.
    """
    layers = busiest_stage_layers(m, plan) if layers is None else layers
    per_rank = layers * layer_params(m) / plan.tp
    if m.extra is not None:
        shared = n_mlp_matrices(m) * m.hidden * m.shared_ffn_hidden + m.n_experts * m.hidden
        per_rank = per_rank + moe_stage_layers(m, layers) * (shared - dense_mlp_params(m)) / plan.tp
    if vocab_mats is None:
        vocab_mats = jnp.where(plan.pp > 1, 1.0, 2.0 - m.tied_embeddings)
    return per_rank + vocab_mats * m.vocab * m.hidden / plan.tp


def expert_local_params(m: ModelSpec, plan: Plan, layers=None):
    """Routed-expert parameters on one rank of the busiest stage: its ``n_experts / ep`` experts
    of each MoE layer, split ``etp`` ways."""
    if m.extra is None:
        return 0.0
    layers = busiest_stage_layers(m, plan) if layers is None else layers
    return moe_stage_layers(m, layers) * expert_params(m) / (plan.ep * plan.etp)


def dp_ranks(plan: Plan):
    """The data-parallel ranks a weight is replicated over, which in Megatron include the
    context-parallel ones: ``dp * cp``."""
    return plan.dp * plan.cp


def zero_group(plan: Plan):
    """ZeRO / distributed-optimizer states are sharded over the data-parallel ranks
    (:func:`dp_ranks`); under hybrid sharding (``shard_group`` > 0) over groups of that many of
    them, each group a replica of the others."""
    n = dp_ranks(plan)
    return jnp.where(plan.shard_group > 0, jnp.minimum(plan.shard_group, n), n)


def expert_dp(plan: Plan):
    """The routed experts' data-parallel size (Megatron's expert-data-parallel group, which their
    gradients are reduced and their ZeRO states sharded over): ``tp*cp*dp / (ep*etp)``."""
    return jnp.maximum(plan.tp * plan.cp * plan.dp / (plan.ep * plan.etp), 1.0)


# DeepSpeed's mixed-precision optimizers step on an fp32 copy of the gradients of their partition
# (deepspeedai/DeepSpeed@7dee2e06 deepspeed/runtime/zero/stage_1_and_2.py: the fp32 partition's
# ``single_partition_of_fp32_groups[i].grad``; runtime/fp16/fused_optimizer.py: the flat fp32
# groups' grads without ZeRO) beside the model's 16-bit gradients, which it keeps and reduces in
# the model's dtype (``communication_data_type`` defaults to it): 2 + 2 + (4 + 12) = 20 bytes per
# parameter unsharded. DeepSpeed 0.3 (the deepspeed-2020 stack) does the same: its FP16 optimizer
# gives the flat fp32 groups a gradient (DachengLi1/AMP @ 72eeea4 DeepSpeed/deepspeed/runtime/fp16/
# fused_optimizer.py l.108), ZeRO 2 its fp32 partition (runtime/zero/stage2.py l.1429).
FP32_GRAD_COPY_BYTES = 4.0


def deepspeed_16bit(plan: Plan):
    deepspeed = (plan.stack_code == Stack.DEEPSPEED) | (plan.stack_code == Stack.DEEPSPEED_2020)
    return deepspeed & (plan.precision_code != Precision.FP32)


def grad_bytes(plan: Plan):
    """Bytes per gradient element, in memory and on the wire."""
    dist_opt = ((plan.zero >= 1) & (plan.zero <= 2)) | deepspeed_16bit(plan)
    # FP16 ZeRO-3 is DeepSpeed's, which keeps and reduces gradients in the model's dtype
    # (communication_data_type defaults to fp16); bf16 FSDP reduces in fp32 (FSDP2's reduce_dtype).
    fp16_z3 = (plan.zero >= 3) & (plan.precision_code == Precision.FP16)
    return jnp.where((dist_opt | fp16_z3) & (plan.precision_code != Precision.FP32), GRAD_BYTES_DIST_OPT, GRAD_BYTES)


def grad_wire_bytes(plan: Plan):
    """Bytes per gradient element in the data-parallel collectives: the stored dtype
    (:func:`grad_bytes`) unless the plan's ``grad_reduce`` forces fp32 (a copy upcast per
    bucket: DeepSpeed's ``allreduce_bucket`` with fp32_allreduce, deepspeedai/DeepSpeed
    deepspeed/runtime/engine.py) or the model's 16-bit dtype."""
    model16 = jnp.where(plan.precision_code == Precision.FP32, GRAD_BYTES, GRAD_BYTES_DIST_OPT)
    code = plan.grad_reduce_code
    forced = jnp.where(code == GradReduce.MODEL, model16, grad_bytes(plan))
    return jnp.where(code == GradReduce.FP32, GRAD_BYTES, forced)


def _dualpipe_copies(plan: Plan, stage):
    """What DualPipe's second stage adds to a state ZeRO shards from ``stage`` on: a whole copy
    where it is not sharded; nothing where it is, as the ranks holding a stage double too (its own
    data-parallel ranks and those of its mirror) and each keeps the same share."""
    return jnp.where(plan.zero >= stage, 1.0, schedule.dualpipe_stages(plan))


def state_bytes(m: ModelSpec, plan: Plan, layers=None, vocab_mats=None):
    """(weights, gradients, optimizer) bytes per GPU before any offload (of the busiest stage, or
    of a stage of ``layers`` layers and ``vocab_mats`` vocabulary matrices; under DualPipe its
    rank's two stages: :func:`hetersim.terms.schedule.dualpipe_stages`)."""
    p = local_params(m, plan, layers, vocab_mats)
    pe = expert_local_params(m, plan, layers)
    n, ne = zero_group(plan), expert_dp(plan)

    def sharded(stage):
        held = p / jnp.where(plan.zero >= stage, n, 1.0) + pe / jnp.where(plan.zero >= stage, ne, 1.0)
        return held * _dualpipe_copies(plan, stage)

    wbytes = jnp.where(plan.precision_code == Precision.FP32, 4.0, WEIGHT_BYTES)
    opt_bytes = optimizer_bytes(plan) + jnp.where(deepspeed_16bit(plan), FP32_GRAD_COPY_BYTES, 0.0)
    return sharded(3) * wbytes, sharded(2) * grad_bytes(plan), sharded(1) * opt_bytes


def optimizer_bytes(plan: Plan):
    """Adam's state per parameter: the fp32 master weight and two moments, 12 bytes; with bf16
    moments (``moments = bf16``, on the GPU) 8, or 6 where bf16 training keeps the master as a
    16-bit remainder (:data:`BF16_MOMENTS_BYTES`, :data:`MASTER_REMAINDER_BYTES`). A CPU optimizer
    keeps fp32 states."""
    bf16 = (plan.moments_code == Moments.BF16) & ~(plan.cpu_optimizer > 0)
    master = jnp.where(bf16 & (plan.precision_code == Precision.BF16), MASTER_REMAINDER_BYTES, 4.0)
    return master + jnp.where(bf16, BF16_MOMENTS_BYTES, OPTIMIZER_BYTES - 4.0)


def optimizer_params(m: ModelSpec, plan: Plan, layers=None, vocab_mats=None):
    """Parameters whose optimizer step one GPU runs (its ZeRO shard of the dense and the expert
    parameters)."""
    n, ne = zero_group(plan), expert_dp(plan)
    dense = local_params(m, plan, layers, vocab_mats) / jnp.where(plan.zero >= 1, n, 1.0)
    experts = expert_local_params(m, plan, layers) / jnp.where(plan.zero >= 1, ne, 1.0)
    return (dense + experts) * _dualpipe_copies(plan, 1)


def layer_activation_bytes(m: ModelSpec, plan: Plan):
    """Activation bytes one layer stores for its backward, per micro-batch, per GPU.

    Korthikanti et al. 2022, generalised to GQA, SwiGLU and dropout-free models: per token,
    norms' inputs 4h, QKV and MLP inputs 2h each, dropout masks h each (GPT) — replicated across
    tensor-parallel ranks unless sequence parallelism shards them; Q 2h, K and V 2h*g/a each, the
    output projection's input 2h, the MLP's intermediate tensors (2 per matrix output and the
    activation output: 4f plain, 6f SwiGLU) — sharded by tp. For GPT (f=4h, g=a) this is
    ``s*b*h*(10 + 24/t)``, their eq. 2. The score matrix adds ``5*a*s/h`` per token (2 with no
    dropout) unless flash attention never stores it or selective recomputation drops it. Full
    recomputation keeps only the layer input, ``2*s*b*h`` (sharded by tp under SP).

    Returns (stored, working): the bytes kept per layer, and the bytes of one layer rebuilt in
    full during its backward under recomputation.
    """
    b, s = plan.micro_batch, plan.seq_len / plan.cp
    h, f, a, t = m.hidden, m.ffn_hidden, m.heads, plan.tp
    sp_div = jnp.where(plan.sp > 0, t, 1.0)
    # FP8 training (Transformer Engine) saves the inputs of the four GEMMs as 1-byte FP8 copies
    # for the weight-gradient GEMMs: the QKV, output-projection and MLP inputs (h each) and the
    # down projection's input (f) take half the bytes.
    fp8 = compute.low_precision(plan)
    gemm_in_save = jnp.where(fp8, 1.0, 0.0)
    replicated = (8.0 + 2.0 * m.dropout) * h / sp_div - gemm_in_save * 2.0 * h / sp_div
    mlp = mlp_activation_bytes(m, plan, f)
    sharded = (attn_activation_bytes(m, plan) + mlp) / t
    scores = (2.0 + 3.0 * m.dropout) * a * plan.seq_len / t  # per query token
    flash_lse = 4.0 * a / t
    keep_scores = (plan.attention_code == Attention.MATERIALIZED) & (plan.recompute_code == Recompute.NONE)
    attn = jnp.where(keep_scores, scores, jnp.where(plan.attention_code != Attention.MATERIALIZED, flash_lse, 0.0))
    e = jnp.where(plan.precision_code == Precision.FP32, 2.0, 1.0)
    per_token = e * (replicated + sharded) + attn
    full = e * 2.0 * h / sp_div
    # The layer being rebuilt during its backward holds everything, the s x s scores included
    # when attention materialises them.
    working = e * (replicated + sharded) + jnp.where(plan.attention_code == Attention.MATERIALIZED, scores, flash_lse)
    return b * s * jnp.where(plan.recompute_code == Recompute.FULL, full, per_token), b * s * working


def mlp_activation_bytes(m: ModelSpec, plan: Plan, f):
    """Bytes per token an MLP of width ``f`` stores (before any tensor-parallel split): the two
    (gated: three) matrix outputs and the activation output, 4f plain and 6f SwiGLU; in FP8 the
    down projection's input as a 1-byte copy. Selective recomputation with flash attention
    (nothing s x s to drop) recomputes the cheap element-wise ops instead, as torchtitan's op-level
    policy and Megatron's ``moe_act`` recompute module do: the activation function's output (the
    down projection's input, 2f per token) is not stored."""
    fp8 = jnp.where(compute.low_precision(plan), 1.0, 0.0)
    mlp = jnp.where(m.gated > 0, 6.0 * f, 4.0 * f) - fp8 * f
    selective = (plan.recompute_code == Recompute.SELECTIVE) & (plan.attention_code != Attention.MATERIALIZED)
    if m.extra is not None:  # Megatron's mla_up_proj module replaces the default ones: the output is stored
        selective = selective & ~compute.mla_up_recompute(m, plan)
    return mlp - jnp.where(selective, 2.0 * f, 0.0)


def attn_activation_bytes(m: ModelSpec, plan: Plan):
    """Bytes per token the attention block stores before any tensor-parallel split: Q, K and V
    and the output projection's input (1 byte in FP8). MLA stores its up-projected query, key and
    value (``a*(d + d_r)``, ``a*(d + d_r)``, ``a*d_v``) and the output projection's input ``a*d_v``
    (its small latents are not counted); under the ``mla_up_proj`` recompute module
    (:func:`~hetersim.terms.compute.mla_up_recompute`) the first three are rebuilt, not stored."""
    fp8 = jnp.where(compute.low_precision(plan), 1.0, 0.0)
    q, k = q_width(m), kv_width(m)  # h and h*g/a when the head width is h/a
    std = 2.0 * q + 4.0 * k + (2.0 - fp8) * q
    a, d_qk, d_v = m.heads, m.head_dim + m.rope_head_dim, m.v_head_dim
    mla = 2.0 * a * (2.0 * d_qk + d_v) + (2.0 - fp8) * a * d_v
    if m.extra is not None:  # the mla_up_proj recompute module stores no up-projected q, k, v
        mla = mla - jnp.where(compute.mla_up_recompute(m, plan), 2.0 * a * (2.0 * d_qk + d_v), 0.0)
    return jnp.where(m.kv_lora_rank > 0, mla, std)


def moe_activation_delta(m: ModelSpec, plan: Plan, routed, local):
    """Bytes an MoE layer stores beyond a dense layer of the same attention, per micro-batch and
    GPU: the dense MLP's share replaced by the routed experts' (``routed`` token copies on the
    busiest rank, their intermediate split ``etp`` ways), the permuted tokens and the experts'
    outputs (2 bytes each per copy and element), the router's fp32 probabilities over the ``local``
    tokens, and the shared experts (tensor-parallel like a dense MLP)."""
    b, s = plan.micro_batch, plan.seq_len / plan.cp
    e = jnp.where(plan.precision_code == Precision.FP32, 2.0, 1.0)
    dense = b * s * e * mlp_activation_bytes(m, plan, m.ffn_hidden) / plan.tp
    fp8 = jnp.where(compute.low_precision(plan), 1.0, 0.0)  # the first expert GEMM's input in FP8
    experts = routed * e * (mlp_activation_bytes(m, plan, m.moe_ffn_hidden / plan.etp) + (4.0 - fp8) * m.hidden)
    shared = b * s * e * mlp_activation_bytes(m, plan, m.shared_ffn_hidden) / plan.tp
    router = local * m.n_experts * 4.0
    stored = experts + shared + router - dense
    full = plan.recompute_code == Recompute.FULL
    return jnp.where(m.moe_layers > 0, jnp.where(full, 0.0, stored), 0.0), jnp.where(m.moe_layers > 0, stored, 0.0)


def inflight_microbatches(plan: Plan, n_micro):
    """Micro-batches whose activations the first stage holds at once: ``min(pp, m)`` under 1F1B,
    times ``1 + (pp-1)/(pp*v)`` when interleaved (Korthikanti et al. §4.2.3); ``pp + 1`` under
    DualPipe ("Activation PP+1", deepseek-ai/DualPipe @ 89f5de17 README)."""
    base = jnp.minimum(plan.pp, n_micro)
    one_f_one_b = base * (1.0 + (plan.pp - 1.0) / (plan.pp * plan.vp) * (plan.vp > 1))
    return jnp.where(schedule.dualpipe_stages(plan) > 1.0, jnp.minimum(plan.pp + 1.0, n_micro), one_f_one_b)


def activation_bytes(m: ModelSpec, plan: Plan, n_micro, layers=None, inflight=None):
    """Activations the first (or a given) stage holds: ``layers`` layers times the micro-batches
    in flight."""
    stored, working = layer_activation_bytes(m, plan)
    first = layers is None  # the first stage: its MoE layers exclude the leading dense ones
    layers = busiest_stage_layers(m, plan) if layers is None else layers
    inflight = inflight_microbatches(plan, n_micro) if inflight is None else inflight
    moe_stored, moe_working = 0.0, 0.0
    if m.extra is not None:
        moe_stored, moe_working = moe_activation_delta(m, plan, moe.routed_tokens(m, plan), moe.local_tokens(plan))
    n_moe = first_stage_moe_layers(m, plan, layers) if first else moe_stage_layers(m, layers)
    kept = (stored * layers + moe_stored * n_moe) * inflight
    # Full recomputation rebuilds one layer's activations during its backward (an MoE layer's in
    # an MoE model).
    return kept + jnp.where(plan.recompute_code == Recompute.FULL, working + moe_working, 0.0)


def loss_chunk_tokens(m: ModelSpec, plan: Plan):
    """Tokens whose logits the loss kernel holds at once: all of a micro-batch's (materialised),
    or one chunk of the chunked fused cross-entropy. Liger-Kernel's fused linear cross-entropy
    (linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py) takes
    ``chunk = next_power_of_2(ceil(T / ceil(V / h)))`` tokens, so that a chunk's logits are about
    the size of the hidden states."""
    T = plan.micro_batch * plan.seq_len / plan.cp
    chunk = 2.0 ** jnp.ceil(jnp.log2(jnp.maximum(jnp.ceil(T / jnp.ceil(m.vocab / m.hidden)), 1.0)))
    return jnp.where(plan.loss_code == Loss.CHUNKED, jnp.minimum(chunk, T), T)


# DeepSpeed ZeRO-3 gathers the weights of one sub-module (a Linear) at a time and frees them after
# use unless they are used again within stage3_max_reuse_distance parameters (the plan's
# reuse_Mparams), prefetching stage3_prefetch_bucket_size (5e7) ahead; each gradient waits in a
# reduce bucket of reduce_bucket_size (5e8) elements for its reduce-scatter
# (deepspeedai/DeepSpeed deepspeed/runtime/zero/stage3.py @ 4601885 fetch_sub_module /
# release_sub_module / _keep_for_later; defaults in deepspeed/runtime/zero/constants.py there and
# deepspeed/runtime/zero/config.py @ edaa72212).
DS_PREFETCH_PARAMS = 5e7
DS_REDUCE_BUCKET_PARAMS = 5e8


def reuse_kept_params(plan: Plan):
    """Parameters DeepSpeed's ZeRO-3 keeps gathered for their next use: a weight is released
    unless reused within ``stage3_max_reuse_distance`` (the plan's ``reuse_Mparams``), and a
    weight of a layer's recomputed forward is reused by its backward ``2 S`` parameters later
    (``S`` the parameters after it), so those within half the distance stay."""
    return 0.5 * plan.reuse_Mparams * 1e6


def largest_matrix_params(m: ModelSpec):
    """Parameters of a dense layer's largest weight matrix, as the stacks build it: the fused QKV
    projection ``h x (q + 2 kv)`` or the MLP's first one (``h x 2f``, gate and up fused, under
    SwiGLU; ``h x f`` plain)."""
    return jnp.maximum(m.hidden * (q_width(m) + 2.0 * kv_width(m)), m.hidden * m.ffn_hidden * (1.0 + m.gated))


def legacy_zero3(plan: Plan):
    """True where ZeRO-3 runs as DeepSpeed <= 0.4 ran it (``zero3_prefetch`` off): each parameter
    gathered on its own, after a device synchronisation, through a tensor-list collective
    (:func:`hetersim.terms.dp.param_tensors`, :func:`hetersim.terms.dp.list_copy_s`)."""
    return (plan.zero >= 3) & (plan.zero3_prefetch <= 0)


def zero3_gathered_bytes(m: ModelSpec, plan: Plan):
    """ZeRO-3's gathered weights and unsharded gradients per GPU. FSDP (``reuse_Mparams`` 0) gathers
    a whole layer: the one computing and the one prefetched, in 16 bits, and the computing layer's
    gradients, the reduce-scatter's input, in the reduction dtype. DeepSpeed (``reuse_Mparams`` >
    0) holds the matrix computing (at most the largest), the weights it keeps for a use within
    the reuse distance (:func:`reuse_kept_params`) and the prefetch bucket, never more than two
    layers; and a reduce bucket of gradients with the largest matrix's arriving whole, never more
    than a layer's. DeepSpeed <= 0.4 (``zero3_prefetch`` off) gathers and reduces each parameter
    through a tensor-list collective, which runs on a flat buffer of the whole tensor beside the
    list's own (ProcessGroupNCCL ``flatten_for_scatter_gather``, pytorch/pytorch @ 6f583bb56;
    :func:`hetersim.terms.dp.list_copy_s`): one more copy of the largest matrix, its weights or its
    gradients (each collective completes before the next gather, which synchronises the device)."""
    layer, big = layer_params(m) / plan.tp, largest_matrix_params(m) / plan.tp
    fsdp = layer * (2.0 * WEIGHT_BYTES + grad_bytes(plan))
    live = jnp.minimum(big + reuse_kept_params(plan) + DS_PREFETCH_PARAMS, 2.0 * layer)
    grads = jnp.minimum(big + DS_REDUCE_BUCKET_PARAMS, layer)
    flat = jnp.where(legacy_zero3(plan), big * jnp.maximum(WEIGHT_BYTES, grad_bytes(plan)), 0.0)
    deepspeed = live * WEIGHT_BYTES + grads * grad_bytes(plan)
    return jnp.where(plan.reuse_Mparams > 0, deepspeed, fsdp) + flat


# Bytes of one kept logit: the fp32 cast the pipeline module's last layer makes (kept_logits).
KEPT_LOGIT_BYTES = 4.0
# Pipe buffers of a DeepSpeed pipeline's last stage (deepspeed/runtime/pipe/schedule.py
# TrainSchedule.num_pipe_buffers): max(2, min(stages - stage_id + 1, micro_batches)) in DeepSpeed 0.3
# (DachengLi1/AMP @ 72eeea4, l.243-247), max(2, min(stages - stage_id, micro_batches)) today
# (deepspeedai/DeepSpeed @ 03f6f75c): 2 for stage_id = stages - 1 in both.
LAST_STAGE_PIPE_BUFFERS = 2.0


def kept_logits_bytes(m: ModelSpec, plan: Plan, n_micro):
    """Logits a pipeline engine keeps on its last stage beyond the micro-batch computing
    (``kept_logits``, DeepSpeed's PipelineEngine): each of the stage's two pipe buffers holds the
    fp32 logits of the last micro-batch that ran in it, from earlier in the step or from the step
    before, until its next forward replaces them; so a forward's new logits meet
    ``min(2, n_micro)`` kept ones. Only a materialised loss outputs logits; only a pipeline
    (pp > 1) runs the engine."""
    t = stacks.table()
    on = (compute.stack_fact(t.kept_logits, plan) > 0) & (plan.pp > 1) & (plan.loss_code == Loss.MATERIALIZED)
    kept = jnp.minimum(n_micro, LAST_STAGE_PIPE_BUFFERS) * KEPT_LOGIT_BYTES
    return jnp.where(on, kept * plan.micro_batch * plan.seq_len / plan.cp * m.vocab / plan.tp, 0.0)


def buffer_bytes(m: ModelSpec, plan: Plan, logits_on=1.0, n_micro=1.0):
    """Temporary buffers: the logits (16-bit GEMM output and the fp32 copy the cross-entropy
    works in, its gradient computed in place; one chunk's under the chunked loss, no fp32 copy
    under the one-pass fused loss; and those a pipeline engine keeps, :func:`kept_logits_bytes`)
    on the last stage, ZeRO-3's gathered weights and unsharded gradients
    (:func:`zero3_gathered_bytes`), and the runtime's reserve. ``logits_on`` 0: a stage without
    the LM head."""
    # The one-pass fused loss keeps only the 16-bit logits (its gradient written in place).
    per_logit = jnp.where(plan.loss_code == Loss.FUSED, 2.0, 2.0 + 4.0)
    logits = per_logit * loss_chunk_tokens(m, plan) * m.vocab / plan.tp
    logits = logits_on * (logits + kept_logits_bytes(m, plan, n_micro))
    gathered = jnp.where(plan.zero >= 3, zero3_gathered_bytes(m, plan), 0.0)
    # MoE: the dispatch's receive buffer and the combine's send buffer of the routed token copies.
    dispatch = 0.0 if m.extra is None else jnp.where(plan.ep > 1, 2.0 * moe.dispatch_bytes(m, plan), 0.0)
    return logits + gathered + dispatch + RUNTIME_RESERVED_GiB * GiB
