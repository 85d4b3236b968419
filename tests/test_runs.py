"""Runs in apply: leases and holders, durable retries, failure alerts, the
concurrency policies, cancel, the reaper's commands, and built-in topics."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core import commands, keys, lifecycle, retry
from raftsched.core.apply import (ALERTS, DUE, LEASES, READY, RUNS_OPEN, TOPICS,
                                  AlertPending, RunCancelled, RunQueued)
from raftsched.testing.proptest import examples
from raftsched.testing.replica import EVERY_2S, HTTP, Replica
from raftsched.errors import InvalidTransition

SHARDS = 16


def make_job(log: Replica, job_id: str = "job_a1", target: dict = HTTP, max_attempts: int = 3,
             concurrency: dict | None = None, alert: dict | None = None) -> int:
    spec = {"name": "j", "schedule": EVERY_2S, "target": target,
            "retry": dict(retry.DEFAULT_POLICY, max_attempts=max_attempts),
            "concurrency": concurrency or {"policy": "allow"}, "misfire": None,
            "alert": alert or {}, "metadata": {}}
    spec["misfire"] = {"policy": "fire_all", "tolerance_ms": 60_000, "catchup_max": 100}
    shard = keys.shard_of(job_id, SHARDS)
    log.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=1))
    log.run(commands.create_job(job_id=job_id, tenant="default", spec=spec, idempotency_key=None,
                                shard=shard, next_ms=10_000, at_ms=1_000))
    return shard


def fire_next(log: Replica, job_id: str = "job_a1") -> str:
    """Fire the job's next occurrence on n1; return its run id."""
    job = log.job(job_id)
    due = job["next_ms"]
    token = log.store.get("shards", keys.shard_key(job["shard"]))["token"]
    log.run(commands.fire(shard=job["shard"], token=token, upto_ms=due, node="n1", at_ms=due,
                          items=[(job_id, due, due + 2000, [due], False)]))
    return keys.run_id(job_id, due)


def update(run_id: str, event: str, *, holder: str = "n1", attempt: int = 1, at_ms: int = 10_100,
           ok: bool = False, retryable: bool = True, delay_ms: int = 500,
           lease_ms: int = 15_000) -> dict:
    return {"run_id": run_id, "event": event, "holder": holder, "attempt": attempt,
            "at_ms": at_ms, "lease_ms": lease_ms, "ok": ok, "retryable": retryable,
            "retry_delay_ms": delay_ms, "http_status": 500 if not ok else 200,
            "exit_code": None, "error": None if ok else "HTTP 500", "output_node": "n1"}


def report(log: Replica, *updates: dict) -> list[bool]:
    return log.run(commands.run_updates(updates=list(updates)))["accepted"]


def fire_retry(log: Replica, run_id: str) -> None:
    run = log.get_run(run_id)
    job = log.job(run["job_id"])
    token = log.store.get("shards", keys.shard_key(job["shard"]))["token"]
    due = run["retry_due_ms"]
    log.run(commands.fire(shard=job["shard"], token=token, upto_ms=due, node="n1", at_ms=due,
                          items=[], retries=[(run_id, due)]))


# --- leases and holders ---------------------------------------------------------------

def test_a_fired_run_is_held_by_its_shards_owner_and_only_that_attempt_may_report():
    log = Replica()
    shard = make_job(log)
    run_id = fire_next(log)
    run = log.get_run(run_id)
    # The lease is taken at fire: n1 owns the shard under token 1.
    assert (run["state"], run["holder"], run["token"], run["lease_ms"]) == \
        ("running", "n1", 1, None)
    assert [(a["attempt"], a["holder"], a["started_ms"]) for a in run["attempts"]] == \
        [(1, "n1", 10_000)]
    assert log.store.scan(LEASES) == []   # no lease of its own: its holder's shard lease
    assert log.store.get(RUNS_OPEN, keys.open_run_key(shard, run_id)) == 1
    assert report(log, update(run_id, "start")) == [False]   # never started by report
    assert report(log, update(run_id, "heartbeat", lease_ms=20_000)) == [False]
    assert report(log, update(run_id, "finish", holder="n2", ok=True)) == [False]
    assert report(log, update(run_id, "finish", attempt=2, ok=True)) == [False]
    assert report(log, update(run_id, "finish", ok=True)) == [True]
    run = log.get_run(run_id)
    assert run["state"] == "succeeded"
    assert log.store.scan(LEASES) == []
    assert log.store.get(RUNS_OPEN, keys.open_run_key(shard, run_id)) is None
    assert log.job()["active"] == []


