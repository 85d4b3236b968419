"""One request cannot block a node's event loop: a maximal batchCreate of long, distinct cron jobs is decoded off the loop and checked in slices (GET /v1/healthz answers meanwhile), and a job of a batch is held to POST /v1/jobs's size bound."""

from __future__ import annotations

import json
import threading
import time

import pytest

from raftsched import limits

pytestmark = pytest.mark.integration

# How long a health check may take while the batch is checked: the loop
# yields every loop_slice_s, so an answer waits for a few slices at most.
HEALTHZ_LATENCY_S_MAX = 0.2
# Every minute listed: 180 bytes, under cron_expression_bytes_max.
EVERY_MINUTE_LISTED = ",".join(str(m) for m in range(60))


def heavy_job(i: int) -> dict:
    """A job whose expression no other job shares (the hour and H differ), in
    a zone with DST: each costs a parse and several evaluations."""
    return {"name": f"heavy-{i}",
            "schedule": {"cron": f"{EVERY_MINUTE_LISTED} {i % 24} H(1-28) * *",
                         "timezone": "Europe/Berlin"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}


def test_healthz_answers_quickly_while_a_maximal_batch_is_checked(shared_cluster):
    jobs = [heavy_job(i) for i in range(limits.batch_create_jobs_max)]
    assert len(jobs[0]["schedule"]["cron"]) <= limits.cron_expression_bytes_max
    assert len(json.dumps({"jobs": jobs})) <= limits.batch_request_body_bytes_max
    answer: dict = {}

    def post() -> None:
        answer["r"] = shared_cluster.api("n1", "POST", "/v1/jobs:batchCreate", {"jobs": jobs},
                                         timeout_s=120)
    poster = threading.Thread(target=post)
    latencies = []
    poster.start()
    try:
        while poster.is_alive():
            started = time.monotonic()
            health = shared_cluster.api("n1", "GET", "/v1/healthz", timeout_s=30)
            latencies.append(time.monotonic() - started)
            assert health.status == 200, health
    finally:
        poster.join()
    result = answer["r"]
    assert result.status == 200, result
    assert all(r.get("created") for r in result.body["results"]), result.body["results"][:3]
    assert len(latencies) >= 3, latencies   # the batch took a while: it was watched
    assert max(latencies) < HEALTHZ_LATENCY_S_MAX, sorted(latencies)[-5:]


def test_a_job_of_a_batch_is_held_to_the_single_create_bound(shared_cluster):
    value = "v" * (limits.target_header_value_chars_max - 100)
    headers = {f"x-pad-{i}": value for i in range(limits.target_headers_max)}
    large = {"schedule": {"cron": "0 3 * * *"},
             "target": {"type": "http", "url": "http://127.0.0.1:9/x", "headers": headers}}
    assert len(json.dumps(large)) > limits.request_body_bytes_max
    single = shared_cluster.api("n1", "POST", "/v1/jobs", large)
    assert single.status == 413, single
    small = {"schedule": {"cron": "0 3 * * *"}, "target": {"type": "http",
                                                         "url": "http://127.0.0.1:9/x"}}
    result = shared_cluster.api("n1", "POST", "/v1/jobs:batchCreate", {"jobs": [small, large]})
    assert result.status == 200, result
    first, second = result.body["results"]
    assert first["created"] is True
    problem = second["error"]
    assert (problem["status"], problem["field"]) == (413, "jobs[1]")
    assert problem["limit"] == "request_body_bytes_max"
