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
        if entry.get("n_experts") and entry.get("top_k") is None:  # no default: Mixtral routes 2, DeepSeek-V3 8
            raise _fail(origin, f"{label}.n_experts {entry['n_experts']} needs top_k (experts a token is routed to)")
        if entry.get("sliding_window_share") is not None and not entry.get("sliding_window"):
            raise _fail(origin, f"{label}.sliding_window_share needs sliding_window (the window its layers see)")
        from ..build import moe_fields  # the experts' and latent attention's own rules, here at load

        try:
            moe_fields(entry)
        except ValueError as error:  # "model NAME: top_k = 2 needs n_experts ...": named by file and entry
            raise _fail(origin, f"{label}: {str(error).partition(': ')[2]}") from None
    elif section == "gpus":
        if entry["peak_tflops_bf16"] <= 0 and entry["peak_tflops_fp16"] <= 0:
            raise _fail(origin, f"{label} needs peak_tflops_bf16 or peak_tflops_fp16 > 0, both are 0")
        _check_node(origin, label, entry)
        _derive_efficiencies(origin, label, entry)
        if (entry["gemm_eff_fp8"] > 0) != (entry["peak_tflops_fp8"] > 0):
            raise _fail(
                origin,
                f"{label}.gemm_eff_fp8 must be > 0 exactly when peak_tflops_fp8 > 0, "
                f"got {entry['gemm_eff_fp8']} with peak_tflops_fp8 = {entry['peak_tflops_fp8']}",
            )
    elif section == "links":
        _derive_busbw(origin, label, entry)
    elif section == "memory":
        is_switch = entry["kind"] == "cxl-switch"
        if is_switch != (entry["capacity_GiB"] == 0):
            rule = "0 for a cxl-switch" if is_switch else "positive unless kind is 'cxl-switch'"
            raise _fail(origin, f"{label}.capacity_GiB must be {rule}, got {entry['capacity_GiB']}")
    elif section == "fleets":
        if sum(v for k, v in entry.items() if k.startswith("interruptions_")) <= 0:
            raise _fail(origin, f"{label} needs interruptions > 0 (a failure rate must be positive), all are 0")


def fits_nodes(domain: int, node: int) -> bool:
    """A scale-up domain of ``domain`` GPUs is whole nodes of ``node`` or a part of one dividing it."""
    return domain % node == 0 or node % domain == 0


def _check_node(origin: str, label: str, entry: Entry) -> None:
    """A scale-up domain is whole nodes (NVL72: 18 nodes of 4) or a part of one that divides it
    (a PCIe machine's 1 of 8); a clock held under the power limit is at most the boost clock."""
    domain, node = entry.get("scaleup_domain"), entry.get("gpus_per_node")
    if domain and node and not fits_nodes(domain, node):
        raise _fail(
            origin, f"{label}.scaleup_domain {domain} neither divides nor is whole nodes of gpus_per_node {node}"
        )
    boost, held = entry.get("boost_clock_MHz"), entry.get("sustained_clock_MHz")
    if boost and held and held > boost:
        raise _fail(origin, f"{label}.sustained_clock_MHz {held:g} exceeds boost_clock_MHz {boost:g}")


# A device without a measured matmul efficiency: the median best-case share of the peak over the
# catalog's measured NVIDIA parts (A100 0.869, H100 0.803, B200 0.776, GB200 0.729; MAMF table of
# stas00/ml-engineering compute/accelerator/README.md @744d01e) = 0.79, times the share of the
# boost clock it sustains under its power limit: a T4 (70 W) holds about 900 of 1590 MHz in long
# GEMMs and sustains about 24 of 65 TFLOP/s fp16 (0.37; 0.79 x 900/1590 = 0.45).
DEFAULT_MAMF_SHARE = 0.79
CLOCK_FIELDS = ("boost_clock_MHz", "sustained_clock_MHz")
# The source of an efficiency derived from the clocks, so that an override of a clock derives it anew.
CLOCK_DERIVED = "derived: DEFAULT_MAMF_SHARE (hetersim.catalog.check) x sustained_clock_MHz / boost_clock_MHz"
# A measured figure under this share of its peak is a unit slip (PFLOP/s written as TFLOP/s reads as
# 0.1 %), not a measurement: the lowest sustained share the sources above give is the T4's 0.37.
MEASURED_FLOOR = 0.05


