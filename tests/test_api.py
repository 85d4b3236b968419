"""The HTTP API over a real cluster: problem+json errors naming the field, job lifecycle, paging."""

from __future__ import annotations

import datetime as dt

import pytest

from raftsched import limits
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration


def body(sink_url: str = "http://127.0.0.1:9/x", **over) -> dict:
    b = {"name": "api", "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
         "target": {"type": "http", "url": sink_url}}
    b.update(over)
    return b


@pytest.mark.parametrize("payload, field", [
    (body(schedule={"cron": "61 * * * *"}), "schedule.cron"),
    (body(schedule={"cron": "0 3 * * *", "timezone": "Mars/Olympus"}), "schedule.timezone"),
    (body(schedule=None, run_at="tomorrow"), "run_at"),
    (body(run_at="2030-01-01T00:00:00Z"), "schedule"),
    ({"name": "x", "target": {"type": "http", "url": "http://a/"}}, "schedule"),
    (body(target={"type": "http", "url": "ftp://example/x"}), "target.url"),
    (body(target={"type": "http", "url": "http://a/", "timeout_s": 0}), "target.timeout_s"),
    (body(target={"type": "http", "url": "http://a/", "timeout_s": 99999}), "target.timeout_s"),
    (body(colour="blue"), "colour"),
    (body(target={"type": "http", "url": "http://a/", "verb": "GET"}), "target.verb"),
])
def test_bad_input_is_400_naming_the_field(shared_cluster, payload, field):
    payload = {k: v for k, v in payload.items() if v is not None}
    before = all_job_ids(shared_cluster, "n1")
    response = shared_cluster.api("n2", "POST", "/v1/jobs", payload)
    assert response.status == 400, response
    assert response.headers["Content-Type"].startswith("application/problem+json")
    assert response.body["field"] == field
    assert response.body["status"] == 400
    assert response.body["detail"]
    # Nothing was written: validation happens before the log.
    assert all_job_ids(shared_cluster, "n1") == before


def all_job_ids(cluster, nid: str) -> set[str]:
    ids: set[str] = set()
    cursor = ""
    while True:
        page = cluster.api(nid, "GET", f"/v1/jobs?limit=200&consistent=true"
                                        f"{'&cursor=' + cursor if cursor else ''}").body
        ids |= {job["job_id"] for job in page["jobs"]}
        cursor = page["next_cursor"]
        if not cursor:
            return ids


def test_oversized_and_malformed_bodies(shared_cluster):
    huge = body(target={"type": "http", "url": "http://a/", "body": "x" * 40_000})
    response = shared_cluster.api("n1", "POST", "/v1/jobs", huge)
    assert response.status == 413
    assert response.body["limit"] == "target_body_bytes_max"
    raw = b'{"name": "' + b"y" * (limits.request_body_bytes_max + 10) + b'"}'
    response = shared_cluster.api("n1", "POST", "/v1/jobs", raw=raw)
    assert response.status == 413
    assert response.body["limit"] == "request_body_bytes_max"
    response = shared_cluster.api("n1", "POST", "/v1/jobs", raw=b"{not json")
    assert response.status == 400
    assert response.body["field"] == "body"
    assert shared_cluster.api("n1", "GET", "/v1/nope").status == 404
    assert shared_cluster.api("n1", "GET", "/v1/jobs/job_00").status == 404
    assert shared_cluster.api("n1", "GET", "/v1/runs/run_00").status == 404


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


def test_schedule_preview_crosses_dst(shared_cluster):
    response = shared_cluster.api("n1", "POST", "/v1/schedules:preview", {
        "schedule": {"cron": "30 2 * * *", "timezone": "America/New_York"},
        "after": "2026-03-07T12:00:00Z", "count": 3})
    assert response.status == 200, response
    assert response.body["fire_times"] == ["2026-03-08T03:00:00-04:00",
                                           "2026-03-09T02:30:00-04:00",
                                           "2026-03-10T02:30:00-04:00"]


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
