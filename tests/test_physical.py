"""Physically consistent for any hardware values: no NaN or inf, no negative term, MFU <= 1;
kernels a device cannot run are flagged (and refused at the CLI), never priced at a zero rate."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from dse.bench import bench_space
from dse.cli import app
from dse.sweep.evaluate import decode_chunk
from hetersim import build, planfields, stacks
from hetersim.outputs import STEP_TERMS
from hetersim.simulate import simulate
from hetersim.specs import SystemSpec
from hetersim.types import Infeasible

# Leaves that say how the hardware is built (counts, presence), not how fast it is: kept as they are.
STRUCTURAL = {"domain_gpus", "gpus_per_node", "gpus_per_nic", "tier_present", "tier_hosts", "sm_count"}
# Efficiencies are fractions of a peak: they are drawn in (0, 1], never scaled past 1.
FRACTIONS = {
    "gemm_eff",
    "attn_eff_fwd",
    "attn_eff_bwd",
    "attn2_eff_fwd",
    "attn2_eff_bwd",
    "busbw_eff",
    "tier_write_eff",
}


def _scaled(systems: SystemSpec, rng) -> SystemSpec:
    """``systems`` (batched) with every rate, capacity and latency scaled by 10^U(-4, 4) and every
    efficiency drawn in (0.01, 1]."""

    def scale(path, leaf):
        name = getattr(path[-1], "name", "")
        batch = np.asarray(leaf, np.float32)
        if name in STRUCTURAL:
            return batch
        if name in FRACTIONS:
            return np.where(batch > 0, rng.uniform(0.01, 1.0, batch.shape), 0.0).astype(np.float32)
        return (batch * 10.0 ** rng.uniform(-4, 4, batch.shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(scale, systems)


# Every mixture-of-experts architecture of the catalog: MLA (DeepSeek, Kimi), shared experts and
# leading dense layers, interleaved MoE layers (Llama 4 Maverick), sliding windows and the extra
# point-wise ops (GPT-OSS), top-2 over 8 experts (Mixtral, Grok-1).
MOE_MODELS = (
    "deepseek-v3",
    "kimi-k2",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "gpt-oss-120b",
    "mixtral-8x7b",
    "llama4-maverick",
    "grok-1",
)
# The expert-parallel axes drawn per layout row: EP over 1-64 ranks (one node or several), the
# experts' own TP, both dispatchers and Megatron's all-to-all overlap.
MOE_AXES = {
    "ep": (1, 2, 4, 8, 16, 64),
    "etp": (1, 2),
    "dispatcher": ("alltoall", "deepep"),
    "ep_overlap": (False, True),
}


def _moe_space(n_configs: int, seed: int):
    """:func:`dse.bench.bench_space` over :data:`MOE_MODELS`, its layout rows also drawing the
    :data:`MOE_AXES` (a row whose EP the layout cannot place is flagged, and checked all the same)."""
    space = bench_space(n_configs, seed=seed, models=MOE_MODELS)
    rng = np.random.default_rng(seed)
    factors = []
    for name, table in space.factors:
        table = dict(table)
        if name == "layout":
            n = len(next(iter(table.values())))
            for axis, values in MOE_AXES.items():
                codes = np.array([planfields.encode(axis, v) for v in values])
                table[axis] = codes[rng.integers(0, len(codes), n)]
        elif name == "fixed":
            table = {c: v for c, v in table.items() if c not in MOE_AXES}
        factors.append((name, table))
    return dataclasses.replace(space, factors=tuple(factors))


def _check_any_hardware(space, cal, chunks: int, seed: int):
    """Evaluate ``chunks`` chunks of ``space`` with every hardware figure redrawn
    (:func:`_scaled`): every metric finite and non-negative, MFU at most 1 where feasible.
    Returns (configurations seen, feasible ones, ones with expert-parallel traffic)."""
    rng = np.random.default_rng(seed)
    chunk = 1 << 16
    tables = space.tables()
    decode = jax.jit(decode_chunk, static_argnames="chunk")  # the sweep's own decoding of flat indices
    run = jax.jit(jax.vmap(simulate, in_axes=(0, 0, 0, None)))
    n_seen = n_feasible = n_ep = 0
    for start in range(0, chunks * chunk, chunk):
        models, systems, plans = decode(start, tables, chunk=chunk)
        systems = _scaled(jax.tree.map(np.asarray, systems), rng)
        out = jax.tree.map(np.asarray, run(models, systems, plans, cal))
        for name in (*STEP_TERMS, "step_time_s", "mfu", "hfu", "hbm_used_GiB", "time_to_train_s", "cost_usd"):
            values = getattr(out, name)
            assert np.all(np.isfinite(values)), name
            assert np.all(values >= 0), name
        ok = out.infeasible == 0
        assert np.all(out.mfu[ok] <= 1.0 + 1e-5), float(out.mfu[ok].max())
        n_seen += chunk
        n_feasible += int(ok.sum())
        n_ep += int((out.ep_comm_s > 0).sum())
    return n_seen, n_feasible, n_ep


@pytest.mark.slow
def test_any_hardware_values_give_finite_nonnegative_results_and_mfu_at_most_one(cal):
    n_seen, n_feasible, _ = _check_any_hardware(bench_space(1_100_000, seed=3), cal, chunks=16, seed=0)
    assert n_seen >= 1_000_000 and n_feasible > 0


@pytest.mark.slow
def test_any_hardware_values_keep_the_moe_terms_finite_and_nonnegative(cal):
    """The same check over the mixture-of-experts terms (expert GEMMs, routing, the dispatch and
    combine, expert-DP reductions), which the dense space above never traces."""
    space = _moe_space(4 << 16, seed=5)
    chunks = -(-space.size // (1 << 16))  # the whole space: every model, every drawn EP row
    n_seen, n_feasible, n_ep = _check_any_hardware(space, cal, chunks=chunks, seed=1)
    assert n_seen >= 4 << 16 and n_feasible > 0 and n_ep > 0


def test_fp32_training_is_priced_at_the_fp32_peak(catalog, cal):
    m = build.model_spec(catalog.model("llama2-7b"))
    s = build.system_spec(catalog.gpu("h100-sxm-80gb"), catalog.links)
    opts = dict(n_gpus=64, tp=8, cp=8, global_batch=8, seq_len=131072, zero=3, recompute="selective")
    out = jax.jit(simulate)(m, s, build.plan_spec(precision="fp32", **opts), cal)
    assert int(out.infeasible) == 0 and 0 < float(out.mfu) <= 1.0 and float(out.hfu) <= 1.0


def test_a_kernel_the_device_cannot_run_is_flagged_and_priced_as_the_one_it_runs(catalog, cal):
    m = build.model_spec(catalog.model("gpt3-1.3b"))
    v100 = build.system_spec(catalog.gpu("v100-sxm-32gb"), catalog.links)
    opts = dict(n_gpus=8, global_batch=64, seq_len=2048, precision="fp16")
    flash = jax.jit(simulate)(m, v100, build.plan_spec(attention="flash", **opts), cal)
    mat = jax.jit(simulate)(m, v100, build.plan_spec(attention="materialized", **opts), cal)
    assert int(flash.infeasible) & Infeasible.KERNEL and not int(mat.infeasible) & Infeasible.KERNEL
    assert float(flash.step_time_s) == pytest.approx(float(mat.step_time_s), rel=1e-6)
    # The stack's kernel (attention = auto, the default) falls back to the one the device runs.
    auto = jax.jit(simulate)(m, v100, build.plan_spec(**opts), cal)
    assert not int(auto.infeasible) & Infeasible.KERNEL
    assert float(auto.step_time_s) == pytest.approx(float(mat.step_time_s), rel=1e-6)
    # A device entry without fused-attention figures runs none (flagged, not a KeyError).
    entry = {k: v for k, v in catalog.gpu("a100-sxm-80gb").items() if not k.startswith("attn")}
    bare = dataclasses.replace(v100, device=build.device_spec(entry))
    asked = build.plan_spec(attention="flash2", **opts)
    assert int(jax.jit(simulate)(m, bare, asked, cal).infeasible) & Infeasible.KERNEL


def test_cli_refuses_a_kernel_the_device_cannot_run():
    args = "evaluate --model gpt3-1.3b --gpu v100-sxm-32gb --gpus 8 --global-batch 64 --precision fp16".split()
    result = CliRunner().invoke(app, [*args, "--attention", "flash"])
    assert result.exit_code == 2
    assert result.output.startswith("error: --attention flash cannot run on") and result.output.count("\n") == 1
    for kernel in ("materialized", "auto"):  # auto: the stack's kernel, materialised on a V100
        ok = CliRunner().invoke(app, [*args, "--attention", kernel, "--json"])
        assert ok.exit_code == 0, ok.output
    assert jnp.isfinite(float(__import__("json").loads(ok.stdout)["step_time_s"]))


def test_chunked_loss_frees_exactly_the_logits_it_does_not_hold(catalog, cal):
    """Long-context fine-tuning on one 40 GB A100 with everything offloaded: the materialised
    loss holds 128k x 128k logits (16-bit and fp32: ~96 GiB) and cannot fit; the chunked fused
    loss holds one chunk of next_power_of_2(T / ceil(V/h)) tokens (Liger-Kernel) and fits."""
    from hetersim.terms.memory import loss_chunk_tokens

    entry = catalog.model("llama3-8b")
    m = build.model_spec(entry)
    s = build.system_spec(catalog.gpu("a100-sxm-40gb"), catalog.links, memory=catalog.memory)
    off = {k: "host-dram" for k in ("optimizer", "grads", "params", "activations")}
    opts = dict(n_gpus=1, global_batch=1, seq_len=131072, recompute="full", offload=off)
    runs = {
        loss: jax.jit(simulate)(m, s, build.plan_spec(loss=loss, **opts), cal) for loss in ("materialized", "chunked")
    }
    T, V, h = 131072, entry["vocab"], entry["hidden"]
    chunk = 2 ** int(np.ceil(np.log2(np.ceil(T / np.ceil(V / h)))))
    assert float(loss_chunk_tokens(m, build.plan_spec(loss="chunked", **opts))) == chunk
    freed = (float(runs["materialized"].buffers_GiB) - float(runs["chunked"].buffers_GiB)) * 2**30
    assert freed == pytest.approx(6.0 * (T - chunk) * V, rel=1e-5)
    assert int(runs["materialized"].infeasible) & Infeasible.HBM_CAPACITY
    assert not int(runs["chunked"].infeasible) & Infeasible.HBM_CAPACITY
    assert float(runs["chunked"].step_time_s) <= float(runs["materialized"].step_time_s)


def test_one_pass_fused_loss_frees_exactly_the_fp32_copy(catalog, cal):
    """flash-attn's xentropy kernel (llm-foundry's MPT loss) holds every logit in 16 bits and
    writes the gradient in place: against the materialized loss it frees exactly the fp32 copy
    (4 bytes a logit) and moves the chunked kernel's 4 bytes a logit instead of 20."""
    entry = catalog.model("llama3-8b")
    m = build.model_spec(entry)
    s = build.system_spec(catalog.gpu("h100-sxm-80gb"), catalog.links)
    opts = dict(n_gpus=8, global_batch=16, micro_batch=2, seq_len=4096)
    runs = {
        k: jax.jit(simulate)(m, s, build.plan_spec(loss=k, **opts), cal) for k in ("materialized", "fused", "chunked")
    }
    freed = (float(runs["materialized"].buffers_GiB) - float(runs["fused"].buffers_GiB)) * 2**30
    assert freed == pytest.approx(4.0 * 2 * 4096 * entry["vocab"], rel=1e-5)
    assert float(runs["fused"].buffers_GiB) > float(runs["chunked"].buffers_GiB)
    t = {k: float(v.step_time_s) for k, v in runs.items()}
    assert t["fused"] == pytest.approx(t["chunked"], rel=1e-6) and t["fused"] < t["materialized"]
    assert stacks.profile("llm-foundry").loss == "fused"


