"""``hetersim sweep`` and ``hetersim bench``: the commands and the plain functions behind them.

Bad input raises ``ValueError`` (the CLI prints it on one line and exits 2); Ctrl-C during a
sweep keeps the finished chunks and exits 130.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from dse import atomic
from dse import format as fmt
from hetersim import planfields
from hetersim.types import decimal_digits
from hetersim.units import DAY

from . import interrupt
from .app import Interrupted, app, positive, show_progress, user_errors
from .options import given

MAX_CHUNK = 1 << 22  # configurations per compiled batch: ~4M rows already need GiBs of device memory
MAX_CONFIGS = 2**31 - 1  # bench: configurations to evaluate (indexed by int32, as in a sweep)
MAX_TOP_K = 10**6  # configurations kept per objective by a streamed sweep


def sweep_command(
    study: Path | None,
    out: Path,
    chunk: int,
    scheduler: str | None,
    workers: int,
    json_out: bool,
    stream: bool | None = None,
    top_k: int | None = None,
) -> dict[str, Any]:
    """Run a study (default: the packaged one) into ``out`` (a folder, or a ``.nc`` path) and
    print its size, feasible count, wall time and the best configuration per objective.
    ``stream``/``top_k``: see :func:`dse.sweep.run_sweep` (None: its defaults)."""
    from dse.sweep import DEFAULT_TOP_K, run_sweep, summarize
    from dse.sweep.run import SweepInterrupted

    t0 = time.perf_counter()
    interrupt.note("the chunks finished so far are kept; run the same command again to resume")
    try:
        path = run_sweep(
            study,
            out,
            chunk=chunk,
            scheduler=scheduler,
            workers=workers,
            progress=not json_out and show_progress(),
            stream=stream,
            top_k=DEFAULT_TOP_K if top_k is None else top_k,
        )
    except SweepInterrupted:
        raise Interrupted() from None  # run_sweep has said what it kept
    except KeyboardInterrupt:
        raise Interrupted("interrupted") from None
    summary = summarize(path)
    summary["wall_s"] = time.perf_counter() - t0
    if json_out:
        print(fmt.dumps(summary))
    else:
        print_sweep_summary(fmt.console(), summary)
        fmt.console().print(f"next: hetersim report {path}  (an offline HTML page with the Pareto fronts)")
    return summary


# The fields of a sweep's layout label (precision last), those a dataset lacks left out.
_LAYOUT_FIELDS = ("tp", "pp", "vp", "cp", "dp", "ep", "etp", "ep_overlap", "micro_batch", "zero", "shard_group")
_LAYOUT_FIELDS += ("recompute", "sp")


def _layout(config: Mapping[str, Any], varied: Sequence[str] = ()) -> str:
    """The registry's layout label of a configuration (``sp`` given as on/off in results), with
    every other field the study varies (``stack:torchtitan``, ``seq8192``) after the layout's."""
    names = (*(k for k in _LAYOUT_FIELDS if k in config), "precision")
    names += tuple(k for k in varied if k not in names and k in config)
    bools = {f.name for f in planfields.FIELDS if f.kind == "bool"}
    values = {k: config[k] in ("on", True, 1) if k in bools else config[k] for k in names}
    quiet = tuple(k for k in ("ep", "etp", "ep_overlap", "shard_group") if k not in varied)  # shown where varied
    return planfields.layout_label(values, names, omit_defaults=quiet)


def _value(value: float, units: str) -> str:
    text = f"{value:.4g} {units}"
    return f"{text} ({value / DAY:.1f} days)" if units == "s" and value >= DAY else text


def print_sweep_summary(con, s: Mapping[str, Any]) -> None:
    n = s["n_configs"]
    con.print(
        f"[bold]{s['study']}[/bold]: {n:,} configurations ({s['cross_product_size']:,} before the host's "
        f"divisibility rules), {s['n_feasible']:,} feasible, {s['wall_s']:.1f} s -> {s['path']}"
    )
    if s.get("streamed"):
        con.print(
            f"streamed: the file keeps {s['n_kept']:,} configurations (the top {s['top_k']} per objective and "
            "the Pareto set) and per-axis summaries (marginal_* dimensions)"
        )
    if s["infeasible_reasons"]:
        reasons = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s["infeasible_reasons"].items())
        con.print(f"infeasible (a configuration may have several reasons): {reasons}")
    table = Table(title="Best feasible configuration per objective")
    for column in ("objective", "value", "model / gpu", "layout", "step s", "MFU", "HBM GiB"):
        table.add_column(column)
    for name, best in s["best"].items():
        if best is None:
            table.add_row(name, "no feasible configuration", "", "", "", "", "")
            continue
        c, m = best["config"], best["metrics"]
        table.add_row(
            f"{best['sense']} {name}",
            _value(best["value"], best["units"]),
            f"{c['model']} / {c['n_gpus']}x {c['gpu']}",
            _layout(c, s.get("varied", ())),
            f"{m['step_time_s']:.3f}",
            f"{m['mfu']:.1%}",
            f"{m['hbm_used_GiB']:.1f}",
        )
    con.print(table)


