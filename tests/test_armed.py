"""Armed runs are held until their second by the cluster's time, never early, in due order, within their bound."""

from __future__ import annotations

import asyncio

import pytest

from raftsched import limits
from raftsched.core import commands
from raftsched.errors import Unavailable
from raftsched.runtime.armed import ArmedRuns


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.synced = True


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def run(run_id: str, scheduled_ms: int, jitter_ms: int = 0) -> dict:
    return {"id": run_id, "job_id": "job_" + run_id, "scheduled_ms": scheduled_ms,
            "jitter_ms": jitter_ms, "tenant": "default"}


def heap(clock: Clock, capacity: int = 100, owner: str | None = "n1", token: int = 7,
         answer=None, stored: dict | None = None) -> tuple[ArmedRuns, list[dict], list]:
    """`answer(command)`: what a proposal answers (default: every run moved);
    `stored`: the runs as the replica has them (default: each queued on n1)."""
    called: list[dict] = []
    proposed: list = []

    async def propose(command) -> dict:
        proposed.append(command)
        if answer is not None:
            return answer(command)
        return {"ok": True, "moved": len(command.items)}

    def run_of(run_id: str) -> dict | None:
        if stored is not None:
            return stored.get(run_id)
        return {"id": run_id, "state": "queued", "node": "n1"}
    armed = ArmedRuns(node_id="n1", now_ms=lambda: clock.now_ms, synced=lambda: clock.synced,
                      call=called.append,
                      owner_of=lambda r: None if owner is None else (owner, token), run_of=run_of,
                      propose=propose,
                      spawn=lambda name, coro: asyncio.ensure_future(coro), capacity=capacity,
                      tick_ms=20)
    return armed, called, proposed


def test_a_run_is_held_until_its_second_and_never_taken_before_it():
    clock = Clock(10_000)
    armed, _, _ = heap(clock)
    assert armed.hold(run("a", 12_000)) is True
    assert armed.hold(run("b", 11_000, jitter_ms=1_500)) is True   # due at 12,500
    for now in (10_000, 11_000, 11_999):
        clock.now_ms = now
        assert armed.take_due() == []
    clock.now_ms = 12_000
    assert [r["id"] for r in armed.take_due()] == ["a"]
    clock.now_ms = 12_499
    assert armed.take_due() == []
    clock.now_ms = 12_500
    assert [r["id"] for r in armed.take_due()] == ["b"]
    assert len(armed) == 0


def test_runs_come_out_in_due_order():
    clock = Clock(0)
    armed, _, _ = heap(clock)
    for run_id, due in (("c", 3_000), ("a", 1_000), ("d", 3_500), ("b", 2_000)):
        armed.hold(run(run_id, due))
    clock.now_ms = 3_000
    assert [r["id"] for r in armed.take_due()] == ["a", "b", "c"]
    assert armed.next_due_ms() == 3_500


def test_a_due_run_is_not_held_and_nothing_is_taken_while_the_clock_is_not_synced():
    clock = Clock(5_000)
    armed, _, _ = heap(clock)
    assert armed.hold(run("due", 5_000)) is False   # the caller calls it now
    clock.synced = False
    assert armed.hold(run("unsure", 4_000)) is True   # no cluster time: held
    assert armed.take_due() == []
    clock.synced = True
    assert [r["id"] for r in armed.take_due()] == ["unsure"]


def test_the_heap_is_bounded_and_a_run_is_held_once():
    clock = Clock(0)
    armed, _, _ = heap(clock, capacity=2)
    assert armed.hold(run("a", 1_000)) and armed.hold(run("a", 1_000))
    assert armed.hold(run("b", 2_000))
    assert armed.room() == 0
    assert armed.hold(run("c", 3_000)) is True   # refused, left to a rescan
    assert armed.refused_total == 1 and len(armed) == 2
    clock.now_ms = 5_000
    assert [r["id"] for r in armed.take_due()] == ["a", "b"]


def test_a_withdrawn_run_is_dropped():
    clock = Clock(0)
    armed, _, _ = heap(clock)
    armed.hold(run("a", 1_000))
    armed.hold(run("b", 1_000))
    assert armed.withdraw("a") and not armed.withdraw("a")
    clock.now_ms = 1_000
    assert [r["id"] for r in armed.take_due()] == ["b"]


