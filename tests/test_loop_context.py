"""The loops run on what they are given (runtime/context.py), with no node:
a replica in memory, its proposals applied at once, and stand-ins named for
what they stand for. And the effects bus (runtime/effects.py) that hands
them what applied entries did."""

from __future__ import annotations

import asyncio
import logging

from raftsched.core import commands, keys
from raftsched.core.apply import ALERTS, JOBS, RUNS
from raftsched.core.tx import BACKFILLS
from raftsched.executors.http import Reply
from raftsched.runtime.backfiller import Backfiller
from raftsched.runtime.effects import Effects
from raftsched.runtime.purger import Purger, Retention
from raftsched.runtime.reaper import Reaper
from raftsched.runtime.supervise import Supervisor
from raftsched.testing.replica import HTTP, Replica, no_call

SHARDS = 256
SECOND_MS = 1000
HOUR_MS = 3_600_000
T0 = 1_767_225_600_000   # 2026-01-01T00:00:00Z


def make_job(replica: Replica, job_id: str, *, schedule: dict, alert: dict | None = None,
             history: dict | None = None, at_ms: int = T0) -> dict:
    spec = {"name": "j", "schedule": schedule, "target": HTTP,
            "retry": {"max_attempts": 1, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0,
                      "non_retryable_exit_codes": []},
            "concurrency": {"policy": "allow"}, "alert": alert or {}, "metadata": {},
            "history": history or {}}
    shard = keys.shard_of(job_id, SHARDS)
    replica.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=1))
    created = replica.run(commands.create_job(job_id=job_id, tenant="default", spec=spec,
                                              idempotency_key=None, shard=shard,
                                              next_ms=at_ms + SECOND_MS, at_ms=at_ms))
    assert created["ok"], created
    return created["job"]


def fire_and_finish(replica: Replica, job_id: str, ok: bool) -> str:
    """Fire the job's next occurrence on n1 and finish it; the run's id."""
    job = replica.store.get(JOBS, keys.job_key(job_id))
    due = job["next_ms"]
    token = replica.store.get("shards", keys.shard_key(job["shard"]))["token"]
    fired = replica.run(commands.fire(shard=job["shard"], token=token, upto_ms=due, node="n1",
                                      at_ms=due, items=[(job_id, due, due + SECOND_MS, [due],
                                                         False)]))
    assert fired["fired"] == 1, fired
    run_id = keys.run_id(job_id, due)
    finished = replica.run(commands.run_updates(updates=[{
        "run_id": run_id, "event": "finish", "holder": "n1", "attempt": 1, "at_ms": due + 10,
        "ok": ok, "retryable": False, "retry_delay_ms": None, "http_status": 200 if ok else 500,
        "exit_code": None, "error": None if ok else "HTTP 500", "output_node": "n1"}]))
    assert finished["accepted"] == [True], finished
    return run_id


# --- the effects bus ------------------------------------------------------------------

class Queued:
    def __init__(self, n: int) -> None:
        self.n = n


class Lost:
    def __init__(self, shard: int) -> None:
        self.shard = shard


def test_effects_reach_their_subscribers_in_apply_order_and_an_after_hook_once_an_entry():
    bus = Effects()
    seen: list = []
    bus.subscribe(Queued, lambda e: seen.append(("a", e.n)))
    bus.subscribe(Queued, lambda e: seen.append(("b", e.n)))
    bus.subscribe(Lost, lambda e: seen.append(("lost", e.shard)),
                  after=lambda: seen.append("lost: after the entry"))
    bus.deliver((Queued(1), Lost(7), Queued(2), Lost(8), object()))
    assert seen == [("a", 1), ("b", 1), ("lost", 7), ("a", 2), ("b", 2), ("lost", 8),
                    "lost: after the entry"]
    seen.clear()
    bus.deliver((Queued(3),))
    assert seen == [("a", 3), ("b", 3)]   # no Lost in this entry: no after hook
    assert bus.kinds() == {Queued, Lost}


def test_a_handler_that_raises_is_logged_and_counted_and_the_others_still_act(caplog):
    bus = Effects()
    seen: list = []

    def broken(effect: Queued) -> None:
        raise RuntimeError("a bug")
    bus.subscribe(Queued, broken)
    bus.subscribe(Queued, lambda e: seen.append(e.n))
    with caplog.at_level(logging.ERROR, logger="raftsched.node"):
        bus.deliver((Queued(1), Queued(2)))
    assert seen == [1, 2]
    assert bus.failed_total == 2
    assert [r.getMessage().startswith("acting on an applied entry's effect failed")
            for r in caplog.records] == [True, True]


