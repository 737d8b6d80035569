"""Published runs as model inputs: the runs CSV read and checked, each row as specs.

Reads the schema of ``data/published_runs.csv`` (see ``data/README.md``): one-line errors for a
bad file, a row's columns as the model, GPU entry, scale-up domain and plan options it describes,
its measured step time, and the candidate plans :mod:`hetersim.fit.validation` tries where the
row cannot run as written. Rows that give only an MFU are compared through the step time that MFU
implies under Megatron-LM's FLOP accounting (:func:`hetersim.terms.flops.megatron_flops_per_token`),
the accounting the sources of such rows print.
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

from .. import build
from ..catalog.check import fits_nodes
from ..planrules import check_experts, check_stack_plan
from ..terms.flops import megatron_flops_per_token
from ..types import ATTENTION, FieldError
from ..units import TFLOP
from .stacks import Stack, load_stacks, row_stack

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
    ``source``, for the facts the CSV has no column for, unless its optional ``stack`` column
    names one (:func:`~hetersim.fit.stacks.row_stack`).
    """
    stacks = load_stacks() if stacks is None else stacks
    path = Path(path)
    reader = csv_records(read_text(path, "runs"))
    reader.fieldnames = [f.strip() for f in reader.fieldnames or []]
    twice = sorted({c for c in reader.fieldnames if reader.fieldnames.count(c) > 1})
    if twice:  # csv.DictReader keeps the last column of a name silently
        raise ValueError(f"{path}: column {twice[0]!r} appears twice in the header; give each column once")
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: not a published-runs CSV, missing columns: {', '.join(missing)}")
    rows, seen = [], set()
    for i, rec in enumerate(reader, start=2):
        if None in rec or any(v is None for v in rec.values()):
            raise ValueError(f"{path}: line {i}: wrong number of fields")
        try:
            stack = row_stack(rec["source"], rec.get("notes") or "", rec.get("stack") or "", stacks)
        except ValueError as e:
            raise ValueError(f"{path}: row {rec['id']}: {e}") from None
        rid = (rec["id"] or "").strip()
        if not rid:
            raise ValueError(f"{path}: line {i}: column id is empty; every run needs an id")
        if rid in seen:
            raise ValueError(f"{path}: line {i}: id {rid!r} is used by an earlier row; ids must be unique")
        seen.add(rid)
        rows.append(Row(rid, rec["source"], rec, not rec["assumed"].strip(), stack))
    if not rows:
        raise ValueError(f"{path}: no runs")
    return rows


def csv_records(text: str) -> csv.DictReader:
    """The records of a CSV text (quoted fields may hold newlines). csv's field limit (128 KiB), a
    guard for unbounded input, is raised to the text's length: a long ``notes`` field is read,
    never a ``_csv.Error`` traceback."""
    csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))
    return csv.DictReader(io.StringIO(text, newline=""))


def read_text(path: Path, what: str) -> str:
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
    raw = (row.fields.get(col) or "").strip()  # a column the file lacks is empty
    if raw == "" and optional:
        return None
    try:  # ASCII digits only: float() reads fullwidth and other scripts' digits and 1_0
        if not raw.isascii() or "_" in raw:
            raise ValueError
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
    moe_plan = _moe(row, model, catalog, path, n)
    plan = dict(
        **moe_plan,
        n_gpus=n_gpus,
        tp=tp,
        pp=pp,
        vp=int(opt("vp", 1)),
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
        loss=_loss(row, path),
        offload=offload,
        reuse_Mparams=row.stack.zero3_reuse_Mparams if row.stack is not None else 0.0,
        zero3_prefetch=row.stack.zero3_prefetch if row.stack is not None else True,
        stack=row.stack.stack if row.stack is not None else "megatron",
        shard_group=int(n("shard_group", optional=True) or 0) if "shard_group" in f else 0,
    )
    _check_layout(path, row, model, plan)
    domain, node = opt("scaleup_domain", None), int(gpu.get("gpus_per_node") or 0)
    if domain is not None and (domain < 1 or (node and not fits_nodes(int(domain), node))):
        raise ValueError(
            f"{path}: row {row.id}: column scaleup_domain must be whole nodes of {gpu.get('gpus_per_node')} "
            f"GPUs or divide one (as the catalog's); got {f['scaleup_domain'].strip()!r}"
        )
    return dict(model=model, gpu=gpu, scaleup_domain=domain, plan=plan)