def test_a_moved_shards_open_run_is_taken_over_once_and_the_old_finish_is_refused():
    log = Replica()
    shard = make_job(log)
    run_id = fire_next(log)
    log.run(commands.assign_shards(assignments=[(shard, "n2")], at_ms=11_000))

    def take_over(node: str, token: int) -> dict:
        return log.run(commands.take_over_runs(node=node, shard=shard, token=token,
                                               run_ids=[run_id], at_ms=11_100))

    # Only the shard's owner under its current token takes over.
    assert take_over("n2", 1)["error"] == "stale_token"
    assert take_over("n1", 2)["error"] == "stale_token"
    assert log.get_run(run_id)["holder"] == "n1"
    assert take_over("n2", 2) == {"ok": True, "taken": 1, "stale": 0, "next_attempts": 1}
    run = log.get_run(run_id)
    assert (run["state"], run["holder"], run["token"], run["attempt"], run["node"]) == \
        ("running", "n2", 2, 2, "n2")
    assert run["redeliveries"] == 1
    assert run["execution_id"] == keys.execution_id("job_a1", 10_000)
    assert "taken over by n2" in run["attempts"][0]["error"]
    assert [(e.run_id, e.holder, e.attempt) for e in log.effects
            if isinstance(e, RunCancelled)] == [(run_id, "n1", 1)]
    assert [(e.run["attempt"], e.run["holder"]) for e in log.effects
            if isinstance(e, RunQueued)] == [(1, "n1"), (2, "n2")]
    assert take_over("n2", 2) == {"ok": True, "taken": 0, "stale": 1}   # once
    assert report(log, update(run_id, "finish", ok=True)) == [False]      # n1's, late
    assert report(log, update(run_id, "finish", holder="n2", attempt=2, ok=True)) == [True]
    assert log.get_run(run_id)["state"] == "succeeded"
    assert log.store.get(RUNS_OPEN, keys.open_run_key(shard, run_id)) is None


def test_a_run_made_while_its_shard_has_no_owner_is_held_by_the_first_owner():
    log = Replica()
    spec = {"name": "j", "schedule": EVERY_2S, "target": HTTP, "retry": retry.DEFAULT_POLICY,
            "concurrency": {"policy": "allow"}, "alert": {}, "metadata": {},
            "misfire": {"policy": "fire_all", "tolerance_ms": 60_000, "catchup_max": 100}}
    shard = keys.shard_of("job_a1", SHARDS)
    log.run(commands.create_job(job_id="job_a1", tenant="default", spec=spec,
                                idempotency_key=None, shard=shard, next_ms=10_000, at_ms=1_000))
    run_id = log.run(commands.trigger_job(job_id="job_a1", scheduled_ms=5_000, node="n3",
                                          at_ms=5_000))["run"]["id"]
    run = log.get_run(run_id)
    assert (run["state"], run["holder"], run["node"]) == ("queued", None, None)
    assert not [e for e in log.effects if isinstance(e, RunQueued)]
    log.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=6_000))
    assert log.run(commands.take_over_runs(node="n1", shard=shard, token=1, run_ids=[run_id],
                                           at_ms=6_100))["taken"] == 1
    run = log.get_run(run_id)
    assert (run["state"], run["holder"], run["token"], run["attempt"]) == ("running", "n1", 1, 1)
    assert "redeliveries" not in run


# --- retries ---------------------------------------------------------------------------

