"""How the CLI shows answers: plain dicts for ``--json``, rich tables for people.

Nothing here computes a metric; it only names, converts and lays out what
:func:`hetersim.simulate.simulate` and :func:`hetersim.fit.validation.validate` return.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dse import atomic
from hetersim import planfields
from hetersim.types import TIER, Infeasible
from hetersim.units import DAY

# Memory components of one GPU's HBM: label -> Breakdown field.
MEMORY_FIELDS = {
    "weights": "weights_GiB",
    "grads": "grads_GiB",
    "optimizer": "optimizer_GiB",
    "activations": "activations_GiB",
    "buffers": "buffers_GiB",
}

# Key columns of `hetersim catalog SECTION`: (field, header).
CATALOG_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "gpus": (
        ("name", "name"),
        ("peak_tflops_bf16", "bf16 TF"),
        ("peak_tflops_fp8", "fp8 TF"),
        ("hbm_capacity_GiB", "HBM GiB"),
        ("hbm_bw_GBps", "HBM GB/s"),
        ("scaleup_link", "scale-up"),
        ("scaleup_domain", "domain"),
        ("nic", "NIC"),
        ("tdp_W", "TDP W"),
        ("price_usd_per_hour", "$/GPU-h"),
    ),
    "links": (
        ("name", "name"),
        ("kind", "kind"),
        ("bw_GBps", "GB/s"),
        ("latency_us", "latency us"),
        ("busbw_eff", "bus eff"),
    ),
    "models": (
        ("name", "name"),
        ("layers", "layers"),
        ("hidden", "hidden"),
        ("heads", "heads"),
        ("kv_heads", "kv"),
        ("ffn_hidden", "ffn"),
        ("vocab", "vocab"),
        ("mlp", "mlp"),
        ("seq_len", "seq"),
    ),
    "memory": (
        ("name", "name"),
        ("kind", "kind"),
        ("capacity_GiB", "GiB"),
        ("bw_GBps", "GB/s"),
        ("latency_ns", "latency ns"),
        ("link", "link"),
    ),
    "fleets": (
        ("name", "name"),
        ("job_gpus", "GPUs"),
        ("window_days", "days"),
        ("restart_s", "restart s"),
        ("pfs_GBps", "PFS GB/s"),
        ("nvme_GBps", "NVMe GB/s"),
    ),
}


def console() -> Console:
    """A console on stdout, 160 columns wide when stdout is not a terminal (pipes, tests)."""
    sized = sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit()
    return Console(width=None if sized else 160, highlight=False)


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


def jsonable(x: Any) -> Any:
    """Plain JSON values: arrays become floats or lists; NaN and infinities become null."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, str | bool) or x is None:
        return x
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, Iterable) and not hasattr(x, "shape"):
        return [jsonable(v) for v in x]
    a = np.asarray(x)
    if a.ndim:
        return [jsonable(v) for v in a.tolist()]
    if a.dtype == bool:
        return bool(a)
    if np.issubdtype(a.dtype, np.integer):
        return int(a)
    v = float(a)
    return v if math.isfinite(v) else None


