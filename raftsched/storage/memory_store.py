"""An in-memory store with the LMDB store's contract, for unit tests of the core
and of the contract itself. Values are kept encoded, as LMDB keeps them, so a
caller never shares a mutable record with the store, and keys obey LMDB's rules
(storage/base.py), so a test over this store fails where LMDB would."""

from __future__ import annotations

import bisect
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

from raftsched.core import codec, keys
from raftsched.core.apply import DUE, RUNS, TABLES, Transition
from raftsched.core.tx import JOB_STATE, JOBS
from raftsched.errors import InvariantBroken
from raftsched.storage.base import (check_key, check_row, decode_job_to_call, decode_run_hold,
                                    decode_value, encode_value, job_row, job_row_with_history,
                                    storable_key)

T = TypeVar("T")


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, dict[bytes, bytes]] = {t: {} for t in TABLES}
        self._sorted: dict[str, list[bytes]] = {t: [] for t in TABLES}
        self._applied = 0

    def get(self, table: str, key: bytes) -> Any | None:
        if not storable_key(key):
            return None
        raw = self._data[table].get(key)
        if raw is not None and table == JOBS:
            return self._merged_job(key, raw)
        return None if raw is None else decode_value(table, raw, key)

    def has(self, table: str, key: bytes) -> bool:
        """Whether `get` would find a record (core/tx.py View)."""
        return storable_key(key) and key in self._data[table]

    def get_stored(self, table: str, key: bytes) -> Any | None:
        """The record as stored, decoded but not restored (core/tx.py View)."""
        if table == DUE or not storable_key(key):
            return None
        raw = self._data[table].get(key)
        return None if raw is None else codec.unpack_record(raw)

    def pending_job_stored(self, key: bytes) -> Any | None:
        """As LmdbStore.pending_job_stored."""
        raw = self._data[JOBS].get(key) if storable_key(key) else None
        if raw is None or key in self._data[JOB_STATE]:
            return None
        return codec.unpack_record(raw)

    def job_to_call(self, job_id: str) -> dict | None:
        key = keys.job_key(job_id)
        with self._lock:
            raw = self._data[JOBS].get(key) if storable_key(key) else None
            state = None if raw is None else self._data[JOB_STATE].get(key)
        return None if raw is None else decode_job_to_call(raw, key, state)

    def run_hold(self, run_id: str) -> tuple[Any, Any, Any, Any] | None:
        key = run_id.encode()
        raw = self._data[RUNS].get(key) if storable_key(key) else None
        return None if raw is None else decode_run_hold(raw, key)

    def _merged_job(self, key: bytes, raw: bytes) -> dict:
        """A job record with its state record laid over it (core/tx.py JOB_STATE)."""
        return job_row(key, raw, self._data[JOB_STATE].get(key))

    def scan_jobs_with_history(self, *, start: bytes = b"",
                               limit: int) -> list[tuple[bytes, dict | None]]:
        with self._lock:
            order = self._sorted[JOBS]
            lo = bisect.bisect_left(order, start)
            return [(k, job_row_with_history(k, self._data[JOBS][k],
                                             self._data[JOB_STATE].get(k)))
                    for k in order[lo:lo + limit]]

    def applied_index(self) -> int:
        return self._applied

    def commit(self, transition: Transition, index: int) -> None:
        with self._lock:
            if index <= self._applied:
                raise InvariantBroken(f"commit of index {index} at applied_index {self._applied}")
            # Check and encode every write first: a commit is all or nothing.
            encoded = []
            checked = transition.keys_checked   # by Tx as apply made them (core/tx.py)
            for table, key, value in transition.writes:
                if not checked:
                    check_key(table, key)
                if table not in self._data:
                    raise KeyError(table)   # as LMDB's store: no such table
                raw = None if value is None else encode_value(table, value, key)
                if raw is not None:
                    check_row(table, key, raw)
                encoded.append((table, key, raw))
            for table, key, raw in encoded:
                self._put(table, key, raw)
            self._applied = index

    def apply_commit(self, index: int, apply: Callable[[Any], T], *,
                     skip_applied: bool = False) -> T | None:
        """As LmdbStore.apply_commit: `apply` reads this store, its (tag,
        transition) is committed as `index`."""
        if skip_applied and index <= self._applied:
            return None
        result = apply(self)
        self.commit(result[1], index)
        return result

    def begin_batch(self) -> None:
        """Each entry is committed at once here (Store.begin_batch)."""

    def end_batch(self) -> None:
        pass

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
            if table == JOBS:
                return [(k, self._merged_job(k, self._data[table][k])) for k in selected]
            return [(k, decode_value(table, self._data[table][k], k)) for k in selected]

    def raw_items(self) -> tuple[int, list[tuple[str, bytes, bytes]]]:
        with self._lock:
            return self._applied, [(t, k, self._data[t][k]) for t in TABLES
                                   for k in self._sorted[t]]

    def replace_all(self, applied_index: int, items: Iterable[tuple[str, bytes, bytes]]) -> None:
        items = list(items)
        for table, key, value in items:
            check_key(table, key)
            if not isinstance(value, bytes) or table not in TABLES:
                raise InvariantBroken(f"snapshot item of table {table!r}: not a stored record")
            check_row(table, key, value)
        with self._lock:
            self._data = {t: {} for t in TABLES}
            self._sorted = {t: [] for t in TABLES}
            for table, key, value in items:
                self._put(table, key, value)
            self._applied = applied_index

    def pin(self) -> "PinnedItems":
        """A consistent read of the whole state as of now (as LmdbStore.pin):
        here a copy of the records, taken under the lock."""
        index, items = self.raw_items()
        return PinnedItems(index, items)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class PinnedItems:
    """The in-memory store's pinned read: applied_index and its records."""

    def __init__(self, applied_index: int, items: list[tuple[str, bytes, bytes]]) -> None:
        self.applied_index = applied_index
        self._items = items

    def items(self) -> Iterator[tuple[str, bytes, bytes]]:
        return iter(self._items)

    def close(self) -> None:
        self._items = []

    def __enter__(self) -> "PinnedItems":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
