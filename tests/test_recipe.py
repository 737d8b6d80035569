"""Megatron-LM / NeMo vocabulary: the flags' aliases, a NeMo recipe YAML and a Megatron argument
list evaluate the same configuration as the native flags (issue 15)."""

from __future__ import annotations

import pytest

from dse.cli.options import PLAN_OPTIONS
from hetersim.planfields import FIELDS
from hetersim.recipe import read_recipe
from tests.test_cli import assert_user_error, run, run_json

# Llama-2-7B's shape (hetersim/catalog/models.toml: 32 layers, 4096 hidden, 11008 FFN, 32 heads,
# 32000 vocabulary, untied) on 16 GPUs, written three ways.
NATIVE = (
    "--gpu h100-sxm-80gb --gpus 16 --global-batch 256 --micro-batch 1 --tp 2 --pp 2 --vp 2 --sp --zero 1"
    " --layers 32 --hidden 4096 --ffn-hidden 11008 --heads 32 --kv-heads 8 --vocab 32000 --seq-len 4096"
    " --recompute selective --precision bf16"
).split()
MEGATRON_FLAGS = (
    "--gpu h100-sxm-80gb --gpus 16 --global-batch-size 256 --micro-batch-size 1 --tensor-model-parallel-size 2"
    " --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 --sequence-parallel"
    " --use-distributed-optimizer --num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008"
    " --num-attention-heads 32 --num-query-groups 8 --vocab 32000 --seq-length 4096"
    " --recompute-granularity selective --precision bf16"
).split()
NEMO_YAML = """\
run:
  name: llama-7b-shape
trainer:
  num_nodes: 2
  devices: 8
  precision: bf16-mixed
model:
  micro_batch_size: 1
  global_batch_size: 256
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  virtual_pipeline_model_parallel_size: 2
  context_parallel_size: 1
  encoder_seq_length: 4096
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 11008
  num_attention_heads: 32
  num_query_groups: 8
  kv_channels: null
  activation: fast-swiglu
  share_embeddings_and_output_weights: false
  activations_checkpoint_granularity: selective
  activations_checkpoint_method: null
  sequence_parallel: true
  fp8: false
  optim:
    name: distributed_fused_adam
    lr: 3.0e-4
"""
MEGATRON_ARGS = """\
# torchrun's share, then pretrain_gpt.py's
torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \\
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\
    --virtual-pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer \\
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32 \\
    --group-query-attention --num-query-groups 8 \\
    --swiglu --untie-embeddings-and-output-weights --vocab-size 32000 \\
    --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 256 \\
    --recompute-granularity selective --bf16 --lr 3e-4 --data-path /data/my_text_document
"""


def _same(a: dict, b: dict) -> None:
    """The same configuration: every plan field, parameter count and result."""
    assert a["plan"] == b["plan"]
    for key in ("params", "step_time_s", "memory_per_gpu_GiB", "feasible", "mfu"):
        assert a[key] == b[key], key


@pytest.fixture(scope="module")
def native() -> dict:
    out = run_json(["evaluate", *NATIVE])
    # The flags mean what they say: the layout is the one given, the model Llama-2-7B-shaped with GQA.
    assert (out["plan"]["tp"], out["plan"]["pp"], out["plan"]["vp"], out["plan"]["dp"]) == (2, 2, 2, 4)
    assert out["plan"]["zero"] == 1 and out["plan"]["sp"] is True and out["plan"]["recompute"] == "selective"
    return out


def test_megatron_flags_evaluate_as_the_native_ones(native):
    _same(run_json(["evaluate", *MEGATRON_FLAGS]), native)


