"""dse.atomic: a file is replaced whole or left as it was, and no temporary file stays behind."""

from __future__ import annotations

import stat

import numpy as np
import pytest

from dse import atomic


def test_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    atomic.write_text(path, "old")
    assert atomic.write_text(path, "new") == path
    assert path.read_text() == "new"
    atomic.write_bytes(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "fig.svg"

    def fail(tmp):
        tmp.write_bytes(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic.atomic_write(path, fail)
    assert list(tmp_path.iterdir()) == []  # no zero-byte or partial file
    atomic.write_text(path, "<svg/>")
    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write(path, lambda tmp: (_ for _ in ()).throw(KeyboardInterrupt))
    assert path.read_text() == "<svg/>"
    assert [p.name for p in tmp_path.iterdir()] == ["fig.svg"]


def test_a_failed_figure_leaves_no_file(tmp_path, monkeypatch):
    from dse.report import figures as rf

    fig = rf.signed_bars(["a", "b"], np.array([1.0, -2.0]), "x", "t")

    def broken(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(atomic, "_fsync", broken)
    with pytest.raises(OSError):
        rf.save(fig, tmp_path, "f")
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_missing_folders_is_written_where_check_target_allows_it(tmp_path):
    """--out new/dir/x.json: check_target vets the nearest existing folder, the write makes the rest
    (the write used to fail after the work with the temporary file's errno)."""
    target = tmp_path / "new" / "dir" / "x.json"
    atomic.check_target(target, "--out")
    atomic.write_text(target, "{}\n")
    assert target.read_text() == "{}\n"
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]


def test_a_written_file_gets_the_mode_a_plain_open_gives(tmp_path):
    """mkstemp makes its file 0600; the written file is readable as any file the user creates."""
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic.write_text(tmp_path / "atomic.txt", "x")
    assert stat.S_IMODE((tmp_path / "atomic.txt").stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
