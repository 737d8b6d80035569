"""How a fused attention kernel's utilisation depends on sequence length and head size.

The catalog gives each device's measured utilisation of its fused kernels (``attn_eff_*``,
``attn2_eff_*``) at the reference shape: head dimension 128, causal, sequence length about 4k
(:data:`REF_SEQ`, :data:`REF_HEAD_DIM`). Two published effects move it from there:

* **Sequence length.** Every query row of a kernel call carries a fixed cost (loading its Q block,
  rescaling and writing O and the log-sum-exp; under a causal mask also the half-masked diagonal
  blocks and the uneven work of the rows) worth the arithmetic of about ``s0`` keys, so the
  utilisation at ``s`` keys per call is ``u_inf * s / (s + s0)``. Least-squares fits of that form to
  the FlashAttention-2 forward+backward curves (Dao 2023, arXiv 2307.08691, Figs. 4 and 7, as
  printed in Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png and
  flash2_h100_fwd_bwd_benchmark.png @ 4f285b3; 16k tokens per batch, seq 512-16k) reproduce every
  point within 1.1% RMS with s0 = 484-542 causal (hdim 64 and 128, A100 and H100) and 177-200
  non-causal. Training attention is causal: :data:`S0_CAUSAL` = 520, their middle.
* **Head size.** Per score element a kernel does ``4 d`` matmul FLOPs (QK^T and PV) and one
  exponential on the much slower special-function units (H100: 989 dense TFLOP/s against 3.9
  TFLOP/s of exponentials, Shah et al. 2024, arXiv 2407.08608 §3), so the utilisation scales as
  ``4d / (4d + r)``, where ``r`` is the kernel's unhidden softmax work in matmul-FLOP units. From
  the same figures' asymptotes at hdim 64 and 128: FlashAttention-2 forward+backward loses 12%
  from 128 to 64 on both A100 (193 -> 176 TFLOP/s, causal) and H100 (333 -> 292), r = 81
  (:data:`FA2_SOFTMAX_COST`); on H100 cuDNN's forward loses 29% (559 -> 397, causal; FA3 paper
  forward figure, Dao-AILab/flash-attention assets/flash3_fp16_fwd.png @ 7ef2484), r = 353 —
  the catalog's ``attn_softmax_cost`` of Hopper-class devices, whose fastest kernel is cuDNN's.

FlashAttention-1-class kernels (``attention = "flash1"``: the FlashAttention v1 CUDA kernels and
their Triton port, Dao-AILab/flash-attention flash_attn/flash_attn_triton.py, which llm-foundry
copied as llmfoundry/models/layers/flash_attn_triton.py and ran in its 2023 benchmark tables) run
at :data:`FLASH1_VS_FA2` of the FlashAttention-2 rate at every sequence length. The same figures
(forward + backward, causal, head dimension 128, seq 4k-16k) give FlashAttention-1 / -2 = 76/173,
80/182, 83/189 on A100 and 126/294, 135/308, 137/328 on H100: 0.42-0.44, 0.43 their middle. The
figures' "Triton" curve (74/173, 78/182, 80/189 on A100) is not the port llm-foundry ran but
OpenAI's triton.ops.flash_attention of mid-2023 (the script that drew them imports it:
Dao-AILab/flash-attention @ 60499abc benchmarks/benchmark_flash_attention.py); of the port there
is only its own docstring, "Triton forward + backward is slightly slower than CUDA forward +
backward" (flash_attn_triton.py), so FlashAttention-1's ratio stands for both. Its head-size
dependence differs from FlashAttention-2's: at head dimension 64 the A100 figure gives
FlashAttention-1 97 TFLOP/s against 83 at 128 (OpenAI's Triton kernel 80 against 80), so these
kernels lose nothing at the smaller head (:data:`FA1_SOFTMAX_COST` = 0). llm-foundry's own tables
(physics check, benchmarks/foundry_tables.py) ran faster than this at 8k-64k, about 0.5 of
FlashAttention-2 per attention FLOP; no kernel measurement says so, so the ratio stays the
published one.
"""

from __future__ import annotations

import jax.numpy as jnp

S0_CAUSAL = 520.0
REF_SEQ = 4096.0
REF_HEAD_DIM = 128.0
FA2_SOFTMAX_COST = 81.0
FLASH1_VS_FA2 = 0.43
FA1_SOFTMAX_COST = 0.0


def seq_factor(keys_per_call):
    """Utilisation at ``keys_per_call`` keys per query row and kernel call, relative to the
    catalog's reference sequence length."""
    s = jnp.maximum(keys_per_call, 1.0)
    return (s / (s + S0_CAUSAL)) / (REF_SEQ / (REF_SEQ + S0_CAUSAL))


def head_dim_factor(head_dim, softmax_cost):
    """Utilisation at ``head_dim`` relative to head dimension 128 for a kernel whose unhidden
    softmax work is ``softmax_cost`` matmul FLOPs per score element."""
    d = jnp.maximum(head_dim, 1.0)
    g = 4.0 * d / (4.0 * d + softmax_cost)
    g_ref = 4.0 * REF_HEAD_DIM / (4.0 * REF_HEAD_DIM + softmax_cost)
    # Larger heads gain no more: at hdim 256 the kernels run smaller tiles (register and shared
    # memory pressure), and the same figures show 0.88 (FlashAttention-2), 0.94 (cuDNN) and 1.05
    # (FlashAttention-3) of their hdim-128 causal rate.
    return jnp.minimum(g / g_ref, 1.0)
