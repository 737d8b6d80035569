"""The ``hetersim`` command line: answers, JSON shapes, and one-line errors with exit code 2."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app
from hetersim.catalog import load_catalog
from hetersim.fit.runs import REQUIRED_COLUMNS, default_runs_path
from hetersim.simulate import STEP_TERMS
from hetersim.types import Infeasible

ROOT = Path(__file__).resolve().parents[1]

# The example of the issue: LLaMA-2-70B on 512 H100s, Megatron's interleaved layout.
ISSUE_EXAMPLE = (
    "evaluate --model llama2-70b --gpu h100-sxm-80gb --gpus 512 --tp 8 --pp 4 --vp 5 --micro-batch 1 "
    "--global-batch 1024 --seq-len 4096 --recompute selective --zero 1"
).split()

# 70B parameters with plain data parallelism (no ZeRO): weights, grads and Adam states replicated on
# every GPU need ~1.1 TiB each, which no GPU has.
DOES_NOT_FIT = "evaluate --model llama2-70b --gpu h100-sxm-80gb --gpus 8 --global-batch 8 --seq-len 4096".split()

runner = CliRunner()


def run(args: list[str]):
    # pytest-xdist workers set COLUMNS=80, which the tables honour as a terminal's width: take it
    # out so that a table's text is the same in a parallel run as in a serial one.
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": None})


def run_json(args: list[str]) -> dict:
    result = run([*args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def assert_user_error(result, *fragments: str) -> str:
    """Exit code 2, and exactly one line on stderr: ``error: ...`` naming every fragment."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def new_gpu_toml(path: Path, key: str, **changes) -> Path:
    """A user catalog file adding GPU ``key``: every field of the H100 entry, with ``changes``."""
    entry = {k: v for k, v in load_catalog().gpu("h100-sxm-80gb").items() if k != "sources"}
    entry.update(changes)
    lines = [f"[gpus.{key}]"] + [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    path.write_text("\n".join(lines) + "\n")
    assert tomllib.loads(path.read_text())["gpus"][key]["name"] == entry["name"]
    return path


# --------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------


def test_evaluate_issue_example_prints_breakdown_and_verdict():
    result = run(ISSUE_EXAMPLE)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for term in STEP_TERMS:
        assert term.removesuffix("_s").replace("_", " ") in out
    for label in ("step time", "tokens/s/GPU", "MFU", "HFU", "model TFLOP/s/GPU", "activations", "optimizer"):
        assert label in out
    assert "days" in out and "$" in out and "MWh" in out
    verdicts = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert len(verdicts) == 1
    assert verdicts[0].split()[1] in ("FEASIBLE", "INFEASIBLE")


def test_evaluate_json_terms_add_up_to_step_time():
    r = run_json(ISSUE_EXAMPLE)
    assert set(r["breakdown_s"]) == set(STEP_TERMS)
    step = r["step_time_s"]
    assert step > 0
    assert sum(r["breakdown_s"].values()) == pytest.approx(step, rel=1e-4)
    assert r["plan"] == {
        **r["plan"],
        **dict(n_gpus=512, tp=8, pp=4, vp=5, cp=1, dp=16, sp=True, zero=1, global_batch=1024, seq_len=4096),
    }
    # tokens/s is the global batch over the step time; per GPU it is that over 512.
    assert r["tokens_per_s"] == pytest.approx(1024 * 4096 / step, rel=1e-4)
    assert r["tokens_per_s_per_gpu"] == pytest.approx(r["tokens_per_s"] / 512, rel=1e-4)
    assert 0 < r["mfu"] <= r["hfu"] < 1
    mem = r["memory_per_gpu_GiB"]
    parts = sum(mem[k] for k in ("weights", "grads", "optimizer", "activations", "buffers"))
    assert mem["total"] == pytest.approx(parts, rel=1e-4)
    assert mem["hbm_capacity"] == 80.0
    assert r["feasible"] == (r["infeasible_code"] == 0) == (r["reasons"] == [])
    assert r["time_to_train_days"] == pytest.approx(r["time_to_train_s"] / 86400, rel=1e-6)


def test_sequence_parallelism_defaults_on_with_tensor_parallelism():
    base = "evaluate --model llama2-7b --gpu h100-sxm-80gb --gpus 8 --global-batch 64 --seq-len 2048".split()
    assert run_json([*base, "--tp", "2"])["plan"]["sp"] is True
    assert run_json([*base, "--tp", "1"])["plan"]["sp"] is False
    assert run_json([*base, "--tp", "2", "--no-sp"])["plan"]["sp"] is False


def test_infeasible_configuration_is_an_answer_with_every_reason():
    r = run_json(DOES_NOT_FIT)
    assert not r["feasible"]
    assert Infeasible(r["infeasible_code"]) & Infeasible.HBM_CAPACITY
    assert r["reasons"] == Infeasible.describe(r["infeasible_code"])
    assert r["memory_per_gpu_GiB"]["total"] > r["memory_per_gpu_GiB"]["hbm_capacity"]

    result = run(DOES_NOT_FIT)
    assert result.exit_code == 0
    assert "verdict: INFEASIBLE" in result.stdout
    for reason in r["reasons"]:
        assert reason in result.stdout


def test_model_by_dimensions():
    args = "evaluate --layers 4 --hidden 512 --heads 8 --gpu a100-sxm-80gb --gpus 8 --tp 2 --global-batch 16".split()
    r = run_json(args)
    assert r["feasible"]
    # 4 layers of a SwiGLU block with ffn 1536 (LLaMA rule) plus 32000-token embedding and head.
    h, f, v = 512, 1536, 32000
    assert r["params"] == pytest.approx(4 * (4 * h * h + 3 * h * f) + 2 * v * h, rel=0.01)


def test_set_overrides_a_field_of_the_gpu():
    base = "evaluate --model llama2-7b --gpu h100-sxm-80gb --gpus 8 --zero 1 --global-batch 64 --seq-len 2048".split()
    ref = run_json(base)
    assert ref["feasible"]
    fast = run_json([*base, "--set", "hbm_bw_GBps=9600"])
    assert fast["step_time_s"] <= ref["step_time_s"]
    tiny = run_json([*base, "--set", "hbm_capacity_GiB=1"])
    assert tiny["memory_per_gpu_GiB"]["hbm_capacity"] == 1.0
    assert "does not fit in HBM" in tiny["reasons"]


def test_extra_catalog_file_adds_a_gpu(tmp_path):
    toml = new_gpu_toml(tmp_path / "future.toml", "future-gpu", name="Future GPU", hbm_capacity_GiB=512.0)
    listed = run(["catalog", "gpus", "--catalog", toml])
    assert listed.exit_code == 0 and "future-gpu" in listed.stdout

    args = ["evaluate", "--model", "llama2-70b", "--gpu", "future-gpu", "--gpus", 8, "--tp", 8, "--global-batch", 64]
    r = run_json([*args, "--seq-len", 4096, "--catalog", toml])
    assert r["gpu"] == "future-gpu"
    assert r["memory_per_gpu_GiB"]["hbm_capacity"] == 512.0
    h100 = run_json([*args[:4], "h100-sxm-80gb", *args[5:], "--seq-len", 4096])
    # Same compute and network as the H100 it was copied from: the same step time.
    assert r["step_time_s"] == pytest.approx(h100["step_time_s"], rel=1e-6)


# --------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit code 2
# --------------------------------------------------------------------------------------------

EVAL = "evaluate --gpu h100-sxm-80gb --gpus 8 --global-batch 64".split()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        ([*EVAL, "--model", "llama-9000"], ("unknown model", "llama-9000")),
        ("evaluate --model llama2-7b --gpu h900 --gpus 8 --global-batch 64".split(), ("unknown gpu", "h900")),
        ([*EVAL[:3], "--gpus", "10", "--tp", "4", *EVAL[5:], "--model", "llama2-7b"], ("--gpus 10", "divisible")),
        ([*EVAL, "--model", "llama2-7b", "--tp", "-1"], ("--tp", "-1")),
        ([*EVAL, "--model", "llama2-7b", "--pp", "0"], ("--pp",)),
        ([*EVAL, "--model", "llama2-7b", "--micro-batch", "-2"], ("--micro-batch",)),
        ([*EVAL, "--model", "llama2-7b", "--zero", "4"], ("--zero",)),
        ([*EVAL, "--model", "llama2-7b", "--recompute", "some"], ("--recompute", "selective")),
        ([*EVAL, "--model", "llama2-7b", "--offload", "optimizer:floppy"], ("--offload", "host-dram")),
        ([*EVAL, "--model", "llama2-7b", "--set", "hbm_speed=9600"], ("--set", "hbm_speed")),
        ([*EVAL, "--model", "llama2-7b", "--set", "hbm_bw_GBps=fast"], ("hbm_bw_GBps", "fast")),
        ([*EVAL, "--model", "llama2-7b", "--set", "hbm_bw_GBps"], ("--set", "FIELD=VALUE")),
        ([*EVAL, "--model", "llama2-7b", "--catalog", "/no/such/file.toml"], ("/no/such/file.toml",)),
        ([*EVAL, "--layers", "4", "--hidden", "512"], ("--heads",)),
        (EVAL, ("--model",)),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragments):
    assert_user_error(run(args), *fragments)


