#!/usr/bin/env bash
# GPU machine, after ci/gpu-vllm/install.sh: pegaflow-bench ttft on the staged vLLM 0.26 with this
# checkout's python/ (docs/gpu.md, "A real vLLM on the H200"). Arguments after OUT_DIR go to
# `pegaflow-bench ttft` (--systems, --lengths, --rounds ...); the fixed ones are the thirteenth
# run's: 5 prompts a length, a 14 GB pool, asynchronous scheduling off, and 180 s per vLLM process
# (110 until the sixteenth run, whose first process on a fresh machine, the reference system
# none, took longer than that to start on cold caches and left the run without its GPU hit).
# NAME (default ttft) names $OUT/$NAME.json and its log; TTFT_S (default 540) bounds the run;
# PEGAFLOW_JAR picks another engine jar than the wheel's (a jar carried beside the tree). PROFILE=1: the ttft worker's
# torch.profiler traces (the longest length's cold, GPU-hit and warm requests, vLLM's step parts
# and the connector's hooks as ranges) in $OUT/prof-$NAME, summarized in $OUT/$NAME-profile.json.
set -u
out=${1:?usage: ci/gpu-vllm/ttft.sh OUT_DIR [pegaflow-bench ttft arguments]}
shift
name=${NAME:-ttft}
mkdir -p "$out"
export PYTHONPATH=$PWD/python:/tmp/vllm-site JAVA_HOME=/tmp/ours-site/pegaflow/_jre \
  PEGAFLOW_JAR=${PEGAFLOW_JAR:-/tmp/ours-site/pegaflow/_jars/pegaflow.jar} \
  VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
if [ "${PROFILE:-0}" = 1 ]; then
  export PEGAFLOW_TTFT_PROFILE=$out/prof-$name  # the ttft worker makes the folder
fi
timeout "${TTFT_S:-540}" python3 -m pegaflow.cli ttft --prompts 5 --pool-size 14gb --timeout 180 --async-scheduling off \
  --pegaflow-site /tmp/pf-site --vllm-site /tmp/vllm-site --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
rc=$?
if [ "${PROFILE:-0}" = 1 ] && ls "$out/prof-$name"/*.json.gz > /dev/null 2>&1; then
  python3 -m pegaflow.bench.profile_summary "$out/prof-$name"/*.json.gz > "$out/$name-profile.json"
fi
tail -25 "$out/$name.log"
echo "ttft rc=$rc"
exit $rc