async def test_the_loop_calls_each_run_at_its_second():
    clock = Clock(0)
    armed, called, _ = heap(clock)
    task = asyncio.ensure_future(armed.run())
    try:
        armed.hold(run("a", 1_000))
        await asyncio.sleep(0.05)
        assert called == []
        clock.now_ms = 1_000
        await until(lambda: called)
        assert [r["id"] for r in called] == ["a"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_run_whose_shard_moved_is_handed_to_the_owner_not_called():
    clock = Clock(0)
    armed, called, proposed = heap(clock, owner="n2")
    armed.hold(run("a", 1_000))
    clock.now_ms = 1_000
    armed._dispatch(armed.take_due())
    await until(lambda: armed.handed_over_total == 1)
    assert called == []
    [command] = proposed
    assert isinstance(command, commands.ReassignRuns)
    assert [(i.run_id, i.from_node, i.to_node) for i in command.items] == [("a", "n1", "n2")]
    assert armed.handed_over_total == 1


@pytest.mark.parametrize("owner", [None, "n1"])
def test_a_run_of_this_node_or_of_a_gone_job_is_called(owner):
    clock = Clock(0)
    armed, called, proposed = heap(clock, owner=owner)
    armed.hold(run("a", 1_000))
    clock.now_ms = 1_000
    armed._dispatch(armed.take_due())
    assert [r["id"] for r in called] == ["a"] and proposed == []


async def test_a_hand_over_not_committed_is_tried_again_until_the_run_is_moved():
    clock = Clock(0)
    stored = {"a": {"id": "a", "state": "queued", "node": "n1"}}
    answers = []

    def answer(command):
        answers.append(command)
        if len(answers) == 1:
            raise Unavailable("not committed: the leader changed; retry", reason="leader_changed")
        stored["a"] = dict(stored["a"], node="n2")
        return {"ok": True, "moved": 1}
    armed, called, proposed = heap(clock, owner="n2", answer=answer, stored=stored)
    armed.hold(run("a", 1_000))
    clock.now_ms = 1_000
    armed._dispatch(armed.take_due())
    await until(lambda: len(armed) == 1)   # held again, for a retry
    assert armed.take_due() == []
    clock.now_ms = 1_000 + limits.armed_hand_over_retry_ms
    armed._dispatch(armed.take_due())
    await until(lambda: armed.handed_over_total == 1)
    assert len(proposed) == 2 and called == [] and len(armed) == 0


def test_a_run_moved_off_this_node_meanwhile_is_neither_called_nor_handed_over():
    clock = Clock(0)
    armed, called, proposed = heap(clock, owner="n2",
                                   stored={"a": {"id": "a", "state": "queued", "node": "n2"}})
    armed.hold(run("a", 1_000))
    clock.now_ms = 1_000
    armed._dispatch(armed.take_due())
    assert called == [] and proposed == [] and len(armed) == 0


def test_a_run_is_called_under_the_shards_token_at_its_second():
    clock = Clock(0)
    armed, called, _ = heap(clock, owner="n1", token=9)
    armed.hold(dict(run("a", 1_000), token=3))   # fired under token 3; the shard moved and back
    clock.now_ms = 1_000
    armed._dispatch(armed.take_due())
    assert [(r["id"], r["token"]) for r in called] == [("a", 9)]


async def test_a_due_run_fired_ahead_is_dispatched_under_the_current_token_or_handed_over():
    clock = Clock(5_000)
    armed, called, _ = heap(clock, owner="n1", token=9)
    assert armed.hold(dict(run("plain", 4_000), token=3)) is False   # not fired ahead: as before
    assert armed.hold(dict(run("moved", 4_000), token=3, armed_ms=1_000)) is True
    assert [(r["id"], r["token"]) for r in called] == [("moved", 9)]
    elsewhere, called_there, proposed = heap(clock, owner="n2")
    assert elsewhere.hold(dict(run("other", 4_000), armed_ms=1_000)) is True
    await until(lambda: elsewhere.handed_over_total == 1)
    assert called_there == [] and len(proposed) == 1   # handed to n2, not called here


def test_a_run_held_again_at_a_later_due_is_not_taken_at_the_earlier_one():
    clock = Clock(0)
    armed, _, _ = heap(clock)
    armed.hold(run("a", 1_000))
    armed.withdraw("a")
    armed.hold(run("a", 2_000))   # withdrawn, then held again (its jitter changed, say)
    clock.now_ms = 1_500
    assert armed.take_due() == []
    clock.now_ms = 2_000
    assert [r["id"] for r in armed.take_due()] == ["a"]


def test_the_heap_sheds_its_stale_entries():
    clock = Clock(0)
    armed, _, _ = heap(clock, capacity=10_000)
    for i in range(1_000):
        armed.hold(run(f"r{i}", 10_000 + i))
        armed.withdraw(f"r{i}")
    assert len(armed) == 0 and len(armed._heap) <= 64 + 1
