"""80% prediction intervals (hetersim.fit.intervals): honest coverage, wider out of evidence."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hetersim import api
from hetersim.fit import intervals
from hetersim.fit.intervals import FLAGS, Evidence, fit_intervals, load_intervals
from hetersim.fit.runs import default_runs_path, read_runs

NONE = {f: 0.0 for f in FLAGS}
EV = Evidence(frozenset({"h100-sxm-80gb"}), frozenset({"megatron"}), 8192.0)


def _synthetic(n=200, seed=0):
    """Base residuals of spread 0.1 from 10 sources; the ``device`` rows come from 5 sources of
    their own, each biased by +0.2 or -0.2 (alternately), and are twice as noisy."""
    rng = np.random.default_rng(seed)
    dev = (np.arange(n) % 4 == 0).astype(float)
    sources = np.where(dev > 0, 100 + np.arange(n) % 5, np.arange(n) % 10)
    bias = np.where(sources % 2 == 0, 0.2, -0.2) * dev
    e = rng.normal(0.0, 0.1, n) * (1 + dev) + bias
    flags = {f: np.zeros(n) for f in FLAGS}
    flags["device"] = dev
    return e, flags, sources


def test_fit_widens_a_class_by_its_sources_without_moving_it():
    e, flags, sources = _synthetic()
    m = fit_intervals(e, flags, EV, sources)
    assert m.n["device"] == 50 and m.sources["device"] == 5 and m.n_base == 150
    # Five sources biased +-0.2 with noise 0.2: about 0.08 of variance, shrunk by 5 / (5 + 1)
    # toward the prior 2 s0^2; the excess over s0^2 widens the interval.
    assert m.extra_var["device"] > 3.0 * m.s0**2
    # A class with no rows gets the prior: as uncertain again as the base.
    assert m.n["offload"] == 0 and m.sources["offload"] == 0
    assert m.extra_var["offload"] == pytest.approx(m.s0**2)
    lo0, hi0 = intervals.log_bounds(m, NONE)
    lo1, hi1 = intervals.log_bounds(m, {**NONE, "device": 1.0})
    w = np.sqrt(1.0 + m.extra_var["device"] / m.s0**2)
    # Wider by w about the same center: the class's sources disagree in sign, and no shift is taken.
    assert hi1 - lo1 == pytest.approx(w * (hi0 - lo0))
    assert (lo1 + hi1) / 2 - m.center == pytest.approx(w * ((lo0 + hi0) / 2 - m.center))
    # The empirical 80% interval of the base covers about 80% of the base rows, the widened one
    # most of the flagged rows.
    inside = intervals.covered(m, e, flags)
    assert 0.75 <= inside[flags["device"] == 0].mean() <= 0.9
    assert inside[flags["device"] == 1].mean() >= 0.7


def test_a_class_counts_its_sources_not_its_rows():
    """One source's rows share its bias: repeating them is no new evidence, and a class seen in
    one source weighs half its own figure, half the prior (K_PSEUDO = 1 pseudo-source)."""
    e, flags, sources = _synthetic()
    one = flags["device"] > 0
    one &= sources == sources[one][0]
    keep = (flags["device"] == 0) | one
    e1, f1, s1 = e[keep], {f: v[keep] for f, v in flags.items()}, sources[keep]
    m1 = fit_intervals(e1, f1, EV, s1)
    rep = np.concatenate([np.flatnonzero(keep), np.repeat(np.flatnonzero(one), 3)])
    m3 = fit_intervals(e[rep], {f: v[rep] for f, v in flags.items()}, EV, sources[rep])
    assert m1.sources["device"] == m3.sources["device"] == 1 and m3.n["device"] == 4 * m1.n["device"]
    assert m3.extra_var["device"] == pytest.approx(m1.extra_var["device"], rel=1e-9)
    var_on = float(np.mean((e1[f1["device"] > 0] - m1.center) ** 2))
    assert m1.extra_var["device"] == pytest.approx(max(0.5 * var_on + 0.5 * 2 * m1.s0**2 - m1.s0**2, 0.0))
    # Counted as rows (each row a source of its own), the same residuals weigh far more.
    rows = fit_intervals(e1, f1, EV)
    assert rows.sources["device"] == rows.n["device"]
    with pytest.raises(ValueError, match="sources for"):
        fit_intervals(e1, f1, EV, s1[:-1])


def test_a_run_of_no_known_stack_is_flagged(catalog):
    """A published run whose source matches no stack entry is priced with the default profile, but
    the fit has no evidence of what it ran: its stack flag is set, a matched Megatron run's not."""

    rows = read_runs(default_runs_path())[:1]
    assert rows[0].stack is not None
    unknown = dataclasses.replace(rows[0], stack=None)
    ev = Evidence(frozenset({"a100-sxm-80gb"}), frozenset({intervals.stack_key(rows[0].stack)}), 8192.0)
    flags = intervals.row_flags([rows[0], unknown], catalog, ev)
    assert list(flags["stack"]) == [0.0, 1.0]
    assert intervals.evidence_of([unknown], np.array([True])).stacks == frozenset()


