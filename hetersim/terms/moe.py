"""Mixture-of-experts layers: routing, expert GEMMs, token dispatch, on one GPU.

An MoE layer replaces the dense FFN by a router, ``n_experts`` routed experts of width
``moe_ffn_hidden`` (each token goes to ``top_k`` of them) and optional shared experts every token
goes through (DeepSeekMoE, arXiv 2401.06066; Megatron-Core ``MoELayer``). Expert parallelism
shards the routed experts over ``ep`` ranks and ``etp`` splits each expert's width (Megatron-Core
"MoE parallel folding", arXiv 2504.14960): a rank sends the tokens it holds to the ranks holding
their experts (dispatch), and the experts' outputs come back the same way (combine), an
all-to-all over the expert-parallel group each way in the forward and again in the backward
(Megatron-Core ``MoEAlltoAllTokenDispatcher``). With sequence parallelism a rank holds ``1/tp`` of
its tensor-parallel group's tokens when it enters the MoE layer, and the routed experts need no
tensor-parallel collective of their own unless ``etp`` > 1.

Load: with balanced routing (as the Megatron-Bridge benchmarks force it) every rank receives the
mean number of token copies, ``local * top_k``; ``moe_imbalance`` multiplies what the busiest rank
computes and receives, and the busiest rank paces the step.
"""

from __future__ import annotations

import jax.numpy as jnp

from .. import stacks
from ..specs import Calibration, DeviceSpec, ModelSpec, NetworkSpec, Plan
from ..types import N_LEVELS, Dispatcher, Precision
from ..units import US
from . import comm, compute, elementwise
from ._safe import safe_div
from .flops import n_mlp_matrices


def is_moe(m: ModelSpec):
    return m.moe_layers > 0


def local_tokens(plan: Plan):
    """Tokens one rank routes per micro-batch: its context-parallel share, split ``tp`` ways by
    sequence parallelism."""
    return compute.tokens(plan) / jnp.where(plan.sp > 0, plan.tp, 1.0)


def routed_tokens(m: ModelSpec, plan: Plan):
    """Token copies the busiest rank's experts process per micro-batch: ``local * top_k`` on the
    mean, gathered ``etp`` ways, times the imbalance."""
    return local_tokens(plan) * m.top_k * plan.etp * plan.moe_imbalance


def local_experts(m: ModelSpec, plan: Plan):
    return m.n_experts / plan.ep


def expert_gemm_shapes(m: ModelSpec, plan: Plan):
    """(M, N, K, present) of one local expert's forward GEMMs (up and gate fused, down); M = its
    tokens."""
    M = routed_tokens(m, plan) / jnp.maximum(local_experts(m, plan), 1.0)
    f, h = m.moe_ffn_hidden / plan.etp, m.hidden
    return [(M, (n_mlp_matrices(m) - 1.0) * f, h, 1.0), (M, h, f, 1.0)]


# Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP, ``moe_grouped_gemm``) runs its
# grouped GEMM as one cuBLAS GEMM per expert, round-robin on ``get_num_compute_streams()`` = 4
# streams (NVIDIA/TransformerEngine@d0067d0d transformer_engine/common/gemm/cublaslt_gemm.cu
# ``multi_stream_cublas_gemm``, the path ``nvte_multi_tensor_gemm`` takes unless Hopper and
# NVTE_USE_CUTLASS_GROUPED_GEMM; common/util/multi_stream.cpp ``num_compute_streams = 4``).
TE_STREAMS = 4.0


def grouped_gemms(plan: Plan):
    """True where the routed experts' GEMMs run as one grouped kernel per matrix: the plan's fused
    grouped MLP (``fused_experts``) or a stack whose experts are grouped (``experts = "grouped"``
    in catalog/stacks.toml: torch._grouped_mm, MegaBlocks' gmm)."""
    return (plan.fused_experts > 0) | (compute.stack_fact(stacks.table().grouped_experts, plan) > 0)


def expert_launches(m: ModelSpec, plan: Plan):
    """(count, kernels, concurrent) of one expert GEMM shape over the local experts: one grouped
    kernel whose tiles of every expert share the SMs (:func:`grouped_gemms`), Transformer Engine's
    default, a launch per expert with at most :data:`TE_STREAMS` of them sharing the SMs, or a
    stack's Python loop over the experts (``experts = "loop"``), a launch per expert, one at a
    time; so an expert with few output tiles leaves SMs idle (wave quantization per launch:
    :func:`hetersim.terms.tiles.wave_eff`)."""
    n = local_experts(m, plan)
    grouped = grouped_gemms(plan)
    loop = compute.stack_fact(stacks.table().expert_loop, plan) > 0
    streams = jnp.where(loop, 1.0, jnp.minimum(n, TE_STREAMS))
    return n, jnp.where(grouped, 1.0, n), jnp.where(grouped, n, streams)


