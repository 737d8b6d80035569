"""Plan rules checked where a plan enters (the API, plan files, studies), each a one-line
:class:`~hetersim.types.FieldError` naming the fields; the traced model flags the same rules of a
sweep's points as data (:mod:`hetersim.simulate`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .types import FieldError


def check_dualpipe(pp: int, vp: int, n_micro: int) -> None:
    """DualPipe's own rules (:func:`hetersim.terms.schedule.dualpipe_bad` flags the same in a sweep)."""
    if pp < 2 or pp % 2 or vp > 1:
        raise FieldError(f"{{0}} needs an even {{1}} >= 2 and {{2}} 1 (got {pp} and {vp})", "dualpipe", "pp", "vp")
    if n_micro % 2 or n_micro < 2 * pp:
        raise FieldError(
            f"{{0}} needs an even number of at least 2 x {{1}} = {2 * pp} micro-batches; {{2}} / ({{3}} x dp) "
            f"gives {n_micro} (deepseek-ai/DualPipe DualPipe.step)",
            "dualpipe",
            "pp",
            "global_batch",
            "micro_batch",
        )


def check_stack_schedule(
    stack: Any, pp: int, vp: int, stages: bool = False, dualpipe: bool = False, zero: int = 0
) -> None:
    """A pipeline the plan's stack does not have (its profile's ``pipeline`` fact; DualPipe needs a
    stack whose schedules are more than 1F1B) or does not run with the plan's ZeRO stage (the
    ``pipeline_zero1`` fact): :func:`hetersim.terms.stackrules.stack_schedule_bad` flags the same in a
    sweep. ``stages``: ``pp`` is a plan file's count of stages, not a field."""
    from . import stacks
    from .types import Stack

    name = str(stack or Stack.MEGATRON.label)
    if name not in Stack.names():
        return  # an unknown stack is named by the field's own check
    kind = stacks.profile(name).pipeline
    where = "(its profile's pipeline fact, hetersim/catalog/stacks.toml)"
    if pp > 1 and kind == "none":
        if stages:
            raise FieldError(f"{{0}} {name} has no pipeline parallelism {where}; the plan has {pp} stages", "stack")
        raise FieldError(f"{{0}} {name} has no pipeline parallelism {where}; {{1}} must be 1, got {pp}", "stack", "pp")
    what = "no pipeline parallelism" if kind == "none" else "no interleaved pipeline schedule, 1F1B only"
    if vp > 1 and kind != "interleaved":
        raise FieldError(f"{{0}} {name} has {what} {where}; {{1}} must be 1, got {vp}", "stack", "vp")
    if dualpipe and kind != "interleaved":
        raise FieldError(f"{{0}} {name} has {what} {where}; leave {{1}} out", "stack", "dualpipe")
    if pp > 1 and zero >= 2 and stacks.profile(name).pipeline_zero1:
        pipe, names = (f"{pp} stages", ()) if stages else (f"{{2}} {pp}", ("pp",))
        raise FieldError(
            f"{{0}} {name}'s pipeline engine runs ZeRO stages 0 and 1 only ('ZeRO-2 and ZeRO-3 are incompatible "
            f"with pipeline parallelism'; its profile's pipeline_zero1 fact); with {pipe}, {{1}} must be 0 or 1, "
            f"got {zero}",
            "stack",
            "zero",
            *names,
        )


def check_stack_plan(plan: Mapping[str, Any], pp: int, vp: int, stages: bool = False, model=None) -> None:
    """:func:`check_stack_schedule` of a plan's fields (its stack, DualPipe and ZeRO stage),
    :func:`check_stack_features` (its context parallelism and precision) and, given the ``model``'s
    entry, :func:`check_stack_experts`."""
    dualpipe, zero = bool(plan.get("dualpipe")), int(plan.get("zero") or 0)
    check_stack_schedule(plan.get("stack"), pp, vp, stages, dualpipe, zero)
    check_stack_features(plan.get("stack"), int(plan.get("cp") or 1), plan.get("precision"))
    if model is not None:
        check_stack_experts(plan, model)


def check_plan_search(plan: Mapping[str, Any], model: Mapping[str, Any] | None = None) -> None:
    """What a plan search (``hetersim plan``, a plan study) cannot lay out, context parallelism (its
    candidates have no context-parallel group), or its stack cannot run (:func:`check_stack_features`;
    with the ``model``'s catalog entry, :func:`check_stack_experts`)."""
    if int(plan.get("cp") or 1) > 1:
        what = "the plan search lays out TP, PP and DP; write cp into a plan file for evaluate --plan"
        raise FieldError(f"{{0}}: {what}", "cp")
    from .planfields import DEFAULTS

    # A plan that names no precision trains in the default one (bf16), as evaluate resolves it.
    check_stack_features(plan.get("stack"), 1, plan.get("precision") or DEFAULTS["precision"])
    if model is not None:
        check_stack_experts(plan, model)
        from .api import check_inert  # the search lays out ep 1: what needs an expert-parallel group is inert

        moe = {k: plan.get(k) for k in ("ep", "ep_overlap", "dispatcher", "moe_imbalance", "fused_experts")}
        check_inert(model, moe, moe)