def test_nemo_recipe_evaluates_as_the_native_flags(native, tmp_path):
    recipe = tmp_path / "llama.yaml"
    recipe.write_text(NEMO_YAML)
    # A NeMo recipe names its tokenizer, not the vocabulary size: --vocab gives it.
    _same(run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", recipe, "--vocab", "32000"]), native)
    # The launcher's group wrapper (`training:`) reads the same.
    wrapped = tmp_path / "wrapped.yaml"
    wrapped.write_text("training:\n" + "".join(f"  {line}\n" for line in NEMO_YAML.splitlines()))
    _same(run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", wrapped, "--vocab", "32000"]), native)


def test_megatron_argument_list_evaluates_as_the_native_flags(native, tmp_path):
    args = tmp_path / "launch.sh"
    args.write_text(MEGATRON_ARGS)
    _same(run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", args]), native)


def test_command_line_flags_win_over_the_recipe(native, tmp_path):
    recipe = tmp_path / "llama.yaml"
    recipe.write_text(NEMO_YAML)
    out = run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", recipe, "--vocab", "32000", "--tp", "4"])
    assert (out["plan"]["tp"], out["plan"]["dp"]) == (4, 2)
    assert out["step_time_s"] != native["step_time_s"]
    # --model replaces the recipe's dimensions: Llama-2-7B itself has 32 KV heads, not 8, so more parameters.
    out = run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", recipe, "--model", "llama2-7b"])
    assert out["params"] > native["params"]


def test_megatron_defaults_apply_to_an_argument_list(tmp_path):
    """Without --swiglu Megatron builds a GeLU MLP; without --group-query-attention it ignores
    --num-query-groups; without --untie-... it ties the embeddings: each changes the count."""
    args = tmp_path / "args.txt"
    args.write_text(
        "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --num-query-groups 2"
        " --ffn-hidden-size 512 --vocab-size 1000"
    )
    model = read_recipe(args)["model"]
    assert model == {
        "layers": 2,
        "hidden": 256,
        "heads": 4,
        "ffn_hidden": 512,
        "vocab": 1000,
        "mlp": "plain",
        "tied_embeddings": True,
    }


def test_every_alias_and_switch_is_a_cli_option():
    """The registry's aliases reach the generated options (one declaration, no hand wiring)."""
    decls = {d for _, opt in PLAN_OPTIONS.values() for d in (opt.param_decls or ()) for d in d.split("/")}
    for f in FIELDS:
        assert set(f.aliases) <= decls, f.name
        assert {flag for flag, _ in f.switches} <= decls, f.name


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (
            "model:\n  num_micro_batches_with_partial_activation_checkpoints: 2\n",
            ["model.num_micro_batches_with_partial_activation_checkpoints", "partial"],
        ),
        ("model:\n  tensor_model_parallel_size: ${oc.env:TP}\n", ["model.tensor_model_parallel_size", "interpolation"]),
        ("model:\n  tensor_model_parallel_size: two\n", ["model.tensor_model_parallel_size", "positive integer"]),
        (
            "model:\n  activations_checkpoint_granularity: full\n  activations_checkpoint_method: block\n",
            ["model.activations_checkpoint_method", "block"],
        ),
        ("model:\n  kv_channels: 2.5\n", ["model.kv_channels", "positive integer"]),
        ("model:\n  activation: mish\n", ["model.activation", "fast-swiglu"]),
        ("trainer:\n  precision: 8\nmodel: {}\n", ["trainer.precision", "bf16-mixed"]),
        ("model: [1, 2\n", ["not valid YAML"]),
        ("lr: 1\n", ["'model' section"]),
    ],
)
def test_recipe_refusals_are_one_line(tmp_path, text, fragments):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    args = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8", "--model", "llama2-7b"]
    assert_user_error(run([*args, "--recipe", recipe]), str(recipe), *fragments)


def test_argument_list_refusals_and_missing_values(tmp_path):
    base = ["evaluate", "--gpu", "h100-sxm-80gb", "--model", "llama2-7b"]
    moe = tmp_path / "moe.txt"
    moe.write_text("--num-experts 8 --ffn-hidden-size 64 --expert-model-parallel-size 8 --tensor-model-parallel-size 2")
    assert_user_error(run([*base, "--gpus", "8", "--global-batch", "8", "--recipe", moe]), "allgather")
    empty = tmp_path / "empty.txt"
    empty.write_text("just words\n")
    assert_user_error(run([*base, "--gpus", "8", "--global-batch", "8", "--recipe", empty]), "no --flag arguments")
    both = tmp_path / "both.sh"
    both.write_text(MEGATRON_ARGS.replace("--bf16", "--bf16 --fp16"))  # Megatron-LM asserts one
    assert_user_error(run([*base, "--recipe", both]), str(both), "--fp16 --bf16", "both given")
    plan_only = tmp_path / "plan.txt"
    plan_only.write_text("--tensor-model-parallel-size 2")
    assert_user_error(run([*base, "--global-batch", "8", "--recipe", plan_only]), "--gpus")
    assert_user_error(
        run([*base, "--recipe", tmp_path / "absent.yaml", "--gpus", "8", "--global-batch", "8"]), "absent.yaml"
    )
    assert_user_error(
        run([*base, "--gpus", "8", "--global-batch", "8", "--use-distributed-optimizer", "--zero", "3"]),
        "--use-distributed-optimizer",
        "--zero 3",
    )


def test_a_recipe_model_needs_a_vocabulary(tmp_path):
    recipe = tmp_path / "novocab.yaml"
    recipe.write_text(NEMO_YAML)
    assert_user_error(run(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", recipe]), "--vocab")


def test_kv_channels_is_the_head_width(tmp_path):
    """Gemma-7B by Megatron's flags (--kv-channels 256, its head width) counts the parameters its
    Hugging Face config does (tests/test_hf_config.py: 8.54B)."""
    from tests.test_hf_config import GEMMA_7B, write

    base = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8", "--seq-len", "8192"]
    hf = run_json([*base, "--model", write(tmp_path / "gemma", GEMMA_7B)])
    dims = "--num-layers 28 --hidden-size 3072 --num-attention-heads 16 --ffn-hidden-size 24576 --vocab 256000"
    flags = run_json([*base, *dims.split(), "--kv-channels", "256"])
    native = run_json([*base, *dims.split(), "--head-dim", "256"])
    # The HF config ties the embeddings (Gemma does); by dimensions they are untied: one V*h apart.
    assert flags["params"] == native["params"] == hf["params"] + 256000 * 3072
