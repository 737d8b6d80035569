"""Mixture-of-experts recipes (issue 18): a Megatron-LM argument list and a NeMo config of an MoE
model evaluate the same configuration as the catalog's model with the native flags; Megatron's
defaults (expert TP = TP, top-2, the expert FFN = the FFN) apply; what the model cannot price is
refused in one line."""

from __future__ import annotations

import pytest

from hetersim.recipe import read_recipe
from tests.test_cli import assert_user_error, run, run_json

# DeepSeek-V3 as NVIDIA/Megatron-LM @ d98e8a64dd examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh
# writes it (its model flags verbatim; the layout and the vocabulary, which that script leaves to
# its tokenizer, filled in; --recompute-modules narrowed to the one the model prices).
DEEPSEEK_V3 = """\
torchrun --nnodes 128 --nproc-per-node 8 pretrain_gpt.py \\
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 \\
    --expert-model-parallel-size 64 --expert-tensor-parallel-size 1 \\
    --use-distributed-optimizer --sequence-parallel \\
    --micro-batch-size 1 --global-batch-size 8192 \\
    --recompute-granularity selective --recompute-modules mla_up_proj \\
    --seq-length 4096 --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 \\
    --num-attention-heads 128 --kv-channels 128 --swiglu --untie-embeddings-and-output-weights \\
    --vocab-size 129280 --multi-latent-attention \\
    --num-experts 256 --moe-layer-freq [0]*3+[1]*58 --moe-ffn-hidden-size 2048 \\
    --moe-shared-expert-intermediate-size 2048 --moe-router-topk 8 \\
    --moe-token-dispatcher-type alltoall --moe-router-group-topk 4 --moe-router-num-groups 8 \\
    --moe-router-load-balancing-type seq_aux_loss --moe-router-force-load-balancing \\
    --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 \\
    --mtp-num-layers 1 --bf16
"""
DEEPSEEK_NATIVE = (
    "--model deepseek-v3 --gpus 1024 --tp 1 --pp 16 --ep 64 --etp 1 --zero 1 --sp --micro-batch 1"
    " --global-batch 8192 --recompute selective --mla-up-proj --seq-len 4096 --precision bf16"
).split()

# Mixtral 8x7B as NVIDIA/NeMo-Framework-Launcher @ 26e42fa9 launcher_scripts/conf/training/mixtral/
# mixtral_8x7b.yaml gives it (the keys the model reads; the optimizer is Megatron-Core's
# distributed one; capacity factor 1.0 with padding: every expert computes its mean share).
MIXTRAL_YAML = """\
trainer:
  num_nodes: 8
  devices: 8
  precision: bf16
model:
  moe_grouped_gemm: false
  moe_token_dispatcher_type: alltoall
  moe_pad_expert_input_to_capacity: True
  moe_expert_capacity_factor: 1.0
  micro_batch_size: 1
  global_batch_size: 256
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 4
  expert_model_parallel_size: 8
  virtual_pipeline_model_parallel_size: 8
  encoder_seq_length: 4096
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  activation: fast-swiglu
  moe_router_topk: 2
  num_moe_experts: 8
  share_embeddings_and_output_weights: false
  num_query_groups: 8
  activations_checkpoint_granularity: null
  sequence_parallel: true
  optim:
    name: mcore_distributed_optim
"""
MIXTRAL_NATIVE = (
    "--model mixtral-8x7b --gpus 64 --tp 1 --pp 4 --vp 8 --ep 8 --zero 1 --sp --micro-batch 1"
    " --global-batch 256 --seq-len 4096 --precision bf16"
).split()


def _same(a: dict, b: dict) -> None:
    assert a["plan"] == b["plan"]
    for key in ("params", "step_time_s", "memory_per_gpu_GiB", "feasible", "mfu"):
        assert a[key] == b[key], key


