"""The Kustomize base in deploy/kubernetes and its components.

Every rendered object is validated offline, strictly (unknown fields are
errors), against the Kubernetes OpenAPI schemas that kubernetes-validate
ships, for the oldest Kubernetes these manifests support (1.30: the preStop
``sleep`` action is on by default from there) and for the newest the
validator knows. The ServiceMonitor is a Prometheus Operator CRD, absent from
those schemas: it gets its own structural check instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from service.config import options, parse_duration
from tests.deploy.tools import (
    KUSTOMIZE_BASE,
    ROOT,
    Doc,
    find,
    kustomize,
    load_all,
    load_yaml,
    run,
    tool,
)

pytestmark = pytest.mark.deploy

MIN_KUBERNETES = "1.30.0"
MAX_KUBERNETES = "1.37.0"
VERSIONS = (MIN_KUBERNETES, MAX_KUBERNETES)
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}
COMPONENTS = ("prometheus-operator", "tls")
GRPC_PORT = 50051
HTTP_PORT = 9464
RELAY_HTTP_PORT = 9465
SECRET_ENV = {"MC_REDIS_URL", "MC_REDIS_DEPLOYMENT", "MC_SCYLLA_PASSWORD", "MC_SCYLLA_USERNAME"}


def validate(doc: Doc, version: str) -> None:
    """Strict schema validation; raises with the path of the first error."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise AssertionError(
            f"{doc['kind']}/{doc['metadata']['name']} fails Kubernetes {version}: "
            f"{path}: {exc.message}"
        ) from None


