"""``hetersim plan``: the heterogeneous plan the model finds best for a mix of devices."""

import dataclasses
import math
from pathlib import Path
from typing import Any

import typer

from dse import atomic
from dse import format as fmt
from hetersim.catalog import load_catalog
from hetersim.planrules import check_plan_search

from .app import app, check_seed, status, user_errors
from .options import PLAN_OPTIONS, cluster_error, fold_switches, given_flags, with_flag, with_options

_OWN_LAYOUT = ("gpus", "tp", "pp", "dp", "vp", "ep", "etp")  # the search chooses or fixes these
OPTIONS = {k: v for k, v in PLAN_OPTIONS.items() if k not in _OWN_LAYOUT}


@with_options(
    OPTIONS,
    model=(str | None, typer.Option(None, "--model", help="Catalog model key or a Hugging Face config.json path.")),
    cluster=(str | None, typer.Option(None, "--cluster", help="The mix to lay the job out on: KIND:N,KIND:N.")),
    budget=(
        float | None,
        typer.Option(None, "--budget", help="Instead of --cluster: an hourly budget ($) to buy a mix of --kinds with."),
    ),
    kinds=(
        str | None,
        typer.Option(None, "--kinds", help="With --budget: the device kinds a mix may hold, KIND,KIND."),
    ),
    trials=(
        int,
        typer.Option(
            0,
            "--trials",
            help="With --budget: Optuna (TPE) proposes this many mixes, each solved over all its candidate plans; "
            "0: every mix the budget buys.",
        ),
    ),
    seed=(int, typer.Option(0, "--seed", help="With --trials: the sampler's seed.")),
    study=(
        Path | None,
        typer.Option(None, "--study", help="A plan-search study (studies/plans/*.toml): every cluster's best plan."),
    ),
    catalog_files=(list[Path], typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable.")),
    top=(int, typer.Option(10, "--top", help="How many of the best plans to list.")),
    out=(
        str | None,
        typer.Option(
            None, "--out", help="Write the best plan here as a plan file (TOML); with --study, the report's folder."
        ),
    ),
    as_json=(bool, typer.Option(False, "--json", help="Print the ranking as JSON.")),
)
def plan(**options: Any) -> None:
    """Search the heterogeneous plans of a mix (stages by kind, pipelines by kind, rank-ordered
    layouts; TP per kind, layers and micro-batches balanced by speed) and rank them by step time.
    The best is printed (and written with --out) as a plan file for ``evaluate --plan``."""
    from hetersim import api, hplan, hsearch

    model, cluster, top, out, as_json = (options.pop(k) for k in ("model", "cluster", "top", "out", "as_json"))
    study = options.pop("study")
    if study is not None:
        return _study(study, model, cluster, out, options)
    budget, kinds, trials, seed = (options.pop(k) for k in ("budget", "kinds", "trials", "seed"))
    _check_search(model, cluster, budget, kinds, trials, seed)
    catalog_files = list(options.pop("catalog_files"))
    catalog = load_catalog(catalog_files)
    if top < 1:
        raise ValueError(f"--top must be a positive integer; got {top}")
    if out is not None:  # never one of the files it reads (a catalog, a config.json model)
        out = atomic.check_own_output(out, "--out", "TOML", reads=(*catalog_files, model))
    rest = {k: v for k, v in fold_switches(options).items() if v is not None and not api._is_default(k, v)}
    rest["offload"] = dict(rest.get("offload") or {})
    if rest.get("global_batch") is None:
        raise ValueError("missing option --global-batch")
    gb, mb = int(rest["global_batch"]), int(rest.get("micro_batch") or 1)
    if gb % mb:  # before the search, by the flags (a plan file's check names its fields)
        raise ValueError(f"--global-batch {gb} is not a multiple of --micro-batch {mb}")
    label, entry = api._model(catalog, model)
    try:  # before any search: context parallelism, a precision or experts the stack does not have
        check_plan_search(rest, entry)
    except ValueError as error:
        raise with_flag(error) from None
    if budget is not None:
        _budget(catalog, label, entry, (budget, kinds, trials, seed), rest, top, out, as_json)
        return
    try:
        mix = hsearch.mix_of(catalog, hplan.parse_cluster_counts(cluster))
    except ValueError as error:
        raise cluster_error(cluster, error) from None
    seq = int(rest.get("seq_len") or entry.get("seq_len", api.DEFAULT_SEQ_LEN))
    try:
        api.shared_plan(catalog, [k for k, _, _ in mix], rest, seq)
    except ValueError as error:
        raise with_flag(error) from None
    status(f"{label} on {cluster}: evaluating the candidate plans (one compilation)...")
    rows, ranked, res, n = hsearch.search(entry, mix, catalog, api.default_calibration(), rest, seq, top=top)
    best, fixed = api.with_chosen_layers(catalog, entry, ranked[0], cluster)
    header = f"hetersim plan --model {label} --cluster {cluster}: the best of {n} candidate plans\n" + (
        f"step time {float(best.breakdown.step_time_s):.4f} s, MFU {100 * float(best.breakdown.mfu):.1f} %"
    )
    text = hplan.to_toml(fixed, header)
    if out is not None:
        atomic.write_text(out, text)
    table = [
        {
            "rank": i + 1,
            "step_time_s": r["step_time_s"],
            "tokens_per_s": r["tokens_per_s"],
            "mfu": r["mfu"],
            "hbm_used_GiB": r["hbm_used_GiB"],
            "feasible": r["infeasible"] == 0,
            "plan": hsearch.describe(ranked[i]),
        }
        for i, r in enumerate(rows)
    ]
    if as_json:
        typer.echo(
            fmt.dumps({"model": label, "cluster": cluster, "candidates": n, "ranking": table, "best": fixed.as_dict()})
        )
        return
    con = fmt.console()
    fmt.print_plan_ranking(con, table, n)
    con.print(text, markup=False, highlight=False)


def _check_search(model, cluster, budget, kinds, trials: int, seed) -> None:
    """The search flags together: a mix you have (``--cluster``) or one a budget buys."""
    if trials < 0:
        raise ValueError(f"--trials must be >= 0 (0: every mix); got {trials}")
    if trials and budget is None:
        raise ValueError("--trials searches the mixes a budget buys: give it with --budget and --kinds")
    if (budget is None) != (kinds is None):
        raise ValueError("--budget and --kinds go together (the kinds a budget may buy)")
    if budget is not None and cluster is not None:
        raise ValueError("give --cluster (a mix you have) or --budget with --kinds (a mix to buy), not both")
    if model is None or (cluster is None and budget is None):
        raise ValueError("give --model and --cluster (or --budget with --kinds, or --study FILE)")
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"--budget must be a positive $ per hour; got {budget}")
    if kinds is not None and not any(k.strip() for k in kinds.split(",")):
        raise ValueError(f"--kinds must name one or more device kinds, KIND,KIND; got {kinds!r}")
    check_seed(seed)
    if seed and not trials:
        raise ValueError("--seed seeds the sampler of --trials; give --trials N with it or leave it out")


