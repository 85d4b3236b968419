"""Runs fired ahead and never called because their node was down at their
second: the call horizon that says so (runtime/horizon.py), and their jobs'
misfire policies judging them (miss_uncalled, core/apply.py)."""

from __future__ import annotations

import asyncio
import os
import struct

import pytest

from raftsched import limits
from raftsched.core import commands, keys, lifecycle, runs
from raftsched.core.timeutil import format_ms
from raftsched.core.apply import SHARDS as SHARDS_TABLE
from raftsched.core.apply import RunCancelled
from raftsched.core.apply import RUNS_OPEN
from raftsched.runtime import horizon as horizon_module
from raftsched.runtime.horizon import CallHorizon, HorizonUnwritable, cover_or_drop
from raftsched.testing.replica import Replica

SHARDS = 256
NODE = "n1"
JOB = "job_a1"
SHARD = keys.shard_of(JOB, SHARDS)
DUE_MS = 1_000_000_000
EVERY_MS = 10_000
LEAD_MS = 20_000   # each occurrence armed this far ahead of its second


def spec(misfire: dict | None = None) -> dict:
    body = {"name": "j", "schedule": {"kind": "every", "every_ms": EVERY_MS, "text": "10s"},
            "target": {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST",
                       "headers": {}, "body": None, "timeout_s": 5.0},
            "retry": {"max_attempts": 1}, "concurrency": {"policy": "allow"}, "metadata": {}}
    if misfire is not None:
        body["misfire"] = misfire
    return body


def token(log: Replica) -> int:
    return log.store.get(SHARDS_TABLE, keys.shard_key(SHARD))["token"]


def armed_three(misfire: dict | None = None) -> Replica:
    """A job every 10 s whose occurrences at DUE_MS, +10 s and +20 s are armed,
    held by NODE (its next one not fired: DUE_MS + 30 s)."""
    log = Replica()
    log.run(commands.assign_shards(assignments=[(SHARD, NODE)], at_ms=1))
    created = log.run(commands.create_job(job_id=JOB, tenant="default", spec=spec(misfire),
                                          idempotency_key=None, shard=SHARD, next_ms=DUE_MS,
                                          at_ms=1_000))
    assert created["ok"], created
    for i in range(3):
        due = DUE_MS + i * EVERY_MS
        fired = log.run(commands.fire(shard=SHARD, token=token(log), upto_ms=due - LEAD_MS,
                                      node=NODE, at_ms=due - LEAD_MS,
                                      items=[(JOB, due, due + EVERY_MS, [due], False)]))
        assert fired["fired"] == 1, fired
    assert [run(log, i)["state"] for i in range(3)] == [lifecycle.RUNNING] * 3
    assert all(run(log, i)["armed_ms"] is not None for i in range(3))
    log.effects.clear()
    return log


def run(log: Replica, i: int) -> dict:
    return log.get_run(keys.run_id(JOB, DUE_MS + i * EVERY_MS))


def judge(log: Replica, at_ms: int, after_ms: int = DUE_MS - 1, node: str = NODE,
          tok: int | None = None) -> dict:
    ids = [keys.run_id(JOB, DUE_MS + i * EVERY_MS) for i in range(3)]
    return log.run(commands.miss_uncalled(node=node, shard=SHARD,
                                          token=token(log) if tok is None else tok,
                                          uncalled_after_ms=after_ms, run_ids=ids, at_ms=at_ms))


def states(log: Replica) -> list[str]:
    return [run(log, i)["state"] for i in range(3)]


def open_ids(log: Replica) -> set[str]:
    return {key[2:].decode() for key, _ in log.store.scan(RUNS_OPEN)}


# --- apply -------------------------------------------------------------------------------

def test_fire_once_calls_the_latest_late_one_and_misses_the_others():
    log = armed_three()
    result = judge(log, at_ms=DUE_MS + 25_000)
    assert result == {"ok": True, "ended": 2, "judged": 3}
    assert states(log) == [lifecycle.MISSED, lifecycle.MISSED, lifecycle.RUNNING]
    for i in (0, 1):
        ended = run(log, i)
        assert ended["attempts"] == [] and ended["started_ms"] is None
        assert ended["holder"] is None and ended["finished_ms"] == DUE_MS + 25_000
        assert "never called" not in ended["reason"]
        assert ended["reason"].startswith("fired ahead of its second, and not called: node n1 "
                                          "stopped")
        assert "is called late instead (fire_once policy)" in ended["reason"]
    # Their holder drops them; their open-run rows and the job's active list lose them.
    assert sorted(e.run_id for e in log.effects if isinstance(e, RunCancelled)) == \
        sorted(run(log, i)["id"] for i in (0, 1))
    assert open_ids(log) == {run(log, 2)["id"]}
    assert log.job()["active"] == [run(log, 2)["id"]]


