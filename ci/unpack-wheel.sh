#!/usr/bin/env bash
# Unpacks dist/pegaflow_jvm-*.whl (the product as users install it: its own Java runtime and
# jar) into a new temporary folder and prints that folder; the caller removes it. Used by the
# scripts that run on the GPU machine (gpu-paths.sh, gpu-ssd.sh).
set -euo pipefail
site=$(mktemp -d)
python3 -m zipfile -e dist/pegaflow_jvm-*.whl "$site"
# zipfile drops the modes: the launcher and the process spawn helper must be executable
chmod +x "$site"/pegaflow/_jre/bin/* "$site"/pegaflow/_jre/lib/jspawnhelper
echo "$site"
