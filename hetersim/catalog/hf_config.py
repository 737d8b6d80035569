"""Model entries from Hugging Face ``config.json`` files and Hub model ids. Each model field is read
from one key of the file, and an error about it names that key, as the file writes it."""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from .. import jsontext
from ..types import whole_number
from .check import _check_complete, _check_entry, _fail, _parse_fragment, _parse_value, read_document
from .schema import _POSITIVE, _SCHEMA, MAX_COUNT, Entry, _Field, _is_number, _number


def _validated_model(origin: str, key: str, entry: Entry) -> Entry:
    parsed = _parse_fragment(origin, "models", key, entry)
    _check_complete(origin, "models", key, parsed)
    _check_entry(origin, "models", key, parsed)
    return parsed


def _read_json(path: Path, origin: str) -> dict[str, Any]:
    hint = "a Hugging Face config.json file"
    data = read_document(path, origin, "JSON", jsontext.loads, json.JSONDecodeError, hint)
    if not isinstance(data, dict):
        raise _fail(origin, f"must hold a JSON object, got {type(data).__name__}")
    return data


# Architectures whose MLP is gated (three matrices: gate, up, down) whatever the activation:
# SwiGLU in Llama/Mistral/Qwen2, GeGLU in Gemma (its `hidden_act`/`hidden_activation` is a GeLU;
# transformers' GemmaMLP is `down(act(gate(x)) * up(x))`). Elsewhere a SiLU/SwiGLU activation
# marks a gated MLP.
_GATED_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "gemma",
        "gemma2",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "qwen3",
        "deepseek_v2",
        "deepseek_v3",
        "kimi_k2",
        "gpt_oss",
        "llama4_text",
    }
)
_GATED_ACTIVATIONS = frozenset({"silu", "swiglu"})
# The activations a config may name: transformers' ACT2CLS (5.25, activations.py) and "swiglu",
# which marks a gated MLP above. Any other name is a typo the reader cannot price (gated or not).
_ACTIVATIONS = _GATED_ACTIVATIONS | frozenset(
    "gelu gelu_10 gelu_fast gelu_new gelu_python gelu_pytorch_tanh gelu_python_tanh gelu_accurate hardswish "
    "laplace leaky_relu linear mish quick_gelu relu relu2 relu6 sigmoid sqrtsoftplus swish tanh prelu xielu".split()
)
# `tie_word_embeddings` where a config leaves it out: the transformers config class's default
# (LlamaConfig, MistralConfig, Qwen2Config: False; GemmaConfig, Gemma2Config, GPT2Config: True).
_TIED_BY_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "gemma": True, "gemma2": True}
# Training context where a config gives only the longest context it serves: the config's
# `rope_scaling.original_max_position_embeddings` (the pre-training context before RoPE scaling,
# Llama-3.1: 8192), else `max_position_embeddings` up to this cap. Llama 3 pre-trains at 8K tokens
# and adds long context in a final stage (arXiv 2407.21783 Sec. 3.4); pass --seq-len for another.
HF_TRAINING_SEQ_LEN_CAP = 8192
# Keys of mixture-of-experts configs (Mixtral, Qwen2-MoE, DeepSeek): the expert count.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# Keys of the experts each token is routed to (GPT-OSS writes both).
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")
HF_EXTRA = "pip install 'hetersim[hf]'"


@dataclass
class _Reader:
    """A config's values as the model reads them, and the file's key each model field was read
    from (``prefix``: the table that holds them, ``text_config.`` in Llama 4): what errors name."""

    config: dict[str, Any]
    origin: str
    prefix: str = ""
    keys: dict[str, str] = field(default_factory=dict)

    def __call__(self, *names: str, default: Any = None, to: str | None = None) -> Any:
        """The first of `names` set in the config (noted as model field `to`), else `default`;
        neither is an error."""
        for key in names:
            if self.config.get(key) is not None:
                self.note(to, key)
                return self.config[key]
        if default is None:
            raise self.fail(f"missing {' or '.join(repr(self.prefix + k) for k in names)}")
        return default

    def note(self, to: str | None, key: str) -> None:
        if to is not None:
            self.keys[to] = self.prefix + key

    def fail(self, message: str) -> ValueError:
        return _fail(self.origin, message)