def test_fire_once_misses_them_all_when_a_later_occurrence_is_due_unfired():
    log = armed_three()
    result = judge(log, at_ms=DUE_MS + 35_000)   # the next, at +30 s, is due too
    assert result["ended"] == 3
    assert states(log) == [lifecycle.MISSED] * 3
    assert "a later occurrence runs late instead" in run(log, 2)["reason"]
    assert log.job()["active"] == []


def test_fire_once_misses_them_all_when_a_later_occurrence_fired_late_already():
    """The trigger's late fire of +30 s and +40 s came first: that run is the
    one late run."""
    log = armed_three()
    at_ms = DUE_MS + 45_000
    fired = log.run(commands.fire(shard=SHARD, token=token(log), upto_ms=at_ms, node=NODE,
                                  at_ms=at_ms,
                                  items=[(JOB, DUE_MS + 30_000, DUE_MS + 50_000,
                                          [DUE_MS + 30_000, DUE_MS + 40_000], False)]))
    assert fired["fired"] == 1, fired
    late = log.get_run(keys.run_id(JOB, DUE_MS + 40_000))
    assert late["state"] == lifecycle.RUNNING and late.get("armed_ms") is None
    assert judge(log, at_ms=at_ms + 1)["ended"] == 3
    assert states(log) == [lifecycle.MISSED] * 3
    assert log.job()["active"] == [late["id"]]


def test_skip_skips_those_later_than_its_tolerance_and_calls_the_rest():
    log = armed_three({"policy": "skip", "tolerance_ms": 15_000, "catchup_max": 100})
    assert judge(log, at_ms=DUE_MS + 25_000)["ended"] == 1
    assert states(log) == [lifecycle.SKIPPED, lifecycle.RUNNING, lifecycle.RUNNING]
    assert "; 25000 ms late, over the misfire tolerance of 15000 ms (skip policy)" \
        in run(log, 0)["reason"]


def test_fire_all_calls_every_one():
    log = armed_three({"policy": "fire_all", "tolerance_ms": 0, "catchup_max": 100})
    before = log.job()
    assert judge(log, at_ms=DUE_MS + 25_000) == {"ok": True, "ended": 0, "judged": 3}
    assert log.job() == before
    assert states(log) == [lifecycle.RUNNING] * 3
    assert not any(isinstance(e, RunCancelled) for e in log.effects)


def test_a_run_due_before_the_horizon_may_have_been_called_and_is_left():
    log = armed_three()
    result = judge(log, at_ms=DUE_MS + 25_000, after_ms=DUE_MS + 5_000)
    assert result == {"ok": True, "ended": 1, "judged": 2}
    assert states(log) == [lifecycle.RUNNING, lifecycle.MISSED, lifecycle.RUNNING]


def test_a_run_not_due_yet_is_left_armed():
    log = armed_three()
    assert judge(log, at_ms=DUE_MS + 15_000) == {"ok": True, "ended": 1, "judged": 2}
    assert states(log) == [lifecycle.MISSED, lifecycle.RUNNING, lifecycle.RUNNING]


def test_another_nodes_word_or_an_old_token_ends_nothing():
    log = armed_three()
    assert judge(log, at_ms=DUE_MS + 25_000, node="n2")["error"] == "stale_token"
    assert judge(log, at_ms=DUE_MS + 25_000, tok=token(log) - 1)["error"] == "stale_token"
    assert states(log) == [lifecycle.RUNNING] * 3


def test_a_run_taken_over_as_its_next_attempt_is_not_judged():
    """Its first attempt may have been called by the node that held it."""
    log = armed_three()
    log.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=DUE_MS + 1))
    ids = [run(log, i)["id"] for i in range(3)]
    log.run(commands.take_over_runs(node="n2", shard=SHARD, token=token(log), run_ids=ids,
                                    at_ms=DUE_MS + 1))
    assert run(log, 0)["attempt"] == 2 and run(log, 1)["attempt"] == 1
    result = judge(log, at_ms=DUE_MS + 25_000, node="n2")
    # Attempt 2 of the first is not judged; the other two moved as the same
    # attempt (not due at the take-over), and n2 never called them.
    assert result == {"ok": True, "ended": 1, "judged": 2}
    assert states(log) == [lifecycle.RUNNING, lifecycle.MISSED, lifecycle.RUNNING]


