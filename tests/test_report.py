"""Pareto sorting and hypervolume against brute force and hand-computed cases; the report on a
tiny sweep (files, offline HTML that headless Chromium renders without console messages);
bad input as one-line ``ValueError``s."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from dse import sweep
from dse.cli.report import report_command
from dse.pareto import hypervolume, pareto_front, pareto_mask
from dse.report import build_report, open_results, validation, write_report
from dse.report.figures import HeatPanel, heatmap_figure

# --------------------------------------------------------------------------------------------
# Non-dominated sorting
# --------------------------------------------------------------------------------------------


def brute_mask(values: np.ndarray, senses=None) -> np.ndarray:
    """The definition over all pairs: no other row at least as good everywhere and better somewhere."""
    v = np.asarray(values, dtype=float)
    if senses is not None:
        v = v * np.array([-1.0 if s == "max" else 1.0 for s in senses])
    ok = ~np.isnan(v).any(axis=1)
    # beats[i, j]: row j dominates row i (a comparison with NaN is False, so NaN rows beat nothing)
    beats = (v[None, :, :] <= v[:, None, :]).all(axis=2) & (v[None, :, :] < v[:, None, :]).any(axis=2)
    return ok & ~beats.any(axis=1)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_pareto_mask_equals_brute_force_with_ties_and_duplicates(k):
    rng = np.random.default_rng(k)
    for trial in range(120):
        n = int(rng.integers(0, 70))
        levels = int(rng.integers(2, 8))  # few levels: many ties and exact duplicates
        v = rng.integers(0, levels, size=(n, k)).astype(float)
        if n and trial % 4 == 0:
            v[rng.random((n, k)) < 0.05] = np.inf
        if n and trial % 5 == 0:
            v[rng.integers(0, n), rng.integers(0, k)] = np.nan
        if n > 3 and trial % 3 == 0:
            v[: n // 3] = v[n // 3 : 2 * (n // 3)]  # blocks of duplicated rows
        senses = tuple(rng.choice(["min", "max"], size=k))
        np.testing.assert_array_equal(pareto_mask(v), brute_mask(v), err_msg=f"k={k} trial={trial}")
        np.testing.assert_array_equal(pareto_mask(v, senses), brute_mask(v, senses), err_msg=f"{senses}")


def test_pareto_continuous_random_against_brute_force():
    rng = np.random.default_rng(7)
    for k in (2, 3):
        v = rng.random((400, k))
        np.testing.assert_array_equal(pareto_mask(v), brute_mask(v))


def test_pareto_hand_cases():
    # Duplicates on the front are all kept; a tie in one objective with a worse other is dominated.
    v = np.array([[1, 3], [1, 3], [2, 2], [2, 3], [3, 1], [3, 1], [4, 1]], dtype=float)
    assert pareto_mask(v).tolist() == [True, True, True, False, True, True, False]
    # Maximizing the second objective turns the order around.
    assert pareto_mask(v, ["min", "max"]).tolist() == [True, True, False, False, False, False, False]
    # 3-D: (1,1,1) dominates (1,1,2) and (2,2,2); (0,5,5) and (5,0,5) are incomparable to it.
    w = np.array([[1, 1, 2], [2, 2, 2], [1, 1, 1], [0, 5, 5], [5, 0, 5], [1, 1, 1]], dtype=float)
    assert pareto_mask(w).tolist() == [False, False, True, True, True, True]
    assert pareto_front(v).tolist() == [0, 1, 2, 4, 5]
    assert pareto_mask(np.zeros((0, 3))).shape == (0,)


def test_pareto_rejects_bad_shapes_and_senses():
    with pytest.raises(ValueError, match="senses"):
        pareto_mask(np.ones((3, 2)), ["min"])
    with pytest.raises(ValueError, match="'min' or 'max'"):
        pareto_mask(np.ones((3, 2)), ["min", "best"])
    with pytest.raises(ValueError, match=r"\(n, k\)"):
        pareto_mask(np.ones((2, 2, 2)))


@pytest.mark.parametrize("k", [2, 3])
def test_million_points(k):
    """Runs to completion (speed is measured elsewhere, never asserted)."""
    v = np.random.default_rng(0).random((1_000_000, k))
    mask = pareto_mask(v)
    assert 0 < mask.sum() < 10_000
    for j in range(k):
        assert mask[np.argmin(v[:, j])]  # each objective's best row is on the front
    front = v[mask]
    pick = np.random.default_rng(1).choice(len(v), 3000, replace=False)
    dominates = (front[:, None, :] <= v[pick][None]).all(axis=2) & (front[:, None, :] < v[pick][None]).any(axis=2)
    np.testing.assert_array_equal(dominates.any(axis=0), ~mask[pick])


# --------------------------------------------------------------------------------------------
# Hypervolume
# --------------------------------------------------------------------------------------------


def test_hypervolume_hand_cases():
    # Two boxes [1,3]x[2,3] and [2,3]x[1,3] overlap in [2,3]x[2,3]: 2 + 2 - 1.
    assert hypervolume([[1, 2], [2, 1]], [3, 3]) == pytest.approx(3.0)
    # Dominated points, duplicates and points outside the reference box add nothing.
    assert hypervolume([[1, 2], [2, 1], [2, 1], [2, 2], [5, 0], [3, 0]], [3, 3]) == pytest.approx(3.0)
    assert hypervolume([[4, 4]], [3, 3]) == 0.0
    assert hypervolume(np.zeros((0, 2)), [1, 1]) == 0.0
    # One point: a box.
    assert hypervolume([[0, 0, 0]], [1, 2, 3]) == pytest.approx(6.0)
    # Two 3-D boxes 2x2x1 and 1x1x2 overlapping in a unit cube: 4 + 2 - 1.
    assert hypervolume([[0, 0, 1], [1, 1, 0]], [2, 2, 2]) == pytest.approx(5.0)
    # Three points on the plane x+y+z = 1 with the reference at (1,1,1): 3 unit-ish boxes.
    pts = [[0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]]
    # Each box is 1 x 0.5 x 0.5 = 0.25; pairwise overlaps 0.5^3 = 0.125 each; triple 0.125.
    assert hypervolume(pts, [1, 1, 1]) == pytest.approx(3 * 0.25 - 3 * 0.125 + 0.125)
    # Maximization: the reference is a lower bound.
    assert hypervolume([[3, 2]], [1, 1], senses=["max", "max"]) == pytest.approx(2.0)
    # Min x, max y: [1,3]x[0,2] and [2,3]x[0,3] overlap in [2,3]x[0,2]: 4 + 3 - 2.
    assert hypervolume([[1, 2], [2, 3]], [3, 0], senses=["min", "max"]) == pytest.approx(5.0)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_hypervolume_counts_unit_cells(k):
    """On integer points the volume is the number of dominated unit cells inside the box."""
    rng = np.random.default_rng(k)
    ref = np.full(k, 6.0)
    for _ in range(25):
        pts = rng.integers(0, 7, size=(int(rng.integers(1, 12)), k)).astype(float)
        cells = np.array(list(itertools.product(range(6), repeat=k)), dtype=float)
        covered = (pts[None, :, :] <= cells[:, None, :]).all(axis=2).any(axis=1)
        assert hypervolume(pts, ref) == pytest.approx(float(covered.sum()))


def test_hypervolume_four_objectives_by_hand():
    # One 4-D box 1x2x3x4; two boxes 2x2x2x1 and 1x1x1x2 overlapping in a unit hypercube: 8 + 2 - 1.
    assert hypervolume([[0, 0, 0, 0]], [1, 2, 3, 4]) == pytest.approx(24.0)
    assert hypervolume([[0, 0, 0, 1], [1, 1, 1, 0]], [2, 2, 2, 2]) == pytest.approx(9.0)


def test_hypervolume_agrees_with_optunas():
    """moocore (what :func:`hypervolume` calls) and Optuna's own WFG give the same volume."""
    from optuna._hypervolume import compute_hypervolume

    rng = np.random.default_rng(0)
    for k in (2, 3):
        pts = rng.random((300, k))
        ref = np.full(k, 1.1)
        assert hypervolume(pts, ref) == pytest.approx(compute_hypervolume(pts, ref), rel=1e-12)


