"""Model entries from a transformer's dimensions, from files (a Hugging Face ``config.json``, read
by :mod:`.hf_config`, or a Calculon model file) and from Hugging Face Hub ids."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from .check import _fail, _parse_value
from .hf_config import (
    HF_EXTRA,
    _auto_config,
    _read_json,
    _validated_model,
    model_from_hf_config,
    model_from_hf_id,
)
from .hf_config import HF_TRAINING_SEQ_LEN_CAP as HF_TRAINING_SEQ_LEN_CAP  # re-exported
from .schema import _POSITIVE, _SCHEMA, Entry


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


def hf_config_path(model: str | Path) -> Path | None:
    """The ``config.json`` that ``model`` names (the file, or a folder: its config.json, which
    may be missing -- reading it then says so), else None (a catalog key)."""
    path = Path(model)
    if path.is_dir():
        return path / "config.json"
    return path if str(model).endswith(".json") or path.is_file() else None


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


# Calculon's model files (calculon-ai/calculon models/*.json at 4f81f029; read by its
# `Llm.Application`): a GPT-style block (a two-matrix GeLU MLP, one tied embedding of 51,200 words,
# the vocabulary `num_parameters` hard-codes). `kv_heads`/`vocab_size` are later forks' additions;
# the position/rope keys do not change the cost (checked, not read); experts (`num_experts`) are
# refused. Each key and the model field it gives: an error names the key.
_CALCULON_FIELDS = {
    "num_blocks": "layers",
    "hidden": "hidden",
    "attn_heads": "heads",
    "kv_heads": "kv_heads",
    "attn_size": "head_dim",
    "feedforward": "ffn_hidden",
    "vocab_size": "vocab",
    "seq_size": "seq_len",
}
_CALCULON_REQUIRED = ("hidden", "feedforward", "seq_size", "attn_heads", "attn_size", "num_blocks")
_CALCULON_OPTIONAL = ("kv_heads", "vocab_size", "max_position_embeddings", "rope_theta", "position_embedding_type")
_CALCULON_CHECKED = {"max_position_embeddings": _SCHEMA["models"]["seq_len"], "rope_theta": _POSITIVE}
# Keys no Hugging Face config uses (its names: hidden_size, num_hidden_layers, ...).
_CALCULON_ONLY = ("num_blocks", "attn_size", "attn_heads", "seq_size", "feedforward")
CALCULON_VOCAB = 51200


def is_calculon_model(config: dict[str, Any]) -> bool:
    """Calculon's format: a file with a key only Calculon uses and no Hugging Face ``model_type``
    (then a missing Calculon key is named as one)."""
    return "model_type" not in config and any(k in config for k in _CALCULON_ONLY)


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
    """A validated model entry from a Calculon model file's keys, each checked by its model
    field's rule under its own name (a 0 is refused, never read as the default)."""
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
    spec = _SCHEMA["models"]
    given = {k: config[k] for k in _CALCULON_FIELDS if k in _CALCULON_REQUIRED or config.get(k) is not None}
    read = {k: _parse_value(origin, k, spec[_CALCULON_FIELDS[k]], v) for k, v in given.items()}
    for key, rule in _CALCULON_CHECKED.items():
        if config.get(key) is not None:
            _parse_value(origin, key, rule, config[key])
    entry: Entry = {_CALCULON_FIELDS[k]: v for k, v in read.items()}
    entry.setdefault("kv_heads", entry["heads"])
    entry.setdefault("vocab", CALCULON_VOCAB)
    entry.update(name=path.stem, mlp="plain", tied_embeddings=True, source=f"Calculon model file {path}")
    return _validated_model(origin, entry["name"], entry)
