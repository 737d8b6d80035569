"""Study files: the question a sweep answers, as TOML (format: ``studies/README.md``).

A study names the model(s), the hardware and the plan axes; a list is an axis, a scalar a fixed
value, ``"auto"`` every sensible value (rules in :data:`AUTO_RULES`). :func:`load_study` reads
and validates one, and resolves catalog entries and ``"auto"`` axes, so that everything after
it works on plain values. Every problem is a one-line ``ValueError`` naming the file and key.
Nothing here imports JAX.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse.metrics import METRICS
from dse.study_checks import StudyError, _check_inert, _check_possible, _check_unused_axes, _constraints, _err
from hetersim import hplan, planfields, tomltext
from hetersim.catalog import Catalog, apply_overrides, load_catalog, model_from_json
from hetersim.types import ATTENTION, HETERO_MODES, MAX_GROUPS, OFFLOAD_STATE, ORDER, RECOMPUTE, TIER, ZERO_STAGES

DEFAULT_STUDY = Path(__file__).resolve().parent / "studies" / "default.toml"

DEFAULT_OBJECTIVES = ("time_to_train_s", "cost_usd")

# Plan axes, in the order of the sweep's ``config`` dimension after model, gpu and n_gpus, their
# defaults and the study-wide scalars: all from the registry of plan fields.
PLAN_AXES = planfields.AXES
CATEGORICAL = planfields.CHOICES
PLAN_DEFAULTS: dict[str, Any] = {k: planfields.DEFAULTS[k] for k in PLAN_AXES if k in planfields.DEFAULTS}
PLAN_SCALARS = planfields.SCALARS


def fixed_plan(scalars: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`hetersim.build.plan_spec` keywords every configuration of a study shares: the
    registry's defaults of :data:`PLAN_SCALARS` with the study's values (derived ones left out)."""
    given = {**{k: planfields.DEFAULTS.get(k) for k in PLAN_SCALARS}, **scalars}
    return {k: v for k, v in given.items() if v is not None and not isinstance(v, str)}


AUTO_RULES = {
    "tp": "divisors of n_gpus up to the GPU's scale-up domain that divide the heads and KV heads",
    "pp": "divisors of n_gpus up to 64 and up to the number of layers",
    "cp": "powers of two up to 16 dividing n_gpus and seq_len/2",
    "vp": "divisors of the number of layers up to 8",
    "micro_batch": "1, 2, 4, 8 (up to the global batch)",
    "zero": "0, 1, 2, 3",
    "recompute": ", ".join(RECOMPUTE),
    "precision": "bf16, fp8 (fp16 runs at the bf16 rate; fp32 is not a training precision here)",
    "attention": ", ".join(ATTENTION),
    "order": ", ".join(ORDER),
    "sp": "on when tp > 1 (Megatron's practice); not an axis",
}
AUTO_PRECISIONS = ("bf16", "fp8")

TOP_KEYS = ("name", "description", "catalog", "model", "hardware", "plan", "constraints", "objectives")
MODEL_KEYS = ("key",)
HARDWARE_KEYS = ("gpu", "n_gpus", "set", "cluster", "hetero")
PLAN_KEYS = (*PLAN_AXES, *PLAN_SCALARS)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")  # 200 at most: file names end at 255 bytes


