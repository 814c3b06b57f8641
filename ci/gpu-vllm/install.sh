#!/usr/bin/env bash
# GPU machine: joins what ci/gpu-vllm/stage.sh's calls left in /tmp/stage and installs it under
# /tmp (kept while the machine stays warm): /tmp/vllm-site (vLLM 0.26 and the dependencies the
# image lacks), /tmp/pf-site (the original PegaFlow's wheel), /tmp/ours-site (this project's
# wheel, unpacked as ci/unpack-wheel.sh does). Prints what it installed.
set -euo pipefail
s=/tmp/stage
cd "$s"
if ls bundle.part-* > /dev/null 2>&1; then  # stage.sh bundle's parts: one tar, joined in name order
  cat bundle.part-* | tar -xf -
  rm -f bundle.part-*
fi
whl=$(awk '{print $2}' vllm.sha256)
cat vllm.whl.part-* > "$whl"
sha256sum -c vllm.sha256
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$@"; }
rm -rf /tmp/vllm-site /tmp/pf-site /tmp/ours-site
pipi --target /tmp/vllm-site "$whl" deps/*.whl
pipi --target /tmp/pf-site pegaflow_llm_cu13-*.whl
pipi --target /tmp/ours-site pegaflow_jvm-*.whl  # with its console scripts in /tmp/ours-site/bin
chmod +x /tmp/ours-site/pegaflow/_jre/bin/* /tmp/ours-site/pegaflow/_jre/lib/jspawnhelper
PYTHONPATH=/tmp/vllm-site python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "installed: $(ls /tmp/vllm-site | wc -l) entries in /tmp/vllm-site; PegaFlow in /tmp/pf-site; ours in /tmp/ours-site"