def test_a_retryable_failure_waits_in_a_durable_due_entry_and_keeps_the_execution_id():
    log = Replica()
    shard = make_job(log, max_attempts=3)
    run_id = fire_next(log)
    execution_id = log.get_run(run_id)["execution_id"]
    report(log, update(run_id, "finish", delay_ms=700))
    run = log.get_run(run_id)
    assert run["state"] == "retry_wait"
    assert run["retry_due_ms"] == 10_800
    assert log.store.get(DUE, keys.retry_due_key(shard, 10_800, run_id)) == keys.due_value("default", None)
    fire_retry(log, run_id)
    run = log.get_run(run_id)
    assert (run["state"], run["holder"]) == ("running", "n1")   # held again at once
    assert run["attempt"] == 2
    assert run["execution_id"] == execution_id
    assert log.store.get(DUE, keys.retry_due_key(shard, 10_800, run_id)) is None
    # The next attempt is dispatched again, and attempt 1's holder is now stale.
    assert [e.run["attempt"] for e in log.effects if isinstance(e, RunQueued)] == [1, 2]
    assert report(log, update(run_id, "finish", attempt=1, ok=True)) == [False]
    assert report(log, update(run_id, "finish", attempt=2, ok=True)) == [True]


def test_attempts_spent_fail_the_run_and_raise_one_alert():
    log = Replica()
    make_job(log, max_attempts=2, alert={"webhook_url": "http://127.0.0.1:9/alert"})
    run_id = fire_next(log)
    report(log, update(run_id, "finish"))
    fire_retry(log, run_id)
    report(log, update(run_id, "finish", attempt=2))
    run = log.get_run(run_id)
    assert run["state"] == "failed"
    assert len(run["attempts"]) == 2
    assert run["alert"] == "pending"
    assert log.store.get(ALERTS, run_id.encode())["url"] == "http://127.0.0.1:9/alert"
    assert [e.run_id for e in log.effects if isinstance(e, AlertPending)] == [run_id]
    log.run(commands.alert_done(run_id=run_id, outcome="sent", error=None, at_ms=20_000))
    assert log.get_run(run_id)["alert"] == "sent"
    assert log.store.scan(ALERTS) == []
    # A second leader's delivery of the same alert changes nothing.
    again = log.run(commands.alert_done(run_id=run_id, outcome="undeliverable", error="x",
                                        at_ms=21_000))
    assert again["stale"] is True
    assert log.get_run(run_id)["alert"] == "sent"


def test_a_non_retryable_failure_fails_at_once():
    log = Replica()
    make_job(log, max_attempts=5)
    run_id = fire_next(log)
    report(log, update(run_id, "finish", retryable=False))
    assert log.get_run(run_id)["state"] == "failed"
    assert log.store.scan(DUE)[0][0][10:11] == keys.KIND_OCCURRENCE   # only the next occurrence


@settings(max_examples=examples(200), deadline=None)
@given(attempt=st.integers(1, 100), base_s=st.floats(0, 100), span_s=st.floats(0, 1000),
       u=st.floats(0, 1, exclude_max=True), fixed=st.booleans())
def test_retry_delays_stay_inside_the_full_jitter_bound(attempt, base_s, span_s, u, fixed):
    policy = dict(retry.DEFAULT_POLICY, base_s=base_s, max_s=base_s + span_s,
                  backoff="fixed" if fixed else "exponential")
    bound = retry.delay_bound_ms(policy, attempt)
    delay = retry.draw_delay_ms(policy, attempt, lambda: u)
    assert 0 <= delay <= bound
    assert bound <= int(policy["max_s"] * 1000) or fixed
    if fixed:
        assert delay == int(base_s * 1000)
    else:
        assert bound == int(min(policy["max_s"], base_s * 2 ** attempt) * 1000)
        assert retry.delay_bound_ms(policy, attempt) <= retry.delay_bound_ms(policy, attempt + 1)


def test_http_statuses_that_are_not_retried():
    assert not retry.http_status_retryable(400)
    assert not retry.http_status_retryable(404)
    assert retry.http_status_retryable(408)
    assert retry.http_status_retryable(429)
    assert retry.http_status_retryable(503)


# --- the reaper ------------------------------------------------------------------------

WORKER_TARGET = {"type": "command", "argv": ["true"], "env": {}, "cwd": None, "timeout_s": 5.0,
                 "queue": "batch", "shell": False}


