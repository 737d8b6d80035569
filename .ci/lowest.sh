#!/usr/bin/env bash
# Run the test suite with every direct dependency that has a lower bound in pyproject.toml pinned
# to that bound (pip's answer to `uv pip install --resolution lowest-direct`), in a fresh venv.
#   .ci/lowest.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LOWEST_VENV:-.venv-lowest}"
python -m venv "$venv"
python - > "$venv/lowest.txt" <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for d in deps:
    m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([^,;\s]+)", d)
    if m:
        print(f"{re.sub(r'\[.*\]', '', m[1])}=={m[2]}")
PY
cat "$venv/lowest.txt"
"$venv/bin/pip" install -q -c "$venv/lowest.txt" -e ".[test]"
"$venv/bin/python" -m pytest -q "$@"
