"""Runs fired ahead are called at their second: never early, once, by the shard's owner, and not at all once edited."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from raftsched.testing.cluster import LocalCluster, shift_clock, shiftable_cluster
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """One 3-node cluster (default --arm-ahead-s) whose clocks a test may shift."""
    with shiftable_cluster(tmp_path_factory.mktemp("arming")) as local:
        yield local


def at(seconds: float) -> str:
    when = dt.datetime.fromtimestamp(time.time() + seconds, dt.timezone.utc)
    return when.isoformat(timespec="milliseconds")


def one_off(cluster: LocalCluster, sink, due_in_s: float, via: str = "n1") -> dict:
    answer = cluster.api(via, "POST", "/v1/jobs", {
        "name": "armed", "run_at": at(due_in_s),
        "target": {"type": "http", "url": sink.url, "timeout_s": 5}})
    assert answer.status == 201, answer
    return answer.body


def runs_of(cluster: LocalCluster, job_id: str, via: str = "n1") -> list[dict]:
    return cluster.api(via, "GET", f"/v1/jobs/{job_id}/runs?consistent=true").body["runs"]


def wait_armed(cluster: LocalCluster, job_ids: list[str], via: str = "n1") -> dict[str, dict]:
    """Every job's run exists before its second, held by its shard's owner
    (the API says `armed` until its second): it was fired ahead."""
    armed: dict[str, dict] = {}

    def all_armed() -> bool:
        for job_id in job_ids:
            runs = runs_of(cluster, job_id, via)
            if runs and runs[0]["state"] == "armed":
                armed[job_id] = runs[0]
        return len(armed) == len(job_ids)
    wait_until(all_armed, 5, "every one-off fired ahead of its second")
    for job_id, run in armed.items():
        assert time.time() < scheduled_s(run), (job_id, run)
    return armed


def scheduled_s(run: dict) -> float:
    return dt.datetime.fromisoformat(run["scheduled_for"].replace("Z", "+00:00")).timestamp()


def test_edits_before_the_second_withdraw_armed_runs(cluster, sink):
    jobs = {edit: one_off(cluster, sink, 5.0) for edit in ("pause", "delete", "patch", "cancel",
                                                             "none")}
    armed = wait_armed(cluster, [j["job_id"] for j in jobs.values()])
    ids = {edit: job["job_id"] for edit, job in jobs.items()}
    # The edits come 1.5 s before the second (the runs were armed seconds before).
    due_s = min(scheduled_s(run) for run in armed.values())
    wait_until(lambda: time.time() >= due_s - 1.5, 5, "1.5 s before the due second", 0.01)
    assert cluster.api("n2", "POST", f"/v1/jobs/{ids['pause']}:pause").status == 200
    assert cluster.api("n3", "DELETE", f"/v1/jobs/{ids['delete']}").status == 204
    patched = cluster.api("n1", "PATCH", f"/v1/jobs/{ids['patch']}", {"run_at": at(6.0)})
    assert patched.status == 200, patched
    cancelled = cluster.api("n2", "POST", f"/v1/runs/{armed[ids['cancel']]['run_id']}:cancel")
    assert cancelled.status == 200, cancelled
    wait_until(lambda: ids["none"] in sink.by_job() and ids["patch"] in sink.by_job(), 15,
               "the unedited one-off and the patched one called")
    calls = sink.by_job()
    assert not {ids["pause"], ids["delete"], ids["cancel"]} & set(calls), calls.keys()
    assert len(calls[ids["patch"]]) == 1
    assert calls[ids["patch"]][0].lateness_s >= 0
    assert calls[ids["patch"]][0].scheduled_s > scheduled_s(armed[ids["patch"]]) + 1
    for edit in ("pause", "delete"):
        [run] = runs_of(cluster, ids[edit])
        assert run["state"] == "cancelled"
        assert run["reason"].startswith("withdrawn: "), run


def test_a_node_skewed_ahead_never_calls_an_armed_run_early(cluster, sink):
    leader = cluster.wait_ready()
    victim = next(nid for nid in cluster.ids if nid != leader)
    wait_until(lambda: cluster.api(victim, "GET", "/v1/node").body["shards_owned"] > 0, 15,
               f"{victim} owning shards")
    jobs = [one_off(cluster, sink, 3.5 + i * 0.1) for i in range(20)]
    armed = wait_armed(cluster, [j["job_id"] for j in jobs])
    assert any(run["node"] == victim for run in armed.values()), "none armed on the victim"
    shift_clock(cluster, victim, 5000)
    try:
        wait_until(lambda: all(j["job_id"] in sink.by_job() for j in jobs), 15,
                   "every one-off called")
    finally:
        shift_clock(cluster, victim, 0)
    assert_called_once_none_early(sink, jobs)
    wait_until(lambda: cluster.api(victim, "GET", "/v1/node").body["shards_owned"] > 0, 15,
               f"{victim} owning shards again")


def armed_on_a_follower(cluster: LocalCluster, sink) -> tuple[str, str, list[dict], list[str]]:
    """20 one-offs due in about 4 s, fired ahead, some of them on a follower
    (the victim): (leader, victim, the jobs, the victim's job ids)."""
    leader = cluster.wait_ready()
    victim = next(nid for nid in cluster.ids if nid != leader)
    wait_until(lambda: cluster.api(victim, "GET", "/v1/node").body["shards_owned"] > 0, 15,
               f"{victim} owning shards")
    jobs = [one_off(cluster, sink, 4.0 + i * 0.05, via=leader) for i in range(20)]
    armed = wait_armed(cluster, [j["job_id"] for j in jobs], via=leader)
    mine = [job_id for job_id, run in armed.items() if run["node"] == victim]
    assert mine, "no one-off was armed on the victim"
    return leader, victim, jobs, mine


def assert_called_once_none_early(sink, jobs: list[dict]) -> None:
    calls = sink.by_job()
    for job in jobs:
        assert len(calls[job["job_id"]]) == 1, calls[job["job_id"]]
        assert calls[job["job_id"]][0].lateness_s >= 0, job


def test_an_armed_runs_owner_frozen_its_runs_are_called_once_by_the_new_owner(cluster, sink):
    leader, victim, jobs, mine = armed_on_a_follower(cluster, sink)
    cluster.pause(victim)
    try:
        wait_until(lambda: all(j["job_id"] in sink.by_job() for j in jobs), 20,
                   "every one-off called")
    finally:
        cluster.resume(victim)
    # Woken, the frozen owner still holds its armed runs, now past their
    # second: it must not call them (they were moved while it slept).
    wait_until(lambda: cluster.api(victim, "GET", "/v1/node").body["armed_runs"] == 0, 15,
               f"{victim} holding no armed run")
    assert_called_once_none_early(sink, jobs)
    for job_id in mine:
        # The sink saw the call before its finish is applied: wait for it.
        [run] = wait_until(lambda: (runs := runs_of(cluster, job_id, via=leader))
                           and runs[0]["state"] == "succeeded" and runs, 15,
                           f"the run of {job_id} to succeed")
        # The attempt that ran is the new owner's (the victim's, opened at
        # fire, was taken over before its second or ended by the takeover).
        assert run["attempts"][-1]["holder"] != victim, run


def test_an_armed_runs_owner_killed_its_runs_are_called_once_by_the_new_owner(cluster, sink):
    leader, victim, jobs, mine = armed_on_a_follower(cluster, sink)
    cluster.kill(victim)
    try:
        wait_until(lambda: all(j["job_id"] in sink.by_job() for j in jobs), 20,
                   "every one-off called")
        assert_called_once_none_early(sink, jobs)
        for job_id in mine:
            [run] = runs_of(cluster, job_id, via=leader)
            assert run["attempts"][-1]["holder"] != victim, run
    finally:
        cluster.start(victim)
        cluster.wait_ready()