def dumps(obj: Any) -> str:
    return json.dumps(jsonable(obj), indent=2, allow_nan=False)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (:func:`dse.atomic.write_text`)."""
    atomic.write_text(Path(path), dumps(obj) + "\n")


# --------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------


def evaluation(
    out: Any, step_terms: Iterable[str], header: Mapping[str, Any], interval: tuple[float, float] | None = None
) -> dict[str, Any]:
    """One configuration's answer as a plain dict (``header`` names the model, GPU and plan;
    ``interval`` the 80% interval of the step time, :mod:`hetersim.fit.intervals`)."""
    f = lambda name: float(np.asarray(getattr(out, name)))  # noqa: E731
    code = int(np.asarray(out.infeasible))
    used = np.asarray(out.tier_used_GiB, dtype=float)
    cap = np.asarray(out.tier_capacity_GiB, dtype=float)
    bw = np.asarray(out.tier_bw_GBps, dtype=float)
    need = np.asarray(out.tier_bw_needed_GBps, dtype=float)
    tiers = {
        TIER[i]: {
            "used_GiB": float(used[i]),
            "capacity_GiB": float(cap[i]),
            "bw_per_gpu_GBps": float(bw[i]),
            "bw_needed_per_gpu_GBps": float(need[i]),
        }
        for i in range(1, len(TIER))
        if used[i] > 0 or cap[i] > 0
    }
    return {
        **header,
        "feasible": code == 0,
        "infeasible_code": code,
        "reasons": Infeasible.describe(code),
        "step_time_s": f("step_time_s"),
        **({} if interval is None else {"step_time_interval_s": _interval(interval)}),
        "breakdown_s": {name: f(name) for name in step_terms},
        "tokens_per_s": f("tokens_per_s"),
        "tokens_per_s_per_gpu": f("tokens_per_s_per_gpu"),
        "mfu": f("mfu"),
        "hfu": f("hfu"),
        "model_tflops_per_gpu": f("model_tflops_per_gpu"),
        "n_microbatches": f("n_microbatches"),
        "params": f("params"),
        "memory_per_gpu_GiB": {
            **{label: f(field) for label, field in MEMORY_FIELDS.items()},
            "total": f("hbm_used_GiB"),
            "hbm_capacity": f("hbm_capacity_GiB"),
        },
        "offload_tiers_per_node_GiB": tiers,
        "offload_traffic_s": f("offload_traffic_s"),
        "time_to_train_s": f("time_to_train_s"),
        "time_to_train_days": f("time_to_train_s") / DAY,
        "cost_usd": f("cost_usd"),
        "energy_kWh": f("energy_kWh"),
        "goodput": {name: f(name) for name in GOODPUT_FIELDS if hasattr(out, name)},
    }


# Goodput fields of a breakdown (hetersim.terms.goodput) shown by ``evaluate``.
GOODPUT_FIELDS = (
    "goodput",
    "effective_time_s",
    "effective_cost_usd",
    "effective_energy_kWh",
    "mtbi_h",
    "interruptions",
    "restart_s",
    "checkpoint_GiB",
    "checkpoint_tier_GiB",
    "checkpoint_s",
    "checkpoint_write_s",
    "checkpoint_interval_s",
    "checkpoint_overhead_s",
)


def _term_label(name: str) -> str:
    return name.removesuffix("_s").replace("_", " ")


def _layout(plan: Mapping[str, Any]) -> str:
    # A heterogeneous plan sets tp, pp and dp per stage and replica (its table follows): left out here.
    text = planfields.layout_label({k: v for k, v in plan.items() if v is not None or k not in ("tp", "pp", "dp")})
    if plan["offload"]:
        text += " offload " + ",".join(f"{s}->{t}" for s, t in plan["offload"].items())
    return text


def stack_summary(plan: Mapping[str, Any], runs_te: bool = True, attention: str | None = None) -> dict[str, Any]:
    """The plan's software stack: its profile's facts, the kernels the plan runs, and the
    sources (``hetersim/catalog/stacks.toml``). ``runs_te``: the device runs Transformer Engine
    (:func:`hetersim.terms.compute.runs_transformer_engine`); where it does not, the stack's TP
    overlap is reported off, as the model prices it. ``attention``: the kernel the plan runs on
    its device, where known (a device without fused kernels runs materialised attention)."""
    from hetersim import stacks

    prof = stacks.profile(plan["stack"])
    return {
        "key": prof.key,
        "name": prof.name,
        "attention": attention or (prof.attention if plan["attention"] == "auto" else plan["attention"]),
        "loss": prof.loss if plan["loss"] == "auto" else plan["loss"],
        "elementwise": prof.elementwise,
        "experts": prof.experts,
        "pipeline": prof.pipeline,
        **stacks.switches(prof),
        "tp_comm_overlap": prof.tp_comm_overlap and runs_te,
        "tp_overlap_needs_te": prof.tp_comm_overlap and not runs_te,
        "sources": dict(prof.sources),
    }


_PIPELINES = {"interleaved": "1F1B or interleaved", "1f1b": "1F1B only", "none": "none"}
_EXPERTS = {"streams": "per expert on 4 streams", "grouped": "one grouped kernel", "loop": "per expert, one at a time"}


def _sends(st: Mapping[str, Any]) -> str:
    """What a stack's pipeline sends beyond the activation and its gradient split alike, and what its
    last stage keeps."""
    facts = (
        ("each micro-batch with its attention mask", st["p2p_mask"]),
        ("gradients sent whole", st["p2p_full_grads"]),
        ("its last stage keeps two micro-batches' fp32 logits under a materialised loss", st["kept_logits"]),
    )
    notes = [n for n, on in facts if on]
    return f" ({', '.join(notes)})" if notes else ""


def _send_overlap(st: Mapping[str, Any]) -> str:
    """How the stack's pipeline sends overlap compute (nothing where it has no pipeline)."""
    if st["pipeline"] == "none":
        return ""
    return f"pipeline-send overlap {'on' if st['p2p_overlap'] else 'off'}{_sends(st)}, "


