"""Hybrid sharding (the plan field ``shard_group``): ZeRO / FSDP states sharded over groups of
data-parallel ranks and replicated across the groups (PyTorch FSDP HYBRID_SHARD, FSDP2 HSDP)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from hetersim.simulate import simulate
from hetersim.types import Infeasible

from .conftest import make

sim = jax.jit(simulate)
SEVEN_B = dict(n_gpus=128, tp=1, pp=1, global_batch=256, micro_batch=2, seq_len=4096, stack="fsdp")


def _run(catalog, cal, model="llama2-7b", gpu="a100-sxm-80gb", **plan):
    return sim(*make(catalog, model, gpu, **plan), cal)


@pytest.mark.parametrize(
    ("model", "plan"),
    [
        ("llama2-7b", dict(SEVEN_B, zero=3)),
        ("llama2-7b", dict(SEVEN_B, zero=1, stack="megatron")),
        ("llama2-70b", dict(n_gpus=64, tp=8, pp=2, cp=2, global_batch=64, zero=1, seq_len=8192)),
        ("mixtral-8x7b", dict(n_gpus=64, tp=1, pp=1, ep=8, global_batch=128, zero=1, seq_len=4096)),
    ],
)
def test_a_shard_group_of_every_data_parallel_rank_is_plain_zero(catalog, cal, model, plan):
    every = plan["n_gpus"] // (plan["tp"] * plan["pp"])  # dp x cp
    base = _run(catalog, cal, model, "h100-sxm-80gb", **plan)
    same = _run(catalog, cal, model, "h100-sxm-80gb", **plan, shard_group=every)
    for field in dataclasses.fields(base):
        assert np.array_equal(np.asarray(getattr(base, field.name)), np.asarray(getattr(same, field.name))), field.name


def test_smaller_shard_groups_hold_more_state_and_gather_inside_the_node(catalog, cal):
    # Llama 2 7B under FSDP on 16 nodes of 8 A100: states over all 128 ranks, then over 16, 8, 4.
    runs = {g: _run(catalog, cal, **SEVEN_B, zero=3, shard_group=g) for g in (0, 16, 8, 4)}
    full = runs[0]
    for g in (16, 8, 4):
        # Weights, gradients and optimizer states are 128 / g times what full sharding keeps.
        for part in ("weights_GiB", "grads_GiB", "optimizer_GiB"):
            assert float(getattr(runs[g], part)) == pytest.approx(float(getattr(full, part)) * 128 / g, rel=1e-5)
        assert float(runs[g].hbm_used_GiB) > float(full.hbm_used_GiB)
    # Eight ranks in a group sit in one node: the weights' all-gathers cross NVLink, not the NICs,
    # and only a shard of the gradients crosses between the groups (fms-fsdp ran its 7B this way).
    assert float(runs[8].dp_comm_s) < float(full.dp_comm_s)
    assert float(runs[8].step_time_s) < float(full.step_time_s)


def test_plain_data_parallelism_ignores_the_shard_group(catalog, cal):
    plan = dict(SEVEN_B, zero=0, stack="megatron", global_batch=512, micro_batch=1, seq_len=2048)
    plain = _run(catalog, cal, model="llama2-7b", gpu="h100-sxm-80gb", **plan)
    grouped = _run(catalog, cal, model="llama2-7b", gpu="h100-sxm-80gb", **plan, shard_group=8)
    assert float(grouped.step_time_s) == pytest.approx(float(plain.step_time_s), rel=1e-6)
    assert float(grouped.hbm_used_GiB) == pytest.approx(float(plain.hbm_used_GiB), rel=1e-6)


def test_a_shard_group_that_does_not_divide_the_ranks_is_flagged(catalog, cal):
    out = _run(catalog, cal, **SEVEN_B, zero=3, shard_group=3)
    assert int(out.infeasible) & int(Infeasible.SHARD_GROUP)
    assert not int(_run(catalog, cal, **SEVEN_B, zero=3, shard_group=8).infeasible) & int(Infeasible.SHARD_GROUP)


def test_shard_group_is_a_sweep_axis(catalog, cal, tmp_path):
    """A study lists shard groups like any plan axis: the dataset holds one configuration per group,
    each the configuration evaluated alone, with a group that does not divide the ranks flagged
    (an infeasible point of a search is data)."""
    import xarray as xr

    from dse import sweep

    study = tmp_path / "hsdp.toml"
    study.write_text(
        'name = "hsdp"\nobjectives = ["time_to_train_s"]\n[model]\nkey = "llama2-7b"\n'
        '[hardware]\ngpu = "h100-sxm-80gb"\nn_gpus = 128\n'
        '[plan]\ntp = 1\npp = 1\nmicro_batch = 2\nzero = 3\nstack = "fsdp"\nshard_group = [0, 3, 8, 16]\n'
        "global_batch = 256\nseq_len = 4096\ntrain_tokens = 1.0e11\n"
    )
    with xr.open_dataset(sweep.run_sweep(study, tmp_path / "out", progress=False)) as ds:
        groups = ds["shard_group"].values.tolist()
        assert sorted(groups) == [0, 3, 8, 16]
        for i, group in enumerate(groups):
            alone = _run(catalog, cal, gpu="h100-sxm-80gb", **SEVEN_B, zero=3, shard_group=group)
            assert float(ds["step_time_s"][i]) == pytest.approx(float(alone.step_time_s), rel=1e-5)
            assert bool(int(ds["infeasible"][i]) & int(Infeasible.SHARD_GROUP)) == (group == 3)