def model_from_hf_config(path: str | Path) -> Entry:
    """A validated model entry from a Hugging Face ``config.json`` (or a folder holding one):
    Llama/Mistral/Qwen2/Gemma or GPT-2 style keys; ``head_dim`` where a config sets it; the
    training context as :data:`HF_TRAINING_SEQ_LEN_CAP` says; the experts, latent attention,
    multi-token prediction and sliding windows of the MoE types in :data:`_MOE_TYPES`. MoE
    configs of other types, encoder-decoder and encoder-only configs are refused. With
    ``transformers`` installed (the ``hf`` extra) the file is read as its config class reads it
    (:func:`_class_view`); without it, as written."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    origin = f"config file {path}"
    raw = _read_json(path, origin)
    _check_as_written(raw, origin)
    config, how = _class_view(raw, origin)
    name = str(raw.get("_name_or_path") or path.parent.name or path.stem)
    return _hf_entry(config, raw, origin, name, f"Hugging Face config {path}{how}")


def model_from_hf_id(model_id: str) -> Entry:
    """A validated model entry from a Hugging Face Hub model id (``org/name``): its config as
    ``transformers.AutoConfig.from_pretrained`` loads it (the Hub, or the local cache offline).
    Needs the ``hf`` extra; every failure is one line."""
    origin = f"Hugging Face model {model_id!r}"
    auto = _auto_config()
    if auto is None:
        raise _fail(origin, f"reading a model id needs transformers ({HF_EXTRA}); or give its config.json")
    try:
        with _quiet_transformers():
            loaded = auto.from_pretrained(model_id)
    except (OSError, ValueError, KeyError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise _fail(origin, f"transformers cannot load its config: {first}") from None
    config = _with_standard_names(loaded)
    _check_as_written(config, origin)
    return _hf_entry(
        config, loaded.to_dict(), origin, model_id, f"Hugging Face model {model_id} (transformers.AutoConfig)"
    )


def _auto_config():
    """``transformers.AutoConfig``, or None without transformers. Its import-time advice that
    PyTorch is missing (irrelevant to configs) is silenced."""
    previous = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    finally:
        if previous is None:
            del os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"]
        else:
            os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = previous
    return AutoConfig


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' and huggingface_hub's log lines (special tokens outside the vocabulary, the
    Hub's retries offline) silenced while a config loads, their verbosity restored after: a problem
    is the reader's one error line."""
    from huggingface_hub.utils import logging as hub_logging  # its retries offline: a line each
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity(), hub_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous[0])
        hub_logging.set_verbosity(previous[1])


def _with_standard_names(loaded) -> dict[str, Any]:
    """A transformers config as a dict: its fields, and every standard name its class maps onto
    its own (``attribute_map``: GPT-2's ``n_embd`` is also ``hidden_size``)."""
    out = loaded.to_dict()
    for standard in getattr(loaded, "attribute_map", {}):
        out.setdefault(standard, getattr(loaded, standard, None))
    return out


