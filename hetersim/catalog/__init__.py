"""The hardware and model catalog: TOML data, a source for every number, validated on load.

The packaged data lives next to this file, one file per section (``accelerators.toml`` ->
``gpus``, ``links.toml``, ``models.toml``, ``memory.toml``), each a table per entry key. User files
passed to :func:`load_catalog` name the section first (``[gpus.my-gpu]``) and add entries or
override fields of existing ones. Every problem is reported as a one-line ``ValueError`` naming the
file, the entry and what is allowed. See ``README.md`` in this folder for the format and units.
"""

from __future__ import annotations

import copy
import json
import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CATALOG_DIR",
    "PACKAGED_FILES",
    "SECTIONS",
    "Catalog",
    "Section",
    "apply_overrides",
    "fields",
    "llama_ffn_hidden",
    "load_catalog",
    "model_from_dims",
    "model_from_hf_config",
    "numeric_fields",
]

CATALOG_DIR = Path(__file__).resolve().parent

Section = Literal["gpus", "links", "models", "memory"]
SECTIONS: tuple[Section, ...] = ("gpus", "links", "models", "memory")
PACKAGED_FILES: dict[Section, str] = {
    "gpus": "accelerators.toml",
    "links": "links.toml",
    "models": "models.toml",
    "memory": "memory.toml",
}
_SINGULAR: dict[Section, str] = {
    "gpus": "gpu",
    "links": "link",
    "models": "model",
    "memory": "memory device",
}

Entry = dict[str, Any]


class _Invalid(Exception):
    """A value breaks its field's rule (turned into a one-line ValueError by the caller)."""


# --------------------------------------------------------------------------------------------
# Field rules
# --------------------------------------------------------------------------------------------


FieldKind = Literal["number", "integer", "text", "flag", "choice", "ref"]


@dataclass(frozen=True)
class _Field:
    """One field of a section: the rule text for messages and a parser that normalises a value."""

    rule: str
    parse: Callable[[Any], Any]
    kind: FieldKind
    ref_kind: str | None = None  # for kind "ref": the `kind` the named link must have
    required: bool = True  # a new entry must set it

    def optional(self) -> _Field:
        return replace(self, required=False)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(ok: Callable[[float], bool]) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if _is_number(value) and ok(value):
            return float(value)
        raise _Invalid

    return parse


def _positive_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise _Invalid


