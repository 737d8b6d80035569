"""The compiled-program cache (hetersim.compile_cache): where it lives, how it is turned off, that a
kept program is loaded instead of traced, and that it gives the same numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetersim import compile_cache

ROOT = Path(__file__).resolve().parents[1]


def test_folder_from_the_environment(tmp_path):
    home = Path.home()
    assert compile_cache.base_dir({}) == home / ".cache" / "hetersim"
    assert compile_cache.base_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "hetersim"
    given = {"HETERSIM_CACHE_DIR": str(tmp_path / "mine"), "XDG_CACHE_HOME": "/elsewhere"}
    assert compile_cache.base_dir(given) == tmp_path / "mine"  # the override wins
    assert compile_cache.base_dir({"HETERSIM_CACHE_DIR": "", "XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "hetersim"
    for off in ("off", "OFF", " Off "):
        assert compile_cache.base_dir({"HETERSIM_CACHE_DIR": off}) is None
        assert compile_cache.cache_dir({"HETERSIM_CACHE_DIR": off}) is None
        assert compile_cache.enable({"HETERSIM_CACHE_DIR": off}) is None


def test_folder_is_named_by_the_sources_and_versions(tmp_path):
    key = compile_cache.source_key()
    assert len(key) == 16 and int(key, 16) >= 0
    assert compile_cache.cache_dir({"HETERSIM_CACHE_DIR": str(tmp_path)}) == tmp_path / f"jax-{key}"


def test_suite_writes_nothing_in_the_users_cache():
    assert os.environ["HETERSIM_CACHE_DIR"] == "off"  # tests/conftest.py
    assert compile_cache.enabled() is None


@pytest.fixture
def exe_folder(tmp_path, monkeypatch):
    """The executables layer on, in a temporary folder (JAX's own cache untouched)."""
    folder = tmp_path / "jax-test"
    (folder / "exe").mkdir(parents=True)
    monkeypatch.setitem(compile_cache._STATE, "folder", folder)
    return folder


def _toy(spec, x):
    return {"y": spec["a"] * x + jnp.sum(spec["b"]), "z": jnp.sqrt(x)}


def test_new_values_hit_the_kept_program_and_a_new_process_loads_it(exe_folder, monkeypatch):
    f = compile_cache.cached_jit(_toy, "toy")
    spec = {"a": np.float32(2.0), "b": np.arange(3, dtype=np.float32)}
    first = f(spec, np.float32(4.0))
    second = f({"a": np.float32(5.0), "b": np.ones(3, np.float32)}, np.float32(9.0))
    assert float(first["y"]) == 11.0 and float(second["y"]) == 48.0
    assert len(list((exe_folder / "exe").glob("toy-*.pkl"))) == 1  # other values: the same entry

    fresh = compile_cache.cached_jit(_toy, "toy")  # as in a later process: nothing in memory
    monkeypatch.setattr(fresh.jitted, "lower", None)  # loading must not trace
    again = fresh({"a": np.float32(3.0), "b": np.ones(3, np.float32)}, np.float32(16.0))
    assert float(again["y"]) == 51.0 and float(again["z"]) == 4.0

    f({"a": np.float32(1.0), "b": np.ones(4, np.float32)}, np.float32(1.0))  # another shape: another entry
    assert len(list((exe_folder / "exe").glob("toy-*.pkl"))) == 2


def test_prefetched_programs_are_used_and_a_failed_prefetch_loads_again(exe_folder, monkeypatch):
    f = compile_cache.cached_jit(_toy, "toy")
    f({"a": np.float32(2.0), "b": np.arange(3, dtype=np.float32)}, np.float32(4.0))
    [older] = (exe_folder / "exe").glob("toy-*.pkl")
    f({"a": np.float32(1.0), "b": np.ones(4, np.float32)}, np.float32(1.0))  # a second entry
    [newer] = set((exe_folder / "exe").glob("toy-*.pkl")) - {older}
    os.utime(older, (1.0, 1.0))  # used long ago
    compile_cache.prefetch(exe_folder, count=1)  # the most recently used one only
    assert list(compile_cache._PREFETCHED) == [newer]
    path = newer
    compile_cache._PREFETCHED[path].result(timeout=60)  # loaded on the thread

    fresh = compile_cache.cached_jit(_toy, "toy")  # as in a later process
    monkeypatch.setattr(fresh.jitted, "lower", None)  # must not trace
    load = compile_cache.pickle.load
    monkeypatch.setattr(compile_cache.pickle, "load", None)  # nor read the entry again
    out = fresh({"a": np.float32(3.0), "b": np.ones(4, np.float32)}, np.float32(16.0))
    assert float(out["y"]) == 52.0 and float(out["z"]) == 4.0
    assert compile_cache._PREFETCHED == {}  # taken, not kept twice
    monkeypatch.setattr(compile_cache.pickle, "load", load)

    # A prefetch whose load failed: the entry is read and loaded as without it.
    failed = compile_cache.Future()
    failed.set_exception(RuntimeError("no such program"))
    monkeypatch.setitem(compile_cache._PREFETCHED, path, failed)
    again = compile_cache.cached_jit(_toy, "toy")({"a": np.float32(3.0), "b": np.ones(4, np.float32)}, np.float32(16.0))
    assert float(again["y"]) == 52.0
    assert compile_cache._PREFETCHED == {}


def test_the_entry_point_prefetches_for_evaluate_only():
    from dse.entry import prefetches

    assert prefetches(["evaluate", "--model", "llama2-70b"])
    assert prefetches(["-q", "evaluate", "--model", "llama2-70b"])  # after a global option
    assert not prefetches(["evaluate", "--help"]) and not prefetches(["-v", "evaluate", "-h"])
    assert not prefetches(["sweep"]) and not prefetches(["validate", "--worst", "3"]) and not prefetches([])


def test_prefetch_without_a_folder_or_entries_does_nothing(tmp_path):
    compile_cache.prefetch(tmp_path / "none")  # no such folder
    (tmp_path / "empty" / "exe").mkdir(parents=True)
    compile_cache.prefetch(tmp_path / "empty")
    assert compile_cache._PREFETCHED == {}


def test_an_unusable_entry_is_compiled_again(exe_folder):
    f = compile_cache.cached_jit(_toy, "toy")
    spec = {"a": np.float32(2.0), "b": np.arange(3, dtype=np.float32)}
    f(spec, np.float32(4.0))
    [entry] = (exe_folder / "exe").glob("toy-*.pkl")
    entry.write_bytes(b"not a pickle")
    out = compile_cache.cached_jit(_toy, "toy")(spec, np.float32(4.0))
    assert float(out["y"]) == 11.0
    assert entry.read_bytes() != b"not a pickle"  # rewritten from the new compilation


def test_off_is_plain_jit():
    f = compile_cache.cached_jit(_toy, "toy")
    assert compile_cache.enabled() is None
    out = f({"a": np.float32(2.0), "b": np.zeros(2, np.float32)}, np.float32(3.0))
    assert float(out["y"]) == 6.0 and not f.loaded


EVAL = "evaluate --model llama3-8b --gpu h100-sxm-80gb --gpus 16 --global-batch 64 --pp 2 --json".split()


def _cli(args, cache, stderr=None):
    """``hetersim ARGS`` in a new process with the cache in ``cache``: its JSON output (and its
    stderr appended to the list ``stderr`` when given)."""
    env = {**os.environ, "HETERSIM_CACHE_DIR": str(cache)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as in a user's shell (this process's `import jax` set it)
    proc = subprocess.run([sys.executable, "-m", "dse", *args], capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    if stderr is not None:
        stderr.append(proc.stderr)
    return json.loads(proc.stdout)


def test_cli_keeps_its_programs_and_gives_the_same_numbers(tmp_path):
    """The command line turns the cache on: a first run fills it, a run with other values (tp,
    batch, sequence length) loads the same program, and its answer is the uncached one."""
    first = _cli([*EVAL, "--tp", "2"], tmp_path)
    [folder] = tmp_path.glob("jax-*")
    assert len(list((folder / "exe").glob("simulate-*.pkl"))) == 1
    # JAX's own cache is on; it holds no program of this run: building the specs compiles none
    # (pytree.as_arrays places a spec with one device_put, no per-leaf conversion program).
    assert (folder / "xla").is_dir() and not any((folder / "xla").iterdir())
    base = " ".join(EVAL).replace("--global-batch 64", "--global-batch 128").split()  # an option given once
    other = [*base[:-1], "--tp", "4", "--seq-len", "2048", "--json"]
    stderr = []
    second = _cli(other, tmp_path, stderr)  # its programs prefetched on a thread (dse/entry.py)
    assert len(list((folder / "exe").glob("simulate-*.pkl"))) == 1
    assert stderr == [""]  # nothing of XLA's start-up logging leaks out with the prefetch
    assert second["plan"]["tp"] == 4 and first["plan"]["tp"] == 2
    from typer.testing import CliRunner

    from dse.cli import app

    uncached = CliRunner().invoke(app, other)  # this process: the cache off (tests/conftest.py)
    assert uncached.exit_code == 0, uncached.stderr
    assert second == json.loads(uncached.stdout)


def test_inside_a_trace_it_is_plain_jit(exe_folder):
    f = compile_cache.cached_jit(_toy, "toy")
    spec = {"a": np.float32(2.0), "b": np.zeros(2, np.float32)}
    grad = jax.grad(lambda x: f(spec, x)["y"])(np.float32(3.0))
    assert float(grad) == 2.0 and not list((exe_folder / "exe").iterdir())


def test_old_cache_folders_are_pruned_and_nothing_else(tmp_path):
    for i in range(compile_cache.KEEP + 2):
        folder = tmp_path / f"jax-{i:016x}"
        folder.mkdir()
        os.utime(folder, (1000 + i, 1000 + i))
    (tmp_path / "validation-abc.json").write_text("{}")  # dse.report.validation's cache, same base
    (tmp_path / "jax-mine").mkdir()
    compile_cache.prune(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    newest = [f"jax-{i:016x}" for i in range(2, compile_cache.KEEP + 2)]
    assert left == sorted([*newest, "jax-mine", "validation-abc.json"])


def test_enable_makes_the_folder_and_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setitem(compile_cache._STATE, "folder", None)
    for option in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        monkeypatch.delenv(option, raising=False)
    monkeypatch.setattr(jax.config, "update", lambda *a: None)  # this process's JAX stays as it is
    folder = compile_cache.enable({"HETERSIM_CACHE_DIR": str(tmp_path)})
    assert folder == compile_cache.cache_dir({"HETERSIM_CACHE_DIR": str(tmp_path)})
    assert (folder / "exe").is_dir() and (folder / "xla").is_dir()
    assert compile_cache.enabled() == folder
    assert (folder.stat().st_mode & 0o077) == 0  # the owner's only


def test_the_fast_compiled_model_gives_the_same_numbers_as_plain_jit(catalog, cal):
    """compile_fast (XLA's CPU backend at LLVM -O0, for compile time) runs the same HLO: every
    output of simulate equals plain jax.jit's for dense and MoE layouts."""
    from hetersim.simulate import simulate

    from .conftest import make

    layouts = [
        make(catalog, "llama2-70b", tp=8, pp=4, vp=5, n_gpus=512, global_batch=1024, recompute="selective"),
        make(catalog, "llama3-8b", tp=1, pp=1, n_gpus=8, global_batch=64, zero=3, seq_len=8192, stack="torchtitan"),
        make(catalog, "mixtral-8x7b", tp=1, pp=1, ep=8, n_gpus=64, global_batch=256, sp=False),
    ]
    jitted = jax.jit(simulate)
    for model, system, plan in layouts:
        args = (model, system, plan, cal)
        fast = compile_cache.compile_fast(jitted, args)(*args)
        plain = jitted(*args)
        for got, want in zip(jax.tree.leaves(fast), jax.tree.leaves(plain), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=0.0)


def test_an_xla_without_one_of_the_fast_options_compiles_with_the_base_ones(monkeypatch):
    """An option this XLA does not know (the floor's XLA predates the CPU fusion emitters) falls
    back to BASE_COMPILE instead of failing: the program still compiles and gives the same value."""
    unknown = "xla_hetersim_no_such_option"
    monkeypatch.setattr(compile_cache, "FAST_COMPILE", {**compile_cache.FAST_COMPILE, unknown: True})
    jitted = jax.jit(lambda x: jnp.sin(x) * 2.0)
    with pytest.raises(Exception, match=unknown):  # XLA itself refuses it
        jitted.lower(1.0).compile(compiler_options={unknown: True})
    assert float(compile_cache.compile_fast(jitted, (1.0,))(1.0)) == pytest.approx(2.0 * np.sin(1.0), rel=1e-6)
