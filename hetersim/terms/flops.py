"""Parameter counts and FLOP counts of a decoder-only transformer.

Notation (Narayanan et al. SC'21; Korthikanti et al. 2022): L layers, h hidden, a heads, g KV heads,
f FFN hidden, V vocabulary, s sequence; d the head width, q = a*d the query (and attention output)
width and k = g*d the key/value width. The papers take d = h/a (q = h); models that do not (Gemma:
d = 256 with h = 3072, a = 16) size the attention projections by q and k instead.
A GEMM of shapes (M, K) x (K, N) costs 2*M*N*K FLOPs.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..specs import ModelSpec


def n_mlp_matrices(m: ModelSpec):
    """3 for SwiGLU (gate, up, down), 2 for a plain MLP."""
    return 2.0 + m.gated


def q_width(m: ModelSpec):
    """Query (and attention output) width a*d: ``hidden`` unless the head width says otherwise."""
    return m.heads * m.head_dim


def kv_width(m: ModelSpec):
    """Key (and value) width g*d."""
    return m.kv_heads * m.head_dim


def is_mla(m: ModelSpec):
    """1.0 for multi-head latent attention (DeepSeek-V2/V3, Kimi-K2), else 0.0."""
    return jnp.where(m.kv_lora_rank > 0, 1.0, 0.0)


def qk_head_dim(m: ModelSpec):
    """Width of one query/key head in the score product: head_dim, plus MLA's decoupled rotary part."""
    return m.head_dim + m.rope_head_dim


def attn_params(m: ModelSpec):
    """Attention projections of one layer.

    Ordinary attention: QKV and output, ``h*(q + 2k) + q*h`` (``h*h*(2 + 2g/a)`` when q = h).
    MLA (DeepSeek-V2, arXiv 2405.04434 §2.1; Megatron-Core ``MLASelfAttention``): the query down
    projection ``h*r_q`` and up projection ``r_q*a*(d + d_r)`` (one ``h*a*(d + d_r)`` matrix when
    ``r_q`` = 0), the joint key/value down projection with the shared rotary key ``h*(r_kv + d_r)``,
    its up projection ``r_kv*a*(d + d_v)`` and the output ``a*d_v*h`` (DeepSeek-V3: 187M per layer).
    """
    std = m.hidden * (2.0 * q_width(m) + 2.0 * kv_width(m))
    h, a, d_qk = m.hidden, m.heads, qk_head_dim(m)
    q = jnp.where(m.q_lora_rank > 0, h * m.q_lora_rank + m.q_lora_rank * a * d_qk, h * a * d_qk)
    kv = h * (m.kv_lora_rank + m.rope_head_dim) + m.kv_lora_rank * a * (m.head_dim + m.v_head_dim)
    mla = q + kv + a * m.v_head_dim * h
    return jnp.where(is_mla(m) > 0, mla, std)


def dense_mlp_params(m: ModelSpec):
    return n_mlp_matrices(m) * m.hidden * m.ffn_hidden


def expert_params(m: ModelSpec):
    """Routed experts of one MoE layer (all of them)."""
    return m.n_experts * n_mlp_matrices(m) * m.hidden * m.moe_ffn_hidden


def moe_block_params(m: ModelSpec):
    """An MoE layer's FFN block: routed and shared experts and the router (``E*h``)."""
    return expert_params(m) + n_mlp_matrices(m) * m.hidden * m.shared_ffn_hidden + m.n_experts * m.hidden


def dense_layers(m: ModelSpec):
    return m.layers - m.moe_layers


def layer_params(m: ModelSpec):
    """Weights of one dense layer: attention, MLP, and two norms (biases ignored)."""
    return attn_params(m) + dense_mlp_params(m) + 2.0 * m.hidden


def moe_layer_params(m: ModelSpec):
    """Weights of one MoE layer: attention, the MoE block and two norms."""
    return attn_params(m) + moe_block_params(m) + 2.0 * m.hidden


def embedding_params(m: ModelSpec):
    """Input embedding plus the LM head (one matrix when tied) and the final norm."""
    return m.vocab * m.hidden * (2.0 - m.tied_embeddings) + m.hidden


