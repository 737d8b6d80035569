"""Gradients of the cost model with respect to the hardware: which upgrade buys the most, and
continuous hardware tuning by projected gradient descent.

:func:`sensitivity` differentiates one metric (the step time by default) of one configuration
with respect to every continuous hardware parameter of its :class:`~hetersim.specs.SystemSpec`
(:mod:`dse.hw_params`: per-precision peaks and GEMM efficiencies, HBM bandwidth and capacity,
per-level network bandwidth, efficiency and latency, host tier paths, ...) with one
``jax.grad``, and ranks them by elasticity ``d ln T / d ln p``: the % change of the metric per %
change of the parameter.

:func:`tune_continuous` minimises time or cost to train over a box of parameter values: each
parameter is ``low + (high - low) * sigmoid(z)`` (the box constraint as a reparametrisation) and
Adam (:func:`hetersim.fit.adam.adam`, the loop the calibration fit runs too) descends
``log(objective)`` in ``z``, keeping the best point it visits. A price model makes
the trade-off real: faster hardware costs more per GPU-hour. :func:`grid_continuous` evaluates a
fine grid of the same box, vectorized, as the reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dse import hw_params
from dse.metrics import METRICS
from hetersim.fit.adam import adam
from hetersim.simulate import simulate
from hetersim.specs import Calibration, ModelSpec, Plan, SystemSpec

OBJECTIVES = {"time": "time_to_train_s", "cost": "cost_usd"}
PriceModel = Mapping[str, float] | Callable[[dict[str, Any]], Any] | None


@dataclass(frozen=True)
class Sensitivity:
    """``derivative`` is d metric / d parameter in their units; ``elasticity`` is
    d ln metric / d ln parameter (0 where the parameter or the metric is 0)."""

    path: str
    value: float
    units: str
    derivative: float
    elasticity: float


def _float_specs(tree: Any) -> Any:
    return jax.tree.map(jnp.asarray, tree)


@functools.partial(jax.jit, static_argnames=("paths", "metric"))
def _value_and_grad(model, system, plan, cal, x, *, paths: tuple[str, ...], metric: str):
    params = [hw_params.resolve(p) for p in paths]

    def f(x):
        sys = hw_params.set_values(system, {p: x[i] for i, p in enumerate(params)})
        return getattr(simulate(model, sys, plan, cal), metric)

    return jax.value_and_grad(f)(x)


def sensitivity(
    model: ModelSpec,
    system: SystemSpec,
    plan: Plan,
    cal: Calibration,
    metric: str = "step_time_s",
    paths: Sequence[str] | None = None,
) -> list[Sensitivity]:
    """The sensitivity of ``metric`` to every continuous hardware parameter (or to ``paths``),
    ranked by absolute elasticity, largest first (ties keep spec order)."""
    if metric not in METRICS or METRICS[metric].dtype != "f4":
        allowed = ", ".join(m for m, v in METRICS.items() if v.dtype == "f4")
        raise ValueError(f"--metric must be one of {allowed}; got {metric!r}")
    params = [hw_params.resolve(p) for p in (paths if paths is not None else hw_params.names())]
    system = _float_specs(system)
    x = jnp.stack([jnp.asarray(hw_params.get(system, p), jnp.float32) for p in params])
    value, grad = _value_and_grad(
        _float_specs(model), system, _float_specs(plan), cal, x, paths=tuple(p.path for p in params), metric=metric
    )
    value, grad, x = float(value), np.asarray(grad, np.float64), np.asarray(x, np.float64)
    out = []
    for p, v, g in zip(params, x, grad, strict=True):
        e = g * v / value if value != 0 and v != 0 else 0.0
        out.append(Sensitivity(p.path, float(v), p.units, float(g), float(e)))
    order = sorted(range(len(out)), key=lambda i: -abs(out[i].elasticity))
    return [out[i] for i in order]


# --------------------------------------------------------------------------------------------
# Continuous tuning
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneResult:
    values: dict[str, float]  # parameter path -> tuned value
    objective: float  # time_to_train_s or cost_usd there
    metric: str
    start_values: dict[str, float]
    start_objective: float
    feasible: bool  # the tuned configuration runs (infeasible == 0)
    history: np.ndarray  # objective per step


def _box(params: Mapping[str, tuple[float, float]]) -> tuple[list[hw_params.Param], np.ndarray, np.ndarray]:
    if not params:
        raise ValueError("params: give at least one parameter path -> (low, high)")
    resolved, lo, hi = [], [], []
    for name, bounds in params.items():
        p = hw_params.resolve(name)
        try:
            low, high = (float(b) for b in bounds)
        except (TypeError, ValueError):
            raise ValueError(f"params[{name!r}] must be (low, high); got {bounds!r}") from None
        if not (np.isfinite(low) and np.isfinite(high)) or low <= 0:
            raise ValueError(f"params[{name!r}]: low must be a positive number; got {bounds!r}")
        if low >= high:
            raise ValueError(f"params[{name!r}]: low ({low:g}) must be below high ({high:g})")
        if p in resolved:
            raise ValueError(f"params[{name!r}]: {p.path} given twice")
        resolved.append(p)
        lo.append(low)
        hi.append(high)
    return resolved, np.asarray(lo, np.float32), np.asarray(hi, np.float32)


def _objective_fn(model, system, plan, cal, params, price_model: PriceModel, objective: str):
    """``f(x) -> (objective metric, infeasible flags)`` for parameter values ``x``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}; got {objective!r}")
    metric = OBJECTIVES[objective]
    system = _float_specs(system)
    price_param = hw_params.resolve("price_usd_per_hour")
    base_price = hw_params.get(system, price_param)
    base = [jnp.asarray(hw_params.get(system, p), jnp.float32) for p in params]
    if isinstance(price_model, Mapping):
        coef = {}
        for name, c in price_model.items():
            path = hw_params.resolve(name).path
            if path not in [p.path for p in params]:
                raise ValueError(f"price_model[{name!r}]: prices only tuned parameters")
            coef[path] = float(c)

        def extra(values):
            return sum(c * (values[path] - base[[p.path for p in params].index(path)]) for path, c in coef.items())

    elif callable(price_model):
        extra = price_model
    elif price_model is None:

        def extra(values):
            return 0.0

    else:
        raise ValueError(f"price_model must be a mapping, a callable or None; got {price_model!r}")

    def f(x):
        values = {p.path: x[i] for i, p in enumerate(params)}
        changes = {p: x[i] for i, p in enumerate(params)}
        if price_model is not None:
            changes[price_param] = base_price + extra(values)
        out = simulate(model, hw_params.set_values(system, changes), plan, cal)
        return getattr(out, metric), out.infeasible

    return f, metric


