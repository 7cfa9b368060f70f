"""TLS and mutual TLS, with certificates made by openssl for this test only."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.client import ClientTls, CommitClient, RetryPolicy
from service.domain.errors import Unavailable
from tests.e2e.conftest import StartServer, tool

pytestmark = pytest.mark.e2e

NO_RETRY = RetryPolicy(max_attempts=1, deadline_s=3.0)
EC_KEY = ("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Pki:
    folder: Path

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(folder: Path, name: str, cn: str, ext: str) -> None:
    _openssl(*EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
             cwd=folder)  # fmt: skip
    (folder / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
             cwd=folder)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: run scripts/setup.sh (make test does)")
    folder = tmp_path_factory.mktemp("pki")
    _openssl(*EC_KEY, "-x509", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=mc-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign",
             cwd=folder)  # fmt: skip
    _issue(folder, "server", "localhost",
           "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    _issue(folder, "client", "gateway-1", "extendedKeyUsage=clientAuth\n")
    return Pki(folder)


async def test_tls_serves_verified_clients_only(start_server: StartServer, pki: Pki) -> None:
    running = await start_server(
        tls=ClientTls(ca=pki.read("ca.pem")),
        tls_cert=pki.path("server.pem"),
        tls_key=pki.path("server.key"),
    )
    assert await running.client.health() == "SERVING"
    await running.client.create_conversation("t1", "c1", ["alice"])
    async with CommitClient.connect(running.target, retry=NO_RETRY) as plaintext:
        with pytest.raises(Unavailable):
            await plaintext.health()


async def test_mutual_tls_requires_a_client_certificate(
    start_server: StartServer, pki: Pki
) -> None:
    ca = pki.read("ca.pem")
    running = await start_server(
        tls=ClientTls(ca=ca, cert=pki.read("client.pem"), key=pki.read("client.key")),
        tls_cert=pki.path("server.pem"),
        tls_key=pki.path("server.key"),
        tls_client_ca=pki.path("ca.pem"),
    )
    assert await running.client.health() == "SERVING"
    target = f"localhost:{running.server.grpc_port}"
    async with CommitClient.connect(target, tls=ClientTls(ca=ca), retry=NO_RETRY) as anonymous:
        with pytest.raises(Unavailable):
            await anonymous.health()

    probe = tool("grpc-health-probe")
    if probe is None:
        pytest.fail("grpc-health-probe is missing: run scripts/install-tools.sh (make test does)")
    result = await asyncio.to_thread(  # the server runs on this loop: do not block it
        subprocess.run,
        [probe, "-addr", target, "-tls", "-tls-ca-cert", pki.path("ca.pem"),
         "-tls-client-cert", pki.path("client.pem"), "-tls-client-key", pki.path("client.key")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (result.stdout + result.stderr).strip() == "status: SERVING"
