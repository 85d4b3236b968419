"""Firing ahead: the trigger arms only what may be armed, and apply withdraws an armed run edited before its second."""

from __future__ import annotations

import asyncio

import pytest

from raftsched import limits
from raftsched.core import commands, keys, lifecycle
from raftsched.core.apply import DUE, RunCancelled, RunQueued
from raftsched.core.apply import SHARDS as SHARDS_TABLE
from raftsched.runtime.trigger import TriggerLoop
from raftsched.testing.replica import Replica

SHARDS = 256
NODE = "n1"
DUE_MS = 1_000_000_000
ARMED_AT_MS = DUE_MS - 20_000   # a fire 20 s ahead of the due second


def spec(schedule: dict | None = None, policy: str = "allow") -> dict:
    return {"name": "j", "schedule": schedule or {"kind": "once", "run_at_ms": DUE_MS},
            "target": {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST",
                       "headers": {}, "body": None, "timeout_s": 5.0},
            "retry": {"max_attempts": 1}, "concurrency": {"policy": policy}, "metadata": {}}


EVERY_60S = {"kind": "every", "every_ms": 60_000, "text": "60s"}


def setup(job_id: str = "job_a1", job_spec: dict | None = None) -> Replica:
    log = Replica()
    log.run(commands.assign_shards(assignments=[(keys.shard_of(job_id, SHARDS), NODE)], at_ms=1))
    created = log.run(commands.create_job(job_id=job_id, tenant="default",
                                          spec=job_spec or spec(), idempotency_key=None,
                                          shard=keys.shard_of(job_id, SHARDS),
                                          next_ms=DUE_MS, at_ms=1_000))
    assert created["ok"], created
    return log


def fire_ahead(log: Replica, job_id: str = "job_a1", at_ms: int = ARMED_AT_MS,
               next_ms: int | None = None) -> dict:
    shard = keys.shard_of(job_id, SHARDS)
    token = log.store.get(SHARDS_TABLE, keys.shard_key(shard))["token"]
    return log.run(commands.fire(shard=shard, token=token, upto_ms=at_ms, node=NODE,
                                 at_ms=at_ms, items=[(job_id, DUE_MS, next_ms, [DUE_MS], False)]))


def armed_run(log: Replica, job_id: str = "job_a1") -> dict:
    return log.get_run(keys.run_id(job_id, DUE_MS))


def armed(log: Replica) -> dict:
    result = fire_ahead(log)
    assert result["fired"] == 1, result
    run = armed_run(log)
    # Held by its shard's owner from the fire (the lease is taken at fire).
    assert run["state"] == lifecycle.RUNNING and run["holder"] == NODE
    assert run["armed_ms"] == ARMED_AT_MS
    log.effects.clear()
    return run


# --- apply -------------------------------------------------------------------------------

def test_an_armable_job_fires_ahead_and_its_run_is_queued_armed():
    log = setup()
    run = armed(log)
    assert run["node"] == NODE and run["scheduled_ms"] == DUE_MS


def test_apply_refuses_to_fire_ahead_what_may_not_be_armed():
    log = setup(job_spec=spec(EVERY_60S, policy="skip_if_running"))
    result = fire_ahead(log, next_ms=DUE_MS + 60_000)
    assert result == {"ok": True, "fired": 0, "stale": 1, "node": NODE}
    assert armed_run(log) is None
    assert log.job()["next_ms"] == DUE_MS   # still due, fired at its second
    # At its second the same fire is taken.
    assert fire_ahead(log, at_ms=DUE_MS, next_ms=DUE_MS + 60_000)["fired"] == 1


def test_apply_refuses_a_fire_further_ahead_than_the_arming_bound():
    log = setup()
    assert fire_ahead(log, at_ms=DUE_MS - 301_000)["stale"] == 1
    assert armed_run(log) is None


@pytest.mark.parametrize("edit, why", [
    (lambda: commands.pause_job(job_id="job_a1", at_ms=DUE_MS - 1_500), "paused"),
    (lambda: commands.delete_job(job_id="job_a1", at_ms=DUE_MS - 1_500), "deleted"),
    (lambda: commands.update_job(job_id="job_a1", spec=spec({"kind": "once", "run_at_ms": DUE_MS + 5_000}),
                                 expected_version=1, next_ms=DUE_MS + 5_000,
                                 at_ms=DUE_MS - 1_500), "schedule was changed"),
])
def test_an_edit_before_the_due_second_withdraws_the_armed_run(edit, why):
    log = setup()
    run = armed(log)
    assert log.run(edit())["ok"]
    withdrawn = armed_run(log)
    assert withdrawn["state"] == lifecycle.CANCELLED
    assert withdrawn["reason"].startswith("withdrawn: ") and why in withdrawn["reason"]
    assert RunCancelled(run_id=run["id"], holder=NODE, attempt=1) in log.effects
    assert not log.store.scan(DUE, start=keys.shard_prefix(keys.shard_of("job_a1", SHARDS)),
                              stop=keys.due_upto_key(keys.shard_of("job_a1", SHARDS), DUE_MS))
    assert run["id"] not in log.job().get("active", [])


