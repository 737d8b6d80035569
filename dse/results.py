"""Results files for people and their tools: categories by name, the labelled grid, export.

A sweep (``hetersim sweep``) or optimize (``hetersim optimize``) file stores its categorical
columns (model, GPU, recomputation, precision, ...) as small integer codes with CF
``flag_values``/``flag_meanings``, which every netCDF reader understands but which ``ds.sel``
cannot select by name. :func:`open_results` decodes them::

    import dse

    ds = dse.open_results("results/cluster_sizing/cluster_sizing.nc")
    ds.sel(gpu="h200-sxm-141gb", tp=8).time_to_train_s       # names and values, any columns
    grid = dse.open_results("results/cluster_sizing/cluster_sizing.nc", grid=True)
    grid.cost_usd.sel(gpu="h100-sxm-80gb").plot()            # one dimension per study axis

It lives in :mod:`dse` (the front door :mod:`hetersim` never imports ``dse``). :func:`to_frame`
is the table that ``hetersim export`` writes as CSV or Parquet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hetersim import planfields

RECORD_DIMS = ("config", "trial")
COLUMNS = ("model", "gpu", *planfields.COLUMNS)
NUMBER = {"config": "config_index", "trial": "trial_number"}  # the record dimension's own coordinate, renamed


def open_results(path: str | Path, *, grid: bool = False):
    """A sweep or optimize results file as an ``xarray.Dataset`` with names for codes.

    Categorical columns become string coordinates (``-1``, "no layout" in an optimize file,
    becomes ``""``); ``feasible`` and ``pareto`` become booleans; the record dimension
    (``config`` or ``trial``) gets a multi-index over the columns a configuration is chosen by,
    so ``ds.sel(gpu="h200-sxm-141gb", tp=8)`` works. Derived columns are coordinates but not
    index levels: ``dp`` (``n_gpus / (tp*pp*cp)``) and ``sp`` when the study left it ``auto``
    (on when ``tp > 1``). Bit-flag variables (``infeasible``, ``constraint_violation``) stay
    integers with their ``flag_masks``.

    ``grid=True`` (a sweep file only) returns the labelled grid: the dataset ``unstack``-ed into
    one dimension per column that varies, cells the space does not hold (layouts the GPU count
    does not divide, rows a streamed sweep did not keep) NaN. One-line ``ValueError`` for a file
    that is not a results dataset.
    """
    path = Path(path)
    ds, dim = open_file(path)
    try:
        ds = decode_names(ds, dim)
    except ValueError as error:
        ds.close()
        raise ValueError(f"{path}: not a HeterSim results dataset ({error})") from None
    levels = index_columns(ds, dim)
    if dim in ds.variables and levels:
        # a streamed sweep's flat index of each kept row, an optimize file's trial number: kept, as coordinates
        ds = ds.drop_indexes(dim).rename_vars({dim: NUMBER[dim]})
    ds = ds.set_index({dim: levels}) if levels else ds
    if not grid:
        return ds
    if dim != "config":
        raise ValueError(f"{path}: grid=True needs a sweep file; an optimize file samples its space (use ds.sel)")
    return unstack(ds, dim, levels, path)


def open_file(path: Path, missing: str = ""):
    """``(dataset, record dimension)`` of results file ``path``, opened lazily (the columns are read
    to decode and index them, the rest on use); one-line ``ValueError`` for a path that is no file
    (``missing`` says how to make it), a file netCDF cannot read, or a dataset with neither record
    dimension. The API's :func:`open_results` and the report's reader both start here."""
    import xarray as xr

    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a results file (a .nc written by sweep or optimize)")
    if not path.is_file():
        raise ValueError(f"{path}: no such results file{missing}")
    try:
        ds = xr.open_dataset(path)
    except Exception as error:  # netCDF4/h5netcdf/scipy raise different types for a non-netCDF file
        reason = " ".join(str(error).split())[:200]
        raise ValueError(f"{path}: not a netCDF results dataset ({type(error).__name__}: {reason})") from None
    dim = next((d for d in RECORD_DIMS if d in ds.dims), None)
    if dim is None:
        ds.close()
        raise ValueError(f"{path}: not a HeterSim results dataset (no 'config' or 'trial' dimension)")
    return ds, dim


def check_codes(ds, dim: str) -> None:
    """Every categorical column's codes are among its ``flag_values`` (or -1, none: an optimize
    trial without a layout), ``feasible`` and ``pareto`` 0 or 1; one-line ``ValueError`` naming the
    column otherwise."""
    for c in (*COLUMNS, *str(ds.attrs.get("outer_variables", "")).split()):
        var = ds.variables.get(c)
        if var is not None and ("flag_meanings" in var.attrs) != ("flag_values" in var.attrs):
            raise ValueError(f"{c} has one of flag_values and flag_meanings without the other (CF gives both)")
        if var is None or var.dims != (dim,) or "flag_meanings" not in var.attrs:
            continue
        n = len(str(var.attrs["flag_meanings"]).split())
        codes = np.asarray(var.values).astype(np.int64)
        bad = codes[(codes < (-1 if dim == "trial" else 0)) | (codes >= n)]
        if bad.size:
            raise ValueError(f"{c} holds code {int(bad[0])}, not one of its flag_values (0..{n - 1})")
    for name in ("feasible", "pareto"):  # read as booleans: NaN or 2 would read as true
        var = ds.variables.get(name)
        values = np.asarray(var.values, dtype=float) if var is not None else np.zeros(0)
        bad = values[~np.isin(values, (0.0, 1.0))]
        if bad.size:
            raise ValueError(f"{name} holds {bad[0]}; it is 0 or 1 for each record")


def decode_names(ds, dim: str):
    """Categorical columns as names, ``feasible``/``pareto`` as booleans, the columns as coordinates."""
    check_codes(ds, dim)
    outer = str(ds.attrs.get("outer_variables", "")).split()
    columns = [c for c in (*COLUMNS, *outer) if c in ds.variables and ds[c].dims == (dim,)]
    out = ds.set_coords(columns)
    for c in columns:
        var = out[c]
        meanings = var.attrs.get("flag_meanings")
        if meanings is None or "flag_values" not in var.attrs:
            continue
        labels = np.array([*str(meanings).split(), ""], dtype=object)  # the last one: code -1
        codes = np.asarray(var.values).astype(np.int64)
        attrs = {k: v for k, v in var.attrs.items() if k not in ("flag_values", "flag_meanings", "units")}
        out = out.assign_coords({c: (var.dims, labels[codes].astype(str), attrs)})
    for name in ("feasible", "pareto"):
        if name in out.variables:
            attrs = {k: v for k, v in out[name].attrs.items() if k not in ("flag_values", "flag_meanings", "units")}
            out[name] = (out[name].dims, np.asarray(out[name].values).astype(bool), attrs)
    return out


def derived_columns(ds) -> tuple[str, ...]:
    """Columns computed from others: ``dp`` always, ``sp`` when the study left it ``auto``."""
    auto_sp = str(ds.attrs.get("sp_rule", "")).startswith("sp = on when") or "sp_rule" not in ds.attrs
    return ("dp", "sp") if auto_sp else ("dp",)


def index_columns(ds, dim: str) -> list[str]:
    outer = str(ds.attrs.get("outer_variables", "")).split()
    derived = derived_columns(ds)
    names = dict.fromkeys(c for c in (*COLUMNS, *outer) if c not in derived)
    return [c for c in names if c in ds.coords and ds[c].dims == (dim,)]


def axes(ds, dim: str = "config") -> list[str]:
    """The index levels that vary: the study's axes as the file holds them."""
    index = ds.indexes.get(dim)
    if index is None or not hasattr(index, "levels"):
        return []
    return [name for name, level in zip(index.names, index.levels, strict=True) if len(level) > 1]


