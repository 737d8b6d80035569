"""CLI conventions (issue 15): plain help that keeps "[...]", no value shown for flags, -q/-v,
progress on stderr, and --json printing JSON on stdout in every command."""

from __future__ import annotations

import json

import pytest

from dse import sweep
from tests.test_cli import run
from tests.test_sweep import CHUNK, write_study


def test_help_keeps_brackets_and_shows_no_value_for_flags():
    sweep_help = run(["sweep", "--help"])
    assert sweep_help.exit_code == 0
    assert "[default: the packaged default study]" in " ".join(sweep_help.stdout.split())
    assert "[search]" in run(["optimize", "-h"]).stdout
    evaluate_help = run(["evaluate", "--help"]).stdout
    assert "--json" in evaluate_help and "--tensor-model-parallel-size" in evaluate_help
    assert "<bool>" not in evaluate_help and "<bool>" not in run(["--help"]).stdout


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conventions")
    return sweep.run_sweep(write_study(tmp), tmp / "out", chunk=CHUNK, progress=False)


def test_progress_on_stderr_off_under_quiet_timed_under_verbose(small_sweep, tmp_path):
    base = ["report", small_sweep, "--no-validation", "--json"]
    default = run([*base, "--out", tmp_path / "a"])
    assert default.exit_code == 0, default.stderr
    assert "hetersim: drawing the figures" in default.stderr
    assert json.loads(default.stdout)["n_configs"] > 0  # stdout stays pure JSON
    # The page opens with the answer: verdict, trade-off and the best per GPU kind, before validation.
    page = (tmp_path / "a" / "index.html").read_text()
    answer = page.index("<h2>The answer</h2>")
    assert answer < page.index("validation against published runs") < page.index("Pareto fronts")
    head = page[answer : page.index("validation against published runs")]
    assert "Verdict" in head and "Trade-off" in head
    for gpu in ("h100-sxm-80gb", "a100-sxm-80gb"):  # the two GPU kinds of tests.test_sweep's study
        assert f"<li>{gpu}: best time_to_train_s" in head
    quiet = run(["-q", *base, "--out", tmp_path / "b"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    verbose = run(["-v", *base, "--out", tmp_path / "c"])
    assert verbose.exit_code == 0 and " s]" in verbose.stderr


def test_bench_json_is_stdout_and_out_is_the_file(tmp_path):
    out = tmp_path / "bench.json"
    result = run(["-q", "bench", "--configs", "64", "--chunk", "64", "--json", "--out", out])
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == json.loads(out.read_text()) and printed["n_configs"] >= 64
