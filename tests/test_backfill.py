"""Backfill's pure part and apply: occurrences of a range in the job's zone, each run once with trigger backfill, never outside the range, paced by the room, counted, cancelled, bounded and purged."""

from __future__ import annotations


import pytest

from raftsched import limits
from raftsched.core import backfill, commands, cost, jobspec, keys, lifecycle
from raftsched.core.apply import JOBS, RUNS, SHARDS, RunCancelled
from raftsched.core.schedule import parse_schedule
from raftsched.core.timeutil import format_ms, parse_rfc3339
from raftsched.core.tx import AUDIT, BACKFILLS, BACKFILLS_OPEN, BackfillOpened, Transition
from raftsched.errors import InvalidInput
from raftsched.runtime.backfiller import Backfiller
from raftsched.runtime.purger import Purger, Retention
from raftsched.testing.replica import Replica

SHARD_COUNT = 256
JOB = "job_" + "a" * 20
HOUR_MS = 3_600_000
EVERY_HOUR = {"kind": "every", "every_ms": HOUR_MS, "text": "1h"}
T0 = 1_767_225_600_000   # 2026-01-01T00:00:00Z, a whole hour


def ms(text: str) -> int:
    return parse_rfc3339(text)[0]


# --- occurrences ------------------------------------------------------------------------

def test_occurrences_follow_the_zone_and_its_dst_rules():
    """America/New_York sprang forward at 02:00 on 8 March 2026: a fixed 02:30
    fires at 03:00 that day, in the zone, and the range's end is excluded."""
    schedule = parse_schedule({"cron": "30 2 * * *", "timezone": "America/New_York"}, None)
    found = backfill.range_occurrences(schedule, ms("2026-03-07T00:00:00-05:00"),
                                       ms("2026-03-10T02:30:00-04:00"), 100)
    assert [format_ms(t, "America/New_York") for t in found] == [
        "2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]


def test_occurrences_include_start_exclude_end_and_stop_at_count():
    assert backfill.range_occurrences(EVERY_HOUR, T0, T0 + 3 * HOUR_MS, 100) == [
        T0, T0 + HOUR_MS, T0 + 2 * HOUR_MS]
    assert backfill.range_occurrences(EVERY_HOUR, T0 + 1, T0 + 3 * HOUR_MS, 100) == [
        T0 + HOUR_MS, T0 + 2 * HOUR_MS]
    assert backfill.range_occurrences(EVERY_HOUR, T0, T0 + 100 * HOUR_MS, 4) == [
        T0 + i * HOUR_MS for i in range(4)]
    assert backfill.occurrences(EVERY_HOUR, T0, T0 + 3 * HOUR_MS, 100) == [
        T0 + HOUR_MS, T0 + 2 * HOUR_MS]


def test_a_one_off_has_its_one_instant_if_the_range_holds_it():
    once = {"kind": "once", "run_at_ms": T0, "offset_min": 0}
    assert backfill.range_occurrences(once, T0, T0 + 1, 10) == [T0]
    assert backfill.range_occurrences(once, T0 - 10, T0, 10) == []
    assert backfill.occurrences(once, T0, T0 + 10, 10) == []   # launched already


# --- the request ------------------------------------------------------------------------

NOW = T0 + 24 * HOUR_MS


def test_a_request_is_read_with_its_defaults():
    asked = backfill.parse_request({"start": "2026-01-01T00:00:00Z",
                                    "end": "2026-01-01T05:00:00+01:00"}, NOW)
    assert asked == {"start_ms": T0, "end_ms": T0 + 4 * HOUR_MS, "overlap": "allow",
                     "max_concurrent": limits.backfill_concurrent_default, "dry_run": False}


@pytest.mark.parametrize("body, field", [
    ([], "body"),
    ({"start": "2026-01-01T00:00:00Z"}, "end"),
    ({"start": "2026-01-01T00:00:00", "end": "2026-01-01T01:00:00Z"}, "start"),
    ({"start": "2026-01-01T01:00:00Z", "end": "2026-01-01T01:00:00Z"}, "end"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-03T00:00:00Z"}, "end"),   # future
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "overlap": "queue"},
     "overlap"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "max_concurrent": 0},
     "max_concurrent"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z",
      "max_concurrent": limits.backfill_concurrent_max + 1}, "max_concurrent"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "max_concurrent": True},
     "max_concurrent"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "dry_run": "yes"},
     "dry_run"),
    ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "step": 1}, "step"),
])
def test_a_bad_request_is_refused_naming_the_member(body, field):
    with pytest.raises(InvalidInput) as info:
        backfill.parse_request(body, NOW)
    assert info.value.field == field


