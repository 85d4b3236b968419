"""Re-drive: a failed run's new attempt keeps its ids, obeys the job's concurrency policy or an overlap override, and is refused when it may not run."""

from __future__ import annotations

import pytest

from raftsched import limits
from raftsched.core import commands, keys, retry
from raftsched.core.apply import AUDIT, RUNS, RUNS_OPEN, RunQueued, Transition
from raftsched.testing.replica import EVERY_2S, HTTP, Replica

SHARDS = 16


def make_job(log: Replica, *, max_attempts: int = 1, concurrency: dict | None = None,
             tenant: str = "default") -> None:
    spec = {"name": "j", "schedule": EVERY_2S, "target": HTTP,
            "retry": dict(retry.DEFAULT_POLICY, max_attempts=max_attempts),
            "concurrency": concurrency or {"policy": "allow"},
            "misfire": {"policy": "fire_all", "tolerance_ms": 60_000, "catchup_max": 100},
            "alert": {}, "metadata": {}}
    shard = keys.shard_of("job_a1", SHARDS)
    log.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=1))
    log.run(commands.create_job(job_id="job_a1", tenant=tenant, spec=spec,
                                idempotency_key=None, shard=shard, next_ms=10_000, at_ms=1_000))


def fire_next(log: Replica) -> str:
    job = log.job()
    due = job["next_ms"]
    token = log.store.get("shards", keys.shard_key(job["shard"]))["token"]
    log.run(commands.fire(shard=job["shard"], token=token, upto_ms=due, node="n1", at_ms=due,
                          items=[("job_a1", due, due + 2000, [due], False)]))
    return keys.run_id("job_a1", due)


def update(run_id: str, event: str, attempt: int = 1, ok: bool = False,
           holder: str = "n1", at_ms: int = 10_100) -> dict:
    return {"run_id": run_id, "event": event, "holder": holder, "attempt": attempt,
            "at_ms": at_ms, "lease_ms": at_ms + 5000, "ok": ok, "retryable": True,
            "retry_delay_ms": 500, "http_status": 200 if ok else 500, "exit_code": None,
            "error": None if ok else "HTTP 500", "output_node": holder}


def report(log: Replica, *updates: dict) -> list[bool]:
    return log.run(commands.run_updates(updates=list(updates)))["accepted"]


def fail(log: Replica, run_id: str, attempt: int = 1, holder: str = "n1") -> None:
    # The run is held by its shard's owner (n1) from its queueing on: no start.
    assert report(log, update(run_id, "finish", attempt, holder=holder)) == [True]


def retry_run(log: Replica, run_id: str, **extra) -> dict:
    return log.run(commands.retry_run(run_id=run_id, node="n2", at_ms=20_000, **extra))


def failed_run(log: Replica, **job) -> str:
    make_job(log, **job)
    run_id = fire_next(log)
    fail(log, run_id)
    assert log.get_run(run_id)["state"] == "failed"
    return run_id


def test_a_failed_run_gets_a_new_attempt_under_the_same_ids():
    log = Replica()
    run_id = failed_run(log)
    before = log.get_run(run_id)
    result = retry_run(log, run_id)
    assert result["ok"], result
    run = log.get_run(run_id)
    assert run["id"] == run_id
    assert run["execution_id"] == before["execution_id"] == keys.execution_id("job_a1", 10_000)
    assert run["state"] == "running"
    assert run["attempt"] == 2
    assert (run["trigger"], run["first_trigger"], run["redrives"]) == ("retry", "schedule", 1)
    assert run["finished_ms"] is None and run["error"] is None
    # n2 took the request; the shard's owner holds the new attempt.
    assert (run["node"], run["holder"]) == ("n1", "n1")
    assert log.store.get(RUNS_OPEN, keys.open_run_key(log.job()["shard"], run_id)) == 1
    assert log.job()["active"] == [run_id]
    queued = [e.run for e in log.effects if isinstance(e, RunQueued)]
    assert queued[-1]["id"] == run_id and queued[-1]["attempt"] == 2
    # The old attempt stays listed; the new one is open (held from its queueing).
    assert [(a["attempt"], a["finished_ms"]) for a in run["attempts"]] == [(1, 10_100), (2, None)]
    # The new attempt runs and succeeds: the run ends as any other.
    assert report(log, update(run_id, "finish", 2, ok=True)) == [True]
    run = log.get_run(run_id)
    assert run["state"] == "succeeded"
    assert [a["attempt"] for a in run["attempts"]] == [1, 2]
    assert log.job()["active"] == []
    actions = [record["action"] for _, record in log.store.scan(AUDIT)]
    assert actions[-1] == "run.retry"


def test_only_a_failed_run_is_retried():
    log = Replica()
    make_job(log)
    run_id = fire_next(log)
    assert retry_run(log, run_id)["error"] == "conflict"          # running
    report(log, update(run_id, "finish", ok=True))
    refused = retry_run(log, run_id)
    assert refused["error"] == "conflict"
    assert "succeeded" in refused["detail"]
    assert retry_run(log, keys.run_id("job_a1", 99))["error"] == "not_found"


