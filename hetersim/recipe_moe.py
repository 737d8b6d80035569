"""Mixture-of-experts, latent attention and multi-token prediction in a recipe
(:mod:`hetersim.recipe`): the keys a NeMo / Megatron-Bridge config and a Megatron-LM argument list
give them, read as the catalog's optional model fields and the plan's expert fields.

Names and defaults are Megatron-Core's, at NVIDIA/Megatron-LM @ d98e8a64dd:

* NeMo / Megatron-Bridge configs use the ``TransformerConfig`` field names
  (``megatron/core/transformer/transformer_config.py``: ``num_moe_experts``, ``moe_router_topk``
  default 2, ``moe_ffn_hidden_size`` default ``ffn_hidden_size``, ``moe_layer_freq`` default 1,
  ``moe_token_dispatcher_type`` default ``allgather``, ...; ``MLATransformerConfig`` there:
  ``q_lora_rank`` 512, ``kv_lora_rank`` 512, ``qk_head_dim`` 128, ``qk_pos_emb_head_dim`` 64,
  ``v_head_dim`` 128), e.g. NVIDIA/NeMo-Framework-Launcher @ 26e42fa9
  ``launcher_scripts/conf/training/mixtral/mixtral_8x7b.yaml``;
* Megatron-LM's flags are the same names with dashes (``megatron/training/arguments.py``, e.g.
  ``examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh``), except ``--num-experts``; there
  ``--q-lora-rank`` defaults to none (no query compression) and ``--kv-lora-rank`` to 32.
* ``expert_tensor_parallel_size`` left out is the tensor-parallel size
  (``megatron/core/model_parallel_config.py`` ``__post_init__``), not this project's default 1.
* ``moe_layer_freq``: an integer ``k`` makes layer ``i`` an MoE layer when ``i % k == 0``
  (``megatron/core/models/gpt/gpt_layer_specs.py``); a list, or a Python list expression such as
  ``([0]*3+[1]*58)``, gives each layer (1: MoE). The model holds leading dense layers followed by
  MoE layers, or one MoE layer every ``k`` layers; any other pattern is refused.
* ``moe_token_dispatcher_type``: ``alltoall`` is priced as such, ``flex`` (DeepEP / HybridEP) as
  ``deepep``; ``allgather`` — also the default — has no price here once experts are spread over
  ranks, so it is refused there.
* ``moe_expert_capacity_factor`` ``c`` with ``moe_pad_expert_input_to_capacity``: every expert
  computes and exchanges ``c`` times its mean share, ``moe_imbalance = c``; without padding a
  factor below 1 drops tokens down to ``c``; above 1 it caps an imbalance the plan does not have.
* ``recompute_modules``: ``core_attn`` is the plan's selective recomputation, ``mla_up_proj``
  alone its ``mla_up_proj``; other modules are refused.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from .types import decimal_digits

# (config key, Megatron-LM flag, model field)
MOE_MODEL_KEYS = (
    ("num_moe_experts", "--num-experts", "n_experts"),
    ("moe_router_topk", "--moe-router-topk", "top_k"),
    ("moe_ffn_hidden_size", "--moe-ffn-hidden-size", "moe_ffn_hidden"),
    ("moe_shared_expert_intermediate_size", "--moe-shared-expert-intermediate-size", "shared_ffn_hidden"),
    ("moe_router_num_groups", "--moe-router-num-groups", "route_groups"),
    ("moe_router_group_topk", "--moe-router-group-topk", "route_group_topk"),
)
MLA_KEYS = (
    ("q_lora_rank", "--q-lora-rank", "q_lora_rank"),
    ("kv_lora_rank", "--kv-lora-rank", "kv_lora_rank"),
    ("qk_head_dim", "--qk-head-dim", "head_dim"),
    ("qk_pos_emb_head_dim", "--qk-pos-emb-head-dim", "qk_rope_head_dim"),
    ("v_head_dim", "--v-head-dim", "v_head_dim"),
)
# MLA dimensions where the file leaves them out: MLATransformerConfig's (configs) and
# arguments.py _add_mla_args' (argument lists; --q-lora-rank none = 0, no query compression).
MLA_DEFAULTS = {
    "config": dict(q_lora_rank=512, kv_lora_rank=512, head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    "flags": dict(q_lora_rank=0, kv_lora_rank=32, head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
}
DEFAULT_TOPK = 2  # TransformerConfig.moe_router_topk
DISPATCHERS = {"alltoall": "alltoall", "flex": "deepep"}
SELECTIVE_MODULES = {"core_attn": False, "mla_up_proj": True}  # module -> plan.mla_up_proj
MAX_PATTERN = 100_000

# lookup(config key, flag) -> (the key as the file names it, its raw value) or None when absent.
Lookup = Callable[[str, str], "tuple[str, Any] | None"]


class Reader:
    """One file's MoE keys: ``lookup`` finds a key, ``fmt`` is ``config`` or ``flags``."""

    def __init__(self, origin: str, lookup: Lookup, fmt: str):
        self.origin, self.lookup, self.fmt = origin, lookup, fmt

    def label(self, key: str, flag: str) -> str:
        """How the file would name a key it leaves out."""
        return flag if self.fmt == "flags" else f"model.{key}"

    def fail(self, key: str, message: str) -> ValueError:
        return ValueError(f"{self.origin}: {key}: {message}")

    def get(self, key: str, flag: str) -> tuple[str, Any] | None:
        found = self.lookup(key, flag)
        return None if found is None or found[1] is None else found

    def count(self, key: str, flag: str, *, zero_ok: bool = False) -> int | None:
        found = self.get(key, flag)
        if found is None:
            return None
        name, raw = found
        value = _integer(raw)
        if value is None or value < (0 if zero_ok else 1):
            raise self.fail(name, f"must be a {'non-negative' if zero_ok else 'positive'} integer; got {raw!r}")
        return value

    def number(self, key: str, flag: str) -> float | None:
        found = self.get(key, flag)
        if found is None:
            return None
        name, raw = found
        try:
            value = float(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not 0.0 < value < 1e3:
            raise self.fail(name, f"must be a number between 0 and 1000; got {raw!r}")
        return value

    def switch(self, key: str, flag: str) -> bool:
        found = self.lookup(key, flag)
        if found is None:
            return False
        name, raw = found
        if self.fmt == "flags":
            return True  # a value-less flag
        if not isinstance(raw, bool) and raw is not None:
            raise self.fail(name, f"must be true or false; got {raw!r}")
        return bool(raw)


def _integer(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and decimal_digits(raw.strip()):
        return int(raw)
    return None


def model_fields(r: Reader, model: dict[str, Any]) -> dict[str, Any]:
    """The catalog's optional MoE / MLA / MTP model fields the file gives (``model`` holds the
    dense dimensions already read: ``layers`` and ``ffn_hidden`` are defaults here)."""
    out: dict[str, Any] = {}
    experts = r.count("num_moe_experts", "--num-experts")
    if experts is not None:
        for key, flag, field in MOE_MODEL_KEYS[1:]:
            value = r.count(key, flag, zero_ok=field == "shared_ffn_hidden")
            if value is not None:
                out[field] = value
        out["n_experts"] = experts
        out.setdefault("top_k", DEFAULT_TOPK)
        if "moe_ffn_hidden" not in out:
            if "ffn_hidden" not in model:
                ffn = r.label("ffn_hidden_size", "--ffn-hidden-size")
                raise r.fail(r.label(*MOE_MODEL_KEYS[2][:2]), f"one expert's FFN width is needed (or {ffn})")
            out["moe_ffn_hidden"] = model["ffn_hidden"]  # TransformerConfig.__post_init__
        out.update(_layer_freq(r, model.get("layers")))
    else:
        for key, flag, _ in MOE_MODEL_KEYS[1:]:
            found = r.get(key, flag)
            if found is not None:
                raise r.fail(found[0], f"is an expert setting; the file gives no {r.label(*MOE_MODEL_KEYS[0][:2])}")
    if r.switch("multi_latent_attention", "--multi-latent-attention"):
        out.update(MLA_DEFAULTS[r.fmt])
        for key, flag, field in MLA_KEYS:
            value = r.count(key, flag, zero_ok=field == "q_lora_rank")
            if value is not None:
                out[field] = value
    mtp = r.count("mtp_num_layers", "--mtp-num-layers", zero_ok=True)
    if mtp:
        out["mtp_layers"] = mtp
    return out


def _layer_freq(r: Reader, layers: int | None) -> dict[str, int]:
    """``moe_layer_freq`` as ``dense_layers`` / ``moe_every`` (module docstring)."""
    found = r.get("moe_layer_freq", "--moe-layer-freq")
    if found is None:
        return {}
    name, raw = found
    every = _integer(raw)
    if every is not None:
        if every < 1:
            raise r.fail(name, f"must be a positive integer or a layer pattern; got {raw!r}")
        if every == 1:
            return {}
        if layers is None or layers % every:
            raise r.fail(name, f"{every}: one MoE layer every {every} is modelled where it divides the layers")
        return {"moe_every": every}
    pattern = _pattern(r, name, raw)
    if layers is not None and len(pattern) != layers:
        raise r.fail(name, f"gives {len(pattern)} layers; the model has {layers}")
    dense = pattern.index(1) if 1 in pattern else len(pattern)
    if dense < len(pattern) and all(pattern[dense:]):
        return {"dense_layers": dense} if dense else {}
    period = pattern.index(1) + 1 if 1 in pattern else 0
    if period > 1 and len(pattern) % period == 0 and pattern == ([0] * (period - 1) + [1]) * (len(pattern) // period):
        return {"moe_every": period}
    raise r.fail(
        name,
        "this layer pattern is not modelled: give leading dense layers then MoE layers ([0]*d+[1]*n) "
        "or one MoE layer every k layers",
    )


def _pattern(r: Reader, name: str, raw: Any) -> list[int]:
    """A layer pattern: a list of 0/1, or a Python list expression of lists, ``+`` and ``*``."""
    if isinstance(raw, list):
        value: Any = raw
    elif isinstance(raw, str):
        try:
            value = _evaluate(ast.parse(raw.strip(), mode="eval").body)
        except (SyntaxError, ValueError, RecursionError):
            value = None
    else:
        value = None
    if not isinstance(value, list) or not value or any(v not in (0, 1) or isinstance(v, bool) for v in value):
        raise r.fail(name, f"must be an integer or a list of 0 and 1 such as ([0]*3+[1]*58); got {raw!r}")
    return [int(v) for v in value]


def _evaluate(node: ast.AST) -> Any:
    """Lists of integers, ``+`` of lists and ``*`` by an integer; nothing else is evaluated."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.List):
        return [_evaluate(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            out = left + right
        elif isinstance(node.op, ast.Mult) and isinstance(left, list) != isinstance(right, list):
            seq, times = (left, right) if isinstance(left, list) else (right, left)
            if not isinstance(times, int) or times < 0 or len(seq) * times > MAX_PATTERN:
                raise ValueError("repeat count")
            out = seq * times
        else:
            raise ValueError("operands")
        if len(out) > MAX_PATTERN:
            raise ValueError("too long")
        return out
    raise ValueError(type(node).__name__)


def plan_fields(r: Reader, plan: dict[str, Any], moe: bool) -> dict[str, Any]:
    """The plan's expert fields: ``etp`` defaulting to ``tp``, the dispatcher, the capacity
    factor as ``moe_imbalance``, the all-to-all overlap, and ``recompute_modules``."""
    out: dict[str, Any] = {}
    if moe:
        if "etp" not in plan:
            out["etp"] = plan.get("tp", 1)  # ModelParallelConfig: expert TP None -> TP
        out.update(_dispatcher(r, plan))
        out.update(_capacity(r))
        if r.switch("overlap_moe_expert_parallel_comm", "--overlap-moe-expert-parallel-comm"):
            out["ep_overlap"] = True  # (the flag is also the registry's alias of ep_overlap)
    if plan.get("recompute") == "selective":  # Megatron reads the modules only then
        out.update(_recompute_modules(r))
    return out


def _dispatcher(r: Reader, plan: dict[str, Any]) -> dict[str, str]:
    found = r.get("moe_token_dispatcher_type", "--moe-token-dispatcher-type")
    key, flag = "moe_token_dispatcher_type", "--moe-token-dispatcher-type"
    name, kind = found if found is not None else (r.label(key, flag), "allgather")
    if kind in DISPATCHERS:
        return {"dispatcher": DISPATCHERS[kind]}
    if kind == "allgather":
        if plan.get("ep", 1) > 1:
            why = "given" if found is not None else "Megatron's default, the file names none"
            raise r.fail(
                name,
                f"allgather ({why}) is not modelled with expert parallelism; use alltoall or flex",
            )
        return {}
    raise r.fail(name, f"must be one of alltoall, flex, allgather; got {kind!r}")


def _capacity(r: Reader) -> dict[str, float]:
    factor = r.number("moe_expert_capacity_factor", "--moe-expert-capacity-factor")
    if factor is None:
        return {}
    padded = r.switch("moe_pad_expert_input_to_capacity", "--moe-pad-expert-input-to-capacity")
    return {"moe_imbalance": factor} if padded or factor < 1.0 else {}


def _recompute_modules(r: Reader) -> dict[str, bool]:
    found = r.get("recompute_modules", "--recompute-modules")
    if found is None:
        return {}
    name, raw = found
    modules = raw.split() if isinstance(raw, str) else raw
    if not isinstance(modules, list) or len(modules) != 1 or modules[0] not in SELECTIVE_MODULES:
        raise r.fail(
            name,
            f"{raw!r}: the model recomputes one of {', '.join(SELECTIVE_MODULES)} (selective recomputation); "
            "other modules are not modelled",
        )
    return {"mla_up_proj": True} if SELECTIVE_MODULES[modules[0]] else {}
