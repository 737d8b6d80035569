"""TOML as HeterSim reads its input files (catalogs, studies, plan files): as :func:`tomllib.loads`,
but an error quotes the line it points at. tomllib names only the place (``Cannot overwrite a value
(at line 11, column 7)``, a key given twice): the quoted line names the key."""

from __future__ import annotations

import re
import tomllib
from typing import Any

_AT_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_QUOTED = 80  # characters of the line quoted at most


def loads(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``; its :class:`tomllib.TOMLDecodeError` with the line it names quoted."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        at = _AT_LINE.search(message)
        lines = text.splitlines()
        if at is None or not 1 <= int(at[1]) <= len(lines):
            raise
        line = lines[int(at[1]) - 1].strip()
        quoted = line if len(line) <= _QUOTED else line[: _QUOTED - 3] + "..."
        raise tomllib.TOMLDecodeError(f"{message}: {quoted!r}") from None
