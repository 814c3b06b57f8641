#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the built wheel carried (`make wheel`,
# carry ["dist"]): unpacks the wheel (its own Java runtime and jar: the product as users
# install it) and runs `pegaflow-bench paths` on the GPUs: line, copy engine alone, embedded,
# server mode (a pegaflow-server process), cross-layer, restore, first operation, pool attach
# settings and, with two GPUs, two TP ranks in two processes. Writes $1/server-h200.json and
# $1/paths.log. COPY=host runs the same flow on a machine without a GPU (the check before
# spending GPU time). E2E=1 first runs the GPU end-to-end tests on the wheel's runtime;
# JUNIT=1 before them the GPU JUnit tier (ci/gpu-junit-bundle.sh, carry [".gpu-tests"]).
# Extra arguments go to `paths`.
set -uo pipefail
out=${1:-out}
shift || true
mkdir -p "$out"
site=$(ci/unpack-wheel.sh) || exit 1
{
  echo "host: $(nproc) cpus, $(free -g | awk '/Mem:/ {print $2}') GiB"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  echo "shmem_enabled: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null)"
  echo "enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  df -h /dev/shm | tail -1
  lscpu | grep -i "numa\|model name"
  command -v nvidia-smi >/dev/null && nvidia-smi topo -m
} 2>&1 | tee "$out/paths.log"
if [ "${JUNIT:-0}" = 1 ]; then
  # the GPU test tier (JUnit tag gpu) on the wheel's runtime and jar: test classes from
  # ci/gpu-junit-bundle.sh (carry [".gpu-tests"])
  "$site/pegaflow/_jre/bin/java" -XX:ErrorFile="$out/hs_err_tests.log" --enable-native-access=ALL-UNNAMED \
    -jar .gpu-tests/lib/junit-platform-console-standalone-*.jar execute \
    --class-path "$site/pegaflow/_jars/pegaflow.jar:.gpu-tests/test-classes:$(ls .gpu-tests/lib/assertj-core-*.jar)" \
    --scan-classpath .gpu-tests/test-classes --include-tag gpu --disable-banner --disable-ansi-colors --details=tree \
    2>&1 | tee "$out/gpu-tests.log" | grep -v "✔" | tail -60
  junit=${PIPESTATUS[0]}
  echo "gpu junit rc=$junit" | tee -a "$out/gpu-tests.log"
fi
if [ "${E2E:-0}" = 1 ]; then
  # the GPU end-to-end tests (python/tests/test_gpu_e2e.py: one GPU, and TP = 2 on two GPUs
  # sharing one pegaflow-server) on the wheel's runtime and jar
  JAVA_HOME="$site/pegaflow/_jre" PEGAFLOW_JAR="$site/pegaflow/_jars/pegaflow.jar" PYTHONPATH=python \
    PEGAFLOW_E2E_JSON="$out/connector-e2e-h200.json" PEGAFLOW_E2E_TP2_JSON="$out/connector-e2e-tp2-h200.json" \
    python3 -m pytest -p no:cacheprovider -m "e2e and gpu" python/tests/test_gpu_e2e.py -q -s 2>&1 \
    | grep -v "^W1130" | tee "$out/connector-e2e.log"
  e2e=${PIPESTATUS[0]}
  echo "gpu e2e rc=$e2e" | tee -a "$out/connector-e2e.log"
fi
# HUGE=1: a tmpfs mounted with huge=always (2 MiB pages; root) holds the server's pool and the
# huge-page attach settings' pools: the placement docs/gpu.md recommends for GPU hosts; removed at the end
huge=()
if [ "${HUGE:-0}" = 1 ]; then
  mkdir -p /mnt/pegaflow-huge
  if mount -t tmpfs -o huge=always,size=70g pegaflow-huge /mnt/pegaflow-huge 2>>"$out/paths.log"; then
    huge=(--attach-huge-dir /mnt/pegaflow-huge --server-pool-dir /mnt/pegaflow-huge)
    trap 'umount /mnt/pegaflow-huge 2>/dev/null' EXIT
  fi
fi
"$site/pegaflow/_jre/bin/java" --enable-native-access=ALL-UNNAMED -XX:ErrorFile="$out/hs_err_paths.log" \
  -cp "$site/pegaflow/_jars/pegaflow.jar" io.pegaflow.bench.BenchMain paths --copy "${COPY:-cuda}" \
  --json "$out/server-h200.json" "${huge[@]}" "$@" 2>&1 | grep -v "sun.misc.Unsafe\|terminally deprecated\|consider reporting" | tee -a "$out/paths.log"
rc=${PIPESTATUS[0]}
# SHMEM_ADVISE=1: huge pages on the shared pool need the kernel's shmem policy at advise (or always); where
# this machine lets us, measure the attach settings under it too, then put the policy back.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [ "${COPY:-cuda}" = cuda ] && [ "${SHMEM_ADVISE:-0}" = 1 ] && [ -w "$thp" ]; then
  was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp")
  if echo advise > "$thp" 2>/dev/null; then
    echo "shmem_enabled: $was -> advise for the attach cases" | tee -a "$out/paths.log"
    "$site/pegaflow/_jre/bin/java" --enable-native-access=ALL-UNNAMED -cp "$site/pegaflow/_jars/pegaflow.jar" \
      io.pegaflow.bench.BenchMain paths --cases attach --json "$out/attach-shmem-advise.json" "$@" 2>&1 \
      | grep -v "sun.misc.Unsafe\|terminally deprecated\|consider reporting" | tee -a "$out/paths.log"
    echo "$was" > "$thp"
  fi
fi
rm -rf "$site"
exit $(( rc != 0 || ${e2e:-0} != 0 || ${junit:-0} != 0 ))
