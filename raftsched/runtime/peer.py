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
import ssl

import aiohttp

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


def peer_session(*, timeout: aiohttp.ClientTimeout, headers: dict[str, str],
                 ssl_context: ssl.SSLContext | None) -> aiohttp.ClientSession:
    """A session for calls to other nodes. trust_env=False: a proxy from the
    environment must not see the node credential."""
    connector = aiohttp.TCPConnector(ssl=ssl_context if ssl_context is not None else True)
    return aiohttp.ClientSession(timeout=timeout, headers=headers, connector=connector,
                                 trust_env=False)