def _check_layout(path, row: Row, model: Mapping[str, Any], plan: Mapping[str, Any]) -> None:
    """A measured run's layout must be one that can run: a row that contradicts itself is a
    mistake in the file, refused naming the row and columns, not a prediction counted as missed."""
    where = f"{path}: row {row.id}"
    tp, pp, cp, dp, n = (plan[k] for k in ("tp", "pp", "cp", "dp", "n_gpus"))
    sizes = [(c, plan[c]) for c in ("n_gpus", "tp", "pp", "vp", "cp", "dp", "micro_batch", "global_batch", "seq_len")]
    for col, v in sizes + [(c, model[c]) for c in ("layers", "hidden", "ffn_hidden", "vocab")]:
        if v < 1:
            raise ValueError(f"{where}: column {col} must be at least 1; got {v}")
    if tp * pp * cp * dp != n:
        raise ValueError(f"{where}: n_gpus {n} is not tp x pp x cp x dp = {tp} x {pp} x {cp} x {dp}")
    if plan["global_batch"] % (plan["micro_batch"] * dp):
        raise ValueError(
            f"{where}: global_batch {plan['global_batch']} is not a multiple of micro_batch x dp "
            f"= {plan['micro_batch']} x {dp}"
        )
    if cp > 1 and plan["seq_len"] % (2 * cp):
        raise ValueError(f"{where}: seq_len {plan['seq_len']} cannot be cut into 2 x cp = {2 * cp} chunks")
    vp = int(plan["vp"])
    if vp > 1 and pp < 2:
        raise ValueError(f"{where}: vp {vp} needs pp > 1 (interleaving splits a pipeline stage into chunks)")
    try:
        check_stack_plan(plan, pp, vp)
    except FieldError as error:
        names = {
            "stack": "the stack",
            "pp": "column pp",
            "vp": "column vp",
            "zero": "column zero",
            "cp": "column cp",
            "precision": "column precision",
        }
        raise ValueError(f"{where}: {error.named(names)}") from None
    heads, kv = int(model["heads"]), int(model["kv_heads"])
    if heads < 1 or kv < 1 or heads % kv:
        raise ValueError(f"{where}: heads {heads} must be a positive multiple of kv_heads {kv}")
    if heads % tp:
        raise ValueError(f"{where}: tp {tp} does not divide the {heads} attention heads")
    accounting = row.fields["flops_accounting"].strip().lower()
    if accounting not in ("", "model", "hardware"):
        raise ValueError(f"{where}: column flops_accounting must be model or hardware; got {accounting!r}")
    for col in ("sp", "ep_overlap"):  # switches: 2 was read as on
        if (row.fields.get(col) or "").strip() not in ("", "0", "1"):
            raise ValueError(f"{where}: column {col} must be 0 or 1; got {row.fields[col].strip()!r}")
    if int(model.get("n_experts", 0) or 0) > 1:  # an expert layout that cannot be placed was scored as a miss
        try:  # the placement rules every stack shares; sequence parallelism under TP is Megatron-Core's own
            check_experts(model, {**plan, "sp": True})
        except FieldError as error:
            if error.fields[:1] == ("stack",):  # the stack has no experts, or no expert parallelism
                names = {"stack": "the stack", "ep": "column ep", "etp": "column etp"}
                raise ValueError(f"{where}: {error.named(names)}") from None
            raise ValueError(f"{where}: {error} (columns ep, etp)") from None


# The MoE columns of moe_runs.csv (data/README.md); a file without them is dense.
MOE_COLUMNS = ("n_experts", "top_k", "moe_ffn_hidden", "shared_experts", "dense_layers", "dense_ffn_hidden")
# Architecture kinds the ``attention`` column may name (not kernels): their extra dimensions come
# from the catalog model the row's ``model`` column names.
ATTENTION_KINDS = ("mha", "gqa", "mla")
# Fields a row's model takes from the catalog entry its ``model`` column names, where one exists.
_CATALOG_EXTRAS = (
    "head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers",
    "sliding_window", "sliding_window_share", "moe_every", "glu_clamp", "expert_bias", "rope_attention_scale",
    "route_groups", "route_group_topk",
)  # fmt: skip
# Busiest EP rank's routed tokens over the mean where a dropless router runs as trained
# (``routing = learned``): the low end of the 1.30-4.01 inter-rank imbalance UltraEP measures
# without balancing across MoE models of 106B-671B in training (arXiv 2606.04101, abstract);
# DODOCO (arXiv 2605.20982) finds the ratio nearly independent of the EP size. A token-drop run
# (the row's notes say so: Megatron-Bridge 25.09, capacity factor 1.0 with expert inputs padded to
# capacity, MB@v0.1.0rc4 src/megatron/bridge/training/utils/moe_token_drop.py) computes exactly
# its capacity on every expert: the busiest rank does the mean's work.
LEARNED_IMBALANCE = 1.30
TOKEN_DROP_IMBALANCE = 1.0


