"""The HTTP API over a real cluster: the job lifecycle as calls reach a sink, paging with a consistent read on another node, the cluster view and priorities. Validation, bounds and previews are checked in process (test_api_inprocess.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration


def body(sink_url: str = "http://127.0.0.1:9/x", **over) -> dict:
    b = {"name": "api", "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
         "target": {"type": "http", "url": sink_url}}
    b.update(over)
    return b


def test_job_lifecycle_patch_pause_resume_trigger_delete(shared_cluster, sink):
    c = shared_cluster
    created = c.api("n1", "POST", "/v1/jobs", body(sink.url))
    assert created.status == 201
    job_id = created.body["job_id"]
    assert created.body["next_run_at"].endswith("T03:00:00+01:00")  # Berlin in winter

    patched = c.api("n2", "PATCH", f"/v1/jobs/{job_id}",
                    {"name": "renamed", "schedule": {"cron": "30 4 * * *",
                                                     "timezone": "America/New_York"}})
    assert patched.status == 200, patched
    assert patched.body["name"] == "renamed"
    assert patched.body["next_run_at"].endswith("T04:30:00-05:00")
    assert patched.body["version"] == 2
    assert c.api("n2", "PATCH", f"/v1/jobs/{job_id}", {"shard": 3}).body["field"] == "shard"

    paused = c.api("n3", "POST", f"/v1/jobs/{job_id}:pause")
    assert paused.body["status"] == "paused"
    assert paused.body["next_run_at"] is None
    run = c.api("n3", "POST", f"/v1/jobs/{job_id}:trigger")
    assert run.status == 201, run
    assert run.body["trigger"] == "manual"
    wait_until(lambda: job_id in sink.by_job(), 10, "the manual run to call the target")
    finished = wait_until(
        lambda: (r := c.api("n1", "GET", f"/v1/runs/{run.body['run_id']}?consistent=true").body)
        .get("state") == "succeeded" and r, 10, "the manual run to succeed")
    assert finished["http_status"] == 200

    resumed = c.api("n1", "POST", f"/v1/jobs/{job_id}:resume")
    assert resumed.body["status"] == "active"
    next_run = dt.datetime.fromisoformat(resumed.body["next_run_at"])
    assert next_run > dt.datetime.now(dt.timezone.utc)

    history = c.api("n2", "GET", f"/v1/jobs/{job_id}/runs?limit=5&consistent=true").body["runs"]
    assert [r["run_id"] for r in history] == [run.body["run_id"]]
    preview = c.api("n2", "GET", f"/v1/jobs/{job_id}/preview?count=3").body["fire_times"]
    assert len(preview) == 3
    assert all(t.endswith(("T04:30:00-05:00", "T04:30:00-04:00")) for t in preview)

    assert c.api("n3", "DELETE", f"/v1/jobs/{job_id}").status == 204
    assert c.api("n3", "GET", f"/v1/jobs/{job_id}?consistent=true").status == 404
    assert c.api("n1", "DELETE", f"/v1/jobs/{job_id}").status == 404


def test_list_pages_through_every_job_once(shared_cluster):
    ids = set()
    for i in range(7):
        r = shared_cluster.api("n1", "POST", "/v1/jobs", body(name=f"page-{i}"))
        assert r.status == 201
        ids.add(r.body["job_id"])
    seen: list[str] = []
    cursor = None
    for _ in range(100):
        query = "limit=3&consistent=true" + (f"&cursor={cursor}" if cursor else "")
        page = shared_cluster.api("n2", "GET", f"/v1/jobs?{query}").body
        assert len(page["jobs"]) <= 3
        seen += [j["job_id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert ids <= set(seen)
    assert shared_cluster.api("n2", "GET", "/v1/jobs?limit=0").body["field"] == "limit"


def test_cluster_view_names_every_node_and_one_leader(shared_cluster):
    view = shared_cluster.api("n3", "GET", "/v1/cluster").body
    assert set(view["nodes"]) == {"n1", "n2", "n3"}
    roles = [n["role"] for n in view["nodes"].values()]
    assert roles.count("leader") == 1
    assert view["nodes"][view["leader"]]["role"] == "leader"
    for nid, node in view["nodes"].items():
        assert node["http"] == shared_cluster.url(nid)
        assert node["raft"] == shared_cluster.raft_addrs[nid]
        assert node["applied_index"] > 0
        # Every node says how many tenants' breakers it has open (GET /v1/node `breakers`).
        assert type(node["breakers_open"]) is int and node["breakers_open"] >= 0


def test_priority_is_stored_shown_and_patchable(shared_cluster):
    created = shared_cluster.api("n1", "POST", "/v1/jobs", body(priority="high"))
    assert created.status == 201, created
    assert created.body["priority"] == "high"
    job_id = created.body["job_id"]
    patched = shared_cluster.api("n2", "PATCH", f"/v1/jobs/{job_id}", {"priority": "low"})
    assert (patched.status, patched.body["priority"]) == (200, "low")
    refused = shared_cluster.api("n2", "PATCH", f"/v1/jobs/{job_id}", {"priority": "urgent"})
    assert (refused.status, refused.body["field"]) == (400, "priority")
    plain = shared_cluster.api("n3", "POST", "/v1/jobs", body())
    assert plain.body["priority"] == "normal"
