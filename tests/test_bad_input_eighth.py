"""The cases the seventh round left: a number written with underscores (``--tp 1_0`` read as 10),
an output written as a folder (``--out r.nc/`` wrote the file ``r.nc``), and an Optuna journal whose
last record a crash cut short (the next run glued its first record onto it, and the run after it
refused the journal); each refused or read as written, checked as :mod:`tests.test_bad_input`
checks its cases."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from dse.atomic import nc_target
from tests.test_bad_input import check_refused
from tests.test_bad_input_seventh import MODEL, _results

ROOT = Path(__file__).resolve().parents[1]
EVAL = ["evaluate", "--model", "llama2-7b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8"]
STUDY = ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml"


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written to the current folder shows in the listing
    return tmp_path


@pytest.mark.parametrize(
    "args, fragments",
    [
        ([*EVAL, "--tp", "1_0"], ["--tp 1_0", "digits only"]),
        ([*EVAL[:-2], "--global-batch", "6_4"], ["--global-batch 6_4", "digits only"]),
        ([*EVAL, "--fragmentation=0.1_5"], ["--fragmentation 0.1_5", "digits only"]),
        ([*EVAL, "--set", "hbm_capacity_GiB=8_0"], ["--set", "hbm_capacity_GiB", "'8_0'"]),
    ],
    ids=["int-flag", "batch-flag", "float-flag", "set-field"],
)
def test_a_number_with_underscores_is_refused(tmp, args, fragments):
    check_refused(tmp, args, fragments)


# Edited results files that report drew and export wrote: a sweep's configuration without a GPU
# (code -1, which only an optimize trial without a layout may hold) and a feasibility that is NaN,
# which reads as true.
EDITS = {
    "gpu_none.nc": lambda ds: ds["gpu"].values.__setitem__(0, -1),
    "feasible_nan.nc": lambda ds: ds.update({"feasible": ("config", np.array([1.0, np.nan]))}),
}


@pytest.mark.parametrize(
    "command", [["report", "--no-validation", "--out", "{tmp}/r"], ["export", "--csv", "{tmp}/t.csv"]]
)
@pytest.mark.parametrize(
    "name, fragment", [("gpu_none.nc", "gpu holds code -1"), ("feasible_nan.nc", "feasible holds nan")]
)
def test_an_edited_results_file_is_refused_by_report_and_export(tmp, command, name, fragment):
    _results(EDITS[name]).to_netcdf(tmp / name)
    check_refused(tmp, [command[0], f"{{tmp}}/{name}", *command[1:]], [name, fragment])


def test_an_output_that_is_no_netcdf_file_is_not_replaced(tmp):
    """``sweep --out notes.nc`` replaced the user's file with the results without a word; a rerun
    still replaces its own results (a netCDF file)."""
    (tmp / "notes.nc").write_text("my notes\n")
    study = str(ROOT / "studies" / "cxl_pool_2hosts.toml")
    check_refused(tmp, ["sweep", study, "--out", "{tmp}/notes.nc"], ["--out", "notes.nc", "no netCDF file"])
    assert (tmp / "notes.nc").read_text() == "my notes\n"


def test_an_output_written_as_a_folder_is_one():
    assert nc_target("r.nc/", "s.nc") == Path("r.nc/s.nc")
    assert nc_target("r.nc", "s.nc") == Path("r.nc")
    assert nc_target("r", "s.nc") == Path("r/s.nc")
    assert nc_target(Path("r.nc"), "s.nc") == Path("r.nc")  # a Path has no separator left: its suffix decides


def _journal(path: Path, records: list[dict], cut: int = 0) -> bytes:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
    path.write_bytes(text[: len(text) - cut] if cut else text)
    return text


def test_a_journal_record_cut_by_a_crash_is_dropped_and_a_whole_one_kept(tmp_path, capsys):
    from dse.optimize.storage import _drop_cut_record

    records = [{"op_code": 0, "study_name": "s"}, {"op_code": 6, "trial_id": 0, "state": 1, "values": [1.0]}]
    path = tmp_path / "j.log"
    whole = _journal(path, records)
    _drop_cut_record(path, "j.log")
    assert path.read_bytes() == whole and not capsys.readouterr().err  # nothing cut: untouched
    _journal(path, records, cut=9)
    _drop_cut_record(path, "j.log")
    first = json.dumps(records[0], separators=(",", ":")) + "\n"
    assert path.read_bytes() == first.encode()
    err = capsys.readouterr().err
    assert err.startswith("warning: --storage j.log: dropped its last record") and err.count("\n") == 1
    assert not (tmp_path / "j.log.lock").exists()  # Optuna's lock released


def test_an_optimize_run_resumes_a_journal_a_crash_cut(tmp_path):
    """Before: the rerun appended onto the cut line, and the run after it failed with
    ``Expecting ',' delimiter`` naming no file."""
    from dse.optimize import run_optimize

    journal = tmp_path / "j.log"
    run_optimize(STUDY, 2, storage=str(journal), out=tmp_path, batch=1, progress=False)
    text = journal.read_bytes()
    journal.write_bytes(text[:-40])
    run_optimize(STUDY, 3, storage=str(journal), out=tmp_path, batch=1, progress=False)
    s = run_optimize(STUDY, 4, storage=str(journal), out=tmp_path, batch=1, progress=False)
    assert s["n_trials"] == 4
    assert all("op_code" in json.loads(line) for line in journal.read_text().splitlines())


# Round 9 (plan files, MoE, runs CSV files): each refused before any pricing.
PLAN = """global_batch = 64
{extra}
[[stage]]
layers = 8
replicas = [{{ gpu = "a100-sxm-80gb", tp = 4, count = 2{share} }}]
[[stage]]
layers = 24
replicas = [{{ gpu = "h100-sxm-80gb", tp = 2, count = 4 }}]
"""
MOE_PLAN = """global_batch = 64
ep = {ep}
etp = {etp}
[[stage]]
layers = 16
replicas = [{{ gpu = "a100-sxm-80gb", tp = 2, count = {count} }}]
[[stage]]
layers = 16
replicas = [{{ gpu = "h100-sxm-80gb", tp = 2, count = {count} }}]
"""


@pytest.mark.parametrize(
    "name, text, flags, fragments",
    [  # a flag at its default value lost to the file's value; a non-default one was refused
        ("zero.toml", PLAN.format(extra="zero = 3", share=""), ["--zero", "0"], ["--zero 0", "plan file's 3"]),
        ("prec.toml", PLAN.format(extra='precision = "fp16"', share=""), ["--precision", "bf16"], ["--precision"]),
        (  # the flag's cluster replaced the file's own
            "cluster.toml",
            PLAN.format(extra='cluster = "a100-sxm-80gb:8,h100-sxm-80gb:8"', share=""),
            ["--cluster", "a100-sxm-80gb:16,h100-sxm-80gb:16"],
            ["--cluster", "contradicts the plan file's cluster"],
        ),
        (  # a stage's replicas taking 2 of the 64 micro-batches were priced as if they took 64
            "shares.toml",
            PLAN.format(extra="", share=", micro_batches = 1"),
            [],
            ["shares.toml stage 0", "sum to 2", "takes 64"],
        ),
        ("cp.toml", PLAN.format(extra="cp = 3", share=""), [], ["cp.toml: seq_len", "2 x cp = 6"]),  # the file's
        ("dense_ep.toml", PLAN.format(extra="ep = 2", share=""), [], ["dense_ep.toml stage 0", "no experts"]),
    ],
)
def test_a_plan_file_is_checked_as_the_flags_are(tmp, name, text, flags, fragments):
    (tmp / name).write_text(text)
    check_refused(tmp, ["evaluate", "--model", "llama2-7b", "--plan", f"{{tmp}}/{name}", *flags], fragments)


@pytest.mark.parametrize(
    "ep, etp, count, fragments",
    [(3, 1, 4, ["does not divide the model's 8 experts"]), (4, 4, 4, ["16 expert ranks do not tile the 8 ranks"])],
)
def test_a_plan_files_expert_layout_is_refused_as_the_flags_are(tmp, ep, etp, count, fragments):
    """Priced as an infeasible point (exit 0) where --ep refused it."""
    (tmp / "moe.toml").write_text(MOE_PLAN.format(ep=ep, etp=etp, count=count))
    check_refused(
        tmp, ["evaluate", "--model", "mixtral-8x7b", "--plan", "{tmp}/moe.toml"], ["moe.toml stage 0", *fragments]
    )


def test_a_replica_named_by_an_alias_is_a_kind_of_the_cluster_its_key_names():
    from hetersim import hplan
    from hetersim.catalog import load_catalog
    from hetersim.planrules import cluster_keys, keyed

    cat = load_catalog([])
    text = PLAN.format(extra="", share="").replace('"a100-sxm-80gb"', '"a100"')
    hp = hplan.parse_plan(tomllib.loads(text), "p.toml")
    kinds = {r.gpu for p in keyed(cat, hp).pipelines for s in p.stages for r in s.replicas}
    assert kinds == {"a100-sxm-80gb", "h100-sxm-80gb"}
    assert cluster_keys(cat, {"a100": 8, "a100-sxm-80gb": 8}) == {"a100-sxm-80gb": 16}


def _runs_file(tmp: Path, drop: tuple[str, ...] = (), **values: str) -> None:
    import csv

    with (ROOT / "hetersim" / "data" / "moe_runs.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    row = {**next(r for r in rows if r["id"].startswith("mb006")), **values}
    columns = [c for c in rows[0] if c not in drop]
    with (tmp / "r.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(row)


@pytest.mark.parametrize(
    "drop, values, fragments",
    [
        (("top_k",), {}, ["needs top_k: its column is empty or missing"]),  # a KeyError traceback before
        ((), {"ep": "0"}, ["column ep must be a positive integer"]),  # read as ep 1
        ((), {"n_experts": ""}, ["column top_k is given without n_experts"]),  # priced as dense
    ],
    ids=["column-missing", "ep-zero", "moe-without-experts"],
)
def test_a_runs_file_moe_row_is_read_as_written_or_refused(tmp, drop, values, fragments):
    _runs_file(tmp, drop, **values)
    check_refused(tmp, ["validate", "--runs", "{tmp}/r.csv"], ["r.csv", *fragments])


MIXTRAL = ["evaluate", "--model", "mixtral-8x7b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64"]


@pytest.mark.parametrize(
    "flags, fragments",
    [  # one expert-parallel rank holds the mean by definition: 5 tripled the step; 9 of 8 ranks cannot be
        (["--moe-imbalance", "5"], ["--moe-imbalance 5", "--ep 1", "between 1 and 1"]),
        (["--ep", "8", "--moe-imbalance", "9"], ["--moe-imbalance 9", "between 1 and 8"]),
        (["--dispatcher", "deepep"], ["--dispatcher", "--ep 1 sends none"]),  # changed nothing
    ],
    ids=["imbalance-one-rank", "imbalance-past-ranks", "dispatcher-one-rank"],
)
def test_an_moe_flag_that_cannot_hold_is_refused(tmp, flags, fragments):
    check_refused(tmp, [*MIXTRAL, *flags], fragments)


def test_a_report_of_a_feasible_configuration_without_its_metric_is_refused(tmp):
    """'error: All-NaN slice encountered' named neither file nor variable, and left the folder."""
    _results(lambda ds: ds["time_to_train_s"].values.__setitem__(slice(None), np.nan)).to_netcdf(tmp / "nan.nc")
    check_refused(
        tmp,
        ["report", "{tmp}/nan.nc", "--no-validation", "--out", "{tmp}/rep"],
        ["nan.nc", "time_to_train_s is not a finite number for a feasible configuration"],
    )


GX = """[gpus.gx]
name = "X"
vendor = "V"
sm_count = 132
peak_tflops_bf16 = 989.0
peak_tflops_fp16 = 989.0
peak_tflops_fp8 = 1979.0
peak_tflops_fp32 = 67.0
hbm_capacity_GiB = 80.0
hbm_bw_GBps = 3350.0
scaleup_link = "nvlink4"
scaleup_domain = 8
gpus_per_node = 8
host_link = "pcie5"
nic = "ib-ndr"
nics_per_gpu = 1.0
tdp_W = 700.0
price_usd_per_hour = 6.0
"""


@pytest.mark.parametrize(
    "extra, fragments",
    [  # a PFLOP/s figure read as TFLOP/s gave an MFU of 0.06 %
        ("measured_gemm_tflops_bf16 = 0.79\n", ["measured_gemm_tflops_bf16 = 0.79 is under 5%", "units the tool"]),
    ],
    ids=["gemm-unit-slip"],
)
def test_a_catalog_figure_that_cannot_be_a_measurement_is_refused(tmp, extra, fragments):
    (tmp / "c.toml").write_text(GX + extra)
    args = ["evaluate", "--model", "llama2-7b", "--global-batch", "64", "--gpus", "8", "--gpu", "gx"]
    check_refused(tmp, [*args, "--catalog", "{tmp}/c.toml"], ["c.toml", "gpus.gx.", *fragments])


@pytest.mark.parametrize(
    "budget, fragments",
    [
        ("inf", ["--budget must be a positive $ per hour; got inf"]),
        ("1", ["--budget $1/h buys no mix: the cheapest node costs"]),
        ("1e9", ["buys no mix: at most 256 GPUs of each kind cost"]),  # it said 'within 85-100 %', after a status line
    ],
)
def test_a_budget_that_buys_nothing_is_refused_before_the_search(tmp, budget, fragments):
    kinds = "a100-sxm-80gb,h100-sxm-80gb"
    check_refused(tmp, ["plan", "--model", "llama2-7b", "--global-batch", "64", "--budget", budget, "--kinds", kinds],
                  fragments)  # fmt: skip


def test_an_optimize_search_over_an_efficiency_past_the_peak_is_refused(tmp):
    """gemm_eff_bf16 = 1.5 was priced as a feasible point at 1.5 x the peak."""
    study = (ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml").read_text()
    (tmp / "o.toml").write_text(study.replace("\n[search]\n", "\n[search]\ngemm_eff_bf16 = [0.5, 1.5]\n", 1))
    check_refused(tmp, ["optimize", "{tmp}/o.toml", "--trials", "2", "--out", "{tmp}/out"],
                  ["o.toml", "search.gemm_eff_bf16", "at most 1"])  # fmt: skip


@pytest.mark.parametrize(
    "values, fragments",
    [  # scored as a 100 % miss (an infeasible prediction); a switch of 2 read as on
        ({"ep": "3"}, ["ep 3 does not divide the model's 128 experts", "columns ep, etp"]),
        ({"sp": "2"}, ["column sp must be 0 or 1"]),
    ],
    ids=["ep-not-dividing", "switch-two"],
)
def test_a_runs_row_that_cannot_run_is_refused(tmp, values, fragments):
    _runs_file(tmp, **values)
    check_refused(tmp, ["validate", "--runs", "{tmp}/r.csv"], ["r.csv", "mb006", *fragments])


MOE_MODEL = MODEL + "n_experts = 8\ntop_k = 4\nmoe_ffn_hidden = 1024\n"  # 4 layers


@pytest.mark.parametrize(
    "extra, fragments",
    [  # priced as dense with its experts named; top-4 priced where 2 experts are reachable; a count contradicted
        ("moe_every = 5\n", ["moe_every = 5", "leaves no MoE layer"]),
        ("route_groups = 4\nroute_group_topk = 1\n", ["top_k = 4 is more than the 2 experts"]),
        ("shared_experts = 0\nshared_ffn_hidden = 2048\n", ["shared_experts = 0 contradicts shared_ffn_hidden"]),
    ],
    ids=["moe-every-past-layers", "groups-reach", "shared-zero"],
)
def test_a_catalog_moe_model_that_contradicts_itself_is_refused(tmp, extra, fragments):
    """Refused where the file is read, naming it and the entry (since the fifteenth fuzz; before,
    when the model was built, as 'model M')."""
    (tmp / "m.toml").write_text(MOE_MODEL + extra)
    args = ["evaluate", "--model", "m", "--catalog", "{tmp}/m.toml", "--gpu", "h100-sxm-80gb", "--gpus", "8"]
    check_refused(tmp, [*args, "--global-batch", "64"], ["catalog file {tmp}/m.toml: models.m: ", *fragments])


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--precision", "fp8", "--fp8-attention", "--attention", "materialized"], ["--fp8-attention", "materialized"]),
        (  # int() read the Arabic-Indic digit as 8
            ["--cluster", "h100-sxm-80gb:4,a100-sxm-80gb:4", "--pp", "2", "--layers-per-stage", "\u0668,24"],
            ["--layers-per-stage", "not a whole number of layers"],
        ),
    ],
    ids=["fp8-attention-materialized", "layers-other-script"],
)
def test_a_kernel_or_layer_count_that_cannot_be_is_refused(tmp, args, fragments):
    base = ["evaluate", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "64"]
    check_refused(tmp, [*base, *([] if "--cluster" in args else ["--gpu", "h100-sxm-80gb"]), *args], fragments)


def test_flash_on_an_entry_without_its_rate_names_the_missing_fields(tmp):
    """An entry that says flash_attention = true and gives no rate is accepted (a user catalog of
    devices outside the tables; the materialized kernel runs), but --attention flash there said
    'no fused attention kernel there', naming nothing to add."""
    (tmp / "c.toml").write_text(GX + "gemm_eff_bf16 = 0.8\nflash_attention = true\n")
    args = ["evaluate", "--model", "llama2-7b", "--global-batch", "64", "--gpus", "8", "--gpu", "gx"]
    check_refused(tmp, [*args, "--catalog", "{tmp}/c.toml", "--attention", "flash"],
                  ["--attention flash", "no fused-attention rate: attn_eff_fwd and attn_eff_bwd"])  # fmt: skip
