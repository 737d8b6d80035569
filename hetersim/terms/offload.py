"""State on memory tiers beyond HBM: what moving it costs and what computation hides it.

Pure functions of one configuration (no batch axes); the tiers come from
:class:`~hetersim.specs.HostSpec` (built by :mod:`hetersim.tiers`), the choice of tier per state
from ``Plan.offload_tier_code`` (``OFFLOAD_STATE`` order: optimizer, grads, params, activations).

**Path.** A GPU reaches tier ``t`` through its own link, a part the node's ``g`` GPUs share and,
for a CXL pool, a part the pool's hosts share. With every GPU of the node moving state at once
(data-parallel ranks do the same thing at the same time), one GPU gets
``min(link * latency factor, node / g, pool / (hosts * g))`` for reads and
``min(link, write_eff * node / g, write_eff * pool / (hosts * g))`` for writes.
Reads are copies the GPU's DMA engine pulls with a fixed number of requests in flight, so their
bandwidth falls with the tier's latency (Little's law, :data:`DMA_WINDOW_NS`).

**What moves and what hides it** (ZeRO-Offload, Ren et al. ATC'21 §4; ZeRO-Infinity, Rajbhandari
et al. SC'21 §5-6), per micro-batch:

* parameters (ZeRO-Infinity streaming): each GPU fetches its share of every layer before the
  forward and again before the backward, one layer ahead of the compute; only the first layer of
  the forward waits for its fetch;
* activation checkpoints: written out during the forward, prefetched during the backward;
* gradients on a tier: each micro-batch's gradient shard is written out during the backward and
  accumulated there. A host-CPU optimizer with gradients left in HBM receives them once, in the
  backward of the last micro-batch.

A pass's reads share the GPU's link in one direction and its writes in the other (the links are
full duplex); the larger of the two hides behind the pass's compute and only the excess is
exposed. Then the optimizer:

* on the host CPU (DeepSpeed CPU-Adam): the node's CPUs update the shards of all its GPUs at
  ``cpu_adam_Gparams_per_s``, or slower where the tier's bandwidth to the CPU limits them
  (:data:`CPU_ADAM_TIER_BYTES`), after one pass over the gradients (norm and unscaling,
  :data:`CPU_GRAD_PASS_BYTES`); the updated 16-bit parameters return to the GPU tile by tile while
  the CPU works;
* on the GPU with states on a tier: master weights, momentum and variance stream in and back out
  while the GPU updates them (the update itself is the on-GPU optimizer time).

``bw_needed_GBps`` is, per tier, the per-GPU bandwidth at which all of its traffic would hide:
the largest bytes / window over the forward and backward of a micro-batch and the optimizer step
(the GPU update for streamed states; the CPU update for parameters returning from the CPU). It
counts each tier's traffic alone, as if the other tiers' were hidden.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..pytree import spec
from ..specs import HostSpec, ModelSpec, Plan
from ..types import N_TIERS, Precision
from ..units import GB, GIGA
from . import memory
from ._safe import pos, safe_div
from .flops import layer_params
from .memory import ACT, GRAD, OPT, PARAM

# Copies from host memory are pulled by the GPU's DMA engine with a bounded number of reads in
# flight: bandwidth = bytes in flight / (round trip + memory latency). Sized so that local DRAM
# (REF_DRAM_NS) saturates the link, the window that reproduces the measured drop from local DRAM
# to a CXL card (pinned H2D, one GPU on PCIe 5: 51.77 -> 49.81 GiB/s; latencies 110 and 210 ns,
# memory.toml) is (W + 110) / (W + 210) = 49.81 / 51.77, W = 2431 ns. Source figures:
# github DandinPower/numa-gpu-xfer-bench (offload_components.csv).
DMA_WINDOW_NS = 2431.0
REF_DRAM_NS = 110.0

# Bytes of tier bandwidth one CPU-Adam update takes when bandwidth limits it: DeepSpeed CPU-Adam
# ran 4.04x slower on a CXL card than in local DRAM (671M fp32 elements: 67.63 -> 273.29 ms,
# github DandinPower/numa-cpu-adam-bench), i.e. 2.456 G updates/s from a card whose read
# bandwidth is 53.5 GB/s (49.81 GiB/s H2D above): 53.5 / 2.456 = 21.8 B. (Streaming counts 28:
# fp32 parameter, m, v read and written, fp32 gradient read.)
CPU_ADAM_TIER_BYTES = 21.8
# DeepSpeed's optimizer_gradients phase before CPU-Adam: the fp32 gradient is read for its norm
# and read and written once to unscale and clip it (stage_1_and_2.py).
CPU_GRAD_PASS_BYTES = 12.0
# GPU Adam on streamed states: its state (fp32 master weight, m and v; fewer bytes with bf16
# moments, memory.optimizer_bytes) comes in and goes back out.

_NO_LIMIT_GBps = 1.0e9  # stands for "no shared part" (kept finite so that gradients stay finite)


@spec
class OffloadCost:
    """Seconds and bandwidths of one step's offload; ``*_GBps`` arrays are [N_TIERS] per GPU."""

    optimizer_s: Any  # optimizer step: the GPU update, or the host CPU's (with its gradient pass)
    exposed_s: Any  # transfer time the step waits for
    traffic_s: Any  # transfer time in all, hidden or not
    bw_GBps: Any  # [N_TIERS] read bandwidth one GPU gets to each tier (0 for HBM)
    bw_needed_GBps: Any  # [N_TIERS] per-GPU bandwidth that would hide each tier's traffic


