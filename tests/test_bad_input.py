"""Bad input, every kind: exit code 2, exactly one line ``error: ...`` that names the flag, file or
key, no traceback, and nothing left behind (the folder the command was pointed at, and the
current folder, hold the same files before and after).

Each case is a command line with ``{tmp}`` standing for a folder prepared by :func:`prepared`:
``file`` (a plain file), ``folder.json/`` and ``folder.nc/`` (folders named like files),
``binary.*`` (bytes that are no text), ``readonly/`` (a folder nobody may write into).
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app

ROOT = Path(__file__).resolve().parents[1]
BIG = "1" + "0" * 23  # 1e23 as an integer: typer parses it, the range check must refuse it
STUDY = str(ROOT / "studies" / "cluster_sizing.toml")
SEARCH = str(ROOT / "studies" / "optimize" / "mix-budget.toml")


def ev(*extra: str, **flags: str) -> list[str]:
    """An ``evaluate`` command line of LLaMA-2-7B (32 layers) on 8 H100s; ``flags`` replace its own."""
    base = {"model": "llama2-7b", "gpu": "h100-sxm-80gb", "gpus": "8", "global_batch": "64", "seq_len": "4096"}
    base.update(flags)
    return ["evaluate", *(x for k, v in base.items() if v is not None for x in ("--" + k.replace("_", "-"), v)), *extra]


# (id, command line, fragments the error line must name)
CASES = [
    # click's own usage errors, made one line
    ("missing-option", ["evaluate", "--model", "llama2-7b", "--gpu", "h100-sxm-80gb"], ["--gpus"]),
    ("not-an-integer", ev(gpus="eight"), ["--gpus"]),
    ("float-for-integer", ev(global_batch="1e23"), ["--global-batch"]),
    ("unknown-command", ["nope"], ["nope"]),
    ("unknown-section", ["catalog", "gpu"], ["section"]),
    # a user's own contradictions: never settled silently by taking the last, never ignored
    ("option-given-twice", ev("--tp", "2", "--tp", "4"), ["--tp 2", "--tp 4", "contradict"]),
    (
        "alias-and-option",
        ev("--tp", "2", "--tensor-model-parallel-size", "4"),
        ["--tp 2", "--tensor-model-parallel-size"],
    ),
    ("switch-both-ways", ev("--tp", "2", "--no-sp", "--sp"), ["--no-sp", "--sp", "contradict"]),
    ("cpu-optimizer-without-offload", ev("--cpu-optimizer"), ["--cpu-optimizer", "--offload optimizer:TIER"]),
    ("pp-layout-without-pipeline", ev("--pp-layout"), ["--pp-layout", "--pp > 1"]),
    ("plan-kinds-empty", ["plan", "--model", "llama2-7b", "--budget", "100", "--kinds", ","], ["--kinds", "KIND,KIND"]),
    (
        "plan-seed-without-trials",
        ["plan", "--model", "llama2-7b", "--cluster", "h100-sxm-80gb:8", "--global-batch", "64", "--seed", "5"],
        ["--seed", "--trials"],
    ),
    (
        "layer-split-with-expert-flag",
        ["evaluate", "--model", "llama2-7b", "--cluster", "h100-sxm-80gb:4,a100-sxm-80gb:4", "--gpus", "8"]
        + ["--global-batch", "64", "--pp", "2", "--layers-per-stage", "16,16", "--fused-experts"],
        ["--fused-experts", "has none"],
    ),
    ("calibrate-out-with-dry-run", ["calibrate", "--dry-run", "--out", "{tmp}/c.toml"], ["--dry-run", "--out"]),
    ("validate-memory-missing", ["validate", "--memory", "{tmp}/missing.csv"], ["missing.csv", "memory"]),
    ("cxl-p2p-without-cxl", ev("--cxl-p2p"), ["--cxl-p2p", "--cxl-expander", "--cxl-pool"]),
    (
        "cxl-on-a-layer-split",
        ["evaluate", "--model", "llama2-7b", "--cluster", "h100-sxm-80gb:4,a100-sxm-80gb:4", "--gpus", "8"]
        + ["--global-batch", "64", "--pp", "2", "--layers-per-stage", "16,16", "--cxl-expander", "micron-cz120:1"],
        ["--cxl-*", "--catalog"],
    ),
    ("switch-against-its-field", ev("--async-save", "--checkpoint-mode", "sync"), ["--async-save", "sync"]),
    ("zero3-prefetch-without-zero3", ev("--no-zero3-prefetch", "--zero", "1"), ["--zero3-prefetch", "--zero is 1"]),
    ("reuse-without-zero3", ev("--reuse-Mparams", "5", "--zero", "2"), ["--reuse-Mparams", "--zero is 2"]),
    ("shard-group-without-zero", ev("--shard-group", "4"), ["--shard-group", "--zero 0"]),
    ("mla-recompute-without-mla", ev("--mla-up-proj"), ["--mla-up-proj", "multi-head latent"]),
    ("expert-flag-on-dense-model", ev("--fused-experts"), ["--fused-experts", "has none"]),
    ("dispatcher-on-dense-model", ev("--dispatcher", "deepep"), ["--dispatcher", "has none"]),
    ("ep-overlap-without-ep", ev("--ep-overlap", model="mixtral-8x7b"), ["--ep-overlap", "--ep 1"]),
    ("moments-unknown", ev("--moments", "fp16"), ["--moments", "fp32, bf16", "fp16"]),
    ("hetero-without-cluster", ev("--hetero", "data"), ["--hetero", "--cluster"]),
    ("sequence-not-cut-by-cp", ev("--cp", "2", seq_len="4097"), ["--seq-len 4097", "2 x --cp = 4"]),
    ("precision-without-peak", ev("--precision", "nvfp4"), ["--precision nvfp4", "H100", "no such peak"]),
    # absurd values: refused with their range
    ("global-batch-1e23", ev(global_batch=BIG), ["--global-batch", "<="]),
    ("train-tokens-1e39", ev("--train-tokens", "1e39"), ["--train-tokens", "<="]),
    ("set-hbm-bw-1e40", ev("--set", "hbm_bw_GBps=1e40"), ["hbm_bw_GBps", "at most"]),
    ("cxl-expander-count-1e23", ev("--cxl-expander", f"micron-cz120:{BIG}"), ["--cxl-expander", "<="]),
    ("tp-1e23", ev("--tp", BIG), ["--tp", "<="]),
    # a float field's range in words: its real bounds, never the integers between them
    ("fragmentation-above-range", ev("--fragmentation", "1.5"), ["--fragmentation", ">= 0 and <= 0.9", "1.5"]),
    ("moe-imbalance-below-one", ev("--moe-imbalance", "0.5"), ["--moe-imbalance", ">= 1", "0.5"]),
    ("sweep-chunk-1e23", ["sweep", STUDY, "--chunk", BIG, "--out", "{tmp}"], ["--chunk", "<="]),
    ("sweep-top-k-1e23", ["sweep", STUDY, "--top-k", BIG, "--out", "{tmp}"], ["--top-k", "<="]),
    ("bench-configs-1e23", ["bench", "--configs", BIG], ["--configs", "<="]),
    ("bench-chunks-not-integer", ["bench", "--chunks", "4096,abc"], ["--chunks", "'abc'", "not an integer"]),
    ("bench-chunks-zero", ["bench", "--chunks", "4096,0"], ["--chunks", "positive"]),
    ("bench-chunks-1e23", ["bench", "--chunks", BIG], ["--chunks", "<="]),
    ("bench-chunks-and-split", ["bench", "--chunks", "64,128", "--split"], ["--split", "--chunks"]),
    ("bench-one-at-a-time-negative", ["bench", "--one-at-a-time", "-1"], ["--one-at-a-time"]),
    ("bench-models-unknown", ["bench", "--models", "llama2-70b,nope"], ["--models", "unknown model 'nope'"]),
    ("bench-models-empty-name", ["bench", "--models", "llama2-70b,,"], ["--models", "distinct"]),
    ("bench-models-twice", ["bench", "--models", "llama2-70b,llama2-70b"], ["--models", "distinct"]),
    ("optimize-trials-negative", ["optimize", SEARCH, "--trials", "-1", "--out", "{tmp}"], ["--trials"]),
    ("optimize-trials-1e23", ["optimize", SEARCH, "--trials", BIG, "--out", "{tmp}"], ["--trials"]),
    ("optimize-batch-0", ["optimize", SEARCH, "--batch", "0", "--out", "{tmp}"], ["--batch"]),
    ("optimize-study-name-empty", ["optimize", SEARCH, "--study-name", "", "--out", "{tmp}"], ["--study-name"]),
    # a user's contradictory flags (a sweep's infeasible point stays data)
    ("gpus-tp-dp-contradict", ev("--tp", "8", "--dp", "2"), ["--gpus 8", "--tp 8", "--dp 2"]),
    ("dp-3-of-8", ev("--dp", "3"), ["--gpus 8", "--dp 3"]),
    ("pp-vp-do-not-split-layers", ev("--pp", "4", "--vp", "3"), ["--pp 4", "--vp 3", "32 layers"]),
    ("vp-without-pp", ev("--vp", "2"), ["--vp 2", "--pp > 1"]),
    ("shard-group-not-dividing", ev("--zero", "3", "--shard-group", "3"), ["--shard-group 3", "8 data-parallel"]),
    ("vp-batches-not-multiple-of-pp", ev("--pp", "2", "--vp", "2", global_batch="12"), ["3 micro-batches", "--pp 2"]),
    ("batch-not-multiple", ev("--micro-batch", "2", global_batch="60"), ["--global-batch"]),
    ("layers-per-stage-without-cluster", ev("--layers-per-stage", "16"), ["--layers-per-stage", "--cluster"]),
    ("study-min-above-max", ["sweep", "{tmp}/min_above_max.toml", "--out", "{tmp}"], ["constraints.min_mfu"]),
    (
        "study-imbalance-below-one",
        ["sweep", "{tmp}/imbalance_below_one.toml", "--out", "{tmp}"],
        ["study file", "imbalance_below_one.toml", "plan.moe_imbalance", ">= 1"],
    ),
    (
        "study-layout-without-pipeline",
        ["sweep", "{tmp}/inert_layout.toml", "--out", "{tmp}"],
        ["inert_layout.toml", "plan.pp_layout", "plan.pp > 1", "every point"],
    ),
    (
        "study-expert-flag-of-dense-models",
        ["sweep", "{tmp}/inert_experts.toml", "--out", "{tmp}"],
        ["inert_experts.toml", "plan.fused_experts", "has none"],
    ),
    (
        "study-expert-parallel-of-dense-models",
        ["sweep", "{tmp}/ep_of_dense.toml", "--out", "{tmp}"],
        ["study file", "ep_of_dense.toml", "plan.ep", "llama2-70b", "no experts"],
    ),
    # files that are folders, binary, or missing: the error names the file
    ("model-is-a-folder", ev(model="{tmp}/folder.json"), ["folder.json", "folder"]),
    ("model-binary", ev(model="{tmp}/binary.json"), ["binary.json"]),
    ("catalog-is-a-folder", ["catalog", "gpus", "--catalog", "{tmp}"], ["catalog file", "folder"]),
    ("catalog-binary", ["catalog", "gpus", "--catalog", "{tmp}/binary.toml"], ["binary.toml"]),
    ("study-binary", ["sweep", "{tmp}/binary.toml", "--out", "{tmp}"], ["study file", "binary.toml"]),
    ("study-is-a-folder", ["sweep", "{tmp}/folder.json", "--out", "{tmp}"], ["study file", "folder.json"]),
    ("runs-binary", ["validate", "--runs", "{tmp}/binary.csv"], ["binary.csv"]),
    ("calibrate-runs-missing", ["calibrate", "--runs", "{tmp}/missing.csv"], ["missing.csv"]),
    ("runs-unknown-stack", ["validate", "--runs", "{tmp}/unknown_stack.csv"], ["unknown_stack.csv", "stack", "fsdp"]),
    # a measured run whose own columns contradict each other is a mistake in the file
    ("runs-gpus-not-the-layout", ["validate", "--runs", "{tmp}/runs_n_gpus.csv"], ["runs_n_gpus.csv", "n_gpus 7"]),
    (
        "runs-batch-not-multiple",
        ["validate", "--runs", "{tmp}/runs_global_batch.csv"],
        ["global_batch 7", "micro_batch"],
    ),
    (
        "runs-tp-not-dividing-heads",
        ["validate", "--runs", "{tmp}/runs_tp.csv"],
        ["tp 5", "24 attention heads"],
    ),
    ("runs-kv-heads", ["validate", "--runs", "{tmp}/runs_kv_heads.csv"], ["kv_heads 7"]),
    ("runs-step-time-zero", ["validate", "--runs", "{tmp}/runs_measured_step_time_s.csv"], ["measured_step_time_s"]),
    ("runs-accounting", ["validate", "--runs", "{tmp}/runs_flops_accounting.csv"], ["flops_accounting", "magic"]),
    ("set-domain-not-nodes", ev("--set", "scaleup_domain=3"), ["scaleup_domain 3", "gpus_per_node 8"]),
    (
        "catalog-clock-above-boost",
        ["catalog", "gpus", "--catalog", "{tmp}/clock.toml"],
        ["clock.toml", "t4-16gb.sustained_clock_MHz 5000", "boost_clock_MHz 1590"],
    ),
    ("runs-no-layers", ["validate", "--runs", "{tmp}/runs_layers.csv"], ["runs_layers.csv", "layers", "at least 1"]),
    ("runs-precision", ["validate", "--runs", "{tmp}/runs_precision.csv"], ["runs_precision.csv", "precision", "fp64"]),
    (
        "search-negative-price",
        ["optimize", "{tmp}/negative_price.toml", "--trials", "1", "--out", "{tmp}"],
        ["search.price.hbm_bw_GBps", ">= 0"],
    ),
    ("runs-empty-id", ["validate", "--runs", "{tmp}/runs_id.csv"], ["runs_id.csv", "line 2", "id"]),
    ("runs-duplicate-id", ["validate", "--runs", "{tmp}/runs_twice.csv"], ["runs_twice.csv", "line 3", "unique"]),
    ("journal-binary", ["optimize", SEARCH, "--storage", "{tmp}/binary.journal", "--out", "{tmp}"], ["binary.journal"]),
    ("journal-not-json", ["optimize", SEARCH, "--storage", "{tmp}/file", "--out", "{tmp}"], ["--storage", "journal"]),
    ("report-binary", ["report", "{tmp}/binary.toml", "--out", "{tmp}/report"], ["binary.toml"]),
    ("report-missing", ["report", "{tmp}/missing.nc", "--out", "{tmp}/report"], ["missing.nc"]),
    # output locations, checked before the work
    ("validate-out-folder", ["validate", "--out", "{tmp}"], ["--out", "folder"]),
    ("calibrate-out-folder", ["calibrate", "--steps", "1", "--out", "{tmp}/folder.nc"], ["--out", "folder"]),
    ("intervals-out-folder", ["calibrate", "--intervals", "--out", "{tmp}/folder.nc"], ["--out", "folder"]),
    ("intervals-and-cross-validate", ["calibrate", "--intervals", "--cross-validate"], ["--intervals", "--cross"]),
    ("bench-out-folder", ["bench", "--configs", "10", "--out", "{tmp}/folder.json"], ["--out", "folder"]),
    ("sweep-out-is-a-file", ["sweep", STUDY, "--out", "{tmp}/file"], ["--out", "not a folder"]),
    ("sweep-out-nc-under-a-file", ["sweep", STUDY, "--out", "{tmp}/file/x.nc"], ["--out", "not a folder"]),
    ("sweep-out-nc-is-a-folder", ["sweep", STUDY, "--out", "{tmp}/folder.nc"], ["--out", "folder"]),
    ("optimize-out-is-a-file", ["optimize", SEARCH, "--trials", "1", "--out", "{tmp}/file"], ["--out"]),
    ("optimize-out-nc-is-a-folder", ["optimize", SEARCH, "--trials", "1", "--out", "{tmp}/folder.nc"], ["--out"]),
    ("report-out-is-a-file", ["report", str(ROOT / "README.md"), "--out", "{tmp}/file"], ["--out"]),
]

READ_ONLY_CASES = [
    ("sweep-out-read-only", ["sweep", STUDY, "--out", "{tmp}/readonly"], ["--out", "not writable"]),
    ("validate-out-read-only", ["validate", "--out", "{tmp}/readonly/v.json"], ["--out", "not writable"]),
]
CAN_WRITE_ANYWHERE = hasattr(os, "geteuid") and os.geteuid() == 0  # root ignores folder permissions


def prepared(tmp: Path) -> Path:
    (tmp / "file").write_text("a file, not a folder\n")
    (tmp / "folder.json").mkdir()
    (tmp / "folder.nc").mkdir()
    for name in ("binary.json", "binary.toml", "binary.csv", "binary.journal"):
        (tmp / name).write_bytes(b"\x00\xff\xfe\x80 not text \x81\x00")
    study = (
        (ROOT / "studies" / "cxl_offload_none.toml")
        .read_text()
        .replace("[constraints]\n", "[constraints]\nmin_mfu = 0.6\nmax_mfu = 0.4\n", 1)
    )
    (tmp / "min_above_max.toml").write_text(study)
    runs = (ROOT / "hetersim" / "data" / "published_runs.csv").read_text().splitlines()
    (tmp / "unknown_stack.csv").write_text(f"{runs[0]},stack\n{runs[1]},colossal\n")
    (tmp / "runs_twice.csv").write_text(f"{runs[0]}\n{runs[1]}\n{runs[1]}\n")
    for col, value in (("n_gpus", "7"), ("global_batch", "7"), ("kv_heads", "7"), ("id", "")):
        _runs_variant(tmp, runs, col, value)
    _runs_variant(tmp, runs, "tp", "5", n_gpus="160")  # GPT 1.7B's 24 heads
    _runs_variant(tmp, runs, "measured_step_time_s", "0")
    _runs_variant(tmp, runs, "flops_accounting", "magic")
    _runs_variant(tmp, runs, "layers", "0")
    _runs_variant(tmp, runs, "precision", "fp64")  # read by the plan's specs: refused before the work is announced
    kinds = (ROOT / "tests" / "data" / "plans" / "kinds.toml").read_text()
    (tmp / "clock.toml").write_text(kinds.replace("sustained_clock_MHz = 900.0", "sustained_clock_MHz = 5000.0", 1))
    hardware = (ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml").read_text()
    (tmp / "negative_price.toml").write_text(hardware.replace("hbm_bw_GBps = 0.0004", "hbm_bw_GBps = -0.0004", 1))
    default = (ROOT / "studies" / "default.toml").read_text()
    (tmp / "inert_layout.toml").write_text(default.replace("pp = [1, 2, 4, 8, 16]", "pp = 1\npp_layout = true", 1))
    (tmp / "inert_experts.toml").write_text(default.replace("[plan]\n", "[plan]\nfused_experts = true\n", 1))
    (tmp / "imbalance_below_one.toml").write_text(default.replace("[plan]\n", "[plan]\nmoe_imbalance = 0.5\n", 1))
    (tmp / "ep_of_dense.toml").write_text(default.replace("[plan]\n", "[plan]\nep = [1, 2]\n", 1))
    readonly = tmp / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    return tmp


def _runs_variant(tmp: Path, lines: list[str], column: str, value: str, **others: str) -> None:
    """``runs_<column>.csv``: the packaged file's header and first run with ``column`` set to
    ``value`` (and the ``others`` columns to theirs)."""
    header, first = next(csv.reader([lines[0]])), next(csv.reader([lines[1]]))
    for col, v in {column: value, **others}.items():
        first[header.index(col)] = v
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([header, first])
    (tmp / f"runs_{column}.csv").write_text(out.getvalue())


def listing(*folders: Path) -> list[str]:
    return sorted(str(p) for folder in folders for p in folder.rglob("*"))


def assert_one_line_error(exit_code: int, stderr: str, fragments: list[str]) -> str:
    assert exit_code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written to the current folder shows in the listing
    yield prepared(tmp_path)
    (tmp_path / "readonly").chmod(0o755)


def _invoke(args: list[str], tmp: Path):
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    before = listing(tmp)
    result = CliRunner().invoke(app, argv)
    assert listing(tmp) == before, "the failed command left files behind"
    return result


def check_refused(tmp: Path, args: list[str], fragments: list[str]) -> str:
    """Run ``args`` in this process (``{tmp}`` filled in): exit 2, one line ``error: ...`` holding
    every fragment, no traceback, nothing left in ``tmp``; the line."""
    result = _invoke(args, tmp)
    return assert_one_line_error(result.exit_code, result.stderr, [f.replace("{tmp}", str(tmp)) for f in fragments])


@pytest.mark.parametrize("args, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(tmp, args, fragments):
    check_refused(tmp, args, fragments)


@pytest.mark.skipif(CAN_WRITE_ANYWHERE, reason="root may write into a read-only folder")
@pytest.mark.parametrize("args, fragments", [c[1:] for c in READ_ONLY_CASES], ids=[c[0] for c in READ_ONLY_CASES])
def test_read_only_output_folder_is_refused_before_the_work(tmp, args, fragments):
    result = _invoke(args, tmp)
    assert_one_line_error(result.exit_code, result.stderr, fragments)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be created")
@pytest.mark.parametrize(
    "args",
    [
        ["sweep", STUDY, "--out", "/proc/hetersim-results"],
        [
            "plan",
            "--model",
            "llama2-7b",
            "--cluster",
            "h100-sxm-80gb:8,a100-sxm-80gb:8",
            "--global-batch",
            "64",
            "--out",
            "/proc/plan.toml",
        ],
        ["validate", "--out", "/proc/validation.json"],
    ],
    ids=["sweep", "plan", "validate"],
)
def test_an_out_where_no_file_can_be_created_is_refused_before_the_work(tmp, args):
    """Permission bits are not the whole answer (root passes them, as in CI): the check creates a
    file where the output will go, so the search never runs to fail at its last step."""
    result = _invoke(args, tmp)
    line = assert_one_line_error(result.exit_code, result.stderr, ["--out", "/proc", "cannot create a file"])
    assert "evaluating" not in result.stdout + line


def test_calibrate_out_folder_leaves_no_temporary_file(tmp):
    """The calibration writer itself (not only the CLI's check) leaves no ``*.tmp`` beside a folder."""
    from hetersim.fit.calibration import write_calibration

    with pytest.raises(ValueError, match="is a folder"):
        write_calibration(tmp / "folder.nc", {}, {})
    assert not list(tmp.parent.glob("*.tmp")) and not list(tmp.glob("*.tmp"))


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["evaluate", "--model", "llama2-7b", "--gpu", "h100-sxm-80gb"], ["--gpus"]),
        (["sweep", STUDY, "--out", "{tmp}/file"], ["--out", "not a folder"]),
    ],
    ids=["missing-option", "sweep-out-is-a-file"],
)
def test_real_process_prints_one_line_without_traceback(tmp, args, fragments):
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    before = listing(tmp)
    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "dse", *argv], capture_output=True, text=True, timeout=300, env=env)
    assert_one_line_error(proc.returncode, proc.stderr, fragments)
    assert proc.stdout == ""
    assert listing(tmp) == before


