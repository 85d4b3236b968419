"""32 batchCreates of 1,000 one-offs at once on a 3-node cluster: each is committed whole or refused busy before proposal, none is answered with an unknown outcome, and every job answered created exists on every node."""

from __future__ import annotations

import pytest

from raftsched.testing.bench import BATCH, BURST_CLIENTS, batch_burst
from raftsched.testing.http import call

pytestmark = pytest.mark.integration


def _job_ids(cluster, nid: str) -> set[str]:
    """Every job id the node lists (one-offs due in a day: none is finished)."""
    ids: set[str] = set()
    token = None
    while True:
        query = "?limit=500" + (f"&page_token={token}" if token else "")
        page = cluster.api(nid, "GET", "/v1/jobs" + query).body
        ids.update(job["job_id"] for job in page["jobs"])
        token = page["next_page_token"]
        if token is None:
            return ids


def test_concurrent_batches_are_committed_or_refused_busy_never_left_unknown(fresh_cluster):
    cluster = fresh_cluster
    burst = batch_burst([cluster.url(nid) for nid in cluster.ids], context=cluster.client_ssl)
    assert burst["outcome_unknown"] == 0, burst
    assert burst["other"] == 0, burst
    assert burst["committed"] + burst["busy"] == BURST_CLIENTS
    assert burst["committed"] > 0
    assert len(burst["job_ids"]) == burst["committed"] * BATCH
    cluster.ensure_same(120)
    for nid in cluster.ids:
        assert _job_ids(cluster, nid) == set(burst["job_ids"]), nid
    # Once the burst is answered, the node takes a whole batch again.
    again = call("POST", cluster.url(cluster.ids[0]) + "/v1/jobs:batchCreate",
                 {"jobs": [{"run_at": "2030-01-01T00:00:00Z",
                            "target": {"type": "http", "url": "http://127.0.0.1:9/"}}] * BATCH},
                 timeout_s=60, context=cluster.client_ssl)
    assert again.status == 200
