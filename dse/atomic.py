"""Every file ``dse`` writes goes through :func:`atomic_write`: all of it or nothing.

The content is written to a temporary file in the destination's folder (``.<name>.<random>.tmp``),
flushed to disk (``fsync``) and renamed over the destination with ``os.replace``; on any failure,
Ctrl-C included, the temporary file is removed and the destination is left as it was. A reader
therefore sees the old file or the new one, never a truncated or zero-byte one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

TMP_SUFFIX = ".tmp"


def temp_path(path: Path) -> Path:
    """A new, empty temporary file beside ``path`` (hidden; its name starts with ``.<name>.``),
    in ``path``'s folder, made if missing (:func:`check_target` vetted its nearest ancestor)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    return Path(tmp)


def _plain_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to fill a temporary file beside ``path``, then move it to ``path``.

    ``write`` gets the temporary file's path (the file exists and is empty; a writer may replace
    it). Its name does not end in the destination's suffix, so writers that guess a format from
    the name must be told it. Returns ``path``.
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        write(tmp)
        _fsync(tmp)
        os.chmod(tmp, _plain_file_mode())  # mkstemp makes it 0600: readable by its owner alone
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    """``data`` to ``path``, atomically."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """``text`` to ``path``, atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding=encoding))


def nc_target(out: str | Path, name: str) -> Path:
    """Where ``--out`` puts a results file called ``name``: ``out`` itself when it names a ``.nc``
    file, else the folder ``out``'s ``name``. Written with a trailing separator (``r.nc/``),
    ``out`` is a folder whatever its name (``Path`` drops the separator: read it as given)."""
    folder = isinstance(out, str) and out.endswith(("/", os.sep))
    path = Path(out)
    return path if path.suffix == ".nc" and not folder else path / name


# The first bytes of a netCDF file: netCDF-4 is HDF5 (its signature), classic netCDF "CDF" and a
# version byte 1, 2 or 5 (NetCDF User's Guide, "File Format Specifications").
NETCDF_MAGIC = (b"\x89HDF\r\n\x1a\n", b"CDF\x01", b"CDF\x02", b"CDF\x05")


def check_nc_target(path: Path, what: str) -> Path:
    """:func:`check_target` for a results dataset, which also refuses to replace an existing file
    that is no netCDF file (a rerun replaces its own results; ``--out notes.nc`` is a typo)."""
    check_target(path, what)
    if path.is_file() and path.stat().st_size and not is_netcdf(path):
        raise ValueError(f"{what} {path}: exists and is no netCDF file; give another path, or remove it")
    return path


def is_netcdf(path: Path) -> bool:
    """An existing file whose first bytes are netCDF's (HDF5's signature, or classic netCDF's)."""
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        return handle.read(8).startswith(NETCDF_MAGIC)


def check_target(path: str | Path, what: str, reads: Iterable[str | Path | None] = ()) -> Path:
    """A one-line ``ValueError`` naming ``what`` (a flag) unless file ``path`` can be written: it
    is not a folder (nor, given as text, a path ending in a separator, which ``Path`` would drop),
    not one of the files the command ``reads``, and its nearest existing ancestor is a folder this
    process may write into. Called before any work, so that a bad output location fails at once and
    leaves nothing."""
    path = file_path(path, what)
    if any(source is not None and Path(source).resolve() == path.resolve() for source in reads):
        raise ValueError(f"{what} {path} is a file this command reads; give the output its own file")
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder; give a file path")
    check_plain(path, what, "a file path")
    _check_ancestor(path.parent, path, what)
    return path


def file_path(path: str | Path, what: str) -> Path:
    """``path`` as a file's path: given as text, one ending in a separator names a folder (``Path``
    would drop the separator), refused naming ``what``."""
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        raise ValueError(f"{what} {path}: ends in a separator, a folder's path; give a file path")
    return Path(path)


def check_own_output(path: str | Path, what: str, kind: str, reads: Iterable[str | Path | None] = ()) -> Path:
    """:func:`check_target` for a ``kind`` ("JSON" or "TOML") output, which also refuses to replace
    an existing file of other content: a rerun replaces its own output, while ``--out r.nc`` (a
    results file) or ``--out notes.txt`` is a slip that would lose the file."""
    import json
    import tomllib

    target = check_target(path, what, reads)
    other = {"JSON": ".toml", "TOML": ".json"}[kind]
    if target.suffix.lower() == other:  # TOML text in o.json: every reader of that name would fail on it
        raise ValueError(f"{what} {target}: this writes {kind}, not {other[1:].upper()}; give a .{kind.lower()} path")
    if target.is_file() and target.stat().st_size:
        try:
            text = target.read_text(encoding="utf-8")
            json.loads(text) if kind == "JSON" else tomllib.loads(text)
        except (UnicodeDecodeError, ValueError):  # JSONDecodeError and TOMLDecodeError are ValueErrors
            message = f"{what} {target}: exists and is no {kind} file; give another path, or remove it"
            raise ValueError(message) from None
    return target


def check_plain(path: str | Path, what: str, give: str = "a file") -> None:
    """A one-line ``ValueError`` naming ``what`` if ``path`` is a device, a pipe or a socket: read,
    it may block for ever (a FIFO); written, ``os.replace`` would put a file there (``/dev/null``)."""
    path = Path(path)
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise ValueError(f"{what} {path}: not a regular file (a device, pipe or socket); give {give}")


def check_folder(path: str | Path, what: str) -> Path:
    """Like :func:`check_target` for a folder ``path`` that will be created or written into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path}: is a file, not a folder")
    _check_ancestor(path, path, what)
    return path


def _check_ancestor(folder: Path, path: Path, what: str) -> None:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{what} {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path}: folder {folder} is not writable")
    # Permissions are not the whole answer (root passes os.access; /proc, a read-only mount):
    # create and remove a file there, as the write will.
    try:
        fd, probe = tempfile.mkstemp(prefix=".hetersim-probe.", dir=folder)
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot create a file in {folder} ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)
