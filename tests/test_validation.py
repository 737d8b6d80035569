"""Accuracy against published training runs, reported as numbers and bounded.

The bounds are the accuracy this model reaches today (see README, "Validation"); a change that
makes any of them worse fails here. They are looser than the targets of the core-model issue,
which the model does not meet yet.
"""

from __future__ import annotations

import shutil

import pytest

from hetersim import validation


@pytest.fixture(scope="module")
def report(catalog, cal):
    rows = validation.read_runs(validation.default_runs_path())
    return validation.validate(rows, catalog, cal)


def test_every_published_run_is_predicted(report):
    assert report["n_runs"] == 78
    ids = [r["id"] for r in report["rows"]]
    assert len(set(ids)) == 78
    for r in report["rows"]:
        assert r["measured_step_time_s"] > 0 and r["predicted_step_time_s"] > 0


def test_step_time_error_is_bounded(report):
    print(
        f"\nMAPE all {report['mape_step_time_pct']:.1f}%  complete rows {report['mape_step_time_pct_complete']:.1f}%"
        f"  max {report['max_abs_error_pct']:.1f}%  infeasible {report['n_infeasible']}"
    )
    assert report["mape_step_time_pct"] <= 14.5
    assert report["mape_step_time_pct_complete"] <= 3.0
    assert report["n_infeasible"] <= 2
    # Every source other than torchtitan (a 2024 eager/FSDP2 stack, see README) stays below 35%
    # on every row but Narayanan's 2240-GPU ZeRO-3 run.
    others = [r for r in report["rows"] if "torchtitan" not in r["source"] and not r["id"].startswith("r015")]
    assert max(abs(r["error_pct"]) for r in others) <= 35.0


@pytest.mark.parametrize(
    "label, bound",
    [
        ("Korthikanti 2022", 6.5),
        ("Narayanan SC'21", 8.0),
        ("NVIDIA/Megatron-LM", 13.0),
        ("NVIDIA/NeMo", 7.0),
    ],
)
def test_per_source_error_is_bounded(report, label, bound):
    src = report["per_source"][label]
    print(f"\n{label}: n={src['n']} MAPE {src['mape_pct']:.1f}% max {src['max_abs_error_pct']:.1f}%")
    assert src["mape_pct"] <= bound


def test_offload_reference_run_within_35_percent(report):
    row = next(r for r in report["rows"] if r["id"].startswith("r141"))
    assert row["feasible"]
    assert abs(row["error_pct"]) <= 35.0


def test_infeasible_row_counts_as_100_percent(catalog, cal, tmp_path):
    src = validation.default_runs_path().read_text().splitlines()
    header, first = src[0], src[1]
    # The 1.7B GPT run with global batch 512 on 32 GPUs, but claiming one GPU: 1.7B states
    # and 16 sequences of activations do not fit in 80 GB, and tp*pp*dp*cp != n_gpus.
    cols = header.split(",")
    vals = first.split(",")
    vals[cols.index("n_gpus")] = "1"
    path = tmp_path / "runs.csv"
    path.write_text(header + "\n" + ",".join(vals) + "\n")
    rep = validation.validate(validation.read_runs(path), catalog, cal)
    assert rep["rows"][0]["feasible"] is False
    assert rep["rows"][0]["error_pct"] == 100.0


def test_malformed_runs_files_are_rejected(tmp_path, catalog, cal):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,model\nx,y\n")
    with pytest.raises(ValueError, match="missing columns"):
        validation.read_runs(bad)
    good = validation.default_runs_path()
    text = good.read_text().replace(",8,32,1,1,1,32,", ",8,32,one,1,1,32,", 1)
    broken = tmp_path / "broken.csv"
    broken.write_text(text)
    with pytest.raises(ValueError, match="column tp must be a number"):
        validation.validate(validation.read_runs(broken), catalog, cal)


def test_shared_schema_without_attention_column_is_read(tmp_path, catalog, cal):
    # Files in the exact schema of shared/validation (no optional attention column) are accepted.
    src = validation.default_runs_path()
    lines = src.read_text().splitlines()
    cols = lines[0].split(",")
    i = cols.index("attention")
    import csv
    import io

    out = io.StringIO()
    w = csv.writer(out)
    for rec in csv.reader(lines[:5]):
        w.writerow(rec[:i] + rec[i + 1 :])
    path = tmp_path / "plain.csv"
    path.write_text(out.getvalue())
    rep = validation.validate(validation.read_runs(path), catalog, cal)
    assert rep["n_runs"] == 4
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_memory_against_published_figures(catalog, cal):
    rep = validation.validate_memory(None, catalog, cal)
    print(f"\nmemory: n={rep['n']} MAPE {rep['mape_pct']:.1f}%")
    korth = [r for r in rep["rows"] if r["component"] == "activations"]
    assert len(korth) == 8
    # Korthikanti et al.'s activation memory (Fig. 1, first pipeline stage, interleaved schedule)
    for r in korth:
        assert r["predicted_GiB"] == pytest.approx(r["measured_GiB"], rel=0.01)
    states = [r for r in rep["rows"] if r["component"].startswith("params+grads+optimizer")]
    assert states and all(abs(r["error_pct"]) <= 10.0 for r in states)
    assert rep["mape_pct"] <= 17.5


@pytest.mark.slow
def test_leave_one_source_out_error_is_bounded(catalog):
    """Fit without each source in turn and predict it: how the model does on unseen runs."""
    from hetersim.calibration import cross_validate

    cv = cross_validate(catalog=catalog, steps=200)
    print(f"\nleave-one-source-out MAPE {cv['mape_step_time_pct']:.1f}%")
    assert cv["mape_step_time_pct"] <= 17.5
    assert cv["per_source"]["Korthikanti 2022"]["mape_pct"] <= 8.0
