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
- A run whose shard this node no longer owns when its second comes (the shard
  moved while it waited: this node was skewed, frozen or cut off) is not
  called here: it is handed to the shard's current owner (`reassign_runs`),
  which calls it at once; a hand-over that is not committed is tried again
  until the run is moved or is no longer queued here. (A node that wakes from a freeze still believing
  it owns the shard may take the run to its dispatcher, whose `start` apply
  refuses: the reaper moved the run to the new owner meanwhile.) A node that died loses its heap; the leader's reaper
  moves its queued runs to the shards' new owners, and the dispatcher's rescan
  of a restarted node's open runs holds them again; both arrive through
  Dispatcher.submit, so neither calls a run before its second.
- At most `limits.armed_runs_max` runs are held; the trigger arms nothing
  more while it is full (`room`), so a run that arrives anyway (a rescan, a
  reassignment) is refused and left to the dispatcher's next rescan.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Any, Awaitable, Callable, Coroutine

from raftsched import limits
from raftsched.core import commands
from raftsched.core.apply import JOBS, RUNS, SHARDS
from raftsched.core.keys import job_key, shard_key
from raftsched.errors import Unavailable

log = logging.getLogger("raftsched.armed")


def due_ms_of(run: dict) -> int:
    """When a run is to be called: its occurrence, later by its jitter."""
    return run["scheduled_ms"] + run.get("jitter_ms", 0)


class ArmedRuns:
    def __init__(self, *, node_id: str, now_ms: Callable[[], int], synced: Callable[[], bool],
                 call: Callable[[dict], None],
                 owner_of: Callable[[dict], tuple[str, int] | None],
                 run_of: Callable[[str], dict | None],
                 propose: Callable[[Any], Awaitable[dict]],
                 spawn: Callable[[str, Coroutine], object],
                 capacity: int = limits.armed_runs_max,
                 tick_ms: int = limits.trigger_tick_ms_max) -> None:
        """`call(run)` hands a due run to the dispatcher; `owner_of(run)`: the
        node that owns the run's shard now and its fencing token (None: the
        job or the shard's record is gone);
        `run_of(run_id)`: the run as this node's replica has it now;
        `propose` proposes a command (Node.propose); `spawn` runs a one-shot
        task under the node's supervisor."""
        self._node_id = node_id
        self._now_ms = now_ms
        self._synced = synced
        self._call = call
        self._owner_of = owner_of
        self._run_of = run_of
        self._propose = propose
        self._spawn = spawn
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
        self.handed_over_total = 0
        self.refused_total = 0

    def __len__(self) -> int:
        return len(self._runs)

    def room(self) -> int:
        return self._capacity - len(self._runs)

    def hold(self, run: dict) -> bool:
        """Hold `run` if it is not due yet by the cluster's time (or that time
        is not known yet); say whether the caller must leave it alone. False
        means: call it now. A run fired ahead that is due already (moved here
        by the reaper or a hand-over, or resumed after a restart) is
        dispatched as a held one is at its second: under the shard's current
        token, or handed to the shard's owner. A run held already is not
        held twice."""
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
        moved: list[tuple[dict, str]] = []
        for run in due:
            owned = self._owner_of(run)
            if owned is None:
                self.called_total += 1
                self._call(run)   # the job is gone: the dispatcher ends the run
            elif owned[0] == self._node_id:
                # Called under the shard's token now, not the one it was
                # fired under: the shard may have moved away and back since.
                self.called_total += 1
                self._call(dict(run, token=owned[1]))
            elif self._still_mine(run["id"]):
                moved.append((run, owned[0]))
        for start in range(0, len(moved), limits.reaper_batch_max):
            self._spawn("armed.hand_over",
                        self._hand_over(moved[start:start + limits.reaper_batch_max]))

    def _still_mine(self, run_id: str) -> bool:
        """Is the run still queued on this node? The leader's reaper may have
        moved it (this node looked dead), or a hand-over whose answer was
        lost did."""
        run = self._run_of(run_id)
        return run is not None and run["state"] == "queued" and run.get("node") == self._node_id

    async def _hand_over(self, moved: list[tuple[dict, str]]) -> None:
        """Give armed runs whose shard moved to the shard's owner, which
        calls them at once. Runs a hand-over did not move are held again and
        tried again after armed_hand_over_retry_ms, until they are moved or
        no longer this node's."""
        log.info("%d armed runs came due in shards this node no longer owns; handing them "
                 "to the shards' owners", len(moved))
        items = [(run["id"], self._node_id, owner) for run, owner in moved]
        try:
            result = await self._propose(commands.reassign_runs(items=items,
                                                                at_ms=self._now_ms()))
        except Unavailable as exc:
            log.warning("hand-over of %d armed runs not committed: %s", len(items), exc.detail)
            result = {"ok": True, "moved": 0}
        if not result.get("ok"):
            log.error("hand-over of %d armed runs refused (%s): %s", len(items),
                      result.get("error"), result.get("detail"))
        self.handed_over_total += result.get("moved", 0)
        retry_ms = self._now_ms() + limits.armed_hand_over_retry_ms
        for run, _ in moved:
            if self._still_mine(run["id"]) and run["id"] not in self._runs:
                self._push(retry_ms, run)


def shard_owner_reader(store: Any) -> Callable[[dict], tuple[str, int] | None]:
    """`owner_of` for ArmedRuns: the owner of a run's shard in this node's
    replicated state and its fencing token (None when the job or the
    shard's record is gone)."""
    def owner_of(run: dict) -> tuple[str, int] | None:
        job = store.get(JOBS, job_key(run["job_id"]))
        state = None if job is None else store.get(SHARDS, shard_key(job["shard"]))
        return None if state is None else (state["owner"], state["token"])
    return owner_of


def run_reader(store: Any) -> Callable[[str], dict | None]:
    """`run_of` for ArmedRuns: a run as this node's replica has it."""
    return lambda run_id: store.get(RUNS, run_id.encode())
