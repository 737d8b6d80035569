"""Results that standard tools read: UDUNITS units, named categories, export, Optuna's own views (issue 15)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from dse import sweep
from dse.metrics import CF_UNITS, METRICS, cf_attrs, display_units
from dse.optimize import run_optimize
from dse.optimize.storage import stored_constraints
from tests.test_sweep import CHUNK, write_study

ROOT = Path(__file__).resolve().parents[1]
OPT_STUDY = ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml"
OPT_TRIALS = 40
OPT_BATCH = 32


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("eco_sweep")
    return sweep.run_sweep(write_study(tmp), tmp / "out", chunk=CHUNK, progress=False)


@pytest.fixture(scope="module")
def optimize_run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("eco_opt")
    return run_optimize(OPT_STUDY, OPT_TRIALS, seed=3, out=tmp, batch=OPT_BATCH, progress=False)


def _all_units(ds: xr.Dataset) -> dict[str, str]:
    return {name: str(var.attrs["units"]) for name, var in ds.variables.items() if "units" in var.attrs}


@pytest.mark.parametrize("which", ["sweep", "optimize"])
def test_every_units_attribute_parses_with_udunits(which, sweep_file, optimize_run):
    """Every ``units`` of a sweep and an optimize file parses with UDUNITS-2 (``cf_units`` wraps the C
    library itself); the quantities keep their dimensions; the file says where it came from."""
    cf_units = pytest.importorskip("cf_units")
    path = sweep_file if which == "sweep" else Path(optimize_run["path"])
    with xr.open_dataset(path, decode_cf=False) as ds:
        units = _all_units(ds)
        assert len(units) >= 40
        bad = {}
        for name, u in units.items():
            try:
                cf_units.Unit(u)
            except ValueError as error:
                bad[name] = (u, str(error))
        assert not bad, bad
        byte = cf_units.Unit("byte")
        assert cf_units.Unit(units["hbm_used_GiB"]).convert(1.0, byte) == 2.0**30
        assert cf_units.Unit(units["energy_kWh"]).convert(1.0, cf_units.Unit("J")) == pytest.approx(3.6e6)
        assert cf_units.Unit(units["tokens_per_s"]) == cf_units.Unit("Hz")
        assert ds["cost_usd"].attrs["currency"] == "USD" and units["cost_usd"] == "1"
        assert "tokens per second" in ds["tokens_per_s"].attrs["long_name"]
        assert ds.attrs["Conventions"] == "CF-1.8"
        when, _, command = ds.attrs["history"].partition(": ")
        assert when.endswith("Z") and len(when) == 20 and command


def test_units_round_trip_to_their_short_names():
    for short in [*CF_UNITS, *(m.units for m in METRICS.values())]:
        assert display_units(cf_attrs(short, "some quantity")) == short, short
    assert display_units({"units": "GiB"}) == "GiB"  # a file written before stays readable


# --------------------------------------------------------------------------------------------
# Categories by name, the labelled grid, export
# --------------------------------------------------------------------------------------------


def test_open_results_selects_by_name(sweep_file):
    import dse

    with xr.open_dataset(sweep_file) as raw:
        raw = raw.load()
    ds = dse.open_results(sweep_file)
    h100 = ds.sel(gpu="h100-sxm-80gb", recompute="full")
    codes = raw.gpu.attrs["flag_meanings"].split()
    expected = (raw.gpu == codes.index("h100-sxm-80gb")) & (
        raw.recompute == raw.recompute.attrs["flag_meanings"].split().index("full")
    )
    assert h100.sizes["config"] == int(expected.sum()) > 0
    np.testing.assert_array_equal(h100.time_to_train_s.values, raw.time_to_train_s.values[expected.values])
    assert set(np.unique(ds.gpu.values)) == {"h100-sxm-80gb", "a100-sxm-80gb"}
    assert ds.feasible.dtype == bool
    # derived columns are coordinates, not index levels: dp always, sp when the study left it auto
    levels = ds.indexes["config"].names
    assert "dp" not in levels and "sp" not in levels and {"dp", "sp"} <= set(ds.coords)
    assert dse.results.axes(ds) == ["gpu", "n_gpus", "tp", "pp", "micro_batch", "vp", "zero", "recompute"]


def test_open_results_grid_is_the_study_axes(sweep_file):
    import dse

    ds = dse.open_results(sweep_file)
    grid = dse.open_results(sweep_file, grid=True)
    axes = ("gpu", "n_gpus", "tp", "pp", "micro_batch", "vp", "zero", "recompute")
    assert grid.time_to_train_s.dims == axes
    assert grid.time_to_train_s.shape == (2, 2, 3, 2, 2, 2, 2, 2)  # sp (derived) is not an axis
    assert int(grid.time_to_train_s.notnull().sum()) == ds.sizes["config"]  # one cell per configuration
    cell = grid.sel(gpu="a100-sxm-80gb", n_gpus=8, tp=2, pp=1, micro_batch=1, vp=1, zero=0, recompute="none")
    row = ds.sel(gpu="a100-sxm-80gb", n_gpus=8, tp=2, pp=1, micro_batch=1, vp=1, zero=0, recompute="none")
    assert float(cell.time_to_train_s) == float(row.time_to_train_s.item())


def test_open_results_of_an_optimize_file(optimize_run):
    import dse

    ds = dse.open_results(optimize_run["path"])
    assert "trial" in ds.dims and ds.trial_number.values.tolist() == list(range(OPT_TRIALS))
    kinds = set(np.unique(ds.gpu.values))
    assert kinds and all(isinstance(k, str) for k in kinds)
    some = sorted(kinds)[0]
    assert ds.sel(gpu=some).sizes["trial"] == int((ds.gpu == some).sum())
    with pytest.raises(ValueError, match="grid=True needs a sweep file"):
        dse.open_results(optimize_run["path"], grid=True)


def test_open_results_refuses_what_it_cannot_read(tmp_path):
    import dse

    with pytest.raises(ValueError, match="no such results file"):
        dse.open_results(tmp_path / "missing.nc")
    (tmp_path / "x.nc").write_text("not netCDF")
    with pytest.raises(ValueError, match="not a netCDF results dataset"):
        dse.open_results(tmp_path / "x.nc")


def test_export_csv_and_parquet(sweep_file, optimize_run, tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from dse.cli import app

    runner = CliRunner()
    csv, parquet = tmp_path / "t.csv", tmp_path / "t.parquet"
    res = runner.invoke(app, ["export", str(sweep_file), "--csv", str(csv)])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(csv)
    with xr.open_dataset(sweep_file) as raw:
        n = raw.sizes["config"]
        assert len(table) == n and set(table.gpu) == {"h100-sxm-80gb", "a100-sxm-80gb"}
        np.testing.assert_allclose(table.cost_usd.values, raw.cost_usd.values, rtol=1e-6)
    assert set(table.recompute) == {"none", "full"} and {"dp", "sp", "feasible"} <= set(table.columns)
    res = runner.invoke(app, ["export", optimize_run["path"], "--csv", str(tmp_path / "o.csv"), "--json"])
    assert res.exit_code == 0, res.output
    assert pd.read_csv(tmp_path / "o.csv").trial_number.tolist() == list(range(OPT_TRIALS))
    res = runner.invoke(app, ["export", str(sweep_file)])
    assert res.exit_code == 2 and "--csv" in res.output
    # Both targets are checked before either is written: nothing half-written.
    fresh, nowhere = tmp_path / "fresh.csv", tmp_path / "a-folder"  # a folder: no file can be written there
    nowhere.mkdir()
    res = runner.invoke(app, ["export", str(sweep_file), "--csv", str(fresh), "--parquet", str(nowhere)])
    assert res.exit_code == 2 and "--parquet" in res.output and not fresh.exists()
    res = runner.invoke(app, ["export", str(sweep_file), "--csv", str(fresh), "--parquet", str(fresh)])
    assert res.exit_code == 2 and "both name" in res.output and not fresh.exists()
    # Parquet where pyarrow imports (recent pyarrow needs NumPy 2; the export says so, in one line).
    try:
        import pyarrow  # noqa: F401
    except ImportError as error:  # not only missing: recent pyarrow refuses NumPy 1.x
        pytest.skip(f"pyarrow cannot be imported: {error}")
    res = runner.invoke(app, ["export", str(sweep_file), "--csv", str(csv), "--parquet", str(parquet)])
    assert res.exit_code == 0, res.output
    frame = pd.read_parquet(parquet)
    assert frame.shape == table.shape and set(frame.gpu) == set(table.gpu) and frame.feasible.dtype == bool
    assert frame.attrs["units"]["cost_usd"] == "USD" and frame.attrs["units"]["hbm_used_GiB"] == "GiB"


# --------------------------------------------------------------------------------------------
# Optuna's own tools
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def journal_study(tmp_path_factory):
    """A project optimize study written to a journal file and read back with ``optuna.load_study``,
    as optuna-dashboard and a notebook would; with the run's summary."""
    import optuna

    tmp = tmp_path_factory.mktemp("eco_journal")
    journal = tmp / "study.log"
    s = run_optimize(OPT_STUDY, OPT_TRIALS, seed=3, out=tmp, storage=str(journal), batch=OPT_BATCH, progress=False)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    return optuna.load_study(study_name=s["study"], storage=storage), s


