"""Golden values computed by hand from the papers' formulas."""

from __future__ import annotations

import pytest

from hetersim import build
from hetersim.specs import ModelSpec
from hetersim.terms.flops import megatron_flops_per_token, model_flops_per_token, total_params
from hetersim.terms.memory import layer_activation_bytes


def test_llama2_7b_parameter_count(catalog):
    # 32 layers x (4*4096^2 attention + 3*4096*11008 SwiGLU + 2*4096 norms) + 2*32000*4096 + 4096
    m = build.model_spec(catalog.model("llama2-7b"))
    by_hand = 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 32000 * 4096 + 4096
    assert by_hand == 6_738_415_616  # the Hugging Face checkpoint's count
    assert float(total_params(m)) == pytest.approx(by_hand, rel=1e-6)


def test_gpt3_175b_parameter_count(catalog):
    # Narayanan et al. SC'21 Table 1 lists the 96-layer, 12288-hidden model as 174.6B
    m = build.model_spec(catalog.model("gpt3-175b"))
    assert float(total_params(m)) / 1e9 == pytest.approx(174.6, abs=0.05)


def test_llama31_8b_flops_per_sample_matches_mlperf(catalog):
    # MLPerf Training counts 421.59 TFLOP per 8192-token sample of Llama 3.1 8B
    m = build.model_spec(catalog.model("llama3.1-8b"))
    tflop = float(model_flops_per_token(m, 8192)) * 8192 / 1e12
    assert tflop == pytest.approx(421.59, rel=2e-3)


def test_llama2_7b_flops_per_token_by_hand(catalog):
    # L*h^2*(12 + 12*g/a + 18*f/h + 6*s/h) + 6*V*h with g = a
    m = build.model_spec(catalog.model("llama2-7b"))
    L, h, f, s, V = 32, 4096, 11008, 4096, 32000
    by_hand = L * h * h * (12 + 12 + 18 * f / h + 6 * s / h) + 6 * V * h
    assert float(model_flops_per_token(m, s)) == pytest.approx(by_hand, rel=1e-6)


@pytest.mark.parametrize("full", [0, 1])
def test_megatron_equation_3(catalog, full):
    # Narayanan et al. SC'21 eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh) with full recompute,
    # 72 B s l h^2 (1 + s/6h + V/12lh) without.
    m = build.model_spec(catalog.model("gpt3-175b"))
    B, s, L, h, V = 1, 2048, 96, 12288, 51200
    if full:
        by_hand = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    else:
        by_hand = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert float(megatron_flops_per_token(m, s, full)) * s == pytest.approx(by_hand, rel=1e-5)


GPT = dict(layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=4 * 12288, vocab=51200, mlp="plain")