def experts_fwd_s(dev: DeviceSpec, cal: Calibration, m: ModelSpec, plan: Plan):
    """The routed experts' forward: a GEMM per matrix and local expert, launched as
    :func:`expert_launches` says (each expert's weights read once, which makes small-M experts
    memory-bound)."""
    return compute.gemms_fwd_s(dev, cal, plan, expert_gemm_shapes(m, plan), *expert_launches(m, plan))


def experts_bwd_s(dev: DeviceSpec, cal: Calibration, m: ModelSpec, plan: Plan):
    """Data- and weight-gradient GEMMs per forward GEMM, launched the same way."""
    return compute.gemms_bwd_s(dev, cal, plan, expert_gemm_shapes(m, plan), *expert_launches(m, plan))


def shared_shapes(m: ModelSpec, plan: Plan):
    """The shared experts: a dense MLP of their total width, tensor-parallel like a dense FFN."""
    return compute.mlp_gemm_shapes(m, plan, width=m.shared_ffn_hidden)


# Element-wise work of the MoE block, forward, per token or token copy (16-bit elements):
# * router: the fp32 logits GEMM output and the score function, top-k and their normalisation
#   read and write ``E`` fp32 values per token about three times: 24 bytes x E, 4 kernels
#   (Megatron-Core router.py: linear, score function, topk, probs scatter; ``moe_router_dtype``
#   fp32 in the Megatron-Bridge recipes);
# * permutation: the fused permute reads a token and writes its ``top_k`` copies, the fused
#   unpermute reads the copies and the probabilities and writes the token (``moe_permute_fusion``,
#   Transformer Engine ``moe_permute``/``moe_unpermute``): 2 bytes x h x (1 + k) each, 2 kernels.
# * sort by local expert: the alltoall dispatcher receives its token copies grouped by source rank
#   and, with more than one local expert, sorts them by expert after the dispatch and back before
#   the combine (Megatron-LM megatron/core/transformer/moe/token_dispatcher.py
#   ``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` / ``combine_preprocess``:
#   ``sort_chunks_by_idxs`` when ``num_local_experts > 1``, @ d98e8a64dd): each reads and writes
#   every copy, 2 bytes x h x 2, one kernel each. The deepep (flex) dispatcher's permute after its
#   dispatch writes them expert-major in one pass (the permutation above).
ROUTER_BYTES_PER_EXPERT = 24.0
ROUTER_KERNELS = 4.0
PERMUTE_KERNELS = 2.0
SORT_KERNELS = 2.0
# The experts' second-linear bias (GPT-OSS): Transformer Engine's grouped linear returns it apart
# and Megatron-Core adds it weighted by each token's router probability, per local expert, as
# eager ops (NVIDIA/Megatron-LM@d98e8a64 megatron/core/transformer/moe/experts.py
# TEGroupedMLP._apply_bias: torch.cat of ``t + b * p`` over the experts' splits of the output,
# after a host sync for the split sizes, which is not priced). Forward per routed hidden element:
# b * p writes 2 bytes, the add reads 4 and writes 2, the cat reads and writes 2 each: 12 bytes,
# two kernels per local expert and the cat. Backward: the add passes the gradient on; the bias's
# and the probabilities' gradients each read it once (2 + 2), a reduction per expert each; the
# split's gradient concatenates the pieces (read and write 2 each): 8 bytes, 2 kernels per local
# expert and the cat.
EXPERT_BIAS_BYTES = (12.0, 8.0)


def sorts_by_expert(m: ModelSpec, plan: Plan):
    """1 where the alltoall dispatcher sorts its received copies by local expert (and back)."""
    many = (plan.ep > 1) & (local_experts(m, plan) > 1.0) & (plan.dispatcher_code != Dispatcher.DEEPEP)
    return jnp.where(many, 1.0, 0.0)


