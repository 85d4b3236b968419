"""The trigger loop: every node fires the shards it owns, on time.

The loop keeps, in memory, the next due instant of every shard it owns (from
LMDB when it gains a shard and after each fire; lowered by apply's DueArmed
effects when a job is created or re-armed; resynced every
`due_resync_period_s` as a safety net). It sleeps until the earliest of them,
then proposes one `fire` command per due shard, carrying the shard's fencing
token: one Raft entry fires up to `fire_batch_max` runs.

For each due entry the proposer computes what apply may not: the occurrences
the fire covers (only the due one when on time; the missed ones after an
outage, for the job's misfire policy) and the next occurrence after now.
A retry's due entry (a run in retry_wait) fires the same way: its next
attempt is queued on this node, under this shard's token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from raftsched import limits
from raftsched.core import commands
from raftsched.core.apply import DEFAULT_MISFIRE, DUE, JOBS, SHARDS
from raftsched.core.keys import KIND_RETRY, job_key, parse_due_key, shard_prefix
from raftsched.core.schedule import covered_occurrences
from raftsched.errors import Unavailable
from raftsched.storage.base import due_entries

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

log = logging.getLogger("raftsched.trigger")

# Re-read owned shards and their next due instants from LMDB this often, in
# case an in-memory update was missed.
due_resync_period_s = 5.0


class TriggerLoop:
    def __init__(self, node: "Node") -> None:
        self._node = node
        self._wake = asyncio.Event()
        self._planned_wake_ms = 0
        self._owned: dict[int, int] = {}          # shard -> fencing token
        self._next_due: dict[int, int | None] = {}  # shard -> earliest due_ms
        self._inflight: set[int] = set()
        self._resynced_at = 0.0
        self.fired_total = 0
        self.stale_items_total = 0
        self.refused_fires_total = 0

    # --- inputs from apply (loop thread) ------------------------------------------------

    def wake(self, shard: int, due_ms: int) -> None:
        if shard not in self._owned:
            return
        current = self._next_due.get(shard)
        if current is None or due_ms < current:
            self._next_due[shard] = due_ms
        if due_ms < self._planned_wake_ms:
            self._wake.set()

    def ownership_changed(self) -> None:
        self._resynced_at = 0.0
        self._wake.set()

    def owned(self) -> dict[int, int]:
        return dict(self._owned)

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs under the node's supervisor, which logs a failed pass and starts
        the loop again (runtime/supervise.py)."""
        while True:
            if time.monotonic() - self._resynced_at > due_resync_period_s:
                self.resync()
            next_ms = self.maybe_fire_due()
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

    def resync(self) -> None:
        """Reload owned shards (and their tokens) and next due instants from LMDB."""
        node = self._node
        owned = {int.from_bytes(key, "big"): state["token"]
                 for key, state in node.store.scan(SHARDS) if state["owner"] == node.node_id}
        gained = set(owned) - set(self._owned)
        lost = set(self._owned) - set(owned)
        if gained or lost:
            log.info("now owning %d shards (+%d, -%d)", len(owned), len(gained), len(lost))
        self._owned = owned
        self._next_due = {shard: self._earliest(shard) for shard in owned}
        self._resynced_at = time.monotonic()

    def _earliest(self, shard: int) -> int | None:
        first = self._node.store.scan(DUE, start=shard_prefix(shard),
                                      stop=shard_prefix(shard + 1), limit=1)
        return parse_due_key(first[0][0])[1] if first else None

    def maybe_fire_due(self) -> int | None:
        """Propose a fire for every owned shard that is due; return the earliest
        future due instant (or None)."""
        now = self._node.now_ms()
        earliest: int | None = None
        for shard, due_ms in self._next_due.items():
            if due_ms is None or shard in self._inflight:
                continue
            if due_ms <= now:
                self._propose(shard, now)
            elif earliest is None or due_ms < earliest:
                earliest = due_ms
        return earliest

    def _propose(self, shard: int, now: int) -> None:
        node = self._node
        items, retries = [], []
        for due_ms, kind, ident in due_entries(node.store, shard, now, limits.fire_batch_max):
            if kind == KIND_RETRY:
                retries.append((ident, due_ms))
                continue
            job_id = ident
            job = node.store.get(JOBS, job_key(job_id))
            if job is None or job["next_ms"] != due_ms:
                continue  # apply would refuse it as stale anyway
            policy = job["spec"].get("misfire", DEFAULT_MISFIRE)
            occurrences, omitted, next_ms = covered_occurrences(
                job["spec"]["schedule"], due_ms, now, policy["catchup_max"])
            items.append((job_id, due_ms, next_ms, occurrences, omitted))
        if not items and not retries:
            self._next_due[shard] = self._earliest(shard)
            return
        cmd = commands.fire(shard=shard, token=self._owned[shard], upto_ms=now,
                            node=node.node_id, at_ms=now, items=items, retries=retries)
        self._inflight.add(shard)
        node.supervisor.spawn("trigger.send", self._send(shard, cmd))

    async def _send(self, shard: int, cmd: dict) -> None:
        try:
            result = await self._node.replicator.propose_wait(commands.encode(cmd))
            if result.get("error") == "stale_token":
                self.refused_fires_total += 1
                log.warning("fire refused: %s", result["detail"])
                self._resynced_at = 0.0   # our view of ownership is out of date
            elif not result.get("ok"):
                # Refused whole (the node logged why); its due entries stay and
                # are proposed again at the next pass.
                self.refused_fires_total += 1
                log.error("fire of shard %d refused (%s): %s", shard, result.get("error"),
                          result.get("detail"))
            self.fired_total += result.get("fired", 0)
            self.stale_items_total += result.get("stale", 0)
        except Unavailable as exc:
            log.warning("fire of shard %d (%d items, %d retries) not committed: %s", shard,
                        len(cmd["items"]), len(cmd["retries"]), exc.detail)
        finally:
            self._inflight.discard(shard)
            if shard in self._owned:
                self._next_due[shard] = self._earliest(shard)
            self._wake.set()
