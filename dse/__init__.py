"""Design-space exploration on top of the :mod:`hetersim` cost model: CLI, studies, sweeps, search."""
