"""The Prometheus configuration, alerting rules and their unit tests, via promtool."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.tools import DEPLOY, PROMETHEUS, ROOT, load_yaml, run, tool

pytestmark = pytest.mark.deploy

RULES = PROMETHEUS / "rules.yml"
RULES_TEST = PROMETHEUS / "rules_test.yml"


def alerts() -> list[dict[str, Any]]:
    groups = load_yaml(RULES)["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules() -> None:
    result = run([tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules() -> None:
    result = run([tool("promtool"), "test", "rules", RULES_TEST.name], cwd=PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_config() -> None:
    result = run([tool("promtool"), "check", "config", "prometheus.yml"], cwd=PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = [check for test in load_yaml(RULES_TEST)["tests"] for check in test["alert_rule_test"]]
    for alert in alerts():
        name = alert["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no firing case"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no quiet case"


def test_the_required_alerts_exist() -> None:
    exprs = {a["alert"]: a["expr"] for a in alerts()}
    stuck = exprs["MessageCommitterStuckIntents"]
    assert "message_committer_oldest_recoverable_age_seconds" in stuck and "> 300" in stuck
    assert next(a for a in alerts() if a["alert"] == "MessageCommitterStuckIntents")["for"] == "5m"
    assert "grpc_server_handled_total" in _resolved(exprs["MessageCommitterCommitErrors"])
    latency = _resolved(exprs["MessageCommitterCommitLatencyHigh"])
    assert "histogram_quantile(0.99" in latency and "grpc_server_handling_seconds_bucket" in latency
    assert "message_committer_recovery_runs_total" in exprs["MessageCommitterRecoveryNotRunning"]
    assert "absent(" in exprs["MessageCommitterRecoveryMetricAbsent"]
    assert "MessageCommitterNotReady" in exprs and "MessageCommitterDown" in exprs


def _resolved(expr: str) -> str:
    """``expr`` with recording-rule names replaced by their expressions."""
    records = {
        rule["record"]: rule["expr"]
        for group in load_yaml(RULES)["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    for name, body in records.items():
        expr = expr.replace(name, f"({body})")
    return expr


def test_every_alert_has_severity_summary_and_a_runbook_section() -> None:
    runbook = (ROOT / "docs" / "operating.md").read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in runbook.splitlines()
        if line.startswith("#")
    }
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        assert alert["annotations"]["summary"], name
        anchor = alert["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in headings, f"{name}: docs/operating.md has no section #{anchor}"


def test_scrape_targets_are_the_compose_services() -> None:
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "message-committer")
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    services = load_yaml(DEPLOY / "compose.yaml")["services"]
    for target in targets:
        host, _, port = target.partition(":")
        assert host in services, f"{target}: no such compose service"
        assert port == "9464"
    assert config["rule_files"] == ["rules.yml"]