# --- apply ------------------------------------------------------------------------------

def job_spec(concurrency: str = "allow") -> dict:
    return {"name": "j", "schedule": EVERY_HOUR,
            "target": {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST",
                       "headers": {}, "body": None, "timeout_s": 5.0},
            "retry": {"max_attempts": 1}, "concurrency": {"policy": concurrency},
            "metadata": {}}


def setup(concurrency: str = "allow", job_id: str = JOB, tenant: str = "default",
          replica: Replica | None = None) -> Replica:
    """A replica holding the job, its shard owned by n2."""
    replica = replica or Replica()
    shard = keys.shard_of(job_id, SHARD_COUNT)
    replica.run(commands.assign_shards(assignments=[(shard, "n2")], at_ms=1))
    created = replica.run(commands.create_job(
        job_id=job_id, tenant=tenant, spec=job_spec(concurrency), idempotency_key=None,
        shard=shard, next_ms=NOW + HOUR_MS, at_ms=NOW))
    assert created["ok"], created
    return replica


def start(replica: Replica, bf_id: str = "bf_1", hours: int = 6, max_concurrent: int = 2,
          overlap: str = "allow", job_id: str = JOB, tenant: str = "default") -> dict:
    job = replica.store.get(JOBS, keys.job_key(job_id))
    return replica.run(commands.create_backfill(
        backfill_id=bf_id, job_id=job_id, tenant=tenant, expected_version=job["version"],
        start_ms=T0, end_ms=T0 + hours * HOUR_MS, overlap=overlap,
        max_concurrent=max_concurrent, total=hours, at_ms=NOW, actor="tok_1"))


def record(replica: Replica, bf_id: str = "bf_1") -> dict:
    return replica.store.get(BACKFILLS, bf_id.encode())


def states(replica: Replica, record_: dict) -> list[str | None]:
    return [(replica.store.get(RUNS, run_id.encode()) or {}).get("state")
            for run_id, _ in record_["open"]]


def step(replica: Replica, bf_id: str = "bf_1", at_ms: int = NOW) -> dict | None:
    """One pass of the backfiller over one backfill, as the leader plans it."""
    rec = record(replica, bf_id)
    job = replica.store.get(JOBS, keys.job_key(rec["job_id"]))
    item = backfill.plan_step(rec, job, states(replica, rec), limits.backfill_step_runs_max)
    if item is None:
        return None
    return replica.run(commands.backfill_step(node="n1", at_ms=at_ms, items=[item]))


def finish(replica: Replica, run_id: str, ok: bool = True) -> None:
    run = replica.store.get(RUNS, run_id.encode())
    holder = run["node"]
    result = replica.run(commands.run_updates(updates=[   # held from its launch: no start
        {"run_id": run_id, "event": "finish", "holder": holder, "attempt": 1, "at_ms": NOW,
         "ok": ok, "retryable": False, "retry_delay_ms": None, "http_status": 200,
         "exit_code": None, "error": None, "output_node": holder}]))
    assert result["applied"] == 1, result


def test_a_backfill_begun_is_announced_to_the_backfiller():
    """The leader's backfiller waits for this effect while none runs
    (runtime/backfiller.py); a refused create announces nothing."""
    replica = setup()
    assert start(replica)["ok"]
    assert [e for e in replica.effects if isinstance(e, BackfillOpened)] == \
        [BackfillOpened(backfill_id="bf_1")]
    assert not start(replica)["ok"]   # the same id again: a conflict
    assert len([e for e in replica.effects if isinstance(e, BackfillOpened)]) == 1


def backfill_runs(replica: Replica) -> list[dict]:
    return [run for _, run in replica.store.scan(RUNS) if run["trigger"] == "backfill"]


