"""The ``hetersim`` command line: evaluate one configuration, validate, list the catalog, calibrate.

Thin by design: options become catalog entries and specs (:mod:`hetersim.build`), the cost model
runs, and :mod:`dse.format` shows the answer. Bad input is one line ``error: ...`` on stderr and
exit code 2; an infeasible configuration is an answer (exit code 0). JAX and the cost model are
imported inside the commands so that ``--help`` stays fast.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer

from dse import format as fmt
from hetersim.catalog import SECTIONS, apply_overrides, load_catalog, model_from_dims, model_from_hf_config
from hetersim.types import ATTENTION, OFFLOAD_STATE, ORDER, PRECISION, RECOMPUTE, TIER

app = typer.Typer(
    name="hetersim",
    help="Analytical cost model of LLM training on heterogeneous clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

USER_ERRORS = (ValueError, FileNotFoundError, tomllib.TOMLDecodeError)

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: object, code: int = 2) -> NoReturn:
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


def user_errors(fn: F) -> F:
    """Turn a user-input error raised by a command into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as error:
            _fail(error)

    return wrapper  # type: ignore[return-value]


def _calibration():
    """The stored calibration constants (``hetersim/catalog/calibration.toml``)."""
    from hetersim.calibration import as_spec, load_calibration

    return as_spec(load_calibration())


@functools.cache
def _simulate():
    """``simulate`` compiled once per process (one configuration, unbatched)."""
    import jax

    from hetersim.simulate import simulate

    return jax.jit(simulate)


# --------------------------------------------------------------------------------------------
# Option parsing
# --------------------------------------------------------------------------------------------

# plan_spec / model names of a value -> the CLI flag that sets it (for error messages).
PLAN_FLAGS = {
    "n_gpus": "--gpus",
    "micro_batch": "--micro-batch",
    "global_batch": "--global-batch",
    "seq_len": "--seq-len",
    "train_tokens": "--train-tokens",
    "offload state": "--offload state",
    "offload tier": "--offload tier",
    **{k: f"--{k}" for k in ("tp", "pp", "vp", "cp", "dp", "zero", "recompute", "precision", "attention", "order")},
}


def _with_flag(error: ValueError) -> ValueError:
    """Rename a plan_spec parameter at the start of its message to the CLI flag that sets it."""
    text = str(error)
    for name in sorted(PLAN_FLAGS, key=len, reverse=True):
        if text.startswith(name + " "):
            return ValueError(PLAN_FLAGS[name] + text[len(name) :])
    return error