# --- leader-only loops over a replica ---------------------------------------------------

async def test_the_backfiller_proposes_a_step_that_launches_runs_and_moves_its_cursor():
    replica = Replica()
    make_job(replica, "job_bf", schedule={"kind": "every", "every_ms": HOUR_MS, "text": "1h"},
             at_ms=T0 + 24 * HOUR_MS)
    job = replica.store.get(JOBS, keys.job_key("job_bf"))
    assert replica.run(commands.create_backfill(
        backfill_id="bf_1", job_id="job_bf", tenant="default", expected_version=job["version"],
        start_ms=T0, end_ms=T0 + 6 * HOUR_MS, overlap="allow", max_concurrent=2, total=6,
        at_ms=T0 + 24 * HOUR_MS, actor="tok_1"))["ok"]
    backfiller = Backfiller(replica.replicated(now_ms=lambda: T0 + 24 * HOUR_MS))
    assert await backfiller.maybe_step() is True
    record = replica.store.get(BACKFILLS, b"bf_1")
    assert [run_id for run_id, _ in record["open"]] == [
        keys.run_id("job_bf", T0), keys.run_id("job_bf", T0 + HOUR_MS)]   # max_concurrent
    assert replica.store.get(RUNS, keys.run_id("job_bf", T0).encode())["trigger"] == "backfill"
    assert (backfiller.steps_total, backfiller.launched_total) == (1, 2)
    assert await backfiller.maybe_step() is False   # no room until one ends


async def test_the_purger_proposes_what_it_chose_and_counts_what_apply_removed():
    replica = Replica()
    make_job(replica, "job_p", schedule={"kind": "every", "every_ms": SECOND_MS, "text": "1s"},
             history={"max_runs": 2})
    run_ids = [fire_and_finish(replica, "job_p", ok=True) for _ in range(5)]
    purger = Purger(replica.replicated(now_ms=lambda: T0 + HOUR_MS), Retention())
    assert await purger.maybe_purge() is False   # the batch was not full
    assert [replica.store.get(RUNS, r.encode()) is None for r in run_ids] == \
        [True, True, True, False, False]
    assert purger.purged_runs_total == 3


async def test_the_alerter_posts_with_the_alert_key_and_records_the_outcome():
    replica = Replica()
    make_job(replica, "job_al", schedule={"kind": "every", "every_ms": SECOND_MS, "text": "1s"},
             alert={"webhook_url": "https://alerts.example/hook"})
    failed = fire_and_finish(replica, "job_al", ok=False)
    assert replica.store.get(ALERTS, failed.encode()) is not None
    posted: list = []

    async def send(method: str, url: str, headers: dict, body: bytes | None,
                   timeout_s: float) -> Reply:
        posted.append((method, url, headers["Idempotency-Key"]))
        return Reply(204, b"", None)
    supervisor = Supervisor("test")
    reaper = Reaper(replica.replicated(now_ms=lambda: T0 + HOUR_MS), spawn=supervisor.spawn,
                    send=send)
    reaper.maybe_deliver_alerts()
    deadline = asyncio.get_running_loop().time() + 5
    while replica.store.get(ALERTS, failed.encode()) is not None:
        assert asyncio.get_running_loop().time() < deadline, "the alert's outcome not recorded"
        await asyncio.sleep(0.01)
    assert posted == [("POST", "https://alerts.example/hook", "alert_" + failed)]
    assert reaper.alerts_sent_total == 1
    await supervisor.stop()


async def test_an_alerter_that_no_longer_leads_leaves_the_alert_to_the_next_leader():
    replica = Replica()
    make_job(replica, "job_al", schedule={"kind": "every", "every_ms": SECOND_MS, "text": "1s"},
             alert={"webhook_url": "https://alerts.example/hook"})
    failed = fire_and_finish(replica, "job_al", ok=False)
    supervisor = Supervisor("test")
    tasks: list[asyncio.Task] = []

    def spawn(name: str, coroutine) -> asyncio.Task:
        tasks.append(supervisor.spawn(name, coroutine))
        return tasks[-1]
    reaper = Reaper(replica.replicated(is_leader=lambda: False), spawn=spawn, send=no_call)
    reaper.maybe_deliver_alerts()
    [task] = tasks
    await asyncio.wait_for(task, 5)
    assert replica.store.get(ALERTS, failed.encode()) is not None   # still pending
    assert reaper.alerts_sent_total == reaper.alerts_failed_total == 0
    assert supervisor.failures == {}
