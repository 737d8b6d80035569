"""A DeepSpeed config (``ds_config.json``) read as a plan (:mod:`hetersim.recipe`): the run's
ZeRO stage, offload, batch, precision and reduction settings, priced under the ``deepspeed``
stack profile. Keys as deepspeedai/DeepSpeed @ edaa72212 ``docs/_pages/config-json.md`` defines
them:

* ``train_batch_size`` is the global batch and ``train_micro_batch_size_per_gpu`` the micro-batch;
  ``gradient_accumulation_steps`` follows from them and the layout (DeepSpeed asserts
  ``train_batch_size = micro x steps x data-parallel ranks``): a file whose three admit no whole
  number of ranks is refused. Once the layout is known (``dse.cli.options.apply_recipe``), the ones
  the file leaves out follow from the others as DeepSpeed sets them (``deepspeed/runtime/config.py``
  ``_set_batch_related_parameters``: accumulation 1 when only one is given) and all three must
  agree with the data-parallel ranks; the file's ``gradient_accumulation_steps`` is returned as
  ``accumulation`` for it.
* ``zero_optimization.stage``; ``offload_optimizer.device: cpu`` (stage 1-3: stage 0, DeepSpeed's
  default, runs no ZeRO optimizer, so DeepSpeed ignores it: refused) is ZeRO-Offload: the optimizer
  states and the gradients live in host DRAM and the step runs on the CPU (DeepSpeed CPU-Adam);
  ``offload_param.device: cpu`` (stage 3) adds the weights; ``nvme`` (ZeRO-Infinity's NVMe tier) is
  refused: the model has no NVMe offload tier. ``stage3_max_reuse_distance`` (default 1e9) is the
  plan's ``reuse_Mparams``; ``reduce_bucket_size`` its ``bucket_Mparams``.
* Precision: ``bf16.enabled``, ``fp16.enabled`` (also ``amp`` and ``torch_autocast`` with its
  ``dtype``); none enabled is fp32, as DeepSpeed then trains. ``msamp.enabled`` (MS-AMP inside the
  DeepSpeed engine, ``opt_level`` O1, O2 or O3: azure.github.io/MS-AMP/docs/user-tutorial/usage,
  "Usage in DeepSpeed") runs the GEMMs in FP8 on top of them: ``fp8``. ``communication_data_type: fp32`` or
  ``fp32_allreduce: true`` (a boolean: DeepSpeed takes any truthy value) reduces gradients in fp32
  (``grad_reduce``).
* ``tensor_parallel.autotp_size`` (AutoTP) is the tensor-parallel size.
* ``"auto"`` (Hugging Face Trainer's placeholder, filled from its own arguments) is read as absent.
"""

from __future__ import annotations

from typing import Any

from .types import whole_number

DS_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_optimization",
        "fp16",
        "bf16",
        "optimizer",
    }
)
REUSE_DEFAULT = 1e9  # stage3_max_reuse_distance (config-json.md)
OFFLOADED = {"offload_optimizer": ("optimizer", "grads"), "offload_param": ("params",)}


def looks_like(data: Any) -> bool:
    """A JSON object with any of DeepSpeed's top-level keys."""
    return isinstance(data, dict) and bool(DS_KEYS & set(data))


def read(data: dict[str, Any], origin: str) -> dict[str, dict[str, Any]]:
    """``{"model": {}, "plan": {...}}`` from a DeepSpeed config (a config names no model)."""
    plan: dict[str, Any] = {"stack": "deepspeed"}
    for key, field in (("train_batch_size", "global_batch"), ("train_micro_batch_size_per_gpu", "micro_batch")):
        value = _count(data, key, origin)
        if value is not None:
            plan[field] = value
    steps = _count(data, "gradient_accumulation_steps", origin)
    if steps is not None and {"global_batch", "micro_batch"} <= set(plan):
        # DeepSpeed asserts train_batch_size = micro x steps x data-parallel ranks; the ranks come from
        # the layout (--gpus, --tp, --pp), so only whether any whole number of them fits is checked.
        per_rank = plan["micro_batch"] * steps
        if plan["global_batch"] % per_rank:
            raise ValueError(
                f"{origin}: train_batch_size {plan['global_batch']} is not train_micro_batch_size_per_gpu x "
                f"gradient_accumulation_steps = {per_rank} x the data-parallel ranks (DeepSpeed asserts it)"
            )
    tp = _count(_section(data, "tensor_parallel", origin), "autotp_size", origin, "tensor_parallel.")
    if tp is not None:
        plan["tp"] = tp
    plan.update(_zero(_section(data, "zero_optimization", origin), origin))
    plan.update(_precision(data, origin))
    _check_optimizer(_section(data, "optimizer", origin), origin)
    comm = _given(data.get("communication_data_type"))
    if comm is not None and comm not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"{origin}: communication_data_type: must be fp32, fp16 or bf16; got {comm!r}")
    fp32 = _given(data.get("fp32_allreduce"))
    if fp32 is not None and not isinstance(fp32, bool):  # DeepSpeed takes any truthy value: "no" would be on
        raise ValueError(f"{origin}: fp32_allreduce: must be true or false; got {fp32!r}")
    if comm == "fp32" or fp32 is True:
        plan["grad_reduce"] = "fp32"
    elif comm is not None:
        plan["grad_reduce"] = "model"
    return {"model": {}, "plan": plan, "accumulation": steps}


def _given(value: Any) -> Any:
    return None if value == "auto" else value


