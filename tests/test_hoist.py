"""Layer costs hoisted out of the per-configuration path (dse.sweep.hoist): the window bound holds
for every chunk of every group, the columns read are the ones the program reaches, and a chunk
gives the numbers of the unhoisted program."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dse.sweep.evaluate as sweep_evaluate
from dse import sweep
from dse.bench import bench_space
from dse.sweep import hoist
from dse.sweep.space import digits


def _widest(radices, read, chunk, lead):
    """The most distinct reduced indices of one group in any chunk, by enumeration."""
    size = math.prod(radices)
    widest = 0
    for start in range(size):
        idx = np.minimum(start + np.arange(chunk), size - 1)
        d = digits(idx, radices)
        group = np.zeros(chunk, np.int64)
        for j in range(lead):
            group = group * radices[j] + d[j]
        reduced = np.zeros(chunk, np.int64)
        for j, r in enumerate(radices):
            if read[j]:
                reduced = reduced * r + d[j]
        for g in np.unique(group):
            r = reduced[group == g]
            widest = max(widest, int(r.max() - r.min()) + 1)
    return widest


@pytest.mark.parametrize("seed", range(40))
def test_the_window_bounds_every_chunk_of_every_group(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 6))
    radices = [int(r) for r in rng.integers(1, 5, n)]
    read = [bool(b) for b in rng.integers(0, 2, n)]
    lead = int(rng.integers(0, min(2, n) + 1))
    chunk = int(rng.integers(1, 40))
    widest = _widest(radices, read, chunk, lead)
    bound = hoist.window(radices, read, chunk, lead)
    assert widest <= bound, (radices, read, lead, chunk)
    # Not loose where it matters: a read factor innermost gives one row per configuration.
    if read[-1] and radices[-1] > 1 and lead < n - 1:
        assert bound >= min(chunk, radices[-1])


def test_used_columns_are_those_the_outputs_reach():
    col = {"a": jnp.ones(4), "b": jnp.ones(4), "c": jnp.ones(4)}

    def fn(c):
        unused = c["c"] * 2.0  # computed, never returned
        del unused
        return {"x": c["a"] + 1.0, "y": jnp.where(c["a"] > 0, c["b"], 0.0)}

    assert hoist.used_columns(fn, col) == {"a", "b"}
    assert hoist.used_columns(lambda c: c["c"].sum(), col) == {"c"}

    # Inside a trace, closing over its tracers (as the chunk function does).
    @jax.jit
    def outer(scale):
        return hoist.used_columns(lambda c: c["b"] * scale, col) == {"b"}

    assert outer(jnp.float32(2.0))


def test_the_bench_space_hoists_and_gives_the_unhoisted_numbers(cal, monkeypatch):
    """ZeRO is a factor of the bench space that the layer costs do not read: a chunk evaluates
    them for about a quarter of its configurations, and every output, in a chunk inside a group,
    one straddling two groups and the padded last one, equals the unhoisted program's within
    float32 rounding (XLA fuses the two programs differently)."""
    space = bench_space(6000)
    tables = space.tables()
    chunk = 1024
    calls = []
    real = hoist.hoisted_layer_costs

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(hoist, "hoisted_layer_costs", spy)
    starts = (0, space.size // 4 - chunk // 3, (space.size // chunk) * chunk)
    hoisted = [sweep.evaluate_chunk(np.int32(s), tables, cal, chunk=chunk, kinds=space.kinds) for s in starts]
    assert calls and all(calls)
    factors = tables["factors"]
    radices = sweep_evaluate.factor_radices(factors)
    read = [("tp" in t) or ("recompute" in t) or ("precision" in t) for t in factors]
    assert hoist.window(radices, read, chunk, 2) <= chunk // 3

    monkeypatch.setattr(hoist, "ENABLED", False)  # the per-configuration program
    calls.clear()
    fresh = sweep_evaluate._ChunkFunction()
    plain = [fresh(np.int32(s), tables, cal, chunk=chunk, kinds=space.kinds) for s in starts]
    assert not calls
    for got, want in zip(hoisted, plain, strict=True):
        for name in want:
            a, b = np.asarray(got[name]), np.asarray(want[name])
            if a.dtype.kind == "f":
                np.testing.assert_allclose(a, b, rtol=2e-6, atol=0, err_msg=name)
            else:
                np.testing.assert_array_equal(a, b, name)


def test_layer_costs_passed_in_give_the_same_breakdown(catalog, cal):
    """simulate with the layer costs computed apart (plan_layer_costs) equals simulate computing
    them itself, for a dense and an MoE layout."""
    from hetersim.simulate import plan_layer_costs, simulate

    from .conftest import make

    for args in (
        make(catalog, "llama2-70b", tp=8, pp=4, vp=5, n_gpus=512, global_batch=1024, recompute="selective"),
        make(catalog, "mixtral-8x7b", tp=1, pp=1, ep=8, n_gpus=64, global_batch=256, sp=False),
    ):
        model, system, plan = args
        own = jax.jit(simulate)(model, system, plan, cal)
        given = jax.jit(simulate)(model, system, plan, cal, plan_layer_costs(model, system, plan, cal))
        for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(given), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=0)
