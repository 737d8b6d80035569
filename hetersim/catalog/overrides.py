"""Overrides of one catalog entry (the CLI's ``--set``, a study's ``[hardware.set]``), validated
like a catalog file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .check import (
    CLOCK_DERIVED,
    CLOCK_FIELDS,
    HOST_REFS,
    MEASURED_FIELDS,
    _check_complete,
    _check_entry,
    _check_host_refs,
    _check_refs,
    _fail,
    _merge,
    _parse_fragment,
    _restamp_sources,
)
from .load import Catalog
from .schema import _PROVENANCE, _SCHEMA, SECTIONS, Entry, Section


def apply_overrides(
    section: Section,
    entry_key: str,
    entry: Mapping[str, Any],
    overrides: Mapping[str, float | int | str | bool],
    *,
    origin: str = "apply_overrides",
    catalog: Catalog | None = None,
    text: bool = True,
) -> Entry:
    """Return a copy of `entry` with `overrides` applied and validated like a catalog file.

    With ``text`` (the CLI's), string values are parsed for numeric and boolean fields (so
    ``--set hbm_bw_GBps=9600`` works); a file's (``text=False``) are typed as a catalog file's.
    References to links are checked when a `catalog` is given.
    """
    if section not in SECTIONS:
        raise ValueError(f"{origin}: unknown catalog section {section!r}; known: {', '.join(SECTIONS)}")
    raw = {name: _from_text(section, name, value) if text else value for name, value in overrides.items()}
    if _PROVENANCE[section] in raw:
        what = _PROVENANCE[section]
        raise _fail(origin, f"{section}.{entry_key}.{what} cannot be set by an override")
    for eff, measured in MEASURED_FIELDS.items() if section == "gpus" else ():
        if eff in raw and measured in entry and measured not in raw:  # it would change nothing
            raise _fail(
                origin,
                f"{section}.{entry_key}.{eff} is set by the entry's {measured} (a measured figure wins); "
                f"set {measured} instead",
            )
    if "aliases" in raw:  # other names to look the key up by: nothing priced
        raise _fail(origin, f"{section}.{entry_key}.aliases names the entry: an override of it changes nothing")
    entry = _clock_derived_dropped(section, entry_key, entry, raw, origin)
    fragment = _parse_fragment(origin, section, entry_key, raw)
    merged = _merge(dict(entry), fragment, section)
    _restamp_sources(merged, fragment, section, origin)
    _check_complete(origin, section, entry_key, merged)
    _check_entry(origin, section, entry_key, merged)
    if catalog is not None:
        _check_refs(origin, section, entry_key, merged, catalog.links)
        if section == "gpus" and any(name in fragment for name in HOST_REFS):
            _check_host_refs(origin, entry_key, merged, vars(catalog))
    return merged


def _from_text(section: Section, name: str, value: Any) -> Any:
    """Parse a CLI-style string for a numeric or boolean field; leave anything else unchanged."""
    spec = _SCHEMA[section].get(name)
    if not isinstance(value, str) or spec is None:
        return value
    text = value.strip()
    if "_" in text or not text.isascii():  # int and float read "1_0" as 10 and "٣٠" as 30: left as
        return value  # text, refused by the field's rule
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


def _clock_derived_dropped(section: Section, key: str, entry: Mapping[str, Any], raw: Mapping[str, Any], origin: str):
    """``entry`` without the matmul efficiencies its clocks gave it where ``raw`` sets a clock (so
    they are derived from the new one); a clock of an entry whose efficiency is given or measured
    would change nothing, and is refused."""
    if section != "gpus" or not set(CLOCK_FIELDS) & raw.keys() or "gemm_eff_bf16" in raw:
        return entry
    sources = entry.get("sources", {})
    derived = {f for f in ("gemm_eff_bf16", "gemm_eff_fp8") if sources.get(f) == CLOCK_DERIVED and f not in raw}
    if "gemm_eff_bf16" not in derived:
        clock = next(f for f in CLOCK_FIELDS if f in raw)
        raise _fail(
            origin,
            f"{section}.{key}.{clock} changes nothing: the entry's gemm_eff_bf16 is given, and a clock only sets "
            "that of a device without one; set gemm_eff_bf16 or measured_gemm_tflops_bf16 instead",
        )
    return {k: v for k, v in entry.items() if k not in derived}
