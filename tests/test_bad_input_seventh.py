"""Bad input found by the seventh fuzz (model and hardware inputs; outputs, files and numeric
flags) and the cases the last rounds left: each case one line ``error: ...`` naming its file,
key or flag, exit 2, no traceback, nothing written, checked as :mod:`tests.test_bad_input` checks
its cases; and the inputs that were misread, now read as they say."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dse.cli import app
from tests.test_bad_input import check_refused

ROOT = Path(__file__).resolve().parents[1]
EVAL = ["evaluate", "--model", "llama2-7b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8"]
MIX = ["--model", "llama2-7b", "--cluster", "a100-sxm-80gb:4,h100-sxm-80gb:4"]
MODEL = """[models.m]
name = "M"
layers = 4
hidden = 1024
heads = 16
kv_heads = 4
ffn_hidden = 2816
vocab = 32000
mlp = "gated"
seq_len = 4096
tied_embeddings = false
source = "a user's"
"""
A100_80G = ROOT / "tests" / "data" / "calculon" / "a100_80g.json"  # no float8 peak
OPTIMIZE = ["optimize", str(ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml"), "--trials", "1"]
BUDGET = ["plan", "--model", "llama2-7b", "--global-batch", "8", "--budget", "100", "--kinds"]
REPORT = ["report", "--no-validation", "--out", "{tmp}/r"]
SYSTEM = [
    "evaluate",
    "--model",
    "llama2-7b",
    "--gpu",
    "a100-sxm-80gb",
    "--gpus",
    "8",
    "--global-batch",
    "8",
    "--system",
]
# A fleet with no failures named by a GPU: the fleet's own rule speaks first.
FLEET_ZERO = """[fleets.f]
name = "F"
window_days = 10
job_gpus = 100
restart_s = 60
pfs_GBps = 100
nvme_GBps = 5
nvme_capacity_GiB = 1000
""" + "".join(f"interruptions_{k} = 0\n" for k in ("gpu", "host", "network", "software", "maintenance", "unknown"))
FLEET_ZERO += '[gpus.h100-sxm-80gb]\nfleet = "f"\n'
# DeepSpeed configs that give one, two or three of its batch keys (deepspeed/runtime/config.py).
DS = {
    "ds_accumulation.json": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4},
    "ds_global.json": {"train_batch_size": 64},
    "ds_uneven.json": {"train_batch_size": 60},
    "ds_all.json": {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2},
}
# A results dataset as a sweep writes it (the variables report reads), and edits of it.
RESULTS = {
    "r_no_meanings.nc": lambda ds: ds.gpu.attrs.pop("flag_meanings"),
    "r_no_objectives.nc": lambda ds: ds.attrs.update(objectives=""),
    "r_short_senses.nc": lambda ds: ds.attrs.update(objective_senses="min"),
    "r_negative.nc": lambda ds: ds["time_to_train_s"].values.__setitem__(0, -1.0),
    "r_text.nc": lambda ds: ds.update({"step_time_s": ("config", np.array(["a", "b"]))}),
}
STUDY = """name = "{name}"
[model]
key = "llama2-7b"
[hardware]
gpu = "h100-sxm-80gb"
n_gpus = 8
{hardware}
[plan]
global_batch = 8
micro_batch = 1
tp = 8
seq_len = 2048
"""


def _files(tmp: Path) -> None:
    for name, hardware in {
        "s_fleet.toml": '[hardware.set]\nfleet = "nosuch"',
        "s_pool.toml": '[hardware.set]\ncxl_pool = "nosuch-pool:4hosts"',
        "s_expander.toml": '[hardware.set]\ncxl_expander = "nosuch:2"',
    }.items():
        (tmp / name).write_text(STUDY.format(name="t", hardware=hardware))
    (tmp / "c_fleet.toml").write_text('[gpus.h100-sxm-80gb]\nfleet = "nosuch"\n')
    (tmp / "c_fleet_zero.toml").write_text(FLEET_ZERO)
    (tmp / "c_topk.toml").write_text(MODEL + "n_experts = 8\nmoe_ffn_hidden = 1024\n")
    (tmp / "c_share.toml").write_text(MODEL + "sliding_window_share = 0.5\n")
    system = json.loads(A100_80G.read_text())
    for name, (key, value) in {
        "sys_latency.json": ("latency", 1e9),
        "sys_size.json": ("size", 7),
        "sys_offset.json": ("ops", {**system["networks"][0]["ops"], "all_reduce": [2.0, "x"]}),
    }.items():
        network = {**system["networks"][0], key: value}
        (tmp / name).write_text(json.dumps({**system, "networks": [network, system["networks"][1]]}))
    os.mkfifo(tmp / "fifo.toml")  # read, it blocked for ever; written, os.replace put a file there
    (tmp / "runs.csv").write_text((ROOT / "hetersim" / "data" / "published_runs.csv").read_text())
    (tmp / "small.toml").write_text(STUDY.format(name="small", hardware=""))
    for name, edit in RESULTS.items():
        _results(edit).to_netcdf(tmp / name)
    for name, batch in DS.items():
        (tmp / name).write_text(json.dumps({**batch, "bf16": {"enabled": True}}))


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written to the current folder shows in the listing
    _files(tmp_path)
    return tmp_path


CASES = [
    # an empty path is the current folder to pathlib: never guessed
    ("sweep-out-empty", ["sweep", "--out", ""], ["--out is empty"]),
    ("sweep-out-eq-empty", ["sweep", "--out="], ["--out is empty"]),
    ("evaluate-catalog-empty", [*EVAL, "--catalog", " "], ["--catalog is empty"]),
    ("report-current-folder", ["report", "."], [".: a folder, not a results file"]),
    # a name another section holds, checked where it enters (it failed inside the sweep, unnamed)
    ("set-fleet", [*EVAL, "--set", "fleet=nosuch"], ["--set", "fleet", "unknown fleet 'nosuch'"]),
    ("set-pool", [*EVAL, "--set", "cxl_pool=nosuch:4hosts"], ["--set", "cxl_pool", "'nosuch'"]),
    ("set-dram-channel", [*EVAL, "--set", "host_dram_channel=x"], ["host_dram_channel", "unknown dram device"]),
    ("study-set-fleet", ["sweep", "{tmp}/s_fleet.toml"], ["s_fleet.toml", "hardware.set", "fleet", "'nosuch'"]),
    ("study-set-pool", ["sweep", "{tmp}/s_pool.toml"], ["s_pool.toml", "hardware.set", "cxl_pool"]),
    ("study-set-expander", ["sweep", "{tmp}/s_expander.toml"], ["s_expander.toml", "cxl_expander", "'nosuch'"]),
    ("catalog-fleet", [*EVAL, "--catalog", "{tmp}/c_fleet.toml"], ["c_fleet.toml", "fleet", "unknown fleet"]),
    # the seventh fuzz (model and hardware inputs): an empty name, a note before the error line,
    # flags named by internal names, a switch tree deeper than its hosts, fields given a default
    ("evaluate-gpu-empty", ["evaluate", "--model", "llama2-7b", "--gpu", "", "--gpus", "8"], ["--gpu is empty"]),
    (
        "system-note-before-error",
        [*EVAL[:4], "a100-sxm-80gb", *EVAL[5:], "--system", str(A100_80G), "--precision", "fp8"],
        ["--precision fp8", "no such peak"],
    ),
    ("set-with-cluster", [*EVAL[:3], *MIX[2:], *EVAL[5:], "--pp", "2", "--set", "hbm_bw_GBps=100"], ["--cluster"]),
    ("system-with-cluster", [*EVAL[:3], *MIX[2:], *EVAL[5:], "--system", str(A100_80G)], ["--system", "--cluster"]),
    ("system-latency", [*SYSTEM, "{tmp}/sys_latency.json"], ["sys_latency.json", "networks[0].latency", "<= 1e+06"]),
    ("system-size", [*SYSTEM, "{tmp}/sys_size.json"], ["sys_size.json", "networks[0].size 7"]),
    ("system-ops-offset", [*SYSTEM, "{tmp}/sys_offset.json"], ["networks[0].ops.all_reduce[1]", "'x'"]),
    (
        "dims-hidden",
        ["evaluate", "--layers", "2", "--hidden", "4095", "--heads", "32", *EVAL[3:]],
        ["--hidden must be a multiple"],
    ),
    (
        "dims-kv-heads",
        ["evaluate", "--layers", "2", "--hidden", "4096", "--heads", "32", "--kv-heads", "64", *EVAL[3:]],
        ["--kv-heads must divide"],
    ),
    (
        "cxl-pool-levels",
        [*EVAL, "--zero", "3", "--cxl-pool", "samsung-cmm-b-pool:4hosts:99", "--offload", "optimizer:cxl-pool"],
        ["--cxl-pool", "LEVELS must be at most 3 for 4 hosts"],
    ),
    ("catalog-experts-no-top-k", [*EVAL, "--catalog", "{tmp}/c_topk.toml"], ["c_topk.toml", "n_experts 8 needs top_k"]),
    ("catalog-share-no-window", [*EVAL, "--catalog", "{tmp}/c_share.toml"], ["c_share.toml", "needs sliding_window"]),
    ("set-gpus-per-node", [*EVAL, "--set", "gpus_per_node=7"], ["--set", "gpus_per_node 7"]),
    # the seventh fuzz (outputs, files, numeric flags): a pipe or device as a file, an output over
    # an input, unbounded counts, kinds and seeds named by their flag, edited results files
    ("study-fifo", ["sweep", "{tmp}/fifo.toml"], ["STUDY", "fifo.toml: not a regular file"]),
    ("catalog-fifo", [*EVAL, "--catalog", "{tmp}/fifo.toml"], ["--catalog", "fifo.toml: not a regular file"]),
    ("model-fifo", [*EVAL[:2], "{tmp}/fifo.toml", *EVAL[3:]], ["--model", "fifo.toml: not a regular file"]),
    ("out-fifo", ["validate", "--out", "{tmp}/fifo.toml"], ["--out", "fifo.toml: not a regular file"]),
    ("storage-fifo", [*OPTIMIZE, "--storage", "{tmp}/fifo.toml"], ["--storage", "not a regular file"]),
    ("argument-empty", ["export", "", "--csv", "{tmp}/t.csv"], ["PATH is empty"]),
    ("section-empty", ["catalog", ""], ["SECTION is empty; give a value"]),
    ("fleet-before-its-gpu", [*EVAL, "--catalog", "{tmp}/c_fleet_zero.toml"], ["fleets.f needs interruptions > 0"]),
    ("validate-out-is-runs", ["validate", "--runs", "{tmp}/runs.csv", "--out", "runs.csv"], ["this command reads"]),
    ("calibrate-out-is-runs", ["calibrate", "--runs", "{tmp}/runs.csv", "--out", "{tmp}/runs.csv"], ["reads"]),
    ("sweep-workers", ["sweep", "{tmp}/small.toml", "--workers", str(2**64)], ["--workers must be from 0 to"]),
    ("plan-cluster-count", ["plan", *MIX[:2], "--cluster", f"h100-sxm-80gb:{2**64}", "--global-batch", "8"], ["<="]),
    ("cluster-no-kind", [*EVAL[:3], "--cluster", ":4,a100-sxm-80gb:4", *EVAL[5:]], ["--cluster", "':4'"]),
    ("cluster-unknown-kind", [*EVAL[:3], "--cluster", "zz9:4,a100-sxm-80gb:4", *EVAL[5:]], ["--cluster", "'zz9'"]),
    ("plan-kinds-unknown", [*BUDGET, "h100-sxm-80gb,zz9"], ["--kinds", "'zz9'"]),
    ("plan-kinds-twice", [*BUDGET, "h100-sxm-80gb,H100"], ["--kinds must name distinct"]),
    ("plan-kinds-empty-item", [*BUDGET, "h100-sxm-80gb,,a100-sxm-80gb"], ["--kinds must name distinct"]),
    ("plan-seed", [*BUDGET, "h100-sxm-80gb,a100-sxm-80gb", "--trials", "4", "--seed", str(2**32)], ["--seed must"]),
    ("report-no-meanings", [*REPORT, "{tmp}/r_no_meanings.nc"], ["gpu has one of flag_values and flag_meanings"]),
    ("report-no-objectives", [*REPORT, "{tmp}/r_no_objectives.nc"], ["objectives attribute names no metric"]),
    ("report-short-senses", [*REPORT, "{tmp}/r_short_senses.nc"], ["1 senses for 2 objectives"]),
    ("report-negative", [*REPORT, "{tmp}/r_negative.nc"], ["time_to_train_s holds negative values"]),
    ("report-text", [*REPORT, "{tmp}/r_text.nc"], ["step_time_s must be numbers along config"]),
    # a DeepSpeed batch that its own assertion refuses (the accumulation steps were ignored)
    (
        "deepspeed-steps-against-flag",
        [*EVAL[:-2], "--recipe", "{tmp}/ds_accumulation.json", "--global-batch", "32"],
        ["ds_accumulation.json", "--global-batch 32", "gradient_accumulation_steps", "2 x 4 x 8 = 64"],
    ),
    ("deepspeed-steps-layout", [*EVAL[:-2], "--recipe", "{tmp}/ds_all.json"], ["ds_all.json", "2 x 2 x 8 = 32"]),
    ("deepspeed-uneven", [*EVAL[:-2], "--recipe", "{tmp}/ds_uneven.json"], ["train_batch_size 60", "8 data-parallel"]),
    # the plan search's batch named by its flags (it named the plan file's fields, after a status line)
    (
        "plan-batch-micro",
        ["plan", *MIX, "--global-batch", "8", "--micro-batch", "3"],
        ["--global-batch 8", "--micro-batch 3"],
    ),
]


@pytest.mark.parametrize("args, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(tmp, args, fragments):
    check_refused(tmp, args, fragments)


def test_a_study_named_like_its_file_is_written_once_with_the_suffix():
    from dse.optimize.results import output_path as optimize_path
    from dse.sweep.run import output_path

    assert output_path("results", "t.nc") == Path("results/t.nc")
    assert output_path("results", "t") == Path("results/t.nc")
    assert optimize_path("results", "t.nc") == Path("results/t.optimize.nc")


@pytest.mark.parametrize(
    "name, flags, batch",
    [
        ("ds_accumulation.json", [], (64, 2)),  # no train_batch_size: micro x steps x ranks (was refused)
        ("ds_accumulation.json", ["--micro-batch", "1"], (32, 1)),  # a flag stands for the file's micro-batch
        ("ds_global.json", [], (64, 8)),  # train_batch_size alone: one step, micro = batch / ranks (was 1)
        ("ds_global.json", ["--tp", "2"], (64, 16)),
    ],
)
def test_a_deepspeed_batch_is_completed_as_deepspeed_completes_it(tmp, name, flags, batch):
    result = CliRunner().invoke(app, [*EVAL[:-2], "--recipe", str(tmp / name), *flags, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert (plan["global_batch"], plan["micro_batch"]) == batch


def test_a_study_gpu_named_by_an_alias_is_labelled_by_its_catalog_key():
    """A study's ``gpu = "H100"`` labelled its results ``H100`` (a name no catalog command shows);
    the catalog key labels them whichever spelling named the device."""
    from dse.study import parse_study

    study = parse_study(STUDY.format(name="t", hardware="").replace('"h100-sxm-80gb"', '["H100", "h200"]'))
    assert study.axes["gpu"] == ("h100-sxm-80gb", "h200-sxm-141gb")
    assert set(study.gpus) == {"h100-sxm-80gb", "h200-sxm-141gb"}


def _results(edit):
    """Two configurations in the variables and attributes ``report`` reads, ``edit`` applied."""
    import xarray as xr

    codes = {"flag_values": np.array([0, 1], dtype=np.int8), "flag_meanings": "h100-sxm-80gb a100-sxm-80gb"}
    ds = xr.Dataset(
        {
            "gpu": ("config", np.array([0, 1], dtype=np.int8), codes),
            "feasible": ("config", np.array([1, 1], dtype=np.int8)),
            "step_time_s": ("config", np.array([1.0, 2.0])),
            **{k: ("config", np.array([3.0, 4.0])) for k in ("time_to_train_s", "cost_usd", "energy_kWh")},
        },
        attrs={"study_name": "t", "objectives": "time_to_train_s cost_usd", "objective_senses": "min min"},
    )
    edit(ds)
    return ds


def test_a_bom_toml_file_reads_as_its_text(tmp):
    """An editor's byte-order mark before a study, catalog or plan file was refused as 'Invalid
    statement (at line 1, column 1)'; the Megatron and CSV readers already read past it."""
    from dse.study import load_study
    from hetersim.catalog import load_catalog
    from hetersim.hplan import read_plan_file

    study = tmp / "bom_study.toml"
    study.write_text("\ufeff" + STUDY.format(name="bom", hardware=""), encoding="utf-8")
    assert load_study(study).name == "bom"
    (tmp / "bom_catalog.toml").write_text("\ufeff" + MODEL, encoding="utf-8")
    assert load_catalog([tmp / "bom_catalog.toml"]).model("m")["layers"] == 4
    plan = '\ufeffglobal_batch = 8\n[[stage]]\nlayers = 32\nreplicas = [{ gpu = "h100-sxm-80gb", tp = 8, count = 1 }]\n'
    (tmp / "bom_plan.toml").write_text(plan, encoding="utf-8")
    assert read_plan_file(tmp / "bom_plan.toml").options["global_batch"] == 8


