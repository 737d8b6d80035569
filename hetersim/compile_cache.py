"""Compiled programs kept between processes, so ``hetersim evaluate`` does not recompile the model.

Two layers, in one user cache folder (:func:`cache_dir`), both off until :func:`enable` is called
(the command line calls it; a library import changes no global JAX setting):

* JAX's persistent compilation cache (``<folder>/xla``): every XLA program the process compiles,
  keyed by JAX on the lowered program, with the thresholds lowered so the small programs of one
  evaluation are kept too.
* the executables of :func:`cached_jit` functions (``<folder>/exe``), keyed by the function, the
  arguments' structure and their shapes and dtypes: a hit skips tracing and lowering as well,
  which the XLA cache cannot (about 2 s of the model's one-configuration compile on 2 cores).
  The values in the arguments are not part of the key: every spec field is a traced leaf
  (:mod:`hetersim.pytree`), so another batch, ``tp`` or ``seq_len`` hits the same entry.

The folder is ``$HETERSIM_CACHE_DIR`` (``off`` disables both layers), else
``$XDG_CACHE_HOME/hetersim``, else ``~/.cache/hetersim``; inside it, a subfolder named after a hash
of the jax and jaxlib versions and of every file of the ``hetersim`` and ``dse`` packages (their
sources and packaged tables, which a trace bakes in as constants), so an edit or an upgrade starts
afresh instead of loading a stale program (the :data:`KEEP` most recently used ones are kept, older
ones removed). Nothing here is an error: a folder that cannot be
written, or an entry that does not load or run, only costs the cache (the function is compiled as
without it). The entries are pickles (JAX's own executable serialization); the folder is created
readable by its owner only, and, as for any cache of code, one should not point it at a folder
that others can write.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ENV = "HETERSIM_CACHE_DIR"
OFF = "off"
PACKAGES = ("hetersim", "dse")
KEEP = 4  # cache folders kept (other sources or JAX versions): a few branches' worth
_STATE: dict[str, Path | None] = {"folder": None}


def base_dir(environ: Any = None) -> Path | None:
    """The cache's base folder from the environment (``environ``, default ``os.environ``):
    ``$HETERSIM_CACHE_DIR``, None when it is ``off``; else ``$XDG_CACHE_HOME/hetersim``; else
    ``~/.cache/hetersim``. An empty variable counts as unset."""
    env = os.environ if environ is None else environ
    given = env.get(ENV, "").strip()
    if given:
        return None if given.lower() == OFF else Path(given).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    return Path(xdg if xdg else Path.home() / ".cache") / "hetersim"


@functools.cache
def source_key() -> str:
    """A hash of the jax and jaxlib versions and of every file of the packages (name and bytes)."""
    import importlib.util
    from importlib import metadata

    h = hashlib.sha256()
    for dist in ("jax", "jaxlib"):
        try:
            h.update(f"{dist} {metadata.version(dist)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist} none\0".encode())
    for package in PACKAGES:
        found = importlib.util.find_spec(package)
        roots = list(found.submodule_search_locations or []) if found is not None else []
        for root in map(Path, roots):
            for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                h.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
                h.update(path.read_bytes())
                h.update(b"\0")
    return h.hexdigest()[:16]


def cache_dir(environ: Any = None) -> Path | None:
    """The folder this installation's compiled programs go in (:func:`base_dir` / ``jax-<key>``),
    or None when the cache is off."""
    base = base_dir(environ)
    return None if base is None else base / f"jax-{source_key()}"


def enable(environ: Any = None) -> Path | None:
    """Turn both layers on in :func:`cache_dir` (None: off, nothing changed); return the folder.

    Sets ``jax_compilation_cache_dir`` and the minimum compile time (0 s) and entry size (0 bytes)
    for a program to be kept: through ``jax.config`` when JAX is imported already (an option this
    JAX lacks is skipped; jax 0.4.27, the floor, has all three), else as the ``JAX_...``
    environment variables JAX reads when it is imported (one set already is left alone), so a
    command that never compiles does not import JAX for this. Call it before the first
    compilation: JAX opens its cache once per process."""
    folder = cache_dir(environ)
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # mode: this folder, not its parents
        (folder / "exe").mkdir(exist_ok=True, mode=0o700)
        (folder / "xla").mkdir(exist_ok=True, mode=0o700)
        os.utime(folder)  # the newest in use, for prune()
    except OSError:
        return None
    prune(folder.parent)
    settings = {
        "jax_compilation_cache_dir": str(folder / "xla"),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    if "jax" in sys.modules:
        import jax

        for option, value in settings.items():
            if option in jax.config.values:
                jax.config.update(option, value)
    else:
        for option, value in settings.items():
            os.environ.setdefault(option.upper(), str(value))
    _STATE["folder"] = folder
    return folder


def prune(base: Path, keep: int = KEEP) -> None:
    """Remove all but the ``keep`` most recently used ``jax-<key>`` folders of ``base`` (each edit
    of the package or JAX upgrade leaves one behind); anything else in ``base`` stays."""
    import re
    import shutil

    try:
        found = [p for p in base.iterdir() if p.is_dir() and re.fullmatch(r"jax-[0-9a-f]{16}", p.name)]
        found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in found[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def enabled() -> Path | None:
    """The folder :func:`enable` turned on in this process, or None."""
    return _STATE["folder"]


def disable() -> None:
    """Stop using the executables layer (tests); JAX's own cache stays as it was opened."""
    _STATE["folder"] = None