def test_hidden_data_parallel_traffic_costs_the_measured_share_of_its_time(catalog, cal, monkeypatch):
    """Collectives running beside compute slow it by OVERLAP_SLOWDOWN of their time (Lee et al.
    2025, arXiv 2507.03114: 18.9% on average): between charging nothing for the hidden traffic
    and charging all of it, exactly that share; with no data parallelism, nothing."""
    from hetersim.terms import dp

    measured = dp.OVERLAP_SLOWDOWN
    assert measured == 0.189  # the paper's average
    m = build.model_spec(catalog.model("llama2-7b"))
    s = build.system_spec(catalog.gpu("h100-sxm-80gb"), catalog.links)
    for zero in (0, 1, 3):
        plan = build.plan_spec(n_gpus=64, zero=zero, micro_batch=1, global_batch=512, seq_len=4096)
        charged = {}
        for share in (0.0, measured, 1.0):
            monkeypatch.setattr(dp, "OVERLAP_SLOWDOWN", share)
            charged[share] = float(simulate(m, s, plan, cal).dp_comm_s)  # traced anew: no jit cache
        hidden = charged[1.0] - charged[0.0]
        assert hidden > 0.0, zero  # some traffic hides behind the passes
        assert charged[measured] - charged[0.0] == pytest.approx(measured * hidden, rel=1e-4), zero
    alone = build.plan_spec(n_gpus=1, micro_batch=1, global_batch=8, seq_len=4096)
    monkeypatch.setattr(dp, "OVERLAP_SLOWDOWN", measured)
    assert float(simulate(m, s, alone, cal).dp_comm_s) == 0.0