def assert_refused(path, fragments) -> None:
    """read_recipe refuses the file in one message that starts with it and names every fragment."""
    with pytest.raises(ValueError) as caught:
        read_recipe(path)
    assert str(caught.value).startswith(f"recipe {path}: ")
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_megatron_moe_argument_list_is_the_catalog_model(tmp_path):
    """DeepSeek-V3 by Megatron's flags: MLA, 3 leading dense layers, a shared expert, group-limited
    routing and one MTP module, the same parameters (671B) and step as the catalog entry."""
    args = tmp_path / "deepseek_v3.sh"
    args.write_text(DEEPSEEK_V3)
    recipe = read_recipe(args)
    model = recipe["model"]
    assert (model["n_experts"], model["top_k"], model["dense_layers"], model["mtp_layers"]) == (256, 8, 3, 1)
    assert (model["q_lora_rank"], model["kv_lora_rank"], model["qk_rope_head_dim"]) == (1536, 512, 64)
    assert recipe["plan"]["mla_up_proj"] is True and recipe["plan"]["dispatcher"] == "alltoall"
    by_file = run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", args])
    _same(by_file, run_json(["evaluate", "--gpu", "h100-sxm-80gb", *DEEPSEEK_NATIVE]))
    assert 670e9 < by_file["params"] < 672e9


def test_a_nemo_moe_config_is_the_catalog_model(tmp_path):
    recipe = tmp_path / "mixtral_8x7b.yaml"
    recipe.write_text(MIXTRAL_YAML)
    read = read_recipe(recipe)
    # mcore_distributed_optim is the distributed optimizer; expert TP defaults to TP (1 here).
    assert (read["plan"]["zero"], read["plan"]["etp"], read["plan"]["moe_imbalance"]) == (1, 1, 1.0)
    by_file = run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", recipe, "--vocab", "32000"])
    _same(by_file, run_json(["evaluate", "--gpu", "h100-sxm-80gb", *MIXTRAL_NATIVE]))
    assert 46.6e9 < by_file["params"] < 46.8e9


def test_megatron_moe_defaults(tmp_path):
    """Left out: top-2, the expert FFN = --ffn-hidden-size, expert TP = TP; --moe-layer-freq 2 puts
    an MoE layer every other layer (half the experts' parameters of every layer MoE)."""
    base = (
        "--nnodes 1 --nproc-per-node 8 --tensor-model-parallel-size 2 --expert-model-parallel-size 4"
        " --num-layers 4 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 512 --vocab-size 1000"
        " --swiglu --num-experts 8 --moe-token-dispatcher-type alltoall"
    )
    every = tmp_path / "every.txt"
    every.write_text(base)
    read = read_recipe(every)
    assert (read["model"]["top_k"], read["model"]["moe_ffn_hidden"], read["plan"]["etp"]) == (2, 512, 2)
    half = tmp_path / "half.txt"
    half.write_text(base + " --moe-layer-freq 2")
    assert read_recipe(half)["model"]["moe_every"] == 2
    args = ["evaluate", "--gpu", "h100-sxm-80gb", "--global-batch", "8", "--recipe"]
    p_every, p_half = run_json([*args, every])["params"], run_json([*args, half])["params"]
    expert = 3 * 256 * 512  # one expert's gated FFN
    router = 8 * 256
    assert p_every - p_half == pytest.approx(2 * (7 * expert + router), rel=1e-9)  # 2 layers: 8 experts -> 1 FFN
    # flex (DeepEP / HybridEP) is priced as deepep; a capacity factor below 1 drops tokens.
    flex = tmp_path / "flex.txt"
    flex.write_text(base.replace("alltoall", "flex") + " --moe-expert-capacity-factor 0.5")
    assert (read_recipe(flex)["plan"]["dispatcher"], read_recipe(flex)["plan"]["moe_imbalance"]) == ("deepep", 0.5)


@pytest.mark.parametrize(
    ("pattern", "fields"),
    [
        ("([0]+[1]*23)", {"dense_layers": 1}),
        ("[0]*3+[1]*21", {"dense_layers": 3}),
        ("[1]*24", {}),
        ("([0]*2+[1])*8", {"moe_every": 3}),
    ],
)
def test_moe_layer_patterns(tmp_path, pattern, fields):
    args = tmp_path / "p.txt"
    args.write_text(
        f"--num-layers 24 --hidden-size 256 --num-attention-heads 4 --vocab-size 1000 --num-experts 4"
        f" --moe-ffn-hidden-size 128 --moe-layer-freq {pattern}"
    )
    model = read_recipe(args)["model"]
    assert {k: model[k] for k in ("dense_layers", "moe_every") if k in model} == fields