def test_optuna_sees_metric_names_constraints_and_a_feasible_front(journal_study):
    """A study loaded with ``optuna.load_study`` names its objectives, carries every constraint
    under the key ``constraints_func`` writes (what optuna-dashboard shows), keeps trials with no
    runnable layout off ``study.best_trials``, and has flat, sortable user attributes."""
    import optuna

    study, s = journal_study
    assert study.metric_names == ["time_to_train_s", "cost_usd"]
    names = study.user_attrs["hetersim_constraints"]
    assert names[0] == "layout"
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(len(t.system_attrs["constraints"]) == len(names) for t in trials)
    infeasible = {t.number for t in trials if max(t.system_attrs["constraints"]) > 0}
    no_layout = {t.number for t in trials if t.system_attrs["constraints"][0] > 0}
    assert no_layout and no_layout <= infeasible
    # Without the constraints, some infeasible trial would be on the front: the check means something.
    unconstrained = optuna.study._multi_objective._get_pareto_front_trials_by_trials(trials, study.directions)
    assert {t.number for t in unconstrained} & infeasible
    best = {t.number for t in study.best_trials}
    assert best and not best & infeasible
    with xr.open_dataset(s["path"]) as ds:
        assert best == set(ds.trial.values[ds.pareto.values.astype(bool)].tolist())
    frame = study.trials_dataframe()
    assert {"values_time_to_train_s", "values_cost_usd", "user_attrs_layout", "user_attrs_step_time_s"} <= set(
        frame.columns
    )
    assert frame["user_attrs_tp"].dropna().map(type).eq(int).all()


