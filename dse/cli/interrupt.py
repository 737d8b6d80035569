"""Ctrl-C: one line, exit code 130, and no crash whatever the process was doing.

Python raises ``KeyboardInterrupt`` wherever the main thread is when the signal is handled. Inside
JAX that is unsafe: XLA's compiler checks for signals and raises out of ``backend.compile_and_load``
while its threads still work, the MLIR lowering is left with a half-built module, an import of
``jaxlib`` is cut short, and a garbage-collection callback swallows the exception (the command
runs on as if nothing had happened). A normal interpreter exit after the first three destroys the
XLA client and the MLIR context under them: a segmentation fault (exit 139).

So the CLI handles SIGINT itself (:func:`sigint_handler`): outside JAX it raises
``KeyboardInterrupt`` as usual, so a sweep or a search keeps what it has done and says so; inside
JAX it prints one line and leaves at once (:func:`exit_now`). Either way the process ends with
``os._exit``, never the interpreter's teardown. What is lost is the work in flight only: sweep
chunks and optimize trials are written atomically as they finish.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C
UNSAFE_MODULES = ("jax", "jaxlib")  # a KeyboardInterrupt raised under these crashes the exit
# What the running command keeps if Ctrl-C comes while it is inside JAX (set by the command), and
# whether a Ctrl-C came (typer turns a KeyboardInterrupt into a silent exit code 130).
_note = {"text": "", "hit": False}


class Interrupted(Exception):
    """Ctrl-C that a command has handled: what it kept is on disk; the message (empty when the
    command has printed its own) is the one line shown before exit code 130."""


def exit_now(code: int) -> NoReturn:
    """Flush the streams and exit with ``code`` without tearing the interpreter down; inside a
    test runner (``sys.stdout`` replaced) a plain ``SystemExit``, so the runner survives."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if sys.stdout is not sys.__stdout__:
        raise SystemExit(code)
    os._exit(code)


def note(text: str) -> None:
    """What the running command keeps when interrupted inside JAX (one line's tail)."""
    _note["text"] = text


def inside_jax(frame: FrameType | None) -> bool:
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).split(".")[0] in UNSAFE_MODULES:
            return True
        frame = frame.f_back
    return False


def interrupted() -> bool:
    """Whether Ctrl-C came while the last :func:`sigint_guard` block ran."""
    return bool(_note["hit"])


def sigint_handler(signum: int, frame: FrameType | None) -> None:
    _note["hit"] = True
    if inside_jax(frame):
        text = _note["text"]
        show_cursor = "\x1b[?25h\n" if sys.stderr.isatty() else ""  # a progress bar may have hidden it
        print(f"{show_cursor}interrupted{': ' + text if text else ''}", file=sys.stderr)
        exit_now(INTERRUPTED_EXIT)
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_guard() -> Iterator[None]:
    """:func:`sigint_handler` for SIGINT while the block runs (main thread only), then the old one."""
    _note["hit"] = False
    try:
        previous = signal.signal(signal.SIGINT, sigint_handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        note("")
