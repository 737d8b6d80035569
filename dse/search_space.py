"""Optimize studies: a sweep study plus a ``[search]`` table naming the *outer* variables.

``hetersim optimize`` is bilevel: Optuna chooses the outer variables (which GPU, how many, values
of continuous hardware parameters), and every layout of the study's plan axes (the *inner* space)
is evaluated for each choice at once (:mod:`dse.inner`). This module reads and validates the
file; the format is in ``studies/README.md`` ("Optimize studies"):

.. code-block:: toml

    [search]
    gpu = ["h100-sxm-80gb", "h200-sxm-141gb", "b200"]   # categorical (replaces hardware.gpu)
    n_gpus = {low = 64, high = 1024, step = 64}          # integer range or a list (replaces hardware.n_gpus)
    hbm_bw_GBps = {low = 3000, high = 9600}              # continuous override of the chosen GPU's field
    scaleout_bw_GBps = {low = 25, high = 100, step = 12.5}
    max_power_kW = 900                                   # optional: n_gpus * tdp_W / 1000 at most this

    [search.price]                                       # optional linear price model: USD per GPU-hour
    hbm_bw_GBps = 0.0005                                 #   added per unit above the GPU's catalog value

Mixed clusters (``hardware.cluster``) are searched with ``mix`` instead of ``gpu``/``n_gpus``:
``mix = {kinds = [..], total = 512, step = 64}`` (counts in steps summing to the total) or
``mix = {kinds = [..], budget_usd_per_hour = 3200, step = 64}`` (the summed hourly price within the
budget). Optuna suggests the counts of all kinds but the last (``n_<kind>``); the last is derived
(:class:`MixSearch`), and every feasible mix is a ``hardware.cluster`` entry of the study.

Without ``[search]`` the outer variables are ``hardware.gpu`` and ``hardware.n_gpus`` (and
``model.key`` when it lists several models). Every problem is a one-line ``ValueError`` naming
the file and key.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dse import hw_params
from dse.metrics import METRICS
from dse.study import Study, read_study_text, study_from_mapping
from hetersim import tomltext

SEARCH_KEYS = ("gpu", "n_gpus", "price", "max_power_kW", "mix")
RANGE_KEYS = ("low", "high", "step", "log")
MIX_KEYS = ("kinds", "total", "budget_usd_per_hour", "step")
MAX_GPU_COUNTS = 4096  # an n_gpus range expands to at most this many values
MAX_MIXES = 4096  # a search.mix expands to at most this many mixes

Kind = Literal["categorical", "int", "float"]


@dataclass(frozen=True)
class OuterParam:
    """One outer variable: ``choices`` (a list in the file) or a ``low..high`` range.

    ``param`` is the hardware parameter a numeric override sets (None for ``gpu``, ``n_gpus``
    and ``model``).
    """

    name: str
    kind: Kind
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    param: hw_params.Param | None = None

    @property
    def discrete(self) -> bool:
        return self.choices is not None or self.step is not None or self.kind == "int"

    def grid(self) -> tuple[Any, ...]:
        """Every value of a discrete variable, in order (``ValueError`` for a continuous one)."""
        if self.choices is not None:
            return self.choices
        if not self.discrete:
            raise ValueError(f"search.{self.name} is continuous; give it a step to enumerate it")
        assert self.low is not None and self.high is not None
        step = self.step or 1
        n = int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        values = [self.low + i * step for i in range(n)]
        return tuple(int(round(v)) for v in values) if self.kind == "int" else tuple(float(v) for v in values)

    def describe(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        out: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.step is not None:
            out["step"] = self.step
        if self.log:
            out["log"] = True
        if self.param is not None:
            out["path"] = self.param.path
        return out


@dataclass(frozen=True)
class MixSearch:
    """``search.mix``: how many GPUs of each kind, in multiples of ``step``.

    Either the counts sum to ``total`` or their summed hourly price stays within ``budget``.
    Optuna suggests the counts of every kind but the last (outer variables ``n_<kind>``); the
    last kind's count is derived: what is left of the total, or the most whole steps the rest of
    the budget buys. ``mixes`` are every feasible mix (counts per kind, in ``kinds`` order).
    """

    kinds: tuple[str, ...]
    step: int
    total: int | None
    budget: float | None
    prices: tuple[float, ...]  # USD per GPU-hour of each kind (catalog, hardware.set applied)
    mixes: tuple[tuple[int, ...], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"n_{k}" for k in self.kinds)

    def complete(self, first: Sequence[int]) -> tuple[int, ...] | None:
        """The full mix from the counts of all kinds but the last; None when none is feasible."""
        first = tuple(int(c) for c in first)
        if self.total is not None:
            last = self.total - sum(first)
        else:
            assert self.budget is not None
            left = self.budget - sum(c * p for c, p in zip(first, self.prices, strict=False))
            if left < -1e-9:
                return None
            last = int(math.floor(left / (self.prices[-1] * self.step) + 1e-9)) * self.step
        counts = (*first, last)
        if last < 0 or sum(counts) <= 0:
            return None
        return counts

    def label(self, counts: Sequence[int]) -> str:
        """The mix as ``hardware.cluster`` writes it (kinds with a zero count left out)."""
        return ",".join(f"{k}:{c}" for k, c in zip(self.kinds, counts, strict=True) if c > 0)

    def point(self, counts: Sequence[int]) -> dict[str, Any]:
        """The inner solver's outer point of a mix: ``n_<kind>`` counts, ``gpu`` (the mix's
        label on the study's gpu axis), ``n_gpus`` (the total) and ``mix`` (kind -> count)."""
        out: dict[str, Any] = dict(zip(self.names, (int(c) for c in counts), strict=True))
        out.update(gpu=self.label(counts), n_gpus=int(sum(counts)), mix=dict(zip(self.kinds, counts, strict=True)))
        return out

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kinds": list(self.kinds), "step": self.step, "n_mixes": len(self.mixes)}
        if self.total is not None:
            out["total"] = self.total
        else:
            out["budget_usd_per_hour"] = self.budget
        return out


