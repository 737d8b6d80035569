"""Adam (Kingma & Ba, ICLR 2015, Algorithm 1) as one pure, traceable loop.

Both gradient descents of the project run it: the calibration fit (:func:`hetersim.fit.fit`) and
``dse``'s continuous hardware tuning (:func:`dse.sensitivity.tune_continuous`). It is a
``jax.lax.scan``, so the caller compiles it once with ``jax.jit`` and no step returns to Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class AdamResult(NamedTuple):
    x: Any  # the iterate after the last step
    best_x: Any  # the evaluated iterate of lowest value (the one after the last step is not evaluated)
    best: Any  # its value
    history: Any  # [steps] the value at each step's iterate, before its update


def adam(
    value_and_grad: Callable[[Any], tuple[Any, Any]],
    x0: Any,
    steps: int,
    lr: float,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    corrections: Literal["float64", "float32"] = "float64",
) -> AdamResult:
    """``steps`` Adam steps on the array ``x0`` with a constant learning rate ``lr``.

    ``value_and_grad(x)`` returns the scalar objective and its gradient at ``x``. ``corrections``
    says where the bias corrections ``1 - b**t`` are computed: on the host in float64, rounded
    once to float32 (the calibration fit), or inside the loop in float32 from the step count (the
    hardware tuning). They are not the same numbers (``1 - 0.999**t`` in float32 is off by up to
    0.3% in the first steps), so each caller keeps the one its recorded figures came from.
    """
    if corrections == "float64":
        c1 = np.array([1 - b1**t for t in range(1, steps + 1)], np.float32)
        c2 = np.array([1 - b2**t for t in range(1, steps + 1)], np.float32)
        xs: Any = (c1, c2)

        def correction(x):
            return x

    elif corrections == "float32":
        xs = jnp.arange(steps, dtype=jnp.float32)

        def correction(t):
            return 1.0 - b1 ** (t + 1.0), 1.0 - b2 ** (t + 1.0)

    else:
        raise ValueError(f"corrections must be float64 or float32; got {corrections!r}")

    def step(carry, x):
        z, m, v, best_z, best = carry
        value, g = value_and_grad(z)
        better = value < best
        best_z = jnp.where(better, z, best_z)
        best = jnp.where(better, value, best)
        c1, c2 = correction(x)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        z = z - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)
        return (z, m, v, best_z, best), value

    zeros = jnp.zeros_like(x0)
    (z, _, _, best_z, best), history = jax.lax.scan(step, (x0, zeros, zeros, x0, jnp.inf), xs)
    return AdamResult(z, best_z, best, history)