def _positive(flag: str, value: int | float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{flag} must be a positive {'integer' if isinstance(value, int) else 'number'}; got {value}")


def _pairs(flag: str, items: list[str], sep: str, example: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key.strip() or not value.strip():
            raise ValueError(f"{flag} expects {example}; got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _model(catalog, model: str | None, dims: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(label, model entry) from ``--model KEY|config.json`` or from dimensions."""
    given = {k: v for k, v in dims.items() if v is not None}
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
            _positive(f"--{key.replace('_', '-')}", value)
    if given.get("mlp", "gated") not in ("gated", "plain"):
        raise ValueError(f"--mlp must be one of gated, plain; got {given['mlp']!r}")
    entry = model_from_dims(**given)
    return entry["name"], entry


def _choices(options: tuple[str, ...]) -> str:
    return "|".join(options)


# --------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------


@app.command()
@user_errors
def evaluate(
    model: str | None = typer.Option(None, "--model", help="Catalog model key or a Hugging Face config.json."),
    gpu: str = typer.Option(..., "--gpu", help="Catalog GPU key (see `hetersim catalog gpus`)."),
    gpus: int = typer.Option(..., "--gpus", help="Number of GPUs."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size."),
    vp: int = typer.Option(1, "--vp", help="Virtual pipeline chunks per stage (interleaved 1F1B when > 1)."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel size."),
    dp: int | None = typer.Option(None, "--dp", help="Data-parallel size (default: gpus/(tp*pp*cp))."),
    sp: bool | None = typer.Option(None, "--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1)."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 (3 = FSDP)."),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Micro-batch size (sequences)."),
    global_batch: int = typer.Option(..., "--global-batch", help="Global batch size (sequences)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Sequence length (default: the model's)."),
    recompute: str = typer.Option("none", "--recompute", help=_choices(RECOMPUTE)),
    precision: str = typer.Option("bf16", "--precision", help=_choices(PRECISION)),
    attention: str = typer.Option("flash", "--attention", help=_choices(ATTENTION)),
    order: str = typer.Option(ORDER[0], "--order", help=f"Rank placement, innermost first: {_choices(ORDER)}."),
    offload: list[str] = typer.Option(
        [], "--offload", help=f"STATE:TIER, repeatable; states {_choices(OFFLOAD_STATE)}, tiers {_choices(TIER[1:])}."
    ),
    train_tokens: float = typer.Option(2.0e12, "--train-tokens", help="Token budget for time/cost/energy."),
    catalog_files: list[Path] = typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable."),
    overrides: list[str] = typer.Option([], "--set", help="FIELD=VALUE override of the GPU entry, repeatable."),
    layers: int | None = typer.Option(None, "--layers", help="Model by dimensions: layers."),
    hidden: int | None = typer.Option(None, "--hidden", help="Model by dimensions: hidden size."),
    heads: int | None = typer.Option(None, "--heads", help="Model by dimensions: attention heads."),
    kv_heads: int | None = typer.Option(None, "--kv-heads", help="Model by dimensions: KV heads (default: heads)."),
    ffn_hidden: int | None = typer.Option(None, "--ffn-hidden", help="Model by dimensions: FFN width."),
    vocab: int | None = typer.Option(None, "--vocab", help="Model by dimensions: vocabulary (default: 32000)."),
    mlp: str | None = typer.Option(None, "--mlp", help="Model by dimensions: gated|plain (default: gated)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Evaluate one configuration: step time and its breakdown, throughput, memory, cost, verdict."""
    for flag, value in (("--gpus", gpus), ("--tp", tp), ("--pp", pp), ("--vp", vp), ("--cp", cp), ("--dp", dp)):
        _positive(flag, value)
    for flag, value in (("--micro-batch", micro_batch), ("--global-batch", global_batch), ("--seq-len", seq_len)):
        _positive(flag, value)
    _positive("--train-tokens", train_tokens)
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"--zero must be one of 0, 1, 2, 3; got {zero}")

    catalog = load_catalog(catalog_files)
    dims = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn_hidden, vocab=vocab)
    model_label, model_entry = _model(catalog, model, {**dims, "mlp": mlp})
    gpu_entry = catalog.gpu(gpu)
    if overrides:
        gpu_entry = apply_overrides(
            "gpus", gpu, gpu_entry, _pairs("--set", overrides, "=", "FIELD=VALUE"), origin="--set", catalog=catalog
        )
    plan = dict(
        n_gpus=gpus,
        tp=tp,
        pp=pp,
        vp=vp,
        cp=cp,
        dp=dp,
        sp=(tp > 1) if sp is None else sp,
        zero=zero,
        micro_batch=micro_batch,
        global_batch=global_batch,
        seq_len=seq_len or int(model_entry.get("seq_len", 4096)),
        train_tokens=train_tokens,
        recompute=recompute,
        precision=precision,
        attention=attention,
        order=order,
        offload=_pairs("--offload", offload, ":", "STATE:TIER (e.g. optimizer:host-dram)"),
    )

    from hetersim import build
    from hetersim.simulate import STEP_TERMS

    try:
        plan_s = build.plan_spec(**plan)
    except ValueError as error:
        raise _with_flag(error) from None
    specs = (build.model_spec(model_entry), build.system_spec(gpu_entry, catalog.links), plan_s, _calibration())
    out = _simulate()(*specs)
    if plan["dp"] is None:
        plan["dp"] = int(round(float(plan_s.dp)))
    result = fmt.evaluation(out, STEP_TERMS, {"model": model_label, "gpu": gpu, "plan": plan})
    if as_json:
        typer.echo(fmt.dumps(result))
    else:
        fmt.print_evaluation(fmt.console(), result)


# --------------------------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------------------------

VALIDATION_KEYS = ("n_runs", "mape_step_time_pct", "mape_step_time_pct_complete", "max_abs_error_pct", "per_source")


@app.command("validate")
@user_errors
def validate_cmd(
    runs: Path | None = typer.Option(None, "--runs", help="Runs CSV (default: the packaged published runs)."),
    memory: Path | None = typer.Option(None, "--memory", help="Measured-memory CSV to validate as well."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report as JSON to this file."),
    worst: int = typer.Option(5, "--worst", help="How many of the worst rows to list again."),
    catalog_files: list[Path] = typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable."),
) -> None:
    """Predict published training runs and report the step-time error."""
    from hetersim import validation

    if worst < 0:
        raise ValueError(f"--worst must be a non-negative integer; got {worst}")
    catalog = load_catalog(catalog_files)
    path = runs or validation.default_runs_path()
    rows = validation.read_runs(path)
    validate_memory = getattr(validation, "validate_memory", None)
    if memory is not None and validate_memory is None:
        raise ValueError("--memory: this version has no memory validation (hetersim.validation.validate_memory)")
    cal = _calibration()
    report = validation.validate(rows, catalog, cal, path=str(path))
    memory_report = validate_memory(memory, catalog, cal) if memory is not None else None

    con = fmt.console()
    fmt.print_validation(con, report, worst)
    if memory_report is not None:
        fmt.print_summary(con, "Memory validation", memory_report)
    if json_out is not None:
        doc = {key: report[key] for key in VALIDATION_KEYS}
        doc.update({k: v for k, v in report.items() if k not in doc})
        doc["runs_path"] = str(path)
        if memory_report is not None:
            doc["memory"] = memory_report
        fmt.write_json_atomic(json_out, doc)
        con.print(f"wrote {json_out}")


# --------------------------------------------------------------------------------------------
# catalog
# --------------------------------------------------------------------------------------------


CatalogSection = StrEnum("CatalogSection", {name: name for name in SECTIONS})


@app.command("catalog")
@user_errors
def catalog_cmd(
    section: CatalogSection = typer.Argument(..., help="Which part of the catalog to list."),
    as_json: bool = typer.Option(False, "--json", help="Print the entries (with their sources) as JSON."),
    catalog_files: list[Path] = typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable."),
) -> None:
    """List what the catalog knows: GPUs, links, models or memory devices."""
    entries = load_catalog(catalog_files).section(section.value)
    if as_json:
        typer.echo(fmt.dumps(entries))
    else:
        fmt.console().print(fmt.catalog_table(section.value, entries))


# --------------------------------------------------------------------------------------------
# calibrate
# --------------------------------------------------------------------------------------------


@app.command("calibrate")
@user_errors
def calibrate_cmd(
    runs: Path | None = typer.Option(None, "--runs", help="Runs CSV (default: the packaged published runs)."),
    steps: int = typer.Option(300, "--steps", help="Gradient steps."),
    out: Path | None = typer.Option(None, "--out", help="Calibration TOML to write (default: the packaged one)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Fit and report, write nothing."),
    catalog_files: list[Path] = typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted values and MAPE as JSON."),
    cross_validate: bool = typer.Option(
        False, "--cross-validate", help="Leave one source out at a time: fit on the rest, report the held-out error."
    ),
) -> None:
    """Fit the global calibration constants to the published runs; print MAPE before and after."""
    from hetersim import calibration

    _positive("--steps", steps)
    if cross_validate:
        cv = calibration.cross_validate(runs, load_catalog(catalog_files), steps=steps)
        if as_json:
            typer.echo(fmt.dumps(cv))
        else:
            fmt.print_summary(fmt.console(), "Leave-one-source-out cross-validation", cv)
        return
    start = calibration.load_calibration()
    result = calibration.calibrate(runs, load_catalog(catalog_files), steps=steps, start=start)
    path = out or calibration.calibration_path()
    if not dry_run:
        calibration.write_calibration(path, result["values"], result["meta"])
    summary = {
        "mape_before_pct": result["before"]["mape_step_time_pct"],
        "mape_after_pct": result["after"]["mape_step_time_pct"],
        "final_loss": result["history"][-1] if result["history"] else None,
        "start_values": start,
        "values": result["values"],
        "written": None if dry_run else str(path),
    }
    if as_json:
        typer.echo(fmt.dumps(summary))
    else:
        fmt.print_summary(fmt.console(), "Calibration", summary)


# --------------------------------------------------------------------------------------------
# sweep and bench
# --------------------------------------------------------------------------------------------


@app.command("sweep")
@user_errors
def sweep_cmd(
    study: Path | None = typer.Argument(None, help="Study TOML [default: the packaged default study]."),
    out: Path = typer.Option(Path("results"), "--out", help="Output folder, or a .nc path."),
    chunk: int = typer.Option(65536, "--chunk", help="Configurations per compiled batch."),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler address (tcp://host:8786)."),
    workers: int = typer.Option(0, "--workers", help="Start a local Dask cluster with N workers."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Evaluate every configuration of a study; write a netCDF dataset and print the best ones."""
    from dse.sweep_cli import sweep_command

    _positive("--chunk", chunk)
    if workers < 0:
        raise ValueError(f"--workers must be >= 0; got {workers}")
    sweep_command(study, out, chunk, scheduler, workers, as_json)


@app.command("bench")
@user_errors
def bench_cmd(
    configs: int = typer.Option(1_000_000, "--configs", help="Configurations to evaluate."),
    chunk: int = typer.Option(65536, "--chunk", help="Configurations per compiled batch."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the figures as JSON to this file."),
) -> None:
    """Measure configurations per second, compile time and peak memory of the vectorized model."""
    from dse.sweep_cli import bench_command

    _positive("--configs", configs)
    _positive("--chunk", chunk)
    bench_command(configs, chunk, json_path)


if __name__ == "__main__":
    app()