def test_an_infeasible_search_point_is_still_data():
    """The layout rules that make a user's flags an error keep a sweep's points as data: a study
    with a dp that cannot divide is swept, not refused (the host drops or flags such rows)."""
    from hetersim import api

    with pytest.raises(ValueError, match="contradicts"):
        api.configure(model="llama2-7b", gpu="h100-sxm-80gb", n_gpus=8, dp=3, global_batch=64)
    # one configuration that does not fit in memory is an answer, not an error
    built = api.configure(model="llama2-70b", gpu="h100-sxm-80gb", n_gpus=8, global_batch=8)
    assert int(built.breakdown.infeasible) != 0


def test_an_rdb_storage_without_its_driver_is_one_line_in_a_real_process(tmp):
    """Optuna warns that RDB heartbeats are experimental; under pytest the warning is captured, so a
    real process shows whether it leaks onto the error's stderr."""
    argv = ["optimize", SEARCH, "--trials", "1", "--storage", "mysql://nobody@nowhere/none", "--out", str(tmp / "o")]
    proc = subprocess.run([sys.executable, "-m", "dse", *argv], capture_output=True, text=True, timeout=300)
    assert_one_line_error(proc.returncode, proc.stderr, ["--storage", "mysql://"])
    assert not (tmp / "o").exists()


def test_options_that_take_several_values_may_repeat_and_a_repeat_that_agrees_is_no_contradiction():
    """--offload and --set are repeatable; the same value given twice contradicts nothing."""
    argv = ev("--offload", "optimizer:host-dram", "--offload", "grads:host-dram", "--set", "tdp_W=700",
              "--set", "hbm_bw_GBps=3000", "--tp", "2", "--tp", "2", "--json")  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert '"tp": 2' in result.output and '"grads": "host-dram"' in result.output
