"""Model entries from a transformer's dimensions and from Hugging Face ``config.json`` files."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Literal

from .. import jsontext
from ..types import whole_number
from .check import _check_complete, _check_entry, _fail, _parse_fragment, read_document
from .schema import MAX_COUNT, Entry, _is_number


def llama_ffn_hidden(hidden: int) -> int:
    """SwiGLU FFN width by the LLaMA rule: 2/3 of 4*hidden, rounded up to a multiple of 256."""
    return -(-8 * hidden // (3 * 256)) * 256


def model_from_dims(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    vocab: int = 32000,
    mlp: Literal["gated", "plain"] = "gated",
    seq_len: int = 4096,
    *,
    name: str | None = None,
    tied_embeddings: bool = False,
    head_dim: int | None = None,
    **optional: Any,
) -> Entry:
    """A validated model entry for any transformer given by its dimensions.

    ``optional``: the catalog's optional model fields (``n_experts``, ``top_k``,
    ``moe_ffn_hidden``, ``kv_lora_rank``, ...; see ``catalog/README.md``).
    Defaults: kv_heads = heads (no GQA); ffn_hidden = 4*hidden for a plain MLP, the LLaMA rule
    (:func:`llama_ffn_hidden`) for a gated one; vocab 32000 and seq_len 4096 as in Llama 2.
    """
    if ffn_hidden is None and isinstance(hidden, int) and not isinstance(hidden, bool):
        ffn_hidden = 4 * hidden if mlp == "plain" else llama_ffn_hidden(hidden)
    label = name or f"custom-{layers}l-{hidden}h"
    entry: Entry = {
        "name": label,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": heads if kv_heads is None else kv_heads,
        "ffn_hidden": ffn_hidden,
        "vocab": vocab,
        "mlp": mlp,
        "seq_len": seq_len,
        "tied_embeddings": tied_embeddings,
        "source": "model_from_dims",
    }
    if head_dim is not None:
        entry["head_dim"] = head_dim
    # The catalog schema's optional model fields (experts, MLA ranks, ...): checked there.
    entry.update({k: v for k, v in optional.items() if v is not None})
    return _validated_model("model_from_dims", label, entry)


def _validated_model(origin: str, key: str, entry: Entry) -> Entry:
    parsed = _parse_fragment(origin, "models", key, entry)
    _check_complete(origin, "models", key, parsed)
    _check_entry(origin, "models", key, parsed)
    return parsed


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


def hf_config_path(model: str | Path) -> Path | None:
    """The ``config.json`` that ``model`` names (the file, or a folder: its config.json, which
    may be missing -- reading it then says so), else None (a catalog key)."""
    path = Path(model)
    if path.is_dir():
        return path / "config.json"
    return path if str(model).endswith(".json") or path.is_file() else None


HF_EXTRA = "pip install 'hetersim[hf]'"
# A Hub model id: one owner and one name (a path that exists is read as a file or folder first).
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hf_id(model: str) -> bool:
    return bool(_HF_ID.fullmatch(model)) and not model.endswith(".json") and not Path(model).exists()


def model_entry(catalog, model: str | Path) -> Entry:
    """The model ``model`` names: a ``config.json`` or Calculon ``.json`` file or a folder
    (:func:`model_from_json`), a catalog key, else -- with transformers -- a Hugging Face model id
    (:func:`model_from_hf_id`). An unknown name is one line (naming the ``hf`` extra for an id)."""
    path = hf_config_path(model)
    if path is not None:
        return model_from_json(path)
    try:
        return catalog.model(str(model))
    except ValueError as error:
        if not is_hf_id(str(model)):
            raise
        if _auto_config() is None:
            raise ValueError(f"{error} (a Hugging Face model id needs transformers: {HF_EXTRA})") from None
    return model_from_hf_id(str(model))


def model_from_hf_config(path: str | Path) -> Entry:
    """A validated model entry from a Hugging Face ``config.json`` (or a folder holding one):
    Llama/Mistral/Qwen2/Gemma or GPT-2 style keys; ``head_dim`` where a config sets it; the
    training context as :data:`HF_TRAINING_SEQ_LEN_CAP` says; the experts, latent attention,
    multi-token prediction and sliding windows of the MoE types in :data:`_MOE_TYPES`. MoE
    configs of other types and encoder-decoder configs are refused. With ``transformers``
    installed (the ``hf`` extra) the file is read as its config class reads it
    (:func:`_class_view`); without it, as written."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    origin = f"config file {path}"
    raw = _read_json(path, origin)
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
        loaded = auto.from_pretrained(model_id)
    except (OSError, ValueError, KeyError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise _fail(origin, f"transformers cannot load its config: {first}") from None
    config = _with_standard_names(loaded)
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
    (:data:`_FROM_THE_FILE`): tied embeddings, KV heads, head width, RoPE -- else ``raw`` itself
    (and likewise for a ``model_type`` transformers does not know)."""
    auto = _auto_config()
    model_type = raw.get("model_type")
    if auto is None or not isinstance(model_type, str):
        return raw, ""
    try:
        loaded = auto.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})
    except Exception as error:  # noqa: BLE001 - transformers >= 5 validates through huggingface_hub's own errors
        if isinstance(error, ValueError) and ("Unrecognized model" in str(error) or "model_type" in str(error)):
            return raw, ""
        cause = error.__cause__ or error  # the validator's own ValueError, not its wrapper
        first = (str(cause).strip().splitlines() or ["invalid"])[0]
        raise _fail(origin, f"transformers refuses it: {first}") from None
    view = _with_standard_names(loaded)
    aliases = getattr(loaded, "attribute_map", {})
    for group in _FROM_THE_FILE:  # a shape the file does not give is missing, not a class default
        if not any(k in raw or aliases.get(k) in raw for k in group):
            for k in group:
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
    ("num_experts_per_tok", "experts_per_token"),
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


def _hf_entry(config: dict[str, Any], raw: dict[str, Any], origin: str, name: str, source: str) -> Entry:
    """The model entry of a Hugging Face config (``raw``: as written, for its key style)."""

    def get(*names: str, default: Any = None) -> Any:
        """The first of `names` set in the config, else `default`; neither is an error."""
        for key in names:
            if config.get(key) is not None:
                return config[key]
        if default is None:
            raise _fail(origin, f"missing {' or '.join(repr(k) for k in names)}")
        return default

    if isinstance(config.get("text_config"), dict) and str(config.get("model_type", "")) in _TEXT_CONFIG_TYPES:
        # Llama 4 (multimodal): the language model's keys sit under text_config.
        config = {**config["text_config"], "_name_or_path": config.get("_name_or_path")}
    _refuse_unmodelled(config, origin)
    model_type = str(config.get("model_type", ""))
    hidden = get("hidden_size", "n_embd", "d_model")  # d_model, n_heads, n_layers: MosaicML's MPT
    heads = get("num_attention_heads", "n_head", "n_heads")
    activation = str(config.get("hidden_activation") or config.get("hidden_act", "")).lower()
    gated = model_type in _GATED_TYPES or activation in _GATED_ACTIVATIONS
    is_gpt2_style = "n_embd" in raw and "hidden_size" not in raw
    ffn_default = 4 * hidden if is_gpt2_style and _is_number(hidden) else None
    if model_type == "mpt" and _is_number(hidden):  # MPTMLP: up_proj to expansion_ratio x d_model, GELU
        ffn_default = int(config.get("expansion_ratio", 4) * hidden)
    seq_len, seq_note = _training_seq_len(config, get, origin)
    entry: Entry = {
        "name": name,
        "layers": get("num_hidden_layers", "n_layer", "n_layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": get("num_key_value_heads", default=(config.get("attn_config") or {}).get("kv_n_heads") or heads),
        "ffn_hidden": get("intermediate_size", "n_inner", default=ffn_default),
        "vocab": get("vocab_size"),
        "mlp": "gated" if gated else "plain",
        "seq_len": seq_len,
        "tied_embeddings": config.get("tie_word_embeddings", _TIED_BY_DEFAULT.get(model_type, True)),
        "source": f"{source}; {seq_note}",
    }
    if config.get("head_dim") is not None:
        entry["head_dim"] = config["head_dim"]
    entry.update(_hf_moe_fields(config, model_type, origin, get))
    return _validated_model(origin, entry["name"], entry)


# Mixture-of-experts configs read with their own keys (transformers' configuration_<type>.py):
# Mixtral, Qwen2-MoE / Qwen3-MoE, DeepSeek-V2 / V3 (and Kimi-K2, which uses DeepSeek-V3's), GPT-OSS,
# Llama 4. A config with experts of any other type is refused rather than read as dense.
_MOE_TYPES = frozenset(
    {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss", "llama4_text"}
)
_TEXT_CONFIG_TYPES = frozenset({"llama4"})


def _hf_moe_fields(config: dict[str, Any], model_type: str, origin: str, get) -> Entry:
    experts = _expert_count(config, model_type, origin, get)
    out: Entry = {}
    if experts and experts > 1:
        out["n_experts"] = experts
        out["top_k"] = get("num_experts_per_tok", "experts_per_token")
        if model_type in ("mixtral", "gpt_oss", "llama4_text"):
            out["moe_ffn_hidden"] = get("intermediate_size")
        else:
            out["moe_ffn_hidden"] = get("moe_intermediate_size")
        if model_type == "llama4_text":  # one shared expert of the routed width; dense layers' FFN
            out["shared_experts"] = 1
            out["moe_every"] = config.get("interleave_moe_layer_step") or 1
            if out["moe_every"] > 1:
                out["ffn_hidden"] = get("intermediate_size_mlp")
        if _is_number(config.get("n_shared_experts")):
            out["shared_experts"] = config["n_shared_experts"]
        if _is_number(config.get("shared_expert_intermediate_size")) and config["shared_expert_intermediate_size"]:
            out["shared_ffn_hidden"] = config["shared_expert_intermediate_size"]
        if _is_number(config.get("first_k_dense_replace")):
            out["dense_layers"] = config["first_k_dense_replace"]
        step = config.get("decoder_sparse_step")  # Qwen2/3-MoE: every step-th layer is MoE
        if step is not None and not whole_number(step, 1):
            raise _fail(origin, f"decoder_sparse_step must be an integer >= 1; got {step!r}")
        if step is not None and step > 1:
            out["moe_every"] = step
        if _is_number(config.get("n_group")) and config["n_group"] > 1 and _is_number(config.get("topk_group")):
            out["route_groups"], out["route_group_topk"] = config["n_group"], config["topk_group"]
        if config.get("mlp_only_layers"):
            raise _fail(origin, "mlp_only_layers: dense layers at chosen positions are not modelled")
    if _is_number(config.get("kv_lora_rank")) and config["kv_lora_rank"]:
        out["kv_lora_rank"] = config["kv_lora_rank"]
        out["q_lora_rank"] = config.get("q_lora_rank") or 0
        out["head_dim"] = get("qk_nope_head_dim")
        out["qk_rope_head_dim"] = get("qk_rope_head_dim")
        out["v_head_dim"] = get("v_head_dim")
    if _is_number(config.get("num_nextn_predict_layers")) and config["num_nextn_predict_layers"]:
        out["mtp_layers"] = config["num_nextn_predict_layers"]
    if _is_number(config.get("swiglu_limit")) and config["swiglu_limit"] > 0:  # GPT-OSS
        out["glu_clamp"] = config["swiglu_limit"]
    if model_type == "gpt_oss" and out.get("n_experts"):  # GptOssExperts: gate_up_proj_bias, down_proj_bias
        out["expert_bias"] = True
    scale = _yarn_attention_scale(config)
    if scale is not None and abs(scale - 1.0) > 1e-6:
        out["rope_attention_scale"] = scale
    out.update(_sliding_fields(config, model_type, origin))
    return out


# Types whose every layer attends through ``sliding_window`` when the config sets it, with no
# ``layer_types``: their model builds one mask for all layers, ``create_causal_mask if
# self.config.sliding_window is None else create_sliding_window_causal_mask`` (transformers 5.25
# models/{mistral,mixtral,phi3,phimoe,starcoder2,qwen3_moe}/modeling_*.py); Qwen3-MoE's config keeps
# the window only under ``use_sliding_window`` (configuration_qwen3_moe.py).
_EVERY_LAYER_WINDOW = frozenset({"mistral", "mixtral", "phi3", "phimoe", "starcoder2", "qwen3_moe"})


def _sliding_fields(config: dict[str, Any], model_type: str, origin: str) -> Entry:
    """``sliding_window`` and the share of layers it applies to: the layers ``layer_types`` marks
    ``sliding_attention``, or all of them for :data:`_EVERY_LAYER_WINDOW` (none where the window is
    null)."""
    types = config.get("layer_types")
    window = config.get("sliding_window")
    if model_type == "qwen3_moe" and not config.get("use_sliding_window"):
        window = None
    if isinstance(types, list) and types:
        share = sum(1 for t in types if t == "sliding_attention") / len(types)
    else:
        share = 1.0 if model_type in _EVERY_LAYER_WINDOW else 0.0
    if share and window is not None and not whole_number(window, 1):  # None: the layers attend to all
        raise _fail(origin, f"sliding_window must be a positive integer (or null); got {window!r}")
    return {"sliding_window": window, "sliding_window_share": share} if share and window is not None else {}


def _expert_count(config: dict[str, Any], model_type: str, origin: str, get) -> int:
    """The routed experts of a mixture-of-experts ``model_type``: given in the file, a whole number
    >= 1, and the same under every name it is given (0 for any other type)."""
    if model_type not in _MOE_TYPES:
        return 0
    experts = get(*_MOE_KEYS)
    given = {k: config[k] for k in _MOE_KEYS if config.get(k) is not None}
    if len({repr(v) for v in given.values()}) > 1:
        named = ", ".join(f"{k} = {v!r}" for k, v in given.items())
        raise _fail(origin, f"{named} contradict each other; give the expert count once")
    if not whole_number(experts, 1):
        key = next(iter(given))
        raise _fail(origin, f"{key} must be an integer >= 1 (the routed experts of {model_type}); got {experts!r}")
    return experts


def _yarn_attention_scale(config: dict[str, Any]) -> float | None:
    """YaRN's attention scale of a config's ``rope_scaling`` (transformers'
    ``_compute_yarn_parameters``): its ``attention_factor``, else ``get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim)`` where both are given (DeepSeek: 1), else ``0.1 ln(factor)
    + 1`` (Peng et al. 2023, arXiv 2309.00071, eq. 22); None for no YaRN."""
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


def _refuse_unmodelled(config: dict[str, Any], origin: str) -> None:
    """Refuse, in one line naming the key, a config whose layers the model would misprice: experts
    of a model type it does not read (top-level or nested), layers that are not attention, an
    encoder-decoder. Never read as a dense decoder."""
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
        raise _fail(origin, "is_encoder_decoder: only decoder-only transformers are modelled")


def _training_seq_len(config: dict[str, Any], get, origin: str) -> tuple[Any, str]:
    """(training context, how it was chosen) -- see :data:`HF_TRAINING_SEQ_LEN_CAP`."""
    for key in ("rope_scaling", "rope_parameters"):  # transformers 5 keeps rope_scaling as rope_parameters
        scaling = config.get(key)
        if isinstance(scaling, dict) and _is_number(scaling.get("original_max_position_embeddings")):
            value = scaling["original_max_position_embeddings"]
            return value, f"seq_len {value} from {key}.original_max_position_embeddings (pre-training context)"
    names = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
    longest = get(*names)
    key = next(k for k in names if config.get(k) is not None)  # the one get() read
    if _is_number(longest) and not (isinstance(longest, int) and 0 < longest <= MAX_COUNT):  # the cap hid it
        raise _fail(origin, f"{key} must be a positive integer; got {longest!r}")
    if _is_number(longest) and longest > HF_TRAINING_SEQ_LEN_CAP:
        note = f"seq_len {HF_TRAINING_SEQ_LEN_CAP}: the config's {key} {longest} capped at the training default"
        return HF_TRAINING_SEQ_LEN_CAP, note
    return longest, f"seq_len {longest} from {key}"


# Calculon's model files (calculon-ai/calculon models/*.json at 4f81f029; read by its
# `Llm.Application`): a GPT-style block (a two-matrix GeLU MLP, one tied embedding of 51,200 words,
# the vocabulary `num_parameters` hard-codes). `kv_heads`/`vocab_size` are later forks' additions;
# the position/rope keys do not change the cost; experts (`num_experts`) are refused.
_CALCULON_REQUIRED = ("hidden", "feedforward", "seq_size", "attn_heads", "attn_size", "num_blocks")
_CALCULON_OPTIONAL = ("kv_heads", "vocab_size", "max_position_embeddings", "rope_theta", "position_embedding_type")
CALCULON_VOCAB = 51200


def is_calculon_model(config: dict[str, Any]) -> bool:
    return "num_blocks" in config and "attn_size" in config


def model_from_json(path: str | Path) -> Entry:
    """A model from a JSON file: Calculon's model format (``num_blocks``, ``attn_size``, ...) or a
    Hugging Face ``config.json`` (a folder: its config.json)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        config = _read_json(path, f"model file {path}")
        if is_calculon_model(config):
            return model_from_calculon(config, path)
    return model_from_hf_config(path)


