"""Bilevel search, sensitivities and continuous tuning (issue 6).

The search is judged against an exhaustive sweep of the same space: the packaged example study
(3 GPU kinds x 16 GPU counts x 23 HBM bandwidths x 7 scale-out bandwidths = 7,728 outer points,
432 layouts each, 3.3M configurations). Every in-process solve uses the same batch, so the
compiled inner solver is shared by the whole module. Figures are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from dse import hw_params
from dse.cli import configuration
from dse.cli.optimize import optimize_command, sensitivity_report
from dse.inner import InnerSolver, exhaustive, outer_grid
from dse.optimize import run_optimize
from dse.optimize.storage import stored_constraints
from dse.pareto import hypervolume, pareto_mask
from dse.search_space import load_search, parse_search
from dse.sensitivity import grid_continuous, sensitivity, tune_continuous
from hetersim import build
from hetersim.catalog import apply_overrides
from hetersim.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml"
BATCH = 32
TRIALS = 384  # 4.97 % of the 7,728 outer points


@pytest.fixture(scope="module")
def space():
    return load_search(STUDY)


@pytest.fixture(scope="module")
def solver(space, cal):
    return InnerSolver(space, batch=BATCH, cal=cal)


@pytest.fixture(scope="module")
def reference(solver):
    """The exhaustive answer: every outer point's best layout, its front and hypervolume."""
    points, res = exhaustive(solver)
    feasible = res["constraints"].max(axis=1) <= 0
    values = np.stack([res["time_to_train_s"], res["cost_usd"]], axis=1).astype(np.float64)[feasible]
    front = values[pareto_mask(values)]
    ideal, nadir = front.min(axis=0), front.max(axis=0)
    ref = nadir + 0.1 * (nadir - ideal)
    return {
        "points": points,
        "result": res,
        "best_time": float(values[:, 0].min()),
        "ref": ref,
        "hv": hypervolume(values, ref),
        "front": front,
    }


def judge(path: Path, reference) -> tuple[float, float]:
    """(gap of the best feasible time to the exhaustive optimum, hypervolume ratio)."""
    with xr.open_dataset(path) as ds:
        ok = ds.feasible.values.astype(bool)
        values = np.stack([ds.time_to_train_s.values, ds.cost_usd.values], axis=1)[ok]
    gap = values[:, 0].min() / reference["best_time"] - 1.0
    return float(gap), hypervolume(values, reference["ref"]) / reference["hv"]


# --------------------------------------------------------------------------------------------
# The space and the inner solver
# --------------------------------------------------------------------------------------------


def test_example_study_is_a_large_two_objective_space(space, solver):
    assert [p.name for p in space.outer] == ["gpu", "n_gpus", "hbm_bw_GBps", "scaleout_bw_GBps"]
    assert space.outer_size == 3 * 16 * 23 * 7
    assert solver.n_layouts == 4 * 4 * 3 * 3 * 3
    assert space.outer_size * solver.n_layouts >= 100_000
    assert space.directions == ["minimize", "minimize"]
    assert space.constraint_names() == ["layout", "max_hbm_frac"]


def test_hardware_overrides_and_price_model(space, solver, catalog):
    point = {"gpu": "h200-sxm-141gb", "n_gpus": 128, "hbm_bw_GBps": 6000.0, "scaleout_bw_GBps": 75.0}
    systems, _, n_gpus, price = solver.hardware([point])
    assert float(systems.device.hbm_bw_GBps[0]) == 6000.0
    assert float(hw_params.get(systems, hw_params.resolve("scaleout_bw_GBps"))[0]) == 75.0
    entry = catalog.gpu("h200-sxm-141gb")
    expected = entry["price_usd_per_hour"] + 0.0004 * (6000 - entry["hbm_bw_GBps"]) + 0.02 * (75 - 50)
    assert price[0] == pytest.approx(expected, rel=1e-6)
    assert n_gpus[0] == 128


def test_power_constraint(tmp_path, cal):
    path = variant(tmp_path, "[search.price]", "max_power_kW = 200\n\n[search.price]")
    s = load_search(path)
    assert s.constraint_names() == ["layout", "max_hbm_frac", "max_power_kW"]
    points = [{"gpu": "b200", "n_gpus": n, "hbm_bw_GBps": 8000.0, "scaleout_bw_GBps": 50.0} for n in (128, 256)]
    res = InnerSolver(s, batch=BATCH, cal=cal).solve(points)
    # B200: 1000 W; 128 GPUs draw 128 kW (36 % under the bound), 256 draw 256 kW (28 % over)
    assert res["power_kW"].tolist() == [128.0, 256.0]
    assert res["constraints"][:, 2] == pytest.approx([-0.36, 0.28])