@contextlib.contextmanager
def bypass() -> Iterator[None]:
    """Compile without JAX's persistent cache inside the block (``hetersim bench`` times a real
    compilation; a program loaded from that cache cannot be serialized again on every backend)."""
    import jax

    option = "jax_enable_compilation_cache"
    if option not in jax.config.values:
        yield
        return
    before = jax.config.values[option]
    jax.config.update(option, False)
    try:
        yield
    finally:
        jax.config.update(option, before)


def _key(name: str, leaves: list[Any], treedef: Any) -> str:
    import jax
    import numpy as np

    device = jax.devices()[0]
    parts = [name, repr(treedef), device.platform, device.device_kind, str(jax.config.values.get("jax_enable_x64"))]
    for leaf in leaves:
        weak = getattr(leaf, "weak_type", isinstance(leaf, int | float | bool | complex))
        dtype = np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.result_type(leaf)
        parts.append(f"{type(leaf).__name__}:{np.shape(leaf)}:{dtype.str}:{weak}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


# One configuration runs in about 2 ms, so its program is compiled for compile time, from the same
# HLO (the same numbers: tests/test_compile_cache.py). Sweeps compile their batched engine apart,
# at the defaults.
# * XLA's CPU backend at LLVM optimisation level 0 instead of its default 3: level 1 compiled the
#   one-configuration simulate program in about 2.5 s instead of 3.0 s on 2 cores, level 0 about
#   0.45 s less again (2026-12-04, the AMD EPYC), and a call of the compiled program stays within
#   the ~7.5 ms that building a configuration's specs in Python takes.
# * ``xla_cpu_use_fusion_emitters`` off: XLA's CPU backend then emits its fused loops with the
#   older elemental IR emitter instead of lowering each fusion through MLIR (the flag's help in
#   xla/debug_options_flags.cc: "Use fusion emitters for code generation in the XLA:CPU
#   backend"). The model's program is thousands of scalar fusions, and for them the MLIR
#   pipeline's fixed cost per fusion dominates: the simulate program compiled in 2.1 s instead of
#   3.8 s (2026-12-05, the same machine, one process each, the README's example), the same step
#   time to the last digit. A JAX whose XLA lacks the option (jax 0.4.27, the floor, predates the
#   fusion emitters) compiles with the options it has (:func:`compile_fast`).
# * ``xla_llvm_disable_expensive_passes``: LLVM's costlier passes skipped (another 0.1-0.2 s).
FAST_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_cpu_use_fusion_emitters": False,
    "xla_llvm_disable_expensive_passes": True,
}
# Options every supported XLA knows, the fallback when one of FAST_COMPILE is unknown.
BASE_COMPILE = {"xla_backend_optimization_level": 0}


def compile_fast(jitted: Any, args: tuple[Any, ...]) -> Any:
    """``jitted`` lowered for ``args`` and compiled with :data:`FAST_COMPILE` on the CPU backend
    (with :data:`BASE_COMPILE` where this XLA does not know one of its options)."""
    import jax

    lowered = jitted.lower(*args)
    if jax.default_backend() != "cpu":
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=FAST_COMPILE)
    except Exception as error:  # noqa: BLE001 - XLA raises its own status error type
        if not any(name in str(error) for name in FAST_COMPILE.keys() - BASE_COMPILE.keys()):
            raise  # not an unknown option: a real failure
        return lowered.compile(compiler_options=BASE_COMPILE)


