#!/usr/bin/env bash
# The GPU JUnit tier (JUnit tag gpu) on the GPU machine once ci/gpu-vllm/install.sh installed
# the staged wheel: that wheel's own Java runtime and jar (/tmp/ours-site, or PEGAFLOW_SITE),
# the test classes of ci/gpu-junit-bundle.sh built here from the same commit (carry
# [".gpu-tests"] alone, so it fits beside the tree in a call of its own). Extra arguments
# replace the default selection (every class tagged gpu), e.g.
#   --select-class io.pegaflow.engine.CudaTransferContractTest --select-class io.pegaflow.engine.CudaPacedLeadContractTest
# Usage: ci/gpu-vllm/junit.sh OUT_DIR [JUnit console selection arguments]
set -uo pipefail
out=${1:?usage: ci/gpu-vllm/junit.sh OUT_DIR [JUnit console selection arguments]}
shift
site=${PEGAFLOW_SITE:-/tmp/ours-site}
mkdir -p "$out"
if [ $# -eq 0 ]; then
  set -- --scan-classpath .gpu-tests/test-classes --include-tag gpu
fi
"$site/pegaflow/_jre/bin/java" -XX:ErrorFile="$out/hs_err_junit.log" --enable-native-access=ALL-UNNAMED \
  -jar .gpu-tests/lib/junit-platform-console-standalone-*.jar execute \
  --class-path "$site/pegaflow/_jars/pegaflow.jar:.gpu-tests/test-classes:$(ls .gpu-tests/lib/assertj-core-*.jar)" \
  "$@" --disable-banner --disable-ansi-colors --details=tree 2>&1 | tee "$out/junit.log" | grep -v "✔" | tail -60
rc=${PIPESTATUS[0]}
echo "gpu junit rc=$rc" | tee -a "$out/junit.log"
exit "$rc"
