"""Backfill on three real nodes: a dry run lists the occurrences; a backfill runs each one once, in range, in the job's zone, at most max_concurrent at a time, not again where a run exists; cancel stops it; it survives a leader SIGKILL."""

from __future__ import annotations

import datetime as dt
import time
from zoneinfo import ZoneInfo

import pytest

from raftsched import limits
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration

BERLIN = ZoneInfo("Europe/Berlin")


def month_starts(year: int, months: range, tz: dt.tzinfo = BERLIN) -> list[float]:
    return [dt.datetime(year, m, 1, tzinfo=tz).timestamp() for m in months]


def monthly_job(cluster, sink, nid: str = "n1", timezone: str = "Europe/Berlin") -> str:
    """A job that fires at midnight on the 1st: none falls inside a test."""
    created = cluster.api(nid, "POST", "/v1/jobs", {
        "name": "monthly", "schedule": {"cron": "0 0 1 * *", "timezone": timezone},
        "target": {"type": "http", "url": sink.url, "timeout_s": 10}})
    assert created.status == 201, created
    return created.body["job_id"]


def start_backfill(cluster, nid: str, job_id: str, body: dict) -> dict:
    started = cluster.api(nid, "POST", f"/v1/jobs/{job_id}:backfill", body)
    assert started.status == 202, started
    assert started.headers["Location"] == f"/v1/backfills/{started.body['backfill_id']}"
    return started.body


def wait_ended(cluster, backfill_id: str, timeout_s: float, among: list[str] | None = None,
               state: str = "succeeded") -> dict:
    def ended() -> dict | None:
        for nid in among or cluster.ids:
            answer = cluster.api(nid, "GET", f"/v1/backfills/{backfill_id}?consistent=true",
                                 timeout_s=6)
            if answer.status == 200 and answer.body["state"] != "running":
                return answer.body
        return None

    body = wait_until(ended, timeout_s, f"backfill {backfill_id} to end")
    assert body["state"] == state, body
    return body


def job_runs(cluster, nid: str, job_id: str) -> list[dict]:
    answer = cluster.api(nid, "GET", f"/v1/jobs/{job_id}/runs?limit=500&consistent=true")
    assert answer.status == 200, answer
    return answer.body["runs"]


def scheduled_s(run: dict) -> float:
    return dt.datetime.fromisoformat(run["scheduled_for"].replace("Z", "+00:00")).timestamp()


def test_a_dry_run_lists_the_occurrences_in_the_jobs_zone_and_runs_nothing(shared_cluster,
                                                                            sink):
    cluster = shared_cluster
    job_id = monthly_job(cluster, sink)
    listed = cluster.api("n2", "POST", f"/v1/jobs/{job_id}:backfill", {
        "start": "2025-01-01T00:00:00+01:00", "end": "2025-07-01T00:00:00+02:00",
        "dry_run": True})
    assert listed.status == 200, listed
    assert listed.body == {"backfill_id": None, "dry_run": True, "occurrences": 6,
                           "existing": 0, "scheduled_for": [
                               "2025-01-01T00:00:00+01:00", "2025-02-01T00:00:00+01:00",
                               "2025-03-01T00:00:00+01:00", "2025-04-01T00:00:00+02:00",
                               "2025-05-01T00:00:00+02:00", "2025-06-01T00:00:00+02:00"]}
    assert job_runs(cluster, "n3", job_id) == []
    # More occurrences than backfill_occurrences_max, a range ending in the
    # future, and a range with none are refused, naming the member.
    every_second = cluster.api("n1", "POST", "/v1/jobs", {
        "schedule": {"every": "1s"}, "target": {"type": "http", "url": sink.url}}).body
    cluster.api("n1", "POST", f"/v1/jobs/{every_second['job_id']}:pause")
    too_many = cluster.api("n1", "POST", f"/v1/jobs/{every_second['job_id']}:backfill", {
        "start": "2025-01-01T00:00:00Z", "end": "2025-01-01T03:00:00Z", "dry_run": True})
    assert (too_many.status, too_many.body["limit"]) == (400, "backfill_occurrences_max")
    future = cluster.api("n1", "POST", f"/v1/jobs/{job_id}:backfill", {
        "start": "2025-01-01T00:00:00Z", "end": "2999-01-01T00:00:00Z"})
    assert (future.status, future.body["field"]) == (400, "end")
    empty = cluster.api("n1", "POST", f"/v1/jobs/{job_id}:backfill", {
        "start": "2025-01-02T00:00:00Z", "end": "2025-01-03T00:00:00Z"})
    assert (empty.status, empty.body["field"]) == (400, "start")


def test_a_backfill_runs_each_occurrence_once_at_most_max_concurrent_at_a_time(
        shared_cluster, sink):
    cluster = shared_cluster
    sink.delay_s = 0.4   # slow enough that three calls overlap
    job_id = monthly_job(cluster, sink)
    started = start_backfill(cluster, "n3", job_id, {
        "start": "2025-01-01T00:00:00+01:00", "end": "2026-01-01T00:00:00+01:00",
        "max_concurrent": 3})
    assert started["occurrences"] == 12
    status = wait_ended(cluster, started["backfill_id"], 30)
    assert {k: status[k] for k in ("total", "done", "succeeded", "failed", "running",
                                   "existing")} == {"total": 12, "done": 12, "succeeded": 12,
                                                    "failed": 0, "running": 0, "existing": 0}
    calls = sink.by_job()[job_id]
    assert sorted(c.scheduled_s for c in calls) == month_starts(2025, range(1, 13))
    assert sink.inflight_max[job_id] == 3
    runs = job_runs(cluster, "n1", job_id)
    assert len(runs) == 12
    assert {r["trigger"] for r in runs} == {"backfill"}
    assert {c.headers["Idempotency-Key"] for c in calls} == {r["execution_id"] for r in runs}

    # Again over a range that overlaps it: only the occurrence without a run runs.
    again = start_backfill(cluster, "n1", job_id, {
        "start": "2024-12-01T00:00:00+01:00", "end": "2025-03-01T00:00:00+01:00",
        "max_concurrent": 3})
    assert again["occurrences"] == 3
    status = wait_ended(cluster, again["backfill_id"], 20)
    assert (status["existing"], status["succeeded"], status["done"]) == (2, 3, 3)
    calls = sink.by_job()[job_id]
    assert sorted(c.scheduled_s for c in calls) == month_starts(2024, range(12, 13)) + \
        month_starts(2025, range(1, 13))