def model_from_calculon(config: dict[str, Any], path: Path) -> Entry:
    """A validated model entry from a Calculon model file's keys."""
    origin = f"Calculon model file {path}"
    unknown = sorted(set(config) - set(_CALCULON_REQUIRED) - set(_CALCULON_OPTIONAL) - {"num_experts"})
    if unknown:
        allowed = ", ".join(_CALCULON_REQUIRED + _CALCULON_OPTIONAL)
        raise _fail(origin, f"unknown key {unknown[0]!r} (known: {allowed})")
    missing = [k for k in _CALCULON_REQUIRED if k not in config]
    if missing:
        raise _fail(origin, f"missing {missing[0]!r}")
    if config.get("num_experts"):
        raise _fail(origin, f"num_experts = {config['num_experts']}: mixture-of-experts layers are not modelled")
    entry: Entry = {
        "name": path.stem,
        "layers": config["num_blocks"],
        "hidden": config["hidden"],
        "heads": config["attn_heads"],
        "kv_heads": config.get("kv_heads") or config["attn_heads"],
        "head_dim": config["attn_size"],
        "ffn_hidden": config["feedforward"],
        "vocab": config.get("vocab_size") or CALCULON_VOCAB,
        "mlp": "plain",
        "seq_len": config["seq_size"],
        "tied_embeddings": True,
        "source": f"Calculon model file {path}",
    }
    return _validated_model(origin, entry["name"], entry)


def _read_json(path: Path, origin: str) -> dict[str, Any]:
    hint = "a Hugging Face config.json file"
    data = read_document(path, origin, "JSON", jsontext.loads, json.JSONDecodeError, hint)
    if not isinstance(data, dict):
        raise _fail(origin, f"must hold a JSON object, got {type(data).__name__}")
    return data
