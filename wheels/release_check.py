#!/usr/bin/env python3
"""Install a built pegaflow-jvm wheel into a fresh venv and prove it works alone.

    python3 wheels/release_check.py dist/pegaflow_jvm-*.whl [--json out.json] [--cold-cache]

From a directory outside the source tree, with ``JAVA_HOME``, ``PEGAFLOW_*`` and
``PYTHONPATH`` removed and, where the kernel lets this process make a mount namespace
(``unshare -m``), ``/usr/lib/jvm`` hidden under an empty tmpfs, it runs: ``pegaflow-server
--help``; a server started and its ``/health``; ``import pegaflow.connector``; a
save/query/load round trip through ``PegaEngine`` with the bytes checked; and which Java
runtime was used. Prints (and writes) JSON with the wheel's size, the install time and the
cold start times. Exit status 0 only if every check passed. Used by the ``release_smoke``
pytest tier and to measure the wheel for docs/wheel.md. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs inside the fresh venv, from outside the source tree.
CHECKS = r'''
import ctypes, json, os, subprocess, sys, time, urllib.request
from pathlib import Path
out = {}
t0 = time.perf_counter()
from pegaflow._java import find_java, find_jar
rt = find_java()
out["java_home"], out["java_source"], out["java_version"] = str(rt.home), rt.source, rt.version
out["jar"] = str(find_jar())
help_ = subprocess.run([str(Path(sys.executable).parent / "pegaflow-server"), "--help"], capture_output=True, text=True)
out["server_help_rc"] = help_.returncode
out["server_help_ok"] = "--pool-size" in help_.stdout + help_.stderr
from pegaflow._server import start_server
server = start_server(Path(sys.argv[1]) / "pool", pool_size="32mb")
out["server_start_s"] = round(server.start_seconds, 3)
status, body = server.http("/health")
out["health_status"] = status
out["health"] = json.loads(body)
server.stop()
out["server_exit"] = server.proc.returncode
import pegaflow.connector
out["connector_import"] = pegaflow.connector.SUPPORTED_VLLM
from pegaflow import _bridge
t1 = time.perf_counter()
_bridge.api()
out["bridge_start_s"] = round(time.perf_counter() - t1, 3)
from pegaflow.engine import LayerRegion, PegaEngine
seg, blocks = 4096, 8
buf = ctypes.create_string_buffer(seg * blocks)
for b in range(blocks):
    ctypes.memset(ctypes.addressof(buf) + b * seg, 0x40 + b, seg)
region = LayerRegion("layer.0", "combined", ctypes.addressof(buf), seg * blocks, blocks, seg, seg)
with PegaEngine(pool_size="4mb") as engine:
    engine.register_instance("smoke", "ns", 1, 1)
    engine.register_worker("smoke", 0, 0, [region])
    hashes = [bytes([i]) * 32 for i in range(3)]
    engine.save("smoke", 0, [0, 1, 2], hashes).wait(10)
    q = engine.query("smoke", hashes)
    engine.load("smoke", 0, q.lease, [5, 6, 7]).wait(10)
    raw = buf.raw
    out["round_trip_hit_blocks"] = q.hit_blocks
    out["round_trip_bytes_equal"] = all(raw[(5 + i) * seg:(6 + i) * seg] == raw[i * seg:(i + 1) * seg] for i in range(3))
out["checks_s"] = round(time.perf_counter() - t0, 3)
print("CHECKS " + json.dumps(out))
'''


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    return subprocess.run([str(ROOT / "ci" / "ensure-uv.sh")], check=True, capture_output=True, text=True).stdout.strip()


def _hide_system_jdks() -> str:
    """How the checks hide /usr/lib/jvm: "tmpfs" (a mount namespace over it), "absent"
    (nothing to hide), or "not permitted" (no mount namespace here: the checks still require
    the runtime inside the venv)."""
    if not Path("/usr/lib/jvm").is_dir():
        return "absent"
    if shutil.which("unshare") is None:
        return "not permitted"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /usr/lib/jvm"], capture_output=True)
    return "tmpfs" if probe.returncode == 0 else "not permitted"


def check(wheel: Path, cold_cache: bool) -> dict:
    uv = _uv()
    report: dict = {"wheel": wheel.name, "wheel_bytes": wheel.stat().st_size}
    with tempfile.TemporaryDirectory(prefix="pegaflow-release-") as tmp:
        tmp_path = Path(tmp)
        venv = tmp_path / "venv"
        env = {k: v for k, v in os.environ.items()
               if k not in ("JAVA_HOME", "PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PEGAFLOW_")}
        if cold_cache:
            env["UV_CACHE_DIR"] = str(tmp_path / "uv-cache")
        subprocess.run([uv, "venv", "--quiet", "--python", "python3", str(venv)], check=True, env=env)
        t0 = time.perf_counter()
        subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)],
                       check=True, env=env, cwd=tmp)
        report["install_s"] = round(time.perf_counter() - t0, 3)
        report["installed_bytes"] = sum(f.stat().st_size for f in (venv / "lib").rglob("*") if f.is_file())
        env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
        env["HOME"] = str(tmp_path / "home")  # a cold ~/.cache/pegaflow: no JVM AOT cache yet
        env["XDG_CACHE_HOME"] = str(tmp_path / "home" / ".cache")
        run_dir = tmp_path / "elsewhere"
        run_dir.mkdir()
        (run_dir / "checks.py").write_text(CHECKS)
        cmd = [str(venv / "bin" / "python"), str(run_dir / "checks.py"), str(run_dir)]
        hidden = _hide_system_jdks()
        if hidden == "tmpfs":
            # a mount namespace where /usr/lib/jvm (every system JDK here) is an empty tmpfs
            quoted = " ".join(f"'{c}'" for c in cmd)
            cmd = ["unshare", "-m", "sh", "-c", f"mount -t tmpfs none /usr/lib/jvm && exec {quoted}"]
        report["system_jdks_hidden"] = hidden
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=run_dir, timeout=600)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("CHECKS ")]
        if proc.returncode != 0 or not lines:
            report["error"] = (proc.stdout[-4000:] + proc.stderr[-4000:]).strip()
            return report
        checks = json.loads(lines[0][len("CHECKS "):])
        report.update(checks)
        report["java_inside_venv"] = checks["java_home"].startswith(str(venv))
        report["jar_inside_venv"] = checks["jar"].startswith(str(venv))
    return report


def passed(r: dict) -> bool:
    return ("error" not in r and r["server_help_rc"] == 0 and r["server_help_ok"] and r["health_status"] == 200
            and r["round_trip_hit_blocks"] == 3 and r["round_trip_bytes_equal"] and r["jar_inside_venv"]
            and r["java_inside_venv"])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheel", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--cold-cache", action="store_true", help="install with an empty uv cache (downloads count)")
    args = p.parse_args(argv)
    report = check(args.wheel.resolve(), args.cold_cache)
    report["passed"] = passed(report)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
