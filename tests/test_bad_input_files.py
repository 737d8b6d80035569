"""Bad input found by the fourth fuzz (files and services): each case one line ``error: ...``
naming its file, key or flag, exit 2, no traceback, nothing written — checked as
:mod:`tests.test_bad_input` checks its cases (:func:`~tests.test_bad_input.assert_one_line_error`,
the folder listed before and after)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from dse import sweep
from dse.cli import app
from tests.test_bad_input import assert_one_line_error, listing
from tests.test_sweep import CHUNK, write_study

ROOT = Path(__file__).resolve().parents[1]
EV = ["evaluate", "--model", "llama2-7b"]
DS_EV = [*EV, "--gpu", "a100-sxm-80gb", "--gpus", "8"]
PLAN = """global_batch = 64
micro_batch = 1
balance = "equal"
[[stage]]
layers = {layers}
replicas = [{{ gpu = "a100-sxm-80gb", tp = {tp}, count = 2 }}]
[[stage]]
layers = 16
replicas = [{{ gpu = "h100-sxm-80gb", tp = 2, count = 2 }}]
"""


def _files(tmp: Path) -> None:
    (tmp / "layers_inf.toml").write_text(PLAN.format(layers="inf", tp=2))
    (tmp / "layers_nan.toml").write_text(PLAN.format(layers="nan", tp=2))
    (tmp / "tp_inf.toml").write_text(PLAN.format(layers=16, tp="inf"))
    hardware = (ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml").read_text()
    huge = hardware.replace("{low = 3000, high = 9600, step = 300}", "{low = 1e39, high = 1e40}", 1)
    (tmp / "huge_range.toml").write_text(huge)
    study = '[model]\nkey = "llama2-7b"\n[hardware]\n{hw}\n[plan]\ntp = [1, 2]\nglobal_batch = 64\nseq_len = 4096\n'
    mix = 'cluster = "a100-sxm-80gb:4,h100-sxm-80gb:4"\nn_gpus = 16'
    (tmp / "mix_16.toml").write_text('name = "s"\n' + study.format(hw=mix))
    as_text = 'gpu = "h100-sxm-80gb"\nn_gpus = 8\n[hardware.set]\nhbm_bw_GBps = "9600"'
    (tmp / "set_text.toml").write_text('name = "s"\n' + study.format(hw=as_text))
    (tmp / "plain.toml").write_text('name = "s"\n' + study.format(hw='gpu = "h100-sxm-80gb"\nn_gpus = 8'))
    two = 'gpu = ["h100-sxm-80gb", "H100-SXM-80GB"]\nn_gpus = 8'
    (tmp / "gpu_twice.toml").write_text('name = "s"\n' + study.format(hw=two))
    models = study.replace('key = "llama2-7b"', 'key = ["llama2-7b", "LLAMA2-7B"]')
    (tmp / "model_twice.toml").write_text('name = "s"\n' + models.format(hw='gpu = "h100-sxm-80gb"\nn_gpus = 8'))
    plan = PLAN.format(layers=16, tp=2)
    (tmp / "link_nvlink.toml").write_text(plan.replace('balance = "equal"', 'balance = "equal"\nlink = "nvlink4"'))
    pipe = "[[pipeline]]\ncount = 1\n{mb}[[pipeline.stage]]\nlayers = 32\n"
    pipe += 'replicas = [{{ gpu = "{gpu}", tp = 1, count = 1 }}]\n'
    some = pipe.format(mb="micro_batches = 60\n", gpu="h100-sxm-80gb") + pipe.format(mb="", gpu="a100-sxm-80gb")
    (tmp / "some_pipelines.toml").write_text("global_batch = 64\nmicro_batch = 1\n" + some)
    (tmp / "unknown_gpu.toml").write_text(plan.replace('gpu = "a100-sxm-80gb"', 'gpu = "a999"'))
    (tmp / "zero_true.toml").write_text(plan.replace('balance = "equal"', 'balance = "equal"\nzero = true'))
    stage = '{"layers": 32, "gpu": "h100-sxm-80gb", "tp": 1, "dp": Infinity}'
    (tmp / "dp_infinity.json").write_text('{"global_batch": 64, "micro_batch": 1, "stage": [' + stage + "]}")
    ds = '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, %s "bf16": {"enabled": true}}'
    (tmp / "ds_stage_inf.json").write_text(ds % '"zero_optimization": {"stage": Infinity},')
    (tmp / "ds_batch_nan.json").write_text((ds % "").replace("64", "NaN", 1))
    (tmp / "hf_twice.json").write_text('{"model_type": "llama", "num_hidden_layers": 32, "num_hidden_layers": 80}')
    (tmp / "plan_twice.json").write_text('{"global_batch": 64, "global_batch": 128, "stage": [' + stage + "]}")
    (tmp / "ds_twice.json").write_text(
        '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "train_batch_size": 32}'
    )
    runs = (ROOT / "hetersim" / "data" / "published_runs.csv").read_text().splitlines()
    header, first = runs[0].split(","), next(csv.reader([runs[1]]))
    _csv(tmp / "runs_gpu_twice.csv", [*header, "gpu"], [*first, "h100-sxm-80gb"])
    for name, changes in {
        "runs_nothing": dict(measured_step_time_s="", measured_tokens_per_s_per_gpu="", measured_mfu=""),
        "runs_mfu_percent": dict(measured_step_time_s="", measured_tokens_per_s_per_gpu="", measured_mfu="44"),
        "runs_cp": dict(seq_len="2047", cp="2", dp="16"),
    }.items():
        _csv(tmp / f"{name}.csv", header, [changes.get(c, v) for c, v in zip(header, first, strict=True)])
    fast = '[gpus.h100-sxm-80gb]\naliases = "fast"\n[gpus.h200-sxm-141gb]\naliases = "fast"\n'
    (tmp / "aliases.toml").write_text(fast)
    stack = '[s]\nname = "a stack"\nmatch = ["Narayanan"]\nstack = "megatron-legacy"\n'
    (tmp / "stacks_sources.toml").write_text(stack + 'sources = "see paper"\n')
    (tmp / "stacks_reuse.toml").write_text(stack + "zero3_reuse_Mparams = inf\n")


def _csv(path: Path, header: list[str], row: list[str]) -> None:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([header, row])
    path.write_text(out.getvalue())


CASES = [
    ("plan-layers-inf", [*EV, "--plan", "{tmp}/layers_inf.toml"], ["layers_inf.toml", "stage 0", "layers", "inf"]),
    ("plan-layers-nan", [*EV, "--plan", "{tmp}/layers_nan.toml"], ["layers_nan.toml", "layers", "nan"]),
    ("plan-tp-inf", [*EV, "--plan", "{tmp}/tp_inf.toml"], ["tp_inf.toml", "tp", "inf"]),
    (
        "plan-json-infinity",
        [*EV, "--plan", "{tmp}/dp_infinity.json"],
        ["dp_infinity.json", "stage 0: count must be", "got inf"],
    ),
    ("ds-stage-inf", [*DS_EV, "--recipe", "{tmp}/ds_stage_inf.json"], ["ds_stage_inf.json", "zero_optimization.stage"]),
    ("ds-batch-nan", [*DS_EV, "--recipe", "{tmp}/ds_batch_nan.json"], ["ds_batch_nan.json", "train_batch_size"]),
    (
        "stacks-sources-not-a-table",
        ["validate", "--stacks", "{tmp}/stacks_sources.toml"],
        ["stacks_sources.toml", "sources", "table"],
    ),
    (
        "stacks-reuse-inf",
        ["validate", "--stacks", "{tmp}/stacks_reuse.toml"],
        ["stacks_reuse.toml", "zero3_reuse_Mparams", "finite"],
    ),
    # a key given twice, which JSON readers and csv.DictReader settle silently by taking the last
    (
        "json-key-twice",
        [*DS_EV[:1], "--model", "{tmp}/hf_twice.json", *DS_EV[3:], "--global-batch", "8"],
        ["hf_twice.json", '"num_hidden_layers" is given twice'],
    ),
    ("plan-key-twice", [*EV, "--plan", "{tmp}/plan_twice.json"], ["plan_twice.json", '"global_batch" is given twice']),
    (
        "ds-key-twice",
        [*DS_EV, "--recipe", "{tmp}/ds_twice.json"],
        ["ds_twice.json", '"train_batch_size" is given twice'],
    ),
    (
        "runs-column-twice",
        ["validate", "--runs", "{tmp}/runs_gpu_twice.csv"],
        ["runs_gpu_twice.csv", "'gpu' appears twice"],
    ),
    (
        "set-twice",
        [*DS_EV, "--global-batch", "8", "--set", "hbm_bw_GBps=3000", "--set", "hbm_bw_GBps=4000"],
        ["--set hbm_bw_GBps=3000", "hbm_bw_GBps=4000", "contradict"],
    ),
    # runs rows: refused before the work is announced, one line
    ("runs-no-measurement", ["validate", "--runs", "{tmp}/runs_nothing.csv"], ["runs_nothing.csv", "no measured step"]),
    ("runs-mfu-percent", ["validate", "--runs", "{tmp}/runs_mfu_percent.csv"], ["measured_mfu 44 is above 1"]),
    ("runs-cp-cannot-cut", ["validate", "--runs", "{tmp}/runs_cp.csv"], ["seq_len 2047", "2 x cp = 4"]),
    # plan files: a share given for some pipelines only (the rest were dealt equally, the share
    # ignored), a scale-up link between kinds on different nodes (a cap above their NICs: no effect)
    ("plan-some-pipelines", [*EV, "--plan", "{tmp}/some_pipelines.toml"], ["for some pipelines only"]),
    ("plan-nvlink-between-kinds", [*EV, "--plan", "{tmp}/link_nvlink.toml"], ["'nvlink4' between kinds", "scaleout"]),
    # errors that named a flag nobody gave, or no file
    ("plan-unknown-gpu", [*EV, "--plan", "{tmp}/unknown_gpu.toml"], ["unknown_gpu.toml: unknown gpu 'a999'"]),
    ("plan-zero-true", [*EV, "--plan", "{tmp}/zero_true.toml"], ["zero_true.toml", "zero must be", "got True"]),
    ("model-empty", ["evaluate", "--model", "", *DS_EV[3:], "--global-batch", "8"], ["--model is empty"]),
    (
        "set-a-switch-to-a-number",
        [*DS_EV, "--global-batch", "8", "--set", "cxl_p2p=1"],
        ["--set: gpus.a100-sxm-80gb.cxl_p2p must be true or false"],
    ),
    (  # evaluated at 1e40, which float32 cannot hold; --set refuses it
        "search-range-beyond-the-catalog",
        ["optimize", "{tmp}/huge_range.toml", "--trials", "1", "--out", "{tmp}"],
        ["huge_range.toml", "search.hbm_bw_GBps", "at most 1e+12"],
    ),
    # studies: a value no point can use, a number written as text, an option that changes nothing
    ("study-gpus-of-no-cluster", ["sweep", "{tmp}/mix_16.toml", "--out", "{tmp}"], ["hardware.n_gpus", "[16]", "[8]"]),
    ("study-set-as-text", ["sweep", "{tmp}/set_text.toml", "--out", "{tmp}"], ["hbm_bw_GBps must be", "'9600'"]),
    ("study-gpu-twice", ["sweep", "{tmp}/gpu_twice.toml", "--out", "{tmp}"], ["'H100-SXM-80GB'", "same entry"]),
    ("study-model-twice", ["sweep", "{tmp}/model_twice.toml", "--out", "{tmp}"], ["'LLAMA2-7B'", "same entry"]),
    ("top-k-unstreamed", ["sweep", "{tmp}/plain.toml", "--out", "{tmp}", "--no-stream", "--top-k", "5"], ["--top-k"]),
    # a catalog name that names two entries (an entry's own key names it first, as always)
    (
        "alias-shared",
        [*DS_EV[:1], "--catalog", "{tmp}/aliases.toml", "--model", "llama2-7b", "--gpu", "FAST", *DS_EV[5:]]
        + ["--global-batch", "8"],
        ["gpu 'FAST' is ambiguous", "h100-sxm-80gb, h200-sxm-141gb"],
    ),
]


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _files(tmp_path)
    return tmp_path


def _invoke(args: list[str], tmp: Path):
    before = listing(tmp)
    result = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp)) for a in args])
    assert listing(tmp) == before, "the failed command left files behind"
    return result


@pytest.mark.parametrize("args, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_file_is_one_line_and_leaves_nothing(tmp, args, fragments):
    result = _invoke(args, tmp)
    assert_one_line_error(result.exit_code, result.stderr, fragments)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("results")
    return sweep.run_sweep(write_study(tmp), tmp / "out", chunk=CHUNK, progress=False)


def test_a_results_file_without_configurations_is_refused(tmp, results):
    with xr.open_dataset(results) as ds:
        ds.load().isel(config=slice(0, 0)).to_netcdf(tmp / "empty.nc")
    result = _invoke(["report", "{tmp}/empty.nc", "--out", "{tmp}/rep", "--no-validation"], tmp)
    assert_one_line_error(result.exit_code, result.stderr, ["empty.nc", "no configurations"])


@pytest.mark.parametrize("flag", ["--csv", "--parquet"])
def test_export_never_writes_over_the_results_file_it_reads(tmp, results, flag):
    copy = tmp / "r.nc"
    copy.write_bytes(results.read_bytes())
    result = _invoke(["export", str(copy), flag, str(copy)], tmp)
    assert_one_line_error(result.exit_code, result.stderr, [flag, "r.nc", "results file"])
    assert copy.read_bytes() == results.read_bytes()


def test_a_scheduler_that_does_not_answer_is_refused_before_any_file(tmp, monkeypatch):
    pytest.importorskip("dask.distributed")
    import dask

    study = write_study(tmp)
    before = listing(tmp)
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        result = CliRunner().invoke(
            app, ["sweep", str(study), "--out", str(tmp / "out"), "--scheduler", "tcp://127.0.0.1:1"]
        )
    assert_one_line_error(result.exit_code, result.stderr, ["--scheduler tcp://127.0.0.1:1", "no Dask scheduler"])
    assert listing(tmp) == before


FOO = {
    "model_type": "foo_lm",  # a type transformers does not know: the file is read as written
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        # was read as true
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
        ({"max_position_embeddings": 131072.5}, "max_position_embeddings must be a positive integer"),  # was capped
        ({"max_position_embeddings": 1e30}, "max_position_embeddings must be a positive integer"),
        ({"max_position_embeddings": None, "n_positions": 1e30}, "n_positions must be a positive integer"),
        (  # was read as full attention
            {"sliding_window": "4096", "layer_types": ["sliding_attention"] * 32},
            "sliding_window must be a positive integer (or null); got '4096'",
        ),
    ],
)
def test_a_config_of_an_unknown_type_is_read_as_written_or_refused(tmp_path, changes, needle):
    from hetersim.catalog import model_from_hf_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**FOO, **changes}))
    with pytest.raises(ValueError, match=re.escape(needle)):
        model_from_hf_config(path)


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_code_outside_a_columns_flag_values_is_refused(tmp, results, command):
    """recompute = 99 was exported as empty strings and drawn in a report."""
    with xr.open_dataset(results) as ds:
        ds = ds.load()
    codes = ds["recompute"]
    ds["recompute"] = codes.copy(data=np.full(codes.shape, 99, codes.dtype))  # its flag attributes kept
    ds.to_netcdf(tmp / "codes.nc")
    out = ["--out", "{tmp}/rep", "--no-validation"] if command == "report" else ["--csv", "{tmp}/t.csv"]
    result = _invoke([command, "{tmp}/codes.nc", *out], tmp)
    assert_one_line_error(result.exit_code, result.stderr, ["codes.nc", "recompute holds code 99"])
