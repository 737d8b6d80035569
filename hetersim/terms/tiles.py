"""Which output tiles a GEMM runs on and how busy they keep the SMs (wave quantization)."""

from __future__ import annotations

import jax.numpy as jnp

from ..specs import DeviceSpec

# cuBLAS's most efficient (and, for large training GEMMs, usual) output tile: NVIDIA, "Matrix
# Multiplication Background User's Guide" (DU-09799-001, 2023) §2.3 "Typical tile dimensions in
# cuBLAS" (256x128 and 128x256 are the most efficient) and §3.2 "Wave quantization".
TILE_M, TILE_N = 128.0, 256.0
# The smaller tiles of the same section (128x128, 64x128, 64x64), which cuBLAS's heuristic picks
# when a GEMM has too few large tiles to fill the SMs. A tile does tm*tn multiply-adds per tm+tn
# operand elements it loads in each step of K, so per SM it runs at its data reuse tm*tn/(tm+tn)
# relative to 128x256's: 0.75, 0.5 and 0.375 (the guide's "larger tiles ... use less bandwidth and
# are more efficient"). Checked against XLA's measured H100 table (openxla/xla
# matmul_interpolator_data.h @ b2766086ecf9, benchmarks/gemm_table.py): its shapes that one wave
# of 128x256 tiles does not fill were priced up to 4x too slow (76% off at K >= 1024); with these
# tiles, 16% at K = 2048 and 12% at K = 4096. Shapes that fill a wave are priced as before (8% at
# K >= 1024), and so is every published training run. The shares are geometry, so every device
# takes them; only the H100's kernels are measured here.
SMALL_TILES = ((128.0, 128.0), (64.0, 128.0), (64.0, 64.0))


def _tile_reuse(tm, tn):
    """Multiply-adds per operand element a tm x tn output tile loads."""
    return tm * tn / (tm + tn)


def tile_waves(dev: DeviceSpec, M, N, batch=1.0):
    """(numerator, denominator) of :func:`wave_eff`, kept apart so that picking the best tile
    costs multiplications and the one division is the caller's."""
    inv_sms = 1.0 / jnp.maximum(dev.sm_count, 1.0)
    num = den = None
    for tm, tn in ((TILE_M, TILE_N), *SMALL_TILES):
        tiles = jnp.maximum(jnp.ceil(M * (1.0 / tm)) * jnp.ceil(N * (1.0 / tn)) * batch, 1.0)
        n = (_tile_reuse(tm, tn) / _tile_reuse(TILE_M, TILE_N) * inv_sms) * tiles
        d = jnp.ceil(tiles * inv_sms)
        if num is None:
            num, den = n, d
        else:  # n / d > num / den, both denominators positive
            take = n * den > num * d
            num, den = jnp.where(take, n, num), jnp.where(take, d, den)
    return num, den


def wave_eff(dev: DeviceSpec, M, N, batch=1.0):
    """Share of the best-case rate a GEMM's output tiles reach: for each of cuBLAS's tile shapes
    (:data:`TILE_M` x :data:`TILE_N` and :data:`SMALL_TILES`), its data reuse relative to the
    largest tile's times the share of the SMs busy over its waves (wave quantization: the
    ``ceil(M/tm) * ceil(N/tn)`` tiles run ``sm_count`` at a time, and the last wave leaves SMs idle);
    the best of them, as cuBLAS's heuristic picks."""
    num, den = tile_waves(dev, M, N, batch)
    return num / den