def _text(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise _Invalid


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _Invalid


def _choice(*options: str) -> _Field:
    def parse(value: Any) -> str:
        if value in options:
            return value
        raise _Invalid

    return _Field(" or ".join(repr(o) for o in options), parse, "choice")


def _link_ref(kind: str, *, optional: bool = False) -> _Field:
    """A field naming an entry of `links` whose `kind` is `kind` (checked once all files are read)."""

    def parse(value: Any) -> str:
        if isinstance(value, str) and (value or optional):
            return value
        raise _Invalid

    rule = f"the key of a {kind} link" + (' or ""' if optional else "")
    return _Field(rule, parse, "ref", ref_kind=kind)


_TEXT = _Field("a non-empty string", _text, "text")
_POSITIVE = _Field("a positive number", _number(lambda v: v > 0), "number")
_NONNEGATIVE = _Field("a number >= 0", _number(lambda v: v >= 0), "number")
_FRACTION = _Field("a number in (0, 1]", _number(lambda v: 0 < v <= 1), "number")
_FRACTION_OR_ZERO = _Field("a number in [0, 1]", _number(lambda v: 0 <= v <= 1), "number")
_COUNT = _Field("a positive integer", _positive_int, "integer")
_FLAG = _Field("true or false", _flag, "flag")

_SCHEMA: dict[Section, dict[str, _Field]] = {
    "gpus": {
        "name": _TEXT,
        "vendor": _TEXT,
        "peak_tflops_bf16": _NONNEGATIVE,
        "peak_tflops_fp16": _NONNEGATIVE,
        "peak_tflops_fp8": _NONNEGATIVE,
        "peak_tflops_fp32": _NONNEGATIVE,
        "gemm_eff_bf16": _FRACTION,
        "gemm_eff_fp8": _FRACTION_OR_ZERO,
        "hbm_capacity_GiB": _POSITIVE,
        "hbm_bw_GBps": _POSITIVE,
        "scaleup_link": _link_ref("scaleup"),
        "scaleup_domain": _COUNT,
        "gpus_per_node": _COUNT,
        "host_link": _link_ref("host"),
        "nic": _link_ref("scaleout"),
        "nics_per_gpu": _POSITIVE,
        "tdp_W": _POSITIVE,
        "price_usd": _POSITIVE,
        "price_usd_per_hour": _POSITIVE,
        # Optional, read by hetersim.build when present:
        "attn_eff_fwd": _FRACTION.optional(),  # flash-attention forward TFLOP/s / bf16 dense peak
        "attn_eff_bwd": _FRACTION.optional(),  # flash-attention backward TFLOP/s / bf16 dense peak
        "sm_count": _COUNT,  # SMs / compute units: GEMM tiles run in waves of this many
        "aliases": _TEXT.optional(),  # other names the key is looked up by, comma-separated
        "attn2_eff_fwd": _FRACTION.optional(),  # FlashAttention-2-class kernel, forward (default: attn_eff_fwd)
        "attn2_eff_bwd": _FRACTION.optional(),  # FlashAttention-2-class kernel, backward (default: attn_eff_bwd)
        "flash_attention": _FLAG.optional(),  # the device runs flash-attention kernels
        "host_dram_GiB": _POSITIVE.optional(),  # host DRAM per node
        "cpu_adam_Gparams_per_s": _POSITIVE.optional(),  # host CPU-Adam throughput per node
        # Memory tiers (read by hetersim.tiers when present; see hetersim/tiers.py):
        "host_dram_channels": _COUNT.optional(),  # DRAM channels per node (all sockets)
        "host_dram_channel": _TEXT.optional(),  # memory device key of one channel (kind "dram")
        "gpus_per_host_link": _COUNT.optional(),  # GPUs behind one upstream PCIe link / root port
        "host_path_GBps": _POSITIVE.optional(),  # measured GPU<->host bandwidth, all GPUs at once
        "cxl_expander": _TEXT.optional(),  # "DEVICE:COUNT" CXL expanders per node
        "cxl_pool": _TEXT.optional(),  # "DEVICE:NHOSTS[:LEVELS]" CXL pool behind a switch
        "cxl_p2p": _FLAG.optional(),  # GPUs reach CXL memory peer-to-peer (CXL 3.x what-if)
        "cxl_expander_GBps": _POSITIVE.optional(),  # what-if: bandwidth of one expander (overrides the device's)
        "cxl_pool_GBps": _POSITIVE.optional(),  # what-if: bandwidth of the pool (overrides the device's)
    },
    "links": {
        "name": _TEXT,
        "kind": _choice("scaleup", "host", "scaleout"),
        "bw_GBps": _POSITIVE,
        "latency_us": _POSITIVE,
        "busbw_eff": _FRACTION,
        # Optional: per-step latency of NCCL's low-latency protocols (absent: Simple only).
        "latency_ll_us": _POSITIVE.optional(),
        "latency_ll128_us": _POSITIVE.optional(),
    },
    "models": {
        "name": _TEXT,
        "layers": _COUNT,
        "hidden": _COUNT,
        "heads": _COUNT,
        "kv_heads": _COUNT,
        "ffn_hidden": _COUNT,
        "vocab": _COUNT,
        "mlp": _choice("gated", "plain"),
        "seq_len": _COUNT,
        "tied_embeddings": _FLAG,
        # Optional, read by hetersim.build when present (defaults follow `mlp`):
        "dropout": _FLAG.optional(),
        "rope": _FLAG.optional(),
    },
    "memory": {
        "name": _TEXT,
        "kind": _choice("dram", "cxl-expander", "cxl-pool", "cxl-switch"),
        "bw_GBps": _POSITIVE,
        "latency_ns": _POSITIVE,
        "capacity_GiB": _NONNEGATIVE,
        "link": _link_ref("host", optional=True),
    },
}

# Provenance: models carry one `source` string, the other sections a `sources` table mapping a
# field name to where its value comes from. Both are optional on load (a user file need not cite);
# the packaged catalog is held to "every number has a source" by tests/test_catalog.py.
_PROVENANCE: dict[Section, str] = {
    "gpus": "sources",
    "links": "sources",
    "models": "source",
    "memory": "sources",
}


def fields(section: Section) -> tuple[str, ...]:
    """The fields a new entry of `section` must set (optional fields and provenance excluded)."""
    return tuple(name for name, spec in _SCHEMA[section].items() if spec.required)


def numeric_fields(section: Section) -> tuple[str, ...]:
    """Fields holding a number, optional ones included (each set one needs a source)."""
    return tuple(name for name, spec in _SCHEMA[section].items() if spec.kind in ("number", "integer"))


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _fail(origin: str, message: str) -> ValueError:
    return ValueError(f"{origin}: {message}".replace("\n", " "))


def _allowed(section: Section) -> str:
    return ", ".join((*_SCHEMA[section], _PROVENANCE[section]))


def _parse_fragment(origin: str, section: Section, key: str, raw: Any) -> Entry:
    """Check field names and values of one entry (or partial override) from one file."""
    label = f"{section}.{key}"
    if not isinstance(raw, dict):
        raise _fail(origin, f"{label} must be a table of fields, got {raw!r}")
    out: Entry = {}
    for name, value in raw.items():
        if name == _PROVENANCE[section]:
            out[name] = _parse_provenance(origin, section, label, value)
        elif name in _SCHEMA[section]:
            out[name] = _parse_value(origin, f"{label}.{name}", _SCHEMA[section][name], value)
        else:
            raise _fail(origin, f"{label} has unknown field {name!r}; allowed: {_allowed(section)}")
    return out


def _parse_value(origin: str, label: str, spec: _Field, value: Any) -> Any:
    try:
        return spec.parse(value)
    except _Invalid:
        raise _fail(origin, f"{label} must be {spec.rule}, got {value!r}") from None


def _parse_provenance(origin: str, section: Section, label: str, value: Any) -> Any:
    if section == "models":
        return _parse_value(origin, f"{label}.source", _TEXT, value)
    if not isinstance(value, dict):
        raise _fail(origin, f'{label}.sources must be a table of field = "source", got {value!r}')
    for name, text in value.items():
        if name not in _SCHEMA[section]:
            allowed = ", ".join(_SCHEMA[section])
            raise _fail(origin, f"{label}.sources has unknown field {name!r}; allowed: {allowed}")
        _parse_value(origin, f"{label}.sources.{name}", _TEXT, text)
    return dict(value)


def _check_complete(origin: str, section: Section, key: str, entry: Entry, *, what: str = "entry") -> None:
    missing = [name for name in fields(section) if name not in entry]
    if missing:
        raise _fail(origin, f"{what} {section}.{key} is missing required fields: {', '.join(missing)}")


def _check_entry(origin: str, section: Section, key: str, entry: Entry) -> None:
    """Rules that tie several fields of one entry together."""
    label = f"{section}.{key}"
    if section == "models":
        heads, kv_heads, hidden = entry["heads"], entry["kv_heads"], entry["hidden"]
        if heads % kv_heads:
            raise _fail(origin, f"{label}.kv_heads must divide heads ({heads}), got {kv_heads}")
        if hidden % heads:
            raise _fail(origin, f"{label}.hidden must be a multiple of heads ({heads}), got {hidden}")
    elif section == "gpus":
        if entry["peak_tflops_bf16"] <= 0 and entry["peak_tflops_fp16"] <= 0:
            raise _fail(origin, f"{label} needs peak_tflops_bf16 or peak_tflops_fp16 > 0, both are 0")
        if (entry["gemm_eff_fp8"] > 0) != (entry["peak_tflops_fp8"] > 0):
            raise _fail(
                origin,
                f"{label}.gemm_eff_fp8 must be > 0 exactly when peak_tflops_fp8 > 0, "
                f"got {entry['gemm_eff_fp8']} with peak_tflops_fp8 = {entry['peak_tflops_fp8']}",
            )
    elif section == "memory":
        is_switch = entry["kind"] == "cxl-switch"
        if is_switch != (entry["capacity_GiB"] == 0):
            rule = "0 for a cxl-switch" if is_switch else "positive unless kind is 'cxl-switch'"
            raise _fail(origin, f"{label}.capacity_GiB must be {rule}, got {entry['capacity_GiB']}")


def _check_refs(origin: str, section: Section, key: str, entry: Entry, links: Mapping[str, Entry]) -> None:
    for name, spec in _SCHEMA[section].items():
        target = entry.get(name)
        if spec.kind != "ref" or not target:
            continue
        label = f"{section}.{key}.{name} = {target!r}"
        if target not in links:
            raise _fail(origin, f"{label} is not a known link; known: {', '.join(sorted(links))}")
        actual = links[target]["kind"]
        if actual != spec.ref_kind:
            raise _fail(origin, f"{label} must name a {spec.ref_kind} link; links.{target} is a {actual} link")


def _merge(base: Entry, fragment: Entry, section: Section) -> Entry:
    """Field-wise merge of an override onto an entry; the `sources` tables merge field-wise too."""
    merged = copy.deepcopy(base)
    for name, value in fragment.items():
        if name == "sources" and section != "models":
            merged.setdefault("sources", {}).update(value)
        else:
            merged[name] = value
    return merged


def _restamp_sources(merged: Entry, fragment: Entry, section: Section, origin: str) -> None:
    """Cite the override for every overridden value whose new source it does not give itself."""
    stamp = f"override from {origin}"
    overridden = [name for name in fragment if name in _SCHEMA[section]]
    if section == "models":
        if overridden and "source" not in fragment:
            merged["source"] = "; ".join(filter(None, (merged.get("source"), stamp)))
        return
    given = fragment.get("sources", {})
    for name in overridden:
        if name not in given:
            merged.setdefault("sources", {})[name] = stamp


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _read_toml(path: Path) -> dict[str, Any]:
    origin = f"catalog file {path}"
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise _fail(origin, "not found") from None
    except tomllib.TOMLDecodeError as error:
        raise _fail(origin, f"invalid TOML: {error}") from None


def _user_sections(path: Path, data: dict[str, Any]) -> dict[Section, dict[str, Any]]:
    origin = f"catalog file {path}"
    out: dict[Section, dict[str, Any]] = {}
    for name, table in data.items():
        if name not in SECTIONS:
            allowed = ", ".join(SECTIONS)
            raise _fail(origin, f"unknown section {name!r}; allowed: {allowed} (write [gpus.<key>] etc.)")
        if not isinstance(table, dict):
            raise _fail(origin, f"section {name!r} must be a table of entries, got {table!r}")
        out[name] = table  # type: ignore[index]
    return out


@dataclass(frozen=True)
class Catalog:
    """Validated catalog: per section, entry key -> dict of fields (with `sources`/`source`)."""

    gpus: dict[str, Entry]
    links: dict[str, Entry]
    models: dict[str, Entry]
    memory: dict[str, Entry]

    def section(self, name: Section) -> dict[str, Entry]:
        if name not in SECTIONS:
            raise ValueError(f"unknown catalog section {name!r}; known: {', '.join(SECTIONS)}")
        return getattr(self, name)

    def gpu(self, key: str) -> Entry:
        return self._lookup("gpus", key)

    def link(self, key: str) -> Entry:
        return self._lookup("links", key)

    def model(self, key: str) -> Entry:
        return self._lookup("models", key)

    def memory_device(self, key: str) -> Entry:
        return self._lookup("memory", key)

    def _lookup(self, section: Section, key: str) -> Entry:
        entries = self.section(section)
        if key not in entries:
            key = self._resolve(entries, key, section)
        return copy.deepcopy(entries[key])

    @staticmethod
    def _resolve(entries: Mapping[str, Entry], key: str, section: Section) -> str:
        """The entry key that ``key`` names case-insensitively or as one of an entry's ``aliases``."""
        want = key.strip().lower()
        for k, entry in entries.items():
            names = [k] + [a.strip() for a in str(entry.get("aliases", "")).split(",") if a.strip()]
            if want in (n.lower() for n in names):
                return k
        raise ValueError(f"unknown {_SINGULAR[section]} {key!r}; known: {', '.join(sorted(entries))}")


def load_catalog(extra: Sequence[str | Path] = ()) -> Catalog:
    """Load the packaged catalog, then each extra file in order (adding or overriding entries)."""
    entries: dict[Section, dict[str, Entry]] = {s: {} for s in SECTIONS}
    last_origin: dict[tuple[Section, str], str] = {}

    def add(origin: str, section: Section, table: Mapping[str, Any]) -> None:
        for key, raw in table.items():
            fragment = _parse_fragment(origin, section, key, raw)
            if key in entries[section]:
                merged = _merge(entries[section][key], fragment, section)
                _restamp_sources(merged, fragment, section, origin)
                entries[section][key] = merged
            else:
                _check_complete(origin, section, key, fragment, what="new entry")
                entries[section][key] = fragment
            last_origin[section, key] = origin

    for section, filename in PACKAGED_FILES.items():
        path = CATALOG_DIR / filename
        add(f"catalog file {path}", section, _read_toml(path))
    for item in extra:
        path = Path(item)
        for section, table in _user_sections(path, _read_toml(path)).items():
            add(f"catalog file {path}", section, table)

    for (section, key), origin in last_origin.items():
        _check_entry(origin, section, key, entries[section][key])
        _check_refs(origin, section, key, entries[section][key], entries["links"])
    return Catalog(**entries)


def apply_overrides(
    section: Section,
    entry_key: str,
    entry: Mapping[str, Any],
    overrides: Mapping[str, float | int | str | bool],
    *,
    origin: str = "apply_overrides",
    catalog: Catalog | None = None,
) -> Entry:
    """Return a copy of `entry` with `overrides` applied and validated like a catalog file.

    String values are parsed for numeric and boolean fields (so CLI ``--set hbm_bw_GBps=9600``
    works); references to links are checked when a `catalog` is given.
    """
    if section not in SECTIONS:
        raise ValueError(f"{origin}: unknown catalog section {section!r}; known: {', '.join(SECTIONS)}")
    raw = {name: _from_text(section, name, value) for name, value in overrides.items()}
    if _PROVENANCE[section] in raw:
        what = _PROVENANCE[section]
        raise _fail(origin, f"{section}.{entry_key}.{what} cannot be set by an override")
    fragment = _parse_fragment(origin, section, entry_key, raw)
    merged = _merge(dict(entry), fragment, section)
    _restamp_sources(merged, fragment, section, origin)
    _check_complete(origin, section, entry_key, merged)
    _check_entry(origin, section, entry_key, merged)
    if catalog is not None:
        _check_refs(origin, section, entry_key, merged, catalog.links)
    return merged


def _from_text(section: Section, name: str, value: Any) -> Any:
    """Parse a CLI-style string for a numeric or boolean field; leave anything else unchanged."""
    spec = _SCHEMA[section].get(name)
    if not isinstance(value, str) or spec is None:
        return value
    text = value.strip()
    try:
        if spec.kind == "integer":
            return int(text)
        if spec.kind == "number":
            return float(text)
    except ValueError:
        return value  # left as text, so validation reports it with the field's rule
    if spec.kind == "flag":
        return {"true": True, "false": False}.get(text.lower(), value)
    return value


# --------------------------------------------------------------------------------------------
# Models from dimensions and from Hugging Face configs
# --------------------------------------------------------------------------------------------


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
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(origin, "not found") from None
    except json.JSONDecodeError as error:
        raise _fail(origin, f"invalid JSON: {error}") from None
    if not isinstance(data, dict):
        raise _fail(origin, f"must hold a JSON object, got {type(data).__name__}")
    return data
