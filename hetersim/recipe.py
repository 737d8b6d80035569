"""The run people already have: a NeMo recipe (YAML) or a Megatron-LM argument list, read as a
model and a plan.

:func:`read_recipe` returns ``{"model": {...}, "plan": {...}}`` keyed by this project's names
(``model_from_dims``'s arguments, the catalog's optional expert / MLA fields among them;
:mod:`hetersim.planfields` fields), holding only what the file says. Mixture-of-experts, latent
attention and multi-token prediction keys are read by :mod:`hetersim.recipe_moe`, with
Megatron-Core's defaults. Keys that change the answer and that the model cannot express
(recomputing only some layers, a dispatcher or MoE layer pattern it has no price for,
unresolved ``${...}`` interpolations) are one-line errors naming the file and key; keys with no
bearing on the cost (learning rates, data paths, logging) are ignored. ``kv_channels`` /
``--kv-channels`` is the head width (``head_dim``).

Formats, with where their keys are defined:

* **NeMo recipe** (``.yaml`` / ``.yml``): the layout of NeMo-Framework-Launcher's training configs,
  e.g. ``launcher_scripts/conf/training/llama/llama3_1_8b.yaml`` at commit dbdb2355 —
  ``trainer.num_nodes`` x ``trainer.devices`` GPUs, ``trainer.precision``, and under ``model``:
  ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
  ``virtual_pipeline_model_parallel_size``, ``context_parallel_size``, ``sequence_parallel``,
  ``micro_batch_size``, ``global_batch_size``, ``encoder_seq_length``, ``num_layers``,
  ``hidden_size``, ``ffn_hidden_size``, ``num_attention_heads``, ``num_query_groups``,
  ``kv_channels``, ``activation``, ``share_embeddings_and_output_weights``,
  ``activations_checkpoint_granularity`` / ``_method``, ``fp8``, ``expert_model_parallel_size``,
  ``expert_tensor_parallel_size``, ``optim.name`` (``distributed_fused_adam`` and
  ``mcore_distributed_optim``, as in ``conf/training/mixtral/mixtral_8x7b.yaml`` there, are the
  distributed optimizer). A file whose top level is
  ``training:`` (the launcher's group) is read inside it.
* **Megatron-Bridge config** (``.yaml`` with a ``train:`` section): the ``ConfigContainer`` layout
  of NVIDIA-NeMo/Megatron-Bridge (``src/megatron/bridge/training/config.py`` @ 067f987df), as a
  run's saved config or an override file such as ``tutorials/recipes/llama/conf/
  llama32_1b_pretrain.yaml`` there writes it. ``model`` holds Megatron-Core ``TransformerConfig``
  names (the parallel sizes, ``seq_length``, ``num_layers``, ``hidden_size``, ...,
  ``gated_linear_unit``, ``recompute_granularity`` / ``_method`` / ``_modules``, the MoE keys);
  ``train`` the batch sizes; ``optimizer`` / ``ddp`` ``use_distributed_optimizer``;
  ``mixed_precision`` a recipe name of ``training/mixed_precision.py`` there (``bf16_mixed``,
  ``bf16_with_mxfp8_mixed``, ...). It names no GPU count: give ``--gpus``. An override file gives
  only what it changes; the model then comes from ``--model``.
* **DeepSpeed config** (``.json``): ``ds_config.json``'s ZeRO stage, offload, batch sizes,
  precision and reduction dtype under the ``deepspeed`` stack (:mod:`hetersim.recipe_ds`); it
  names no model and no GPU count.
* **Megatron-LM argument list** (any other file): the ``--flag value`` arguments of
  ``pretrain_gpt.py`` as a launch script passes them (backslash continuations and ``#``
  comments allowed), with Megatron's names (``megatron/training/arguments.py``); the GPU count
  from torchrun's ``--nnodes`` x ``--nproc-per-node`` when present. Megatron's own defaults
  apply where a flag is absent: a GeLU MLP unless ``--swiglu``, tied embeddings unless
  ``--untie-embeddings-and-output-weights``, ``--num-query-groups`` read only with
  ``--group-query-attention``. ``--num-distributed-optimizer-instances N`` (with
  ``--use-distributed-optimizer``) shards the optimizer over ``dp * cp / N`` ranks
  (``megatron/core/parallel_state.py`` ``intra_partial_data_parallel_size`` @ d98e8a64dd): the
  plan's ``shard_group``, which needs the GPU count.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from . import recipe_ds, recipe_moe
from .planfields import FIELDS
from .recipe_precision import FP8_FORMATS, megatron_precision
from .types import decimal_digits

# Model dimensions: ``model_from_dims`` argument -> Megatron-LM flag (megatron/training/arguments.py).
MEGATRON_MODEL_FLAGS = {
    "layers": "--num-layers",
    "hidden": "--hidden-size",
    "heads": "--num-attention-heads",
    "kv_heads": "--num-query-groups",
    "ffn_hidden": "--ffn-hidden-size",
    "vocab": "--vocab-size",
    "head_dim": "--kv-channels",
}

# NeMo ``model.*`` keys -> plan fields / model dimensions (NeMo-Framework-Launcher training configs).
NEMO_PLAN_KEYS = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "virtual_pipeline_model_parallel_size": "vp",
    "context_parallel_size": "cp",
    "sequence_parallel": "sp",
    "micro_batch_size": "micro_batch",
    "global_batch_size": "global_batch",
    "encoder_seq_length": "seq_len",
    "activations_checkpoint_granularity": "recompute",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
}
NEMO_MODEL_KEYS = {
    "num_layers": "layers",
    "hidden_size": "hidden",
    "num_attention_heads": "heads",
    "num_query_groups": "kv_heads",
    "ffn_hidden_size": "ffn_hidden",
    "kv_channels": "head_dim",
    "vocab_size": "vocab",  # Megatron-Bridge's model provider; NeMo launcher configs name a tokenizer instead
}
# NeMo ``model.activation`` -> MLP kind: a gated MLP (three matrices) for every *GLU.
GATED_ACTIVATIONS = ("swiglu", "fast-swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu")
PLAIN_ACTIVATIONS = ("gelu", "fast-gelu", "relu", "squared-relu", "approx-gelu")
# Lightning's ``trainer.precision`` spellings -> precision.
NEMO_PRECISION = {
    "bf16": "bf16",
    "bf16-mixed": "bf16",
    "16": "fp16",
    "16-mixed": "fp16",
    "32": "fp32",
    "32-true": "fp32",
}
# Keys whose presence (with a value that turns them on) the model cannot express.
NEMO_REFUSED = {
    "num_micro_batches_with_partial_activation_checkpoints": "partial activation checkpointing is not modelled",
}


def read_recipe(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{"model": dims, "plan": fields}`` from a NeMo recipe YAML or a Megatron argument list."""
    path = Path(path)
    origin = f"recipe {path}"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        reason = "no such file" if isinstance(error, FileNotFoundError) else type(error).__name__
        hint = "give a NeMo recipe .yaml or a Megatron argument list"
        raise ValueError(f"{origin}: cannot be read ({reason}); {hint}") from None
    if path.suffix.lower() == ".json":
        return _from_deepspeed(text, origin)
    if path.suffix.lower() in (".yaml", ".yml"):
        data = _load_yaml(text, origin)
        return _from_bridge(data, origin) if "train" in data else _from_nemo(data, origin)
    return _from_megatron(text, origin)


