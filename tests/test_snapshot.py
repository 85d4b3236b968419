"""A node that fell behind a compacted log catches up from a snapshot of the LMDB state."""

from __future__ import annotations

import concurrent.futures

import pytest

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration


def test_lagging_node_installs_a_snapshot_and_converges(tmp_path):
    with LocalCluster(tmp_path / "c", node_args=["--raft-snapshot-entries", "40"]) as cluster:
        cluster.wait_ready()
        cluster.kill("n3")
        leader = cluster.wait_ready(among=["n1", "n2"])
        body = {"name": "snap", "schedule": {"cron": "0 4 * * *"},
                "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}

        def create(i: int) -> str:
            r = cluster.api(["n1", "n2"][i % 2], "POST", "/v1/jobs", dict(body, name=f"s{i}"))
            assert r.status == 201, r
            return r.body["job_id"]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(create, range(150)))
        wait_until(lambda: "snapshot written" in cluster.logs(leader, 200_000), 20,
                   "the leader to write a snapshot")

        cluster.start("n3")
        cluster.wait_ready()
        wait_until(lambda: "installing a snapshot" in cluster.logs("n3", 200_000), 30,
                   "n3 to install the leader's snapshot")
        cluster.ensure_same()
        for job_id in (ids[0], ids[-1]):
            assert cluster.api("n3", "GET", f"/v1/jobs/{job_id}").status == 200

        # A restart loads the node's own snapshot and replays the rest of its journal.
        cluster.kill("n1")
        cluster.start("n1")
        cluster.wait_ready()
        assert cluster.api("n1", "POST", "/v1/jobs", body).status == 201
        cluster.ensure_same()
