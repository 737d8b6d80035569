"""Goodput: the share of wall time a job spends on useful training, given failures, restarts,
checkpoints written to a tier, and stragglers. Pure functions of one configuration, a cheap
post-processing of the step time (:func:`goodput` is called once per configuration by
:func:`hetersim.simulate.simulate`).

**Checkpoint.** Each GPU writes what only it holds of the model states (``memory.state_bytes``,
per ZeRO layout): its 16-bit weights and its fp32 master weights and Adam moments, a state
replicated over the ``dp*cp`` ranks counted once across them (Megatron's fully parallel
distributed save spreads replicas over the data-parallel ranks). Gradients are not saved. The
busiest pipeline stage holds the most, and the checkpoint is complete when its ranks are done.

**Tiers** (:class:`hetersim.types.CheckpointTier`), write bandwidth per GPU with every GPU of the
job writing at once:

* ``pfs``: the parallel file system's sustained bandwidth shared by all GPUs of the job, and each
  GPU's scale-out NIC share;
* ``nvme``: the node's NVMe drives shared by its GPUs (capped by the GPU's host link);
* ``host-dram``, ``cxl-expander``: the node's memory tiers at their write bandwidth with their
  sharing (:func:`hetersim.terms.offload.tier_bandwidth`);
* ``cxl-pool``: the pool behind its switch, shared by the pool's hosts and their GPUs (the same);
* ``gpu-peers``: a peer node's host DRAM over the scale-out network (Gemini, Wang et al. SOSP'23).

A tier inside the node (NVMe, host DRAM, CXL expanders) is lost with its node, and most
interruptions are hardware (Llama 3 paper §3.3.4), so these keep a replica on a peer node, sent
over the scale-out network while the local copy is written (the slower of the two paces the
write, and each node holds its own checkpoint and a peer's). A CXL pool is outside the host and a
file system outside the node: no replica. Every tier keeps the last complete checkpoint while the
next is written (two checkpoints' room). Reading back on restart uses the tier's read bandwidth
(the replaced node reads the peer's replica over the network).

**Sync or async.** Synchronous: training waits for the write (``checkpoint_s`` = the write).
Asynchronous (torch DCP ``async_save``, Megatron async save, CheckFreq, Gemini): training waits
only for the copy into host DRAM, the write to the tier overlaps training (its interference with
training traffic is not modelled), the next checkpoint cannot start before it ends, and a failure
during the write falls back to the checkpoint before.

**Young's first-order model** (J. W. Young, "A first order approximation to the optimum
checkpoint interval", CACM 17(9), 1974). With interruptions at rate ``lam`` (Poisson; the job's
mean time between interruptions ``M = 1/lam``), a blocking cost ``delta`` per checkpoint, an
interval ``tau`` of training between checkpoints, a restart ``R`` (detect, replace, relaunch:
``restart_s``; plus loading the checkpoint from its tier) and on average ``tau/2`` of lost work per
interruption (plus the write time ``w`` when asynchronous: a failure in the ``w`` after a
checkpoint starts loses the interval before too), the share of wall time wasted is

    waste = delta / tau + lam * (R + tau / 2 + w)

whose minimum over ``tau`` is exactly ``tau* = sqrt(2 delta M)`` (Young; Daly 2006's higher-order
estimate corrects it for ``delta`` comparable to ``M``, which checkpoints of seconds against
hours between interruptions are not). ``checkpoint_every`` = 0 takes ``tau*``, never less than a
step (nor, asynchronous, than ``w``); ``checkpoint_every`` = N takes N steps.

**Stragglers.** A synchronous step is paced by its slowest rank: with a share ``f`` of nodes
degraded (``straggler_node_frac``) and each ``s`` slower (``straggler_slowdown``), a job of ``n``
nodes runs every step ``1 + (1 - (1 - f)^n) s`` times its healthy time on average.

``goodput = (1 - waste) / (1 + stragglers)``: the healthy training time over the wall time;
``effective_time_s = time_to_train_s / goodput``. With no interruptions the optimum interval is
unbounded, the checkpoint overhead vanishes and the effective time is the time to train. Where
``waste >= 1`` the job makes no progress (``Infeasible.NO_PROGRESS``; its effective time is held
finite at a million times the time to train).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..pytree import spec
from ..specs import ModelSpec, Plan, SystemSpec
from ..types import N_LEVELS, N_TIERS, CheckpointMode, CheckpointTier, Infeasible, Precision, Tier
from ..units import GB, HOUR, KWH, GiB
from . import comm, memory, offload
from ._safe import pos, safe_div, safe_log2
from .flops import total_params

_BIG = 1.0e30  # stands for "no limit" (kept finite so that gradients stay finite)
NO_PROGRESS_FACTOR = 1.0e6  # effective time of a job that makes no progress, x the time to train
KEPT = 2.0  # checkpoints a tier holds: the last complete one while the next is written

# Per checkpoint tier (CheckpointTier order): the memory tier holding it (0: none of the node's
# memory tiers) and whether a replica goes to a peer node (tiers lost with their node).
_MEMORY_TIER = (0, 0, int(Tier.HOST_DRAM), int(Tier.CXL_EXPANDER), int(Tier.CXL_POOL), int(Tier.HOST_DRAM))
_REPLICATED = (0.0, 1.0, 1.0, 1.0, 0.0, 0.0)


@spec
class Goodput:
    """One configuration's goodput terms (the breakdown's goodput fields, :data:`FIELDS`)."""

    goodput: Any
    effective_time_s: Any
    effective_cost_usd: Any
    effective_energy_kWh: Any
    checkpoint_GiB: Any
    checkpoint_tier_GiB: Any
    checkpoint_s: Any
    checkpoint_write_s: Any
    checkpoint_interval_s: Any
    checkpoint_overhead_s: Any
    restart_s: Any
    mtbi_h: Any
    interruptions: Any


FIELDS = tuple(Goodput.__dataclass_fields__)


def checkpoint_bytes(model: ModelSpec, plan: Plan, states):
    """(bytes one GPU of the busiest stage writes, bytes of the whole checkpoint)."""
    weights, _, opt = states
    n = memory.dp_ranks(plan)  # replicated states: every data-parallel rank writes a share
    w_rep = jnp.where(plan.zero >= 3, 1.0, n)
    o_rep = jnp.where(plan.zero >= 1, 1.0, n)
    wbytes = jnp.where(plan.precision_code == Precision.FP32, 4.0, memory.WEIGHT_BYTES)
    total = total_params(model) * (wbytes + memory.optimizer_bytes(plan))
    return weights / w_rep + opt / o_rep, total


def _select(code, values):
    """``values[code]`` for a traced integer ``code`` by compare-and-select (fuses; no gather)."""
    out = values[0]
    for i, v in enumerate(values[1:], start=1):
        out = jnp.where(code == i, v, out)
    return out


def tier_bandwidths(system: SystemSpec, plan: Plan):
    """(write, read) bytes/s per GPU to the plan's checkpoint tier (CheckpointTier order), every
    GPU of the job at once; a replicated tier is paced by the slower of the local copy and the
    network copy to the peer. The file system's own cap is in :func:`write_times`."""
    host, net = system.host, system.network
    rd, wr = offload.tier_bandwidth(host, plan)
    nic = comm.bus_bw(net, N_LEVELS - 1)
    g = offload.gpus_sharing(host, plan)
    nvme = jnp.minimum(safe_div(host.nvme_GBps * GB, g, _BIG), host.tier_path_GBps[Tier.HOST_DRAM] * GB)
    pfs = jnp.minimum(safe_div(host.pfs_GBps * GB, plan.n_gpus, _BIG), nic)
    k = plan.checkpoint_tier_code

    def table(mem):
        return _select(
            k,
            (
                pfs,
                jnp.minimum(nvme, nic),
                jnp.minimum(mem[Tier.HOST_DRAM], nic),
                jnp.minimum(mem[Tier.CXL_EXPANDER], nic),
                mem[Tier.CXL_POOL],
                nic,
            ),
        )

    return table(wr), table(rd)


