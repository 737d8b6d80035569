"""Checks of catalog entries: one file's fragment of an entry, a whole entry, references to links;
and the merge of an override onto an entry. Every problem is a one-line ``ValueError``."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .schema import _PROVENANCE, _SCHEMA, _TEXT, Entry, Section, _Field, _Invalid, fields


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
    except _Invalid as invalid:
        rule = f"{spec.rule}, {invalid}" if str(invalid) and spec.kind == "number" else str(invalid) or spec.rule
        raise _fail(origin, f"{label} must be {rule}, got {value!r}") from None


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
        if entry.get("head_dim") is None and hidden % heads:
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


def read_document(path: Path, origin: str, kind: str, parse, decode_error: type[Exception], folder_hint: str):
    """``parse(text)`` of the file at ``path`` (TOML or JSON, named ``kind`` in errors), with one
    one-line ``ValueError`` naming ``origin`` for every way reading it can fail."""
    try:
        return parse(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise _fail(origin, "not found") from None
    except IsADirectoryError:
        raise _fail(origin, f"is a folder; give {folder_hint}") from None
    except OSError as error:
        raise _fail(origin, f"cannot read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise _fail(origin, f"not a text (UTF-8) {kind} file") from None
    except decode_error as error:
        raise _fail(origin, f"invalid {kind}: {error}") from None
