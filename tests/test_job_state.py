"""A job's runs rewrite only its small state record (next occurrence, open runs, last run, run count), never its spec; every reader, in apply and through either store, sees the job whole."""

from __future__ import annotations

import pytest

from raftsched.core import commands, keys, retry
from raftsched.core.apply import apply_entry
from raftsched.core.tx import JOB_STATE, JOBS
from raftsched.testing.replica import EVERY_2S, HTTP

SHARDS = 16
JOB = "job_a1"
SHARD = keys.shard_of(JOB, SHARDS)


def run(store, index: int, command) -> tuple[dict, set[str]]:
    """Apply and commit one entry: (its result, the tables it wrote)."""
    _, transition = apply_entry(store, commands.encode(command), index)
    store.commit(transition, index)
    return transition.result, {table for table, _, _ in transition.writes}


def spec() -> dict:
    return {"name": "j", "schedule": EVERY_2S, "target": HTTP, "retry": retry.DEFAULT_POLICY,
            "concurrency": {"policy": "allow"}, "alert": {}, "metadata": {},
            "misfire": {"policy": "fire_all", "tolerance_ms": 60_000, "catchup_max": 100}}


def test_fire_and_finish_write_the_state_record_and_not_the_spec(store):
    run(store, 1, commands.assign_shards(assignments=[(SHARD, "n1")], at_ms=1))
    _, tables = run(store, 2, commands.create_job(
        job_id=JOB, tenant="default", spec=spec(), idempotency_key=None, shard=SHARD,
        next_ms=10_000, at_ms=1_000))
    assert JOBS in tables and JOB_STATE not in tables
    result, tables = run(store, 3, commands.fire(
        shard=SHARD, token=1, upto_ms=10_000, node="n1", at_ms=10_000,
        items=[(JOB, 10_000, 12_000, [10_000], False)]))
    assert result["fired"] == 1
    assert JOB_STATE in tables and JOBS not in tables
    run_id = keys.run_id(JOB, 10_000)
    job = store.get(JOBS, keys.job_key(JOB))   # the job whole, as before
    assert (job["next_ms"], job["active"], job["last_run_id"], job["runs_count"]) == \
        (12_000, [run_id], run_id, 1)
    assert job["spec"]["name"] == "j"
    assert [j["next_ms"] for _, j in store.scan(JOBS)] == [12_000]
    finish = commands.run_finish(run_id=run_id, holder="n1", attempt=1, at_ms=10_100, ok=True)
    result, tables = run(store, 4, commands.run_updates(updates=[finish]))
    assert result["accepted"] == [True]
    assert JOB_STATE in tables and JOBS not in tables
    assert store.get(JOBS, keys.job_key(JOB))["active"] == []
    # A change of the spec writes the job whole again, and its state with it.
    _, tables = run(store, 5, commands.pause_job(job_id=JOB, at_ms=11_000))
    assert JOBS in tables
    assert store.get(JOB_STATE, keys.job_key(JOB)) is None
    job = store.get(JOBS, keys.job_key(JOB))
    assert (job["status"], job["next_ms"], job["runs_count"], job["version"]) == \
        ("paused", None, 1, 2)


class _CountingView:
    """The store, counting reads of job records."""

    def __init__(self, store) -> None:
        self._store, self.job_reads = store, 0

    def get(self, table: str, key: bytes):
        if table == JOBS:
            self.job_reads += 1
        return self._store.get(table, key)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def _two_open_runs(store) -> tuple[str, str]:
    run(store, 1, commands.assign_shards(assignments=[(SHARD, "n1")], at_ms=1))
    run(store, 2, commands.create_job(
        job_id=JOB, tenant="default", spec=spec(), idempotency_key=None, shard=SHARD,
        next_ms=10_000, at_ms=1_000))
    result, _ = run(store, 3, commands.fire(
        shard=SHARD, token=1, upto_ms=12_000, node="n1", at_ms=12_000,
        items=[(JOB, 10_000, 14_000, [10_000, 12_000], False)]))
    assert result["fired"] == 2
    first, second = keys.run_id(JOB, 10_000), keys.run_id(JOB, 12_000)
    assert store.get(JOBS, keys.job_key(JOB))["active"] == [first, second]
    return first, second


