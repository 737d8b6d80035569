"""Checkpoints of a sweep: finished chunks (or a streamed sweep's reduced state) in ``<out>.chunks/``,
valid only for the fingerprint (study, space, calibration, chunk, versions, source) they were made for."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping
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


class Checkpoints:
    """``<out>.chunks/``: one ``chunk_NNNNNN.npz`` per finished chunk and a ``manifest.json``
    naming the fingerprint they belong to. Files are written atomically (:mod:`dse.atomic`)."""

    def __init__(self, folder: Path, fp: str, n_chunks: int):
        self.folder = folder
        self.n_chunks = n_chunks
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
        return {i for i in range(self.n_chunks) if self.path(i).is_file()}

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
        if not self.state_path.is_file():
            return None
        with np.load(self.state_path) as data:
            return {k: data[k] for k in data.files}

    def clear(self) -> None:
        """Remove the folder and what this module writes in it."""
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            if path.name.removeprefix(".").startswith(("manifest.json", "chunk_", "state.npz")):  # and temporaries
                path.unlink()
        self.folder.rmdir()


def _savez(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("wb") as handle:  # a handle: np.savez would add ".npz" to a path
            np.savez(handle, **arrays)

    atomic.atomic_write(path, write)