@dataclass(frozen=True)
class SearchSpace:
    """A validated optimize study.

    ``study`` is the sweep study with ``hardware.gpu``/``hardware.n_gpus`` set to every outer
    candidate (so ``"auto"`` plan axes cover them all); ``text`` is the file as written.
    """

    study: Study
    text: str
    origin: str
    outer: tuple[OuterParam, ...]
    price: dict[str, float] = field(default_factory=dict)  # outer name -> USD/GPU-h per unit
    max_power_kW: float | None = None
    mix: MixSearch | None = None  # search.mix: outer = the counts of all kinds but the last

    @property
    def name(self) -> str:
        return self.study.name

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.study.objectives

    @property
    def directions(self) -> list[str]:
        return ["minimize" if METRICS[o].sense == "min" else "maximize" for o in self.objectives]

    @property
    def primary(self) -> str:
        """The objective that ranks the layouts of one hardware choice (the first one).

        For fixed hardware, time and cost to train, energy, tokens/s and MFU all rank layouts the
        same way (each is a monotone function of the step time), so one ranking serves them all.
        """
        return self.objectives[0]

    @property
    def discrete(self) -> bool:
        return all(p.discrete for p in self.outer)

    @property
    def outer_size(self) -> int | None:
        """Points of the outer grid, or None when a variable is continuous."""
        if self.mix is not None:
            return len(self.mix.mixes)
        return math.prod(len(p.grid()) for p in self.outer) if self.discrete else None

    def constraint_names(self) -> list[str]:
        """Names of the constraints every trial reports (> 0 violates), in this order."""
        names = ["layout", *self.study.constraints]
        if self.max_power_kW is not None:
            names.append("max_power_kW")
        return names

    def describe(self) -> dict[str, Any]:
        out = {p.name: p.describe() for p in self.outer}
        if self.mix is not None:
            out["mix"] = self.mix.describe()
        if self.price:
            out["price"] = dict(self.price)
        if self.max_power_kW is not None:
            out["max_power_kW"] = self.max_power_kW
        return out


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_search(path: str | Path) -> SearchSpace:
    """Read and validate an optimize study (a study file, with or without ``[search]``)."""
    path = Path(path)
    return parse_search(read_study_text(path), origin=str(path), base=path.parent)


def parse_search(text: str, origin: str = "<study>", base: Path | None = None) -> SearchSpace:
    try:
        doc = tomltext.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise _err(origin, None, f"invalid TOML: {error}") from None
    search = doc.pop("search", {})
    if not isinstance(search, dict):
        raise _err(origin, "search", f"must be a table ([search]); got {search!r}")
    hardware = doc.get("hardware")
    if not isinstance(hardware, dict):
        hardware = doc["hardware"] = {}  # parse_study reports what is missing

    mix, n_range, moved = _move_to_hardware(origin, search, doc, hardware, base)
    study = _parse_moved_study(doc, text, origin, base, moved)
    if study.clusters and mix is None:
        raise _err(origin, "hardware.cluster", "mixed clusters are searched with search.mix (kinds and counts)")
    outer = _cluster_outer(study, mix, n_range) + _hardware_outer(origin, search, mix)
    price = _price(origin, search.get("price", {}), {p.name for p in outer if p.param is not None})
    max_power = None
    if "max_power_kW" in search:
        max_power = _positive(origin, "search.max_power_kW", search["max_power_kW"])
    return SearchSpace(
        study=study, text=text, origin=origin, outer=tuple(outer), price=price, max_power_kW=max_power, mix=mix
    )