def tune_continuous(
    model: ModelSpec,
    system: SystemSpec,
    plan: Plan,
    cal: Calibration,
    params: Mapping[str, tuple[float, float]],
    price_model: PriceModel = None,
    objective: str = "time",
    steps: int = 300,
    lr: float = 0.1,
) -> TuneResult:
    """Minimise time (``"time"``) or cost (``"cost"``) to train over ``params`` = {parameter:
    (low, high)} by Adam on ``log(objective)`` with each parameter ``low + (high-low)*sigmoid(z)``.

    ``price_model``: None (the GPU's price is fixed), a mapping {parameter: USD per GPU-hour per
    unit} (linear, relative to the system's current values), or a JAX-traceable callable
    ``values -> USD per GPU-hour added`` (``values`` maps paths to scalars). The search starts
    from the system's values (clipped into the box) and returns the best point visited.
    """
    if steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps}")
    resolved, lo, hi = _box(params)
    f, metric = _objective_fn(model, system, plan, cal, resolved, price_model, objective)
    model, plan = _float_specs(model), _float_specs(plan)
    start = np.array([float(hw_params.get(_float_specs(system), p)) for p in resolved], np.float32)
    frac = np.clip((start - lo) / (hi - lo), 0.02, 0.98)
    z0 = jnp.asarray(np.log(frac / (1.0 - frac)), jnp.float32)
    lo_j, hi_j = jnp.asarray(lo), jnp.asarray(hi)

    def to_x(z):
        return lo_j + (hi_j - lo_j) * jax.nn.sigmoid(z)

    def loss(z):
        value, _ = f(to_x(z))
        return jnp.log(value)

    @jax.jit
    def run(z0):
        z, best_z, best, history = adam(jax.value_and_grad(loss), z0, steps, lr, corrections="float32")
        last = loss(z)
        best_z = jnp.where(last < best, z, best_z)
        x = to_x(best_z)
        value, flags = f(x)
        start_value, _ = f(to_x(z0))
        return x, value, flags, start_value, history

    x, value, flags, start_value, history = run(z0)
    x = np.asarray(x, np.float64)
    return TuneResult(
        values={p.path: float(v) for p, v in zip(resolved, x, strict=True)},
        objective=float(value),
        metric=metric,
        start_values={p.path: float(lo[i] + (hi[i] - lo[i]) * frac[i]) for i, p in enumerate(resolved)},
        start_objective=float(start_value),
        feasible=int(flags) == 0,
        history=np.exp(np.asarray(history, np.float64)),
    )


def grid_continuous(
    model: ModelSpec,
    system: SystemSpec,
    plan: Plan,
    cal: Calibration,
    params: Mapping[str, tuple[float, float]],
    price_model: PriceModel = None,
    objective: str = "time",
    points: int = 101,
) -> TuneResult:
    """The best point of a ``points``-per-parameter grid over the same box (vectorized; feasible
    points only), the reference for :func:`tune_continuous`."""
    if points < 2:
        raise ValueError(f"points must be at least 2; got {points}")
    resolved, lo, hi = _box(params)
    if points ** len(resolved) > 4_000_000:
        raise ValueError(f"{points}^{len(resolved)} grid points is too many; lower points")
    f, metric = _objective_fn(model, system, plan, cal, resolved, price_model, objective)
    model, plan = _float_specs(model), _float_specs(plan)
    axes = [np.linspace(lo[i], hi[i], points, dtype=np.float32) for i in range(len(resolved))]
    grid = np.stack([a.reshape(-1) for a in np.meshgrid(*axes, indexing="ij")], axis=1)
    values, flags = jax.jit(jax.vmap(f))(jnp.asarray(grid))
    values = np.where(np.asarray(flags) == 0, np.asarray(values, np.float64), np.inf)
    i = int(np.argmin(values))
    best = {p.path: float(grid[i, j]) for j, p in enumerate(resolved)}
    return TuneResult(
        values=best,
        objective=float(values[i]),
        metric=metric,
        start_values=best,
        start_objective=float(values[i]),
        feasible=bool(np.isfinite(values[i])),
        history=np.sort(values)[:1],
    )
