"""A live scrape: the real ``message-committer serve`` process (memory backend),
a real Commit through the real CLI client, then /metrics linted by
``promtool check metrics`` and matched against every series that the alert
rules and the dashboard use. Also runs the image's HEALTHCHECK command and
checks that SIGTERM drains and exits 0 (what the exec-form ENTRYPOINT relies on).
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_dockerfile import healthcheck_command
from tests.deploy.tools import DEPLOY, PROMETHEUS, load_yaml, run, tool
from tests.e2e.process import ServeProcess, run_cli
from toolkit.ports import free_port

pytestmark = pytest.mark.deploy

COMMITTER_SERVICE = "message_committer.v1.MessageCommitterService"
SCRAPE_TIMEOUT_S = 10
# A metric name in PromQL: not preceded by ":" (recording-rule names such as
# job:message_committer_commit_rpcs:rate5m are not exported series).
_SERIES = re.compile(r"(?<![:\w])((?:message_committer|grpc_server)_[a-z_]+)")


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    process = ServeProcess()
    try:
        yield process
    finally:
        process.close()


@pytest.fixture(scope="module")
def scrape(server: ServeProcess) -> str:
    """/metrics after one committed message and one rejected send."""
    common = ["--target", server.target, "--tenant", "t1", "--conversation", "c1"]
    created = run_cli(["conversation", "create", *common, "--member", "alice", "--member", "bob"])
    assert created.returncode == 0, created.stderr
    sent = run_cli(["send", *common, "--sender", "alice", "--device", "phone", "--text", "hi"])
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith("committed"), sent.stdout
    refused = run_cli(["send", *common, "--sender", "mallory", "--device", "pc", "--text", "x"])
    assert refused.returncode == 1, refused.stdout + refused.stderr
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=SCRAPE_TIMEOUT_S) as response:
        body: bytes = response.read()
    return body.decode()


def exported(scrape: str) -> set[str]:
    """Every series name the scrape exposes, including those of families with no
    sample yet (a backend whose request counter is still empty)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(scrape):
        names.add(family.name)
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "info": ("_info",),
        }.get(family.type, ())
        names.update(family.name + s for s in suffixes)
        names.update(sample.name for sample in family.samples)
    return names


def test_promtool_check_metrics_on_a_live_scrape(scrape: str) -> None:
    result = run([tool("promtool"), "check", "metrics"], stdin=scrape)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout


def test_a_commit_is_counted_with_the_labels_the_rules_select(scrape: str) -> None:
    samples = [s for f in text_string_to_metric_families(scrape) for s in f.samples]
    handled = [
        s
        for s in samples
        if s.name == "grpc_server_handled_total"
        and s.labels.get("grpc_service") == COMMITTER_SERVICE
        and s.labels.get("grpc_method") == "Commit"
    ]
    codes = {s.labels["grpc_code"]: s.value for s in handled}
    assert codes.get("OK", 0) >= 1
    assert codes.get("PERMISSION_DENIED", 0) >= 1
    committed = next(
        s
        for s in samples
        if s.name == "message_committer_commits_total" and s.labels["outcome"] == "committed"
    )
    assert committed.value >= 1
    assert any(
        s.name == "grpc_server_handling_seconds_bucket" and s.labels.get("grpc_method") == "Commit"
        for s in samples
    )


def test_rules_and_dashboard_use_only_exported_series(scrape: str) -> None:
    names = exported(scrape)
    sources = [
        (PROMETHEUS / "rules.yml").read_text(),
        json.dumps([t["expr"] for p in _panels() for t in p.get("targets", [])]),
    ]
    used = {name for text in sources for name in _SERIES.findall(text)}
    assert used, "no series found in the rules and dashboard"
    missing = used - names
    assert not missing, f"not exported by the service: {sorted(missing)}"


def _panels() -> list[dict[str, Any]]:
    data = json.loads((DEPLOY / "grafana" / "message-committer.json").read_text())
    panels: list[dict[str, Any]] = data["panels"]
    return panels


def _python(command: list[str]) -> list[str]:
    assert command[0] == "python"
    return [sys.executable, *command[1:]]


def _closed_port() -> int:
    return free_port()  # reserved: nothing of ours will listen there


def test_image_healthcheck_passes_on_a_ready_server(server: ServeProcess) -> None:
    command = _python(healthcheck_command())
    ready = run(command, env={"MC_HTTP_ADDRESS": f"0.0.0.0:{server.http_port}"}, timeout=30)
    assert ready.returncode == 0, ready.stderr
    down = run(command, env={"MC_HTTP_ADDRESS": f"0.0.0.0:{_closed_port()}"}, timeout=30)
    assert down.returncode != 0


def test_compose_healthcheck_passes_on_a_ready_server(server: ServeProcess) -> None:
    test = load_yaml(DEPLOY / "compose.yaml")["x-committer-healthcheck"]["test"]
    assert test[0] == "CMD"
    command = _python([arg.replace(":9464/", f":{server.http_port}/") for arg in test[1:]])
    result = run(command, timeout=30)
    assert result.returncode == 0, result.stderr


def test_sigterm_drains_and_exits_zero() -> None:
    process = ServeProcess(args=["--shutdown-grace", "2s"])
    try:
        with urllib.request.urlopen(f"{process.http}/readyz", timeout=SCRAPE_TIMEOUT_S) as r:
            assert r.status == 200
        assert process.terminate() == 0
        assert "shutdown requested" in process.log()
    finally:
        process.close()
