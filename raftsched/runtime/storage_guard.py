"""Full storage is a refusal, not a crash: the node's storage guard.

At each check the guard measures, off the event loop, the bytes the state's
B-trees use in the LMDB map (cheap: database headers only) and the free
space of the data disk, and asks its peers (GET /v1/node) for theirs. The
next check comes after `storage_check_period_s` (1 s) while this node's
state changes size, and otherwise after the time the node, or a peer,
nearest its mark would take to reach it at `storage_fill_rate_bytes_per_s`:
every second near a mark, at most every `storage_check_period_max_s` (10 s)
far from all of them, so an idle cluster with room to spare is not asked
every second. This node is past its
mark when the state uses
`data_bytes_high_water_ratio` of --max-data-bytes, or when the disk has less
than --min-free-disk-bytes free.

While this node, or a peer that answered within `storage_peer_report_s`, is
past its mark, `check_room()` refuses the API writes that add state (507,
naming max_data_bytes or min_free_disk_bytes), and runs that publish fail
with a retryable error. Everything else goes on: firing, finishing runs,
deletes and purges, which free space. A peer counts because every replica
applies every write: a write accepted here would fill the peer too.

The headroom above the mark is for what goes on regardless, and for the
writes accepted between two checks. If an apply still finds the map full,
the node stops (storage/lmdb_store.py raises StorageFull); see
docs/operations.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import aiohttp

from raftsched import limits
from raftsched.core import queries
from raftsched.errors import InsufficientStorage
from raftsched.runtime.peer import PeerClient

log = logging.getLogger("raftsched.storage")


class StorageGuard:
    def __init__(self, *, node_id: str, store: Any, peers: PeerClient,
                 min_free_disk_bytes: int) -> None:
        """`store`: this node's LMDB store (its map size, use and file);
        `peers`: the client it asks the other nodes' storage with
        (runtime/peer.py)."""
        self._node_id = node_id
        self._store = store
        self._peer_client = peers
        self._min_free_disk_bytes = min_free_disk_bytes
        self.used_bytes = 0
        self.file_bytes = 0
        self.free_disk_bytes: int | None = None
        # (limit, detail) while this node is past its mark.
        self._own: tuple[str, str] | None = None
        # peer id -> (limit, detail, time.monotonic() of the answer)
        self._peers: dict[str, tuple[str, str, float]] = {}
        self.refused_total = 0
        # The least room, in bytes, this node or a peer that answered the last
        # check has before its mark (None: not known yet): it sets the next check.
        self._room_bytes: int | None = None
        self._changing = True   # whether the state's size moved at the last check

    @property
    def high_water_bytes(self) -> int:
        return int(self._store.map_size * limits.data_bytes_high_water_ratio)

    async def run(self) -> None:
        # A failed check is the node's supervisor's: it logs and counts it and
        # starts the loop again; meanwhile the last measurement stands.
        while True:
            await self.check()
            await asyncio.sleep(self.next_check_s())

    async def check(self) -> None:
        loop = asyncio.get_running_loop()
        used, file_bytes, free = await loop.run_in_executor(None, self._measure)
        self._changing = used != self.used_bytes
        self._judge(used, file_bytes, free)
        self._room_bytes = self._room_of(self.status())
        await self._ask_peers()

    def next_check_s(self) -> float:
        """Seconds to the next check: storage_check_period_s while this node's
        state changes size (what GET /v1/node shows is then at most that old);
        else what the least room this node or a peer has before its mark lasts
        at storage_fill_rate_bytes_per_s, up to storage_check_period_max_s."""
        if self._room_bytes is None or self._changing:
            return limits.storage_check_period_s
        lasts_s = self._room_bytes / limits.storage_fill_rate_bytes_per_s
        return min(limits.storage_check_period_max_s, max(limits.storage_check_period_s, lasts_s))

    @staticmethod
    def _room_of(storage: dict) -> int | None:
        """Bytes a node (its GET /v1/node `storage`) may still fill before a
        mark: the state's before its high water, the disk's before its minimum
        free; None if it did not say."""
        try:
            state = int(storage["high_water_bytes"]) - int(storage["used_bytes"])
            free = storage.get("free_disk_bytes")
            disk = state if free is None else int(free) - int(storage["min_free_disk_bytes"])
        except (KeyError, TypeError, ValueError):
            return None
        return max(0, min(state, disk))

    def _note_room(self, room: int | None) -> None:
        if room is not None and (self._room_bytes is None or room < self._room_bytes):
            self._room_bytes = room

    def _measure(self) -> tuple[int, int, int]:
        store = self._store
        disk = os.statvfs(store.path)
        return store.used_bytes(), store.file_bytes(), disk.f_bavail * disk.f_frsize

    def _judge(self, used: int, file_bytes: int, free: int) -> None:
        self.used_bytes, self.file_bytes, self.free_disk_bytes = used, file_bytes, free
        full = None
        if used >= self.high_water_bytes:
            full = ("max_data_bytes",
                    f"node {self._node_id}'s state uses {used} bytes, over "
                    f"{limits.data_bytes_high_water_ratio:.0%} of max_data_bytes "
                    f"({self._store.map_size} bytes)")
        elif free < self._min_free_disk_bytes:
            full = ("min_free_disk_bytes",
                    f"node {self._node_id}'s data disk has {free} bytes free, under "
                    f"min_free_disk_bytes ({self._min_free_disk_bytes} bytes)")
        if full is not None and self._own is None:
            log.warning("storage past its mark, refusing writes that add state: %s", full[1])
        elif full is None and self._own is not None:
            log.info("storage back under its mark (%d bytes used, %s bytes free on disk); "
                     "accepting writes again", used, free)
        self._own = full

    async def _ask_peers(self) -> None:
        peers = [rec for rec in queries.registered_nodes(self._store)
                 if rec["id"] != self._node_id]
        if not peers:
            return
        await asyncio.gather(*(self._ask(rec) for rec in peers))

    async def _ask(self, rec: dict) -> None:
        try:
            status = await self._peer_client.get_json(rec["http"] + "/v1/node",
                                                      timeout_s=limits.storage_peer_timeout_s)
            storage = status.get("storage") or {}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
            return   # an unreachable peer applies nothing until it is back
        if not isinstance(storage, dict):
            return
        self._note_room(0 if storage.get("full") else self._room_of(storage))
        if storage.get("full"):
            self._peers[rec["id"]] = (storage["full"], str(storage.get("detail")),
                                      time.monotonic())
        else:
            self._peers.pop(rec["id"], None)

    def past_mark(self) -> tuple[str, str] | None:
        """(limit, detail) if this node, or a peer that said so recently, is past its mark."""
        if self._own is not None:
            return self._own
        fresh_after = time.monotonic() - limits.storage_peer_report_s
        for limit, detail, seen in self._peers.values():
            if seen >= fresh_after:
                return limit, detail
        return None

    def check_room(self) -> None:
        """Raise InsufficientStorage (507) if a write that adds state must wait."""
        full = self.past_mark()
        if full is None:
            return
        self.refused_total += 1
        limit, detail = full
        raise InsufficientStorage(f"storage is past its mark: {detail}. Writes that add state "
                                  f"are refused until deletes and purges free space (or the "
                                  f"limit is raised); running jobs go on", limit=limit)

    def status(self) -> dict:
        """For GET /v1/node (what peers read)."""
        own = self._own
        return {"used_bytes": self.used_bytes, "file_bytes": self.file_bytes,
                "max_data_bytes": self._store.map_size,
                "high_water_bytes": self.high_water_bytes,
                "free_disk_bytes": self.free_disk_bytes,
                "min_free_disk_bytes": self._min_free_disk_bytes,
                "full": own[0] if own else None, "detail": own[1] if own else None}
