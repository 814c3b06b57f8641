#!/usr/bin/env bash
# Build machine: prepares what staging vLLM 0.26 onto the GPU machine carries, one folder per
# call to that machine (docs/gpu.md, "Real vLLM on the H200"). The GPU machine has no network
# and its own PyTorch 2.11 (cu130); vLLM 0.26 is the newest release pinning that torch.
#
#   ci/gpu-vllm/stage.sh prepare        downloads, the vLLM wheel less FA2, its parts (.stage/c2 ..)
#   ci/gpu-vllm/stage.sh select FREEZE  the dependencies the GPU image lacks (FREEZE: `pip list
#                                       --format=freeze` there, printed by call 1) into .stage/c5
#   ci/gpu-vllm/stage.sh bundle         all of the above (c1, c1b, the slim vLLM wheel, c5 and c6) as
#                                       one tar in parts of 46 MiB, .stage/b1 .. b6: six calls
#                                       instead of eight (install.sh unpacks them)
#
# What each call carries (name it in `carry`; every part stays under 58 MiB, the working tree
# travels beside it):
#   c1: this project's wheel (dist/); the call prints the image's package list
#   c1b: the original PegaFlow's wheel and the vLLM wheel's sha256 (apart since 2026-12-05: with
#       the working tree beside them the two wheels together passed the 64 MiB a call carries)
#   c2-c4: the vLLM wheel in three parts (split -b 57M)
#   c5 (and c6 when they pass 55 MiB): the dependencies vLLM 0.26 names that the image lacks or
#       has at a version vLLM refuses
# Then ci/gpu-vllm/install.sh joins and installs them under /tmp (kept while the machine is warm).
#
# Left out of the vLLM wheel: vllm_flash_attn/_vllm_fa2_C.abi3.so (123 MiB compressed). vLLM
# picks FlashAttention 3 on Hopper (v1/attention/backends/fa_utils.py: get_flash_attn_version)
# and falls back to FA2 only for ALiBi models, which nothing here runs; without it the wheel is
# three parts instead of five. The torch family, CUDA libraries and the GPU-kernel packages
# (flashinfer, tilelang, cutlass-dsl, deep-gemm kernels) are not shipped: the image has torch
# 2.11 and its CUDA libraries, and vLLM runs without the others (VLLM_USE_FLASHINFER_SAMPLER=0).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
stage=.stage
dl=$stage/dl
VLLM=0.26.0
PEGAFLOW=0.25.1
PART=57M
pip_dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux1_x86_64 "$@"; }

case "${1:-}" in
prepare)
  mkdir -p "$dl/deps" "$stage"/c1 "$stage"/c1b "$stage"/c2 "$stage"/c3 "$stage"/c4 "$stage"/c5
  ls dist/pegaflow_jvm-*.whl > /dev/null || { echo "stage.sh: run make wheel first" >&2; exit 1; }
  [ -f "$dl/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl" ] || pip_dl -d "$dl" "vllm==$VLLM"
  [ -n "$(ls "$dl"/pegaflow_llm_cu13-$PEGAFLOW-cp312-*.whl 2>/dev/null)" ] || pip_dl -d "$dl" "pegaflow-llm-cu13==$PEGAFLOW"
  slim=$stage/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl
  if [ ! -f "$slim" ]; then
    python3 - "$dl/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl" "$slim" <<'PY'
import sys, zipfile
src, dst = sys.argv[1:]
drop = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zo:
    for info in zi.infolist():
        if info.filename == drop:
            continue
        data = zi.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l for l in data.splitlines(keepends=True) if not l.startswith(drop.encode() + b","))
        zo.writestr(info, data)
PY
  fi
  # vLLM's own requirements, less what the image brings or vLLM runs without; resolved for 3.12
  python3 - "$dl/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl" > "$stage/requires.txt" <<'PY'
import re, sys, zipfile
skip = re.compile(r"^(torch|torchaudio|torchvision|torchcodec|PyNvVideoCodec|flashinfer-python|tilelang|"
                  r"nvidia-cudnn-frontend|nvtx|fastsafetensors|nvidia-cutlass-dsl|quack-kernels|tokenspeed-mla|"
                  r"humming-kernels|numba)\b", re.I)
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist: ") and "extra ==" not in line:
        req = line[len("Requires-Dist: "):]
        if not skip.match(req):
            print(req)
