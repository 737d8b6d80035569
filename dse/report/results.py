"""Reading a results dataset for the report: checks, decoding of codes, display units, the Pareto set."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse.metrics import METRICS, display_units
from dse.pareto import pareto_front
from dse.results import check_codes, open_file
from hetersim import planfields

REQUIRED = ("feasible", "time_to_train_s", "cost_usd", "energy_kWh")
COLUMNS = ("model", "gpu", *planfields.COLUMNS)


def open_results(path: str | Path):
    """Open a results dataset, checking it is one; one-line ``ValueError`` otherwise."""
    path = Path(path)
    study = Path("studies") / f"{path.stem}.toml"
    hint = f"hetersim sweep {study} --out {path.parent}/" if study.is_file() else "hetersim sweep STUDY"
    ds, dim = open_file(path, f"; make it first with `{hint}`")
    if dim == "trial":
        ds = ds.rename({"trial": "config"})  # `hetersim optimize` results: one record per trial
    missing = [v for v in (*REQUIRED, *_objectives(ds)[0]) if v not in ds.variables]
    if missing:
        ds.close()
        raise ValueError(f"{path}: results dataset lacks variable(s) {', '.join(dict.fromkeys(missing))}")
    try:
        check_codes(ds, "config")
        _check_attrs(ds)
    except ValueError as error:
        ds.close()
        raise ValueError(f"{path}: not a HeterSim results dataset ({error})") from None
    return ds


def _check_attrs(ds) -> None:
    """The attributes a report reads, checked before any of it is drawn: a streamed sweep's counts
    and the objectives' senses."""
    if streamed(ds):
        for key in ("n_configs", "n_feasible"):
            value = ds.attrs.get(key)
            if not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"streamed, but its {key} attribute is {value!r}, not a count")
        if ds.attrs["n_feasible"] > ds.attrs["n_configs"]:
            raise ValueError("streamed, but its n_feasible attribute counts more configurations than n_configs")
        for name in (v for v in ds.data_vars if any(str(d).startswith("marginal_") for d in ds[v].dims)):
            if bool(np.any(np.asarray(ds[name].values, dtype=float) < 0)):
                raise ValueError(f"its per-axis summary {name} holds negative values")
    _check_json_attrs(ds)
    names, given = str(ds.attrs.get("objectives", "time_to_train_s cost_usd")).split(), ds.attrs.get("objective_senses")
    senses = str(given or "").split()
    if not names:
        raise ValueError("its objectives attribute names no metric")
    odd = [n for n in names if n not in METRICS or n == "infeasible"]
    if odd or len(set(names)) < len(names):
        got = repr(odd[0]) if odd else "a metric twice"
        raise ValueError(f"its objectives attribute must name distinct metrics (as a study's objectives); got {got}")
    bad = [x for x in senses if x not in ("min", "max")]
    if bad or (given is not None and len(senses) != len(names)):
        got = bad[0] if bad else f"{len(senses)} senses for {len(names)} objectives"
        raise ValueError(f"objective_senses must be 'min' or 'max' for each objective; got {got!r}")
    drawn = dict.fromkeys([*REQUIRED, *names, *(v for v in ds.data_vars if v in METRICS)])
    feasible = np.asarray(ds["feasible"].values, dtype=float) == 1.0 if "feasible" in ds.variables else None
    for name in drawn:  # what the fronts and tables read: one number per configuration
        var = ds[name]
        if var.dims != ("config",) or not np.issubdtype(var.dtype, np.number) and var.dtype != bool:
            raise ValueError(f"{name} must be numbers along config; it is {var.dtype} over {var.dims}")
        if name == "feasible":
            continue
        values = np.asarray(var.values, dtype=float)
        if bool(np.any(values < 0)):
            raise ValueError(f"{name} holds negative values; every metric it reports is >= 0")
        if feasible is None:
            continue
        if not np.isfinite(values[feasible]).all():  # a front of NaN: 'All-NaN slice'
            raise ValueError(f"{name} is not a finite number for a feasible configuration; a sweep writes one for each")
        if name in SHARES and bool(np.any(values[feasible] > 1.0)):
            raise ValueError(
                f"{name} is a share, at most 1, but a feasible configuration has {values[feasible].max():g}"
            )
        if name == "infeasible" and bool(np.any(values[feasible] != 0)):
            raise ValueError("a feasible configuration has infeasible flags set; a sweep sets them only on the others")
    _check_layout(ds, feasible)


SHARES = ("mfu", "hfu", "goodput")  # metrics that are shares of a whole


