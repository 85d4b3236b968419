"""Batch run reports (start, heartbeat, finish) into `run_updates` commands.

One Raft entry per `run_update_period_ms` carries up to `run_update_batch_max`
reports, from this node's dispatcher and from the workers that talk to this
node. Each report gets a future that resolves to whether apply accepted it
(a start or heartbeat is refused when the run was cancelled, reassigned, or
its lease expired and it moved on). While there is no quorum, reports wait
and are sent again; a start whose caller has given up (its future cancelled)
is dropped before it is sent.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING

from raftsched import limits
from raftsched.core import commands
from raftsched.errors import CommandRefused, Unavailable

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

log = logging.getLogger("raftsched.report")


class Reporter:
    def __init__(self, node: "Node") -> None:
        self._node = node
        self._pending: collections.deque[tuple[dict, asyncio.Future]] = collections.deque()
        self._flush = asyncio.Event()
        self.dropped_total = 0

    def send(self, update: dict) -> asyncio.Future:
        """Queue one report; the future resolves to True (applied) or False (refused)."""
        future = asyncio.get_running_loop().create_future()
        try:
            # A malformed report would make apply refuse the whole batch it
            # shares with other runs' reports: keep it out.
            commands.check_run_update(update)
        except CommandRefused as exc:
            log.error("run report not sent: %s", exc.detail)
            future.set_result(False)
            return future
        if len(self._pending) >= limits.run_update_pending_max:
            # A dropped finish leaves the lease to expire: the run is retried,
            # not lost. Said loudly because it means the log is far behind.
            self.dropped_total += 1
            log.error("run_update_pending_max (%d) reached; dropping the %s of run %s",
                      limits.run_update_pending_max, update["event"], update["run_id"])
            future.set_result(False)
            return future
        self._pending.append((update, future))
        self._flush.set()
        return future

    async def run(self) -> None:
        backoff_s = limits.run_update_period_ms / 1000
        while True:
            await self._flush.wait()
            await asyncio.sleep(limits.run_update_period_ms / 1000)
            batch = self._take_batch()
            if not batch:
                continue
            try:
                result = await self._node.propose(
                    commands.run_updates(updates=[update for update, _ in batch]))
            except Unavailable as exc:
                log.warning("%d run reports not committed (%s); retrying", len(batch),
                            exc.detail)
                self._pending.extendleft(reversed(batch))
                self._flush.set()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)
                continue
            except Exception:
                # The supervisor logs it and restarts this loop; nobody may wait
                # for these reports forever meanwhile: a start refused is not
                # run, a finish lost is retried after its lease expires.
                self._refuse(batch)
                raise
            backoff_s = limits.run_update_period_ms / 1000
            accepted = result.get("accepted")
            if not isinstance(accepted, list):
                # The batch was refused whole (the node logged why): no report
                # in it was applied.
                log.error("%d run reports refused (%s): %s", len(batch), result.get("error"),
                          result.get("detail"))
                accepted = [False] * len(batch)
            for (_, future), ok in zip(batch, accepted):
                if not future.done():
                    future.set_result(ok)

    @staticmethod
    def _refuse(batch: list[tuple[dict, asyncio.Future]]) -> None:
        for _, future in batch:
            if not future.done():
                future.set_result(False)

    def _take_batch(self) -> list[tuple[dict, asyncio.Future]]:
        batch = []
        while self._pending and len(batch) < limits.run_update_batch_max:
            update, future = self._pending.popleft()
            if future.cancelled() and update["event"] != "finish":
                continue   # nobody waits for this start or heartbeat any more
            batch.append((update, future))
        if not self._pending:
            self._flush.clear()
        return batch

    def pending(self) -> int:
        return len(self._pending)