def test_the_transition_is_only_for_a_running_run():
    assert lifecycle.next_state("r", lifecycle.RUNNING, "miss") == lifecycle.MISSED
    assert lifecycle.next_state("r", lifecycle.RUNNING, "skip") == lifecycle.SKIPPED
    assert not lifecycle.allows(lifecycle.QUEUED, "miss")
    assert not lifecycle.allows(lifecycle.SUCCEEDED, "skip")


# --- the horizon file ------------------------------------------------------------------

def test_a_new_folder_claims_nothing(tmp_path):
    horizon = CallHorizon(str(tmp_path))
    assert horizon.previous_ms is None and not horizon.covers(0)


async def test_a_call_pushes_the_horizon_past_its_due_time_once_per_step(tmp_path):
    horizon = CallHorizon(str(tmp_path))
    await cover_or_drop(horizon, 5_000)
    assert horizon.covered_ms == 5_000 + limits.call_horizon_step_ms
    await asyncio.gather(*(cover_or_drop(horizon, 5_000 + i) for i in range(50)))
    assert horizon.writes_total == 1
    await cover_or_drop(horizon, horizon.covered_ms + 1)
    assert horizon.writes_total == 2
    # What the next start reads: no call was due after it.
    assert CallHorizon(str(tmp_path)).previous_ms == horizon.covered_ms


async def test_calls_waiting_on_one_push_share_it(tmp_path):
    horizon = CallHorizon(str(tmp_path))
    await asyncio.gather(cover_or_drop(horizon, 1_000), cover_or_drop(horizon, 2_000))
    assert horizon.writes_total == 1 and horizon.covers(2_000)


def test_a_file_of_another_size_claims_nothing(tmp_path):
    (tmp_path / horizon_module.FILE_NAME).write_bytes(b"\x00" * 5)
    assert CallHorizon(str(tmp_path)).previous_ms is None


async def test_a_failed_write_removes_the_file_and_the_call_goes_ahead(tmp_path, monkeypatch):
    horizon = CallHorizon(str(tmp_path))
    await cover_or_drop(horizon, 1_000)
    path = tmp_path / horizon_module.FILE_NAME
    assert struct.unpack(">q", path.read_bytes())[0] == horizon.covered_ms

    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(horizon_module.os, "pwrite", full)
    await cover_or_drop(horizon, horizon.covered_ms + 1)   # does not raise
    assert not path.exists() and horizon.covered_ms is None
    assert CallHorizon(str(tmp_path)).previous_ms is None


async def test_a_horizon_neither_written_nor_removed_stops_the_call(tmp_path):
    os.mkdir(tmp_path / horizon_module.FILE_NAME)   # a folder where the file goes
    horizon = CallHorizon(str(tmp_path))
    with pytest.raises(HorizonUnwritable):
        await cover_or_drop(horizon, 1_000)


# --- judged at a take-over, by the holder's recorded lease -------------------------------

LEASE_MS = runs.LEASE_BOUND_MS


def registered(log: Replica, node: str = NODE) -> None:
    log.run(commands.register_node(node=node, http=f"http://{node}", raft=f"raft-{node}",
                                   at_ms=2_000))


def node_record(log: Replica, node: str = NODE) -> dict | None:
    return log.store.get("nodes", node.encode())


def test_a_recorded_renewal_keeps_the_latest_time_of_a_registered_node_only():
    log = Replica()
    registered(log)
    log.run(commands.renew(node=NODE, at_ms=5_000))
    assert "renewed_ms" not in node_record(log)   # level 3's renewal writes nothing
    log.run(commands.renew(node=NODE, at_ms=6_000, record=True))
    log.run(commands.renew(node=NODE, at_ms=5_500, record=True))   # applied out of order
    assert node_record(log)["renewed_ms"] == 6_000
    log.run(commands.renew(node="n9", at_ms=7_000, record=True))
    assert node_record(log, "n9") is None


