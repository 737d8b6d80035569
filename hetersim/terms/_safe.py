"""Gradient-safe arithmetic (jax-md's ``safe_mask``): no NaN gradient at a masked division."""

import jax.numpy as jnp


def safe_div(num, den, fill=0.0):
    """``num / den`` where ``den > 0``, else ``fill``; the gradient is finite everywhere."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), fill)


def safe_log2(x):
    ok = x > 0
    return jnp.where(ok, jnp.log2(jnp.where(ok, x, 1.0)), 0.0)


def pos(x):
    """max(x, 0)."""
    return jnp.maximum(x, 0.0)


def not_multiple(a, b):
    """True where ``a`` is not an integer multiple of ``b`` (float-safe)."""
    q = safe_div(a, b)
    return (b <= 0) | (jnp.abs(q - jnp.round(q)) > 1e-4) | (q < 1.0 - 1e-4)
