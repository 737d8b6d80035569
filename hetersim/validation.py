"""Predict published training runs and measure the error.

Reads the schema of ``data/published_runs.csv`` (see ``data/README.md``), builds one
configuration per row, evaluates all rows in one vmapped call and reports the step-time error.
Rows that give only an MFU are compared through the step time that MFU implies under
Megatron-LM's FLOP accounting (:func:`hetersim.terms.flops.megatron_flops_per_token`), the
accounting the sources of such rows print.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import build
from .simulate import simulate
from .specs import Calibration
from .stacks import Stack, load_stacks, stack_for
from .terms.flops import megatron_flops_per_token
from .types import ATTENTION

REQUIRED_COLUMNS = (
    "id", "source", "model", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len",
    "mlp", "gpu", "scaleup_domain", "n_gpus", "tp", "pp", "vp", "dp", "cp", "sp", "zero", "offload",
    "offload_tier", "recompute", "micro_batch", "global_batch", "precision", "measured_step_time_s",
    "measured_tokens_per_s_per_gpu", "measured_mfu", "flops_accounting", "assumed",
)  # fmt: skip


def default_runs_path() -> Path:
    return Path(str(resources.files("hetersim") / "data" / "published_runs.csv"))


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    source: str
    fields: dict[str, str]
    complete: bool  # the source states every column (empty ``assumed``)
    stack: Stack | None = None  # software-stack facts matched by ``source`` (data/stacks.toml)


def read_runs(path: str | Path, stacks: Sequence[Stack] | None = None) -> list[Row]:
    """Read a runs CSV, validating its header and every value used; one-line errors.

    Each row is matched to a software stack (``stacks``, default ``data/stacks.toml``) by its
    ``source``, for the facts the CSV has no column for.
    """
    stacks = load_stacks() if stacks is None else stacks
    path = Path(path)
    text = _read_text(path, "runs")
    reader = csv.DictReader(io.StringIO(text, newline=""))  # quoted fields may hold newlines
    reader.fieldnames = [f.strip() for f in reader.fieldnames or []]
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: not a published-runs CSV, missing columns: {', '.join(missing)}")
    rows = []
    for i, rec in enumerate(reader, start=2):
        if None in rec or any(v is None for v in rec.values()):
            raise ValueError(f"{path}: line {i}: wrong number of fields")
        rows.append(Row(rec["id"], rec["source"], rec, not rec["assumed"].strip(), stack_for(rec["source"], stacks)))
    if not rows:
        raise ValueError(f"{path}: no runs")
    return rows


def _read_text(path: Path, what: str) -> str:
    """A CSV file's text: UTF-8 (a spreadsheet's byte-order mark tolerated), else Latin-1."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read {what} file ({e.strerror})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _num(path, row: Row, col: str, *, integer: bool = True, optional: bool = False) -> float | None:
    raw = row.fields[col].strip()
    if raw == "" and optional:
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{path}: row {row.id}: column {col} must be a number; got {raw!r}") from None
    if not math.isfinite(v) or v < 0 or (integer and v != int(v)):
        kind = "integer" if integer else "number"
        raise ValueError(f"{path}: row {row.id}: column {col} must be a non-negative {kind}; got {raw!r}")
    return v


# Spellings other tools and papers use for the categorical columns, read as the schema's values.
SYNONYMS = {
    "mlp": {"swiglu": "gated", "geglu": "gated", "glu": "gated", "gelu": "plain", "relu": "plain", "mlp": "plain"},
    "precision": {"bf16-mixed": "bf16", "bfloat16": "bf16", "fp16-mixed": "fp16", "16-mixed": "fp16",
                  "float16": "fp16", "fp8-hybrid": "fp8", "fp8-e4m3": "fp8", "float32": "fp32", "32": "fp32"},
    "recompute": {"no": "none", "off": "none", "false": "none", "0": "none", "block": "full",
                  "uniform": "full", "true": "full", "1": "full"},
}  # fmt: skip


def _category(row: Row, col: str, default: str) -> str:
    value = row.fields[col].strip().lower() or default
    return SYNONYMS.get(col, {}).get(value, value)


