#!/usr/bin/env bash
# .native/: the JDK's JNI headers (jni.h, jni_md.h) that bridge/cuda/native_kv.cu includes
# through pegaflow_boot.h; the GPU machine has no JDK. Carried with dist/ (ci/gpu-native.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
: "${JAVA_HOME:=$(ci/find-jdk.sh)}"
rm -rf .native && mkdir -p .native/include/linux
cp "$JAVA_HOME/include/jni.h" .native/include/
cp "$JAVA_HOME/include/linux/jni_md.h" .native/include/linux/
grep -qx '/.native/' .git/info/exclude 2>/dev/null || echo '/.native/' >> .git/info/exclude
du -sh .native
