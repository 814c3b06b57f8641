#!/usr/bin/env bash
# GPU machine: `pegaflow-bench overlap` (an in-step load beside a stand-in forward, no vLLM) from
# this project's wheel, carried in .stage/c1 (ci/gpu-vllm/stage.sh prepare), over this checkout's
# python/: the default layer split and its variants, each in its own process. Writes $1/overlap-*.json.
set -uo pipefail
out=${1:-out}
mkdir -p "$out" /tmp/stage
[ -d /tmp/ours-site/pegaflow ] || { cp .stage/c1/pegaflow_jvm-*.whl /tmp/stage/ && python3 -m pip install -q --no-index \
  --no-deps --no-compile --target /tmp/ours-site /tmp/stage/pegaflow_jvm-*.whl && chmod +x /tmp/ours-site/pegaflow/_jre/bin/* \
  /tmp/ours-site/pegaflow/_jre/lib/jspawnhelper; } || exit 1
export PYTHONPATH=$PWD/python JAVA_HOME=/tmp/ours-site/pegaflow/_jre PEGAFLOW_JAR=/tmp/ours-site/pegaflow/_jars/pegaflow.jar
export PYTHONUNBUFFERED=1
rc=0
run() {  # NAME TOKENS [ENV=VALUE ...]
  local name=$1 tokens=$2; shift 2
  echo "overlap $name ($tokens tokens) $*"
  env "$@" python3 -m pegaflow.cli overlap --tokens "$tokens" ${OVERLAP_ARGS:-} --json "$out/overlap-$name.json" 2>&1 | tail -3
  rc=$(( rc || PIPESTATUS[0] ))
}
run per-layer-16k 16384
OVERLAP_ARGS="--side-stream ${OVERLAP_ARGS:-}" run side-stream-16k 16384
OVERLAP_ARGS="--kernels-per-layer 10 ${OVERLAP_ARGS:-}" run few-kernels-16k 16384
run per-layer-8k 8192
run grouped-16k 16384 PEGAFLOW_CUDA_LAYER_GROUP_KIB=256
exit $rc