PY
  UV=$(ci/ensure-uv.sh)
  echo "torch==2.11.0" > "$stage/overrides.txt"
  "$UV" pip compile -q "$stage/requires.txt" --override "$stage/overrides.txt" --python-version 3.12 \
    --python-platform x86_64-manylinux_2_28 --no-header --no-annotate -o "$stage/closure.txt"
  grep -viE '^(torch|triton|nvidia-|cuda-)' "$stage/closure.txt" > "$stage/ship.txt"
  pip_dl -d "$dl/deps" -r "$stage/ship.txt"
  rm -f "$stage"/c1/* "$stage"/c1b/* "$stage"/c2/* "$stage"/c3/* "$stage"/c4/*
  cp dist/pegaflow_jvm-*.whl "$stage/c1/"
  cp "$dl"/pegaflow_llm_cu13-$PEGAFLOW-cp312-*.whl "$stage/c1b/"
  (cd "$stage" && sha256sum "$(basename "$slim")" > c1b/vllm.sha256)
  split -b $PART -d -a 2 "$slim" "$stage/vllm.whl.part-"
  i=2
  for p in "$stage"/vllm.whl.part-*; do mv "$p" "$stage/c$i/"; i=$((i + 1)); done
  [ $i -le 5 ] || { echo "stage.sh: the vLLM wheel took more than three parts" >&2; exit 1; }
  du -sh "$stage"/c*
  ;;
select)
  freeze=${2:?usage: stage.sh select FREEZE}
  rm -rf "$stage"/c5/* "$stage"/c6
  python3 - "$freeze" "$stage/requires.txt" "$stage/ship.txt" "$dl/deps" "$stage/c5" <<'PY'
import re, shutil, sys
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
freeze, requires, ship, deps, out = sys.argv[1:]
have = {}
for line in Path(freeze).read_text().splitlines():
    if "==" in line:
        name, version = line.strip().split("==", 1)
        have[canonicalize_name(name)] = version
direct = {}
for line in Path(requires).read_text().splitlines():
    r = Requirement(line)
    if r.marker is None or r.marker.evaluate({"python_version": "3.12", "platform_machine": "x86_64",
                                              "platform_system": "Linux", "sys_platform": "linux"}):
        direct[canonicalize_name(r.name)] = r.specifier
wheels = {canonicalize_name(re.split(r"-\d", p.name, 1)[0]): p for p in Path(deps).glob("*.whl")}
chosen, kept = [], []
for line in Path(ship).read_text().splitlines():
    name = canonicalize_name(line.split("==")[0])
    if name in have and (name not in direct or Version(have[name]) in direct[name]):
        kept.append(f"{name}=={have[name]}")
        continue
    chosen.append(wheels[name])
budget, used, part = 55 << 20, 0, Path(out)
for w in sorted(chosen, key=lambda w: -w.stat().st_size):
    if used + w.stat().st_size > budget and part.name == "c5":
        part, used = part.with_name("c6"), 0  # a second call carries the rest
        part.mkdir(exist_ok=True)
    shutil.copy(w, part)
    used += w.stat().st_size
print(f"shipping {len(chosen)} wheels, {sum(w.stat().st_size for w in chosen) / 2**20:.1f} MiB; "
      f"the image's own {len(kept)}", file=sys.stderr)
PY
  du -sh "$stage"/c5 "$stage"/c6 2>/dev/null || true  # c6 exists only when needed
  ;;
bundle)
  # Each call to the GPU machine carries at most 64 MiB with the working tree (~14 MiB) beside
  # it, and costs device time to start: the eight parts above, cut where the files end, need
  # eight calls; one tar of them, cut every 46 MiB, needs six.
  slim=$stage/vllm-$VLLM-cp38-abi3-manylinux_2_28_x86_64.whl
  for f in "$slim" "$stage"/c1/pegaflow_jvm-*.whl "$stage"/c1b/vllm.sha256; do
    [ -f "$f" ] || { echo "stage.sh: $f is missing; run prepare and select first" >&2; exit 1; }
  done
  [ -n "$(ls "$stage"/c5/*.whl 2>/dev/null)" ] || { echo "stage.sh: .stage/c5 is empty; run select first" >&2; exit 1; }
  rm -rf "$stage"/b[0-9]* "$stage/tar"
  mkdir -p "$stage/tar/deps"
  cp "$stage"/c1/* "$stage"/c1b/* "$stage/tar/"
  ln -s "$(cd "$(dirname "$slim")" && pwd)/$(basename "$slim")" "$stage/tar/vllm.whl.part-00"  # the wheel whole
  cp "$stage"/c5/* "$stage/tar/deps/"
  if [ -d "$stage/c6" ]; then cp "$stage"/c6/* "$stage/tar/deps/"; fi
  tar -chf - -C "$stage/tar" . | split -b 46M -a 1 - "$stage/bundle.part-"
  rm -rf "$stage/tar"
  i=1
  for p in "$stage"/bundle.part-*; do mkdir -p "$stage/b$i"; mv "$p" "$stage/b$i/"; i=$((i + 1)); done
  du -sh "$stage"/b[0-9]*
  ;;
*) echo "usage: ci/gpu-vllm/stage.sh prepare | select FREEZE | bundle" >&2; exit 2 ;;
esac
