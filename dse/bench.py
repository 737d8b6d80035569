"""How fast the sweep engine evaluates configurations (``hetersim bench``).

The space is a realistic mix: random valid layouts (GPU count, tp, pp, cp, micro- and global
batch, vp, sequence length) of LLaMA-2-70B and LLaMA-3-405B on H100 and H200, crossed with ZeRO
stage, recomputation and precision, model and GPU outermost as in a study. It runs through the
same compiled :func:`dse.sweep.evaluate.evaluate_chunk` as a sweep (results pulled to the host,
nothing written), and, for comparison, a few hundred configurations one at a time through
``jax.jit(simulate)`` with no ``vmap``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dse.sweep import hoist as hoist_layers
from dse.sweep.evaluate import (
    chunk_groups,
    chunk_outputs,
    decode_columns,
    decoded_plan,
    evaluate_chunk,
    hardware_groups,
    jit,
    pick,
    simulate_batch,
    specs_of,
)
from dse.sweep.space import DEFAULT_CHUNK, Space, layout_rows
from hetersim import build, compile_cache, planfields
from hetersim.catalog import load_catalog
from hetersim.fit.calibration import load_calibration
from hetersim.simulate import simulate
from hetersim.types import PRECISION, RECOMPUTE

BENCH_MODELS = ("llama2-70b", "llama3-405b")
BENCH_GPUS = ("h100-sxm-80gb", "h200-sxm-141gb")
LAYOUT_CHOICES = {
    "n_gpus": (128, 256, 512, 1024, 2048, 4096),
    "tp": (1, 2, 4, 8),
    "pp": (1, 2, 4, 8, 16),
    "cp": (1, 2),
    "micro_batch": (1, 2, 4),
    "global_batch": (512, 1024, 2048),
}
VP_CHOICES = (1, 2, 3, 4)
SEQ_CHOICES = (4096, 8192)
ONE_AT_A_TIME = 300


def bench_space(n_configs: int, seed: int = 0, models: tuple[str, ...] = BENCH_MODELS) -> Space:
    """At least ``n_configs`` configurations: ``models`` (catalog names; default 2 dense models)
    x 2 GPUs (outermost, as in a study's space, :func:`dse.sweep.space.space_from_study`) x random
    valid layout rows x ZeRO 0-3 x 3 recompute modes x bf16/fp8. A mixture-of-experts model among
    ``models`` compiles the MoE terms in for all of them."""
    rng = np.random.default_rng(seed)
    valid = layout_rows(LAYOUT_CHOICES)  # every layout the host rules keep, then sample them
    inner = len(models) * len(BENCH_GPUS) * 4 * len(RECOMPUTE) * 2
    n_rows = max(1, -(-n_configs // inner))
    pick = rng.integers(0, len(valid["tp"]), n_rows)
    layout = {c: v[pick] for c, v in valid.items()}
    layout["vp"] = rng.choice(VP_CHOICES, n_rows)
    layout["seq_len"] = rng.choice(SEQ_CHOICES, n_rows)
    catalog = load_catalog()
    factors = (
        ("model", {"model": np.arange(len(models))}),
        ("gpu", {"gpu": np.arange(len(BENCH_GPUS))}),
        ("layout", layout),
        ("zero", {"zero": np.arange(4)}),
        ("recompute", {"recompute": np.arange(len(RECOMPUTE))}),
        ("precision", {"precision": np.array([PRECISION.index("bf16"), PRECISION.index("fp8")])}),
    )
    # Every other plan axis at its registry default (sp: on when tp > 1).
    varied = {c for _, table in factors for c in table}
    rest = [a for a in planfields.AXES if a not in varied]
    factors += (("fixed", {a: np.array([planfields.encode(a, planfields.DEFAULTS[a])]) for a in rest}),)
    return Space(
        factors=factors,
        model_entries={k: catalog.model(k) for k in models},
        gpu_entries={k: catalog.gpu(k) for k in BENCH_GPUS},
        links=dict(catalog.links),
        fixed={"train_tokens": planfields.DEFAULTS["train_tokens"]},
    )


def device_name() -> str:
    d = jax.devices()[0]
    cores = f", {os.cpu_count()} host cores" if d.platform == "cpu" else ""
    return f"{d.platform}: {d.device_kind} x{jax.device_count()}{cores}"


def peak_rss_MiB() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_bench(
    n_configs: int = 4_000_000,
    chunk: int = DEFAULT_CHUNK,
    one_at_a_time: int = ONE_AT_A_TIME,
    split: bool = False,
    models: tuple[str, ...] = BENCH_MODELS,
    hoist: bool = True,
) -> dict:
    """Time ``n_configs`` configurations in chunks of ``chunk`` and ``one_at_a_time`` unbatched;
    ``hoist`` False: the layer costs once per configuration (:mod:`dse.sweep.hoist` off, in this
    process), for the figure of a space whose innermost factors they all read.

    ``compile_s`` is trace + compile of the chunk function (never read from the compilation
    cache); ``first_chunk_s`` one untimed call after it (the tables placed on the device);
    ``configs_per_s`` counts real configurations (not the last chunk's padding) over the wall
    time of all chunks after it, device to host copy included. The ``hlo_*`` figures are XLA's
    (:func:`hlo_profile`); ``split`` adds ``split_s`` (:func:`time_split`, which compiles the
    stages again, one by one).
    """
    if n_configs < 1:
        raise ValueError(f"--configs must be a positive integer; got {n_configs}")
    if chunk < 1:
        raise ValueError(f"--chunk must be a positive integer; got {chunk}")
    space = bench_space(n_configs, models=models)
    cal = build.calibration_spec(load_calibration())
    tables = space.tables()
    kinds = space.kinds

    t0 = time.perf_counter()
    was, hoist_layers.ENABLED = hoist_layers.ENABLED, hoist
    hoist_layers.forget()
    try:
        with compile_cache.bypass():
            compiled = evaluate_chunk.lower(np.int32(0), tables, cal, chunk=chunk, kinds=kinds).compile()
    finally:
        hoist_layers.ENABLED = was
    compile_s = time.perf_counter() - t0

    # One untimed call first: it places the tables on the device and touches the output buffers,
    # once per sweep (``first_chunk_s``); the rate is the steady state after it.
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(np.int32(0), tables, cal))
    first_chunk_s = time.perf_counter() - t0

    n_chunks = -(-n_configs // chunk)
    sink = 0.0
    t0 = time.perf_counter()
    pending = None
    for index in range(n_chunks):
        out = compiled(np.int32(index * chunk), tables, cal)
        if pending is not None:
            sink += float(np.asarray(pending["step_time_s"])[0])
            np.asarray(pending["feasible"])
        pending = out
    sink += float(np.asarray(pending["step_time_s"])[0])
    elapsed = time.perf_counter() - t0

    result = {
        "n_configs": n_configs,
        "chunk": chunk,
        "compile_s": compile_s,
        "first_chunk_s": first_chunk_s,
        "wall_s": elapsed,
        "configs_per_s": n_configs / elapsed,
        "peak_rss_MiB": peak_rss_MiB(),
        "device": device_name(),
        "models": list(models),
        "one_at_a_time_configs_per_s": one_at_a_time_rate(space, cal, min(one_at_a_time, space.size)),
        **hlo_profile(compiled, compiled.block),
        "layer_costs_window": hoist_layers.last_window() or None,
        "moe_terms": tables["models"].extra is not None,  # compiled in (a static branch)
    }
    if split:
        result["split_s"] = time_split(tables, cal, chunk, kinds)
        result["split_note"] = SPLIT_NOTE
    return result


SPLIT_NOTE = (
    "seconds per chunk of each stage of evaluate_chunk compiled on its own (decode: flat index to "
    "factor rows; gather: the stacked specs of each row; model: simulate over the batch; reductions: "
    "constraints, interval, outputs); apart, XLA cannot fuse across stages, so they add up to more "
    "than the whole chunk"
)


def cost_analysis(compiled: Any) -> dict[str, float]:
    """``compiled.cost_analysis()`` as one dict: JAX returns a dict, a list of one dict per
    program (0.4.x), or None where the backend has no analysis."""
    try:
        found = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis raises instead of None
        return {}
    if isinstance(found, list | tuple):
        found = found[0] if found else None
    return dict(found) if isinstance(found, dict) else {}


# One instruction of HLO text: ``[ROOT] [%]name = type op(...)`` (computation headers have none).
_HLO_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\S", re.MULTILINE)


def hlo_op_count(text: str) -> tuple[int, int]:
    """(instructions in the whole optimized module, instructions of its ENTRY computation: the
    fusions and other kernels a call runs)."""
    entry = re.search(r"^ENTRY .*?^}", text, re.MULTILINE | re.DOTALL)
    return len(_HLO_OP.findall(text)), len(_HLO_OP.findall(entry.group(0))) if entry else 0


def hlo_profile(compiled: Any, chunk: int) -> dict[str, float | int | None]:
    """XLA's view of the compiled chunk function: FLOPs and bytes accessed per configuration
    (None where the backend reports none), and its instruction counts (:func:`hlo_op_count`)."""
    costs = cost_analysis(compiled)
    flops, moved = costs.get("flops"), costs.get("bytes accessed")
    try:
        n_ops, n_entry = hlo_op_count(compiled.as_text())
    except Exception:  # noqa: BLE001 - no text for this executable
        n_ops, n_entry = 0, 0
    return {
        "hlo_flops_per_config": None if flops is None else float(flops) / chunk,
        "hlo_bytes_per_config": None if moved is None else float(moved) / chunk,
        "hlo_ops": n_ops,
        "hlo_entry_ops": n_entry,
    }


def _best_of(fn: Any, args: tuple[Any, ...], reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compiles
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def time_split(tables: Any, cal: Any, chunk: int, kinds: tuple, reps: int = 3) -> dict[str, float]:
    """Seconds per chunk (best of ``reps``) of the four stages of :func:`evaluate_chunk`, each
    compiled apart and fed the previous stage's output (:data:`SPLIT_NOTE`): the first chunk, as
    one (model, GPU) group with them unbatched where the sweep evaluates it so (the study's
    shared choices are arguments here, not compiled in)."""
    start = np.int32(0)
    inner = hardware_groups(tables, chunk)
    decode = jit(decode_columns, static_argnames=("chunk",))
    if inner is None:
        gather, model = jit(specs_of), jit(simulate_batch)
        gpu_of = jit(lambda col: col["gpu"])
    else:
        m, g = (int(c) for c in chunk_groups(tables, 0, chunk, inner)[0][1])
        gather = jit(lambda col, t: (pick(t["models"], m), pick(t["systems"], g), decoded_plan(col, t["fixed"])))
        model = jit(functools.partial(simulate_batch, shared_hardware=True))
        gpu_of = jit(lambda col: jnp.full(chunk, g, jnp.int32))
    reduce = jit(chunk_outputs, static_argnames=("kinds",))
    with compile_cache.bypass():
        col = decode(start, tables, chunk=chunk)
        specs = gather(col, tables)
        out = model(*specs, cal)
        gpu = gpu_of(col)
        return {
            "decode": _best_of(lambda s: decode(s, tables, chunk=chunk), (start,), reps),
            "gather": _best_of(gather, (col, tables), reps),
            "model": _best_of(model, (*specs, cal), reps),
            "reductions": _best_of(lambda o: reduce(o, specs[0], specs[2], gpu, tables, kinds=kinds), (out,), reps),
        }


def run_chunks(
    n_configs: int,
    chunks: list[int],
    one_at_a_time: int = ONE_AT_A_TIME,
    models: tuple[str, ...] = BENCH_MODELS,
    hoist: bool = True,
) -> list[dict]:
    """:func:`run_bench` once per chunk size, each in a new process (``hetersim bench --json``),
    so each row's peak RSS is its own; the first row also times one configuration at a time."""
    rows = []
    for i, chunk in enumerate(chunks):
        cmd = [sys.executable, "-m", "dse", "-q", "bench", "--json", "--configs", str(n_configs)]
        cmd += ["--models", ",".join(models)]
        cmd += ["--chunk", str(chunk), "--one-at-a-time", str(one_at_a_time if i == 0 else 0)]
        cmd += [] if hoist else ["--no-hoist"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"bench --chunk {chunk} failed: {proc.stderr.strip()}")
        rows.append(json.loads(proc.stdout))
    return rows


def one_at_a_time_rate(space: Space, cal: Any, n: int) -> float | None:
    """Configurations per second through ``jax.jit(simulate)`` called once per configuration
    (specs built beforehand; the first call, which compiles, is not timed). None when ``n`` is 0."""
    if n < 1:
        return None
    single = jax.jit(simulate)
    stride = max(1, space.size // max(n, 1))
    specs = [space.specs(i * stride) for i in range(n)]
    jax.block_until_ready(single(*specs[0], cal))
    t0 = time.perf_counter()
    for model, system, plan in specs:
        jax.block_until_ready(single(model, system, plan, cal))
    return n / (time.perf_counter() - t0)
