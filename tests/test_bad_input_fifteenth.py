"""Defects found by the fifteenth bad-input fuzz (a helper session, /tmp/fz15: report and export on
edited datasets, validate's runs and memory files, catalog files, recipes), each a one-line
``error: ...`` naming the file, key or column, exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import test_bad_input as base
from tests.test_bad_input import check_refused
from tests.test_bad_input_seventh import _results

tmp = base.tmp  # the fixture: a prepared folder, the current one


def _set_attr(key, value):
    return lambda ds: ds.attrs.__setitem__(key, value)


def _set_values(name, values, dtype=float):
    return lambda ds: ds.__setitem__(name, ("config", np.array(values, dtype=dtype)))


def _layout(ds):
    for name, values in (("n_gpus", [8, 8]), ("tp", [2, 4]), ("pp", [1, 1]), ("cp", [1, 1]), ("dp", [4, 2])):
        ds[name] = ("config", np.array(values, dtype=np.int32))


def _then(*edits):
    def edit(ds):
        for e in edits:
            e(ds)

    return edit


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        # a streamed file's reasons as a list: a traceback after the figures were drawn
        (_then(_set_attr("streamed", 1), _set_attr("n_configs", 2), _set_attr("n_feasible", 2),
               _set_attr("infeasible_reasons", "[1, 2]")), "infeasible_reasons attribute is not an object of counts"),
        (_set_attr("fixed_plan", "nope"), "fixed_plan attribute is not an object in JSON"),
        (_set_attr("fixed_plan", json.dumps({"train_tokens": -5})), "train_tokens must be a number > 0; got -5"),
        (_then(_set_values("infeasible", [0, 0], np.int32),
               lambda ds: ds["infeasible"].attrs.update(flag_masks="abc", flag_meanings="a")),
         "flag_masks are not one integer per flag_meanings name"),
        (_then(_set_attr("streamed", 1), _set_attr("n_configs", 2), _set_attr("n_feasible", 9)),
         "n_feasible attribute counts more configurations than n_configs"),
        # objectives naming what is not a metric, or one twice
        (_then(_layout, _set_attr("objectives", "tp cost_usd")), "must name distinct metrics"),
        (_set_attr("objectives", "feasible cost_usd"), "got 'feasible'"),
        (_set_attr("objectives", "cost_usd cost_usd"), "got a metric twice"),
        # metrics and layouts that cannot be real on a feasible configuration
        (_set_values("step_time_s", [np.nan, 1.0]), "step_time_s is not a finite number for a feasible configuration"),
        (_set_values("mfu", [5.0, 0.4]), "mfu is a share, at most 1"),
        (_set_values("hbm_used_GiB", [-5.0, 1.0]), "hbm_used_GiB holds negative values"),
        (_set_values("infeasible", [64, 0], np.int32), "a feasible configuration has infeasible flags set"),
        (_then(_layout, _set_values("tp", [0, 4], np.int32)), "tp must be a whole number >= 1"),
        (_then(_layout, _set_values("dp", [3, 2], np.int32)), "n_gpus is not tp * pp * cp * dp"),
        (_then(_set_values("price_usd_per_hour", [-3.0, 1.0]), _set_attr("outer_variables", "")),
         "price_usd_per_hour, a hardware value of the search, must be finite and > 0"),
        (_set_attr("outer_variables", "bogus"), "outer_variables attribute names 'bogus'"),
    ],
)  # fmt: skip
def test_report_refuses_a_dataset_it_cannot_draw_before_drawing(tmp, edit, needle):
    """A malformed attribute failed after the figures were drawn (an AttributeError traceback, or a
    JSON error naming nothing) and left them in the folder; metrics, layouts and objectives that
    cannot be real were drawn."""
    _results(edit).to_netcdf(tmp / "r.nc")
    check_refused(tmp, ["report", "{tmp}/r.nc", "--no-validation", "--out", "{tmp}/rep"], ["r.nc", needle])
    assert not (tmp / "rep").exists()


def test_report_still_draws_a_sound_dataset(tmp):
    """The checks above pass a dataset whose every value can be real (the same two configurations)."""
    from typer.testing import CliRunner

    from dse.cli import app

    _results(_layout).to_netcdf(tmp / "r.nc")
    result = CliRunner().invoke(app, ["report", str(tmp / "r.nc"), "--no-validation", "--out", str(tmp / "rep")])
    assert result.exit_code == 0, result.output
    assert (tmp / "rep" / "index.html").is_file()