def gpus_sharing(host: HostSpec, plan: Plan):
    """GPUs of one node that move state at the same time."""
    return jnp.minimum(host.gpus_per_node, plan.n_gpus)


def latency_factor(host: HostSpec):
    """[N_TIERS] fraction of its link a DMA read reaches at each tier's latency: 1 at local DRAM's,
    less for the slower tiers (every tier of the catalog is at least as slow as local DRAM)."""
    return (DMA_WINDOW_NS + REF_DRAM_NS) / (DMA_WINDOW_NS + host.tier_latency_ns)


def tier_bandwidth(host: HostSpec, plan: Plan):
    """([N_TIERS] read, [N_TIERS] write) bytes/s one GPU gets to each tier, all GPUs of the node
    and all hosts of a pool moving at once."""
    g = gpus_sharing(host, plan)
    pool = jnp.where(
        host.tier_shared_GBps > 0, safe_div(host.tier_shared_GBps, host.tier_hosts * g, _NO_LIMIT_GBps), _NO_LIMIT_GBps
    )
    devices = jnp.minimum(safe_div(host.tier_node_GBps, g, _NO_LIMIT_GBps), pool)
    read = jnp.minimum(host.tier_path_GBps * latency_factor(host), devices)
    write = jnp.minimum(host.tier_path_GBps, host.tier_write_eff * devices)
    return read * GB, write * GB


def tier_capacity_GiB(host: HostSpec):
    """[N_TIERS] capacity one node may use: a pool's is split among the hosts sharing it."""
    return safe_div(host.tier_capacity_GiB, jnp.maximum(host.tier_hosts, 1.0))


def cpu_bandwidth(host: HostSpec):
    """[N_TIERS] bytes/s between the node's CPUs and each tier, the pool's hosts all at once."""
    pool = jnp.where(host.tier_shared_GBps > 0, safe_div(host.tier_shared_GBps, host.tier_hosts), _NO_LIMIT_GBps)
    return jnp.minimum(host.tier_cpu_GBps, pool) * GB


def activation_offload_bytes(m: ModelSpec, plan: Plan, n_micro, layers=None, inflight=None):
    """(bytes held on the tier per GPU, bytes moved per micro-batch) when activation checkpoints
    are offloaded: all stored layers but two (the one in use and the one prefetched) per
    micro-batch in flight (of the busiest stage, or of a stage of ``layers`` layers holding
    ``inflight`` micro-batches)."""
    stored, _ = memory.layer_activation_bytes(m, plan)
    layers = memory.busiest_stage_layers(m, plan) if layers is None else layers
    inflight = memory.inflight_microbatches(plan, n_micro) if inflight is None else inflight
    per_mb = stored * pos(layers - 2.0)
    return per_mb * inflight, per_mb


def param_staging_bytes(m: ModelSpec, plan: Plan):
    """HBM that offloaded parameters still need: two layers (computing and prefetched). ZeRO-3
    already holds two gathered layers in its buffers (:func:`memory.buffer_bytes`)."""
    two = 2.0 * layer_params(m) / plan.tp * memory.WEIGHT_BYTES
    return jnp.where(plan.zero >= 3, 0.0, two)