def _class_view(raw: dict[str, Any], origin: str) -> tuple[dict[str, Any], str]:
    """``(config, note)``: with transformers, ``raw`` as the config class of its ``model_type``
    reads it -- its standard names, and its defaults for what the file leaves out except the shape
    (:data:`_FROM_THE_FILE`, read only under the names the file gives): tied embeddings, KV heads,
    head width, RoPE -- else ``raw`` itself (and likewise for a ``model_type`` transformers does
    not know)."""
    auto = _auto_config()
    model_type = raw.get("model_type")
    if auto is None or not isinstance(model_type, str):
        return raw, ""
    try:
        with _quiet_transformers():
            loaded = auto.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})
    except Exception as error:  # noqa: BLE001 - transformers >= 5 validates through huggingface_hub's own errors
        if isinstance(error, ValueError) and ("Unrecognized model" in str(error) or "model_type" in str(error)):
            return raw, ""
        cause = error.__cause__ or error  # the validator's own ValueError, not its wrapper
        first = (str(cause).strip().splitlines() or ["invalid"])[0]
        raise _fail(origin, f"transformers refuses it: {first}") from None
    view = _with_standard_names(loaded)
    aliases = getattr(loaded, "attribute_map", {})
    for k in chain(*_FROM_THE_FILE):  # a shape the file does not give is missing, not a class default
        if k not in raw and aliases.get(k) not in raw:
            view.pop(k, None)
            view.pop(aliases.get(k), None)
    return {**view, **raw}, " (read with transformers' config class)"


# The shape of the model: read from the file (under any of its class's names), never a class
# default -- a config without its width is refused, not given Llama-7B's.
_FROM_THE_FILE = (
    ("hidden_size", "n_embd", "d_model"),
    ("num_attention_heads", "n_head", "n_heads"),
    ("num_hidden_layers", "n_layer", "n_layers"),
    ("intermediate_size", "n_inner"),
    ("vocab_size",),
    ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
    # Mixture of experts and latent attention: a file's own counts, never its class's (transformers'
    # MixtralConfig would give 8 experts and top-2, DeepseekV3Config 256 experts of width 2048).
    _MOE_KEYS,
    _TOP_K_KEYS,
    ("moe_intermediate_size",),
    ("shared_expert_intermediate_size",),
    ("n_shared_experts",),
    ("first_k_dense_replace",),
    ("decoder_sparse_step",),
    ("n_group",),
    ("topk_group",),
    ("kv_lora_rank",),
    ("q_lora_rank",),
    ("qk_nope_head_dim",),
    ("qk_rope_head_dim",),
    ("v_head_dim",),
    ("num_nextn_predict_layers",),
)

# Keys checked as the file writes them, before transformers or the reader takes them:
# transformers divides by `original_max_position_embeddings` (YaRN) and steps a range() by
# `interleave_moe_layer_step` (Llama 4), and the reader would skip a YaRN number it cannot read.
# A YaRN factor is the context's extension, s = L'/L >= 1 (Peng et al. 2023, arXiv 2309.00071,
# Sec. 3.1); its mscale terms are any numbers (transformers' `get_mscale`).
_YARN_KEYS = {
    "factor": _Field("a number >= 1 (the context's extension)", _number(lambda v: v >= 1), "number"),
    "attention_factor": _POSITIVE,
    "mscale": _Field("a number", _number(lambda v: True), "number"),
    "mscale_all_dim": _Field("a number", _number(lambda v: True), "number"),
}
_MOE_STEP_KEYS = ("decoder_sparse_step", "interleave_moe_layer_step")


def _check_as_written(raw: dict[str, Any], origin: str) -> None:
    """Refuse, naming the key, an MoE layer step or a RoPE scaling number the file writes wrongly
    (top level and Llama 4's ``text_config``; see :data:`_YARN_KEYS`)."""
    text = raw.get("text_config")
    for prefix, table in (("", raw), *((("text_config.", text),) if isinstance(text, dict) else ())):
        for key in _MOE_STEP_KEYS:  # every step-th layer is MoE
            step = table.get(key)
            if step is not None and not whole_number(step, 1):
                raise _fail(origin, f"{prefix}{key} must be an integer >= 1; got {step!r}")
        for rope in ("rope_scaling", "rope_parameters"):  # transformers 5 keeps rope_scaling as rope_parameters
            scaling = table.get(rope)
            if not isinstance(scaling, dict):
                continue
            rules = {"original_max_position_embeddings": _SCHEMA["models"]["seq_len"]}
            if (scaling.get("rope_type") or scaling.get("type")) == "yarn":
                rules.update(_YARN_KEYS)
            for key, rule in rules.items():
                if scaling.get(key) is not None:
                    _parse_value(origin, f"{prefix}{rope}.{key}", rule, scaling[key])