def write_times(system: SystemSpec, plan: Plan, per_gpu, total):
    """(write, load, copy into host DRAM) seconds of one checkpoint on the plan's tier."""
    host = system.host
    wr, rd = tier_bandwidths(system, plan)
    pfs_total = safe_div(total, host.pfs_GBps * GB)  # the file system's aggregate, whatever the ranks
    is_pfs = plan.checkpoint_tier_code == CheckpointTier.PFS
    write = jnp.where(is_pfs, jnp.maximum(safe_div(per_gpu, wr), pfs_total), safe_div(per_gpu, wr))
    load = jnp.where(is_pfs, jnp.maximum(safe_div(per_gpu, rd), pfs_total), safe_div(per_gpu, rd))
    _, host_wr = offload.tier_bandwidth(host, plan)
    stage = safe_div(per_gpu, host_wr[Tier.HOST_DRAM])
    return write, load, stage


def job_rate_per_s(system: SystemSpec, plan: Plan):
    """Interruptions per second of the whole job (its size times the per-GPU rate)."""
    return system.host.interrupts_per_Mgpuh * 1e-6 * plan.n_gpus / HOUR


def straggler_factor(system: SystemSpec, plan: Plan):
    """Mean step time / healthy step time: the step is paced by the slowest rank."""
    host = system.host
    nodes = jnp.maximum(safe_div(plan.n_gpus, host.gpus_per_node, 1.0), 1.0)
    # (1 - frac) ** nodes as 2 ** (nodes log2(1 - frac)): the logarithm is the hardware's alone
    # (computed once per chunk of a group), the power per configuration a vectorised exponential.
    base = jnp.clip(1.0 - host.straggler_node_frac, 0.0, 1.0)
    healthy = jnp.where(base > 0, jnp.exp2(nodes * safe_log2(base)), 0.0)
    return 1.0 + (1.0 - healthy) * host.straggler_slowdown


