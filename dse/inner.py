"""The inner problem of a bilevel search: the best layout for each of a batch of hardware choices.

For a batch of outer points (GPU kind, GPU count, overridden hardware parameters) every layout of
the study's plan axes is evaluated in one compiled call, ``jax.jit`` of ``jax.vmap`` (points) of
``jax.vmap`` (layouts) of :func:`hetersim.simulate.simulate`, and each point keeps its best
layout. Shapes are fixed per study (``batch`` points x ``chunk`` layouts, the last batch padded),
so a whole search compiles once; layout spaces larger than a chunk are solved chunk by chunk and
merged on the host.

A layout's *class* orders the choice: 0 meets every study constraint, 1 runs but violates a
constraint, 2 does not run (``infeasible`` bits), 3 does not divide the GPU count. A point keeps
the layout of its lowest class; within class 0 and 2 the one best in the primary objective,
within class 1 the one with the least total (relative) violation. The simulation and the classes
are those of a sweep (:func:`dse.sweep.evaluate.simulate_batch`,
:func:`dse.sweep.evaluate.check_constraints`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dse import hw_params
from dse.metrics import METRICS
from dse.search_space import SearchSpace
from dse.study import PLAN_AXES, Study
from dse.sweep.evaluate import CLASS_NAMES as CLASS_NAMES  # the classes below
from dse.sweep.evaluate import check_constraints, simulate_batch
from dse.sweep.space import columns_plan, space_from_study
from hetersim import build, planfields
from hetersim.cluster import ClusterSpec
from hetersim.fit.calibration import load_calibration
from hetersim.specs import Calibration

CODE_COLUMNS = tuple(f.name for f in planfields.FIELDS if f.coded)
BLOCK = 1 << 15  # configurations per compiled call

_TRACES = 0


def trace_count() -> int:
    """How many times :func:`solve_block` has been traced in this process (tests use it)."""
    return _TRACES


# --------------------------------------------------------------------------------------------
# The layout table
# --------------------------------------------------------------------------------------------


def layout_rows(study: Study, n_gpus: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Every combination of the study's plan axes (int64 codes; ``sp`` -1 = on when tp > 1),
    less those no GPU count can use: the global batch must be a multiple of the micro-batch and,
    when the GPU counts are known, ``tp*pp*cp`` must divide one of them."""
    axes = study.axes
    values = [np.asarray([planfields.encode(name, x) for x in axes[name]], dtype=np.int64) for name in PLAN_AXES]
    grids = np.meshgrid(*values, indexing="ij")
    rows = {name: g.reshape(-1) for name, g in zip(PLAN_AXES, grids, strict=True)}
    keep = rows["global_batch"] % rows["micro_batch"] == 0
    if n_gpus is not None:
        group = rows["tp"] * rows["pp"] * rows["cp"]
        counts = np.asarray(sorted(set(n_gpus)), dtype=np.int64)
        ok = {int(g): bool(np.any(counts % g == 0)) for g in np.unique(group)}
        keep &= np.array([ok[int(g)] for g in group], dtype=bool) if len(group) else keep
    return {k: v[keep] for k, v in rows.items()}


def describe_layout(rows: Mapping[str, np.ndarray], index: int, n_gpus: int) -> dict[str, Any]:
    """Row ``index`` with names for codes, ``dp`` and ``sp`` resolved."""
    out: dict[str, Any] = {name: planfields.decode(name, rows[name][index]) for name in PLAN_AXES}
    out["sp"] = planfields.resolve_sp(out["sp"], out["tp"])
    dp = planfields.derived_dp(n_gpus, out["tp"], out["pp"], out["cp"])
    out["dp"] = int(dp) if dp == int(dp) else 0
    return out


# --------------------------------------------------------------------------------------------
# The compiled block
# --------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("kinds", "primary", "maximize"))
def solve_block(
    systems: Any,
    models: Any,
    model_code: Any,
    n_gpus: Any,
    rows: Mapping[str, Any],
    fixed: Mapping[str, Any],
    limits: Any,
    cal: Calibration,
    *,
    kinds: tuple[tuple[str, str], ...],
    primary: str,
    maximize: bool,
) -> dict[str, Any]:
    """Best layout of ``rows`` for each point (``systems``, ``model_code``, ``n_gpus`` batched).

    ``kinds`` are the study constraints' ``(metric, sense)``, ``limits`` their bounds; returns,
    per point, the chosen row (``index``), its ``cls`` and ``score``, every metric of
    :data:`dse.metrics.METRICS` there, the relative ``violation`` of each constraint there, and
    how many rows divide, run, and meet every constraint.
    """
    global _TRACES
    _TRACES += 1
    group = rows["tp"] * rows["pp"] * rows["cp"]

    def per_point(system, model, n):
        divides = (jnp.mod(n, group) == 0) & (rows["real"] > 0)
        plan = columns_plan(rows, fixed, n_gpus=n, dp=n / group)
        out = simulate_batch(model, system, plan, cal, shared_hardware=True)  # a mix (search.mix): a cluster
        checks = check_constraints(out, kinds, limits, divides)
        cls, total, violation = checks.cls, checks.total, checks.relative
        objective = getattr(out, primary)
        objective = -objective if maximize else objective
        score = jnp.where(cls == 1, total, jnp.where(cls == 3, jnp.inf, objective))
        best_cls = jnp.min(cls)
        idx = jnp.argmin(jnp.where(cls == best_cls, score, jnp.inf))
        result = {name: getattr(out, name)[idx] for name in METRICS}
        result.update(
            index=idx.astype(jnp.int32),
            cls=best_cls.astype(jnp.int32),
            score=score[idx],
            violation=violation[:, idx],
            n_divides=jnp.sum(divides).astype(jnp.int32),
            n_runnable=jnp.sum(cls <= 1).astype(jnp.int32),
            n_ok=jnp.sum(cls == 0).astype(jnp.int32),
        )
        return result

    point_models = jax.tree.map(lambda a: a[model_code], models)
    return jax.vmap(per_point)(systems, point_models, n_gpus)


