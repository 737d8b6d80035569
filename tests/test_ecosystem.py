"""Results that standard tools read: UDUNITS units, named categories, export, Optuna's own views (issue 15)."""

from __future__ import annotations

from pathlib import Path

import pytest
import xarray as xr

from dse import sweep
from dse.metrics import CF_UNITS, METRICS, cf_attrs, display_units
from dse.optimize import run_optimize
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
