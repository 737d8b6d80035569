"""Streamed sweeps: the top-k per objective, the Pareto set and per-axis summaries instead of every row.

A space of :data:`dse.sweep.run.STREAM_THRESHOLD` configurations or more (or any, with
``stream=True``) is *streamed*: each chunk is folded on the host by :class:`Reducer` into the
top-k feasible configurations per objective, the Pareto set of each model and per-axis summaries,
and only those are written (:func:`write_streamed`); the reduced state is checkpointed
(:meth:`dse.sweep.checkpoints.Checkpoints.save_state`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dse import atomic
from dse.metrics import INTERVALS, METRICS, cf_attrs
from dse.pareto import pareto_mask
from dse.study import Study
from dse.sweep.dataset import (
    COMPRESSION_LEVEL,
    EXTRA_VARIABLES,
    column_attrs,
    dataset_attrs,
    define_config_variables,
    variables,
)
from dse.sweep.space import COLUMNS, Space
from hetersim.specs import Calibration
from hetersim.types import Infeasible

DEFAULT_TOP_K = 100
MAX_FRONT = 20_000  # Pareto points kept per model; a larger front is thinned (Reducer.select)
ANCHORS = 16  # front points a chunk is screened against with three or more objectives
BLOCK_KEYS = 1 << 12  # most keys of one block of factors in a streamed sweep's marginals
PARETO_BIT = 1  # kept_because: bit 0 the Pareto set, bit 1 + i the top-k of objective i


def stream_fingerprint(fp: str, top_k: int) -> str:
    """Checkpoints of a streamed sweep: the full sweep's fingerprint plus what the reduction keeps."""
    return hashlib.sha256(f"{fp} stream top_k={top_k} max_front={MAX_FRONT}".encode()).hexdigest()


@dataclass(frozen=True)
class StreamState:
    """What a streamed sweep keeps. :meth:`Reducer.add` returns a new one (nothing is changed in
    place), so Ctrl-C between chunks always leaves a consistent state to checkpoint.

    ``rows``: ``index`` (flat) and every variable of :func:`variables` for the kept rows;
    ``kept``: their ``kept_because`` bits; per group of :attr:`Reducer.groups`, ``feasible``
    configurations per key and ``best`` (objectives x keys, in "smaller is better" form, +inf
    where no feasible configuration); ``reasons``: configurations per :class:`Infeasible` flag;
    ``done``: finished chunks; ``thinned``: fronts cut to :data:`MAX_FRONT`.
    """

    rows: dict[str, np.ndarray]
    kept: np.ndarray
    feasible: tuple[np.ndarray, ...]
    best: tuple[np.ndarray, ...]
    reasons: np.ndarray
    done: np.ndarray
    thinned: int = 0


