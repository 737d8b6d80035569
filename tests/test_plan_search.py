"""Optuna over the mixes a budget buys, every candidate plan of a mix solved exactly (dse.plan_search)."""

from __future__ import annotations

import json

from dse import plan_search
from hetersim import api, hplan, hsearch
from hetersim.catalog import load_catalog

from .test_cli import assert_user_error, run

H100, A100 = "h100-sxm-80gb", "a100-sxm-80gb"
KINDS = [(A100, 2.7, 8), (H100, 6.155, 8)]  # $ per GPU-hour as the catalog's, 8 GPUs a node
BASE = ["plan", "--model", "llama2-7b", "--global-batch", "64"]


def test_the_last_kind_fills_what_the_budget_leaves_and_bad_proposals_are_pruned():
    mix = plan_search.nodes_for(KINDS, {A100: 3}, 120.0)
    assert mix == [(A100, 24, 8), (H100, 8, 8)]  # 3 * 21.6 + 49.24 = 114.04 <= 120 < 3 * 21.6 + 2 * 49.24
    assert plan_search.nodes_for(KINDS, {A100: 6}, 120.0) is None  # 129.6 > 120: overspends
    assert plan_search.nodes_for(KINDS, {A100: 2}, 120.0) is None  # 43.2 + 49.24 = 92.4 < 85 % of 120
    assert plan_search.nodes_for(KINDS, {A100: 5}, 120.0) == [(A100, 40, 8)]  # no H100 node fits: left out
    exhaustive = hsearch.mixes_within(KINDS, 120.0)
    maximal = [plan_search.nodes_for(KINDS, {A100: n}, 120.0) for n in range(6)]
    assert sorted(m for m in maximal if m) == sorted(exhaustive)  # here every mix in the band is maximal


def test_optuna_finds_the_best_plan_of_the_exhaustive_budget_search():
    """A budget of $120/h buys two mixes of whole nodes in its 85-100 % band; both are proposed in
    ten trials, and the best plan is the exhaustive search's, to the last bit."""
    catalog = load_catalog()
    entry, cal = catalog.model("llama2-7b"), api.default_calibration()
    options = {"global_batch": 64}
    rows, plans, n_mix, n, how = plan_search.search_budget_optuna(
        entry, KINDS, 120.0, catalog, cal, options, 4096, trials=10, seed=0, top=3
    )
    full_rows, full_plans, full_mixes, _ = hsearch.search_budget(entry, KINDS, 120.0, catalog, cal, options, 4096, 3)
    assert n_mix == full_mixes == 2 and how["method"] == "optuna-tpe" and how["trials"] == 10
    assert rows[0]["mix"] == full_rows[0]["mix"] and rows[0]["step_time_s"] == full_rows[0]["step_time_s"]
    assert hsearch.describe(plans[0]) == hsearch.describe(full_plans[0])
    # Each mix on its own, padded to the search's two shapes in chunks of 512: the same numbers
    # as the exhaustive batch of both mixes' plans.
    assert hplan.plan_shape(full_plans) == plan_search._shape(KINDS, entry)
    exhaustive = {(r["mix"], hsearch.describe(p)): r for r, p in zip(full_rows, full_plans, strict=False)}
    for row, plan in zip(rows, plans, strict=True):
        same = exhaustive[(row["mix"], hsearch.describe(plan))]  # both mixes solved: the same top 3
        assert all(row[k] == same[k] for k in ("step_time_s", "hbm_used_GiB", "infeasible"))
    assert [r["step_time_s"] for r in rows] == sorted(r["step_time_s"] for r in rows)
    assert all(0.85 * 120 <= r["usd_per_hour"] <= 120 for r in rows)


def test_the_chosen_plan_is_written_as_a_plan_file_that_evaluates_to_the_same_step(tmp_path):
    out = tmp_path / "best.toml"
    result = run([*BASE, "--budget", "120", "--kinds", f"{A100},{H100}", "--trials", "6", "--out", out, "--json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["search"] == {"method": "optuna-tpe", "seed": 0, "trials": 6, "pruned": report["search"]["pruned"],
                                "mixes": report["mixes"]}  # fmt: skip
    best = report["ranking"][0]
    evaluated = json.loads(run(["evaluate", "--model", "llama2-7b", "--plan", out, "--json"]).stdout)
    assert abs(evaluated["step_time_s"] - best["step_time_s"]) <= 1e-6 * best["step_time_s"]
    assert hplan.read_plan_file(out).cluster == best["mix"]


def test_trials_without_a_budget_and_negative_trials_are_usage_errors():
    assert_user_error(run([*BASE, "--cluster", f"{A100}:8", "--trials", "5"]), "--trials", "--budget")
    assert_user_error(run([*BASE, "--budget", "120", "--kinds", A100, "--trials", "-1"]), "--trials")
