"""The three inputs of the cost model, plus its calibration constants.

``ModelSpec`` (what is trained), ``SystemSpec`` (the hardware), ``Plan`` (how it is laid out and
trained; its fields are declared once, in :mod:`hetersim.planfields`) and ``Calibration``
(global efficiency constants fitted by ``hetersim calibrate``).
Every field is a leaf: a scalar for one configuration, an array with a leading batch axis under
``jax.vmap``. Counts are stored as floats (parameter, byte and FLOP counts overflow int32);
discrete choices are ``*_code`` int32 leaves whose meanings live in :mod:`hetersim.types`.
Fixed-size arrays hold the memory tiers (``N_TIERS``), network levels (``N_LEVELS``) and the
precisions (``PRECISION`` order), so that every configuration of a study has the same shapes.
"""

from __future__ import annotations

from typing import Any

from ..pytree import spec
from .plan import Plan, plan_spec


@spec
class ModelSpec:
    """A decoder-only transformer (LLaMA/GPT family)."""

    layers: Any
    hidden: Any
    heads: Any
    kv_heads: Any  # < heads: grouped-query attention
    head_dim: Any  # width of one attention head; hidden / heads except where a model says (Gemma: 256)
    ffn_hidden: Any
    vocab: Any
    gated: Any  # 1: SwiGLU (three MLP matrices, LLaMA); 0: plain two-matrix MLP (GPT)
    dropout: Any  # 1: the model trains with dropout (GPT-3, Megatron GPT); 0: LLaMA
    rope: Any  # 1: rotary position embedding applied to q and k
    tied_embeddings: Any  # 1: the LM head shares the input embedding matrix
    # Mixture of experts, latent attention, multi-token prediction, sliding windows: None for a
    # LLaMA-style dense model, whose traced graph then has none of their terms (read through the
    # properties below, which give a dense model's values).
    extra: Any = None

    def _x(self, name: str, dense: Any = 0.0) -> Any:
        return dense if self.extra is None else getattr(self.extra, name)

    n_experts = property(lambda self: self._x("n_experts"))
    top_k = property(lambda self: self._x("top_k"))
    moe_ffn_hidden = property(lambda self: self._x("moe_ffn_hidden"))
    shared_ffn_hidden = property(lambda self: self._x("shared_ffn_hidden"))
    moe_layers = property(lambda self: self._x("moe_layers"))
    moe_every = property(lambda self: self._x("moe_every", 1.0))
    q_lora_rank = property(lambda self: self._x("q_lora_rank"))
    kv_lora_rank = property(lambda self: self._x("kv_lora_rank"))
    rope_head_dim = property(lambda self: self._x("rope_head_dim"))
    v_head_dim = property(lambda self: self._x("v_head_dim", self.head_dim))
    mtp_layers = property(lambda self: self._x("mtp_layers"))
    swa_window = property(lambda self: self._x("swa_window"))
    swa_share = property(lambda self: self._x("swa_share"))
    glu_clamp = property(lambda self: self._x("glu_clamp"))
    expert_bias = property(lambda self: self._x("expert_bias"))
    rope_scaled = property(lambda self: self._x("rope_scaled"))
    route_groups = property(lambda self: self._x("route_groups"))
    route_group_topk = property(lambda self: self._x("route_group_topk"))


@spec
class ModelExtra:
    """What a model has beyond a LLaMA-style dense transformer (:attr:`ModelSpec.extra`).

    ``ffn_hidden`` of the ModelSpec is the dense layers' FFN.
    """

    # Mixture of experts (0 experts: none).
    n_experts: Any  # routed experts per MoE layer
    top_k: Any  # routed experts each token goes to
    moe_ffn_hidden: Any  # FFN width of one routed expert
    shared_ffn_hidden: Any  # total FFN width of the shared experts every token also goes through
    moe_layers: Any  # layers whose FFN is the MoE block (the rest are dense)
    moe_every: Any  # 1: MoE layers are contiguous (after any leading dense ones); 2: every other layer
    # Multi-head latent attention (DeepSeek MLA; kv_lora_rank 0 = ordinary attention). ``head_dim``
    # is then the non-rotary query/key head width (qk_nope_head_dim).
    q_lora_rank: Any  # query compression rank (0: queries projected directly)
    kv_lora_rank: Any  # joint key/value compression rank
    rope_head_dim: Any  # rotary part of each query/key head (decoupled RoPE; 0 for ordinary attention)
    v_head_dim: Any  # value head width (head_dim for ordinary attention)
    mtp_layers: Any  # multi-token-prediction modules (DeepSeek-V3: 1), each one more layer and LM head
    swa_window: Any  # sliding-window attention width in tokens (0: none)
    swa_share: Any  # share of the layers whose attention is windowed (GPT-OSS: every other layer)
    # Point-wise extras that a stack without a fusing compiler runs as eager ops (GPT-OSS has all
    # three; hetersim.terms.compute): 1 where the model has them, else 0.
    glu_clamp: Any  # the gated FFN's two inputs are clamped before the activation (swiglu_limit)
    expert_bias: Any  # the routed experts' second linear adds a bias
    rope_scaled: Any  # the rotary embedding carries an attention scale (YaRN's mscale != 1)
    # Group-limited routing (DeepSeek's device- and node-limited routing; 0: none): the routed
    # experts form ``route_groups`` contiguous groups and a token picks its experts from
    # ``route_group_topk`` of them (Megatron-Core ``moe_router_num_groups`` / ``moe_router_group_topk``).
    route_groups: Any
    route_group_topk: Any