def _check_layout(ds, feasible) -> None:
    """The layout columns a report labels configurations with: whole numbers >= 1 with
    ``n_gpus = tp * pp * cp * dp`` (on the feasible rows: an infeasible point may carry any layout
    the study asked for); the hardware values an optimize search set, finite and > 0."""
    if feasible is None:
        return
    cols = {}
    for name in ("n_gpus", "tp", "pp", "cp", "dp", "vp", "micro_batch", "global_batch"):
        if name not in ds.variables or ds[name].dims != ("config",):
            continue
        cols[name] = values = np.asarray(ds[name].values, dtype=float)[feasible]
        if values.size and not (np.all(values >= 1) and np.all(values == np.round(values))):
            raise ValueError(f"{name} must be a whole number >= 1 on every feasible configuration")
    if all(k in cols for k in ("n_gpus", "tp", "pp", "cp", "dp")):
        if np.any(cols["tp"] * cols["pp"] * cols["cp"] * cols["dp"] != cols["n_gpus"]):
            raise ValueError("a feasible configuration's n_gpus is not tp * pp * cp * dp")
    outer = str(ds.attrs.get("outer_variables", "")).split()
    missing = [name for name in outer if name not in ds.variables]
    if missing:
        raise ValueError(f"its outer_variables attribute names {missing[0]!r}, which it does not hold")
    for name in (*outer, *SEARCH_TOTALS):
        if name in ds.variables and name not in COLUMNS and ds[name].dims == ("config",):
            values = np.asarray(ds[name].values, dtype=float)[feasible]
            if not (np.isfinite(values).all() and np.all(values > 0)):
                raise ValueError(f"{name}, a hardware value of the search, must be finite and > 0")


SEARCH_TOTALS = ("price_usd_per_hour", "power_kW")  # what an optimize search records of each point's cluster


def _check_json_attrs(ds) -> None:
    """The attributes a report decodes as JSON: a sweep's ``fixed_plan`` (an object) and a streamed
    sweep's ``infeasible_reasons`` (reason -> count), and the ``infeasible`` flags' masks."""
    for key in ("fixed_plan", "infeasible_reasons"):
        if key not in ds.attrs:
            continue
        try:
            value = json.loads(str(ds.attrs[key]) or "{}")
        except json.JSONDecodeError:
            value = None
        counts = key != "infeasible_reasons" or (
            isinstance(value, dict)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values())
        )
        if not isinstance(value, dict) or not counts:
            what = "an object" if key == "fixed_plan" else "an object of counts"
            raise ValueError(f"its {key} attribute is not {what} in JSON")
        tokens = value.get("train_tokens", 1.0) if key == "fixed_plan" else 1.0
        if isinstance(tokens, bool) or not isinstance(tokens, int | float) or not 0 < tokens < float("inf"):
            raise ValueError(f"its fixed_plan attribute's train_tokens must be a number > 0; got {tokens!r}")
    if "infeasible" in ds.variables:
        attrs = ds["infeasible"].attrs
        masks = np.asarray(attrs.get("flag_masks", []))
        names = str(attrs.get("flag_meanings", "")).split()
        if masks.size != len(names) or (masks.size and not np.issubdtype(masks.dtype, np.integer)):
            raise ValueError("its infeasible variable's flag_masks are not one integer per flag_meanings name")


def _objectives(ds) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = tuple(str(ds.attrs.get("objectives", "time_to_train_s cost_usd")).split())
    senses = tuple(str(ds.attrs.get("objective_senses", "")).split())
    if len(senses) != len(names):
        senses = tuple(METRICS[n].sense if n in METRICS else "min" for n in names)
    return names, senses


def flag_labels(ds, name: str) -> list[str] | None:
    """Names of a categorical variable's codes (CF ``flag_meanings``), or None."""
    meanings = ds[name].attrs.get("flag_meanings") if name in ds.variables else None
    return str(meanings).split() if meanings is not None else None


def decode(ds, name: str, value: Any) -> Any:
    labels = flag_labels(ds, name)
    if labels is not None and name != "infeasible":
        return labels[int(value)] if 0 <= int(value) < len(labels) else int(value)
    v = np.asarray(value).item()
    return int(v) if isinstance(v, (int, np.integer)) else v


def label_of(ds, name: str, factor_units: tuple[float, str] | None = None) -> str:
    """Axis label from a variable's ``long_name`` and ``units`` (converted units when given)."""
    attrs = ds[name].attrs
    long_name = attrs.get("long_name", name)
    units = factor_units[1] if factor_units is not None else display_units(attrs)
    return f"{long_name} [{units}]" if units and units != "1" else str(long_name)


