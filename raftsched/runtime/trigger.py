"""The trigger loop: on the Raft leader, fire every due entry on time.

Every shard is fired by the leader in this release (the next one spreads shards
over nodes with fencing tokens). The loop sleeps until the earliest due instant
(or `trigger_tick_ms_max`, or a wake-up from apply when a new entry is armed
earlier), then proposes one `fire` command per shard with due entries: one Raft
entry fires up to `fire_batch_max` runs. The next occurrence of each recurring
job is computed here, by the proposer, after max(due, now): occurrences missed
while nothing could fire collapse into one late run (the fire_once rule).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from raftsched import limits
from raftsched.core import commands
from raftsched.core.apply import DUE, JOBS
from raftsched.core.keys import job_key, parse_due_key, shard_prefix
from raftsched.core.schedule import next_fire_ms
from raftsched.errors import Unavailable
from raftsched.storage.base import due_until

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

log = logging.getLogger("raftsched.trigger")


class TriggerLoop:
    def __init__(self, node: "Node") -> None:
        self._node = node
        self._wake = asyncio.Event()
        self._planned_wake_ms = 0
        self._inflight: set[int] = set()
        self._tasks: set[asyncio.Task] = set()
        self.fired_total = 0
        self.stale_total = 0

    def wake(self, due_ms: int) -> None:
        """Called on the loop thread when apply armed a due entry at `due_ms`."""
        if due_ms < self._planned_wake_ms:
            self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                next_ms = self.maybe_fire_due() if self._node.replicator.is_leader() else None
            except Exception:
                log.exception("trigger loop pass failed; retrying")
                next_ms = None
            now = self._node.now_ms()
            wake_ms = now + limits.trigger_tick_ms_max
            if next_ms is not None:
                wake_ms = min(wake_ms, next_ms)
            self._planned_wake_ms = wake_ms
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, (wake_ms - now) / 1000))
            except asyncio.TimeoutError:
                pass

    def maybe_fire_due(self) -> int | None:
        """Propose fires for every shard with entries due now; return the
        earliest future due instant seen (or None).

        Walks only non-empty shards: the first `due` key at or after a shard's
        prefix names the next shard that has entries, and its earliest one.
        """
        node = self._node
        now = node.now_ms()
        earliest: int | None = None
        shard = 0
        while shard < node.shard_count:
            first = node.store.scan(DUE, start=shard_prefix(shard), limit=1)
            if not first:
                break
            shard, due_ms, _, _ = parse_due_key(first[0][0])
            if shard not in self._inflight:
                if due_ms <= now:
                    self._propose(shard, now, due_until(node.store, shard, now,
                                                        limits.fire_batch_max))
                elif earliest is None or due_ms < earliest:
                    earliest = due_ms
            shard += 1
        return earliest

    def _propose(self, shard: int, now: int, due: list[tuple[int, str]]) -> None:
        items: list[tuple[str, int, int | None]] = []
        for due_ms, job_id in due:
            job = self._node.store.get(JOBS, job_key(job_id))
            if job is None or job["next_ms"] != due_ms:
                continue  # apply would refuse it as stale anyway
            schedule = job["spec"]["schedule"]
            nxt = None if schedule["kind"] == "once" else next_fire_ms(schedule, max(due_ms, now))
            items.append((job_id, due_ms, nxt))
        if not items:
            return
        cmd = commands.fire(shard=shard, upto_ms=now, node=self._node.node_id, at_ms=now,
                            items=items)
        self._inflight.add(shard)
        task = asyncio.ensure_future(self._send(shard, cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, shard: int, cmd: dict) -> None:
        try:
            result = await self._node.replicator.propose_wait(commands.encode(cmd))
            self.fired_total += result["fired"]
            self.stale_total += result["stale"]
        except Unavailable as exc:
            log.warning("fire of shard %d (%d items) not committed: %s", shard,
                        len(cmd["items"]), exc.detail)
        finally:
            self._inflight.discard(shard)
            self._wake.set()
