"""The ``hetersim`` console script: Ctrl-C is handled from the first line on.

Importing the command line (typer, rich, and through the commands JAX) takes most of a second;
a Ctrl-C then would end in Python's default traceback. So the script installs a SIGINT handler
that prints one line and exits with 130 before it imports anything else; the commands replace it
with their own (:mod:`dse.cli.interrupt`) while they run.

When the command is done, the script ends the process without Python's teardown of its modules
(:func:`_exit`): freeing JAX's loaded executables one object at a time takes 0.2 s of the
0.5 s that a repeated ``hetersim evaluate`` spends outside ``import jax`` (2 cores,
``benchmarks/evaluate_latency.py``). The exit handlers still run and the streams are flushed first.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

INTERRUPTED_EXIT = 130  # 128 + SIGINT (dse.cli.interrupt.INTERRUPTED_EXIT)


def _starting(signum, frame) -> None:
    print("interrupted while starting", file=sys.stderr, flush=True)
    os._exit(INTERRUPTED_EXIT)


def main() -> None:
    try:
        signal.signal(signal.SIGINT, _starting)
    except ValueError:  # not the main thread
        pass
    if prefetches(sys.argv[1:]):
        _prefetch()
    from dse.cli import app

    try:
        app(prog_name="hetersim")
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            _exit(done.code or 0)
        raise  # a message as the exit status: Python prints it
    _exit(0)


def prefetches(args: list[str]) -> bool:
    """True for an ``evaluate`` command line (not its help): the command is the first word after
    the global options (-q, -v; none takes a value)."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    return command == "evaluate" and not {"-h", "--help"} & set(args)


def _prefetch() -> None:
    """Start loading the compiled programs a repeated ``hetersim evaluate`` will use while the rest
    starts (:func:`hetersim.compile_cache.prefetch`); it imports JAX first, so only ``evaluate``,
    whose model needs it anyway, does this. A failure only loses the head start."""
    try:
        from hetersim import compile_cache

        compile_cache.prefetch()
    except Exception:  # noqa: BLE001 - never the command's error: it runs without the prefetch
        pass


def _exit(code: int) -> None:
    """End the process with ``code`` as Python would, less the module teardown: the exit handlers
    run, the streams are flushed, then ``os._exit``. Where a thread other than daemons is still
    alive, Python's own exit waits for it, so this does too (it returns and the caller exits)."""
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written to it
            pass
    os._exit(code)
