"""Defects found by the fourteenth bad-input fuzz (a helper session, /tmp/fz14: the stack facts at
every door, recipes, plan files), each a one-line ``error: ...`` naming the flag, file or key,
exit 2, nothing written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dse.cli import app

from .test_bad_input_thirteenth import _one_line  # one line "error: ...", exit 2, naming the needle

MIX = "evaluate --cluster h100-sxm-80gb:8,h200-sxm-141gb:8 --gpus 16 --global-batch 64 --seq-len 4096".split()
REPLICAS = 'replicas = [{ gpu = "h100-sxm-80gb", tp = 1, count = 8 }, { gpu = "h200-sxm-141gb", tp = 1, count = 8 }]'


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # a --cluster mix priced experts its stack lacks (flagged, or FEASIBLE for the data split)
        (["--hetero", "data", "--model", "mixtral-8x7b", "--stack", "megatron-legacy", "--ep", "8"], "--ep must be 1"),
        (["--hetero", "pipeline", "--pp", "2", "--model", "qwen3-30b-a3b", "--stack", "deepspeed-2020",
          "--precision", "fp16"], "deepspeed-2020 has no mixture-of-experts layer"),
        # the experts' own tensor parallelism is expert parallelism too
        (["--hetero", "data", "--model", "mixtral-8x7b", "--stack", "megatron-legacy", "--tp", "2", "--etp", "2"],
         "--etp must be 1, got 2"),
    ],
)  # fmt: skip
def test_a_mix_refuses_experts_its_stack_lacks(extra, needle):
    _one_line([*MIX, *extra], needle)


def test_expert_tensor_parallelism_needs_a_stack_with_expert_parallelism(catalog, cal):
    import jax

    from hetersim.simulate import simulate
    from hetersim.types import Infeasible

    from .conftest import make

    _one_line(
        "evaluate --model mixtral-8x7b --gpu h100-sxm-80gb --gpus 64 --global-batch 256 --tp 2 --etp 2 "
        "--stack megatron-legacy".split(),
        "megatron-legacy has no expert parallelism",
    )
    opts = dict(n_gpus=64, tp=2, pp=1, global_batch=256, seq_len=4096, sp=True, etp=2)
    flags = [int(jax.jit(simulate)(*make(catalog, "mixtral-8x7b", stack=s, **opts), cal).infeasible) for s in
             ("megatron-legacy", "megatron")]  # fmt: skip
    assert flags[0] & int(Infeasible.STACK) and not flags[1] & int(Infeasible.STACK)


def test_a_plan_file_without_a_precision_is_checked_in_the_default_bf16(tmp_path):
    """A plan file naming deepspeed-2020 and no precision was priced in bf16, which DeepSpeed 0.3 lacks."""
    plan = tmp_path / "p.toml"
    plan.write_text(f'global_batch = 64\nstack = "deepspeed-2020"\n[[stage]]\nlayers = 32\n{REPLICAS}\n')
    line = _one_line(["evaluate", "--model", "llama2-7b", "--plan", str(plan)], "trains in no bf16")
    assert line.startswith(f"error: {plan}: stack deepspeed-2020 ") and line.endswith("got bf16")
    plan.write_text(plan.read_text().replace("global_batch = 64\n", 'global_batch = 64\nprecision = "fp16"\n'))
    assert CliRunner().invoke(app, ["evaluate", "--model", "llama2-7b", "--plan", str(plan)]).exit_code == 0


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("ep = 8.0", "ep must be a positive integer <= 1,048,576; got 8.0"),
        ("zero = 1.0", "zero must be one of 0, 1, 2, 3; got 1.0"),
        ("seq_len = 4096.0", "seq_len must be a positive integer"),
        ("fused_experts = 1", "fused_experts must be true or false; got 1"),
    ],
)
def test_a_plan_files_common_fields_are_written_as_its_stages_are(tmp_path, line, needle):
    """Whole floats (``ep = 8.0``) and a switch as ``1`` were read, where a stage's ``tp = 4.0`` is refused."""
    plan = tmp_path / "p.toml"
    plan.write_text(f"global_batch = 64\n{line}\n[[stage]]\nlayers = 32\n{REPLICAS}\n")
    line = _one_line(["evaluate", "--model", "mixtral-8x7b", "--plan", str(plan)], needle)
    assert line.startswith(f"error: {plan}: ")


MEG = (
    "--vocab-size 32000 --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 "
    "--seq-length 2048 --micro-batch-size 1 --global-batch-size 64 "
)


def test_a_megatron_argument_lists_fp4_format_is_nvfp4(tmp_path):
    """``--fp4-format e2m1`` (Megatron-Core's NVFP4) was ignored: the run was priced in bf16."""
    from hetersim.recipe import read_recipe

    args = tmp_path / "a.sh"
    args.write_text(MEG + "--fp4-format e2m1")
    assert read_recipe(args)["plan"]["precision"] == "nvfp4"
    for tail, needle in (
        ("--fp4-format e3m2", "--fp4-format: must be e2m1; got 'e3m2'"),
        ("--fp4-format e2m1 --fp8-format hybrid", "--fp4-format --fp8-format: both given"),
    ):
        args.write_text(MEG + tail)
        _one_line(["evaluate", "--gpu", "b200", "--gpus", "16", "--recipe", str(args)], needle)