def row_inputs(row: Row, catalog, path="runs") -> dict[str, Any]:
    """Model entry, GPU entry, scale-up domain and plan options of one row.

    Empty ``vp``, ``cp``, ``sp``, ``zero`` read as 1, 1, 0, 0; an empty ``dp`` as the GPUs left
    after tp x pp x cp; an empty ``scaleup_domain`` as the GPU entry's.
    """
    f = row.fields
    n = lambda c, **k: _num(path, row, c, **k)  # noqa: E731
    opt = lambda c, default: (lambda v: default if v is None else v)(n(c, optional=True))  # noqa: E731
    model = {k: n(k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")}
    model["mlp"] = _category(row, "mlp", "")
    if model["mlp"] not in ("gated", "plain"):
        raise ValueError(f"{path}: row {row.id}: column mlp must be gated or plain; got {f['mlp']!r}")
    try:
        gpu = catalog.gpu(f["gpu"].strip())
    except ValueError as e:
        raise ValueError(f"{path}: row {row.id}: {e}") from None
    offload = {}
    if f["offload"].strip().lower() not in ("", "none"):
        tier = f["offload_tier"].strip().lower() or "host-dram"
        for state in f["offload"].strip().lower().split("+"):
            offload[state.strip()] = tier
    n_gpus = int(n("n_gpus"))
    tp, pp, cp = int(n("tp")), int(n("pp")), int(opt("cp", 1))
    dp = int(opt("dp", n_gpus // max(tp * pp * cp, 1)))
    micro, glob = int(opt("micro_batch", 1)), int(n("global_batch"))
    # Pipelined rows whose micro_batch is the whole local batch (torchtitan reports it so): the
    # stack splits it into one micro-batch per stage, its default; a 1F1B step with fewer
    # micro-batches than stages is not a schedule anyone runs.
    if pp > 1 and glob // max(micro * dp, 1) < pp and micro % pp == 0:
        micro //= pp
    plan = dict(
        n_gpus=n_gpus,
        tp=tp,
        pp=pp,
        vp=int(opt("vp", 1) or 1),
        dp=dp,
        cp=cp,
        sp=bool(opt("sp", 0)),
        zero=_zero(row, dp * cp, int(opt("zero", 0))),
        micro_batch=micro,
        global_batch=glob,
        seq_len=int(n("seq_len")),
        recompute=_category(row, "recompute", "none"),
        precision=_category(row, "precision", "bf16"),
        attention=_attention(row, gpu, path),
        offload=offload,
        reuse_Mparams=row.stack.zero3_reuse_Mparams if row.stack is not None else 0.0,
    )
    return dict(model=model, gpu=gpu, scaleup_domain=opt("scaleup_domain", None), plan=plan)


def _zero(row: Row, shard_group: int, zero: int) -> int:
    """The row's ZeRO stage; a stack that always shards over dp x cp (FSDP over the dp x cp
    mesh) runs stage 3 where the row writes 0 for dp = 1."""
    if row.stack is not None and row.stack.shards_over_cp and zero == 0 and shard_group > 1:
        return 3
    return zero


def _attention(row: Row, gpu: Mapping[str, Any], path) -> str:
    """The row's optional ``attention`` column, else its stack's attention kernel, else ``flash``;
    ``materialized`` on devices without flash-attention kernels (V100: FlashAttention needs
    Ampere or newer)."""
    value = (row.fields.get("attention") or "").strip().lower()
    if value:
        if value not in ATTENTION:
            allowed = ", ".join(ATTENTION)
            raise ValueError(f"{path}: row {row.id}: column attention must be one of {allowed}; got {value!r}")
        return value
    if not gpu.get("flash_attention", True):
        return "materialized"
    if row.stack is not None and row.stack.attention:
        return row.stack.attention
    return "flash"


def measured_step_time(row: Row, inputs: Mapping[str, Any], path="runs") -> tuple[float, str]:
    """The row's measured step time and how it was obtained ("step", "tokens" or "mfu")."""
    st = _num(path, row, "measured_step_time_s", integer=False, optional=True)
    if st:
        return st, "step"
    plan = inputs["plan"]
    tokens = plan["global_batch"] * plan["seq_len"]
    tps = _num(path, row, "measured_tokens_per_s_per_gpu", integer=False, optional=True)
    if tps:
        return tokens / (tps * plan["n_gpus"]), "tokens"
    mfu = _num(path, row, "measured_mfu", integer=False, optional=True)
    if mfu:
        model = build.model_spec(inputs["model"])
        full = plan["recompute"] == "full" and row.fields["flops_accounting"].strip() == "hardware"
        flops = float(megatron_flops_per_token(model, plan["seq_len"], full)) * tokens
        peak = float(inputs["gpu"]["peak_tflops_bf16"]) * 1e12
        return flops / (mfu * peak * plan["n_gpus"]), "mfu"
    raise ValueError(f"{path}: row {row.id}: no measured step time, tokens/s or MFU")


# A row that offloads to a CXL tier names the tier, not the device. Where the GPU's catalog entry
# configures none, validate assumes one device of the kind the published figures describe: a
# Micron CZ120 expander (CXL 2.0 x8, about 36 GB/s) or a Samsung CMM-B pool used by one host.
DEFAULT_CXL = {"cxl-expander": ("cxl_expander", "micron-cz120:1"), "cxl-pool": ("cxl_pool", "samsung-cmm-b-pool:1host")}


def cxl_defaults(inputs: Mapping[str, Any]) -> dict[str, str]:
    """The CXL devices validate assumes for a row's offload tiers its GPU entry does not configure."""
    out = {}
    for tier in set(inputs["plan"]["offload"].values()):
        if tier in DEFAULT_CXL:
            field, default = DEFAULT_CXL[tier]
            if not inputs["gpu"].get(field):
                out[field] = default
    return out


def _system(row: Row | None, inputs: Mapping[str, Any], catalog, path, cxl: Mapping[str, str]):
    try:
        return build.system_spec(inputs["gpu"], catalog.links, inputs["scaleup_domain"], catalog.memory, **cxl)
    except ValueError as e:
        where = f"row {row.id}: " if row is not None else ""
        raise ValueError(f"{path}: {where}{e}") from None


# Assumed discrete columns are the curator's guess ("the usual default of that stack"). Where a
# row is infeasible as written, validate tries the other values of an assumed column, from the
# one that saves least memory on, and keeps the first that runs: a real run ran, so it did not
# use a layout that cannot fit.
ALTERNATIVES = {"recompute": ("none", "selective", "full")}


def _candidates(row: Row, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row as written, then its assumed values replaced, then (where its micro-batch is the
    whole local batch) gradient accumulation over halved micro-batches: the order validate
    tries them in when a row cannot run as written."""
    plan = inputs["plan"]
    assumed = {c.strip() for c in row.fields["assumed"].split(";")}

    def variants(base):
        out = [dict(base)]
        for col, values in ALTERNATIVES.items():
            if col in assumed and base[col] in values:
                for v in values[values.index(base[col]) + 1 :]:
                    out.append(dict(base, **{col: v}))
        return out

    out = variants(plan)
    # A source that gives only the global batch leaves the micro-batch at the whole local batch;
    # stacks split a local batch that does not fit into accumulation steps.
    micro = plan["micro_batch"]
    whole = micro * plan["dp"] == plan["global_batch"]
    while whole and micro > 1 and micro % 2 == 0:
        micro //= 2
        out += variants(dict(plan, micro_batch=micro))
    return out


def _stack(xs):
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *xs)


@jax.jit
def _predict(models, systems, plans, cal: Calibration):
    return jax.vmap(simulate, in_axes=(0, 0, 0, None))(models, systems, plans, cal)


@dataclasses.dataclass
class Prepared:
    rows: list[Row]
    models: Any
    systems: Any
    plans: Any
    measured: np.ndarray
    kinds: list[str]
    substituted: list[str]  # "" or "recompute=full" for rows whose assumed value was replaced


def prepare(rows: Sequence[Row], catalog, cal: Calibration, path="runs") -> Prepared:
    """Specs of every row (with assumed values substituted where the row cannot run as written)."""
    flat_m, flat_s, flat_p, owner, plans_raw = [], [], [], [], []
    measured, kinds, devices = [], [], []
    for i, row in enumerate(rows):
        inp = row_inputs(row, catalog, path)
        model = build.model_spec(inp["model"])
        devices.append(cxl_defaults(inp))
        system = _system(row, inp, catalog, path, devices[-1])
        for cand in _candidates(row, inp):
            try:
                flat_p.append(build.plan_spec(**cand))
            except ValueError as e:
                raise ValueError(f"{path}: row {row.id}: {e}") from None
            flat_m.append(model)
            flat_s.append(system)
            owner.append(i)
            plans_raw.append(cand)
        st, kind = measured_step_time(row, inp, path)
        measured.append(st)
        kinds.append(kind)
    models, systems, plans = _stack(flat_m), _stack(flat_s), _stack(flat_p)
    flags = np.asarray(_predict(models, systems, plans, cal).infeasible)
    owner = np.array(owner)
    pick, substituted = [], []
    for i in range(len(rows)):
        idx = np.flatnonzero(owner == i)
        ok = idx[flags[idx] == 0]
        j = int(ok[0]) if ok.size else int(idx[0])
        pick.append(j)
        changed = [f"{k}={v}" for k, v in plans_raw[j].items() if plans_raw[int(idx[0])][k] != v]
        changed += [f"{k}={v}" for k, v in devices[i].items()]
        substituted.append(",".join(changed))
    take = lambda tree: jax.tree.map(lambda a: a[np.array(pick)], tree)  # noqa: E731
    return Prepared(list(rows), take(models), take(systems), take(plans), np.array(measured), kinds, substituted)


def predict(prep: Prepared, cal: Calibration):
    return _predict(prep.models, prep.systems, prep.plans, cal)


def source_label(source: str) -> str:
    """A short per-source label: the text before the first bracket or '@'."""
    for sep in (" [", " (", " @", " Tab", " docs/", " README"):
        source = source.split(sep)[0]
    return source.strip()


def validate(rows: Sequence[Row], catalog, cal: Calibration, path="runs") -> dict[str, Any]:
    prep = prepare(rows, catalog, cal, path)
    out = predict(prep, cal)
    measured = prep.measured
    pred = np.asarray(out.step_time_s, dtype=np.float64)
    flags = np.asarray(out.infeasible)
    feasible = flags == 0
    err = np.where(feasible, (pred - measured) / measured * 100.0, 100.0)
    report_rows = []
    for i, row in enumerate(rows):
        report_rows.append(
            dict(
                id=row.id,
                model=row.fields["model"],
                gpu=row.fields["gpu"],
                n_gpus=int(float(row.fields["n_gpus"])),
                layout=_layout(row.fields),
                source=source_label(row.source),
                measured_from=prep.kinds[i],
                measured_step_time_s=float(measured[i]),
                predicted_step_time_s=float(pred[i]),
                error_pct=float(err[i]),
                feasible=bool(feasible[i]),
                infeasible_code=int(flags[i]),
                complete=row.complete,
                substituted=prep.substituted[i],
                stack=row.stack.key if row.stack else "",
                hbm_used_GiB=float(np.asarray(out.hbm_used_GiB)[i]),
            )
        )
    return summarize(report_rows)


def _layout(f: Mapping[str, str]) -> str:
    parts = [f"tp{f['tp']}", f"pp{f['pp']}"]
    if f["vp"] not in ("", "1"):
        parts.append(f"vp{f['vp']}")
    parts += [f"dp{f['dp']}"]
    if f["cp"] not in ("", "1"):
        parts.append(f"cp{f['cp']}")
    if f["zero"] not in ("", "0"):
        parts.append(f"z{f['zero']}")
    parts.append(f"mb{f['micro_batch']}")
    parts.append(f"gb{f['global_batch']}")
    return "-".join(parts)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    abs_err = np.array([abs(r["error_pct"]) for r in rows])
    complete = np.array([r["complete"] for r in rows])
    per_source: dict[str, dict[str, float]] = {}
    for label in dict.fromkeys(r["source"] for r in rows):
        e = np.array([abs(r["error_pct"]) for r in rows if r["source"] == label])
        per_source[label] = {"n": int(e.size), "mape_pct": float(e.mean()), "max_abs_error_pct": float(e.max())}
    return {
        "n_runs": len(rows),
        "mape_step_time_pct": float(abs_err.mean()),
        "mape_step_time_pct_complete": float(abs_err[complete].mean()) if complete.any() else float("nan"),
        "n_complete": int(complete.sum()),
        "max_abs_error_pct": float(abs_err.max()),
        "n_infeasible": int(sum(not r["feasible"] for r in rows)),
        "per_source": per_source,
        "rows": rows,
    }


# --- memory ------------------------------------------------------------------------------------

MEMORY_COLUMNS = ("source", "model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "micro_batch", "seq_len",
                  "recompute", "sp", "component", "value", "unit", "notes")  # fmt: skip


def default_memory_path() -> Path:
    return Path(str(resources.files("hetersim") / "data" / "published_memory.csv"))


def _component(out, i: int, component: str) -> float | None:
    c = component.lower()
    if c.startswith("params+grads+optimizer"):
        return float(out.weights_GiB[i] + out.grads_GiB[i] + out.optimizer_GiB[i])
    if c == "activations":
        return float(out.activations_GiB[i])
    if c.startswith("peak memory"):
        return float(out.hbm_used_GiB[i])
    return None


def validate_memory(path: str | Path | None, catalog, cal: Calibration, runs_path=None) -> dict[str, Any]:
    """Compare per-GPU memory with ``published_memory.csv``.

    Each memory row is matched to the run of ``published_runs.csv`` with the same model, GPU
    count, tp, pp, cp and sequence length; its recompute mode, sequence parallelism and
    micro-batch replace the run's. Rows whose value is not a number (relative figures) or that
    match no run are listed as skipped.
    """
    path = Path(path) if path else default_memory_path()
    recs = list(csv.DictReader(io.StringIO(_read_text(path, "memory"), newline="")))
    if not recs or any(c not in recs[0] for c in MEMORY_COLUMNS):
        raise ValueError(f"{path}: not a published-memory CSV, expected columns: {', '.join(MEMORY_COLUMNS)}")
    runs = read_runs(runs_path or default_runs_path())
    results, skipped = [], []
    for k, rec in enumerate(recs, start=2):
        try:
            value = float(rec["value"])
        except ValueError:
            skipped.append(f"line {k}: value {rec['value'][:30]!r} is not a number")
            continue
        match = next((r for r in runs if _same_config(r.fields, rec)), None)
        if match is None:
            skipped.append(f"line {k}: no run of {rec['model']} with this layout")
            continue
        inp = row_inputs(match, catalog, str(path))
        plan = dict(inp["plan"], micro_batch=int(rec["micro_batch"]))
        per_step = plan["micro_batch"] * plan["dp"]
        plan["global_batch"] = max(plan["global_batch"] // per_step, 1) * per_step
        if rec["recompute"].strip():
            plan["recompute"] = rec["recompute"].strip()
        if rec["sp"].strip():
            plan["sp"] = rec["sp"].strip() == "True"
        if "optimizer_sharding=false" in rec["notes"]:
            plan["zero"] = 0
        model = build.model_spec(inp["model"])
        system = _system(None, inp, catalog, "memory", cxl_defaults(inp))
        out = _predict(_stack([model]), _stack([system]), _stack([build.plan_spec(**plan)]), cal)
        pred = _component(out, 0, rec["component"])
        if pred is None:
            skipped.append(f"line {k}: component {rec['component']!r} is not modelled")
            continue
        results.append(
            dict(
                model=rec["model"],
                layout=f"tp{rec['tp']}-pp{rec['pp']}-dp{rec['dp']}-cp{rec['cp']}",
                recompute=plan["recompute"],
                component=rec["component"],
                measured_GiB=value,
                predicted_GiB=pred,
                error_pct=(pred - value) / value * 100.0,
            )  # fmt: skip
        )
    errs = np.array([abs(r["error_pct"]) for r in results]) if results else np.array([np.nan])
    return {"n": len(results), "mape_pct": float(np.mean(errs)), "rows": results, "skipped": skipped}


def _same_config(run: Mapping[str, str], mem: Mapping[str, str]) -> bool:
    def num(x):
        try:
            return float(x)
        except ValueError:
            return None

    same = all(num(run[c]) == num(mem[c]) for c in ("n_gpus", "tp", "pp", "cp", "seq_len"))
    return same and run["model"].strip().lower().startswith(mem["model"].strip().lower())
