"""The ``hetersim`` command line: one thin module per command, calling the engine.

Options become fields of :func:`hetersim.api.configure`, a study, or a search, and
:mod:`dse.format` shows the answer. Bad input is one line ``error: ...`` on stderr and exit code
2; an infeasible configuration is an answer (exit code 0). JAX and the cost model are imported
inside the commands so that ``--help`` stays fast.
"""

# Importing a command module registers its commands, in the order `hetersim --help` lists them.
from . import evaluate, validate, catalog, sweep, report, optimize, export, plan  # noqa: F401, I001
from .app import app, user_errors
from .evaluate import configuration
from .options import FIELD_FLAGS

__all__ = ["FIELD_FLAGS", "app", "configuration", "user_errors"]