def _moe(st: Mapping[str, Any]) -> str:
    """How the stack runs mixture-of-experts layers: not at all, or its expert GEMMs and whether it
    shards the experts over ranks."""
    if st["experts"] == "none":
        return "no mixture-of-experts layer"
    return f"MoE expert GEMMs {_EXPERTS[st['experts']]}{'' if st['expert_parallel'] else ', no expert parallelism'}"


def _print_stack(con: Console, st: Mapping[str, Any]) -> None:
    on = lambda v: "on" if v else "off"  # noqa: E731
    con.print(
        f"stack: [bold]{st['key']}[/] ({st['name']}): attention {st['attention']}, loss {st['loss']}, "
        f"element-wise {st['elementwise']}, TP overlap {on(st['tp_comm_overlap'])}"
        f"{' (Transformer Engine needs Ampere or newer)' if st['tp_overlap_needs_te'] else ''}, "
        f"pipeline {_PIPELINES[st['pipeline']]}, "
        f"{_send_overlap(st)}gradient-reduction overlap {on(st['dp_overlap'])}"
        f"{' (per pipeline chunk)' if st['chunk_grad_sync'] else ''}"
        f", ZeRO 1-2 weights gathered {'in the next forward' if st['param_gather_overlap'] else 'after the step'}"
        f"{', sharded data parallelism per FSDP unit' if st['fsdp_units'] else ''}, "
        f"selective recomputation {'op-level' if st['op_level_sac'] else 'attention core'}, "
        f"{_moe(st)}; "
        "sources: hetersim/catalog/stacks.toml",
        highlight=False,
        markup=True,
    )