def test_another_tenants_run_is_not_found():
    log = Replica()
    run_id = failed_run(log)
    command = commands.scoped(commands.retry_run(run_id=run_id, node="n2", at_ms=20_000),
                              tenant="other", actor=None)
    assert log.run(command)["error"] == "not_found"
    assert log.get_run(run_id)["state"] == "failed"


def test_a_deleted_jobs_run_is_not_retried():
    log = Replica()
    run_id = failed_run(log)
    log.run(commands.delete_job(job_id="job_a1", at_ms=15_000))
    refused = retry_run(log, run_id)
    assert refused["error"] == "conflict"
    assert "deleted" in refused["detail"]


def test_the_retry_policy_applies_afresh_from_the_redrive():
    log = Replica()
    make_job(log, max_attempts=2)
    run_id = fire_next(log)
    fail(log, run_id)
    assert log.get_run(run_id)["state"] == "retry_wait"
    log.run(commands.fire(shard=log.job()["shard"], token=1, upto_ms=11_000, node="n1",
                          at_ms=11_000, items=[], retries=[(run_id, 10_600)]))
    fail(log, run_id, attempt=2)
    assert log.get_run(run_id)["state"] == "failed"
    assert retry_run(log, run_id)["ok"]
    fail(log, run_id, attempt=3)
    # Attempt 3 is the re-drive's first of two: it waits for a retry.
    assert log.get_run(run_id)["state"] == "retry_wait"


def test_skip_if_running_refuses_while_a_run_is_open_unless_overlap_allows():
    log = Replica()
    run_id = failed_run(log, concurrency={"policy": "skip_if_running"})
    open_run = fire_next(log)
    assert log.get_run(open_run)["state"] == "running"
    refused = retry_run(log, run_id)
    assert refused["error"] == "conflict"
    assert "skip_if_running" in refused["detail"]
    assert log.get_run(run_id)["state"] == "failed"
    assert retry_run(log, run_id, overlap="allow")["ok"]
    assert log.get_run(run_id)["state"] == "running"
    assert log.job()["active"] == [open_run, run_id]


def test_under_the_queue_policy_a_redrive_waits_its_turn():
    log = Replica()
    run_id = failed_run(log, concurrency={"policy": "queue", "queue_max": 5})
    open_run = fire_next(log)
    assert retry_run(log, run_id)["ok"]
    run = log.get_run(run_id)
    assert run["state"] == "scheduled"
    assert open_run in run["reason"]
    assert log.job()["waiting"] == [run_id]
    report(log, update(open_run, "finish", ok=True, at_ms=12_200))
    assert log.get_run(run_id)["state"] == "running"
    assert log.job()["active"] == [run_id]


def test_replace_cancels_the_open_run():
    log = Replica()
    run_id = failed_run(log, concurrency={"policy": "replace"})
    open_run = fire_next(log)
    assert retry_run(log, run_id)["ok"]
    assert log.get_run(open_run)["state"] == "cancelled"
    assert log.get_run(run_id)["state"] == "running"


def test_redrives_are_bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "run_redrives_max", 2)
    log = Replica()
    run_id = failed_run(log)
    for attempt in (2, 3):
        assert retry_run(log, run_id)["ok"]
        fail(log, run_id, attempt=attempt)
    refused = retry_run(log, run_id)
    assert refused["error"] == "limit"
    assert refused["limit"] == "run_redrives_max"
    assert log.get_run(run_id)["state"] == "failed"


def test_a_dag_task_run_is_not_retried_alone():
    log = Replica()
    run_id = failed_run(log)
    run = log.get_run(run_id)
    run["dag_run"] = "run_" + "0" * 24   # as core/dagrun.py marks a task's run
    log.index += 1
    log.store.commit(Transition(writes=((RUNS, run_id.encode(), run),), effects=(), result={}),
                     log.index)
    refused = retry_run(log, run_id)
    assert refused["error"] == "conflict"
    assert "DAG" in refused["detail"]


def test_trigger_with_overlap_allow_runs_despite_skip_if_running():
    log = Replica()
    make_job(log, concurrency={"policy": "skip_if_running"})
    open_run = fire_next(log)
    plain = log.run(commands.trigger_job(job_id="job_a1", scheduled_ms=30_000, node="n1",
                                         at_ms=30_000))
    assert plain["run"]["state"] == "skipped"
    forced = log.run(commands.trigger_job(job_id="job_a1", scheduled_ms=31_000, node="n1",
                                          at_ms=31_000, overlap="allow"))
    assert forced["run"]["state"] == "running"
    assert forced["run"]["trigger"] == "manual"
    assert log.job()["active"] == [open_run, forced["run"]["id"]]
    # The override is for that one run: the next occurrence follows the policy again.
    assert log.get_run(fire_next(log))["state"] == "skipped"


def test_trigger_override_keeps_the_open_runs_bound(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "job_active_runs_max", 1)
    log = Replica()
    make_job(log, concurrency={"policy": "skip_if_running"})
    fire_next(log)
    forced = log.run(commands.trigger_job(job_id="job_a1", scheduled_ms=31_000, node="n1",
                                          at_ms=31_000, overlap="allow"))
    assert forced["run"]["state"] == "skipped"
    assert "job_active_runs_max" in forced["run"]["reason"]
