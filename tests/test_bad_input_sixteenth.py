"""Defects found by the sixteenth bad-input fuzz (a helper session, /tmp/fz15: plan files, Hugging
Face configs, ``--set``, DeepSpeed configs, sensitivity / bench / calibrate flags, studies), each a
one-line ``error: ...`` naming the file, key or flag, exit 2, nothing written; and the numbers an
override that used to change nothing now changes. (The Hugging Face and DeepSpeed cases sit with
their readers' tests: tests/test_bad_input_models.py, tests/test_recipe_ds.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hetersim.catalog import load_catalog
from hetersim.catalog.check import CLOCK_DERIVED, DEFAULT_MAMF_SHARE
from hetersim.catalog.overrides import apply_overrides
from tests import test_bad_input as base
from tests.test_bad_input import check_refused

tmp = base.tmp  # the fixture: a prepared folder, the current one
KINDS = Path(__file__).resolve().parent / "data" / "plans" / "kinds.toml"  # a user catalog: the T4 by its clocks
EVAL = ["evaluate", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "64"]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        # a clock of a device whose matmul efficiency is measured: accepted, and it changed nothing
        (
            [*EVAL, "--gpu", "h100-sxm-80gb", "--set", "sustained_clock_MHz=99999"],
            ["--set", "gpus.h100-sxm-80gb.sustained_clock_MHz changes nothing", "set gemm_eff_bf16"],
        ),
        (
            [*EVAL, "--gpu", "h100-sxm-80gb", "--set", "aliases=h200"],
            ["--set", "gpus.h100-sxm-80gb.aliases names the entry: an override of it changes nothing"],
        ),
    ],
    ids=["clock-of-measured", "aliases"],
)
def test_an_override_that_would_change_nothing_is_refused(tmp, args, fragments):
    check_refused(tmp, args, fragments)


def test_a_clock_override_derives_the_matmul_efficiency_anew():
    """A device priced by its clocks (no measured matmul figure): ``--set sustained_clock_MHz``
    used to keep the efficiency the entry's own clocks gave it at load; it is derived from the new
    clock, and a clock above the boost clock is capped at it."""
    catalog = load_catalog([KINDS])
    t4 = catalog.gpus["t4-16gb"]
    assert t4["sources"]["gemm_eff_bf16"] == CLOCK_DERIVED
    assert t4["gemm_eff_bf16"] == pytest.approx(DEFAULT_MAMF_SHARE * 900 / 1590)
    slower = apply_overrides("gpus", "t4-16gb", t4, {"sustained_clock_MHz": "450"}, catalog=catalog)
    assert slower["gemm_eff_bf16"] == pytest.approx(DEFAULT_MAMF_SHARE * 450 / 1590)
    held = apply_overrides("gpus", "t4-16gb", t4, {"boost_clock_MHz": "900"}, catalog=catalog)
    assert held["gemm_eff_bf16"] == pytest.approx(DEFAULT_MAMF_SHARE)
    given = apply_overrides("gpus", "t4-16gb", t4, {"sustained_clock_MHz": "450", "gemm_eff_bf16": "0.5"})
    assert given["gemm_eff_bf16"] == 0.5  # an efficiency given beside the clock wins


def _study(model: str, n_gpus: int, plan: str, extra: str = "") -> str:
    return (
        f'name = "s"\n[model]\nkey = "{model}"\n[hardware]\ngpu = "h100-sxm-80gb"\nn_gpus = {n_gpus}\n'
        f"[plan]\nglobal_batch = 256\nseq_len = 4096\n{plan}\n{extra}"
    )


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        # every point infeasible, the sweep rc 0: a share bound above 1, expert parallelism that fits
        # no model's experts or no GPU count, DualPipe with no even pipeline
        (
            _study("llama2-7b", 8, "tp = 1", "[constraints]\nmin_mfu = 5"),
            ["constraints.min_mfu: must be in (0, 1] (mfu is a share); got 5"],
        ),
        (_study("llama2-7b", 8, "tp = 1", "[constraints]\nmin_goodput = 1.5"), ["constraints.min_goodput", "share"]),
        (
            _study("mixtral-8x7b", 64, "ep = 16"),
            ["plan.ep: 16 divides the experts of none of the study's models (mixtral-8x7b: 8)"],
        ),
        (_study("mixtral-8x7b", 64, "ep = [1, 3]"), ["plan.ep: 3 divides none of hardware.n_gpus (64)"]),
        (
            _study("llama2-7b", 8, "pp = 1\ndualpipe = true"),
            ["plan.dualpipe: true needs an even plan.pp >= 2 and plan.vp 1", "pp [1]", "(use false)"],
        ),
    ],
    ids=["min-mfu-5", "min-goodput", "ep-over-experts", "ep-3", "dualpipe-pp1"],
)
def test_a_study_setting_no_point_can_use_is_refused(tmp, text, fragments):
    (tmp / "s.toml").write_text(text)
    check_refused(tmp, ["sweep", "{tmp}/s.toml", "--out", "{tmp}/o.nc"], ["{tmp}/s.toml", *fragments])


def test_a_study_whose_dualpipe_or_ep_some_points_use_still_loads():
    """A value some points can use leaves the rest as data: DualPipe beside an even pp, an ep that
    divides the experts of one of two models."""
    from dse.study import parse_study

    both = parse_study(_study("llama2-7b", 8, "pp = [1, 2]\ndualpipe = [false, true]"))
    assert both.axes["dualpipe"] == (False, True)
    two = _study("mixtral-8x7b", 64, "ep = [1, 8]").replace('"mixtral-8x7b"', '["mixtral-8x7b", "llama2-7b"]')
    assert parse_study(two).axes["ep"] == (1, 8)


@pytest.mark.parametrize("models", ["llama2-7b,LLAMA2-7B", "llama2-7b,llama-2-7b"])
def test_bench_refuses_one_model_named_twice_under_another_spelling(tmp, models):
    args = ["bench", "--models", models, "--configs", "16", "--chunk", "16", "--one-at-a-time", "0"]
    check_refused(tmp, args, ["--models: 'llama2-7b' and", "name the same catalog model; give it once"])


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["calibrate", "--steps", "2", "--out", "{tmp}/o.json"], ["--out", "o.json: this writes TOML, not JSON"]),
        (["validate", "--out", "{tmp}/o.toml"], ["--out", "o.toml: this writes JSON, not TOML; give a .json path"]),
        (
            ["sensitivity", *EVAL[1:], "--gpu", "h100-sxm-80gb", "--plan", "{tmp}/p.toml"],
            ["--plan: sensitivity works on one device kind; leave --plan out"],
        ),
    ],
    ids=["calibrate-json", "validate-toml", "sensitivity-plan"],
)
def test_a_misnamed_output_or_a_flag_sensitivity_cannot_use_is_named(tmp, args, fragments):
    check_refused(tmp, args, fragments)


def test_an_rdb_storage_without_its_driver_names_the_driver(tmp):
    """Optuna's own message ("Please install appropriate one.") named no driver."""
    if importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("a MySQL driver is installed here: the URL fails on connecting instead")
    args = ["optimize", base.SEARCH, "--trials", "1", "--storage", "mysql://nobody@nowhere/none", "--out", "{tmp}/o"]
    check_refused(tmp, args, ["--storage mysql://", "driver for 'mysql' is not installed", "sqlite:///FILE"])