def test_bad_catalog_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpus.x\nname = 1\n")
    assert_user_error(run([*EVAL, "--model", "llama2-7b", "--catalog", bad]), str(bad))
    incomplete = tmp_path / "incomplete.toml"
    incomplete.write_text('[gpus.half-gpu]\nname = "Half"\n')
    assert_user_error(run(["catalog", "gpus", "--catalog", incomplete]), "half-gpu", "missing")


def test_malformed_runs_csv(tmp_path):
    missing_columns = tmp_path / "missing.csv"
    missing_columns.write_text("id,source,model\nr1,x,y\n")
    assert_user_error(run(["validate", "--runs", missing_columns]), str(missing_columns), "missing columns")

    # A correct header, then a row with too few fields.
    short_row = tmp_path / "short.csv"
    short_row.write_text(",".join(REQUIRED_COLUMNS) + "\nr1,some source,GPT\n")
    assert_user_error(run(["validate", "--runs", short_row]), str(short_row))

    assert_user_error(run(["validate", "--runs", tmp_path / "absent.csv"]), "absent.csv")


def test_console_script_exit_code_and_stderr():
    """The real process: exit status 2, one stderr line, no traceback."""
    cmd = [sys.executable, "-m", "dse", *EVAL, "--model", "llama2-7b", "--tp", "-1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: --tp must be a positive integer <= 1,048,576; got -1"]
    assert proc.stdout == ""


