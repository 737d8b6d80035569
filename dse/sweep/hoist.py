"""Layer costs once per distinct set of the columns they read, not once per configuration.

The per-layer costs (:func:`hetersim.simulate.plan_layer_costs`: GEMMs, attention, element-wise
work, the MoE block, exposed TP/CP/EP traffic) are most of a chunk's work, and they read few of a
study's axes: not ZeRO, offload, tiers, data-parallel width or global batch, for instance. Which
ones is read off the program itself: the columns that the jaxpr of the layer costs reaches from
its outputs back (:func:`used_columns`). A configuration's *reduced index* is its mixed-radix index
over the factors holding those columns alone; a chunk evaluates the layer costs for a window of
consecutive reduced indices and gathers each configuration's row from it.

How wide that window must be is known before anything runs (:func:`window`): within one (model,
GPU) group the configurations of a chunk are consecutive, so if ``J`` is the outermost factor whose
row changes inside them, every factor outside ``J`` is fixed and the reduced indices fall in
``cnt_J * W_J`` consecutive values (``J`` read by the layer costs: ``cnt_J`` consecutive rows of it,
``W_J`` the product of the read factors inside it) or in ``W_J`` (``J`` not read). The largest of
those over ``J`` bounds every chunk. Where it is not well under the chunk (the layer costs read
the innermost factors) nothing is hoisted. The numbers are the unhoisted path's (a test compares
them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.extend.core as jcore
import jax.numpy as jnp

from dse.sweep.space import chunk_indices, digits

# Hoist only where the window is at most this share of the chunk. A choice, not a measured
# break-even: the bench's window is a quarter of the chunk (1.4-1.8x faster, README "Speed"); where
# the window nears the chunk the stacked gather would be paid for almost nothing.
MAX_SHARE = 0.6
# Whether chunk functions staged from now on hoist (a static argument of the compiled chunk, so a
# program of the other setting is never reused): ``hetersim bench --no-hoist`` turns it off.
ENABLED = True

_LAST: dict[str, Any] = {}


def _barrier(x: Any) -> Any:
    """``jax.lax.optimization_barrier`` (public since JAX 0.4.3x; before it, nothing: the same
    numbers, only slower)."""
    barrier = getattr(jax.lax, "optimization_barrier", None)
    return x if barrier is None else barrier(x)


def last_window() -> dict[str, Any]:
    """The window and chunk of the chunk function traced last (``hoisted``: whether it hoists),
    for the bench's report; empty before any, or after :func:`forget`."""
    return dict(_LAST)


def forget() -> None:
    """Clear :func:`last_window` (the bench, before it traces)."""
    _LAST.clear()


def used_columns(fn: Callable[[dict[str, Any]], Any], col: Mapping[str, Any]) -> frozenset[str]:
    """The columns of ``col`` that ``fn(col)`` depends on: the inputs its jaxpr reaches from its
    outputs, an equation counting as reading all of its inputs (conservative for sub-programs)."""
    keys = sorted(col)
    closed = jax.make_jaxpr(lambda *xs: fn(dict(zip(keys, xs, strict=True))))(*(col[k] for k in keys))
    jaxpr = closed.jaxpr
    needed = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if isinstance(v, jcore.Var))
    # JAX before 0.5 makes the tracers ``fn`` closes over the jaxpr's first inputs; ``col``'s are last.
    inputs = jaxpr.invars[len(jaxpr.invars) - len(keys) :]
    return frozenset(k for k, v in zip(keys, inputs, strict=True) if v in needed)


def window(radices: Sequence[int], read: Sequence[bool], chunk: int, lead: int = 0) -> int:
    """Most distinct reduced indices that ``chunk`` consecutive configurations of one group can
    hold (module docstring): factors ``radices`` outermost first, ``read`` whether the layer costs
    read each, the first ``lead`` of them (the model and GPU) fixed within a group."""
    most = 1
    for j, n in enumerate(radices):
        if j < lead:
            continue
        inner = math.prod(radices[j + 1 :])
        w = math.prod(r for r, used in zip(radices[j + 1 :], read[j + 1 :], strict=True) if used)
        rows = min(n, (chunk - 1) // inner + 2) if read[j] else 1
        most = max(most, rows * w)
    return most


def hoisted_layer_costs(
    start,
    col: Mapping[str, Any],
    factors: Sequence[Mapping[str, Any]],
    radices: Sequence[int],
    lc_of: Callable[[dict[str, Any]], Any],
    in_group,
    *,
    chunk: int,
    lead: int,
) -> Any | None:
    """Each configuration's layer costs, computed over the chunk's window of reduced indices and
    gathered back; None where hoisting does not pay (:data:`MAX_SHARE`). ``col``: the chunk's
    decoded columns (:func:`dse.sweep.evaluate.decode_columns`) of the tables' ``factors``, whose
    rows are ``radices`` (:func:`dse.sweep.evaluate.factor_radices`); ``lc_of``: batched columns to
    layer costs; ``in_group``: bool per configuration, those of the (model, GPU) group evaluated
    (the others' rows are discarded by the caller and may be anything), whose hardware is the
    first ``lead`` factors."""
    used = used_columns(lc_of, col)
    read = [any(c in used for c in t) for t in factors]
    span = window(radices, read, chunk, lead)
    _LAST.update(window=span, chunk=chunk, hoisted=span <= MAX_SHARE * chunk)  # at trace time
    if not _LAST["hoisted"]:
        return None
    idx = chunk_indices(start, radices, chunk)
    read_radices = [r for r, used_ in zip(radices, read, strict=True) if used_]
    reduced = jnp.zeros(chunk, jnp.int32)
    for d, r, used_ in zip(digits(idx, radices), radices, read, strict=True):
        if used_:
            reduced = reduced * r + d
    first = jnp.min(jnp.where(in_group, reduced, jnp.iinfo(jnp.int32).max))
    rows = jnp.minimum(first + jnp.arange(span, dtype=jnp.int32), math.prod(read_radices) - 1)
    row_digits = iter(digits(rows, read_radices))
    window_col = {}
    for t, r, used_ in zip(factors, radices, read, strict=True):
        d = next(row_digits) if used_ else None
        for c, v in t.items():
            window_col[c] = v[d] if used_ and r > 1 else jnp.broadcast_to(v[0], (span, *jnp.shape(v)[1:]))
    lc = _barrier(lc_of(window_col))
    at = jnp.clip(reduced - first, 0, span - 1)
    leaves, tree = jax.tree.flatten(lc)
    rows_of = jnp.stack([jnp.broadcast_to(a, (span,)) for a in leaves], axis=1)[at]
    rows_of = _barrier(rows_of)
    return jax.tree.unflatten(tree, [rows_of[:, i] for i in range(len(leaves))])
