"""The one-call API: names in, a breakdown out, with the same defaults as the CLI.

:func:`configure` turns plain options (catalog keys, plan fields, CXL devices, a mix of kinds)
into the specs of one configuration, validated with one-line ``ValueError``s that name the
field; :func:`evaluate` also runs the model on them. The ``hetersim evaluate`` and ``hetersim
sensitivity`` commands call :func:`configure` (they only add flags, tables and JSON).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .hplan import parse_cluster_groups
from .planfields import AUTO, DEFAULTS, FIELDS, resolve_cpu_optimizer, resolve_sp
from .planrules import check_dualpipe, check_experts, check_plan_file, check_stack_plan, cluster_keys, keyed
from .types import LOW_PRECISION, Attention, FieldError, Tier

DEFAULT_SEQ_LEN = 4096  # where a model entry names no training context
# Plan fields the front door takes from the model entry when not given.
FROM_MODEL = ("seq_len",)


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One configuration, built: labels, the resolved plan options, the specs and the result.

    ``specs`` is ``(model, system, plan, calibration)``; for a mix of device kinds ``system`` is
    a :class:`hetersim.cluster.ClusterSpec` and ``groups`` has one row per kind.
    """

    model: str
    gpu: str
    plan: dict[str, Any]
    specs: tuple[Any, Any, Any, Any]
    breakdown: Any
    groups: list[dict[str, Any]] | None = None
    mixed: Any = None  # the ClusterBreakdown of a mix
    interval: tuple[float, float] | None = None  # 80% interval of the step time (hetersim.fit.intervals)


@functools.cache
def _compiled(name: str):
    """``simulate`` / ``simulate_cluster`` / the layout checks, compiled once per process (one
    configuration), and kept between processes when the command line turned the cache on
    (:mod:`hetersim.compile_cache`)."""
    from .cluster import simulate_cluster
    from .compile_cache import cached_jit
    from .hsim import simulate_plan
    from .simulate import layers_split_for_interleaving, simulate
    from .terms.compute import kernel_supported

    functions = {
        "simulate": simulate,
        "cluster": simulate_cluster,
        "plan": simulate_plan,
        "kernel": kernel_supported,
        "interleave": layers_split_for_interleaving,
    }
    return cached_jit(functions[name], name)


def default_calibration():
    """The stored calibration constants (``hetersim/catalog/calibration.toml``) as a spec."""
    from .fit.calibration import as_spec, load_calibration

    return as_spec(load_calibration())


