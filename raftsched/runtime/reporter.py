"""Batch run reports (start, heartbeat, finish) into `run_updates` commands.

Every `run_update_period_ms`, Raft entries of up to `run_update_batch_max`
reports and `apply_entry_cost_max` cost units are proposed (the finish of a
DAG task run costs a unit per task it may release: core/cost.py), up to
`run_update_inflight_reports_max` of a tenant's
reports at once (`run_update_inflight_reports_solo_max` while it is the only
tenant reporting), from this
node's dispatcher and from the workers that talk to this node; while several
tenants' reports wait, a batch holds a fair share of each (runtime/fair.py). Each report gets a future that resolves to whether apply accepted it
(a start or heartbeat is refused when the run was cancelled, reassigned, or
its lease expired and it moved on). While there is no quorum, reports wait
and are sent again; a start whose caller has given up (its future cancelled)
is dropped before it is sent.

Calls come first: while runs wait on this node for their call (a dispatcher
slot, or their target host's turn), the dispatcher marks the finishes nothing
waits on as ones that may be held (`send(..., hold=True)`); they are kept
back and go when no run waits any more, once the oldest has waited
`finish_hold_max_s`, or when a shard moves, in the largest batches; at most
`finishes_held_max` wait (past it the oldest `run_update_batch_max` go).
During a spike every replica's CPU then goes to calls, and the finishes are
applied after them: later and larger, never lost while the node lives.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Callable

from raftsched import limits
from raftsched.core import commands
from raftsched.errors import CommandRefused, Unavailable
from raftsched.runtime.context import Propose, Spawn

log = logging.getLogger("raftsched.report")


class Reporter:
    def __init__(self, *, propose: Propose, spawn: Spawn,
                 weight_of: Callable[[str], int] = lambda tenant: 1,
                 calls_waiting: Callable[[], int] = lambda: 0) -> None:
        """`weight_of`: a tenant's share of the batches while several wait
        (its quota's weight); `calls_waiting`: how many runs wait on this node
        for their call (Dispatcher.calls_waiting); while any do, finishes that
        may be held are."""
        self._propose = propose
        self._spawn = spawn
        self._weight_of = weight_of
        self._calls_waiting = calls_waiting
        # Finishes held back while calls wait: (time.monotonic() when held,
        # tenant, report, future), oldest first. Counted in run_update_pending_max.
        self._held: collections.deque[tuple[float, str, commands.RunUpdate,
                                            asyncio.Future]] = collections.deque()
        self._held_check: asyncio.TimerHandle | None = None
        self.held_total = 0
        # Reports waiting, by tenant ("" where the caller did not say): a batch
        # takes them by deficit round robin when several tenants wait, so one
        # tenant's thousands of starts do not fill the entries ahead of
        # another's few (runtime/fair.py).
        self._pending: dict[str, collections.deque[tuple[commands.RunUpdate, asyncio.Future]]] = {}
        self._count = 0
        self._flush = asyncio.Event()
        self._inflight: set[asyncio.Task] = set()
        self._inflight_reports: collections.Counter[str] = collections.Counter()   # by tenant
        # What a waiting report costs apply, where more than one unit (core/cost.py).
        self._costs: dict[asyncio.Future, int] = {}
        self.dropped_total = 0

    def send(self, update: commands.RunUpdate | dict, tenant: str = "",
             cost: int = 1, hold: bool = False) -> asyncio.Future:
        """Queue one report; the future resolves to True (applied) or False
        (refused). `cost`: what apply may do for it, in cost units
        (core/cost.run_update_cost). `hold`: nothing waits on this finish, so
        it may wait while calls do (see the module's docstring)."""
        future = asyncio.get_running_loop().create_future()
        try:
            # A malformed report would make apply refuse the whole batch it
            # shares with other runs' reports: keep it out.
            update = commands.run_update(update)
        except CommandRefused as exc:
            log.error("run report not sent: %s", exc.detail)
            future.set_result(False)
            return future
        if self.pending() >= limits.run_update_pending_max:
            # A dropped finish leaves the lease to expire: the run is retried,
            # not lost. Said loudly because it means the log is far behind.
            self.dropped_total += 1
            log.error("run_update_pending_max (%d) reached; dropping the %s of run %s",
                      limits.run_update_pending_max, commands.tag_of(update), update.run_id)
            future.set_result(False)
            return future
        if cost > 1:
            self._costs[future] = cost
            future.add_done_callback(self._forget_cost)
        if hold and self._calls_waiting() > 0:
            if len(self._held) >= limits.finishes_held_max:
                # The oldest go: a run called and not reported is one the
                # shard's next owner would call again, so only so many wait.
                # A batch's worth at once, so that they fill whole entries
                # rather than trickle out one per new finish.
                for _ in range(min(len(self._held), limits.run_update_batch_max)):
                    self._queue(*self._held.popleft()[1:])
            self._held.append((time.monotonic(), tenant, update, future))
            self.held_total += 1
            self._check_held_later()
            return future
        self._queue(tenant, update, future)
        return future

    def _queue(self, tenant: str, update: commands.RunUpdate, future: asyncio.Future) -> None:
        """To be proposed at the loop's next turn."""
        self._pending.setdefault(tenant, collections.deque()).append((update, future))
        self._count += 1
        self._flush.set()

    def _check_held_later(self) -> None:
        if self._held_check is None:
            self._held_check = asyncio.get_running_loop().call_later(
                limits.finish_hold_check_s, self._held_checked)

    def _held_checked(self) -> None:
        self._held_check = None
        self._release_held()

    def release_held(self) -> None:
        """Send every held finish now. A shard moved to another node: the
        finishes of calls this node made must land within the new owner's
        take_over_grace_s, or those runs would be called again."""
        self._release_held(everything=True)

    def _release_held(self, everything: bool = False) -> None:
        """Send the held finishes: all once no call waits on this node, else
        those held finish_hold_max_s; look again later while any stay."""
        if not self._held:
            return
        everything = everything or self._calls_waiting() <= 0
        oldest_kept = time.monotonic() - limits.finish_hold_max_s
        while self._held and (everything or self._held[0][0] <= oldest_kept):
            self._queue(*self._held.popleft()[1:])
        if self._held:
            self._check_held_later()

    async def run(self) -> None:
        """Batches are proposed while their tenants have fewer than
        run_update_inflight_reports_max reports in flight; pysyncobj keeps
        their order. The bound keeps a report that arrives behind another
        tenant's backlog from waiting for thousands of others in the log. A
        start and the finish of the same attempt never share the pipeline: the
        finish is sent once the start was answered. The loop wakes on a new
        report and on an answered batch."""
        if self._count:
            self._flush.set()   # restarted after a failure: reports may be waiting
        if self._held:
            self._check_held_later()
        while True:
            await self._flush.wait()
            self._flush.clear()
            await asyncio.sleep(limits.run_update_period_ms / 1000)
            while self._count:
                batch = self._take_batch()
                if not batch:
                    break
                self._inflight_reports.update(tenant for tenant, _, _ in batch)
                task = self._spawn("reporter.send", self._send_batch(batch))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    async def _send_batch(self, batch: list[tuple[str, dict, asyncio.Future]]) -> None:
        try:
            await self._propose_batch(batch)
        finally:
            self._inflight_reports.subtract(tenant for tenant, _, _ in batch)
            self._inflight_reports = +self._inflight_reports   # drops the zeros
            self._flush.set()   # room again for these tenants

    async def _propose_batch(self, batch: list[tuple[str, dict, asyncio.Future]]) -> None:
        try:
            result = await self._propose(
                commands.run_updates(updates=[update for _, update, _ in batch]))
        except Unavailable as exc:
            log.warning("%d run reports not committed (%s); retrying", len(batch), exc.detail)
            self._requeue(batch)
            # Holding the pipeline place a while: no quorum now, no use hurrying.
            await asyncio.sleep(limits.run_update_retry_s)
            return
        except BaseException:
            # The supervisor logs it; nobody may wait for these reports forever
            # meanwhile: a start refused is not run, a finish lost is retried
            # after its lease expires.
            self._refuse(batch)
            raise
        accepted = result.get("accepted")
        if not isinstance(accepted, list):
            # The batch was refused whole (the node logged why): no report
            # in it was applied.
            log.error("%d run reports refused (%s): %s", len(batch), result.get("error"),
                      result.get("detail"))
            accepted = [False] * len(batch)
        for (_, _, future), ok in zip(batch, accepted):
            if not future.done():
                future.set_result(ok)

    def _requeue(self, batch: list[tuple[str, dict, asyncio.Future]]) -> None:
        for tenant, update, future in reversed(batch):
            self._pending.setdefault(tenant, collections.deque()).appendleft((update, future))
            self._count += 1
        self._flush.set()

    @staticmethod
    def _refuse(batch: list[tuple[str, dict, asyncio.Future]]) -> None:
        for _, _, future in batch:
            if not future.done():
                future.set_result(False)

    def _forget_cost(self, future: asyncio.Future) -> None:
        self._costs.pop(future, None)

    def _take_batch(self) -> list[tuple[str, dict, asyncio.Future]]:
        """Up to run_update_batch_max reports of one tenant; when several wait,
        up to run_update_fair_batch_max, a quantum (by weight) of each in turn.
        Either way at most apply_entry_cost_max cost units (the first report
        goes whatever it costs). A tenant with run_update_inflight_reports_max
        reports in flight waits
        (run_update_inflight_reports_solo_max while no other tenant has
        reports waiting or in flight here)."""
        waiting = {t for t, q in self._pending.items() if q}
        bound = (limits.run_update_inflight_reports_max
                 if len(waiting | set(self._inflight_reports)) > 1
                 else limits.run_update_inflight_reports_solo_max)
        room = {t: bound - self._inflight_reports[t] for t in waiting}
        tenants = [t for t, r in room.items() if r > 0]
        several = len(tenants) > 1
        size = limits.run_update_fair_batch_max if several else limits.run_update_batch_max
        batch: list[tuple[str, commands.RunUpdate, asyncio.Future]] = []
        total = 0
        while tenants and len(batch) < size:
            for tenant in list(tenants):
                queue = self._pending[tenant]
                share = limits.fair_quantum * max(1, self._weight(tenant)) if several else size
                share = min(share, room[tenant])
                room[tenant] -= share
                while queue and share > 0 and len(batch) < size:
                    cost = self._costs.get(queue[0][1], 1)
                    if batch and total + cost > limits.apply_entry_cost_max:
                        return batch
                    update, future = queue.popleft()
                    self._count -= 1
                    if future.cancelled() and not isinstance(update, commands.RunFinish):
                        continue   # nobody waits for this start or heartbeat any more
                    batch.append((tenant, update, future))
                    total += cost
                    share -= 1
                if not queue:
                    tenants.remove(tenant)
                    del self._pending[tenant]
                elif room[tenant] <= 0:
                    tenants.remove(tenant)
        return batch

    def _weight(self, tenant: str) -> int:
        return self._weight_of(tenant) if tenant else 1

    def pending(self) -> int:
        """Reports waiting to be proposed, held finishes included."""
        return self._count + len(self._held)

    def held(self) -> int:
        return len(self._held)

    def idle(self) -> bool:
        """Nothing waits to be proposed, is held, or is in flight."""
        return self.pending() == 0 and not self._inflight
