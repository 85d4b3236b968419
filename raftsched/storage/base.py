"""The store contract, shared by the LMDB and in-memory stores.

A store holds the replicated tables of `raftsched.core.apply.TABLES` plus
`applied_index`. `commit` is the only writer: it persists one Transition's
writes and the new applied_index atomically, or nothing. Readers (the HTTP API,
the trigger loop) may run on other threads and always see a committed state.

Keys are LMDB's: bytes, 1 to `lmdb_key_bytes_max` (511) long. A commit or a
snapshot install holding any other key raises InvalidKey and writes nothing
(apply refuses such writes before they get here, so this is a bug). `get` of a
key no record can have answers None. Values are any msgpack-encodable record.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

from raftsched import limits
from raftsched.core import codec, compact, keys
from raftsched.core.apply import DUE, TABLES, Transition
from raftsched.core.tx import JOB_STATE, JOBS, merge_job
from raftsched.errors import InvariantBroken

T = TypeVar("T")


class InvalidKey(InvariantBroken):
    """A write under a key LMDB cannot hold: empty, too long, or not bytes."""


def storable_key(key: object) -> bool:
    return isinstance(key, bytes) and 1 <= len(key) <= limits.lmdb_key_bytes_max


def check_key(table: str, key: object) -> None:
    """Raise InvalidKey unless a store can hold `key` (both stores call this)."""
    if not isinstance(key, bytes):
        raise InvalidKey(f"{table}: a key must be bytes, not {type(key).__name__}")
    if not storable_key(key):
        raise InvalidKey(f"{table}: a key of {len(key)} bytes; keys are 1 to "
                         f"{limits.lmdb_key_bytes_max} bytes (lmdb_key_bytes_max)")
    if table == DUE and not keys.due_key_storable(key):
        raise InvalidKey(f"{table}: a key of {len(key)} bytes; a due key is a shard, a time, "
                         f"a kind and an id without NUL, at most {limits.due_key_bytes_max} "
                         f"bytes (due_key_bytes_max)")


def check_row(table: str, key: bytes, raw: bytes) -> None:
    """Raise InvalidKey unless a store can hold the encoded value `raw` under
    `key`: the LMDB store keeps a due entry's key after its shard, a NUL and
    its value as one LMDB value, which LMDB bounds as it bounds keys. A due
    value (keys.due_value) is a tenant and a rank, so only a bug gets here."""
    if table == DUE and len(key) - 1 + len(raw) > limits.lmdb_key_bytes_max:
        raise InvalidKey(f"{table}: a key of {len(key)} bytes and a value of {len(raw)}; "
                         f"a due entry holds at most {limits.lmdb_key_bytes_max + 1} "
                         f"bytes of both (lmdb_key_bytes_max)")


class Store(Protocol):
    def get(self, table: str, key: bytes) -> Any | None: ...

    def run_hold(self, run_id: str) -> tuple[Any, Any, Any, Any] | None:
        """(state, attempt, holder, token) of the run, or None if there is none:
        what `get` of its record would show, read for less."""

    def job_to_call(self, job_id: str) -> dict | None:
        """The job's id, tenant, status and spec (compact.CALL_VIEW), or None
        if there is none: what `get` of its record would show of them, read
        for less."""

    def commit(self, transition: Transition, index: int) -> None:
        """Persist writes and applied_index = index in one transaction.
        Precondition: index > applied_index()."""

    def apply_commit(self, index: int, apply: Callable[[Any], T], *,
                     skip_applied: bool = False) -> T | None:
        """Call `apply(view)`, which returns (tag, transition), and commit the
        transition as `index` as `commit` does; the view reads the state as
        of before it (the LMDB store reads through its write transaction).
        `skip_applied`: an index already applied (a replay after a restart)
        is answered None, checked in the same transaction, where otherwise
        it breaks the precondition."""

    def begin_batch(self) -> None:
        """The Raft thread's entries from here to end_batch may be committed
        together, at end_batch (LmdbStore); a store whose commits are cheap
        commits each at once."""

    def end_batch(self) -> None:
        """Commit what begin_batch gathered."""

    def applied_index(self) -> int: ...

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]:
        """Entries with start <= key < stop (stop None: no upper bound), in key
        order or reversed, decoded."""

    def scan_jobs_with_history(self, *, start: bytes = b"",
                               limit: int) -> list[tuple[bytes, dict | None]]:
        """Jobs from `start` in key order, at most `limit`, as scan reads them,
        except that an active job that has never had a run reads as None,
        undecoded (compact.pending_without_history): what the purger visits,
        at a fraction of a decode for each pending one-off."""

    def raw_items(self) -> tuple[int, Iterable[tuple[str, bytes, bytes]]]:
        """(applied_index, every (table, key, raw value)) from one consistent read."""

    def replace_all(self, applied_index: int, items: Iterable[tuple[str, bytes, bytes]]) -> None:
        """Replace the whole state (a snapshot install) in one transaction."""

    def pin(self) -> "Pinned":
        """A consistent read of the whole state as of this call, which another
        thread may then read (a digest, a snapshot) while commits go on."""

    def close(self) -> None: ...


class Pinned(Protocol):
    """A pinned read: `applied_index` and the records as of one moment. Close
    it when done (it is a context manager)."""

    applied_index: int

    def items(self) -> Iterator[tuple[str, bytes, bytes]]:
        """Every (table, key, raw value): tables in TABLES order, keys in order."""

    def close(self) -> None: ...

    def __enter__(self) -> "Pinned": ...

    def __exit__(self, *exc: object) -> None: ...


def encode_value(table: str, value: Any, key: bytes) -> bytes:
    """A record as a store keeps it under `key`: compacted (core/compact.py),
    msgpack."""
    return codec.pack(compact.compact(table, value, key))


def job_row(key: bytes, raw: bytes, state: bytes | None) -> dict:
    """A job as readers see it, from its stored record and state record (if
    any): the record with its state laid over it (core/tx.py merge_job)."""
    return merge_job(decode_value(JOBS, raw, key),
                     None if state is None else decode_value(JOB_STATE, state, key))


def job_row_with_history(key: bytes, raw: bytes, state: bytes | None) -> dict | None:
    """job_row, or None, undecoded, for an active job that has never had a
    run (scan_jobs_with_history)."""
    if state is None and compact.pending_without_history(raw):
        return None
    return job_row(key, raw, state)


def decode_value(table: str, raw: bytes, key: bytes) -> Any:
    """A stored record as every reader sees it: whole again. Give the key it
    is stored under: a job or run record leaves out its id when it is the key."""
    return compact.expand(table, codec.unpack_record(raw), key)


def decode_job_to_call(raw: bytes, key: bytes, state: bytes | None) -> dict:
    """compact.CALL_VIEW of a stored job and its state record (if any), the
    rest of both left unread (core/compact.py job_to_call)."""
    return compact.job_to_call(codec.unpack_record(raw), key,
                               None if state is None else codec.unpack_record(state))


def decode_run_hold(raw: bytes, key: bytes) -> tuple[Any, Any, Any, Any]:
    """(state, attempt, holder, token) of a stored run, without restoring the rest
    of it (core/compact.py run_hold)."""
    return compact.run_hold(codec.unpack_record(raw), key)


def due_entries(store: Store, shard: int, upto_ms: int,
                limit: int) -> list[tuple[int, bytes, str]]:
    """Due entries of `shard` at or before `upto_ms`, oldest first:
    (due_ms, kind, id): a job id for an occurrence, a run id for a retry."""
    rows = store.scan(DUE, start=keys.shard_prefix(shard),
                      stop=keys.due_upto_key(shard, upto_ms), limit=limit)
    return [keys.parse_due_key(key)[1:] for key, _ in rows]


def due_rows(store: Store, shard: int, upto_ms: int,
             limit: int) -> list[tuple[int, bytes, str, dict]]:
    """As due_entries, with each entry's value (keys.due_value)."""
    rows = store.scan(DUE, start=keys.shard_prefix(shard),
                      stop=keys.due_upto_key(shard, upto_ms), limit=limit)
    return [(*keys.parse_due_key(key)[1:], value) for key, value in rows]


def due_until(store: Store, shard: int, upto_ms: int, limit: int) -> list[tuple[int, str]]:
    """The occurrences among the due entries: (due_ms, job_id)."""
    return [(due_ms, ident) for due_ms, kind, ident in due_entries(store, shard, upto_ms, limit)
            if kind == keys.KIND_OCCURRENCE]


def digest(store: Store) -> tuple[int, str]:
    """SHA-256 over every replicated table in key order: equal on every node
    that has applied the same log prefix."""
    with store.pin() as pinned:
        return digest_pinned(pinned)


def digest_pinned(pinned: Pinned) -> tuple[int, str]:
    """digest() of a pinned read, record by record (never the whole state in
    memory), so it can run on any thread while the Raft thread goes on."""
    h = hashlib.sha256()
    for table, key, value in pinned.items():
        for part in (table.encode(), key, value):
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
    return pinned.applied_index, h.hexdigest()


def tables() -> tuple[str, ...]:
    return TABLES


def fsync_dir(path: str) -> None:
    """Make a rename inside `path` durable (the snapshot file, a swapped-in
    data file)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