def total_params(m: ModelSpec):
    """Parameters of the model as its card counts them: multi-token-prediction modules excluded
    (DeepSeek-V3's 671B; its 14B MTP module is the difference to the 685B checkpoint)."""
    return dense_layers(m) * layer_params(m) + m.moe_layers * moe_layer_params(m) + embedding_params(m)


def active_mlp_params(m: ModelSpec):
    """FFN weights one token passes through in an MoE layer: top-k routed and the shared experts."""
    return n_mlp_matrices(m) * m.hidden * (m.top_k * m.moe_ffn_hidden + m.shared_ffn_hidden)


def active_params(m: ModelSpec):
    """Parameters one token passes through (the model cards' "active": embeddings included)."""
    moe = attn_params(m) + active_mlp_params(m) + m.n_experts * m.hidden + 2.0 * m.hidden
    return dense_layers(m) * layer_params(m) + m.moe_layers * moe + embedding_params(m)


def window_keys(m: ModelSpec, seq_len):
    """Keys a query of a windowed layer attends to, as a share of a causal full-length layer's
    ``s/2``: at most ``swa_window`` (1 where the model has no window)."""
    return jnp.where(m.swa_window > 0, jnp.minimum(2.0 * m.swa_window / seq_len, 1.0), 1.0)


def attention_keys(m: ModelSpec, seq_len):
    """Mean keys a query attends to over the layers, as a share of a causal full-length layer's
    ``s/2``: windowed layers (``swa_share`` of them) see at most ``swa_window`` keys."""
    return 1.0 - m.swa_share + m.swa_share * window_keys(m, seq_len)


def core_width(m: ModelSpec):
    """Per-key width of the score and value products summed over heads: ``a*(d_qk + d_v)`` (2q for
    ordinary attention)."""
    return m.heads * (qk_head_dim(m) + m.v_head_dim)


def model_flops_per_token(m: ModelSpec, seq_len):
    """Training FLOPs per token, forward + backward, causal attention, no recomputation.

    The NeMo / Megatron-Bridge "model TFLOP/s" accounting for LLaMA (GQA, SwiGLU):
    ``L*h^2*(12 + 12*g/a + 18*f/h + 6*s/h) + 6*V*h`` (18 becomes 12 for a two-matrix MLP). It
    reproduces MLPerf's 421.59 TFLOP per 8192-token sample of Llama 3.1 8B. This is what
    ``hetersim`` calls MFU. With a head width other than h/a the projections count
    ``6*attn_params`` and the attention core ``3*s*a*(d_qk + d_v)``. MoE layers count the
    FFN weights a token passes through (top-k routed and shared experts) and the router, as
    Megatron-LM's ``num_floating_point_operations`` does; sliding-window layers their window;
    each multi-token-prediction module one more MoE layer and LM head.
    """
    h, s = m.hidden, seq_len
    core = 3.0 * s * core_width(m) * attention_keys(m, s)
    attn = 6.0 * attn_params(m) + core
    dense = attn + 6.0 * dense_mlp_params(m)
    moe = attn + 6.0 * (active_mlp_params(m) + m.n_experts * h)
    mtp_layer = jnp.where(m.moe_layers > 0, moe, dense) + 6.0 * 2.0 * h * h  # + the 2h -> h projection
    layers = dense_layers(m) * dense + m.moe_layers * moe + m.mtp_layers * mtp_layer
    return layers + 6.0 * m.vocab * h * (1.0 + m.mtp_layers)


def megatron_flops_per_token(m: ModelSpec, seq_len, full_recompute):
    """Megatron-LM's accounting (Narayanan et al. SC'21, eq. 3, generalised to GQA/SwiGLU).

    Non-causal attention (``12*s*h`` per layer and token, fwd+bwd) as Megatron-LM's training loop
    prints it; with full recomputation every layer's forward is counted twice (factor 96 instead
    of 72 in eq. 3), the logit layer is not recomputed.
    """
    h, f, s = m.hidden, m.ffn_hidden, seq_len
    per_layer_fwd = 2.0 * (attn_params(m) + n_mlp_matrices(m) * h * f) + 4.0 * s * q_width(m)
    layer_factor = 3.0 + jnp.asarray(full_recompute, jnp.float32)
    return m.layers * layer_factor * per_layer_fwd + 6.0 * m.vocab * h
