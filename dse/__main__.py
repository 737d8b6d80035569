"""``python -m dse`` runs the ``hetersim`` command line."""

from dse.cli import app

app(prog_name="hetersim")