def print_evaluation(con: Console, r: Mapping[str, Any]) -> None:
    plan = r["plan"]
    con.print(f"[bold]{r['model']}[/] ({r['params'] / 1e9:.2f}B params) on {plan['n_gpus']} x [bold]{r['gpu']}[/]")
    con.print(f"layout: {_layout(plan)}")
    if r.get("stack"):
        _print_stack(con, r["stack"])
    _print_mix(con, r)

    step = r["step_time_s"]
    t = Table(title="Step time", title_justify="left")
    t.add_column("term")
    t.add_column("seconds", justify="right")
    t.add_column("% of step", justify="right")
    for name, value in r["breakdown_s"].items():
        t.add_row(_term_label(name), f"{value:.4f}", f"{100.0 * value / step:.1f}" if step > 0 else "-")
    t.add_row("[bold]step time[/]", f"[bold]{step:.4f}[/]", "100.0", end_section=True)
    con.print(t)
    if r.get("step_time_interval_s"):
        itv = r["step_time_interval_s"]
        level = f"{100 * itv['level']:.0f}%"
        wider = f"; wider: {', '.join(itv['flags'])}" if itv.get("flags") else ""
        con.print(f"step time {_sig(step)} s ({level}: {_sig(itv['low'])}–{_sig(itv['high'])} s{wider})")

    t = Table(title="Throughput", title_justify="left", show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("tokens/s", f"{r['tokens_per_s']:,.0f}")
    t.add_row("tokens/s/GPU", f"{r['tokens_per_s_per_gpu']:,.1f}")
    t.add_row("MFU", f"{100.0 * r['mfu']:.1f} %")
    t.add_row("HFU", f"{100.0 * r['hfu']:.1f} %")
    t.add_row("model TFLOP/s/GPU", f"{r['model_tflops_per_gpu']:.1f}")
    t.add_row("micro-batches per step", f"{r['n_microbatches']:.0f}")
    con.print(t)

    mem = r["memory_per_gpu_GiB"]
    t = Table(title="Memory per GPU (HBM)", title_justify="left")
    t.add_column("component")
    t.add_column("GiB", justify="right")
    for label in MEMORY_FIELDS:
        t.add_row(label, f"{mem[label]:.2f}")
    cap = mem["hbm_capacity"]
    share = f" ({100.0 * mem['total'] / cap:.0f} %)" if cap > 0 else ""
    fits = "green" if mem["total"] <= cap else "red"
    t.add_row("[bold]total[/]", f"[bold {fits}]{mem['total']:.2f} / {cap:.2f}{share}[/]", end_section=True)
    con.print(t)

    if plan["offload"]:
        moved, exposed = r.get("offload_traffic_s", 0.0), r["breakdown_s"].get("offload_s", 0.0)
        title = f"Offload tiers per node (transfers {moved:.2f} s/step, {exposed:.2f} s exposed)"
        t = Table(title=title, title_justify="left")
        t.add_column("tier")
        t.add_column("used GiB", justify="right")
        t.add_column("capacity GiB", justify="right")
        t.add_column("GB/s per GPU", justify="right")
        t.add_column("GB/s to hide", justify="right")
        for tier, v in r["offload_tiers_per_node_GiB"].items():
            bw, need = v.get("bw_per_gpu_GBps", 0.0), v.get("bw_needed_per_gpu_GBps", 0.0)
            t.add_row(tier, f"{v['used_GiB']:.1f}", f"{v['capacity_GiB']:.1f}", f"{bw:.1f}", f"{need:.1f}")
        con.print(t)

    con.print(
        f"to train {plan['train_tokens'] / 1e12:.4g}T tokens: {r['time_to_train_days']:,.1f} days, "
        f"${r['cost_usd']:,.0f}, {r['energy_kWh'] / 1000.0:,.1f} MWh (GPU TDP)"
    )
    g = r.get("goodput") or {}
    if g:
        con.print(
            f"with failures (every {g['mtbi_h']:.3g} h, {g['interruptions']:,.0f} in all; restart "
            f"{g['restart_s']:.0f} s) and checkpoints to {plan.get('checkpoint_tier', '?')} "
            f"({g['checkpoint_GiB']:.3g} GiB/GPU, {g['checkpoint_s']:.3g} s each every "
            f"{g['checkpoint_interval_s']:.3g} s): goodput {100.0 * g['goodput']:.1f} %, "
            f"{g['effective_time_s'] / DAY:,.1f} days, ${g['effective_cost_usd']:,.0f}"
        )
    if r["feasible"]:
        con.print("verdict: [bold green]FEASIBLE[/]")
    else:
        con.print("verdict: [bold red]INFEASIBLE[/]")
        for reason in r["reasons"]:
            con.print(f"  - {reason}")


# --------------------------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------------------------


def _num(v: float | None, digits: int) -> str:
    """Fixed-point, or 3 significant digits when a value is too large to read that way."""
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.{digits}f}" if abs(v) < 1e5 else f"{v:.3g}"