def test_inner_best_equals_one_configuration_brute_force(space, solver, catalog, cal):
    """The vmapped solve picks the layout a loop over one-configuration ``simulate`` picks."""
    entry = catalog.gpu("h200-sxm-141gb")
    n = 256
    point = {"gpu": "h200-sxm-141gb", "n_gpus": n, "hbm_bw_GBps": entry["hbm_bw_GBps"], "scaleout_bw_GBps": 50.0}
    res = solver.solve([point])
    sim = jax.jit(simulate)
    model = build.model_spec(catalog.model("llama2-13b"))
    system = build.system_spec(entry, catalog.links)
    best, best_i, n_runnable = np.inf, -1, 0
    for i in range(solver.n_layouts):
        lay = solver.layout(i, n)
        if lay["dp"] == 0:
            continue
        kw = {k: lay[k] for k in ("tp", "pp", "vp", "cp", "dp", "zero", "micro_batch", "global_batch", "seq_len")}
        kw.update({k: lay[k] for k in ("sp", "recompute", "precision", "attention", "order")})
        out = sim(model, system, build.plan_spec(n_gpus=n, train_tokens=1.0e12, **kw), cal)
        if int(out.infeasible) != 0:
            continue
        n_runnable += 1
        if float(out.hbm_used_GiB / out.hbm_capacity_GiB) <= 0.95 and float(out.time_to_train_s) < best:
            best, best_i = float(out.time_to_train_s), i
    assert int(res["n_runnable"][0]) == n_runnable
    assert int(res["cls"][0]) == 0
    assert int(res["index"][0]) == best_i
    assert float(res["time_to_train_s"][0]) == pytest.approx(best, rel=1e-5)


# --------------------------------------------------------------------------------------------
# The search against the exhaustive answer
# --------------------------------------------------------------------------------------------


def test_optimize_one_seed_near_exhaustive(tmp_path, reference, space, capsys):
    summary = optimize_command(STUDY, TRIALS, "auto", 0, tmp_path, None, None, BATCH, True)
    printed = json.loads(capsys.readouterr().out)
    assert printed["n_trials"] == TRIALS
    gap, hv = judge(Path(summary["path"]), reference)
    share = TRIALS / space.outer_size
    with capsys.disabled():
        print(
            f"\noptimize (NSGA-II, seed 0): {TRIALS} trials = {share:.2%} of {space.outer_size} outer points; "
            f"best time-to-train gap {gap:.2%}; hypervolume {hv:.1%} of the exhaustive front's"
        )
    assert share <= 0.05
    assert gap <= 0.02
    assert hv >= 0.95


@pytest.mark.slow
def test_optimize_five_seeds_median(tmp_path, reference, space, capsys):
    gaps, hvs = [], []
    for seed in range(5):
        s = run_optimize(STUDY, TRIALS, seed=seed, out=tmp_path / str(seed), batch=BATCH, progress=False)
        gap, hv = judge(Path(s["path"]), reference)
        gaps.append(gap)
        hvs.append(hv)
    with capsys.disabled():
        print(
            f"\noptimize (NSGA-II, 5 seeds, {TRIALS / space.outer_size:.2%} of the outer space): gaps "
            f"{', '.join(f'{g:.2%}' for g in gaps)} (median {np.median(gaps):.2%}); hypervolume ratios "
            f"{', '.join(f'{h:.1%}' for h in hvs)} (median {np.median(hvs):.1%})"
        )
    assert np.median(gaps) <= 0.02
    assert np.median(hvs) >= 0.95


