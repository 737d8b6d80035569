"""Defects found by the thirteenth bad-input fuzz (a helper session, /tmp/fz13), each a one-line
``error: ...`` naming the flag, file or key, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app

from .test_hplan import PLAN  # the README's plan file: 12 + 20 layers, speed-balanced


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
    text = PLAN.replace("count = 2 }", "count = 1000000000 }")
    plan.write_text(text)
    line = _one_line(["evaluate", "--model", "llama2-7b", "--plan", str(plan)], "GPUs to work; at most 1,048,576")
    assert line.startswith(f"error: {plan}: the plan puts 2,000,000,012 GPUs")
    assert Path(plan).read_text() == text


MEGATRON = (
    "--vocab-size 32000 --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 "
    "--seq-length 2048 --micro-batch-size 1 --global-batch-size 8 "
)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("--fp8-format bogus", "--fp8-format: must be e4m3 or hybrid; got 'bogus'"),  # was read as fp8
        ("--fp8-format hybrid --fp8-recipe nope", "--fp8-recipe: must be tensorwise, delayed, mxfp8 or blockwise"),
        ("--num-layers-per-virtual-pipeline-stage 0", "must be a positive integer; got '0'"),  # was ignored
        (
            "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3",
            "3 must divide the layers of a stage (4 layers over --pipeline-model-parallel-size 2",
        ),
        (
            "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
            "--num-layers-per-virtual-pipeline-stage 1",
            "each sets the virtual pipeline stages; give one of them",
        ),
    ],
)
def test_a_megatron_argument_list_is_read_as_megatron_reads_it(tmp_path, extra, needle):
    recipe = tmp_path / "args.sh"
    recipe.write_text(MEGATRON + extra + "\n")
    _one_line(["evaluate", "--gpu", "b200", "--gpus", "8", "--recipe", str(recipe)], needle)


def test_megatrons_interleaving_and_fp8_recipe_flags_set_the_plan(tmp_path):
    """``--num-layers-per-virtual-pipeline-stage`` was ignored (an interleaved run read as 1F1B) and
    ``--fp8-recipe mxfp8`` read as per-tensor FP8; Megatron derives vp = layers / pp / N."""
    from hetersim import recipe

    path = tmp_path / "args.sh"
    path.write_text(
        MEGATRON + "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "
        "--fp8-format hybrid --fp8-recipe mxfp8\n"
    )
    plan = recipe.read_recipe(path)["plan"]
    assert plan["vp"] == 2 and plan["pp"] == 2 and plan["precision"] == "mxfp8"
    path.write_text(MEGATRON + "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2\n")
    assert recipe.read_recipe(path)["plan"]["vp"] == 2


def test_a_bridge_fp8_format_is_one_transformer_engine_has(tmp_path):
    recipe = tmp_path / "b.yaml"
    model = "num_layers: 4, hidden_size: 1024, num_attention_heads: 16, ffn_hidden_size: 4096, seq_length: 2048"
    recipe.write_text(f"train: {{micro_batch_size: 1, global_batch_size: 8}}\nmodel: {{{model}, fp8: e5m2}}\n")
    _one_line(["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--recipe", str(recipe)], "model.fp8: must be")


def test_a_one_expert_config_routes_a_token_to_one_expert(tmp_path):
    """A Mixtral config with num_local_experts 1 and num_experts_per_tok 2 was read as dense."""
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, '
        '"num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 1, "num_experts_per_tok": 2, '
        '"vocab_size": 32000, "max_position_embeddings": 32768, "hidden_act": "silu"}'
    )
    args = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8", "--model", str(config)]
    _one_line(args, "num_experts_per_tok = 2 must be at most num_local_experts = 1")


def test_an_override_that_changes_nothing_is_refused(tmp_path):
    """A stated efficiency under a measured figure of the same entry changed nothing (the measured
    figure wins): ``--set gemm_eff_bf16=0.3`` left the step as it was without a word."""
    catalog = tmp_path / "cat.toml"
    catalog.write_text(
        '[gpus.mgpu]\nname = "Measured GPU"\nvendor = "Me"\npeak_tflops_bf16 = 989.0\npeak_tflops_fp16 = 989.0\n'
        "peak_tflops_fp8 = 1979.0\npeak_tflops_fp32 = 67.0\nmeasured_gemm_tflops_bf16 = 700.0\ngemm_eff_fp8 = 0.7\n"
        'hbm_capacity_GiB = 80.0\nhbm_bw_GBps = 3350.0\nscaleup_link = "nvlink4"\nscaleup_domain = 8\n'
        'gpus_per_node = 8\nhost_link = "pcie5"\nnic = "ib-ndr"\nnics_per_gpu = 1.0\ntdp_W = 700.0\n'
        'price_usd_per_hour = 4.0\nsm_count = 132\n[gpus.mgpu.sources]\nmeasured_gemm_tflops_bf16 = "mamf-finder"\n'
    )
    args = ["evaluate", "--model", "llama2-7b", "--gpu", "mgpu", "--gpus", "8", "--global-batch", "64"]
    args += ["--catalog", str(catalog)]
    _one_line([*args, "--set", "gemm_eff_bf16=0.3"], "gpus.mgpu.gemm_eff_bf16 is set by the entry's measured_gemm")
    assert CliRunner().invoke(app, [*args, "--set", "measured_gemm_tflops_bf16=300"]).exit_code == 0


def test_a_speed_balanced_plan_gives_every_replica_a_micro_batch(tmp_path):
    """``balance = "speed"`` with 71 replicas for 64 micro-batches was priced FEASIBLE (each got one);
    ``equal`` refused it. A whole number written as a float (``tp = 2.0``) is refused, as a study does."""
    plan = tmp_path / "p.toml"
    assert 'balance = "speed"' in PLAN and "count = 2 }" in PLAN
    plan.write_text(PLAN.replace("count = 2 }", "count = 70 }"))
    _one_line(["evaluate", "--model", "llama2-7b", "--plan", str(plan)], "64 micro-batches for 71 replicas leave a")
    plan.write_text(PLAN.replace("tp = 4\n", "tp = 4.0\n"))
    _one_line(["evaluate", "--model", "llama2-7b", "--plan", str(plan)], "tp must be an integer >= 1; got 4.0")
