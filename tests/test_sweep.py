"""The sweep engine: values equal one-configuration ``simulate``, one compile for all chunks,
resume after an interruption, Dask equals local, study validation, and the netCDF file.

Every sweep here has the same shape (factor lengths and chunk), so the chunk function compiles
once for the whole module.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
import xarray as xr

from dse import sweep
from dse.bench import bench_space, run_bench
from dse.cli.sweep import sweep_command
from dse.metrics import INTERVALS, METRICS, STEP_TERM_LABELS
from dse.pareto import pareto_mask
from dse.study import DEFAULT_STUDY, load_study, parse_study
from dse.sweep import evaluate as sweep_evaluate
from dse.sweep import run as sweep_run
from dse.sweep import stream as sweep_stream
from hetersim import build
from hetersim.catalog import load_catalog
from hetersim.fit.calibration import load_calibration
from hetersim.simulate import STEP_TERMS, Breakdown, simulate
from hetersim.types import TIER

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 64
# The sweep's chunk compiles with XLA's fast math (NaNs, infinities, division honoured: float32
# sums and products reassociated, multiply-adds fused), so it agrees with one-at-a-time
# evaluation to float32 rounding over a few dozen operations, not bit for bit.
SWEEP_RTOL = 1e-5

TINY = """\
name = "tiny"
objectives = ["time_to_train_s", "cost_usd", "mfu"]

[model]
key = "{model}"

[hardware]
gpu = ["h100-sxm-80gb", "a100-sxm-80gb"]
n_gpus = [8, 12]

[plan]
tp = [1, 2, 4]
pp = [1, 2]
vp = [1, 2]
micro_batch = [1, 2]
zero = [0, 3]
recompute = ["none", "full"]
global_batch = 48
seq_len = 2048
train_tokens = {tokens}

