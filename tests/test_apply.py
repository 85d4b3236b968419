"""apply is deterministic, idempotent per occurrence, and refuses stale commands without writing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core import commands, keys, lifecycle
from raftsched.core.apply import (DUE, JOBS, RUNS, RUNS_OPEN, DueArmed, RunQueued,
                                  ShardsAssigned, apply, misfire_decisions)
from raftsched.core.apply import SHARDS as SHARDS_TABLE
from raftsched.errors import CommandRefused, InvalidTransition, UnknownCommand
from raftsched.storage.base import digest, due_until
from raftsched.storage.memory_store import MemoryStore
from raftsched.testing.proptest import examples
from raftsched.testing.replica import Replica

SHARDS = 256


def spec(schedule: dict) -> dict:
    return {"name": "j", "schedule": schedule,
            "target": {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST",
                       "headers": {}, "body": None, "timeout_s": 5.0},
            "retry": {"max_attempts": 1}, "concurrency": {"policy": "allow"}, "metadata": {}}


EVERY_2S = {"kind": "every", "every_ms": 2000, "text": "2s"}


Log = Replica   # applies commands to a store the way a node does: apply, then commit


def create(log: Log, job_id: str = "job_a1", schedule: dict = EVERY_2S, next_ms: int = 10_000,
           idem: str | None = None) -> dict:
    return log.run(commands.create_job(job_id=job_id, tenant="default", spec=spec(schedule),
                                       idempotency_key=idem, shard=keys.shard_of(job_id, SHARDS),
                                       next_ms=next_ms, at_ms=1_000))


def own(log: Log, shard: int, node: str) -> int:
    """Make `node` the owner of `shard`; return its fencing token."""
    state = log.store.get(SHARDS_TABLE, keys.shard_key(shard))
    if state is None or state["owner"] != node:
        log.run(commands.assign_shards(assignments=[(shard, node)], at_ms=1))
    return log.store.get(SHARDS_TABLE, keys.shard_key(shard))["token"]


def fire(log: Log, job_id: str, due_ms: int, next_ms: int | None, node: str = "n1",
         occurrences: list[int] | None = None, at_ms: int | None = None) -> dict:
    shard = keys.shard_of(job_id, SHARDS)
    token = own(log, shard, node)
    occurrences = occurrences or [due_ms]
    return log.run(commands.fire(shard=shard, token=token, upto_ms=at_ms or occurrences[-1],
                                 node=node, at_ms=at_ms or occurrences[-1],
                                 items=[(job_id, due_ms, next_ms, occurrences, False)]))


def test_create_arms_one_due_entry_and_idempotency_key_returns_the_same_job():
    log = Log()
    first = create(log, idem="k")
    assert first["ok"] and not first["existing"]
    again = create(log, job_id="job_b2", idem="k")
    assert again["existing"]
    assert again["job"]["id"] == "job_a1"
    assert log.store.get(JOBS, b"job_b2") is None
    shard = keys.shard_of("job_a1", SHARDS)
    assert due_until(log.store, shard, 10_000, 10) == [(10_000, "job_a1")]
    assert DueArmed(shard=shard, due_ms=10_000) in log.effects


def test_fire_creates_the_run_once_and_arms_the_next_occurrence():
    log = Log()
    create(log)
    result = fire(log, "job_a1", 10_000, 12_000)
    assert result == {"ok": True, "fired": 1, "stale": 0, "node": "n1"}
    duplicate = fire(log, "job_a1", 10_000, 12_000)
    assert duplicate == {"ok": True, "fired": 0, "stale": 1, "node": "n1"}
    created = [e.run for e in log.effects if isinstance(e, RunQueued)]
    assert len(created) == 1
    run = created[0]
    assert run["id"] == keys.run_id("job_a1", 10_000)
    assert run["execution_id"] == keys.execution_id("job_a1", 10_000)
    assert (run["state"], run["holder"]) == (lifecycle.RUNNING, "n1")   # held from its fire
    shard = keys.shard_of("job_a1", SHARDS)
    assert log.store.get(RUNS_OPEN, keys.open_run_key(shard, run["id"])) == 1
    assert due_until(log.store, shard, 20_000, 10) == [(12_000, "job_a1")]
    assert log.store.get(JOBS, b"job_a1")["next_ms"] == 12_000


def test_one_off_completes_after_its_fire():
    log = Log()
    create(log, schedule={"kind": "once", "run_at_ms": 5_000, "offset_min": 0}, next_ms=5_000)
    fire(log, "job_a1", 5_000, None)
    job = log.store.get(JOBS, b"job_a1")
    assert job["status"] == "completed"
    assert job["next_ms"] is None
    assert log.store.scan(DUE) == []


def test_paused_job_is_not_fired_and_resume_arms_from_the_given_time():
    log = Log()
    create(log)
    assert log.run(commands.pause_job(job_id="job_a1", at_ms=2_000))["job"]["status"] == "paused"
    assert log.store.scan(DUE) == []
    assert fire(log, "job_a1", 10_000, 12_000)["stale"] == 1
    resumed = log.run(commands.resume_job(job_id="job_a1", next_ms=50_000, at_ms=49_000))
    assert resumed["job"]["status"] == "active"
    assert [keys.parse_due_key(k)[1] for k, _ in log.store.scan(DUE)] == [50_000]


def test_update_with_a_stale_version_is_refused_without_writes():
    log = Log()
    create(log)
    before = digest(log.store)[1]
    refused = log.run(commands.update_job(job_id="job_a1", spec=spec(EVERY_2S),
                                          expected_version=7, next_ms=20_000, at_ms=3_000))
    assert refused["ok"] is False
    assert refused["error"] == "conflict"
    assert digest(log.store)[1] == before
    ok = log.run(commands.update_job(job_id="job_a1", spec=spec(EVERY_2S), expected_version=1,
                                     next_ms=20_000, at_ms=3_000))
    assert ok["job"]["version"] == 2
    assert [keys.parse_due_key(k)[1] for k, _ in log.store.scan(DUE)] == [20_000]


def test_delete_disarms_and_keeps_the_idempotency_key_reserved():
    log = Log()
    create(log, idem="k")
    log.run(commands.delete_job(job_id="job_a1", at_ms=2_000))
    assert log.store.scan(DUE) == []
    again = create(log, job_id="job_c3", idem="k")
    assert again["error"] == "idempotency_key_reserved"
    assert again["job_id"] == "job_a1"
    assert again["reserved_ms"] == 1_000
    assert log.store.get(JOBS, b"job_c3") is None
    assert log.run(commands.delete_job(job_id="job_a1", at_ms=3_000))["error"] == "not_found"


def test_run_updates_follow_the_lifecycle_and_count_duplicates():
    log = Log()
    create(log)
    fire(log, "job_a1", 10_000, 12_000)
    run_id = keys.run_id("job_a1", 10_000)

    def upd(event: str, node: str = "n1", ok: bool = True) -> dict:
        return {"run_id": run_id, "event": event, "at_ms": 10_050, "holder": node, "attempt": 1,
                "lease_ms": 15_050, "ok": ok, "retryable": True, "retry_delay_ms": 0,
                "http_status": 200, "exit_code": None, "error": None, "output_node": None}
    result = log.run(commands.run_updates(updates=[upd("start"), upd("finish")]))
    assert result["accepted"] == [False, True]   # held from its fire: no start
    assert log.store.get(RUNS, run_id.encode())["state"] == "succeeded"
    shard = keys.shard_of("job_a1", SHARDS)
    assert log.store.get(RUNS_OPEN, keys.open_run_key(shard, run_id)) is None
    again = log.run(commands.run_updates(updates=[upd("finish", ok=False),
                                                  upd("start", node="n9")]))
    assert again == {"ok": True, "applied": 0, "stale": 2, "accepted": [False, False]}
    assert log.store.get(RUNS, run_id.encode())["state"] == "succeeded"


def test_lifecycle_table_refuses_illegal_edges():
    assert lifecycle.next_state("r", "queued", "start") == "running"
    with pytest.raises(InvalidTransition) as info:
        lifecycle.next_state("r", "succeeded", "start")
    assert info.value.state == "succeeded"
    assert info.value.event == "start"


def test_unknown_versions_and_tags_are_refused_loudly():
    from raftsched.core import codec
    with pytest.raises(UnknownCommand):
        commands.decode(codec.pack({"v": 2, "t": "fire"}))
    with pytest.raises(UnknownCommand):
        commands.decode(codec.pack({"v": 1, "t": "drop_tables"}))
    # Bytes that are not a command are not a newer build's log: a refusal, not a stop.
    with pytest.raises(CommandRefused):
        commands.decode(b"\xc1")


def test_trigger_runs_a_paused_job_now():
    log = Log()
    create(log)
    own(log, keys.shard_of("job_a1", SHARDS), "n1")
    log.run(commands.pause_job(job_id="job_a1", at_ms=2_000))
    result = log.run(commands.trigger_job(job_id="job_a1", scheduled_ms=3_000, node="n2",
                                          at_ms=3_000))
    assert result["created"] is True
    assert result["run"]["trigger"] == "manual"
    # n2 took the request; the shard's owner holds the run, as a fired one.
    assert (result["run"]["node"], result["run"]["holder"], result["run"]["state"]) == \
        ("n1", "n1", "running")


_job_ids = st.sampled_from(["job_a1", "job_b2", "job_c3"])
_ops = st.one_of(
    st.tuples(st.just("create"), _job_ids, st.integers(1, 50)),
    st.tuples(st.just("fire"), _job_ids, st.integers(1, 50)),
    st.tuples(st.just("pause"), _job_ids, st.just(0)),
    st.tuples(st.just("resume"), _job_ids, st.integers(1, 50)),
    st.tuples(st.just("delete"), _job_ids, st.just(0)),
)


def _to_command(op: tuple, store: MemoryStore) -> dict:
    kind, job_id, t = op
    ms = t * 1000
    if kind == "create":
        return commands.create_job(job_id=job_id, tenant="default", spec=spec(EVERY_2S),
                                   idempotency_key=None, shard=keys.shard_of(job_id, SHARDS),
                                   next_ms=ms, at_ms=ms)
    if kind == "fire":
        job = store.get(JOBS, job_id.encode())
        due = job["next_ms"] if job and job["next_ms"] else ms
        shard = keys.shard_of(job_id, SHARDS)
        state = store.get(SHARDS_TABLE, keys.shard_key(shard))
        if state is None or state["owner"] != "n1":
            return commands.assign_shards(assignments=[(shard, "n1")], at_ms=ms)
        return commands.fire(shard=shard, token=state["token"], upto_ms=due, node="n1",
                             at_ms=due, items=[(job_id, due, due + 2000, [due], False)])
    if kind == "pause":
        return commands.pause_job(job_id=job_id, at_ms=ms)
    if kind == "resume":
        return commands.resume_job(job_id=job_id, next_ms=ms, at_ms=ms)
    return commands.delete_job(job_id=job_id, at_ms=ms)


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(_ops, min_size=1, max_size=30))
def test_replicas_applying_the_same_log_have_equal_digests(ops):
    """Two replicas fed the same encoded log end bit-for-bit equal; and every
    recurring active job has exactly one due entry, at its next_ms."""
    leader, follower = Log(), Log()
    for op in ops:
        data = commands.encode(_to_command(op, leader.store))
        for log in (leader, follower):
            log.index += 1
            transition = apply(log.store, commands.decode(data), log.index)
            log.store.commit(transition, log.index)
    assert digest(leader.store) == digest(follower.store)
    due = [keys.parse_due_key(k) for k, _ in leader.store.scan(DUE)]
    for _, job in leader.store.scan(JOBS):
        entries = [d for d in due if d[3] == job["id"]]
        if job["status"] == "active" and job["next_ms"] is not None:
            assert [d[1] for d in entries] == [job["next_ms"]]
        else:
            assert entries == []


def test_fire_with_a_stale_token_is_refused_and_counted():
    log = Log()
    create(log)
    shard = keys.shard_of("job_a1", SHARDS)
    old = own(log, shard, "n1")
    new = own(log, shard, "n2")
    assert new == old + 1
    assert ShardsAssigned(shard=shard, owner="n2", token=new) in log.effects
    refused = log.run(commands.fire(shard=shard, token=old, upto_ms=10_000, node="n1",
                                    at_ms=10_000, items=[("job_a1", 10_000, 12_000, [10_000],
                                                          False)]))
    assert refused["ok"] is False
    assert refused["error"] == "stale_token"
    assert log.store.get(SHARDS_TABLE, keys.shard_key(shard))["stale_fires"] == 1
    assert log.store.get(RUNS, keys.job_run_key("job_a1", 10_000)) is None
    # The same token from the wrong node is refused too: tokens are per owner.
    wrong_node = log.run(commands.fire(shard=shard, token=new, upto_ms=10_000, node="n1",
                                       at_ms=10_000, items=[("job_a1", 10_000, 12_000,
                                                             [10_000], False)]))
    assert wrong_node["error"] == "stale_token"
    assert fire(log, "job_a1", 10_000, 12_000, node="n2")["fired"] == 1


def test_fire_once_runs_the_latest_missed_occurrence_and_records_the_rest():
    log = Log()
    create(log)
    fire(log, "job_a1", 10_000, 18_000, occurrences=[10_000, 12_000, 14_000, 16_000],
         at_ms=16_500)
    runs = {r["scheduled_ms"]: r for _, r in log.store.scan(RUNS)}
    assert runs[16_000]["state"] == "running"
    assert [runs[t]["state"] for t in (10_000, 12_000, 14_000)] == ["missed"] * 3
    assert "fire_once" in runs[10_000]["reason"]
    dispatched = [e.run["scheduled_ms"] for e in log.effects if isinstance(e, RunQueued)]
    assert dispatched == [16_000]
    assert log.store.get(JOBS, b"job_a1")["next_ms"] == 18_000
    # An answer names the late run's time as it names every time.
    from raftsched.api.views import run_view
    assert run_view(runs[10_000])["reason"] == \
        "missed while nothing could fire; one late run for 1970-01-01T00:00:16Z instead " \
        "(fire_once policy)"


def test_misfire_policies_decide_per_occurrence():
    occ = [10_000, 12_000, 14_000]
    skip = {"policy": "skip", "tolerance_ms": 3_000, "catchup_max": 100}
    assert [d[1] for d in misfire_decisions(skip, occ, 14_500)] == ["skipped", "queued", "queued"]
    every = {"policy": "fire_all", "tolerance_ms": 0, "catchup_max": 100}
    assert [d[1] for d in misfire_decisions(every, occ, 99_000)] == ["queued"] * 3
    once = {"policy": "fire_once", "tolerance_ms": 0, "catchup_max": 100}
    assert [d[1] for d in misfire_decisions(once, [10_000], 10_001)] == ["queued"]


def test_fire_many_applies_each_part_under_its_own_token():
    """A part under a stale token is refused and counted alone; the others fire."""
    store = MemoryStore()

    def run(cmd, index):
        transition = apply(store, commands.decode(commands.encode(cmd)), index)
        store.commit(transition, index)
        return transition.result

    run(commands.assign_shards(assignments=[(0, "n1"), (1, "n1")], at_ms=1), 1)
    run(commands.assign_shards(assignments=[(1, "n2")], at_ms=1), 2)   # shard 1: token 2
    result = run(commands.fire_many(node="n1", at_ms=5, parts=[
        {"shard": 0, "token": 1, "upto_ms": 5, "items": [], "retries": []},
        {"shard": 1, "token": 1, "upto_ms": 5, "items": [], "retries": []}]), 3)
    assert [p["ok"] for p in result["parts"]] == [True, False]
    assert result["parts"][1]["error"] == "stale_token"
    assert store.get(SHARDS_TABLE, keys.shard_key(0))["checkpoint_ms"] == 5
    assert store.get(SHARDS_TABLE, keys.shard_key(1))["stale_fires"] == 1
