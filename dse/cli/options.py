"""Options shared by commands, declared once: the plan options are generated from the registry
of plan fields (:mod:`hetersim.planfields`), and error messages that name a field show the flag.

A command that takes them declares ``**options`` and is wrapped by :func:`with_options`, which
gives it a signature typer reads (the same mechanism for ``evaluate`` and ``sensitivity``).
"""

import inspect
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer

from dse import atomic
from hetersim.api import FROM_MODEL
from hetersim.catalog import model_entry, model_from_dims
from hetersim.planfields import FIELDS, REQUIRED, PlanField
from hetersim.recipe import MEGATRON_MODEL_FLAGS
from hetersim.types import FieldError, decimal_digits

from .app import context, positive

# Field names (hetersim.planfields and hetersim.api's options) -> the CLI flag that sets them.
FIELD_FLAGS = {
    **{f.name: f.cli_flag for f in FIELDS},
    "offload state": "--offload state",
    "offload tier": "--offload tier",
    "cluster": "--cluster",
    "hetero": "--hetero",
    "layers_per_stage": "--layers-per-stage",
    "plan_file": "--plan",
    "set": "--set",
    "cxl": "--cxl-*",
    "cxl_p2p": "--cxl-p2p",
    "cxl_expander": "--cxl-expander",
    "cxl_pool": "--cxl-pool",
    "gpu": "--gpu",
    "catalog": "--catalog",
    "system": "--system",
}
TIER_FLAGS = {name: "--" + name.replace("_", "-") for name in ("cxl_expander", "cxl_pool", "cxl_p2p", "offload")}
_TIER_FIELD = re.compile(r"(?<![\w.-])(" + "|".join(TIER_FLAGS) + r")(?![\w-])")


def cluster_error(cluster: str, error: ValueError) -> ValueError:
    """An error of ``--cluster``'s parser or its kinds (``hplan.parse_cluster_groups``, a catalog
    lookup) named by the flag and its value."""
    return ValueError(f"--cluster {cluster}: {str(error).removeprefix('cluster: ')}")


def recipe_field(field: str, recipe: tuple[Any, tuple[str, ...]]) -> str:
    """How an error names a field whose value came from ``--recipe FILE`` (``recipe``: the file and
    the fields it set, :func:`apply_recipe`)."""
    return f"{field} (from --recipe {recipe[0]})"


def with_flag(error: ValueError, recipe: tuple[Any, tuple[str, ...]] | None = None) -> ValueError:
    """Rename the fields of a message to the CLI flags that set them: every field of a
    :class:`hetersim.types.FieldError`, else a field at the start of the message and the tier
    fields (``cxl_pool``, ...) wherever they stand. A field whose value came from ``--recipe FILE``
    (``recipe``: the file and those fields, :func:`apply_recipe`) is named as the file's, not by a
    flag the command line did not give."""
    flags = dict(FIELD_FLAGS)
    if recipe is not None:
        flags.update({field: recipe_field(field, recipe) for field in recipe[1]})
    if isinstance(error, FieldError):
        return ValueError(error.named(flags))
    text = _TIER_FIELD.sub(lambda m: TIER_FLAGS[m[1]], str(error))
    for name in sorted(flags, key=len, reverse=True):
        if text.startswith(name + " ") or text.startswith(name + ":"):
            return ValueError(flags[name] + text[len(name) :])
    return ValueError(text)