def test_dataset_and_journal(tmp_path, space):
    s = run_optimize(STUDY, 64, sampler="tpe", seed=1, out=tmp_path, batch=BATCH, progress=False)
    path = Path(s["path"])
    assert path == tmp_path / "llama2-13b-hardware.optimize.nc"
    assert not list(tmp_path.glob(".*.tmp"))
    with xr.open_dataset(path) as ds:
        assert ds.sizes["trial"] == 64
        assert list(ds.trial.values) == list(range(64))
        for name in ("gpu", "n_gpus", "hbm_bw_GBps", "tp", "pp", "dp", "recompute", "time_to_train_s", "cost_usd"):
            assert name in ds
        assert ds.gpu.attrs["flag_meanings"].split() == list(space.study.axes["gpu"])
        assert set(ds.state.values) == {1}  # complete
        assert "constraint_layout" in ds and "constraint_max_hbm_frac" in ds
        feasible = ds.feasible.values.astype(bool)
        cons = np.stack([ds.constraint_layout.values, ds.constraint_max_hbm_frac.values], axis=1)
        assert np.array_equal(feasible, (cons <= 0).all(axis=1))
        pareto = ds.pareto.values.astype(bool)
        assert pareto.any() and not (pareto & ~feasible).any()
        values = np.stack([ds.time_to_train_s.values, ds.cost_usd.values], axis=1)
        assert np.array_equal(pareto[feasible], pareto_mask(values[feasible]))
        assert ds.attrs["study_toml"] == STUDY.read_text()
        # each trial's best layout divides its GPU count
        ok = ds.layout_class.values <= 1
        assert np.all((ds.tp * ds.pp * ds.cp * ds.dp).values[ok] == ds.n_gpus.values[ok])
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(s["journal"]))
    study = optuna.load_study(study_name="llama2-13b-hardware", storage=storage)
    assert len(study.trials) == 64
    assert study.user_attrs["hetersim_constraints"] == ["layout", "max_hbm_frac"]
    assert len(study.trials[0].system_attrs["constraints"]) == 2  # the key constraints_func writes


def test_grid_sampler_visits_each_point_once(tmp_path):
    path = variant(tmp_path, "n_gpus = {low = 64, high = 1024, step = 64}", "n_gpus = [64, 128]")
    path.write_text(path.read_text().replace("step = 300}", "step = 3300}").replace("step = 12.5}", "step = 75}"))
    s = run_optimize(path, 100, sampler="grid", out=tmp_path, batch=BATCH, progress=False)
    assert s["outer_size"] == 3 * 2 * 3 * 2
    assert s["n_trials"] == s["n_distinct_points"] == 36  # capped at the grid, no point twice


def test_rdb_storage(tmp_path):
    pytest.importorskip("sqlalchemy")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    s = run_optimize(STUDY, 8, storage=url, out=tmp_path, batch=BATCH, progress=False)
    s = run_optimize(STUDY, 12, storage=url, out=tmp_path, batch=BATCH, progress=False)
    assert s["trials_added"] == 4 and s["n_trials"] == 12 and s["storage"] == url


def test_same_seed_same_run(tmp_path):
    runs = []
    for k in range(2):
        s = run_optimize(STUDY, 48, sampler="nsga2", seed=7, out=tmp_path / str(k), batch=BATCH, progress=False)
        with xr.open_dataset(s["path"]) as ds:
            run = ds[["gpu", "n_gpus", "hbm_bw_GBps", "scaleout_bw_GBps", "tp", "time_to_train_s"]].load()
            assert run.attrs.pop("history")  # when it was written: the one attribute that differs
            runs.append(run)
    xr.testing.assert_identical(runs[0], runs[1])


WORKER = """
import json, sys
from dse.optimize import run_optimize
s = run_optimize(sys.argv[1], int(sys.argv[2]), seed=int(sys.argv[3]), out=sys.argv[4], storage=sys.argv[5],
                 batch=16, progress=False)
print(json.dumps({"added": s["trials_added"]}))
"""


def test_two_workers_share_one_journal(tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    journal = tmp_path / "study.log"
    target = 64
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(STUDY),
                str(target),
                str(seed),
                str(tmp_path / f"w{seed}"),
                str(journal),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # compile faster (the workers' batches are small); results do not depend on it
            env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0"},
        )
        for seed in (1, 2)
    ]
    added = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        added.append(json.loads(out.strip().splitlines()[-1])["added"])
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name="llama2-13b-hardware", storage=storage).trials
    numbers = [t.number for t in trials]
    assert sorted(numbers) == list(range(len(trials)))  # none lost, none duplicated
    assert sum(added) == len(trials)  # every trial a worker asked was told, by that worker
    assert target <= len(trials) <= target + 16  # concurrent workers overshoot by at most a batch
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all("metrics" in t.user_attrs["hetersim"] and stored_constraints(t) for t in trials)
    assert len({t.user_attrs["hetersim"]["worker"] for t in trials}) == sum(a > 0 for a in added)

    # resuming continues the same study, and the dataset holds every trial of the storage
    s = run_optimize(STUDY, len(trials) + 8, out=tmp_path, storage=str(journal), batch=BATCH, progress=False)
    assert s["trials_added"] == 8
    with xr.open_dataset(s["path"]) as ds:
        assert list(ds.trial.values) == list(range(len(trials) + 8))
        assert int(ds.state.isin([1]).sum()) == len(trials) + 8


