"""Provenance of the files dse writes: the CF ``history`` attribute (date and command line)."""

from __future__ import annotations

import shlex
import sys
from datetime import UTC, datetime


def history(argv: list[str] | None = None) -> str:
    """``"2025-01-31T12:00:00Z: hetersim sweep studies/x.toml"``: when, and the command that wrote
    the file (CF's ``history``: one line per program that touched it). Run from Python instead of
    the CLI, the command is the Python program's own."""
    argv = list(sys.argv if argv is None else argv)
    if argv and (argv[0].endswith(("hetersim", "__main__.py")) or argv[0] == "-m"):
        argv[0] = "hetersim"
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{when}: {shlex.join(argv)}"
