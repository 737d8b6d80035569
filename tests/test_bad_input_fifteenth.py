"""Defects found by the fifteenth bad-input fuzz (a helper session, /tmp/fz15: report and export on
edited datasets, validate's runs and memory files, catalog files, recipes), each a one-line
``error: ...`` naming the file, key or column, exit 2, nothing written."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from tests import test_bad_input as base
from tests.test_bad_input import check_refused
from tests.test_bad_input_seventh import MODEL as MODEL7
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


def _nemo(groups: int = 8, optim: str = "distributed_fused_adam") -> str:
    """test_recipe's NeMo recipe with its query groups and optimizer replaced."""
    from tests.test_recipe import NEMO_YAML

    text = NEMO_YAML.replace("num_query_groups: 8", f"num_query_groups: {groups}")
    return text.replace("name: distributed_fused_adam", f"name: {optim}")


MEGATRON = (
    "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 32 "
    "--hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 --swiglu --vocab-size 32000 "
    "--seq-length 4096 --micro-batch-size 1 --global-batch-size 256 --bf16 --expert-model-parallel-size 2\n"
)


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        # the recipe's num_query_groups was blamed on --kv-heads, a flag never given
        ("r.yaml", _nemo(groups=5),
         "kv_heads (from --recipe {tmp}/r.yaml) must divide heads (32), got 5"),
        # a dense model's expert parallelism named --etp, left at its default
        ("a.sh", MEGATRON, "ep (from --recipe {tmp}/a.sh) 2: the model has no experts (use 1)"),
        # an optimizer other than Adam was priced as Adam's states
        ("r.yaml", _nemo(optim="sgd"), "model.optim.name: must be an Adam optimizer"),
    ],
)  # fmt: skip
def test_a_recipes_values_are_named_as_the_recipes(tmp, name, text, needle):
    (tmp / name).write_text(text, encoding="utf-8")
    line = check_refused(tmp, ["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", f"{{tmp}}/{name}", "--vocab", "32000"],
                         [needle])  # fmt: skip
    assert "--kv-heads" not in line and "--etp" not in line


def _run_row(**cells):
    from hetersim.fit.runs import default_runs_path

    lines = default_runs_path().read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    row = next(x for x in lines if x.startswith("r047-"))
    values = next(csv.reader([row]))
    for key, value in cells.items():
        values[header.index(key)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([header, values])
    return out.getvalue()


@pytest.mark.parametrize(
    ("cells", "needle"),
    [
        ({"tp": "\uff11"}, "column tp must be a number; got '\uff11'"),  # a fullwidth 1 read as tp 1
        ({"n_gpus": "1_6"}, "column n_gpus must be a number"),
        ({"scaleup_domain": "0"}, "column scaleup_domain must be whole nodes of 8 GPUs or divide one"),
        ({"scaleup_domain": "3"}, "column scaleup_domain must be whole nodes of 8 GPUs or divide one"),
    ],
)
def test_a_runs_row_holds_ascii_numbers_and_a_real_scaleup_domain(tmp, cells, needle):
    (tmp / "runs.csv").write_text(_run_row(**cells), encoding="utf-8")
    check_refused(tmp, ["validate", "--runs", "{tmp}/runs.csv"], ["runs.csv", "r047-", needle])


MEMORY = (
    "source,model,gpu,n_gpus,tp,pp,dp,cp,micro_batch,seq_len,recompute,sp,component,value,unit,notes\n"
    "K,22B,A100-80GB,{n},{tp},1,1,1,4,2048,none,False,{component},59.25,GiB/GPU,x\n"
)


@pytest.mark.parametrize(
    ("cells", "needle"),
    [
        ({"n": 8, "tp": "x", "component": "activations"}, "line 2: column tp must be a positive integer"),
        ({"n": 7, "tp": 8, "component": "activations"}, "line 2: no run of '22B' with n_gpus 7, tp 8"),
        ({"n": 8, "tp": 8, "component": "bogus"}, "line 2: column component must start with one of"),
    ],
)
def test_a_measured_memory_row_is_scored_or_refused_never_dropped(tmp, cells, needle):
    """validate --memory reported 'n 0, mape_pct nan' for a row it silently dropped."""
    (tmp / "mem.csv").write_text(MEMORY.format(**cells), encoding="utf-8")
    check_refused(tmp, ["validate", "--memory", "{tmp}/mem.csv"], ["mem.csv", needle])


MODEL = MODEL7.replace("[models.m]", "[models.m1]") + "{extra}\n"  # the seventh fuzz's small model entry


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("top_k = 2", "models.m1: top_k = 2 needs n_experts"),
        ("n_experts = 8\ntop_k = 9\nmoe_ffn_hidden = 1024", "models.m1: top_k must be between 1 and n_experts = 8"),
        ("n_experts = 8\ntop_k = 2\nmoe_ffn_hidden = 1024\nroute_groups = 3\nroute_group_topk = 1",
         "models.m1: route_groups must divide n_experts = 8"),
    ],
)  # fmt: skip
def test_a_catalog_models_expert_fields_are_checked_where_the_file_is_read(tmp, extra, needle):
    """The entry was listed by `catalog models` and refused only when used, naming neither file nor key."""
    (tmp / "c.toml").write_text(MODEL.format(extra=extra), encoding="utf-8")
    check_refused(tmp, ["catalog", "models", "--catalog", "{tmp}/c.toml"], ["c.toml", needle])


def test_export_refuses_a_dataset_with_no_configuration(tmp):
    """It wrote a table of 0 rows x 74 columns, rc 0, where report refuses the same file."""
    _results(lambda ds: None).isel(config=slice(0, 0)).to_netcdf(tmp / "r.nc")
    check_refused(tmp, ["export", "{tmp}/r.nc", "--csv", "{tmp}/t.csv"], ["r.nc: holds no configurations to export"])


def test_a_relative_memory_figure_is_skipped_not_matched(tmp_path):
    """A '% of baseline' row whose value reads as a number ended in a StopIteration traceback when
    it matched no run (since rows in GiB had to match one); it is listed as skipped, as the text
    figures are, and never scored as GiB."""
    from hetersim import api
    from hetersim.catalog import load_catalog
    from hetersim.fit.validation import validate_memory

    path = tmp_path / "mem.csv"
    path.write_text(MEMORY.format(n=7, tp=8, component="activations").replace("GiB/GPU", "% of baseline"))
    report = validate_memory(path, load_catalog(), api.default_calibration())
    assert report["n"] == 0 and report["skipped"] == ["line 2: unit '% of baseline' is a relative figure"]
