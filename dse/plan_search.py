"""Optuna over the mixes a budget buys, the exact plan search inside each trial
(``hetersim plan --budget B --kinds K,K,... --trials N``).

The exhaustive budget search (:func:`hetersim.hsearch.search_budget`) lists every mix of whole
nodes within 85-100 % of the budget and evaluates all their candidate plans: right for two kinds,
combinatorial beyond (up to ``(256 / node + 1) ** K`` node counts). Here the outer choice, how many
nodes of each kind to buy, is a bilevel search like ``hetersim optimize``'s: Optuna's TPE
(multivariate, seeded, the sampler of :mod:`dse.optimize.storage`) proposes the node counts of
every kind but the last of ``--kinds``, and the last takes the whole nodes the budget leaves, so
a trial spends the budget to within one of its nodes (a proposal that overspends, or leaves the
mix below the 85 % band, is pruned without an evaluation, as :func:`~hetersim.hsearch.mixes_within`
drops it). The inner problem is solved exactly and vectorized: every candidate plan of the trial's
mix (:func:`hetersim.hsearch.candidates` — stages by kind, pipelines by kind, rank-ordered
layouts; Metis's and FlashFlex's choices, see that module) in compiled ``vmap`` calls padded to
two shapes and one chunk for the whole search (single-pipeline plans of one replica group a stage
apart, as most candidates are), so a search compiles twice. A trial's value is the step time
of its mix's best plan that fits (the same global batch everywhere: the fastest trains soonest);
a mix with no plan that fits scores ``inf``. Mixes are solved once; a repeated proposal reuses the
answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hetersim import hsearch


def nodes_for(kinds: Sequence[tuple[str, float, int]], proposal: Mapping[str, int], budget: float):
    """The mix ``[(kind, GPUs, node), ...]`` of a proposal (nodes of every kind but the last), the
    last kind filling what the budget leaves in whole nodes; None when the proposal overspends,
    holds no GPU, or spends less than :data:`~hetersim.hsearch.BUDGET_LOW` of the budget."""
    *head, (last, last_price, last_node) = kinds
    spent = sum(proposal[k] * node * price for k, price, node in head)
    if spent > budget:
        return None
    fill = min(int((budget - spent) // (last_node * last_price)), hsearch.MAX_GPUS_PER_KIND // last_node)
    counts = [(k, proposal[k] * node, node) for k, _, node in head] + [(last, fill * last_node, last_node)]
    mix = [c for c in counts if c[1] > 0]
    price = spent + fill * last_node * last_price
    if not mix or price < hsearch.BUDGET_LOW * budget:
        return None
    return mix


def _shape(kinds: Sequence[Any], model_entry: Mapping[str, Any]) -> tuple[int, int, int]:
    """One padded plan shape for every candidate of every mix of ``kinds``: a pipeline per kind
    (pipelines by kind), at most :data:`hetersim.hsearch.MAX_STAGES` stages, and a stage's
    replicas on at most every kind (rank-ordered stages straddle kinds)."""
    layers = int(model_entry.get("layers", 0) or 0) + int(model_entry.get("mtp_layers", 0) or 0)
    return len(kinds), max(1, min(hsearch.MAX_STAGES, layers)), len(kinds)


def search_budget_optuna(
    model_entry,
    kinds: Sequence[tuple[str, float, int]],
    budget: float,
    catalog,
    cal,
    options: Mapping[str, Any],
    seq_len: int,
    trials: int,
    seed: int = 0,
    top: int = 10,
):
    """The best plans Optuna finds over ``trials`` proposals of a mix (``kinds``: ``(kind, $ per
    GPU-hour, GPUs per node)``, the last one filling). Returns (rows ranked by step time with their
    mix, the plans in that order, the number of mixes solved, the number of plans evaluated, and a
    summary of the search)."""
    import optuna

    from dse.optimize.storage import experimental_ok

    if len(kinds) < 1:
        raise ValueError("--kinds: name at least one device kind")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with experimental_ok():
        sampler = optuna.samplers.TPESampler(multivariate=True, seed=seed, n_startup_trials=min(10, trials))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    shape = _shape(kinds, model_entry)
    solved: dict[str, tuple[float, list]] = {}  # mix label -> (best fitting step time, [(row, plan), ...])
    n_plans = 0
    told = asked = 0
    while told < trials and asked < 50 * trials:  # pruned proposals cost nothing, but are bounded
        trial = study.ask()
        asked += 1
        cap = hsearch.MAX_GPUS_PER_KIND
        proposal = {
            k: trial.suggest_int(f"nodes[{k}]", 0, min(int(budget // (price * node)), cap // node))
            for k, price, node in kinds[:-1]
        }
        mix = nodes_for(kinds, proposal, budget)
        if mix is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        label = ",".join(f"{k}:{n}" for k, n, _ in mix)
        if label not in solved:
            plans = hsearch.candidates(mix, model_entry, options)
            solved[label] = _solve(model_entry, mix, label, kinds, plans, catalog, cal, seq_len, shape, top)
            n_plans += len(plans)
        study.tell(trial, solved[label][0])
        told += 1
    if not solved:
        raise ValueError(f"--budget: ${budget:g}/h buys no mix of whole nodes of --kinds within 85-100 % of it")
    rows, plans = _ranked(solved, top)
    summary = {"method": "optuna-tpe", "seed": seed, "trials": told, "pruned": asked - told, "mixes": len(solved)}
    return rows, plans, len(solved), n_plans, summary


def _solve(model_entry, mix, label, kinds, plans, catalog, cal, seq_len, shape, top):
    """Every candidate of one mix (``label``), evaluated at the search's two shapes: (the best
    fitting step time or inf, the ``top`` best (row, plan) pairs, fitting ones first; a row carries
    the mix and its hourly price, bought whether its plan uses every GPU or not)."""
    present = {k: n for k, n, _ in mix}
    cluster = {k: present.get(k, node) for k, _, node in kinds}  # every kind, so one compiled shape
    price = sum(present.get(k, 0) * usd for k, usd, _ in kinds)
    res = hsearch.evaluate_bucketed(model_entry, plans, catalog, cluster, cal, seq_len, shape)
    fits = res["infeasible"] == 0
    order = np.lexsort((res["step_time_s"], ~fits))
    best = float(res["step_time_s"][order[0]]) if fits[order[0]] else math.inf
    extra = {"mix": label, "usd_per_hour": price}
    keep = [({k: v[i].item() for k, v in res.items()} | extra, plans[i]) for i in order[:top]]
    return best, keep


def _ranked(solved: Mapping[str, tuple[float, list]], top: int):
    """The best ``top`` plans over every solved mix, fitting ones first, by step time."""
    pairs = [pair for _, keep in solved.values() for pair in keep]
    pairs.sort(key=lambda p: (p[0]["infeasible"] != 0, p[0]["step_time_s"]))
    return [row for row, _ in pairs[:top]], [plan for _, plan in pairs[:top]]