def test_an_expired_lease_is_retried_and_a_live_one_is_not():
    # Leases of their own are a remote worker's claim (a node's runs are held
    # under its shard lease).
    log = Replica()
    log.run(commands.put_tenant(tenant="default", quota={}, actor=None, at_ms=1,
                                commands=True))
    make_job(log, target=WORKER_TARGET, max_attempts=2)
    run_id = fire_next(log)
    worker = "worker:w1"
    report(log, update(run_id, "start", holder=worker, lease_ms=15_000))
    assert log.run(commands.expire_leases(items=[(run_id, 1, 100)], at_ms=14_999)) == \
        {"ok": True, "expired": 0}
    assert log.run(commands.expire_leases(items=[(run_id, 1, 100)], at_ms=15_001))["expired"] == 1
    run = log.get_run(run_id)
    assert run["state"] == "retry_wait"
    assert "lease expired" in run["attempts"][0]["error"]
    assert run["holder"] is None
    # The late holder's report is refused.
    assert report(log, update(run_id, "finish", holder=worker, ok=True)) == [False]
    fire_retry(log, run_id)
    report(log, update(run_id, "start", holder=worker, attempt=2, lease_ms=16_000))
    log.run(commands.expire_leases(items=[(run_id, 2, 100)], at_ms=16_001))
    assert log.get_run(run_id)["state"] == "failed"


# --- concurrency policies ---------------------------------------------------------------

def test_skip_if_running_records_the_overlap_as_skipped():
    log = Replica()
    make_job(log, concurrency={"policy": "skip_if_running"})
    first = fire_next(log)
    assert log.get_run(first)["state"] == "running"   # held from its fire
    second = fire_next(log)
    assert log.get_run(second)["state"] == "skipped"
    assert first in log.get_run(second)["reason"]
    report(log, update(first, "finish", ok=True))
    assert log.get_run(fire_next(log))["state"] == "running"


def test_queue_runs_one_after_another_and_is_bounded():
    log = Replica()
    make_job(log, concurrency={"policy": "queue", "queue_max": 2})
    first = fire_next(log)
    assert log.get_run(first)["state"] == "running"   # held from its fire
    second, third, fourth = fire_next(log), fire_next(log), fire_next(log)
    assert [log.get_run(r)["state"] for r in (second, third, fourth)] == \
        ["scheduled", "scheduled", "skipped"]
    assert "queue_max 2" in log.get_run(fourth)["reason"]
    report(log, update(first, "finish", ok=True))
    assert log.get_run(second)["state"] == "running"
    assert log.get_run(third)["state"] == "scheduled"
    assert log.job()["active"] == [second]
    # A retry keeps the queue waiting: the run is still open.
    report(log, update(second, "finish"))
    assert log.get_run(second)["state"] == "retry_wait"
    assert log.get_run(third)["state"] == "scheduled"
    cancel = log.run(commands.cancel_run(run_id=second, reason="test", at_ms=20_000))
    assert cancel["ok"]
    assert log.get_run(third)["state"] == "running"


def test_replace_cancels_the_running_one_and_tells_its_holder():
    log = Replica()
    make_job(log, concurrency={"policy": "replace"})
    first = fire_next(log)
    assert log.get_run(first)["state"] == "running"   # held from its fire
    second = fire_next(log)
    assert log.get_run(first)["state"] == "cancelled"
    assert "replace" in log.get_run(first)["reason"]
    # An answer names the run it was replaced by with its time, as every time is named.
    from raftsched.api.views import run_view
    from raftsched.core.timeutil import format_ms
    scheduled = format_ms(log.get_run(second)["scheduled_ms"])
    assert run_view(log.get_run(first))["reason"] == \
        f"replaced by the run for {scheduled} (replace policy)"
    assert log.get_run(second)["state"] == "running"
    assert [(e.run_id, e.holder) for e in log.effects if isinstance(e, RunCancelled)] == \
        [(first, "n1")]
    assert log.store.scan(LEASES) == []
    assert report(log, update(first, "finish", ok=True)) == [False]
    assert log.job()["active"] == [second]


def test_allow_overlaps():
    log = Replica()
    make_job(log)
    first = fire_next(log)
    assert log.get_run(first)["state"] == "running"   # held from its fire
    second = fire_next(log)
    assert log.get_run(second)["state"] == "running"
    assert log.job()["active"] == [first, second]


