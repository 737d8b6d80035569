"""Wall time of ``hetersim evaluate`` as a user sees it: ``python benchmarks/evaluate_latency.py``.

Each row is a new process (``python -m dse evaluate ... --json``, the README's example): first
with the compiled-program cache off, then cold in a fresh cache folder (it compiles and fills the
cache), then ``--repeat`` runs with other values (tp, batch, sequence length, ZeRO), which load
the kept programs (:mod:`hetersim.compile_cache`). The floor under every row is starting Python
and importing JAX, which the ``import jax`` row measures alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = (
    "evaluate --model llama2-70b --gpu h100-sxm-80gb --gpus 512 --pp 4 --vp 5 --micro-batch 1 "
    "--recompute selective --json"
).split()
# (tp, global batch, sequence length, ZeRO): the first is the README's example.
VALUES = [(8, 1024, 4096, 1), (4, 512, 4096, 1), (2, 2048, 8192, 2), (8, 256, 2048, 0), (1, 1024, 4096, 3)]


def timed(cmd: list[str], cache: str) -> float:
    env = {**os.environ, "HETERSIM_CACHE_DIR": cache}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {proc.stderr.strip()}")
    return wall


def evaluate_cmd(tp: int, batch: int, seq: int, zero: int) -> list[str]:
    values = ["--tp", tp, "--global-batch", batch, "--seq-len", seq, "--zero", zero]
    return [sys.executable, "-m", "dse", *BASE, *map(str, values)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=4, help="runs with other values after the cold one")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")
    args = parser.parse_args()
    if args.repeat < 0:
        sys.exit(f"error: --repeat must be >= 0; got {args.repeat}")
    rows = [("import jax (the floor)", timed([sys.executable, "-c", "import jax"], "off"))]
    rows.append(("cache off", timed(evaluate_cmd(*VALUES[0]), "off")))
    with tempfile.TemporaryDirectory(prefix="hetersim-cache-") as cache:
        rows.append(("cold: fresh cache folder", timed(evaluate_cmd(*VALUES[0]), cache)))
        for i in range(args.repeat):
            tp, batch, seq, zero = VALUES[1 + i % (len(VALUES) - 1)]
            label = f"warm: tp {tp}, batch {batch}, seq {seq}, zero {zero}"
            rows.append((label, timed(evaluate_cmd(tp, batch, seq, zero), cache)))
    width = max(len(label) for label, _ in rows)
    for label, wall in rows:
        print(f"{label:<{width}}  {wall:6.2f} s")
    print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    # Python writes each module's bytecode on its first import and loads it afterwards, unless
    # PYTHONDONTWRITEBYTECODE is set (some sandboxes set it): then every run compiles the
    # project's modules from source again, about 0.1 s of each row here.
    bytecode = "off (PYTHONDONTWRITEBYTECODE is set)" if sys.dont_write_bytecode else "on (Python's default)"
    print(f"bytecode cache: {bytecode}")
    # JAX's import reads the metadata of every installed distribution (its ROCm-plugin discovery,
    # jax/_src/numpy/array_constructors.py in 0.10.2): a fuller environment starts slower.
    import importlib.metadata

    import jax

    dists = sum(1 for _ in importlib.metadata.distributions())
    print(f"python: {sys.executable}, {dists} installed distributions, jax {jax.__version__}")
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump([{"run": label, "wall_s": wall} for label, wall in rows], handle, indent=2)


if __name__ == "__main__":
    main()
