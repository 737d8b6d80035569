"""What a plan's software stack cannot run, as flags of a sweep's points (the traced view of
:func:`hetersim.planrules.check_stack_schedule` and :func:`~hetersim.planrules.check_stack_features`,
which refuse the same where a plan is given): the profile's ``pipeline``, ``pipeline_zero1``,
``context_parallel``, ``fp8``, ``bf16``, ``experts`` and ``expert_parallel`` facts (``catalog/stacks.toml``)."""

from __future__ import annotations

from .. import stacks
from ..specs import ModelSpec, Plan
from ..types import Precision
from .compute import low_precision, stack_fact


def stack_feature_bad(model: ModelSpec, plan: Plan):
    """The plan uses what its stack does not have: context parallelism (the stack fact
    ``context_parallel``), 8-bit-class GEMMs (``fp8``), bf16 (``bf16``), mixture-of-experts layers
    (``experts = "none"``) or expert parallelism, ``ep`` or ``etp`` > 1 (``expert_parallel``)."""
    table = stacks.table()
    no_cp = (plan.cp > 1) & (stack_fact(table.context_parallel, plan) <= 0)
    no_bf16 = (plan.precision_code == int(Precision.BF16)) & (stack_fact(table.bf16, plan) <= 0)
    no_moe = (model.moe_layers > 0) & (stack_fact(table.no_experts, plan) > 0)
    no_ep = ((plan.ep > 1) | (plan.etp > 1)) & (stack_fact(table.expert_parallel, plan) <= 0)
    return no_cp | no_bf16 | no_moe | no_ep | (low_precision(plan) & (stack_fact(table.fp8, plan) <= 0))


def stack_schedule_bad(plan: Plan):
    """The plan's stack has not the pipeline it asks for (the stack fact ``pipeline``): ``pp`` > 1
    stages where it has no pipeline parallelism, or interleaved chunks (vp > 1) or DualPipe where it
    has 1F1B alone; or its pipeline engine does not run the plan's ZeRO stage (``pipeline_zero1``:
    DeepSpeed's, ZeRO 0-1 only)."""
    table = stacks.table()
    no_pipe = (plan.pp > 1) & (stack_fact(table.no_pipeline, plan) > 0)
    chunks = (plan.vp > 1) | (plan.dualpipe > 0)  # DualPipe too needs more than 1F1B
    zero = (plan.pp > 1) & (plan.zero >= 2) & (stack_fact(table.pipeline_zero1, plan) > 0)
    return no_pipe | zero | (chunks & (stack_fact(table.no_interleaving, plan) > 0))