@dataclass(frozen=True)
class Study:
    """A validated study with every axis resolved to a tuple of plain values.

    ``axes`` holds ``model``, ``gpu``, ``n_gpus`` and every name of :data:`PLAN_AXES`, in that
    order; categorical values are names, ``sp`` is ``"auto"`` (on when tp > 1) or booleans.
    """

    name: str
    text: str
    origin: str
    axes: dict[str, tuple[Any, ...]]
    models: dict[str, dict[str, Any]]  # key -> catalog entry
    gpus: dict[str, dict[str, Any]]  # key -> catalog entry with hardware.set applied
    links: dict[str, dict[str, Any]]
    scalars: dict[str, Any] = field(default_factory=dict)  # the plan scalars given (PLAN_SCALARS)
    # The study catalog's memory devices and fleets (None: the packaged ones), for the host specs.
    memory: dict[str, dict[str, Any]] | None = None
    fleets: dict[str, dict[str, Any]] | None = None
    constraints: dict[str, float] = field(default_factory=dict)
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    description: str = ""
    # Mixed clusters: label -> ((gpu key, count), ...); the ``gpu`` axis then holds these labels.
    clusters: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    hetero: str = "pipeline"  # how a mix splits the job: pipeline stages or data-parallel replicas

    @property
    def cross_product_size(self) -> int:
        """Configurations before the host's divisibility filter."""
        n = 1
        for values in self.axes.values():
            n *= len(values)
        return n


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def read_study_text(path: Path) -> str:
    """A study file's text, or a one-line ``ValueError`` naming the file."""
    try:
        return path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is no statement
    except FileNotFoundError:
        raise ValueError(f"study file {path}: not found") from None
    except IsADirectoryError:
        raise ValueError(f"study file {path}: is a folder; give a study TOML file") from None
    except OSError as error:
        raise ValueError(f"study file {path}: cannot read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"study file {path}: not a text (UTF-8) TOML file") from None


def load_study(path: str | Path | None = None, catalog: Catalog | None = None) -> Study:
    """Read and validate a study file (default: the packaged :data:`DEFAULT_STUDY`)."""
    path = Path(path) if path is not None else DEFAULT_STUDY
    return parse_study(read_study_text(path), origin=str(path), base=path.parent, catalog=catalog)


def parse_study(text: str, origin: str = "<study>", base: Path | None = None, catalog: Catalog | None = None) -> Study:
    """Validate study TOML ``text``; ``origin`` names it in errors, ``base`` resolves ``catalog`` paths."""
    try:
        doc = tomltext.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise _err(origin, None, f"invalid TOML: {error}") from None
    return study_from_mapping(doc, text=text, origin=origin, base=base, catalog=catalog)


def study_from_mapping(
    doc: Mapping[str, Any],
    *,
    text: str,
    origin: str = "<study>",
    base: Path | None = None,
    catalog: Catalog | None = None,
    key_names: Mapping[str, str] | None = None,
) -> Study:
    """Validate a study given as a mapping (a parsed TOML document). ``text`` is what the user
    wrote (it fingerprints results); ``key_names`` renames keys in errors (a search study's
    ``search.gpu`` is read here as ``hardware.gpu``)."""
    try:
        return _study(doc, text, origin, base, catalog)
    except StudyError as error:
        raise StudyError(origin, (key_names or {}).get(error.key, error.key), error.message) from None


def _study(doc: Mapping[str, Any], text: str, origin: str, base: Path | None, catalog: Catalog | None) -> Study:
    _known(origin, None, doc, TOP_KEYS)
    name, description = _name(origin, doc)
    if catalog is None or "catalog" in doc:
        catalog = _catalog(origin, doc.get("catalog", []), base)
    model_t = _table(origin, "model", doc.get("model"), required=True)
    hw = _table(origin, "hardware", doc.get("hardware"), required=True)
    plan_t = _table(origin, "plan", doc.get("plan"), required=True)
    _known(origin, "model", model_t, MODEL_KEYS)
    _known(origin, "hardware", hw, HARDWARE_KEYS)
    _known(origin, "plan", plan_t, PLAN_KEYS)

    model_keys = _strings(origin, "model.key", _required(origin, "model.key", model_t.get("key")))
    models = {k: _lookup(origin, "model.key", lambda key: _model(catalog, key, base), k) for k in model_keys}
    _once(origin, "model.key", list(model_keys), catalog, "models")
    clusters, hetero = _clusters(origin, hw)
    gpus, n_gpus = _hardware(origin, hw, catalog, clusters)
    gpu_axis = tuple(clusters) if clusters else tuple(gpus)
    axes = _plan_axes(origin, plan_t, {"model": model_keys, "gpu": gpu_axis, "n_gpus": n_gpus}, models, gpus)
    return Study(
        name=name,
        text=text,
        origin=origin,
        axes=axes,
        models=models,
        gpus=gpus,
        links=dict(catalog.links),
        memory=dict(catalog.memory),
        fleets=dict(catalog.fleets),
        constraints=_constraints(origin, _table(origin, "constraints", doc.get("constraints"), required=False)),
        objectives=_objectives(origin, doc.get("objectives", list(DEFAULT_OBJECTIVES))),
        description=description,
        clusters=clusters,
        hetero=hetero,
        scalars=_check_inert(origin, axes, _plan_scalars(origin, plan_t), models),
    )


def _name(origin: str, doc: Mapping[str, Any]) -> tuple[str, str]:
    name = doc.get("name")
    if name is None:
        raise _err(origin, "name", "missing; give the study a name (letters, digits, '.', '_', '-')")
    if not isinstance(name, str) or not NAME_RE.match(name):
        rule = "must be at most 200 letters, digits, '.', '_' or '-' (it names the results file)"
        raise _err(origin, "name", f"{rule}; got {name!r}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise _err(origin, "description", f"must be a string; got {description!r}")
    return name, description


def _hardware(origin: str, hw: Mapping[str, Any], catalog: Catalog, clusters) -> tuple[dict, tuple[int, ...]]:
    """The GPU entries (``hardware.set`` applied) and the GPU counts."""
    if clusters and "gpu" in hw:
        raise _err(origin, "hardware.gpu", "give either hardware.gpu or hardware.cluster, not both")
    if clusters:
        gpu_keys = tuple(dict.fromkeys(k for groups in clusters.values() for k, _ in groups))
    else:
        gpu_keys = _strings(origin, "hardware.gpu", _required(origin, "hardware.gpu", hw.get("gpu")))
    overrides = _table(origin, "hardware.set", hw.get("set"), required=False)
    for key, value in overrides.items():
        if isinstance(value, dict | list):
            raise _err(origin, f"hardware.set.{key}", f"must be a single value; got {value!r}")
    gpus = {}
    if not clusters:  # one device under two spellings would give the same points twice
        _once(origin, "hardware.gpu", list(gpu_keys), catalog, "gpus")
        gpu_keys = tuple(_lookup(origin, "hardware.gpu", lambda k: catalog.key("gpus", k), k) for k in gpu_keys)
    for key in gpu_keys:  # the catalog's key labels the results, whichever spelling named it
        entry = _lookup(origin, "hardware.gpu", catalog.gpu, key)
        if overrides:
            where = f"{origin}: hardware.set"
            entry = apply_overrides("gpus", key, entry, overrides, origin=where, catalog=catalog, text=False)
        gpus[key] = entry
    totals = tuple(sorted({sum(c for _, c in groups) for groups in clusters.values()}))
    if clusters and "n_gpus" not in hw:
        return gpus, totals
    n_gpus = _required(origin, "hardware.n_gpus", hw.get("n_gpus"))
    counts = _ints(origin, "hardware.n_gpus", n_gpus, lo=1, hi=int(planfields.BY_NAME["n_gpus"].hi))
    if clusters and not set(counts) & set(totals):  # every point would be flagged "gpu count"
        message = f"{list(counts)} matches no cluster's GPUs ({list(totals)}); leave it out"
        raise _err(origin, "hardware.n_gpus", message)
    return gpus, counts


def _plan_axes(origin: str, plan_t: Mapping[str, Any], axes: dict, models: Mapping, gpus: Mapping) -> dict:
    """Every plan axis resolved to a tuple of plain values, ``"auto"`` expanded."""
    raw = {k: plan_t.get(k, PLAN_DEFAULTS.get(k)) for k in PLAN_AXES}
    for key in ("global_batch", "seq_len"):
        _required(origin, f"plan.{key}", raw[key])
        if raw[key] == "auto":
            raise _err(origin, f"plan.{key}", '"auto" is not allowed here; give a value or a list of values')
    # Axes that "auto" derives from others are parsed first.
    for key in ("global_batch", "seq_len"):
        axes[key] = _ints(origin, f"plan.{key}", raw[key], lo=1, hi=int(planfields.BY_NAME[key].hi))
    ctx = _AutoContext(
        axes["n_gpus"], list(models.values()), list(gpus.values()), axes["global_batch"], axes["seq_len"]
    )
    for key in PLAN_AXES:
        if key not in axes:
            axes[key] = _plan_axis(origin, key, raw[key], ctx)
    axes = {k: axes[k] for k in ("model", "gpu", "n_gpus", *PLAN_AXES)}
    _check_possible(origin, axes, models)
    _check_unused_axes(origin, axes, models)
    return axes


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------


def _clusters(origin: str, hw: Mapping[str, Any]) -> tuple[dict[str, tuple[tuple[str, int], ...]], str]:
    """``hardware.cluster``: a mix ``"kind:count,kind:count"`` or a list of them (an axis)."""
    hetero = hw.get("hetero", "pipeline")
    if hetero not in HETERO_MODES:
        raise _err(origin, "hardware.hetero", f"must be one of {', '.join(HETERO_MODES)}; got {hetero!r}")
    if "cluster" not in hw:
        if "hetero" in hw:
            raise _err(origin, "hardware.hetero", "needs hardware.cluster")
        return {}, hetero
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    for mix in _strings(origin, "hardware.cluster", hw["cluster"]):
        try:  # the parser of --cluster and plan files
            groups = hplan.parse_cluster_groups(mix)
        except ValueError as e:
            raise _err(origin, "hardware.cluster", str(e).removeprefix("cluster: ")) from None
        if len(groups) > MAX_GROUPS:
            raise _err(origin, "hardware.cluster", f"{mix!r} has {len(groups)} groups; at most {MAX_GROUPS}")
        out[",".join(f"{k}:{c}" for k, c in groups)] = tuple(groups)
    return out, hetero


def _known(origin: str, section: str | None, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in table:
        if key not in allowed:
            full = key if section is None else f"{section}.{key}"
            raise _err(origin, full, f"unknown key; allowed: {', '.join(allowed)}")


def _table(origin: str, key: str, value: Any, required: bool) -> dict[str, Any]:
    if value is None:
        if required:
            raise _err(origin, key, f"missing; add a [{key}] table")
        return {}
    if not isinstance(value, dict):
        raise _err(origin, key, f"must be a table ([{key}]); got {value!r}")
    return value


def _required(origin: str, key: str, value: Any) -> Any:
    if value is None:
        raise _err(origin, key, "missing")
    return value


def _catalog(origin: str, files: Any, base: Path | None) -> Catalog:
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise _err(origin, "catalog", f"must be a file name or a list of them; got {files!r}")
    paths = [Path(f) if Path(f).is_absolute() or base is None else base / f for f in files]
    try:
        return load_catalog(paths)
    except ValueError as error:
        raise _err(origin, "catalog", str(error)) from None


def _model(catalog: Catalog, key: str, base: Path | None) -> dict[str, Any]:
    """A catalog model, or a JSON model file (a Hugging Face config.json or its folder, a Calculon
    model file) relative to the study file."""
    path = Path(key) if Path(key).is_absolute() or base is None else base / key
    if key.endswith(".json") or path.is_dir():
        return model_from_json(path)
    return catalog.model(key)


def _lookup(origin: str, key: str, get, name: str) -> dict[str, Any]:
    try:
        return get(name)
    except ValueError as error:
        raise _err(origin, key, str(error)) from None


def _as_list(origin: str, key: str, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise _err(origin, key, "empty list; give at least one value")
    seen = []
    for v in values:
        if v in seen and not isinstance(v, bool):
            raise _err(origin, key, f"duplicate value {v!r}")
        seen.append(v)
    return values


def _once(origin: str, key: str, names: list[str], catalog: Catalog, section: str) -> None:
    """No two of ``names`` name one catalog entry (:meth:`Catalog.same_entry`)."""
    pair = catalog.same_entry(section, names)
    if pair is not None:
        raise _err(origin, key, f"{pair[0]!r} and {pair[1]!r} name the same entry; give it once")


def _strings(origin: str, key: str, value: Any) -> tuple[str, ...]:
    values = _as_list(origin, key, value)
    for v in values:
        if not isinstance(v, str):
            raise _err(origin, key, f"must be a string or a list of strings; got {v!r}")
    return tuple(values)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(origin: str, key: str, value: Any, lo: int, hi: int | None = None) -> tuple[int, ...]:
    values = _as_list(origin, key, value)
    for v in values:
        if not _is_int(v):
            raise _err(origin, key, f"must be an integer or a list of integers; got {v!r}")
        if v < lo or (hi is not None and v > hi):
            bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
            raise _err(origin, key, f"must be {bound}; got {v}")
    return tuple(values)


@dataclass(frozen=True)
class _AutoContext:
    n_gpus: tuple[int, ...]
    models: list[dict[str, Any]]
    gpus: list[dict[str, Any]]
    global_batch: tuple[int, ...]
    seq_len: tuple[int, ...]


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def auto_values(key: str, ctx: _AutoContext) -> tuple[Any, ...]:
    """Every sensible value of plan axis ``key`` (:data:`AUTO_RULES`): the union over the
    study's GPU counts, GPUs and models, so one axis serves every combination (a value that
    does not suit one of them is flagged infeasible or dropped for it)."""
    out: set[Any] = set()
    if key == "tp":
        for n in ctx.n_gpus:
            for g in ctx.gpus:
                for d in _divisors(n, int(g.get("scaleup_domain", 8))):
                    heads = [(int(m["heads"]), int(m.get("kv_heads", m["heads"]))) for m in ctx.models]
                    out.update(d for h, kv in heads if h % d == 0 and kv % d == 0)
    elif key == "pp":
        for n in ctx.n_gpus:
            out.update(d for m in ctx.models for d in _divisors(n, min(64, int(m["layers"]))))
    elif key == "cp":
        pow2 = [1, 2, 4, 8, 16]
        fits_n = [c for c in pow2 if any(n % c == 0 for n in ctx.n_gpus)]
        out.update(c for c in fits_n if any(s % (2 * c) == 0 for s in ctx.seq_len))
        out.add(1)
    elif key == "vp":
        out.update(d for m in ctx.models for d in _divisors(int(m["layers"]), 8))
    elif key == "micro_batch":
        out.update(b for b in (1, 2, 4, 8) if b <= max(ctx.global_batch))
    elif key == "zero":
        out.update(ZERO_STAGES)
    elif key == "precision":
        return AUTO_PRECISIONS
    elif key in CATEGORICAL:
        return CATEGORICAL[key]
    elif key == "sp":
        return ("auto",)
    elif key not in AUTO_RULES:
        raise ValueError(f'plan.{key} has no "auto" rule; give a value or a list of values')
    return tuple(sorted(out))


def _plan_axis(origin: str, key: str, value: Any, ctx: _AutoContext) -> tuple[Any, ...]:
    full = f"plan.{key}"
    # "auto" is an option of its own for the kernels (the stack's kernel), not the study's rule.
    is_option = key in CATEGORICAL and "auto" in CATEGORICAL[key]
    if value == "auto" and not is_option:
        if key not in AUTO_RULES:
            raise _err(origin, full, '"auto" has no rule for this field; give a value or a list of values')
        return auto_values(key, ctx)
    if isinstance(value, list) and "auto" in value and not is_option:
        raise _err(origin, full, f'"auto" stands alone (write plan.{key} = "auto"), not inside a list')
    if key in CATEGORICAL:
        options = CATEGORICAL[key]
        values = _strings(origin, full, value)
        for v in values:
            if v not in options:  # "auto" offered only where it is an option or the study has a rule for it
                auto = ' or "auto"' if key in AUTO_RULES and not is_option else ""
                raise _err(origin, full, f"must be one of {', '.join(options)}{auto}; got {v!r}")
        return values
    f = planfields.BY_NAME[key]
    if f.kind == "bool":
        values = _as_list(origin, full, value)
        if not all(isinstance(v, bool) for v in values) or len(set(values)) != len(values):
            rule = f'true, false, [false, true] or "auto" ({f.auto_rule})'
            raise _err(origin, full, f"must be {rule}; got {value!r}")
        return tuple(values)
    return _ints(origin, full, value, lo=int(f.lo), hi=None if math.isinf(f.hi) else int(f.hi))


def _plan_scalars(origin: str, plan_t: Mapping[str, Any]) -> dict[str, Any]:
    """The study-wide plan fields (:data:`PLAN_SCALARS`), checked by their registry kind."""
    out: dict[str, Any] = {}
    for key in PLAN_SCALARS:
        if key not in plan_t:
            continue
        f, value, full = planfields.BY_NAME[key], plan_t[key], f"plan.{key}"
        if f.kind in ("float", "int"):
            # A TOML number in the registry's own range (its lower bound too: moe_imbalance >= 1).
            number = isinstance(value, int | float) and not isinstance(value, bool)
            try:
                out[key] = planfields.leaf_value(f, value if number else None)
            except ValueError:
                raise _err(origin, full, f"must be {planfields.rule(key)}; got {value!r}") from None
        elif f.kind == "bool":
            if not isinstance(value, bool):
                raise _err(origin, full, f"must be true or false; got {value!r}")
            out[key] = value
        elif f.kind == "offload":
            out[key] = _offload(origin, _table(origin, full, value, required=False))
    return out


def _offload(origin: str, table: Mapping[str, Any]) -> dict[str, str]:
    for state, tier in table.items():
        if state not in OFFLOAD_STATE:
            raise _err(origin, f"plan.offload.{state}", f"unknown state; allowed: {', '.join(OFFLOAD_STATE)}")
        if tier not in TIER[1:]:
            raise _err(origin, f"plan.offload.{state}", f"must be one of {', '.join(TIER[1:])}; got {tier!r}")
    return dict(table)


def _objectives(origin: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _err(origin, "objectives", f"must be a list of metric names; got {value!r}")
    names = _strings(origin, "objectives", value)
    for n in names:
        if n not in METRICS or n == "infeasible":
            allowed = ", ".join(m for m in METRICS if m != "infeasible")
            raise _err(origin, "objectives", f"unknown metric {n!r}; allowed: {allowed}")
    return names