def test_a_backfill_runs_each_occurrence_once_paced_by_its_room():
    replica = setup()
    assert start(replica)["ok"]
    assert replica.store.get(BACKFILLS_OPEN, b"bf_1") == 1
    assert step(replica) == {"ok": True, "launched": 2, "stale": 0}
    assert step(replica) is None   # no room: nothing to propose
    runs = backfill_runs(replica)
    assert sorted(r["scheduled_ms"] for r in runs) == [T0, T0 + HOUR_MS]
    for run in runs:
        assert run["id"] == keys.run_id(JOB, run["scheduled_ms"])
        assert run["execution_id"] == keys.execution_id(JOB, run["scheduled_ms"])
        # Held by the shard's owner from its launch (the lease is taken at fire).
        assert (run["node"], run["holder"], run["state"]) == ("n2", "n2", lifecycle.RUNNING)
        assert run["token"] == replica.store.get(SHARDS, keys.shard_key(
            keys.shard_of(JOB, SHARD_COUNT)))["token"]
    while record(replica)["state"] == backfill.RUNNING:
        for run_id, _ in record(replica)["open"]:
            finish(replica, run_id, ok=run_id != keys.run_id(JOB, T0 + 3 * HOUR_MS))
        step(replica)
    done = record(replica)
    assert (done["state"], done["launched"], done["succeeded"], done["failed"]) == (
        backfill.FAILED, 6, 5, 1)
    assert sorted(r["scheduled_ms"] for r in backfill_runs(replica)) == [
        T0 + i * HOUR_MS for i in range(6)]
    assert replica.store.get(BACKFILLS_OPEN, b"bf_1") is None
    actions = [rec["action"] for _, rec in replica.store.scan(AUDIT)]
    assert "backfill.create" in actions


def test_an_occurrence_with_a_run_is_not_run_again_and_counted_existing():
    replica = setup()
    shard = keys.shard_of(JOB, SHARD_COUNT)
    token = replica.store.get(SHARDS, keys.shard_key(shard))["token"]
    # The schedule fired the occurrence at T0 + 1h (a fire carries it as due).
    replica.run(commands.update_job(job_id=JOB, spec=job_spec(), expected_version=1,
                                    next_ms=T0 + HOUR_MS, at_ms=NOW))
    fired = replica.run(commands.fire(shard=shard, token=token, upto_ms=T0 + HOUR_MS,
                                      node="n2", at_ms=T0 + HOUR_MS,
                                      items=[(JOB, T0 + HOUR_MS, NOW + HOUR_MS,
                                              [T0 + HOUR_MS], False)]))
    assert fired["fired"] == 1
    scheduled = replica.store.get(RUNS, keys.run_id(JOB, T0 + HOUR_MS).encode())
    assert start(replica, hours=3, max_concurrent=3)["ok"]
    assert step(replica)["launched"] == 2   # T0 and T0 + 2h; T0 + 1h has its run
    rec = record(replica)
    assert rec["existing"] == 1
    assert [run_id for run_id, created in rec["open"] if not created] == [scheduled["id"]]
    assert replica.store.get(RUNS, scheduled["id"].encode())["trigger"] == "schedule"
    assert len(backfill_runs(replica)) == 2
    # An earlier backfill's runs count as existing too.
    assert start(replica, bf_id="bf_2", hours=3, max_concurrent=3)["ok"]
    assert step(replica, "bf_2")["launched"] == 0
    assert record(replica, "bf_2")["existing"] == 3
    assert len(backfill_runs(replica)) == 2


def test_occurrences_outside_the_range_or_launched_already_are_ignored():
    replica = setup()
    assert start(replica, hours=3, max_concurrent=10)["ok"]
    bad = replica.run(commands.backfill_step(node="n1", at_ms=NOW, items=[
        {"backfill_id": "bf_1", "occurrences": [T0 - HOUR_MS, T0, T0 + 3 * HOUR_MS],
         "exhausted": False}]))
    assert bad["launched"] == 1
    assert [r["scheduled_ms"] for r in backfill_runs(replica)] == [T0]
    # The same step again (a new leader, a retry) launches nothing twice.
    again = replica.run(commands.backfill_step(node="n1", at_ms=NOW, items=[
        {"backfill_id": "bf_1", "occurrences": [T0], "exhausted": False}]))
    assert again["launched"] == 0
    assert record(replica)["launched"] == 1


def test_exhausted_is_believed_only_when_nothing_sent_was_left_over():
    """A stale step that claims the end, but whose last occurrence found no
    room, must not end the backfill before that occurrence runs."""
    replica = setup()
    assert start(replica, hours=2, max_concurrent=1)["ok"]
    replica.run(commands.backfill_step(node="n1", at_ms=NOW, items=[
        {"backfill_id": "bf_1", "occurrences": [T0, T0 + HOUR_MS], "exhausted": True}]))
    rec = record(replica)
    assert (rec["launched"], rec["exhausted"]) == (1, False)
    finish(replica, rec["open"][0][0])
    step(replica)
    finish(replica, record(replica)["open"][0][0])
    step(replica)
    assert record(replica)["state"] == backfill.SUCCEEDED
    assert record(replica)["succeeded"] == 2


