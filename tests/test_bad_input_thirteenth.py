"""Defects found by the thirteenth bad-input fuzz (a helper session, /tmp/fz13), each a one-line
``error: ...`` naming the flag, file or key, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app

PLAN = """\
global_batch = 64
micro_batch = 1
[[stage]]
layers = 16
replicas = [{ gpu = "a100-sxm-80gb", tp = 4 }, { gpu = "h100-sxm-80gb", tp = 2, count = 1e9 }]
[[stage]]
layers = 16
gpu = "h100-sxm-80gb"
tp = 4
"""


def _one_line(args: list[str], needle: str) -> str:
    result = CliRunner().invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("chunks", "needle"),
    [
        ("64,64", "--chunks: 64 is given twice"),  # was timed twice
        ("\u0666\u0664", "is not an integer"),  # Arabic-Indic digits: int() read them as 64
        ("-5", "--chunks must be a positive integer; got -5"),
    ],
)
def test_bench_chunks_are_distinct_ascii_integers(chunks, needle):
    _one_line(["bench", "--configs", "1000", "--chunks", chunks], needle)


def test_an_output_is_never_a_file_the_command_reads(tmp_path):
    """``plan --catalog cat.toml --out cat.toml`` overwrote the catalog it read with the plan."""
    catalog = tmp_path / "cat.toml"
    catalog.write_text("[gpus.a100-sxm-80gb]\nprice_usd_per_hour = 2.0\n")
    before = catalog.read_text()
    args = ["plan", "--model", "llama2-7b", "--cluster", "a100-sxm-80gb:8", "--global-batch", "64"]
    _one_line([*args, "--catalog", str(catalog), "--out", str(catalog)], "is a file this command reads")
    assert catalog.read_text() == before


def test_cross_validation_writes_nothing_so_takes_no_out(tmp_path):
    out = tmp_path / "c.toml"
    _one_line(["calibrate", "--cross-validate", "--out", str(out)], "--cross-validate reports the held-out error")
    assert not out.exists()


def test_a_plan_file_cannot_put_more_gpus_to_work_than_a_plan_field_allows(tmp_path):
    """``count = 1e9`` replicas were evaluated as two billion GPUs; the plan's total now has the
    ``n_gpus`` field's bound."""
    plan = tmp_path / "p.toml"
    plan.write_text(PLAN)
    line = _one_line(["evaluate", "--model", "llama2-7b", "--plan", str(plan)], "GPUs to work; at most 1,048,576")
    assert line.startswith(f"error: {plan}: the plan puts 2,000,000,008 GPUs")
    assert Path(plan).read_text() == PLAN
