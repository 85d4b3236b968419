"""On a live cluster, the worst fire a tenant can cause (many DAG jobs of dag_tasks_max tasks due on the same second) stalls no replica's Raft thread: no node's term changes while it fires, and every task runs once."""

from __future__ import annotations

import datetime as dt

import pytest

from raftsched import limits
from raftsched.testing.fastsink import FastSink
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration

# DAG jobs due at one instant: their task runs (JOBS * dag_tasks_max) in one
# fire entry held each replica's Raft thread past the election timeout.
JOBS = 60
# From the create to the due instant: room to create every job first.
DUE_IN_S = 15
# The most CPU one entry's apply may take on a node: half the shortest
# election timeout.
APPLY_ENTRY_MS_MAX = limits.election_timeout_min_s * 1000 / 2


def dag_job(url: str, run_at: str, i: int) -> dict:
    return {"name": f"wide-{i}", "run_at": run_at, "retry": {"max_attempts": 1},
            "dag": {"tasks": [{"id": f"t{n}", "target": {"type": "http", "url": url}}
                              for n in range(limits.dag_tasks_max)]}}


def terms(cluster) -> dict[str, int]:
    return {nid: cluster.api(nid, "GET", "/v1/node", timeout_s=5).body["term"]
            for nid in cluster.ids}


def test_a_fire_of_many_maximal_dag_jobs_causes_no_election_and_runs_every_task(fresh_cluster):
    cluster = fresh_cluster
    with FastSink() as sink:
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=DUE_IN_S)
        run_at = at.isoformat(timespec="seconds").replace("+00:00", "Z")
        created = cluster.api("n1", "POST", "/v1/jobs:batchCreate",
                              {"jobs": [dag_job(sink.url, run_at, i) for i in range(JOBS)]},
                              timeout_s=60)
        assert created.status == 200, created
        assert all(r.get("created") for r in created.body["results"]), created.body
        before = terms(cluster)
        assert len(set(before.values())) == 1, before
        tasks = JOBS * limits.dag_tasks_max
        seen: list[dict[str, int]] = []

        def every_task_called() -> bool:
            seen.append(terms(cluster))
            return sink.stats()["calls"] >= tasks
        wait_until(every_task_called, DUE_IN_S + 120, f"{tasks} task calls", 0.1)
        status = {nid: cluster.api(nid, "GET", "/v1/node", timeout_s=5).body
                  for nid in cluster.ids}
        slowest = {nid: (s["apply_entry_ms_max"], s["apply_entry_slowest"])
                   for nid, s in status.items()}
        changed = [t for t in seen if t != before]
        assert not changed, f"a term changed while the fire applied: {before} -> " \
                            f"{changed[0]}; slowest applies {slowest}"
        # No entry held a Raft thread for half an election timeout (CPU of
        # that thread; entries are sized for about 50 ms, and a collection of
        # the interpreter's garbage may land in one).
        assert all(ms < APPLY_ENTRY_MS_MAX for ms, _ in slowest.values()), slowest
        calls = sink.stats()
        assert calls["calls"] == tasks, calls   # each task once, none twice
        assert calls["jobs"] == JOBS, calls