def test_cancel_refuses_a_finished_run_and_clears_a_pending_retry():
    log = Replica()
    shard = make_job(log)
    run_id = fire_next(log)
    report(log, update(run_id, "finish", delay_ms=1000))
    assert log.store.get(DUE, keys.retry_due_key(shard, 11_100, run_id)) is not None
    assert log.run(commands.cancel_run(run_id=run_id, reason="r", at_ms=10_200))["ok"]
    assert log.store.get(DUE, keys.retry_due_key(shard, 11_100, run_id)) is None
    refused = log.run(commands.cancel_run(run_id=run_id, reason="r", at_ms=10_300))
    assert refused["error"] == "conflict"
    assert log.run(commands.cancel_run(run_id="run_00", reason="r", at_ms=1))["error"] == \
        "not_found"


# --- worker queues ---------------------------------------------------------------------

def test_a_command_on_a_named_queue_waits_in_the_ready_index_for_any_worker():
    log = Replica()
    target = {"type": "command", "argv": ["true"], "env": {}, "cwd": None, "timeout_s": 5.0,
              "queue": "batch", "shell": False}
    log.run(commands.put_tenant(tenant="default", quota={}, actor=None, at_ms=1,
                                commands=True))
    make_job(log, target=target)
    run_id = fire_next(log)
    run = log.get_run(run_id)
    assert run["queue"] == "batch"
    assert run["node"] is None
    assert log.store.scan(READY) == [(keys.ready_key("default/batch", 1, 10_000, run_id), 1)]
    assert report(log, update(run_id, "start", holder="worker:w1"),
                  update(run_id, "start", holder="worker:w2")) == [True, False]
    assert log.store.scan(READY) == []
    assert report(log, update(run_id, "finish", holder="worker:w1", ok=True)) == [True]


# --- topics ----------------------------------------------------------------------------

def publish(log: Replica, execution_id: str, at_ms: int = 1000, topic: str = "t") -> dict:
    return log.run(commands.publish(topic=topic, key=None, message={"n": execution_id},
                                    execution_id=execution_id, job_id="job_a1", at_ms=at_ms))


def test_publish_appends_once_per_execution_and_trims_by_count(monkeypatch):
    from raftsched import limits
    monkeypatch.setattr(limits, "topic_messages_max", 3)
    log = Replica()
    assert publish(log, "exe_1")["offset"] == 1
    assert publish(log, "exe_1") == {"ok": True, "offset": 1, "duplicate": True}
    for i in range(2, 6):
        assert publish(log, f"exe_{i}")["offset"] == i
    offsets = [m["offset"] for _, m in log.store.scan(TOPICS)]
    assert offsets == [3, 4, 5]
    # A trimmed message's execution may publish again: its record is gone too.
    assert publish(log, "exe_1")["offset"] == 6


def test_publish_trims_by_age_and_offsets_commit_per_group():
    from raftsched import limits
    log = Replica()
    publish(log, "exe_old", at_ms=0)
    publish(log, "exe_new", at_ms=int(limits.topic_retention_s * 1000) + 1)
    assert [m["offset"] for _, m in log.store.scan(TOPICS)] == [2]
    assert log.run(commands.commit_offset(topic="t", group="g", offset=2, at_ms=1))["ok"]
    assert log.run(commands.commit_offset(topic="t", group="g", offset=9, at_ms=1))["ok"] is False


# --- the table -------------------------------------------------------------------------

def test_the_lifecycle_table_has_no_edge_out_of_a_terminal_state_but_a_redrive():
    for state in lifecycle.TERMINAL:
        for event in lifecycle.EVENTS:
            if state == lifecycle.FAILED and event in lifecycle.REDRIVE_EVENTS:
                continue
            with pytest.raises(InvalidTransition):
                lifecycle.next_state("r", state, event)
    assert lifecycle.next_state("r", "failed", "redrive") == "queued"
    assert lifecycle.next_state("r", "failed", "redrive_wait") == "scheduled"
    assert lifecycle.next_state("r", "running", "retry") == "retry_wait"
    assert lifecycle.next_state("r", "retry_wait", "due") == "queued"


def test_the_docs_diagram_is_generated_from_the_table():
    from pathlib import Path
    page = (Path(__file__).parent.parent / "docs" / "lifecycle.md").read_text()
    assert lifecycle.diagram() in page, "run scripts/gen_lifecycle_doc.py"
