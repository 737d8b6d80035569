"""Small Pareto helpers: a vectorized non-dominated filter and the 2-D hypervolume.

Meant for thousands of points (search trials, an exhaustive reference), not for whole sweeps:
the filter compares points pairwise in blocks, ``O(n^2 k)`` time and ``O(block n k)`` memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BLOCK = 1024


def _as_min(points: np.ndarray, senses: Sequence[str] | None) -> np.ndarray:
    """``points`` with every column turned into one to minimise."""
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"points must be a 2-D array (points x objectives); got shape {p.shape}")
    if senses is None:
        return p
    if len(senses) != p.shape[1]:
        raise ValueError(f"{len(senses)} senses for {p.shape[1]} objectives")
    for s in senses:
        if s not in ("min", "max"):
            raise ValueError(f"sense must be 'min' or 'max'; got {s!r}")
    sign = np.array([1.0 if s == "min" else -1.0 for s in senses])
    return p * sign


def non_dominated(points: np.ndarray, senses: Sequence[str] | None = None) -> np.ndarray:
    """Boolean mask of the points no other point dominates (all columns minimised unless
    ``senses`` says ``"max"``). Rows with a NaN are never on the front; equal points are all kept."""
    p = _as_min(points, senses)
    n = p.shape[0]
    ok = ~np.isnan(p).any(axis=1)
    q = p[ok]
    keep = np.ones(len(q), dtype=bool)
    for lo in range(0, len(q), BLOCK):
        block = q[lo : lo + BLOCK]  # is block[i] dominated by some q[j]?
        le = (q[None, :, :] <= block[:, None, :]).all(axis=2)
        lt = (q[None, :, :] < block[:, None, :]).any(axis=2)
        keep[lo : lo + BLOCK] = ~(le & lt).any(axis=1)
    out = np.zeros(n, dtype=bool)
    out[np.flatnonzero(ok)[keep]] = True
    return out


def hypervolume_2d(points: np.ndarray, ref: Sequence[float], senses: Sequence[str] | None = None) -> float:
    """Area dominated by ``points`` and bounded by the reference point ``ref`` (two objectives,
    minimised unless ``senses`` says ``"max"``; ``ref`` is in the same units and senses as the
    points). Points not strictly better than ``ref`` in both objectives add nothing."""
    p = _as_min(points, senses)
    if p.shape[1] != 2:
        raise ValueError(f"hypervolume_2d needs two objectives; got {p.shape[1]}")
    r = _as_min(np.asarray(ref, dtype=np.float64).reshape(1, 2), senses)[0]
    p = p[~np.isnan(p).any(axis=1)]
    p = p[(p[:, 0] < r[0]) & (p[:, 1] < r[1])]
    if len(p) == 0:
        return 0.0
    p = p[non_dominated(p)]
    p = p[np.lexsort((p[:, 1], p[:, 0]))]  # x ascending; on a front y then descends
    x_next = np.append(p[1:, 0], r[0])
    return float(np.sum((x_next - p[:, 0]) * (r[1] - p[:, 1])))
