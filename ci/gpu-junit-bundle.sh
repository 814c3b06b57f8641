#!/usr/bin/env bash
# Builds .gpu-tests/ (~5 MB): the engine's test classes, AssertJ and the JUnit console
# launcher, so the GPU machine runs the GPU test tier (JUnit tag gpu) on the wheel's own
# runtime and jar next to ci/gpu-paths.sh in one call (carry ["dist", ".gpu-tests"], run
# with JUNIT=1). After `make wheel`: the test classes must be of the same commit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
: "${JAVA_HOME:=$(ci/find-jdk.sh)}"
export JAVA_HOME
./mvnw -q -B -pl jvm-engine test-compile
rm -rf .gpu-tests && mkdir -p .gpu-tests/lib
cp -r jvm-engine/target/test-classes .gpu-tests/test-classes
./mvnw -q -B dependency:copy -Dartifact=org.junit.platform:junit-platform-console-standalone:1.14.4 \
  -DoutputDirectory="$root/.gpu-tests/lib"
./mvnw -q -B dependency:copy -Dartifact=org.assertj:assertj-core:3.27.7 -DoutputDirectory="$root/.gpu-tests/lib"
mkdir -p .git/info
grep -qx '/.gpu-tests/' .git/info/exclude 2>/dev/null || echo '/.gpu-tests/' >> .git/info/exclude
du -sh .gpu-tests
