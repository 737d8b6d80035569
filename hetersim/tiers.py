"""Memory tiers of a node, host side: catalog memory devices and options -> :class:`HostSpec`.

A node's GPUs reach three tiers beyond their HBM (``hetersim.types.TIER``):

* **host DRAM**, over each GPU's own host link (PCIe or NVLink-C2C), through the root ports the
  node's GPUs share, into the DRAM channels of the sockets;
* **CXL Type-3 expanders** attached to the host (``cxl_expander="micron-cz120:2"``): the same GPU
  path into the host, then the expanders' own CXL links and media;
* **a CXL memory pool** behind a CXL switch, shared by several hosts
  (``cxl_pool="samsung-cmm-b-pool:4hosts[:LEVELS]"``): the host's switch port, one or more switch
  levels (each adds a hop of latency) and the pool's bandwidth and capacity, both shared by the
  hosts that use it.

``cxl_p2p`` is the CXL 3.x what-if: GPUs reach the CXL tiers peer-to-peer through the fabric,
so the host's root ports and its switch port drop out of the path.

This module turns those options into the fixed-size tier arrays of :class:`HostSpec`; the
traced cost of moving state over them is :mod:`hetersim.terms.offload`. Nothing here is traced:
bad input is a one-line ``ValueError`` (unknown device, a device of the wrong kind, a count or
capacity that is not positive, an offload to a tier the node lacks) that names the argument or
catalog field (``cxl_expander``, ``cxl_pool``, ``offload``); the CLI shows its flag instead.

Measured figures this module uses, all from ``hetersim/data/offload_components.csv``:

* pinned H2D copy, one GPU, PCIe 5: 51.77 GiB/s from local DRAM, 49.81 GiB/s from a CXL card
  (the CXL card's longer latency, see ``offload.DMA_WINDOW_NS``); two GPUs sharing the card get
  24.87 GiB/s each (its bandwidth, split);
* D2H into the CXL card: 34.66 GiB/s against 49.81 GiB/s H2D (``CXL_WRITE_EFF``); into local
  DRAM 51.69 against 51.77 (``DRAM_WRITE_EFF``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .pytree import as_arrays
from .specs import HostSpec
from .types import N_TIERS, TIER

HOST_DRAM, CXL_EXPANDER, CXL_POOL = 1, 2, 3

# Write / read bandwidth of the devices. Measured with pinned cudaMemcpyAsync, one GPU,
# 2 GiB transfers (github DandinPower/numa-gpu-xfer-bench, offload_components.csv):
DRAM_WRITE_EFF = 51.69 / 51.77  # D2H / H2D, local DRAM
CXL_WRITE_EFF = 34.66 / 49.81  # D2H / H2D, one CXL add-in card; assumed for pools built of CXL modules

DEFAULT_DRAM_CHANNEL = "ddr5-4800-channel"
DEFAULT_DRAM_CHANNELS = 16  # estimate: two sockets of 8 DDR5 channels (the DGX H100 host)
CXL2_SWITCH, CXL3_SWITCH = "cxl2-switch", "cxl3-switch"

MAX_COUNT = 1 << 16  # CXL devices per node, hosts per pool, switch levels: far above any product
_EXPANDER_RE = re.compile(r"^(?P<device>[^:]+):(?P<count>[^:]+)$")
_POOL_RE = re.compile(r"^(?P<device>[^:]+):(?P<hosts>[^:]+?)(?:hosts?)?(?::(?P<levels>[^:]+?)(?:levels?)?)?$")


# --------------------------------------------------------------------------------------------
# Option parsing
# --------------------------------------------------------------------------------------------


def _count(what: str, text: str, given: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be a positive integer; got {given!r}") from None
    if value <= 0:
        raise ValueError(f"{what} must be a positive integer; got {given!r}")
    if value > MAX_COUNT:
        raise ValueError(f"{what} must be a positive integer <= {MAX_COUNT:,}; got {given!r}")
    return value


def parse_expander(text: str) -> tuple[str, int]:
    """``"micron-cz120:2"`` -> ``("micron-cz120", 2)``: CXL expanders per node."""
    m = _EXPANDER_RE.match(text.strip())
    if not m:
        raise ValueError(f"cxl_expander expects DEVICE:COUNT (e.g. micron-cz120:2); got {text!r}")
    return m["device"].strip(), _count("cxl_expander COUNT", m["count"].strip(), text)


def parse_pool(text: str) -> tuple[str, int, int]:
    """``"cmm-b:4hosts"`` or ``"cmm-b:4hosts:2"`` -> ``(device, hosts, switch levels)``."""
    m = _POOL_RE.match(text.strip())
    if not m:
        raise ValueError(f"cxl_pool expects DEVICE:NHOSTS[:LEVELS] (e.g. samsung-cmm-b-pool:4hosts); got {text!r}")
    hosts = _count("cxl_pool NHOSTS", m["hosts"].strip(), text)
    levels = _count("cxl_pool LEVELS", m["levels"].strip(), text) if m["levels"] else 1
    if levels > max(1, hosts - 1):  # a switch joins two or more ports below it: n hosts, n - 1 levels deep at most
        raise ValueError(
            f"cxl_pool LEVELS must be at most {max(1, hosts - 1)} for {hosts} hosts (a tree of switches, each "
            f"joining two or more ports, is that deep at most); got {text!r}"
        )
    return m["device"].strip(), hosts, levels


def resolve_device(memory: Mapping[str, Mapping[str, Any]], name: str, kind: str, field: str) -> str:
    """The memory-catalog key ``name`` stands for: the key itself, or the one key of that kind
    that contains it as whole dash-separated words (``cmm-b`` -> ``samsung-cmm-b-pool``); errors
    name ``field``, the option that gave it."""
    of_kind = sorted(k for k, e in memory.items() if e.get("kind") == kind)
    if name in memory:
        if memory[name].get("kind") != kind:
            raise ValueError(
                f"{field}: {name!r} is a {memory[name].get('kind')}, not a {kind}; known: {', '.join(of_kind)}"
            )
        return name
    words = re.compile(rf"(^|-){re.escape(name)}(-|$)")
    hits = [k for k in of_kind if words.search(k)]
    if len(hits) == 1:
        return hits[0]
    what = "ambiguous" if hits else "unknown"
    raise ValueError(f"{field}: {what} {kind} {name!r}; known: {', '.join(of_kind)}")


@functools.cache
def _packaged_memory() -> dict[str, dict[str, Any]]:
    from .catalog import load_catalog

    return load_catalog().memory


# --------------------------------------------------------------------------------------------
# HostSpec
# --------------------------------------------------------------------------------------------


def _link_bw(links: Mapping[str, Mapping[str, Any]], key: str) -> float:
    """Achievable bandwidth of a link: nominal times its measured copy efficiency."""
    link = links[key]
    return float(link["bw_GBps"]) * float(link["busbw_eff"])


def _device_bw(device: Mapping[str, Any], links: Mapping[str, Mapping[str, Any]]) -> float:
    """A CXL device's streaming bandwidth: its media, capped by its own CXL link where known."""
    bw = float(device["bw_GBps"])
    if device.get("link"):
        bw = min(bw, _link_bw(links, device["link"]))
    return bw


