"""What a node sends another node: the node credential derived from the Raft secret (else the admin token), never the admin token itself, and its address is https:// when it serves TLS."""

from __future__ import annotations

import hashlib
import hmac

from raftsched.runtime.node import NodeConfig
from raftsched.runtime.peer import node_credential

RAFT_SECRET = "raft-secret-" + "r" * 24
ADMIN_TOKEN = "admin-token-" + "a" * 24


def config(**over) -> NodeConfig:
    given = dict(node_id="n1", http_host="127.0.0.1", http_port=8701, raft_addr="127.0.0.1:9701",
                 peers=("127.0.0.1:9702",), data_dir="/nonexistent", raft_secret=RAFT_SECRET,
                 admin_token=ADMIN_TOKEN)
    given.update(over)
    return NodeConfig(**given)


def test_the_credential_is_an_hmac_of_the_secret_under_a_fixed_label():
    expected = hmac.new(RAFT_SECRET.encode(), b"raftsched node api v1", hashlib.sha256).hexdigest()
    assert node_credential(RAFT_SECRET) == "rsnode_" + expected
    assert node_credential(RAFT_SECRET) != node_credential(RAFT_SECRET + "x")
    assert RAFT_SECRET not in node_credential(RAFT_SECRET)


def test_nodes_send_the_credential_never_the_admin_token():
    headers = config().peer_headers()
    assert headers == {"Authorization": f"Bearer {node_credential(RAFT_SECRET)}"}
    assert ADMIN_TOKEN not in str(headers)


def test_without_a_raft_secret_the_credential_derives_from_the_admin_token():
    headers = config(raft_secret=None).peer_headers()
    assert headers == {"Authorization": f"Bearer {node_credential(ADMIN_TOKEN)}"}
    assert ADMIN_TOKEN not in str(headers)
    assert config(raft_secret=None, admin_token=None, insecure_no_auth=True).peer_headers() == {}


def test_the_nodes_address_is_https_when_it_serves_tls():
    assert config().http_url == "http://127.0.0.1:8701"
    assert config(tls_cert="c.pem", tls_key="k.pem").http_url == "https://127.0.0.1:8701"
    assert config(tls_cert="c.pem", tls_key="k.pem",
                  advertise_http="https://n1.example:8701").http_url == "https://n1.example:8701"