def test_a_runs_field_past_the_csv_modules_limit_is_read(tmp):
    """A 300 kB notes field ended validate and calibrate in a _csv.Error traceback (csv's 128 KiB
    field limit)."""
    from hetersim.fit.runs import read_runs

    lines = (tmp / "runs.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = next(csv.reader([lines[1]]))
    row[header.index("notes")] = "x" * 300_000
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, row])
    (tmp / "long.csv").write_text(buffer.getvalue())
    assert len(read_runs(tmp / "long.csv")[0].fields["notes"]) == 300_000


def test_a_mixed_plans_layout_line_leaves_out_the_fields_its_stages_set():
    """evaluate --cluster with --layers-per-stage printed 'tpNone ppNone dpNone'."""
    args = [*EVAL[:3], "--cluster", "h100-sxm-80gb:4,a100-sxm-80gb:4", "--pp", "2", *EVAL[5:], "--layers-per-stage"]
    result = CliRunner().invoke(app, [*args, "16,16"])
    assert result.exit_code == 0, result.output
    layout = next(line for line in result.stdout.splitlines() if line.startswith("layout:"))
    assert "None" not in layout and "gb8" in layout


def test_a_toml_error_quotes_the_line_it_names(tmp):
    """tomllib names a key given twice only by its place ('Cannot overwrite a value (at line 6,
    column 22)'): the line is quoted, which names the key."""
    (tmp / "twice.toml").write_text(STUDY.format(name="t", hardware='gpu = "a100-sxm-80gb"'))
    check_refused(tmp, ["sweep", "{tmp}/twice.toml"], ["twice.toml", "Cannot overwrite a value", "'gpu = \"a100"])
    (tmp / "plan_twice.toml").write_text("global_batch = 8\nglobal_batch = 9\n")
    check_refused(tmp, [*EVAL[:3], "--plan", "{tmp}/plan_twice.toml"], ["'global_batch = 9'"])