# Whether a published MoE run overlapped its all-to-all (Megatron-Core's
# overlap_moe_expert_parallel_comm) and which dispatcher it ran (a flex dispatcher backend, DeepEP
# or HybridEP, is the hierarchical ``deepep``), where the run's own recipe says: data/moe_run_configs.csv,
# one row per run id, read off the Megatron-Bridge performance presets of the container the run
# names (WorkloadBaseConfig.moe_a2a_overlap at the tag of that container, kept only where the
# preset's expert-parallel size and micro-batch are the row's; each line cites its preset and
# commit). A row's own ``ep_overlap`` / ``dispatcher`` columns override; a run in neither runs
# Megatron-Core's defaults: no overlap, the alltoall dispatcher. ``recompute_modules`` is the same
# preset's WorkloadBaseConfig.recompute_modules at that tag (space-separated; empty: none set):
# ``mla_up_proj`` among them sets the plan's ``mla_up_proj`` (a selective run rebuilds MLA's up
# projections, not the attention core). ``fused_experts`` is the preset's cutedsl_fused_grouped_mlp
# (1: the experts' GEMMs in one grouped kernel; 0 or empty: Transformer Engine's per-expert GEMMs).
# ``fp8_attention``: the preset's fp8_dot_product_attention (1: set; 0 or empty: not set, or not checked
# where the model has no sliding-window layers, on which alone it acts).
# ``pp_layout``: the preset's (or its recipe's) explicit pipeline layout, where it sets one.
# ``moments``: the dtype of Adam's moments where the source gives it (bf16: Megatron-Core's
# precision-aware optimizer, or DeepSeek's BF16 moments; empty: fp32).
def _run_configs() -> dict[str, dict[str, str]]:
    path = Path(str(resources.files("hetersim") / "data" / "moe_run_configs.csv"))
    return {r["id"]: r for r in csv.DictReader(io.StringIO(path.read_text(), newline=""))}


def _moe(row: Row, model: dict[str, Any], catalog, path, n) -> dict[str, Any]:
    """Fill a mixture-of-experts row's model fields (``model``, in place) and return its plan's
    expert fields; nothing for a dense row."""
    f = row.fields
    raw = (f.get("n_experts") or "").strip()
    if not raw:
        experts_only = ("top_k", "moe_ffn_hidden", "shared_experts", "ep", "etp")  # a dense row may give dense_*
        given = [c for c in experts_only if (f.get(c) or "").strip() not in ("", "0", "1")]
        if given:  # priced as dense, the layout still naming its experts
            raise ValueError(f"{path}: row {row.id}: column {given[0]} is given without n_experts (a dense row)")
        return {}
    for col in MOE_COLUMNS:
        value = n(col, optional=True)
        if value is not None:
            model[col] = value
        elif col in ("top_k", "moe_ffn_hidden"):  # an MoE row's own sizes: no default stands for them
            raise ValueError(
                f"{path}: row {row.id}: an MoE row (n_experts {raw}) needs {col}: its column is empty or missing"
            )
    if model.get("dense_ffn_hidden"):
        model["ffn_hidden"] = model.pop("dense_ffn_hidden")
    model.pop("dense_ffn_hidden", None)
    kind = (f.get("attention") or "").strip().lower()
    entry = _catalog_model(catalog, f["model"])
    if entry is not None:
        model.update({k: entry[k] for k in _CATALOG_EXTRAS if k in entry})
    if kind == "mla" and not model.get("kv_lora_rank"):
        raise ValueError(
            f"{path}: row {row.id}: attention = mla needs the model's MLA dimensions: no catalog model "
            f"named {f['model']!r} has kv_lora_rank"
        )
    routing = (f.get("routing") or "balanced").strip().lower()
    if routing not in ("balanced", "learned"):
        raise ValueError(f"{path}: row {row.id}: column routing must be balanced or learned; got {routing!r}")
    ep = n("ep", optional=True)
    etp = n("etp", optional=True)
    for col, value in (("ep", ep), ("etp", etp)):
        if value == 0:  # read as 1 before
            raise ValueError(f"{path}: row {row.id}: column {col} must be a positive integer (empty: 1); got 0")
    overlap = n("ep_overlap", optional=True) if "ep_overlap" in f else None
    config = _run_configs().get(row.id, {})
    if overlap is None:
        overlap = float(config.get("ep_overlap") or 0)
    dispatcher = (f.get("dispatcher") or config.get("dispatcher") or "alltoall").strip().lower()
    return dict(
        ep=int(ep or 1),
        etp=int(etp or 1),
        ep_overlap=bool(overlap),
        dispatcher=dispatcher,
        moe_imbalance=_imbalance(routing, f.get("notes") or "") if int(ep or 1) > 1 else 1.0,  # one rank: the mean
        mla_up_proj="mla_up_proj" in (config.get("recompute_modules") or "").split(),
        fused_experts=(config.get("fused_experts") or "0").strip() == "1",
        fp8_attention=(config.get("fp8_attention") or "0").strip() == "1",
        pp_layout=bool((config.get("pp_layout") or "").strip()),
        moments=(config.get("moments") or "fp32").strip().lower(),
    )


