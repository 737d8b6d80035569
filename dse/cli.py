"""The ``hetersim`` command line: evaluate one configuration, validate, list the catalog, calibrate.

Thin by design: options become catalog entries and specs (:mod:`hetersim.build`), the cost model
runs, and :mod:`dse.format` shows the answer. Bad input is one line ``error: ...`` on stderr and
exit code 2; an infeasible configuration is an answer (exit code 0). JAX and the cost model are
imported inside the commands so that ``--help`` stays fast.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer

from dse import format as fmt
from hetersim.catalog import SECTIONS, load_catalog, model_from_dims, model_from_hf_config
from hetersim.outputs import STEP_TERMS
from hetersim.planfields import FIELDS
from hetersim.types import ATTENTION, OFFLOAD_STATE, ORDER, PRECISION, RECOMPUTE, TIER, FieldError

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


# --------------------------------------------------------------------------------------------
# Option parsing
# --------------------------------------------------------------------------------------------

# Field names (hetersim.planfields and hetersim.api's options) -> the CLI flag that sets them, for
# error messages: hetersim names fields, the CLI names its flags.
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


def _with_flag(error: ValueError) -> ValueError:
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


def configuration(
    *,
    gpus,
    global_batch,
    model=None,
    gpu=None,
    offload=(),
    catalog_files=(),
    overrides=(),
    layers=None,
    hidden=None,
    heads=None,
    kv_heads=None,
    ffn_hidden=None,
    vocab=None,
    mlp=None,
    cluster=None,
    hetero="pipeline",
    layers_per_stage=None,
    cxl_expander=None,
    cxl_pool=None,
    cxl_p2p=False,
    **plan,
):
    """``evaluate``'s options -> :func:`hetersim.api.configure` (one configuration, evaluated).

    Flags map to the API's fields one to one; an error that names a field is shown with its flag.
    """
    from hetersim import api

    if (gpu is None) == (cluster is None):
        raise ValueError("give one of --gpu KIND or --cluster KIND:N,KIND:N")
    catalog = load_catalog(list(catalog_files))
    dims = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn_hidden, vocab=vocab)
    dims = {k: v for k, v in {**dims, "mlp": mlp}.items() if v is not None}
    _model(catalog, model, dims)  # checks the model flags
    try:
        return api.configure(
            model=model if model is not None else dims,
            gpu=gpu,
            cluster=cluster,
            hetero=hetero,
            layers_per_stage=layers_per_stage,
            catalog=catalog,
            overrides=_pairs("--set", list(overrides), "=", "FIELD=VALUE") or None,
            cxl_expander=cxl_expander,
            cxl_pool=cxl_pool,
            cxl_p2p=cxl_p2p,
            n_gpus=gpus,
            global_batch=global_batch,
            offload=_pairs("--offload", list(offload), ":", "STATE:TIER (e.g. optimizer:host-dram)"),
            **plan,
        )
    except ValueError as error:
        raise _with_flag(error) from None


@app.command()
@user_errors
def evaluate(
    model: str | None = typer.Option(None, "--model", help="Catalog model key or a Hugging Face config.json."),
    gpu: str | None = typer.Option(None, "--gpu", help="Catalog GPU key (see `hetersim catalog gpus`)."),
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
    cpu_optimizer: bool | None = typer.Option(
        None,
        "--cpu-optimizer/--gpu-optimizer",
        help="Offloaded optimizer: step on the host CPU (DeepSpeed CPU-Adam; default) or stream states to the GPU.",
    ),
    cxl_expander: str | None = typer.Option(
        None, "--cxl-expander", help="CXL Type-3 expanders per node, DEVICE:COUNT (e.g. micron-cz120:2)."
    ),
    cxl_pool: str | None = typer.Option(
        None,
        "--cxl-pool",
        help="CXL memory pool behind a switch, DEVICE:NHOSTS[:LEVELS] (e.g. cmm-b:4hosts); `hetersim catalog memory`.",
    ),
    cxl_p2p: bool = typer.Option(
        False, "--cxl-p2p", help="What-if CXL 3.x: GPUs reach CXL memory peer-to-peer through the fabric."
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
    cluster: str | None = typer.Option(
        None, "--cluster", help="A mix of device kinds KIND:N,KIND:N (instead of --gpu; --gpus is their total)."
    ),
    hetero: str = typer.Option("pipeline", "--hetero", help="How a mix splits the job: pipeline|data."),
    layers_per_stage: list[int] = typer.Option(
        [], "--layers-per-stage", help="Fix the layers per stage of each --cluster group (default: balanced)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Evaluate one configuration: step time and its breakdown, throughput, memory, cost, verdict.

    ``--cluster KIND:N,KIND:N`` evaluates a mix of device kinds (``--hetero pipeline|data``)."""
    opts = {k: v for k, v in locals().items() if k != "as_json"}
    built = configuration(**opts)
    result = fmt.evaluation(built.breakdown, STEP_TERMS, {"model": built.model, "gpu": built.gpu, "plan": built.plan})
    if built.groups is not None:
        result["groups"] = built.groups
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
    stacks_file: Path | None = typer.Option(
        None, "--stacks", help="Software-stack facts TOML matched by each row's source (default: the packaged one)."
    ),
) -> None:
    """Predict published training runs and report the step-time error."""
    from hetersim.fit import validation
    from hetersim.fit.runs import default_runs_path, read_runs
    from hetersim.fit.stacks import load_stacks

    if worst < 0:
        raise ValueError(f"--worst must be a non-negative integer; got {worst}")
    catalog = load_catalog(catalog_files)
    path = runs or default_runs_path()
    rows = read_runs(path, load_stacks(stacks_file))
    validate_memory = getattr(validation, "validate_memory", None)
    if memory is not None and validate_memory is None:
        raise ValueError("--memory: this version has no memory validation (hetersim.fit.validation.validate_memory)")
    from hetersim.api import default_calibration

    cal = default_calibration()
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
    from hetersim.fit import calibration

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
    chunk: int = typer.Option(16384, "--chunk", help="Configurations per compiled batch (dse.sweep.DEFAULT_CHUNK)."),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler address (tcp://host:8786)."),
    workers: int = typer.Option(0, "--workers", help="Start a local Dask cluster with N workers."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    stream: bool | None = typer.Option(
        None,
        "--stream/--no-stream",
        help="Keep only the top-k per objective, the Pareto set and per-axis summaries "
        "[default: stream spaces of 1e8 configurations or more].",
    ),
    top_k: int = typer.Option(100, "--top-k", help="Configurations kept per objective when streaming."),
) -> None:
    """Evaluate every configuration of a study; write a netCDF dataset and print the best ones."""
    from dse.sweep_cli import sweep_command

    _positive("--chunk", chunk)
    _positive("--top-k", top_k)
    if workers < 0:
        raise ValueError(f"--workers must be >= 0; got {workers}")
    sweep_command(study, out, chunk, scheduler, workers, as_json, stream=stream, top_k=top_k)


@app.command("bench")
@user_errors
def bench_cmd(
    configs: int = typer.Option(1_000_000, "--configs", help="Configurations to evaluate."),
    chunk: int = typer.Option(16384, "--chunk", help="Configurations per compiled batch (dse.sweep.DEFAULT_CHUNK)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the figures as JSON to this file."),
) -> None:
    """Measure configurations per second, compile time and peak memory of the vectorized model."""
    from dse.sweep_cli import bench_command

    _positive("--configs", configs)
    _positive("--chunk", chunk)
    bench_command(configs, chunk, json_path)


@app.command("report")
@user_errors
def report_cmd(
    path: Path = typer.Argument(..., help="Results dataset (.nc) from `hetersim sweep` or `hetersim optimize`."),
    out: Path | None = typer.Option(None, "--out", help="Output folder [default: results/X.nc -> results/X/]."),
    no_validation: bool = typer.Option(False, "--no-validation", help="Skip the model's validation run (~10 s)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (Pareto set, figures, validation) as JSON."),
) -> None:
    """Write an offline HTML report: Pareto fronts, breakdowns, memory, heat maps, validation error."""
    from dse.report_cli import report_command

    report_command(path, out, as_json, validation=not no_validation)


def sensitivity_cmd(**options: Any) -> None:
    """Which hardware upgrade buys the most: d metric / d p and the elasticity of every continuous
    hardware parameter of one configuration (given as for ``evaluate``)."""
    from dse.optimize_cli import sensitivity_report

    metric, top, as_json = options.pop("metric"), options.pop("top"), options.pop("as_json")
    if options.get("cluster"):
        raise ValueError("--cluster: sensitivity works on one device kind; give --gpu")
    built = configuration(**options)
    sensitivity_report(built, metric=metric, top=top, json_out=as_json)


def _with_extra_options(fn: Callable[..., Any], like: Callable[..., Any], extra: dict[str, Any]) -> Callable[..., Any]:
    """Give ``fn`` the typer options of ``like`` (its signature) plus ``extra`` ones."""
    import inspect

    params = [p for name, p in inspect.signature(like).parameters.items() if name != "as_json"]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in extra.items()]
    fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return fn


