"""The node refuses an unauthenticated Raft port; the CLI contract parses as documented."""

from __future__ import annotations

import subprocess
import sys

from raftsched.cli import build_parser


def test_node_with_peers_and_no_secret_refuses_to_start(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "raftsched", "node", "--id", "n1", "--http", "127.0.0.1:0",
         "--raft", "127.0.0.1:1", "--peers", "127.0.0.1:2,127.0.0.1:3", "--data", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert "no Raft secret" in result.stderr
    assert not any(tmp_path.iterdir())   # it wrote nothing


def test_cli_contract_parses():
    args = build_parser().parse_args(
        ["node", "--id", "n2", "--http", "127.0.0.1:8702", "--raft", "127.0.0.1:9702",
         "--peers", "127.0.0.1:9701,127.0.0.1:9703", "--data", "/tmp/x"])
    assert args.http == ("127.0.0.1", 8702)
    assert args.peers == "127.0.0.1:9701,127.0.0.1:9703"
    dev = build_parser().parse_args(["dev"])
    assert (dev.nodes, dev.http_port_base, dev.raft_port_base) == (3, 8701, 9701)