def quantize_launches(m: ModelSpec, plan: Plan):
    """Kernels that cast one expert GEMM operand (the first or second GEMM's input in the forward,
    their output gradients in the backward) to FP8 over the local experts: Transformer Engine's
    ``GroupedLinear`` splits the operand by expert and quantizes the splits one kernel each, the
    fused multi-tensor kernel being for FP8 delayed scaling only ("Currently only have fused kernel
    for FP8 delayed scaling", NVIDIA/TransformerEngine@d0067d0d
    transformer_engine/pytorch/csrc/extensions/cast.cpp ``multi_tensor_quantize_impl``; MXFP8
    and current-scaling FP8, the Megatron-Bridge recipes', take that path; NVFP4 has its fused
    split kernel, ``FUSED_NVFP4``); one kernel in the fused grouped MLP (``tex.group_quantize``)
    and none in 16-bit runs. ``fp8`` is taken as current scaling, the Megatron-Bridge performance
    recipes' ``fp8_cs`` (under delayed scaling Transformer Engine would fuse the casts: one kernel)."""
    per_expert = compute.low_precision(plan) & (plan.precision_code != Precision.NVFP4) & ~grouped_gemms(plan)
    n = jnp.where(per_expert, jnp.maximum(local_experts(m, plan), 1.0), 1.0)
    return jnp.where(compute.low_precision(plan), n, 0.0)


# FP8 with current scaling casts a tensor in three kernels, its amax, the scale from it and the
# cast, reading the tensor twice (NVIDIA/TransformerEngine@d0067d0d
# transformer_engine/pytorch/csrc/quantizer.cpp ``Float8CurrentScalingQuantizer::quantize_impl``:
# ``nvte_compute_amax_with_config``, ``nvte_compute_scale_from_amax``, ``nvte_quantize_v2``); the
# block-scaled formats compute their scales inside the one cast kernel.
CURRENT_SCALING_KERNELS = 3.0


def cast_kernels(plan: Plan):
    """Kernels of one cast of an expert operand split: 3 in FP8 (current scaling), else 1."""
    return jnp.where(plan.precision_code == Precision.FP8, CURRENT_SCALING_KERNELS, 1.0)


def block_elementwise_fwd_s(dev: DeviceSpec, cal: Calibration, m: ModelSpec, plan: Plan):
    """Router, permutation (and the alltoall dispatcher's sorts by local expert), the experts'
    activation function and FP8 casts of their inputs, and the shared experts' activation
    function, on the busiest rank."""
    e = compute.act_bytes(plan) / 2.0
    local, routed = local_tokens(plan), routed_tokens(m, plan)
    h, f = m.hidden, m.moe_ffn_hidden / plan.etp
    router = local * m.n_experts * ROUTER_BYTES_PER_EXPERT
    permute = 2.0 * 2.0 * e * h * (local + local * m.top_k * plan.moe_imbalance)
    act = e * routed * elementwise.act_fn_bytes(m, plan) * f
    shared = e * compute.tokens(plan) * elementwise.act_fn_bytes(m, plan) * m.shared_ffn_hidden / plan.tp
    fp8 = jnp.where(compute.low_precision(plan), 3.0 * routed * (h + f), 0.0)
    fp8 = fp8 + jnp.where(plan.precision_code == Precision.FP8, 2.0 * routed * (h + f), 0.0)  # the amax pass
    sort = sorts_by_expert(m, plan)
    sort_bytes = sort * 2.0 * 2.0 * e * h * local * m.top_k * plan.moe_imbalance
    kernels = ROUTER_KERNELS + PERMUTE_KERNELS + 2.0 + jnp.where(m.shared_ffn_hidden > 0, 1.0, 0.0)
    kernels = kernels + sort * SORT_KERNELS
    # The two operands' FP8 casts beyond one kernel each (the backward, twice this block, casts
    # the two output gradients the same way).
    kernels = kernels + 2.0 * (quantize_launches(m, plan) * cast_kernels(plan) - 1.0) * compute.low_precision(plan)
    return compute.stream_s(dev, cal, router + permute + act + shared + fp8 + sort_bytes, kernels)


def moe_act_fn_s(dev: DeviceSpec, cal: Calibration, m: ModelSpec, plan: Plan):
    """The routed and shared experts' activation functions alone (recomputed under selective
    recomputation: Megatron's ``moe_act`` recompute module), with their input clamps."""
    e = compute.act_bytes(plan) / 2.0
    width = routed_tokens(m, plan) * m.moe_ffn_hidden / plan.etp + compute.tokens(plan) * m.shared_ffn_hidden / plan.tp
    act = compute.stream_s(dev, cal, e * elementwise.act_fn_bytes(m, plan) * width, 2.0)
    return act + _clamps_s(dev, cal, m, plan, False, _fused_mlp(plan))


