"""Toxiproxy: the TCP fault proxy between service replicas and storage.

``ToxiproxyServer`` runs ``toxiproxy-server`` (built by ``scripts/install-tools.sh``
into ``.tools/bin`` from the Go module proxy) on a free loopback port;
``Toxiproxy`` is a small typed client of its HTTP API (v2.5):

* proxies: ``create_proxy(name, listen, upstream)``, ``set_enabled``, ``delete_proxy``;
* toxics: ``add_toxic(proxy, Toxic)`` with ``latency``, ``timeout``, ``reset_peer`` and
  ``bandwidth`` constructors, ``remove_toxic``;
* ``reset()``: every proxy enabled again and every toxic removed (the heal step);
* ``bytes_through(proxy)``: bytes the proxy forwarded, from its Prometheus metrics
  (the server runs with ``-proxy-metrics``), to prove traffic really goes through it;
  ``byte_counters(proxy)``: received and sent on per direction, to prove a toxic's
  effect (``proof.py``).

Only loopback addresses are accepted as listen or upstream addresses.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolkit.ports import free_port

REPO = Path(__file__).resolve().parents[2]
ENV_BINARY = "TOXIPROXY_SERVER"
START_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 5.0
Stream = Literal["upstream", "downstream"]
_BYTES = re.compile(
    r'^toxiproxy_proxy_(sent|received)_bytes_total\{direction="(\w+)",listener="[^"]*",'
    r'proxy="([^"]+)",upstream="[^"]*"\}\s+([0-9.eE+]+)$'
)


class ToxiproxyError(RuntimeError):
    """The server is missing, did not start, or refused a request."""


def binary() -> str:
    """toxiproxy-server: $TOXIPROXY_SERVER, else .tools/bin, else PATH."""
    built = REPO / ".tools" / "bin" / "toxiproxy-server"
    for candidate in (os.environ.get(ENV_BINARY), str(built)):
        if candidate and Path(candidate).is_file():
            return candidate
    found = shutil.which("toxiproxy-server")
    if found is None:
        raise ToxiproxyError(
            f"toxiproxy-server is not installed: run scripts/install-tools.sh (or set {ENV_BINARY})"
        )
    return found


def require_loopback(address: str) -> None:
    host = address.rpartition(":")[0].strip("[]")
    if not ipaddress.ip_address(host).is_loopback:
        raise ToxiproxyError("only loopback addresses may be proxied")


@dataclass(frozen=True, slots=True)
class Toxic:
    """One toxic: ``kind`` is Toxiproxy's type, ``stream`` the direction it acts on
    (upstream = client to server), ``toxicity`` the share of connections it hits."""

    kind: str
    attributes: dict[str, int] = field(default_factory=dict)
    stream: Stream = "downstream"
    toxicity: float = 1.0
    name: str = ""

    def body(self) -> dict[str, Any]:
        return {
            "name": self.name or f"{self.kind}_{self.stream}",
            "type": self.kind,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": self.attributes,
        }


def latency(ms: int, jitter_ms: int = 0, stream: Stream = "downstream") -> Toxic:
    """Delay every chunk of data by ``ms`` (+- ``jitter_ms``)."""
    return Toxic("latency", {"latency": ms, "jitter": jitter_ms}, stream)


def timeout(ms: int, stream: Stream = "upstream") -> Toxic:
    """Swallow data; close the connection after ``ms`` (0: never). Replies go missing."""
    return Toxic("timeout", {"timeout": ms}, stream)


def reset_peer(after_ms: int = 0, stream: Stream = "upstream") -> Toxic:
    """Reset connections (TCP RST) after ``after_ms``."""
    return Toxic("reset_peer", {"timeout": after_ms}, stream)


def bandwidth(kb_per_s: int, stream: Stream = "downstream") -> Toxic:
    """Limit the rate to ``kb_per_s`` KB/s."""
    return Toxic("bandwidth", {"rate": kb_per_s}, stream)


class Toxiproxy:
    """A client of one toxiproxy-server's HTTP API (synchronous; short timeouts)."""

    def __init__(self, api: str) -> None:
        self.api = api.rstrip("/")

    def _request(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "User-Agent": "message-committer"},
        )
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(f"toxiproxy refused {method} {path}: HTTP {exc.code}") from None
        except OSError as exc:
            raise ToxiproxyError(f"toxiproxy did not answer ({type(exc).__name__})") from None
        return json.loads(raw) if raw.strip() else None

    def version(self) -> str:
        with urllib.request.urlopen(self.api + "/version", timeout=HTTP_TIMEOUT_S) as response:
            return str(response.read().decode().strip())

    def create_proxy(self, name: str, listen: str, upstream: str) -> str:
        """Create an enabled proxy; returns the address it listens on."""
        require_loopback(listen)
        require_loopback(upstream)
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": True}
        created = self._request("POST", "/proxies", body)
        return str(created["listen"])

    def proxies(self) -> dict[str, Any]:
        return dict(self._request("GET", "/proxies"))

    def set_enabled(self, name: str, enabled: bool) -> None:
        """A disabled proxy closes its connections and refuses new ones."""
        self._request("POST", f"/proxies/{name}", {"enabled": enabled})

    def delete_proxy(self, name: str) -> None:
        self._request("DELETE", f"/proxies/{name}")

    def add_toxic(self, proxy: str, toxic: Toxic) -> str:
        """Add ``toxic`` to ``proxy``; returns the toxic's name."""
        created = self._request("POST", f"/proxies/{proxy}/toxics", toxic.body())
        return str(created["name"])

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/proxies/{proxy}/toxics"))

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._request("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._request("POST", "/reset")

    def bytes_through(self, proxy: str) -> int:
        """Bytes ``proxy`` sent on, both directions (needs ``-proxy-metrics``)."""
        counts = self.byte_counters(proxy)
        return counts.get("upstream sent", 0) + counts.get("downstream sent", 0)

    def byte_counters(self, proxy: str) -> dict[str, int]:
        """``proxy``'s byte counters by ``"<direction> <received|sent>"`` (upstream:
        client to server; received from the source, sent on), from ``/metrics``: a
        toxic that swallows data shows as received and not sent."""
        with urllib.request.urlopen(self.api + "/metrics", timeout=HTTP_TIMEOUT_S) as response:
            text = response.read().decode("utf-8", "replace")
        counts: dict[str, int] = {}
        for line in text.splitlines():
            match = _BYTES.match(line)
            if match and match.group(3) == proxy:
                key = f"{match.group(2)} {match.group(1)}"
                counts[key] = counts.get(key, 0) + int(float(match.group(4)))
        return counts


class ToxiproxyServer:
    """One toxiproxy-server on 127.0.0.1 (a free port), its log in a temp file."""

    def __init__(self, executable: str | None = None, log_dir: Path | None = None) -> None:
        self.executable = executable or binary()
        self.port = 0
        directory = log_dir or Path(tempfile.mkdtemp(prefix="mc-toxiproxy-"))
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "toxiproxy.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def client(self) -> Toxiproxy:
        return Toxiproxy(f"http://127.0.0.1:{self.port}")

    def start(self) -> Toxiproxy:
        self.port = free_port()
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [self.executable, "-host", "127.0.0.1", "-port", str(self.port), "-proxy-metrics"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "LOG_LEVEL": "warn"},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ToxiproxyError(f"toxiproxy-server exited; see {self.log_path}")
            with contextlib.suppress(OSError):
                self.client.version()
                return self.client
            time.sleep(0.05)
        self.stop()
        raise ToxiproxyError(f"toxiproxy-server did not answer within {START_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> Toxiproxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