def _with_bw(device: Mapping[str, Any], gpu: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    """The device, with the GPU entry's what-if bandwidth ``field`` in place of its own (the media
    bandwidth; its link still caps it)."""
    if gpu.get(field) is None:
        return device
    return {**device, "bw_GBps": _positive(field, float(gpu[field]))}


def _positive(what: str, value: float) -> float:
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be positive; got {value!r}")
    return value


class _Tiers:
    """The [N_TIERS] arrays of a :class:`HostSpec`, filled one tier at a time (HBM: present)."""

    def __init__(self) -> None:
        self.present = np.zeros(N_TIERS)
        self.cap = np.zeros(N_TIERS)
        self.path = np.ones(N_TIERS)
        self.node = np.ones(N_TIERS)
        self.shared = np.zeros(N_TIERS)
        self.hosts = np.ones(N_TIERS)
        self.write = np.ones(N_TIERS)
        self.cpu = np.ones(N_TIERS)
        self.lat = np.zeros(N_TIERS)
        self.present[0] = 1.0

    def set(self, tier: int, **values: float) -> None:
        self.present[tier] = 1.0
        for name, value in values.items():
            getattr(self, name)[tier] = value


def host_spec(
    gpu: Mapping[str, Any],
    links: Mapping[str, Mapping[str, Any]],
    memory: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    cxl_expander: str | None = None,
    cxl_pool: str | None = None,
    cxl_p2p: bool | None = None,
    fleets: Mapping[str, Mapping[str, Any]] | None = None,
) -> HostSpec:
    """The node's host side and memory tiers from a GPU catalog entry and CXL options.

    ``cxl_expander``/``cxl_pool``/``cxl_p2p`` default to the entry's optional fields of the same
    names (so a study can set them with ``[hardware.set]``); ``memory`` defaults to the packaged
    catalog's memory devices, ``fleets`` (failures, restarts, storage: :mod:`hetersim.reliability`)
    to its fleets.
    """
    from .reliability import host_fields

    memory = _packaged_memory() if memory is None else memory
    cxl_expander = cxl_expander if cxl_expander is not None else gpu.get("cxl_expander")
    cxl_pool = cxl_pool if cxl_pool is not None else gpu.get("cxl_pool")
    cxl_p2p = bool(cxl_p2p if cxl_p2p is not None else gpu.get("cxl_p2p", False))
    n_gpus = float(gpu.get("gpus_per_node", 8))

    t = _Tiers()
    gpu_link = _link_bw(links, gpu["host_link"])
    host_path = _add_host_dram(t, gpu, memory, n_gpus, gpu_link)
    if cxl_expander:
        _add_expander(t, cxl_expander, gpu, links, memory, gpu_link, host_path, cxl_p2p)
    if cxl_pool:
        _add_pool(t, cxl_pool, gpu, links, memory, gpu_link, host_path, cxl_p2p, n_gpus)

    return as_arrays(
        HostSpec(
            gpus_per_node=n_gpus,
            tier_present=t.present,
            tier_capacity_GiB=t.cap,
            tier_path_GBps=t.path,
            tier_latency_ns=t.lat,
            cpu_adam_Gparams_per_s=cpu_adam_rate(gpu),
            tier_node_GBps=t.node,
            tier_shared_GBps=t.shared,
            tier_hosts=t.hosts,
            tier_write_eff=t.write,
            tier_cpu_GBps=t.cpu,
            **host_fields(gpu, fleets),
        )
    )


# DeepSpeed CPU-Adam per physical core with AVX-512, inside a training run: the ZeRO-Offload
# tutorial's log shows optimizer_step 6.35 s for GPT-2 10B (10.28e9 parameters) on the DGX-2
# host (deepspeedai/DeepSpeed docs/assets/images/zero_offload_dp1_10B_log.png), whose CPUs are
# 2 x 24-core Xeon Platinum 8168 with AVX-512 (Intel ARK): 1.62 G/s / 48 cores = 33.7 M/s per
# core. (The stand-alone benchmark, Ren et al. ATC'21 arXiv 2101.06840 Table 4, reaches 10B in
# 2.57 s on the same host, 2.4x more: a training step's update also converts and copies the
# states it touches.) CPU-Adam's inner loop handles SIMD_WIDTH floats per instruction: 16 with
# AVX-512, 8 with AVX2 (deepspeedai/DeepSpeed csrc/includes/simd.h), so an AVX2 core does half
# the work per cycle.
CPU_ADAM_MPARAMS_PER_CORE_S = 10.28e3 / 6.35 / 48.0
SIMD_SHARE = {"avx512": 1.0, "avx2": 0.5}
# Measured on the DGX-2 host (above): the default where an entry states neither a measured
# figure nor its host's cores.
DEFAULT_CPU_ADAM_GPARAMS_S = 3.9


def cpu_adam_rate(gpu: Mapping[str, Any]) -> float:
    """The node's CPU-Adam throughput, G parameters/s: the entry's measured figure, else its
    host's physical cores x the per-core rate of its SIMD width, else the DGX-2 measurement. The
    DRAM or tier bandwidth bounds it further in the model (terms/offload.py)."""
    if "cpu_adam_Gparams_per_s" in gpu:
        return float(gpu["cpu_adam_Gparams_per_s"])
    if "host_cores" in gpu:
        simd = str(gpu.get("host_simd", "avx512"))
        if simd not in SIMD_SHARE:
            raise ValueError(f"host_simd must be one of {', '.join(SIMD_SHARE)}; got {simd!r}")
        return float(gpu["host_cores"]) * CPU_ADAM_MPARAMS_PER_CORE_S * SIMD_SHARE[simd] / 1e3
    return DEFAULT_CPU_ADAM_GPARAMS_S


def _add_host_dram(t: _Tiers, gpu: Mapping[str, Any], memory, n_gpus: float, gpu_link: float) -> float:
    """Host DRAM: each GPU's own host link; the node's GPUs share the upstream links of their PCIe
    switches (gpus_per_host_link GPUs each) and the DRAM channels, unless a measured aggregate
    (host_path_GBps) is known. Returns the node's path into the host, GB/s."""
    channel_key = gpu.get("host_dram_channel", DEFAULT_DRAM_CHANNEL)
    channel = memory.get(channel_key)
    if channel is None or channel.get("kind") != "dram":
        known = ", ".join(sorted(k for k, e in memory.items() if e.get("kind") == "dram"))
        raise ValueError(f"host_dram_channel: unknown dram device {channel_key!r}; known: {known}")
    dram_bw = float(gpu.get("host_dram_channels", DEFAULT_DRAM_CHANNELS)) * float(channel["bw_GBps"])
    per_uplink = float(gpu.get("gpus_per_host_link", 1))
    shared_uplinks = n_gpus / per_uplink * gpu_link if per_uplink > 1 else dram_bw
    host_path = float(gpu.get("host_path_GBps", min(shared_uplinks, dram_bw)))
    t.set(
        HOST_DRAM,
        cap=_positive("host_dram_GiB", float(gpu.get("host_dram_GiB", 1024.0))),
        path=gpu_link,
        node=host_path,
        write=DRAM_WRITE_EFF,
        cpu=dram_bw,
        lat=float(channel["latency_ns"]),
    )
    return host_path


def _add_expander(t: _Tiers, option: str, gpu, links, memory, gpu_link: float, host_path: float, p2p: bool) -> None:
    """CXL expanders on the host: the GPU's path into the host, then the expanders' own links."""
    key, count = parse_expander(option)
    dev = _with_bw(memory[resolve_device(memory, key, "cxl-expander", "cxl_expander")], gpu, "cxl_expander_GBps")
    bw = count * _device_bw(dev, links)
    t.set(
        CXL_EXPANDER,
        cap=_positive(f"cxl_expander {key} capacity_GiB", count * float(dev["capacity_GiB"])),
        path=gpu_link,
        node=bw if p2p else min(host_path, bw),
        write=CXL_WRITE_EFF,
        cpu=bw,
        lat=float(dev["latency_ns"]),
    )


def _add_pool(t: _Tiers, option: str, gpu, links, memory, gpu_link, host_path, p2p: bool, n_gpus: float) -> None:
    """A CXL pool behind a switch, shared by ``n_hosts`` hosts."""
    key, n_hosts, levels = parse_pool(option)
    dev = _with_bw(memory[resolve_device(memory, key, "cxl-pool", "cxl_pool")], gpu, "cxl_pool_GBps")
    # CXL 2.0 switches have one level; several levels (and peer-to-peer GPU access) are CXL 3.x.
    switch = memory[CXL3_SWITCH if (levels > 1 or p2p) else CXL2_SWITCH]
    port = _link_bw(links, switch["link"]) if switch.get("link") else float(switch["bw_GBps"])
    t.set(
        CXL_POOL,
        cap=_positive(f"cxl_pool {key} capacity_GiB", float(dev["capacity_GiB"])),
        path=gpu_link,
        # Peer-to-peer every GPU has its own fabric port; through the host, the node has one.
        node=n_gpus * gpu_link if p2p else min(host_path, port),
        shared=_device_bw(dev, links),
        hosts=float(n_hosts),
        write=CXL_WRITE_EFF,
        cpu=port,
        # The pool's latency is measured through its own switch; every further level adds a hop.
        lat=float(dev["latency_ns"]) + (levels - 1) * float(switch["latency_ns"]),
    )


_ADD_TIER = {"cxl-expander": "cxl_expander DEVICE:COUNT", "cxl-pool": "cxl_pool DEVICE:NHOSTS"}


def check_offload(host: HostSpec, offload: Mapping[str, str]) -> None:
    """Reject an offload to a tier this node does not have (the CLI edge; inside the model the
    same case is the ``TIER_MISSING`` flag). States and tiers are already valid names."""
    present = np.asarray(host.tier_present)
    for state, tier in offload.items():
        if tier in TIER and present[TIER.index(tier)] <= 0:
            add = f" (add {_ADD_TIER[tier]})" if tier in _ADD_TIER else ""
            raise ValueError(f"offload {state}:{tier}: this node has no {tier} tier{add}")
