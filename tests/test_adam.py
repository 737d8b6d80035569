"""The one Adam loop (``hetersim.fit.adam``) that calibration and hardware tuning share."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetersim.fit import adam


@pytest.mark.parametrize("corrections", ["float64", "float32"])
def test_adam_matches_a_hand_written_loop_and_finds_the_minimum(corrections):
    target = jnp.array([1.5, -2.0], jnp.float32)

    def f(x):
        return jnp.sum((x - target) ** 2)

    vg = jax.value_and_grad(f)
    x0 = jnp.zeros(2, jnp.float32)
    res = jax.jit(lambda x: adam(vg, x, 200, 0.1, corrections=corrections))(x0)
    np.testing.assert_allclose(np.asarray(res.x), np.asarray(target), atol=1e-2)
    assert res.history.shape == (200,) and float(res.best) == float(np.min(np.asarray(res.history)))

    # Kingma & Ba, Algorithm 1, step by step in Python
    z, m, v = x0, jnp.zeros(2), jnp.zeros(2)
    for t in range(1, 201):
        _, g = vg(z)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        z = z - 0.1 * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8)
    np.testing.assert_allclose(np.asarray(res.x), np.asarray(z), rtol=1e-4, atol=1e-5)


def test_adam_rejects_an_unknown_correction():
    with pytest.raises(ValueError, match="corrections"):
        adam(jax.value_and_grad(lambda x: jnp.sum(x * x)), jnp.ones(1), 3, 0.1, corrections="float16")
