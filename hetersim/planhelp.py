"""Long names and help texts of the plan fields (:data:`hetersim.planfields.FIELDS`), kept apart so
that each field stays one line of the registry. Nothing here imports JAX."""

from __future__ import annotations

_EP_ALIAS = ("--expert-model-parallel-size",)
_Z3P = ("ZeRO-3 weight gathers overlap compute (FSDP prefetch, DeepSpeed >= 0.5); off: DeepSpeed <= 0.4, which "
        "gathers and reduces one parameter tensor at a time through tensor-list collectives (a copy per rank), "
        "synchronising the device before every gather (DeepSpeed PR 1188).")  # fmt: skip
_Z3P_NAME = "ZeRO-3 gathers the next weights while the current ones compute"
_GR_NAME = "dtype of the gradients on the wire (auto: the stack's)"
_GR_HELP = "Gradient reduction dtype: auto (the stack's), fp32 (DeepSpeed fp32_allreduce), model (16-bit)."
_FRAG_NAME = "share of the caching allocator's reserved HBM lost to fragmentation"
_FRAG_HELP = ("Allocator fragmentation: the share of reserved HBM that is free but unusable (0: none; 0.15 is GMLake's "
              "mean over eight LLMs on A100-80GB, Guo et al. ASPLOS'24).")  # fmt: skip
_FP8A_HELP = ("Attention in FP8 (Megatron's fp8_dot_product_attention, cuDNN's FP8 SDPA; FP8 recipes only): its "
              "backward ignores a sliding window (NVIDIA/cudnn-frontend's benchmark); off: 16-bit.")  # fmt: skip
_ETP_ALIAS = ("--expert-tensor-parallel-size",)
_EPO_NAME = "expert-parallel all-to-all overlapped with another micro-batch's compute"
_EPO_ALIAS = ("--overlap-moe-expert-parallel-comm",)
_EPO_HELP = "Megatron-Core's overlap_moe_expert_parallel_comm (1F1B all-to-all overlap); off by default as there."
_DISP_NAME = "MoE token dispatcher (alltoall: every copy over NCCL; deepep: once per node, then NVLink)"
_IMB_NAME = "routed tokens of the busiest expert-parallel rank / the mean"
_IMB_HELP = "MoE load imbalance: the busiest rank's routed tokens over the mean (1: balanced routing)."
_FUSED_NAME = "the routed experts' GEMMs run as one grouped kernel, not one cuBLAS GEMM per expert"
_FUSED_HELP = ("Routed experts in one grouped kernel (Megatron-Bridge's cutedsl_fused_grouped_mlp); off: Transformer "
               "Engine's GroupedLinear default, a cuBLAS GEMM per local expert on 4 streams.")  # fmt: skip
_LAYOUT_NAME = "an explicit pipeline layout places the layers (interleaved chunks of unequal size)"
_LAYOUT_HELP = ("Megatron-Core's pipeline_model_parallel_layout (MoE models): interleaved chunks may hold different "
                "numbers of layers, at most ceil(layers / (pp*vp)) each, so layers need not divide pp*vp.")  # fmt: skip
_DUALPIPE_NAME = "DeepSeek's bidirectional pipeline schedule (DualPipe): each rank holds two stages"
_DUALPIPE_HELP = ("DualPipe (DeepSeek-V3 report; deepseek-ai/DualPipe): micro-batches enter from both ends, bubble "
                  "(pp/2-1)(F&B+B-3W), two stages' parameters per rank, pp+1 micro-batches in flight; needs an even "
                  "pp, vp 1 and an even number of at least 2 x pp micro-batches.")  # fmt: skip
_MLA_NAME = "selective recomputation rebuilds MLA's up projections instead of the attention core"
_MLA_HELP = (
    "Selective recomputation of Megatron-Core's --recompute-modules mla_up_proj: MLA's query and key/value up "
    "projections and RoPE are recomputed in the backward and their outputs not stored (no effect without MLA)."
)
_SG_NAME = "data-parallel ranks a ZeRO / FSDP shard group spans (hybrid sharding)"
_SG_HELP = ("Hybrid sharding: ZeRO / FSDP states sharded over groups of this many adjacent data-parallel "
               "ranks, replicated across the groups (FSDP HYBRID_SHARD, FSDP2 replicate x shard); 0: all.")  # fmt: skip
_MOM_NAME = "dtype of Adam's moments (bf16: Megatron-Core's precision-aware optimizer)"
_MOM_HELP = ("Adam's moments in fp32 (default) or bf16, Megatron-Core's precision-aware optimizer (exp_avg_dtype = "
             "exp_avg_sq_dtype = bf16; the DeepSeek-V3 recipes): 2 + 2 bytes per parameter instead of 4 + 4, and "
             "in bf16 training the fp32 master weight kept as a 16-bit remainder beside the bf16 weight "
             "(store_param_remainders). A CPU optimizer keeps fp32 moments.")  # fmt: skip