def _imbalance(routing: str, notes: str) -> float:
    if routing != "learned":
        return 1.0
    return TOKEN_DROP_IMBALANCE if "token-drop" in notes.lower() else LEARNED_IMBALANCE


def _catalog_model(catalog, name: str):
    try:
        return catalog.model(name.strip())
    except ValueError:
        return None


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
    value = _kernel_column(row, "attention", ATTENTION, path, ignore=ATTENTION_KINDS)
    fused = gpu.get("flash_attention", True)
    if value and value not in ("auto", "materialized") and not fused:  # as evaluate refuses --attention
        raise ValueError(
            f"{path}: row {row.id}: column attention {value} cannot run on {gpu.get('name', row.fields.get('gpu'))} "
            "(no fused attention kernel there); use materialized or leave it empty"
        )
    if value:
        return value
    if not fused:
        return "materialized"
    if row.stack is not None and row.stack.attention:
        return row.stack.attention
    return "flash"


def _loss(row: Row, path) -> str:
    """The row's optional ``loss`` column (:data:`LOSS_KERNELS`), else ``auto``: its stack's."""
    return _kernel_column(row, "loss", LOSS_KERNELS, path, ignore=("auto",)) or "auto"


def _kernel_column(row: Row, col: str, allowed: Sequence[str], path, ignore: Sequence[str] = ()) -> str:
    """The row's optional kernel column ``col``, lower-case, or "" where it is empty or one of
    ``ignore``; a one-line ``ValueError`` naming the row and column for any value not ``allowed``."""
    value = (row.fields.get(col) or "").strip().lower()
    if not value or value in ignore:
        return ""
    if value not in allowed:
        raise ValueError(f"{path}: row {row.id}: column {col} must be one of {', '.join(allowed)}; got {value!r}")
    return value


# The largest measured step (seconds) and rate (tokens per second per GPU) taken as real: bounds
# on what a measurement can be (a step of 11.6 days; a thousand times any GPU's rate today), not
# fitted; a figure beyond them is a unit or typing slip.
MAX_STEP_S = 1e6
MAX_TOKENS_PER_S_PER_GPU = 1e9


def _step_time_column(row: Row, path) -> float | None:
    st = _num(path, row, "measured_step_time_s", integer=False, optional=True)
    if st is not None and not 0 < st <= MAX_STEP_S:
        raise ValueError(
            f"{path}: row {row.id}: column measured_step_time_s must be positive and at most {MAX_STEP_S:g} s "
            f"(leave it empty to use tokens/s or MFU); got {st:g}"
        )
    return st


def check_rows(rows: Sequence[Row], catalog, path="runs") -> None:
    """Every row's columns read and checked (:func:`row_inputs`), before any prediction: a file
    with a mistake is refused before the work is announced."""
    from ..specs.plan import host_plan

    for row in rows:
        inputs = row_inputs(row, catalog, path)
        try:  # the values the specs read (precision, recompute, an offload tier), as prepare reads them
            build.model_spec(inputs["model"])
            host_plan(**inputs["plan"])
        except ValueError as e:
            raise ValueError(f"{path}: row {row.id}: {e}") from None
        _check_measured(row, path)