def test_hypervolume_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2 objectives"):
        hypervolume(np.ones((2, 1)), np.zeros(1))
    with pytest.raises(ValueError, match="one value per objective"):
        hypervolume(np.ones((2, 2)), np.zeros(3))


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------

TINY = """\
name = "tiny_report"
description = "two GPUs, two sizes, a handful of layouts"
objectives = ["time_to_train_s", "cost_usd"]

[model]
key = "llama2-7b"

[hardware]
gpu = ["h100-sxm-80gb", "a100-sxm-80gb"]
n_gpus = [8, 16]

[plan]
tp = [1, 2, 4]
pp = [1, 2]
micro_batch = [1, 2]
zero = [0, 1]
recompute = ["none", "full"]
global_batch = 64
seq_len = 2048
train_tokens = 1.0e11

[constraints]
max_hbm_frac = 0.9
"""


@pytest.fixture(scope="module")
def tiny_nc(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    study = tmp / "tiny_report.toml"
    study.write_text(TINY)
    return sweep.run_sweep(study, tmp, chunk=256, progress=False)


@pytest.fixture(scope="module")
def report(tiny_nc, tmp_path_factory):
    """The report of the tiny sweep, with the validation run, in the default folder (its cache in
    a temporary folder, not the user's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        return build_report(tiny_nc)


def test_report_writes_page_and_figures(tiny_nc, report):
    out = tiny_nc.with_suffix("")
    assert report.index == out / "index.html" and report.index.is_file()
    expected = {"front_cost", "front_energy", "breakdown", "memory", "memory_tiers"}
    assert expected <= set(report.figures)
    assert any(name.startswith("heatmap_") for name in report.figures)
    for paths in report.figures.values():
        assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert paths["png"].stat().st_size > 2000
        svg = paths["svg"].read_text()
        assert "<svg" in svg and len(svg) > 2000
    page = report.index.read_text()
    for text in ("tiny_report", "Pareto fronts", "The Pareto set", "Step-time breakdown", "Memory per GPU",
                 "Memory per tier", "Best objective over two study axes", "Sensitivities: not available", "MAPE",
                 "Study file", "Versions and calibration"):  # fmt: skip
        assert text in page, text
    # Offline: every image is embedded, every link points at a file written beside the page.
    assert re.findall(r'<img src="(?!data:image/png;base64,)', page) == []
    for href in re.findall(r'href="([^"]+)"', page):
        assert href.startswith("data:") or (out / href).is_file(), href
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page
    assert "not sampled" not in page  # a sweep evaluates every cell of its grid
    assert "token budget</dt><dd>1e+11 tokens" in page
    s = report.summary
    assert s["n_feasible"] > 0 and len(s["pareto"]) >= 1
    assert s["validation"]["n_runs"] > 0 and s["validation"]["mape_step_time_pct"] > 0
    total = sum(p.stat().st_size for p in out.iterdir())
    assert total < 2_000_000


def test_pareto_table_is_the_front_of_the_feasible_set(tiny_nc, report):
    with xr.open_dataset(tiny_nc) as ds:
        ok = ds["feasible"].values == 1
        v = np.stack([ds["time_to_train_s"].values, ds["cost_usd"].values], axis=1)
    expected = np.flatnonzero(ok)[brute_mask(v[ok])]
    assert sorted(row["config"] for row in report.summary["pareto"]) == sorted(expected.tolist())
    row = report.summary["pareto"][0]
    assert row["gpu"] in ("h100-sxm-80gb", "a100-sxm-80gb") and row["recompute"] in ("none", "full")
    assert {"tp", "pp", "dp", "step_time_s", "compute_s", "hbm_used_GiB", "energy_kWh"} <= set(row)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary on PATH (the CI script installs it)")
def test_page_renders_in_headless_chromium(report, tmp_path):
    from PIL import Image

    shot = tmp_path / "shot.png"
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1200,900",
        report.index.resolve().as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 1  # None: more colours than the limit


def test_report_of_optimize_style_results_with_elasticities_and_missing_parts(tiny_nc, tmp_path, capsys):
    """Records along ``trial`` (as ``hetersim optimize`` writes them), elasticity variables, and
    a memory part and a step-time term missing: the page shows what it can and says what not."""
    with xr.open_dataset(tiny_nc) as ds:
        ds = ds.load()
    n = ds.sizes["config"]
    ds["elasticity_step_time_s_hbm_bw_GBps"] = ("config", np.linspace(-0.4, -0.1, n, dtype=np.float32))
    ds["elasticity_step_time_s_peak_tflops"] = ("config", np.full(n, -0.7, np.float32))
    ds = ds.drop_vars(["activations_GiB", "bubble_s"]).rename({"config": "trial"})
    ds.attrs["constraints"] = "max_hbm_frac"  # optimize results name their constraints, not as JSON
    path = tmp_path / "changed.nc"
    ds.to_netcdf(path)
    summary = report_command(path, tmp_path / "rep", json_out=True, validation=False)
    printed = json.loads(capsys.readouterr().out)
    assert printed["index"] == summary["index"] == str(tmp_path / "rep" / "index.html")
    assert "sensitivity" in printed["figures"] and "front_cost" in printed["figures"]
    assert printed["validation"] is None and len(printed["pareto"]) >= 1
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "step_time_s_hbm_bw_GBps" in page and "Sensitivities: not available" not in page
    assert "activations_GiB" in page and "bubble_s" in page  # the page says what it could not show
    assert any("activations_GiB" in note for note in printed["notes"])


OFFLOADING = """\
name = "tiny_tiers"
description = "optimizer states on CXL expanders: the memory-per-tier figure has HBM, host DRAM and CXL"
objectives = ["time_to_train_s", "cost_usd"]

[model]
key = "llama2-7b"

[hardware]
gpu = ["h100-sxm-80gb"]
n_gpus = [8, 16]

[hardware.set]
cxl_expander = "micron-cz120:2"

[plan]
tp = [1, 2]
pp = [1, 2]
micro_batch = [1, 2]
zero = [1, 3]
recompute = ["none", "full"]
global_batch = 64
seq_len = 2048
train_tokens = 1.0e11
offload = { optimizer = "cxl-expander" }
"""


def test_memory_per_tier_figure_of_an_offloading_study(tmp_path):
    study = tmp_path / "tiny_tiers.toml"
    study.write_text(OFFLOADING)
    nc = sweep.run_sweep(study, tmp_path, chunk=256, progress=False)
    rep = build_report(nc, tmp_path / "rep", validation=False)
    paths = rep.figures["memory_tiers"]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths["png"].stat().st_size > 2000
    svg = paths["svg"].read_text()
    for label in ("HBM per GPU", "host DRAM per node", "CXL expanders per node", "capacity"):
        assert label in svg, label
    assert "CXL pool per node" not in svg  # no pool anywhere: the tier is skipped and the page says so
    page = rep.index.read_text()
    assert "Memory per tier" in page and "CXL pool (zero capacity everywhere)" in page
    row = rep.summary["pareto"][0]
    assert row["cxl_expander_capacity_GiB"] == pytest.approx(2 * 256.0)
    assert 0 < row["cxl_expander_used_GiB"] < row["cxl_expander_capacity_GiB"]


def test_report_without_per_tier_memory_says_so(tiny_nc, tmp_path):
    """A dataset written before the per-tier variables existed still reports; the section says why not."""
    with xr.open_dataset(tiny_nc) as ds:
        ds = ds.load()
    ds = ds.drop_vars([n for n in ds.data_vars if n.startswith(("host_dram_", "cxl_"))])
    path = tmp_path / "old.nc"
    ds.to_netcdf(path)
    rep = build_report(path, tmp_path / "old", validation=False)
    assert "memory_tiers" not in rep.figures and "memory" in rep.figures
    page = rep.index.read_text()
    assert "Memory per tier" in page and "Not available: the dataset has no per-tier memory variables" in page
    assert any(note.startswith("memory per tier: not available") for note in rep.summary["notes"])


def test_report_without_feasible_configurations(tiny_nc, tmp_path):
    with xr.open_dataset(tiny_nc) as ds:
        ds = ds.load()
    ds["feasible"][:] = 0
    path = tmp_path / "none.nc"
    ds.to_netcdf(path)
    index = write_report(path, tmp_path / "none", validation=False)
    page = index.read_text()
    assert "No feasible configuration" in page
    # the answer says why, from the file's flags (its overview counts them too)
    assert ds["infeasible"].values.any()
    said = re.search(r"No configuration of this study is feasible</b>: (.+?) \(a configuration may have", page)
    counted = re.search(r"<dt>not feasible because</dt><dd>(.+?)</dd>", page)
    assert said and counted and said.group(1) == counted.group(1) and re.search(r"[a-z] [0-9,]+", said.group(1))
    ds["infeasible"][:] = 0
    if "constraint_violation" in ds:
        ds["constraint_violation"][:] = 0
    ds.to_netcdf(tmp_path / "unflagged.nc")
    page = write_report(tmp_path / "unflagged.nc", tmp_path / "unflagged", validation=False).read_text()
    assert "No configuration of this study is feasible</b> (the file records no reason)." in page


def test_bad_input_is_one_line_value_error(tiny_nc, tmp_path):
    text = tmp_path / "notes.nc"
    text.write_text("not a netCDF file\n")
    cases = [
        (tmp_path / "missing.nc", "no such results file"),
        (text, "not a netCDF results dataset"),
    ]
    plain = tmp_path / "plain.nc"
    xr.Dataset({"x": ("row", np.arange(3.0))}).to_netcdf(plain)
    cases.append((plain, "no 'config' or 'trial' dimension"))
    with xr.open_dataset(tiny_nc) as ds:
        ds.load().drop_vars("cost_usd").to_netcdf(tmp_path / "nocost.nc")
    cases.append((tmp_path / "nocost.nc", "lacks variable.*cost_usd"))
    for path, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            write_report(path, tmp_path / "out", validation=False)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="lacks variable"):
        open_results(tmp_path / "nocost.nc")


# --------------------------------------------------------------------------------------------
# The validation cache
# --------------------------------------------------------------------------------------------


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """validation.compute replaced by a counter; its inputs one file in tmp_path; the cache there."""
    calls = []
    source = tmp_path / "runs.csv"
    source.write_text("id,step_time_s\na,1.0\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(validation, "inputs", lambda moe=False: [source])
    monkeypatch.setattr(validation, "compute", lambda moe=False: calls.append(1) or fake_validation(10.0 + len(calls)))
    return calls, source


def fake_validation(mape: float) -> dict:
    return {
        "n_runs": 3,
        "n_complete": 2,
        "n_infeasible": 0,
        "mape_step_time_pct": mape,
        "mape_step_time_pct_complete": mape / 2,
        "max_abs_error_pct": 2 * mape,
        "per_source": {"paper": {"n": 3, "mape_pct": mape, "max_abs_error_pct": 2 * mape}},
        "runs_path": "published_runs.csv",
    }


def test_validation_is_computed_once_per_input(counted):
    calls, source = counted
    first = validation.validation_summary()
    assert validation.validation_summary() == first == fake_validation(11.0) and len(calls) == 1
    assert len(list((source.parent / "cache" / "hetersim").glob("validation-*.json"))) == 1
    source.write_text("id,step_time_s\na,2.0\n")  # a changed input: a new fingerprint, recomputed
    assert validation.validation_summary() == fake_validation(12.0) and len(calls) == 2
    assert validation.validation_summary()["mape_step_time_pct"] == 12.0 and len(calls) == 2


def test_unreadable_validation_cache_is_recomputed(counted):
    calls, source = counted
    validation.validation_summary()
    (cached,) = (source.parent / "cache" / "hetersim").glob("validation-*.json")
    for k, broken in enumerate(('{"truncated": ', '{"mape_step_time_pct": 1.0}')):  # cut short; from an old version
        cached.write_text(broken)
        assert validation.validation_summary() == fake_validation(12.0 + k) and len(calls) == 2 + k
        assert json.loads(cached.read_text()) == fake_validation(12.0 + k)  # rewritten whole
    assert validation.validation_summary() == fake_validation(13.0) and len(calls) == 3


def test_second_report_reads_the_cached_validation(tiny_nc, tmp_path, counted, monkeypatch):
    calls, _ = counted
    monkeypatch.setattr("dse.report.build.Figures.add", lambda self, fig, name, caption: "")  # no files
    for k in range(2):
        rep = build_report(tiny_nc, tmp_path / f"rep{k}")
        assert rep.summary["validation"] == fake_validation(11.0)
        assert "MAPE) of <b>11.0 %" in rep.index.read_text()
    assert len(calls) == 1


def test_validation_fingerprint_follows_the_packaged_inputs():
    paths = validation.inputs()
    names = {p.name for p in paths}
    assert {"published_runs.csv", "calibration.toml"} <= names and all(p.is_file() for p in paths)
    assert validation.fingerprint() == validation.fingerprint(paths) != validation.fingerprint(paths[1:])


# --------------------------------------------------------------------------------------------
# Results of `hetersim optimize`
# --------------------------------------------------------------------------------------------


def test_heatmap_cell_never_sampled_says_so():
    grid = np.array([[1.0, np.nan], [np.nan, 2.0]])
    sampled = np.array([[True, True], [False, True]])
    fig = heatmap_figure([HeatPanel("", grid, ["a", "b"], ["x", "y"], sampled)], "x", "y", "v", "min")
    texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in fig.axes[0].texts}
    assert texts == {(0, 0): "1", (1, 0): "–", (0, 1): "not\nsampled", (1, 1): "2"}


def test_report_of_a_search_names_gaps_budget_and_hardware(tiny_nc, tmp_path):
    """A dataset shaped like ``hetersim optimize`` output: records along ``trial``, a searched
    hardware parameter among ``outer_variables``, the token budget only in the study file, and
    tp 4 × pp 2 never tried while tp 4 × pp 1 was tried but nothing there is feasible."""
    with xr.open_dataset(tiny_nc) as ds:
        ds = ds.load()
    gpus = ds["gpu"].attrs["flag_meanings"].split()
    gpu, n = ds["gpu"].values, ds["n_gpus"].values
    ds["hbm_bw_GBps"] = ("config", np.where(gpu == gpus.index("h100-sxm-80gb"), 3350.0, 2039.0) + 0.5 * n)
    ds["hbm_bw_GBps"].attrs.update(units="GB/s", long_name="searched hardware parameter gpu.hbm_bw_GBps")
    tp, pp = ds["tp"].values, ds["pp"].values
    ds["feasible"][:] = np.where((tp == 4) & (pp == 1), 0, ds["feasible"].values)
    ds = ds.isel(config=np.flatnonzero(~((tp == 4) & (pp == 2)))).rename({"config": "trial"})
    ds.attrs["outer_variables"] = "gpu n_gpus hbm_bw_GBps"
    del ds.attrs["fixed_plan"]
    path = tmp_path / "search.optimize.nc"
    ds.to_netcdf(path)
    rep = build_report(path, tmp_path / "rep", validation=False)
    page = rep.index.read_text()
    assert "token budget</dt><dd>1e+11 tokens" in page
    assert "heatmap_tp_pp_time_to_train_s" in rep.figures
    assert "not sampled: the search tried no configuration there" in page
    svg = rep.figures["heatmap_tp_pp_time_to_train_s"]["svg"].read_text()
    assert svg.count("sampled") == 1 and "–" in svg  # one gap; the tried tp 4 × pp 1 cell has a dash
    best = {row["hbm_bw_GBps"] for row in rep.summary["pareto"]}
    front = rep.figures["front_cost"]["svg"].read_text()
    assert any(f"hbm_bw_GBps={v:g}" in front for v in best)
    assert f"hbm_bw_GBps={rep.summary['pareto'][0]['hbm_bw_GBps']:g}" in page


def test_a_study_of_moe_models_is_judged_against_the_moe_runs(counted, monkeypatch):
    """The report of a study with a mixture-of-experts model quotes the MoE validation (its own
    cache file), a dense study the dense one."""
    from types import SimpleNamespace

    from dse.report.build import _has_experts

    assert _has_experts(SimpleNamespace(group_names=["deepseek-v3"]))
    assert not _has_experts(SimpleNamespace(group_names=["llama2-70b", "not-a-model"]))
    assert validation.runs_path(moe=True).name == "moe_runs.csv" and validation.runs_path().name == "published_runs.csv"
    seen = []
    monkeypatch.setattr(
        validation, "compute", lambda moe=False: seen.append(moe) or fake_validation(20.0 if moe else 9.0)
    )
    assert validation.validation_summary(moe=True)["mape_step_time_pct"] == 20.0
    assert validation.validation_summary()["mape_step_time_pct"] == 9.0 and seen == [True, False]
