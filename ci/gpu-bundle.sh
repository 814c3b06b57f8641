#!/usr/bin/env bash
# Builds .gpu/: what the GPU machine needs to run the GPU test tier and the transfer bench,
# which has no JDK, no Maven and no network there: a jlink'd runtime, the engine's classes
# and test classes, the JUnit console launcher and the test libraries, and a slim jar
# (engine, connector brain, store link, in-process bridge, bench CLI, picocli; no server, gRPC or JMH:
# embedded mode only) that ci/gpu-run.sh points PEGAFLOW_JAR at. Everything travels as one folder: carry [".gpu"] (under 64 MiB).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
: "${JAVA_HOME:=$(ci/find-jdk.sh)}"
export JAVA_HOME
./mvnw -q -B package -DskipTests
rm -rf .gpu && mkdir -p .gpu/lib
cp -r jvm-engine/target/classes .gpu/classes
cp -r jvm-engine/target/test-classes .gpu/test-classes
./mvnw -q -B -pl jvm-engine dependency:copy-dependencies -DincludeScope=test -DoutputDirectory="$root/.gpu/lib" \
  -DexcludeGroupIds=org.junit.jupiter,org.junit.platform,org.opentest4j,org.apiguardian,net.bytebuddy
./mvnw -q -B dependency:copy -Dartifact=org.junit.platform:junit-platform-console-standalone:1.14.4 \
  -DoutputDirectory="$root/.gpu/lib"
modules=java.base,java.logging,java.management,java.instrument,jdk.unsupported
"$JAVA_HOME/bin/jlink" --add-modules "$modules" --strip-java-debug-attributes --strip-native-debug-symbols=objcopy=/usr/bin/objcopy --no-man-pages --no-header-files \
  --compress=zip-9 --output .gpu/jre
slim=$(mktemp -d)
cp -r jvm-engine/target/classes/. "$slim/"
cp -r connector/target/classes/. "$slim/"
cp -r client/target/classes/. "$slim/"  # the store link; its gRPC client is not used in embedded mode
cp -r bridge/target/classes/. "$slim/"
cp -r bench/target/classes/. "$slim/"
(cd "$slim" && "$JAVA_HOME/bin/jar" xf "$(find ~/.m2/repository/info/picocli/picocli -name 'picocli-*.jar' | head -1)")
rm -rf "$slim/META-INF/MANIFEST.MF" "$slim"/io/pegaflow/bench/jmh "$slim"/io/pegaflow/bench/JmhCommand*.class "$slim"/io/pegaflow/bench/RpcCommand*.class
"$JAVA_HOME/bin/jar" cfe .gpu/pegaflow-gpu.jar io.pegaflow.bench.GpuBenchMain -C "$slim" .
rm -rf "$slim"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
echo "modules: $modules"
du -sh .gpu .gpu/jre .gpu/pegaflow-gpu.jar
