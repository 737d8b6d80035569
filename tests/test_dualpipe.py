"""DeepSeek's DualPipe schedule: its bubble, its memory and its rules (deepseek-ai/DualPipe README
and ``DualPipe.step``; the DeepSeek-V3 report, arXiv 2412.19437, §3.2.1 Table 2)."""

from __future__ import annotations

import jax
import pytest
from typer.testing import CliRunner

from dse.cli import app
from hetersim import build
from hetersim.cluster import cluster_spec, simulate_cluster
from hetersim.simulate import micro_batches, pipeline_step, simulate
from hetersim.terms import memory
from hetersim.types import Infeasible

from .conftest import make

sim = jax.jit(simulate)
LAYOUT = dict(n_gpus=64, tp=8, pp=8, global_batch=64, micro_batch=1, zero=1)


def _pair(catalog, **plan):
    opts = {**LAYOUT, **plan}
    return make(catalog, "llama2-70b", **opts), make(catalog, "llama2-70b", dualpipe=True, **opts)


def test_dualpipe_fills_and_drains_in_table_2s_share_of_1f1bs_bubble(catalog, cal):
    """(pp/2 - 1)(F&B + B - 3W) against (pp - 1)(F + B), with F&B = F + B and W half of the
    backward's weight-gradient work: at pp 8 the bubble is 3/7 x (F + 2B - 3W) / (F + B) of
    1F1B's, smaller; the steady state is the same work."""
    (m, s, p), (_, _, d) = _pair(catalog, recompute="selective")
    one, dual = pipeline_step(m, s, p, cal), pipeline_step(m, s, d, cal)
    f, b, r = float(one.fwd_s), float(one.bwd_s), float(one.recompute_s)
    w = 0.5 * (b - r)
    share = 3.0 / 7.0 * (f + 2.0 * b - 3.0 * w) / (f + b)
    assert float(dual.bubble_s) == pytest.approx(float(one.bubble_s) * share, rel=1e-5)
    assert 0.0 < float(dual.bubble_s) < float(one.bubble_s)
    assert float(dual.compute_s) == float(one.compute_s)
    # Two ranks: the two directions fill each other's pipeline; nothing is left to drain.
    (m2, s2, p2), (_, _, d2) = _pair(catalog, n_gpus=16, pp=2, global_batch=16)
    assert float(pipeline_step(m2, s2, p2, cal).bubble_s) > 0.0
    assert float(pipeline_step(m2, s2, d2, cal).bubble_s) == 0.0


def test_dualpipe_holds_two_stages_and_one_more_micro_batch(catalog):
    """'Parameter 2x, Activation PP+1' (deepseek-ai/DualPipe README): a rank holds stage i and
    stage pp-1-i. A state ZeRO shards is shared by twice the ranks, so its share stays."""
    for zero, doubled in ((0, (True, True, True)), (1, (True, True, False)), (2, (True, False, False))):
        (m, _, p), (_, _, d) = _pair(catalog, zero=zero)
        one, dual = memory.state_bytes(m, p), memory.state_bytes(m, d)
        for a, b, twice in zip(one, dual, doubled, strict=True):
            assert float(b) == pytest.approx(float(a) * (2.0 if twice else 1.0), rel=1e-6), zero
        steps = float(memory.optimizer_params(m, d)) / float(memory.optimizer_params(m, p))
        assert steps == pytest.approx(2.0 if zero == 0 else 1.0)
    (m, _, p), (_, _, d) = _pair(catalog, zero=3)
    assert [float(x) for x in memory.state_bytes(m, d)] == pytest.approx([float(x) for x in memory.state_bytes(m, p)])
    n = micro_batches(p)
    assert float(memory.inflight_microbatches(p, n)) == 8.0
    assert float(memory.inflight_microbatches(d, n)) == 9.0


@pytest.mark.parametrize(
    "plan",
    [
        dict(n_gpus=24, pp=3, global_batch=60),  # an odd number of ranks
        dict(vp=2),  # interleaved chunks
        dict(global_batch=8),  # 8 micro-batches < 2 x pp
        dict(n_gpus=32, pp=4, global_batch=9),  # an odd number of micro-batches
    ],
)
def test_a_schedule_dualpipe_cannot_run_is_flagged(catalog, cal, plan):
    """DualPipe.step's asserts: an even pp, and an even number of at least 2 x pp micro-batches;
    its ranks run one stage per direction, no interleaving. The same plans on 1F1B are not."""
    opts = {**LAYOUT, **plan}
    model, system, one = make(catalog, "llama2-70b", **opts)
    _, _, dual = make(catalog, "llama2-70b", dualpipe=True, **opts)
    assert int(sim(model, system, dual, cal).infeasible) & Infeasible.SCHEDULE
    assert not int(sim(model, system, one, cal).infeasible) & Infeasible.SCHEDULE


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--pp", "3", "--gpus", "24"], "--dualpipe needs an even --pp >= 2 and --vp 1"),
        (["--pp", "4", "--vp", "2"], "--dualpipe needs an even --pp >= 2 and --vp 1"),
        (["--pp", "4", "--global-batch", "4"], "--dualpipe needs an even number of at least 2 x --pp = 8"),
    ],
)
def test_a_dualpipe_plan_that_cannot_run_is_a_one_line_error(extra, needle):
    flags = {"--model": "llama3-70b", "--gpu": "h100-sxm-80gb", "--gpus": "64", "--tp": "8", "--global-batch": "64"}
    flags.update(zip(extra[::2], extra[1::2], strict=True))  # an option given twice is itself an error
    result = CliRunner().invoke(app, ["evaluate", *(x for kv in flags.items() for x in kv), "--dualpipe"])
    assert result.exit_code == 2, result.output
    assert needle in result.output and result.output.count("\n") == 1 and "Traceback" not in result.output


def test_a_mix_of_device_kinds_refuses_dualpipe():
    argv = (
        "evaluate --model llama2-7b --cluster a100-sxm-80gb:4,h100-sxm-80gb:4 --gpus 8 --tp 1 --pp 2 --dp 4 "
        "--hetero data --global-batch 64 --dualpipe"
    ).split()
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and "a mix of device kinds runs 1F1B" in result.output, result.output


def test_a_mixed_sweep_point_with_dualpipe_is_flagged(catalog, cal):
    """A sweep over a mix of kinds prices its stages as 1F1B, so a DualPipe point there is
    infeasible data, not a half-DualPipe price."""
    entries = [(catalog.gpu("h100-sxm-80gb"), 32), (catalog.gpu("h200-sxm-141gb"), 32)]
    model = build.model_spec(catalog.model("llama2-70b"))
    mix = cluster_spec(entries, catalog.links, "pipeline")
    flags = {}
    for dual in (False, True):
        plan = build.plan_spec(**{**LAYOUT, "seq_len": 4096, "dualpipe": dual})
        flags[dual] = int(jax.jit(simulate_cluster)(model, mix, plan, cal).total.infeasible)
    assert not flags[False] & Infeasible.SCHEDULE
    assert flags[True] & Infeasible.SCHEDULE
