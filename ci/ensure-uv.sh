#!/usr/bin/env bash
# Prints the path of a uv binary: the one on PATH, else one installed from PyPI into .tools/.
set -euo pipefail
if command -v uv >/dev/null 2>&1; then
  command -v uv; exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$root/.tools/uv/bin/uv" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$root/.tools/uv" uv >&2
fi
echo "$root/.tools/uv/bin/uv"
