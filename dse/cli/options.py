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

from hetersim.api import FROM_MODEL
from hetersim.catalog import model_from_dims, model_from_hf_config
from hetersim.planfields import FIELDS, REQUIRED, PlanField
from hetersim.types import FieldError

from .app import positive

# Field names (hetersim.planfields and hetersim.api's options) -> the CLI flag that sets them.
FIELD_FLAGS = {
    **{f.name: f.cli_flag for f in FIELDS},
    "offload state": "--offload state",
    "offload tier": "--offload tier",
    "cluster": "--cluster",
    "hetero": "--hetero",
    "layers_per_stage": "--layers-per-stage",
    "set": "--set",
    "cxl": "--cxl-*",
    "gpu": "--gpu",
    "catalog": "--catalog",
}
TIER_FLAGS = {name: "--" + name.replace("_", "-") for name in ("cxl_expander", "cxl_pool", "cxl_p2p", "offload")}
_TIER_FIELD = re.compile(r"(?<![\w-])(" + "|".join(TIER_FLAGS) + r")(?![\w-])")


def with_flag(error: ValueError) -> ValueError:
    """Rename the fields of a message to the CLI flags that set them: every field of a
    :class:`hetersim.types.FieldError`, else a field at the start of the message and the tier
    fields (``cxl_pool``, ...) wherever they stand."""
    if isinstance(error, FieldError):
        return ValueError(error.named(FIELD_FLAGS))
    text = _TIER_FIELD.sub(lambda m: TIER_FLAGS[m[1]], str(error))
    for name in sorted(FIELD_FLAGS, key=len, reverse=True):
        if text.startswith(name + " ") or text.startswith(name + ":"):
            return ValueError(FIELD_FLAGS[name] + text[len(name) :])
    return ValueError(text)


def pairs(flag: str, items: list[str], sep: str, example: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key.strip() or not value.strip():
            raise ValueError(f"{flag} expects {example}; got {item!r}")
        out[key.strip()] = value.strip()
    return out


def check_model(catalog, model: str | None, given: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(label, model entry) from ``--model KEY|config.json`` or from dimensions, with flag errors."""
    if model is not None:
        if given:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise ValueError(f"--model cannot be combined with model dimensions ({flags})")
        if model.endswith(".json") or Path(model).is_file():
            return model, model_from_hf_config(model)
        return model, catalog.model(model)
    if not given:
        raise ValueError("give --model KEY|config.json, or the model's dimensions (--layers, --hidden, --heads, ...)")
    missing = [f"--{k}" for k in ("layers", "hidden", "heads") if k not in given]
    if missing:
        raise ValueError(f"a model given by dimensions needs {', '.join(missing)}")
    for key, value in given.items():
        if key != "mlp":
            positive(f"--{key.replace('_', '-')}", value)
    if given.get("mlp", "gated") not in ("gated", "plain"):
        raise ValueError(f"--mlp must be one of gated, plain; got {given['mlp']!r}")
    entry = model_from_dims(**given)
    return entry["name"], entry


# --------------------------------------------------------------------------------------------
# Option groups: name -> (annotation, typer.Option)
# --------------------------------------------------------------------------------------------


def _plan_option(f: PlanField) -> tuple[Any, Any]:
    """The typer option of one plan field (flag, default, choices and help from the registry)."""
    text = f.help or f"{f.long_name[0].upper()}{f.long_name[1:]}."
    if f.kind == "choice":
        return str, typer.Option(f.default, f.cli_flag, help=f"{text} {'|'.join(f.names)}.")
    if f.kind == "offload":
        return list[str], typer.Option([], f.cli_flag, help=f"{text}.")
    if f.kind == "bool":
        flags = f"{f.cli_flag}/{f.off_flag}" if f.off_flag else f.cli_flag
        return bool | None, typer.Option(None, flags, help=text)
    kind = int if f.kind == "int" else float
    if f.default is REQUIRED and f.name not in FROM_MODEL:
        return kind, typer.Option(..., f.cli_flag, help=text)
    default = f.default if isinstance(f.default, int | float) and f.default is not REQUIRED else None
    return (kind if default is not None else kind | None), typer.Option(default, f.cli_flag, help=text)


PLAN_OPTIONS = {("gpus" if f.name == "n_gpus" else f.name): _plan_option(f) for f in FIELDS}

MODEL_OPTIONS = {
    "model": (str | None, typer.Option(None, "--model", help="Catalog model key or a Hugging Face config.json.")),
    "layers": (int | None, typer.Option(None, "--layers", help="Model by dimensions: layers.")),
    "hidden": (int | None, typer.Option(None, "--hidden", help="Model by dimensions: hidden size.")),
    "heads": (int | None, typer.Option(None, "--heads", help="Model by dimensions: attention heads.")),
    "kv_heads": (int | None, typer.Option(None, "--kv-heads", help="Model by dimensions: KV heads (default: heads).")),
    "ffn_hidden": (int | None, typer.Option(None, "--ffn-hidden", help="Model by dimensions: FFN width.")),
    "vocab": (int | None, typer.Option(None, "--vocab", help="Model by dimensions: vocabulary (default: 32000).")),
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
        list[int],
        typer.Option(
            [], "--layers-per-stage", help="Fix the layers per stage of each --cluster group (default: balanced)."
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
    "overrides": (list[str], typer.Option([], "--set", help="FIELD=VALUE override of the GPU entry, repeatable.")),
}

CONFIGURATION_OPTIONS = {**MODEL_OPTIONS, **HARDWARE_OPTIONS, **PLAN_OPTIONS}


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
