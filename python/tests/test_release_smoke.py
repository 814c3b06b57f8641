"""The built wheel alone, in a fresh venv, outside the source tree, with no system JDK
visible (wheels/release_check.py; `make wheel` builds the wheel first)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.release_smoke

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_alone_serves_imports_and_round_trips(tmp_path):
    wheels = sorted((ROOT / "dist").glob("pegaflow_jvm-*-manylinux_2_17_x86_64.whl"))
    assert wheels, "no wheel in dist/: run `make wheel`"
    report = tmp_path / "release.json"
    proc = subprocess.run([sys.executable, str(ROOT / "wheels" / "release_check.py"), str(wheels[-1]),
                           "--json", str(report)], capture_output=True, text=True, timeout=600)
    r = json.loads(report.read_text())
    assert proc.returncode == 0 and r["passed"], proc.stdout[-4000:] + proc.stderr[-2000:]
    assert r["java_source"] == "the runtime in the wheel" and r["java_inside_venv"] and r["jar_inside_venv"]
    assert r["system_jdks_hidden"] in ("tmpfs", "absent"), "could not hide the system JDKs here"
    assert r["server_help_rc"] == 0 and r["health_status"] == 200 and r["health"]["status"] == "serving"
    assert r["connector_import"] == "0.26-0.33"
    assert r["round_trip_hit_blocks"] == 3 and r["round_trip_bytes_equal"]
