"""``hetersim evaluate`` and ``hetersim sensitivity``: one configuration, from flags.

Both take the same options (:data:`dse.cli.options.CONFIGURATION_OPTIONS`) and build the
configuration with :func:`hetersim.api.configure`; the CLI only maps flags to fields and back.
"""

from typing import Any

import numpy as np
import typer

from dse import format as fmt
from hetersim.catalog import load_catalog
from hetersim.catalog.calculon import UNUSED, with_calculon_system
from hetersim.outputs import STEP_TERMS

from .app import app, status, user_errors
from .options import (
    CONFIGURATION_OPTIONS,
    FIELD_FLAGS,
    apply_recipe,
    check_model,
    cluster_error,
    fold_switches,
    given,
    pairs,
    with_flag,
    with_options,
)


def configuration(
    *,
    gpus,
    global_batch,
    model=None,
    gpu=None,
    offload=(),
    catalog_files=(),
    system=None,
    overrides=(),
    layers=None,
    hidden=None,
    heads=None,
    kv_heads=None,
    ffn_hidden=None,
    vocab=None,
    head_dim=None,
    mlp=None,
    tied_embeddings=None,
    **rest,
):
    """``evaluate``'s options -> :func:`hetersim.api.configure` (one configuration, evaluated).

    Flags map to the API's fields one to one; an error that names a field is shown with its flag.
    """
    from hetersim import api

    rest = fold_switches(rest)
    recipe = rest.pop("recipe_fields", None)  # (file, fields it set): an error names them as the file's
    plan_file = rest.get("plan_file")
    if plan_file is not None:  # a flag left at its default must not stand for the plan file's value
        rest = {k: None if _untouched(k, v) else v for k, v in rest.items()}
    for flag, value in (("--gpus", gpus), ("--global-batch", global_batch)):
        if value is None and plan_file is None:
            raise ValueError(f"missing option {flag} (give it, or a --recipe that names it)")
    if plan_file is not None and (rest.get("gpu") is not None or gpu is not None):
        raise ValueError(
            "--plan names the device kind of every replica; leave --gpu out (--cluster may give the GPUs there are)"
        )
    if plan_file is None and (rest.get("gpu") is None and gpu is None) == (rest.get("cluster") is None):
        raise ValueError("give one of --gpu KIND or --cluster KIND:N,KIND:N")
    catalog = load_catalog(list(catalog_files))
    if rest.get("cluster") is not None:  # its kinds named with the flag (the engine's error names none)
        from hetersim import hplan

        try:
            [catalog.key("gpus", kind) for kind, _ in hplan.parse_cluster_groups(rest["cluster"])]
        except ValueError as error:
            raise cluster_error(rest["cluster"], error) from None
    if system is not None:
        if rest.get("cluster") is not None:
            raise ValueError("--system describes one device kind (--gpu KIND), not the kinds of --cluster")
        if gpu is None:
            raise ValueError("--system describes one device kind: give --gpu KIND (the base for what it leaves out)")
        catalog, gpu = with_calculon_system(catalog, gpu, system)
    dims = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn_hidden, vocab=vocab)
    dims["head_dim"] = head_dim
    dims = {k: v for k, v in {**dims, "mlp": mlp, "tied_embeddings": tied_embeddings}.items() if v is not None}
    extra = rest.pop("model_extra", None) or {}
    check_model(catalog, model, dims, extra, recipe)
    dims.update(extra)
    try:
        built = api.configure(
            model=model if model is not None else dims,
            gpu=gpu,
            catalog=catalog,
            overrides=pairs("--set", list(overrides), "=", "FIELD=VALUE") or None,
            n_gpus=gpus,
            global_batch=global_batch,
            offload=pairs("--offload", list(offload), ":", "STATE:TIER (e.g. optimizer:host-dram)"),
            **rest,
        )
    except ValueError as error:
        raise with_flag(error, recipe) from None
    if system is not None:  # a note once the inputs are checked: an error stays the one line
        status(f"{system}: Calculon keys the model does not use (its own apply): {', '.join(UNUSED)}")
    return built