def _from_deepspeed(text: str, origin: str) -> dict[str, dict[str, Any]]:
    import json

    from . import jsontext

    try:
        data = jsontext.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{origin}: not valid JSON ({error.msg} at line {error.lineno})") from None
    if not recipe_ds.looks_like(data):
        keys = ", ".join(sorted(recipe_ds.DS_KEYS))
        raise ValueError(f"{origin}: expected a DeepSpeed config (a JSON object with any of {keys})")
    return recipe_ds.read(data, origin)


def _fail(origin: str, key: str, message: str) -> ValueError:
    return ValueError(f"{origin}: {key}: {message}")


# --------------------------------------------------------------------------------------------
# NeMo YAML
# --------------------------------------------------------------------------------------------


def _strict_loader():
    """PyYAML's safe loader, refusing what YAML 1.1 reads otherwise than a reader expects: a key
    given twice in one mapping (the last was taken) and integers written in base 8 (``010`` read as
    8) or base 60 (``1:00`` read as 60); YAML 1.2 reads these as the decimal 10 and text."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    line = key_node.start_mark.line + 1
                    raise yaml.constructor.ConstructorError(None, None, f"{key!r} given twice (line {line})")
                seen[key] = 1
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node):
            text = str(node.value).replace("_", "")
            if ":" in text or re.fullmatch(r"[-+]?0[0-7]+", text):
                base = "base 60" if ":" in text else "base 8"
                raise yaml.constructor.ConstructorError(
                    None, None, f"{node.value!r} is a YAML 1.1 {base} number; write it in decimal", node.start_mark
                )
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    Loader.add_constructor("tag:yaml.org,2002:map", Loader.construct_yaml_map)
    return Loader


def _load_yaml(text: str, origin: str) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.constructor.ConstructorError as error:
        raise ValueError(f"{origin}: {error.problem}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{origin}: not valid YAML{where}") from None
    if isinstance(data, dict) and "model" not in data and isinstance(data.get("training"), dict):
        data = data["training"]
    if isinstance(data, dict) and "train" in data:
        return data  # a Megatron-Bridge ConfigContainer: its sections are checked where they are read
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ValueError(
            f"{origin}: expected a NeMo training config with a 'model' section (and 'trainer'), "
            "or a Megatron-Bridge config with 'model' and 'train'"
        )
    return data


def _value(origin: str, key: str, value: Any, kind: str) -> Any:
    """A recipe value checked for its kind (``int``, ``bool``, ``str``); ``${...}`` is refused."""
    if isinstance(value, str) and "${" in value:
        raise _fail(origin, key, f"interpolation {value!r} is not resolved here; write the value")
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool) and value > 0,
        "bool": isinstance(value, bool),
        "str": isinstance(value, str | int) and not isinstance(value, bool),
    }[kind]
    if not ok:
        wanted = {"int": "a positive integer", "bool": "true or false", "str": "a name"}[kind]
        raise _fail(origin, key, f"must be {wanted}; got {value!r}")
    return value


def _from_nemo(data: dict[str, Any], origin: str) -> dict[str, dict[str, Any]]:
    m = data["model"]
    plan = _plan_values(origin, ((f"model.{key}", m.get(key), field) for key, field in NEMO_PLAN_KEYS.items()))
    if "seq_len" not in plan and isinstance(m.get("data"), dict) and m["data"].get("seq_length") is not None:
        plan["seq_len"] = _value(origin, "model.data.seq_length", m["data"]["seq_length"], "int")
    keys = ("model.activations_checkpoint_granularity", "model.activations_checkpoint_method")
    _check_recompute(origin, plan.get("recompute"), m.get("activations_checkpoint_method"), keys)
    _nemo_refusals(m, origin)
    _nemo_hardware(data, m, plan, origin)
    return _with_moe(_config_reader(origin, m), _config_model(m, origin), plan)


def _plan_values(origin: str, found) -> dict[str, Any]:
    """Plan fields from ``(key as the file names it, raw value, field)`` triples, absent values
    skipped, each checked for its kind (``sp`` a boolean, ``recompute`` a name, the rest counts)."""
    plan: dict[str, Any] = {}
    for key, raw, field in found:
        if raw is not None:
            kind = "bool" if field == "sp" else "str" if field == "recompute" else "int"
            plan[field] = _value(origin, key, raw, kind)
    return plan


def _config_reader(origin: str, m: dict[str, Any]) -> recipe_moe.Reader:
    """The expert keys of a config's ``model`` section (NeMo and Megatron-Bridge share the names)."""
    return recipe_moe.Reader(origin, lambda key, _flag: (f"model.{key}", m[key]) if key in m else None, "config")


