"""A DeepSpeed config (``ds_config.json``) as a recipe: its ZeRO stage, offload, batch, precision
and reduction dtype evaluate as the native flags under the ``deepspeed`` stack; what the model
cannot price (NVMe offload) or DeepSpeed itself refuses is one line naming the key."""

from __future__ import annotations

import json

import pytest

from hetersim.recipe import read_recipe
from tests.test_cli import assert_user_error, run, run_json
from tests.test_recipe_moe import assert_refused

# The ZeRO-Offload tutorial's zero_optimization (deepspeedai/DeepSpeed @ edaa72212
# docs/_tutorials/zero-offload.md, its trailing commas dropped), with the batch and fp16 of the
# 10B run its log shows.
ZERO_OFFLOAD = {
    "train_batch_size": 10,
    "train_micro_batch_size_per_gpu": 10,
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu"},
        "contiguous_gradients": True,
        "overlap_comm": True,
    },
    "fp16": {"enabled": True, "loss_scale": 0},
    "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
}
GPT2_10B = "--layers 50 --hidden 4096 --heads 32 --ffn-hidden 16384 --vocab 51200 --mlp plain --seq-len 1024".split()


def _write(tmp_path, data, name="ds_config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_zero_offload_config_evaluates_as_the_native_flags(tmp_path):
    path = _write(tmp_path, ZERO_OFFLOAD)
    plan = read_recipe(path)["plan"]
    assert plan == {
        "stack": "deepspeed",
        "global_batch": 10,
        "micro_batch": 10,
        "zero": 2,
        "offload": {"optimizer": "host-dram", "grads": "host-dram"},
        "precision": "fp16",
    }
    base = ["evaluate", "--gpu", "v100-sxm-32gb", "--gpus", "1", *GPT2_10B]
    native = "--stack deepspeed --zero 2 --offload optimizer:host-dram --offload grads:host-dram --precision fp16"
    by_file = run_json([*base, "--recipe", path])
    same = run_json([*base, *native.split(), "--micro-batch", "10", "--global-batch", "10"])
    assert by_file["plan"] == same["plan"]
    assert by_file["step_time_s"] == same["step_time_s"] and by_file["feasible"] == same["feasible"]


def test_stage3_reuse_reduction_and_hugging_face_autos(tmp_path):
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "reduce_bucket_size": "auto"},
        "communication_data_type": "fp32",
        "tensor_parallel": {"autotp_size": 2},
    }
    plan = read_recipe(_write(tmp_path, config))["plan"]
    # DeepSpeed's stage3_max_reuse_distance default, 1e9 parameters; "auto" left to the Trainer.
    assert plan == {
        "stack": "deepspeed",
        "tp": 2,
        "zero": 3,
        "offload": {"params": "host-dram"},
        "reuse_Mparams": 1000.0,
        "grad_reduce": "fp32",
    }
    plain = read_recipe(_write(tmp_path, {"train_batch_size": 8, "fp32_allreduce": True}, "p.json"))["plan"]
    assert (plain["precision"], plain["grad_reduce"]) == ("fp32", "fp32")  # nothing enabled: fp32


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}, ["offload_optimizer", "NVMe"]),
        ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, ["offload_param", "stage 3"]),
        # the sixteenth fuzz: priced as ZeRO-Offload where DeepSpeed ignores it; "yes" read as off
        ({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}, ["offload_optimizer", "1, 2"]),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, ["offload_optimizer", "stage 0"]),
        ({"train_batch_size": 8, "fp32_allreduce": "yes"}, ["fp32_allreduce", "true or false", "'yes'"]),
        ({"zero_optimization": {"stage": 4}}, ["zero_optimization.stage", "0, 1, 2 or 3"]),
        ({"zero_optimization": {"stage": "two"}}, ["zero_optimization.stage", "integer"]),
        ({"zero_optimization": []}, ["zero_optimization", "object"]),
        ({"train_batch_size": 0}, ["train_batch_size", ">= 1"]),
        ({"train_batch_size": 8, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, ["both true"]),
        ({"train_batch_size": 8, "fp16": {"enabled": "yes"}}, ["fp16.enabled", "true or false"]),
        ({"train_batch_size": 8, "communication_data_type": "int8"}, ["communication_data_type", "fp32"]),
        ({"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": -1}}, ["stage3_max_reuse_distance"]),
        ({"zero_optimization": {"stage": 1, "reduce_bucket_size": 0}}, ["reduce_bucket_size", "positive"]),
        (
            {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 5},
            ["train_batch_size 64", "gradient_accumulation_steps = 5", "DeepSpeed asserts"],
        ),
        # settled silently before: the first precision taken, every optimizer priced as Adam
        ({"bf16": {"enabled": True}, "amp": {"enabled": True}}, ["bf16.enabled and amp.enabled", "both true"]),
        (
            {"bf16": {"enabled": True}, "torch_autocast": {"enabled": True, "dtype": "float16"}},
            ["torch_autocast.dtype float16 and bf16.enabled contradict"],
        ),
        ({"train_batch_size": 8, "optimizer": {"type": "SGD"}}, ["optimizer.type 'SGD'", "Adam and AdamW"]),
        ({"lr": 1}, ["expected a DeepSpeed config"]),
        ('{"train_batch_size": 8,', ["not valid JSON"]),
    ],
)
def test_deepspeed_config_refusals(tmp_path, data, fragments):
    assert_refused(_write(tmp_path, data), fragments)


def test_deepspeed_config_errors_reach_the_user_in_one_line(tmp_path):
    path = _write(tmp_path, {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})
    args = ["evaluate", "--gpu", "a100-sxm-80gb", "--gpus", "8", "--global-batch", "8", "--model", "llama2-7b"]
    assert_user_error(run([*args, "--recipe", path]), str(path), "offload_param", "NVMe")