def test_allow_runs_do_not_meet_the_jobs_own_policy():
    """A skip_if_running job: its backfill runs are not the job's open runs, so a
    scheduled occurrence while they run is not skipped."""
    replica = setup("skip_if_running")
    assert start(replica, hours=3, max_concurrent=3)["ok"]
    assert step(replica)["launched"] == 3
    job = replica.store.get(JOBS, keys.job_key(JOB))
    assert job.get("active", []) == []
    assert job["runs_count"] == 3
    triggered = replica.run(commands.trigger_job(job_id=JOB, scheduled_ms=NOW, node="n1",
                                                 at_ms=NOW))
    assert triggered["run"]["state"] == lifecycle.RUNNING


def test_overlap_job_obeys_the_policy_one_run_at_a_time():
    replica = setup("skip_if_running")
    replica.run(commands.trigger_job(job_id=JOB, scheduled_ms=NOW, node="n1", at_ms=NOW))
    assert start(replica, hours=3, max_concurrent=3, overlap="job")["ok"]
    assert step(replica)["launched"] == 1   # one at a time under skip_if_running
    run = replica.store.get(RUNS, keys.run_id(JOB, T0).encode())
    assert run["state"] == lifecycle.SKIPPED   # the manual run was open
    assert record(replica)["skipped"] == 1
    assert record(replica)["open"] == []


def test_cancel_cancels_its_own_open_runs_only():
    replica = setup()
    shard = keys.shard_of(JOB, SHARD_COUNT)
    token = replica.store.get(SHARDS, keys.shard_key(shard))["token"]
    replica.run(commands.update_job(job_id=JOB, spec=job_spec(), expected_version=1,
                                    next_ms=T0, at_ms=NOW))
    replica.run(commands.fire(shard=shard, token=token, upto_ms=T0, node="n2", at_ms=T0,
                              items=[(JOB, T0, NOW + HOUR_MS, [T0], False)]))
    assert start(replica, hours=4, max_concurrent=3)["ok"]
    step(replica)
    ours = [run_id for run_id, created in record(replica)["open"] if created]
    running = ours[0]
    holder = replica.store.get(RUNS, running.encode())["holder"]
    replica.effects.clear()
    cancelled = replica.run(commands.scoped(commands.cancel_backfill(
        backfill_id="bf_1", reason=None, at_ms=NOW), tenant="default", actor="tok_1"))
    assert cancelled["ok"]
    rec = cancelled["backfill"]
    assert (rec["state"], rec["skipped"], rec["open"]) == (backfill.CANCELLED, 2, [])
    for run_id in ours:
        assert replica.store.get(RUNS, run_id.encode())["state"] == lifecycle.CANCELLED
    assert RunCancelled(run_id=running, holder=holder, attempt=1) in replica.effects
    scheduled = replica.store.get(RUNS, keys.run_id(JOB, T0).encode())
    assert scheduled["state"] == lifecycle.RUNNING   # the schedule's run is left alone
    # Nothing more is launched, and a second cancel answers the same.
    assert replica.run(commands.backfill_step(node="n1", at_ms=NOW, items=[
        {"backfill_id": "bf_1", "occurrences": [T0 + 3 * HOUR_MS], "exhausted": True}])
    )["stale"] == 1
    assert replica.run(commands.cancel_backfill(backfill_id="bf_1", reason=None,
                                                at_ms=NOW))["ok"]
    assert replica.store.get(BACKFILLS_OPEN, b"bf_1") is None


def test_another_tenant_sees_no_backfill_and_a_changed_job_is_a_conflict():
    replica = setup()
    job_version = replica.store.get(JOBS, keys.job_key(JOB))["version"]
    foreign = replica.run(commands.create_backfill(
        backfill_id="bf_1", job_id=JOB, tenant="t2", expected_version=job_version,
        start_ms=T0, end_ms=T0 + HOUR_MS, overlap="allow", max_concurrent=1, total=1,
        at_ms=NOW))
    assert foreign["error"] == "not_found"
    stale = replica.run(commands.create_backfill(
        backfill_id="bf_1", job_id=JOB, tenant="default", expected_version=job_version + 1,
        start_ms=T0, end_ms=T0 + HOUR_MS, overlap="allow", max_concurrent=1, total=1,
        at_ms=NOW))
    assert stale["error"] == "conflict"
    assert start(replica)["ok"]
    cancel = replica.run(commands.scoped(commands.cancel_backfill(
        backfill_id="bf_1", reason=None, at_ms=NOW), tenant="t2", actor=None))
    assert cancel["error"] == "not_found"