def _act(t, sp, recompute, attention="materialized", b=1, s=2048):
    m = build.model_spec(GPT)
    plan = build.plan_spec(
        n_gpus=t, tp=t, global_batch=b, micro_batch=b, seq_len=s, sp=sp, recompute=recompute, attention=attention
    )
    return float(layer_activation_bytes(m, plan)[0])


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_bytes(t):
    # Korthikanti et al. 2022, bytes per layer (s, b, h, a; tensor parallel t)
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    assert _act(t, False, "none") == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-5)
    assert _act(t, True, "none") == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)), rel=1e-5)
    assert _act(t, True, "selective") == pytest.approx(sbh * 34 / t, rel=1e-5)
    assert _act(t, False, "selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-5)
    assert _act(t, True, "full") == pytest.approx(2 * sbh / t, rel=1e-5)
    assert _act(t, False, "full") == pytest.approx(2 * sbh, rel=1e-5)


def test_flash_attention_stores_no_score_matrix():
    s, h, a = 2048, 12288, 96
    flash = _act(8, True, "none", attention="flash")
    # 34/t * sbh plus the fp32 log-sum-exp (4 bytes per head and token), no 5as/h term
    assert flash == pytest.approx(s * h * 34 / 8 + 4 * a / 8 * s, rel=1e-5)


def test_model_spec_from_dims_is_a_modelspec():
    m = build.model_spec(dict(layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=100))
    assert isinstance(m, ModelSpec)
    assert float(m.kv_heads) == 4.0


def test_wave_quantization_by_hand(catalog):
    # A100 (108 SMs), 128x256 tiles. M=8192, N=2304: 64 x 9 = 576 tiles -> ceil(576/108) = 6
    # waves of 108 SMs: 576/648 busy. M=N=... 12 x 9 = 108 tiles fill exactly one wave.
    from hetersim.terms.compute import wave_eff

    dev = build.device_spec(catalog.gpu("a100-sxm-80gb"))
    assert float(wave_eff(dev, 8192.0, 2304.0)) == pytest.approx(576 / 648)
    assert float(wave_eff(dev, 12 * 128.0, 9 * 256.0)) == pytest.approx(1.0)
    # One tile more starts a second, almost empty wave.
    assert float(wave_eff(dev, 12 * 128.0 + 1, 9 * 256.0)) == pytest.approx(117 / 216)
    # A batched launch of 4 such GEMMs: 432 tiles, exactly 4 waves.
    assert float(wave_eff(dev, 12 * 128.0, 9 * 256.0, 4.0)) == pytest.approx(1.0)


def test_gemm_time_includes_wave_quantization(catalog, cal):
    # Adding one tile's worth of rows to a GEMM that fills one wave costs a whole extra wave.
    from hetersim.terms.compute import gemm_s

    dev = build.device_spec(catalog.gpu("a100-sxm-80gb"))
    plan = build.plan_spec(n_gpus=1, tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=2048)
    one_wave = float(gemm_s(dev, cal, plan, 12 * 128.0, 9 * 256.0, 8192.0))
    two_waves = float(gemm_s(dev, cal, plan, 13 * 128.0, 9 * 256.0, 8192.0))
    assert two_waves / one_wave == pytest.approx(2.0, rel=0.02)


@pytest.mark.parametrize("attention", ["materialized", "flash"])
def test_full_recompute_working_layer_holds_everything(attention):
    # Under full recomputation one layer is rebuilt for its backward: it holds the activations of
    # a layer without recomputation, the s x s scores included when attention materialises them
    # (Korthikanti eq. 2 with the 5as/h term), whatever the stored checkpoints are.
    m = build.model_spec(GPT)
    kw = dict(n_gpus=8, tp=8, global_batch=1, micro_batch=1, seq_len=2048, sp=True, attention=attention)
    stored_none, _ = layer_activation_bytes(m, build.plan_spec(recompute="none", **kw))
    _, working_full = layer_activation_bytes(m, build.plan_spec(recompute="full", **kw))
    assert float(working_full) == pytest.approx(float(stored_none), rel=1e-6)


@pytest.mark.parametrize(
    "zero, precision, expected",
    [
        (0, "bf16", 4.0),  # Megatron DDP: fp32 main_grad
        (0, "fp16", 4.0),  # Korthikanti et al.'s 18 bytes per parameter with fp16 training
        (1, "bf16", 2.0),  # distributed optimizer: grad buffer in the parameter dtype
        (3, "bf16", 4.0),  # FSDP2 reduce_dtype fp32
        (3, "fp16", 2.0),  # DeepSpeed ZeRO-3: gradients and their reduction in fp16
        (3, "fp32", 4.0),
    ],
)
def test_gradient_bytes_per_stack(zero, precision, expected):
    from hetersim.terms.memory import grad_bytes

    plan = build.plan_spec(n_gpus=8, dp=8, zero=zero, precision=precision, micro_batch=1, global_batch=8, seq_len=2048)
    assert float(grad_bytes(plan)) == expected


def test_zero3_buffers_hold_two_gathered_layers_and_one_layer_of_gradients():
    from hetersim.terms.flops import layer_params
    from hetersim.terms.memory import buffer_bytes

    m = build.model_spec(GPT)
    kw = dict(n_gpus=64, tp=8, dp=8, micro_batch=1, global_batch=8, seq_len=2048, precision="bf16")
    z1 = float(buffer_bytes(m, build.plan_spec(zero=1, **kw)))
    z3 = float(buffer_bytes(m, build.plan_spec(zero=3, **kw)))
    per_layer = float(layer_params(m)) / 8
    assert z3 - z1 == pytest.approx(per_layer * (2 * 2.0 + 4.0), rel=1e-6)