def unstack(ds, dim: str, levels: list[str], path: Path):
    import pandas as pd

    varying = axes(ds, dim)
    if not varying:
        return ds
    index = ds.indexes[dim]
    if not pd.MultiIndex.from_arrays([index.get_level_values(c) for c in varying]).is_unique:
        raise ValueError(f"{path}: the columns {', '.join(varying)} do not identify a configuration; use ds.sel")
    fixed = [c for c in levels if c not in varying]
    flat = ds.reset_index(dim)
    constant = {c: flat[c].values[0] for c in fixed}
    flat = flat.drop_vars([*fixed, *derived_columns(ds)], errors="ignore")
    out = flat.set_index({dim: varying}).unstack(dim)
    return out.assign_attrs(fixed_columns=str(constant))


TABLE_ATTRS = ("title", "study_name", "objectives", "history", "streamed")  # what a table keeps of its dataset


def to_frame(path: str | Path):
    """One row per configuration (or trial): names for codes, every variable along the record
    dimension as a column, the units and the study in ``DataFrame.attrs``."""
    ds = open_results(path)
    dim = next(d for d in RECORD_DIMS if d in ds.dims)
    keep = [v for v in ds.data_vars if ds[v].dims == (dim,)]
    drop = [c for c in ds.coords if dim not in ds[c].dims]
    frame = ds[keep].drop_vars(drop, errors="ignore").to_dataframe()
    # Older xarray (2022.10) also puts index levels among the columns; keep them once, as columns.
    frame = frame.drop(columns=[c for c in frame.index.names if c in frame.columns]).reset_index()
    first = [c for c in (NUMBER[dim], *frame.columns) if c in frame.columns and c in ds.coords]
    first = list(dict.fromkeys(first))
    frame = frame[[*first, *(c for c in frame.columns if c not in first)]]
    from dse.metrics import display_units

    frame.attrs = {
        "units": {c: display_units(ds[c].attrs) for c in frame.columns if c in ds.variables and "units" in ds[c].attrs},
        **{k: _plain(v) for k, v in ds.attrs.items() if k in TABLE_ATTRS},
    }
    return frame


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