def test_a_deleted_job_ends_its_backfill():
    replica = setup()
    assert start(replica)["ok"]
    replica.run(commands.delete_job(job_id=JOB, at_ms=NOW))
    assert step(replica)["ok"]
    rec = record(replica)
    assert (rec["state"], rec["reason"]) == (backfill.CANCELLED, "the job was deleted")


def test_running_backfills_are_bounded_per_tenant_and_in_the_cluster(monkeypatch):
    monkeypatch.setattr(limits, "backfills_open_per_tenant_max", 2)
    monkeypatch.setattr(limits, "backfills_open_max", 3)
    replica = setup()
    other = "job_" + "b" * 20
    setup(job_id=other, tenant="t2", replica=replica)
    assert start(replica, "bf_1")["ok"] and start(replica, "bf_2")["ok"]
    refused = start(replica, "bf_3")
    assert (refused["error"], refused["limit"]) == ("limit", "backfills_open_per_tenant_max")
    assert start(replica, "bf_4", job_id=other, tenant="t2")["ok"]
    refused = start(replica, "bf_5", job_id=other, tenant="t2")
    assert refused["limit"] == "backfills_open_max"
    replica.run(commands.cancel_backfill(backfill_id="bf_1", reason=None, at_ms=NOW))
    assert start(replica, "bf_3")["ok"]   # a slot freed


def test_backfill_records_are_bounded_and_ended_ones_purged(monkeypatch):
    monkeypatch.setattr(limits, "backfills_max", 2)
    replica = setup()
    assert start(replica, "bf_1")["ok"] and start(replica, "bf_2")["ok"]
    assert start(replica, "bf_3")["limit"] == "backfills_max"
    replica.run(commands.cancel_backfill(backfill_id="bf_1", reason=None, at_ms=NOW))
    assert start(replica, "bf_3")["limit"] == "backfills_max"   # ended, but kept

    def purge(at_ms: int, ids: list[str]) -> dict:
        return replica.run(commands.purge(
            at_ms=at_ms, history_max_runs=1000, history_max_age_ms=10 ** 9,
            finished_job_retention_ms=HOUR_MS, idempotency_ttl_ms=10 ** 9, runs=[], jobs=[],
            idem=[], backfills=ids))

    assert purge(NOW + HOUR_MS - 1, ["bf_1", "bf_2"])["backfills"] == 0   # within retention
    result = purge(NOW + HOUR_MS, ["bf_1", "bf_2"])
    assert (result["backfills"], result["refused"]) == (1, 1)   # bf_2 still runs
    assert record(replica, "bf_1") is None
    assert start(replica, "bf_3")["ok"]


def test_progress_reads_the_open_runs_states():
    rec = {"total": 5, "succeeded": 1, "failed": 0, "skipped": 1, "existing": 2,
           "launched": 4}
    view = backfill.progress(rec, [lifecycle.RUNNING, lifecycle.SUCCEEDED, None])
    assert view == {"total": 5, "done": 4, "succeeded": 2, "failed": 0, "skipped": 2,
                    "running": 1, "existing": 2, "launched": 4}


def test_the_plan_asks_for_the_room_and_says_when_the_range_is_exhausted():
    replica = setup()
    assert start(replica, hours=3, max_concurrent=2)["ok"]
    job = replica.store.get(JOBS, keys.job_key(JOB))
    rec = record(replica)
    assert backfill.plan_step(rec, job, [], 100) == {
        "backfill_id": "bf_1", "occurrences": [T0, T0 + HOUR_MS], "exhausted": False}
    assert backfill.plan_step(rec, job, [], 1)["occurrences"] == [T0]   # the entry's budget
    rec = dict(rec, cursor_ms=T0 + HOUR_MS, launched=2, open=[["run_x", True]])
    assert backfill.plan_step(rec, job, [lifecycle.RUNNING], 100) == {
        "backfill_id": "bf_1", "occurrences": [T0 + 2 * HOUR_MS], "exhausted": True}
    full = dict(rec, open=[["run_x", True], ["run_y", True]])
    assert backfill.plan_step(full, job, [lifecycle.RUNNING, lifecycle.QUEUED], 100) is None
    assert backfill.plan_step(full, job, [lifecycle.RUNNING, lifecycle.SUCCEEDED], 100) \
        is not None   # a finished run to count, and its slot to fill
    assert backfill.plan_step(rec, None, [lifecycle.RUNNING], 100)["occurrences"] == []



