"""A Megatron argument list's precision flags read as the plan's ``precision``
(:mod:`hetersim.recipe`): ``--fp16`` / ``--bf16``, Transformer Engine's FP8 (``--fp8-format``
with ``--fp8-recipe``) and NVFP4 (``--fp4-format``), with the checks Megatron-LM's own argument
parser makes, each cited."""

from __future__ import annotations

# --fp8-format's choices (NVIDIA/Megatron-LM megatron/training/arguments.py @ c550cf6c41
# l.1179-1187), TransformerConfig.fp8.
FP8_FORMATS = ("e4m3", "hybrid")
# --fp8-recipe's choices (the same lines).
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
# --fp4-format's choices: TransformerConfig.fp4 is Literal['e2m1'], the flag its argparse_meta names,
# and fp4_recipe defaults to 'nvfp4' (NVIDIA/Megatron-LM @ d98e8a64dd
# megatron/core/transformer/transformer_config.py l.673-681); --fp4-format and --fp8-format
# together are refused (megatron/training/arguments.py l.1100-1101, the same commit).
FP4_FORMATS = ("e2m1",)


def _fail(origin: str, key: str, message: str) -> ValueError:
    return ValueError(f"{origin}: {key}: {message}")


def megatron_precision(args: dict[str, str | None], origin: str) -> dict[str, str]:
    """``{"precision": ...}`` from the flags an argument list gives, or nothing where it gives none."""
    if "--bf16" in args and "--fp16" in args:  # megatron/training/arguments.py: assert not args.bf16
        raise _fail(origin, "--fp16 --bf16", "both given; Megatron-LM takes one of them")
    if "--fp4-format" in args:
        if "--fp8-format" in args:
            raise _fail(origin, "--fp4-format --fp8-format", "both given; Megatron-LM takes one of them")
        if args["--fp4-format"] not in FP4_FORMATS:
            raise _fail(origin, "--fp4-format", f"must be e2m1; got {args['--fp4-format']!r}")
        return {"precision": "nvfp4"}
    if "--fp8-format" in args:
        if args["--fp8-format"] not in FP8_FORMATS:
            raise _fail(origin, "--fp8-format", f"must be e4m3 or hybrid; got {args['--fp8-format']!r}")
        recipe = args.get("--fp8-recipe", "delayed")
        if recipe not in FP8_RECIPES:
            raise _fail(origin, "--fp8-recipe", f"must be tensorwise, delayed, mxfp8 or blockwise; got {recipe!r}")
        return {"precision": "mxfp8" if recipe == "mxfp8" else "fp8"}
    if "--bf16" in args:
        return {"precision": "bf16"}
    if "--fp16" in args:
        return {"precision": "fp16"}
    return {}