def _section(data: dict[str, Any], key: str, origin: str, prefix: str = "") -> dict[str, Any]:
    value = _given(data.get(key))
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{origin}: {prefix}{key}: must be an object of settings; got {value!r}")
    return value


def _count(data: dict[str, Any], key: str, origin: str, prefix: str = "", lo: int = 1) -> int | None:
    value = _given(data.get(key))
    if value is None:
        return None
    if not whole_number(value, lo):
        raise ValueError(f"{origin}: {prefix}{key}: must be an integer >= {lo}; got {value!r}")
    return int(value)


def _zero(z: dict[str, Any], origin: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    stage = _count(z, "stage", origin, "zero_optimization.", lo=0)
    if stage is not None:
        if stage > 3:
            raise ValueError(f"{origin}: zero_optimization.stage: must be 0, 1, 2 or 3; got {stage}")
        out["zero"] = stage
    offload: dict[str, str] = {}
    for key, states in OFFLOADED.items():
        device = _given(_section(z, key, origin, "zero_optimization.").get("device"))
        if device in (None, "none"):
            continue
        if device != "cpu":
            why = "NVMe offload (ZeRO-Infinity) is not modelled" if device == "nvme" else "expected cpu, nvme or none"
            raise ValueError(f"{origin}: zero_optimization.{key}.device: {device!r}: {why}")
        if key == "offload_param" and out.get("zero") != 3:
            raise ValueError(f"{origin}: zero_optimization.offload_param: needs stage 3 (DeepSpeed asserts it)")
        if not out.get("zero"):  # stage 0 (DeepSpeed's default) has no ZeRO optimizer to offload: ignored there
            raise ValueError(
                f"{origin}: zero_optimization.offload_optimizer: needs stage 1, 2 or 3 (at stage 0 DeepSpeed "
                "runs no ZeRO optimizer and ignores it)"
            )
        offload.update(dict.fromkeys(states, "host-dram"))
    if offload:
        out["offload"] = offload
    if out.get("zero") == 3:
        reuse = _given(z.get("stage3_max_reuse_distance", REUSE_DEFAULT))
        out["reuse_Mparams"] = _megaparams(reuse, origin, "zero_optimization.stage3_max_reuse_distance")
    bucket = _given(z.get("reduce_bucket_size"))
    if bucket is not None:
        out["bucket_Mparams"] = _megaparams(bucket, origin, "zero_optimization.reduce_bucket_size", positive=True)
    return out


def _megaparams(value: Any, origin: str, key: str, positive: bool = False) -> float:
    """Parameters as millions (a reuse distance may be 0, nothing kept; a bucket must be positive)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e15
    if not ok or (positive and value == 0):
        raise ValueError(
            f"{origin}: {key}: must be a {'positive ' if positive else ''}number of parameters; got {value!r}"
        )
    return float(value) / 1e6


def _precision(data: dict[str, Any], origin: str) -> dict[str, str]:
    enabled = {}
    for key in ("bf16", "fp16", "amp", "torch_autocast"):
        flag = _given(_section(data, key, origin).get("enabled", False))
        if flag is None:
            return {}  # "auto": Hugging Face Trainer decides
        if not isinstance(flag, bool):
            raise ValueError(f"{origin}: {key}.enabled: must be true or false; got {flag!r}")
        enabled[key] = flag
    both = [k for k in ("bf16", "fp16", "amp") if enabled[k]]
    if len(both) > 1:
        raise ValueError(f"{origin}: {both[0]}.enabled and {both[1]}.enabled: both true; DeepSpeed takes one")
    msamp = _section(data, "msamp", origin)
    on = _given(msamp.get("enabled", False))
    if on is not None and not isinstance(on, bool):
        raise ValueError(f"{origin}: msamp.enabled: must be true or false; got {on!r}")
    if on and msamp.get("opt_level", "O1") not in ("O1", "O2", "O3"):
        raise ValueError(f"{origin}: msamp.opt_level: must be O1, O2 or O3; got {msamp['opt_level']!r}")
    if on:
        return {"precision": "fp8"}
    if enabled["torch_autocast"]:
        dtype = data["torch_autocast"].get("dtype", "bfloat16")
        if dtype not in ("bfloat16", "float16"):
            raise ValueError(f"{origin}: torch_autocast.dtype: must be bfloat16 or float16; got {dtype!r}")
        precision = "bf16" if dtype == "bfloat16" else "fp16"
        if both and both[0] != precision:
            raise ValueError(f"{origin}: torch_autocast.dtype {dtype} and {both[0]}.enabled contradict each other")
        return {"precision": precision}
    if enabled["bf16"]:
        return {"precision": "bf16"}
    return {"precision": "fp16" if enabled["fp16"] or enabled["amp"] else "fp32"}


# DeepSpeed optimizer types whose states the model prices (Adam's two moments beside an fp32
# master): Adam and AdamW. The others DeepSpeed takes (deepspeedai/DeepSpeed docs/_pages/config-json.md,
# "optimizer": OneBitAdam, ZeroOneAdam, Lamb, OneBitLamb, Lion, MuAdam, MuSGD) keep other states.
ADAM_TYPES = frozenset({"adam", "adamw"})


def _check_optimizer(optimizer: dict[str, Any], origin: str) -> None:
    kind = _given(optimizer.get("type"))
    if kind is not None and str(kind).lower() not in ADAM_TYPES:
        raise ValueError(f"{origin}: optimizer.type {kind!r}: only Adam and AdamW are modelled (their states)")
