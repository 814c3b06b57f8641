#!/usr/bin/env bash
# GPU machine, after ci/gpu-vllm/install.sh: the real-vLLM GPU tier from the built wheel
# (`pytest -m "e2e and gpu and vllm"`, python/tests/test_vllm_gpu.py), then `pegaflow-bench ttft`
# (TTFT=0 skips it; TTFT_ARGS adds its arguments). Writes $1/vllm-gpu-tier.log,
# $1/vllm-gpu-cases.jsonl, $1/vllm-gpu-ttft.json and $1/ttft.log. TIER=0 skips the tier;
# TIER_K selects its cases (pytest -k); SRC=1 runs this checkout's python/ instead of the wheel's.
set -uo pipefail
out=${1:-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/ours-site:/tmp/vllm-site
if [ "${SRC:-0}" = 1 ]; then
  # this checkout's Python over the wheel's runtime and jar (JAR= a jar carried beside it): a fix
  # tried without restaging the wheel; records are made from the wheel alone. The wheel's site
  # after python/: its package metadata holds the vLLM plugin entry point that registers the
  # connector (the checkout's package is the one imported)
  export PYTHONPATH=$PWD/python:/tmp/ours-site:/tmp/vllm-site JAVA_HOME=/tmp/ours-site/pegaflow/_jre
  export PEGAFLOW_JAR=${JAR:-/tmp/ours-site/pegaflow/_jars/pegaflow.jar}
fi
export VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
unset PYTHONHASHSEED
nvidia-smi -L
rc=0
if [ "${TIER:-1}" = 1 ]; then
  PEGAFLOW_VLLM_TIER_OUT=$out/tier python3 -m pytest -p no:cacheprovider -p no:faulthandler -m "e2e and gpu and vllm" \
    --rootdir python -c python/pyproject.toml python/tests/test_vllm_gpu.py -q -rA ${TIER_K:+-k "$TIER_K"} 2>&1 \
    | grep -v "^W1130\|sun.misc.Unsafe\|terminally deprecated\|consider reporting" | tee "$out/vllm-gpu-tier.log" | tail -40
  tier=${PIPESTATUS[0]}
  cp "$out/tier/cases.jsonl" "$out/vllm-gpu-cases.jsonl" 2>/dev/null
  rm -rf "$out/tier"
  echo "gpu vllm tier rc=$tier" | tee -a "$out/vllm-gpu-tier.log"
  rc=$(( rc || tier ))
fi
if [ "${TTFT:-1}" = 1 ]; then
  python3 -m pegaflow.cli ttft --json "$out/vllm-gpu-ttft.json" --pegaflow-site /tmp/pf-site \
    --vllm-site /tmp/vllm-site ${TTFT_ARGS:-} 2>&1 | tee "$out/ttft.log" | tail -60
  ttft=${PIPESTATUS[0]}
  echo "ttft rc=$ttft"
  rc=$(( rc || ttft ))
fi
exit $rc