def _hf_entry(config: dict[str, Any], raw: dict[str, Any], origin: str, name: str, source: str) -> Entry:
    """The model entry of a Hugging Face config (``raw``: as written, for its key style)."""
    prefix = ""
    if isinstance(config.get("text_config"), dict) and str(config.get("model_type", "")) in _TEXT_CONFIG_TYPES:
        # Llama 4 (multimodal): the language model's keys sit under text_config.
        config, prefix = {**config["text_config"], "_name_or_path": config.get("_name_or_path")}, "text_config."
    get = _Reader(config, origin, prefix)
    _refuse_unmodelled(config, origin)
    model_type = str(config.get("model_type", ""))
    hidden = get("hidden_size", "n_embd", "d_model", to="hidden")  # d_model, n_heads, n_layers: MosaicML's MPT
    heads = get("num_attention_heads", "n_head", "n_heads", to="heads")
    act_key = next((k for k in ("hidden_activation", "hidden_act") if config.get(k)), None)  # Gemma: the first
    activation = str(config[act_key]).lower() if act_key else ""
    if activation and activation not in _ACTIVATIONS:
        known = ", ".join(sorted(_ACTIVATIONS))
        raise get.fail(f"{prefix}{act_key} {activation!r} is no activation transformers knows ({known})")
    gated = model_type in _GATED_TYPES or activation in _GATED_ACTIVATIONS
    is_gpt2_style = "n_embd" in raw and "hidden_size" not in raw
    ffn_default = 4 * hidden if is_gpt2_style and _is_number(hidden) else None
    if model_type == "mpt" and _is_number(hidden):  # MPTMLP: up_proj to expansion_ratio x d_model, GELU
        ffn_default = int(config.get("expansion_ratio", 4) * hidden)
    seq_len, seq_note = _training_seq_len(get)
    mpt_kv_heads = (config.get("attn_config") or {}).get("kv_n_heads")
    entry: Entry = {
        "name": name,
        "layers": get("num_hidden_layers", "n_layer", "n_layers", to="layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": get("num_key_value_heads", default=mpt_kv_heads or heads, to="kv_heads"),
        "ffn_hidden": get("intermediate_size", "n_inner", default=ffn_default, to="ffn_hidden"),
        "vocab": get("vocab_size", to="vocab"),
        "mlp": "gated" if gated else "plain",
        "seq_len": seq_len,
        "tied_embeddings": config.get("tie_word_embeddings", _TIED_BY_DEFAULT.get(model_type, True)),
        "source": f"{source}; {seq_note}",
    }
    get.note("tied_embeddings", "tie_word_embeddings")  # where it is the default, the default is valid
    if config.get("head_dim") is not None:
        entry["head_dim"] = get("head_dim", to="head_dim")
    entry.update(_hf_moe_fields(get, model_type))
    entry = _as_file_keys(get, entry)
    _check_across_keys(get, entry)
    return _validated_model(origin, entry["name"], entry)


def _as_file_keys(get: _Reader, entry: Entry) -> Entry:
    """``entry`` with each value read from a key of the file checked by its field's catalog rule,
    an error naming that key (``num_hidden_layers must be a positive integer``, not ``layers``)."""
    spec = _SCHEMA["models"]
    return {f: _parse_value(get.origin, get.keys[f], spec[f], v) if f in get.keys else v for f, v in entry.items()}


def _check_across_keys(get: _Reader, entry: Entry) -> None:
    """Rules that tie a config's keys together, named by them: a token is routed to at most the
    experts there are; at least one layer is MoE; ``layer_types`` gives one type per layer."""
    keys, layers, experts = get.keys, entry["layers"], entry.get("n_experts", 0)
    if experts and entry["top_k"] > experts:
        raise get.fail(f"{keys['top_k']} = {entry['top_k']} must be at most {keys['n_experts']} = {experts}")
    dense, every = entry.get("dense_layers", 0), entry.get("moe_every", 1)
    if experts and (layers - dense) // every < 1:  # hetersim.build.moe_fields: (layers - dense) // every
        key, value, most = (
            (keys["moe_every"], every, layers - dense) if every > 1 else (keys["dense_layers"], dense, layers - 1)
        )
        raise get.fail(f"{key} = {value} leaves no MoE layer of {keys['layers']} = {layers}; it must be at most {most}")
    types = get.config.get("layer_types")
    if types is not None and not (isinstance(types, list) and len(types) == layers):
        got = f"{len(types)} entries" if isinstance(types, list) else repr(types)
        raise get.fail(f"{get.prefix}layer_types must list one type per layer ({keys['layers']} = {layers}); got {got}")


# Mixture-of-experts configs read with their own keys (transformers' configuration_<type>.py):
# Mixtral, Qwen2-MoE / Qwen3-MoE, DeepSeek-V2 / V3 (and Kimi-K2, which uses DeepSeek-V3's), GPT-OSS,
# Llama 4. A config with experts of any other type is refused rather than read as dense.
_MOE_TYPES = frozenset(
    {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss", "llama4_text"}
)
_TEXT_CONFIG_TYPES = frozenset({"llama4"})
# Types whose every attention layer is multi-head latent attention (transformers'
# DeepseekV2Attention / DeepseekV3Attention project keys and values through kv_lora_rank).
_MLA_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
# Optional counts read as written (a value that is no count is refused by its field's rule, never
# skipped); 0 or absent: none.
_OPTIONAL_MOE_KEYS = {
    "shared_experts": "n_shared_experts",
    "shared_ffn_hidden": "shared_expert_intermediate_size",
    "dense_layers": "first_k_dense_replace",
}


def _given(value: Any) -> bool:
    """A value the file sets: anything but null and 0 (a bool or a string is set, and checked)."""
    return value is not None and (isinstance(value, bool) or value != 0)


def _hf_moe_fields(get: _Reader, model_type: str) -> Entry:
    config = get.config
    out = _expert_fields(get, model_type)
    if model_type in _MLA_TYPES and not _given(config.get("kv_lora_rank")):  # never read as plain attention
        rank, key = config.get("kv_lora_rank"), f"{get.prefix}kv_lora_rank"
        raise get.fail(f"{key} must be a positive integer ({model_type} attends through MLA); got {rank!r}")
    if _given(config.get("kv_lora_rank")):
        out["kv_lora_rank"] = get("kv_lora_rank", to="kv_lora_rank")
        out["q_lora_rank"] = get("q_lora_rank", default=0, to="q_lora_rank")
        out["head_dim"] = get("qk_nope_head_dim", to="head_dim")
        out["qk_rope_head_dim"] = get("qk_rope_head_dim", to="qk_rope_head_dim")
        out["v_head_dim"] = get("v_head_dim", to="v_head_dim")
    if _given(config.get("num_nextn_predict_layers")):
        out["mtp_layers"] = get("num_nextn_predict_layers", to="mtp_layers")
    if _given(config.get("swiglu_limit")):  # GPT-OSS
        out["glu_clamp"] = get("swiglu_limit", to="glu_clamp")
    if model_type == "gpt_oss" and out.get("n_experts"):  # GptOssExperts: gate_up_proj_bias, down_proj_bias
        out["expert_bias"] = True
    scale = _yarn_attention_scale(config)
    if scale is not None and abs(scale - 1.0) > 1e-6:
        out["rope_attention_scale"] = scale
    out.update(_sliding_fields(get, model_type))
    return out


def _expert_fields(get: _Reader, model_type: str) -> Entry:
    """The experts, their routing and their layers (none for a dense model)."""
    config = get.config
    experts = _expert_count(get, model_type)
    if experts <= 1:  # dense; one expert routes a token to at most that one
        top = get(*_TOP_K_KEYS, default=0, to="top_k") if experts == 1 else 0
        if _is_number(top) and top > 1:
            raise get.fail(f"{get.keys['top_k']} = {top} must be at most {get.keys['n_experts']} = 1")
        return {}
    out: Entry = {"n_experts": experts, "top_k": _agreed(get, "top_k", _TOP_K_KEYS, "the experts per token")}
    ffn_key = "intermediate_size" if model_type in ("mixtral", "gpt_oss", "llama4_text") else "moe_intermediate_size"
    out["moe_ffn_hidden"] = get(ffn_key, to="moe_ffn_hidden")
    if model_type == "llama4_text":  # one shared expert of the routed width; dense layers' FFN
        out["shared_experts"] = 1
        out["moe_every"] = get("interleave_moe_layer_step", default=1, to="moe_every")
        if out["moe_every"] > 1:
            out["ffn_hidden"] = get("intermediate_size_mlp", to="ffn_hidden")
    for to, key in _OPTIONAL_MOE_KEYS.items():
        if _given(config.get(key)):
            out[to] = get(key, to=to)
    if (config.get("decoder_sparse_step") or 1) > 1:  # Qwen2/3-MoE: every step-th layer is MoE (checked as written)
        out["moe_every"] = get("decoder_sparse_step", to="moe_every")
    if _given(config.get("n_group")) and config["n_group"] != 1:  # one group: routing is not limited
        out["route_groups"] = get("n_group", to="route_groups")
        out["route_group_topk"] = get("topk_group", to="route_group_topk")
    freq = config.get("moe_layer_freq")
    if freq is not None and (isinstance(freq, bool) or freq != 1):  # DeepSeek's own code: layer % freq == 0
        raise get.fail(
            f"{get.prefix}moe_layer_freq = {freq!r}: only 1 is read (every layer after first_k_dense_replace is "
            "MoE); transformers' DeepSeek models ignore the key where DeepSeek's own code uses it"
        )
    if config.get("mlp_only_layers"):
        raise get.fail("mlp_only_layers: dense layers at chosen positions are not modelled")
    return out


# Types whose every layer attends through ``sliding_window`` when the config sets it, with no
# ``layer_types``: their model builds one mask for all layers, ``create_causal_mask if
# self.config.sliding_window is None else create_sliding_window_causal_mask`` (transformers 5.25
# models/{mistral,mixtral,phi3,phimoe,starcoder2,qwen3_moe}/modeling_*.py); Qwen3-MoE's config keeps
# the window only under ``use_sliding_window`` (configuration_qwen3_moe.py).
_EVERY_LAYER_WINDOW = frozenset({"mistral", "mixtral", "phi3", "phimoe", "starcoder2", "qwen3_moe"})


def _sliding_fields(get: _Reader, model_type: str) -> Entry:
    """``sliding_window`` and the share of layers it applies to: the layers ``layer_types`` marks
    ``sliding_attention``, or all of them for :data:`_EVERY_LAYER_WINDOW` (none where the window is
    null)."""
    config = get.config
    types = config.get("layer_types")
    window = config.get("sliding_window")
    if model_type == "qwen3_moe" and not config.get("use_sliding_window"):
        window = None
    if isinstance(types, list) and types:
        share = sum(1 for t in types if t == "sliding_attention") / len(types)
    else:
        share = 1.0 if model_type in _EVERY_LAYER_WINDOW else 0.0
    if share and window is not None and not whole_number(window, 1):  # None: the layers attend to all
        raise get.fail(f"{get.prefix}sliding_window must be a positive integer (or null); got {window!r}")
    return {"sliding_window": window, "sliding_window_share": share} if share and window is not None else {}


def _agreed(get: _Reader, to: str, names: tuple[str, ...], what: str) -> Any:
    """The value ``names`` give (read as model field ``to``), refused where two of them differ."""
    given = {get.prefix + k: get.config[k] for k in names if get.config.get(k) is not None}
    if len({repr(v) for v in given.values()}) > 1:
        named = ", ".join(f"{k} = {v!r}" for k, v in given.items())
        raise get.fail(f"{named} contradict each other; give {what} once")
    return get(*names, to=to)


def _expert_count(get: _Reader, model_type: str) -> int:
    """The routed experts of a mixture-of-experts ``model_type``: given in the file, a whole number
    >= 1, and the same under every name it is given (0 for any other type)."""
    if model_type not in _MOE_TYPES:
        return 0
    experts = _agreed(get, "n_experts", _MOE_KEYS, "the expert count")
    if not whole_number(experts, 1):
        key = get.keys["n_experts"]
        raise get.fail(f"{key} must be an integer >= 1 (the routed experts of {model_type}); got {experts!r}")
    return experts


def _yarn_attention_scale(config: dict[str, Any]) -> float | None:
    """YaRN's attention scale of a config's ``rope_scaling`` (transformers'
    ``_compute_yarn_parameters``): its ``attention_factor``, else ``get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim)`` where both are given (DeepSeek: 1), else ``0.1 ln(factor)
    + 1`` (Peng et al. 2023, arXiv 2309.00071, eq. 22); None for no YaRN. Its numbers were checked
    as written (:func:`_check_as_written`)."""
    for key in ("rope_scaling", "rope_parameters"):
        scaling = config.get(key)
        if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "yarn":
            continue
        if _is_number(scaling.get("attention_factor")):
            return float(scaling["attention_factor"])
        factor = float(scaling["factor"]) if _is_number(scaling.get("factor")) else 1.0
        if _is_number(scaling.get("mscale")) and _is_number(scaling.get("mscale_all_dim")):
            scale, scale_all = float(scaling["mscale"]), float(scaling["mscale_all_dim"])
            return _yarn_mscale(factor, scale) / _yarn_mscale(factor, scale_all)
        return _yarn_mscale(factor, 1.0)
    return None


def _yarn_mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


# Expert counts a config may keep in a nested table (DBRX: ``ffn_config.moe_num_experts``,
# transformers' DbrxFFNConfig), beside the top-level _MOE_KEYS.
_NESTED_MOE_KEYS = (*_MOE_KEYS, "moe_num_experts")
# ``layer_types`` entries of the layers this model prices: full and sliding-window attention, the
# chunked local attention of Llama 4 (priced as full attention: the same up to its chunk of 8,192
# tokens) and the legacy name "attention". transformers (5.25, configuration_utils.py
# ``ALLOWED_ATTN_LAYER_TYPES``) also names recurrent layers ("linear_attention": Mamba, Gated
# DeltaNet, Qwen3-Next), hybrid, indexed-sparse and convolution layers, and the legacy "mamba":
# layers the model has no cost for, so a config with any of them is refused.
_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention"})
_DECODER_ONLY = "only decoder-only transformers are modelled"
# The types with a masked-language-model head: transformers 5.25 MODEL_FOR_MASKED_LM_MAPPING_NAMES
# (models/auto/modeling_auto.py). One is an encoder unless the file makes it a decoder (is_decoder).
_MASKED_LM_TYPES = frozenset(
    "albert bart bert big_bird camembert convbert data2vec-text deberta deberta-v2 distilbert electra ernie esm esmc "
    "eurobert flaubert fnet funnel gte ibert jina_embeddings_v3 layoutlm longformer luke mbart megatron-bert "
    "mobilebert modernbert modernvbert mpnet mra mvp neomme nomic_bert nystromformer perceiver reformer rembert "
    "roberta roberta-prelayernorm roc_bert roformer squeezebert tapas ultrabert ultravbert xlm xlm-roberta "
    "xlm-roberta-xl xmod yoso".split()
)


def _refuse_unmodelled(config: dict[str, Any], origin: str) -> None:
    """Refuse, in one line naming the key, a config whose layers the model would misprice: experts
    of a model type it does not read (top-level or nested), layers that are not attention, an
    encoder-decoder or an encoder. Never read as a dense decoder."""
    model_type = str(config.get("model_type", ""))
    if model_type not in _MOE_TYPES:
        nested = {k: v for k, v in config.items() if isinstance(v, dict) and k != "text_config"}
        tables = [("", config, _MOE_KEYS), *((f"{k}.", v, _NESTED_MOE_KEYS) for k, v in nested.items())]
        for prefix, table, keys in tables:
            for key in keys:
                value = table.get(key)
                if value is not None and not (_is_number(value) and 0 <= value <= 1):  # 0 or 1 expert: dense
                    known = ", ".join(sorted(_MOE_TYPES))
                    message = f"mixture-of-experts model_type {model_type!r} is not read (known: {known})"
                    raise _fail(origin, f"{prefix}{key} = {value!r}: {message}")
    types = config.get("layer_types")
    if isinstance(types, list):
        other = sorted({str(t) for t in types if str(t) not in _ATTENTION_LAYER_TYPES})
        if other:
            allowed = ", ".join(sorted(_ATTENTION_LAYER_TYPES))
            raise _fail(
                origin, f"layer_types has {', '.join(map(repr, other))}: only attention layers are modelled ({allowed})"
            )
    if config.get("is_encoder_decoder"):
        raise _fail(origin, f"is_encoder_decoder: {_DECODER_ONLY}")
    # An encoder (BERT, RoBERTa, ModernBERT): the file names a masked-language-model head, the class
    # transformers' AutoModelForMaskedLM maps its type to (models/auto/modeling_auto.py), and
    # does not make it a decoder (`is_decoder`, BertConfig's switch to a causal mask).
    names = config.get("architectures")
    if names is not None and not (isinstance(names, list) and all(isinstance(a, str) for a in names)):
        raise _fail(origin, f"architectures must be a list of class names; got {names!r}")
    masked = [a for a in names or () if a.endswith("ForMaskedLM")]
    if masked and not config.get("is_decoder"):
        raise _fail(origin, f"architectures {masked[0]!r} is an encoder (a masked language model): {_DECODER_ONLY}")
    if model_type in _MASKED_LM_TYPES and not config.get("is_decoder"):  # BertModel, or no architectures
        raise _fail(origin, f"model_type {model_type!r} is an encoder (is_decoder makes it causal): {_DECODER_ONLY}")


def _training_seq_len(get: _Reader) -> tuple[Any, str]:
    """(training context, how it was chosen) -- see :data:`HF_TRAINING_SEQ_LEN_CAP`."""
    for key in ("rope_scaling", "rope_parameters"):  # transformers 5 keeps rope_scaling as rope_parameters
        scaling = get.config.get(key)
        if isinstance(scaling, dict) and _is_number(scaling.get("original_max_position_embeddings")):
            value = scaling["original_max_position_embeddings"]
            get.note("seq_len", f"{key}.original_max_position_embeddings")
            return value, f"seq_len {value} from {key}.original_max_position_embeddings (pre-training context)"
    longest = get("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", to="seq_len")
    key = get.keys["seq_len"]
    if _is_number(longest) and not (isinstance(longest, int) and 0 < longest <= MAX_COUNT):  # the cap hid it
        raise get.fail(f"{key} must be a positive integer; got {longest!r}")
    if _is_number(longest) and longest > HF_TRAINING_SEQ_LEN_CAP:
        note = f"seq_len {HF_TRAINING_SEQ_LEN_CAP}: the config's {key} {longest} capped at the training default"
        return HF_TRAINING_SEQ_LEN_CAP, note
    return longest, f"seq_len {longest} from {key}"
