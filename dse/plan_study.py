"""``hetersim plan --study FILE``: the best heterogeneous plan of each cluster of a study, and a
report comparing them (``report.md``, ``ranking.json``, one plan file per cluster)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from dse import atomic
from hetersim import tomltext

_KEYS = {"name", "description", "model", "clusters", "top", "plan", "catalog"}


def read_plan_study(path: Path) -> dict[str, Any]:
    """A plan-search study file, checked (one-line ``ValueError`` naming the file and key)."""
    from hetersim import hplan, planfields
    from hetersim.planrules import check_plan_search
    from hetersim.types import FieldError

    try:
        data = tomltext.loads(Path(path).read_text(encoding="utf-8-sig"))
    except OSError as e:
        raise ValueError(f"{path}: cannot read study ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text (UTF-8) TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_KEYS))}")
    for key in ("name", "model", "clusters", "plan"):
        if key not in data:
            raise ValueError(f"{path}: {key} is required")
    for key in ("name", "description", "model"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{path}: {key} must be a string; got {data[key]!r}")
    catalogs = data.get("catalog", [])
    if not isinstance(catalogs, list) or not all(isinstance(c, str) for c in catalogs):
        raise ValueError(f"{path}: catalog must be a list of catalog file paths; got {catalogs!r}")
    if (
        not isinstance(data["clusters"], list)
        or not data["clusters"]
        or not all(isinstance(c, str) for c in data["clusters"])
    ):
        raise ValueError(f"{path}: clusters must be a non-empty list of KIND:N,KIND:N strings")
    for c in data["clusters"]:
        try:
            hplan.parse_cluster_counts(c)
        except ValueError as e:
            raise ValueError(f"{path}: clusters: {e}") from None
    plan = data["plan"]
    if not isinstance(plan, dict):
        raise ValueError(f"{path}: [plan] must be a table")
    for k in plan:
        if k not in planfields.BY_NAME or k in hplan.STRUCTURAL + ("vp", "ep", "etp"):
            raise ValueError(f"{path}: plan.{k} is not a field a plan search takes (the search sets the layout)")
    hplan.check_options(str(path), plan, "plan.")
    try:  # before any search, as `hetersim plan`: context parallelism, a precision the stack lacks
        check_plan_search(plan)
    except FieldError as e:
        raise ValueError(f"{path}: {e.named({k: f'plan.{k}' for k in ('stack', 'cp', 'precision')})}") from None
    if "global_batch" not in plan:
        raise ValueError(f"{path}: plan.global_batch is required")
    top = data.get("top", 5)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"{path}: top must be a positive integer; got {top!r}")
    return data


def run_plan_study(path: Path, out_dir: Path, catalog_files=()) -> Path:
    """Search every cluster of the study; write the report into ``out_dir``."""
    from hetersim import api, hplan, hsearch
    from hetersim.catalog import load_catalog
    from hetersim.planrules import check_plan_search
    from hetersim.types import FieldError

    study = read_plan_study(path)
    catalog = load_catalog([*catalog_files, *study.get("catalog", [])])
    label, entry = api._model(catalog, study["model"])
    opts = dict(study["plan"])
    try:  # the model's experts on the study's stack, before any search (the rest read_plan_study checked)
        check_plan_search(opts, entry)
    except FieldError as e:
        raise ValueError(f"{path}: {e.named({k: f'plan.{k}' for k in e.fields})}") from None
    seq = int(opts.get("seq_len") or entry.get("seq_len", api.DEFAULT_SEQ_LEN))
    atomic.check_folder(out_dir, "--out")
    counts_of, mixes = {c: hplan.parse_cluster_counts(c) for c in study["clusters"]}, {}
    for cluster, counts in counts_of.items():  # every kind known before any search or file
        try:
            mixes[cluster] = hsearch.mix_of(catalog, counts)
        except ValueError as e:
            raise ValueError(f"{path}: clusters: {cluster}: {e}") from None
    results, files = [], {}
    for cluster, counts in counts_of.items():
        try:
            rows, ranked, _, n = hsearch.search(
                entry, mixes[cluster], catalog, api.default_calibration(), opts, seq, top=study.get("top", 5)
            )
        except ValueError as e:
            raise ValueError(f"{path}: {cluster}: {e}") from None
        best, fixed = api.with_chosen_layers(catalog, entry, ranked[0], cluster)
        b = best.breakdown
        price = sum(n_k * float(catalog.gpu(k)["price_usd_per_hour"]) for k, n_k in counts.items())
        results.append(
            dict(
                cluster=cluster,
                candidates=n,
                usd_per_hour=price,
                feasible=int(b.infeasible) == 0,
                step_time_s=float(b.step_time_s),
                tokens_per_s=float(b.tokens_per_s),
                mfu=float(b.mfu),
                time_to_train_days=float(b.time_to_train_s) / 86400.0,
                cost_usd=float(b.cost_usd),
                hbm_used_GiB=float(b.hbm_used_GiB),
                best_plan=hsearch.describe(fixed),
                plan_file=f"best_{len(results)}.toml",
                runners_up=[dict(r, plan=hsearch.describe(ranked[i])) for i, r in enumerate(rows[1:], 1)],
            )
        )
        header = f"{study['name']}: best plan of {cluster} ({n} candidates); hetersim plan --study {Path(path).name}"
        files[results[-1]["plan_file"]] = hplan.to_toml(fixed, header)
    for name, text in files.items():  # written once every cluster is searched: nothing half-written
        atomic.write_text(Path(out_dir) / name, text)
    atomic.write_text(
        Path(out_dir) / "ranking.json",
        json.dumps({"study": study["name"], "model": label, "results": results}, indent=1),
    )
    atomic.write_text(Path(out_dir) / "report.md", _report(study, label, results))
    return Path(out_dir)


def _report(study, label, results) -> str:
    lines = [f"# {study['name']}", "", study.get("description", ""), "", f"Model {label}; plan fields: "
             + ", ".join(f"{k} = {v}" for k, v in study["plan"].items()) + ".", "",
             "| cluster | $/h | candidates | best step s | tokens/s | MFU % | days to train | cost $ | HBM GiB "
             "| best plan |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in results:
        lines.append(
            f"| {r['cluster']} | {r['usd_per_hour']:.1f} | {r['candidates']} | {r['step_time_s']:.3f} | "
            f"{r['tokens_per_s']:,.0f} | "
            f"{100 * r['mfu']:.1f} | {r['time_to_train_days']:.1f} | {r['cost_usd']:,.0f} | {r['hbm_used_GiB']:.1f} | "
            f"{r['best_plan']} ([{r['plan_file']}]({r['plan_file']})) |"
        )
    lines += ["", "Runners-up per cluster (step time, plan):", ""]
    for r in results:
        lines.append(
            f"* {r['cluster']}: " + "; ".join(f"{x['step_time_s']:.3f} s {x['plan']}" for x in r["runners_up"])
        )
    lines += ["", "Each best plan is a plan file: `hetersim evaluate --model "
              f"{label} --plan <file>` reproduces its row; edit it to try a variant.", ""]  # fmt: skip
    return "\n".join(lines)