def render_with_components(tmp_path: Path, components: tuple[str, ...]) -> list[Doc]:
    """An overlay like an operator's: the base plus ``components``."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(KUSTOMIZE_BASE, overlay)
    lines = [
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        f"resources: [{rel}]",
        "components: [" + ", ".join(f"{rel}/components/{c}" for c in components) + "]",
    ]
    (overlay / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    result = run([tool("kubectl"), "kustomize", str(overlay)])
    assert result.returncode == 0, result.stderr
    return load_all(result.stdout)


@pytest.fixture(scope="module")
def base() -> list[Doc]:
    return kustomize(KUSTOMIZE_BASE)


def container(docs: list[Doc], kind: str, name: str) -> dict[str, Any]:
    pod = exact(docs, kind, name)["spec"]["template"]["spec"]
    (only,) = pod["containers"]
    result: dict[str, Any] = only
    return result


def exact(docs: list[Doc], kind: str, name: str) -> Doc:
    """The one document of ``kind`` named exactly ``name`` (the server Deployment's
    name is a prefix of the relay's)."""
    (only,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return only


def env_names(c: dict[str, Any]) -> set[str]:
    return {e["name"] for e in c.get("env", [])}


def config_map(docs: list[Doc]) -> dict[str, str]:
    data: dict[str, str] = find(docs, "ConfigMap", "message-committer-config")["data"]
    return data


# --- schemas ------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_base_validates_strictly(base: list[Doc], version: str) -> None:
    kinds = sorted(d["kind"] for d in base)
    expected = ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "ServiceAccount"]
    assert kinds == sorted([*expected, "Deployment", "Service", "Service"])
    for doc in base:
        validate(doc, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_base_with_every_component_validates(tmp_path: Path, version: str) -> None:
    docs = render_with_components(tmp_path, COMPONENTS)
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue  # checked by test_service_monitor_scrapes_each_pod_once
        validate(doc, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_example_secrets_validate_and_hold_only_placeholders(version: str) -> None:
    docs = load_all((KUSTOMIZE_BASE / "examples" / "secret.example.yaml").read_text())
    assert {d["metadata"]["name"] for d in docs} == {
        "message-committer-backend",
        "message-committer-tls",
    }
    for doc in docs:
        validate(doc, version)
        for value in doc["stringData"].values():
            assert "REPLACE_ME" in value, "an example Secret holds placeholders only"


def test_the_validator_rejects_what_it_should(base: list[Doc]) -> None:
    """A typo'd field and a wrong type both fail: the passes above mean something."""
    deployment = exact(base, "Deployment", "message-committer")
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, MIN_KUBERNETES, strict=True)
    wrong = {**deployment, "spec": {**deployment["spec"], "replicas": "three"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, MIN_KUBERNETES, strict=True)


def test_every_manifest_file_is_part_of_the_base() -> None:
    kustomization = load_yaml(KUSTOMIZE_BASE / "kustomization.yaml")
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in KUSTOMIZE_BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


# --- the Deployment --------------------------------------------------------------------


def test_probes(base: list[Doc]) -> None:
    c = container(base, "Deployment", "message-committer")
    assert c["readinessProbe"]["grpc"] == {"port": GRPC_PORT}
    assert c["startupProbe"]["grpc"] == {"port": GRPC_PORT}
    # Liveness must not follow the backend (a backend outage would restart
    # every replica): the HTTP side's /healthz only says the loop answers.
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60


def test_addresses_ports_and_services_agree(base: list[Doc]) -> None:
    c = container(base, "Deployment", "message-committer")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MC_GRPC_ADDRESS"].endswith(f":{GRPC_PORT}")
    assert env["MC_HTTP_ADDRESS"].endswith(f":{HTTP_PORT}")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": GRPC_PORT, "metrics": HTTP_PORT}
    pod_labels = exact(base, "Deployment", "message-committer")["spec"]["template"]["metadata"][
        "labels"
    ]
    for svc in (d for d in base if d["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        assert selector.items() <= pod_labels.items(), svc["metadata"]["name"]
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, port
    pdb = find(base, "PodDisruptionBudget", "message-committer")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_graceful_shutdown_fits_in_the_termination_grace(base: list[Doc]) -> None:
    pod = exact(base, "Deployment", "message-committer")["spec"]["template"]["spec"]
    c = container(base, "Deployment", "message-committer")
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = parse_duration(config_map(base)["MC_SHUTDOWN_GRACE"])
    margin = 10  # closing the HTTP side and the backend after the drain
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + grace + margin


def test_pods_are_locked_down(base: list[Doc]) -> None:
    for kind, name in (
        ("Deployment", "message-committer"),
        ("Deployment", "message-committer-relay"),
        ("Job", "message-committer-migrate"),
    ):
        pod = exact(base, kind, name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        c = container(base, kind, name)
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        for kind_of in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind_of]), (name, kind_of)


def test_replicas_spread_and_roll_safely(base: list[Doc]) -> None:
    spec = exact(base, "Deployment", "message-committer")["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"]
    pdb = find(base, "PodDisruptionBudget", "message-committer")["spec"]
    assert pdb["maxUnavailable"] == 1


# --- configuration -------------------------------------------------------------------


def test_config_keys_are_real_settings_and_hold_no_secret(base: list[Doc]) -> None:
    known = {opt.env for opt in options()}
    data = config_map(base)
    assert set(data) <= known, f"unknown settings: {set(data) - known}"
    assert not SECRET_ENV & set(data), "credentials belong in the Secret"
    assert data["MC_BACKEND"] in ("memory", "redis", "scylla")
    c = container(base, "Deployment", "message-committer")
    assert env_names(c) <= known
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e
    }
    assert from_secret == dict.fromkeys(SECRET_ENV, "message-committer-backend")


def references(args: list[str]) -> Iterator[str]:
    for arg in args:
        yield from re.findall(r"\$\(([A-Z0-9_]+)\)", arg)


def test_migration_job_runs_the_real_migrate_command(base: list[Doc]) -> None:
    job = find(base, "Job", "message-committer-migrate")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    c = container(base, "Job", "message-committer-migrate")
    args: list[str] = c["args"]
    assert args[0] == "migrate"
    defined = set(config_map(base)) | env_names(c)
    for ref in references(args):
        assert ref in defined, f"$({ref}) is not defined in the Job's environment"
    helptext = run([*_cli(), "migrate", "--help"])
    assert helptext.returncode == 0, helptext.stdout + helptext.stderr
    for arg in args[1:]:
        flag = arg.split("=", 1)[0]
        assert flag in helptext.stdout, f"migrate has no {flag}"
    assert {"MC_SCYLLA_USERNAME", "MC_SCYLLA_PASSWORD"} <= env_names(c)
    # First upgrade step applies exactly the Job and the ConfigMap it reads.
    phase = {
        d["kind"]
        for d in base
        if d["metadata"].get("labels", {}).get("message-committer/phase") == "migrate"
    }
    assert phase == {"Job", "ConfigMap"}


def _cli() -> list[str]:
    return [tool("message-committer")]


# --- the relay --------------------------------------------------------------------------


def test_the_relay_deployment_runs_the_relay_command_on_its_own_port(base: list[Doc]) -> None:
    relay = exact(base, "Deployment", "message-committer-relay")
    spec = relay["spec"]
    assert spec["replicas"] >= 2, "a second relay takes over a dead one's partitions"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    c = container(base, "Deployment", "message-committer-relay")
    assert c["args"] == ["relay"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MC_RELAY_HTTP_ADDRESS"].endswith(f":{RELAY_HTTP_PORT}")
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": RELAY_HTTP_PORT}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == "metrics", probe
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(RELAY_HTTP_PORT)
    # The same configuration as the servers: the fan-out threshold must agree.
    assert c["envFrom"] == container(base, "Deployment", "message-committer")["envFrom"]
    from_secret = {e["name"] for e in c["env"] if "valueFrom" in e}
    assert from_secret == SECRET_ENV
    server_labels = exact(base, "Deployment", "message-committer")["spec"]["selector"]
    assert spec["selector"]["matchLabels"] != server_labels["matchLabels"]
    for svc in (d for d in base if d["kind"] in ("Service", "PodDisruptionBudget")):
        selector = svc["spec"]["selector"]
        labels = selector.get("matchLabels", selector)
        relay_pod = spec["template"]["metadata"]["labels"]
        assert not labels.items() <= relay_pod.items(), "servers' objects must not select relays"


def test_the_relay_help_lists_every_flag_it_is_configured_with(base: list[Doc]) -> None:
    helptext = run([*_cli(), "relay", "--help"])
    assert helptext.returncode == 0, helptext.stdout + helptext.stderr
    for name in config_map(base):
        flag = "--" + name.removeprefix("MC_").lower().replace("_", "-")
        assert flag in helptext.stdout, flag


# --- components ------------------------------------------------------------------------


def test_service_monitor_scrapes_each_pod_once(tmp_path: Path) -> None:
    docs = render_with_components(tmp_path, ("prometheus-operator",))
    monitor = find(docs, "ServiceMonitor", "message-committer")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"])
    selector = monitor["spec"]["selector"]["matchLabels"]
    matched = [
        svc
        for svc in docs
        if svc["kind"] == "Service" and selector.items() <= svc["metadata"]["labels"].items()
    ]
    with_port = [
        svc for svc in matched if endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    ]
    assert [svc["metadata"]["name"] for svc in with_port] == ["message-committer"]
    for name in ("message-committer", "message-committer-relay"):
        annotations = exact(docs, "Deployment", name)["spec"]["template"]["metadata"]
        assert not any(k.startswith("prometheus.io/") for k in annotations.get("annotations", {}))
    pods = find(docs, "PodMonitor", "message-committer-relay")
    assert pods["apiVersion"] == "monitoring.coreos.com/v1"
    (scrape,) = pods["spec"]["podMetricsEndpoints"]
    assert scrape["port"] == "metrics" and scrape["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "message-committer-relay"} in scrape["relabelings"]
    relay_labels = exact(docs, "Deployment", "message-committer-relay")["spec"]["template"][
        "metadata"
    ]["labels"]
    assert pods["spec"]["selector"]["matchLabels"].items() <= relay_labels.items()


def test_tls_component_mounts_the_secret_and_probes_over_http(tmp_path: Path) -> None:
    docs = render_with_components(tmp_path, ("tls",))
    c = container(docs, "Deployment", "message-committer")
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "tls")
    assert mount["readOnly"] is True
    for name in ("MC_TLS_CERT", "MC_TLS_KEY", "MC_TLS_CLIENT_CA"):
        assert env[name].startswith(mount["mountPath"] + "/")
    for probe in ("startupProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert "grpc" not in c[probe]
    pod = exact(docs, "Deployment", "message-committer")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == "message-committer-tls"


def test_operating_doc_covers_the_upgrade_commands() -> None:
    doc = (ROOT / "docs" / "operating.md").read_text()
    assert "kubectl apply -k deploy/kubernetes -l message-committer/phase=migrate" in doc
