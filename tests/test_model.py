"""Physical properties, batching, precision, compilation and gradients of the cost model."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetersim import build
from hetersim.simulate import STEP_TERMS, simulate
from hetersim.types import Infeasible

from .conftest import enable_x64, make

sim = jax.jit(simulate)

LAYOUTS = st.fixed_dictionaries(
    {
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.sampled_from([1, 2, 4]),
        "cp": st.sampled_from([1, 2]),
        "micro_batch": st.sampled_from([1, 2]),
        "zero": st.sampled_from([0, 1, 2, 3]),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "precision": st.sampled_from(["bf16", "fp8"]),
        "sp": st.booleans(),
        "model": st.sampled_from(["llama2-7b", "llama2-70b", "gpt3-175b", "llama3-8b"]),
        "gpu": st.sampled_from(["a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200"]),
    }
)
PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _specs(catalog, layout):
    layout = dict(layout)
    model, gpu = layout.pop("model"), layout.pop("gpu")
    if gpu == "a100-sxm-80gb" and layout["precision"] == "fp8":
        layout["precision"] = "bf16"
    return make(catalog, model=model, gpu=gpu, n_gpus=64, global_batch=128, **layout)


def _scale(tree, field_path, factor):
    """Return ``tree`` with the leaf at ``field_path`` (e.g. ('device', 'hbm_bw_GBps')) scaled."""
    head, *rest = field_path
    value = getattr(tree, head)
    new = _scale(value, rest, factor) if rest else value * factor
    return dataclasses.replace(tree, **{head: new})


@PROPS
@given(layout=LAYOUTS, factor=st.floats(1.01, 4.0))
@pytest.mark.parametrize(
    "field",
    [("device", "hbm_bw_GBps"), ("device", "peak_tflops"), ("network", "bw_GBps"), ("host", "tier_path_GBps")],
)
def test_more_bandwidth_or_flops_is_never_slower(catalog, cal, layout, factor, field):
    m, s, p = _specs(catalog, layout)
    base = sim(m, s, p, cal).step_time_s
    faster = sim(m, _scale(s, field, factor), p, cal).step_time_s
    assert float(faster) <= float(base) * (1 + 1e-5)


@PROPS
@given(layout=LAYOUTS)
def test_breakdown_adds_up_and_tp1_has_no_tp_traffic(catalog, cal, layout):
    m, s, p = _specs(catalog, layout)
    out = sim(m, s, p, cal)
    total = sum(float(getattr(out, k)) for k in STEP_TERMS)
    assert total == pytest.approx(float(out.step_time_s), rel=1e-5)
    assert all(float(getattr(out, k)) >= 0 for k in STEP_TERMS)
    if layout["tp"] == 1:
        assert float(out.tp_comm_s) == 0.0
    if layout["cp"] == 1:
        assert float(out.cp_comm_s) == 0.0
    if layout["pp"] == 1:
        assert float(out.bubble_s) == 0.0 and float(out.pp_comm_s) == 0.0


@PROPS
@given(layout=LAYOUTS)
def test_feasible_fits_in_hbm_and_flags_are_consistent(catalog, cal, layout):
    m, s, p = _specs(catalog, layout)
    out = sim(m, s, p, cal)
    used, cap = float(out.hbm_used_GiB), float(out.hbm_capacity_GiB)
    flags = int(out.infeasible)
    assert np.isfinite(float(out.step_time_s))
    if flags == 0:
        assert used <= cap
    assert bool(flags & Infeasible.HBM_CAPACITY) == (used > cap)


def test_infeasible_configurations_stay_finite_and_name_their_reason(catalog, cal):
    # 70B with no recompute on 8 GPUs does not fit; 10 heads do not divide tp=8 for a toy model
    m, s, p = make(catalog, n_gpus=8, tp=1, pp=1, zero=0, recompute="none", global_batch=8)
    out = sim(m, s, p, cal)
    assert int(out.infeasible) & Infeasible.HBM_CAPACITY
    assert np.isfinite(float(out.step_time_s)) and float(out.step_time_s) > 0
    toy = build.model_spec(dict(layers=4, hidden=640, heads=10, ffn_hidden=2560, vocab=1000))
    out = sim(toy, s, build.plan_spec(n_gpus=8, tp=8, global_batch=8, seq_len=128), cal)
    assert "attention heads or KV heads are not divisible by tp" in Infeasible.describe(int(out.infeasible))


def test_vmap_equals_one_at_a_time(catalog, cal):
    layouts = [dict(tp=8, pp=2), dict(tp=4, pp=4, vp=5), dict(tp=2, pp=1, cp=2, zero=3), dict(tp=8, pp=8, vp=2)]
    specs = [make(catalog, **lay) for lay in layouts]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *specs)
    batched = jax.jit(jax.vmap(simulate, in_axes=(0, 0, 0, None)))(*stacked, cal)
    for i, (m, s, p) in enumerate(specs):
        one = sim(m, s, p, cal)
        for leaf_b, leaf_1 in zip(jax.tree.leaves(batched), jax.tree.leaves(one), strict=True):
            np.testing.assert_allclose(np.asarray(leaf_b)[i], np.asarray(leaf_1), rtol=1e-6)


def test_float32_agrees_with_float64_reference(catalog, cal):
    m, s, p = make(catalog, tp=4, pp=4, vp=5, cp=2, zero=1, recompute="selective")
    out32 = simulate(m, s, p, cal)
    with enable_x64():
        up = lambda t: jax.tree.map(lambda x: x.astype(jnp.float64) if x.dtype == jnp.float32 else x, t)  # noqa: E731
        out64 = simulate(up(m), up(s), up(p), up(cal))
        ref = {k: float(getattr(out64, k)) for k in ("step_time_s", "mfu", "hbm_used_GiB", *STEP_TERMS)}
    assert jnp.asarray(out32.step_time_s).dtype == jnp.float32
    for k, v in ref.items():
        assert float(getattr(out32, k)) == pytest.approx(v, rel=1e-4, abs=1e-7)


def test_new_values_do_not_recompile(catalog, cal):
    traces = []

    @jax.jit
    def f(m, s, p, c):
        traces.append(1)
        return simulate(m, s, p, c).step_time_s

    for lay in (dict(tp=8, pp=2), dict(tp=4, pp=4, vp=5, zero=3), dict(tp=1, pp=1, cp=2, recompute="full")):
        for gpu in ("h100-sxm-80gb", "b200"):
            f(*make(catalog, gpu=gpu, **lay), cal)
    assert len(traces) == 1


CONTINUOUS = [
    ("device", "hbm_bw_GBps"),
    ("device", "peak_tflops"),
    ("device", "hbm_capacity_GiB"),
    ("network", "bw_GBps"),
    ("network", "latency_us"),
    ("network", "busbw_eff"),
    ("host", "tier_path_GBps"),
]


@pytest.mark.parametrize("field", CONTINUOUS)
def test_gradients_are_finite_and_match_finite_differences(catalog, cal, field):
    m, s, p = make(catalog, n_gpus=128, tp=4, pp=4, vp=5, zero=3, global_batch=256)
    head, leaf = field

    def step(x):
        sub = dataclasses.replace(getattr(s, head), **{leaf: x})
        return simulate(m, dataclasses.replace(s, **{head: sub}), p, cal).step_time_s

    x0 = getattr(getattr(s, head), leaf)
    g = jax.grad(step)(x0)
    assert np.all(np.isfinite(np.asarray(g)))
    # Central differences in float64 along a random direction.
    with enable_x64():
        up = lambda t: jax.tree.map(lambda v: v.astype(jnp.float64) if v.dtype == jnp.float32 else v, t)  # noqa: E731
        m64, s64, p64, c64 = up(m), up(s), up(p), up(cal)
        x64 = getattr(getattr(s64, head), leaf)

        def step64(x):
            sub = dataclasses.replace(getattr(s64, head), **{leaf: x})
            return simulate(m64, dataclasses.replace(s64, **{head: sub}), p64, c64).step_time_s

        d = np.random.default_rng(0).uniform(0.5, 1.0, np.shape(x64)) * np.asarray(x64)
        eps = 1e-6
        fd = (step64(x64 + eps * d) - step64(x64 - eps * d)) / (2 * eps)
        analytic = float(np.sum(np.asarray(jax.grad(step64)(x64)) * d))
    assert analytic == pytest.approx(float(fd), rel=1e-3, abs=1e-9)
    assert float(np.sum(np.asarray(g) * d)) == pytest.approx(analytic, rel=1e-2, abs=1e-6)


@pytest.mark.parametrize(
    "layers, pp, vp, runs",
    [
        (32, 4, 2, True),  # 32 = 4 x 2 x 4
        (32, 4, 3, False),  # 32, 33, 34 are no multiples of 12
        (126, 8, 8, True),  # LLaMA-3-405B as NVIDIA runs it: 126 + embedding + loss = 128 = 8 x 8 x 2
        (95, 4, 2, True),  # 95 + 1 = 96: the embedding counted as a layer
        (30, 4, 1, True),  # one chunk per stage may split unevenly (Megatron's first/last-stage layers)
        (7, 4, 2, False),  # fewer layers than chunks
    ],
)
def test_interleaving_rule_of_the_model_and_of_the_front_door_agree(catalog, cal, layers, pp, vp, runs):
    """Megatron-LM's interleaved split (megatron/core/transformer/transformer_block.py
    get_num_layers_to_build @ d98e8a64dd): layers per pipeline rank, the embedding and the loss
    optionally counted as one layer each, divisible by vp. The model flags what the one-line
    check of :func:`hetersim.api.check_layout` refuses, and nothing else."""
    from hetersim.api import check_layout
    from hetersim.types import FieldError

    entry = dict(catalog.model("llama2-7b"), layers=layers)
    opts = dict(n_gpus=8 * pp, tp=8, pp=pp, vp=vp, global_batch=64 * pp, micro_batch=1, seq_len=4096)
    out = simulate(build.model_spec(entry), build.system_spec(catalog.gpu("h100-sxm-80gb"), catalog.links),
                   build.plan_spec(**opts), cal)  # fmt: skip
    assert bool(int(out.infeasible) & Infeasible.LAYERS_DIVIDE) == (not runs)
    if runs or layers < pp * vp:  # too few layers is the model's flag alone (a sweep's data)
        check_layout(entry, opts, opts)
    else:
        with pytest.raises(FieldError, match="divisible by pp\\*vp"):
            check_layout(entry, opts, opts)


def test_gradients_reduced_in_fp32_double_the_wire_bytes_and_leave_memory_alone(catalog, cal):
    """``grad_reduce = fp32`` (DeepSpeed's fp32_allreduce) sends a 16-bit DeepSpeed plan's
    gradients as fp32: twice the bandwidth time of its data-parallel sync (nothing hidden here,
    to see the collective itself), the same gradient memory; ``model`` is what a 16-bit DeepSpeed
    plan reduces in already."""
    cal0 = dataclasses.replace(cal, dp_overlap=0.0)
    base = dict(model="gpt3-1.3b", gpu="a100-sxm-80gb", n_gpus=16, tp=1, pp=1, global_batch=32, seq_len=2048)
    base.update(sp=False, zero=0, precision="fp16", stack="deepspeed", bucket_Mparams=1e4)
    out = {g: jax.jit(simulate)(*make(catalog, **base, grad_reduce=g), cal0) for g in ("auto", "fp32", "model")}
    assert float(out["model"].dp_comm_s) == pytest.approx(float(out["auto"].dp_comm_s), rel=1e-6)
    assert 1.8 < float(out["fp32"].dp_comm_s) / float(out["auto"].dp_comm_s) <= 2.0
    assert float(out["fp32"].grads_GiB) == pytest.approx(float(out["auto"].grads_GiB), rel=1e-6)


def test_a_tied_embedding_is_synchronised_between_the_first_and_the_last_stage(catalog, cal):
    """With a pipeline, the first stage's embedding and the last stage's head are one tied matrix
    held twice: its gradient is all-reduced between them after the backward (Megatron-LM,
    DeepSpeed's ReduceTiedGrads) -- vocab x hidden / tp gradients over the link between the two
    stages; nothing without a pipeline or with an untied head."""
    from hetersim import simulate as sim_mod

    m_untied, s, _ = make(catalog, "llama2-7b")
    m = dataclasses.replace(m_untied, tied_embeddings=jnp.asarray(1.0))
    grid = dict(n_gpus=32, tp=4, global_batch=64, seq_len=4096, sp=True, zero=1)
    p4, p1 = build.plan_spec(pp=4, **grid), build.plan_spec(pp=1, **grid)
    t = float(sim_mod.tied_embedding_sync_s(m, s, p4))
    nbytes = float(m.vocab * m.hidden) / 4 * 2.0  # Megatron's distributed optimizer: 16-bit grads
    nic = float(s.network.bw_GBps[-1] * s.network.busbw_eff[-1]) * 1e9
    assert t == pytest.approx(nbytes / nic, rel=0.05)  # two ranks in different nodes: M / busbw
    assert float(sim_mod.tied_embedding_sync_s(m, s, p1)) == 0.0
    assert float(sim_mod.tied_embedding_sync_s(m_untied, s, p4)) == 0.0
    tied, untied = (float(jax.jit(simulate)(mm, s, p4, cal).dp_comm_s) for mm in (m, m_untied))
    assert tied == pytest.approx(untied + t, rel=1e-5)


def test_zero3_without_prefetch_exposes_every_weight_gather(catalog, cal):
    """ZeRO-3 whose gathers wait for the device (DeepSpeed <= 0.4) shows all of their bandwidth
    time in the step; with prefetch they hide behind the passes they feed, never slower. Its
    tensor-list collectives hold one more copy of the largest matrix (weights, or the gradients
    where those are wider): the only memory that differs."""
    from hetersim.terms import memory

    base = dict(n_gpus=64, tp=1, pp=1, global_batch=64, seq_len=2048, sp=False, zero=3, micro_batch=1)
    specs = {flag: make(catalog, "llama2-7b", **base, zero3_prefetch=flag) for flag in (True, False)}
    pre, wait = (jax.jit(simulate)(*specs[flag], cal) for flag in (True, False))
    assert float(wait.dp_comm_s) > float(pre.dp_comm_s)
    assert float(wait.step_time_s) > float(pre.step_time_s)
    m, _, plan = specs[False]
    flat = float(memory.largest_matrix_params(m)) * max(memory.WEIGHT_BYTES, float(memory.grad_bytes(plan)))
    assert float(wait.hbm_used_GiB) - float(pre.hbm_used_GiB) == pytest.approx(flat / 2**30, rel=1e-4)


def test_as_arrays_places_a_whole_spec_and_keeps_traced_leaves():
    """pytree.as_arrays converts on the host and places the spec with one device_put: JAX leaves,
    float32 with int32 codes; inside a trace a traced leaf stays traced (gradients flow)."""
    from hetersim.pytree import as_arrays

    p = build.plan_spec(tp=2, n_gpus=8, global_batch=8, seq_len=4096)
    leaves = jax.tree_util.tree_leaves_with_path(p)
    assert all(isinstance(v, jax.Array) for _, v in leaves)
    assert {str(v.dtype) for k, v in leaves if k[-1].name.endswith("_code")} == {"int32"}
    assert {str(v.dtype) for k, v in leaves if not k[-1].name.endswith("_code")} == {"float32"}
    assert jax.grad(lambda x: as_arrays({"a": x, "b": 3.0})["a"] * as_arrays({"b": 3.0})["b"])(1.0) == 3.0
    assert isinstance(as_arrays({"a": 1.0}, xp=np)["a"], np.ndarray)
    assert as_arrays({"a": 1.0}, dtype=jnp.float16)["a"].dtype == jnp.float16
