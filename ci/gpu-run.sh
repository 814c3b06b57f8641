#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `make gpu-bundle` on the build machine
# (carry [".gpu"]): runs the GPU test tier (JUnit tag gpu),
# then the connector's end-to-end test (a transformers Llama's KV through the worker
# connector and back; logits must match exactly), then the transfer benchmark with its
# PyTorch per-piece baseline. Writes to $1 (default out/).
set -uo pipefail
out=${1:-out}
mkdir -p "$out"
export JAVA_HOME=$PWD/.gpu/jre
export PEGAFLOW_JAR=$PWD/.gpu/pegaflow-gpu.jar
cp=.gpu/classes:.gpu/test-classes:$(ls .gpu/lib/assertj-core-*.jar)
"$JAVA_HOME/bin/java" -XX:ErrorFile="$out/hs_err_tests.log" --enable-native-access=ALL-UNNAMED \
  -jar .gpu/lib/junit-platform-console-standalone-*.jar execute --class-path "$cp" \
  --select-package io.pegaflow.engine --include-tag gpu --disable-banner --disable-ansi-colors --details=tree \
  2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
PEGAFLOW_E2E_JSON="$out/connector-e2e-h200.json" PYTHONPATH=python python3 -m pytest -p no:cacheprovider \
  -m "e2e and gpu" python/tests/test_gpu_e2e.py -q -s 2>&1 | tee "$out/connector-e2e.log"
e2e=${PIPESTATUS[0]}
PYTHONPATH=python PYTHONUNBUFFERED=1 python3 -m pegaflow.cli transfer --json "$out/transfer-h200.json" 2>&1 \
  | tee "$out/transfer.log"
bench=${PIPESTATUS[0]}
echo "gpu tests rc=$tests, connector e2e rc=$e2e, transfer bench rc=$bench"
exit $(( tests != 0 || e2e != 0 || bench != 0 ))