# --------------------------------------------------------------------------------------------
# catalog, validate
# --------------------------------------------------------------------------------------------


def test_catalog_lists_gpus_and_models():
    result = run(["catalog", "gpus"])
    assert result.exit_code == 0
    assert "h100-sxm-80gb" in result.stdout
    gpus = run_json(["catalog", "gpus"])
    assert gpus["h100-sxm-80gb"]["hbm_capacity_GiB"] == 80.0
    assert set(gpus) == set(load_catalog().gpus)
    models = run(["catalog", "models"])
    assert models.exit_code == 0 and "llama2-70b" in models.stdout


def test_validate_json_report(tmp_path):
    out = tmp_path / "validation.json"
    result = run(["validate", "--out", out, "--worst", "3"])
    assert result.exit_code == 0, result.stderr
    assert "MAPE" in result.stdout and "Worst 3" in result.stdout

    def no_nan(name):
        raise AssertionError(f"non-JSON constant {name} in the report")

    doc = json.loads(out.read_text(), parse_constant=no_nan)
    for key in ("n_runs", "mape_step_time_pct", "mape_step_time_pct_complete", "max_abs_error_pct", "per_source"):
        assert key in doc
    with default_runs_path().open() as handle:
        ids = [row["id"] for row in csv.DictReader(handle)]
    assert doc["n_runs"] == len(doc["rows"]) == len(ids)
    assert [r["id"] for r in doc["rows"]] == ids
    for row in doc["rows"]:
        assert {"id", "measured_step_time_s", "predicted_step_time_s", "error_pct", "feasible"} <= set(row)
        assert row["measured_step_time_s"] > 0
    # --json means what it means in every command: the same document on stdout, no tables.
    printed = run(["validate", "--json"])
    assert printed.exit_code == 0, printed.stderr
    assert json.loads(printed.stdout) == doc
    errors = [abs(r["error_pct"]) for r in doc["rows"]]
    assert doc["mape_step_time_pct"] == pytest.approx(sum(errors) / len(errors), rel=1e-6)
    assert doc["max_abs_error_pct"] == pytest.approx(max(errors), rel=1e-6)
    assert sum(s["n"] for s in doc["per_source"].values()) == doc["n_runs"]
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file


def test_validate_rejects_a_bad_stacks_file(tmp_path):
    bad = tmp_path / "stacks.toml"
    bad.write_text('[old]\nmatch = ["Narayanan"]\nattention = "sparse"\n')
    out = tmp_path / "v.json"
    assert_user_error(run(["validate", "--stacks", bad, "--out", out]), str(bad), "attention", "flash2")
    assert not out.exists()


def test_calibrate_writes_a_loadable_calibration(tmp_path):
    from hetersim.fit.calibration import BOUNDS, load_calibration

    out = tmp_path / "calibration.toml"
    r = run_json(["calibrate", "--steps", "2", "--out", out])
    assert r["written"] == str(out)
    assert r["mape_before_pct"] > 0 and r["mape_after_pct"] > 0
    assert set(r["values"]) == set(BOUNDS)
    assert load_calibration(out) == pytest.approx(r["values"], rel=1e-5)
    assert r["start_values"] == load_calibration()


def test_a_boolean_left_unset_reports_its_default_and_can_be_turned_off():
    """zero3_prefetch is on by default: the reported plan says so (it said nothing, and the layout
    label read "no-zero3_prefetch"), and --no-zero3-prefetch turns it off, each gather then waiting."""
    base = ["evaluate", "--gpu", "a100-sxm-80gb", "--gpus", "8", "--model", "llama2-7b", "--global-batch", "8"]
    on = run_json([*base, "--zero", "3"])
    off = run_json([*base, "--zero", "3", "--no-zero3-prefetch"])
    assert (on["plan"]["zero3_prefetch"], off["plan"]["zero3_prefetch"]) == (True, False)
    assert off["step_time_s"] > on["step_time_s"]
    assert on["step_time_s"] == run_json([*base, "--zero", "3", "--zero3-prefetch"])["step_time_s"]
    # cpu_optimizer's rule (on when the optimizer is offloaded) is what the plan reports.
    offload = run_json([*base, "--zero", "1", "--offload", "optimizer:host-dram"])
    assert (on["plan"]["cpu_optimizer"], offload["plan"]["cpu_optimizer"]) == (False, True)
