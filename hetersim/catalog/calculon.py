"""Calculon's system files (``systems/*.json``) as a catalog device, so its users can compare.

The format, as calculon-ai/calculon reads it at commit caa4b11f (``calculon/system.py``,
``processor.py``, ``memory.py``, ``network.py``; ``systems/a100_80g.json``):

* ``matrix`` / ``vector``: per datatype (``float8``, ``float16``, ``bfloat16``, ``float32``) a
  ``tflops`` peak and ``gflops_efficiency``, rows ``[GFLOP, efficiency]`` in decreasing size: an
  operation of at least that many GFLOP runs at that share of the peak.
* ``mem1`` (HBM) / ``mem2`` (the offload memory), per processor: ``GiB``, ``GBps`` and
  ``MB_efficiency`` (rows ``[MB, efficiency]``).
* ``processing_mode``: ``"roofline"`` or ``"no_overlap"`` (compute and memory time combined).
* ``networks``: tier 0 first; each ``bandwidth`` (GB/s), ``efficiency``, ``size`` (processors it
  spans), ``latency`` (seconds per operation), ``ops`` (per collective ``[scalar, offset]``),
  ``must_be_filled``, ``processor_usage``.

The mapping onto a catalog GPU entry (:func:`calculon_device`): the matrix peaks give
``peak_tflops_*`` (``bfloat16`` takes ``float16``'s numbers where the file has none, and the
reverse, as the catalog's 16-bit rule does; a datatype the file lacks is unsupported, 0) and the
first (largest-operation) row of each table gives ``gemm_eff_*``, the best-case share the catalog
holds; smaller GEMMs lose by hetersim's own wave and shape terms. ``mem1`` gives
``hbm_capacity_GiB`` / ``hbm_bw_GBps``; ``mem2`` the host tier, per node (``host_dram_GiB`` and
``host_path_GBps`` = the per-processor figure x ``gpus_per_node``). ``networks[0]`` becomes the
scale-up link (``bandwidth``, ``efficiency`` as ``busbw_eff``, ``latency`` as its per-step
latency) and ``scaleup_domain`` (its ``size``); ``networks[1]`` the NIC (one per GPU). Everything
Calculon does not describe (power, price, SM count, host link, attention kernels) stays the base
entry's. Read and checked but not used, because hetersim's own models apply (:data:`UNUSED`): the
``vector`` tables, the smaller rows of every efficiency table, ``processing_mode``, the ``ops``
scalars (hetersim picks NCCL's algorithms), ``must_be_filled``, ``processor_usage`` and the
scale-out ``size`` (hetersim's scale-out spans the job). Anything else, a third network or a key
Calculon does not have, is refused with a one-line error naming the key.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import jsontext
from .check import _check_entry, _check_refs, _fail, _parse_fragment, fits_nodes, read_document
from .schema import MAX_NUMBER, Entry, _is_number

CALCULON_COMMIT = "caa4b11f8fe1fee3ba57adaacb7590d7deabd053"
_TOP_KEYS = ("matrix", "vector", "mem1", "mem2", "processing_mode", "networks")
_DATATYPES = {"float16": "fp16", "bfloat16": "bf16", "float8": "fp8", "float32": "fp32"}
_MEMORY_KEYS = ("GiB", "GBps", "MB_efficiency")
_NETWORK_KEYS = ("bandwidth", "efficiency", "size", "latency", "ops", "must_be_filled", "processor_usage")
_NETWORK_OPS = ("p2p", "reduce_scatter", "all_gather", "all_reduce")
_PROCESSING_MODES = ("roofline", "no_overlap")
UNUSED = (
    "vector",
    "gflops_efficiency/MB_efficiency rows after the first",
    "mem1.MB_efficiency",
    "mem2.MB_efficiency",
    "processing_mode",
    "networks[*].ops",
    "networks[*].must_be_filled",
    "networks[*].processor_usage",
    "networks[1].size",
)
# Fields of the base entry that would override what the file says (a measured rate wins over a
# stated efficiency in catalog.check) or derive an efficiency the file now gives.
# The base's aliases stay its own.
_DROPPED = (
    "measured_gemm_tflops_bf16",
    "measured_gemm_tflops_fp8",
    "boost_clock_MHz",
    "sustained_clock_MHz",
    "aliases",
)


def _number(origin: str, label: str, value: Any, *, low: float = 0.0, strict: bool = True, high=MAX_NUMBER) -> float:
    ok = _is_number(value) and (value > low if strict else value >= low) and value <= high
    if not ok:
        rule = f"a number {'>' if strict else '>='} {low:g}" + (f" and <= {high:g}" if high != MAX_NUMBER else "")
        raise _fail(origin, f"{label} must be {rule}, got {value!r}")
    return float(value)


def _keys(origin: str, label: str, table: Any, allowed: tuple[str, ...], *, required: bool = True) -> dict:
    if not isinstance(table, dict):
        raise _fail(origin, f"{label} must be a JSON object, got {table!r}")
    for key in table:
        if key not in allowed:
            known = ", ".join(allowed)
            raise _fail(origin, f"{label}.{key} is not a Calculon system key hetersim can map; known: {known}")
    missing = [k for k in allowed if k not in table] if required else []
    if missing:
        raise _fail(origin, f"{label}.{missing[0]} is missing")
    return table


def _table(origin: str, label: str, rows: Any) -> float:
    """Check an efficiency table (rows ``[size, efficiency]``, sizes decreasing); its first row's
    efficiency, the best case."""
    if not isinstance(rows, list) or not rows:
        raise _fail(origin, f"{label} must be a non-empty list of [size, efficiency] rows, got {rows!r}")
    last = None
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 2):
            raise _fail(origin, f"{label}[{i}] must be a [size, efficiency] pair, got {row!r}")
        size = _number(origin, f"{label}[{i}][0]", row[0], strict=False)
        _number(origin, f"{label}[{i}][1]", row[1], high=1.0)
        if last is not None and size >= last:
            raise _fail(origin, f"{label}[{i}][0] must be below the row before ({last:g}), got {size:g}")
        last = size
    return float(rows[0][1])


def _processor(origin: str, label: str, table: Any) -> dict[str, tuple[float, float]]:
    """datatype -> (peak TFLOP/s, best-case efficiency)."""
    table = _keys(origin, label, table, tuple(_DATATYPES), required=False)
    if not table:
        raise _fail(origin, f"{label} names no datatype; known: {', '.join(_DATATYPES)}")
    out = {}
    for dtype, spec in table.items():
        spec = _keys(origin, f"{label}.{dtype}", spec, ("tflops", "gflops_efficiency"))
        peak = _number(origin, f"{label}.{dtype}.tflops", spec["tflops"])
        out[dtype] = (peak, _table(origin, f"{label}.{dtype}.gflops_efficiency", spec["gflops_efficiency"]))
    return out


def _memory(origin: str, label: str, table: Any) -> tuple[float, float]:
    table = _keys(origin, label, table, _MEMORY_KEYS)
    _table(origin, f"{label}.MB_efficiency", table["MB_efficiency"])
    return _number(origin, f"{label}.GiB", table["GiB"]), _number(origin, f"{label}.GBps", table["GBps"])


def _network(origin: str, label: str, table: Any) -> dict[str, float]:
    table = _keys(origin, label, table, _NETWORK_KEYS)
    ops = _keys(origin, f"{label}.ops", table["ops"], _NETWORK_OPS)
    for op, pair in ops.items():
        if not (isinstance(pair, list) and len(pair) == 2):
            raise _fail(origin, f"{label}.ops.{op} must be a [scalar, offset] pair, got {pair!r}")
        _number(origin, f"{label}.ops.{op}[0]", pair[0])
        if pair[1] is not None and not (_is_number(pair[1]) and abs(pair[1]) <= MAX_NUMBER):
            raise _fail(origin, f"{label}.ops.{op}[1] (the offset) must be a number or null, got {pair[1]!r}")
    if not isinstance(table["must_be_filled"], bool):
        raise _fail(origin, f"{label}.must_be_filled must be true or false, got {table['must_be_filled']!r}")
    _number(origin, f"{label}.processor_usage", table["processor_usage"], strict=False, high=0.999999)
    size = table["size"]
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
        raise _fail(origin, f"{label}.size must be a positive integer, got {size!r}")
    return {
        "bw_GBps": _number(origin, f"{label}.bandwidth", table["bandwidth"]),
        "busbw_eff": _number(origin, f"{label}.efficiency", table["efficiency"], high=1.0),
        # hetersim's links need a positive per-step latency (seconds in the file, us here).
        "latency_us": _number(origin, f"{label}.latency", table["latency"], high=MAX_NUMBER / 1e6) * 1e6,
        "size": size,
    }


def read_calculon_system(path: str | Path) -> dict[str, Any]:
    """The checked contents of a Calculon system file: ``matrix`` (datatype -> (TFLOP/s, best
    efficiency)), ``mem1`` / ``mem2`` ((GiB, GB/s) per processor) and ``networks`` (two dicts of
    ``bw_GBps``, ``busbw_eff``, ``latency_us``, ``size``). One-line ``ValueError`` otherwise."""
    path = Path(path)
    origin = f"Calculon system file {path}"
    data = read_document(path, origin, "JSON", jsontext.loads, json.JSONDecodeError, "a Calculon systems/*.json file")
    data = _keys(origin, "system", data, _TOP_KEYS)
    matrix = _processor(origin, "matrix", data["matrix"])
    if "float16" not in matrix and "bfloat16" not in matrix:
        raise _fail(origin, "matrix needs float16 or bfloat16 (hetersim's models train in 16 bits)")
    _processor(origin, "vector", data["vector"])
    if data["processing_mode"] not in _PROCESSING_MODES:
        modes = " or ".join(repr(m) for m in _PROCESSING_MODES)
        raise _fail(origin, f"processing_mode must be {modes}, got {data['processing_mode']!r}")
    networks = data["networks"]
    if not isinstance(networks, list) or len(networks) != 2:
        count = len(networks) if isinstance(networks, list) else networks
        raise _fail(
            origin, f"networks must list two networks (scale-up, then scale-out), as hetersim models; got {count!r}"
        )
    return {
        "matrix": matrix,
        "mem1": _memory(origin, "mem1", data["mem1"]),
        "mem2": _memory(origin, "mem2", data["mem2"]),
        "networks": [_network(origin, f"networks[{i}]", n) for i, n in enumerate(networks)],
    }


def calculon_device(path: str | Path, base: Entry) -> tuple[Entry, dict[str, Entry]]:
    """(GPU entry, its two links) from a Calculon system file over ``base`` (a catalog GPU entry
    that gives what Calculon does not describe); see the module docstring for the mapping."""
    path = Path(path)
    system = read_calculon_system(path)
    matrix = system["matrix"]
    cite = f"Calculon system file {path}:"
    entry = {k: v for k, v in copy.deepcopy(base).items() if k not in _DROPPED}
    sources = {k: v for k, v in entry.pop("sources", {}).items() if k not in _DROPPED}

    def put(field: str, value: Any, source: str) -> None:
        entry[field] = value
        sources[field] = f"{cite} {source}"

    for hetersim_name, own, other in (("bf16", "bfloat16", "float16"), ("fp16", "float16", "bfloat16")):
        dtype = own if own in matrix else other
        put(f"peak_tflops_{hetersim_name}", matrix[dtype][0], f"matrix.{dtype}.tflops")
    dtype16 = "bfloat16" if "bfloat16" in matrix else "float16"
    put("gemm_eff_bf16", matrix[dtype16][1], f"matrix.{dtype16}.gflops_efficiency[0] (largest operations)")
    for hetersim_name, dtype in (("fp8", "float8"), ("fp32", "float32")):
        peak = matrix[dtype][0] if dtype in matrix else 0.0
        put(f"peak_tflops_{hetersim_name}", peak, f"matrix.{dtype}.tflops" if dtype in matrix else f"no matrix.{dtype}")
    if "float8" in matrix:
        put("gemm_eff_fp8", matrix["float8"][1], "matrix.float8.gflops_efficiency[0] (largest operations)")
    else:
        put("gemm_eff_fp8", 0.0, "no matrix.float8")
    put("hbm_capacity_GiB", system["mem1"][0], "mem1.GiB")
    put("hbm_bw_GBps", system["mem1"][1], "mem1.GBps")
    per_node = int(base["gpus_per_node"])
    put("host_dram_GiB", system["mem2"][0] * per_node, f"mem2.GiB x gpus_per_node {per_node}")
    put("host_path_GBps", system["mem2"][1] * per_node, f"mem2.GBps x gpus_per_node {per_node}")
    up, out = system["networks"]
    if not fits_nodes(up["size"], per_node):  # the catalog's rule, named by the file's key
        raise _fail(
            f"Calculon system file {path}",
            f"networks[0].size {up['size']} neither divides nor is whole nodes of {base['name']}'s {per_node} GPUs",
        )
    put("scaleup_domain", up["size"], "networks[0].size")
    put("nics_per_gpu", 1.0, "networks[1] is one network per processor")
    links: dict[str, Entry] = {}
    for i, (net, kind, field) in enumerate(((up, "scaleup", "scaleup_link"), (out, "scaleout", "nic"))):
        key = f"calculon-{path.stem}-net{i}"
        links[key] = {
            "name": f"{path.stem} networks[{i}] (Calculon)",
            "kind": kind,
            **{k: net[k] for k in ("bw_GBps", "busbw_eff", "latency_us")},
            "sources": {
                "bw_GBps": f"{cite} networks[{i}].bandwidth",
                "busbw_eff": f"{cite} networks[{i}].efficiency",
                "latency_us": f"{cite} networks[{i}].latency (per operation there, per step here)",
            },
        }
        put(field, key, f"networks[{i}]")
    entry["name"] = f"{base['name']} as Calculon's {path.name}"
    entry["sources"] = sources
    return entry, links


def with_calculon_system(catalog, gpu: str, path: str | Path):
    """``(catalog, key)``: the catalog with one more GPU entry, ``calculon-<file stem>``, which is
    the ``gpu`` entry with what the Calculon system file at ``path`` describes (and its two links),
    checked as every catalog entry is."""
    path = Path(path)
    origin = f"Calculon system file {path}"
    entry, links = calculon_device(path, catalog.gpu(gpu))
    key = f"calculon-{path.stem}"
    all_links = {**catalog.links}
    for link_key, link in links.items():
        all_links[link_key] = _parse_fragment(origin, "links", link_key, link)
        _check_entry(origin, "links", link_key, all_links[link_key])
    parsed = _parse_fragment(origin, "gpus", key, entry)
    _check_entry(origin, "gpus", key, parsed)
    _check_refs(origin, "gpus", key, parsed, all_links)
    return replace(catalog, gpus={**catalog.gpus, key: parsed}, links=all_links), key
