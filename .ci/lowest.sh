#!/usr/bin/env bash
# Run the test suite with every direct dependency that has a lower bound in pyproject.toml pinned
# to that bound (pip's answer to `uv pip install --resolution lowest-direct`), in a fresh venv.
#   .ci/lowest.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LOWEST_VENV:-.venv-lowest}"
py="${PYTHON:-python3}"
"$py" -m venv "$venv"
"$py" - > "$venv/lowest.txt" <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for d in deps:
    m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([^,;\s]+)", d)
    if m:
        name = re.sub(r"\[.*\]", "", m[1])
        print(f"{name}=={m[2]}")
        if name == "jax":  # jaxlib is released in step with jax; an older jax needs its own jaxlib
            print(f"jaxlib=={m[2]}")
PY
cat "$venv/lowest.txt"
# The pins as requirements (so jaxlib is installed even where jax does not require it), then the
# package and its test extra under them as constraints.
"$venv/bin/pip" install -q -r "$venv/lowest.txt"
"$venv/bin/pip" install -q -c "$venv/lowest.txt" -e ".[test]"
"$venv/bin/python" -m pytest -q "$@"