def _fused_mlp(plan: Plan):
    """1.0 where the routed experts run as one fused grouped MLP kernel (``fused_experts``)."""
    return jnp.where(plan.fused_experts > 0, 1.0, 0.0)


def _clamps_s(dev: DeviceSpec, cal: Calibration, m: ModelSpec, plan: Plan, backward: bool, fused):
    """The routed experts' input clamps (none where one fused grouped MLP takes them in: ``fused``)
    and the shared experts' (:func:`hetersim.terms.elementwise.clamp_s`), one pass."""
    routed = elementwise.clamp_s(
        dev, cal, m, plan, routed_tokens(m, plan) * m.moe_ffn_hidden / plan.etp, backward, fused
    )
    shared = elementwise.clamp_s(dev, cal, m, plan, compute.tokens(plan) * m.shared_ffn_hidden / plan.tp, backward)
    return routed + jnp.where(m.shared_ffn_hidden > 0, shared, 0.0)


def experts_extras_s(dev: DeviceSpec, cal: Calibration, m: ModelSpec, plan: Plan, backward: bool):
    """One pass of the experts' point-wise extras a stack runs apart: the input clamps and the
    second linear's bias (:data:`EXPERT_BIAS_BYTES`); none under a compiling stack, and none of the
    routed experts' where one fused grouped MLP kernel runs them."""
    fused = _fused_mlp(plan)
    share = m.expert_bias * (1.0 - elementwise.compiled(plan)) * (1.0 - fused)
    nbytes = share * compute.act_bytes(plan) / 2.0 * routed_tokens(m, plan) * m.hidden * EXPERT_BIAS_BYTES[backward]
    bias = compute.stream_s(dev, cal, nbytes, share * (2.0 * local_experts(m, plan) + 1.0))
    return bias + _clamps_s(dev, cal, m, plan, backward, fused)


def dispatch_bytes(m: ModelSpec, plan: Plan):
    """Bytes the busiest rank receives in one dispatch (or sends in one combine): its token copies,
    16-bit (fp32 runs: 32-bit) hidden vectors."""
    return local_tokens(plan) * m.top_k * plan.moe_imbalance * m.hidden * compute.act_bytes(plan)


def reachable_nodes(m: ModelSpec, nodes):
    """Nodes a token's experts may sit on: all ``nodes``, or under group-limited routing the
    nodes of the ``route_group_topk`` groups it picks (the groups are contiguous experts, laid
    over the EP ranks in order). A group spanning ``N/G`` nodes gives ``M N / G`` of them; groups
    no wider than a node give at most ``M`` (Megatron-Core ``group_limited_topk``: "node-limited
    routing: set moe_router_num_groups equal to number of nodes in EP group", DeepSeek-V3 report
    arXiv 2412.19437 §2.1.2 "each token will be sent to at most M nodes", M = 4; with more groups
    than nodes, two picked groups may share a node, and ``M`` is the bound)."""
    n = jnp.maximum(nodes, 1.0)
    g, top = jnp.maximum(m.route_groups, 1.0), m.route_group_topk
    limit = jnp.minimum(n, top * jnp.maximum(n / g, 1.0))  # >= 1: a limit has route_group_topk >= 1
    return jnp.where(m.route_groups > 0, limit, n)


def remote_nodes_per_token(m: ModelSpec, nodes):
    """Expected nodes other than its own that a token's ``top_k`` experts sit on, experts spread
    evenly over ``nodes`` and routing uniform (balanced; Megatron's forced balancing draws random
    logits before the group-limited top-k, megatron/core/transformer/moe/router.py @ d98e8a64):
    the copies land uniformly on the ``L`` :func:`reachable_nodes`, one of which is the token's own
    with probability ``L / N``: ``(N - 1) / N * L * (1 - (1 - 1/L)^k)``; without a group limit
    ``(N - 1) * (1 - (1 - 1/N)^k)``."""
    n = jnp.maximum(nodes, 1.0)
    reach = reachable_nodes(m, n)
    return (n - 1.0) / n * reach * (1.0 - (1.0 - 1.0 / reach) ** m.top_k)