@dataclass
class Results:
    """What every section needs, read once: the open dataset, feasibility, groups, varying axes."""

    path: Path
    ds: Any
    feasible: np.ndarray
    objectives: tuple[str, ...]
    senses: tuple[str, ...]
    group: np.ndarray  # model code per configuration (0 when the dataset has one model)
    group_names: list[str]
    varying: list[str]  # columns with more than one value among feasible configurations
    notes: list[str] = field(default_factory=list)
    searched: list[str] = field(default_factory=list)  # hardware parameters an optimize search set

    def values(self, name: str, idx: np.ndarray | None = None) -> np.ndarray:
        var = self.ds[name]
        return np.asarray(var.values if idx is None else var.isel(config=idx).values)

    def layout(self, i: int, with_model: bool = False) -> str:
        """A short label of configuration ``i``: the study axes that vary, tp/pp/dp always."""
        parts = []
        cols = [c for c in COLUMNS if c in self.ds.variables and (c in self.varying or c in ("tp", "pp", "dp"))]
        row = {c: decode(self.ds, c, self.ds[c].values[i]) for c in cols}
        if "n_gpus" in row or "gpu" in row:
            n = row.pop("n_gpus", None)
            g = row.pop("gpu", None)
            parts.append("×".join(str(x) for x in (n, g) if x is not None))
        model = row.pop("model", None)
        if with_model and model is not None:
            parts.insert(0, str(model))
        if row:
            parts.append(planfields.layout_label({c: v == "on" if _is_bool(c) else v for c, v in row.items()}))
        parts += [f"{name}={float(self.ds[name].values[i]):g}" for name in self.searched]
        return " ".join(parts)


def load(path: str | Path) -> Results:
    ds = open_results(path)
    if not ds["feasible"].size and not streamed(ds):  # a streamed sweep with nothing feasible keeps no row
        raise ValueError(f"{path}: holds no configurations to report")
    feasible = np.asarray(ds["feasible"].values).astype(bool)
    objectives, senses = _objectives(ds)
    if "model" in ds.variables and len(np.unique(ds["model"].values)) > 1:
        group = np.asarray(ds["model"].values).astype(np.int64)
        names = flag_labels(ds, "model") or [str(k) for k in range(group.max() + 1)]
    else:
        group = np.zeros(ds.sizes["config"], dtype=np.int64)
        names = [str(decode(ds, "model", ds["model"].values[0]))] if "model" in ds.variables and group.size else [""]
    varying = [
        c for c in COLUMNS if c in ds.variables and feasible.any() and len(np.unique(ds[c].values[feasible])) > 1
    ]
    outer = str(ds.attrs.get("outer_variables", "")).split()
    searched = [v for v in outer if v in ds.variables and v not in COLUMNS]
    r = Results(Path(path), ds, feasible, objectives, senses, group, names, varying, searched=searched)
    if streamed(ds):
        r.notes.append(
            f"streamed sweep: the file keeps {ds.sizes['config']:,} of the {int(ds.attrs['n_configs']):,} "
            f"configurations evaluated (the top {ds.attrs.get('top_k', '?')} per objective and the Pareto set of "
            "each model); the Pareto set is complete, but the heat maps and axes that vary cover the kept rows "
            "only (per-axis summaries over every configuration: the marginal_* variables)"
        )
    return r


def streamed(ds) -> bool:
    """Whether a dataset is the output of a streamed sweep (only the kept rows along ``config``)."""
    return bool(int(ds.attrs.get("streamed", 0)))


def pareto_set(r: Results) -> np.ndarray:
    """Indices of the Pareto set: per model, the feasible configurations no other beats in every
    study objective; ordered by model, then along the front (best first objective first)."""
    out = []
    values = np.stack([r.values(o).astype(np.float64) for o in r.objectives], axis=1)
    for g in np.unique(r.group[r.feasible]):
        idx = np.flatnonzero(r.feasible & (r.group == g))
        out.append(idx[pareto_front(values[idx], r.senses)])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def shown(idx: np.ndarray, limit: int) -> np.ndarray:
    """At most ``limit`` of ``idx``, spread evenly (both ends kept)."""
    if len(idx) <= limit:
        return idx
    return idx[np.unique(np.round(np.linspace(0, len(idx) - 1, limit)).astype(int))]


def _is_bool(column: str) -> bool:
    field = planfields.BY_NAME.get(column)
    return field is not None and field.kind == "bool"