def test_a_cancel_before_the_due_second_tells_the_owner_to_drop_the_armed_run():
    log = setup()
    run = armed(log)
    assert log.run(commands.cancel_run(run_id=run["id"], reason="no longer needed",
                                       at_ms=DUE_MS - 1_500))["ok"]
    assert armed_run(log)["state"] == lifecycle.CANCELLED
    assert RunCancelled(run_id=run["id"], holder=NODE, attempt=1) in log.effects


def test_a_run_already_due_is_not_withdrawn():
    log = setup()
    armed(log)
    assert log.run(commands.pause_job(job_id="job_a1", at_ms=DUE_MS))["ok"]
    run = armed_run(log)
    assert run["state"] == lifecycle.RUNNING
    assert not [e for e in log.effects if isinstance(e, RunCancelled)]


def test_an_update_that_keeps_the_schedule_keeps_the_armed_run():
    log = setup()
    armed(log)
    changed = dict(log.job()["spec"], name="renamed")   # as a PATCH merges it
    assert log.run(commands.update_job(job_id="job_a1", spec=changed, expected_version=1,
                                       next_ms=None, at_ms=DUE_MS - 1_500))["ok"]
    assert armed_run(log)["state"] == lifecycle.RUNNING


def test_a_withdrawn_occurrence_the_schedule_brings_back_fires_again():
    log = setup(job_spec=spec(EVERY_60S))
    armed_now = fire_ahead(log, next_ms=DUE_MS + 60_000)
    assert armed_now["fired"] == 1
    assert log.run(commands.pause_job(job_id="job_a1", at_ms=DUE_MS - 3_000))["ok"]
    assert armed_run(log)["state"] == lifecycle.CANCELLED
    # Resumed before the second: the occurrence is the next one again, and runs.
    assert log.run(commands.resume_job(job_id="job_a1", next_ms=DUE_MS,
                                       at_ms=DUE_MS - 2_000))["ok"]
    log.effects.clear()
    again = fire_ahead(log, at_ms=DUE_MS - 1_000, next_ms=DUE_MS + 60_000)
    assert again["fired"] == 1
    run = armed_run(log)
    assert run["state"] == lifecycle.RUNNING and not run.get("withdrawn")
    assert [e.run["id"] for e in log.effects if isinstance(e, RunQueued)] == [run["id"]]


# --- the trigger -------------------------------------------------------------------------

def trigger_over(log: Replica, now_ms: int, arm_ahead_ms: int) -> TriggerLoop:
    trigger = TriggerLoop(log.replicated(node_id=NODE, now_ms=lambda: now_ms),
                          arm_ahead_ms=arm_ahead_ms, propose_entry=log.propose_entry,
                          spawn=lambda name, coro: asyncio.ensure_future(coro),
                          synced=lambda: True, armed_room=lambda: 1)
    trigger.resync()
    return trigger


async def one_pass(trigger: TriggerLoop) -> int | None:
    next_ms = trigger.maybe_fire_due()
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.gather(*pending)
    return next_ms


async def test_the_trigger_fires_an_armable_job_within_its_window_and_no_earlier():
    log = setup()
    early = trigger_over(log, DUE_MS - 31_000, arm_ahead_ms=30_000)
    assert await one_pass(early) == DUE_MS - 30_000   # wakes when the window reaches it
    assert armed_run(log) is None
    await one_pass(trigger_over(log, DUE_MS - 29_000, arm_ahead_ms=30_000))
    assert armed_run(log)["armed_ms"] == DUE_MS - 29_000


async def test_the_trigger_fires_a_job_that_may_not_be_armed_at_its_second():
    log = setup(job_spec=spec(EVERY_60S, policy="queue"))
    trigger = trigger_over(log, DUE_MS - 10_000, arm_ahead_ms=30_000)
    await one_pass(trigger)
    assert armed_run(log) is None
    # Held: the next pass wakes at the due second, not at once.
    assert await one_pass(trigger) == DUE_MS
    assert trigger.stale_items_total == 0