def _trace_trials(fig, label: str) -> set[int]:
    """Trial numbers of the scatter whose hover box is labelled ``label`` (Optuna's plot names its
    traces only in ``hovertemplate``; each point's ``text`` is the trial as JSON)."""
    import json

    traces = [t for t in fig.data if f"<extra>{label}</extra>" in (t.hovertemplate or "")]
    assert len(traces) == 1, [t.hovertemplate for t in fig.data]
    return {json.loads(text.replace("<br>", "\n"))["number"] for text in traces[0].text or ()}


def test_optuna_visualization_shows_names_constraints_and_a_feasible_front(journal_study):
    """``optuna.visualization.plot_pareto_front`` on the loaded study titles its axes with the
    metric names, reads the stored constraints itself (no ``constraints_func`` passed) and so draws
    every trial that violates one as "Infeasible Trial", none of them as "Best Trial"."""
    pytest.importorskip("plotly", reason="optuna.visualization needs plotly (pip install 'hetersim[test]')")
    import optuna

    study, _ = journal_study
    fig = optuna.visualization.plot_pareto_front(study)
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("time_to_train_s", "cost_usd")
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    infeasible = {t.number for t in trials if max(stored_constraints(t)) > 0}
    assert infeasible
    assert _trace_trials(fig, "Infeasible Trial") == infeasible
    best = _trace_trials(fig, "Best Trial")
    assert best == {t.number for t in study.best_trials}
    assert best and not best & infeasible
