"""Armed runs are held until their second by the cluster's time, never early, in due order, within their bound."""

from __future__ import annotations

import asyncio

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


def heap(clock: Clock, capacity: int = 100) -> tuple[ArmedRuns, list[dict]]:
    called: list[dict] = []
    armed = ArmedRuns(node_id="n1", now_ms=lambda: clock.now_ms, synced=lambda: clock.synced,
                      call=called.append, capacity=capacity, tick_ms=20)
    return armed, called


def test_a_run_is_held_until_its_second_and_never_taken_before_it():
    clock = Clock(10_000)
    armed, _ = heap(clock)
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
    armed, _ = heap(clock)
    for run_id, due in (("c", 3_000), ("a", 1_000), ("d", 3_500), ("b", 2_000)):
        armed.hold(run(run_id, due))
    clock.now_ms = 3_000
    assert [r["id"] for r in armed.take_due()] == ["a", "b", "c"]
    assert armed.next_due_ms() == 3_500


def test_a_due_run_is_not_held_and_nothing_is_taken_while_the_clock_is_not_synced():
    clock = Clock(5_000)
    armed, _ = heap(clock)
    assert armed.hold(run("due", 5_000)) is False   # the caller calls it now
    clock.synced = False
    assert armed.hold(run("unsure", 4_000)) is True   # no cluster time: held
    assert armed.take_due() == []
    clock.synced = True
    assert [r["id"] for r in armed.take_due()] == ["unsure"]


def test_the_heap_is_bounded_and_a_run_is_held_once():
    clock = Clock(0)
    armed, _ = heap(clock, capacity=2)
    assert armed.hold(run("a", 1_000)) and armed.hold(run("a", 1_000))
    assert armed.hold(run("b", 2_000))
    assert armed.room() == 0
    assert armed.hold(run("c", 3_000)) is True   # refused, left to a rescan
    assert armed.refused_total == 1 and len(armed) == 2
    clock.now_ms = 5_000
    assert [r["id"] for r in armed.take_due()] == ["a", "b"]


def test_a_withdrawn_run_is_dropped():
    clock = Clock(0)
    armed, _ = heap(clock)
    armed.hold(run("a", 1_000))
    armed.hold(run("b", 1_000))
    assert armed.withdraw("a") and not armed.withdraw("a")
    clock.now_ms = 1_000
    assert [r["id"] for r in armed.take_due()] == ["b"]


async def test_the_loop_calls_each_run_at_its_second():
    clock = Clock(0)
    armed, called = heap(clock)
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


def test_a_due_run_is_handed_to_the_dispatcher_as_it_is():
    """Whether this node may still call it (its shard, its token, its shard
    lease) is the dispatcher's to judge at the call, not the heap's."""
    clock = Clock(0)
    armed, called = heap(clock)
    armed.hold(dict(run("a", 1_000), token=3))
    clock.now_ms = 1_000
    armed._dispatch(armed.take_due())
    assert [(r["id"], r["token"]) for r in called] == [("a", 3)]


def test_a_due_run_fired_ahead_is_dispatched_at_once_and_any_other_left_to_the_caller():
    clock = Clock(5_000)
    armed, called = heap(clock)
    assert armed.hold(run("plain", 4_000)) is False   # not fired ahead: the caller calls it
    assert armed.hold(dict(run("taken", 4_000), armed_ms=1_000)) is True
    assert [r["id"] for r in called] == ["taken"] and len(armed) == 0


def test_a_run_held_again_at_a_later_due_is_not_taken_at_the_earlier_one():
    clock = Clock(0)
    armed, _ = heap(clock)
    armed.hold(run("a", 1_000))
    armed.withdraw("a")
    armed.hold(run("a", 2_000))   # withdrawn, then held again (its jitter changed, say)
    clock.now_ms = 1_500
    assert armed.take_due() == []
    clock.now_ms = 2_000
    assert [r["id"] for r in armed.take_due()] == ["a"]


def test_the_heap_sheds_its_stale_entries():
    clock = Clock(0)
    armed, _ = heap(clock, capacity=10_000)
    for i in range(1_000):
        armed.hold(run(f"r{i}", 10_000 + i))
        armed.withdraw(f"r{i}")
    assert len(armed) == 0 and len(armed._heap) <= 64 + 1
