"""Golden values computed by hand from the papers' formulas."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
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
    from hetersim.terms.tiles import wave_eff

    dev = build.device_spec(catalog.gpu("a100-sxm-80gb"))
    assert float(wave_eff(dev, 8192.0, 2304.0)) == pytest.approx(576 / 648)
    assert float(wave_eff(dev, 12 * 128.0, 9 * 256.0)) == pytest.approx(1.0)
    # One tile more starts a second, almost empty wave.
    assert float(wave_eff(dev, 12 * 128.0 + 1, 9 * 256.0)) == pytest.approx(117 / 216)
    # A batched launch of 4 such GEMMs: 432 tiles, exactly 4 waves.
    assert float(wave_eff(dev, 12 * 128.0, 9 * 256.0, 4.0)) == pytest.approx(1.0)


def test_a_gemm_below_one_wave_runs_on_a_smaller_tile_by_hand(catalog):
    # H100 (132 SMs), M = 2048, N = 512: 16 x 2 = 32 tiles of 128x256 leave 100 SMs idle (32/132);
    # 128x128: 64 tiles at 0.75 of the reuse (0.36); 64x128: 128 tiles, one wave, at 0.5 (0.485);
    # 64x64: 256 tiles in two waves at 0.375 (0.36). cuBLAS's pick is 64x128.
    from hetersim.terms.tiles import wave_eff

    dev = build.device_spec(catalog.gpu("h100-sxm-80gb"))
    assert float(wave_eff(dev, 2048.0, 512.0)) == pytest.approx(0.5 * 128 / 132)
    # A GEMM that fills its waves of large tiles keeps them: 4096 x 4096 is 32 x 16 = 512 tiles.
    assert float(wave_eff(dev, 4096.0, 4096.0)) == pytest.approx(512 / 528)
    # Never above the best-case rate, never below the large tile's own share.
    for m, n in ((64.0, 64.0), (1.0, 1.0), (300.0, 7000.0), (8192.0, 128.0)):
        large = np.ceil(m / 128) * np.ceil(n / 256)
        assert large / 132 / np.ceil(large / 132) <= float(wave_eff(dev, m, n)) + 1e-7 <= 1.0 + 1e-7


# XLA's measured H100 bf16 matmul throughput (TFLOP/s, kernel time, launch excluded) at K = 4096:
# openxla/xla xla/service/gpu/model/matmul_interpolator_data.h, sm_90 entries, as mirrored at
# ROCm/xla @ b2766086ecf9 (benchmarks/gemm_table.py prices all 375 of its shapes).
XLA_H100_K4096 = {
    (4096, 4096): 783.3,
    (4096, 512): 650.0,
    (2048, 1024): 653.1,
    (2048, 512): 451.2,
    (1024, 1024): 470.1,
    (4096, 256): 376.2,
}


def test_gemm_kernel_time_is_within_a_quarter_of_measured_h100_shapes(catalog, cal):
    """The kernel part of a GEMM's price (best-case rate, tile choice and waves, memory roofline;
    no training-shape factor, no launch overhead) against measured H100 kernels that fill one wave
    of 128x256 tiles (4096 x 4096) and that do not: within 25% of each. With one tile shape the
    second group was priced up to 2.3x too slow (2048 x 512: 193 TFLOP/s against 451)."""
    from hetersim.terms.compute import gemm_s

    dev = build.device_spec(catalog.gpu("h100-sxm-80gb"))
    kernel = dataclasses.replace(cal, gemm_shape_eff=1.0, kernel_overhead_us=0.0)
    plan = build.plan_spec(n_gpus=1, global_batch=1, seq_len=4096, precision="bf16")
    for (m, n), measured in XLA_H100_K4096.items():
        seconds = float(gemm_s(dev, kernel, plan, float(m), float(n), 4096.0))
        tflops = 2.0 * m * n * 4096 / seconds / 1e12
        assert tflops == pytest.approx(measured, rel=0.25), (m, n)


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


def test_collectives_run_on_nccls_fastest_protocol(catalog):
    # NCCL's tuning model (tuning.cc @b6475625) for an all-gather over 2240 A100s (280 DGX nodes,
    # HDR): Simple costs 8.4 us + 1960 NVLink steps x 3.4 us + 279 network steps x 14 us; LL128
    # 14 us + 1960 x 1.9 us + 279 x 4.0 us at 92% of the bandwidth; LL 6.6 us + 1960 x max(0.6,
    # 1.0 net overhead) + 279 x 2.7 us at a quarter of it.
    from hetersim.terms import comm

    net = build.network_spec(catalog.gpu("a100-sxm-80gb"), catalog.links)
    n, one = jnp.float32(2240.0), jnp.float32(1.0)
    simple = (8.4 + 1960 * 3.4 + 279 * 14.0) * 1e-6
    ll128 = (14.0 + 1960 * 1.9 + 279 * 4.0) * 1e-6
    ll = (6.6 + 1960 * 1.0 + 279 * 2.7) * 1e-6
    assert float(comm.ring_latency_s(net, n, one)) == pytest.approx(simple, rel=1e-5)
    assert float(comm.ring_latency_s(net, n, one, "ll128")) == pytest.approx(ll128, rel=1e-5)
    assert float(comm.ring_latency_s(net, n, one, "ll")) == pytest.approx(ll, rel=1e-5)
    bw_simple = float(comm._bandwidth_s(net, n, one, jnp.float32(1e8), 1.0))
    # A 100 MB gather (one ZeRO-3 prefetch bucket of 50M fp16 weights): LL128 is fastest.
    bw, lat = comm.all_gather_parts(net, n, one, jnp.float32(1e8))
    assert float(lat) == pytest.approx(ll128, rel=1e-5)
    assert float(bw) == pytest.approx(bw_simple / 0.92, rel=1e-5)
    # 100 GB in one gather: bandwidth dominates and Simple wins.
    bw, lat = comm.all_gather_parts(net, n, one, jnp.float32(1e11))
    assert float(lat) == pytest.approx(simple, rel=1e-5)
    # A link that gives no low-latency protocol is priced on Simple alone.
    plain = {k: {f: v for f, v in e.items() if not f.startswith("latency_ll")} for k, e in catalog.links.items()}
    net0 = build.network_spec(catalog.gpu("a100-sxm-80gb"), plain)
    _, lat0 = comm.all_gather_parts(net0, n, one, jnp.float32(1e8))
    assert float(lat0) == pytest.approx(simple, rel=1e-5)
    # One rank: no collective, no cost.
    assert float(sum(comm.all_gather_parts(net, one, one, jnp.float32(1e8)))) == 0.0


def test_deepspeed_zero3_regathers_what_it_releases():
    # GPT 530B layer: 12 h^2 + 2 h = 5.033e9 weights (biases ignored). DeepSpeed keeps a weight from the
    # recomputed forward to the backward only if the 2 S weights used in between (S after it in
    # the layer) are within stage3_max_reuse_distance = 1e9: the first 5.033e9 - 0.5e9 are gathered
    # again, 90.07% of the layer.
    from hetersim.terms.dp import zero3_regather

    gpt = dict(layers=105, hidden=20480, heads=128, kv_heads=128, ffn_hidden=81920, vocab=51200, mlp="plain")
    m = build.model_spec(gpt)
    kw = dict(n_gpus=2240, tp=1, pp=1, zero=3, micro_batch=1, global_batch=2240, seq_len=2048)
    p_layer = 12 * 20480**2 + 2 * 20480
    ds = build.plan_spec(recompute="full", reuse_Mparams=1000.0, **kw)
    assert float(zero3_regather(m, ds)) == pytest.approx((p_layer - 0.5e9) / p_layer, rel=1e-5)
    # FSDP (0) keeps the recompute's gather; without full recomputation nothing is re-gathered.
    assert float(zero3_regather(m, build.plan_spec(recompute="full", **kw))) == 0.0
    assert float(zero3_regather(m, build.plan_spec(recompute="selective", reuse_Mparams=1000.0, **kw))) == 0.0
    # A layer shorter than half the distance is kept whole (LLaMA-2-7B: 0.2e9 per layer).
    llama = dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000, mlp="gated")
    small = build.model_spec(llama)
    assert float(zero3_regather(small, ds)) == 0.0
    with pytest.raises(ValueError, match="reuse_Mparams must be a number >= 0 and <= 10,000,000"):
        build.plan_spec(reuse_Mparams=-1.0, **kw)


def test_legacy_deepspeed_zero3_gathers_each_tensor_and_copies_per_rank(catalog, cal):
    """DeepSpeed <= 0.4's ZeRO-3 (zero3_prefetch off) runs one all-gather and one reduce-scatter per
    parameter tensor, whatever its size (not one per 50M bucket), each through PyTorch's
    tensor-list collective, which copies the flat buffer out to (or in from) one view per rank:
    a collective over twice the ranks issues twice the copies. With prefetch (FSDP, DeepSpeed >=
    0.5) neither applies."""
    import jax

    from hetersim.simulate import simulate
    from hetersim.terms import dp, memory

    dims = dict(layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=49152, vocab=51200)
    gpt = build.model_spec({**dims, "mlp": "plain", "tied_embeddings": True})
    llama = build.model_spec(dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256))
    # GPT (Megatron's modules): QKV, projection, two MLP matrices, their biases, two LayerNorms
    # (weight, bias) per layer; word and position embeddings and the final LayerNorm at the root,
    # the head tied. LLaMA: four matrices and two RMSNorm weights; embedding, final norm, head.
    assert float(dp.param_tensors(gpt, 96.0, 1.0)) == 96 * 12 + 4
    assert float(dp.param_tensors(llama, 32.0, 1.0)) == 32 * 6 + 3

    kw = dict(tp=1, pp=1, zero=3, micro_batch=1, seq_len=2048, precision="fp16", recompute="full")
    legacy = {n: build.plan_spec(n_gpus=n, global_batch=n, zero3_prefetch=False, **kw) for n in (768, 1536)}
    modern = build.plan_spec(n_gpus=768, global_batch=768, **kw)
    p = float(memory.local_params(gpt, modern))
    tensors = 96 * 12 + 4
    assert [float(x) for x in dp.dp_collectives(legacy[768], p, 768.0, 97.0, tensors)] == [tensors, tensors]
    # With prefetch the count is the stack's (buckets, or FSDP units): the tensors do not enter.
    assert [float(x) for x in dp.dp_collectives(modern, p, 768.0, 97.0, tensors)] == [
        float(x) for x in dp.dp_collectives(modern, p, 768.0, 97.0)
    ]

    dev = catalog.gpu("a100-sxm-80gb")
    s = build.system_spec(dev, catalog.links, 8, catalog.memory)
    dev_spec = s.device
    copies = {n: float(dp.list_copy_s(dev_spec, cal, plan, p, float(n), tensors, 2.0)) for n, plan in legacy.items()}
    launches = {n: 3.0 * tensors * n * dp.COPY_LAUNCH_US * 1e-6 for n in legacy}
    # Launch-bound at this size (the copied bytes take less): the launches plus the zero fill.
    fill = copies[768] - launches[768]
    assert 0.0 < fill < 0.2 * launches[768]
    assert copies[1536] - copies[768] == pytest.approx(launches[1536] - launches[768], rel=1e-4)
    assert float(dp.list_copy_s(dev_spec, cal, modern, p, 768.0, tensors, 2.0)) == 0.0
    # In the step: the legacy gather path pays them on top of its transfers, exposed.
    sim = jax.jit(simulate)
    t = {n: float(sim(gpt, s, plan, cal).dp_comm_s) for n, plan in legacy.items()}
    assert t[1536] - t[768] >= launches[1536] - launches[768]


def test_deepspeed_zero3_holds_a_linear_and_a_reduce_bucket_not_a_layer(catalog, cal):
    """GPT 530B under ZeRO-3, fp16: FSDP holds two gathered layers and a layer of gradients,
    5.033e9 x (2 + 2 + 2) bytes; DeepSpeed the 1.678e9-weight first MLP matrix (h x 4h), the
    0.5e9 weights it keeps for reuse (half its 1e9 reuse distance) and its 5e7 prefetch bucket in
    fp16, and a 5e8 reduce bucket with that matrix's gradients arriving whole. Narayanan et al.
    ran it at micro-batch 4 on 640 80 GB A100s; whole layers would not fit."""
    import jax

    from hetersim.simulate import simulate
    from hetersim.terms import flops, memory

    sim = jax.jit(simulate)
    gpt = dict(layers=105, hidden=20480, heads=128, kv_heads=128, ffn_hidden=81920, vocab=51200, mlp="plain")
    m = build.model_spec(gpt)
    kw = dict(n_gpus=640, tp=1, pp=1, zero=3, micro_batch=4, global_batch=2560, seq_len=2048, precision="fp16")
    layer, big = 12 * 20480**2 + 2 * 20480, 4 * 20480**2
    fsdp = build.plan_spec(recompute="full", **kw)
    ds = build.plan_spec(recompute="full", reuse_Mparams=1000.0, **kw)
    assert float(memory.largest_matrix_params(m)) == pytest.approx(big, rel=1e-6)
    assert float(memory.zero3_gathered_bytes(m, fsdp)) == pytest.approx(layer * 6.0, rel=1e-5)
    assert float(memory.zero3_gathered_bytes(m, ds)) == pytest.approx((big + 5.5e8) * 2 + (big + 5e8) * 2, rel=1e-5)
    # DeepSpeed <= 0.4 runs each gather and reduction on a flat buffer beside the list of per-rank
    # views: one more copy of that matrix (fp16 weights or gradients); it still fits.
    old = build.plan_spec(recompute="full", reuse_Mparams=1000.0, zero3_prefetch=False, **kw)
    assert float(memory.zero3_gathered_bytes(m, old)) == pytest.approx(
        (big + 5.5e8) * 2 + (big + 5e8) * 2 + big * 2, rel=1e-5
    )
    s = build.system_spec(catalog.gpu("a100-sxm-80gb"), catalog.links, 8, catalog.memory)
    assert int(sim(m, s, ds, cal).infeasible) == 0
    assert int(sim(m, s, old, cal).infeasible) == 0
    assert int(sim(m, s, fsdp, cal).infeasible) != 0
    # A small layer is held whole either way, never more than two layers gathered and one of gradients.
    llama = build.model_spec(dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000))
    p7 = float(flops.layer_params(llama))
    assert float(memory.zero3_gathered_bytes(llama, ds)) == pytest.approx(p7 * 6.0, rel=1e-5)


@pytest.mark.parametrize("attention", ["materialized", "flash"])
def test_selective_recompute_rebuilds_what_it_did_not_store(catalog, cal, attention):
    # Korthikanti et al. 2022 §5: selective recomputation drops the attention core's activations
    # (with materialised scores) and recomputes that core only; the activation function's output
    # stays stored. With flash attention nothing s x s is stored, and the selective policy drops
    # and rebuilds the activation function's output instead (memory.layer_activation_bytes).
    from hetersim.layer import layer_costs
    from hetersim.terms import compute, elementwise

    def plan(attn):
        kw = dict(n_gpus=8, tp=8, sp=True, micro_batch=1, global_batch=8, seq_len=2048, recompute="selective")
        return build.plan_spec(attention=attn, **kw)

    m = build.model_spec(GPT)
    s = build.system_spec(catalog.gpu("a100-sxm-80gb"), catalog.links)
    p = plan(attention)
    recomp = float(layer_costs(m, s, p, cal).recomp)
    attn = float(compute.attention_fwd_s(s.device, cal, m, p))
    act = float(elementwise.activation_fn_s(s.device, cal, m, p))
    assert act > 0.0
    expected = attn if attention == "materialized" else attn + act
    assert recomp == pytest.approx(expected, rel=1e-6)
    # Per token, flash stores the activation function's output (2f/t bytes) less and its
    # log-sum-exp (4a/t bytes) more than the materialised form under selective recomputation.
    diff = float(layer_activation_bytes(m, plan("materialized"))[0] - layer_activation_bytes(m, plan("flash"))[0])
    assert diff == pytest.approx(2048 * (2 * 4 * 12288 / 8 - 4 * 96 / 8), rel=1e-6)


def _amp_network(nics_per_gpu):
    """The V100 of AMP's p3.8xlarge from the mixed-GPU test catalog (one 10 Gbps NIC for four
    GPUs), with ``nics_per_gpu`` replaced."""
    from pathlib import Path

    from hetersim.catalog import load_catalog

    cat = load_catalog([Path(__file__).parent / "data" / "plans" / "kinds.toml"])
    gpu = dict(cat.gpu("v100-16gb"), nics_per_gpu=nics_per_gpu)
    return build.network_spec(gpu, cat.links), cat.links[gpu["nic"]]


def test_a_pipeline_send_has_the_nic_to_itself_where_it_is_the_nodes_only_flow():
    """A NIC's line rate is shared by the flows crossing it: a 16-stage pipeline of one V100 per
    stage sends each boundary's activations alone over the node's 10 Gbps NIC, at 1.25 GB/s x the
    bus efficiency, not at the quarter of it a data-parallel collective of all four GPUs leaves
    each; stages of four ranks (the whole node) do get that quarter. A GPU with a NIC of its own
    gains nothing."""
    from hetersim.terms import comm

    net, nic = _amp_network(0.25)
    assert float(net.gpus_per_nic) == 4.0
    line = float(nic["bw_GBps"]) * float(nic["busbw_eff"]) * 1e9
    # 1024 GPT-2 medium micro-batches (1024 tokens x 1024 x fp16 each): the bandwidth term dominates
    nbytes = 2.0 * 1024 * 1024 * 1024
    lat = float(nic["latency_us"]) * 1e-6
    alone = float(comm.p2p_s(net, 1.0, nbytes, n=16.0))
    whole_node = float(comm.p2p_s(net, 4.0, nbytes, n=4.0))
    assert alone == pytest.approx(nbytes / line + lat, rel=1e-6)
    assert whole_node == pytest.approx(4.0 * nbytes / line + lat, rel=1e-6)
    two = float(comm.p2p_s(net, 2.0, nbytes, n=8.0))
    assert alone < two < whole_node  # more flows on the NIC never send faster
    own, _ = _amp_network(1.0)
    assert float(own.gpus_per_nic) == 1.0
    assert float(comm.nic_gain(own, 1.0)) == 1.0
    assert float(comm.nic_gain(net, 1.0)) == 4.0 and float(comm.nic_gain(net, 8.0)) == 1.0


def test_the_tied_embedding_sync_of_a_pipeline_of_one_gpu_per_stage_uses_the_whole_nic(catalog):
    """The first and last stages' all-reduce of a tied embedding's gradient is the only traffic
    across the NIC then: with one rank per stage it costs the same behind a NIC shared by four
    GPUs as behind one of the same line rate per GPU; with four ranks per stage (a node) the
    shared NIC is slower."""
    from hetersim.simulate import tied_embedding_sync_s

    m = build.model_spec(catalog.model("gpt3-1.3b"))
    times = {}
    v100 = build.system_spec(catalog.gpu("v100-sxm-32gb"), catalog.links)
    for share in (0.25, 1.0):
        sys = dataclasses.replace(v100, network=_amp_network(share)[0])
        for tp in (1, 4):
            plan = build.plan_spec(n_gpus=16 * tp, tp=tp, pp=16, global_batch=64, seq_len=1024, precision="fp16")
            times[share, tp] = float(tied_embedding_sync_s(m, sys, plan))
    assert times[0.25, 1] == pytest.approx(times[1.0, 1], rel=1e-6)
    assert times[0.25, 4] > 2.0 * times[1.0, 4]