def placed_bytes(plan: Plan, weights, grads, opt, acts):
    """[N_TIERS] bytes per GPU each tier holds (index 0, HBM, left at 0)."""
    off = plan.offload_tier_code
    tiers = jnp.arange(N_TIERS)
    out = jnp.zeros(N_TIERS)
    for state, nbytes in ((OPT, opt), (GRAD, grads), (PARAM, weights), (ACT, acts)):
        out = out + jnp.where((tiers == off[state]) & (off[state] > 0), nbytes, 0.0)
    return out


def offload_cost(
    host: HostSpec,
    plan: Plan,
    *,
    n_micro,
    layers,
    weights,
    grads,
    opt,
    opt_params,
    grad_elem_bytes,
    acts_mb,
    t_fwd,
    t_bwd,
    gpu_opt_s,
) -> OffloadCost:
    """The offload part of one step.

    ``weights``/``grads``/``opt``: bytes of each state per GPU; ``opt_params``: parameters whose
    optimizer states this GPU owns; ``grad_elem_bytes``: bytes per gradient element; ``acts_mb``:
    activation bytes offloaded per micro-batch; ``t_fwd``/``t_bwd``: forward and backward (with
    recomputation) compute of one micro-batch on the busiest stage; ``gpu_opt_s``: the optimizer
    step on the GPU with its states in HBM; ``layers``: layers on the busiest stage.
    """
    off = plan.offload_tier_code
    cpu_opt = (off[OPT] > 0) & (plan.cpu_optimizer > 0)
    rd, wr = tier_bandwidth(host, plan)
    wbytes = jnp.where(plan.precision_code == Precision.FP32, 4.0, memory.WEIGHT_BYTES)
    # A host optimizer with the gradients in HBM takes them once, in the last backward.
    last_bytes = opt_params * grad_elem_bytes

    exposed, traffic = _pass_transfers(
        off, cpu_opt, rd, wr, n_micro, layers, weights, grads, acts_mb, last_bytes, t_fwd, t_bwd
    )
    opt_state = opt_params * memory.optimizer_bytes(plan)  # the states a GPU optimizer streams
    optimizer_s, cpu_s, opt_exposed, opt_traffic = _optimizer_step(
        host, plan, cpu_opt, rd, wr, weights, grads, opt_params, opt_state, wbytes, gpu_opt_s
    )
    exposed = exposed + opt_exposed
    traffic = traffic + opt_traffic
    needed = _bw_needed(
        off, cpu_opt, weights, grads, acts_mb, last_bytes, opt_params, opt_state, wbytes, t_fwd, t_bwd, gpu_opt_s, cpu_s
    )
    tiers = jnp.arange(N_TIERS)
    return OffloadCost(
        optimizer_s=optimizer_s,
        exposed_s=exposed,
        traffic_s=traffic,
        bw_GBps=jnp.where((tiers > 0) & (host.tier_present > 0), rd / GB, 0.0),
        bw_needed_GBps=needed / GB,
    )


def _moved(cond, nbytes, bw):
    return jnp.where(cond, safe_div(nbytes, bw), 0.0)


def _pass_transfers(off, cpu_opt, rd, wr, n_micro, layers, weights, grads, acts_mb, last_bytes, t_fwd, t_bwd):
    """(exposed, all) transfer seconds of the forward and backward passes of a step."""
    on = off > 0
    on_g, on_p, on_a = on[GRAD], on[PARAM], on[ACT]
    t_o, t_g, t_p, t_a = off[OPT], off[GRAD], off[PARAM], off[ACT]
    f_in = _moved(on_p, weights, rd[t_p])
    f_out = _moved(on_a, acts_mb, wr[t_a])
    b_in = _moved(on_p, weights, rd[t_p]) + _moved(on_a, acts_mb, rd[t_a])
    b_out = _moved(on_g, grads, wr[t_g])
    last_out = _moved(cpu_opt & ~on_g, last_bytes, wr[t_o])
    first_layer = _moved(on_p, safe_div(weights, layers), rd[t_p])

    fwd = jnp.maximum(f_in, f_out)
    bwd = jnp.maximum(b_in, b_out)
    bwd_last = jnp.maximum(b_in, b_out + last_out)
    exposed_mb = pos(fwd - t_fwd) + pos(bwd - t_bwd) + first_layer
    exposed = n_micro * exposed_mb + pos(bwd_last - t_bwd) - pos(bwd - t_bwd)
    traffic = n_micro * (fwd + bwd) + (bwd_last - bwd)
    return exposed, traffic