def _move_to_hardware(
    origin: str, search: Mapping[str, Any], doc: Mapping[str, Any], hardware: dict[str, Any], base: Path | None
) -> tuple[MixSearch | None, dict[str, Any] | None, dict[str, str]]:
    """Write ``search.mix``/``search.gpu``/``search.n_gpus`` into ``[hardware]`` as the study
    parser reads them; return the mix, the GPU-count range and which keys moved where."""
    moved: dict[str, str] = {}
    mix = None
    if "mix" in search:
        for key in ("gpu", "n_gpus"):
            if key in search:
                raise _err(origin, f"search.{key}", "give either search.mix or search.gpu/search.n_gpus, not both")
        mix = _mix(origin, search["mix"], doc, base)
        for key in ("gpu", "n_gpus", "cluster"):
            hardware.pop(key, None)
        hardware["cluster"] = [mix.label(c) for c in mix.mixes]
        moved["hardware.cluster"] = "search.mix"
    elif "gpu" in search:
        hardware["gpu"] = search["gpu"]
        moved["hardware.gpu"] = "search.gpu"
    n_range = None
    if "n_gpus" in search:
        n_range = _range(origin, "n_gpus", search["n_gpus"], integer=True)
        if n_range is not None:
            hardware["n_gpus"] = list(_param("n_gpus", "int", n_range).grid())
            if len(hardware["n_gpus"]) > MAX_GPU_COUNTS:
                raise _err(origin, "search.n_gpus", f"expands to more than {MAX_GPU_COUNTS} values; raise the step")
        else:
            hardware["n_gpus"] = search["n_gpus"]
        moved["hardware.n_gpus"] = "search.n_gpus"
    return mix, n_range, moved


def _parse_moved_study(
    doc: Mapping[str, Any], text: str, origin: str, base: Path | None, moved: Mapping[str, str]
) -> Study:
    """The study of ``doc``; errors name the ``[search]`` keys the user wrote, not where they moved."""
    return study_from_mapping(doc, text=text, origin=origin, base=base, key_names=moved)


def _cluster_outer(study: Study, mix: MixSearch | None, n_range: Mapping[str, Any] | None) -> list[OuterParam]:
    """The model (when several), then the GPU kind and count, or a mix's counts but the last."""
    outer: list[OuterParam] = []
    if len(study.axes["model"]) > 1:
        outer.append(OuterParam("model", "categorical", choices=study.axes["model"]))
    if mix is not None:
        for i, name in enumerate(mix.names[:-1]):
            high = max(c[i] for c in mix.mixes)
            outer.append(OuterParam(name, "int", low=0, high=high, step=mix.step))
    else:
        outer.append(OuterParam("gpu", "categorical", choices=study.axes["gpu"]))
        if n_range is not None:
            outer.append(_param("n_gpus", "int", n_range))
        else:
            outer.append(OuterParam("n_gpus", "int", choices=study.axes["n_gpus"]))
    return outer


def _hardware_outer(origin: str, search: Mapping[str, Any], mix: MixSearch | None) -> list[OuterParam]:
    """One outer variable per searched continuous hardware parameter (a range or a list)."""
    outer: list[OuterParam] = []
    seen_paths: dict[str, str] = {}
    for key, value in search.items():
        if key in SEARCH_KEYS:
            continue
        try:
            param = hw_params.resolve(key, what="search key")
        except ValueError:
            allowed = f"{', '.join(SEARCH_KEYS)} or a continuous hardware parameter ({', '.join(hw_params.ALIASES)})"
            raise _err(origin, f"search.{key}", f"unknown key; allowed: {allowed}") from None
        if mix is not None:
            raise _err(origin, f"search.{key}", "searched hardware parameters cannot be combined with search.mix")
        if param.path in seen_paths:
            raise _err(origin, f"search.{key}", f"sets the same parameter as search.{seen_paths[param.path]}")
        seen_paths[param.path] = key
        if isinstance(value, list):
            values = _numbers(origin, f"search.{key}", value)
            _within_catalog(origin, key, values, param)
            outer.append(OuterParam(key, "float", choices=values, param=param))
            continue
        rng = _range(origin, key, value, integer=False)
        if rng is None:
            raise _err(origin, f"search.{key}", f"must be {{low = .., high = ..}} or a list of numbers; got {value!r}")
        _within_catalog(origin, key, [rng["low"], rng["high"]], param)
        outer.append(_param(key, "float", rng, param))
    return outer


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------


