"""compose.yaml runs three nodes the CLI accepts, peered by service name, each with its own volume and a health check on /v1/healthz."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raftsched.cli import build_parser
from raftsched.replication.raft import parse_peer
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call, wait_until

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def _entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT, in its exec (JSON) form."""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            return json.loads(line.removeprefix("ENTRYPOINT "))
    raise AssertionError("the Dockerfile has no ENTRYPOINT")


def _node_args(service: dict):
    entrypoint = _entrypoint()
    assert entrypoint[0] == "raftsched"
    return build_parser().parse_args(entrypoint[1:] + service["command"])


def test_three_services_with_commands_the_cli_accepts():
    services = _compose()["services"]
    assert sorted(services) == ["n1", "n2", "n3"]
    for name, service in services.items():
        args = _node_args(service)
        assert args.command == "node"
        assert args.id == name
        assert args.data == "/data"
        assert args.http[0] == "0.0.0.0"
        assert args.advertise_http == f"http://{name}:{args.http[1]}"
        assert service["build"] == "."


def test_peers_are_the_other_services_raft_addresses():
    services = _compose()["services"]
    raft = {name: _node_args(s).raft for name, s in services.items()}
    for name, service in services.items():
        args = _node_args(service)
        assert raft[name].rpartition(":")[0] == name   # reached by its service name
        peers = [parse_peer(p, args.raft)[0] for p in args.peers.split(",")]
        assert sorted(peers) == sorted(addr for other, addr in raft.items() if other != name)


def test_healthcheck_calls_healthz_on_the_api_port_and_the_port_is_published():
    services = _compose()["services"]
    host_ports = set()
    for service in services.values():
        port = _node_args(service).http[1]
        check = service["healthcheck"]["test"]
        assert check[0] == "CMD"
        # The image must have what the check runs: the slim Python image has no curl.
        assert check[1] == "python"
        assert "\nFROM python:" in (ROOT / "Dockerfile").read_text()
        assert f"http://127.0.0.1:{port}/v1/healthz" in " ".join(check)
        (published,) = service["ports"]
        host, host_port, container_port = published.split(":")
        assert host == "127.0.0.1"       # plain HTTP: not on every interface
        assert int(container_port) == port
        host_ports.add(host_port)
    assert len(host_ports) == 3


@pytest.mark.integration
def test_the_healthcheck_command_passes_on_a_live_node_and_fails_on_a_dead_one(tmp_path):
    service = _compose()["services"]["n1"]
    port = _node_args(service).http[1]
    argv = service["healthcheck"]["test"][1:]
    assert argv[0] == "python"

    def check(address: str) -> int:
        code = [a.replace(f"127.0.0.1:{port}", address) for a in argv[1:]]
        return subprocess.run([sys.executable, *code], capture_output=True, timeout=30).returncode

    with LocalCluster(tmp_path, nodes=1) as cluster:
        cluster.wait_ready()
        live = f"127.0.0.1:{cluster.http_ports['n1']}"
        assert check(live) == 0   # no token needed
        cluster.stop("n1")
        assert check(live) != 0


def test_each_node_has_its_own_named_volume_on_data():
    compose = _compose()
    mounts = [s["volumes"] for s in compose["services"].values()]
    volumes = [m[0].split(":")[0] for m in mounts]
    assert all(len(m) == 1 and m[0].endswith(":/data") for m in mounts)
    assert len(set(volumes)) == 3
    assert set(volumes) <= set(compose["volumes"])


def test_secrets_come_from_the_environment_and_are_required():
    for service in _compose()["services"].values():
        env = service["environment"]
        for name in ("RAFTSCHED_RAFT_SECRET", "RAFTSCHED_ADMIN_TOKEN"):
            # ${NAME:?...}: compose refuses to start without it.
            assert re.fullmatch(r"\$\{" + name + r":\?[^}]+\}", env[name]), env[name]


def _docker_compose_usable() -> bool:
    if shutil.which("docker") is None:
        return False
    for argv in (["docker", "info"], ["docker", "compose", "version"]):
        try:
            if subprocess.run(argv, capture_output=True, timeout=30).returncode != 0:
                return False
        except (OSError, subprocess.TimeoutExpired):
            return False
    return True


@pytest.mark.integration
@pytest.mark.skipif(not _docker_compose_usable(), reason="no usable docker daemon and compose")
def test_docker_compose_up_serves_a_healthy_cluster():
    token = secrets.token_urlsafe(32)
    env = dict(os.environ, RAFTSCHED_RAFT_SECRET=secrets.token_urlsafe(32),
               RAFTSCHED_ADMIN_TOKEN=token)
    project = ["docker", "compose", "-p", f"raftsched-test-{secrets.token_hex(4)}"]
    try:
        subprocess.run([*project, "up", "-d", "--build", "--wait"], cwd=ROOT, env=env,
                       check=True, timeout=900)
        for port in (8701, 8702, 8703):
            assert call("GET", f"http://127.0.0.1:{port}/v1/healthz", token=None).status == 200

        def leader_known():
            cluster = call("GET", "http://127.0.0.1:8701/v1/cluster", token=token)
            return cluster.status == 200 and cluster.body.get("leader")

        wait_until(leader_known, 60, "a leader")
    finally:
        subprocess.run([*project, "down", "-v"], cwd=ROOT, env=env, timeout=300,
                       stdout=sys.stderr)