app.command("sensitivity")(
    user_errors(
        _with_extra_options(
            sensitivity_cmd,
            evaluate,
            {
                "metric": typer.Option("step_time_s", "--metric", help="Metric to differentiate (step_time_s, ...)."),
                "top": typer.Option(15, "--top", help="How many parameters to list."),
                "as_json": typer.Option(False, "--json", help="Print every derivative and elasticity as JSON."),
            },
        )
    )
)


# --------------------------------------------------------------------------------------------
# optimize
# --------------------------------------------------------------------------------------------


@app.command("optimize")
@user_errors
def optimize_cmd(
    study: Path = typer.Argument(..., help="Optimize study TOML: a study file with a [search] table."),
    trials: int = typer.Option(200, "--trials", help="Trials the study should hold (a rerun resumes; 0 only writes)."),
    sampler: str = typer.Option(
        "auto", "--sampler", help="auto|nsga2|tpe|random|grid (auto: NSGA-II, or TPE for one objective)."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampler seed; the same seed reproduces a run."),
    out: Path = typer.Option(Path("results"), "--out", help="Output folder, or a .nc path."),
    storage: str | None = typer.Option(
        None, "--storage", help="Journal file or RDB URL (sqlite:///x.db, postgresql://...) shared by workers."
    ),
    study_name: str | None = typer.Option(None, "--study-name", help="Optuna study name (default: the study's)."),
    batch: int = typer.Option(32, "--batch", help="Trials asked, solved in one vectorized call and told together."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Search the hardware with Optuna, solving every layout of each trial at once; write all trials."""
    from dse.optimize_cli import optimize_command

    _positive("--batch", batch)
    optimize_command(study, trials, sampler, seed, out, storage, study_name, batch, as_json)


if __name__ == "__main__":
    app()
