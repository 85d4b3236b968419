"""The trigger loop: every node fires the shards it owns, on time.

The loop keeps, in memory, the next due instant of every shard it owns (from
LMDB when it gains a shard and after each fire; lowered by apply's DueArmed
effects when a job is created or re-armed; resynced every
`limits.due_resync_period_s` as a safety net). It sleeps until the earliest of them,
then proposes one `fire` command per due shard, carrying the shard's fencing
token: one Raft entry fires up to `fire_batch_max` runs and
`apply_entry_cost_max` cost units (core/cost.py: a DAG job's fire costs a unit
per task that starts at once), so no fire holds apply for long. When a pass holds
items of more than one tenant or priority, it proposes them in fair order
(deficit round robin by tenant weight, then priority and due time:
runtime/fair.py). Either way at most `fire_inflight_items_max` of a tenant's
items are in fires not yet committed while another tenant has items due or
in flight, and `fire_inflight_items_solo_max` while it is alone.

For each due entry the proposer computes what apply may not: the occurrences
the fire covers (only the due one when on time; the missed ones after an
outage, for the job's misfire policy) and the next occurrence after now
(core/firing.py: a job's jitter and catch-up window count there too).
A retry's due entry (a run in retry_wait) fires the same way: its next
attempt is queued on this node, under this shard's token.

Firing ahead (--arm-ahead-s): an occurrence whose due entry apply marked
armable (core/firing.py `armable`: one a node calls, not a DAG, concurrency
`allow`) fires up to the arming window before it is due; its run is queued
here and held until its second (runtime/armed.py). Anything else, retries
included, fires at its second. Arming is background work: a pass fires ahead
only while none of this node's fires is in flight, and reads at most
`arm_fire_items_max` entries ahead of now, shard by shard from the earliest
due, so followers apply small entries and the event loop reads little while
creates and calls go on. When what a shard's window showed holds only
entries that may not be armed, the shard is `_held` (fired at its next due
instant, not ahead) until an entry is armed in it or its own fire is
answered, so passes do not read them again and again; what it holds back
fires no later than without arming.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Awaitable, Callable, NamedTuple

from raftsched import limits
from raftsched.core import commands, cost, queries
from raftsched.core.firing import (PENDING_ONCE_SPEC, FireItem, armable, fire_item,
                                    pending_fire_item)
from raftsched.core.keys import KIND_RETRY
from raftsched.errors import Unavailable
from raftsched.runtime.context import Replicated, Spawn
from raftsched.runtime.fair import drr_order

log = logging.getLogger("raftsched.trigger")


class DueEntry(NamedTuple):
    """A due entry as the trigger reads it: what it is (an occurrence of job
    `ident`, or the next attempt of run `ident`: keys.KIND_*), whose, its
    priority rank, and when it is due."""
    kind: bytes
    ident: str
    tenant: str
    rank: int
    due_ms: int


def job_fire_item(store: Any, job_id: str, due_ms: int, now: int) -> tuple[FireItem, int] | None:
    """The fire item of the job's due entry at `due_ms` and what it costs
    apply (core/cost.py), or None if the job changed since it was armed
    (apply would refuse it as stale anyway). A pending one-off's comes from
    its record as stored (queries.pending_once_facts), any other's from the
    whole job."""
    facts = queries.pending_once_facts(store, job_id)
    if facts is not None:
        item = pending_fire_item(job_id, facts, due_ms)
        return None if item is None else (item, cost.fire_item_cost(PENDING_ONCE_SPEC, 1))
    job = queries.job(store, job_id)
    if job is not None and due_ms > now and not armable(job["spec"]):
        return None   # its due entry is being rewritten (an update in flight)
    item = None if job is None else fire_item(job, due_ms, now)
    if item is None:
        return None
    return item, cost.fire_item_cost(job["spec"], len(item.occurrences))


class TriggerLoop:
    def __init__(self, replicated: Replicated, *, arm_ahead_ms: int,
                 propose_entry: Callable[[bytes], Awaitable[dict]], spawn: Spawn,
                 synced: Callable[[], bool], armed_room: Callable[[], int],
                 weight_of: Callable[[str], int] = lambda tenant: 1) -> None:
        """`arm_ahead_ms`: the arming window (--arm-ahead-s); 0 fires at the second.
        `propose_entry`: an encoded fire to Raft, its result once applied
        here (Replicator.propose_wait: a fire is not held back while no
        leader is known, its shards' next pass proposes again);
        `synced`: whether this node knows the cluster's time yet
        (runtime/clock.py); `armed_room`: how many more runs this node may
        hold armed (runtime/armed.py); `weight_of`: a tenant's share of a
        pass when several tenants' items are due."""
        self._replicated = replicated
        self._store = replicated.store
        self._to_raft = propose_entry
        self._spawn = spawn
        self._synced = synced
        self._armed_room = armed_room
        self._weight_of = weight_of
        self._wake = asyncio.Event()
        self._planned_wake_ms = 0
        self._owned: dict[int, int] = {}          # shard -> fencing token
        self._next_due: dict[int, int | None] = {}  # shard -> earliest due_ms
        self._inflight: dict[int, int] = {}      # shard -> fires not yet answered
        # Shards whose arming window holds nothing armable: fired at their due instant.
        self._held: set[int] = set()
        self._arm_ahead_ms = arm_ahead_ms
        # Items and retries in those fires, by tenant.
        self._inflight_items: collections.Counter[str] = collections.Counter()
        self._resynced_at = 0.0
        self.fired_total = 0
        self.stale_items_total = 0
        self.refused_fires_total = 0

    # --- inputs from apply (loop thread) ------------------------------------------------

    def wake(self, shard: int, due_ms: int) -> None:
        if shard not in self._owned:
            return
        self._held.discard(shard)   # what was armed may be armable
        current = self._next_due.get(shard)
        if current is None or due_ms < current:
            self._next_due[shard] = due_ms
        if due_ms - self._arm_ahead_ms < self._planned_wake_ms:
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
            if time.monotonic() - self._resynced_at > limits.due_resync_period_s:
                self.resync()
            next_ms = self.maybe_fire_due()
            now = self._replicated.now_ms()
            wake_ms = now + limits.trigger_tick_ms_max
            if next_ms is not None:
                wake_ms = min(wake_ms, next_ms)
            else:
                wake_ms = self._rest_until(now, wake_ms)
            self._planned_wake_ms = wake_ms
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, (wake_ms - now) / 1000))
            except asyncio.TimeoutError:
                pass

    def _rest_until(self, now: int, tick_ms: int) -> int:
        """When the loop wakes next if no shard was found due soon: past the
        tick while nothing is in flight, the node knows the cluster's time
        and has room to arm, and no shard held acts within the tick (after
        this pass, which moved the next due instants of the shards it
        passed): then until the soonest of them acts, or the next resync.
        What would make something due sooner wakes the loop (a due entry
        within the planned wait, through `wake`; a change of the shards
        held; a fire answered). An idle node then wakes its trigger every
        few seconds, not five times a second."""
        if self._inflight or not self._synced() or self._armed_room() <= 0:
            return tick_ms
        ahead_ms = self._ahead_ms()
        soonest: int | None = None
        for shard, due_ms in self._next_due.items():
            if due_ms is not None:
                act_ms = self._act_ms(shard, due_ms, ahead_ms)
                soonest = act_ms if soonest is None else min(soonest, act_ms)
        if soonest is not None and soonest <= tick_ms:
            return tick_ms
        resync_ms = now + round((self._resynced_at + limits.due_resync_period_s
                                 - time.monotonic()) * 1000)
        return max(tick_ms, resync_ms if soonest is None else min(soonest, resync_ms))

    def resync(self) -> None:
        """Reload owned shards (and their tokens) and next due instants from LMDB."""
        me = self._replicated.node_id
        owned = queries.owned_shards(self._store, me)
        gained = set(owned) - set(self._owned)
        lost = set(self._owned) - set(owned)
        if gained or lost:
            log.info("now owning %d shards (+%d, -%d)", len(owned), len(gained), len(lost))
        self._owned = owned
        self._next_due = {shard: self._earliest(shard) for shard in owned}
        self._held.clear()
        self._resynced_at = time.monotonic()

    def _earliest(self, shard: int) -> int | None:
        return queries.earliest_due(self._store, shard)

    def maybe_fire_due(self) -> int | None:
        """Propose fires for every owned shard that is due; return the earliest
        future due instant (or None). Nothing before this node knows the
        cluster's time: its own clock may be wrong (runtime/clock.py)."""
        if not self._synced():
            return None
        now = self._replicated.now_ms()
        ahead_ms = self._ahead_ms()
        earliest: int | None = None
        due: list[int] = []
        for shard, due_ms in self._next_due.items():
            if due_ms is None or shard in self._inflight:
                continue
            act_ms = self._act_ms(shard, due_ms, ahead_ms)
            if act_ms <= now:
                due.append(shard)
            elif earliest is None or act_ms < earliest:
                earliest = act_ms
        if due:
            self._propose_pass(due, now)
        return earliest

    def _act_ms(self, shard: int, due_ms: int, ahead_ms: int) -> int:
        """When a shard whose earliest entry is due at `due_ms` is passed: that
        much ahead of it, or at it while its window holds nothing armable."""
        return due_ms if shard in self._held else due_ms - ahead_ms

    def _ahead_ms(self) -> int:
        """How far ahead this pass may fire: the arming window; 0 while a fire
        of this node is in flight (arming waits for it: limits.arm_fire_items_max)
        or while the node holds as many armed runs as it may (limits.armed_runs_max)."""
        if self._arm_ahead_ms and not self._inflight and self._armed_room() > 0:
            return self._arm_ahead_ms
        return 0

    def _propose_pass(self, shards: list[int], now: int) -> None:
        """Propose the due items of `shards` in `fire_many` entries of up to
        fire_batch_max items and apply_entry_cost_max cost units (many shards
        in one entry), at most
        fire_inflight_items_max of each tenant's in flight: the rest wait for
        the next pass, which reads what is due again. When the pass holds more
        than one tenant or priority, the items go in fair order
        (runtime/fair.py), first ones first. A light
        tenant's items then commit in the first entry, and the log never holds
        a heavy tenant's whole backlog ahead of the others' starts and
        finishes."""
        ahead_ms = self._ahead_ms()
        # What is due first; then the window ahead, shard by shard from the
        # earliest, reading at most arm_fire_items_max entries in all.
        collected = {shard: self._collect(shard, now) for shard in shards}
        if ahead_ms:
            budget = limits.arm_fire_items_max
            for shard in sorted(shards, key=lambda s: self._next_due.get(s) or 0):
                if budget <= 0 or shard in self._held:
                    continue
                ahead, read = self._collect_ahead(shard, now, ahead_ms, budget)
                if read and not ahead and not collected[shard]:
                    self._held.add(shard)   # nothing in its window may be armed
                collected[shard] += ahead
                budget -= read
            collected = self._within_arming_room(collected, now)
        for shard, entries in collected.items():
            if not entries and not self._inflight.get(shard):
                self._next_due[shard] = self._earliest(shard)   # nothing due after all
        classes = {(e.tenant, e.rank) for entries in collected.values() for e in entries}
        if len(classes) <= 1:
            order = [(shard, e) for shard, entries in collected.items() for e in entries]
            self._propose(self._within_room(order), now)
            return
        queues: dict[str, list[tuple[int, DueEntry]]] = {}
        for shard, entries in collected.items():
            for entry in entries:
                queues.setdefault(entry.tenant, []).append((shard, entry))
        for items in queues.values():
            items.sort(key=lambda item: (item[1].rank, item[1].due_ms))
        order = drr_order(queues, self._weight_of)
        self._propose(self._within_room(order), now)
        # The rest waits for a fire to be answered, which wakes the loop.

    @staticmethod
    def _within_arming_room(collected: dict[int, list[DueEntry]], now: int
                            ) -> dict[int, list[DueEntry]]:
        """`collected` with every entry due by now, and only the earliest
        arm_fire_items_max of those ahead of it; the rest are fired ahead by
        the passes after this one's fires are answered."""
        ahead = sorted(entry.due_ms for entries in collected.values() for entry in entries
                       if entry.due_ms > now)
        if len(ahead) <= limits.arm_fire_items_max:
            return collected
        last_ms = ahead[limits.arm_fire_items_max - 1]
        room = sum(1 for due_ms in ahead if due_ms < last_ms)
        room = limits.arm_fire_items_max - room   # entries at last_ms that fit
        kept: dict[int, list[DueEntry]] = {}
        for shard, entries in collected.items():
            kept[shard] = []
            for entry in entries:
                if entry.due_ms <= now or entry.due_ms < last_ms:
                    kept[shard].append(entry)
                elif entry.due_ms == last_ms and room > 0:
                    kept[shard].append(entry)
                    room -= 1
        return kept

    def _within_room(self, order: list[tuple[int, DueEntry]]) -> list[tuple[int, DueEntry]]:
        """The items of `order`, in order, that fit their tenant's room: at
        most fire_inflight_items_max of a tenant's items in flight while
        another tenant has items due or in flight here, else
        fire_inflight_items_solo_max."""
        room: dict[str, int] = {}
        chosen = []
        tenants = {entry.tenant for _, entry in order} | set(self._inflight_items)
        bound = (limits.fire_inflight_items_max if len(tenants) > 1
                 else limits.fire_inflight_items_solo_max)
        for shard, entry in order:
            tenant = entry.tenant
            if tenant not in room:
                room[tenant] = bound - self._inflight_items[tenant]
            if room[tenant] > 0:
                room[tenant] -= 1
                chosen.append((shard, entry))
        return chosen

    def _collect(self, shard: int, now: int) -> list[DueEntry]:
        """The shard's due entries, read from the due index alone (its values name tenant and priority;
        an entry written without them is looked up)."""
        rows = queries.due(self._store, shard, None, now, limits.fire_batch_max)
        return [self._entry(due_ms, kind, ident, value) for due_ms, kind, ident, value in rows]

    def _collect_ahead(self, shard: int, now: int, ahead_ms: int,
                       limit: int) -> tuple[list[DueEntry], int]:
        """The entries of the shard due after now and within `ahead_ms` that
        may be armed (their due value says so: core/apply.py `_arm`), from
        at most `limit` read: (entries, rows read)."""
        rows = queries.due(self._store, shard, now, now + ahead_ms, limit)
        entries = []
        for due_ms, kind, ident, value in rows:
            if value.get("a"):
                entries.append(self._entry(due_ms, kind, ident, value))
        return entries, len(rows)

    def _entry(self, due_ms: int, kind: bytes, ident: str, value: dict) -> DueEntry:
        tenant, rank = value.get("tn"), value.get("p", 1)
        if tenant is None:
            tenant = queries.due_tenant(self._store, kind, ident) or "default"
        return DueEntry(kind, ident, tenant, rank, due_ms)

    def _fire_item(self, kind: bytes, ident: str, due_ms: int,
                   now: int) -> tuple[str, tuple, int] | None:
        """What a fire carries for one due entry and what it costs apply
        (core/cost.py), or None if the job changed since it was armed (apply
        would refuse it as stale anyway)."""
        if kind == KIND_RETRY:
            return "retries", (ident, due_ms), 1
        built = job_fire_item(self._store, ident, due_ms, now)
        return None if built is None else ("items", *built)

    def _propose(self, chosen: list[tuple[int, DueEntry]], now: int) -> None:
        """`chosen` (shard, item entry) in order, as fire_many entries of up to
        fire_batch_max items and apply_entry_cost_max cost units (a fire of
        DAG jobs creates a task run per starting task: core/cost.py); within
        an entry, a part per shard in the order of the shard's first item."""
        built = []
        for shard, entry in chosen:
            item = self._fire_item(entry.kind, entry.ident, entry.due_ms, now)
            if item is None:
                if not self._inflight.get(shard):
                    self._next_due[shard] = self._earliest(shard)   # all it had was stale
                continue
            built.append((shard, entry.tenant, item))
        start = 0
        for size in cost.pack([item[2] for _, _, item in built], limits.apply_entry_cost_max,
                              limits.fire_batch_max):
            self._propose_entry(built[start:start + size], now)
            start += size

    def _propose_entry(self, built: list[tuple[int, str, tuple]], now: int) -> None:
        parts: dict[int, dict] = {}
        tenants: collections.Counter[str] = collections.Counter()
        for shard, tenant, (member, item, _) in built:
            part = parts.setdefault(shard, {"shard": shard, "token": self._owned[shard],
                                            "upto_ms": now, "items": [], "retries": []})
            part[member].append(item)
            tenants[tenant] += 1
        cmd = commands.fire_many(node=self._replicated.node_id, at_ms=now,
                                 parts=list(parts.values()))
        for shard in parts:
            self._inflight[shard] = self._inflight.get(shard, 0) + 1
        self._inflight_items.update(tenants)
        self._spawn("trigger.send", self._send(cmd, tenants))

    async def _send(self, cmd: commands.FireMany,
                    tenants: collections.Counter | None = None) -> None:
        parts = cmd.parts
        try:
            result = await self._to_raft(commands.encode(cmd))
            if "parts" in result:
                for part, answer in zip(parts, result["parts"]):
                    self._count_answer(str(part.shard), answer)
            else:   # refused whole
                self._count_answer(",".join(str(p.shard) for p in parts), result)
        except Unavailable as exc:
            log.warning("fire of %d shards (%d items, %d retries) not committed: %s", len(parts),
                        sum(len(p.items) for p in parts),
                        sum(len(p.retries) for p in parts), exc.detail)
        finally:
            if tenants:
                self._inflight_items.subtract(tenants)
                self._inflight_items = +self._inflight_items   # drops the zeros
            for part in parts:
                shard = part.shard
                left = self._inflight.pop(shard, 1) - 1
                if left > 0:
                    self._inflight[shard] = left
                elif shard in self._owned:
                    self._next_due[shard] = self._earliest(shard)
                    self._held.discard(shard)
            self._wake.set()

    def _count_answer(self, shards: str, result: dict) -> None:
        if result.get("error") == "stale_token":
            self.refused_fires_total += 1
            log.warning("fire refused: %s", result["detail"])
            self._resynced_at = 0.0   # our view of ownership is out of date
        elif not result.get("ok"):
            # Refused whole (the node logged why); its due entries stay and
            # are proposed again at the next pass.
            self.refused_fires_total += 1
            log.error("fire of shard(s) %s refused (%s): %s", shards, result.get("error"),
                      result.get("detail"))
        self.fired_total += result.get("fired", 0)
        self.stale_items_total += result.get("stale", 0)
