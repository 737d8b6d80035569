"""Heterogeneous clusters: mixes of device kinds in one job."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetersim import build
from hetersim.cluster import MAX_GROUPS, check_plan, cluster_spec, simulate_cluster
from hetersim.simulate import STEP_TERMS, simulate
from hetersim.types import Infeasible

sim_cluster = jax.jit(simulate_cluster)
sim = jax.jit(simulate)
PROPS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _plan(n, **kw):
    opts = dict(n_gpus=n, tp=8, pp=8, global_batch=128, seq_len=4096, sp=True, zero=1)
    opts.update(kw)
    return build.plan_spec(**opts)  # dp = n / (tp*pp*cp)


def _run(catalog, cal, groups, mode="pipeline", fixed=None, model="llama2-70b", **plan):
    entries = [(catalog.gpu(k), c) for k, c in groups]
    cl = cluster_spec(entries, catalog.links, mode, fixed)
    n = sum(c for _, c in groups)
    m = build.model_spec(catalog.model(model))
    return sim_cluster(m, cl, _plan(n, **plan), cal)


@pytest.mark.parametrize("mode, plan", [("pipeline", {}), ("data", dict(pp=4))])
def test_mix_of_identical_groups_equals_homogeneous(catalog, cal, mode, plan):
    mixed = _run(catalog, cal, [("h100-sxm-80gb", 64), ("h100-sxm-80gb", 64)], mode, **plan)
    m = build.model_spec(catalog.model("llama2-70b"))
    homo = sim(m, build.system_spec(catalog.gpu("h100-sxm-80gb"), catalog.links), _plan(128, **plan), cal)
    assert int(mixed.total.infeasible) == 0
    for k in ("step_time_s", "tokens_per_s", "mfu", *STEP_TERMS):
        assert float(getattr(mixed.total, k)) == pytest.approx(float(getattr(homo, k)), rel=1e-4, abs=1e-6), k
    # Memory is priced per stage (the first holds the most micro-batches, the last the logits);
    # the homogeneous model counts both on its busiest stage, an upper bound. One pipeline stage
    # group per kind (data mode) is that same busiest stage.
    mixed_hbm, homo_hbm = float(mixed.total.hbm_used_GiB), float(homo.hbm_used_GiB)
    if mode == "data":
        assert mixed_hbm == pytest.approx(homo_hbm, rel=1e-5)
    else:
        assert homo_hbm * 0.9 < mixed_hbm < homo_hbm


@pytest.mark.parametrize("mode, plan", [("pipeline", {}), ("data", dict(pp=4))])
def test_mix_lies_between_the_homogeneous_clusters(catalog, cal, mode, plan):
    h100 = _run(catalog, cal, [("h100-sxm-80gb", 128)], mode, **plan)
    h200 = _run(catalog, cal, [("h200-sxm-141gb", 128)], mode, **plan)
    mix = _run(catalog, cal, [("h100-sxm-80gb", 64), ("h200-sxm-141gb", 64)], mode, **plan)
    lo, hi = sorted([float(h100.total.tokens_per_s), float(h200.total.tokens_per_s)])
    assert lo * (1 - 1e-5) <= float(mix.total.tokens_per_s) <= hi * (1 + 1e-5)
    print(f"\n{mode}: H100 {float(h100.total.step_time_s):.2f}s  mix {float(mix.total.step_time_s):.2f}s  "
          f"H200 {float(h200.total.step_time_s):.2f}s")  # fmt: skip


def test_balanced_split_is_never_slower_than_uniform(catalog, cal):
    groups = [("a100-sxm-80gb", 64), ("h100-sxm-80gb", 64)]
    balanced = _run(catalog, cal, groups)
    uniform = _run(catalog, cal, groups, fixed=[10, 10])
    assert int(balanced.total.infeasible) == 0 and int(uniform.total.infeasible) == 0
    assert float(balanced.total.step_time_s) <= float(uniform.total.step_time_s)
    # A fixed split that does not add up to the model's layers is flagged.
    short = _run(catalog, cal, groups, fixed=[5, 5])
    assert int(short.total.infeasible) & Infeasible.LAYERS_DIVIDE
    layers = np.asarray(balanced.group_layers)[:2]
    assert layers[1] > layers[0]  # the faster H100 stages take more layers
    assert float(np.sum(np.asarray(balanced.group_stages)[:2] * layers)) >= 80


@PROPS
@given(a=st.integers(2, 8))
def test_moving_a_layer_off_the_slowest_stage_never_raises_the_steady_state(catalog, cal, a):
    # Four stages on each kind, 80 layers: a fixed split (a, 20 - a) per stage.
    groups = [("a100-sxm-80gb", 64), ("h100-sxm-80gb", 64)]
    before = _run(catalog, cal, groups, fixed=[a, 20 - a])
    t = np.asarray(before.group_stage_time_s)[:2]
    slow, fast = int(np.argmax(t)), int(np.argmin(t))
    split = [a, 20 - a]
    cost_fast = t[fast] / split[fast]
    if t[fast] + cost_fast > t[slow] or split[slow] <= 1:
        return  # the moved layer would not fit under the old maximum
    split[slow] -= 1
    split[fast] += 1
    after = _run(catalog, cal, groups, fixed=split)
    assert float(np.max(np.asarray(after.group_stage_time_s))) <= float(np.max(t)) * (1 + 1e-6)


def test_memory_capacity_differs_per_group(catalog, cal):
    out = _run(catalog, cal, [("h100-sxm-80gb", 64), ("h200-sxm-141gb", 64)])
    caps = np.asarray(jax.tree.map(lambda x: x, out.total.hbm_capacity_GiB))
    assert float(caps) in (80.0, 141.0)
    assert np.asarray(out.group_hbm_used_GiB)[:2].min() > 0


def test_cluster_vmaps_over_mixes(catalog, cal):
    entries = [(catalog.gpu("h100-sxm-80gb"), 64), (catalog.gpu("h200-sxm-141gb"), 64)]
    a = cluster_spec(entries, catalog.links)
    b = cluster_spec(entries[::-1], catalog.links)
    both = jax.tree.map(lambda x, y: np.stack([x, y]), a, b)
    m = build.model_spec(catalog.model("llama2-70b"))
    out = jax.jit(jax.vmap(simulate_cluster, in_axes=(None, 0, None, None)))(m, both, _plan(128), cal)
    one = sim_cluster(m, a, _plan(128), cal)
    assert float(out.total.step_time_s[0]) == pytest.approx(float(one.total.step_time_s), rel=1e-6)
    assert out.group_layers.shape == (2, MAX_GROUPS)


def test_bad_cluster_input(catalog):
    with pytest.raises(ValueError, match="unknown gpu"):
        catalog.gpu("h999")
    with pytest.raises(ValueError, match="positive integer"):
        cluster_spec([(catalog.gpu("h100-sxm-80gb"), 0)], catalog.links)
    with pytest.raises(ValueError, match="^hetero must be one of"):
        cluster_spec([(catalog.gpu("h100-sxm-80gb"), 8)], catalog.links, mode="tensor")
    with pytest.raises(ValueError, match="cannot span two device kinds"):
        check_plan(
            [(catalog.gpu("h100-sxm-80gb"), 12), (catalog.gpu("h200-sxm-141gb"), 4)], dict(tp=8, dp=1), "pipeline"
        )


MIX_STUDY = """
name = "tiny_mix"
[model]
key = "llama2-7b"
[hardware]
cluster = ["h100-sxm-80gb:16", "h100-sxm-80gb:8,h200-sxm-141gb:8"]
hetero = "pipeline"
[plan]
tp = [2, 4]
pp = [2, 4]
micro_batch = 1
zero = 1
global_batch = 32
seq_len = 2048
"""


def test_sweep_of_mixes_equals_simulate_cluster(tmp_path, cal):
    import xarray as xr

    from dse.study import parse_study
    from dse.sweep import run_sweep, space_from_study

    path = tmp_path / "mix.toml"
    path.write_text(MIX_STUDY)
    out = run_sweep(path, tmp_path, progress=False)
    ds = xr.open_dataset(out)
    space = space_from_study(parse_study(MIX_STUDY))
    assert ds.sizes["config"] == space.size == 8
    for i in range(space.size):
        m, cl, p = space.specs(i)
        one = sim_cluster(m, cl, p, cal).total
        assert float(ds["step_time_s"][i]) == pytest.approx(float(one.step_time_s), rel=1e-5)
        assert int(ds["infeasible"][i]) == int(one.infeasible)


@pytest.mark.parametrize(
    "line, message",
    [
        ('cluster = ["h100-sxm-80gb"]', "must be KIND:COUNT"),
        ('cluster = ["h100-sxm-80gb:0"]', "positive count"),
        ('cluster = ["nope:8"]', "unknown gpu"),
        ('cluster = ["h100-sxm-80gb:8"]\nhetero = "tensor"', "hardware.hetero: must be one of"),
        ('cluster = ["h100-sxm-80gb:8"]\ngpu = "b200"', "either hardware.gpu or hardware.cluster"),
    ],
)
def test_bad_cluster_studies_are_rejected(line, message):
    from dse.study import parse_study

    text = MIX_STUDY.replace(
        'cluster = ["h100-sxm-80gb:16", "h100-sxm-80gb:8,h200-sxm-141gb:8"]\nhetero = "pipeline"', line
    )
    with pytest.raises(ValueError, match=message):
        parse_study(text, origin="mix.toml")


def test_cli_evaluates_a_mix_and_rejects_bad_ones():
    import json

    from typer.testing import CliRunner

    from dse.cli import app

    runner = CliRunner()
    base = ["evaluate", "--model", "llama2-70b", "--tp", "8", "--pp", "8", "--global-batch", "256", "--zero", "1"]
    res = runner.invoke(app, [*base, "--cluster", "h100-sxm-80gb:64,h200-sxm-141gb:64", "--gpus", "128", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [g["gpus"] for g in out["groups"]] == [64, 64]
    assert sum(g["stages"] * g["layers_per_stage"] for g in out["groups"]) >= 80
    bad = [
        (
            [*base[:6], "2", *base[7:], "--cluster", "h100-sxm-80gb:12,h200-sxm-141gb:4", "--gpus", "16"],
            "cannot span two device kinds",
        ),
        ([*base, "--cluster", "h100-sxm-80gb:0", "--gpus", "8"], "positive count"),
        ([*base, "--cluster", "h999:8", "--gpus", "8"], "unknown gpu"),
        ([*base, "--cluster", "h100-sxm-80gb:64", "--gpus", "128"], "must equal the --cluster total"),
        ([*base, "--gpus", "128"], "give one of --gpu"),
    ]
    for args, message in bad:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output and res.output.strip().count("\n") == 0


def test_two_groups_never_share_an_nvlink_domain(catalog, cal):
    """Groups smaller than a node: the data-parallel ring between them crosses the scale-out NICs,
    so a 4 + 4 "mix" of one kind equals the homogeneous job on two 4-GPU NVLink islands and is
    slower than the same job inside one 8-GPU NVLink domain."""
    opts = dict(tp=4, pp=1, global_batch=64, sp=False, zero=0)
    mixed = _run(catalog, cal, [("a100-sxm-80gb", 4), ("a100-sxm-80gb", 4)], "data", model="llama2-7b", **opts)
    m = build.model_spec(catalog.model("llama2-7b"))
    a100 = catalog.gpu("a100-sxm-80gb")
    islands = sim(m, build.system_spec(a100, catalog.links, scaleup_domain=4), _plan(8, **opts), cal)
    one_node = sim(m, build.system_spec(a100, catalog.links), _plan(8, **opts), cal)
    assert float(mixed.total.dp_comm_s) == pytest.approx(float(islands.dp_comm_s), rel=1e-5)
    assert float(mixed.total.dp_comm_s) > 10 * float(one_node.dp_comm_s)