def _measured_share(origin: str, label: str, entry: Entry, measured: str, peak: str) -> float | None:
    if measured not in entry:
        return None
    value, top = float(entry[measured]), float(entry.get(peak, 0.0))
    if top <= 0:
        raise _fail(origin, f"{label}.{measured} needs {peak} > 0")
    if value > top:
        raise _fail(
            origin, f"{label}.{measured} = {value:g} exceeds {peak} = {top:g}; a measured rate cannot pass the peak"
        )
    if value < MEASURED_FLOOR * top:
        raise _fail(
            origin,
            f"{label}.{measured} = {value:g} is under {MEASURED_FLOOR:.0%} of {peak} = {top:g}: give it in the "
            "units the tool prints (TFLOP/s, GB/s), as measured",
        )
    return value / top


# A measured figure (a tool's output) and the efficiency it sets: the figure wins over a stated one.
MEASURED_FIELDS = {
    "gemm_eff_bf16": "measured_gemm_tflops_bf16",
    "gemm_eff_fp8": "measured_gemm_tflops_fp8",
    "attn_eff_fwd": "measured_attn_tflops_fwd",
    "attn_eff_bwd": "measured_attn_tflops_bwd",
}


def _derive_efficiencies(origin: str, label: str, entry: Entry) -> None:
    """Fill gemm_eff_* and attn_eff_* from measured figures (these win over a stated efficiency),
    else gemm_eff_bf16 from the sustained clock (:data:`DEFAULT_MAMF_SHARE`)."""
    peak16 = "peak_tflops_bf16" if entry["peak_tflops_bf16"] > 0 else "peak_tflops_fp16"
    for eff, measured, peak in (
        ("gemm_eff_bf16", "measured_gemm_tflops_bf16", peak16),
        ("gemm_eff_fp8", "measured_gemm_tflops_fp8", "peak_tflops_fp8"),
        ("attn_eff_fwd", "measured_attn_tflops_fwd", peak16),
        ("attn_eff_bwd", "measured_attn_tflops_bwd", peak16),
    ):
        share = _measured_share(origin, label, entry, measured, peak)
        if share is not None:
            entry[eff] = share
    if "gemm_eff_bf16" not in entry:
        if "boost_clock_MHz" not in entry or "sustained_clock_MHz" not in entry:
            raise _fail(
                origin,
                f"{label} has no gemm_eff_bf16: give it, measured_gemm_tflops_bf16 (mamf-finder), "
                "or boost_clock_MHz and sustained_clock_MHz",
            )
        clock = min(float(entry["sustained_clock_MHz"]) / float(entry["boost_clock_MHz"]), 1.0)
        entry["gemm_eff_bf16"] = DEFAULT_MAMF_SHARE * clock
        entry.setdefault("sources", {})["gemm_eff_bf16"] = CLOCK_DERIVED
        if "gemm_eff_fp8" not in entry and entry["peak_tflops_fp8"] > 0:
            entry["sources"]["gemm_eff_fp8"] = CLOCK_DERIVED
    entry.setdefault("gemm_eff_fp8", entry["gemm_eff_bf16"] if entry["peak_tflops_fp8"] > 0 else 0.0)


def _derive_busbw(origin: str, label: str, entry: Entry) -> None:
    share = _measured_share(origin, label, entry, "measured_busbw_GBps", "bw_GBps")
    if share is not None:
        entry["busbw_eff"] = share
    if "busbw_eff" not in entry:
        raise _fail(origin, f"{label} has no busbw_eff: give it or measured_busbw_GBps (nccl-tests busbw)")


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


# GPU fields that name entries of other sections (memory devices, fleets): resolved when a host is
# built, so checked by building it where the entry enters (a catalog file, --set, hardware.set).
HOST_REFS = ("fleet", "cxl_expander", "cxl_pool", "host_dram_channel")


def _check_host_refs(origin: str, key: str, entry: Entry, sections: Mapping[str, Mapping[str, Entry]]) -> None:
    """The memory devices and the fleet a GPU entry names exist, as their sections say."""
    if not any(name in entry for name in HOST_REFS):
        return
    from hetersim.build import system_spec  # the catalog is loaded by build's callers: no cycle at import

    try:
        system_spec(entry, sections["links"], memory=sections["memory"], fleets=sections["fleets"])
    except ValueError as error:
        raise _fail(origin, f"gpus.{key}.{error}") from None


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
        return parse(path.read_bytes().decode("utf-8-sig"))  # an editor's byte-order mark is no statement
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