def test_a_plan_search_under_a_stack_without_a_pipeline_ranks_one_stage_plans(tmp_path):
    """``plan --stack fsdp`` failed after the search ('the plan has 2 stages') whenever a pipelined
    candidate ranked first: a stack with no pipeline (or DeepSpeed's engine under ZeRO 2-3) now
    searches one-stage plans only."""
    from hetersim import hsearch

    mix = [("h100-sxm-80gb", 8, 8), ("h200-sxm-141gb", 8, 8)]
    entry = {"layers": 32, "heads": 32, "kv_heads": 32}
    for options in ({"stack": "fsdp"}, {"stack": "llm-foundry"}, {"stack": "deepspeed", "zero": 3}):
        plans = hsearch.candidates(mix, entry, options)
        assert plans and all(len(p.stages) == 1 for q in plans for p in q.pipelines), options
    assert any(len(p.stages) > 1 for q in hsearch.candidates(mix, entry, {"stack": "megatron"}) for p in q.pipelines)


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        (["--moe-imbalance", "2"], "--moe-imbalance 2 is the busiest of --ep 1 ranks'"),
        (["--ep-overlap"], "--ep-overlap overlaps the expert-parallel all-to-all; --ep 1 has none"),
    ],
)
def test_a_plan_search_refuses_what_needs_expert_parallelism_before_it_searches(flag, needle):
    """The search lays out ep 1: these were refused after it, naming 'plan:' rather than the flag."""
    args = "plan --model mixtral-8x7b --cluster h100-sxm-80gb:8,h200-sxm-141gb:8 --global-batch 64".split()
    result = CliRunner().invoke(app, [*args, *flag])
    assert result.exit_code == 2 and result.output == f"error: {result.output[7:].strip()}\n"
    assert needle in result.output and "evaluating" not in result.output


def test_a_layer_split_per_cluster_group_needs_groups_with_stages_of_their_own():
    """With one stage over two kinds, ``--layers-per-stage 32,999`` read the 32 alone (FEASIBLE) and
    ``12,20`` said the stages had 12 layers."""
    args = [*MIX[:-2], "--model", "llama2-7b", "--zero", "3", "--layers-per-stage"]
    for split in ("32,999", "12,20"):
        _one_line([*args, split], "--layers-per-stage has 2 entries; give one per pipeline stage (1) or one per")
    assert CliRunner().invoke(app, [*args, "12,20", "--pp", "2"]).exit_code == 0


def test_a_deepspeed_configs_msamp_runs_fp8_and_zero_given_as_a_flag_replaces_its_stage_3(tmp_path):
    """MS-AMP's section was ignored (priced bf16); ``--zero 1`` beside a ZeRO-3 config was refused
    blaming ``--reuse-Mparams``, the stage-3 default the reader had filled in."""
    from hetersim.recipe import read_recipe

    ds = tmp_path / "ds.json"
    base = '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, '
    ds.write_text(base + '"bf16": {"enabled": true}, "msamp": {"enabled": true, "opt_level": "O2"}}')
    assert read_recipe(ds)["plan"]["precision"] == "fp8"
    ds.write_text(base + '"bf16": {"enabled": true}, "msamp": {"enabled": true, "opt_level": "O4"}}')
    _one_line(["evaluate", "--gpu", "b200", "--gpus", "16", "--model", "llama2-7b", "--recipe", str(ds)],
              "msamp.opt_level: must be O1, O2 or O3; got 'O4'")  # fmt: skip
    ds.write_text(base + '"bf16": {"enabled": true}}')
    args = ["evaluate", "--gpu", "b200", "--gpus", "16", "--model", "llama2-7b", "--recipe", str(ds), "--json"]
    result = CliRunner().invoke(app, [*args, "--zero", "1"])
    assert result.exit_code == 0, result.output
    import json

    assert json.loads(result.output)["plan"]["zero"] == 1


def test_a_runs_rows_etp_under_a_stack_without_expert_parallelism_names_its_column(tmp_path):
    import csv
    import io
    from pathlib import Path

    rows = list(csv.DictReader(io.StringIO((Path(__file__).parents[1] / "hetersim/data/moe_runs.csv").read_text())))
    row = next(r for r in rows if r["model"] == "Mixtral-8x7B" and int(r["ep"]) > 1 and int(r["pp"] or 1) == 1)
    out = io.StringIO()
    writer = csv.DictWriter(out, [*rows[0].keys(), "stack"])
    writer.writeheader()
    dp = str(int(row["n_gpus"]) // 2 // int(row["cp"] or 1))
    cells = {"stack": "megatron-legacy", "precision": "fp16", "ep": "1", "etp": "2", "tp": "2", "dp": dp}
    writer.writerow({**row, **cells})
    runs = tmp_path / "runs.csv"
    runs.write_text(out.getvalue())
    line = _one_line(["validate", "--runs", str(runs)], "megatron-legacy has no expert parallelism")
    assert line.endswith("column etp must be 1, got 2"), line
