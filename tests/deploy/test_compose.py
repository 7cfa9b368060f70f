"""deploy/compose.yaml, checked for structure (there is no Docker engine here,
and the docker CLI of this machine has no compose plugin to run `config`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.tools import DEPLOY, ROOT, load_yaml

pytestmark = pytest.mark.deploy

COMPOSE = DEPLOY / "compose.yaml"
SERVERS = ("committer-scylla", "committer-redis")
RELAYS = ("relay-scylla", "relay-redis")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    data = load_yaml(COMPOSE)
    assert set(data) <= {"name", "services", "volumes", "x-committer", "x-committer-healthcheck"}
    result: dict[str, dict[str, Any]] = data["services"]
    return result


def test_the_stack(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {
        "scylla",
        "migrate",
        "migrate-redis",
        *SERVERS,
        "redis",
        *RELAYS,
        "prometheus",
        "grafana",
    }


def test_scylla_runs_small_and_reports_cql_health(services: dict[str, dict[str, Any]]) -> None:
    scylla = services["scylla"]
    assert scylla["image"].startswith("scylladb/scylla:")
    command = " ".join(scylla["command"])
    for flag in ("--smp 1", "--memory 750M", "--developer-mode 1"):
        assert flag in command
    assert "cqlsh" in " ".join(scylla["healthcheck"]["test"])


def test_start_up_order(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert migrate["command"][0] == "migrate"
    assert migrate["depends_on"] == {"scylla": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"
    server = services["committer-scylla"]["depends_on"]
    assert server["migrate"] == {"condition": "service_completed_successfully"}
    assert server["scylla"] == {"condition": "service_healthy"}
    assert services["committer-redis"]["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "migrate-redis": {"condition": "service_completed_successfully"},
    }
    assert services["migrate-redis"]["command"] == ["migrate", "--backend", "redis"]
    assert services["migrate-redis"]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}


def test_every_dependency_waited_on_has_a_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for dep, cond in service.get("depends_on", {}).items():
            if cond["condition"] == "service_healthy":
                check = services[dep].get("healthcheck", {})
                assert check.get("test") and not check.get("disable"), f"{name} -> {dep}"


def test_servers_are_built_here_hardened_and_ready_checked(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in (*SERVERS, *RELAYS, "migrate"):
        service = services[name]
        assert service["build"]["context"] == ".."
        assert (ROOT / service["build"]["dockerfile"]).is_file()
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
    for name in SERVERS:
        service = services[name]
        assert service["command"] == ["serve"]
        assert "/readyz" in " ".join(service["healthcheck"]["test"])
        assert service["environment"]["MC_BACKEND"] in name
    for name in RELAYS:
        service = services[name]
        assert service["command"] == ["relay"]
        assert "9465/readyz" in " ".join(service["healthcheck"]["test"])
        assert service["environment"]["MC_BACKEND"] in name
        assert service["environment"]["MC_RELAY_HTTP_ADDRESS"].endswith(":9465")


def test_images_are_pinned_and_ports_stay_on_loopback(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is reachable from the network"


def test_mounted_files_exist(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"


def test_no_credentials_in_the_file(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for key, value in service.get("environment", {}).items():
            assert not any(w in key for w in ("PASSWORD", "SECRET", "TOKEN")), f"{name}: {key}"
            assert "@" not in str(value), f"{name}: {key} carries credentials"