def test_bounds_always_contain_the_prediction():
    e, flags, sources = _synthetic()
    m = fit_intervals(e + 0.5, flags, EV, sources)  # a model biased far too fast: the center is off zero
    lo, hi = intervals.log_bounds(m, NONE)
    assert lo <= 0.0 <= hi
    low, high = intervals.bounds(m, np.array([1.0, 2.0]), NONE)
    assert np.all(low <= [1.0, 2.0]) and np.all(high >= [1.0, 2.0])


def test_stored_model_is_readable_and_unreadable_one_is_one_line(tmp_path):
    m = load_intervals()
    assert m.s0 > 0 and set(m.extra_var) == set(m.sources) == set(FLAGS)
    assert "megatron" in m.evidence.stacks and "fsdp" not in m.evidence.stacks
    bad = tmp_path / "intervals.toml"
    bad.write_text("[base]\ncenter = 0.0\n")
    with pytest.raises(ValueError, match=r"intervals.toml: cannot read the interval model") as err:
        load_intervals(bad)
    assert "\n" not in str(err.value)


def test_write_then_load_round_trips(tmp_path):
    e, flags, sources = _synthetic()
    m = fit_intervals(e, flags, EV, sources)
    path = tmp_path / "intervals.toml"
    intervals.write_intervals(path, m, {"date": "2026-12-01", "n_runs": 200})
    back = load_intervals(path)
    assert back.evidence == EV
    for f in FLAGS:
        assert back.extra_var[f] == pytest.approx(m.extra_var[f], rel=1e-5)
        assert (back.n[f], back.sources[f]) == (m.n[f], m.sources[f])
    assert back.q_hi == pytest.approx(m.q_hi, rel=1e-5)


def _relative_width(**options):
    c = api.configure(model="llama2-7b", **{"n_gpus": 8, "tp": 2, "global_batch": 64, **options})
    low, high = c.interval
    step = float(c.breakdown.step_time_s)
    assert low <= step <= high
    return np.log(high / low)


def test_out_of_evidence_device_stack_and_context_get_wider_intervals():
    m = load_intervals()
    base = _relative_width(gpu="h100-sxm-80gb", seq_len=4096)
    # mi300x: no fitted row (and its GEMM efficiency is not a measured one in the catalog).
    assert "mi300x" not in m.evidence.devices
    assert _relative_width(gpu="mi300x", seq_len=4096) > base
    # A context longer than any fitted run.
    longer = int(m.evidence.max_seq_len) * 2
    assert _relative_width(gpu="h100-sxm-80gb", seq_len=longer, cp=2, n_gpus=16, tp=8, zero=3) > base
    # A stack the fit had no rows for (the plan's stack field will name it; the helper takes it).
    lo0, hi0 = intervals.log_bounds(m, NONE)
    lo1, hi1 = intervals.log_bounds(m, {**NONE, "stack": intervals.stack_flag("some-new-stack", m.evidence)})
    assert hi1 - lo1 > hi0 - lo0


def test_a_device_of_a_fitted_die_is_evidenced_by_it(catalog):
    """A100 40 GB shares the fitted A100 80 GB's SMs, peak and measured efficiency, H200 the H100
    SXM's: their compute is evidenced; a device whose efficiency is an estimate never is, and
    a die with no fitted device (MI300X) is not."""
    ev = Evidence(frozenset({"a100-sxm-80gb", "h100-sxm-80gb"}), frozenset({"megatron"}), 8192.0)
    for key in ("a100-sxm-40gb", "h200-sxm-141gb", "a100-sxm-80gb"):
        assert intervals.device_flag(key, catalog.gpu(key), ev) == 0.0, key
    for key in ("h800", "h100-96gb-500w", "mi300x", "b200"):
        assert intervals.device_flag(key, catalog.gpu(key), ev) == 1.0, key
    assert intervals.device_flag("a100-sxm-40gb", catalog.gpu("a100-sxm-40gb"), EV) == 1.0


def test_validate_reports_interval_and_coverage(catalog, cal):
    from hetersim import fit

    rep = fit.validate(fit.read_runs(fit.default_runs_path()), catalog, cal)
    rows = rep["rows"]
    assert all(r["predicted_low_s"] <= r["predicted_step_time_s"] <= r["predicted_high_s"] for r in rows)
    inside = [
        r["feasible"] and r["predicted_low_s"] <= r["measured_step_time_s"] <= r["predicted_high_s"] for r in rows
    ]
    assert rep["coverage_pct"] == pytest.approx(100.0 * np.mean(inside))
    # Each row names what widened its interval; a row with no flag has the base interval.
    m = load_intervals()
    for r in rows:
        assert set(r["interval_flags"]) <= set(FLAGS)
        lo, hi = intervals.bounds(m, r["predicted_step_time_s"], {f: float(f in r["interval_flags"]) for f in FLAGS})
        assert r["predicted_low_s"] == pytest.approx(lo) and r["predicted_high_s"] == pytest.approx(hi)
    assert any(r["interval_flags"] == [] for r in rows) and any(r["interval_flags"] for r in rows)
    print(f"\nin-sample coverage of the 80% intervals (shipped constants): {rep['coverage_pct']:.1f}%")