def goodput(
    model: ModelSpec, system: SystemSpec, plan: Plan, states, *, step_s, time_to_train_s, usd_per_hour, power_W
) -> tuple[Goodput, Any]:
    """(the goodput terms, their :class:`~hetersim.types.Infeasible` bits). ``states``: the
    (weights, grads, optimizer) bytes per GPU of :func:`memory.state_bytes`; ``step_s`` and
    ``time_to_train_s`` the healthy, uninterrupted figures; ``usd_per_hour`` and ``power_W`` the job's."""
    host = system.host
    per_gpu, total = checkpoint_bytes(model, plan, states)
    write, load, stage = write_times(system, plan, per_gpu, total)
    sync = plan.checkpoint_mode_code != CheckpointMode.ASYNC
    delta = jnp.where(sync, write, jnp.minimum(stage, write))
    behind = jnp.where(sync, 0.0, write)  # seconds a new checkpoint takes to become durable

    lam = job_rate_per_s(system, plan)
    slow = straggler_factor(system, plan)
    step = step_s * slow
    young = jnp.sqrt(jnp.maximum(safe_div(2.0 * delta, lam, _BIG), 1e-30))
    tau = jnp.where(plan.checkpoint_every > 0, plan.checkpoint_every * step, young)
    tau = jnp.maximum(tau, jnp.maximum(step, behind))
    restart = host.restart_s + load
    waste = safe_div(delta, tau) + lam * (restart + 0.5 * tau + behind)
    useful = 1.0 - waste
    g = pos(useful) / slow
    eff = jnp.where(useful > 0, safe_div(time_to_train_s, g), NO_PROGRESS_FACTOR * time_to_train_s)

    k = plan.checkpoint_tier_code
    replicas = 1.0 + _select(k, _REPLICATED)
    node_gpus = offload.gpus_sharing(host, plan)
    # Per node: its GPUs' checkpoints (a file system's share: the whole over the job's nodes).
    nodes = jnp.maximum(safe_div(plan.n_gpus, node_gpus, 1.0), 1.0)
    node_bytes = jnp.where(k == CheckpointTier.PFS, total / nodes, per_gpu * node_gpus)
    out = Goodput(
        goodput=g,
        effective_time_s=eff,
        effective_cost_usd=eff / HOUR * usd_per_hour,
        effective_energy_kWh=eff * power_W / KWH,
        checkpoint_GiB=per_gpu / GiB,
        checkpoint_tier_GiB=KEPT * replicas * node_bytes / GiB,
        checkpoint_s=delta,
        checkpoint_write_s=write,
        checkpoint_interval_s=tau,
        checkpoint_overhead_s=safe_div(delta * step, tau),
        restart_s=restart,
        mtbi_h=safe_div(1.0, lam * HOUR, _BIG),
        interruptions=lam * eff,
    )
    return out, _flags(host, plan, out, useful)


def _flags(host, plan: Plan, out: Goodput, useful):
    """A checkpoint tier the node lacks, one too small for the checkpoints (beside what the plan
    offloads there: ``tier_used`` is added by the caller), and no progress."""
    k = plan.checkpoint_tier_code
    mem_tier = _select(k, _MEMORY_TIER)
    missing = (mem_tier > 0) & (_select(mem_tier, tuple(host.tier_present[i] for i in range(N_TIERS))) <= 0)
    nvme_full = (k == CheckpointTier.NVME) & (out.checkpoint_tier_GiB > host.nvme_capacity_GiB)
    f = jnp.where(missing, jnp.int32(int(Infeasible.TIER_MISSING)), jnp.int32(0))
    f |= jnp.where(nvme_full, jnp.int32(int(Infeasible.TIER_CAPACITY)), jnp.int32(0))
    f |= jnp.where(useful <= 0, jnp.int32(int(Infeasible.NO_PROGRESS)), jnp.int32(0))
    return f


def memory_tier_need_GiB(plan: Plan, out: Goodput):
    """[N_TIERS] GiB per node the checkpoints take on the node's memory tiers (index 0 unused)."""
    mem_tier = _select(plan.checkpoint_tier_code, _MEMORY_TIER)
    tiers = jnp.arange(N_TIERS)
    return jnp.where((tiers == mem_tier) & (mem_tier > 0), out.checkpoint_tier_GiB, 0.0)
