"""An in-memory store with the LMDB store's contract, for unit tests of the core
and of the contract itself. Values are kept encoded, as LMDB keeps them, so a
caller never shares a mutable record with the store."""

from __future__ import annotations

import bisect
import threading
from typing import Any, Iterable

from raftsched.core import codec
from raftsched.core.apply import TABLES, Transition
from raftsched.errors import InvariantBroken


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, dict[bytes, bytes]] = {t: {} for t in TABLES}
        self._sorted: dict[str, list[bytes]] = {t: [] for t in TABLES}
        self._applied = 0

    def get(self, table: str, key: bytes) -> Any | None:
        raw = self._data[table].get(key)
        return None if raw is None else codec.unpack(raw)

    def applied_index(self) -> int:
        return self._applied

    def commit(self, transition: Transition, index: int) -> None:
        with self._lock:
            if index <= self._applied:
                raise InvariantBroken(f"commit of index {index} at applied_index {self._applied}")
            for table, key, value in transition.writes:
                self._put(table, key, None if value is None else codec.pack(value))
            self._applied = index

    def _put(self, table: str, key: bytes, raw: bytes | None) -> None:
        data, order = self._data[table], self._sorted[table]
        if raw is None:
            if data.pop(key, None) is not None:
                order.pop(bisect.bisect_left(order, key))
            return
        if key not in data:
            bisect.insort(order, key)
        data[key] = raw

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]:
        with self._lock:
            order = self._sorted[table]
            lo = bisect.bisect_left(order, start)
            hi = len(order) if stop is None else bisect.bisect_left(order, stop)
            selected = order[lo:hi]
            if reverse:
                selected = selected[::-1]
            if limit is not None:
                selected = selected[:limit]
            return [(k, codec.unpack(self._data[table][k])) for k in selected]

    def raw_items(self) -> tuple[int, list[tuple[str, bytes, bytes]]]:
        with self._lock:
            return self._applied, [(t, k, self._data[t][k]) for t in TABLES
                                   for k in self._sorted[t]]

    def replace_all(self, applied_index: int, items: Iterable[tuple[str, bytes, bytes]]) -> None:
        with self._lock:
            self._data = {t: {} for t in TABLES}
            self._sorted = {t: [] for t in TABLES}
            for table, key, value in items:
                self._put(table, key, value)
            self._applied = applied_index

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass
