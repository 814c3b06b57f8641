#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `make gpu-bundle` on the build machine
# (carry [".gpu"]): runs the GPU test tier (JUnit tag gpu),
# then the transfer benchmark with its PyTorch per-piece baseline. Writes to $1 (default out/).
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
tests=$?
PYTHONPATH=python PYTHONUNBUFFERED=1 python3 -m pegaflow.cli transfer --json "$out/transfer-h200.json" 2>&1 \
  | tee "$out/transfer.log"
bench=$?
echo "gpu tests rc=$tests, transfer bench rc=$bench"
exit $(( tests != 0 || bench != 0 ))