[constraints]
max_hbm_frac = 0.9
"""


def write_study(tmp_path: Path, model: str = "llama2-7b", tokens: float = 1.0e11, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(TINY.format(model=model, tokens=tokens))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, xr.Dataset]:
    """The tiny study swept once: (study path, dataset loaded into memory)."""
    tmp = tmp_path_factory.mktemp("tiny")
    study = write_study(tmp)
    path = sweep.run_sweep(study, tmp / "out", chunk=CHUNK, progress=False)
    with xr.open_dataset(path) as ds:
        return study, ds.load()


def assert_same(a: xr.Dataset, b: xr.Dataset) -> None:
    """Same values and attributes, but for ``history`` (when the file was written)."""
    a, b = a.copy(), b.copy()
    assert a.attrs.pop("history") and b.attrs.pop("history")
    xr.testing.assert_identical(a, b)
    assert a.attrs.keys() == b.attrs.keys()
    for key in a.attrs:
        assert np.array_equal(a.attrs[key], b.attrs[key]), key


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


def test_space_filters_only_by_integer_rules(tiny):
    study_path, ds = tiny
    study = load_study(study_path)
    assert ds.sizes["config"] == sweep.space_from_study(study).size
    # Every kept row has an integer dp and a global batch divisible by micro_batch * dp ...
    n, tp, pp, cp, dp = (ds[c].values for c in ("n_gpus", "tp", "pp", "cp", "dp"))
    assert np.all(n == tp * pp * cp * dp)
    assert np.all(ds.global_batch.values % (ds.micro_batch.values * dp) == 0)
    # ... and every dropped one breaks a rule: the kept count is exactly the passing count.
    passing = 0
    for n_ in study.axes["n_gpus"]:
        for tp_ in study.axes["tp"]:
            for pp_ in study.axes["pp"]:
                for mb in study.axes["micro_batch"]:
                    dp_, rest = divmod(n_, tp_ * pp_)
                    passing += rest == 0 and 48 % (mb * dp_) == 0
    assert ds.sizes["config"] == passing * 2 * 2 * 2 * 2  # gpus, vp, zero, recompute
    assert ds.sizes["config"] < study.cross_product_size
    # Everything else is kept with its feasibility code, including infeasible rows.
    assert 0 < int(ds.feasible.sum()) < ds.sizes["config"]
    assert int((ds.infeasible != 0).sum()) > 0


def test_sweep_equals_single_configuration_simulate(tiny):
    study_path, ds = tiny
    catalog = load_catalog()
    cal = build.calibration_spec(load_calibration())
    single = jax.jit(simulate)
    names = {c: ds[c].attrs["flag_meanings"].split() for c in sweep.CODE_COLUMNS}
    rows = np.random.default_rng(0).choice(ds.sizes["config"], 12, replace=False)
    rows = np.concatenate([rows, [0, ds.sizes["config"] - 1]])
    for i in rows:
        row = {c: int(ds[c].values[i]) for c in sweep.COLUMNS}
        plan = build.plan_spec(
            n_gpus=row["n_gpus"],
            tp=row["tp"],
            pp=row["pp"],
            vp=row["vp"],
            cp=row["cp"],
            sp=row["tp"] > 1,  # the study's sp = "auto"
            zero=row["zero"],
            micro_batch=row["micro_batch"],
            global_batch=row["global_batch"],
            seq_len=row["seq_len"],
            train_tokens=1.0e11,
            recompute=names["recompute"][row["recompute"]],
            precision=names["precision"][row["precision"]],
            attention=names["attention"][row["attention"]],
            order=names["order"][row["order"]],
        )
        gpu = catalog.gpu(names["gpu"][row["gpu"]])
        model = build.model_spec(catalog.model(names["model"][row["model"]]))
        out = single(model, build.system_spec(gpu, catalog.links), plan, cal)
        for name in METRICS:
            want = np.asarray(getattr(out, name))
            np.testing.assert_allclose(ds[name].values[i], want, rtol=SWEEP_RTOL, err_msg=name)
        frac = float(out.hbm_used_GiB / out.hbm_capacity_GiB)
        assert int(ds.constraint_violation.values[i]) == int(frac > 0.9)
        assert int(ds.feasible.values[i]) == int(int(out.infeasible) == 0 and frac <= 0.9)


def test_no_recompile_across_chunks_or_values(tmp_path, tiny):
    before = sweep.trace_count()
    out = sweep.run_sweep(write_study(tmp_path), tmp_path / "a", chunk=CHUNK, progress=False)
    with xr.open_dataset(out) as ds:
        assert ds.sizes["config"] > 3 * CHUNK  # several chunks, padded last one
    # Other numbers in the same shape (model, token budget) reuse the compiled function too.
    other = write_study(tmp_path, model="llama2-13b", tokens=3.0e11, name="other.toml")
    sweep.run_sweep(other, tmp_path / "b", chunk=CHUNK, progress=False)
    assert sweep.trace_count() == before


def test_a_fixed_choice_is_compiled_in_and_a_new_one_recompiles(tmp_path, tiny):
    """What every configuration shares and that chooses (here the software stack, a one-value
    axis) is a constant of the compiled chunk: another choice compiles again, the same choice
    with other numbers does not (test above), and the tables split and merge back unchanged."""
    study = load_study(write_study(tmp_path))
    tables = sweep.space_from_study(study).tables()
    shared = sweep_evaluate.Shared(tables)
    moved = {c for _, c, _ in shared.columns}
    assert {"stack", "attention", "sp"} <= moved and "ep" not in moved  # numbers stay arguments
    assert {k for k, _ in shared.fixed} == set(sweep_evaluate.CODED_LEAVES)
    assert "train_tokens" in shared.runtime(tables)["fixed"]
    back = shared.merge(shared.runtime(tables))
    assert jax.tree.all(jax.tree.map(np.array_equal, back, tables))
    assert shared == sweep_evaluate.Shared(tables) and hash(shared) == hash(sweep_evaluate.Shared(tables))
    text = write_study(tmp_path).read_text().replace("[plan]\n", '[plan]\nstack = "torchtitan"\n')
    other = tmp_path / "stack.toml"
    other.write_text(text)
    assert sweep_evaluate.Shared(sweep.space_from_study(load_study(other)).tables()) != shared
    before = sweep.trace_count()
    sweep.run_sweep(other, tmp_path / "s", chunk=CHUNK, progress=False)
    assert sweep.trace_count() == before + 1


def test_trace_counter_counts_a_new_shape(tmp_path, tiny):
    before = sweep.trace_count()
    sweep.run_sweep(write_study(tmp_path), tmp_path / "c", chunk=CHUNK // 2, progress=False)
    assert sweep.trace_count() == before + 1


def test_progress_shows_the_compilation_as_its_own_phase(tmp_path, tiny, capsys):
    """The progress display's first row is the compilation ("compiled in N s"); the sweep's row,
    with its configurations per second, starts after it (so the rate counts evaluation only)."""
    before = sweep.trace_count()
    sweep.run_sweep(write_study(tmp_path), tmp_path / "p", chunk=CHUNK, progress=True)
    assert sweep.trace_count() == before  # the phase compiles what the chunks then call
    lines = [line.strip() for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0].startswith("compiled in ") and float(lines[0].split()[2]) >= 0.0
    assert "configs/s" not in lines[0] and "/" not in lines[0].split("━")[0]
    assert lines[1].startswith("sweep tiny") and "configs/s" in lines[1]


# --------------------------------------------------------------------------------------------
# Resume, Dask
# --------------------------------------------------------------------------------------------


def _sweep_interrupted_after(study: Path, out: Path, chunks: int) -> None:
    """Sweep ``study`` into ``out`` and interrupt it (Ctrl-C) once ``chunks`` chunks are written."""

    def stop(index: int) -> None:
        if index == chunks - 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(study, out, chunk=CHUNK, progress=False, on_chunk=stop)


def test_interrupted_sweep_resumes_to_the_same_dataset(tmp_path, tiny):
    study, full = tiny
    out = tmp_path / "out"
    _sweep_interrupted_after(study, out, chunks=2)
    folder = out / "tiny.nc.chunks"
    assert not (out / "tiny.nc").exists()
    assert sorted(p.name for p in folder.glob("chunk_*.npz")) == ["chunk_000000.npz", "chunk_000001.npz"]

    computed: list[int] = []
    path = sweep.run_sweep(study, out, chunk=CHUNK, progress=False, on_chunk=computed.append)
    n_chunks = -(-full.sizes["config"] // CHUNK)
    assert sorted(computed) == list(range(2, n_chunks))  # nothing finished is computed again
    assert not folder.exists()
    with xr.open_dataset(path) as resumed:
        assert_same(resumed.load(), full)


@pytest.mark.parametrize("damage", ["truncated", "not-a-zip", "foreign-rows"])
def test_damaged_or_foreign_checkpoint_is_computed_again_with_a_warning(tmp_path, tiny, capsys, damage):
    """A chunk file cut short, replaced by other bytes, or holding another sweep's rows is removed
    with one ``warning:`` line and recomputed; the dataset equals the uninterrupted one."""
    study, full = tiny
    out = tmp_path / "out"
    _sweep_interrupted_after(study, out, chunks=3)
    folder = out / "tiny.nc.chunks"
    bad = folder / "chunk_000001.npz"
    if damage == "truncated":
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    elif damage == "not-a-zip":
        bad.write_text("not a checkpoint\n")
    else:
        np.savez(bad, step_time_s=np.zeros(3))
    (folder / "notes.txt").write_text("a file of the user's\n")
    capsys.readouterr()

    computed: list[int] = []
    path = sweep.run_sweep(study, out, chunk=CHUNK, progress=False, on_chunk=computed.append)
    n_chunks = -(-full.sizes["config"] // CHUNK)
    assert sorted(computed) == [1, *range(3, n_chunks)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, warnings
    assert "chunk_000001.npz: unreadable checkpoint" in warnings[0] and "computing chunk 1 again" in warnings[0]
    assert "notes.txt" in warnings[1]  # the folder is kept for the user's file, the sweep's files removed
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    with xr.open_dataset(path) as resumed:
        assert_same(resumed.load(), full)


def test_checkpoints_of_another_study_are_discarded(tmp_path, tiny):
    study, full = tiny
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        other = write_study(tmp_path, tokens=5.0e11, name="tiny.toml")
        sweep.run_sweep(other, out, chunk=CHUNK, progress=False, on_chunk=_interrupt)
    computed: list[int] = []
    path = sweep.run_sweep(study, out, chunk=CHUNK, progress=False, on_chunk=computed.append)
    assert 0 in computed
    with xr.open_dataset(path) as ds:
        assert_same(ds.load(), full)


def _interrupt(index: int) -> None:
    raise KeyboardInterrupt


def test_dask_cluster_equals_local(tmp_path, tiny):
    distributed = pytest.importorskip("dask.distributed")
    study, full = tiny
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        path = sweep.run_sweep(study, tmp_path, chunk=CHUNK, scheduler=cluster.scheduler_address, progress=False)
        assert "chunk_task" in cluster.scheduler.task_prefixes  # the chunks ran as Dask tasks
    with xr.open_dataset(path) as ds:
        assert_same(ds.load(), full)


# --------------------------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------------------------


def test_netcdf_round_trip_keeps_values_and_attrs(tiny):
    study_path, ds = tiny
    study = load_study(study_path)
    space = sweep.space_from_study(study)
    cal = build.calibration_spec(load_calibration())
    payload = (space.tables(), cal, CHUNK, space.kinds, space.size)
    for index in range(-(-space.size // CHUNK)):
        lo = index * CHUNK
        _, arrays = sweep.chunk_task(payload, index)
        for name, values in arrays.items():
            np.testing.assert_array_equal(ds[name].values[lo : lo + len(values)], values, err_msg=name)
            assert ds[name].dtype == values.dtype
    for c, values in space.coords(0, space.size).items():
        np.testing.assert_array_equal(ds[c].values, values, err_msg=c)

    assert set(ds.coords) == set(sweep.COLUMNS)
    assert list(ds.data_vars) == sweep.variables()
    for name in (*ds.data_vars, *ds.coords):
        assert ds[name].attrs["units"] and ds[name].attrs["long_name"], name
    assert ds.recompute.attrs["flag_meanings"] == "none selective full"
    assert list(ds.recompute.attrs["flag_values"]) == [0, 1, 2]
    assert ds.gpu.attrs["flag_meanings"] == "h100-sxm-80gb a100-sxm-80gb"
    assert ds.constraint_violation.attrs["flag_meanings"] == "max_hbm_frac"
    assert "hbm_capacity" in ds.infeasible.attrs["flag_meanings"].split()
    assert ds.attrs["study_toml"] == study_path.read_text()
    assert ds.attrs["objectives"] == "time_to_train_s cost_usd mfu"
    assert ds.attrs["objective_senses"] == "min min max"
    assert json.loads(ds.attrs["constraints"]) == {"max_hbm_frac": 0.9}
    for package in ("hetersim", "jax", "numpy", "xarray", "netCDF4"):
        assert ds.attrs[f"{package}_version"]
    assert ds.step_time_s.encoding["zlib"]


def test_per_tier_memory_variables(tiny, cal):
    """Memory of the slower tiers per node, one variable per tier and quantity, from the
    Breakdown's tier arrays (no offload in the tiny study: nothing placed, host DRAM present)."""
    study_path, ds = tiny
    for tier in TIER[1:]:
        for what in ("used", "capacity"):
            name = f"{tier.replace('-', '_')}_{what}_GiB"
            assert name in METRICS and name in ds.data_vars, name
            assert ds[name].attrs["units"] == "2^30 byte" and "per node" in ds[name].attrs["long_name"], name
            assert ds[name].dtype == np.float32
    assert (ds.host_dram_capacity_GiB.values > 0).all()
    for name in ("host_dram_used_GiB", "cxl_expander_used_GiB", "cxl_pool_used_GiB", "cxl_expander_capacity_GiB"):
        assert (ds[name].values == 0).all(), name
    space = sweep.space_from_study(load_study(study_path))
    model, system, plan = space.specs(5)
    out = simulate(model, system, plan, cal)
    for i, tier in enumerate(TIER[1:], start=1):
        key = tier.replace("-", "_")
        assert float(ds[f"{key}_used_GiB"][5]) == pytest.approx(float(out.tier_used_GiB[i]))
        assert float(ds[f"{key}_capacity_GiB"][5]) == pytest.approx(float(out.tier_capacity_GiB[i]))


