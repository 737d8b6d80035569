"""The house rules: one registry of plan fields seen everywhere, a front door, one-way imports,
and small modules and functions."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import hetersim
from dse.cli import FIELD_FLAGS, app
from hetersim import planfields
from hetersim.specs import Plan, plan_spec
from hetersim.specs.plan import plan_options

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def test_front_door_exports_and_version():
    assert hetersim.__version__ == importlib.metadata.version("hetersim")
    for name in hetersim.__all__:
        assert getattr(hetersim, name) is not None, name
    assert callable(hetersim.evaluate) and hetersim.PLAN_FIELDS is planfields.FIELDS
    with pytest.raises(AttributeError):
        hetersim.no_such_thing  # noqa: B018


def test_study_parsing_and_catalog_load_no_jax():
    code = "import sys, dse.study, hetersim, hetersim.catalog, hetersim.planfields; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_model_package_never_imports_dse():
    for path in (ROOT / "hetersim").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "dse" or n.startswith("dse.") for n in names), path


def _sources():
    for folder in ("hetersim", "dse"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_modules_and_functions_are_small():
    too_long = []
    for path in _sources():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not too_long, "\n".join(too_long)


# --------------------------------------------------------------------------------------------
# The registry of plan fields
# --------------------------------------------------------------------------------------------


def test_registry_generates_the_plan_pytree():
    assert tuple(Plan.__dataclass_fields__) == tuple(f.leaf for f in planfields.FIELDS)
    assert planfields.COLUMNS == (*planfields.LAYOUT, "dp", *(a for a in planfields.AXES if a not in planfields.LAYOUT))


def test_plan_options_round_trip():
    opts = dict(n_gpus=64, tp=4, pp=2, global_batch=128, seq_len=2048, recompute="full", precision="fp8")
    opts.update(order="tp-pp-cp-dp", offload={"optimizer": "cxl-pool"}, bucket_Mparams=25.0)
    back = plan_options(plan_spec(**opts))
    assert {k: back[k] for k in opts} == opts
    assert back["dp"] == 8 and back["sp"] is True and back["cpu_optimizer"] is True


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(tp=3), "n_gpus"),
        (dict(zero=4), "zero"),
        (dict(recompute="some"), "recompute"),
        (dict(micro_batch=0), "micro_batch"),
        (dict(reuse_Mparams=-1.0), "reuse_Mparams"),
        (dict(train_tokens=float("inf")), "train_tokens"),
        (dict(offload={"optimizer": "tape"}), "offload tier"),
        (dict(vpp=2), "unknown plan field 'vpp'"),
    ],
)
def test_plan_errors_name_the_field(bad, field):
    opts = dict(n_gpus=8, global_batch=8, seq_len=1024, **bad)
    with pytest.raises(ValueError) as error:
        plan_spec(**opts)
    assert str(error.value).startswith(field) and "\n" not in str(error.value)


def test_every_field_has_a_cli_flag():
    from typer.main import get_command

    evaluate = get_command(app).commands["evaluate"]
    flags = {opt for p in evaluate.params for opt in p.opts}
    for f in planfields.FIELDS:
        assert FIELD_FLAGS[f.name] == f.cli_flag
        assert f.cli_flag in flags, f.name


def test_registry_derived_rules():
    assert planfields.derived_dp(512, 8, 4, 2) == 8
    tp = np.array([1, 2, 8])
    assert planfields.resolve_sp(np.array([-1, -1, 0]), tp).tolist() == [False, True, False]
    assert planfields.resolve_sp("auto", 4) is True and planfields.resolve_sp(None, 1) is False
    for name in planfields.AXES:
        f = planfields.BY_NAME[name]
        for value in f.names or ():
            assert planfields.decode(name, planfields.encode(name, value)) == value
    values = dict(tp=8, pp=4, vp=1, dp=16, cp=1, zero=1, recompute="full", sp=False, precision="fp8")
    assert planfields.layout_label(values) == "tp8 pp4 cp1 dp16 vp1 z1 rc:full no-sp fp8"
    assert planfields.layout_label(values, ("tp", "pp", "vp", "cp"), sep="-", omit_defaults=("vp",)) == "tp8-pp4-cp1"


# --------------------------------------------------------------------------------------------
# The API and the CLI agree
# --------------------------------------------------------------------------------------------


def test_api_uses_the_cli_defaults():
    args = dict(n_gpus=64, tp=8, pp=2, global_batch=128, seq_len=4096)
    out = hetersim.evaluate("llama2-13b", "h100-sxm-80gb", **args)
    cli = CliRunner().invoke(
        app,
        "evaluate --model llama2-13b --gpu h100-sxm-80gb --gpus 64 --tp 8 --pp 2 --global-batch 128 "
        "--seq-len 4096 --json".split(),
    )
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["step_time_s"] == pytest.approx(float(out.step_time_s), rel=1e-6)
    built = hetersim.configure(model="llama2-13b", gpu="h100-sxm-80gb", **args)
    assert built.plan["sp"] is True and built.plan["dp"] == 4


def _readme_block(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_api_example_runs():
    code = _readme_block("Python API")
    assert len([line for line in code.splitlines() if line.strip()]) <= 5
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    assert float(scope["out"].step_time_s) > 0 and 0 < float(scope["out"].mfu) < 1


# --------------------------------------------------------------------------------------------
# Every consumer sees every field of the registry
# --------------------------------------------------------------------------------------------

EVERY_AXIS_STUDY = """
name = "every_axis"
[model]
key = "llama2-7b"
[hardware]
gpu = "h100-sxm-80gb"
n_gpus = 16
[plan]
tp = [1, 2]
pp = [1, 2]
cp = 1
micro_batch = 1
global_batch = 32
vp = 1
zero = [0, 1]
recompute = ["none", "full"]
sp = [false, true]
precision = "bf16"
seq_len = 2048
attention = "flash"
loss = ["materialized", "chunked"]
order = "tp-cp-dp-pp"
train_tokens = 1.0e11
offload = {}
bucket_Mparams = 0.0
reuse_Mparams = 0.0
cpu_optimizer = false
ep = 1
etp = 1
ep_overlap = false
moe_imbalance = 1.0
mla_up_proj = false
fused_experts = false
fp8_attention = false
pp_layout = false
fragmentation = 0.0
shard_group = 0
grad_reduce = "auto"
zero3_prefetch = true
"""


def test_every_field_reaches_the_study_the_sweep_and_the_optimizer(tmp_path):
    import xarray as xr

    from dse import study as study_mod
    from dse.metrics import cf_attrs
    from dse.optimize.results import LAYOUT_COLUMNS
    from dse.sweep import COORD_ATTRS, run_sweep
    from dse.sweep.space import COLUMNS, FIXED_FIELDS

    every = {f.name for f in planfields.FIELDS}
    # The study parser: every plan field is a key of [plan] (axes and scalars); the text above sets each.
    assert set(study_mod.PLAN_KEYS) == every - {"n_gpus", "dp"}
    study = study_mod.parse_study(EVERY_AXIS_STUDY)
    assert set(study.axes) == {"model", "gpu", "n_gpus", *planfields.AXES}
    assert set(study.scalars) == set(planfields.SCALARS)
    # The sweep: every axis, n_gpus and dp a coordinate with the registry's attributes; every
    # scalar a fixed leaf of the batched Plan.
    assert set(COLUMNS) == {"model", "gpu", *planfields.COLUMNS}
    assert set(FIXED_FIELDS) == {planfields.BY_NAME[k].leaf for k in planfields.SCALARS}
    path = tmp_path / "every.toml"
    path.write_text(EVERY_AXIS_STUDY)
    out = run_sweep(path, tmp_path / "out", chunk=64, progress=False)
    with xr.open_dataset(out) as ds:
        for name in planfields.COLUMNS:
            f = planfields.BY_NAME[name]
            assert f.long_name == COORD_ATTRS[name][0], name
            # the registry's long name and units, as a file spells them (UDUNITS: dse.metrics.cf_attrs)
            cf = cf_attrs(f.units, f.long_name)
            assert {k: ds[name].attrs[k] for k in cf} == cf, name
            if f.kind == "choice":
                assert ds[name].attrs["flag_meanings"].split() == list(f.names)
        for axis in ("sp", "zero", "loss"):
            assert sorted(np.unique(ds[axis].values)) == [0, 1], axis
    # The optimizer's layout encoding: every axis and dp.
    assert set(LAYOUT_COLUMNS) == {*planfields.AXES, "dp"}
