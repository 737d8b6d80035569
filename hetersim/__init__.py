"""HeterSim: a differentiable analytical cost model of LLM training on heterogeneous clusters.

The front door. Five lines::

    import hetersim

    out = hetersim.evaluate("llama3-70b", "h200-sxm-141gb", n_gpus=512, tp=8, pp=4, global_batch=512)
    print(float(out.step_time_s), float(out.mfu))

Exports are loaded on first use, so that ``import hetersim.catalog`` (and study parsing in
``dse``) stays free of JAX: :func:`evaluate` and :func:`configure` (names in, breakdown out, the
CLI's defaults), :func:`simulate` and :func:`simulate_cluster` (specs in, breakdown out; batch
them with ``jax.vmap``), the specs and their builders, :func:`load_catalog`, and the registry of
plan fields. Layout: ``specs/`` and ``planfields.py`` (inputs), ``terms/`` (cost terms of one
configuration), ``simulate.py`` and ``cluster.py`` (stages composed), ``catalog/`` (data with
sources), ``fit/`` (validation against measured runs and calibration).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_EXPORTS = {
    "evaluate": "hetersim.api",
    "configure": "hetersim.api",
    "Configuration": "hetersim.api",
    "simulate": "hetersim.simulate",
    "Breakdown": "hetersim.simulate",
    "STEP_TERMS": "hetersim.outputs",
    "simulate_cluster": "hetersim.cluster",
    "cluster_spec": "hetersim.cluster",
    "ModelSpec": "hetersim.specs",
    "SystemSpec": "hetersim.specs",
    "Plan": "hetersim.specs",
    "Calibration": "hetersim.specs",
    "plan_spec": "hetersim.specs",
    "model_spec": "hetersim.build",
    "system_spec": "hetersim.build",
    "load_catalog": "hetersim.catalog",
    "PLAN_FIELDS": "hetersim.planfields",
    "Infeasible": "hetersim.types",
    "read_recipe": "hetersim.recipe",
}

__all__ = [
    "STEP_TERMS",
    "PLAN_FIELDS",
    "Breakdown",
    "Calibration",
    "Configuration",
    "Infeasible",
    "ModelSpec",
    "Plan",
    "SystemSpec",
    "__version__",
    "cluster_spec",
    "configure",
    "evaluate",
    "load_catalog",
    "model_spec",
    "plan_spec",
    "read_recipe",
    "simulate",
    "simulate_cluster",
    "system_spec",
]


def __getattr__(name: str) -> Any:
    if name == "PLAN_FIELDS":
        return importlib.import_module("hetersim.planfields").FIELDS
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hetersim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from .api import Configuration, configure, evaluate
    from .build import model_spec, system_spec
    from .catalog import load_catalog
    from .cluster import cluster_spec, simulate_cluster
    from .outputs import STEP_TERMS
    from .planfields import FIELDS as PLAN_FIELDS
    from .simulate import Breakdown, simulate
    from .specs import Calibration, ModelSpec, Plan, SystemSpec, plan_spec
    from .types import Infeasible