def parse_chunks(text: str) -> list[int]:
    """``--chunks 4096,16384``: distinct positive integers (ASCII digits), at most :data:`MAX_CHUNK` each."""
    sizes = []
    for item in text.split(","):
        digits = item.strip().replace("_", "")
        if not decimal_digits(digits.lstrip("+-")):  # int() also reads other scripts' digits
            raise ValueError(f"--chunks: {item.strip()!r} is not an integer (give sizes like 4096,16384)")
        size = int(digits)
        positive("--chunks", size, hi=MAX_CHUNK)
        if size in sizes:
            raise ValueError(f"--chunks: {size} is given twice; each size is timed once")
        sizes.append(size)
    return sizes


def parse_models(text: str) -> tuple[str, ...]:
    """``--models llama2-70b,deepseek-v3``: catalog model names, each once."""
    from hetersim.catalog import load_catalog

    names = tuple(item.strip() for item in text.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"--models: give distinct catalog model names separated by commas; got {text!r}")
    catalog = load_catalog()
    for name in names:
        try:
            catalog.model(name)
        except ValueError as error:
            raise ValueError(f"--models: {error}") from None
    pair = catalog.same_entry("models", names)  # an alias or another case of one key
    if pair is not None:
        raise ValueError(f"--models: {pair[0]!r} and {pair[1]!r} name the same catalog model; give it once")
    return names


def bench_command(
    configs: int,
    chunk: int,
    json_path: Path | None,
    as_json: bool = False,
    chunks: list[int] | None = None,
    split: bool = False,
    one_at_a_time: int = 300,
    models: tuple[str, ...] | None = None,
    hoist: bool = True,
) -> dict[str, Any]:
    """Measure the sweep engine (configurations per second, compile time, peak memory, XLA's
    FLOPs and bytes per configuration); the figures as JSON on stdout (``as_json``) and/or in the
    file ``json_path``. ``chunks``: one row per chunk size instead, each in its own process."""
    from dse.bench import BENCH_MODELS, device_name, run_bench, run_chunks

    models = BENCH_MODELS if models is None else models
    if chunks:
        result: dict[str, Any] = {"device": device_name(), "n_configs": configs, "models": list(models)}
        result["chunks"] = run_chunks(configs, chunks, one_at_a_time, models, hoist=hoist)
    else:
        result = run_bench(configs, chunk, one_at_a_time=one_at_a_time, split=split, models=models, hoist=hoist)
    if json_path is not None:
        fmt.write_json_atomic(json_path, result)
    if as_json:
        typer.echo(fmt.dumps(result))
        return result
    con = fmt.console()
    if chunks:
        _print_chunk_table(con, result)
    else:
        _print_bench_table(con, result)
    if json_path is not None:
        con.print(f"wrote {json_path}")
    return result


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _print_bench_table(con, result: Mapping[str, Any]) -> None:
    table = Table(title="hetersim bench")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("device", result["device"])
    table.add_row("models", ", ".join(result["models"]))
    terms = "compiled in" if result.get("moe_terms") else "left out (dense)"
    table.add_row("MoE, MLA, windowed-attention terms", terms)
    table.add_row("configurations", f"{result['n_configs']:,}")
    table.add_row("chunk", f"{result['chunk']:,}")
    table.add_row("compile s", f"{result['compile_s']:.2f}")
    table.add_row("configs/s (vmapped chunks)", _rate(result["configs_per_s"]))
    table.add_row("configs/s (jit, one at a time)", _rate(result["one_at_a_time_configs_per_s"]))
    table.add_row("peak RSS MiB", f"{result['peak_rss_MiB']:,.0f}")
    table.add_row("HLO FLOPs / config", _rate(result["hlo_flops_per_config"]))
    table.add_row("HLO bytes accessed / config", _rate(result["hlo_bytes_per_config"]))
    table.add_row("HLO ops (ENTRY)", f"{result['hlo_ops']:,} ({result['hlo_entry_ops']:,})")
    table.add_row("layer costs per chunk", _window(result.get("layer_costs_window")))
    for stage, seconds in result.get("split_s", {}).items():
        table.add_row(f"{stage} ms / chunk (compiled apart)", f"{seconds * 1e3:,.2f}")
    con.print(table)


def _window(w: Mapping[str, Any] | None) -> str:
    """How many rows of layer costs a chunk computes (dse.sweep.hoist)."""
    if not w:
        return "one per configuration"
    rows = w["window"] if w["hoisted"] else w["chunk"]
    return f"{rows:,} of {w['chunk']:,}" + (" (hoisted)" if w["hoisted"] else " (not hoisted)")