def pairs(flag: str, items: list[str], sep: str, example: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key.strip() or not value.strip():
            raise ValueError(f"{flag} expects {example}; got {item!r}")
        key, value = key.strip(), value.strip()
        if out.get(key, value) != value:  # a repeated key is the user's own contradiction, never the last one silently
            raise ValueError(f"{flag} {key}={out[key]} and {flag} {key}={value} contradict each other; give one")
        out[key] = value
    return out


def check_model(
    catalog,
    model: str | None,
    given: dict[str, Any],
    extra: dict[str, Any] | None = None,
    recipe: tuple[Any, tuple[str, ...]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """(label, model entry) from ``--model KEY|config.json`` or from dimensions, with flag errors;
    ``extra``: a recipe's optional model fields (experts, MLA ranks), checked by the catalog schema;
    ``recipe``: the file and the fields it set (:func:`apply_recipe`), named as the file's."""
    if model is not None and not model.strip():
        raise ValueError("--model is empty; give a catalog key, a config.json path or a Hugging Face model id")
    if model is not None:
        atomic.check_plain(model, "--model", "a config.json")  # a name that may be a path
        if given:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise ValueError(f"--model cannot be combined with model dimensions ({flags})")
        return model, model_entry(catalog, model)
    if not given:
        raise ValueError("give --model KEY|config.json, or the model's dimensions (--layers, --hidden, --heads, ...)")
    missing = [f"--{k}" for k in ("layers", "hidden", "heads") if k not in given]
    if missing:
        raise ValueError(f"a model given by dimensions needs {', '.join(missing)}")
    for key, value in given.items():
        if key not in ("mlp", "tied_embeddings"):
            positive(f"--{key.replace('_', '-')}", value)
    if given.get("mlp", "gated") not in ("gated", "plain"):
        raise ValueError(f"--mlp must be one of gated, plain; got {given['mlp']!r}")
    try:
        entry = model_from_dims(**given, **(extra or {}))
    except ValueError as error:  # "model_from_dims: models.<key>.<field> ...": the field by its flag
        match = _DIMS_ERROR.match(str(error))
        if match is None:
            raise
        field = match[1]
        if recipe is not None and field in recipe[1]:
            name = recipe_field(field, recipe)
        else:
            name = f"--{field.replace('_', '-')}" if field in given else f"--recipe's model field {field}"
        raise ValueError(name + str(error)[match.end() :]) from None
    return entry["name"], entry


_DIMS_ERROR = re.compile(r"^model_from_dims: models\.[^ ]+?\.(\w+)(?= )")


def given(name: str) -> bool:
    """Whether the running command's parameter ``name`` was given on the command line (not its
    default)."""
    ctx = context()
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def given_flags(names) -> list[str]:
    """The flags (as written in help) of the running command's parameters in ``names`` that were
    given on the command line."""
    ctx = context()
    params = ctx.command.params if ctx is not None else []
    return [p.opts[0] for p in params if p.name in names and given(p.name)]


def apply_recipe(options: dict[str, Any]) -> dict[str, Any]:
    """Fill ``options`` from ``--recipe FILE`` (:func:`hetersim.recipe.read_recipe`): each value the
    file gives, unless the same option was given on the command line (the command line wins). The
    file's model dimensions are used unless ``--model`` is given; a model by dimensions needs a
    vocabulary, from the file or ``--vocab``."""
    path = options.pop("recipe", None)
    if path is None:
        return options
    from hetersim.recipe import read_recipe

    recipe = read_recipe(path)
    plan = {("gpus" if k == "n_gpus" else k): v for k, v in recipe["plan"].items()}
    if given("zero") and plan.get("zero") == 3 and options.get("zero") != 3:
        for name in ("reuse_Mparams", "zero3_prefetch"):  # the file's ZeRO-3 settings go with the stage --zero replaces
            plan.pop(name, None)
    if isinstance(plan.get("offload"), dict):  # --offload's STATE:TIER form
        plan["offload"] = [f"{state}:{tier}" for state, tier in plan["offload"].items()]
    model = recipe["model"] if not given("model") else {}
    if model and "vocab" not in model and not given("vocab"):
        raise ValueError(f"--recipe {path}: the file names no vocabulary size; give --vocab N")
    # The catalog's optional model fields (experts, MLA ranks, ...) have no flags: they ride along.
    extra = {k: v for k, v in model.items() if k not in MODEL_OPTIONS and k != "tied_embeddings"}
    options["model_extra"] = extra
    taken = []
    for name, value in {**plan, **model}.items():
        if name not in extra and not given(name):
            options[name] = value
            taken.append("n_gpus" if name == "gpus" else name)
    options["recipe_fields"] = (path, tuple(taken))
    if "accumulation" in recipe:
        _deepspeed_batch(options, recipe["plan"], recipe["accumulation"], path)
    return options


def _deepspeed_batch(options: dict[str, Any], file: Mapping[str, Any], steps: int | None, path: Any) -> None:
    """A DeepSpeed config's batch once the layout is known: of ``train_batch_size``,
    ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` (a flag given stands for
    the file's), the ones left out follow as DeepSpeed sets them, accumulation 1 when two are
    missing, and ``train_batch_size = micro x steps x data-parallel ranks`` must hold
    (deepspeedai/DeepSpeed @ edaa72212 ``deepspeed/runtime/config.py``,
    ``_set_batch_related_parameters`` and ``_batch_assertion``)."""
    gpus, split = options.get("gpus"), [int(options.get(k) or 1) for k in ("tp", "pp", "cp")]
    if not gpus or options.get("cluster"):
        return  # the ranks are the layout's: a mix's plan sets them per kind
    ranks = int(options.get("dp") or gpus // (split[0] * split[1] * split[2]) or 1)
    gb = options.get("global_batch") if given("global_batch") or "global_batch" in file else None
    mb = options.get("micro_batch") if given("micro_batch") or "micro_batch" in file else None
    name = {"gb": "--global-batch" if given("global_batch") else "train_batch_size",
            "mb": "--micro-batch" if given("micro_batch") else "train_micro_batch_size_per_gpu"}  # fmt: skip
    if gb is None and mb is not None:
        options["global_batch"] = int(mb) * (steps or 1) * ranks
    elif gb is not None and mb is None:
        per = ranks * (steps or 1)
        if int(gb) % per:
            raise ValueError(
                f"--recipe {path}: {name['gb']} {gb} is not a whole micro-batch per rank: {per} = "
                f"{ranks} data-parallel ranks x {steps or 1} accumulation steps (DeepSpeed sets the micro-batch so)"
            )
        options["micro_batch"] = int(gb) // per
    elif gb is not None and steps is not None and int(gb) != int(mb) * steps * ranks:
        raise ValueError(
            f"--recipe {path}: {name['gb']} {gb} is not {name['mb']} x gradient_accumulation_steps x data-parallel "
            f"ranks = {mb} x {steps} x {ranks} = {int(mb) * steps * ranks} (DeepSpeed asserts it)"
        )


# --------------------------------------------------------------------------------------------
# Option groups: name -> (annotation, typer.Option)
# --------------------------------------------------------------------------------------------


def layer_counts(values: list[str]) -> list[int]:
    """``--layers-per-stage`` values: integers, each flag one or a comma-separated list (``12,20``)."""
    out = []
    for part in (p.strip() for v in values for p in str(v).split(",")):
        try:
            if not decimal_digits(part):  # int() reads '٨' and '0_8' as 8
                raise ValueError(part)
            out.append(int(part))
        except ValueError:
            raise typer.BadParameter(
                f"{part!r} is not a whole number of layers; give 12,20 or the flag once per stage"
            ) from None
    return out


def _plan_option(f: PlanField) -> tuple[Any, Any]:
    """The typer option of one plan field (flag, aliases, default, choices and help from the registry)."""
    text = f.help or f"{f.long_name[0].upper()}{f.long_name[1:]}."
    decls = (f.cli_flag, *f.aliases)
    if f.kind == "choice":
        return str, typer.Option(f.default, *decls, help=f"{text} {'|'.join(f.names)}.")
    if f.kind == "offload":
        return list[str], typer.Option([], *decls, help=f"{text}.")
    if f.kind == "bool":
        flags = f"{f.cli_flag}/{f.off_flag}" if f.off_flag else f.cli_flag
        return bool | None, typer.Option(None, flags, *f.aliases, help=text)
    kind = int if f.kind == "int" else float
    if f.default is REQUIRED and f.name not in FROM_MODEL:
        # Not required by typer: a --recipe may give it; `configuration` says when neither does.
        return kind | None, typer.Option(None, *decls, help=f"{text} Required unless --recipe gives it.")
    default = f.default if isinstance(f.default, int | float) and f.default is not REQUIRED else None
    return (kind if default is not None else kind | None), typer.Option(default, *decls, help=text)


def switch_param(flag: str) -> str:
    """The parameter name typer gives a value-less switch (``--use-distributed-optimizer``)."""
    return flag.lstrip("-").replace("-", "_")


# (parameter, flag, field, value) of every value-less switch in the registry.
SWITCHES = tuple((switch_param(flag), flag, f, value) for f in FIELDS for flag, value in f.switches)


def fold_switches(options: dict[str, Any]) -> dict[str, Any]:
    """Set each field whose switch was given (``--use-distributed-optimizer`` -> ``zero=1``); a
    switch and its field's own flag at another non-default value is an error."""
    for param, flag, f, value in SWITCHES:
        if not options.pop(param, False):
            continue
        given = options.get(f.name)
        if given not in (None, f.default, value):
            raise ValueError(f"{flag} sets {f.cli_flag} {value}; it cannot be combined with {f.cli_flag} {given}")
        options[f.name] = value
    return options


def _switch_option(flag: str, f: PlanField, value: Any) -> tuple[Any, Any]:
    return bool, typer.Option(False, flag, help=f"Megatron's name for {f.cli_flag} {value}.")


PLAN_OPTIONS = {
    **{("gpus" if f.name == "n_gpus" else f.name): _plan_option(f) for f in FIELDS},
    **{param: _switch_option(flag, f, value) for param, flag, f, value in SWITCHES},
}


def _model_option(name: str, text: str) -> tuple[Any, Any]:
    """A model-dimension option under its own flag and Megatron's (:data:`MEGATRON_MODEL_FLAGS`)."""
    alias = (MEGATRON_MODEL_FLAGS[name],) if name in MEGATRON_MODEL_FLAGS else ()
    return int | None, typer.Option(None, "--" + name.replace("_", "-"), *alias, help=text)


MODEL_OPTIONS = {
    "model": (
        str | None,
        typer.Option(
            None,
            "--model",
            help="Catalog model key, a Hugging Face config.json (or its folder), or a Calculon model .json.",
        ),
    ),
    "layers": _model_option("layers", "Model by dimensions: layers."),
    "hidden": _model_option("hidden", "Model by dimensions: hidden size."),
    "heads": _model_option("heads", "Model by dimensions: attention heads."),
    "kv_heads": _model_option("kv_heads", "Model by dimensions: KV heads (default: heads)."),
    "ffn_hidden": _model_option("ffn_hidden", "Model by dimensions: FFN width."),
    "vocab": _model_option("vocab", "Model by dimensions: vocabulary (default: 32000)."),
    "head_dim": _model_option("head_dim", "Model by dimensions: width of one attention head (default: hidden/heads)."),
    "mlp": (str | None, typer.Option(None, "--mlp", help="Model by dimensions: gated|plain (default: gated).")),
}

HARDWARE_OPTIONS = {
    "gpu": (str | None, typer.Option(None, "--gpu", help="Catalog GPU key (see `hetersim catalog gpus`).")),
    "cluster": (
        str | None,
        typer.Option(
            None, "--cluster", help="A mix of device kinds KIND:N,KIND:N (instead of --gpu; --gpus is their total)."
        ),
    ),
    "hetero": (str, typer.Option("pipeline", "--hetero", help="How a mix splits the job: pipeline|data.")),
    "layers_per_stage": (
        list[str],
        typer.Option(
            [],
            "--layers-per-stage",
            help="Fix the layers of each pipeline stage (one per stage or per --cluster group; default: balanced): "
            "12,20 or the flag once per stage.",
            callback=layer_counts,
        ),
    ),
    "plan_file": (
        Path | None,
        typer.Option(
            None,
            "--plan",
            help="A heterogeneous plan file (TOML/JSON): stages, their layers, and per replica the device kind "
            "and TP (instead of --gpu/--tp/--pp/--dp; format: README, Heterogeneous plans).",
        ),
    ),
    "cxl_expander": (
        str | None,
        typer.Option(None, "--cxl-expander", help="CXL Type-3 expanders per node, DEVICE:COUNT (e.g. micron-cz120:2)."),
    ),
    "cxl_pool": (
        str | None,
        typer.Option(
            None,
            "--cxl-pool",
            help="CXL memory pool behind a switch, DEVICE:NHOSTS[:LEVELS] (e.g. cmm-b:4hosts); see catalog memory.",
        ),
    ),
    "cxl_p2p": (
        bool,
        typer.Option(
            False, "--cxl-p2p", help="What-if CXL 3.x: GPUs reach CXL memory peer-to-peer through the fabric."
        ),
    ),
    "catalog_files": (list[Path], typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable.")),
    "system": (
        Path | None,
        typer.Option(
            None,
            "--system",
            help="A Calculon system file (systems/*.json): its compute, memory and networks replace the --gpu "
            "device's; the rest (power, price, SMs, host link) stays that device's.",
        ),
    ),
    "overrides": (list[str], typer.Option([], "--set", help="FIELD=VALUE override of the GPU entry, repeatable.")),
}

RECIPE_OPTIONS = {
    "recipe": (
        Path | None,
        typer.Option(
            None,
            "--recipe",
            help="A NeMo recipe .yaml or a Megatron-LM argument list: its model and layout (flags given win).",
        ),
    ),
}

CONFIGURATION_OPTIONS = {**RECIPE_OPTIONS, **MODEL_OPTIONS, **HARDWARE_OPTIONS, **PLAN_OPTIONS}


def with_options(options: Mapping[str, tuple[Any, Any]], **own: tuple[Any, Any]) -> Callable[[Callable], Callable]:
    """Give a ``**options`` command the signature typer reads: ``options`` then its ``own``."""

    def wrap(fn: Callable) -> Callable:
        params = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
            for name, (ann, opt) in {**options, **own}.items()
        ]
        fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return fn

    return wrap