def _with_moe(reader: recipe_moe.Reader, model: dict[str, Any], plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The file's expert / MLA / MTP model fields and expert plan fields added to its dense ones."""
    extra = recipe_moe.model_fields(reader, model)
    plan.update(recipe_moe.plan_fields(reader, plan, extra.get("n_experts", 0) > 1))
    return {"model": {**model, **extra}, "plan": plan}


def _check_recompute(origin: str, granularity: Any, method: Any, keys: tuple[str, str]) -> None:
    """The recomputation a file gives: selective, full or none; full on only some layers (the
    ``block`` method) is not modelled. ``keys``: how the file names granularity and method."""
    if granularity is not None and granularity not in ("selective", "full"):
        raise _fail(origin, keys[0], f"must be selective or full; got {granularity!r}")
    if granularity == "full" and method == "block":
        raise _fail(origin, keys[1], "block (only some layers recomputed) is not modelled; use uniform")


def _nemo_refusals(m: dict[str, Any], origin: str) -> None:
    for key, why in NEMO_REFUSED.items():
        value = m.get(key)
        if value not in (None, 0, 1, False):
            raise _fail(origin, f"model.{key}", f"{value!r}: {why}")


def _nemo_hardware(data: dict[str, Any], m: dict[str, Any], plan: dict[str, Any], origin: str) -> None:
    """GPUs (nodes x devices per node), precision and the distributed optimizer."""
    trainer = data.get("trainer") or {}
    if trainer.get("num_nodes") is not None and trainer.get("devices") is not None:
        nodes = _value(origin, "trainer.num_nodes", trainer["num_nodes"], "int")
        plan["n_gpus"] = nodes * _value(origin, "trainer.devices", trainer["devices"], "int")
    precision = trainer.get("precision")
    if precision is not None:
        name = str(_value(origin, "trainer.precision", precision, "str"))
        if name not in NEMO_PRECISION:
            raise _fail(origin, "trainer.precision", f"must be one of {', '.join(NEMO_PRECISION)}; got {precision!r}")
        plan["precision"] = NEMO_PRECISION[name]
    if m.get("fp8") is not None and _value(origin, "model.fp8", m["fp8"], "bool"):
        plan["precision"] = "fp8"
    optim = {} if m.get("optim") is None else m["optim"]
    if not isinstance(optim, dict):
        raise _fail(origin, "model.optim", f"must be a section of keys (name: ...); got {optim!r}")
    name = optim.get("name")  # NeMo's optimizer registry (nemo/core/optim/optimizers.py); the model prices Adam
    if name is not None and not (isinstance(name, str) and ("adam" in name or name == "mcore_distributed_optim")):
        raise _fail(origin, "model.optim.name", f"must be an Adam optimizer (adam, fused_adam, ...); got {name!r}")
    if name in ("distributed_fused_adam", "mcore_distributed_optim"):
        plan["zero"] = 1  # the distributed optimizer: optimizer states sharded over DP (ZeRO-1)


def _config_model(m: dict[str, Any], origin: str) -> dict[str, Any]:
    """The dense dimensions of a config's ``model`` section (NeMo's keys; Megatron-Bridge's
    TransformerConfig uses the same names)."""
    model = {
        dim: _value(origin, f"model.{key}", m[key], "int")
        for key, dim in NEMO_MODEL_KEYS.items()
        if m.get(key) is not None
    }
    activation = m.get("activation")
    if activation is not None:
        if activation not in GATED_ACTIVATIONS + PLAIN_ACTIVATIONS:
            allowed = ", ".join(GATED_ACTIVATIONS + PLAIN_ACTIVATIONS)
            raise _fail(origin, "model.activation", f"must be one of {allowed}; got {activation!r}")
        model["mlp"] = "gated" if activation in GATED_ACTIVATIONS else "plain"
    if m.get("share_embeddings_and_output_weights") is not None:
        model["tied_embeddings"] = _value(
            origin, "model.share_embeddings_and_output_weights", m["share_embeddings_and_output_weights"], "bool"
        )
    return model


# --------------------------------------------------------------------------------------------
# Megatron-Bridge ConfigContainer YAML
# --------------------------------------------------------------------------------------------

# (section, key) -> plan field: ``model`` in Megatron-Core TransformerConfig / ModelParallelConfig
# names, ``train`` Megatron-Bridge's TrainingConfig.
BRIDGE_PLAN_KEYS = {
    ("model", "tensor_model_parallel_size"): "tp",
    ("model", "pipeline_model_parallel_size"): "pp",
    ("model", "virtual_pipeline_model_parallel_size"): "vp",
    ("model", "context_parallel_size"): "cp",
    ("model", "expert_model_parallel_size"): "ep",
    ("model", "expert_tensor_parallel_size"): "etp",
    ("model", "sequence_parallel"): "sp",
    ("model", "seq_length"): "seq_len",
    ("model", "recompute_granularity"): "recompute",
    ("train", "micro_batch_size"): "micro_batch",
    ("train", "global_batch_size"): "global_batch",
}
# Megatron-Bridge's mixed-precision recipes (training/mixed_precision.py @ 067f987df): the GEMM
# precision each name runs, read from its name (bf16_with_mxfp8_mixed -> mxfp8, ...).
BRIDGE_PRECISION_WORDS = (("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("fp8", "fp8"), ("bf16", "bf16"), ("fp16", "fp16"))


def _from_bridge(data: dict[str, Any], origin: str) -> dict[str, dict[str, Any]]:
    names = ("model", "train", "optimizer", "ddp", "dataset")
    sections = {name: {} if data.get(name) is None else data[name] for name in names}
    for name, section in sections.items():
        if not isinstance(section, dict):
            raise _fail(origin, name, f"must be a section of keys; got {section!r}")
    m = sections["model"]
    found = ((f"{sec}.{key}", sections[sec].get(key), field) for (sec, key), field in BRIDGE_PLAN_KEYS.items())
    plan = _plan_values(origin, found)
    if sections["dataset"].get("seq_length") is not None:
        seq = _value(origin, "dataset.seq_length", sections["dataset"]["seq_length"], "int")
        if plan.setdefault("seq_len", seq) != seq:
            raise _fail(origin, "dataset.seq_length", f"{seq} and model.seq_length {plan['seq_len']} contradict")
    keys = ("model.recompute_granularity", "model.recompute_method")
    _check_recompute(origin, plan.get("recompute"), m.get("recompute_method"), keys)
    distributed = {
        f"{sec}.use_distributed_optimizer": _value(origin, f"{sec}.use_distributed_optimizer", value, "bool")
        for sec in ("optimizer", "ddp")
        if (value := sections[sec].get("use_distributed_optimizer")) is not None
    }
    if len(set(distributed.values())) > 1:
        raise _fail(origin, " and ".join(distributed), "contradict (one true, one false)")
    if any(distributed.values()):
        plan["zero"] = 1
    instances = sections["ddp"].get("num_distributed_optimizer_instances")
    if instances not in (None, 1):
        raise _fail(
            origin, "ddp.num_distributed_optimizer_instances", "the file names no GPU count; give --shard-group"
        )
    plan.update(_bridge_precision(data, m, origin))
    model = _config_model(m, origin)
    if m.get("gated_linear_unit") is not None:  # TransformerConfig's switch in place of NeMo's activation name
        model["mlp"] = "gated" if _value(origin, "model.gated_linear_unit", m["gated_linear_unit"], "bool") else "plain"
    return _with_moe(_config_reader(origin, m), model, plan)


def _bridge_precision(data: dict[str, Any], m: dict[str, Any], origin: str) -> dict[str, str]:
    """``mixed_precision`` (a recipe name), else the model's ``fp4`` / ``fp8`` (with ``fp8_recipe``),
    ``bf16`` and ``fp16`` switches. A file with both runs the recipe's: Megatron-Bridge copies its
    fields over the model's (``update_config_with_precision_overrides``, NVIDIA-NeMo/Megatron-Bridge
    @ 067f987df src/megatron/bridge/training/mixed_precision.py l.148-156)."""
    name = data.get("mixed_precision")
    if isinstance(name, str):
        for word, precision in BRIDGE_PRECISION_WORDS:
            if word in name.replace("-", "_").split("_"):
                return {"precision": precision}
        raise _fail(
            origin, "mixed_precision", f"{name!r}: expected a recipe such as bf16_mixed or bf16_with_mxfp8_mixed"
        )
    if name is not None and not isinstance(name, dict):
        raise _fail(origin, "mixed_precision", f"must be a recipe name or a section; got {name!r}")
    if _format_switch(m, "fp4", origin):
        return {"precision": "nvfp4"}
    if _format_switch(m, "fp8", origin):
        return {"precision": "mxfp8" if m.get("fp8_recipe") == "mxfp8" else "fp8"}
    for key in ("bf16", "fp16"):
        if m.get(key) is not None and _value(origin, f"model.{key}", m[key], "bool"):
            return {"precision": key}
    return {}


def _format_switch(m: dict[str, Any], key: str, origin: str) -> bool:
    """Whether TransformerConfig's ``fp8`` / ``fp4`` is on: a format name (fp8: ``e4m3``, ``hybrid``)
    or true; null or false is off. Text that reads as a yes or no is refused, never taken as on."""
    value = m.get(key)
    if value is None or value is False:
        return False
    fp8_name = key != "fp8" or not isinstance(value, str) or value.strip().lower() in FP8_FORMATS
    if value is True or (isinstance(value, str) and value.strip().lower() not in _YES_NO and fp8_name):
        return True
    raise _fail(
        origin, f"model.{key}", f"must be a format name (fp8: e4m3 or hybrid), true, false or null; got {value!r}"
    )


_YES_NO = frozenset({"true", "false", "yes", "no", "on", "off", "0", "1", "none", "null", ""})


# --------------------------------------------------------------------------------------------
# Megatron argument list
# --------------------------------------------------------------------------------------------

# Megatron flag -> plan field, from the registry's aliases (value-taking flags and booleans).
_PLAN_FLAGS = {alias: f for f in FIELDS for alias in f.aliases}
_SWITCH_FLAGS = {flag: (f, value) for f in FIELDS for flag, value in f.switches}
_MODEL_FLAGS = {flag: dim for dim, flag in MEGATRON_MODEL_FLAGS.items()}
# Flags whose value is a list (nargs='+' in megatron/training/arguments.py): their words are joined.
_LIST_FLAGS = frozenset({"--recompute-modules"})


# Megatron's value-less switches this reader looks at (``action='store_true'`` in
# megatron/training/arguments.py): argparse refuses a value after one, so a file that gives one is
# refused rather than read as the switch given (``--sequence-parallel false`` turned it on).
_VALUELESS = frozenset(
    {*_SWITCH_FLAGS, *(a for a, f in _PLAN_FLAGS.items() if f.kind == "bool")}
    | {"--swiglu", "--untie-embeddings-and-output-weights", "--group-query-attention", "--bf16", "--fp16"}
    | {"--multi-latent-attention", "--overlap-moe-expert-parallel-comm", "--moe-pad-expert-input-to-capacity"}
)


def _words(text: str, origin: str) -> list[str]:
    """The shell words of an argument list, as bash splits them: backslash continuations joined, a
    ``#`` that begins a word outside quotes comments out the rest of its line (``a#b`` is one word)."""
    words: list[str] = []
    for number, line in enumerate(text.removeprefix("\ufeff").replace("\\\n", " ").splitlines(), 1):
        try:
            words += shlex.split(_uncommented(line))
        except ValueError as error:  # shlex: an unclosed quote
            raise ValueError(f"{origin}: line {number}: {error} (quotes do not span lines here)") from None
    return words


def _uncommented(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes."""
    quote, escaped = "", False
    for at, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (at == 0 or line[at - 1].isspace()):
            return line[:at]
    return line


def _arguments(text: str, origin: str = "recipe") -> dict[str, str | None]:
    """``--flag value`` / ``--flag=value`` / value-less ``--flag`` pairs of an argument list; a flag
    given twice with two values (argparse takes the last) and a value after a switch are refused."""
    tokens = _words(text, origin)
    args: dict[str, str | None] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            continue
        flag, eq, value = token.partition("=")
        name = flag.replace("_", "-")
        follows = not eq and i < len(tokens) and not tokens[i].startswith("--")
        if name in _VALUELESS and (eq or follows):  # argparse: "unrecognized arguments"
            raise _fail(origin, flag, f"is a switch and takes no value; got {value if eq else tokens[i]!r}")
        if follows:
            value, i = tokens[i], i + 1
            while name in _LIST_FLAGS and i < len(tokens) and not tokens[i].startswith("--"):
                value, i = f"{value} {tokens[i]}", i + 1
        given = value if (eq or value) else None
        if name in args and args[name] != given:
            raise _fail(origin, flag, f"given twice, {args[name]!r} and {given!r}; give it once")
        args[name] = given
    return args


def _int_arg(origin: str, flag: str, value: str | None) -> int:
    if value is None or not decimal_digits(value) or int(value) <= 0:
        raise _fail(origin, flag, f"must be a positive integer; got {value!r}")
    return int(value)


def _from_megatron(text: str, origin: str) -> dict[str, dict[str, Any]]:
    args = _arguments(text, origin)
    if not args:
        raise ValueError(f"{origin}: no --flag arguments found; give a Megatron argument list or a NeMo recipe .yaml")
    plan: dict[str, Any] = {}
    for flag, value in args.items():
        if flag in _PLAN_FLAGS:
            f = _PLAN_FLAGS[flag]
            plan[f.name] = True if f.kind == "bool" else value if f.kind == "choice" else _int_arg(origin, flag, value)
        elif flag in _SWITCH_FLAGS:
            f, fixed = _SWITCH_FLAGS[flag]
            plan[f.name] = fixed
    keys = ("--recompute-granularity", "--recompute-method")
    _check_recompute(origin, plan.get("recompute"), args.get("--recompute-method"), keys)
    if "--nnodes" in args and "--nproc-per-node" in args:
        plan["n_gpus"] = _int_arg(origin, "--nnodes", args["--nnodes"]) * _int_arg(
            origin, "--nproc-per-node", args["--nproc-per-node"]
        )
    plan.update(megatron_precision(args, origin))
    _shard_group(args, plan, origin)
    reader = recipe_moe.Reader(origin, lambda _key, flag: (flag, args[flag]) if flag in args else None, "flags")
    model = _megatron_model(args, origin)
    _virtual_stages(args, plan, model, origin)
    return _with_moe(reader, model, plan)


_VP_FLAGS = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")


def _virtual_stages(args: dict[str, str | None], plan: dict[str, Any], model: dict[str, Any], origin: str) -> None:
    """Megatron-LM's interleaving flags (megatron/training/arguments.py, NVIDIA/Megatron-LM @
    c550cf6c41 l.495-545): ``--num-virtual-stages-per-pipeline-rank N`` is vp N;
    ``--num-layers-per-virtual-pipeline-stage N`` is vp = layers / pp / N (the embedding and the
    loss each one layer more under --account-for-embedding/loss-in-pipeline-split), the layers of a
    stage divisible by N; no more than one of them (or --virtual-pipeline-model-parallel-size)."""
    given = [f for f in (*_VP_FLAGS, "--virtual-pipeline-model-parallel-size") if f in args]
    if len(given) > 1:
        raise _fail(origin, " ".join(given), "each sets the virtual pipeline stages; give one of them")
    if given == [_VP_FLAGS[1]]:
        plan["vp"] = _int_arg(origin, given[0], args[given[0]])
    elif given == [_VP_FLAGS[0]]:
        per, pp = _int_arg(origin, given[0], args[given[0]]), int(plan.get("pp", 1))
        if "layers" not in model:
            raise _fail(origin, given[0], "needs --num-layers (the virtual stages are its layers over pp)")
        extra = ("--account-for-embedding-in-pipeline-split" in args) + ("--account-for-loss-in-pipeline-split" in args)
        layers = model["layers"] + extra
        if layers % pp or (layers // pp) % per:
            what = f"{layers} layers over --pipeline-model-parallel-size {pp}"
            raise _fail(origin, given[0], f"{per} must divide the layers of a stage ({what}; Megatron-LM asserts it)")
        plan["vp"] = layers // pp // per


def _shard_group(args: dict[str, str | None], plan: dict[str, Any], origin: str) -> None:
    """``--num-distributed-optimizer-instances N``: the optimizer sharded over ``dp * cp / N`` ranks."""
    flag = "--num-distributed-optimizer-instances"
    if flag not in args:
        return
    instances = _int_arg(origin, flag, args[flag])
    if instances == 1:
        return
    if plan.get("zero") != 1:
        raise _fail(origin, flag, "needs --use-distributed-optimizer (the instances are its copies)")
    if "n_gpus" not in plan:
        raise _fail(origin, flag, "needs the GPU count (--nnodes and --nproc-per-node) to size each instance")
    ranks = plan["n_gpus"] // (plan.get("tp", 1) * plan.get("pp", 1))  # dp * cp
    if plan["n_gpus"] % (plan.get("tp", 1) * plan.get("pp", 1)) or ranks % instances:
        raise _fail(origin, flag, f"{instances} must divide the data-parallel ranks dp*cp = {ranks}")
    plan["shard_group"] = ranks // instances


def _megatron_model(args: dict[str, str | None], origin: str) -> dict[str, Any]:
    model = {dim: _int_arg(origin, flag, args[flag]) for flag, dim in _MODEL_FLAGS.items() if flag in args}
    if "--group-query-attention" not in args:
        model.pop("kv_heads", None)  # Megatron reads --num-query-groups only with --group-query-attention
    if model:
        model["mlp"] = "gated" if "--swiglu" in args else "plain"
        model["tied_embeddings"] = "--untie-embeddings-and-output-weights" not in args
    return model
