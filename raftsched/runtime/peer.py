"""How a node calls another node's HTTP API: with the node credential, and over
TLS with the cluster's CA when the nodes serve TLS (docs/security.md, "Node to
node").

The node credential is derived from the shared Raft secret (or, on a cluster
started without one, from the bootstrap admin token), so every node computes the
same one and no node ever sends the admin token itself:

    node credential = "rsnode_" + hex(HMAC-SHA256(secret, b"raftsched node api v1"))

HMAC is one-way: a credential seen on the wire gives neither the secret nor the
admin token. It grants only the peer routes (api/auth.py, PEER_ROUTES).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
from typing import Any

import aiohttp

from raftsched import limits

NODE_CREDENTIAL_PREFIX = "rsnode_"
# Changing the label changes every node's credential: a cluster's nodes must
# agree on it, so it is versioned, not edited.
_LABEL = b"raftsched node api v1"


def node_credential(secret: str) -> str:
    """The bearer token nodes derive from their shared `secret` to call each other."""
    digest = hmac.new(secret.encode(), _LABEL, hashlib.sha256).hexdigest()
    return NODE_CREDENTIAL_PREFIX + digest


def client_ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    """What verifies the nodes' certificates: `ca_file`'s CAs, or None for the
    system's (aiohttp's default for https)."""
    if ca_file is None:
        return None
    return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The node's TLS server side (raises OSError / ssl.SSLError on a bad file)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class PeerClient:
    """How a node calls other nodes' HTTP API: one aiohttp session for every
    caller on the node (consistent reads asking the leader, clock probes, the
    storage guard, run logs, cluster status), so that calls to a peer reuse
    its kept-alive connections (and TLS sessions) rather than each caller
    opening its own. It sends the node credential (never the admin token),
    verifies the nodes' certificates by the cluster's CA, and ignores proxies
    from the environment (trust_env=False: a proxy must not see the
    credential). Each call has its own total timeout.

    Calls raise what aiohttp raises (aiohttp.ClientError, asyncio.TimeoutError),
    and get_json raises ValueError for a body that is not JSON."""

    def __init__(self, *, headers: dict[str, str], ssl_context: ssl.SSLContext | None) -> None:
        self._headers = headers
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            ssl=self._ssl if self._ssl is not None else True,
            limit=limits.peer_connections_max,
            keepalive_timeout=limits.peer_keepalive_s)
        self._session = aiohttp.ClientSession(headers=self._headers, connector=connector,
                                              trust_env=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, url: str, *, timeout_s: float,
                  params: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of a GET of `url` on another node."""
        if self._session is None:
            raise aiohttp.ClientConnectionError("the node's peer client is not started")
        async with self._session.get(url, params=params,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            return response.status, await response.read()

    async def get_json(self, url: str, *, timeout_s: float,
                       params: dict[str, str] | None = None) -> Any:
        """The JSON body of a GET of `url` on another node, whatever its status."""
        _, body = await self.get(url, timeout_s=timeout_s, params=params)
        return json.loads(body)