def _check_measured(row: Row, path) -> None:
    """The row has a measurement :func:`measured_step_time` can use, and an MFU is a share."""
    mfu = _num(path, row, "measured_mfu", integer=False, optional=True)
    if mfu is not None and mfu > 1:
        raise ValueError(f"{path}: row {row.id}: measured_mfu {mfu:g} is above 1; give a share of the peak (0.45)")
    tps = _num(path, row, "measured_tokens_per_s_per_gpu", integer=False, optional=True)
    if tps is not None and tps > MAX_TOKENS_PER_S_PER_GPU:
        raise ValueError(
            f"{path}: row {row.id}: column measured_tokens_per_s_per_gpu must be at most "
            f"{MAX_TOKENS_PER_S_PER_GPU:g}; got {tps:g}"
        )
    if not (_step_time_column(row, path) or tps or mfu):
        raise ValueError(f"{path}: row {row.id}: no measured step time, tokens/s or MFU")


def measured_step_time(row: Row, inputs: Mapping[str, Any], path="runs", model=None) -> tuple[float, str]:
    """The row's measured step time and how it was obtained ("step", "tokens" or "mfu");
    ``model`` is the row's model spec where the caller has built it."""
    st = _step_time_column(row, path)
    if st:
        return st, "step"
    plan = inputs["plan"]
    tokens = plan["global_batch"] * plan["seq_len"]
    tps = _num(path, row, "measured_tokens_per_s_per_gpu", integer=False, optional=True)
    if tps:
        return tokens / (tps * plan["n_gpus"]), "tokens"
    mfu = _num(path, row, "measured_mfu", integer=False, optional=True)
    if mfu:
        model = build.model_spec(inputs["model"]) if model is None else model
        full = plan["recompute"] == "full" and row.fields["flops_accounting"].strip() == "hardware"
        flops = float(megatron_flops_per_token(model, plan["seq_len"], full)) * tokens
        peak = float(inputs["gpu"]["peak_tflops_bf16"]) * TFLOP
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


def row_system(row: Row | None, inputs: Mapping[str, Any], catalog, path, cxl: Mapping[str, str]):
    """The system spec of a row's inputs with the CXL devices ``cxl``; errors name the row."""
    try:
        gpu, domain = inputs["gpu"], inputs["scaleup_domain"]
        return build.system_spec(gpu, catalog.links, domain, catalog.memory, fleets=catalog.fleets, **cxl)
    except ValueError as e:
        where = f"row {row.id}: " if row is not None else ""
        raise ValueError(f"{path}: {where}{e}") from None


# Assumed discrete columns are the curator's guess ("the usual default of that stack"). Where a
# row is infeasible as written, validate tries the other values of an assumed column, from the
# one that saves least memory on, and keeps the first that runs: a real run ran, so it did not
# use a layout that cannot fit. For a model with MLA, selective recomputation with the mla_up_proj
# module (what 16 of the 19 Megatron-Bridge DeepSeek-V3 presets behind moe_run_configs.csv
# recompute) comes between selective and full: it stores less than the first, more than the second.
ALTERNATIVES = {"recompute": ("none", "selective", "full")}
# A row that states no loss kernel ran one: where none of its variants fits with every logit held
# (its stack's loss kernel being the materialized one), it fused the loss with the LM head over
# chunks of tokens (Liger-Kernel's fused linear cross-entropy, torchtune's chunked cross-entropy),
# as every single-GPU long-context stack does, and validate tries that last.
LOSS_KERNELS = ("materialized", "fused", "chunked")


def candidates(row: Row, inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row as written, then its assumed values replaced, then (where its micro-batch is the
    whole local batch) gradient accumulation over halved micro-batches: the order validate
    tries them in when a row cannot run as written."""
    plan = inputs["plan"]
    assumed = {c.strip() for c in row.fields["assumed"].split(";")}

    mla = float(inputs["model"].get("kv_lora_rank") or 0) > 0

    def variants(base):
        out = [dict(base)]
        for col, values in ALTERNATIVES.items():
            if col in assumed and base[col] in values:
                for v in values[values.index(base[col]) + 1 :]:
                    if col == "recompute" and v == "full" and mla and not base.get("mla_up_proj"):
                        # Between the two: the module the Megatron-Bridge DeepSeek-V3 presets name.
                        out.append(dict(base, recompute="selective", mla_up_proj=True))
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
    if plan["loss"] == "auto":  # no loss kernel stated (LOSS_KERNELS): chunked, tried last
        out += [dict(c, loss="chunked") for c in out]
    return out


def source_label(source: str) -> str:
    """A short per-source label: the text before the first bracket or '@'."""
    for sep in (" [", " (", " @", " Tab", " docs/", " README"):
        source = source.split(sep)[0]
    return source.strip()
