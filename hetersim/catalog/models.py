"""Model entries from a transformer's dimensions and from Hugging Face ``config.json`` files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from .check import _check_complete, _check_entry, _fail, _parse_fragment, read_document
from .schema import Entry, _is_number


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
) -> Entry:
    """A validated model entry for any transformer given by its dimensions.

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
    return _validated_model("model_from_dims", label, entry)


def _validated_model(origin: str, key: str, entry: Entry) -> Entry:
    parsed = _parse_fragment(origin, "models", key, entry)
    _check_complete(origin, "models", key, parsed)
    _check_entry(origin, "models", key, parsed)
    return parsed


_GATED_TYPES = frozenset({"llama", "mistral", "qwen2"})
_GATED_ACTIVATIONS = frozenset({"silu", "swiglu"})


def model_from_hf_config(path: str | Path) -> Entry:
    """A validated model entry from a Hugging Face ``config.json`` (LLaMA or GPT-2 style keys)."""
    path = Path(path)
    origin = f"config file {path}"
    config = _read_json(path, origin)

    def get(*names: str, default: Any = None) -> Any:
        """The first of `names` set in the config, else `default`; neither is an error."""
        for key in names:
            if config.get(key) is not None:
                return config[key]
        if default is None:
            raise _fail(origin, f"missing {' or '.join(repr(k) for k in names)}")
        return default

    model_type = str(config.get("model_type", ""))
    hidden = get("hidden_size", "n_embd")
    heads = get("num_attention_heads", "n_head")
    gated = model_type in _GATED_TYPES or str(config.get("hidden_act", "")).lower() in _GATED_ACTIVATIONS
    is_gpt2_style = "n_embd" in config and "hidden_size" not in config
    ffn_default = 4 * hidden if is_gpt2_style and _is_number(hidden) else None
    entry: Entry = {
        "name": str(config.get("_name_or_path") or path.parent.name or path.stem),
        "layers": get("num_hidden_layers", "n_layer"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": get("num_key_value_heads", default=heads),
        "ffn_hidden": get("intermediate_size", "n_inner", default=ffn_default),
        "vocab": get("vocab_size"),
        "mlp": "gated" if gated else "plain",
        "seq_len": get("max_position_embeddings", "n_positions", "n_ctx"),
        "tied_embeddings": bool(config.get("tie_word_embeddings", model_type not in _GATED_TYPES)),
        "source": f"Hugging Face config {path}",
    }
    return _validated_model(origin, entry["name"], entry)


def _read_json(path: Path, origin: str) -> dict[str, Any]:
    hint = "a Hugging Face config.json file"
    data = read_document(path, origin, "JSON", json.loads, json.JSONDecodeError, hint)
    if not isinstance(data, dict):
        raise _fail(origin, f"must hold a JSON object, got {type(data).__name__}")
    return data