@spec
class DeviceSpec:
    """One accelerator kind."""

    peak_tflops: Any  # [4] dense peak per precision (PRECISION order); 0 = unsupported
    gemm_eff: Any  # [4] measured best-case matmul throughput / dense peak
    attn_eff_fwd: Any  # flash-attention forward throughput / bf16 dense peak
    attn_eff_bwd: Any  # flash-attention backward throughput / bf16 dense peak
    sm_count: Any  # streaming multiprocessors (compute units); 0 = no wave quantization
    attn2_eff_fwd: Any  # FlashAttention-2-class kernel forward throughput / bf16 dense peak
    attn2_eff_bwd: Any  # FlashAttention-2-class kernel backward throughput / bf16 dense peak
    attn_softmax_cost: Any  # the fastest fused kernel's head-size sensitivity (compute.head_dim_factor)
    hbm_capacity_GiB: Any
    hbm_bw_GBps: Any
    tdp_W: Any
    price_usd_per_hour: Any


@spec
class NetworkSpec:
    """Network levels, innermost first (scale-up domain, intermediate, scale-out).

    ``domain_gpus[l]`` GPUs share level ``l`` (8 for an HGX node, 72 for NVL72, everything for the
    scale-out fabric). ``bw_GBps`` is per GPU and per direction; ``busbw_eff`` the measured
    fraction of it that NCCL collectives reach; ``latency_us`` the per-step latency of NCCL's
    Simple protocol and ``ll_latency_us`` / ``ll128_latency_us`` of its low-latency protocols
    (equal to ``latency_us`` where a link has none). ``gpus_per_nic``: the GPUs whose scale-out
    traffic shares one NIC (a node's GPUs over its NICs; 1 where each GPU has its own): the
    outermost ``bw_GBps`` is that NIC's share per GPU, which a flow gets whole only when every
    one of those GPUs sends at once (:func:`hetersim.terms.comm.nic_gain`).
    """

    domain_gpus: Any  # [N_LEVELS]
    bw_GBps: Any  # [N_LEVELS]
    busbw_eff: Any  # [N_LEVELS]
    latency_us: Any  # [N_LEVELS]
    ll_latency_us: Any  # [N_LEVELS]
    ll128_latency_us: Any  # [N_LEVELS]
    gpus_per_nic: Any  # scalar


@spec
class HostSpec:
    """The host side of a node, and the memory tiers beyond HBM (TIER order, index 0 unused).

    A GPU reaches a tier over a path of three parts (built by :mod:`hetersim.tiers`, priced by
    :mod:`hetersim.terms.offload`): its own link (``tier_path_GBps``), the part the node's GPUs
    share (``tier_node_GBps``: host root ports, host DRAM, the node's CXL expanders or its port
    into a CXL switch) and the part the hosts of a CXL pool share (``tier_shared_GBps``, divided
    among ``tier_hosts``). Bandwidths are read bandwidths, per direction; writes reach
    ``tier_write_eff`` of the devices' part.
    """

    gpus_per_node: Any
    tier_present: Any  # [N_TIERS] 1 where the node has the tier
    tier_capacity_GiB: Any  # [N_TIERS] the tier's devices (a pool: the whole pool, split among tier_hosts)
    tier_path_GBps: Any  # [N_TIERS] per GPU: the GPU's own link toward the tier, per direction
    tier_latency_ns: Any  # [N_TIERS] load-to-use latency (device plus switch hops)
    cpu_adam_Gparams_per_s: Any  # host CPU Adam update throughput (whole node, local DRAM)
    tier_node_GBps: Any  # [N_TIERS] per node: the part of the path all GPUs of the node share
    tier_shared_GBps: Any  # [N_TIERS] the part all hosts of a pool share; 0 = nothing shared
    tier_hosts: Any  # [N_TIERS] hosts that share the tier (1 = private to the node)
    tier_write_eff: Any  # [N_TIERS] write / read bandwidth of the tier's devices
    tier_cpu_GBps: Any  # [N_TIERS] per node: host CPU <-> tier bandwidth before pool sharing
    # Goodput (hetersim.reliability builds them, hetersim.terms.goodput prices them):
    interrupts_per_Mgpuh: Any  # job interruptions per 1e6 GPU-hours (all causes)
    restart_s: Any  # per interruption: detection and rescheduling, before the checkpoint loads
    nvme_GBps: Any  # per node: local NVMe write bandwidth
    nvme_capacity_GiB: Any  # per node: local NVMe capacity
    pfs_GBps: Any  # the parallel file system's sustained bandwidth, shared by the whole job
    straggler_node_frac: Any  # fraction of nodes running degraded at any time
    straggler_slowdown: Any  # a degraded node's extra step time, as a fraction (0.1 = 10% slower)


@spec
class SystemSpec:
    device: DeviceSpec
    network: NetworkSpec
    host: HostSpec


@spec
class Calibration:
    """Global efficiency constants: same for every device, model and layout.

    Initial values come from measurements (see ``catalog/calibration.toml``); ``hetersim
    calibrate`` refines them by gradient descent on the published runs and stores the result with
    its date and data.
    """

    kernel_overhead_us: Any  # fixed time per kernel launch (launch + tail)
    mem_bw_eff: Any  # fraction of HBM bandwidth reached by element-wise kernels
    tp_overlap: Any  # fraction of tensor-parallel communication hidden behind GEMMs
    dp_overlap: Any  # fraction of the backward/forward window usable to hide DP/FSDP traffic
    pp_overlap: Any  # fraction of pipeline point-to-point traffic hidden
    gemm_shape_eff: Any  # training-shaped GEMMs' rate / the best-case (MAMF) rate
    fp8_scaling_eff: Any  # FP8 GEMMs with per-tensor scaling: further fraction of the FP8 rate


__all__ = [
    "Calibration",
    "DeviceSpec",
    "HostSpec",
    "ModelExtra",
    "ModelSpec",
    "NetworkSpec",
    "Plan",
    "SystemSpec",
    "plan_spec",
]
