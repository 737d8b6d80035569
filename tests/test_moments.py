"""Adam's moments in bf16: Megatron-Core's precision-aware optimizer (use_precision_aware_optimizer,
exp_avg_dtype = exp_avg_sq_dtype = bf16; store_param_remainders) and DeepSeek-V3's BF16 moments
(report §3.3.3)."""

from __future__ import annotations

import json
from importlib import resources

import jax
import pytest
from typer.testing import CliRunner

from dse.cli import app
from hetersim.catalog import load_catalog
from hetersim.fit.runs import read_runs, row_inputs
from hetersim.simulate import simulate
from hetersim.terms import compute, memory

from .conftest import make

sim = jax.jit(simulate)


@pytest.mark.parametrize(
    ("precision", "extra", "fp32_bytes", "bf16_bytes"),
    [
        ("bf16", {}, 12.0, 6.0),  # master kept as the 16 bits the bf16 weight lacks
        ("fp8", {}, 12.0, 8.0),  # an FP8 recipe: Megatron-Core keeps an fp32 master
        ("fp16", {}, 12.0, 8.0),  # remainders only beside bf16 weights
        ("bf16", {"offload": {"optimizer": "host-dram"}}, 12.0, 12.0),  # CPU-Adam keeps fp32 states
    ],
)
def test_optimizer_state_bytes_per_parameter(catalog, precision, extra, fp32_bytes, bf16_bytes):
    _, _, p32 = make(catalog, precision=precision, **extra)
    _, _, p16 = make(catalog, precision=precision, moments="bf16", **extra)
    assert float(memory.optimizer_bytes(p32)) == fp32_bytes
    assert float(memory.optimizer_bytes(p16)) == bf16_bytes


def test_bf16_moments_shrink_the_state_the_update_and_the_checkpoint_only(catalog, cal):
    """Same layout, bf16 training: the optimizer state halves (12 -> 6 bytes per parameter), the
    GPU update streams 18 bytes per parameter instead of 30, the checkpoint loses 6 of its 14;
    weights, gradients, activations and the rest of the step are untouched."""
    m, s, p32 = make(catalog, "llama2-7b", n_gpus=8, tp=1, pp=1, global_batch=64, zero=0, sp=False)
    _, _, p16 = make(catalog, "llama2-7b", n_gpus=8, tp=1, pp=1, global_batch=64, zero=0, sp=False, moments="bf16")
    a, b = sim(m, s, p32, cal), sim(m, s, p16, cal)
    assert float(b.optimizer_GiB) == pytest.approx(float(a.optimizer_GiB) / 2.0, rel=1e-6)
    for key in ("weights_GiB", "grads_GiB", "activations_GiB", "compute_s", "dp_comm_s", "bubble_s"):
        assert float(getattr(b, key)) == float(getattr(a, key)), key
    assert float(b.checkpoint_GiB) == pytest.approx(float(a.checkpoint_GiB) * 8.0 / 14.0, rel=1e-6)
    assert 0.0 < float(b.optimizer_s) < float(a.optimizer_s)
    params = 1.0e9
    bytes_s = [float(compute.optimizer_gpu_s(s.device, cal, params, x) - compute.optimizer_gpu_s(s.device, cal, 0.0, x))
               for x in (12.0, 6.0)]  # fmt: skip
    assert bytes_s[1] / bytes_s[0] == pytest.approx(18.0 / 30.0, rel=1e-6)


def test_the_cli_takes_moments_and_refuses_other_dtypes():
    base = "evaluate --model llama2-7b --gpu h100-sxm-80gb --gpus 8 --global-batch 64".split()
    ok = CliRunner().invoke(app, [*base, "--moments", "bf16", "--json"])
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.output)
    assert out["plan"]["moments"] == "bf16"
    bad = CliRunner().invoke(app, [*base, "--moments", "fp16"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1, bad.output
    assert "--moments must be one of fp32, bf16" in bad.output and "Traceback" not in bad.output


def test_the_deepseek_v3_reports_run_keeps_bf16_moments():
    """pap071 (the DeepSeek-V3 report's run) reads its BF16 moments from data/moe_run_configs.csv;
    the Megatron-Bridge rows whose presets were not checked keep fp32."""
    rows = read_runs(resources.files("hetersim") / "data" / "moe_runs.csv")
    catalog = load_catalog([])
    moments = {
        r.id.split("-")[0]: row_inputs(r, catalog)["plan"]["moments"] for r in rows if r.id[:5] in ("pap07", "mb000")
    }
    assert moments["pap071"] == "bf16"
    assert moments["mb000"] == "fp32"
