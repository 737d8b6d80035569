"""The search that picks a heterogeneous plan for a given mix of devices (``hetersim plan``).

Candidates are the plans that the published planners enumerate, written in :mod:`hetersim.hplan`:

* **stages by kind** (Metis, Sailor): an order of the kinds, each kind's GPUs cut into ``s``
  equal stages of one TP degree (its replicas the stage's GPUs over TP) — the choices of
  Metis's planner, whose candidates are a device-group order, per-stage ``(dp, tp)`` and a layer
  partition (SamsungLabs/Metis@4b24046f ``results/hetero_cost_model``: columns
  ``node_sequence, device_groups, strategies(dp_deg, tp_deg), layer_partition``); a kind may be
  left out;
* **pipelines by kind** (FlashFlex/HexiScale's per-pipeline shapes, HetPipe's virtual workers):
  each kind runs copies of its own pipeline of ``pp`` stages and TP degree, the micro-batches
  shared by speed;
* **rank-ordered** (AMP, Megatron's placement over a mixed rank list): one ``(tp, pp, dp)`` over
  the ranks in kind order, stages that straddle two kinds holding replicas of both.

TP stays inside a node (no device kind runs tensor parallelism over its NICs in these systems;
Metis prunes it the same way) and divides the heads; stages never outnumber the layers. Layers
are balanced by speed over the stages and micro-batches by speed over the replicas
(:mod:`hetersim.hsim`); every candidate is evaluated in one ``jax.vmap`` batch and ranked by
step time among those that fit.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .hplan import HeteroPlan, Pipeline, Replica, Stage, from_shorthand

TPS = (1, 2, 4, 8)
MAX_STAGES = 16


def mix_of(catalog, counts: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """``[(kind, GPUs, GPUs per node), ...]`` of a cluster's counts (a node: the kind's scale-up
    domain, at most its GPUs per node)."""
    out = []
    for kind, n in counts.items():
        gpu = catalog.gpu(kind)
        out.append((kind, int(n), int(min(gpu.get("scaleup_domain", 8), gpu.get("gpus_per_node", 8)))))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_ok(tp: int, gpus: int, node: int, heads: int, kv: int) -> bool:
    return gpus % tp == 0 and tp <= node and heads % tp == 0 and kv % tp == 0


def candidates(
    mix: Sequence[tuple[str, int, int]],
    model: Mapping[str, Any],
    options: Mapping[str, Any],
    max_stages: int = MAX_STAGES,
) -> list[HeteroPlan]:
    """Every candidate plan of a mix ``[(kind, GPUs, GPUs per node), ...]`` (see the module); one
    stage each where the options' stack has no pipeline (or its pipeline engine not their ZeRO stage)."""
    layers = int(model.get("layers", 0) or 0) + int(model.get("mtp_layers", 0) or 0)
    heads = int(model.get("heads", 1) or 1)
    kv = int(model.get("kv_heads", 0) or heads)
    max_stages = min(max_stages, layers, _stack_stages(options))
    out: list[HeteroPlan] = []
    seen: set[Any] = set()

    def add(plan: HeteroPlan) -> None:
        key = describe(plan)  # one layout written two ways (a rank order that is stages by kind) once
        if key not in seen:
            seen.add(key)
            out.append(plan)

    def per_kind():
        """Per kind: None (left out) or (kind, stages, tp, replicas per stage) for each way to cut
        its GPUs into equal stages of one TP degree inside a node."""
        out = []
        for kind, n, node in mix:
            opts: list[Any] = [None]
            for s in _divisors(n):
                opts += [
                    (kind, s, tp, n // s // tp) for tp in TPS if s <= max_stages and _tp_ok(tp, n // s, node, heads, kv)
                ]
            out.append(opts)
        return out

    # Stages by kind: per kind its stage count and TP; all orders of the kinds used.
    for choice in itertools.product(*per_kind()):
        used = [c for c in choice if c is not None]
        if not used or sum(c[1] for c in used) > max_stages:
            continue
        for order in itertools.permutations(used):
            stages = tuple(Stage(None, (Replica(k, tp, dp),)) for k, s, tp, dp in order for _ in range(s))
            add(HeteroPlan((Pipeline(stages),), "speed", dict(options)))
    # Pipelines by kind: copies of one pipeline shape per kind (pp stages, each copy's stages one
    # replica of TP tp: as many copies as the stages have replicas), micro-batches by speed.
    for choice in itertools.product(*per_kind()):
        used = [c for c in choice if c is not None]
        if len(used) < 2:
            continue  # one kind alone is a stages-by-kind plan already
        pipes = tuple(
            Pipeline(tuple(Stage(None, (Replica(k, tp, 1),)) for _ in range(pp)), count=c) for k, pp, tp, c in used
        )
        add(HeteroPlan(pipes, "speed", dict(options)))
    # Rank-ordered (tp, pp, dp) over the kinds in each order.
    total = sum(n for _, n, _ in mix)
    node = min(nd for _, _, nd in mix)
    for order in itertools.permutations(mix):
        groups = [(k, n) for k, n, _ in order]
        for tp in TPS:
            for pp in _divisors(total // tp) if total % tp == 0 else []:
                if pp > max_stages or not _tp_ok(tp, total, node, heads, kv):
                    continue
                try:
                    add(from_shorthand(groups, tp=tp, pp=pp, dp=total // (tp * pp), options=dict(options)))
                except ValueError:
                    continue  # a tensor-parallel group across two kinds
    return out


def _stack_stages(options: Mapping[str, Any]) -> int | float:
    """1 where the options' stack cannot pipeline them (its profile's ``pipeline`` fact is none, or
    ``pipeline_zero1`` with ZeRO 2 or 3), else no limit."""
    from . import stacks
    from .types import Stack

    name = str(options.get("stack") or Stack.MEGATRON.label)
    if name not in Stack.names():
        return math.inf  # named by the field's own check
    prof = stacks.profile(name)
    return 1 if prof.pipeline == "none" or (prof.pipeline_zero1 and int(options.get("zero") or 0) >= 2) else math.inf


CHUNK = 512  # plans per compiled call of the plan engine


def evaluate_all(
    model_entry,
    plans: Sequence[HeteroPlan],
    catalog,
    cluster: Mapping[str, int],
    cal,
    seq_len: int,
    chunk: int = CHUNK,
    shape: tuple[int, int, int] | None = None,
):
    """Step time, throughput, MFU, HBM and flags of every plan: one compiled ``vmap`` over
    chunks of plans padded to the largest (kinds in the cluster's order, the network between
    kinds from those each plan uses). With ``shape`` (pipelines, stages, replica groups), every
    chunk is padded to that shape and to ``chunk`` plans, so calls with other plans of the same
    kinds reuse the compiled program."""
    import jax.numpy as jnp

    from . import build
    from .hplan import plan_shape, to_arrays
    from .hsim import common_plan, hetero_spec

    kinds = list(cluster)
    J, S, R = plan_shape(plans) if shape is None else (max(a, b) for a, b in zip(plan_shape(plans), shape, strict=True))
    m = build.model_spec(model_entry)
    plan_s = common_plan(plans[0], seq_len)
    base = hetero_spec(plans[0], catalog, dict(cluster), shape=(J, S, R), kinds=kinds)
    run = _batched()
    args = (m, base.systems, base.sp_auto, plan_s, cal)
    keys = ("step_time_s", "tokens_per_s", "mfu", "hbm_used_GiB", "cost_usd", "infeasible")
    out: dict[str, list] = {k: [] for k in keys}
    chunk = chunk if shape is not None else min(chunk, len(plans))
    for i in range(0, len(plans), chunk):
        part = list(plans[i : i + chunk])
        n = len(part)
        part += [part[-1]] * (chunk - n)
        arrays = {k: jnp.asarray(v) for k, v in to_arrays(part, kinds, (J, S, R)).items()}
        used = jnp.asarray([[1.0 if k in p.kinds() else 0.0 for k in kinds] for p in part])
        res = run(*args, arrays, used)
        for k in keys:
            out[k].extend(np.asarray(getattr(res, k))[:n].tolist())
    return {k: np.asarray(v) for k, v in out.items()}


# Plans from which an exhaustive search evaluates in two shapes (:func:`evaluate_bucketed`): the
# second shape costs a compilation (~20 s on 2 cores) and saves ~0.3 ms a single-pipeline plan
# (10k against 2.4k plans/s at the full shape, LLaMA-2-7B on A100 + H100): it pays from ~60k plans.
BUCKET_MIN_PLANS = 60_000


def evaluate_search(model_entry, plans, catalog, cluster, cal, seq_len: int):
    """An exhaustive search's evaluation: :func:`evaluate_bucketed` where it pays
    (:data:`BUCKET_MIN_PLANS`), else one call at the plans' own shape."""
    if len(plans) >= BUCKET_MIN_PLANS:
        return evaluate_bucketed(model_entry, plans, catalog, cluster, cal, seq_len)
    return evaluate_all(model_entry, plans, catalog, cluster, cal, seq_len)


def evaluate_bucketed(model_entry, plans, catalog, cluster, cal, seq_len: int, shape=None, chunk: int = CHUNK):
    """:func:`evaluate_all` in two padded shapes: plans of one pipeline and one replica group a
    stage (stages by kind, most candidates) at ``(1, S, 1)``, the rest at ``shape`` (default: the
    plans' own). The engine's work grows with the padded slots, so the first group runs about 4x
    faster than at the full shape; padding is masked out, so the numbers are those of one call at
    the full shape. Fixed chunks: a search compiles at most twice, and calls with other plans of
    the same kinds reuse both programs."""
    from .hplan import plan_shape

    J, S, R = plan_shape(plans) if shape is None else shape
    simple = [i for i, p in enumerate(plans) if plan_shape([p])[::2] == (1, 1)]
    rest = sorted(set(range(len(plans))) - set(simple))
    out: dict[str, np.ndarray] = {}
    for index, padded in ((simple, (1, S, 1)), (rest, (J, S, R))):
        if not index:
            continue
        part = evaluate_all(model_entry, [plans[i] for i in index], catalog, cluster, cal, seq_len, chunk, padded)
        for key, values in part.items():
            out.setdefault(key, np.zeros(len(plans), values.dtype))[index] = values
    return out


@functools.cache
def _batched():
    """The plan engine over a batch of plans' arrays (one compiled program per shape, shared by
    every search of the process)."""
    import jax

    from .hsim import HeteroSpec, cross_network, simulate_plan

    def one(model, systems, sp_auto, plan, cal, arrays, used):
        hs = HeteroSpec(systems=systems, cross=cross_network(systems, used), sp_auto=sp_auto, **arrays)
        return simulate_plan(model, hs, plan, cal).total

    return jax.jit(jax.vmap(one, in_axes=(None, None, None, None, None, 0, 0)))


def search(model_entry, mix, catalog, cal, options: Mapping[str, Any], seq_len: int, top: int = 10):
    """(ranked rows, the plans in that order): every candidate of the mix evaluated, the feasible
    ones by step time first, then the rest."""
    plans = candidates(mix, model_entry, options)
    cluster = {k: n for k, n, _ in mix}
    res = evaluate_search(model_entry, plans, catalog, cluster, cal, seq_len)
    feasible = res["infeasible"] == 0
    order = np.lexsort((res["step_time_s"], ~feasible))
    rows = []
    for i in order[:top]:
        rows.append({k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in res.items()} | {"index": int(i)})
    return rows, [plans[i] for i in order], res, len(plans)


def describe(plan: HeteroPlan) -> str:
    """A one-line summary: ``2x[a100 tp4 x2 | h100 tp2 x4]`` (copies x [stages | ...])."""
    parts = []
    for p in plan.pipelines:
        stages = " | ".join(" + ".join(f"{r.gpu} tp{r.tp} x{r.count}" for r in s.replicas) for s in p.stages)
        parts.append(f"{p.count}x[{stages}]")
    return ", ".join(parts)


BUDGET_LOW = 0.85  # a mix spends at least this share of its budget
MAX_GPUS_PER_KIND = 256  # at most this many GPUs of one kind in a mix


def mixes_within(
    kinds: Sequence[tuple[str, float, int]], budget: float, low: float = BUDGET_LOW, max_gpus: int = MAX_GPUS_PER_KIND
) -> list:
    """Mixes ``[(kind, GPUs, node), ...]`` of whole nodes whose hourly price is within
    ``[low * budget, budget]`` (``kinds``: ``(kind, $/GPU-hour, GPUs per node)``), at most
    ``max_gpus`` GPUs of a kind; a kind may be absent."""
    ranges = [range(0, max_gpus // node + 1) for _, _, node in kinds]
    out = []
    for nodes in itertools.product(*ranges):
        price = sum(n * node * p for n, (_, p, node) in zip(nodes, kinds, strict=True))
        if low * budget <= price <= budget and any(nodes):
            out.append([(k, n * node, node) for n, (k, _, node) in zip(nodes, kinds, strict=True) if n])
    return out


def no_mix(kinds: Sequence[tuple[str, float, int]], budget: float) -> str:
    """Why ``budget`` buys no mix (:func:`mixes_within`): below the cheapest node, or past the
    :data:`MAX_GPUS_PER_KIND` GPUs of every kind, or between whole nodes' prices."""
    cheapest = min(p * node for _, p, node in kinds)
    most = sum(p * (MAX_GPUS_PER_KIND // node) * node for _, p, node in kinds)
    if budget < cheapest:
        why = f"the cheapest node costs ${cheapest:g}/h"
    elif BUDGET_LOW * budget > most:
        why = f"at most {MAX_GPUS_PER_KIND} GPUs of each kind cost ${most:g}/h"
    else:
        why = "no mix of whole nodes is priced within 85-100 % of it"
    return f"--budget ${budget:g}/h buys no mix: {why}"


def search_budget(model_entry, kinds, budget, catalog, cal, options, seq_len: int, top: int = 10):
    """The best plans of every mix a budget buys (:func:`mixes_within`), all in one batch, ranked
    by step time (the same global batch: the fastest trains soonest). Returns (rows with their
    mix, the plans in that order, the number of mixes, the number of plans)."""
    mixes = mixes_within(kinds, budget)
    if not mixes:
        raise ValueError(no_mix(kinds, budget))
    plans, owner = [], []
    for i, mix in enumerate(mixes):
        for p in candidates(mix, model_entry, options):
            plans.append(p)
            owner.append(i)
    widest = {k: max([n for mix in mixes for kk, n, _ in mix if kk == k], default=0) for k, _, _ in kinds}
    res = evaluate_search(model_entry, plans, catalog, {k: n for k, n in widest.items() if n}, cal, seq_len)
    order = np.lexsort((res["step_time_s"], res["infeasible"] != 0))
    rows = []
    usd = {k: p for k, p, _ in kinds}  # the prices the budget band was drawn with
    for i in order[:top]:
        mix = mixes[owner[i]]
        price = sum(n * usd[k] for k, n, _ in mix)
        row = {k: v[i].item() for k, v in res.items()}
        rows.append(row | {"mix": ",".join(f"{k}:{n}" for k, n, _ in mix), "usd_per_hour": price, "index": int(i)})
    return rows, [plans[i] for i in order], len(mixes), len(plans)
