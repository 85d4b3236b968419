"""Armed runs: runs fired ahead of their second, held until it comes.

The trigger loop fires an armable occurrence up to --arm-ahead-s before it is
due (runtime/trigger.py, core/firing.py `armable`); apply queues its run on
the shard's owner as any other, and the dispatcher hands it here instead of
calling it (Dispatcher.submit). This keeps them in a heap by due instant (the
run's scheduled time plus its jitter) and hands each back to the dispatcher
once the cluster's time (`now_ms`, runtime/clock.py) has reached it: never
before, by the same clock the trigger fires by, and only while that clock is
synced. A run is late only by the dispatcher's own queueing.

- A run withdrawn or cancelled in apply before its second is dropped
  (`withdraw`, from the RunCancelled effect).
- A run is handed to the dispatcher at its second as it is: the dispatcher
  calls it only if this node still holds it (owns its shard under the run's
  fencing token, with its shard lease valid: runtime/dispatcher.py). A run
  whose shard moved while it waited is the new owner's: the new owner takes
  it over (core/runs.py `take_over`: at once while it is not due, since no
  node calls a run early; else after take_over_grace_s) and holds it until
  its second in turn. A node that died loses its heap; the dispatcher's
  rescan of a restarted node's held runs holds them again, through
  Dispatcher.submit, so no run is called before its second.
- At most `limits.armed_runs_max` runs are held; the trigger arms nothing
  more while it is full (`room`), so a run that arrives anyway (a rescan, a
  takeover) is refused and left to the dispatcher's next rescan.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Callable

from raftsched import limits

log = logging.getLogger("raftsched.armed")


def due_ms_of(run: dict) -> int:
    """When a run is to be called: its occurrence, later by its jitter."""
    return run["scheduled_ms"] + run.get("jitter_ms", 0)


class ArmedRuns:
    def __init__(self, *, node_id: str, now_ms: Callable[[], int], synced: Callable[[], bool],
                 call: Callable[[dict], None],
                 capacity: int = limits.armed_runs_max,
                 tick_ms: int = limits.trigger_tick_ms_max) -> None:
        """`call(run)` hands a due run to the dispatcher."""
        self._node_id = node_id
        self._now_ms = now_ms
        self._synced = synced
        self._call = call
        self._capacity = capacity
        self._tick_ms = tick_ms
        # (due_ms, run id), by due time. An entry whose run is no longer held
        # at that due time lingers until it comes up, or until the heap holds
        # more than twice the runs held, when it is rebuilt (_compact).
        self._heap: list[tuple[int, str]] = []
        self._runs: dict[str, tuple[int, dict]] = {}   # run id -> (due_ms, run), the ones held
        self._wake = asyncio.Event()
        self.held_total = 0
        self.called_total = 0
        self.withdrawn_total = 0
        self.refused_total = 0

    def __len__(self) -> int:
        return len(self._runs)

    def room(self) -> int:
        return self._capacity - len(self._runs)

    def hold(self, run: dict) -> bool:
        """Hold `run` if it is not due yet by the cluster's time (or that time
        is not known yet); say whether the caller must leave it alone. False
        means: call it now. A run fired ahead that is due already (taken over
        by this node, or resumed after a restart) is dispatched as a held one
        is at its second. A run held already is not held twice."""
        if run["id"] in self._runs:
            return True
        due_ms = due_ms_of(run)
        if self._synced() and due_ms <= self._now_ms():
            if run.get("armed_ms") is None:
                return False
            self._dispatch([run])
            return True
        if len(self._runs) >= self._capacity:
            self.refused_total += 1
            log.error("%d armed runs held (armed_runs_max); run %s, due at %d, is left to "
                      "the next rescan of this node's open runs", len(self._runs), run["id"],
                      due_ms)
            return True
        self._push(due_ms, run)
        self.held_total += 1
        return True

    def _push(self, due_ms: int, run: dict) -> None:
        self._runs[run["id"]] = (due_ms, run)
        if not self._heap or due_ms < self._heap[0][0]:
            self._wake.set()
        heapq.heappush(self._heap, (due_ms, run["id"]))
        self._compact()

    def _compact(self) -> None:
        """Drop the heap's stale entries once they outnumber the runs held,
        so the heap stays within twice armed_runs_max."""
        if len(self._heap) > 2 * len(self._runs) + 64:
            self._heap = [(due_ms, run_id) for run_id, (due_ms, _) in self._runs.items()]
            heapq.heapify(self._heap)

    def held_in(self, shards: set[int]) -> list[dict]:
        """The held runs of `shards`."""
        return [run for _, run in self._runs.values() if run["shard"] in shards]

    def withdraw(self, run_id: str) -> bool:
        """Drop a held run (cancelled or withdrawn in apply); say if it was held."""
        if self._runs.pop(run_id, None) is None:
            return False
        self.withdrawn_total += 1
        self._compact()
        return True

    def _held_at(self, entry: tuple[int, str]) -> bool:
        held = self._runs.get(entry[1])
        return held is not None and held[0] == entry[0]

    def next_due_ms(self) -> int | None:
        while self._heap and not self._held_at(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def take_due(self) -> list[dict]:
        """The held runs whose second has come by the cluster's time, in due
        order (none while that time is not known)."""
        if not self._synced():
            return []
        now = self._now_ms()
        due = []
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._held_at(entry):
                due.append(self._runs.pop(entry[1])[1])
        return due

    async def run(self) -> None:
        """Runs under the node's supervisor (runtime/supervise.py)."""
        while True:
            due = self.take_due()
            if due:
                self._dispatch(due)
            next_ms = self.next_due_ms()
            self._wake.clear()
            if next_ms is None:
                await self._wake.wait()   # nothing held: an idle node does not tick
                continue
            # At most a tick: the cluster's time may be re-judged meanwhile.
            wait_ms = max(0, min(self._tick_ms, next_ms - self._now_ms()))
            try:
                await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
            except asyncio.TimeoutError:
                pass

    def _dispatch(self, due: list[dict]) -> None:
        for run in due:
            self.called_total += 1
            self._call(run)