def check_stack_features(stack: Any, cp: int, precision: Any) -> None:
    """Context parallelism, an 8-bit-class precision or bf16 that the plan's stack does not have (its
    profile's ``context_parallel``, ``fp8`` and ``bf16`` facts): :func:`hetersim.terms.stackrules.stack_feature_bad`
    flags the same in a sweep (``Infeasible.STACK``)."""
    from . import stacks
    from .types import LOW_PRECISION, Stack

    name = str(stack or Stack.MEGATRON.label)
    if name not in Stack.names():
        return  # an unknown stack is named by the field's own check
    prof, where = stacks.profile(name), "hetersim/catalog/stacks.toml"
    if cp > 1 and not prof.context_parallel:
        raise FieldError(
            f"{{0}} {name} has no context parallelism (its profile's context_parallel fact, {where}); "
            f"{{1}} must be 1, got {cp}",
            "stack",
            "cp",
        )
    low = [p.label for p in LOW_PRECISION]
    label = str(getattr(precision, "label", precision)).strip().lower()  # a runs CSV may write FP8
    fact = "fp8" if label in low else "bf16" if label == "bf16" else None
    if fact is not None and not getattr(prof, fact):
        what = "no 8-bit precision" if fact == "fp8" else "no bf16"
        has = {"bf16": prof.bf16, **dict.fromkeys(low, prof.fp8)}
        allowed = [p for p in ("bf16", "fp16", "fp32", *low) if has.get(p, True)]
        raise FieldError(
            f"{{0}} {name} trains in {what} (its profile's {fact} fact, {where}); {{1}} must be "
            f"{', '.join(allowed[:-1])} or {allowed[-1]}, got {label}",
            "stack",
            "precision",
        )


