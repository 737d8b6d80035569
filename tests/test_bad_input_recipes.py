"""Bad input found by the fifth and sixth fuzz (recipes, calibration, bench, plan files; studies,
optimize, plan searches, reports: 302 and 318 cases): each case one line ``error: ...`` naming its
file, key or flag, exit 2, no traceback, nothing written — checked as :mod:`tests.test_bad_input`
checks its cases — and the inputs that were misread, now read as they say."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app
from hetersim.recipe import _arguments, read_recipe
from tests.test_bad_input import check_refused

ROOT = Path(__file__).resolve().parents[1]
# A Megatron argument list (the fuzz's base case) and a Megatron-Bridge ConfigContainer.
MEG = (
    "--vocab-size 32000 --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 "
    "--seq-length 1024 --micro-batch-size 1 --global-batch-size 8"
)
BRIDGE = (
    "train: {micro_batch_size: 1, global_batch_size: 8}\n"
    "model: {num_layers: 4, hidden_size: 1024, num_attention_heads: 16, ffn_hidden_size: 4096, "
    "seq_length: 1024, vocab_size: 32000%s}\n"
)
NEMO = (
    "trainer: {num_nodes: 1, devices: 8, precision: bf16-mixed}\nmodel:\n  num_layers: %s\n  hidden_size: 1024\n"
    "  num_attention_heads: 16\n  ffn_hidden_size: 4096\n  encoder_seq_length: 1024\n  micro_batch_size: 1\n"
    "  global_batch_size: 8\n  vocab_size: 32000\n%s"
)
PLAN = """global_batch = 64
%s
[[stage]]
layers = 8
replicas = [{ gpu = "a100-sxm-80gb", tp = 4, count = 2 }]
[[stage]]
layers = 24
replicas = [{ gpu = "h100-sxm-80gb", tp = 2, count = 4 }]
"""
EV = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--recipe"]
STUDY = """name = "{name}"
[model]
key = "llama2-7b"
[hardware]
gpu = "h100-sxm-80gb"
n_gpus = 8
[plan]
global_batch = 64
seq_len = 2048
{extra}
"""
PLAN_STUDY = """name = "ps"
model = "llama2-7b"
clusters = ["h100-sxm-80gb:8"]
top = 2
[plan]
global_batch = 32
seq_len = 2048
"""
PLAN_OUT = ["--out", "{tmp}/rep"]


def _files(tmp: Path) -> None:
    for name, text in {
        "twice.sh": f"{MEG} --tensor-model-parallel-size 2 --tensor_model_parallel_size 4",
        "switch_value.sh": f"{MEG} --tensor-model-parallel-size 2 --sequence-parallel false",
        "switch_eq.sh": f"{MEG} --swiglu=false",
        "superscript.sh": MEG.replace("--num-layers 4", "--num-layers \u00b2"),
        "open_quote.sh": f"{MEG} --data-path 'a#b",
        "dup.yaml": NEMO % ("4", "  num_layers: 8\n"),
        "octal.yaml": NEMO % ("010", ""),
        "sexagesimal.yaml": NEMO % ("1:00", ""),
        "optim_text.yaml": NEMO % ("4", "  optim: distributed_fused_adam\n"),
        "fp8_text.yaml": BRIDGE % ", fp8: 'false'",
        "fp16_text.yaml": BRIDGE % ", fp16: 'true'",
        "dist_text.yaml": (BRIDGE % "") + "optimizer: {use_distributed_optimizer: 'true'}\n",
        "dist_both.yaml": (BRIDGE % "")
        + "optimizer: {use_distributed_optimizer: true}\nddp: {use_distributed_optimizer: false}\n",
        "seq_both.yaml": (BRIDGE % "") + "dataset: {seq_length: 2048}\n",
        "plan.toml": PLAN % "",
        "plan_seq_text.toml": PLAN % 'seq_len = "2048"',
    }.items():
        (tmp / name).write_text(text)
    for name, extra in {
        "s_long_name.toml": "",
        "s_ok.toml": "",
        "s_imbalance.toml": "moe_imbalance = 2.0",
        "s_fp8_attention.toml": "fp8_attention = true",
        "s_shard.toml": "shard_group = 4",
        "s_dispatcher.toml": 'dispatcher = "deepep"',
        "s_overlap.toml": "ep_overlap = true",
        "s_cluster_digit.toml": "",
    }.items():
        text = STUDY.format(name="a" * 300 if "long" in name else "t", extra=extra)
        if "digit" in name:
            text = text.replace('gpu = "h100-sxm-80gb"\nn_gpus = 8', 'cluster = "h100-sxm-80gb:\u00b2"')
        (tmp / name).write_text(text, encoding="utf-8")
    for name, change in {
        "ps_description.toml": ("top = 2", "top = 2\ndescription = 5"),
        "ps_catalog.toml": ("top = 2", 'top = 2\ncatalog = "c.toml"'),
        "ps_unknown_kind.toml": ('clusters = ["h100-sxm-80gb:8"]', 'clusters = ["h100-sxm-80gb:8", "h900:8"]'),
        "ps_text.toml": ("global_batch = 32", 'global_batch = "32"'),
    }.items():
        (tmp / name).write_text(PLAN_STUDY.replace(*change))
    (tmp / "ps.toml").write_text(PLAN_STUDY)
    runs = (ROOT / "hetersim" / "data" / "published_runs.csv").read_text().splitlines()
    (tmp / "one_source.csv").write_text("\n".join(runs[:2]) + "\n")


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written to the current folder shows in the listing
    _files(tmp_path)
    return tmp_path


CASES = [
    # tracebacks
    (
        "sensitivity-plan",
        ["sensitivity", "--model", "llama2-7b", "--plan", "{tmp}/plan.toml"],
        ["--plan", "one device kind"],
    ),
    (
        "calibrate-intervals-one-source",
        ["calibrate", "--runs", "{tmp}/one_source.csv", "--steps", "2", "--dry-run", "--intervals"],
        ["--intervals", "two sources", "one_source.csv has 1"],
    ),
    (
        "calibrate-cross-validate-one-source",
        ["calibrate", "--runs", "{tmp}/one_source.csv", "--steps", "2", "--cross-validate"],
        ["--cross-validate", "two sources"],
    ),
    # a Megatron argument list: the last of a flag given twice was taken, a switch's value ignored
    ("megatron-flag-twice", [*EV, "{tmp}/twice.sh"], ["twice.sh", "--tensor_model_parallel_size", "given twice"]),
    ("megatron-switch-value", [*EV, "{tmp}/switch_value.sh"], ["--sequence-parallel", "takes no value", "'false'"]),
    ("megatron-switch-eq", [*EV, "{tmp}/switch_eq.sh"], ["switch_eq.sh", "--swiglu", "takes no value"]),
    ("megatron-superscript", [*EV, "{tmp}/superscript.sh"], ["superscript.sh", "--num-layers", "positive integer"]),
    ("megatron-open-quote", [*EV, "{tmp}/open_quote.sh"], ["open_quote.sh", "line 1", "No closing quotation"]),
    # YAML: a key twice (the last was taken), YAML 1.1's base-8 and base-60 integers (8 and 60 layers)
    ("yaml-key-twice", [*EV, "{tmp}/dup.yaml"], ["dup.yaml", "'num_layers' given twice"]),
    ("yaml-octal", [*EV, "{tmp}/octal.yaml"], ["octal.yaml", "'010'", "base 8"]),
    ("yaml-sexagesimal", [*EV, "{tmp}/sexagesimal.yaml"], ["sexagesimal.yaml", "'1:00'", "base 60"]),
    # switches read for truth, not checked (fp8: 'false' ran FP8, use_distributed_optimizer: 'true' none)
    ("nemo-optim-text", [*EV, "{tmp}/optim_text.yaml"], ["optim_text.yaml", "model.optim", "section"]),
    ("bridge-fp8-text", [*EV, "{tmp}/fp8_text.yaml"], ["fp8_text.yaml", "model.fp8", "'false'"]),
    ("bridge-fp16-text", [*EV, "{tmp}/fp16_text.yaml"], ["model.fp16", "true or false", "'true'"]),
    ("bridge-dist-text", [*EV, "{tmp}/dist_text.yaml"], ["optimizer.use_distributed_optimizer", "true or false"]),
    (
        "bridge-dist-contradict",
        [*EV, "{tmp}/dist_both.yaml"],
        ["optimizer.use_distributed_optimizer and ddp.use_distributed_optimizer", "contradict"],
    ),
    ("bridge-seq-contradict", [*EV, "{tmp}/seq_both.yaml"], ["dataset.seq_length", "2048", "model.seq_length 1024"]),
    # an inert flag, and a number written as text in a plan file
    (
        "bench-chunk-and-chunks",
        ["bench", "--configs", "1000", "--chunk", "1024", "--chunks", "2048", "--one-at-a-time", "0"],
        ["--chunk and --chunks"],
    ),
    # sixth fuzz: studies, plan searches, optimize, sweeps (the study's points never run)
    ("study-long-name", ["sweep", "{tmp}/s_long_name.toml", "--out", "{tmp}/out"], ["name", "at most 200"]),
    ("study-imbalance-dense", ["sweep", "{tmp}/s_imbalance.toml"], ["s_imbalance.toml", "plan.moe_imbalance"]),
    ("study-fp8-attention-bf16", ["sweep", "{tmp}/s_fp8_attention.toml"], ["plan.fp8_attention", "plan.precision"]),
    ("study-shard-zero0", ["sweep", "{tmp}/s_shard.toml"], ["s_shard.toml", "plan.shard_group", "plan.zero 0"]),
    ("study-dispatcher-dense", ["sweep", "{tmp}/s_dispatcher.toml"], ["plan.dispatcher", "no experts"]),
    ("study-overlap-dense", ["sweep", "{tmp}/s_overlap.toml"], ["plan.ep_overlap", "no experts"]),
    (
        "study-cluster-superscript",
        ["sweep", "{tmp}/s_cluster_digit.toml"],
        ["s_cluster_digit.toml", "hardware.cluster"],
    ),
    (
        "evaluate-imbalance-dense",
        ["evaluate", "--model", "llama2-7b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8"]
        + ["--moe-imbalance", "2"],
        ["--moe-imbalance", "no"],
    ),
    ("plan-study-description", ["plan", "--study", "{tmp}/ps_description.toml", *PLAN_OUT], ["description", "string"]),
    ("plan-study-catalog-text", ["plan", "--study", "{tmp}/ps_catalog.toml", *PLAN_OUT], ["catalog", "a list"]),
    ("plan-study-unknown-kind", ["plan", "--study", "{tmp}/ps_unknown_kind.toml", *PLAN_OUT], ["clusters", "h900"]),
    ("plan-study-text", ["plan", "--study", "{tmp}/ps_text.toml", *PLAN_OUT], ["plan.global_batch", "'32'"]),
    (
        "plan-study-and-flag",
        ["plan", "--study", "{tmp}/ps.toml", *PLAN_OUT, "--global-batch", "999"],
        ["--global-batch"],
    ),
    (
        "plan-unknown-kind",
        ["plan", "--model", "llama2-7b", "--cluster", "h900:8", "--global-batch", "8"],
        ["--cluster h900:8", "unknown gpu"],
    ),
    (
        "plan-cluster-superscript",
        ["plan", "--model", "llama2-7b", "--cluster", "h100-sxm-80gb:\u00b2", "--global-batch", "8"],
        ["h100-sxm-80gb:\u00b2", "positive count"],
    ),
    (
        "plan-cp",
        ["plan", "--model", "llama2-7b", "--cluster", "h100-sxm-80gb:8", "--global-batch", "8", "--cp", "2"],
        ["--cp", "plan file"],
    ),
    ("sweep-scheduler-address", ["sweep", "{tmp}/s_ok.toml", "--scheduler", "bogus"], ["--scheduler bogus"]),
    (
        "optimize-seed",
        ["optimize", str(ROOT / "studies/optimize/llama2-13b-hardware.toml"), "--seed", "-1"],
        ["--seed"],
    ),
    (
        "optimize-storage-is-out",
        [
            "optimize",
            str(ROOT / "studies/optimize/llama2-13b-hardware.toml"),
            "--storage",
            "{tmp}/o/",
            "--out",
            "{tmp}/o/",
        ],
        ["--storage", "folder"],
    ),
    (
        "plan-seq-text",
        ["evaluate", "--model", "llama2-7b", "--plan", "{tmp}/plan_seq_text.toml"],
        ["plan_seq_text.toml", "seq_len must be", "'2048'"],
    ),
]


@pytest.mark.parametrize("args, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(tmp, args, fragments):
    check_refused(tmp, args, fragments)


def test_an_argument_list_is_split_as_bash_splits_it(tmp):
    """A ``#`` inside a word or quotes is no comment (``'a#b'`` was cut to ``'a``); a byte-order
    mark does not hide the first flag (it read as tp 1); a flag given twice with one value is fine."""
    args = _arguments("--data-path 'a#b' --x c#d # a comment\n--tp 2 --tp 2 \\\n --pp 4")
    assert args == {"--data-path": "a#b", "--x": "c#d", "--tp": "2", "--pp": "4"}
    (tmp / "bom.sh").write_text("\ufeff--tensor-model-parallel-size 4 " + MEG, encoding="utf-8")
    assert read_recipe(tmp / "bom.sh")["plan"]["tp"] == 4


def test_a_whole_number_written_as_a_decimal_reads_and_calibrate_makes_its_folder(tmp):
    """A runs row's tp written ``1.0`` (accepted by the reader) crashed the report's layout label;
    ``calibrate --out`` into a missing folder failed after the fit with a raw errno: the folder is
    made, as every other command's output folder is."""
    rows = list(csv.reader((tmp / "one_source.csv").open()))
    rows[1][rows[0].index("tp")] = "1.0"
    with (tmp / "tp.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    result = CliRunner().invoke(app, ["validate", "--runs", str(tmp / "tp.csv"), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["rows"][0]["layout"].startswith("tp1-")
    out = tmp / "new" / "c.toml"
    result = CliRunner().invoke(
        app, ["calibrate", "--runs", str(tmp / "one_source.csv"), "--steps", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    assert out.is_file() and "gemm_shape_eff" in out.read_text()


def test_a_searched_value_below_the_catalogs_earns_no_price_credit(tmp):
    """[search.price] is per unit above the catalog's value; below it the price was credited, down
    to a negative price and cost that won the cost objective."""
    import xarray as xr

    study = STUDY.format(name="neg", extra="tp = [1, 2]")
    study += '[search]\ngpu = ["h100-sxm-80gb"]\nn_gpus = [8]\nhbm_bw_GBps = [100, 3350]\n'
    (tmp / "neg.toml").write_text(study + "[search.price]\nhbm_bw_GBps = 0.003\n")
    args = ["optimize", str(tmp / "neg.toml"), "--trials", "2", "--batch", "2", "--sampler", "grid"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp / "o")])
    assert result.exit_code == 0, result.stderr
    with xr.open_dataset(next((tmp / "o").glob("*.nc"))) as ds:
        price = dict(zip(ds["hbm_bw_GBps"].values.tolist(), ds["price_usd_per_hour"].values.tolist(), strict=True))
    catalog = price[3350]  # the H100's own bandwidth: its catalog price
    assert price[100] == pytest.approx(catalog) and catalog > 0


def test_top_k_streams_a_small_study_and_a_report_checks_its_counts_first(tmp):
    """--top-k on a study below the streaming threshold kept every row (no stream, no top k): it
    now streams. A streamed file without its counts, or with an objective sense that is neither min
    nor max, is refused before the report draws anything (a KeyError after the figures before)."""
    import xarray as xr

    (tmp / "small.toml").write_text(STUDY.format(name="small", extra="tp = [1, 2]"))
    result = CliRunner().invoke(app, ["sweep", str(tmp / "small.toml"), "--out", str(tmp / "out"), "--top-k", "1"])
    assert result.exit_code == 0, result.stderr
    with xr.open_dataset(tmp / "out" / "small.nc") as ds:
        ds = ds.load()
    assert int(ds.attrs["streamed"]) == 1 and int(ds.attrs["top_k"]) == 1
    bad = ds.copy()
    del bad.attrs["n_feasible"]
    bad.to_netcdf(tmp / "counts.nc")
    ds.attrs["objective_senses"] = "up min"
    ds.to_netcdf(tmp / "senses.nc")
    for name, needle in (("counts", "n_feasible attribute"), ("senses", "objective_senses")):
        check_refused(
            tmp, ["report", str(tmp / f"{name}.nc"), "--no-validation", "--out", str(tmp / "r")], [f"{name}.nc", needle]
        )


def test_context_parallelism_in_a_heterogeneous_plan_runs_and_a_mix_of_one_kind_is_the_homogeneous_run():
    """cp > 1 in a heterogeneous plan failed with 'n_gpus 1 is not divisible by tp*pp*cp' (the shared
    plan's placeholder group had one GPU); a mix of identical kinds now prices as the homogeneous
    cluster, and cp halves the activations of a mix of two kinds."""
    base = [
        "evaluate",
        "--model",
        "llama2-7b",
        "--gpus",
        "16",
        "--tp",
        "4",
        "--global-batch",
        "32",
        "--seq-len",
        "8192",
    ]
    same = CliRunner().invoke(app, [*base, "--cp", "2", "--cluster", "h100-sxm-80gb:8,h100-sxm-80gb:8", "--json"])
    homo = CliRunner().invoke(app, [*base, "--cp", "2", "--gpu", "h100-sxm-80gb", "--json"])
    assert same.exit_code == 0 and homo.exit_code == 0, (same.stderr, homo.stderr)
    assert json.loads(same.stdout)["step_time_s"] == json.loads(homo.stdout)["step_time_s"]
    mix = [*base, "--cluster", "a100-sxm-80gb:8,h100-sxm-80gb:8", "--json"]
    act = {
        cp: json.loads(CliRunner().invoke(app, [*mix, "--cp", cp]).stdout)["memory_per_gpu_GiB"]["activations"]
        for cp in ("1", "2")
    }
    assert act["2"] == pytest.approx(act["1"] / 2, rel=1e-3)


def test_a_recipes_value_is_named_as_the_recipes_not_by_a_flag_not_given(tmp):
    """Left by the thirteenth fuzz: a value the recipe gave was named by the flag it maps to
    (``--cp must be 1``), a flag the user never gave; it is named as the file's now, and a flag that
    was given (which wins over the file) keeps its own name."""
    path = tmp / "nemo.yaml"
    path.write_text(NEMO % (4, "  context_parallel_size: 2\n"))
    base = ["evaluate", "--model", "llama2-7b", "--gpu", "h100-sxm-80gb", "--recipe", str(path)]
    result = CliRunner().invoke(app, [*base, "--stack", "megatron-legacy"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: --stack megatron-legacy has no context parallelism")
    assert result.output.rstrip().endswith(f"; cp (from --recipe {path}) must be 1, got 2")
    result = CliRunner().invoke(app, [*base, "--stack", "megatron-legacy", "--cp", "4"])
    assert result.exit_code == 2 and result.output.rstrip().endswith("; --cp must be 1, got 4")
    result = CliRunner().invoke(app, [*base, "--tp", "3"])  # the recipe's 8 GPUs, the command line's TP
    assert result.exit_code == 2
    assert result.output == f"error: n_gpus (from --recipe {path}) 8 is not divisible by tp*pp*cp = 6\n"
