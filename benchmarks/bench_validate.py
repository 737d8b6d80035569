"""``hetersim validate`` throughput on a large runs file: ``python benchmarks/bench_validate.py [--rows N]``.

The runs file is the packaged ``published_runs.csv`` repeated to ``--rows`` rows (each copy with a
new id and its measured figures scaled by a random factor in [0.9, 1.1], so no two rows are the
same measurement); it goes through the same :func:`hetersim.fit.validation.validate` as the
command, reading the CSV included. The first call compiles the model; ``--repeat`` more calls show
the time without compiling. Peak RSS is the process's high-water mark.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import resource
import tempfile
import time
from pathlib import Path

from hetersim.api import default_calibration
from hetersim.catalog import load_catalog
from hetersim.fit import validation
from hetersim.fit.runs import default_runs_path, read_runs, read_text

MEASURED = ("measured_step_time_s", "measured_tokens_per_s_per_gpu", "measured_mfu")


def synthetic_runs(n_rows: int, path: Path, seed: int = 0) -> None:
    """Write ``n_rows`` rows made from the packaged runs to ``path``."""
    reader = csv.DictReader(io.StringIO(read_text(default_runs_path(), "runs"), newline=""))
    records = list(reader)
    rng = random.Random(seed)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=reader.fieldnames or [])
        writer.writeheader()
        for i in range(n_rows):
            rec = dict(records[i % len(records)], id=f"{records[i % len(records)]['id']}-{i}")
            for col in MEASURED:
                if rec[col].strip():
                    rec[col] = repr(float(rec[col]) * rng.uniform(0.9, 1.1))
            writer.writerow(rec)


def run(n_rows: int, repeat: int) -> dict:
    catalog, cal = load_catalog(), default_calibration()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.csv"
        synthetic_runs(n_rows, path)
        times = []
        for _ in range(1 + repeat):
            t0 = time.perf_counter()
            report = validation.validate(read_runs(path), catalog, cal, path=str(path))
            times.append(time.perf_counter() - t0)
    return {
        "rows": n_rows,
        "first_s": times[0],
        "rows_per_s": n_rows / times[0],
        "again_s": min(times[1:]) if repeat else None,
        "mape_step_time_pct": report["mape_step_time_pct"],
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="rows of the synthetic runs file")
    parser.add_argument("--repeat", type=int, default=1, help="further calls after the first (compiled) one")
    parser.add_argument("--json", dest="json_path", help="also write the result as JSON to this file")
    args = parser.parse_args()
    r = run(args.rows, args.repeat)
    print(f"{r['rows']:,} rows: {r['first_s']:.1f} s ({r['rows_per_s']:,.0f} rows/s), compile included")
    if r["again_s"] is not None:
        print(f"again, compiled: {r['again_s']:.1f} s ({r['rows'] / r['again_s']:,.0f} rows/s)")
    print(f"MAPE {r['mape_step_time_pct']:.2f} %, peak RSS {r['peak_rss_MiB']:,.0f} MiB")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
