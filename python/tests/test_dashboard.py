"""The Grafana dashboard (ops/grafana/pegaflow-dashboard.json) against a live pegaflow-server:
every series a panel asks for is one the server's /metrics serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pegaflow._server import start_server

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "pegaflow-dashboard.json"
# a metric name in a PromQL expression: a word before '{', '[' or ')' that is not a function or label
METRIC = re.compile(r"\b((?:pegaflow|process|jvm)_[a-z0-9_]+)\b")


def exprs(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def test_the_dashboard_is_well_formed():
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) >= 10, "panel ids are unique"
    for p in d["panels"]:
        assert p["title"] and p["targets"], p
        assert p["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "job"}


def test_every_panel_series_is_served_by_a_live_server(tmp_path):
    d = json.loads(DASHBOARD.read_text())
    s = start_server(tmp_path / "pool", pool_size="16mb")
    try:
        status, text = s.http("/metrics")
    finally:
        s.stop()
    assert status == 200
    served = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    missing = {}
    for title, expr in exprs(d):
        names = METRIC.findall(expr)
        assert names, f"panel '{title}' reads no series: {expr}"
        for name in names:
            if name not in served:
                missing.setdefault(title, []).append(name)
    assert not missing, f"series the dashboard asks for that /metrics does not serve: {missing}"
