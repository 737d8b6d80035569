"""Checkpoints of a sweep: finished chunks (or a streamed sweep's reduced state) in ``<out>.chunks/``,
valid only for the fingerprint (study, space, calibration, chunk, versions, source) they were made for."""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import zipfile
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dse import atomic
from dse.sweep.space import Space
from hetersim import build
from hetersim.specs import Calibration


def package_versions() -> dict[str, str]:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "unknown"

    names = ("hetersim", "jax", "jaxlib", "numpy", "xarray", "netCDF4")
    return {"python": platform.python_version(), **{n: version(n) for n in names}}


def _source_digest() -> str:
    """Digest of the cost model's source, so checkpoints of other code are never reused."""
    h = hashlib.sha256()
    root = Path(build.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):  # this package: the sweep engine
        h.update(path.read_bytes())
    return h.hexdigest()


def fingerprint(study_text: str, space: Space, tables: Any, cal: Calibration, chunk: int) -> str:
    h = hashlib.sha256()
    h.update(study_text.encode())
    meta = {"chunk": chunk, "size": space.size, "radices": space.radices, "kinds": space.kinds, "v": package_versions()}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for leaf in jax.tree.leaves((tables, cal)):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    h.update(_source_digest().encode())
    return h.hexdigest()


def checkpoint_folder(path: Path) -> Path:
    """Where the checkpoints of the dataset ``path`` are kept: ``<path>.chunks/``."""
    return path.with_name(path.name + ".chunks")


# What reading a damaged or foreign ``.npz`` raises (a truncated zip, bytes that are no zip, a
# pickled object refused, a missing member).
UNREADABLE = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile)


def warn(message: str) -> None:
    """One line ``warning: ...`` on stderr (the sweep goes on)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


class Checkpoints:
    """``<out>.chunks/``: one ``chunk_NNNNNN.npz`` per finished chunk and a ``manifest.json``
    naming the fingerprint they belong to. Files are written atomically (:mod:`dse.atomic`).

    A chunk file that cannot be read whole, or holds other rows than its chunk (``rows(index)``,
    when given, is the row count each chunk must have), is removed with a one-line warning and
    its chunk computed again."""

    def __init__(self, folder: Path, fp: str, n_chunks: int, rows: Callable[[int], int] | None = None):
        self.folder = folder
        self.n_chunks = n_chunks
        self.rows = rows
        manifest = folder / "manifest.json"
        if folder.is_dir():
            try:
                old = json.loads(manifest.read_text()).get("fingerprint")
            except (OSError, ValueError):
                old = None
            if old != fp:
                self.clear()
        folder.mkdir(parents=True, exist_ok=True)
        if not manifest.is_file():
            atomic.write_bytes(manifest, json.dumps({"fingerprint": fp, "n_chunks": n_chunks}).encode())

    def path(self, index: int) -> Path:
        return self.folder / f"chunk_{index:06d}.npz"

    def done(self) -> set[int]:
        """The chunks whose checkpoint is whole (each file read once; damaged ones removed)."""
        return {i for i in range(self.n_chunks) if self.path(i).is_file() and self._check(i)}

    def _check(self, index: int) -> bool:
        path = self.path(index)
        try:
            arrays = self.load(index)
            lengths = {len(a) for a in arrays.values()}
            if not arrays or len(lengths) != 1:
                raise ValueError("not a chunk of this sweep")
            if self.rows is not None and lengths != {self.rows(index)}:
                raise ValueError(f"{lengths.pop()} rows, expected {self.rows(index)}")
        except UNREADABLE as error:
            warn(f"{path}: unreadable checkpoint ({_reason(error)}); computing chunk {index} again")
            path.unlink(missing_ok=True)
            return False
        return True

    def save(self, index: int, arrays: Mapping[str, np.ndarray]) -> None:
        _savez(self.path(index), arrays)

    def load(self, index: int) -> dict[str, np.ndarray]:
        with np.load(self.path(index)) as data:
            return {k: data[k] for k in data.files}

    @property
    def state_path(self) -> Path:
        return self.folder / "state.npz"

    def save_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The reduced state of a streamed sweep (one file, replaced atomically)."""
        _savez(self.state_path, arrays)

    def load_state(self) -> dict[str, np.ndarray] | None:
        """The streamed state, or None (none yet, or damaged: removed with a warning, so the sweep
        starts over)."""
        if not self.state_path.is_file():
            return None
        try:
            with np.load(self.state_path) as data:
                return {k: data[k] for k in data.files}
        except UNREADABLE as error:
            warn(f"{self.state_path}: unreadable checkpoint ({_reason(error)}); starting the streamed sweep over")
            self.state_path.unlink(missing_ok=True)
            return None

    def clear(self) -> None:
        """Remove the folder and what this module writes in it."""
        if not self.folder.is_dir():
            return
        others = []
        for path in self.folder.iterdir():
            if path.name.removeprefix(".").startswith(("manifest.json", "chunk_", "state.npz")):  # and temporaries
                path.unlink()
            else:
                others.append(path.name)
        if others:
            warn(f"{self.folder}: kept, it holds files the sweep did not write ({', '.join(sorted(others))})")
            return
        self.folder.rmdir()


def _reason(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _savez(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("wb") as handle:  # a handle: np.savez would add ".npz" to a path
            np.savez(handle, **arrays)

    atomic.atomic_write(path, write)
