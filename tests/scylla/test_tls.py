"""TLS to the cluster: a Cassandra node with client encryption required, its
keystore made here (a throwaway CA signs a certificate for 127.0.0.1), reached
through ``ClusterTls``; a CA that did not sign the node's certificate is refused.
"""

from __future__ import annotations

import ssl
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.scylla.session import CqlSession
from backends.scylla.tls import ClusterTls
from service import config
from service.domain.errors import StoreInvalid, StoreUnavailable
from tests.servers.cql_server import start_node

pytestmark = [pytest.mark.scylla, pytest.mark.slow, pytest.mark.own_cql]  # its own TLS node

PASSWORD = "changeit"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip


def _certificates(directory: Path) -> Path:
    """ca.pem, other-ca.pem, and node.p12: a key and certificate for 127.0.0.1 by ca."""
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr",
        "-subj", "/CN=127.0.0.1", cwd=directory,
    )  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "node.pem",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "pkcs12", "-export", "-in", "node.pem", "-inkey", "node.key", "-name", "node",
        "-out", "node.p12", "-passout", f"pass:{PASSWORD}", cwd=directory,
    )  # fmt: skip
    return directory / "node.p12"


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    keystore = _certificates(directory)
    node = start_node(
        directory / "node",
        extra_config=f"""\
client_encryption_options:
  enabled: true
  optional: false
  keystore: {keystore}
  keystore_password: {PASSWORD}
  store_type: PKCS12
  require_client_auth: false
""",
    )
    try:
        yield node, directory
    finally:
        node.stop()


async def _connect(node: Any, ca: Path) -> CqlSession:
    return await CqlSession.connect(
        [node.host],
        port=node.port,
        keyspace="tls_probe",
        requests=Counter(),
        request_timeout_s=10.0,
        tls=ClusterTls(str(ca)),
    )


async def test_a_session_over_tls_sends_and_reads_on_the_direct_path(
    tls_node: tuple[Any, Path],
) -> None:
    node, directory = tls_node
    cql = await _connect(node, directory / "ca.pem")
    try:
        pool = next(iter(cql._session._pools.values()))
        (connection,) = pool._connections.values()
        assert isinstance(connection._socket, ssl.SSLSocket)
        await cql.simple(
            "CREATE KEYSPACE IF NOT EXISTS tls_probe WITH replication ="
            " {'class': 'SimpleStrategy', 'replication_factor': 1}",
            timeout_s=60,
            raw=True,
        )
        await cql.simple(
            "CREATE TABLE IF NOT EXISTS tls_probe.t (k text PRIMARY KEY, v int)", timeout_s=60
        )
        await cql.prepare(
            {
                "put": "INSERT INTO {ks}.t (k, v) VALUES (?, ?)",
                "put_new": "INSERT INTO {ks}.t (k, v) VALUES (?, ?) IF NOT EXISTS",
                "get": "SELECT v FROM {ks}.t WHERE k = ?",
            }
        )
        assert cql.direct is not None
        key = uuid.uuid4().hex
        await cql.write("put", (key, 1))
        assert not await cql.cas("put_new", (key, 2))
        assert await cql.read("get", (key,)) == [{"v": 1}]
        assert cql.direct.sent == 3 and not cql.direct.passed
    finally:
        await cql.close()


async def test_a_node_certificate_another_ca_signed_is_refused(
    tls_node: tuple[Any, Path],
) -> None:
    node, directory = tls_node
    with pytest.raises(StoreUnavailable, match="cannot connect to the cluster") as refused:
        await _connect(node, directory / "other-ca.pem")
    assert str(node.port) not in str(refused.value)


def test_the_context_checks_the_name_and_refuses_files_that_do_not_load(tmp_path: Path) -> None:
    _ca(tmp_path, "ca")
    context = ClusterTls(str(tmp_path / "ca.pem")).context()
    assert context.check_hostname and context.verify_mode is ssl.CERT_REQUIRED
    (tmp_path / "broken.pem").write_text("not a certificate")
    with pytest.raises(StoreInvalid, match="could not be loaded") as refused:
        ClusterTls(str(tmp_path / "broken.pem")).context()
    assert "broken" not in str(refused.value)


def test_the_tls_settings_are_checked_at_start(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    base = {"backend": "memory"}
    loaded = config.load(base, {"MC_SCYLLA_TLS_CA": str(ca)})
    assert loaded.scylla_tls_ca == str(ca)
    for env, rule in [
        ({"MC_SCYLLA_TLS_CA": str(tmp_path / "missing.pem")}, "file not found"),
        ({"MC_SCYLLA_TLS_CA": str(ca), "MC_SCYLLA_TLS_CERT": str(ca)}, "go together"),
        ({"MC_SCYLLA_TLS_CERT": str(ca), "MC_SCYLLA_TLS_KEY": str(ca)}, "needs MC_SCYLLA_TLS_CA"),
    ]:
        with pytest.raises(config.ConfigError, match=rule) as refused:
            config.load(base, env)
        assert str(tmp_path) not in str(refused.value)