def device_facts(specs: tuple) -> dict[str, Any]:
    """What the device changes in the stack's facts, as the model prices them, read with NumPy
    (no JAX program is compiled for it): whether every device kind runs Transformer Engine
    (:func:`hetersim.terms.compute.runs_transformer_engine`; a mix's padding slots, without
    memory, are not kinds) and, on one kind, the attention kernel an ``auto`` plan runs there
    (materialised where the device runs none of the stack's fused kernels:
    :func:`hetersim.terms.compute.fallback_attention`, as in ``resolve_kernels``)."""
    from hetersim import stacks
    from hetersim.terms import compute
    from hetersim.types import Attention

    system, plan = specs[1], specs[2]
    inner = getattr(system, "systems", system)  # a mix: one leading axis of kinds
    device = getattr(inner, "device", None)
    if device is None:
        return {}
    te = np.atleast_1d(compute.runs_transformer_engine(device, xp=np))
    real = np.atleast_1d(np.asarray(device.hbm_capacity_GiB)) > 0
    facts: dict[str, Any] = {"runs_te": bool(np.all(te[real] > 0))}
    if inner is system and hasattr(plan, "attention_code"):
        code = int(np.asarray(plan.attention_code))
        auto = code == Attention.AUTO
        if auto:
            code = int(stacks.table().attention[int(np.asarray(plan.stack_code))])
        facts["attention"] = Attention(int(compute.fallback_attention(device, code, auto, xp=np))).label
    return facts


@with_options(
    CONFIGURATION_OPTIONS,
    as_json=(bool, typer.Option(False, "--json", help="Print one JSON object instead of tables.")),
)
def evaluate(**options: Any) -> None:
    """Evaluate one configuration: step time and its breakdown, throughput, memory, cost, verdict.

    ``--cluster KIND:N,KIND:N`` evaluates a mix of device kinds (``--hetero pipeline|data``)."""
    as_json = options.pop("as_json")
    built = configuration(**apply_recipe(options))
    header = {"model": built.model, "gpu": built.gpu, "plan": built.plan}
    result = fmt.evaluation(built.breakdown, STEP_TERMS, header, built.interval)
    result["stack"] = fmt.stack_summary(built.plan, **device_facts(built.specs))
    if built.groups is not None:
        result["stages" if built.groups and "stage" in built.groups[0] else "groups"] = built.groups
    if as_json:
        typer.echo(fmt.dumps(result))
    else:
        fmt.print_evaluation(fmt.console(), result)


@with_options(
    CONFIGURATION_OPTIONS,
    metric=(str, typer.Option("step_time_s", "--metric", help="Metric to differentiate (step_time_s, ...).")),
    top=(int, typer.Option(15, "--top", help="How many parameters to list.")),
    as_json=(bool, typer.Option(False, "--json", help="Print every derivative and elasticity as JSON.")),
)
def sensitivity(**options: Any) -> None:
    """Which hardware upgrade buys the most: d metric / d p and the elasticity of every continuous
    hardware parameter of one configuration (given as for ``evaluate``)."""
    from .optimize import sensitivity_report

    metric, top, as_json = options.pop("metric"), options.pop("top"), options.pop("as_json")
    for key in ("cluster", "plan_file"):  # a plan file names kinds per replica
        if options.get(key):
            instead = f"leave {FIELD_FLAGS[key]} out" if options.get("gpu") else "give --gpu instead"
            raise ValueError(f"{FIELD_FLAGS[key]}: sensitivity works on one device kind; {instead}")
    sensitivity_report(configuration(**apply_recipe(options)), metric=metric, top=top, json_out=as_json)


app.command("evaluate")(user_errors(evaluate))
app.command("sensitivity")(user_errors(sensitivity))


def _untouched(name: str, value: Any) -> bool:
    """An option the command line did not give, at its registry default (a recipe's value stays)."""
    from hetersim import api

    return not given(name) and api._is_default(name, value)