def _model(catalog, model: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(label, entry) of a catalog key, a Hugging Face ``config.json`` path or model id, or a
    dimensions dict."""
    from .catalog import model_entry, model_from_dims

    if isinstance(model, Mapping):
        entry = model_from_dims(**model)
        return entry["name"], entry
    return str(model), model_entry(catalog, model)


def parse_cluster(catalog, text: str) -> list[tuple[dict[str, Any], int]]:
    """``"KIND:N,KIND:N"`` -> ``[(catalog entry, count), ...]`` with one-line errors."""
    return [(catalog.gpu(kind), count) for kind, count in parse_cluster_groups(text)]


def group_rows(groups, mixed, hetero: str) -> list[dict[str, Any]]:
    """One row per device kind of a mix: its stages or replicas, layers, time and memory."""
    from .types import Infeasible

    rows = []
    for i, (entry, count) in enumerate(groups):
        units = "stages" if hetero == "pipeline" else "replicas"
        rows.append(
            {
                "gpu": entry.get("name", "?"),
                "gpus": count,
                units: int(round(float(mixed.group_stages[i]))),
                "layers_per_stage": int(round(float(mixed.group_layers[i]))),
                "microbatches": int(round(float(mixed.group_microbatches[i]))),
                "stage_or_step_time_s": float(mixed.group_stage_time_s[i]),
                "hbm_used_GiB": float(mixed.group_hbm_used_GiB[i]),
                "infeasible": Infeasible.describe(int(mixed.group_infeasible[i])),
            }
        )
    return rows


def _hardware(catalog, gpu, cluster, n_gpus, overrides):
    if (gpu is None) == (cluster is None):
        raise FieldError("give one of {0} KIND or {1} KIND:N,KIND:N", "gpu", "cluster")
    if cluster is None:
        entry = catalog.gpu(gpu)
        if overrides:
            from .catalog import apply_overrides

            entry = apply_overrides("gpus", gpu, entry, dict(overrides), origin="set", catalog=catalog)
        return gpu, entry, None
    groups = parse_cluster(catalog, cluster)
    total = sum(c for _, c in groups)
    if n_gpus is not None and total != n_gpus:
        raise FieldError(f"{{0}} {n_gpus} must equal the {{1}} total {total}", "n_gpus", "cluster")
    return cluster, groups[0][0], groups


def configure(
    *,
    model: str | Mapping[str, Any],
    gpu: str | None = None,
    cluster: str | None = None,
    hetero: str = "pipeline",
    layers_per_stage: Sequence[int] | None = None,
    catalog: Any = (),
    overrides: Mapping[str, Any] | None = None,
    cxl_expander: str | None = None,
    cxl_pool: str | None = None,
    cxl_p2p: bool = False,
    calibration: Any = None,
    plan_file: Any = None,
    **plan: Any,
) -> Configuration:
    """Build and evaluate one configuration (see :func:`evaluate`)."""
    from . import build
    from .catalog import Catalog, load_catalog

    cat = catalog if isinstance(catalog, Catalog) else load_catalog(list(catalog))
    model_label, model_entry = _model(cat, model)
    cal = calibration if calibration is not None else default_calibration()
    if hetero != "pipeline" and (cluster is None or plan_file is not None):
        raise FieldError("{0} says how a {1} mix splits the job; give {1} KIND:N,KIND:N or leave it out",
                         "hetero", "cluster")  # fmt: skip
    if plan_file is not None:
        from . import hplan

        hp = plan_file if isinstance(plan_file, hplan.HeteroPlan) else hplan.read_plan_file(plan_file)
        origin = "plan" if isinstance(plan_file, hplan.HeteroPlan) else str(plan_file)
        if overrides or cxl_expander or cxl_pool or cxl_p2p or layers_per_stage:
            raise FieldError("{0} describes every stage; give extra hardware with {1} files", "plan_file", "catalog")
        return configure_plan(cat, model_label, model_entry, hp, cluster, plan, cal, origin)
    if cluster is not None and (cxl_expander or cxl_pool or cxl_p2p):
        raise FieldError(
            "{0} options apply to one device kind; describe a mix's tiers with {1} files", "cxl", "catalog"
        )
    _check_mix(plan, cluster, overrides, model_entry)
    if cluster is not None and (layers_per_stage or _straddles(cluster, plan, hetero)):
        return _shorthand(cat, model_label, model_entry, cluster, hetero, layers_per_stage, plan, cal)
    gpu_label, gpu_entry, groups = _hardware(cat, gpu, cluster, plan.get("n_gpus"), overrides)
    if layers_per_stage and groups is None:
        raise FieldError("{0} sets the layers of each {1} group; give {1} KIND:N,KIND:N or leave it out",
                         "layers_per_stage", "cluster")  # fmt: skip
    if plan.get("seq_len") is None:
        plan["seq_len"] = int(model_entry.get("seq_len", DEFAULT_SEQ_LEN))
    plan_s = build.plan_spec(**plan)
    resolved = _resolved(plan, plan_s)
    check_inert(model_entry, plan, resolved)
    for entry in [gpu_entry] if groups is None else [e for e, _ in groups]:
        _check_kernel(entry, plan_s)
        _check_precision(entry, str(entry.get("name", gpu_label)), plan_s)
    m = build.model_spec(model_entry)
    if groups is not None:
        from .cluster import check_plan, cluster_spec

        if resolved.get("dualpipe"):
            raise FieldError("{0}: a mix of device kinds runs 1F1B (DualPipe is priced for one kind)", "dualpipe")
        check_plan(groups, dict(resolved), hetero)
        layers = list(layers_per_stage or ()) or None
        system = cluster_spec(groups, cat.links, hetero, layers, memory=cat.memory, fleets=cat.fleets)
        mixed = _compiled("cluster")(m, system, plan_s, cal)
        rows = group_rows(groups, mixed, hetero)
        itv = step_time_interval(cat, [e for e, _ in groups], resolved, mixed.total.step_time_s, _is_moe(m))
        return Configuration(model_label, gpu_label, resolved, (m, system, plan_s, cal), mixed.total, rows, mixed, itv)
    from . import tiers
    from .reliability import check_checkpoint_tier

    cxl = dict(cxl_expander=cxl_expander, cxl_pool=cxl_pool, cxl_p2p=cxl_p2p or None)
    system = build.system_spec(gpu_entry, cat.links, memory=cat.memory, fleets=cat.fleets, **cxl)
    if cxl_p2p and not np.asarray(system.host.tier_present)[[int(Tier.CXL_EXPANDER), int(Tier.CXL_POOL)]].any():
        raise FieldError("{0} lets the GPUs reach CXL memory directly; the node has none: give {1} or {2}",
                         "cxl_p2p", "cxl_expander", "cxl_pool")  # fmt: skip
    tiers.check_offload(system.host, resolved["offload"])
    check_checkpoint_tier(system.host, resolved.get("checkpoint_tier") or DEFAULTS["checkpoint_tier"])
    check_layout(model_entry, plan, resolved)
    out = _compiled("simulate")(m, system, plan_s, cal)
    itv = step_time_interval(cat, [gpu_entry], resolved, out.step_time_s, _is_moe(m))
    return Configuration(model_label, gpu_label, resolved, (m, system, plan_s, cal), out, interval=itv)


def _is_moe(m: Any) -> bool:
    """Whether a model spec has mixture-of-experts layers."""
    return float(m.moe_layers) > 0


def _given_dp(plan: Mapping[str, Any]) -> int:
    """The ``dp`` the options give (0: derive it)."""
    dp = plan.get("dp")
    return 0 if dp in (None, AUTO) else int(dp)


def _straddles(cluster: str, plan: Mapping[str, Any], hetero: str) -> bool:
    """Whether ``--hetero pipeline`` puts a stage across two groups (data parallelism across kinds
    inside a stage), which only the general plan expresses."""
    if hetero != "pipeline":
        return False
    tp, cp, pp = (int(plan.get(k) or 1) for k in ("tp", "cp", "pp"))
    total = sum(c for _, c in parse_cluster_groups(cluster))
    dp = _given_dp(plan) or max(total // max(tp * cp * pp, 1), 1)
    unit = tp * cp * dp
    return any(c % unit for _, c in parse_cluster_groups(cluster)) and total == unit * pp


def _shorthand(cat, model_label, model_entry, cluster, hetero, layers_per_stage, plan, cal):
    """``--cluster`` with a per-stage layer split or stages that straddle two kinds: the
    general plan (:func:`hetersim.hplan.from_shorthand`) evaluated."""
    from . import hplan

    groups = parse_cluster_groups(cluster)
    for kind, _ in groups:
        cat.gpu(kind)
    total = sum(c for _, c in groups)
    n = plan.get("n_gpus")
    if n is not None and int(n) != total:
        raise FieldError(f"{{0}} {n} must equal the {{1}} total {total}", "n_gpus", "cluster")
    tp, cp, pp = (int(plan.get(k) or 1) for k in ("tp", "cp", "pp"))
    dp = _given_dp(plan) or max(total // max(tp * cp * pp, 1), 1)
    if hetero == "pipeline" and tp * cp * dp * pp != total:
        raise FieldError(f"{{0}} {total} is not tp*cp*dp*pp = {tp * cp * dp * pp}", "cluster")
    layers = int(model_entry.get("layers", 0) or 0) + int(model_entry.get("mtp_layers", 0) or 0)
    common = {k: v for k, v in plan.items() if k not in hplan.STRUCTURAL and v is not None}
    hp = hplan.from_shorthand(
        groups, tp=tp, pp=pp, dp=dp, cp=cp, mode=hetero, layers_per_stage=layers_per_stage, n_layers=layers,
        options=common,
    )  # fmt: skip
    return configure_plan(cat, model_label, model_entry, hp, cluster, common, cal, "cluster")  # flags, every one


def _in_file(origin: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, a plain one-line error naming the plan file ``origin`` it came from
    (a :class:`FieldError` names its fields' flags instead)."""
    try:
        return fn(*args, **kwargs)
    except FieldError:
        raise
    except ValueError as error:
        raise ValueError(f"{origin}: {error}" if origin else str(error)) from None


def _from_file(origin: str, given: Mapping[str, Any], fn, *args):
    """``fn(*args)``; a :class:`FieldError` about fields the command line did not give names the
    plan file ``origin`` and the fields' keys in it, not flags the user never wrote."""
    try:
        return fn(*args)
    except FieldError as error:
        if not origin or all(f in given for f in error.fields):
            raise
        if not any(f in given for f in error.fields):
            raise ValueError(f"{origin}: {error}") from None
        flags = [f for f in error.fields if f in given]  # a flag against the file: each named where it is
        names = [f"{{{flags.index(f)}}}" if f in given else f"{origin}'s {f}" for f in error.fields]
        raise FieldError(error.template.format(*names), *flags) from None


def configure_plan(cat, model_label, model_entry, hp, cluster, given, cal, origin: str) -> Configuration:
    """A heterogeneous plan (:mod:`hetersim.hplan`) built, checked and evaluated; ``given``: plan
    fields from flags (they may add to the file's, not contradict them)."""
    from . import build, hplan, hsim

    # A field not given is None (the CLI passes its flags left at their defaults as None): a value
    # given, default or not, may add to the file's fields but not contradict them.
    given = {k: v for k, v in given.items() if v is not None and not (k == "offload" and not v)}
    for k in hplan.STRUCTURAL:
        if k in given and k != "n_gpus":
            raise FieldError("{0} is set per replica or by the stages of {1}; leave it out", k, "plan_file")
    opts = dict(hp.options)
    for k, v in given.items():
        if k in hplan.STRUCTURAL:
            continue
        if k in opts and opts[k] != v:
            raise FieldError(f"{{0}} {v!r} contradicts the plan file's {opts[k]!r}", k)
        opts[k] = v
    if opts.get("global_batch") is None:
        raise FieldError("{0} is required (give it, or global_batch in the plan file)", "global_batch")
    if opts.get("dualpipe"):  # named as a flag, or as the file's key, where it was given
        why = "{0}: a heterogeneous plan's stages run 1F1B (DualPipe is priced for a plan given by --gpu)"
        _from_file(origin, given, _raise, FieldError(why, "dualpipe"))
    hp = dataclasses.replace(hp, options=opts)
    text = cluster or hp.cluster
    counts, hp = cluster_keys(cat, hplan.parse_cluster_counts(text) if text else hp.gpus()), keyed(cat, hp)
    if cluster and hp.cluster and counts != cluster_keys(cat, hplan.parse_cluster_counts(hp.cluster)):
        raise FieldError(f"{{0}} {cluster} contradicts the plan file's cluster {hp.cluster!r}", "cluster")
    entries = [_in_file(origin if not cluster else "", cat.gpu, k) for k in counts]
    hplan.check(hp, model_entry, counts, origin)
    seq = int(opts.get("seq_len") or model_entry.get("seq_len", DEFAULT_SEQ_LEN))
    _from_file(origin, given, check_plan_file, hp, model_entry, opts, seq, origin)
    used = hp.gpus()
    if given.get("n_gpus") is not None and int(given["n_gpus"]) != sum(used.values()):
        raise FieldError(f"{{0}} {given['n_gpus']} contradicts the plan's {sum(used.values())} GPUs", "n_gpus")
    plan_s = _from_file(origin, given, _in_file, origin, shared_plan, cat, hp.kinds(), opts, seq)
    defaults = {k: v for k, v in DEFAULTS.items() if isinstance(v, str | int | float | bool | type(None))}
    resolved = _resolved({**defaults, **opts, "seq_len": seq, "n_gpus": sum(used.values())}, plan_s)
    stages = max(len(p.stages) for p in hp.pipelines) if hp.pipelines else 1
    _from_file(origin, given, check_inert, model_entry, opts, {**resolved, "pp": stages})  # before it runs
    resolved.update(tp=None, pp=None, dp=None, plan=hp.as_dict())
    m = build.model_spec(model_entry)
    hs = _in_file(origin, hsim.hetero_spec, hp, cat, counts, shape=hsim.padded_shape(hp))
    out = _compiled("plan")(m, hs, plan_s, cal)
    rows = stage_rows(hp, out)
    label = ",".join(f"{k}:{n}" for k, n in counts.items())
    itv = step_time_interval(cat, entries, resolved, out.total.step_time_s, _is_moe(m))
    return Configuration(model_label, label, resolved, (m, hs, plan_s, cal), out.total, rows, out, itv)


def _check_mix(plan: Mapping[str, Any], cluster: str | None, overrides, model: Mapping[str, Any]) -> None:
    """A ``--cluster`` mix's stages are the user's flags: a pipeline or experts the stack lacks are
    refused, and ``--set``, which edits one device kind (whichever engine prices the mix)."""
    if cluster is None:
        return
    if overrides:
        raise FieldError(
            "{0} applies to one device kind, not the kinds of {1}; describe mixed hardware with {2} files",
            "set", "cluster", "catalog",
        )  # fmt: skip
    check_stack_plan(plan, int(plan.get("pp") or 1), int(plan.get("vp") or 1), model=model)


def _raise(error: Exception) -> None:
    raise error


def shared_plan(cat, kinds: Sequence[str], options: Mapping[str, Any], seq_len: int) -> Any:
    """The plan fields every replica of a heterogeneous plan shares, as a checked :class:`Plan`
    (bad values, a kernel or precision one of ``kinds`` cannot run: one-line errors)."""
    from . import hplan, hsim

    plan_s = hsim.common_plan(hplan.HeteroPlan((), "equal", dict(options)), seq_len)
    for k in kinds:
        _check_kernel(cat.gpu(k), plan_s)
        _check_precision(cat.gpu(k), k, plan_s)
    return plan_s


def with_chosen_layers(cat, model_entry, hp, cluster: str) -> tuple[Configuration, Any]:
    """``hp`` evaluated on ``cluster``, and ``hp`` with every stage's layers fixed to the split
    the model chose (what a plan search writes out)."""
    from . import hplan

    best = configure(model=model_entry, catalog=cat, plan_file=hp, cluster=cluster)
    layers = [[int(x) for x in row] for row in best.mixed.stage_layers.tolist()]
    return best, hplan.with_layers(hp, layers)


def _is_default(name: str, value: Any) -> bool:
    default = DEFAULTS.get(name, object())
    if name == "offload":
        return not value
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - arrays and the like are never a default
        return False


def stage_rows(hp, out) -> list[dict[str, Any]]:
    """One row per replica group of every stage of a heterogeneous plan's breakdown."""
    from .types import Infeasible

    rows = []
    for j, p in enumerate(hp.pipelines):
        for s, st in enumerate(p.stages):
            for r, rep in enumerate(st.replicas):
                rows.append(
                    {
                        "pipeline": j,
                        "copies": p.count,
                        "stage": s,
                        "gpu": rep.gpu,
                        "tp": rep.tp,
                        "replicas": rep.count,
                        "layers": int(round(float(out.stage_layers[j, s]))),
                        "microbatches": int(round(float(out.slot_microbatches[j, s, r]))),
                        "stage_time_s": float(out.slot_time_s[j, s, r]),
                        "busy_s": float(out.slot_busy_s[j, s, r]),
                        "hbm_used_GiB": float(out.slot_hbm_used_GiB[j, s, r]),
                        "infeasible": Infeasible.describe(int(out.slot_infeasible[j, s, r])),
                    }
                )
    return rows


def step_time_interval(
    catalog, entries: Sequence[Mapping[str, Any]], plan: Mapping[str, Any], step_time_s, moe: bool = False
):
    """``(low, high)``: the 80% interval of a predicted step time (:mod:`hetersim.fit.intervals`)
    for a configuration of these device kinds (catalog entries) and resolved plan options, of a
    mixture-of-experts model where ``moe``; an :class:`~hetersim.fit.intervals.Interval`, whose
    ``flags`` say what widened it."""
    from .fit import intervals

    model = intervals.load_intervals()
    ev = model.evidence
    keys = [next((k for k, v in catalog.gpus.items() if v == e), "") for e in entries]
    flags = {
        "device": max(intervals.device_flag(k, e, ev) for k, e in zip(keys, entries, strict=True)),
        "stack": intervals.stack_flag(plan.get("stack"), ev),
        "long_context": float(plan["seq_len"] > ev.max_seq_len),
        "offload": float(bool(plan.get("offload"))),
        "moe": float(intervals.moe_flag(moe, ev)),
    }
    low, high = intervals.bounds(model, float(step_time_s), flags)
    return intervals.Interval(low, high, intervals.raised(flags))


def _check_precision(entry: Mapping[str, Any], key: str, plan_s: Any) -> None:
    """Refuse a precision the device (a kind of a mix, or the one GPU) has no peak for (never priced at zero)."""
    import numpy as np

    from . import build
    from .types import Precision

    code = int(plan_s.precision_code)
    # NumPy indexing: indexing the JAX array would compile a program just for this check.
    if float(np.asarray(build.device_spec(entry).peak_tflops)[code]) <= 0:
        message = f"{{0}} {Precision(code).label}: {key} has no such peak (its catalog entry); use another"
        raise FieldError(message, "precision")


def _check_kernel(entry: Mapping[str, Any], plan_s: Any) -> None:
    """Refuse a fused attention kernel the device cannot run (a sweep flags it instead)."""
    import numpy as np

    from . import build

    if not bool(np.asarray(_compiled("kernel")(build.device_spec(entry), plan_s))):
        kernel = Attention(int(plan_s.attention_code)).label
        why = "no fused attention kernel there"
        if entry.get("flash_attention", True) and not (entry.get("attn_eff_fwd") and entry.get("attn_eff_bwd")):
            why = "its catalog entry gives no fused-attention rate: attn_eff_fwd and attn_eff_bwd"  # flash said to run
        message = f"{{0}} {kernel} cannot run on {entry.get('name', '?')} ({why}); use materialized"
        raise FieldError(message, "attention")


def check_layout(model: Mapping[str, Any], given: Mapping[str, Any], resolved: Mapping[str, Any]) -> None:
    """A :class:`FieldError` naming the fields when the plan's own numbers contradict each other:
    ``dp`` given that does not make ``tp*pp*cp*dp`` the GPU count, a global batch that
    ``micro_batch*dp`` does not divide, an interleaved schedule whose chunks do not split the layers
    evenly. One configuration given field by field is a question with a mistake in it, not an
    answer; a sweep's or a search's points keep such layouts as infeasible data (the model's
    :class:`~hetersim.types.Infeasible` flags)."""
    n, tp, pp, cp = (int(resolved.get(k) or 1) for k in ("n_gpus", "tp", "pp", "cp"))
    dp, vp, mb, gb = (int(resolved.get(k) or 1) for k in ("dp", "vp", "micro_batch", "global_batch"))
    if given.get("dp") is not None and tp * pp * cp * dp != n:
        product = f"{{2}} {tp} x {{3}} {pp} x {{4}} {cp} x {{1}} {dp} = {tp * pp * cp * dp}"
        raise FieldError(
            f"{{0}} {n} contradicts {product}; leave {{1}} out to derive it", "n_gpus", "dp", "tp", "pp", "cp"
        )
    if gb % (mb * dp):
        raise FieldError(f"{{0}} {gb} is not a multiple of {{1}} x dp = {mb} x {dp}", "global_batch", "micro_batch")
    if vp > 1 and pp == 1:
        raise FieldError(f"{{0}} {vp} needs {{1}} > 1 (interleaving splits a pipeline stage into chunks)", "vp", "pp")
    seq = int(resolved.get("seq_len") or 0)
    if cp > 1 and seq % (2 * cp):  # simulate's Infeasible.SEQ_DIVIDE flags the same in a sweep
        raise FieldError(f"{{0}} {seq} is not a multiple of 2 x {{1}} = {2 * cp} (load-balanced causal context "
                         "parallelism cuts each sequence into 2 x cp chunks)", "seq_len", "cp")  # fmt: skip
    n_micro = gb // (mb * dp)
    if vp > 1 and n_micro % pp:  # simulate's Infeasible.SCHEDULE flags the same in a sweep
        raise FieldError(
            f"{{0}} {gb} / ({{1}} {mb} x dp {dp}) = {n_micro} micro-batches is not a multiple of {{2}} {pp}, "
            "which the interleaved schedule needs (Megatron-Core refuses a last group of fewer than pp "
            "micro-batches: megatron/core/pipeline_parallel/schedules.py @ d98e8a64)",
            "global_batch",
            "micro_batch",
            "pp",
        )
    layers = int(model.get("layers", 0) or 0) + int(model.get("mtp_layers", 0) or 0)
    if vp > 1 and layers and not bool(_compiled("interleave")(layers, pp * vp)):
        raise FieldError(
            f"{{0}} {pp} and {{1}} {vp} do not split the model's {layers} layers into equal chunks "
            f"(interleaving needs layers, layers+1 or layers+2 divisible by pp*vp = {pp * vp}: "
            "Megatron-LM may count the embedding and the loss as one layer each)",
            "pp",
            "vp",
        )
    if resolved.get("dualpipe"):  # simulate's Infeasible.SCHEDULE flags the same in a sweep
        check_dualpipe(pp, vp, n_micro)
    check_stack_plan(resolved, pp, vp)  # and this
    shard = int(resolved.get("shard_group") or 0)
    if shard and (dp * cp) % shard:  # simulate's Infeasible.SHARD_GROUP flags the same in a sweep
        raise FieldError(
            f"{{0}} {shard} does not divide the {dp * cp} data-parallel ranks (dp {dp} x {{1}} {cp})",
            "shard_group",
            "cp",
        )
    check_experts(model, resolved)


def check_inert(model: Mapping[str, Any], given: Mapping[str, Any], resolved: Mapping[str, Any]) -> None:
    """A flag that would change nothing in this plan is a usage error, never silently ignored:
    a host-CPU optimizer step needs the optimizer states on the host (the model steps on the CPU
    only what is offloaded), an explicit pipeline layout needs pipeline stages to lay out, the
    ZeRO-3 gather options need ZeRO-3 and hybrid sharding something sharded, the MoE options
    experts (the all-to-all overlap an expert-parallel group) and MLA's recomputation MLA."""
    if resolved.get("cpu_optimizer") and "optimizer" not in (resolved.get("offload") or {}):
        raise FieldError("{0} steps the optimizer on the host CPU, where its states must be: add {1} optimizer:TIER",
                         "cpu_optimizer", "offload")  # fmt: skip
    if resolved.get("pp_layout") and int(resolved.get("pp") or 1) == 1:
        raise FieldError("{0} places the layers over pipeline stages; it needs {1} > 1", "pp_layout", "pp")
    zero = int(resolved.get("zero") or 0)
    for name, on in (
        ("zero3_prefetch", given.get("zero3_prefetch") is False),  # its default, on, asks nothing
        ("reuse_Mparams", given.get("reuse_Mparams")),
    ):
        if zero < 3 and on:
            raise FieldError(f"{{0}} applies to ZeRO-3's weight gathers; {{1}} is {zero}", name, "zero")
    if zero == 0 and int(resolved.get("shard_group") or 0):
        raise FieldError("{0} shards the ZeRO / FSDP states over groups; {1} 0 shards nothing", "shard_group", "zero")
    precision = str(resolved.get("precision") or "bf16")
    low = [p.label for p in LOW_PRECISION]
    if resolved.get("fp8_attention") and precision not in low:
        raise FieldError(
            f"{{0}} needs {{1}} {', '.join(low[:-1])} or {low[-1]}, got {precision} (Transformer Engine runs "
            "attention in FP8 only inside its FP8 recipe: Megatron-Core's fp8_dot_product_attention)",
            "fp8_attention",
            "precision",
        )
    if resolved.get("fp8_attention") and resolved.get("attention") == Attention.MATERIALIZED.label:
        raise FieldError("{0} runs in cuDNN's fused attention kernel; {1} materialized is not one", "fp8_attention",
                         "attention")  # fmt: skip
    if not int(model.get("kv_lora_rank", 0) or 0) and resolved.get("mla_up_proj"):
        raise FieldError("{0} recomputes MLA's up projections; the model has no multi-head latent attention",
                         "mla_up_proj")  # fmt: skip
    experts = int(model.get("n_experts", 0) or 0) > 1
    moe = {"ep_overlap": bool(resolved.get("ep_overlap")), "fused_experts": bool(resolved.get("fused_experts")),
           "dispatcher": (resolved.get("dispatcher") or DEFAULTS["dispatcher"]) != DEFAULTS["dispatcher"]}  # fmt: skip
    moe["moe_imbalance"] = float(resolved.get("moe_imbalance") or 1.0) != 1.0
    for name in [k for k, on in moe.items() if on and not experts]:
        raise FieldError("{0} applies to the routed experts; the model has none", name)
    ep = int(resolved.get("ep") or 1)
    if moe["ep_overlap"] and ep == 1:
        raise FieldError("{0} overlaps the expert-parallel all-to-all; {1} 1 has none", "ep_overlap", "ep")
    if moe["dispatcher"] and ep == 1:
        raise FieldError("{0} dispatches tokens over expert-parallel ranks; {1} 1 sends none", "dispatcher", "ep")
    imbalance = float(resolved.get("moe_imbalance") or 1.0)
    if experts and (imbalance > ep or (ep == 1 and imbalance != 1.0)):  # the busiest of ep ranks
        raise FieldError(f"{{0}} {imbalance:g} is the busiest of {{1}} {ep} ranks' tokens over the mean: "
                         f"between 1 and {ep}", "moe_imbalance", "ep")  # fmt: skip


def _resolved(plan: Mapping[str, Any], plan_s: Any) -> dict[str, Any]:
    """The options as given, with the registry's derived values filled in (dp, sp, cpu_optimizer)
    and a boolean left unset shown as its default (``zero3_prefetch`` is on unless turned off)."""
    out = dict(plan)
    for f in FIELDS:
        if f.kind == "bool" and out.get(f.name) is None and isinstance(f.default, bool):
            out[f.name] = f.default
    if out.get("dp") in (None, AUTO):
        out["dp"] = int(round(float(plan_s.dp)))
    out["sp"] = resolve_sp(out.get("sp"), plan.get("tp") or 1)
    out["offload"] = dict(out.get("offload") or {})
    out["cpu_optimizer"] = resolve_cpu_optimizer(out.get("cpu_optimizer"), "optimizer" in out["offload"])
    return out


def evaluate(model: str | Mapping[str, Any], gpu: str | None = None, **options: Any):
    """Evaluate one configuration and return its :class:`~hetersim.simulate.Breakdown`.

    ``model``: a catalog key (``"llama3-70b"``), a Hugging Face ``config.json`` path, or a dict of
    dimensions (``layers``, ``hidden``, ``heads``, ...). ``gpu``: a catalog key; or
    ``cluster="h100-sxm-80gb:256,h200-sxm-141gb:256"`` with ``hetero="pipeline"|"data"``. Plan
    fields (:data:`hetersim.planfields.FIELDS`) by name, with the CLI's defaults: ``n_gpus``,
    ``global_batch`` required; ``seq_len`` the model's; ``dp = n_gpus/(tp*pp*cp)``; sequence
    parallelism on when ``tp > 1``. Also ``catalog`` (extra TOML files or a Catalog),
    ``overrides`` (GPU entry fields), ``cxl_expander``, ``cxl_pool``, ``cxl_p2p``.

    >>> import hetersim
    >>> out = hetersim.evaluate("llama3-70b", "h200-sxm-141gb", n_gpus=512, tp=8, pp=4, global_batch=512)
    >>> float(out.step_time_s) > 0
    True
    """
    return configure(model=model, gpu=gpu, **options).breakdown
