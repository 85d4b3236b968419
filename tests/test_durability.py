"""The Raft journal reaches the disk: once a second by default, and before a write commits under --fsync always."""

from __future__ import annotations

import pytest

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration

BODY = {"schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}


def flushes(cluster: LocalCluster) -> dict[str, int]:
    return {nid: cluster.api(nid, "GET", "/v1/node").body["journal_flushes_total"]
            for nid in cluster.ids}


def test_the_journal_is_flushed_every_second_by_default(tmp_path):
    with LocalCluster(tmp_path / "c") as cluster:
        cluster.wait_ready()
        assert {cluster.api(n, "GET", "/v1/node").body["fsync"] for n in cluster.ids} == \
            {"periodic"}
        before = flushes(cluster)
        wait_until(lambda: all(count >= before[nid] + 2 for nid, count in flushes(cluster).items()),
                   5, "every node to flush its journal twice more (once a second)")


def test_fsync_always_flushes_before_each_write_commits(tmp_path):
    writes = 30
    with LocalCluster(tmp_path / "c", node_args=["--fsync", "always"]) as cluster:
        leader = cluster.wait_ready()
        assert cluster.api(leader, "GET", "/v1/node").body["fsync"] == "always"
        before = flushes(cluster)
        # One write at a time: each is its own Raft append, which the leader
        # flushes before it counts itself and each follower before it acknowledges.
        for i in range(writes):
            # A 503 (a leader change on a busy machine) is retried: the key makes it one job.
            body = dict(BODY, name=f"d{i}", idempotency_key=f"durable-{i}")
            wait_until(lambda: cluster.api(cluster.ids[i % 3], "POST", "/v1/jobs", body).status
                       in (200, 201), 20, f"create {i} to commit")
        grown = {nid: count - before[nid] for nid, count in flushes(cluster).items()}
        assert all(delta >= writes for delta in grown.values()), grown