def _optimizer_step(
    host: HostSpec, plan: Plan, cpu_opt, rd, wr, weights, grads, opt_params, opt_state, wbytes, gpu_opt_s
):
    """(optimizer seconds, the host CPU's seconds, exposed and all transfer seconds) of the
    optimizer step, on the host CPU or on the GPU with streamed states."""
    off = plan.offload_tier_code
    on = off > 0
    on_o, on_g, on_p = on[OPT], on[GRAD], on[PARAM]
    t_o, t_g, t_p = off[OPT], off[GRAD], off[PARAM]
    node_params = opt_params * gpus_sharing(host, plan)
    cpu_bw = cpu_bandwidth(host)
    grads_at = jnp.where(on_g, t_g, t_o)
    cpu_rate = host.cpu_adam_Gparams_per_s * GIGA
    update = jnp.maximum(safe_div(node_params, cpu_rate), safe_div(node_params * CPU_ADAM_TIER_BYTES, cpu_bw[t_o]))
    cpu_s = update + safe_div(node_params * CPU_GRAD_PASS_BYTES, cpu_bw[grads_at])
    # Updated 16-bit parameters return to the GPU while the CPU works; with the parameters on a
    # tier the CPU writes them there and the next forward fetches them.
    ret = _moved(~on_p, opt_params * wbytes, rd[t_o])
    cpu_exposed = pos(ret - cpu_s)

    # On the GPU: streamed states (and offloaded gradients) come in, states (and updated
    # parameters on a tier) go out, while the GPU updates them.
    g_in = _moved(on_o, opt_state, rd[t_o]) + _moved(on_g, grads, rd[t_g])
    g_out = _moved(on_o, opt_state, wr[t_o]) + _moved(on_p, weights, wr[t_p])
    gpu_stream = jnp.maximum(g_in, g_out)
    gpu_exposed = pos(gpu_stream - gpu_opt_s)

    optimizer_s = jnp.where(cpu_opt, cpu_s, gpu_opt_s)
    exposed = jnp.where(cpu_opt, cpu_exposed, gpu_exposed)
    traffic = jnp.where(cpu_opt, ret, gpu_stream)
    return optimizer_s, cpu_s, exposed, traffic


def _bw_needed(
    off, cpu_opt, weights, grads, acts_mb, last_bytes, opt_params, opt_state, wbytes, t_fwd, t_bwd, gpu_opt_s, cpu_s
):
    """[N_TIERS] per-GPU bandwidth at which each tier's traffic would hide (bytes/s); ``opt_state``:
    the bytes of optimizer state a GPU optimizer streams (:func:`hetersim.terms.memory.optimizer_bytes`)."""
    on = off > 0
    on_o, on_g, on_p, on_a = on[OPT], on[GRAD], on[PARAM], on[ACT]
    t_o, t_g, t_p, t_a = off[OPT], off[GRAD], off[PARAM], off[ACT]
    tiers = jnp.arange(N_TIERS)

    def at(state_on, tier, nbytes):
        return jnp.where(state_on & (tiers == tier) & (tiers > 0), nbytes, 0.0)

    p_bytes = at(on_p, t_p, weights)
    a_bytes = at(on_a, t_a, acts_mb)
    need_f = safe_div(jnp.maximum(p_bytes, a_bytes), t_fwd)
    b_in_bytes = p_bytes + a_bytes
    b_out_bytes = at(on_g, t_g, grads) + at(cpu_opt & ~on_g, t_o, last_bytes)
    need_b = safe_div(jnp.maximum(b_in_bytes, b_out_bytes), t_bwd)
    s_bytes = at(on_o & ~cpu_opt, t_o, opt_state)
    o_in = s_bytes + at(on_g & ~cpu_opt, t_g, grads)
    o_out = s_bytes + at(on_p & ~cpu_opt, t_p, weights)
    need_gpu_opt = safe_div(jnp.maximum(o_in, o_out), gpu_opt_s)
    need_cpu_opt = safe_div(at(cpu_opt & ~on_p, t_o, opt_params * wbytes), cpu_s)
    return jnp.maximum(jnp.maximum(need_f, need_b), jnp.maximum(need_gpu_opt, need_cpu_opt))
