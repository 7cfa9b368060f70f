"""The Grafana dashboard: valid JSON, a well-formed grid, and the panels asked for."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.deploy.tools import DEPLOY

pytestmark = pytest.mark.deploy

DASHBOARD = DEPLOY / "grafana" / "message-committer.json"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def exprs(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    return {
        p["title"]: [t["expr"] for t in p.get("targets", [])]
        for p in dashboard["panels"]
        if p["type"] != "row"
    }


def test_panel_ids_are_unique_and_every_target_uses_the_datasource_variable(
    dashboard: dict[str, Any],
) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "message-committer"
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= names
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["refId"]
            assert 'job="$job"' in target["expr"]


def test_panels_fit_the_24_column_grid(dashboard: dict[str, Any]) -> None:
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]


def test_the_panels_asked_for(dashboard: dict[str, Any]) -> None:
    by_title = exprs(dashboard)
    joined = {title: " ".join(e) for title, e in by_title.items()}
    assert "by (outcome)" in joined["Commit rate by outcome"]
    latency = by_title["Commit latency p50 / p99"]
    assert any("histogram_quantile(0.50" in e for e in latency)
    assert any("histogram_quantile(0.99" in e for e in latency)
    assert "by (grpc_code)" in joined["Commit errors by code"]
    assert "oldest_recoverable_age_seconds" in joined["Oldest recoverable intent age"]
    assert "backend_operation_seconds_bucket" in joined["Backend operation latency p99"]
    per_commit = joined["Backend requests per commit"]
    assert "message_committer_backend_requests_total" in per_commit
    assert "message_committer_commits_total" in per_commit
