#!/usr/bin/env bash
# Unpack the PegaFlow 0.25.1 cp312 wheel without pip/network.
#   bash install.sh [DIR] [--with-deps]
# DIR defaults to ./site next to this script. --with-deps also unpacks the
# pure-python deps of the wheel's METADATA (httpx & co., only used by
# pegaflow.pd_connector) into DIR/_deps (add it to PYTHONPATH yourself if needed;
# kept separate so typing_extensions etc. never shadow the machine's torch deps).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-$HERE/site}"
PY="${PYTHON:-python3}"
WHL="$(ls "$HERE"/pegaflow_llm_cu13-0.25.1-cp312-cp312-manylinux_2_34_x86_64.whl)"
rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m zipfile -e "$WHL" "$DEST"
chmod +x "$DEST/pegaflow/pegaflow-server-py" "$DEST/pegaflow/pegaflow-metaserver-py"
if [[ "${2:-}" == "--with-deps" ]]; then
  mkdir -p "$DEST/_deps"
  for w in "$HERE"/deps/*.whl; do "$PY" -m zipfile -e "$w" "$DEST/_deps"; done
fi
echo "pegaflow unpacked into $DEST  (use: PYTHONPATH=$DEST)"
