"""JSON as HeterSim reads its input files (Hugging Face and Calculon configs, plan files, DeepSpeed
configs): as :func:`json.loads`, but a key given twice in one object is an error, as TOML makes it
(:func:`json.loads` keeps the last value silently)."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str) -> Any:
    """``json.loads(text)``; :class:`json.JSONDecodeError` for a key given twice in one object,
    placed at its second occurrence."""
    twice: list[str] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                twice.append(key)
            out[key] = value
        return out

    data = json.loads(text, object_pairs_hook=unique)
    if twice:
        quoted = json.dumps(twice[0])
        raise json.JSONDecodeError(
            f"key {quoted} is given twice in one object", text, text.find(quoted, text.find(quoted) + 1)
        )
    return data