def test_summary_and_sweep_command_json(tmp_path, tiny, capsys):
    study, ds = tiny
    summary = sweep_command(study, tmp_path / "tiny.nc", CHUNK, None, 0, json_out=True)
    printed = json.loads(capsys.readouterr().out)
    assert printed["n_configs"] == summary["n_configs"] == ds.sizes["config"]
    assert printed["n_feasible"] == int(ds.feasible.sum())
    best = printed["best"]["time_to_train_s"]
    feasible = ds.time_to_train_s.values[ds.feasible.values == 1]
    assert best["value"] == pytest.approx(float(feasible.min()))
    assert printed["best"]["mfu"]["value"] == pytest.approx(float(ds.mfu.values[ds.feasible.values == 1].max()))
    assert best["config"]["gpu"] in ("h100-sxm-80gb", "a100-sxm-80gb")
    assert (tmp_path / "tiny.nc").is_file()
    assert {"tp", "pp", "vp", "micro_batch", "zero", "recompute"} <= set(printed["varied"])
    assert not {"seq_len", "stack", "global_batch", "n_gpus"} & set(printed["varied"])


def test_best_table_names_each_field_the_study_varies_beyond_the_layout(tmp_path, capsys):
    """A study with a stack axis (or sequence lengths) shows each best configuration's stack (and
    length) in its layout; a study that fixes them does not."""
    text = TINY.format(model="llama2-7b", tokens=1.0e11).replace("tp = [1, 2, 4]", "tp = [2]")
    text = text.replace("seq_len = 2048", 'seq_len = [2048, 4096]\nstack = ["torchtitan", "fsdp"]')
    study = tmp_path / "stk.toml"
    study.write_text(text.replace("pp = [1, 2]", "pp = 1").replace("vp = [1, 2]", "vp = 1"))
    sweep_command(study, tmp_path / "stk.nc", CHUNK, None, 0, json_out=False)
    out = capsys.readouterr().out
    # one best configuration per objective (rich may wrap a layout over two lines of its cell)
    assert out.count("stack:") == out.count("seq4096") + out.count("seq2048") == 3, out
    study.write_text(TINY.format(model="llama2-7b", tokens=1.0e11).replace("tp = [1, 2, 4]", "tp = [2]"))
    sweep_command(study, tmp_path / "fixed.nc", CHUNK, None, 0, json_out=False)
    assert "stack:" not in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# Study files
