"""Heterogeneous plans: per pipeline stage its layers, per replica of the stage its device kind
and tensor-parallel degree (host side: the file format, its checks, the shorthands).

A plan is one or more **pipelines** (data-parallel copies of the whole model; a pipeline may
be repeated ``count`` times), each a list of **stages** in order, each stage holding
``layers`` transformer layers (0: an embedding-only first or head-only last stage; a middle
stage with none holds no parameters and is flagged infeasible, ``hsim``) and one or more
**replica groups**: ``count`` replicas of the stage on device kind ``gpu`` with tensor
parallelism ``tp``. Replicas of one stage may sit on different kinds and use different TP
degrees — data parallelism across kinds inside a stage (Cephalo, AMP's rank-ordered
placements) — and pipelines may split the layers differently (FlashFlex/HexiScale). The first
stage of every pipeline holds the embedding and the last the LM head and loss.

The batch is ``global_batch / micro_batch`` micro-batches of ``micro_batch`` sequences. They
are shared among the pipelines, and within a pipeline every stage shares them among its
replicas, each replica taking whole micro-batches: ``equal`` shares (what Megatron-LM and
DeepSpeed do: every data-parallel rank takes the same number), ``speed`` (as many as let every
replica finish together: Cephalo's and HetPipe's balancing), or a number given per replica /
pipeline (``micro_batches``). Layers not given per stage are balanced by speed.

File format (TOML, or JSON with the same keys)::

    global_batch = 64          # and any other plan field (precision, zero, stack, ...)
    micro_batch = 2
    balance = "equal"          # or "speed": micro-batch shares not given below
    cluster = "v100-sxm-16gb:8,t4-16gb:8"   # optional: the GPUs there are (else: what it uses)

    [[stage]]                  # one pipeline; [[pipeline]] + [[pipeline.stage]] for several
    layers = 12
    replicas = [{ gpu = "v100-sxm-16gb", tp = 4, count = 2 }]
    [[stage]]
    layers = 12
    gpu = "t4-16gb"            # one replica group written in the stage itself
    tp = 2
    dp = 4

:func:`to_arrays` gives the padded arrays :mod:`hetersim.hsim` evaluates (a batch of plans pads
to the largest).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import jsontext, tomltext
from .types import decimal_digits, whole_number

BALANCE = ("equal", "speed")
# Plan fields a heterogeneous plan sets per replica or derives from its structure.
STRUCTURAL = ("n_gpus", "tp", "pp", "dp")
_TOP = {"cluster", "balance", "link", "stage", "pipeline"}
_PIPE = {"stage", "count", "micro_batches"}
_STAGE = {"layers", "replicas", "gpu", "tp", "dp", "count"}
_REPLICA = {"gpu", "tp", "count", "micro_batches"}


@dataclasses.dataclass(frozen=True)
class Replica:
    gpu: str  # a device kind of the cluster (catalog key)
    tp: int = 1
    count: int = 1  # identical replicas of the stage on this kind
    micro_batches: int | None = None  # per replica and step; None: the plan's balance


@dataclasses.dataclass(frozen=True)
class Stage:
    layers: int | None  # None: balanced by speed (then no stage of the pipeline gives it)
    replicas: tuple[Replica, ...]

    @property
    def gpus(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.replicas:
            out[r.gpu] = out.get(r.gpu, 0) + r.count * r.tp
        return out


@dataclasses.dataclass(frozen=True)
class Pipeline:
    stages: tuple[Stage, ...]
    count: int = 1  # identical copies (data-parallel replicas of the whole pipeline)
    micro_batches: int | None = None  # per copy and step; None: the plan's balance


@dataclasses.dataclass(frozen=True)
class HeteroPlan:
    pipelines: tuple[Pipeline, ...]
    balance: str = "equal"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the common plan fields
    cluster: str | None = None  # "KIND:N,..." the plan runs on (None: the GPUs it uses)
    link: str | None = None  # catalog link between device kinds (None: the slowest kind's scale-out)

    def gpus(self) -> dict[str, int]:
        """GPUs of each kind the plan uses (cp included: every replica has ``tp * cp`` GPUs)."""
        cp = int(self.options.get("cp", 1) or 1)
        out: dict[str, int] = {}
        for p in self.pipelines:
            for s in p.stages:
                for k, n in s.gpus.items():
                    out[k] = out.get(k, 0) + n * cp * p.count
        return out

    def kinds(self) -> list[str]:
        seen: list[str] = []
        for p in self.pipelines:
            for s in p.stages:
                for r in s.replicas:
                    if r.gpu not in seen:
                        seen.append(r.gpu)
        return seen

    def as_dict(self) -> dict[str, Any]:
        """The plan in the file format (``pipeline`` tables), for ``--plan`` and reports."""
        out: dict[str, Any] = {k: _plain(v) for k, v in self.options.items()}
        out["balance"] = self.balance
        if self.cluster:
            out["cluster"] = self.cluster
        if self.link:
            out["link"] = self.link
        pipes = []
        for p in self.pipelines:
            stages = []
            for s in p.stages:
                reps = []
                for r in s.replicas:
                    rep: dict[str, Any] = {"gpu": r.gpu, "tp": r.tp, "count": r.count}
                    if r.micro_batches is not None:
                        rep["micro_batches"] = r.micro_batches
                    reps.append(rep)
                stage: dict[str, Any] = {"replicas": reps}
                if s.layers is not None:
                    stage = {"layers": s.layers, **stage}
                stages.append(stage)
            pipe: dict[str, Any] = {"count": p.count, "stage": stages}
            if p.micro_batches is not None:
                pipe["micro_batches"] = p.micro_batches
            pipes.append(pipe)
        out["pipeline"] = pipes
        return out


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


# --------------------------------------------------------------------------------------------
# Reading a plan file
# --------------------------------------------------------------------------------------------


def read_plan_file(path: str | Path) -> HeteroPlan:
    """A plan file (``.toml`` or ``.json``) -> :class:`HeteroPlan`; one-line ``ValueError``
    naming the file, the stage and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ValueError(f"{path}: cannot read plan file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text (UTF-8) plan file") from None
    try:
        data = jsontext.loads(text) if path.suffix.lower() == ".json" else tomltext.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise ValueError(f"{path}: not valid {kind} ({str(e).splitlines()[0]})") from None
    return parse_plan(data, origin=str(path))