def test_hybrid_optimizer_instances_are_the_shard_group(tmp_path):
    """--num-distributed-optimizer-instances 2 on dp*cp = 4 ranks: shard groups of 2, as --shard-group 2."""
    args = tmp_path / "hsdp.sh"
    flags = (
        "--nnodes 2 --nproc-per-node 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
        " --use-distributed-optimizer --num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008"
        " --num-attention-heads 32 --swiglu --untie-embeddings-and-output-weights --vocab-size 32000"
        " --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --bf16"
    )
    args.write_text(flags + " --num-distributed-optimizer-instances 2")
    assert read_recipe(args)["plan"]["shard_group"] == 2
    native = (
        "--gpus 16 --tp 2 --pp 2 --zero 1 --layers 32 --hidden 4096 --ffn-hidden 11008 --heads 32 --vocab 32000"
        " --micro-batch 1 --global-batch 256 --seq-len 4096 --precision bf16"
    ).split()
    by_file = run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", args])
    _same(by_file, run_json(["evaluate", "--gpu", "h100-sxm-80gb", *native, "--shard-group", "2"]))


E = "--ffn-hidden-size 64 --num-experts 8"  # an MoE model: experts and their FFN width


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (E + " --expert-model-parallel-size 8", ["--moe-token-dispatcher-type", "allgather", "default"]),
        (
            E + " --expert-model-parallel-size 8 --moe-token-dispatcher-type allgather",
            ["--moe-token-dispatcher-type", "allgather (given)"],
        ),
        (E + " --moe-token-dispatcher-type ring", ["--moe-token-dispatcher-type", "'ring'"]),
        ("--num-layers 12 " + E + " --moe-layer-freq ([1]*3+[0]*1)*3", ["--moe-layer-freq", "not modelled"]),
        ("--num-layers 12 " + E + " --moe-layer-freq [0]*3+[1]*8", ["--moe-layer-freq", "11 layers"]),
        ("--num-layers 12 " + E + " --moe-layer-freq 5", ["--moe-layer-freq", "divides"]),
        (E + " --moe-layer-freq __import__('os')", ["--moe-layer-freq", "list of 0 and 1"]),
        (E + " --moe-layer-freq [2]*4", ["--moe-layer-freq", "list of 0 and 1"]),
        ("--num-experts 8 --moe-router-topk two", ["--moe-router-topk", "positive integer"]),
        (E + " --moe-expert-capacity-factor -1", ["--moe-expert-capacity-factor", "between 0"]),
        ("--moe-router-topk 2", ["--moe-router-topk", "--num-experts"]),
        ("--num-experts 8", ["--moe-ffn-hidden-size", "FFN width", "--ffn-hidden-size"]),
        (
            "--recompute-granularity selective --recompute-modules mlp moe layernorm",
            ["--recompute-modules", "'mlp moe layernorm'", "core_attn"],
        ),
        ("--use-distributed-optimizer --num-distributed-optimizer-instances 2", ["instances", "GPU count"]),
        ("--num-distributed-optimizer-instances 2 --nnodes 1 --nproc-per-node 8", ["--use-distributed-optimizer"]),
        (
            "--use-distributed-optimizer --num-distributed-optimizer-instances 3 --nnodes 1 --nproc-per-node 8",
            ["3 must divide", "dp*cp = 8"],
        ),
    ],
)
def test_moe_argument_list_refusals(tmp_path, text, fragments):
    args = tmp_path / "bad.txt"
    args.write_text(text)
    assert_refused(args, fragments)


