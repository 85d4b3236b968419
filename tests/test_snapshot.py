"""Snapshots: a lagging node catches up from one, a restart loads its own, and a large state is snapshotted without an election."""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time

import pytest

from raftsched import limits
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call, wait_until

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


class RaftWatch:
    """Samples every node's Raft term and leader, every `period_s`, on a thread,
    until the block ends. Any election, even a lost one, raises some term."""

    def __init__(self, cluster: LocalCluster, period_s: float = 0.1) -> None:
        self.cluster = cluster
        self.period_s = period_s
        self.seen: dict[str, set[tuple[int, str | None]]] = {n: set() for n in cluster.ids}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for nid in self.cluster.ids:
                try:
                    body = call("GET", self.cluster.url(nid) + "/v1/node", timeout_s=2).body
                except OSError:
                    continue   # a busy node answers late; the next sample will do
                self.seen[nid].add((body["term"], body["leader_raft"]))
                self.samples += 1

    def __enter__(self) -> "RaftWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def snapshots_written(cluster: LocalCluster) -> dict[str, int]:
    return {nid: cluster.api(nid, "GET", "/v1/node").body["snapshots_written_total"]
            for nid in cluster.ids}


def settled(cluster: LocalCluster, quiet_s: float = 2.0) -> None:
    """Wait until every node reports one term and leader, unchanged for quiet_s
    (longer than the longest election timeout): elections among nodes that
    started at different moments are over."""
    def views() -> set:
        return {(b["term"], b["leader_raft"]) for b in
                (cluster.api(nid, "GET", "/v1/node").body for nid in cluster.ids)}

    def steady() -> bool:
        first = views()
        time.sleep(quiet_s)
        return len(first) == 1 and views() == first

    wait_until(steady, 30, "the nodes to agree on one term and leader")


def test_snapshots_of_a_large_state_never_stall_raft(tmp_path):
    jobs, batch = 200_000, limits.batch_create_jobs_max
    body = {"schedule": {"cron": "0 4 * * *", "timezone": "UTC"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}

    def create(cluster: LocalCluster, i: int) -> None:
        answer = call("POST", cluster.url(cluster.ids[i % 3]) + "/v1/jobs:batchCreate",
                      {"jobs": [dict(body, name=f"big-{i}-{k}") for k in range(batch)]},
                      timeout_s=30)
        assert answer.status == 200, answer
        refused = [r for r in answer.body["results"] if not r.get("created")]
        assert refused == [], refused[:3]

    with LocalCluster(tmp_path / "c", node_args=["--raft-snapshot-entries", "150"]) as cluster:
        cluster.wait_ready()
        settled(cluster)
        started = time.monotonic()
        with RaftWatch(cluster) as watch:
            # One batch at a time: the test itself should not be what starves
            # the nodes' Raft threads on a small machine.
            for i in range(jobs // batch):
                create(cluster, i)
            loaded_s = time.monotonic() - started
            # At least one more snapshot on every node, of the whole state.
            after_load = snapshots_written(cluster)
            wait_until(lambda: all(count > after_load[nid]
                                   for nid, count in snapshots_written(cluster).items()),
                       60, "every node to snapshot the whole state")
        for nid, seen in watch.seen.items():
            assert len(seen) == 1, f"{nid} saw terms and leaders {sorted(seen, key=str)}"
        assert len(set().union(*watch.seen.values())) == 1, watch.seen
        assert watch.samples > 100
        written = snapshots_written(cluster)
        assert all(count >= 3 for count in written.values()), written
        cluster.ensure_same(60)
        lines = [line for nid in cluster.ids for line in cluster.logs(nid, 10 ** 7).splitlines()
                 if "snapshot written" in line]
        sizes = [int(m.group(1)) for m in map(re.compile(r"(\d+) bytes").search, lines) if m]
        times = [float(m.group(1)) for m in map(re.compile(r" in ([\d.]+) s").search, lines) if m]
        print(f"{jobs} jobs created in {loaded_s:.1f} s; {len(lines)} snapshots, largest "
              f"{max(sizes)} bytes, slowest {max(times):.2f} s; whole test "
              f"{time.monotonic() - started:.1f} s")