def test_evaluate_json_carries_the_interval(capsys):
    from typer.testing import CliRunner

    from dse.cli import app

    args = ["evaluate", "--model", "llama2-7b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    itv = doc["step_time_interval_s"]
    assert itv["level"] == 0.8 and itv["low"] <= doc["step_time_s"] <= itv["high"]
    assert itv["flags"] == []  # a fitted device and stack, a dense model: nothing widened it
    text = CliRunner().invoke(app, args).output
    assert "(80%: " in text and "wider:" not in text
    # An MoE model on a device without fitted runs: both flags, named in the JSON and the text.
    moe = ["evaluate", "--model", "mixtral-8x7b", "--gpu", "mi300x", "--gpus", "64", "--tp", "2", "--ep", "8"]
    moe += ["--global-batch", "256"]
    res = CliRunner().invoke(app, [*moe, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["step_time_interval_s"]["flags"] == ["device", "moe"]
    assert "wider: device, moe)" in CliRunner().invoke(app, moe).output


@pytest.mark.slow
def test_leave_one_source_out_coverage_is_bounded(catalog, held_out):
    """The honest coverage: intervals fitted without a source, applied to its held-out residuals."""
    from hetersim.fit.interval_fit import fit_from_runs

    result = fit_from_runs(catalog=catalog, steps=300, held=held_out)
    meta = result["meta"]
    print(f"\n80% intervals: LOSO coverage {meta['coverage_loso_pct']}%, in-sample {meta['coverage_in_sample_pct']}%")
    # Measured 78.2% LOSO (83.3% in-sample) on the 78 published runs, 2026-12-04 after the
    # interleaved chunks' early gradient reductions and FSDP's per-unit collectives (79.5% / 82.1%
    # before), and since Megatron-LM
    # 2022's blocking pipeline sends (73.1% / 79.5% before; classes counted
    # in sources, no shift; 75.6% / 82.1% with a median shift over rows, which covered 40% of
    # llm-foundry's 216 unfitted runs against 85%; 82% after the DeepSpeed ZeRO-3 memory change).
    assert meta["coverage_loso_pct"] >= 70.0
    assert meta["coverage_in_sample_pct"] <= 90.0  # an 80% interval, not a blanket


def test_a_mixture_of_experts_model_is_out_of_the_dense_fits_evidence(catalog):
    """The calibration and the intervals are fitted to dense runs only: an MoE prediction takes the
    moe flag (in evaluate, in validate's rows and in a sweep) and a wider interval."""
    from importlib import resources

    m = load_intervals()
    assert not m.evidence.moe and m.sources["moe"] == 0
    assert m.extra_var["moe"] == pytest.approx(m.s0**2, rel=1e-3)  # the prior: as uncertain again
    dense = _relative_width(gpu="h100-sxm-80gb", seq_len=4096)
    c = api.configure(model="mixtral-8x7b", gpu="h100-sxm-80gb", n_gpus=64, tp=2, ep=8, global_batch=256)
    low, high = c.interval
    assert low <= float(c.breakdown.step_time_s) <= high
    assert np.log(high / low) > 1.3 * dense
    moe_rows = read_runs(resources.files("hetersim") / "data" / "moe_runs.csv")[:2]
    dense_rows = read_runs(default_runs_path())[:1]
    flags = intervals.row_flags(moe_rows + dense_rows, catalog, m.evidence)
    assert list(flags["moe"]) == [1.0, 1.0, 0.0]
    # A fit that had an MoE run gives none.
    ev = dataclasses.replace(m.evidence, moe=True)
    assert intervals.row_flags(moe_rows, catalog, ev)["moe"].tolist() == [0.0, 0.0]
    assert intervals.evidence_of(moe_rows, np.array([True, False])).moe


def test_the_sweep_flags_mixture_of_experts_models():
    import jax.numpy as jnp

    from dse.sweep.evaluate import step_time_interval
    from hetersim import build
    from hetersim.catalog import load_catalog

    cat = load_catalog()
    m = load_intervals()
    table = {
        "params": intervals.params(m),
        "device": jnp.zeros(1),
        "stack": jnp.zeros(8),
        "max_seq_len": jnp.float32(m.evidence.max_seq_len),
        "moe": jnp.float32(1.0),
    }
    plan = build.plan_spec(n_gpus=8, global_batch=8, seq_len=4096)
    widths = []
    for key in ("llama2-7b", "mixtral-8x7b"):
        spec = build.model_spec(cat.model(key))
        out = step_time_interval(jnp.float32(1.0), spec, plan, 0, table)
        widths.append(float(jnp.log(out["step_time_s_high"] / out["step_time_s_low"])))
    assert widths[1] > 1.3 * widths[0]
    lo, hi = intervals.log_bounds(m, {**NONE, "moe": 1.0})
    assert widths[1] == pytest.approx(float(hi - lo), rel=1e-5)