def test_cli_commands_once_registered(tmp_path):
    from typer.testing import CliRunner

    from dse.cli import app

    names = {c.name for c in app.registered_commands}
    assert {"optimize", "sensitivity"} <= names
    runner = CliRunner()
    res = runner.invoke(app, ["optimize", str(STUDY), "--trials", "16", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["n_trials"] == 16
    res = runner.invoke(app, ["optimize", str(STUDY), "--sampler", "cmaes"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "--sampler" in res.output
    args = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]
    res = runner.invoke(app, ["sensitivity", *args, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["parameters"][0]["elasticity"] < 0


def test_a_search_with_nothing_feasible_says_why(tmp_path, capsys):
    """Every layout of LLaMA-2-13B unsharded on one GPU (tp 1, pp 1, ZeRO 0: ~16 bytes a parameter)
    overflows HBM: the summary counts each infeasible trial's reasons by its stored layout's flags
    and prints them, instead of only "no feasible trial"."""
    path = variant(tmp_path, "tp = [1, 2, 4, 8]\npp = [1, 2, 4, 8]", "tp = [1]\npp = [1]")
    path.write_text(path.read_text().replace("zero = [0, 1, 3]", "zero = [0]"))
    s = optimize_command(path, 4, "random", 0, tmp_path, None, None, 4, False)
    assert s["n_feasible"] == 0 and s["best"]["time_to_train_s"] is None
    reasons = s["infeasible_reasons"]
    assert reasons["hbm_capacity"] == 4  # and the study's HBM bound, and gb 1536 against some dp
    assert set(reasons) <= {"hbm_capacity", "batch_divide", "constraint max_hbm_frac"}
    out = " ".join(capsys.readouterr().out.split())
    line = "infeasible trials (a constraint, or the flags of the layout stored where none runs): "
    assert line + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in reasons.items()) in out
    # A search constraint no trial meets is named as such (the layouts themselves run).
    path = variant(tmp_path, "[search.price]", "max_power_kW = 0.001\n\n[search.price]")
    s = optimize_command(path, 4, "random", 0, tmp_path / "power", None, None, 4, True)
    assert s["n_feasible"] == 0 and s["infeasible_reasons"]["constraint max_power_kW"] == 4


def test_export_only_with_zero_trials(tmp_path):
    s = run_optimize(STUDY, 0, out=tmp_path, progress=False)
    assert s["n_trials"] == 0 and s["trials_added"] == 0
    with xr.open_dataset(s["path"]) as ds:
        assert ds.sizes["trial"] == 0 and "time_to_train_s" in ds


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def variant(tmp_path: Path, old: str, new: str) -> Path:
    text = STUDY.read_text()
    assert old in text
    path = tmp_path / "variant.toml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("kwargs", "old", "new", "needle"),
    [
        ({"sampler": "cmaes"}, "", "", "--sampler"),
        ({"storage": "redis2://host/0"}, "", "", "--storage"),
        ({"storage": "/no/such/folder/journal.log"}, "", "", "--storage"),
        ({"batch": 0}, "", "", "--batch"),
        (
            {},
            'objectives = ["time_to_train_s", "cost_usd"]',
            'objectives = ["time_to_train", "cost_usd"]',
            "objectives",
        ),
        ({}, "max_hbm_frac = 0.95", "max_hbm_frac = 0.95\nmin_mfu = 0.6\nmax_mfu = 0.4", "constraints.min_mfu"),
        ({}, "low = 3000, high = 9600", "low = 9600, high = 3000", "search.hbm_bw_GBps"),
        ({}, "step = 12.5", "step = 10", "search.scaleout_bw_GBps.step"),
        ({}, "hbm_bw_GBps = {", "hbm_speed = {", "search.hbm_speed"),
        ({}, "scaleout_bw_GBps = 0.02", "nics = 0.02", "search.price.nics"),
        ({}, '"b200"]', '"b900"]', "search.gpu"),
        ({}, "max_hbm_frac = 0.95", "max_hbm_frac = 0.95\n[search.x]", "search.x"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(tmp_path, kwargs, old, new, needle):
    path = variant(tmp_path, old, new) if old else STUDY
    with pytest.raises(ValueError) as info:
        run_optimize(path, 8, out=tmp_path, progress=False, **kwargs)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_mixed_clusters_are_searched_with_search_mix(tmp_path):
    text = STUDY.read_text().split("\n[search]\n")[0]
    text = text.replace('gpu = "h100-sxm-80gb"', 'cluster = "h100-sxm-80gb:32,h200-sxm-141gb:32"')
    with pytest.raises(ValueError, match="hardware.cluster: mixed clusters are searched with search.mix"):
        parse_search(text)


def test_grid_sampler_needs_steps(tmp_path):
    path = variant(tmp_path, "low = 3000, high = 9600, step = 300", "low = 3000, high = 9600")
    with pytest.raises(ValueError, match="--sampler grid needs a discrete space; give a step to search.hbm_bw_GBps"):
        run_optimize(path, 8, sampler="grid", out=tmp_path, progress=False)


def test_search_defaults_to_the_hardware_lists(catalog):
    text = (
        STUDY.read_text().split("\n[search]\n")[0].replace('gpu = "h100-sxm-80gb"', 'gpu = ["h100-sxm-80gb", "b200"]')
    )
    s = parse_search(text.replace("n_gpus = 64", "n_gpus = [64, 128]"))
    assert [(p.name, p.choices) for p in s.outer] == [("gpu", ("h100-sxm-80gb", "b200")), ("n_gpus", (64, 128))]
    assert len(outer_grid(s)) == 4


# --------------------------------------------------------------------------------------------
# Sensitivity and continuous tuning
# --------------------------------------------------------------------------------------------

CONFIG = dict(model="llama2-70b", gpu="h100-sxm-80gb", gpus=256, global_batch=1024, tp=8, pp=4, zero=1)


def test_sensitivity_ranks_finite_elasticities_and_matches_finite_differences(catalog, cal, capsys):
    result = sensitivity_report(configuration(**CONFIG, recompute="selective"), json_out=True)
    capsys.readouterr()
    params = {p["path"]: p for p in result["parameters"]}
    assert set(params) == set(hw_params.names())
    assert all(np.isfinite(p["elasticity"]) and np.isfinite(p["derivative"]) for p in params.values())
    ranked = [abs(p["elasticity"]) for p in result["parameters"]]
    assert ranked == sorted(ranked, reverse=True)
    # element-wise kernels are HBM-bound: more bandwidth, shorter step
    hbm = params["device.hbm_bw_GBps"]
    assert hbm["derivative"] < 0
    assert params["device.peak_tflops[bf16]"]["elasticity"] < -0.3  # compute-bound layout
    assert params["network.latency_us[scale-up]"]["derivative"] > 0

    # d step / d hbm_bw against a central difference on the catalog entry (no hw_params involved)
    entry = catalog.gpu("h100-sxm-80gb")
    model = build.model_spec(catalog.model("llama2-70b"))
    plan = build.plan_spec(
        n_gpus=256, tp=8, pp=4, sp=True, zero=1, global_batch=1024, seq_len=4096, recompute="selective"
    )
    sim = jax.jit(simulate)

    def step(bw):
        e = apply_overrides("gpus", "h100-sxm-80gb", entry, {"hbm_bw_GBps": bw}, catalog=catalog)
        return float(sim(model, build.system_spec(e, catalog.links), plan, cal).step_time_s)

    h = 0.02 * entry["hbm_bw_GBps"]
    fd = (step(entry["hbm_bw_GBps"] + h) - step(entry["hbm_bw_GBps"] - h)) / (2 * h)
    with capsys.disabled():
        print(f"\nd step / d hbm_bw: jax.grad {hbm['derivative']:.4g} s per GB/s, central difference {fd:.4g}")
    assert hbm["derivative"] == pytest.approx(fd, rel=0.02)

    # the function API agrees with the command on one entry
    system = build.system_spec(entry, catalog.links)
    [only] = sensitivity(model, system, plan, cal, paths=["hbm_bw_GBps"])
    assert only.path == "device.hbm_bw_GBps" and only.derivative == pytest.approx(hbm["derivative"], rel=1e-5)


def test_tune_continuous_reaches_the_fine_grid_optimum(catalog, cal, capsys):
    model = build.model_spec(catalog.model("llama2-70b"))
    system = build.system_spec(catalog.gpu("h100-sxm-80gb"), catalog.links)
    plan = build.plan_spec(n_gpus=256, tp=8, pp=4, sp=True, zero=1, global_batch=1024, seq_len=4096)
    params = {"hbm_bw_GBps": (1000.0, 12000.0), "scaleout_bw_GBps": (5.0, 200.0)}
    price = {"hbm_bw_GBps": 0.0002, "scaleout_bw_GBps": 0.03}
    tuned = tune_continuous(model, system, plan, cal, params, price_model=price, objective="cost", steps=300)
    grid = grid_continuous(model, system, plan, cal, params, price_model=price, objective="cost", points=201)
    gap = tuned.objective / grid.objective - 1.0
    with capsys.disabled():
        print(
            f"\ntune_continuous (cost): ${tuned.objective:,.0f} at {tuned.values} vs 201x201 grid "
            f"${grid.objective:,.0f} at {grid.values}: gap {gap:+.3%} (start ${tuned.start_objective:,.0f})"
        )
    assert tuned.feasible
    assert gap <= 0.01
    assert tuned.objective < tuned.start_objective
    for path, v in tuned.values.items():
        lo, hi = params["hbm_bw_GBps" if "hbm" in path else "scaleout_bw_GBps"]
        assert lo <= v <= hi


@pytest.mark.parametrize(
    ("params", "kwargs", "needle"),
    [
        ({"hbm_bw_GBps": (5000.0, 3000.0)}, {}, "hbm_bw_GBps"),
        ({"hbm_speed": (1.0, 2.0)}, {}, "hbm_speed"),
        ({"hbm_bw_GBps": (1000.0, 3000.0)}, {"objective": "energy"}, "objective"),
        ({"hbm_bw_GBps": (1000.0, 3000.0)}, {"price_model": {"tdp_W": 1.0}}, "price_model"),
    ],
)
def test_tune_bad_input(catalog, cal, params, kwargs, needle):
    from tests.conftest import make

    with pytest.raises(ValueError, match=needle):
        tune_continuous(*make(catalog), cal, params, **kwargs)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def test_hw_params_cover_every_continuous_leaf(catalog):
    system = build.system_spec(catalog.gpu("h100-sxm-80gb"), catalog.links)
    paths = set(hw_params.names())
    for group in ("device", "network", "host"):
        spec = getattr(system, group)
        for field in spec.__dataclass_fields__:
            leaf = np.asarray(getattr(spec, field))
            if f"{group}.{field}" in hw_params.STRUCTURAL or not np.issubdtype(leaf.dtype, np.floating):
                continue
            if leaf.ndim == 0:
                assert f"{group}.{field}" in paths
            else:
                found = [p for p in paths if p.startswith(f"{group}.{field}[")]
                skip = 1 if group == "host" else 0  # host tier arrays: index 0 is HBM (device fields)
                assert len(found) == leaf.shape[-1] - skip, (group, field)


def _naive_front(p: np.ndarray) -> np.ndarray:
    n = len(p)
    return np.array([not any((p[j] <= p[i]).all() and (p[j] < p[i]).any() for j in range(n)) for i in range(n)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 6)] * 3), min_size=1, max_size=40))
def test_pareto_mask_equals_naive(rows):
    p = np.array(rows, dtype=float)
    assert np.array_equal(pareto_mask(p), _naive_front(p))
    flipped = pareto_mask(-p, senses=["max"] * 3)
    assert np.array_equal(flipped, _naive_front(p))


def test_hypervolume_by_hand():
    pts = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [3.5, 3.5], [5.0, 0.5]])
    # rectangles to the reference (4, 4): 1*1 + 1*2 + 1*3; (3.5, 3.5) is dominated, (5, 0.5) beyond ref
    assert hypervolume(pts, (4.0, 4.0)) == pytest.approx(6.0)
    assert hypervolume(-pts, (-4.0, -4.0), senses=["max", "max"]) == pytest.approx(6.0)
    assert hypervolume(np.empty((0, 2)), (1.0, 1.0)) == 0.0
    assert pareto_mask(np.array([[1.0, np.nan], [2.0, 2.0]])).tolist() == [False, True]


# --------------------------------------------------------------------------------------------
# Mixed clusters: search.mix (kinds and counts, by total or by hourly budget)
# --------------------------------------------------------------------------------------------

MIX_STUDY = """
name = "mix-tiny"
objectives = ["time_to_train_s", "cost_usd"]

[model]
key = "llama2-7b"

[hardware]
hetero = "pipeline"

[plan]
tp = [1, 2]
pp = [2, 4]
micro_batch = [1]
zero = [1]
recompute = ["selective"]
global_batch = 256
seq_len = 4096
train_tokens = 1.0e11

[constraints]
max_hbm_frac = 0.95

[search]
"""
MIX_TOTAL = 'mix = { kinds = ["h100-sxm-80gb", "h200-sxm-141gb"], total = 64, step = 16 }'
MIX_BUDGET = 'mix = { kinds = ["h100-sxm-80gb", "h200-sxm-141gb", "b200"], budget_usd_per_hour = 500, step = 16 }'
MIX_BATCH = 8  # every mix test shares one compiled inner solver (same batch and layout chunk)


def mix_file(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "mix.toml"
    path.write_text(MIX_STUDY + line + "\n")
    return path


def test_mix_search_finds_the_exhaustive_best(tmp_path, cal, capsys):
    space = parse_search(MIX_STUDY + MIX_TOTAL)
    assert space.mix is not None and space.outer_size == 5
    assert [p.name for p in space.outer] == ["n_h100-sxm-80gb"]
    assert all(sum(c) == 64 for c in space.mix.mixes)
    points, res = exhaustive(InnerSolver(space, batch=MIX_BATCH, cal=cal))
    ok = res["constraints"].max(axis=1) <= 0
    best = float(res["time_to_train_s"][ok].min())

    s = run_optimize(mix_file(tmp_path, MIX_TOTAL), 8, out=tmp_path, progress=False, batch=MIX_BATCH, cal=cal)
    with xr.open_dataset(s["path"]) as ds:
        done = ds.feasible.values.astype(bool)
        found = float(ds.time_to_train_s.values[done].min())
        counts = np.stack([ds["n_h100-sxm-80gb"].values, ds["n_h200-sxm-141gb"].values], axis=1)
        assert np.all(counts[done].sum(axis=1) == 64) and np.all(ds.n_gpus.values[done] == 64)
    with capsys.disabled():
        print(f"\nmix search: best time-to-train {found:.6g} s, exhaustive {best:.6g} s over {len(points)} mixes")
    assert found == pytest.approx(best, rel=1e-6)
    assert set(s["best"]["time_to_train_s"]) >= {"n_h100-sxm-80gb", "n_h200-sxm-141gb"}


def test_mix_budget_never_proposes_a_mix_over_budget(tmp_path, cal):
    space = parse_search(MIX_STUDY + MIX_BUDGET)
    mix = space.mix
    assert mix is not None and mix.budget == 500
    spend = [sum(c * p for c, p in zip(m, mix.prices, strict=True)) for m in mix.mixes]
    assert max(spend) <= 500 and all(sum(m) > 0 for m in mix.mixes)
    # The last kind takes every whole step the rest of the budget buys.
    assert all(500 - s < mix.prices[-1] * mix.step for s in spend)
    s = run_optimize(
        mix_file(tmp_path, MIX_BUDGET), 16, sampler="random", out=tmp_path, progress=False, batch=MIX_BATCH, cal=cal
    )
    with xr.open_dataset(s["path"]) as ds:
        done = ds.state.values == 1
        counts = np.stack([ds[n].values for n in mix.names], axis=1)
        assert done.any()
        assert np.all(counts[done] @ np.asarray(mix.prices) <= 500 + 1e-9)
        assert {tuple(c) for c in counts[done]} <= set(mix.mixes)
        assert np.all(ds.state.values[~done] == 2)  # the rest are pruned: counts over budget


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('mix = { kinds = ["h100-sxm-80gb", "h900"], total = 64, step = 16 }', "search.mix.kinds"),
        ('mix = { kinds = ["h100-sxm-80gb", "h200-sxm-141gb"], total = 64, step = 24 }', "search.mix.step"),
        (
            'mix = { kinds = ["h100-sxm-80gb", "h200-sxm-141gb"], budget_usd_per_hour = 50, step = 16 }',
            "search.mix.budget_usd_per_hour",
        ),
        ('mix = { kinds = ["h100-sxm-80gb"], total = 64, step = 16 }', "search.mix.kinds"),
        ('mix = { kinds = ["h100-sxm-80gb", "b200"], step = 16 }', "search.mix"),
        ('mix = { kinds = ["h100-sxm-80gb", "b200"], total = 64, step = 16, x = 1 }', "search.mix.x"),
        ('mix = { kinds = ["h100-sxm-80gb", "b200"], total = 64, step = 16 }\nhbm_bw_GBps = [3000.0]', "search.hbm_bw"),
        ('mix = { kinds = ["h100-sxm-80gb", "b200"], total = 64, step = 16 }\ngpu = ["b200"]', "search.gpu"),
    ],
)
def test_mix_bad_input_is_one_line_naming_the_key(line, needle):
    with pytest.raises(ValueError) as info:
        parse_search(MIX_STUDY + line)
    message = str(info.value)
    assert needle in message and "\n" not in message