def test_a_success_reads_and_writes_its_jobs_state_alone(store):
    first, _ = _two_open_runs(store)
    view = _CountingView(store)
    finish = commands.run_finish(run_id=first, holder="n1", attempt=1, at_ms=12_100, ok=True)
    _, transition = apply_entry(view, commands.encode(commands.run_updates(updates=[finish])), 4)
    store.commit(transition, 4)
    assert transition.result["accepted"] == [True]
    assert view.job_reads == 0   # neither the job's record nor its spec was read
    assert {table for table, _, _ in transition.writes} == {"runs", "runs_open", JOB_STATE}
    job = store.get(JOBS, keys.job_key(JOB))
    assert job["active"] == [keys.run_id(JOB, 12_000)] and job["spec"]["name"] == "j"


@pytest.mark.parametrize("success_first", [True, False])
def test_a_success_and_a_failure_of_one_job_in_one_entry_both_leave_its_open_runs(
        store, success_first):
    """One entry ends two runs of a job: a success, which changes the job's
    state alone, and a failure, which reads the job whole (its retry
    policy). Whichever comes first, the other sees what it changed."""
    first, second = _two_open_runs(store)
    ok = commands.run_finish(run_id=first, holder="n1", attempt=1, at_ms=12_100, ok=True)
    failed = commands.run_finish(run_id=second, holder="n1", attempt=1, at_ms=12_100,
                                 ok=False, retryable=False, error="HTTP 400")
    result, _ = run(store, 4, commands.run_updates(
        updates=[ok, failed] if success_first else [failed, ok]))
    assert result["accepted"] == [True, True]
    assert store.get(JOBS, keys.job_key(JOB))["active"] == []
    assert [store.get("runs", r.encode())["state"] for r in (first, second)] == \
        ["succeeded", "failed"]


def _stored_job(store) -> dict:
    run(store, 1, commands.assign_shards(assignments=[(SHARD, "n1")], at_ms=1))
    run(store, 2, commands.create_job(
        job_id=JOB, tenant="default", spec=spec(), idempotency_key=None, shard=SHARD,
        next_ms=10_000, at_ms=1_000))
    return store.get(JOBS, keys.job_key(JOB))


def test_a_fired_jobs_write_is_its_state_record_alone(store):
    from raftsched.core.tx import Tx
    _stored_job(store)
    tx = Tx(store)
    job = tx.get(JOBS, keys.job_key(JOB))
    job["next_ms"], job["runs_count"] = 12_000, 1
    tx.put_fired_job(job)
    writes = tx.transition({"ok": True}).writes
    assert [(table, value["next_ms"]) for table, _, value in writes] == [(JOB_STATE, 12_000)]


def test_a_fired_job_written_whole_before_or_after_in_the_entry_stays_whole(store):
    """put_fired_job trusts that only the state changed since the read: a
    whole write of the job in the same command, before it or after it, is
    kept whole (a spec changed there is not lost)."""
    from raftsched.core.tx import Tx
    _stored_job(store)
    key = keys.job_key(JOB)
    for whole_first in (True, False):
        tx = Tx(store)
        job = tx.get(JOBS, key)
        job["spec"] = dict(job["spec"], name="renamed")
        if whole_first:
            tx.put(JOBS, key, job)
            job["next_ms"] = 12_000
            tx.put_fired_job(job)
        else:
            tx.put_fired_job(job)
            tx.put(JOBS, key, job)
        writes = tx.transition({"ok": True}).writes
        assert [table for table, _, _ in writes] == [JOBS], (whole_first, writes)
        assert writes[0][2]["spec"]["name"] == "renamed"


def test_a_job_created_and_fired_in_one_command_is_written_whole(store):
    from raftsched.core.tx import Tx
    tx = Tx(store)
    key = keys.job_key(JOB)
    tx.put(JOBS, key, {"id": JOB, "spec": spec(), "next_ms": None, "status": "active"})
    tx.put_fired_job(tx.get(JOBS, key))
    assert [table for table, _, _ in tx.transition({"ok": True}).writes] == [JOBS]


def test_the_suite_catches_a_fired_job_whose_other_members_changed(store):
    """The check the suite runs with (tests/conftest.py): a put_fired_job of a
    job whose spec changed is a bug, raised rather than stored as state alone."""
    from raftsched.core import tx as txmod
    assert txmod.CHECK_FIRED_STATE_ONLY
    _stored_job(store)
    tx = txmod.Tx(store)
    job = tx.get(JOBS, keys.job_key(JOB))
    job["spec"] = dict(job["spec"], name="renamed")
    tx.put_fired_job(job)
    with pytest.raises(AssertionError, match="changed more than its state"):
        tx.transition({"ok": True})
