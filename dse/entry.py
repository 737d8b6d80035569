"""The ``hetersim`` console script: Ctrl-C is handled from the first line on.

Importing the command line (typer, rich, and through the commands JAX) takes most of a second;
a Ctrl-C then would end in Python's default traceback. So the script installs a SIGINT handler
that prints one line and exits with 130 before it imports anything else; the commands replace it
with their own (:mod:`dse.cli.interrupt`) while they run.
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED_EXIT = 130  # 128 + SIGINT (dse.cli.interrupt.INTERRUPTED_EXIT)


def _starting(signum, frame) -> None:
    print("interrupted while starting", file=sys.stderr, flush=True)
    os._exit(INTERRUPTED_EXIT)


def main() -> None:
    try:
        signal.signal(signal.SIGINT, _starting)
    except ValueError:  # not the main thread
        pass
    from dse.cli import app

    app(prog_name="hetersim")
