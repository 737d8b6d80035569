"""Software-stack facts for published runs (``data/stacks.toml``).

A runs CSV describes hardware and layout but not which attention kernel the framework of the
day ran, whether it sharded over context-parallel ranks, or how its ZeRO-3 reused gathered
weights. Those are facts about software,
looked up here by the row's ``source``; each cites where it comes from. They are categorical:
the time a kernel takes still comes from the device's measured utilisation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from ..stacks import check_table, read_stacks_file
from ..types import ATTENTION, STACK

# Other names a runs CSV's ``stack`` column may give a profile (catalog/stacks.toml): Megatron-Core
# is what NeMo 2.x and Megatron-Bridge train with; FSDP1/FSDP2 frameworks without torchtitan's or
# llm-foundry's kernels are the ``fsdp`` profile.
PROFILE_SYNONYMS = {
    "megatron-core": "megatron", "mcore": "megatron", "nemo": "megatron", "megatron-bridge": "megatron",
    "pytorch-fsdp": "fsdp", "torch-fsdp": "fsdp", "fsdp1": "fsdp", "fsdp2": "fsdp",
    "deepspeed-zero": "deepspeed",
}  # fmt: skip

__all__ = ["PROFILE_SYNONYMS", "Stack", "default_stacks_path", "load_stacks", "row_stack", "stack_for"]

_FIELDS = {
    "name",
    "match",
    "notes",
    "stack",
    "attention",
    "shards_over_cp",
    "zero3_reuse_Mparams",
    "zero3_prefetch",
    "sources",
}

# The facts an entry may set (and cite in its ``sources``).
_FACTS = ("stack", "attention", "shards_over_cp", "zero3_reuse_Mparams", "zero3_prefetch")


@dataclasses.dataclass(frozen=True)
class Stack:
    key: str
    name: str
    match: tuple[str, ...]
    stack: str = "megatron"  # the software-stack profile (catalog/stacks.toml) the runs used
    notes: tuple[str, ...] = ()  # substrings the row's notes must also contain, all of them
    attention: str | None = None
    shards_over_cp: bool = False
    zero3_reuse_Mparams: float = 0.0  # ZeRO-3 reuse distance (Plan.reuse_Mparams); 0: FSDP's behaviour
    zero3_prefetch: bool = True  # ZeRO-3 gathers overlap compute (Plan.zero3_prefetch)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)


def default_stacks_path() -> Path:
    return Path(str(resources.files("hetersim") / "data" / "stacks.toml"))


def load_stacks(path: str | Path | None = None) -> list[Stack]:
    """Read a stacks file; one-line ``ValueError`` naming the file, entry and key on bad input."""
    path = Path(path) if path is not None else default_stacks_path()
    data = read_stacks_file(path)
    out = []
    for key, entry in data.items():
        where = check_table(path, key, entry, _FIELDS)
        match = entry.get("match")
        if not isinstance(match, list) or not match or not all(isinstance(m, str) and m.strip() for m in match):
            raise ValueError(f"{where}: match must be a non-empty list of source substrings")
        notes = entry.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(m, str) and m.strip() for m in notes):
            raise ValueError(f"{where}: notes must be a list of substrings of a row's notes")
        stack = entry.get("stack", "megatron")
        if stack not in STACK:
            raise ValueError(f"{where}: stack must be one of {', '.join(STACK)}; got {stack!r}")
        attention = entry.get("attention")
        if attention is not None and attention not in ATTENTION:
            raise ValueError(f"{where}: attention must be one of {', '.join(ATTENTION)}; got {attention!r}")
        shards = entry.get("shards_over_cp", False)
        if not isinstance(shards, bool):
            raise ValueError(f"{where}: shards_over_cp must be true or false; got {shards!r}")
        reuse = entry.get("zero3_reuse_Mparams", 0.0)
        if isinstance(reuse, bool) or not isinstance(reuse, int | float) or not 0 <= reuse < math.inf:
            raise ValueError(f"{where}: zero3_reuse_Mparams must be a finite number >= 0; got {reuse!r}")
        sources = entry.get("sources") or {}
        if not isinstance(sources, dict):
            raise ValueError(f"{where}: sources must be a table of fact = citation; got {sources!r}")
        for fact, citation in sources.items():  # a citation of a fact the entry has, as text
            if fact not in _FACTS:
                raise ValueError(
                    f"{where}: sources.{fact} is not a fact of a source entry (allowed: {', '.join(_FACTS)}; "
                    "a profile's facts live in hetersim/catalog/stacks.toml)"
                )
            if not isinstance(citation, str) or not citation.strip():
                raise ValueError(f"{where}: sources.{fact} must be a citation (text); got {citation!r}")
        prefetch = entry.get("zero3_prefetch", True)
        if not isinstance(prefetch, bool):
            raise ValueError(f"{where}: zero3_prefetch must be true or false; got {prefetch!r}")
        out.append(
            Stack(
                key=key,
                name=str(entry.get("name", key)),
                match=tuple(m.strip() for m in match),
                stack=stack,
                notes=tuple(m.strip() for m in notes),
                attention=attention,
                shards_over_cp=shards,
                zero3_reuse_Mparams=float(reuse),
                zero3_prefetch=prefetch,
                sources={str(k): str(v) for k, v in sources.items()},
            )
        )
    return out


def stack_for(source: str, stacks: Sequence[Stack], notes: str = "") -> Stack | None:
    """The first stack one of whose ``match`` strings occurs in ``source`` and all of whose
    ``notes`` strings occur in the row's ``notes`` (case-insensitive)."""
    low, low_notes = source.lower(), notes.lower()
    for stack in stacks:
        if any(m.lower() in low for m in stack.match) and all(n.lower() in low_notes for n in stack.notes):
            return stack
    return None


def row_stack(source: str, notes: str, named: str, stacks: Sequence[Stack]) -> Stack | None:
    """The stack a runs-CSV row is priced with. A row that names one in its ``stack`` column gets
    it: the key of an entry of ``stacks`` (with that entry's facts), or a profile of
    catalog/stacks.toml (:data:`PROFILE_SYNONYMS` read as theirs), which keeps the facts of the
    entry its ``source`` matches only where that entry runs the same profile. A row that names
    none gets the entry its ``source`` matches (:func:`stack_for`), or None: the default profile.
    A name that is neither raises a one-line ``ValueError`` saying what is allowed."""
    matched = stack_for(source, stacks, notes)
    value = named.strip().lower()
    if not value:
        return matched
    by_key = {s.key.lower(): s for s in stacks}
    if value in by_key:
        return by_key[value]
    profile = PROFILE_SYNONYMS.get(value, value)
    if profile not in STACK:
        entries = f", or an entry of the stacks file ({', '.join(sorted(by_key))})" if by_key else ""
        raise ValueError(f"column stack must be a profile ({', '.join(STACK)}){entries}; got {named.strip()!r}")
    if matched is not None and matched.stack == profile:
        return matched
    return Stack(key=profile, name=f"profile {profile}, named by the row", match=(), stack=profile)