def test_occurrences_the_schedule_ran_are_not_run_again(shared_cluster, sink):
    cluster = shared_cluster
    created = cluster.api("n2", "POST", "/v1/jobs", {
        "schedule": {"cron": "*/2 * * * * *"},
        "target": {"type": "http", "url": sink.url, "timeout_s": 5}})
    job_id = created.body["job_id"]
    wait_until(lambda: len(sink.by_job().get(job_id, [])) >= 2, 15, "two scheduled runs")
    assert cluster.api("n2", "POST", f"/v1/jobs/{job_id}:pause").status == 200
    fired = sorted(c.scheduled_s for c in sink.by_job()[job_id])
    # Three occurrences before the job existed, and the two the schedule ran.
    start_s, end_s = fired[0] - 6, fired[1] + 0.001
    started = start_backfill(cluster, "n1", job_id, {
        "start": dt.datetime.fromtimestamp(start_s, dt.timezone.utc).isoformat(),
        "end": dt.datetime.fromtimestamp(end_s, dt.timezone.utc).isoformat(),
        "max_concurrent": 5})
    assert started["occurrences"] == 5
    status = wait_ended(cluster, started["backfill_id"], 20)
    assert (status["existing"], status["succeeded"]) == (2, 5)
    in_range = [c.scheduled_s for c in sink.by_job()[job_id] if start_s <= c.scheduled_s < end_s]
    assert sorted(in_range) == [fired[0] - 6, fired[0] - 4, fired[0] - 2, fired[0], fired[1]]
    backfilled = [r for r in job_runs(cluster, "n3", job_id) if r["trigger"] == "backfill"]
    assert sorted(scheduled_s(r) for r in backfilled) == [fired[0] - 6, fired[0] - 4,
                                                          fired[0] - 2]


def test_cancel_stops_a_backfill_and_its_running_run(shared_cluster, sink):
    cluster = shared_cluster
    sink.delay_s = 3.0
    job_id = monthly_job(cluster, sink)
    started = start_backfill(cluster, "n2", job_id, {
        "start": "2025-01-01T00:00:00+01:00", "end": "2026-01-01T00:00:00+01:00"})
    wait_until(lambda: sink.by_job().get(job_id), 10, "the first backfill call")
    cancelled = cluster.api("n3", "POST", f"/v1/backfills/{started['backfill_id']}:cancel",
                            {"reason": "wrong range"})
    assert cancelled.status == 200, cancelled
    assert (cancelled.body["state"], cancelled.body["reason"]) == ("cancelled", "wrong range")
    assert (cancelled.body["running"], cancelled.body["done"]) == (0, 1)
    runs = job_runs(cluster, "n3", job_id)
    assert [r["state"] for r in runs] == ["cancelled"]
    # Nothing more starts: several backfiller passes later there is still one
    # call and one run (an absence cannot be polled for).
    time.sleep(5 * limits.backfill_period_ms / 1000)
    assert len(sink.by_job()[job_id]) == 1
    assert len(job_runs(cluster, "n1", job_id)) == 1
    again = cluster.api("n1", "GET", f"/v1/backfills/{started['backfill_id']}")
    assert again.body["state"] == "cancelled"


def test_a_backfill_survives_a_leader_kill_and_runs_each_occurrence_once(fresh_cluster,
                                                                          sink):
    cluster = fresh_cluster
    sink.delay_s = 0.3
    utc = dt.timezone.utc
    job_id = monthly_job(cluster, sink, timezone="UTC")
    started = start_backfill(cluster, "n1", job_id, {
        "start": "2023-01-01T00:00:00Z", "end": "2025-01-01T00:00:00Z", "max_concurrent": 2})
    assert started["occurrences"] == 24
    wait_until(lambda: len(sink.by_job().get(job_id, [])) >= 4, 15, "four backfill calls")
    leader = cluster.leader()
    midway = cluster.api(leader, "GET", f"/v1/backfills/{started['backfill_id']}")
    assert midway.body["state"] == "running", midway   # the kill falls inside the backfill
    cluster.kill(leader)
    live = [nid for nid in cluster.ids if nid != leader]
    cluster.wait_ready(among=live)
    status = wait_ended(cluster, started["backfill_id"], 60, among=live)
    assert (status["total"], status["succeeded"], status["done"]) == (24, 24, 24)
    expected = month_starts(2023, range(1, 13), utc) + month_starts(2024, range(1, 13), utc)
    runs = job_runs(cluster, live[0], job_id)
    assert sorted(scheduled_s(r) for r in runs) == expected   # one run per occurrence
    assert {r["state"] for r in runs} == {"succeeded"}
    calls = sink.by_job()[job_id]
    assert sorted({c.scheduled_s for c in calls}) == expected
    attempts = {scheduled_s(r): r["attempt"] for r in runs}
    for when in expected:
        # At least once: a call cut off by the kill is made again by the
        # run's next attempt, under the same execution id.
        assert len([c for c in calls if c.scheduled_s == when]) <= attempts[when]
    cluster.ensure_same(among=live)