class Reducer:
    """Folds evaluated chunks into a :class:`StreamState` on the host (NumPy).

    * Top-k: per objective, the ``k`` best feasible configurations, ties broken by the lower flat
      index (so the result does not depend on the order chunks finish in). A chunk contributes
      only rows at least as good as the current k-th.
    * Pareto set: per model (as ``hetersim report`` draws it), the feasible configurations no
      other feasible configuration of that model beats in every objective (equal points all
      kept, as :func:`dse.pareto.pareto_mask` does). A chunk's rows are first screened against the
      kept front (exactly with one or two objectives, against :data:`ANCHORS` of its points with
      more), and the survivors merged with it by :func:`pareto_mask`. A front of more than
      :data:`MAX_FRONT` points is thinned to that many, spread evenly along the first objective
      (both ends kept); the file then says ``pareto_thinned > 0`` and the kept front is a subset
      (a later point dominated only by a dropped one may be kept too).
    * Marginals: feasible configurations and the best value of each objective per key of a few
      *groups*: *blocks* of consecutive factors whose lengths multiply to at most
      :data:`BLOCK_KEYS` (key: the block's mixed-radix digit, so one ``bincount`` and one
      ``fmin.at`` per objective serve several axes), and ``sp`` as resolved (0/1).
      :meth:`marginals` reduces them to each column at the end; configuration counts per value
      need no accumulation (every factor row occurs ``size / length`` times).
    """

    def __init__(self, space: Space, objectives: Sequence[str], chunk: int, k: int):
        self.space, self.chunk, self.k = space, chunk, k
        self.objectives = tuple(objectives)
        self.sign = np.array([-1.0 if METRICS[o].sense == "max" else 1.0 for o in self.objectives])
        self.n_chunks = -(-space.size // chunk)
        self.flags = np.array([int(f) for f in Infeasible if f], np.int64)
        self.factor_of = {c: f for f, (_, table) in enumerate(space.factors) for c in table}
        blocks: list[list[int]] = []
        for f, r in enumerate(space.radices):
            if blocks and math.prod(space.radices[g] for g in blocks[-1]) * r <= BLOCK_KEYS:
                blocks[-1].append(f)
            else:
                blocks.append([f])
        self.blocks = tuple(tuple(b) for b in blocks)
        self.block_of = {f: (b, i) for b, block in enumerate(self.blocks) for i, f in enumerate(block)}
        self.groups = (*(math.prod(space.radices[f] for f in b) for b in self.blocks), 2)  # keys per group

    # -- state ---------------------------------------------------------------------------------

    def empty(self) -> StreamState:
        rows = {"index": np.zeros(0, np.int64)}
        for name in variables():
            spec = METRICS.get(name) or INTERVALS.get(name)
            dtype = spec.dtype if spec is not None else EXTRA_VARIABLES[name][1]
            rows[name] = np.zeros(0, np.dtype(dtype))
        return StreamState(
            rows=rows,
            kept=np.zeros(0, np.int32),
            feasible=tuple(np.zeros(n, np.int64) for n in self.groups),
            best=tuple(np.full((len(self.objectives), n), np.inf) for n in self.groups),
            reasons=np.zeros(len(self.flags), np.int64),
            done=np.zeros(self.n_chunks, bool),
        )

    def to_arrays(self, state: StreamState) -> dict[str, np.ndarray]:
        out = {f"row_{k}": v for k, v in state.rows.items()}
        out.update(kept=state.kept, reasons=state.reasons, done=state.done, thinned=np.int64(state.thinned))
        for g in range(len(self.groups)):
            out.update({f"feasible_{g}": state.feasible[g], f"best_{g}": state.best[g]})
        return out

    def from_arrays(self, arrays: Mapping[str, np.ndarray] | None) -> StreamState:
        """The state saved by :meth:`to_arrays` (an empty one for None)."""
        if arrays is None:
            return self.empty()
        n = range(len(self.groups))
        return StreamState(
            rows={k.removeprefix("row_"): v for k, v in arrays.items() if k.startswith("row_")},
            kept=arrays["kept"],
            feasible=tuple(arrays[f"feasible_{g}"] for g in n),
            best=tuple(arrays[f"best_{g}"] for g in n),
            reasons=arrays["reasons"],
            done=arrays["done"].astype(bool),
            thinned=int(arrays["thinned"]),
        )

    # -- one chunk -----------------------------------------------------------------------------

    def values(self, arrays: Mapping[str, np.ndarray], pick: np.ndarray | None = None) -> np.ndarray:
        """Objectives x rows, negated where larger is better (so smaller is better everywhere)."""
        cols = [np.asarray(arrays[o] if pick is None else arrays[o][pick], np.float64) for o in self.objectives]
        return np.stack(cols) * self.sign[:, None]

    def digit(self, f: int, index: np.ndarray) -> np.ndarray:
        """Factor ``f``'s row of flat indices ``index``."""
        stride = math.prod(self.space.radices[f + 1 :])
        return (index // stride) % self.space.radices[f]

    def models(self, index: np.ndarray) -> np.ndarray:
        f = self.factor_of["model"]
        return self.space.factors[f][1]["model"][self.digit(f, index)]

    def add(self, state: StreamState, index: int, arrays: Mapping[str, Any]) -> StreamState:
        """``state`` with chunk ``index`` (its evaluated ``arrays``, padded or not) folded in."""
        lo = index * self.chunk
        n = min(self.chunk, self.space.size - lo)
        fpos = np.flatnonzero(np.asarray(arrays["feasible"])[:n])
        v = self.values({o: np.asarray(arrays[o]) for o in self.objectives}, fpos)

        keys = _host_digits(lo, n, self.groups[:-1])
        keys.append(self._sp(keys))
        feasible, best = [], []
        for g, (key, size) in enumerate(zip(keys, self.groups, strict=True)):
            b = state.best[g].copy()
            kf = key[fpos]
            feasible.append(state.feasible[g] + np.bincount(kf, minlength=size))
            for j in range(len(v)):
                np.fmin.at(b[j], kf, v[j])
            best.append(b)
        flags = np.asarray(arrays["infeasible"])[:n]
        per_value = np.bincount(flags[flags != 0])
        seen = np.flatnonzero(per_value)
        reasons = state.reasons + ((seen[:, None] & self.flags) != 0).astype(np.int64).T @ per_value[seen]
        done = state.done.copy()
        done[index] = True
        counts = dict(feasible=tuple(feasible), best=tuple(best), reasons=reasons, done=done)

        cand = self._candidates(state, v, lo + fpos)
        if not cand.any():
            return replace(state, **counts)
        pick = fpos[cand]
        new = {"index": (lo + pick).astype(np.int64), **{name: np.asarray(arrays[name])[pick] for name in variables()}}
        rows = {name: np.concatenate([state.rows[name], new[name]]) for name in state.rows}
        kept, thinned = self.select(rows)
        keep = kept != 0
        return StreamState(
            rows={name: r[keep] for name, r in rows.items()},
            kept=kept[keep],
            thinned=state.thinned + thinned,
            **counts,
        )

    def _factor_digit(self, keys: Sequence[np.ndarray], f: int) -> np.ndarray:
        b, i = self.block_of[f]
        if self.space.radices[f] == 1:
            return np.zeros(len(keys[b]), np.int64)
        inner = math.prod(self.space.radices[g] for g in self.blocks[b][i + 1 :])
        return (keys[b] // inner) % self.space.radices[f]

    def _sp(self, keys: Sequence[np.ndarray]) -> np.ndarray:
        """``sp`` as the sweep resolves it (on when tp > 1 for the code -1), per row."""
        ft, fs = self.factor_of["tp"], self.factor_of["sp"]
        tp = self.space.factors[ft][1]["tp"][self._factor_digit(keys, ft)]
        code = self.space.factors[fs][1]["sp"][self._factor_digit(keys, fs)]
        return np.where(code < 0, tp > 1, code).astype(np.int64)

    def _candidates(self, state: StreamState, v: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Which feasible rows of a chunk may enter the kept set: those at least as good as the
        current k-th of some objective, and those the kept front of their model does not dominate."""
        cand = np.zeros(v.shape[1], bool)
        if not len(cand):
            return cand
        kept_v = self.values(state.rows)
        for j in range(len(v)):
            mine = (state.kept & (1 << (1 + j))) != 0
            ok = ~np.isnan(v[j])
            if np.count_nonzero(mine) >= self.k:
                ok &= v[j] <= kept_v[j][mine].max()
            if np.count_nonzero(ok) > self.k:
                ok &= v[j] <= np.partition(v[j][ok], self.k - 1)[self.k - 1]
            cand |= ok
        models = self.models(index)
        kept_models = self.models(state.rows["index"])
        on_front = (state.kept & PARETO_BIT) != 0
        for m in np.flatnonzero(np.bincount(models)):
            sel = models == m
            front = kept_v[:, on_front & (kept_models == m)]
            cand[sel] |= maybe_front(v[:, sel].T, front.T)
        return cand

    def select(self, rows: Mapping[str, np.ndarray]) -> tuple[np.ndarray, int]:
        """``kept_because`` bits of candidate ``rows`` (0: drop it) and how many fronts were thinned."""
        v = self.values(rows)
        index = rows["index"]
        kept = np.zeros(len(index), np.int32)
        for j in range(len(v)):
            ok = np.flatnonzero(~np.isnan(v[j]))
            best = ok[np.lexsort((index[ok], v[j][ok]))][: self.k]
            kept[best] |= 1 << (1 + j)
        thinned = 0
        models = self.models(index)
        for m in np.unique(models):
            sel = np.flatnonzero(models == m)
            on = sel[pareto_mask(v[:, sel].T)]
            if len(on) > MAX_FRONT:
                on = on[np.lexsort((index[on], v[0][on]))]
                on = on[np.unique(np.round(np.linspace(0, len(on) - 1, MAX_FRONT)).astype(np.int64))]
                thinned += 1
            kept[on] |= PARETO_BIT
        return kept, thinned

    # -- results -------------------------------------------------------------------------------

    def n_feasible(self, state: StreamState) -> int:
        return int(state.feasible[0].sum())

    def marginals(self, state: StreamState) -> dict[str, tuple[np.ndarray, ...]]:
        """Per column: (values, configurations, feasible configurations, best per objective in the
        metric's own sense (NaN where none is feasible), objectives x values)."""
        radices, size, n_obj = self.space.radices, self.space.size, len(self.objectives)
        per_row = {}  # factor -> (configurations, feasible, best) per row of the factor
        for b, block in enumerate(self.blocks):
            shape = tuple(radices[f] for f in block)
            feasible = state.feasible[b].reshape(shape)
            best = state.best[b].reshape(n_obj, *shape)
            for i, f in enumerate(block):
                other = tuple(a for a in range(len(block)) if a != i)
                count = np.full(radices[f], size // radices[f], np.int64)
                per_row[f] = (
                    count,
                    feasible.sum(axis=other),
                    np.fmin.reduce(best, axis=tuple(a + 1 for a in other)) if other else best,
                )
        # sp as resolved: each (tp row, sp row) pair occurs size / (their lengths) times.
        ft, fs = self.factor_of["tp"], self.factor_of["sp"]
        tp, code = self.space.factors[ft][1]["tp"], self.space.factors[fs][1]["sp"]
        if ft == fs:
            resolved = np.where(code < 0, tp > 1, code)
            sp_count = np.bincount(resolved, minlength=2) * (size // radices[ft])
        else:
            resolved = np.where(code[None, :] < 0, tp[:, None] > 1, code[None, :])
            sp_count = np.bincount(resolved.reshape(-1), minlength=2) * (size // (radices[ft] * radices[fs]))
        out = {}
        coords = self.space.coords(0, 0)
        for c in COLUMNS:
            if c == "sp":
                values = np.flatnonzero(sp_count)
                count, feasible, best = sp_count[values], state.feasible[-1][values], state.best[-1][:, values]
            else:
                f = self.factor_of[c]
                values, inv = np.unique(self.space.factors[f][1][c], return_inverse=True)
                inv = inv.reshape(-1)
                count = np.zeros(len(values), np.int64)
                feasible = np.zeros(len(values), np.int64)
                best = np.full((n_obj, len(values)), np.inf)
                np.add.at(count, inv, per_row[f][0])
                np.add.at(feasible, inv, per_row[f][1])
                for j in range(n_obj):
                    np.fmin.at(best[j], inv, per_row[f][2][j])
            best = np.where(np.isinf(best), np.nan, best * self.sign[:, None])
            out[c] = (values.astype(coords[c].dtype), count, feasible, best)
        return out


def _host_digits(start: int, n: int, radices: Sequence[int]) -> list[np.ndarray]:
    """Mixed-radix digits of ``start .. start+n-1`` (NumPy; division only, which is faster than %)."""
    q = np.arange(start, start + n, dtype=np.int64)
    out = []
    for r in reversed(radices):
        if r == 1:
            out.append(np.zeros(n, np.int64))
            continue
        nq = q // r
        out.append(q - nq * r)
        q = nq
    return out[::-1]


def maybe_front(points: np.ndarray, front: np.ndarray) -> np.ndarray:
    """Which of ``points`` (n x k, smaller is better) no row of ``front`` (a Pareto front) is known
    to dominate: exact for k <= 2, against :data:`ANCHORS` front points for more. NaN rows: False."""
    ok = ~np.isnan(points).any(axis=1)
    if not len(front) or not ok.any():
        return ok
    k = points.shape[1]
    if k == 1:
        return ok & (points[:, 0] <= front[:, 0].min())
    if k == 2:
        # Along a front sorted by x, y falls: the last point with x <= px has the least y of them.
        order = np.lexsort((front[:, 1], front[:, 0]))
        fx, fy = front[order, 0], front[order, 1]
        j = np.searchsorted(fx, points[:, 0], side="right") - 1
        qx, qy = fx[np.maximum(j, 0)], fy[np.maximum(j, 0)]
        dominated = (j >= 0) & (qy <= points[:, 1]) & ((qx < points[:, 0]) | (qy < points[:, 1]))
        return ok & ~dominated
    spread = np.round(np.linspace(0, len(front) - 1, min(len(front), ANCHORS))).astype(np.int64)
    dominated = np.zeros(len(points), bool)
    for q in front[np.unique(np.r_[spread, front.argmin(axis=0)])]:
        dominated |= (q <= points).all(axis=1) & (q < points).any(axis=1)
    return ok & ~dominated


def write_streamed(
    path: Path,
    study: Study,
    space: Space,
    reducer: Reducer,
    state: StreamState,
    chunk: int,
    fp: str,
    cal: Calibration,
) -> None:
    """The netCDF file of a streamed sweep, written atomically (:mod:`dse.atomic`).

    ``config`` holds only the kept rows, ordered by flat index (the ``config`` coordinate), with
    the columns and variables of a full dataset plus ``kept_because``; per column ``c`` a
    dimension ``marginal_c`` (its values) with ``n_configs_by_c``, ``n_feasible_by_c`` and
    ``best_<objective>_by_c`` over every configuration evaluated.
    """
    import netCDF4

    def write(tmp: Path) -> None:
        with netCDF4.Dataset(tmp, "w", format="NETCDF4") as nc:
            _write_kept_rows(nc, space, reducer, state)
            _write_marginals(nc, space, reducer, state)
            nc.setncatts(_streamed_attrs(study, space, reducer, state, chunk, fp, cal))

    atomic.atomic_write(path, write)


def _write_kept_rows(nc, space: Space, reducer: Reducer, state: StreamState) -> None:
    """The kept rows along ``config`` (by flat index), their columns, variables and ``kept_because``."""
    order = np.argsort(state.rows["index"], kind="stable")
    index = state.rows["index"][order]
    opts = dict(zlib=True, complevel=COMPRESSION_LEVEL, shuffle=True)
    nc.createDimension("config", len(index))
    var = nc.createVariable("config", "i8", ("config",), **opts)
    var.long_name = "flat index of the configuration in the study's space (mixed radix over its factors)"
    var.units = "1"
    define_config_variables(nc, space, opts)
    kept = nc.createVariable("kept_because", "i4", ("config",), **opts)
    kept.long_name, kept.units = "why the streamed sweep kept the configuration (bit flags)", "1"
    kept.flag_masks = np.array([1 << b for b in range(1 + len(reducer.objectives))], np.int32)
    kept.flag_meanings = " ".join(["pareto", *(f"top_k_{o}" for o in reducer.objectives)])
    kept.coordinates = " ".join(COLUMNS)
    if len(index):
        nc["config"][:] = index
        for c, values in space.coords_at(index).items():
            nc[c][:] = values
        for name in variables():
            nc[name][:] = state.rows[name][order]
        kept[:] = state.kept[order]


def _write_marginals(nc, space: Space, reducer: Reducer, state: StreamState) -> None:
    """Per column ``c``: dimension ``marginal_c`` and the counts and best objectives along it."""
    for c, (values, count, feasible, best) in reducer.marginals(state).items():
        dim = f"marginal_{c}"
        nc.createDimension(dim, len(values))
        var = nc.createVariable(dim, values.dtype, (dim,))
        column_attrs(var, space, c)
        var[:] = values
        for name, data, long_name in (
            (f"n_configs_by_{c}", count, f"configurations per {c}"),
            (f"n_feasible_by_{c}", feasible, f"feasible configurations per {c}"),
        ):
            var = nc.createVariable(name, "i8", (dim,))
            var.long_name, var.units = long_name, "1"
            var[:] = data
        for j, o in enumerate(reducer.objectives):
            m = METRICS[o]
            var = nc.createVariable(f"best_{o}_by_{c}", "f4", (dim,))
            word = "lowest" if m.sense == "min" else "highest"
            var.setncatts(cf_attrs(m.units, f"{word} {m.long_name} among feasible configurations, per {c}"))
            var[:] = best[j].astype(np.float32)


def _streamed_attrs(
    study: Study, space: Space, reducer: Reducer, state: StreamState, chunk: int, fp: str, cal: Calibration
) -> dict[str, Any]:
    """:func:`dataset_attrs` plus what the reduction kept and counted."""
    attrs = dataset_attrs(study, space, chunk, fp, cal)
    reasons = {f.name.lower(): int(c) for f, c in zip([f for f in Infeasible if f], state.reasons, strict=True)}
    attrs.update(
        streamed=1,
        top_k=reducer.k,
        n_kept=len(state.rows["index"]),
        n_feasible=reducer.n_feasible(state),
        infeasible_reasons=json.dumps({k: v for k, v in reasons.items() if v}),
        pareto_scope="per model",
        pareto_max_points=MAX_FRONT,
        pareto_thinned=state.thinned,
    )
    return attrs
