"""The netCDF schema of a sweep dataset and the writer of a full (not streamed) one.

One ``config`` dimension; the columns of :data:`dse.sweep.space.COLUMNS` are coordinates along
it (categoricals as small int codes with CF ``flag_values``/``flag_meanings``); one variable per
metric of :data:`dse.metrics.METRICS` with ``units`` (UDUNITS-2 spellings,
:func:`dse.metrics.cf_attrs`) and ``long_name``, then
:data:`EXTRA_VARIABLES`. The study, the calibration and the versions are in the attributes
(:func:`dataset_attrs`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dse import atomic
from dse.metrics import INTERVALS, METRICS, cf_attrs
from dse.provenance import history
from dse.study import Study
from dse.sweep.checkpoints import Checkpoints, package_versions
from dse.sweep.space import CODE_COLUMNS, COLUMNS, Space
from hetersim import planfields
from hetersim.specs import Calibration
from hetersim.types import Infeasible

COMPRESSION_LEVEL = 1  # zlib: level 1 writes ~2x faster than 4 for files a few % larger

# (long_name, units) of every coordinate: the model and GPU keys, then the plan fields' (registry).
COORD_ATTRS = {
    "model": ("model (catalog key)", "1"),
    "gpu": ("accelerator (catalog key)", "1"),
    **{c: (planfields.BY_NAME[c].long_name, planfields.BY_NAME[c].units) for c in planfields.COLUMNS},
}
EXTRA_VARIABLES = {
    "constraint_violation": ("which study constraints the configuration violates (bit flags)", "i4"),
    "feasible": ("1 when the configuration runs (infeasible == 0) and meets every constraint", "i1"),
}


def variables() -> list[str]:
    """Data variables of a sweep dataset, in file order."""
    return [*METRICS, *INTERVALS, *EXTRA_VARIABLES]


def write_dataset(
    path: Path, study: Study, space: Space, ckpt: Checkpoints, chunk: int, fp: str, cal: Calibration
) -> None:
    """Stream the checkpoints into a netCDF4 file (zlib), written atomically (:mod:`dse.atomic`).

    One ``config`` dimension; the columns are coordinates along it (categoricals as small int
    codes with CF ``flag_values``/``flag_meanings``); one variable per metric with ``units`` and
    ``long_name``. Memory stays one chunk, whatever the size of the space.
    """
    import netCDF4

    size = space.size
    rows = min(size, 1 << 16)
    opts = dict(zlib=True, complevel=COMPRESSION_LEVEL, shuffle=True, chunksizes=(rows,))

    def write(tmp: Path) -> None:
        with netCDF4.Dataset(tmp, "w", format="NETCDF4") as nc:
            nc.createDimension("config", size)
            define_config_variables(nc, space, opts)
            for var in nc.variables.values():
                # HDF5 keeps a chunk cache per variable (64 MiB by default in netCDF-C); writing in
                # order needs only the chunk being filled.
                var.set_var_chunk_cache(size=2 * rows * var.dtype.itemsize, nelems=7, preemption=1.0)
            for index in range(ckpt.n_chunks):
                lo, hi = index * chunk, min(size, (index + 1) * chunk)
                for c, values in space.coords(lo, hi).items():
                    nc[c][lo:hi] = values
                for name, values in ckpt.load(index).items():
                    nc[name][lo:hi] = values
            nc.setncatts(dataset_attrs(study, space, chunk, fp, cal))

    atomic.atomic_write(path, write)


def define_config_variables(nc, space: Space, opts: Mapping[str, Any], extra_coords: str = "") -> None:
    """The columns and the variables of :func:`variables` along ``config``, with their attributes."""
    coords = space.coords(0, 0)
    for c in COLUMNS:
        var = nc.createVariable(c, coords[c].dtype, ("config",), **opts)
        column_attrs(var, space, c)
    coord_names = " ".join((*COLUMNS, *extra_coords.split()))
    for name in variables():
        if name in METRICS or name in INTERVALS:
            m = METRICS.get(name) or INTERVALS[name]
            var = nc.createVariable(name, m.dtype, ("config",), **opts)
            var.setncatts(cf_attrs(m.units, m.long_name))
            if name == "infeasible":
                flags = [f for f in Infeasible if f]
                var.flag_masks = np.array([int(f) for f in flags], np.int32)
                var.flag_meanings = " ".join(f.name.lower() for f in flags)
        else:
            long_name, dtype = EXTRA_VARIABLES[name]
            var = nc.createVariable(name, dtype, ("config",), **opts)
            var.units, var.long_name = "1", long_name
            if name == "constraint_violation" and space.constraints:
                var.flag_masks = np.array([1 << b for b in range(len(space.constraints))], np.int32)
                var.flag_meanings = " ".join(key for key, _, _ in space.constraints)
            if name == "feasible":
                var.flag_values = np.array([0, 1], np.int8)
                var.flag_meanings = "no yes"
        var.coordinates = coord_names


def column_attrs(var, space: Space, c: str) -> None:
    long_name, units = COORD_ATTRS[c]
    var.setncatts(cf_attrs(units, long_name))
    if c in CODE_COLUMNS:
        labels = space.labels(c)
        var.flag_values = np.arange(len(labels), dtype=np.int8)
        var.flag_meanings = " ".join(labels)


def dataset_attrs(study: Study, space: Space, chunk: int, fp: str, cal: Calibration) -> dict[str, Any]:
    entries = {
        "models": study.models,
        "gpus": study.gpus,
    }
    attrs: dict[str, Any] = {
        "title": f"HeterSim sweep: {study.name}",
        "Conventions": "CF-1.8",
        "source": "HeterSim analytical cost model (hetersim.simulate)",
        "history": history(),
        "study_name": study.name,
        "study_description": study.description,
        "study_toml": study.text,
        "objectives": " ".join(study.objectives),
        "objective_senses": " ".join(METRICS[o].sense for o in study.objectives),
        "constraints": json.dumps(study.constraints),
        "calibration": json.dumps({k: float(v) for k, v in vars(cal).items()}),
        "catalog_entries": json.dumps(entries, sort_keys=True),
        "fixed_plan": json.dumps(space.fixed, sort_keys=True),
        "sp_rule": "sp = on when tp > 1" if "auto" in study.axes["sp"] else "sp as given",
        "n_configs": space.size,
        "cross_product_size": study.cross_product_size,
        "chunk": chunk,
        "fingerprint": fp,
    }
    attrs.update({f"{k}_version": v for k, v in package_versions().items()})
    return attrs