def test_moe_recipe_errors_reach_the_user_in_one_line(tmp_path):
    bad = tmp_path / "moe.yaml"
    bad.write_text("model:\n  ffn_hidden_size: 64\n  num_moe_experts: 8\n  moe_layer_freq: [0, 1, 0]\n")
    base = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8", "--recipe", bad]
    assert_user_error(run(base), str(bad), "model.moe_layer_freq", "not modelled")
    # Experts that the top-k exceeds: the catalog's own check, naming the field.
    topk = tmp_path / "topk.yaml"
    topk.write_text(
        "model:\n  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n  num_moe_experts: 4\n"
        "  moe_router_topk: 8\n  moe_ffn_hidden_size: 128\n  moe_token_dispatcher_type: alltoall\n"
    )
    args = ["evaluate", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8", "--vocab", "1000"]
    assert_user_error(run([*args, "--recipe", topk]), "top_k")


# Qwen3-30B-A3B as a Megatron-Bridge ConfigContainer YAML writes it (src/megatron/bridge/training/
# config.py @ 067f987df: model = Megatron-Core TransformerConfig names, train = batch sizes, ddp /
# optimizer use_distributed_optimizer, mixed_precision a training/mixed_precision.py recipe name);
# the dimensions are the catalog entry's (Qwen/Qwen3-30B-A3B config.json).
QWEN3_BRIDGE = """\
model:
  num_layers: 48
  hidden_size: 2048
  ffn_hidden_size: 6144
  num_attention_heads: 32
  num_query_groups: 4
  kv_channels: 128
  vocab_size: 151936
  gated_linear_unit: true
  share_embeddings_and_output_weights: false
  seq_length: 4096
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 2
  virtual_pipeline_model_parallel_size: 12
  context_parallel_size: 1
  expert_model_parallel_size: 8
  sequence_parallel: false
  num_moe_experts: 128
  moe_router_topk: 8
  moe_ffn_hidden_size: 768
  moe_token_dispatcher_type: alltoall
  recompute_granularity: null
train:
  micro_batch_size: 1
  global_batch_size: 512
  train_iters: 100
optimizer:
  use_distributed_optimizer: true
  lr: 3.0e-4
ddp:
  use_distributed_optimizer: true
  num_distributed_optimizer_instances: 1
mixed_precision: bf16_with_mxfp8_mixed
"""


def test_a_megatron_bridge_config_is_the_catalog_model(tmp_path):
    recipe = tmp_path / "qwen3_30b_a3b.yaml"
    recipe.write_text(QWEN3_BRIDGE)
    read = read_recipe(recipe)
    assert (read["plan"]["precision"], read["plan"]["zero"], read["plan"]["etp"]) == ("mxfp8", 1, 1)
    args = ["evaluate", "--gpu", "b200", "--gpus", "16"]
    native = (
        "--model qwen3-30b-a3b --tp 1 --pp 2 --vp 12 --ep 8 --zero 1 --no-sp --micro-batch 1 --global-batch 512"
        " --seq-len 4096 --precision mxfp8"
    ).split()
    _same(run_json([*args, "--recipe", recipe]), run_json([*args, *native]))
    # An override file gives only what it changes: the model then comes from --model.
    override = tmp_path / "override.yaml"
    override.write_text("model:\n  tensor_model_parallel_size: 2\ntrain:\n  micro_batch_size: 2\n")
    assert read_recipe(override) == {"model": {}, "plan": {"tp": 2, "micro_batch": 2}}
    override.write_text("train:\n  global_batch_size: 64\n")  # no model section at all
    assert read_recipe(override) == {"model": {}, "plan": {"global_batch": 64}}


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("model: {}\ntrain: {}\nmixed_precision: int3_mixed\n", ["mixed_precision", "bf16_mixed"]),
        ("model: {}\ntrain: {}\nddp:\n  num_distributed_optimizer_instances: 2\n", ["ddp.num_distributed", "--shard"]),
        ("model: {}\ntrain:\n  micro_batch_size: 0\n", ["train.micro_batch_size", "positive integer"]),
        ("model: {}\ntrain: []\n", ["train", "must be a section"]),
        ("model: 5\ntrain: {}\n", ["model", "must be a section"]),
        ("model: {}\ntrain: {}\noptimizer: 3\n", ["optimizer", "section"]),
        (
            "model:\n  recompute_granularity: full\n  recompute_method: block\ntrain: {}\n",
            ["model.recompute_method", "block"],
        ),
    ],
)
def test_megatron_bridge_refusals(tmp_path, text, fragments):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    assert_refused(recipe, fragments)


def test_python_api_reads_a_recipe(tmp_path):
    """hetersim.read_recipe + hetersim.evaluate: the same step as the CLI's --recipe."""
    import hetersim

    args = tmp_path / "deepseek_v3.sh"
    args.write_text(DEEPSEEK_V3)
    recipe = hetersim.read_recipe(args)
    out = hetersim.evaluate(recipe["model"], "h100-sxm-80gb", **recipe["plan"])
    cli = run_json(["evaluate", "--gpu", "h100-sxm-80gb", "--recipe", args])
    assert float(out.step_time_s) == pytest.approx(cli["step_time_s"], rel=1e-6)
    assert float(out.params) == pytest.approx(cli["params"], rel=1e-9)