async def test_with_no_window_the_trigger_fires_at_the_second():
    log = setup()
    assert await one_pass(trigger_over(log, DUE_MS - 1, arm_ahead_ms=0)) == DUE_MS
    assert armed_run(log) is None


async def test_a_pass_fires_ahead_at_most_arm_fire_items_max_and_the_next_pass_the_rest():
    from raftsched import limits
    log = Replica()
    log.run(commands.assign_shards(assignments=[(s, NODE) for s in range(SHARDS)], at_ms=1))
    jobs = limits.arm_fire_items_max + 50
    for i in range(jobs):
        job_id = f"job_{i:04d}"
        assert log.run(commands.create_job(job_id=job_id, tenant="default", spec=spec(),
                                           idempotency_key=None,
                                           shard=keys.shard_of(job_id, SHARDS),
                                           next_ms=DUE_MS + i, at_ms=1_000))["ok"]
    trigger = trigger_over(log, DUE_MS - 10_000, arm_ahead_ms=30_000)

    def armed_count() -> int:
        return sum(1 for i in range(jobs) if log.get_run(keys.run_id(f"job_{i:04d}", DUE_MS + i)))
    await one_pass(trigger)
    assert armed_count() == limits.arm_fire_items_max
    # The earliest ones first.
    assert log.get_run(keys.run_id("job_0000", DUE_MS)) is not None
    await one_pass(trigger)
    assert armed_count() == jobs


@pytest.mark.parametrize("value", ["301", "-1", "nan"])
def test_the_arming_window_flag_is_bounded(value, tmp_path, capsys):
    from raftsched.cli import main
    code = main(["node", "--id", "n1", "--http", "127.0.0.1:1", "--raft", "127.0.0.1:2",
                 "--data", str(tmp_path), "--insecure-no-auth", "--arm-ahead-s", value])
    assert code == 2
    assert "--arm-ahead-s must be a number from 0 to 300" in capsys.readouterr().err


def _move_shard(log: Replica, at_ms: int) -> tuple[int, int]:
    shard = keys.shard_of("job_a1", SHARDS)
    log.run(commands.assign_shards(assignments=[(shard, "n2")], at_ms=at_ms))
    return shard, log.store.get(SHARDS_TABLE, keys.shard_key(shard))["token"]


def test_a_moved_shards_armed_run_not_yet_due_is_taken_over_as_the_same_attempt():
    """Its holder calls nothing early, so it cannot have called it: the new
    owner holds the same attempt, with no redelivery, and the old holder is
    told to drop it."""
    log = setup()
    run = armed(log)
    shard, token = _move_shard(log, ARMED_AT_MS + 1)
    log.effects.clear()
    taken = log.run(commands.take_over_runs(node="n2", shard=shard, token=token,
                                            run_ids=[run["id"]], at_ms=ARMED_AT_MS + 2))
    assert taken["taken"] == 1, taken
    after = armed_run(log)
    assert (after["state"], after["holder"], after["token"], after["attempt"]) == \
        (lifecycle.RUNNING, "n2", token, 1)
    assert not after.get("redeliveries") and after["attempts"][-1]["holder"] == "n2"
    assert [(e.run_id, e.holder) for e in log.effects if isinstance(e, RunCancelled)] == \
        [(run["id"], NODE)]
    assert [e.run["node"] for e in log.effects if isinstance(e, RunQueued)] == ["n2"]


def test_a_moved_shards_armed_run_due_within_the_margin_is_taken_over_as_its_next_attempt():
    log = setup()
    run = armed(log)
    shard, token = _move_shard(log, ARMED_AT_MS + 1)
    at_ms = DUE_MS - limits.take_over_armed_margin_ms
    taken = log.run(commands.take_over_runs(node="n2", shard=shard, token=token,
                                            run_ids=[run["id"]], at_ms=at_ms))
    assert taken["taken"] == 1, taken
    after = armed_run(log)
    assert (after["holder"], after["attempt"], after["redeliveries"]) == ("n2", 2, 1)


