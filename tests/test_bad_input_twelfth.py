"""The twelfth bad-input round (a helper session, 592 cases), each case refused as
:mod:`tests.test_bad_input` checks (exit 2, one ``error:`` line naming the flag, file, line or
column, no traceback, the folder as it was) or now answered right: ``--set`` on a ``--cluster``
mix was dropped silently; ``validate --memory`` ended in a traceback on a zero value or micro-batch
and scored NaN, infinite or negative values and any unit as GiB; ``validate``, ``plan`` and
``bench`` replaced any file given as ``--out`` (a results file, notes), and ``export``,
``validate`` and ``plan`` wrote a file where the path ends in a separator; ``--set`` read
non-ASCII digits; a runs row's step time of 1e30 s was scored; a streamed sweep's varied fields
and infeasibility reasons were read from the few rows it kept, and its report refused a file
with no feasible row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import xarray as xr
from typer.testing import CliRunner

from dse.cli import app
from tests.test_bad_input import check_refused

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = (
    "evaluate --model llama2-7b --gpus 16 --global-batch 64 --seq-len 2048 --cluster a100-sxm-80gb:8,h100-sxm-80gb:8"
)
EVA = "evaluate --model llama2-7b --gpus 8 --global-batch 64 --seq-len 2048 --gpu a100-sxm-80gb"


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written to the current folder shows in the listing
    return tmp_path


@pytest.mark.parametrize("extra", [["--zero", "3"], ["--pp", "2"], ["--hetero", "data"]])
def test_set_on_a_cluster_mix_is_refused_whichever_engine_prices_it(tmp, extra):
    args = [*CLUSTER.split(), *extra, "--set", "hbm_bw_GBps=100"]
    check_refused(tmp, args, ["--set applies to one device kind", "--cluster", "--catalog"])


def test_set_reads_ascii_digits_only(tmp):
    check_refused(tmp, [*EVA.split(), "--set", "hbm_bw_GBps=٣٠٠٠"], ["--set", "hbm_bw_GBps", "'٣٠٠٠'"])


def _memory_file(tmp: Path, **cells: str) -> Path:
    lines = (ROOT / "hetersim" / "data" / "published_memory.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = dict(zip(header, next(csv.reader([lines[1]])), strict=True))
    row.update(cells)
    path = tmp / "m.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, header)
        writer.writeheader()
        writer.writerow(row)
    return path


@pytest.mark.parametrize(
    "cells, column",
    [
        (dict(value="0"), "column value"),
        (dict(value="-4"), "column value"),
        (dict(value="nan"), "column value"),
        (dict(value="inf"), "column value"),
        (dict(value="1e30"), "column value"),
        (dict(unit="parsecs"), "column unit"),
        (dict(unit="MiB/GPU"), "column unit"),
        (dict(micro_batch="0"), "column micro_batch"),
        (dict(micro_batch="four"), "column micro_batch"),
        (dict(micro_batch="-4"), "column micro_batch"),
        (dict(recompute="sometimes"), "column recompute"),
        (dict(sp="yes"), "column sp"),
    ],
)
def test_a_memory_row_that_cannot_be_real_is_refused_naming_its_line_and_column(tmp, cells, column):
    memory = _memory_file(tmp, **cells)
    check_refused(tmp, ["validate", "--memory", str(memory), "--json"], [f"{memory}: line 2: {column}"])


def test_the_packaged_memory_file_passes_the_row_checks():
    from hetersim.fit.validation import default_memory_path, memory_records

    assert len(memory_records(default_memory_path())) > 10


def _runs_file(tmp: Path, **cells: str) -> Path:
    lines = (ROOT / "hetersim" / "data" / "published_runs.csv").read_text().splitlines()
    rows = list(csv.DictReader(lines))
    path = tmp / "r.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerow({**rows[0], **cells})
    return path


@pytest.mark.parametrize(
    "cells, column",
    [
        (dict(measured_step_time_s="1e30"), "measured_step_time_s"),
        (dict(measured_step_time_s="", measured_tokens_per_s_per_gpu="1e30"), "measured_tokens_per_s_per_gpu"),
    ],
)
def test_a_measurement_that_cannot_be_real_is_refused(tmp, cells, column):
    runs = _runs_file(tmp, **cells)
    check_refused(tmp, ["validate", "--runs", str(runs)], [f"{runs}: row ", f"column {column}", "at most"])


def _kept(path: Path, text: str | bytes) -> None:
    assert (path.read_bytes() if isinstance(text, bytes) else path.read_text()) == text


def test_outputs_never_replace_a_file_of_other_content(tmp):
    notes = tmp / "notes.txt"
    notes.write_text("my notes, not JSON or TOML\n")
    results = tmp / "r.nc"
    results.write_bytes(b"\x89HDF\r\n\x1a\n a results file")
    for args, kind in (
        (["validate", "--out", "{target}"], "JSON"),
        (["bench", "--configs", "2000", "--out", "{target}"], "JSON"),
        (["calibrate", "--out", "{target}"], "TOML"),
        (["plan", "--model", "llama2-7b", "--global-batch", "64", "--cluster", "a100-sxm-80gb:8", "--out", "{target}"],
         "TOML"),
    ):  # fmt: skip
        for target in (notes, results):
            before = target.read_bytes()
            argv = [a.replace("{target}", str(target)) for a in args]
            check_refused(tmp, argv, ["--out", str(target), f"exists and is no {kind} file"])
            _kept(target, before)


def test_an_output_path_ending_in_a_separator_is_a_folders_path(tmp):
    results = "r.nc"  # the output path is checked before the results file is read
    for args, flag in (
        (["validate", "--out", "v.json/"], "--out"),
        (["plan", "--model", "llama2-7b", "--global-batch", "64", "--cluster", "a100-sxm-80gb:8", "--out", "b.toml/"],
         "--out"),
        (["export", results, "--csv", "d/"], "--csv"),
        (["export", results, "--parquet", "t/"], "--parquet"),
    ):  # fmt: skip
        check_refused(tmp, args, [flag, "ends in a separator"])


STUDY = """\
name = "{name}"
objectives = ["step_time_s"]
[model]
key = "{model}"
[hardware]
gpu = "a100-sxm-80gb"
n_gpus = 8
[plan]
{plan}
global_batch = 64
seq_len = 2048
"""


def test_a_streamed_sweep_names_the_fields_it_varied_over_every_configuration(tmp):
    study = tmp / "s.toml"
    study.write_text(STUDY.format(name="s", model="llama2-7b", plan='tp = 2\nstack = ["megatron", "torchtitan"]'))
    result = CliRunner().invoke(app, ["sweep", str(study), "--out", str(tmp), "--stream", "--top-k", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["n_kept"] == 1 and summary["varied"] == ["stack"]


def test_the_report_of_a_streamed_sweep_with_nothing_feasible_says_why(tmp):
    study = tmp / "i9.toml"
    study.write_text(STUDY.format(name="i9", model="llama2-70b", plan="tp = [1, 2]"))
    sweep = CliRunner().invoke(app, ["sweep", str(study), "--out", str(tmp), "--stream", "--top-k", "2", "--json"])
    assert sweep.exit_code == 0, sweep.output
    reasons = json.loads(sweep.stdout)["infeasible_reasons"]
    with xr.open_dataset(tmp / "i9.nc") as ds:
        assert ds.sizes["config"] == 0
    result = CliRunner().invoke(app, ["report", str(tmp / "i9.nc"), "--no-validation", "--out", str(tmp / "rep")])
    assert result.exit_code == 0, result.output
    page = (tmp / "rep" / "index.html").read_text()
    said = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in reasons.items())
    assert f"No configuration of this study is feasible</b>: {said} (a configuration" in page


def test_the_best_table_names_a_varied_field_at_its_default(tmp):
    study = tmp / "sg.toml"
    study.write_text(STUDY.format(name="sg", model="llama2-7b", plan="zero = 3\nshard_group = [0, 2, 4]"))
    result = CliRunner().invoke(app, ["sweep", str(study), "--out", str(tmp)])
    assert result.exit_code == 0, result.output
    assert " sg" in result.stdout  # the winner's shard_group, whichever of 0, 2 and 4 it is
