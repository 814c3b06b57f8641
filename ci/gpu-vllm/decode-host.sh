#!/usr/bin/env bash
# GPU machine, after ci/gpu-vllm/install.sh: pegaflow-bench ttft's decode beside the host's speed.
# Three samplers (python/pegaflow/bench/hostspeed.py) time a fixed Python loop every 0.2 s, each
# pinned to one of CPUs 13-15, while the benchmark runs on CPUs 0-11: every system of SYSTEMS
# (default none,server_instepa,embedded_instepa), ROUNDS rounds (default 2), 8K prompts, 48-token
# answers, at most TTFT_S seconds (default 400). Writes $1/decode-host.json, its log,
# $1/host-<cpu>.jsonl and $1/decode-host-summary.json (each request's decode spacing beside the
# host's loop time: hostspeed.py summarize).
set -u
out=${1:?usage: ci/gpu-vllm/decode-host.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=$PWD/python:/tmp/vllm-site JAVA_HOME=/tmp/ours-site/pegaflow/_jre PEGAFLOW_JAR=/tmp/ours-site/pegaflow/_jars/pegaflow.jar \
  VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
ttft_s=${TTFT_S:-400}
samplers=()
trap 'kill "${samplers[@]}" 2>/dev/null' EXIT
for c in 13 14 15; do
  taskset -c $c python3 python/pegaflow/bench/hostspeed.py sample "$out/host-$c.jsonl" $((ttft_s + 20)) &
  samplers+=($!)
done
taskset -c 0-11 timeout "$ttft_s" python3 -m pegaflow.cli ttft --lengths 8k --prompts 5 --pool-size 14gb \
  --timeout 110 --async-scheduling off --max-tokens 48 --pegaflow-site /tmp/pf-site --vllm-site /tmp/vllm-site \
  --systems "${SYSTEMS:-none,server_instepa,embedded_instepa}" --rounds "${ROUNDS:-2}" --json "$out/decode-host.json" \
  > "$out/decode-host.log" 2>&1
rc=$?
kill "${samplers[@]}" 2>/dev/null
wait
if [ -s "$out/decode-host.json" ]; then
  python3 -m pegaflow.bench.hostspeed summarize "$out/decode-host.json" "$out"/host-*.jsonl > "$out/decode-host-summary.json"
else
  echo "no report (the benchmark stopped after $ttft_s s?): $out/decode-host.partial.json has the summaries so far"
fi
echo "ttft rc=$rc"
exit $rc