def _print_chunk_table(con, result: Mapping[str, Any]) -> None:
    table = Table(title=f"hetersim bench: {result['n_configs']:,} configurations per row ({result['device']})")
    for column in ("chunk", "compile s", "configs/s", "peak RSS MiB", "HLO bytes / config"):
        table.add_column(column, justify="right")
    for row in result["chunks"]:
        table.add_row(
            f"{row['chunk']:,}",
            f"{row['compile_s']:.2f}",
            _rate(row["configs_per_s"]),
            f"{row['peak_rss_MiB']:,.0f}",
            _rate(row["hlo_bytes_per_config"]),
        )
    con.print(table)
    first = result["chunks"][0]["one_at_a_time_configs_per_s"]
    con.print(f"one configuration at a time (jit, no vmap): {_rate(first)} configs/s")


@app.command("sweep")
@user_errors
def sweep_cmd(
    study: Path | None = typer.Argument(None, help="Study TOML [default: the packaged default study]."),
    out: str = typer.Option("results", "--out", metavar="PATH", help="Output folder, or a .nc path."),
    chunk: int = typer.Option(16384, "--chunk", help="Configurations per compiled batch (dse.sweep.DEFAULT_CHUNK)."),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler address (tcp://host:8786)."),
    workers: int = typer.Option(0, "--workers", help="Start a local Dask cluster with N workers."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    stream: bool | None = typer.Option(
        None,
        "--stream/--no-stream",
        help="Keep only the top-k per objective, the Pareto set and per-axis summaries "
        "[default: stream spaces of 1e8 configurations or more].",
    ),
    top_k: int | None = typer.Option(
        None, "--top-k", help="Configurations kept per objective when streaming (given: streams) [default: 100]."
    ),
) -> None:
    """Evaluate every configuration of a study; write a netCDF dataset and print the best ones."""
    positive("--chunk", chunk, hi=MAX_CHUNK)
    if top_k is not None:
        positive("--top-k", top_k, hi=MAX_TOP_K)
        if stream is False:
            raise ValueError("--top-k applies to a streamed sweep; --no-stream keeps every configuration")
        stream = True  # a study below the streaming threshold streams when asked for its top k
    most = 4 * (os.cpu_count() or 1)  # a local cluster's workers are processes on this machine
    if not 0 <= workers <= most:
        raise ValueError(f"--workers must be from 0 to {most} (4 per CPU of this machine); got {workers}")
    sweep_command(study, out, chunk, scheduler, workers, as_json, stream=stream, top_k=top_k)


@app.command("bench")
@user_errors
def bench_cmd(
    configs: int = typer.Option(
        4_000_000,
        "--configs",
        help="Configurations to evaluate (4e6: a 0.4 s timed loop, steadier than shorter ones on a shared machine).",
    ),
    chunk: int = typer.Option(16384, "--chunk", help="Configurations per compiled batch (dse.sweep.DEFAULT_CHUNK)."),
    chunks: str | None = typer.Option(
        None, "--chunks", help="Comma-separated chunk sizes (4096,16384,65536): one row each, in its own process."
    ),
    split: bool = typer.Option(
        False, "--split", help="Also time decode / gather / model / reductions, each compiled apart."
    ),
    one_at_a_time: int = typer.Option(300, "--one-at-a-time", help="Configurations timed one at a time (0: none)."),
    models: str | None = typer.Option(
        None,
        "--models",
        help="Comma-separated catalog models of the space [default: llama2-70b,llama3-405b]; "
        "a mixture-of-experts one (deepseek-v3) adds the MoE terms.",
    ),
    no_hoist: bool = typer.Option(
        False,
        "--no-hoist",
        help="Compute the layer costs once per configuration, not once per distinct set of the axes they read.",
    ),
    json_path: str | None = typer.Option(None, "--out", help="Also write the figures as JSON to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON instead of a table."),
) -> None:
    """Measure configurations per second, compile time, peak memory and XLA's cost figures of the
    vectorized model."""
    positive("--configs", configs, hi=MAX_CONFIGS)
    positive("--chunk", chunk, hi=MAX_CHUNK)
    sizes = parse_chunks(chunks) if chunks is not None else None
    if sizes and split:
        raise ValueError("--split times one chunk size: give --chunk N with it, not --chunks")
    if sizes and given("chunk"):
        raise ValueError("--chunk and --chunks: --chunks times each of its sizes; give one of them")
    if one_at_a_time < 0:
        raise ValueError(f"--one-at-a-time must be >= 0; got {one_at_a_time}")
    names = parse_models(models) if models is not None else None
    if json_path is not None:
        json_path = atomic.check_own_output(json_path, "--out", "JSON")
    bench_command(
        configs,
        chunk,
        json_path,
        as_json,
        chunks=sizes,
        split=split,
        one_at_a_time=one_at_a_time,
        models=names,
        hoist=not no_hoist,
    )