class CachedJit:
    """``jax.jit(fn)``, compiled for compile time (:func:`compile_fast`), whose compiled programs
    are also kept in the executables layer when it is on (:func:`enable`): one per argument
    structure, loaded instead of traced in a later process."""

    def __init__(self, fn: Callable[..., Any], name: str):
        import jax

        self.fn = fn
        self.name = name
        self.jitted = jax.jit(fn)
        self.loaded: dict[str, Any] = {}  # programs of the executables layer, by key
        self.compiled: dict[str, Any] = {}  # programs compiled in this process with the layer off

    def __call__(self, *args: Any) -> Any:
        import jax

        leaves, treedef = jax.tree.flatten(args)
        if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):  # called inside a trace
            return self.jitted(*args)
        key = _key(self.name, leaves, treedef)
        folder = enabled()
        if folder is None:
            if key not in self.compiled:
                self.compiled[key] = compile_fast(self.jitted, args)
            return self.compiled[key](*args)
        compiled = self.loaded.get(key)
        if compiled is not None:
            return compiled(*args)
        path = folder / "exe" / f"{self.name}-{key}.pkl"
        out = self._load(path, args)
        if out is not None:
            self.loaded[key], result = out
            return result
        with bypass():
            compiled = compile_fast(self.jitted, args)
        self.loaded[key] = compiled
        _store(path, compiled)
        return compiled(*args)

    @staticmethod
    def _load(path: Path, args: tuple[Any, ...]) -> tuple[Any, Any] | None:
        """(compiled, its result for ``args``) from ``path`` (or from :func:`prefetch`'s thread);
        None when absent or unusable."""
        import jax
        from jax.experimental import serialize_executable

        future = _PREFETCHED.pop(path, None)  # exception() waits for a prefetch still loading it
        compiled = None if future is None or future.exception() is not None else future.result()
        if compiled is None:  # not prefetched, or its load failed: read it here
            entry = _read(path)
            if entry is None:
                return None
            try:
                compiled = serialize_executable.deserialize_and_load(*entry)
            except Exception:  # noqa: BLE001 - any failure of a cached program means: compile it again
                path.unlink(missing_ok=True)
                return None
        try:
            out = jax.block_until_ready(compiled(*args))  # an unusable entry fails here
        except Exception:  # noqa: BLE001
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the first that prefetch() loads next time
        return compiled, out


def _read(path: Path) -> tuple[Any, Any, Any] | None:
    """An entry's pickled (serialized executable, argument tree, output tree); None when it is
    absent or unreadable (CachedJit then compiles it again)."""
    try:
        with path.open("rb") as handle:
            return pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError):
        return None


# Programs prefetch() is loading, by entry path: a Future of the loaded program each.
_PREFETCHED: dict[Path, Future] = {}
# How many of the most recently used entries prefetch() loads: a dense ``hetersim evaluate`` uses
# three (the kernel check, the interleave check and the model).
PREFETCH_ENTRIES = 3


def prefetch(folder: Path | None = None, count: int = PREFETCH_ENTRIES) -> None:
    """Start loading the ``count`` most recently used entries of the executables layer on a
    background thread, before the command has built its arguments; :class:`CachedJit` takes a
    prefetched program for the same entry path instead of loading it again.

    Loading the one-configuration model (XLA re-reads the program and redoes its buffer analysis:
    0.3-0.4 s on 2 cores, about a third of a repeated ``hetersim evaluate``) releases Python's GIL,
    so it runs while the main thread imports the command line and builds the specs. The files are
    unpickled here, on the calling thread (that imports the modules of their argument trees, so the
    thread never imports), and the JAX backend is started here too. Nothing here is an error: a
    folder that is off or unreadable, or an entry that does not load, only loses the prefetch.
    ``folder``: the cache folder, default :func:`cache_dir` (the command line calls this before
    :func:`enable`)."""
    folder = cache_dir() if folder is None else folder
    if folder is None or count < 1:
        return
    try:
        paths = sorted((folder / "exe").glob("*.pkl"), key=lambda p: p.stat().st_mtime, reverse=True)[:count]
    except OSError:
        return
    if not paths:
        return
    # JAX imported (and its backend started) before any entry is unpickled: ``import jax`` sets
    # TF_CPP_MIN_LOG_LEVEL=1 before its C++ runtime loads (jax/__init__.py), and an entry unpickled
    # first loads that runtime ahead of it (its argument trees name jaxlib's classes), so XLA then
    # printed its INFO lines ("PjRt-IFRT device count ...") on stderr.
    import jax
    from jax.experimental import serialize_executable

    jax.devices()
    jobs = [(path, entry) for path in paths if (entry := _read(path)) is not None]
    if not jobs:
        return
    futures = {path: Future() for path, _ in jobs}

    def load() -> None:
        for path, entry in jobs:
            try:
                futures[path].set_result(serialize_executable.deserialize_and_load(*entry))
            except BaseException as error:  # noqa: BLE001 - handed to the caller of result()
                futures[path].set_exception(error)

    _PREFETCHED.update(futures)
    threading.Thread(target=load, name="hetersim-prefetch", daemon=True).start()


def _store(path: Path, compiled: Any) -> None:
    """Write ``compiled`` to ``path`` atomically; a backend that cannot serialize, or a folder that
    cannot be written, only skips it."""
    from jax.experimental import serialize_executable

    try:
        payload = pickle.dumps(serialize_executable.serialize(compiled))
    except Exception:  # noqa: BLE001 - not serializable here (a backend without it): no entry
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


def cached_jit(fn: Callable[..., Any], name: str | None = None) -> CachedJit:
    """:class:`CachedJit` of ``fn`` (``name``: its entries' file prefix, default the function's)."""
    return CachedJit(fn, name or getattr(fn, "__name__", "fn"))
