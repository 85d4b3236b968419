"""POST /v1/jobs:batchCreate: one result per job in order, bad jobs alone refused, idempotency per job, bounds named."""

from __future__ import annotations

import json

import pytest

from raftsched import limits
from raftsched.core import commands
from raftsched.testing.replica import Replica

SPEC_BODY = {"schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
             "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}


def job(**over) -> dict:
    return dict(SPEC_BODY, **over)


def batch(cluster, jobs: list, node: str = "n1"):
    return cluster.api(node, "POST", "/v1/jobs:batchCreate", {"jobs": jobs})


# --- the command, on one replica -------------------------------------------------------

def item(job_id: str, key: str | None = None) -> commands.CreateJobItem:
    spec = {"name": job_id, "schedule": {"kind": "once", "run_at_ms": 5_000, "offset_min": 0},
            "target": {"type": "http", "url": "http://a/", "method": "POST", "timeout_s": 1.0},
            "retry": None, "concurrency": None, "metadata": {}}
    return commands.create_job_item(job_id=job_id, spec=spec, idempotency_key=key, shard=1,
                                    next_ms=5_000)


def test_create_jobs_applies_each_item_as_a_create_in_order():
    replica = Replica()
    replica.run(commands.create_job(job_id="job_aa", tenant="default", spec=item("job_aa").spec,
                                    idempotency_key=None, shard=1, next_ms=5_000, at_ms=1))
    result = replica.run(commands.create_jobs(tenant="default", at_ms=2, items=[
        item("job_01", "k1"), item("job_02", "k1"), item("job_aa"), item("job_03")]))
    assert result["ok"] is True
    first, repeat, taken, last = result["results"]
    assert (first["existing"], first["job"]["id"]) == (False, "job_01")
    # The same key later in the batch answers the job the first item created.
    assert (repeat["existing"], repeat["job"]["id"]) == (True, "job_01")
    # An id that exists refuses that item only.
    assert (taken["ok"], taken["error"]) == (False, "conflict")
    assert (last["existing"], last["job"]["id"]) == (False, "job_03")
    again = replica.run(commands.create_jobs(tenant="default", at_ms=3,
                                             items=[item("job_04", "k1")]))
    assert again["results"][0]["job"]["id"] == "job_01"


def test_a_malformed_batch_is_refused_whole_at_decode():
    replica = Replica()
    bad = commands.create_jobs(tenant="default", at_ms=2, items=[item("job_01"), {"job_id": ""}])
    result = replica.run(bad)
    assert result["ok"] is False
    assert result["error"] == "invalid_command"
    assert replica.store.scan("jobs") == []


# --- the API, on a cluster ---------------------------------------------------------------

@pytest.mark.integration
def test_mixed_batch_answers_one_result_per_job_in_order(shared_cluster):
    jobs = [job(name="a"), job(schedule={"cron": "61 * * * *"}), job(name="c"),
            {"target": SPEC_BODY["target"]}, job(name="e", colour="blue")]
    response = batch(shared_cluster, jobs)
    assert response.status == 200, response
    results = response.body["results"]
    assert len(results) == len(jobs)
    assert [("error" in r) for r in results] == [False, True, False, True, True]
    made = [r["job_id"] for r in results if "job_id" in r]
    assert made == sorted(made)   # ids in the order made (api/ids.py)
    assert [r["error"]["field"] for r in results if "error" in r] == \
        ["schedule.cron", "schedule", "colour"]
    assert results[1]["error"]["status"] == 400
    assert results[1]["error"]["type"] == "/problems/invalid-field"
    for position, name in ((0, "a"), (2, "c")):
        assert results[position]["created"] is True
        assert results[position]["next_run_at"].endswith("03:00:00Z")
        got = shared_cluster.api("n2", "GET",
                                 f"/v1/jobs/{results[position]['job_id']}?consistent=true")
        assert got.status == 200, got
        assert got.body["name"] == name


@pytest.mark.integration
def test_idempotency_keys_hold_within_and_across_batches(shared_cluster):
    first = batch(shared_cluster, [job(idempotency_key="batch-k1"), job(idempotency_key="batch-k2"),
                                   job(idempotency_key="batch-k1")])
    assert first.status == 200, first
    one, two, repeat = first.body["results"]
    assert one["created"] and two["created"]
    assert (repeat["job_id"], repeat["created"]) == (one["job_id"], False)
    assert one["job_id"] != two["job_id"]
    second = batch(shared_cluster, [job(idempotency_key="batch-k2"), job(idempotency_key="batch-k3")],
                   node="n3")
    assert second.status == 200, second
    again, new = second.body["results"]
    assert (again["job_id"], again["created"]) == (two["job_id"], False)
    assert new["created"] is True
    # A single create with a key a batch used answers the same job.
    single = shared_cluster.api("n2", "POST", "/v1/jobs", job(idempotency_key="batch-k1"))
    assert (single.status, single.body["job_id"]) == (200, one["job_id"])


@pytest.mark.integration
def test_batch_bounds_are_named(shared_cluster):
    too_many = batch(shared_cluster, [job() for _ in range(limits.batch_create_jobs_max + 1)])
    assert too_many.status == 400, too_many
    assert (too_many.body["field"], too_many.body["limit"]) == ("jobs", "batch_create_jobs_max")
    # The largest batch of ordinary jobs fits the body limit.
    full = [job(name=f"full-{i}", idempotency_key=f"full-{i}")
            for i in range(limits.batch_create_jobs_max)]
    assert len(json.dumps({"jobs": full})) < limits.batch_request_body_bytes_max
    answer = batch(shared_cluster, full)
    assert answer.status == 200, answer
    assert all(r["created"] for r in answer.body["results"])
    # 1000 jobs of about 5 KB each are over it.
    padded = [job(metadata={"pad": "x" * 5000}) for _ in range(limits.batch_create_jobs_max)]
    too_large = batch(shared_cluster, padded)
    assert too_large.status == 413, too_large
    assert too_large.body["limit"] == "batch_request_body_bytes_max"
    for payload in ({"jobs": []}, {"jobs": job()}, {"jobs": [job()], "extra": 1}, [job()]):
        refused = shared_cluster.api("n1", "POST", "/v1/jobs:batchCreate", payload)
        assert (refused.status, refused.body["field"]) == (400, "jobs"), (payload, refused)


def test_a_batch_is_proposed_in_entries_bounded_by_bytes_and_by_count():
    from raftsched.api.app import batch_entries
    big = limits.request_body_bytes_max   # the largest job a batch takes
    checked = [(i, {"n": i}, big) for i in range(10)]
    entries = batch_entries(checked)
    per_entry = limits.batch_entry_bytes_max // big
    assert [positions for positions, _ in entries][0] == list(range(per_entry))
    assert [p for positions, _ in entries for p in positions] == list(range(10))   # in order
    assert all(len(items) * big <= limits.batch_entry_bytes_max for _, items in entries)
    small = [(i, {"n": i}, 300) for i in range(limits.batch_create_jobs_max)]
    entries_of_small = limits.batch_create_jobs_max // limits.batch_entry_jobs_max
    assert [len(items) for _, items in batch_entries(small)] == \
        [limits.batch_entry_jobs_max] * entries_of_small
