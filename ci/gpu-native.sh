#!/usr/bin/env bash
# On the GPU machine, from the repository root (issue 8/8, docs/embedding.md), with the wheel
# and the JDK's JNI headers carried (`make wheel`, ci/native-bundle.sh: carry ["dist", ".native"]):
# builds bridge/cuda/native_kv.cu with nvcc, starts pegaflow-server from the wheel's runtime,
# runs the native engine (save / flush / query / load on a page-first GPU cache, bits checked,
# timed), then the vLLM connector's worker path in a second process (python -m
# pegaflow.bench.native_peer), which loads the native engine's blocks by the same vLLM hashes
# and saves a prompt of the same size. Writes $1/native.json, $1/native-peer.json, $1/native.log.
set -uo pipefail
out=${1:-out}
blocks=${BLOCKS:-2048}
mkdir -p "$out"
site=$(ci/unpack-wheel.sh) || exit 1
jre=$site/pegaflow/_jre
jar=$site/pegaflow/_jars/pegaflow.jar
log=$out/native.log
nvcc --version | tail -1 | tee "$log"
nvcc -O2 -std=c++17 -I.native/include -I.native/include/linux -Ibridge/include bridge/cuda/native_kv.cu -ldl \
  -o "$out/native_kv" 2>&1 | tee -a "$log" || exit 1
pool=/dev/shm/pegaflow-native.pool
"$jre/bin/java" --enable-native-access=ALL-UNNAMED -Xms64m -Xmx2g -XX:+UseSerialGC -cp "$jar" \
  io.pegaflow.server.ServerMain --addr 127.0.0.1:50655 --http-addr 127.0.0.1:0 --pool-size "${POOL:-44gb}" \
  --pool-path "$pool" > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 600); do grep -q "ready grpc" "$out/server.log" && break; sleep 0.1; done
grep "ready grpc" "$out/server.log" | tee -a "$log" || { cat "$out/server.log"; kill $server; exit 1; }
PEGAFLOW_JAVA_HOME=$jre "$out/native_kv" "$jar" 127.0.0.1:50655 "$blocks" 3 > "$out/native.out" 2>&1
native=$?
cat "$out/native.out" | tee -a "$log"
tail -1 "$out/native.out" > "$out/native.json"
PEGAFLOW_JAVA_HOME=$jre JAVA_HOME=$jre PEGAFLOW_JAR=$jar PYTHONPATH=python \
  python3 -m pegaflow.bench.native_peer --endpoint 127.0.0.1:50655 --blocks "$blocks" --json "$out/native-peer.json" \
  2>&1 | grep -v "^W1[12]" | tee -a "$log"
peer=${PIPESTATUS[0]}
kill $server; wait $server 2>/dev/null
rm -rf "$site"
echo "native rc=$native, connector peer rc=$peer" | tee -a "$log"
[ "$native" = 0 ] && [ "$peer" = 0 ]