# --------------------------------------------------------------------------------------------

BAD_STUDIES = [
    ("unknown plan key", "tp = [1, 2, 4]", "tp = [1, 2, 4]\nfoo = 3", "plan.foo"),
    ("unknown top-level key", 'name = "tiny"', 'name = "tiny"\nsurprise = 1', "surprise"),
    ("empty axis", "tp = [1, 2, 4]", "tp = []", "plan.tp"),
    ("wrong type", "pp = [1, 2]", 'pp = "two"', "plan.pp"),
    ("float for an integer", "global_batch = 48", "global_batch = 48.0", "plan.global_batch"),
    ("zero out of range", "zero = [0, 3]", "zero = [0, 4]", "plan.zero"),
    ("unknown option", 'recompute = ["none", "full"]', 'recompute = ["none", "partial"]', "plan.recompute"),
    ("unknown gpu", '"a100-sxm-80gb"]', '"a100-sxm-80gb", "tpu9"]', "hardware.gpu"),
    ("unknown model", 'key = "llama2-7b"', 'key = "llama9"', "model.key"),
    ("gpu override", "n_gpus = [8, 12]", "n_gpus = [8, 12]\n[hardware.set]\nhbm_bw_GBps = -1", "hardware.set"),
    ("impossible tp", "tp = [1, 2, 4]", "tp = [1, 2, 5]", "plan.tp"),
    ("auto not allowed", "seq_len = 2048", 'seq_len = "auto"', "plan.seq_len"),
    ("duplicate", "vp = [1, 2]", "vp = [1, 2, 2]", "plan.vp"),
    ("constraint", "max_hbm_frac = 0.9", "max_hbm_frac = 1.5", "constraints.max_hbm_frac"),
    ("unknown constraint", "max_hbm_frac = 0.9", "max_speed = 3", "constraints.max_speed"),
    ("objective", '"mfu"]', '"goodness"]', "objectives"),
    ("bad toml", "[plan]", "[plan", "invalid TOML"),
]


@pytest.mark.parametrize(("what", "old", "new", "key"), BAD_STUDIES, ids=[b[0] for b in BAD_STUDIES])
def test_malformed_study_is_rejected_naming_the_key(tmp_path, what, old, new, key):
    good = TINY.format(model="llama2-7b", tokens=1e11)
    text = good.replace(old, new, 1)
    assert text != good, what
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = tmp_path / "out"
    with pytest.raises(ValueError) as error:
        sweep.run_sweep(path, out, chunk=CHUNK, progress=False)
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message and key in message, message
    assert not out.exists()