def _mix(origin: str, table: Any, doc: Mapping[str, Any], base: Path | None) -> MixSearch:
    """``search.mix``, validated, with every feasible mix enumerated."""
    key = "search.mix"
    if not isinstance(table, dict):
        raise _err(origin, key, f"must be a table {{kinds = [..], total = .., step = ..}}; got {table!r}")
    for k in table:
        if k not in MIX_KEYS:
            raise _err(origin, f"{key}.{k}", f"unknown key; allowed: {', '.join(MIX_KEYS)}")
    kinds = table.get("kinds")
    from hetersim.cluster import MAX_GROUPS

    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds) or len(kinds) < 2:
        raise _err(origin, f"{key}.kinds", f"must be a list of at least two GPU catalog keys; got {kinds!r}")
    if len(set(kinds)) != len(kinds):
        raise _err(origin, f"{key}.kinds", "duplicate kinds")
    if len(kinds) > MAX_GROUPS:
        raise _err(origin, f"{key}.kinds", f"{len(kinds)} kinds; at most {MAX_GROUPS}")
    step = table.get("step")
    if step is None:
        raise _err(origin, f"{key}.step", "missing (the GPUs of each kind come in multiples of it)")
    if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
        raise _err(origin, f"{key}.step", f"must be a positive integer; got {step!r}")
    if ("total" in table) == ("budget_usd_per_hour" in table):
        raise _err(origin, key, "give exactly one of total (GPUs) or budget_usd_per_hour")
    total = budget = None
    if "total" in table:
        total = table["total"]
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            raise _err(origin, f"{key}.total", f"must be a positive integer; got {total!r}")
        if total % step:
            raise _err(origin, f"{key}.step", f"does not divide search.mix.total ({step} into {total})")
    else:
        budget = _positive(origin, f"{key}.budget_usd_per_hour", table["budget_usd_per_hour"])

    # The kinds' catalog entries (and hourly prices, hardware.set applied): parse the study once
    # with a one-GPU-each mix and a trivial plan (the real one is checked with the real mixes).
    probe = {k: (dict(v) if isinstance(v, dict) else v) for k, v in doc.items()}
    probe["plan"] = {"global_batch": 1, "seq_len": 1}
    probe.pop("constraints", None)
    hardware = probe.setdefault("hardware", {})
    if isinstance(hardware, dict):
        for k in ("gpu", "n_gpus", "cluster"):
            hardware.pop(k, None)
        hardware["cluster"] = ",".join(f"{k}:1" for k in kinds)
    names = {"hardware.gpu": f"{key}.kinds", "hardware.cluster": key}
    study = study_from_mapping(probe, text="", origin=origin, base=base, key_names=names)
    prices = tuple(float(study.gpus[k].get("price_usd_per_hour", 0.0)) for k in kinds)
    if budget is not None:
        for k, p in zip(kinds, prices, strict=True):
            if p <= 0:
                raise _err(origin, f"{key}.kinds", f"{k} has no hourly price (price_usd_per_hour); a budget needs one")

    partial = MixSearch(kinds=tuple(kinds), step=step, total=total, budget=budget, prices=prices, mixes=())
    if total is not None:
        highs = [total] * (len(kinds) - 1)
    else:
        assert budget is not None
        highs = [int(math.floor(budget / (p * step) + 1e-9)) * step for p in prices[:-1]]
    n_candidates = math.prod(h // step + 1 for h in highs)
    if n_candidates > 64 * MAX_MIXES:
        raise _err(origin, f"{key}.step", f"expands to {n_candidates:,} candidate mixes; raise the step")
    mixes = []
    for first in itertools.product(*(range(0, h + 1, step) for h in highs)):
        counts = partial.complete(first)
        if counts is not None:
            mixes.append(counts)
    if not mixes:
        cheapest = min(prices) * step
        raise _err(
            origin,
            f"{key}.budget_usd_per_hour",
            f"{budget} buys no mix (one step of {step} GPUs of the cheapest kind costs ${cheapest:,.2f}/h)",
        )
    if len(mixes) > MAX_MIXES:
        raise _err(origin, f"{key}.step", f"expands to {len(mixes):,} mixes (at most {MAX_MIXES}); raise the step")
    return dataclasses.replace(partial, mixes=tuple(mixes))


def _err(origin: str, key: str | None, message: str) -> ValueError:
    where = f"study file {origin}" if key is None else f"study file {origin}: {key}"
    return ValueError(f"{where}: {message}")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _positive(origin: str, key: str, value: Any) -> float:
    if not _is_number(value) or value <= 0:
        raise _err(origin, key, f"must be a positive number; got {value!r}")
    return float(value)


def _numbers(origin: str, key: str, values: list[Any]) -> tuple[float, ...]:
    if not values:
        raise _err(origin, key, "empty list; give at least one value")
    for v in values:
        if not _is_number(v) or v <= 0:
            raise _err(origin, key, f"must be positive numbers; got {v!r}")
    if len(set(values)) != len(values):
        raise _err(origin, key, "duplicate values")
    return tuple(float(v) for v in values)


def _within_catalog(origin: str, key: str, values: Sequence[float], param: hw_params.Param) -> None:
    """A searched hardware value stays within what the catalog (and ``--set``) takes for its field:
    any number at most ``MAX_NUMBER``, an efficiency (a share of a peak) at most 1."""
    from hetersim.catalog.schema import MAX_NUMBER

    if max(abs(v) for v in values) > MAX_NUMBER:
        raise _err(origin, f"search.{key}", f"values must be at most {MAX_NUMBER:.0e}, as in the catalog")
    if "eff" in param.field and max(values) > 1.0:  # 1.5 of the peak was priced as feasible
        raise _err(
            origin, f"search.{key}", f"is a share of the peak, at most 1, as in the catalog; got {max(values):g}"
        )


def _range(origin: str, name: str, value: Any, integer: bool) -> dict[str, Any] | None:
    """A ``{low, high, step, log}`` table, validated; None when ``value`` is not a table."""
    if not isinstance(value, dict):
        return None
    key = f"search.{name}"
    for k in value:
        if k not in RANGE_KEYS:
            raise _err(origin, f"{key}.{k}", f"unknown key; allowed: {', '.join(RANGE_KEYS)}")
    for k in ("low", "high"):
        if k not in value:
            raise _err(origin, f"{key}.{k}", "missing")
        v = value[k]
        if not _is_number(v) or (integer and not isinstance(v, int)) or v <= 0:
            kind = "a positive integer" if integer else "a positive number"
            raise _err(origin, f"{key}.{k}", f"must be {kind}; got {v!r}")
    low, high = value["low"], value["high"]
    if low > high:
        raise _err(origin, f"{key}", f"low ({low}) is above high ({high})")
    step = value.get("step")
    if step is not None:
        if not _is_number(step) or step <= 0 or (integer and not isinstance(step, int)):
            kind = "a positive integer" if integer else "a positive number"
            raise _err(origin, f"{key}.step", f"must be {kind}; got {step!r}")
        steps = (high - low) / step
        if abs(steps - round(steps)) > 1e-9:
            raise _err(origin, f"{key}.step", f"high - low ({high - low}) is not a multiple of the step ({step})")
    log = value.get("log", False)
    if not isinstance(log, bool):
        raise _err(origin, f"{key}.log", f"must be true or false; got {log!r}")
    if log and step is not None:
        raise _err(origin, f"{key}.log", "cannot be combined with step")
    return {"low": low, "high": high, "step": step, "log": log}


def _param(name: str, kind: Kind, rng: Mapping[str, Any], param: hw_params.Param | None = None) -> OuterParam:
    return OuterParam(name, kind, low=rng["low"], high=rng["high"], step=rng["step"], log=rng["log"], param=param)


def _price(origin: str, table: Any, overrides: set[str]) -> dict[str, float]:
    if not isinstance(table, dict):
        raise _err(origin, "search.price", f"must be a table ([search.price]); got {table!r}")
    out = {}
    for key, value in table.items():
        if key not in overrides:
            searched = ", ".join(sorted(overrides)) or "none"
            raise _err(origin, f"search.price.{key}", f"prices only searched hardware parameters ({searched})")
        if not _is_number(value) or not 0.0 <= float(value) < math.inf:
            message = f"must be a finite number >= 0 (USD per GPU-hour per unit above the catalog's); got {value!r}"
            raise _err(origin, f"search.price.{key}", message)
        out[key] = float(value)
    return out


__all__ = ["MixSearch", "OuterParam", "SearchSpace", "load_search", "parse_search"]
