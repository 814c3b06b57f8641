#!/usr/bin/env bash
# Creates .venv-<minor>/ with vLLM's CUDA build (the `vllm` distribution) <version> and the
# project in development mode; prints the venv's path. Its scheduler, config and connector
# classes run on a machine without a GPU (the scheduler tier of `make test-compat`), its engine
# does not.
#   ci/venv-vllm.sh 0.26.0
# Each release pins its own torch (0.26: 2.11.0, the GPU machine's; 0.27-0.29: 2.13.0; 0.33:
# 2.14.0), all on PyPI, so nothing is overridden.
set -euo pipefail
version=${1:?usage: ci/venv-vllm.sh <vllm version, e.g. 0.26.0>}
root=$(cd "$(dirname "$0")/.." && pwd)
minor=${version%.*}
case "$minor" in
  0.26|0.27|0.28|0.29|0.30|0.31|0.32|0.33) ;;
  *) echo "ci/venv-vllm.sh: vllm $version is not a supported release; expected 0.26.x-0.33.x" >&2; exit 2 ;;
esac
venv="$root/.venv-$minor"
if [ -f "$venv/.installed-$version" ] && [ "$venv/.installed-$version" -nt "$root/python/pyproject.toml" ]; then
  echo "$venv"; exit 0
fi
UV=$("$root/ci/ensure-uv.sh")
"$UV" venv --quiet --allow-existing --python python3 "$venv" >&2
# --compile-bytecode: see ci/venv-vllm-cpu.sh
"$UV" pip install --quiet --compile-bytecode --python "$venv/bin/python" "vllm==$version" -e "$root/python[test]" \
  --reinstall-package pegaflow-jvm >&2
touch "$venv/.installed-$version"
echo "$venv"