@pytest.mark.parametrize("uncalled_by, attempt", [(NODE, 1), ("n3", 2)])
def test_a_due_run_handed_over_by_its_holder_moves_as_the_same_attempt(uncalled_by, attempt):
    """Due, so only its holder can say it was not called: its own hand-over
    moves the same attempt; another node's word counts for nothing."""
    log = setup()
    run = armed(log)
    shard, token = _move_shard(log, ARMED_AT_MS + 1)
    taken = log.run(commands.hand_over_runs(node="n2", holder=uncalled_by, shard=shard,
                                            token=token, run_ids=[run["id"]],
                                            at_ms=DUE_MS + 10))
    assert taken["taken"] == 1, taken
    after = armed_run(log)
    assert (after["holder"], after["attempt"], after.get("redeliveries", 0)) == \
        ("n2", attempt, attempt - 1)


def test_the_api_says_when_a_run_was_armed_and_not_for_one_fired_at_its_second():
    """armed_at tells a run fired ahead from one fired at its second; the
    stored state stays what apply wrote when no time is given."""
    from raftsched.api.views import run_view
    from raftsched.core.timeutil import format_ms

    log = setup()
    run = armed(log)
    view = run_view(run)
    assert (view["state"], view["armed_at"]) == ("running", format_ms(ARMED_AT_MS))
    assert view["scheduled_for"] == format_ms(DUE_MS)
    at_second = setup("job_b2")
    shard = keys.shard_of("job_b2", SHARDS)
    token = at_second.store.get(SHARDS_TABLE, keys.shard_key(shard))["token"]
    assert at_second.run(commands.fire(shard=shard, token=token, upto_ms=DUE_MS, node=NODE,
                                       at_ms=DUE_MS, items=[("job_b2", DUE_MS, None, [DUE_MS],
                                                             False)]))["fired"] == 1
    fired_at_second = run_view(armed_run(at_second, "job_b2"), now_ms=DUE_MS)
    assert fired_at_second["armed_at"] is None
    assert (fired_at_second["state"], fired_at_second["started_at"]) == \
        ("running", format_ms(DUE_MS))


def test_an_armed_run_reads_armed_until_its_second_and_shows_no_start_until_its_call():
    """Before its second an armed run cannot have been called (no node calls
    early): the API says `armed`, with no start time, where the record holds
    `running` and its fire's time. From its second it reads `running`, and its
    finish gives the time its call began."""
    from raftsched.api.views import run_view
    from raftsched.core.timeutil import format_ms

    log = setup()
    run = armed(log)
    before = run_view(run, now_ms=DUE_MS - 1)
    assert before["state"] == lifecycle.ARMED
    assert before["started_at"] is None and before["attempts"][0]["started_at"] is None
    assert before["armed_at"] == format_ms(ARMED_AT_MS)
    due = run_view(run, now_ms=DUE_MS)
    assert (due["state"], due["started_at"]) == ("running", None)
    called_ms = DUE_MS + 7
    finish = commands.RunFinish(run_id=run["id"], holder=NODE, attempt=1, at_ms=DUE_MS + 20,
                                ok=True, http_status=200, called_ms=called_ms)
    assert log.run(commands.run_updates(updates=[finish]))["accepted"] == [True]
    done = run_view(armed_run(log), now_ms=DUE_MS + 30)
    assert (done["state"], done["started_at"], done["attempts"][0]["started_at"]) == \
        ("succeeded", format_ms(called_ms), format_ms(called_ms))


def test_a_jittered_armed_run_reads_armed_until_its_jittered_time():
    from raftsched.core import runs

    log = setup()
    run = dict(armed(log), jitter_ms=400)
    assert runs.presented_state(run, DUE_MS + 399) == lifecycle.ARMED
    assert runs.presented_state(run, DUE_MS + 400) == lifecycle.RUNNING
    # A later attempt (taken over, or retried) is no longer the armed one.
    assert runs.presented_state(dict(run, attempt=2), DUE_MS) == lifecycle.RUNNING
    assert runs.presented_state(dict(run, armed_ms=None), DUE_MS) == lifecycle.RUNNING


def test_a_state_filter_of_armed_or_running_reads_the_state_an_answer_shows():
    from raftsched.core import queries

    log = setup()
    armed(log)
    run_id = keys.run_id("job_a1", DUE_MS)

    def listed(state: str, now_ms: int | None) -> list[str]:
        found, _ = queries.runs_page(log.store, "default", {"state": state}, 10, None, now_ms)
        return [r["id"] for r in found]

    assert listed("armed", DUE_MS - 1) == [run_id] and listed("running", DUE_MS - 1) == []
    assert listed("armed", DUE_MS) == [] and listed("running", DUE_MS) == [run_id]
    assert listed("running", None) == [run_id]   # no time: the stored state
