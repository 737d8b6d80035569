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


def test_bench_json_has_the_profile_figures():
    """XLA's figures of the compiled chunk (FLOPs and bytes per configuration, instruction
    counts) and, with --split, the four stages' times: present and positive."""
    result = run(["-q", "bench", "--configs", "64", "--chunk", "64", "--json", "--split", "--one-at-a-time", "0"])
    assert result.exit_code == 0, result.stderr
    printed = json.loads(result.stdout)
    for key in ("hlo_flops_per_config", "hlo_bytes_per_config", "hlo_ops", "hlo_entry_ops", "configs_per_s"):
        assert printed[key] > 0, key
    assert printed["hlo_ops"] > printed["hlo_entry_ops"]
    assert set(printed["split_s"]) == {"decode", "gather", "model", "reductions"}
    assert all(seconds > 0 for seconds in printed["split_s"].values()) and "fuse" in printed["split_note"]
    assert printed["one_at_a_time_configs_per_s"] is None


@pytest.mark.slow
def test_bench_chunks_gives_one_row_per_size_from_its_own_process():
    result = run(["-q", "bench", "--configs", "64", "--chunks", "32,64", "--one-at-a-time", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["chunks"]
    assert [row["chunk"] for row in rows] == [32, 64]
    assert all(row["configs_per_s"] > 0 and row["peak_rss_MiB"] > 0 for row in rows)
    assert rows[0]["one_at_a_time_configs_per_s"] > 0 and rows[1]["one_at_a_time_configs_per_s"] is None
