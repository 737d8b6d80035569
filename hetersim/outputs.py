"""What one configuration's breakdown holds: one table of names and meanings (no JAX).

:data:`STEP_TERMS` are the parts of the step time, in the order they add up;
:data:`OUTPUTS` every other field of :class:`hetersim.simulate.Breakdown`. The breakdown's
fields, ``simulate``'s step sum, the cluster model's per-term composition and the sweep's
metric labels (``dse.metrics``) are all generated from these two tables. :data:`INTERVALS` names
the step time's prediction interval, computed beside the breakdown, not by ``simulate``.
"""

from __future__ import annotations

STEP_TERMS: dict[str, str] = {
    "compute_s": "forward and backward compute of the busiest stage",
    "recompute_s": "activation recomputation",
    "tp_comm_s": "exposed tensor-parallel communication",
    "cp_comm_s": "exposed context-parallel communication",
    "pp_comm_s": "exposed pipeline point-to-point communication",
    "dp_comm_s": "exposed data-parallel / ZeRO communication",
    "ep_comm_s": "exposed expert-parallel token dispatch and combine (MoE)",
    "bubble_s": "pipeline bubble (fill and drain)",
    "optimizer_s": "optimizer step",
    "offload_s": "exposed offload traffic",
}

OUTPUTS: dict[str, str] = {
    "step_time_s": "training step time: the sum of the step terms",
    "tokens_per_s": "training throughput",
    "tokens_per_s_per_gpu": "training throughput per GPU",
    "mfu": "model FLOPs (causal, no recompute) / (step time * GPUs * dense peak of the precision)",
    "hfu": "hardware FLOPs (with recompute) / the same",
    "model_tflops_per_gpu": "model FLOP/s per GPU in 1e12",
    "weights_GiB": "weights in HBM per GPU",
    "grads_GiB": "gradients in HBM per GPU",
    "optimizer_GiB": "optimizer states in HBM per GPU",
    "activations_GiB": "stored activations in HBM per GPU",
    "buffers_GiB": "temporary buffers per GPU",
    "hbm_used_GiB": "HBM used per GPU",
    "hbm_capacity_GiB": "HBM capacity per GPU",
    "tier_used_GiB": "[N_TIERS] memory used per node on each tier; index 0 = HBM of one GPU",
    "tier_capacity_GiB": "[N_TIERS] capacity per node of each tier",
    "n_microbatches": "micro-batches per step and replica",
    "params": "model parameters",
    "time_to_train_s": "time to train the token budget",
    "cost_usd": "cost to train the token budget (GPU-hours at the catalog price)",
    "energy_kWh": "GPU energy to train the token budget (at TDP)",
    "infeasible": "why the configuration cannot run (hetersim.types.Infeasible bit flags)",
    "offload_traffic_s": "transfer time to and from slower tiers, hidden or not (offload_s is exposed)",
    "tier_bw_GBps": "[N_TIERS] read bandwidth one GPU gets to each tier (index 0 unused)",
    "tier_bw_needed_GBps": "[N_TIERS] per-GPU bandwidth that would hide each tier's traffic",
    "offload_bw_needed_GBps": "the largest of tier_bw_needed_GBps",
    # Goodput (hetersim.terms.goodput): failures, restarts, checkpoints on a tier, stragglers.
    "goodput": "share of wall time spent on useful training (failures, restarts, checkpoints, stragglers)",
    "effective_time_s": "wall time to train the token budget with failures, restarts, checkpoints and stragglers",
    "effective_cost_usd": "cost of the effective time (GPU-hours at the catalog price)",
    "effective_energy_kWh": "GPU energy of the effective time (at TDP)",
    "checkpoint_GiB": "checkpoint bytes one GPU of the busiest stage writes (its unique model states)",
    "checkpoint_tier_GiB": "room per node the checkpoints need on their tier (two kept, with any peer replica)",
    "checkpoint_s": "time training waits per checkpoint (the write, or the copy to host DRAM when async)",
    "checkpoint_write_s": "time to write one checkpoint to its tier",
    "checkpoint_interval_s": "training time between checkpoints (Young's optimum or the plan's)",
    "checkpoint_overhead_s": "checkpoint time training waits for, per step",
    "restart_s": "time per interruption: detect, replace, relaunch and load the checkpoint",
    "mtbi_h": "the job's mean time between interruptions",
    "interruptions": "interruptions expected over the effective time",
}

# The 80% prediction interval of step_time_s (hetersim.fit.intervals), from the leave-one-source-out
# residuals: computed beside the breakdown (by the sweep, ``evaluate`` and ``validate``), not in it.
INTERVALS: dict[str, str] = {
    "step_time_s_low": "lower end of the 80% prediction interval of the step time",
    "step_time_s_high": "upper end of the 80% prediction interval of the step time",
}