# --------------------------------------------------------------------------------------------
# The host side
# --------------------------------------------------------------------------------------------


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class InnerSolver:
    """Solves the inner problem of ``space`` for any list of outer points, ``batch`` at a time.

    An outer point is a mapping from each outer variable's name (:attr:`SearchSpace.outer`) to its
    value: ``model`` and ``gpu`` catalog keys, ``n_gpus``, hardware parameter values.
    """

    def __init__(self, space: SearchSpace, batch: int = 32, block: int = BLOCK, cal: Calibration | None = None):
        if batch < 1:
            raise ValueError(f"--batch must be a positive integer; got {batch}")
        self.space = space
        self.batch = batch
        study = space.study
        sweep_space = space_from_study(study)
        self.models = jax.tree.map(np.asarray, sweep_space.models)
        self.systems = jax.tree.map(np.asarray, sweep_space.systems)
        self.kinds = sweep_space.kinds
        self.limits = np.asarray(sweep_space.limits, np.float32).reshape(len(sweep_space.limits))
        self.fixed = sweep_space.fixed_arrays()
        self.cal = cal if cal is not None else build.calibration_spec(load_calibration())
        if space.mix is not None:
            counts: Sequence[int] | None = study.axes["n_gpus"]
        else:
            n_param = next(p for p in space.outer if p.name == "n_gpus")
            counts = n_param.grid() if n_param.discrete else None
        self.rows = layout_rows(study, counts)
        self.n_layouts = len(self.rows["tp"])
        if self.n_layouts == 0:
            raise ValueError(f"study file {space.origin}: no layout has a global batch divisible by its micro-batch")
        per_call = max(16, block // batch)
        self.chunk = min(_pow2_at_least(self.n_layouts), 1 << (per_call.bit_length() - 1))
        self.n_chunks = -(-self.n_layouts // self.chunk)
        self.tables = [self._chunk_rows(i) for i in range(self.n_chunks)]
        self.evaluated = 0  # layouts evaluated so far (real points x real rows)

    def _chunk_rows(self, i: int) -> dict[str, np.ndarray]:
        lo, hi = i * self.chunk, min(self.n_layouts, (i + 1) * self.chunk)
        idx = np.arange(lo, lo + self.chunk)
        real = idx < hi
        idx = np.where(real, idx, lo)
        out = {}
        for name in PLAN_AXES:
            dtype = np.int32 if name in CODE_COLUMNS else np.float32
            out[name] = self.rows[name][idx].astype(dtype)
        out["real"] = real.astype(np.int32)
        return out

    # ---- outer points -> specs -------------------------------------------------------------

    def hardware(self, points: Sequence[Mapping[str, Any]]) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """(systems, model codes, GPU counts, price per GPU-hour) of ``points``, NumPy, batched."""
        study = self.space.study
        models = list(study.axes["model"])
        gpus = list(study.axes["gpu"])
        model_code = np.array([models.index(p["model"]) if "model" in p else 0 for p in points], np.int32)
        gpu_code = np.array([gpus.index(p["gpu"]) if "gpu" in p else 0 for p in points], np.int64)
        n_gpus = np.array([p["n_gpus"] for p in points], np.float32)
        systems = jax.tree.map(lambda a: a[gpu_code], self.systems)
        if isinstance(systems, ClusterSpec):  # a mix: the GPU-weighted mean price per GPU-hour
            gpus = np.asarray(systems.gpus, np.float64)
            hourly = np.sum(gpus * np.asarray(systems.systems.device.price_usd_per_hour, np.float64), axis=1)
            return systems, model_code, n_gpus, hourly / np.maximum(gpus.sum(axis=1), 1.0)
        price_param = hw_params.resolve("price_usd_per_hour")
        price = np.asarray(hw_params.get(systems, price_param), np.float64).copy()
        overrides = {}
        for outer in self.space.outer:
            if outer.param is None:
                continue
            values = np.array([p[outer.name] for p in points], np.float64)
            coef = self.space.price.get(outer.name)
            if coef:  # per unit above the catalog's value: a value below it earns no credit
                price += coef * np.maximum(values - np.asarray(hw_params.get(systems, outer.param), np.float64), 0.0)
            overrides[outer.param] = values.astype(np.float32)
        if self.space.price:
            overrides[price_param] = price.astype(np.float32)
        if overrides:
            systems = hw_params.set_values(systems, overrides)
        price = np.asarray(hw_params.get(systems, price_param), np.float64)
        return systems, model_code, n_gpus, price

    # ---- solving ---------------------------------------------------------------------------

    def solve(self, points: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """The best layout of every point (any number of points; batches of ``batch``)."""
        parts = [self._solve_batch(points[i : i + self.batch]) for i in range(0, len(points), self.batch)]
        if not parts:
            return {}
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _solve_batch(self, points: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        n = len(points)
        padded = list(points) + [points[0]] * (self.batch - n)
        systems, model_code, n_gpus, price = self.hardware(padded)
        best: dict[str, np.ndarray] | None = None
        maximize = METRICS[self.space.primary].sense == "max"
        for c, rows in enumerate(self.tables):
            out = solve_block(
                systems,
                self.models,
                model_code,
                n_gpus,
                rows,
                self.fixed,
                self.limits,
                self.cal,
                kinds=self.kinds,
                primary=self.space.primary,
                maximize=maximize,
            )
            out = {k: np.asarray(v) for k, v in out.items()}
            out["index"] = out["index"].astype(np.int64) + c * self.chunk
            best = out if best is None else _merge(best, out)
        assert best is not None
        best = {k: v[:n] for k, v in best.items()}
        best["price_usd_per_hour"] = price[:n]
        if isinstance(systems, ClusterSpec):
            gpus = np.asarray(systems.gpus, np.float64)
            best["power_kW"] = np.sum(gpus * np.asarray(systems.systems.device.tdp_W, np.float64), axis=1)[:n] / 1000.0
        else:
            tdp = np.asarray(hw_params.get(systems, hw_params.resolve("tdp_W")), np.float64)[:n]
            best["power_kW"] = n_gpus[:n].astype(np.float64) * tdp / 1000.0
        best["constraints"] = self.constraint_values(best)
        self.evaluated += n * self.n_layouts
        return best

    def constraint_values(self, best: Mapping[str, np.ndarray]) -> np.ndarray:
        """``[points, constraints]`` in :meth:`SearchSpace.constraint_names` order; > 0 violates."""
        cols = [np.where(best["cls"] >= 2, 1.0, 0.0)]
        cols += [best["violation"][:, i].astype(np.float64) for i in range(best["violation"].shape[1])]
        if self.space.max_power_kW is not None:
            cols.append((best["power_kW"] - self.space.max_power_kW) / self.space.max_power_kW)
        return np.stack(cols, axis=1)

    def layout(self, index: int, n_gpus: int) -> dict[str, Any]:
        return describe_layout(self.rows, index, n_gpus)


def _merge(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Keep, per point, the better of two chunk results (lower class, then lower score; ties
    keep ``a``, the earlier chunk). Counts add up."""
    take_b = (b["cls"] < a["cls"]) | ((b["cls"] == a["cls"]) & (b["score"] < a["score"]))
    out = {}
    for k in a:
        if k in ("n_divides", "n_runnable", "n_ok"):
            out[k] = a[k] + b[k]
        else:
            mask = take_b.reshape(take_b.shape + (1,) * (a[k].ndim - 1))
            out[k] = np.where(mask, b[k], a[k])
    return out


# --------------------------------------------------------------------------------------------
# Exhaustive reference
# --------------------------------------------------------------------------------------------


def outer_grid(space: SearchSpace) -> list[dict[str, Any]]:
    """Every point of a discrete outer space, in row-major order of :attr:`SearchSpace.outer`
    (of a ``search.mix``: every feasible mix, :meth:`dse.search_space.MixSearch.point`)."""
    if space.mix is not None:
        return [space.mix.point(c) for c in space.mix.mixes]
    grids = [p.grid() for p in space.outer]
    names = [p.name for p in space.outer]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grids)]


def exhaustive(solver: InnerSolver) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Solve every point of the (discrete) outer grid: the reference a search is judged by."""
    if not solver.space.discrete:
        continuous = ", ".join(p.name for p in solver.space.outer if not p.discrete)
        raise ValueError(f"the outer space is continuous ({continuous}); give each a step to enumerate it")
    points = outer_grid(solver.space)
    return points, solver.solve(points)


def total_configurations(solver: InnerSolver) -> int:
    """Outer points x layouts (None-safe only for discrete spaces)."""
    size = solver.space.outer_size
    return 0 if size is None else size * solver.n_layouts
