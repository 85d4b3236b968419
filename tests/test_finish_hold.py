"""Calls first: finishes held back while runs wait for a call slot
(runtime/reporter.py, dispatcher.may_hold)."""

from __future__ import annotations

import asyncio

import pytest

from raftsched import limits
from raftsched.core import commands
from raftsched.executors.base import Outcome
from raftsched.runtime.dispatcher import may_hold
from raftsched.runtime.reporter import Reporter
from raftsched.runtime.supervise import Supervisor

AT_MS = 1_800_000_000_000


def finish(run_id: str, ok: bool = True) -> dict:
    return {"run_id": run_id, "event": "finish", "holder": "n1", "attempt": 1, "at_ms": AT_MS,
            "ok": ok, "retryable": True, "retry_delay_ms": None if ok else 1000,
            "http_status": 200 if ok else 500, "exit_code": None, "error": None,
            "output_node": None}


class Calls:
    """The dispatcher's queue as the reporter sees it: runs waiting for a slot."""

    def __init__(self, waiting: int) -> None:
        self.waiting = waiting

    def __call__(self) -> int:
        return self.waiting


async def until(check, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.fixture
async def reporter_of():
    tasks = []

    def make(calls: Calls) -> tuple[Reporter, list[list[str]]]:
        proposed: list[list[str]] = []

        async def propose(command: commands.RunUpdates) -> dict:
            proposed.append([u.run_id for u in command.updates])
            return {"ok": True, "accepted": [True] * len(command.updates)}

        reporter = Reporter(propose=propose, spawn=Supervisor("test").spawn,
                            calls_waiting=calls)
        tasks.append(asyncio.ensure_future(reporter.run()))
        return reporter, proposed

    yield make
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def sent(proposed: list[list[str]]) -> list[str]:
    return [run_id for batch in proposed for run_id in batch]


async def test_a_held_finish_waits_while_calls_wait_and_goes_when_none_does(reporter_of):
    calls = Calls(waiting=5)
    reporter, proposed = reporter_of(calls)
    held = [reporter.send(finish(f"run_h{i}"), "acme", hold=True) for i in range(3)]
    assert reporter.held() == 3 and reporter.pending() == 3
    # A report that may not be held goes while the others wait: once it is
    # applied, the held ones are still not proposed.
    assert await asyncio.wait_for(reporter.send(finish("run_now", ok=False), "acme"), 5)
    assert sent(proposed) == ["run_now"]
    assert not any(f.done() for f in held)
    calls.waiting = 0
    assert all(await asyncio.wait_for(asyncio.gather(*held), 5))
    assert sent(proposed) == ["run_now", "run_h0", "run_h1", "run_h2"]   # in order, none lost
    assert len(proposed) == 2   # the held ones went together
    assert reporter.held() == 0 and reporter.pending() == 0
    assert reporter.held_total == 3


async def test_a_finish_is_held_only_while_calls_wait(reporter_of):
    reporter, proposed = reporter_of(Calls(waiting=0))
    assert await asyncio.wait_for(reporter.send(finish("run_a"), "acme", hold=True), 5)
    assert sent(proposed) == ["run_a"]
    assert reporter.held_total == 0


async def test_a_held_finish_goes_after_finish_hold_max_s_though_calls_still_wait(
        reporter_of, monkeypatch):
    monkeypatch.setattr(limits, "finish_hold_max_s", 0.2)
    reporter, proposed = reporter_of(Calls(waiting=1))
    loop = asyncio.get_running_loop()
    started = loop.time()
    future = reporter.send(finish("run_old"), "acme", hold=True)
    assert await asyncio.wait_for(future, 5)
    assert loop.time() - started >= 0.2
    assert sent(proposed) == ["run_old"]


async def test_held_finishes_go_at_once_when_a_shard_moves(reporter_of):
    """A shard moved to another node (apply's ShardsAssigned): the calls this
    node made must have their finishes land within the new owner's grace."""
    reporter, proposed = reporter_of(Calls(waiting=1))
    held = [reporter.send(finish(f"run_{i}"), "acme", hold=True) for i in range(2)]
    assert reporter.held() == 2
    reporter.release_held()
    assert all(await asyncio.wait_for(asyncio.gather(*held), 5))
    assert sent(proposed) == ["run_0", "run_1"]


async def test_past_finishes_held_max_the_oldest_held_go_a_batch_at_once(reporter_of,
                                                                          monkeypatch):
    """A run called and not reported is called again if its shard moves
    before the report lands: only so many are held. Past the bound, the
    oldest go a batch's worth at once (so they fill an entry), not one per
    new finish."""
    monkeypatch.setattr(limits, "finishes_held_max", 4)
    monkeypatch.setattr(limits, "run_update_batch_max", 3)
    reporter, proposed = reporter_of(Calls(waiting=10))
    futures = [reporter.send(finish(f"run_{i}"), "acme", hold=True) for i in range(1, 5)]
    assert reporter.held() == 4 and not proposed
    reporter.send(finish("run_5"), "acme", hold=True)
    assert reporter.held() == 2
    assert all(await asyncio.wait_for(asyncio.gather(*futures[:3]), 5))
    assert sent(proposed) == ["run_1", "run_2", "run_3"]
    assert not futures[3].done()


async def test_held_finishes_count_towards_run_update_pending_max(reporter_of, monkeypatch):
    monkeypatch.setattr(limits, "run_update_pending_max", 2)
    reporter, _ = reporter_of(Calls(waiting=1))
    first = reporter.send(finish("run_1"), "acme", hold=True)
    second = reporter.send(finish("run_2"), "acme", hold=True)
    third = reporter.send(finish("run_3"), "acme", hold=True)
    assert third.done() and third.result() is False   # refused, said in the log
    assert reporter.dropped_total == 1
    assert not first.done() and not second.done()


JOB = {"id": "job_a", "spec": {"concurrency": {"policy": "allow"}}}
RUN = {"id": "run_a", "trigger": "schedule"}
OK = Outcome(ok=True, http_status=200)


@pytest.mark.parametrize("job, run, outcome, expected", [
    (JOB, RUN, OK, True),
    ({"id": "job_a", "spec": {}}, RUN, OK, True),   # allow is the default
    (JOB, RUN, Outcome(ok=False, http_status=500), False),   # a retry to schedule
    (JOB, dict(RUN, trigger="manual"), OK, False),   # a caller may wait on it
    (JOB, dict(RUN, trigger="backfill"), OK, False),   # the backfill releases the next
    (JOB, dict(RUN, dag_run="run_d"), OK, False),   # releases the tasks after it
    ({"id": "job_a", "spec": {"concurrency": {"policy": "skip_if_running"}}}, RUN, OK, False),
    ({"id": "job_a", "spec": {"concurrency": {"policy": "queue"}}}, RUN, OK, False),
    (None, RUN, OK, False),
])
def test_only_a_finish_nothing_waits_on_may_be_held(job, run, outcome, expected):
    assert may_hold(job, run, outcome) is expected
