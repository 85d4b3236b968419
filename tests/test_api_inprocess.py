"""The API's handlers in this process over an in-memory replica (the fast tier): problem+json errors naming the field with nothing proposed, bounds named, a job's create-read-delete, paging, schedule preview."""

from __future__ import annotations

import pytest

from raftsched import limits
from raftsched.errors import Unavailable
from raftsched.testing.inprocess import ReplicaPort, api_client


def body(**over) -> dict:
    b = {"name": "api", "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
         "target": {"type": "http", "url": "https://h.example/x"}}
    b.update(over)
    return {k: v for k, v in b.items() if v is not None}


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
async def test_bad_input_is_400_naming_the_field_and_proposes_nothing(payload, field):
    port = ReplicaPort()
    async with api_client(port) as client:
        response = await client.post("/v1/jobs", json=payload)
        problem = await response.json(content_type=None)
    assert response.status == 400, problem
    assert response.headers["Content-Type"].startswith("application/problem+json")
    assert problem["field"] == field
    assert problem["status"] == 400
    assert problem["detail"]
    assert port.proposed == []


async def test_oversized_and_malformed_bodies_name_their_bound():
    port = ReplicaPort()
    async with api_client(port) as client:
        huge = body(target={"type": "http", "url": "http://a/", "body": "x" * 40_000})
        response = await client.post("/v1/jobs", json=huge)
        assert (response.status, (await response.json())["limit"]) == (413,
                                                                      "target_body_bytes_max")
        raw = b'{"name": "' + b"y" * (limits.request_body_bytes_max + 10) + b'"}'
        response = await client.post("/v1/jobs", data=raw,
                                     headers={"Content-Type": "application/json"})
        assert (response.status, (await response.json())["limit"]) == (413,
                                                                      "request_body_bytes_max")
        response = await client.post("/v1/jobs", data=b"{not json",
                                     headers={"Content-Type": "application/json"})
        assert (response.status, (await response.json())["field"]) == (400, "body")
        for path in ("/v1/nope", "/v1/jobs/job_00", "/v1/runs/run_00"):
            assert (await client.get(path)).status == 404, path
    assert port.proposed == []


async def test_a_job_is_created_read_listed_and_deleted_one_proposal_each():
    port = ReplicaPort()
    async with api_client(port) as client:
        created = await client.post("/v1/jobs", json=body())
        job = await created.json()
        assert created.status == 201, job
        assert len(port.proposed) == 1
        read = await client.get(f"/v1/jobs/{job['job_id']}")
        assert (read.status, (await read.json())["name"]) == (200, "api")
        listed = await (await client.get("/v1/jobs?consistent=true")).json()
        assert [j["job_id"] for j in listed["jobs"]] == [job["job_id"]]
        assert (await client.delete(f"/v1/jobs/{job['job_id']}")).status == 204
        assert len(port.proposed) == 2


async def test_list_pages_through_every_job_once():
    port = ReplicaPort()
    async with api_client(port) as client:
        ids = set()
        for i in range(7):
            created = await client.post("/v1/jobs", json=body(name=f"page-{i}"))
            ids.add((await created.json())["job_id"])
        seen: list[str] = []
        cursor = None
        for _ in range(100):
            query = "limit=3" + (f"&cursor={cursor}" if cursor else "")
            page = await (await client.get(f"/v1/jobs?{query}")).json()
            assert len(page["jobs"]) <= 3
            seen += [j["job_id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        refused = await (await client.get("/v1/jobs?limit=0")).json()
    assert sorted(seen) == sorted(ids)
    assert refused["field"] == "limit"


async def test_a_bad_schedule_preview_is_refused_naming_the_member():
    async with api_client(ReplicaPort()) as client:
        for body, field, limit in (
                ({"schedule": {"every": "1h"}, "count": 0}, "count", "preview_count_max"),
                ({"schedule": {"every": "1h"}, "count": limits.preview_count_max + 1}, "count",
                 "preview_count_max"),
                ({"schedule": {"every": "1h"}, "job_id": "job_x"}, "job_id", None),
                ({"schedule": {"every": "1h"}, "colour": "blue"}, "colour", None),
                ({"schedule": {"cron": "0 1 * * *", "zone": "UTC"}}, "schedule.zone", None)):
            response = await client.post("/v1/schedules:preview", json=body)
            assert response.status == 400, body
            problem = await response.json()
            assert (problem["field"], problem.get("limit")) == (field, limit), body


async def test_schedule_preview_crosses_dst():
    async with api_client(ReplicaPort()) as client:
        response = await client.post("/v1/schedules:preview", json={
            "schedule": {"cron": "30 2 * * *", "timezone": "America/New_York"},
            "after": "2026-03-07T12:00:00Z", "count": 3})
        assert response.status == 200
        assert (await response.json())["fire_times"] == ["2026-03-08T03:00:00-04:00",
                                                         "2026-03-09T02:30:00-04:00",
                                                         "2026-03-10T02:30:00-04:00"]


async def test_a_digest_check_still_being_computed_answers_its_index():
    class Slow(ReplicaPort):
        asked: list[int] = []

        async def propose(self, command: dict) -> dict:
            # A node's answer carries the entry's log index; this port's has none.
            return {**await super().propose(command), "index": 41}

        async def digest_at(self, index: int, timeout_s: float) -> str | None:
            self.asked.append(index)
            raise Unavailable(f"the digest at index {index} is still being computed here; "
                              "ask again", reason="digest_pending")

    port = Slow()
    async with api_client(port) as client:
        answer = await client.post("/v1/state/digest:check")
        problem = await answer.json()
        assert answer.status == 503, problem
        assert problem["reason"] == "digest_pending"
        assert problem["index"] == port.asked[-1] == 41
        assert answer.headers["Retry-After"] == "1"


CONSISTENT_READS = ["/v1/jobs", "/v1/jobs/{job}", "/v1/jobs/{job}/runs", "/v1/jobs/{job}/preview",
                    "/v1/runs", "/v1/runs/{run}", "/v1/runs/{run}/logs", "/v1/cluster/shards",
                    "/v1/tokens", "/v1/tenants", "/v1/tenants/default", "/v1/audit"]


@pytest.mark.parametrize("path", CONSISTENT_READS)
async def test_a_consistent_read_waits_for_this_node_to_catch_up(path):
    """Every read docs/api.md lists as taking `?consistent=true` asks the node to
    catch up first: on a node that cannot, it is refused 503, not answered from
    a copy that may lack the caller's last write."""
    class Behind(ReplicaPort):
        async def wait_caught_up(self, timeout_s: float = 0) -> None:
            raise Unavailable("this node did not catch up with the leader's commit index",
                              reason="timeout")

    port = Behind()
    async with api_client(port) as client:
        job = await (await client.post("/v1/jobs", json=body())).json()
        fired = await client.post(f"/v1/jobs/{job['job_id']}:trigger", json={})
        run = await fired.json()
        assert fired.status in (200, 201, 202), run
        url = path.format(job=job["job_id"], run=run["run_id"])
        plain = await client.get(url)
        assert plain.status == 200, (url, await plain.text())
        waited = await client.get(url + "?consistent=true")
        assert waited.status == 503, (url, await waited.text())
        assert (await waited.json())["reason"] == "timeout"
