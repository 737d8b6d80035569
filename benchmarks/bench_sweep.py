"""Sweep-engine throughput over chunk sizes: ``python benchmarks/bench_sweep.py [--configs N]``.

Each row compiles the chunk function for that chunk size and evaluates the same random mix of
layouts (``dse.bench``). Peak RSS is the process's high-water mark so far, so it only grows
down the table.
"""

from __future__ import annotations

import argparse
import json

from dse.bench import run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=1_000_000, help="configurations per row")
    parser.add_argument("--chunks", default="4096,16384,65536,262144", help="comma-separated chunk sizes")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]

    rows = []
    header = f"{'chunk':>8} {'compile s':>10} {'configs/s':>14} {'peak RSS MiB':>13}"
    print(header)
    for chunk in chunks:
        r = run_bench(args.configs, chunk, one_at_a_time=0 if rows else 300)
        rows.append(r)
        print(f"{chunk:>8} {r['compile_s']:>10.2f} {r['configs_per_s']:>14,.0f} {r['peak_rss_MiB']:>13,.0f}")
    print(f"device: {rows[0]['device']}")
    print(f"one configuration at a time (jit, no vmap): {rows[0]['one_at_a_time_configs_per_s']:,.0f} configs/s")
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