def _int(where: str, key: str, value: Any, low: int = 1) -> int:
    if isinstance(value, float) or not whole_number(value, low):  # 2.0 is a slip, as in a study
        raise ValueError(f"{where}: {key} must be an integer >= {low}; got {value!r}")
    return int(value)


def _keys(where: str, table: Any, allowed: set[str], what: str) -> Mapping[str, Any]:
    """``table`` is a table whose keys are all ``allowed``."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: must be a table of {what}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    return table


def _replica(where: str, table: Any) -> Replica:
    table = _keys(where, table, _REPLICA, "replica keys")
    if not isinstance(table.get("gpu"), str) or not table["gpu"].strip():
        raise ValueError(f"{where}: gpu must name a device kind (a catalog key)")
    mb = table.get("micro_batches")
    return Replica(
        gpu=table["gpu"].strip(),
        tp=_int(where, "tp", table.get("tp", 1)),
        count=_int(where, "count", table.get("count", 1)),
        micro_batches=None if mb is None else _int(where, "micro_batches", mb),
    )


def _stage(where: str, table: Any) -> Stage:
    table = _keys(where, table, _STAGE, "stage keys")
    layers = table.get("layers")
    layers = None if layers is None else _int(where, "layers", layers, low=0)
    inline = {k for k in ("gpu", "tp", "dp", "count") if k in table}
    if "replicas" in table and inline:
        raise ValueError(f"{where}: give replicas or {sorted(inline)[0]} (one replica group), not both")
    if "replicas" in table:
        reps = table["replicas"]
        if not isinstance(reps, list) or not reps:
            raise ValueError(f"{where}: replicas must be a non-empty list of tables (gpu, tp, count)")
        replicas = tuple(_replica(f"{where} replica {i}", r) for i, r in enumerate(reps))
    elif "gpu" in table:
        if "dp" in table and "count" in table:
            raise ValueError(f"{where}: dp and count both give the replicas of the stage; give one")
        one = {"gpu": table["gpu"], "tp": table.get("tp", 1), "count": table.get("dp", table.get("count", 1))}
        replicas = (_replica(where, one),)
    else:
        raise ValueError(f"{where}: needs replicas = [{{gpu = KIND, tp = N, count = N}}, ...] or gpu = KIND")
    return Stage(layers=layers, replicas=replicas)


def _pipeline(where: str, table: Any) -> Pipeline:
    table = _keys(where, table, _PIPE, "pipeline keys")
    stages = table.get("stage")
    if not isinstance(stages, list) or not stages:
        raise ValueError(f"{where}: needs at least one [[stage]] (or [[pipeline.stage]]) table")
    out = tuple(_stage(f"{where} stage {i}", s) for i, s in enumerate(stages))
    given = [s.layers is not None for s in out]
    if any(given) and not all(given):
        i = given.index(False)
        raise ValueError(f"{where} stage {i}: layers missing; give layers for every stage or for none (balanced)")
    mb = table.get("micro_batches")
    return Pipeline(
        stages=out,
        count=_int(where, "count", table.get("count", 1)),
        micro_batches=None if mb is None else _int(where, "micro_batches", mb),
    )


def parse_plan(data: Mapping[str, Any], origin: str = "plan") -> HeteroPlan:
    """A plan from its file's tables (see the module docstring)."""
    from . import planfields

    if not isinstance(data, Mapping):
        raise ValueError(f"{origin}: must be a table")
    has_stage, has_pipe = "stage" in data, "pipeline" in data
    if has_stage == has_pipe:
        raise ValueError(f"{origin}: give [[stage]] tables (one pipeline) or [[pipeline]] tables, exactly one of them")
    options = {k: v for k, v in data.items() if k not in _TOP}
    for k in options:
        if k in STRUCTURAL:
            raise ValueError(
                f"{origin}: {k} is set by the plan's structure (tp per replica, pp by the stages, dp by the "
                "replicas, n_gpus by their sum); remove it"
            )
        if k not in planfields.BY_NAME:
            allowed = sorted(_TOP | (set(planfields.BY_NAME) - set(STRUCTURAL)))
            raise ValueError(f"{origin}: unknown key {k!r}; allowed: {', '.join(allowed)}")
    balance = data.get("balance", "equal")
    if balance not in BALANCE:
        raise ValueError(f"{origin}: balance must be one of {', '.join(BALANCE)}; got {balance!r}")
    if has_stage:
        pipes = (_pipeline(origin, {"stage": data["stage"]}),)
    else:
        raw = data["pipeline"]
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{origin}: pipeline must be a list of [[pipeline]] tables")
        pipes = tuple(_pipeline(f"{origin} pipeline {i}", p) for i, p in enumerate(raw))
    for key in ("cluster", "link"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{origin}: {key} must be a string; got {data[key]!r}")
    if "cluster" in data:
        try:
            parse_cluster_groups(data["cluster"])
        except ValueError as e:
            raise ValueError(f"{origin}: {e}") from None
    check_options(origin, options)
    hp = HeteroPlan(pipes, balance, options, data.get("cluster"), data.get("link"))
    if (n := sum(hp.gpus().values())) > (most := int(planfields.BY_NAME["n_gpus"].hi)):
        raise ValueError(f"{origin}: the plan puts {n:,} GPUs to work; at most {most:,}")
    return hp


def check_options(origin: str, options: Mapping[str, Any], prefix: str = "") -> None:
    """Each plan field's value in its range, named where it is (``prefix``: the table it sits in),
    written as a file writes it (:func:`hetersim.planrules.file_value`)."""
    from . import planfields, planrules

    for key, value in options.items():
        if value == planfields.AUTO and planfields.BY_NAME[key].default == planfields.AUTO:
            continue  # derived by the field's rule (sp: on when tp > 1)
        try:
            planrules.file_value(planfields.BY_NAME[key], value)
        except ValueError as e:
            raise ValueError(f"{origin}: {prefix}{e}") from None


# --------------------------------------------------------------------------------------------
# Checks against the model and the cluster
# --------------------------------------------------------------------------------------------


def check(plan: HeteroPlan, model: Mapping[str, Any], cluster: Mapping[str, int], origin: str = "plan") -> None:
    """One-line ``ValueError`` naming the pipeline, stage and field: stages that do not cover the
    model's layers, a replica on a kind the cluster lacks, TP that does not divide the heads or
    the widths, more GPUs of a kind than the cluster has, micro-batch shares that do not add up."""
    layers = int(model.get("layers", 0) or 0) + int(model.get("mtp_layers", 0) or 0)
    heads, kv = int(model.get("heads", 0) or 0), int(model.get("kv_heads", 0) or model.get("heads", 0) or 0)
    hidden, ffn = int(model.get("hidden", 0) or 0), int(model.get("ffn_hidden", 0) or 0)
    mb = int(plan.options.get("micro_batch", 1) or 1)
    gb = plan.options.get("global_batch")
    total_mb = None if gb is None else int(gb) // mb
    if gb is not None and int(gb) % mb:
        raise ValueError(f"{origin}: global_batch {gb} is not a multiple of micro_batch {mb}")
    for j, p in enumerate(plan.pipelines):
        pwhere = origin if len(plan.pipelines) == 1 else f"{origin} pipeline {j}"
        if p.stages[0].layers is not None:
            got = sum(s.layers or 0 for s in p.stages)
            if got != layers:
                raise ValueError(
                    f"{pwhere}: the stages' layers sum to {got}; the model has {layers} (stage layers must cover them)"
                )
        elif len(p.stages) > layers:
            raise ValueError(f"{pwhere}: {len(p.stages)} stages for the model's {layers} layers")
        for i, s in enumerate(p.stages):
            swhere = f"{pwhere} stage {i}"
            for r, rep in enumerate(s.replicas):
                rwhere = swhere if len(s.replicas) == 1 else f"{swhere} replica {r}"
                if rep.gpu not in cluster:
                    raise ValueError(f"{rwhere}: gpu {rep.gpu!r} is not a kind of the cluster ({', '.join(cluster)})")
                if heads and (heads % rep.tp or kv % rep.tp):
                    raise ValueError(f"{rwhere}: tp {rep.tp} does not divide the model's {heads} heads / {kv} KV heads")
                if (hidden and hidden % rep.tp) or (ffn and ffn % rep.tp):
                    raise ValueError(f"{rwhere}: tp {rep.tp} does not divide the hidden size {hidden} / FFN {ffn}")
            given = [rep.micro_batches for rep in s.replicas]
            if any(g is not None for g in given) and not all(g is not None for g in given):
                raise ValueError(f"{swhere}: micro_batches given for some replicas only; give it for all or none")
            if all(g is not None for g in given) and p.micro_batches is not None:
                got = sum(g * rep.count for g, rep in zip(given, s.replicas, strict=True))
                if got != p.micro_batches:
                    raise ValueError(
                        f"{swhere}: replicas' micro_batches sum to {got}; the pipeline takes {p.micro_batches}"
                    )
    fixed = [p for p in plan.pipelines if p.micro_batches is not None]
    if fixed and len(fixed) < len(plan.pipelines):  # as for a stage's replicas: the rest were dealt equally
        raise ValueError(f"{origin}: micro_batches given for some pipelines only; give it for all or none")
    if total_mb is not None:
        if len(fixed) == len(plan.pipelines):
            got = sum(p.micro_batches * p.count for p in fixed)
            if got != total_mb:
                raise ValueError(
                    f"{origin}: pipelines' micro_batches sum to {got}; global_batch/micro_batch is {total_mb}"
                )
    if total_mb is not None:
        _check_shares(plan, total_mb, origin)
    used = plan.gpus()
    for kind, n in used.items():
        if kind in cluster and n > cluster[kind]:
            raise ValueError(f"{origin}: the plan puts {n} GPUs on {kind}; the cluster has {cluster[kind]}")


def _check_shares(plan: HeteroPlan, total_mb: int, origin: str) -> None:
    """Whole micro-batches for every replica, as :func:`hetersim.hsim._share_microbatches` deals
    them: ``equal`` shares over the copies, then a stage's replicas, come out whole; no replica is
    left without one (under ``speed``: a copy's widest stage has at most its share)."""
    given = all(p.micro_batches is not None for p in plan.pipelines)
    copies = sum(p.count for p in plan.pipelines)
    equal = plan.balance == "equal"
    fix = 'give micro_batches or balance = "speed"'
    if not given and equal and total_mb % copies:
        what = f"{total_mb} micro-batches (global_batch / micro_batch)"
        raise ValueError(f"{origin}: {what} do not split equally over {copies} pipeline copies; {fix}")
    if not (given or equal):
        need = sum(p.count * max(sum(r.count for r in s.replicas) for s in p.stages) for p in plan.pipelines)
        if need > total_mb:
            raise ValueError(f"{origin}: {total_mb} micro-batches for {need} replicas leave a replica without one")
        return
    for j, p in enumerate(plan.pipelines):
        n = p.micro_batches if given else total_mb // copies
        for i, s in enumerate(p.stages):
            reps = sum(r.count for r in s.replicas)
            where = f"{origin} stage {i}" if len(plan.pipelines) == 1 else f"{origin} pipeline {j} stage {i}"
            got = [r.micro_batches * r.count for r in s.replicas if r.micro_batches is not None]
            if len(got) == len(s.replicas) and sum(got) != n:  # the stage must take the pipeline's all
                raise ValueError(f"{where}: replicas' micro_batches sum to {sum(got)}; the pipeline takes {n}")
            if got:
                continue
            if n < reps:
                raise ValueError(f"{where}: {n} micro-batches for {reps} replicas leave a replica without one")
            if equal and n % reps:
                raise ValueError(f"{where}: {n} micro-batches do not split equally over its {reps} replicas; {fix}")


def parse_cluster_groups(text: str) -> list[tuple[str, int]]:
    """``"KIND:N,KIND:N"`` -> ``[(kind, count), ...]`` in order (one-line errors)."""
    from . import planfields

    out = []
    most = int(planfields.BY_NAME["n_gpus"].hi)
    for part in text.split(","):
        kind, sep, count = part.strip().partition(":")
        if not sep or not kind.strip() or not decimal_digits(count.strip()) or not 0 < int(count) <= most:
            raise ValueError(f"cluster: {part.strip()!r} must be KIND:COUNT with a positive count <= {most:,}")
        out.append((kind.strip(), int(count)))
    return out


def parse_cluster_counts(text: str) -> dict[str, int]:
    """``"KIND:N,KIND:N"`` -> ``{kind: count}``, groups of one kind added up."""
    out: dict[str, int] = {}
    for kind, count in parse_cluster_groups(text):
        out[kind] = out.get(kind, 0) + count
    return out


# --------------------------------------------------------------------------------------------
# The shorthands: --cluster with --hetero pipeline|data
# --------------------------------------------------------------------------------------------


def from_shorthand(
    groups: Sequence[tuple[str, int]],
    *,
    tp: int,
    pp: int,
    dp: int,
    cp: int = 1,
    mode: str = "pipeline",
    layers_per_stage: Sequence[int] | None = None,
    n_layers: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> HeteroPlan:
    """The plan ``--cluster KIND:N,... --hetero pipeline|data`` means.

    ``pipeline``: ranks are numbered through the groups in the order given and placed as
    Megatron-LM places them (tensor, context, data, then pipeline: a stage is ``tp*cp*dp``
    consecutive ranks). A stage may straddle two kinds (data parallelism across kinds inside a
    stage, equal shares as the frameworks run it); a replica (a tensor-parallel group) may not.
    Layers: ``layers_per_stage`` one per stage (or one per group, every stage of the group), else
    balanced by speed. ``data``: every group holds whole pipelines of ``pp`` stages on its kind,
    micro-batches balanced by speed; ``layers_per_stage`` one per stage, the same in every copy.
    """
    options = dict(options or {})
    per_replica = tp * cp
    if mode == "data":
        split = _stage_layers(layers_per_stage, pp, n_layers, len(groups), by_group=None)  # every copy alike
        pipes = []
        for kind, count in groups:
            unit = per_replica * pp
            if count % unit:
                raise ValueError(
                    f"cluster group {kind}:{count} does not hold whole replicas (tp*cp*pp = {unit} GPUs each)"
                )
            stages = tuple(Stage(split[i], (Replica(kind, tp, 1),)) for i in range(pp))
            pipes.append(Pipeline(stages, count=count // unit))
        return HeteroPlan(tuple(pipes), "speed", options)
    ranks: list[str] = [kind for kind, count in groups for _ in range(count)]
    if len(ranks) != tp * cp * dp * pp:
        raise ValueError(f"cluster has {len(ranks)} GPUs; tp*cp*dp*pp = {tp * cp * dp * pp}")
    stages = []
    group_of_stage = []
    for s in range(pp):
        block = ranks[s * per_replica * dp : (s + 1) * per_replica * dp]
        reps: dict[str, int] = {}
        for r in range(dp):
            kinds = set(block[r * per_replica : (r + 1) * per_replica])
            if len(kinds) > 1:
                raise ValueError(
                    f"pipeline stage {s} replica {r}: its tp*cp = {per_replica} GPUs span "
                    f"{' and '.join(sorted(kinds))}; "
                    "a tensor- or context-parallel group cannot span two device kinds (change the cluster order or tp)"
                )
            kind = kinds.pop()
            reps[kind] = reps.get(kind, 0) + 1
        stages.append(tuple(Replica(k, tp, n) for k, n in reps.items()))
        group_of_stage.append(next(i for i, (k, _) in enumerate(groups) if k == block[0]))
    split = _stage_layers(layers_per_stage, pp, n_layers, len(groups), by_group=group_of_stage)
    return HeteroPlan((Pipeline(tuple(Stage(split[i], stages[i]) for i in range(pp))),), "equal", options)


def _stage_layers(given, pp, n_layers, n_groups, by_group):
    """Layers of each stage from ``--layers-per-stage`` (one per stage, or one per group when
    ``by_group`` maps stages to groups), or Nones (balanced)."""
    if not given:
        return [None] * pp
    given = [int(x) for x in given]
    if any(x < 0 for x in given):
        raise ValueError("layers_per_stage: every entry must be a non-negative integer")
    if len(given) == pp:
        split = given
    elif by_group is not None and len(given) == n_groups and set(by_group) == set(range(n_groups)):
        split = [given[g] for g in by_group]  # each group starts a stage of its own (none straddled away)
    else:
        per = f" or one per cluster group ({n_groups}), each with stages of its own" if by_group is not None else ""
        raise ValueError(f"layers_per_stage has {len(given)} entries; give one per pipeline stage ({pp}){per}")
    if n_layers is not None and sum(split) != n_layers:
        raise ValueError(f"layers_per_stage gives the stages {sum(split)} layers; the model has {n_layers}")
    return split


# --------------------------------------------------------------------------------------------
# Padded arrays for the traced model
# --------------------------------------------------------------------------------------------


def plan_shape(plans: Sequence[HeteroPlan]) -> tuple[int, int, int]:
    """``(J, S, R)``: the most pipelines, stages of a pipeline and replica groups of a stage of
    any of ``plans``."""
    J = max(len(p.pipelines) for p in plans)
    S = max(len(q.stages) for p in plans for q in p.pipelines)
    R = max(len(s.replicas) for p in plans for q in p.pipelines for s in q.stages)
    return J, S, R


def to_arrays(plans: Sequence[HeteroPlan], kinds: Sequence[str], shape: tuple[int, int, int] | None = None):
    """The plans as NumPy arrays padded to ``shape = (J, S, R)`` (pipelines, stages, replica
    groups; default the largest of ``plans``), one leading batch axis. ``kinds`` orders the
    device kinds (``kind`` indexes it)."""
    J, S, R = plan_shape(plans)
    if shape is not None:
        J, S, R = (max(a, b) for a, b in zip((J, S, R), shape, strict=True))
    n = len(plans)
    out = {
        "pipe_count": np.zeros((n, J), np.float32),
        "pipe_mb": np.zeros((n, J), np.float32),
        "stage_count": np.zeros((n, J, S), np.float32),
        "stage_layers": np.full((n, J, S), -1.0, np.float32),
        "kind": np.zeros((n, J, S, R), np.int32),
        "tp": np.ones((n, J, S, R), np.float32),
        "count": np.zeros((n, J, S, R), np.float32),
        "rep_mb": np.zeros((n, J, S, R), np.float32),
        "balance_code": np.zeros((n,), np.int32),
    }
    for b, plan in enumerate(plans):
        out["balance_code"][b] = BALANCE.index(plan.balance)
        for j, p in enumerate(plan.pipelines):
            out["pipe_count"][b, j] = p.count
            out["pipe_mb"][b, j] = p.micro_batches or 0
            for s, st in enumerate(p.stages):
                out["stage_count"][b, j, s] = 1.0
                out["stage_layers"][b, j, s] = -1.0 if st.layers is None else st.layers
                for r, rep in enumerate(st.replicas):
                    out["kind"][b, j, s, r] = kinds.index(rep.gpu)
                    out["tp"][b, j, s, r] = rep.tp
                    out["count"][b, j, s, r] = rep.count
                    out["rep_mb"][b, j, s, r] = rep.micro_batches or 0
    return out


def to_toml(plan: HeteroPlan, header: str = "") -> str:
    """The plan as a plan file (TOML; :func:`read_plan_file` reads it back)."""
    import json as _json

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return _json.dumps(v)
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise ValueError(f"cannot write {v!r} to a plan file")

    d = plan.as_dict()
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    lines += [f"{k} = {value(v)}" for k, v in d.items() if k != "pipeline" and v not in (None, {}, [])]
    for p in d["pipeline"]:
        lines += ["", "[[pipeline]]", f"count = {p['count']}"]
        if "micro_batches" in p:
            lines.append(f"micro_batches = {p['micro_batches']}")
        for st in p["stage"]:
            lines.append("[[pipeline.stage]]")
            if "layers" in st:
                lines.append(f"layers = {st['layers']}")
            lines.append(f"replicas = {value(st['replicas'])}")
    return "\n".join(lines) + "\n"


def with_layers(plan: HeteroPlan, layers: Sequence[Sequence[int]]) -> HeteroPlan:
    """The plan with every stage's layers fixed (``layers[j][s]``, e.g. the balanced split the
    model chose), so that the file says what runs."""
    pipes = tuple(
        dataclasses.replace(
            p, stages=tuple(dataclasses.replace(s, layers=int(layers[j][i])) for i, s in enumerate(p.stages))
        )
        for j, p in enumerate(plan.pipelines)
    )
    return dataclasses.replace(plan, pipelines=pipes)