def check_stack_experts(plan: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """A ``model`` (its catalog entry) with experts on a ``plan``'s stack that has no mixture-of-experts
    layer (its profile's ``experts`` fact is ``none``), or ``ep`` or ``etp`` > 1 on one without expert
    parallelism (``expert_parallel``; the experts' own tensor parallelism came with Megatron-Core's
    MoE parallel folding): :func:`hetersim.terms.stackrules.stack_feature_bad` flags the same in a
    sweep (``Infeasible.STACK``)."""
    from . import stacks
    from .types import Stack

    name = str(plan.get("stack") or Stack.MEGATRON.label)
    if name not in Stack.names():
        return  # an unknown stack is named by the field's own check
    prof, where = stacks.profile(name), "hetersim/catalog/stacks.toml"
    experts, ep, etp = (int(m.get(k) or 0) for m, k in ((model, "n_experts"), (plan, "ep"), (plan, "etp")))
    if experts > 1 and prof.experts == "none":
        raise FieldError(
            f"{{0}} {name} has no mixture-of-experts layer (its profile's experts fact, {where}); the model has "
            f"{experts} experts: pick a stack that has them",
            "stack",
        )
    for field, value in (("ep", ep), ("etp", etp)):
        if value > 1 and not prof.expert_parallel:
            raise FieldError(
                f"{{0}} {name} has no expert parallelism (its profile's expert_parallel fact, {where}); {{1}} must "
                f"be 1, got {value}",
                "stack",
                field,
            )


def check_experts(model: Mapping[str, Any], resolved: Mapping[str, Any]) -> None:
    """A :class:`FieldError` for an expert-parallel layout Megatron-Core refuses
    (:func:`hetersim.simulate.expert_layout_bad` flags the same in a sweep), or one the plan's stack
    cannot run (:func:`check_stack_experts`)."""
    ep, etp = int(resolved.get("ep") or 1), int(resolved.get("etp") or 1)
    tp, cp, dp = (int(resolved.get(k) or 1) for k in ("tp", "cp", "dp"))
    experts = int(model.get("n_experts", 0) or 0)
    check_stack_experts(resolved, model)
    if experts <= 1:
        if ep > 1 or etp > 1:  # named by the fields that ask for expert parallelism, not a default 1
            wrong = [(name, v) for name, v in (("ep", ep), ("etp", etp)) if v > 1]
            text = " and ".join(f"{{{i}}} {v}" for i, (_, v) in enumerate(wrong))
            raise FieldError(f"{text}: the model has no experts (use 1)", *(name for name, _ in wrong))
        return
    if experts % ep:
        raise FieldError(f"{{0}} {ep} does not divide the model's {experts} experts", "ep")
    if (tp * cp * dp) % (ep * etp):
        raise FieldError(
            f"{{0}} {ep} x {{1}} {etp} = {ep * etp} expert ranks do not tile the {tp * cp * dp} ranks of a "
            f"pipeline stage ({{2}} {tp} x {{3}} {cp} x dp {dp})",
            "ep",
            "etp",
            "tp",
            "cp",
        )
    width = int(model.get("moe_ffn_hidden", 0) or 0)
    if width % etp:
        raise FieldError(f"{{0}} {etp} does not divide the expert FFN width {width}", "etp")
    if tp > 1 and not resolved.get("sp"):
        raise FieldError(f"an MoE model with {{0}} {tp} needs sequence parallelism (Megatron-Core requires it)", "tp")


def cluster_keys(cat, counts: Mapping[str, int]) -> dict[str, int]:
    """A cluster's GPU counts by catalog key (a kind named by an alias counted as its key)."""
    out: dict[str, int] = {}
    for kind, n in counts.items():
        try:
            key = cat.key("gpus", kind)
        except ValueError:  # named by the plan's own check
            key = kind
        out[key] = out.get(key, 0) + n
    return out


def check_plan_file(hp: Any, model: Mapping[str, Any], options: Mapping[str, Any], seq: int, origin: str) -> None:
    """What :func:`hetersim.api.check_layout` refuses of a one-kind plan, for a heterogeneous plan
    file (the engine flagged it as an infeasible point): context parallelism that does not cut the
    sequence into ``2 x cp`` chunks, and each replica's expert layout (:func:`check_experts`) over
    its stage's data-parallel group, the replicas of every pipeline copy's stage holding the same
    first layer (:func:`hetersim.hsim._dp_groups`)."""
    from .planfields import DEFAULTS

    cp = int(options.get("cp") or 1)
    depth, vp = max(len(p.stages) for p in hp.pipelines), int(options.get("vp") or 1)
    # A plan that names no precision trains in the default one (bf16), as the engine resolves it.
    check_stack_plan({**options, "precision": options.get("precision") or DEFAULTS["precision"]}, depth, vp, True)
    if vp > 1 and depth < 2:
        raise FieldError(f"{{0}} {vp} needs a plan of more than one stage (interleaving splits each stage)", "vp")
    if cp > 1 and seq % (2 * cp):
        raise FieldError(f"{{0}} {seq} is not a multiple of 2 x {{1}} = {2 * cp} (load-balanced causal context "
                         "parallelism cuts each sequence into 2 x cp chunks)", "seq_len", "cp")  # fmt: skip
    for j, p in enumerate(hp.pipelines):
        for i, stage in enumerate(p.stages):
            where = f"{origin} stage {i}" if len(hp.pipelines) == 1 else f"{origin} pipeline {j} stage {i}"
            dp = _group_size(hp, p, i)
            for rep in stage.replicas:
                resolved = {**options, "tp": rep.tp, "cp": cp, "dp": dp, "sp": _sp(options.get("sp"), rep.tp)}
                try:
                    check_experts(model, resolved)
                except FieldError as error:
                    raise ValueError(f"{where}: {error}") from None


def _group_size(hp: Any, pipeline: Any, i: int) -> int:
    """Replicas holding stage ``i``'s first layer over every pipeline copy; where a pipeline leaves
    its layers to the balance, the stage's own replicas over its copies (the engine knows more)."""
    if any(s.layers is None for q in hp.pipelines for s in q.stages):
        return pipeline.count * sum(r.count for r in pipeline.stages[i].replicas)
    first = sum(s.layers for s in pipeline.stages[:i])
    n = 0
    for q in hp.pipelines:
        lo = 0
        for s in q.stages:
            if lo <= first < lo + s.layers or (s.layers == 0 and lo == first):
                n += q.count * sum(r.count for r in s.replicas)
                break
            lo += s.layers
    return max(n, 1)


def _sp(value: Any, tp: int) -> bool:
    from .planfields import resolve_sp

    return bool(resolve_sp(value, tp))


def keyed(cat: Any, hp: Any) -> Any:
    """``hp`` with each replica's kind as its catalog key (an alias compared with the cluster's
    key named two kinds); a kind the catalog lacks is left for the plan's own check to name."""
    import dataclasses

    def key(kind: str) -> str:
        try:
            return cat.key("gpus", kind)
        except ValueError:
            return kind

    pipes = tuple(
        dataclasses.replace(p, stages=tuple(
            dataclasses.replace(s, replicas=tuple(dataclasses.replace(r, gpu=key(r.gpu)) for r in s.replicas))
            for s in p.stages
        ))
        for p in hp.pipelines
    )  # fmt: skip
    return dataclasses.replace(hp, pipelines=pipes)


def file_value(field: Any, value: Any) -> Any:
    """:func:`hetersim.planfields.leaf_value` of a plan field's value that a file gives: a file writes a
    count as an integer (``4``, not ``4.0``) and a switch as true or false (not ``1``), as a plan
    file's stages do (a value a program computes may be a whole float)."""
    from .planfields import leaf_value, rule

    if {"int": not isinstance(value, int), "bool": not isinstance(value, bool)}.get(field.kind, False):
        what = "true or false" if field.kind == "bool" else rule(field.name)
        raise ValueError(f"{field.name} must be {what}; got {value!r}")
    return leaf_value(field, value)
