"""``python -m dse`` runs the ``hetersim`` command line."""

from dse.entry import main

main()
