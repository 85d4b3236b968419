"""The trigger loop: every node fires the shards it owns, on time.

The loop keeps, in memory, the next due instant of every shard it owns (from
LMDB when it gains a shard and after each fire; lowered by apply's DueArmed
effects when a job is created or re-armed; resynced every
`due_resync_period_s` as a safety net). It sleeps until the earliest of them,
then proposes one `fire` command per due shard, carrying the shard's fencing
token: one Raft entry fires up to `fire_batch_max` runs. When a pass holds
items of more than one tenant or priority, it proposes them in fair order
(deficit round robin by tenant weight, then priority and due time:
runtime/fair.py), at most `fire_fair_inflight_items_max` in flight.

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
from raftsched.core.apply import DEFAULT_MISFIRE, DUE, JOBS, RUNS, SHARDS
from raftsched.core.keys import KIND_RETRY, PRIORITY_RANK, job_key, parse_due_key, shard_prefix
from raftsched.core.schedule import covered_occurrences
from raftsched.errors import Unavailable
from raftsched.runtime.fair import drr_order
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
        self._inflight: dict[int, int] = {}      # shard -> fires not yet answered
        self._inflight_items = 0                  # items and retries in those fires
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
        """Propose fires for every owned shard that is due; return the earliest
        future due instant (or None)."""
        now = self._node.now_ms()
        earliest: int | None = None
        due: list[int] = []
        for shard, due_ms in self._next_due.items():
            if due_ms is None or shard in self._inflight:
                continue
            if due_ms <= now:
                due.append(shard)
            elif earliest is None or due_ms < earliest:
                earliest = due_ms
        if due:
            self._propose_pass(due, now)
        return earliest

    def _propose_pass(self, shards: list[int], now: int) -> None:
        """One fire per due shard; or, when the pass holds more than one tenant
        or priority, its items in fair order (runtime/fair.py), at most
        fire_fair_inflight_items_max of them in flight: fires of the first
        items are proposed first and the rest wait for the next pass, which
        orders what is due again. A light tenant's items then commit in the
        first entries, and the log never holds a heavy tenant's whole backlog
        ahead of the others' starts and finishes."""
        collected = {shard: self._collect(shard, now) for shard in shards}
        classes = {(tenant, rank) for entries in collected.values()
                   for _, tenant, rank, _ in entries}
        if len(classes) <= 1:
            for shard, entries in collected.items():
                self._propose(shard, now, entries)
            return
        queues: dict[str, list[tuple[int, tuple]]] = {}
        for shard, entries in collected.items():
            for entry in entries:
                queues.setdefault(entry[1], []).append((shard, entry))
        for items in queues.values():
            items.sort(key=lambda item: (item[1][2], item[1][3]))   # priority, then due time
        order = drr_order(queues, lambda tenant: self._node.quota_of(tenant)["weight"])
        budget = max(0, limits.fire_fair_inflight_items_max - self._inflight_items)
        by_shard: dict[int, list[tuple]] = {}   # in the order of each shard's first item
        for shard, entry in order[:budget]:
            by_shard.setdefault(shard, []).append(entry)
        for shard, entries in by_shard.items():
            self._propose(shard, now, entries)
        for shard in shards:
            if not collected[shard]:
                self._propose(shard, now, [])   # nothing due after all: re-read its next
        # The rest waits for a fire to be answered, which wakes the loop.

    def _collect(self, shard: int, now: int) -> list[tuple]:
        """The shard's due items: (item, tenant, priority rank, due_ms), where
        item is ("job", fire item) or ("retry", (run_id, due_ms))."""
        node = self._node
        entries: list[tuple] = []
        for due_ms, kind, ident in due_entries(node.store, shard, now, limits.fire_batch_max):
            if kind == KIND_RETRY:
                run = node.store.get(RUNS, ident.encode())
                tenant = run["tenant"] if run else "default"
                rank = PRIORITY_RANK.get(run.get("priority", "normal"), 1) if run else 1
                entries.append((("retry", (ident, due_ms)), tenant, rank, due_ms))
                continue
            job = node.store.get(JOBS, job_key(ident))
            if job is None or job["next_ms"] != due_ms:
                continue  # apply would refuse it as stale anyway
            policy = job["spec"].get("misfire", DEFAULT_MISFIRE)
            occurrences, omitted, next_ms = covered_occurrences(
                job["spec"]["schedule"], due_ms, now, policy["catchup_max"])
            rank = PRIORITY_RANK.get(job["spec"].get("priority", "normal"), 1)
            entries.append((("job", (ident, due_ms, next_ms, occurrences, omitted)),
                            job["tenant"], rank, due_ms))
        return entries

    def _propose(self, shard: int, now: int, entries: list[tuple]) -> None:
        items = [payload for (kind, payload), *_ in entries if kind == "job"]
        retries = [payload for (kind, payload), *_ in entries if kind == "retry"]
        if not items and not retries:
            if not self._inflight.get(shard):
                self._next_due[shard] = self._earliest(shard)
            return
        cmd = commands.fire(shard=shard, token=self._owned[shard], upto_ms=now,
                            node=self._node.node_id, at_ms=now, items=items, retries=retries)
        self._inflight[shard] = self._inflight.get(shard, 0) + 1
        self._inflight_items += len(items) + len(retries)
        self._node.supervisor.spawn("trigger.send", self._send(shard, cmd))

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
            self._inflight_items = max(0, self._inflight_items - len(cmd["items"])
                                       - len(cmd["retries"]))
            left = self._inflight.pop(shard, 1) - 1
            if left > 0:
                self._inflight[shard] = left
            elif shard in self._owned:
                self._next_due[shard] = self._earliest(shard)
            self._wake.set()
