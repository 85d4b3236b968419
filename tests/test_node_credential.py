"""Nodes call each other with the node credential derived from the Raft secret, never with the admin token, and that credential opens the peer routes (status, clock, a node's own run output) and nothing else."""

from __future__ import annotations

import threading

import pytest

from raftsched.runtime.peer import node_credential
from raftsched.testing.cluster import LocalCluster, free_ports
from raftsched.testing.http import ADMIN_TOKEN, wait_until
from raftsched.testing.netproxy import LinkProxy

pytestmark = pytest.mark.integration

PROBE_JOB = {"name": "probe", "schedule": {"cron": "0 0 1 1 *"},
             "target": {"type": "publish", "topic": "probe", "message": 1}}


def credential_of(cluster: LocalCluster) -> str:
    return node_credential(cluster.env["RAFTSCHED_RAFT_SECRET"])


def test_no_call_between_nodes_carries_the_admin_token(tmp_path):
    """n3 advertises its API through a relay that records what the other nodes send it."""
    sent = bytearray()
    lock = threading.Lock()

    def record(chunk: bytes) -> None:
        with lock:
            sent.extend(chunk)

    (relay_port,) = free_ports(1)
    cluster = LocalCluster(tmp_path / "cluster", args_of={
        "n3": ["--advertise-http", f"http://127.0.0.1:{relay_port}"]})
    relay = LinkProxy(relay_port, ("127.0.0.1", cluster.http_ports["n3"]), "http-n3", tap=record)
    try:
        with cluster:
            cluster.wait_ready()

            def n3_measured_and_seen(nid: str) -> bool:
                n3 = cluster.api(nid, "GET", "/v1/cluster", timeout_s=5).body["nodes"]["n3"]
                return n3["role"] != "unreachable" and n3["clock_offset_ms"] is not None

            for nid in ("n1", "n2"):
                wait_until(lambda: n3_measured_and_seen(nid), 30,
                           f"{nid} to measure n3's clock and read its status through the relay")
    finally:
        relay.close()
    with lock:
        seen = bytes(sent)
    assert b"GET /v1/node/clock " in seen
    assert b"GET /v1/node " in seen
    assert f"Bearer {credential_of(cluster)}".encode() in seen
    assert ADMIN_TOKEN.encode() not in seen


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/v1/jobs", PROBE_JOB),
    ("GET", "/v1/jobs", None),
    ("GET", "/v1/runs", None),
    ("GET", "/v1/tenants", None),
    ("POST", "/v1/tokens", {"name": "x", "role": "admin", "tenant": "default"}),
    ("GET", "/v1/cluster", None),
    ("GET", "/v1/state/digest", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/runs/run_" + "0" * 24 + "/logs", None),   # without local=true
    ("GET", "/v1/node?tenant=t1", None),               # acting for a tenant
])
def test_the_node_credential_is_refused_on_other_routes(shared_cluster, method, path, body):
    answer = shared_cluster.api("n1", method, path, body, token=credential_of(shared_cluster))
    assert answer.status == 403, answer
    assert answer.body["type"].endswith("forbidden"), answer


def test_a_forged_node_credential_is_401(shared_cluster):
    forged = node_credential("not-the-raft-secret-of-this-cluster")
    answer = shared_cluster.api("n1", "GET", "/v1/node/clock", token=forged)
    assert answer.status == 401, answer


def test_the_peer_routes_answer_the_node_credential(shared_cluster):
    credential = credential_of(shared_cluster)
    status = shared_cluster.api("n2", "GET", "/v1/node", token=credential)
    assert status.status == 200, status
    assert status.body["id"] == "n2"
    clock = shared_cluster.api("n2", "GET", "/v1/node/clock", token=credential)
    assert clock.status == 200, clock
    assert isinstance(clock.body["wall_us"], int)
    # A run's output, kept on the node that ran it: that node answers the node
    # credential with it, and any other node fetches it from there.
    created = shared_cluster.api("n1", "POST", "/v1/jobs", {
        "name": "peer-output", "schedule": {"cron": "0 0 1 1 *"},
        "target": {"type": "command", "argv": ["echo", "hello-peer"]},
        "retry": {"max_attempts": 1}})
    assert created.status == 201, created
    job_id = created.body["job_id"]
    run_id = shared_cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger").body["run_id"]

    def finished() -> dict | None:
        run = shared_cluster.api("n1", "GET", f"/v1/runs/{run_id}").body
        return run if run["state"] == "succeeded" else None

    run = wait_until(finished, 20, "the run to succeed")
    holder = run["attempts"][0]["holder"]
    local = shared_cluster.api(holder, "GET", f"/v1/runs/{run_id}/logs?local=true",
                               token=credential)
    assert local.status == 200, local
    assert "hello-peer" in local.body["attempts"][0]["stdout"]
    other = next(nid for nid in shared_cluster.ids if nid != holder)
    fetched = shared_cluster.api(other, "GET", f"/v1/runs/{run_id}/logs")
    assert fetched.status == 200, fetched
    assert fetched.body["unavailable"] == [], fetched
    assert "hello-peer" in fetched.body["attempts"][0]["stdout"]