def taken_by_n2(log: Replica, at_ms: int, judge: bool = True) -> dict:
    moved = log.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=at_ms - 1))
    assert moved["ok"], moved
    ids = [keys.run_id(JOB, DUE_MS + i * EVERY_MS) for i in range(3)]
    return log.run(commands.take_over_runs(node="n2", shard=SHARD, token=token(log),
                                           run_ids=ids, at_ms=at_ms, judge_uncalled=judge))


def test_a_take_over_judges_the_late_runs_a_holder_armed_past_the_end_of_its_lease():
    log = armed_three()
    registered(log)
    log.run(commands.renew(node=NODE, at_ms=DUE_MS - LEAD_MS, record=True))
    result = taken_by_n2(log, at_ms=DUE_MS + 25_000)
    assert result == {"ok": True, "taken": 1, "stale": 0, "ended": 2}
    assert states(log) == [lifecycle.MISSED, lifecycle.MISSED, lifecycle.RUNNING]
    latest = run(log, 2)
    assert (latest["holder"], latest["attempt"], latest.get("redeliveries", 0)) == ("n2", 1, 0)
    bound = format_ms(DUE_MS - LEAD_MS + LEASE_MS)
    assert run(log, 0)["reason"].startswith(
        f"fired ahead of its second, and not called: node n1 held no shard lease after {bound}")
    assert open_ids(log) == {latest["id"]}
    assert log.job()["active"] == [latest["id"]]


def test_a_take_over_judges_nothing_without_the_flag_or_a_recorded_renewal():
    """Level 3 (no judge_uncalled), or no renewal recorded: each due run may
    have been called, and is taken over as its next attempt."""
    for judge, record in ((False, True), (True, False)):
        log = armed_three()
        registered(log)
        log.run(commands.renew(node=NODE, at_ms=DUE_MS - LEAD_MS, record=record))
        result = taken_by_n2(log, at_ms=DUE_MS + 25_000, judge=judge)
        assert result == {"ok": True, "taken": 3, "stale": 0, "next_attempts": 3}, (judge, record)
        assert [run(log, i)["attempt"] for i in range(3)] == [2, 2, 2]


def test_a_run_due_within_the_holders_lease_is_taken_over_as_its_next_attempt():
    log = armed_three()
    registered(log)
    # Renewed just before the first second: its lease covered it, not the others.
    log.run(commands.renew(node=NODE, at_ms=DUE_MS - 1_000, record=True))
    result = taken_by_n2(log, at_ms=DUE_MS + 25_000)
    assert result == {"ok": True, "taken": 2, "stale": 0, "next_attempts": 1, "ended": 1}
    assert states(log) == [lifecycle.RUNNING, lifecycle.MISSED, lifecycle.RUNNING]
    assert [run(log, i)["attempt"] for i in (0, 2)] == [2, 1]


def test_a_take_over_judging_uncalled_runs_is_refused_whole_under_a_stale_token():
    log = armed_three()
    registered(log)
    log.run(commands.renew(node=NODE, at_ms=DUE_MS - LEAD_MS, record=True))
    log.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=DUE_MS))
    ids = [keys.run_id(JOB, DUE_MS + i * EVERY_MS) for i in range(3)]
    result = log.run(commands.take_over_runs(node="n2", shard=SHARD, token=token(log) - 1,
                                             run_ids=ids, at_ms=DUE_MS + 25_000,
                                             judge_uncalled=True))
    assert (result["ok"], result["error"]) == (False, "stale_token")
    assert states(log) == [lifecycle.RUNNING] * 3


def test_once_recorded_every_renewal_keeps_the_latest_and_a_new_address_keeps_it():
    """Recorded once, every replica applies level 4: a renewal proposed
    without `record` (its node did not hear every peer) still moves the time
    on, so the lease's end is never read from a renewal older than its
    latest. A registration with new addresses keeps it."""
    from raftsched.runtime.dispatcher import JUDGE_UNCALLED_LEVEL, recorded_level

    log = Replica()
    registered(log)
    assert recorded_level(log.store, NODE) == commands.APPLY_LEVEL_UNSAID
    log.run(commands.renew(node=NODE, at_ms=6_000, record=True))
    log.run(commands.renew(node=NODE, at_ms=7_000))
    assert node_record(log)["renewed_ms"] == 7_000
    assert recorded_level(log.store, NODE) == JUDGE_UNCALLED_LEVEL
    log.run(commands.register_node(node=NODE, http="http://moved", raft="raft-moved",
                                   at_ms=8_000))
    assert (node_record(log)["http"], node_record(log)["renewed_ms"]) == ("http://moved", 7_000)
