#!/usr/bin/env bash
# GPU machine, after ci/gpu-vllm/install.sh: the README's GPU quick start as written, on a model
# of Llama-3.1-8B's shape with random weights (the machine has no weights: --load-format dummy,
# --skip-tokenizer-init and a prompt of token ids are the only additions). The second request
# is answered from the store (vLLM's own prefix cache is off, so only the store can serve it).
set -uo pipefail
export PATH=/tmp/ours-site/bin:/tmp/vllm-site/bin:$PATH PYTHONPATH=/tmp/ours-site:/tmp/vllm-site
export VLLM_USE_FLASHINFER_SAMPLER=0
MODEL=$(python3 -m pegaflow.models.shapes llama-3.1-8b /tmp/llama-3.1-8b-shape)
# --- the README's lines ---
pegaflow-server --pool-size 16gb &
vllm serve $MODEL --load-format dummy --skip-tokenizer-init --no-enable-prefix-caching --port 8000 \
  --kv-transfer-config '{"kv_connector":"PegaKVConnector","kv_role":"kv_both","kv_load_failure_policy":"recompute","kv_connector_extra_config":{"mode":"server"}}' \
  > /tmp/quickstart-vllm.log 2>&1 &
until curl -sf localhost:8000/health > /dev/null; do sleep 2; done
P=$(python3 -c "import random; r=random.Random(1); print([r.randrange(1000, 128000) for _ in range(4096)])")
for i in 1 2; do
  curl -s -w ' %{time_total}s\n' localhost:8000/v1/completions -H 'Content-Type: application/json' \
    -d "{\"model\":\"$MODEL\",\"prompt\":$P,\"max_tokens\":1,\"temperature\":0}" | cut -c1-200
done
curl -s localhost:8000/metrics | grep -E '^vllm:pegaflow_(hit_tokens|loaded_blocks)_total'
# ---
kill %2 %1; wait