def _interval(interval: tuple[float, float]) -> dict[str, Any]:
    """The JSON of an interval: its level, ends and the evidence flags that widened it."""
    from hetersim.fit.intervals import LEVEL

    flags = list(getattr(interval, "flags", ()))
    return {"level": LEVEL, "low": float(interval[0]), "high": float(interval[1]), "flags": flags}


def _sig(v: float) -> str:
    """Three significant figures (an interval's ends are not known better)."""
    return f"{v:.3g}"


def _pct(v: float | None) -> str:
    return _num(v, 1)


def _rows_table(title: str, rows: Iterable[Mapping[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("id", overflow="fold")
    t.add_column("model")
    t.add_column("GPUs", justify="right")
    t.add_column("layout", overflow="fold")
    t.add_column("measured s", justify="right")
    t.add_column("predicted s", justify="right")
    t.add_column("error %", justify="right")
    for r in rows:
        err = _pct(r["error_pct"]) if r["feasible"] else "[red]infeasible[/]"
        t.add_row(
            r["id"],
            r["model"],
            f"{r['gpu']} x{r['n_gpus']}",
            r["layout"],
            _num(r["measured_step_time_s"], 3),
            _num(r["predicted_step_time_s"], 3),
            err,
        )
    return t


def _group_table(title: str, what: str, groups: Mapping[str, Mapping[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column(what, overflow="fold")
    t.add_column("runs", justify="right")
    t.add_column("MAPE %", justify="right")
    t.add_column("max |error| %", justify="right")
    for label, s in groups.items():
        t.add_row(label, str(s["n"]), _pct(s["mape_pct"]), _pct(s["max_abs_error_pct"]))
    return t


def print_validation(con: Console, report: Mapping[str, Any], worst: int) -> None:
    rows = report["rows"]
    con.print(_rows_table(f"Published runs ({report['n_runs']})", rows))
    con.print(_group_table("Per source", "source", report["per_source"]))
    if report.get("per_stack"):
        con.print(_group_table("Per software stack (hetersim/catalog/stacks.toml)", "stack", report["per_stack"]))
    stacks: dict[str, int] = {}
    for r in rows:
        if r.get("stack"):
            stacks[r["stack"]] = stacks.get(r["stack"], 0) + 1
    if stacks:
        con.print("stack entries matched by source: " + ", ".join(f"{k} ({n} runs)" for k, n in stacks.items()))
    if worst > 0:
        ranked = sorted(rows, key=lambda r: abs(r["error_pct"]), reverse=True)[:worst]
        con.print(_rows_table(f"Worst {len(ranked)}", ranked))
    con.print(
        f"MAPE step time: [bold]{_pct(report['mape_step_time_pct'])} %[/] over {report['n_runs']} runs; "
        f"{_pct(report['mape_step_time_pct_complete'])} % over the {report.get('n_complete', '?')} complete runs; "
        f"max |error| {_pct(report['max_abs_error_pct'])} %"
    )
    if "coverage_pct" in report:
        how = (
            "in-sample: the stored intervals were fitted to these runs' held-out residuals"
            if report.get("coverage_in_sample", True)
            else "out of sample: the stored intervals were fitted to other runs"
        )
        con.print(f"80% intervals cover [bold]{_pct(report['coverage_pct'])} %[/] of the measured runs ({how})")


def print_summary(con: Console, title: str, result: Mapping[str, Any]) -> None:
    """Scalars of a result dict as a two-column table (for results whose shape this module does not own)."""
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("key")
    t.add_column("value", justify="right")
    for key, value in result.items():
        if isinstance(value, int | float | str | bool) or value is None:
            t.add_row(str(key), f"{value:.4g}" if isinstance(value, float) else str(value))
        elif isinstance(value, Mapping) and all(isinstance(v, int | float) for v in value.values()):
            for k, v in value.items():
                t.add_row(f"{key}.{k}", f"{v:.4g}")
    con.print(t)


# --------------------------------------------------------------------------------------------
# catalog
# --------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def catalog_table(section: str, entries: Mapping[str, Mapping[str, Any]]) -> Table:
    columns = CATALOG_COLUMNS[section]
    t = Table(title=f"{section} ({len(entries)})", title_justify="left")
    t.add_column("key", overflow="fold")
    for _, header in columns:
        t.add_column(header, justify="left" if header in ("name", "kind", "mlp") else "right")
    for key, entry in entries.items():
        t.add_row(key, *(_cell(entry.get(field)) for field, _ in columns))
    return t


def _print_mix(con: Console, r: Mapping[str, Any]) -> None:
    """The device groups of a ``--cluster`` mix, or the stages of a plan file."""
    if r.get("groups"):
        print_groups(con, r["groups"])
    if r.get("stages"):
        print_stages(con, r["stages"])


def print_plan_ranking(con: Console, rows: list[Mapping[str, Any]], n: int) -> None:
    """``hetersim plan``'s ranking: the best candidate plans by step time."""
    from rich.markup import escape

    t = Table(title=f"Best plans of {n} candidates", title_justify="left")
    plan_header = escape("plan (copies x [stage | stage ...])")
    for column in ("rank", "step s", "tokens/s", "MFU %", "HBM GiB", "fits", plan_header):
        t.add_column(column, justify="left" if column.startswith("plan") else "right", overflow="fold")
    for r in rows:
        t.add_row(str(r["rank"]), f"{r['step_time_s']:.4f}", f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f}",
                  f"{r['hbm_used_GiB']:.1f}", "yes" if r["feasible"] else "no", escape(r["plan"]))  # fmt: skip
    con.print(t)


def print_stages(con: Console, rows: list[Mapping[str, Any]]) -> None:
    """The stages of a heterogeneous plan: per replica group its kind, TP, layers, share, memory."""
    t = Table(title="Stages (per replica group)", title_justify="left")
    cols = ("pipeline", "stage", "gpu", "tp", "replicas", "layers", "micro-batches", "stage s", "busy s", "HBM GiB")
    for column in (*cols, "verdict"):
        t.add_column(column, justify="left" if column in ("gpu", "verdict") else "right")
    for g in rows:
        t.add_row(
            f"{g['pipeline']} (x{g['copies']})",
            str(g["stage"]),
            g["gpu"],
            str(g["tp"]),
            str(g["replicas"]),
            str(g["layers"]),
            str(g["microbatches"]),
            f"{g['stage_time_s']:.4f}",
            f"{g['busy_s']:.3f}",
            f"{g['hbm_used_GiB']:.1f}",
            "; ".join(g["infeasible"]) or "fits",
        )
    con.print(t)


def print_groups(con: Console, groups: list[Mapping[str, Any]]) -> None:
    """The device groups of a mixed cluster: stages or replicas, layer split, memory."""
    t = Table(title="Device groups", title_justify="left")
    units = "stages" if "stages" in groups[0] else "replicas"
    for column in ("gpu", "GPUs", units, "layers/stage", "micro-batches", "stage or step s", "HBM GiB", "verdict"):
        t.add_column(column, justify="left" if column in ("gpu", "verdict") else "right")
    for g in groups:
        t.add_row(
            g["gpu"],
            str(g["gpus"]),
            str(g[units]),
            str(g["layers_per_stage"]),
            str(g["microbatches"]),
            f"{g['stage_or_step_time_s']:.4f}",
            f"{g['hbm_used_GiB']:.1f}",
            "; ".join(g["infeasible"]) or "fits",
        )
    con.print(t)
