"""The :class:`Plan` pytree and its builder, generated from the registry of plan fields
(:mod:`hetersim.planfields`): one leaf per :class:`~hetersim.planfields.PlanField`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..planfields import FIELDS, leaf_value, resolve
from ..pytree import as_arrays, spec
from ..types import OffloadState, Tier

# --------------------------------------------------------------------------------------------
# The pytree
# --------------------------------------------------------------------------------------------


def _plan_class() -> type:
    doc = "Parallel layout and training options of one run (fields: :data:`hetersim.specs.plan.FIELDS`).\n\n"
    doc += "\n".join(f"``{f.leaf}``: {f.long_name}" for f in FIELDS)
    namespace = {"__annotations__": {f.leaf: Any for f in FIELDS}, "__doc__": doc, "__module__": __name__}
    return spec(type("Plan", (), namespace))


Plan = _plan_class()


def plan_spec(**options: Any) -> Plan:
    """A :class:`Plan` from plain options named as in :data:`FIELDS` (host side, validated).

    Required: ``n_gpus``, ``global_batch``, ``seq_len``. Defaults are the registry's:
    ``dp = n_gpus / (tp*pp*cp)``, sequence parallelism on when ``tp > 1``, ``cpu_optimizer`` on
    when the optimizer states are offloaded (DeepSpeed ZeRO-Offload's CPU-Adam). ``offload`` maps
    a state (``optimizer``, ``grads``, ``params``, ``activations``) to a tier (``host-dram``,
    ``cxl-expander``, ``cxl-pool``). A bad value is a one-line ``ValueError`` naming the field.
    """
    return as_arrays(host_plan(**options))


def host_plan(**options: Any) -> Plan:
    """:func:`plan_spec` with NumPy leaves (same dtypes), for stacking many plans on the host."""
    values = resolve(options)
    return as_arrays(Plan(**{f.leaf: leaf_value(f, values[f.name]) for f in FIELDS}), np.float32, np)


def plan_options(plan: Any) -> dict[str, Any]:
    """The plain options of a one-configuration :class:`Plan` (the inverse of :func:`plan_spec`)."""
    out: dict[str, Any] = {}
    for f in FIELDS:
        leaf = np.asarray(getattr(plan, f.leaf))
        if f.kind == "choice":
            out[f.name] = f.names[int(leaf)]
        elif f.kind == "offload":
            out[f.name] = {OffloadState(i).label: Tier(int(t)).label for i, t in enumerate(leaf) if int(t) > 0}
        elif f.kind == "bool":
            out[f.name] = bool(leaf > 0)
        elif f.kind == "int":
            out[f.name] = int(round(float(leaf)))
        else:
            out[f.name] = float(leaf)
    return out