def _study(study: Path, model, cluster, out, options: dict[str, Any]) -> None:
    """``--study``: every cluster's best plan, and the report (``options``: the command's others,
    which the file gives: the model, the clusters, the plan fields and how many to rank)."""
    from dse.plan_study import run_plan_study

    extra = given_flags({*options, "top", "as_json"} - {"catalog_files"})
    if extra:
        raise ValueError(f"--study takes its model, clusters and plan fields from the file; leave {extra[0]} out")
    catalog_files = list(options.pop("catalog_files"))
    if model is not None or cluster is not None:
        raise ValueError("--study names the model and the clusters; leave --model and --cluster out")
    if out is None:
        raise ValueError("--study needs --out DIR (the report's folder)")
    folder = run_plan_study(study, Path(out), catalog_files)
    status(f"wrote {folder / 'report.md'}")


def _budget(catalog, label, entry, search, rest, top, out, as_json) -> None:
    """``--budget``: the best plan of every mix of ``kinds`` the budget buys, or of the mixes
    Optuna proposes (``--trials``)."""
    from dse.plan_search import search_budget_optuna
    from hetersim import api, hplan, hsearch

    budget, kinds, trials, seed = search

    names = [k.strip() for k in kinds.split(",")]
    try:
        keys = [catalog.key("gpus", k) for k in names if k]
    except ValueError as error:
        raise ValueError(f"--kinds {kinds}: {error}") from None
    if "" in names or len(set(keys)) < len(names):
        raise ValueError(f"--kinds must name distinct device kinds, KIND,KIND; got {kinds!r}")
    table = [
        (k, float(catalog.gpu(k)["price_usd_per_hour"]), node)
        for k, _, node in hsearch.mix_of(catalog, dict.fromkeys(names, 0))
    ]
    if not hsearch.mixes_within(table, budget):  # before the status line and the search
        raise ValueError(hsearch.no_mix(table, budget))
    seq = int(rest.get("seq_len") or entry.get("seq_len", api.DEFAULT_SEQ_LEN))
    try:
        api.shared_plan(catalog, names, rest, seq)
    except ValueError as error:
        raise with_flag(error) from None
    cal, how = api.default_calibration(), {"method": "exhaustive"}
    if trials:
        status(f"{label}: {trials} Optuna trials over the mixes of {kinds} that ${budget:g}/h buys...")
        found = search_budget_optuna(entry, table, budget, catalog, cal, rest, seq, trials, seed, top)
        rows, ranked, n_mix, n, how = found
    else:
        status(f"{label}: every mix of {kinds} within 85-100 % of ${budget:g}/h and its candidate plans...")
        rows, ranked, n_mix, n = hsearch.search_budget(entry, table, budget, catalog, cal, rest, seq, top)
    _, fixed = api.with_chosen_layers(catalog, entry, ranked[0], rows[0]["mix"])
    flags = f" --trials {trials} --seed {seed}" if trials else ""
    header = f"hetersim plan --model {label} --budget {budget:g} --kinds {kinds}{flags}: "
    header += f"best of {n} plans over {n_mix} mixes\n"
    text = hplan.to_toml(
        dataclasses.replace(fixed, cluster=rows[0]["mix"]),
        header + f"mix {rows[0]['mix']} at ${rows[0]['usd_per_hour']:.1f}/h",
    )
    if out is not None:
        atomic.write_text(out, text)
    for i, r in enumerate(rows):
        r.update(
            rank=i + 1,
            feasible=r["infeasible"] == 0,
            plan=f"{r['mix']} ${r['usd_per_hour']:.0f}/h: {hsearch.describe(ranked[i])}",
        )
    if as_json:
        head = {"model": label, "budget_usd_per_hour": budget, "mixes": n_mix, "candidates": n, "search": how}
        typer.echo(fmt.dumps({**head, "ranking": rows,
                              "best": dataclasses.replace(fixed, cluster=rows[0]["mix"]).as_dict()}))  # fmt: skip
        return
    con = fmt.console()
    fmt.print_plan_ranking(con, rows, n)
    con.print(text, markup=False, highlight=False)


app.command("plan")(user_errors(plan))