def hierarchical_a2a_s(net: NetworkSpec, m: ModelSpec, plan: Plan):
    """One dispatch (or combine) of the deepep dispatcher: a token crosses the scale-out network
    once per remote node its experts sit on (:func:`remote_nodes_per_token`, not once per copy)
    and fans out to its experts' GPUs over the scale-up fabric there, which carries every copy
    that leaves its GPU (DeepEP's internode dispatch: RDMA to one GPU per node, NVLink forwarding,
    deepseek-ai/DeepEP README). The two move concurrently; the slower sets the time."""
    inside = comm.ranks_per_level(net, plan.ep, plan.etp)[0]  # EP ranks per scale-up domain
    nodes = safe_div(plan.ep, inside, 1.0)
    per_token = local_tokens(plan) * plan.moe_imbalance * m.hidden * compute.act_bytes(plan)
    out_bw, in_bw = comm.bus_bw(net, N_LEVELS - 1), comm.bus_bw(net, 0)
    t_out = safe_div(per_token * remote_nodes_per_token(m, nodes), out_bw)
    t_in = safe_div(per_token * m.top_k * (1.0 - safe_div(1.0, plan.ep, 1.0)), in_bw)
    lat = jnp.where(nodes > 1.0, net.latency_us[-1], net.latency_us[0]) * US
    return jnp.maximum(t_out, t_in) + lat


def ep_comm_s(net: NetworkSpec, m: ModelSpec, plan: Plan):
    """One pass's dispatch and combine (two all-to-alls over the ``ep`` ranks, stride ``etp``:
    Megatron-Core orders expert ranks etp-ep-edp-pp; hierarchical under the deepep dispatcher)
    and, with ``etp`` > 1, the all-gather and reduce-scatter of the routed tokens inside the
    expert's tensor-parallel group."""
    flat = comm.all_to_all_s(net, plan.ep, plan.etp, dispatch_bytes(m, plan))
    a2a = 2.0 * jnp.where(plan.dispatcher_code == Dispatcher.DEEPEP, hierarchical_a2a_s(net, m, plan), flat)
    etp_bytes = dispatch_bytes(m, plan) * plan.etp
    etp = 2.0 * comm.all_gather_s(net, plan.etp, jnp.ones_like(plan.etp), etp_bytes)
    return jnp.where(plan.ep > 1, a2a, 0.0) + jnp.where(plan.etp > 1, etp, 0.0)


# Streaming multiprocessors the flex dispatcher's dispatch and combine kernels hold while they run:
# DeepEP's default, 20 (Megatron-LM megatron/core/transformer/transformer_config.py
# ``moe_deepep_num_sms``, "historical default 20", @ d98e8a64dd; DeepSeek-V3 report arXiv
# 2412.19437 §3.5.1: "20 out of the 132 SMs available in the H800 GPU" for its all-to-all).
# Megatron-Bridge's performance scripts give HybridEP 32 (scripts/performance/utils/overrides.py
# ``moe_hybridep_num_sms = 32`` @ v0.5.1 5cb3444c43f7); 20 is the lower of the two.
DISPATCH_SMS = 20.0


def comm_sm_share(dev: DeviceSpec, plan: Plan):
    """Share of the SMs the deepep dispatcher's kernels take from the compute they overlap (its
    kernels are persistent CUDA blocks, one per SM, that copy tokens over NVLink and RDMA); the
    plain alltoall dispatcher's NCCL kernels are not counted (no sourced figure)."""
    share = safe_div(DISPATCH_SMS, dev.sm_count, 0.0)
    return jnp.where(plan.dispatcher_code == Dispatcher.DEEPEP, jnp.minimum(share, 0.5), 0.0)


def overlapped_ep_s(dev: DeviceSpec, plan: Plan, ep_pass, compute_s):
    """Exposed time of one pass's dispatch and combine hidden under ``compute_s`` of another
    micro-batch's other pass (Megatron-Core's ``overlap_moe_expert_parallel_comm``): what the
    compute cannot cover, plus the compute slowed while the dispatcher holds its SMs: over the
    ``min(ep_pass, compute_s)`` they run together the compute has ``1 - share`` of the SMs, so it
    takes ``share * min(ep_pass, compute_s)`` longer."""
    share = comm_sm_share(dev, plan)
    return jnp.maximum(ep_pass - compute_s, 0.0) + share * jnp.minimum(ep_pass, compute_s)
