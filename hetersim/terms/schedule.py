"""DeepSeek's DualPipe pipeline schedule (the plan field ``dualpipe``): its rules, its bubble and
the stages a rank holds. DualPipe (DeepSeek-V3 report, arXiv 2412.19437, §3.2.1;
deepseek-ai/DualPipe) feeds micro-batches from both ends of the pipeline: rank ``i`` runs stage
``i`` for one direction and stage ``pp - 1 - i`` for the other, and overlaps a forward and a
backward chunk's computation with each other's communication. Its README compares it with 1F1B:

| Method   | Bubble              | Parameter | Activation |
| 1F1B     | (PP-1)(F+B)         | 1x        | PP         |
| DualPipe | (PP/2-1)(F&B+B-3W)  | 2x        | PP+1       |

(deepseek-ai/DualPipe @ 89f5de17 README.md). The model prices a DualPipe plan's steady state as
1F1B's (every rank runs each micro-batch through one stage), its fill and drain by the table,
its states and in-flight activations by the table (:mod:`hetersim.terms.memory`), and its
gradient reductions for both stages a rank holds (:func:`hetersim.simulate.dp_comm_s`).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..specs import Plan
from ._safe import not_multiple, safe_div


def dualpipe_stages(plan: Plan):
    """Pipeline stages one rank holds: 2 under DualPipe, which runs stage ``i`` and stage
    ``pp - 1 - i`` on rank ``i``, one per direction ("Parameter 2x", deepseek-ai/DualPipe @
    89f5de17 README), else 1."""
    return jnp.where((plan.dualpipe > 0) & (plan.pp > 1), 2.0, 1.0)


def dualpipe_bad(plan: Plan, n_micro) -> Any:
    """DualPipe needs an even number of pipeline ranks, no interleaving and an even number of at
    least twice as many micro-batches (deepseek-ai/DualPipe @ 030ce432 dualpipe/dualpipe.py
    ``DualPipe.step``: ``assert num_ranks % 2 == 0``, ``num_chunks % 2 == 0 and num_chunks >=
    num_ranks * 2``; its ranks each run one stage of each direction, not interleaved chunks)."""
    odd = not_multiple(plan.pp, 2.0) | not_multiple(n_micro, 2.0)
    return (plan.dualpipe > 0) & ((plan.pp < 2) | odd | (plan.vp > 1) | (n_micro < 2.0 * plan.pp))


def dualpipe_bubble_share(plan: Plan, t) -> Any:
    """DualPipe's fill and drain against 1F1B's: (pp/2 - 1)(F&B + B - 3W) over (pp - 1)(F + B)
    (DeepSeek-V3 report, arXiv 2412.19437, §3.2.1 Table 2; deepseek-ai/DualPipe @ 89f5de17
    README), F and B the forward and the whole backward of a stage's micro-batch. F&B, a forward
    and a backward chunk run as one overlapped pair, is taken as F + B: what the pair hides is
    communication, which the plan's ``ep_overlap`` prices. W, the weights' gradients, is taken as
    half of the backward less its recomputed forward: each GEMM's backward is two GEMMs of its
    forward's FLOPs, one for the input's gradient and one for the weight's (Qi et al. 2024, Zero
    Bubble Pipeline Parallelism, arXiv 2401.10241, §2, take the two as equal); the attention
    kernel's backward, which has no weight gradient, is counted in that half too, so W is a
    little high and the bubble a little small."""
    f, b = t["fwd_s"], t["bwd_s"]
    w = 0.5 * jnp.maximum(b - t["recompute_s"], 0.0)
    ranks = safe_div(plan.pp / 2.0 - 1.0, plan.pp - 1.0, 0.0)
    return ranks * safe_div(f + 2.0 * b - 3.0 * w, f + b, 1.0)
