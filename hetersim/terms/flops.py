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


def attn_params(m: ModelSpec):
    """QKV and output projections: h*(q + 2k) + q*h (h*h*(2 + 2g/a) when q = h)."""
    return m.hidden * (2.0 * q_width(m) + 2.0 * kv_width(m))


def layer_params(m: ModelSpec):
    """Weights of one layer: QKV, output projection, MLP, and two norms (biases ignored)."""
    h, f = m.hidden, m.ffn_hidden
    mlp = n_mlp_matrices(m) * h * f
    return attn_params(m) + mlp + 2.0 * h


def embedding_params(m: ModelSpec):
    """Input embedding plus the LM head (one matrix when tied) and the final norm."""
    return m.vocab * m.hidden * (2.0 - m.tied_embeddings) + m.hidden


def total_params(m: ModelSpec):
    return m.layers * layer_params(m) + embedding_params(m)


def model_flops_per_token(m: ModelSpec, seq_len):
    """Training FLOPs per token, forward + backward, causal attention, no recomputation.

    The NeMo / Megatron-Bridge "model TFLOP/s" accounting for LLaMA (GQA, SwiGLU):
    ``L*h^2*(12 + 12*g/a + 18*f/h + 6*s/h) + 6*V*h`` (18 becomes 12 for a two-matrix MLP). It
    reproduces MLPerf's 421.59 TFLOP per 8192-token sample of Llama 3.1 8B. This is what
    ``hetersim`` calls MFU. With a head width other than h/a the projections count
    ``6*attn_params`` and the attention core ``6*s*q``.
    """
    h, f, s = m.hidden, m.ffn_hidden, seq_len
    per_layer = 6.0 * attn_params(m) + 6.0 * n_mlp_matrices(m) * h * f + 6.0 * s * q_width(m)
    return m.layers * per_layer + 6.0 * m.vocab * h


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
