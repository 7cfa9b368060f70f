"""TLS to the cluster (client-to-node encryption): ``MC_SCYLLA_TLS_CA`` and, for
nodes that ask for a client certificate, ``MC_SCYLLA_TLS_CERT`` / ``_KEY``.

Every node's certificate must chain to the CA, and name the address the driver
dials (``check_hostname``: the driver passes the endpoint's address as the
server name). The loop reactor (``reactor.py``) does not speak TLS, so with TLS
the driver's own reactor serves the sockets; the direct path still sends the
frames (its completions already hop onto the loop from a driver thread).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from service.domain.errors import StoreInvalid


@dataclass(frozen=True, slots=True)
class ClusterTls:
    """PEM file paths: the CA of the nodes' certificates, and an optional client
    certificate with its key."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2 or later, the node's certificate and name
        checked. StoreInvalid (naming no path) when a file does not load."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_verify_locations(cafile=self.ca)
            if self.cert:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ValueError):
            raise StoreInvalid("scylla: a TLS file for the cluster could not be loaded") from None
        return context
