"""On a real cluster: a writer of a tenant without the command grant is refused 403, an admin's grant lets it create command jobs, and once the grant is withdrawn its jobs' runs fail unrun, on a node and before a worker is given them; both changes are in the audit table."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration
FAR = {"cron": "0 0 1 1 *"}   # fires only when triggered


def command_job(script: str, queue: str | None = None) -> dict:
    target = {"type": "command", "argv": [script], "shell": True}
    if queue is not None:
        target["queue"] = queue
    return {"name": "cmd", "schedule": FAR, "target": target}


def token(cluster: LocalCluster, tenant: str, role: str) -> str:
    made = cluster.api("n1", "POST", "/v1/tokens", {"tenant": tenant, "role": role})
    assert made.status == 201, made
    return made.body["token"]


def finished_run(cluster: LocalCluster, job_id: str, writer: str) -> dict:
    def check() -> dict | None:
        runs = cluster.api("n1", "GET", f"/v1/jobs/{job_id}/runs?consistent=true",
                           token=writer).body["runs"]
        return runs[0] if runs and runs[0]["state"] in ("succeeded", "failed") else None
    return wait_until(check, 30, f"a finished run of {job_id}")


def start_worker(cluster: LocalCluster, worker_token: str, queue: str) -> subprocess.Popen:
    env = dict(cluster.env, RAFTSCHED_TOKEN=worker_token)
    with open(cluster.base / "worker.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "raftsched", "worker", "--cluster", cluster.url("n1"),
             "--queue", queue, "--concurrency", "1", "--id", "w1"],
            stdout=log, stderr=subprocess.STDOUT, env=env)


def test_a_tenants_command_grant_is_given_and_withdrawn_by_an_admin(tmp_path):
    node_marker, worker_marker = tmp_path / "node-ran", tmp_path / "worker-ran"
    with LocalCluster(tmp_path / "c", nodes=1, command_tenants=()) as cluster:
        cluster.wait_ready()
        writer = token(cluster, "t1", "writer")
        refused = cluster.api("n1", "POST", "/v1/jobs", command_job("true", "batch"),
                              token=writer)
        assert refused.status == 403, refused
        assert refused.body["field"] == "target.type"
        assert "PUT /v1/tenants/t1" in refused.body["detail"]
        # A writer cannot grant itself.
        assert cluster.api("n1", "PUT", "/v1/tenants/t1", {"commands": True},
                           token=writer).status == 403
        assert cluster.api("n1", "PUT", "/v1/tenants/t1", {"commands": True}).status == 200
        on_node = cluster.api("n1", "POST", "/v1/jobs", command_job(f"touch {node_marker}"),
                              token=writer)
        on_worker = cluster.api("n1", "POST", "/v1/jobs",
                                command_job(f"touch {worker_marker}", "batch"), token=writer)
        assert (on_node.status, on_worker.status) == (201, 201), (on_node, on_worker)

        withdrawn = cluster.api("n1", "PUT", "/v1/tenants/t1", {"commands": False})
        assert (withdrawn.status, withdrawn.body["commands"]) == (200, False)
        worker = start_worker(cluster, token(cluster, "t1", "worker"), "batch")
        try:
            runs = {}
            for name, created in (("node", on_node), ("worker", on_worker)):
                job_id = created.body["job_id"]
                assert cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger",
                                   token=writer).status in (200, 201, 202)
                runs[name] = finished_run(cluster, job_id, writer)
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
        audit = cluster.api("n1", "GET", "/v1/audit?limit=1000").body["records"]
    for run in runs.values():
        assert run["state"] == "failed", run
        assert len(run["attempts"]) == 1, "a withdrawn grant is not retried"
        assert "tenant t1 may not run commands" in run["attempts"][0]["error"]
    assert runs["node"]["attempts"][0]["holder"] == "n1"
    assert runs["worker"]["attempts"][0]["holder"] == "worker:w1"
    assert not node_marker.exists()
    assert not worker_marker.exists()
    grants = [(e["tenant"], e["detail"]["commands"]) for e in audit
              if e["action"] == "tenant.put"]
    assert grants == [("t1", True), ("t1", False)]