def test_missing_study_file(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_study(tmp_path / "nope.toml")


def test_auto_axes_follow_the_documented_rules():
    text = """
name = "auto"
[model]
key = "llama2-70b"
[hardware]
gpu = "h100-sxm-80gb"
n_gpus = 512
[plan]
tp = "auto"
pp = "auto"
vp = "auto"
cp = "auto"
micro_batch = "auto"
zero = "auto"
recompute = "auto"
precision = "auto"
global_batch = 1024
seq_len = 4096
"""
    axes = parse_study(text).axes
    assert axes["tp"] == (1, 2, 4, 8)  # 64 heads, 8 KV heads, 8-GPU NVLink domain
    assert axes["pp"] == (1, 2, 4, 8, 16, 32, 64)
    assert axes["vp"] == (1, 2, 4, 5, 8)  # divisors of 80 layers up to 8
    assert axes["cp"] == (1, 2, 4, 8, 16)
    assert axes["micro_batch"] == (1, 2, 4, 8)
    assert axes["zero"] == (0, 1, 2, 3)
    assert axes["recompute"] == ("none", "selective", "full")
    assert axes["precision"] == ("bf16", "fp8")
    assert axes["sp"] == ("auto",)


def test_default_study_is_packaged_and_copied():
    assert (ROOT / "studies" / "default.toml").read_text() == DEFAULT_STUDY.read_text()
    assert DEFAULT_STUDY.is_relative_to(ROOT / "dse")
    study = load_study(None)
    assert study.axes["gpu"] == ("h100-sxm-80gb", "h200-sxm-141gb")
    assert study.cross_product_size == 4 * 5 * 4 * 3 * 3 * 3 * 2
    assert 0 < sweep.space_from_study(study).size <= study.cross_product_size


def test_every_study_file_loads():
    for path in sorted((ROOT / "studies").glob("*.toml")):
        assert sweep.space_from_study(load_study(path)).size > 0, path


def test_readme_example_is_a_valid_study():
    text = (ROOT / "studies" / "README.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    example = "\n".join(line for line in example.splitlines() if not line.startswith("catalog ="))
    study = parse_study(example, origin="README")
    assert study.axes["model"] == ("llama3-70b", "llama3-405b")
    assert study.gpus["h100-sxm-80gb"]["price_usd_per_hour"] == 4.0
    assert study.scalars["offload"] == {"optimizer": "host-dram"}
    assert sweep.space_from_study(study).size > 0


def test_metric_table_matches_the_cost_model():
    assert STEP_TERM_LABELS is STEP_TERMS
    fields = set(Breakdown.__dataclass_fields__)
    # A metric is a Breakdown field or a property of one (the per-tier memory: one tier of an array).
    assert all(name in fields or isinstance(getattr(Breakdown, name, None), property) for name in METRICS)
    assert all(m.sense in ("min", "max") for m in METRICS.values())


# --------------------------------------------------------------------------------------------
# Bench
# --------------------------------------------------------------------------------------------


def test_run_bench_reports_its_figures():
    result = run_bench(n_configs=5000, chunk=1024, one_at_a_time=5)
    assert set(result) >= {
        "n_configs",
        "compile_s",
        "configs_per_s",
        "peak_rss_MiB",
        "device",
        "one_at_a_time_configs_per_s",
    }
    assert result["n_configs"] == 5000
    assert result["configs_per_s"] > 0 and result["one_at_a_time_configs_per_s"] > 0
    assert result["peak_rss_MiB"] > 0
    assert result["models"] == ["llama2-70b", "llama3-405b"]
    # A (model, GPU) group longer than the chunk: it runs with them unbatched, and ZeRO, which the
    # layer costs do not read, is a factor inside the layout rows: they are hoisted
    # (dse.sweep.hoist), a quarter of the chunk's rows and a few more.
    window = result["layer_costs_window"]
    assert window["hoisted"] and window["chunk"] == 1024 and window["window"] <= 1024 // 3
    # An MoE model in the space compiles the MoE terms in (dispatch, experts, expert-DP...).
    moe = run_bench(n_configs=3000, chunk=1024, one_at_a_time=0, models=("llama2-70b", "mixtral-8x7b"))
    assert moe["models"] == ["llama2-70b", "mixtral-8x7b"] and moe["configs_per_s"] > 0
    assert moe["hlo_flops_per_config"] > 1.3 * result["hlo_flops_per_config"]
    assert moe["moe_terms"] and not result["moe_terms"]


def test_a_long_chunk_runs_as_blocks_with_the_numbers_of_one_program(cal, monkeypatch):
    """A chunk longer than ``BLOCK`` (and a multiple of it) runs as blocks through one program of
    ``BLOCK`` configurations and is joined: the same outputs, in order, as the blocks evaluated
    one by one; the staged function reports its block and places the tables once."""
    space = bench_space(3000)
    tables = space.tables()
    monkeypatch.setattr(sweep_evaluate, "BLOCK", 256)
    staged = sweep.evaluate_chunk.lower(np.int32(0), tables, cal, chunk=1024, kinds=space.kinds).compile()
    assert staged.block == 256
    start = space.size // 4 - 300  # crosses a (model, GPU) group boundary inside the chunk
    whole = staged(np.int32(start), tables, cal)
    placed = staged._placed[1]
    assert staged(np.int32(start), tables, cal) is not None and staged._placed[1] is placed
    for b in range(4):
        part = sweep.evaluate_chunk(np.int32(start + 256 * b), tables, cal, chunk=256, kinds=space.kinds)
        for name, values in part.items():
            np.testing.assert_array_equal(np.asarray(whole[name])[256 * b : 256 * (b + 1)], np.asarray(values), name)


def test_chunk_equals_plain_vmap_of_simulate(cal):
    """The sweep's compiled chunk (XLA options of dse.sweep.evaluate.compiler_options included)
    gives the numbers of plain ``jax.vmap(simulate)`` over specs built from names, on a random
    sample of the bench space's configurations: evaluated a (model, GPU) group at a time (the
    first chunk, one straddling two groups and the padded last one) and, in a space of groups
    shorter than a chunk, with each configuration gathering its own model and GPU."""
    plain = jax.jit(jax.vmap(simulate, in_axes=(0, 0, 0, None)))
    rng = np.random.default_rng(1)
    chunk = 1024
    grouped, small = bench_space(5000), bench_space(200)
    assert sweep_evaluate.hardware_groups(grouped.tables(), chunk) == grouped.size // 4
    assert sweep_evaluate.hardware_groups(small.tables(), chunk) is None
    straddle = grouped.size // 4 - chunk // 2
    for space, start in ((grouped, 0), (grouped, straddle), (grouped, (grouped.size // chunk) * chunk), (small, 0)):
        tables = space.tables()
        out = sweep.evaluate_chunk(np.int32(start), tables, cal, chunk=chunk, kinds=space.kinds)
        n = min(chunk, space.size - start)
        pick = np.unique(np.r_[rng.choice(n, 40, replace=False), 0, n - 1])
        specs = [space.specs(start + int(i)) for i in pick]
        ref = plain(*jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *specs), cal)
        for name in METRICS:
            got = np.asarray(out[name])[pick]
            np.testing.assert_allclose(got, np.asarray(getattr(ref, name)), rtol=SWEEP_RTOL, atol=0, err_msg=name)
        feasible = (np.asarray(ref.infeasible) == 0).astype(np.int8)
        assert np.array_equal(np.asarray(out["feasible"])[pick], feasible)


def test_chunk_compiler_options_are_kept_or_dropped_whole():
    """All of CPU_COMPILER_OPTIONS or none (a JAX or XLA without them); where kept, a max over a
    small axis compiles without a YNNPACK fusion, and to the same numbers."""
    options = sweep_evaluate.compiler_options()
    assert options in ({}, sweep_evaluate.CPU_COMPILER_OPTIONS)
    x = np.random.default_rng(0).random((1024, 4), np.float32)
    fn = lambda v: jax.numpy.max(v * 2.0, axis=1)  # noqa: E731
    compiled = sweep_evaluate.jit(fn).lower(x).compile()
    if options:
        assert "ynn" not in compiled.as_text().lower()
    assert np.array_equal(np.asarray(compiled(x)), np.asarray(jax.jit(fn)(x)))


def test_cli_chunk_default_matches_the_engine():
    import inspect

    from dse.cli import sweep as cli_sweep
    from dse.sweep import DEFAULT_CHUNK

    for command in (cli_sweep.sweep_cmd, cli_sweep.bench_cmd):
        assert inspect.signature(command).parameters["chunk"].default.default == DEFAULT_CHUNK


# --------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------

TOP_K = 10


@pytest.fixture(scope="module")
def streamed(tiny, tmp_path_factory) -> tuple[Path, xr.Dataset]:
    """The tiny study swept with ``stream=True`` (same chunk, so no new compile)."""
    study, _ = tiny
    path = sweep.run_sweep(
        study, tmp_path_factory.mktemp("stream"), chunk=CHUNK, progress=False, stream=True, top_k=TOP_K
    )
    with xr.open_dataset(path) as ds:
        return path, ds.load()


def assert_same_attrs(a, b) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def _objectives(ds: xr.Dataset) -> list[tuple[int, str, np.ndarray]]:
    """(bit, name, values with smaller better) per study objective."""
    out = []
    for j, name in enumerate(ds.attrs["objectives"].split()):
        sign = -1.0 if METRICS[name].sense == "max" else 1.0
        out.append((1 << (1 + j), name, ds[name].values.astype(np.float64) * sign))
    return out


def test_streamed_rows_are_the_full_runs_rows(tiny, streamed):
    _, full = tiny
    _, st = streamed
    index = st.config.values
    assert np.all(np.diff(index) > 0) and st.feasible.values.all()
    for name in (*sweep.COLUMNS, *sweep.variables()):
        np.testing.assert_array_equal(st[name].values, full[name].values[index], err_msg=name)
        assert_same_attrs(st[name].attrs, full[name].attrs)
    assert st.attrs["streamed"] == 1 and st.attrs["top_k"] == TOP_K
    assert st.attrs["n_configs"] == full.sizes["config"] and st.attrs["n_kept"] == st.sizes["config"]
    assert st.attrs["n_feasible"] == int(full.feasible.sum())
    assert st.kept_because.attrs["flag_meanings"] == "pareto top_k_time_to_train_s top_k_cost_usd top_k_mfu"
    assert np.all(st.kept_because.values != 0)


def test_streamed_top_k_and_pareto_equal_the_full_run(tiny, streamed):
    _, full = tiny
    _, st = streamed
    feasible = np.flatnonzero(full.feasible.values == 1)
    kept = st.kept_because.values
    objectives = _objectives(full)
    for bit, name, values in objectives:
        v = values[feasible]
        expected = feasible[np.lexsort((feasible, v))][:TOP_K]  # k best, ties by flat index
        assert st.config.values[(kept & bit) != 0].tolist() == sorted(expected.tolist()), name
    front = feasible[pareto_mask(np.stack([v[feasible] for _, _, v in objectives], axis=1))]
    assert st.config.values[(kept & 1) != 0].tolist() == front.tolist()
    assert 1 < len(front) < len(feasible)


def test_streamed_marginals_equal_groupby_of_the_full_run(tiny, streamed):
    _, full = tiny
    _, st = streamed
    feasible = full.feasible.values == 1
    for c in sweep.COLUMNS:
        values = st[f"marginal_{c}"].values
        assert sorted(values.tolist()) == sorted(np.unique(full[c].values).tolist()), c
        assert_same_attrs(st[f"marginal_{c}"].attrs, full[c].attrs)
        for i, u in enumerate(values):
            rows = full[c].values == u
            assert st[f"n_configs_by_{c}"].values[i] == rows.sum()
            assert st[f"n_feasible_by_{c}"].values[i] == (rows & feasible).sum()
            for name in st.attrs["objectives"].split():
                best = st[f"best_{name}_by_{c}"].values[i]
                ok = full[name].values[rows & feasible]
                if not len(ok):
                    assert np.isnan(best)
                else:
                    assert best == (ok.min() if METRICS[name].sense == "min" else ok.max()), (c, u, name)
    assert np.isnan(st.best_time_to_train_s_by_tp.values).sum() == 0
    assert st.n_configs_by_tp.dims == ("marginal_tp",)


def test_streamed_summary_and_report(tiny, streamed, tmp_path, capsys):
    from dse.report import build_report

    full_path = tmp_path / "full.nc"
    tiny[1].to_netcdf(full_path)
    path, st = streamed
    a, b = sweep.summarize(full_path), sweep.summarize(path)
    assert b["streamed"] and b["n_kept"] == st.sizes["config"]
    for key in ("n_configs", "n_feasible", "infeasible_reasons", "best"):
        assert a[key] == b[key], key
    report = build_report(path, tmp_path / "report", validation=False)
    s = report.summary
    assert s["streamed"] and any("streamed sweep" in note for note in s["notes"])
    page = report.index.read_text()
    assert "streamed sweep" in page and f"{a['n_configs']:,} evaluated" in page
    front = st.config.values[(st.kept_because.values & 1) != 0]
    assert sorted(row["index"] for row in s["pareto"]) == front.tolist()  # the full run's Pareto set


def test_killed_streamed_sweep_resumes_to_the_same_result(tiny, streamed, tmp_path, monkeypatch):
    study, _ = tiny
    _, expected = streamed
    monkeypatch.setattr(sweep_run, "STREAM_CHECKPOINT_S", 0.0)  # checkpoint after every chunk
    out = tmp_path / "out"

    def crash_after_three(index: int) -> None:
        if index == 2:
            raise RuntimeError("killed")  # not Ctrl-C: only the periodic checkpoint is on disk

    with pytest.raises(RuntimeError):
        sweep.run_sweep(study, out, chunk=CHUNK, progress=False, on_chunk=crash_after_three, stream=True, top_k=TOP_K)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C after one more chunk saves the state too
        sweep.run_sweep(study, out, chunk=CHUNK, progress=False, on_chunk=_interrupt, stream=True, top_k=TOP_K)
    assert not (out / "tiny.nc").exists() and (out / "tiny.nc.chunks" / "state.npz").is_file()
    computed: list[int] = []
    path = sweep.run_sweep(study, out, chunk=CHUNK, progress=False, on_chunk=computed.append, stream=True, top_k=TOP_K)
    n_chunks = -(-expected.attrs["n_configs"] // CHUNK)
    assert computed == list(range(4, n_chunks))
    assert not (out / "tiny.nc.chunks").exists()
    with xr.open_dataset(path) as resumed:
        assert_same(resumed.load(), expected)


def test_stream_is_automatic_for_big_spaces_and_a_cli_flag(tiny, tmp_path, monkeypatch, capsys):
    study, full = tiny
    monkeypatch.setattr(sweep_run, "STREAM_THRESHOLD", full.sizes["config"])
    path = sweep.run_sweep(study, tmp_path / "auto", chunk=CHUNK, progress=False)
    with xr.open_dataset(path) as ds:
        assert ds.attrs["streamed"] == 1 and ds.attrs["top_k"] == sweep.DEFAULT_TOP_K
    path = sweep.run_sweep(study, tmp_path / "forced", chunk=CHUNK, progress=False, stream=False)
    with xr.open_dataset(path) as ds:
        assert "streamed" not in ds.attrs and ds.sizes["config"] == full.sizes["config"]
    summary = sweep_command(study, tmp_path / "cli.nc", CHUNK, None, 0, json_out=True, stream=True, top_k=3)
    printed = json.loads(capsys.readouterr().out)
    assert printed["streamed"] and printed["top_k"] == 3 and summary["n_configs"] == full.sizes["config"]
    with pytest.raises(ValueError, match="--top-k"):
        sweep.run_sweep(study, tmp_path / "bad", chunk=CHUNK, progress=False, stream=True, top_k=0)

    import inspect

    from typer.testing import CliRunner

    from dse import cli
    from dse.cli.sweep import sweep_cmd

    top_k = inspect.signature(sweep_cmd).parameters["top_k"].default  # None: given or not (--no-stream refuses it)
    assert top_k.default is None and f"[default: {sweep.DEFAULT_TOP_K}]" in top_k.help
    args = ["sweep", str(study), "--out", str(tmp_path / "typer.nc"), "--chunk", str(CHUNK), "--json"]
    for flag, extra, expected in (("--stream", ["--top-k", "4"], True), ("--no-stream", [], False)):
        result = CliRunner().invoke(cli.app, [*args, flag, *extra])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout).get("streamed", False) is expected


@pytest.mark.parametrize("k", [1, 2, 3])
def test_front_screen_keeps_every_non_dominated_point(k):
    rng = np.random.default_rng(k)
    for _ in range(40):
        front_pool = rng.integers(0, 6, size=(int(rng.integers(1, 30)), k)).astype(float)
        front = front_pool[pareto_mask(front_pool)]
        points = rng.integers(0, 6, size=(50, k)).astype(float)
        points[0] = np.nan
        screened = sweep_stream.maybe_front(points, front)
        # Exactly the points that no front point dominates survive (k <= 2), or more (k = 3).
        le = (front[None, :, :] <= points[:, None, :]).all(axis=2)
        lt = (front[None, :, :] < points[:, None, :]).any(axis=2)
        undominated = ~np.isnan(points).any(axis=1) & ~(le & lt).any(axis=1)
        assert not screened[0]
        assert np.all(screened[undominated])
        if k <= 2:
            np.testing.assert_array_equal(screened, undominated)


@pytest.mark.parametrize(
    "objectives", [("cost_usd",), ("time_to_train_s", "mfu"), ("time_to_train_s", "cost_usd", "energy_kWh")]
)
def test_reducer_in_any_chunk_order_equals_brute_force(objectives):
    """Random values with many ties, two models, chunks folded in a shuffled order (as Dask
    finishes them): top-k, per-model Pareto set and marginals equal a brute-force reduction."""
    text = TINY.format(model="llama2-7b", tokens=1e11).replace('key = "llama2-7b"', 'key = ["llama2-7b", "llama2-13b"]')
    space = sweep.space_from_study(parse_study(text))
    n, k, chunk = space.size, 7, 64
    rng = np.random.default_rng(len(objectives))
    arrays = {}
    for name in sweep.variables():
        spec = METRICS.get(name) or INTERVALS.get(name)
        dtype = spec.dtype if spec is not None else sweep.EXTRA_VARIABLES[name][1]
        arrays[name] = rng.integers(0, 12, n).astype(dtype)
    arrays["feasible"] = (rng.random(n) < 0.6).astype(np.int8)
    arrays["infeasible"] = np.where(arrays["feasible"] == 1, 0, rng.integers(1, 64, n)).astype(np.int32)
    arrays[objectives[-1]][rng.random(n) < 0.02] = np.nan
    reducer = sweep.Reducer(space, objectives, chunk, k)
    state = reducer.empty()
    for index in rng.permutation(reducer.n_chunks):
        lo = index * chunk
        state = reducer.add(state, int(index), {name: v[lo : lo + chunk] for name, v in arrays.items()})
    assert state.done.all() and state.thinned == 0

    feasible = np.flatnonzero(arrays["feasible"])
    sign = np.array([-1.0 if METRICS[o].sense == "max" else 1.0 for o in objectives])
    values = np.stack([arrays[o].astype(np.float64) * s for o, s in zip(objectives, sign, strict=True)], axis=1)
    for j in range(len(objectives)):
        ok = feasible[~np.isnan(values[feasible, j])]
        expected = ok[np.lexsort((ok, values[ok, j]))][:k]
        got = state.rows["index"][(state.kept & (1 << (1 + j))) != 0]
        assert sorted(got.tolist()) == sorted(expected.tolist())
    coords = space.coords(0, n)
    front = [feasible[coords["model"][feasible] == m] for m in (0, 1)]
    front = np.concatenate([f[pareto_mask(values[f])] for f in front])
    assert sorted(state.rows["index"][(state.kept & 1) != 0].tolist()) == sorted(front.tolist())
    kept = state.rows["index"]
    for name in sweep.variables():
        np.testing.assert_array_equal(state.rows[name], arrays[name][kept])

    for c, (vals, count, n_feasible, best) in reducer.marginals(state).items():
        assert vals.tolist() == np.unique(coords[c]).tolist()
        for i, u in enumerate(vals):
            rows = coords[c] == u
            assert count[i] == rows.sum() and n_feasible[i] == (rows & (arrays["feasible"] == 1)).sum()
            for j in range(len(objectives)):
                v = values[rows & (arrays["feasible"] == 1), j]
                v = v[~np.isnan(v)]
                np.testing.assert_array_equal(best[j, i], v.min() * sign[j] if len(v) else np.nan)
    assert state.reasons.sum() == sum(int(np.count_nonzero(arrays["infeasible"] & f)) for f in reducer.flags)


def test_a_front_too_large_is_thinned(monkeypatch):
    space = sweep.space_from_study(parse_study(TINY.format(model="llama2-7b", tokens=1e11)))
    monkeypatch.setattr(sweep_stream, "MAX_FRONT", 5)
    n = space.size
    arrays = {name: np.zeros(n, np.float32) for name in sweep.variables()}
    arrays["feasible"] = np.ones(n, np.int8)
    arrays["infeasible"] = np.zeros(n, np.int32)
    arrays["time_to_train_s"] = np.arange(n, dtype=np.float32)  # every point on the front
    arrays["cost_usd"] = np.arange(n, 0, -1).astype(np.float32)
    reducer = sweep.Reducer(space, ("time_to_train_s", "cost_usd"), n, 3)
    state = reducer.add(reducer.empty(), 0, arrays)
    front = state.rows["index"][(state.kept & 1) != 0]
    assert state.thinned == 1 and len(front) == 5 and front[0] == 0 and front[-1] == n - 1


def test_streamed_dask_equals_streamed_local(tmp_path, streamed):
    distributed = pytest.importorskip("dask.distributed")
    path, expected = streamed
    study = tmp_path / "tiny.toml"
    study.write_text(expected.attrs["study_toml"])
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        out = sweep.run_sweep(
            study, tmp_path, chunk=CHUNK, scheduler=cluster.scheduler_address, progress=False, stream=True, top_k=TOP_K
        )
    with xr.open_dataset(out) as ds:
        assert_same(ds.load(), expected)


def test_sweep_stores_the_step_time_interval_around_the_prediction(tiny):
    _, ds = tiny
    low, step, high = ds.step_time_s_low.values, ds.step_time_s.values, ds.step_time_s_high.values
    ok = np.isfinite(step)
    assert ok.any()
    assert np.all(low[ok] <= step[ok]) and np.all(step[ok] <= high[ok])
    assert np.any(high[ok] > step[ok])  # an interval, not a copy of the prediction
    for name in ("step_time_s_low", "step_time_s_high"):
        assert ds[name].attrs["units"] == "s" and "80% prediction interval" in ds[name].attrs["long_name"]


# --------------------------------------------------------------------------------------------
# Bench: XLA's figures, whatever JAX returns
# --------------------------------------------------------------------------------------------


class _Compiled:
    def __init__(self, found):
        self.found = found

    def cost_analysis(self):
        if isinstance(self.found, Exception):
            raise self.found
        return self.found


@pytest.mark.parametrize(
    "found, expected",
    [
        ({"flops": 8.0, "bytes accessed": 4.0}, {"flops": 8.0, "bytes accessed": 4.0}),  # newer JAX
        ([{"flops": 8.0, "bytes accessed": 4.0}], {"flops": 8.0, "bytes accessed": 4.0}),  # jax 0.4.x
        ([], {}),
        (None, {}),
        (NotImplementedError("no analysis"), {}),
    ],
)
def test_cost_analysis_as_one_dict(found, expected):
    from dse.bench import cost_analysis

    assert cost_analysis(_Compiled(found)) == expected


def test_hlo_op_count_counts_instructions():
    from dse.bench import hlo_op_count

    text = """HloModule jit_f, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%fused_computation (param_0.2: f32[4]) -> f32[4] {
  %param_0.2 = f32[4]{0} parameter(0)
  %sin.0 = f32[4]{0} sine(%param_0.2)
  ROOT %mul.1 = f32[4]{0} multiply(%sin.0, %sin.0)
}

ENTRY %main.5 (Arg_0.1: f32[4]) -> f32[4] {
  %Arg_0.1 = f32[4]{0} parameter(0)
  ROOT %fusion = f32[4]{0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation
}
"""
    assert hlo_op_count(text) == (5, 2)
    assert hlo_op_count(text.replace("%", "")) == (5, 2)  # newer XLA prints names without %


def test_a_study_catalogs_memory_devices_and_fleets_reach_the_sweep(tmp_path):
    """A CXL device and a fleet defined in the study's own catalog file shape its hosts, in one
    kind's systems and in a mix's (they were validated against that catalog, then built from the
    packaged one: 'unknown cxl-expander')."""
    fleet = {k: v for k, v in load_catalog().fleet("meta-llama3-h100").items() if k != "sources"}
    fleet["restart_s"] = 1234.0
    lines = [
        "[memory.my-cxl-512]",
        'name = "a 512 GiB CXL expander"',
        'kind = "cxl-expander"',
        "bw_GBps = 50.0",
        "latency_ns = 250.0",
        "capacity_GiB = 512.0",
        'link = "cxl2-x8"',
        "[memory.my-cxl-512.sources]",
        'bw_GBps = "measured: Intel MLC"',
        "[fleets.my-fleet]",
        *(f"{k} = {json.dumps(v)}" for k, v in fleet.items()),
        "[gpus.h100-sxm-80gb]",
        'fleet = "my-fleet"',
    ]
    (tmp_path / "mine.toml").write_text("\n".join(lines) + "\n")
    text = TINY.format(model="llama2-7b", tokens=1e11).replace("objectives =", 'catalog = ["mine.toml"]\nobjectives =')
    text = text.replace("[plan]", '[hardware.set]\ncxl_expander = "my-cxl-512:2"\n\n[plan]')
    (tmp_path / "s.toml").write_text(text)
    space = sweep.space_from_study(load_study(tmp_path / "s.toml"))
    host = space.systems.host
    assert np.asarray(host.tier_capacity_GiB)[:, TIER.index("cxl-expander")].tolist() == [1024.0, 1024.0]
    assert float(np.asarray(host.restart_s)[0]) == pytest.approx(1234.0)
    mixed = text.replace(
        'gpu = ["h100-sxm-80gb", "a100-sxm-80gb"]\nn_gpus = [8, 12]', 'cluster = ["h100-sxm-80gb:4,a100-sxm-80gb:4"]'
    )
    (tmp_path / "m.toml").write_text(mixed)
    cluster = sweep.space_from_study(load_study(tmp_path / "m.toml")).cluster("h100-sxm-80gb:4,a100-sxm-80gb:4")
    assert np.asarray(cluster.systems.host.tier_capacity_GiB)[0, TIER.index("cxl-expander")] == 1024.0
