"""The store contract, shared by the LMDB and in-memory stores.

A store holds the replicated tables of `raftsched.core.apply.TABLES` plus
`applied_index`. `commit` is the only writer: it persists one Transition's
writes and the new applied_index atomically, or nothing. Readers (the HTTP API,
the trigger loop) may run on other threads and always see a committed state.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Protocol

from raftsched.core import codec, keys
from raftsched.core.apply import DUE, TABLES, Transition


class Store(Protocol):
    def get(self, table: str, key: bytes) -> Any | None: ...

    def commit(self, transition: Transition, index: int) -> None:
        """Persist writes and applied_index = index in one transaction.
        Precondition: index > applied_index()."""

    def applied_index(self) -> int: ...

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]:
        """Entries with start <= key < stop (stop None: no upper bound), in key
        order or reversed, decoded."""

    def raw_items(self) -> tuple[int, Iterable[tuple[str, bytes, bytes]]]:
        """(applied_index, every (table, key, raw value)) from one consistent read."""

    def replace_all(self, applied_index: int, items: Iterable[tuple[str, bytes, bytes]]) -> None:
        """Replace the whole state (a snapshot install) in one transaction."""

    def close(self) -> None: ...


def encode_value(value: Any) -> bytes:
    return codec.pack(value)


def due_entries(store: Store, shard: int, upto_ms: int,
                limit: int) -> list[tuple[int, bytes, str]]:
    """Due entries of `shard` at or before `upto_ms`, oldest first:
    (due_ms, kind, id): a job id for an occurrence, a run id for a retry."""
    rows = store.scan(DUE, start=keys.shard_prefix(shard),
                      stop=keys.due_upto_key(shard, upto_ms), limit=limit)
    return [keys.parse_due_key(key)[1:] for key, _ in rows]


def due_until(store: Store, shard: int, upto_ms: int, limit: int) -> list[tuple[int, str]]:
    """The occurrences among the due entries: (due_ms, job_id)."""
    return [(due_ms, ident) for due_ms, kind, ident in due_entries(store, shard, upto_ms, limit)
            if kind == keys.KIND_OCCURRENCE]


def digest(store: Store) -> tuple[int, str]:
    """SHA-256 over every replicated table in key order: equal on every node
    that has applied the same log prefix."""
    index, items = store.raw_items()
    h = hashlib.sha256()
    for table, key, value in items:
        for part in (table.encode(), key, value):
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
    return index, h.hexdigest()


def tables() -> tuple[str, ...]:
    return TABLES
