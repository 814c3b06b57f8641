#!/usr/bin/env bash
# On the GPU machine (or any machine), from the repository root, with the built wheel carried
# (`make wheel`, carry ["dist"]): unpacks the wheel and runs `pegaflow-bench ssd` on the local
# disk under the repository (the tier against raw direct I/O on the same file system, and the
# 2,048-block prefix read back). Writes $1/ssd.json, $1/ssd-threads.json (more I/O threads)
# and $1/ssd.log. Extra arguments go to both runs.
set -uo pipefail
out=${1:-out}
shift || true
mkdir -p "$out"
site=$(ci/unpack-wheel.sh) || exit 1
path=${SSD_PATH:-$PWD/out/ssd-bench}
mkdir -p "$path"
{
  echo "host: $(nproc) cpus, $(free -g | awk '/Mem:/ {print $2}') GiB"
  df -hT "$path" | tail -1
  lsblk -d -o NAME,ROTA,SIZE,MODEL 2>/dev/null
} 2>&1 | tee "$out/ssd.log"
java() {
  "$site/pegaflow/_jre/bin/java" --enable-native-access=ALL-UNNAMED -Xmx8g -cp "$site/pegaflow/_jars/pegaflow.jar" \
    io.pegaflow.bench.BenchMain "$@" 2>&1 | grep -v "^INFO\|^[A-Z][a-z][a-z] [0-9]" | tee -a "$out/ssd.log"
  return "${PIPESTATUS[0]}"
}
java ssd --path "$path" --json "$out/ssd.json" "$@"
rc=$?
java ssd --path "$path" --write-threads 4 --read-threads 8 --json "$out/ssd-threads.json" "$@"
rc2=$?
rm -rf "$site" "$path"
exit $(( rc != 0 || rc2 != 0 ))