def _running_trials(journal: Path) -> int:
    """RUNNING trials of the journal's study that their worker has marked (asked and held)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from dse.optimize.storage import WORKER_ATTR

    if not journal.is_file():
        return 0
    try:
        storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
        study = optuna.load_study(study_name="llama2-13b-hardware", storage=storage)
    except (KeyError, ValueError):  # the study is not written yet
        return 0
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return sum(WORKER_ATTR in t.system_attrs for t in running)


def test_killed_worker_leaves_no_trial_running_forever(tmp_path):
    """A worker killed with SIGKILL while its trials run cannot fail them; the next run on the
    same journal fails them (their worker is gone) and completes the study."""
    import signal
    import time

    import optuna
    from optuna.storages.journal import JournalFileBackend

    journal = tmp_path / "study.log"
    cmd = [sys.executable, "-c", WORKER, str(STUDY), "48", "3", str(tmp_path / "killed"), str(journal)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        # kill it in the middle of a batch: every trial of the batch asked, the solve (its first
        # compile takes seconds) not done. A worker killed between ask and marking a trial leaves
        # one that only the grace period fails (GRACE_S), which this test does not wait for.
        while _running_trials(journal) < 16:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the worker never held a running trial"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stranded = _running_trials(journal)
    assert stranded > 0

    s = run_optimize(STUDY, 48, seed=3, out=tmp_path, storage=str(journal), batch=16, progress=False)
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name="llama2-13b-hardware", storage=storage).trials
    states = [t.state for t in trials]
    assert optuna.trial.TrialState.RUNNING not in states
    assert set(states) <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL}
    assert states.count(optuna.trial.TrialState.FAIL) == stranded
    assert states.count(optuna.trial.TrialState.COMPLETE) == 48 and s["n_trials"] == len(trials)


def test_stale_trials_of_a_silent_worker_elsewhere_are_failed_after_the_grace_period(tmp_path):
    """A worker on another host cannot be asked whether it lives: its trials fail once its
    heartbeat is older than the grace period, not before."""
    import optuna

    from dse.optimize import storage as st

    study = optuna.create_study(storage=st.open_storage(str(tmp_path / "j.log")), study_name="s")
    trial = study.ask()
    study._storage.set_trial_system_attr(trial._trial_id, st.WORKER_ATTR, "elsewhere:1")
    study._storage.set_trial_system_attr(trial._trial_id, st.BEAT_ATTR, 1000.0)
    assert st.fail_stale_trials(study, now=1000.0 + st.GRACE_S - 1) == []
    assert st.fail_stale_trials(study, now=1000.0 + st.GRACE_S + 1) == [trial.number]
    assert study.trials[0].state == optuna.trial.TrialState.FAIL


def test_workers_without_seed_sample_differently():
    from dse.optimize.loop import worker_seed

    assert worker_seed(None, None) == 0 and worker_seed(5, "j.log") == 5
    assert len({worker_seed(None, "j.log") for _ in range(8)}) > 1


@pytest.mark.parametrize("trials", [3, 4])
def test_trials_at_or_below_the_corners_are_all_evaluated(tmp_path, trials):
    """NSGA-II starts with the box's corners queued (four here: two GPUs x two bandwidths); a run
    asking for no more trials than that evaluates that many, none of them left waiting (the queued
    corners were counted as done and the run ended with none evaluated)."""
    study = tmp_path / "corners.toml"
    study.write_text(
        'name = "corners"\n[model]\nkey = "llama2-7b"\n[hardware]\ngpu = "h100-sxm-80gb"\nn_gpus = 8\n'
        "[plan]\ntp = [1, 2]\nglobal_batch = 64\nseq_len = 4096\n"
        '[search]\ngpu = ["h100-sxm-80gb", "h200-sxm-141gb"]\nhbm_bw_GBps = [3000.0, 4000.0]\n'
        "[search.price]\nhbm_bw_GBps = 0.001\n"
    )
    s = run_optimize(study, trials, out=tmp_path, batch=BATCH, progress=False)
    assert "NSGAIISampler" in s["sampler"]
    assert s["trials_added"] == s["n_trials"] == trials
    assert s["states"] == {"complete": trials} and s["layouts_evaluated"] == 2 * trials