def test_a_backfill_that_cannot_be_planned_holds_back_no_other():
    """A record whose schedule raises when evaluated is left out of the pass
    (else it would fail every pass, on every leader in turn)."""
    replica = setup()
    assert start(replica, "bf_1")["ok"] and start(replica, "bf_2")["ok"]
    broken = dict(record(replica, "bf_1"),
                  schedule={"kind": "cron", "cron": "0 * * * *", "timezone": "Nowhere/Gone"})
    replica.index += 1
    replica.store.commit(Transition(writes=((BACKFILLS, b"bf_1", broken),), effects=(),
                                    result={}), replica.index)
    planner = Backfiller(replica.replicated())
    items = planner.plan()
    assert [item["backfill_id"] for item in items] == ["bf_2"]
    assert planner.plan() == items   # and again, quietly


def test_a_step_of_a_large_dag_job_is_bounded_by_cost_not_only_by_runs():
    """Each run of a DAG job releases its starting tasks in the same entry:
    the step plans what fits apply_entry_cost_max, and at least one run."""
    replica = Replica()
    shard = keys.shard_of(JOB, SHARD_COUNT)
    replica.run(commands.assign_shards(assignments=[(shard, "n2")], at_ms=1))
    spec = dict(job_spec(), target=None)
    del spec["target"]
    spec["dag"] = {"tasks": [{"id": f"t{i}", "depends_on": [], "trigger_rule": "all_success",
                              "target": job_spec()["target"]}
                             for i in range(limits.dag_tasks_max)]}
    assert replica.run(commands.create_job(
        job_id=JOB, tenant="default", spec=spec, idempotency_key=None, shard=shard,
        next_ms=NOW + HOUR_MS, at_ms=NOW))["ok"]
    assert start(replica, hours=200, max_concurrent=100)["ok"]
    planner = Backfiller(replica.replicated())
    [item] = planner.plan()
    unit = cost.occurrence_cost(spec)
    assert len(item["occurrences"]) == limits.apply_entry_cost_max // unit
    assert len(item["occurrences"]) * unit <= limits.apply_entry_cost_max


def test_the_purger_chooses_backfills_that_ended_past_the_retention():
    replica = setup()
    assert start(replica, "bf_1")["ok"] and start(replica, "bf_2")["ok"]
    replica.run(commands.cancel_backfill(backfill_id="bf_1", reason=None, at_ms=NOW))
    retention = Retention(history_max_runs=1000, history_max_age_s=86400.0,
                          finished_job_retention_s=3600.0, idempotency_ttl_s=86400.0)
    purger = Purger(replica.replicated(), retention)
    assert purger.plan(purger.bounds(NOW + HOUR_MS - 1)).backfills == []
    assert purger.plan(purger.bounds(NOW + HOUR_MS)).backfills == ["bf_1"]   # bf_2 runs


def test_a_dag_job_is_backfilled_with_a_dag_run_per_occurrence():
    spec = jobspec.validate_create({
        "schedule": {"every": "1h"},
        "dag": {"tasks": [{"id": "a", "target": {"type": "http", "url": "https://h.example/a"}},
                          {"id": "b", "target": {"type": "http", "url": "https://h.example/b"},
                           "depends_on": ["a"]}]}})["spec"]
    replica = Replica()
    shard = keys.shard_of(JOB, SHARD_COUNT)
    replica.run(commands.assign_shards(assignments=[(shard, "n2")], at_ms=1))
    assert replica.run(commands.create_job(
        job_id=JOB, tenant="default", spec=spec, idempotency_key=None, shard=shard,
        next_ms=NOW + HOUR_MS, at_ms=NOW))["ok"]
    assert start(replica, hours=2, max_concurrent=2)["ok"]
    assert step(replica)["launched"] == 2
    for ms_ in (T0, T0 + HOUR_MS):
        run = replica.store.get(RUNS, keys.run_id(JOB, ms_).encode())
        assert run["trigger"] == "backfill"
        assert [t["id"] for t in run["tasks"]] == ["a", "b"]
    assert len(record(replica)["open"]) == 2   # a DAG run is open until its tasks end
