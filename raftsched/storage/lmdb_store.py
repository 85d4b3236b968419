"""The LMDB adapter: the one module that imports lmdb.

One environment per node, one named database per replicated table, plus
`meta` (applied_index, schema version). Keys are big-endian so byte order is
time order.

Durability. The state is what the Raft journal and the last snapshot hold,
applied: after a crash, the journal entries above `applied_index` are applied
again. A committed LMDB transaction is in the OS page cache, so it survives
the process being killed (SIGKILL) in either mode of `--fsync`:

- `periodic` (the default): transactions are not fsynced (sync=False); the
  node calls `sync()` once a second, as the journal is flushed once a second
  (replication/raft.py). A power loss may lose that last second here, which
  the journal or the other replicas give back, and, on a file system that
  reorders writes, may damage the environment (LMDB keeps its integrity
  without syncs only if writes reach the disk in order); such a node is wiped
  and catches up from a snapshot.
- `always` (durable_commits=True): each commit fdatasyncs its data pages
  (sync=True) and leaves the meta page to the next commit (metasync=False).
  LMDB documents that this keeps the environment intact and can undo only the
  last transaction, which the journal, flushed before an entry counts towards
  commit, applies again.

Snapshots (replication/raft.py) are taken from a pinned read transaction
(`pin()`, usable on another thread) as a compacted LMDB copy, and installed
by copying such an image into a fresh environment that replaces the live one
(`install_image`). Every use of the environment goes through `_begin`, so a
reader on another thread never meets a closed environment during that swap.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import shutil
import struct
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

import lmdb

from raftsched import limits
from raftsched.core import codec, keys
from raftsched.core.apply import DUE, RUNS, TABLES, Transition
from raftsched.core.tx import JOB_STATE, JOBS, View
from raftsched.errors import InvariantBroken, StorageFull
from raftsched.storage.base import (check_key, check_row, decode_job_to_call, decode_run_hold,
                                    decode_value, encode_value, fsync_dir, job_row,
                                    job_row_with_history, storable_key)

T = TypeVar("T")
log = logging.getLogger("raftsched.storage")

# 2: a run's id (its key) names its job and occurrence (keys.run_id), and the
# runs_by_job index is gone. A state of schema 1 is refused: its run ids and
# its open-runs and tenant indexes name runs by the ids of before.
# 3: the due table is kept as sorted duplicates under each shard (_DUE_DB).
# A state of schema 2 is rewritten so when the node opens it (_migrate_due).
SCHEMA_VERSION = 3
_SCHEMAS_READ = (2, 3)
_SCHEMAS_READ_TEXT = " and ".join(str(v) for v in _SCHEMAS_READ)
_SCHEMA_ADVICE = ("; a data folder of an earlier release whose state this build does not "
                  "read: start the node with an empty --data folder (docs/operations.md, "
                  "\"Restarting and upgrading\")")
_APPLIED = b"applied_index"
_SCHEMA = b"schema_version"
_META = "meta"              # the named database of applied_index and schema_version
_DATA_FILE = "data.mdb"     # LMDB's data file in an environment directory
# Where LMDB 0.9 keeps, in each meta page, its magic, the page size and the
# last page number (see _check_image_pages).
_LMDB_MAGIC = 0xBEEFC0DE
_META_MAGIC_AT = 16
_META_PAGE_SIZE_AT = 40
_META_LAST_PAGE_AT = 136


class SnapshotAborted(Exception):
    """A pinned read was given up because a snapshot install replaces the state."""


class _EnvGuard:
    """Any number of threads may use the environment at once; a swap (a
    snapshot install) waits until none does and holds new users back
    meanwhile. Closing an environment invalidates every transaction open in
    it, so nobody may be inside it then."""

    def __init__(self) -> None:
        # enter/leave take the plain lock (every read does, so it must be cheap);
        # the condition on it is only waited on around a swap.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._users = 0
        self._swapping = False
        # The thread holding an apply batch open (LmdbStore.begin_batch): it
        # is a user until the batch ends, so its own further uses must not
        # wait for a swap, which waits for it.
        self.batch_thread: int | None = None

    def enter(self) -> None:
        with self._lock:
            while self._swapping and threading.get_ident() != self.batch_thread:
                self._cond.wait()
            self._users += 1

    def leave(self) -> None:
        with self._lock:
            self._users -= 1
            if self._swapping and self._users == 0:
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._lock:
            while self._swapping:
                self._cond.wait()
            self._swapping = True
            while self._users:
                self._cond.wait()
        try:
            yield
        finally:
            with self._lock:
                self._swapping = False
                self._cond.notify_all()


# The due table takes its new entries where their shard's entries end: a
# shard's entries are in time order, and most new ones are its latest. Kept
# as one LMDB table keyed (shard, time, kind, id), that is one place per shard
# in the middle of the table, where LMDB splits a full page in half and the
# left half never takes an entry again: pages about half full. So the due
# table is kept as sorted duplicates (MDB_DUPSORT) under each shard's two
# bytes: each shard's entries are a B-tree of their own, whose new entries
# go at its end, where LMDB leaves a full page full. A duplicate is the rest
# of the key (time, kind, id), a NUL and the encoded value, which sorts as
# the keys do, since ids hold no NUL (keys.due_key_storable). Readers see
# (key, value) rows as of any other table.
_DUE_DB = "due_dups"
_DUE_GROUP = 2                                  # a due key's shard
_DUE_ID_AT = keys.DUE_HEAD_BYTES - _DUE_GROUP   # where the id starts in a duplicate
_MAX_DBS = len(TABLES) + 3   # the tables, meta, and schema 2's due table while migrating


def _open_table(env: Any, table: str, txn: Any = None) -> Any:
    if table == DUE:
        return env.open_db(_DUE_DB.encode(), txn=txn, dupsort=True)
    return env.open_db(table.encode(), txn=txn)


def _due_dup(key: bytes, raw: bytes = b"") -> tuple[bytes, bytes]:
    """(LMDB key, duplicate) of the due entry `raw` under `key`; with no
    `raw`, the duplicate's start, which every entry under `key` shares."""
    return key[:_DUE_GROUP], key[_DUE_GROUP:] + b"\0" + raw


def _due_find(cursor: Any, key: bytes) -> bool:
    """Position `cursor` on the due entry stored under `key`; False if none."""
    group, rest = _due_dup(key)
    return cursor.set_range_dup(group, rest) and cursor.value().startswith(rest)


def _due_get(txn: Any, db: Any, key: bytes) -> bytes | None:
    if not keys.due_key_storable(key):
        return None
    cursor = txn.cursor(db)
    return cursor.value()[len(key) - _DUE_GROUP + 1:] if _due_find(cursor, key) else None


def _due_write(txn: Any, db: Any, key: bytes, raw: bytes | None) -> None:
    cursor = txn.cursor(db)
    if _due_find(cursor, key):
        cursor.delete()
    if raw is not None:
        txn.put(*_due_dup(key, raw), db=db)


def _due_row(group: bytes, dup: bytes) -> tuple[bytes, bytes]:
    """(key, raw value) of a stored duplicate."""
    cut = dup.index(b"\0", _DUE_ID_AT)
    return group + dup[:cut], dup[cut + 1:]


def _due_seek(cursor: Any, start: bytes) -> bool:
    """Position `cursor` on the first due entry whose key is >= `start`."""
    group = start[:_DUE_GROUP]
    if len(start) <= _DUE_GROUP:   # every entry of a group is at or after its bytes
        return cursor.set_range(start)
    if cursor.set_range_dup(group, start[_DUE_GROUP:]):
        return True
    if not cursor.set_range(group):   # no entry of `group` at or after `start`
        return False
    return cursor.next_nodup() if cursor.key() == group else True


def _due_items(txn: Any, db: Any, start: bytes = b"", stop: bytes | None = None,
               reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
    """The due entries with start <= key < stop, as (key, raw value), in key
    order or reversed."""
    cursor = txn.cursor(db)
    if not reverse:
        positioned = _due_seek(cursor, start)
    elif stop is not None and _due_seek(cursor, stop):
        positioned = cursor.prev()
    else:
        positioned = cursor.last()
    if not positioned:
        return
    for group, dup in cursor.iterprev() if reverse else cursor.iternext():
        key, raw = _due_row(group, dup)
        if reverse:
            if key < start:
                return
            if stop is not None and key >= stop:
                continue
        else:
            if stop is not None and key >= stop:
                return
            if key < start:
                continue
        yield key, raw


def _rows(txn: Any, dbs: dict[str, Any], table: str) -> Iterable[tuple[bytes, bytes]]:
    """Every (key, raw value) of `table`, in key order."""
    return _due_items(txn, dbs[DUE]) if table == DUE else txn.cursor(db=dbs[table])


class LmdbStore:
    def __init__(self, path: str, *, map_size: int = limits.lmdb_map_size_default,
                 durable_commits: bool = False) -> None:
        # Private whatever the umask: the state holds every tenant's secrets.
        os.makedirs(path, mode=limits.private_dir_mode, exist_ok=True)
        self.path = path
        self.map_size = map_size
        self._durable_commits = durable_commits
        self._guard = _EnvGuard()
        # begin_batch .. end_batch: the write transaction entries share.
        self._batching = False
        self._batch: Any = None
        # apply_commit's write transactions committed since open (GET /metrics).
        self.commits_total = 0
        self._pins: set[PinnedRead] = set()
        self._pins_lock = threading.Lock()
        self._open_env()

    def _open_env(self) -> None:
        """Open the environment at self.path (at start, and after an install swapped
        its data file). Callers other than __init__ hold the guard exclusively."""
        self._env = lmdb.open(self.path, map_size=self.map_size, max_dbs=_MAX_DBS,
                              subdir=True, sync=self._durable_commits, metasync=False,
                              writemap=False, lock=True, readahead=False, max_readers=256,
                              mode=limits.private_dir_mode)   # files: without the x bits
        # LMDB raises the map to the data file's size if that is larger.
        self.map_size = self._env.info()["map_size"]
        self._meta = self._env.open_db(_META.encode())
        with self._env.begin(write=True) as txn:
            raw = txn.get(_SCHEMA, db=self._meta)
            schema = None if raw is None else keys.from_u64(raw)
            if schema is None:
                txn.put(_SCHEMA, keys.u64(SCHEMA_VERSION), db=self._meta)
        if schema is not None and schema not in _SCHEMAS_READ:
            raise InvariantBroken(f"{self.path}: schema version {schema}, "
                                  f"this build reads {_SCHEMAS_READ_TEXT}" + _SCHEMA_ADVICE)
        if schema == 2:
            self._migrate_due()
        self._dbs = {name: _open_table(self._env, name) for name in TABLES}

    def _migrate_due(self) -> None:
        """Rewrite a schema 2 state's due table (a plain LMDB table named
        "due") as schema 3 keeps it (_DUE_DB), schema_migrate_txn_entries
        entries a transaction, then drop it and record schema 3 in one
        transaction. A crash part way leaves schema 2 and a partial copy, which
        the next open clears and makes again."""
        old = self._env.open_db(DUE.encode())
        new = _open_table(self._env, DUE)
        count, start = 0, b""
        try:
            with self._env.begin(write=True) as txn:
                txn.drop(new, delete=False)
            while start is not None:
                with self._env.begin(write=True) as txn:
                    cursor = txn.cursor(old)
                    rows = cursor.iternext() if cursor.set_range(start) else iter(())
                    start = None
                    for done, (key, raw) in enumerate(rows):
                        if done == limits.schema_migrate_txn_entries:
                            start = key
                            break
                        if not keys.due_key_storable(key):
                            raise InvariantBroken(f"{self.path}: a due entry under key {key!r}, "
                                                  f"which this build cannot keep")
                        txn.put(*_due_dup(key, raw), db=new)
                        count += 1
            with self._env.begin(write=True) as txn:
                txn.drop(old, delete=True)
                txn.put(_SCHEMA, keys.u64(SCHEMA_VERSION), db=self._meta)
        except lmdb.MapFullError:
            raise StorageFull(f"{self.path}: the LMDB map is full (max_data_bytes = "
                              f"{self.map_size} bytes) while rewriting the due table for "
                              f"schema {SCHEMA_VERSION}; restart the node with a larger "
                              f"--max-data-bytes") from None
        log.info("%s: state of schema 2 rewritten as schema %d (%d due entries)", self.path,
                     SCHEMA_VERSION, count)

    @contextlib.contextmanager
    def _begin(self, table: str | None = None, *, write: bool = False) -> Iterator[Any]:
        """A transaction on the live environment (default database: `table`, or
        `meta`). self._env, self._dbs and self._meta stay valid inside it."""
        self._guard.enter()
        try:
            db = None if table is None else self._meta if table == _META else self._dbs[table]
            with self._env.begin(db=db, write=write) as txn:
                yield txn
        finally:
            self._guard.leave()

    def get(self, table: str, key: bytes) -> Any | None:
        if not storable_key(key):
            return None   # LMDB would raise on an empty key; no record has such a key
        # As _begin, inline: this is the hottest read (apply, every handler).
        self._guard.enter()
        try:
            with self._env.begin(db=self._dbs[table]) as txn:
                raw = _due_get(txn, self._dbs[DUE], key) if table == DUE else txn.get(key)
                if table == JOBS and raw is not None:
                    return _merged_job(txn, self._dbs, key, raw)
        finally:
            self._guard.leave()
        return None if raw is None else decode_value(table, raw, key)

    def pending_job_stored(self, key: bytes) -> Any | None:
        """A job's record as stored (decoded, not restored: core/compact.py)
        while its state is still in it (no state record), else None."""
        if not storable_key(key):
            return None
        with self._begin(JOBS) as txn:
            raw = txn.get(key)
            if raw is None or txn.get(key, db=self._dbs[JOB_STATE]) is not None:
                return None
        return codec.unpack_record(raw)

    def job_to_call(self, job_id: str) -> dict | None:
        key = keys.job_key(job_id)
        if not storable_key(key):
            return None
        self._guard.enter()
        try:
            with self._env.begin(db=self._dbs[JOBS]) as txn:
                raw = txn.get(key)
                if raw is None:
                    return None
                state = txn.get(key, db=self._dbs[JOB_STATE])
        finally:
            self._guard.leave()
        return decode_job_to_call(raw, key, state)

    def run_hold(self, run_id: str) -> tuple[Any, Any, Any, Any] | None:
        key = run_id.encode()
        if not storable_key(key):
            return None
        self._guard.enter()
        try:
            with self._env.begin(db=self._dbs[RUNS]) as txn:
                raw = txn.get(key)
        finally:
            self._guard.leave()
        return None if raw is None else decode_run_hold(raw, key)

    def applied_index(self) -> int:
        self._guard.enter()
        try:
            with self._env.begin(db=self._meta) as txn:
                raw = txn.get(_APPLIED)
        finally:
            self._guard.leave()
        return 0 if raw is None else keys.from_u64(raw)

    def commit(self, transition: Transition, index: int) -> None:
        try:
            self._commit(transition, index)
        except lmdb.MapFullError:
            # The transaction was aborted: nothing of this entry was written.
            raise StorageFull(f"the LMDB map is full (max_data_bytes = {self.map_size} bytes, "
                              f"{self.used_bytes()} used) and cannot hold this entry's writes; "
                              f"restart the node with a larger --max-data-bytes") from None

    def _commit(self, transition: Transition, index: int) -> None:
        with self._begin(write=True) as txn:
            self._check_index(txn, index)
            self._write(txn, transition, index)

    def _applied_in(self, txn: Any) -> int:
        raw = txn.get(_APPLIED, db=self._meta)
        return 0 if raw is None else keys.from_u64(raw)

    def _check_index(self, txn: Any, index: int) -> None:
        current = self._applied_in(txn)
        if index <= current:
            raise InvariantBroken(f"commit of index {index} at applied_index {current}")

    def _write(self, txn: Any, transition: Transition, index: int) -> None:
        checked = transition.keys_checked   # by Tx as apply made them (core/tx.py)
        for table, key, value in transition.writes:
            db = self._dbs[table]
            if not checked:
                check_key(table, key)   # raising here aborts the whole transaction
            if table == DUE:
                raw = None if value is None else encode_value(table, value, key)
                if raw is not None:
                    check_row(table, key, raw)
                _due_write(txn, db, key, raw)
            elif value is None:
                txn.delete(key, db=db)
            else:
                txn.put(key, encode_value(table, value, key), db=db)
        txn.put(_APPLIED, keys.u64(index), db=self._meta)

    def apply_commit(self, index: int, apply: Callable[[View], T], *,
                     skip_applied: bool = False) -> T | None:
        """Run `apply` over a view of the state and commit the transition it
        returns (with the tag: (tag, transition)) as `index`, in one LMDB
        write transaction: the reads of a whole entry share it, where each
        `get` would open its own. Only the Raft thread writes; readers on
        other threads go on seeing the last committed state. `skip_applied`:
        an index at or below applied_index is answered None, unapplied (read
        in the same transaction: no read transaction of its own per entry).
        Between begin_batch and end_batch the entries share one transaction,
        committed by end_batch."""
        try:
            if self._batching:
                try:
                    return self._apply_in(self._batch_txn(), index, apply, skip_applied)
                except BaseException:
                    self._abort_batch()   # nothing of the failed entry's is ever committed
                    raise
            with self._begin(write=True) as txn:
                result = self._apply_in(txn, index, apply, skip_applied)
            self.commits_total += 1
            return result
        except lmdb.MapFullError:
            raise self._map_full() from None

    def _apply_in(self, txn: Any, index: int, apply: Callable[[View], T],
                  skip_applied: bool) -> T | None:
        if skip_applied and index <= self._applied_in(txn):
            return None
        self._check_index(txn, index)
        result = apply(_TxnView(txn, self._dbs))
        self._write(txn, result[1], index)
        return result

    def _map_full(self) -> StorageFull:
        return StorageFull(f"the LMDB map is full (max_data_bytes = {self.map_size} bytes, "
                           f"{self.used_bytes()} used) and cannot hold this entry's writes; "
                           f"restart the node with a larger --max-data-bytes")

    # An LMDB commit costs about 100 us of the Raft thread (its dirty pages
    # written), more than a small entry's apply; a tick that applies several
    # entries commits them together (docs/benchmarks.md, "One LMDB
    # transaction for several entries").
    def begin_batch(self) -> None:
        """Raft thread: the entries apply_commit applies from now on go into
        one write transaction (opened at the first of them), which end_batch
        commits. Readers see none of them until then; whoever acts on them
        (effects, answers) must wait for end_batch too."""
        self._batching = True

    def end_batch(self) -> None:
        """Raft thread: commit the batch's transaction, if it has one. A
        failed commit raises (StorageFull for a full map), and leaves no batch."""
        txn = self._batch
        self._batching, self._batch = False, None
        if txn is None:
            return
        try:
            txn.commit()
            self.commits_total += 1
        except lmdb.MapFullError:
            raise self._map_full() from None
        finally:
            self._guard.batch_thread = None
            self._guard.leave()

    def _abort_batch(self) -> None:
        txn, self._batch = self._batch, None
        if txn is not None:
            try:
                txn.abort()
            finally:
                self._guard.batch_thread = None
                self._guard.leave()

    def _batch_txn(self) -> Any:
        if self._batch is None:
            self._guard.enter()
            self._guard.batch_thread = threading.get_ident()
            try:
                self._batch = self._env.begin(write=True)
            except BaseException:
                self._guard.batch_thread = None
                self._guard.leave()
                raise
        return self._batch

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]:
        out: list[tuple[bytes, Any]] = []
        with self._begin(table) as txn:
            cursor = txn.cursor()
            if table == DUE:
                items = _due_items(txn, self._dbs[DUE], start, stop, reverse)
            elif reverse:
                items = self._reverse(cursor, start, stop)
            else:
                items = cursor.iternext() if cursor.set_range(start) else iter(())
            for key, raw in items:
                if not reverse and stop is not None and key >= stop:
                    break
                if reverse and key < start:
                    break
                out.append((bytes(key), _merged_job(txn, self._dbs, bytes(key), raw)
                            if table == JOBS else decode_value(table, raw, bytes(key))))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def scan_jobs_with_history(self, *, start: bytes = b"",
                               limit: int) -> list[tuple[bytes, dict | None]]:
        out: list[tuple[bytes, dict | None]] = []
        with self._begin(JOBS) as txn:
            cursor = txn.cursor(db=self._dbs[JOBS])
            items = cursor.iternext() if cursor.set_range(start) else iter(())
            states = self._dbs[JOB_STATE]
            for key, raw in itertools.islice(items, limit):
                key = bytes(key)
                out.append((key, job_row_with_history(key, raw, txn.get(key, db=states))))
        return out

    @staticmethod
    def _reverse(cursor: Any, start: bytes, stop: bytes | None) -> Iterable:
        if stop is None:
            positioned = cursor.last()
        elif cursor.set_range(stop):
            positioned = cursor.prev()
        else:
            positioned = cursor.last()
        return cursor.iterprev() if positioned else iter(())

    def raw_items(self) -> tuple[int, list[tuple[str, bytes, bytes]]]:
        with self._begin() as txn:
            raw = txn.get(_APPLIED, db=self._meta)
            index = 0 if raw is None else keys.from_u64(raw)
            items = [(table, bytes(k), bytes(v)) for table in TABLES
                     for k, v in _rows(txn, self._dbs, table)]
        return index, items

    def replace_all(self, applied_index: int, items: Iterable[tuple[str, bytes, bytes]]) -> None:
        with self._begin(write=True) as txn:
            for db in self._dbs.values():
                txn.drop(db, delete=False)
            for table, key, value in items:
                check_key(table, key)
                if table == DUE:
                    check_row(table, key, value)
                    _due_write(txn, self._dbs[DUE], key, value)
                else:
                    txn.put(key, value, db=self._dbs[table])
            txn.put(_APPLIED, keys.u64(applied_index), db=self._meta)

    def used_bytes(self) -> int:
        """Bytes of the map the state's B-trees occupy now: the branch, leaf and
        overflow pages of every database (the named ones, the main one that
        lists them, and meta). Pages freed by deletes are not counted: LMDB
        reuses them. Reads each database's header only, so it is cheap."""
        with self._begin() as txn:
            stats = [txn.stat(db) for db in (self._meta, *self._dbs.values())]
            stats.append(self._env.stat())
        pages = sum(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"] for st in stats)
        return pages * stats[-1]["psize"]

    def file_bytes(self) -> int:
        """Size of the data file: the high-water mark of pages ever used (the
        file does not shrink; freed pages are reused first)."""
        return os.path.getsize(os.path.join(self.path, "data.mdb"))

    def pin(self) -> "PinnedRead":
        """A consistent read of the whole state as of now, for a snapshot or a
        digest on another thread. Close it promptly: LMDB keeps every page it
        sees until then, so the data file grows while it is open."""
        self._guard.enter()
        try:
            txn = self._env.begin(buffers=False)
            raw = txn.get(_APPLIED, db=self._meta)
        except BaseException:
            self._guard.leave()
            raise
        pinned = PinnedRead(self, txn, 0 if raw is None else keys.from_u64(raw))
        with self._pins_lock:
            self._pins.add(pinned)
        return pinned

    def _unpin(self, pinned: "PinnedRead") -> None:
        with self._pins_lock:
            self._pins.discard(pinned)
        self._guard.leave()

    def install_image(self, source: str, offset: int, length: int) -> int:
        """Replace the whole state with the LMDB image stored in `source` at
        [offset, offset + length) (a compacted copy, see PinnedRead.copy_to);
        return the applied_index it holds. The image is copied beside the live
        environment, fdatasynced and checked; then, with no reader inside, the
        live environment is closed, the new data file renamed over its data
        file (one atomic step on disk: a crash leaves the old state or the new)
        and opened again. Pinned reads still open are aborted first."""
        staging = self.path.rstrip("/") + ".install"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging, mode=limits.private_dir_mode)
        try:
            image = os.path.join(staging, _DATA_FILE)
            _copy_range(source, offset, length, image)
            applied = self._check_image(staging)
            self._abort_pins()
            with self._guard.exclusive():
                self._env.close()
                os.replace(image, os.path.join(self.path, _DATA_FILE))
                fsync_dir(self.path)
                self._open_env()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return applied

    def _check_image(self, directory: str) -> int:
        """The applied_index of the environment in `directory`, after checking
        that its file holds every page it names and this build reads its schema."""
        _check_image_pages(os.path.join(directory, _DATA_FILE))
        env = lmdb.open(directory, map_size=self.map_size, max_dbs=_MAX_DBS,
                        subdir=True, readonly=True, lock=False, readahead=False)
        try:
            meta = env.open_db(_META.encode(), create=False)
            with env.begin(db=meta) as txn:
                schema, applied = txn.get(_SCHEMA), txn.get(_APPLIED)
        finally:
            env.close()
        if schema is None or keys.from_u64(schema) not in _SCHEMAS_READ:
            raise InvariantBroken(f"snapshot image: schema version "
                                  f"{None if schema is None else keys.from_u64(schema)}, "
                                  f"this build reads {_SCHEMAS_READ_TEXT}")
        return 0 if applied is None else keys.from_u64(applied)

    def sync(self) -> None:
        with self._begin():
            self._env.sync(True)

    def _abort_pins(self) -> None:
        with self._pins_lock:
            for pinned in self._pins:
                pinned.abort()

    def close(self) -> None:
        self._abort_pins()
        with self._guard.exclusive():
            self._env.sync(True)
            self._env.close()


def _merged_job(txn: Any, dbs: dict[str, Any], key: bytes, raw: bytes) -> dict:
    """A job record with its state record laid over it (core/tx.py JOB_STATE)."""
    return job_row(key, raw, txn.get(key, db=dbs[JOB_STATE]))


class _TxnView:
    """The state as one transaction sees it (core/tx.py View)."""

    __slots__ = ("_txn", "_dbs")

    def __init__(self, txn: Any, dbs: dict[str, Any]) -> None:
        self._txn, self._dbs = txn, dbs

    def get(self, table: str, key: bytes) -> Any | None:
        if not storable_key(key):
            return None
        raw = _due_get(self._txn, self._dbs[DUE], key) if table == DUE \
            else self._txn.get(key, db=self._dbs[table])
        return None if raw is None else decode_value(table, raw, key)

    def has(self, table: str, key: bytes) -> bool:
        """Whether `get` would find a record (core/tx.py View)."""
        if not storable_key(key):
            return False
        if table == DUE:
            return _due_get(self._txn, self._dbs[DUE], key) is not None
        return self._txn.get(key, db=self._dbs[table]) is not None

    def get_stored(self, table: str, key: bytes) -> Any | None:
        """The record as stored, decoded but not restored (core/tx.py View)."""
        if table == DUE or not storable_key(key):
            return None
        raw = self._txn.get(key, db=self._dbs[table])
        return None if raw is None else codec.unpack_record(raw)


class PinnedRead:
    """One read transaction, pinned: `applied_index` and every record as of the
    moment `LmdbStore.pin()` was called. It may be used on another thread than
    the one that pinned it (py-lmdb opens environments with MDB_NOTLS), by one
    thread at a time."""

    def __init__(self, store: LmdbStore, txn: Any, applied_index: int) -> None:
        self._store = store
        self._txn = txn
        self.applied_index = applied_index
        self._aborted = threading.Event()
        self._closed = False

    def abort(self) -> None:
        """Ask the thread iterating this read to give up (a snapshot install
        replaces the state); items() then raises SnapshotAborted."""
        self._aborted.set()

    def items(self) -> Iterator[tuple[str, bytes, bytes]]:
        """Every (table, key, raw value), tables in TABLES order, keys in order."""
        seen = 0
        for table in TABLES:
            for key, value in _rows(self._txn, self._store._dbs, table):
                seen += 1
                if seen % limits.snapshot_abort_check_records == 0 and self._aborted.is_set():
                    raise SnapshotAborted("a snapshot install replaces the state")
                yield table, key, value

    def copy_to(self, fd: int) -> None:
        """Write this read's state to `fd`, from its current position, as a
        compacted LMDB environment (free pages left out). LMDB writes it from
        its own thread with the GIL released, so the Raft thread and the event
        loop run on meanwhile."""
        self._store._env.copyfd(fd, compact=True, txn=self._txn)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._txn.abort()
        finally:
            self._store._unpin(self)

    def __enter__(self) -> "PinnedRead":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_range(source: str, offset: int, length: int, target: str) -> None:
    """Copy source[offset:offset + length] to a new file `target`, fdatasynced.
    copy_file_range moves the bytes inside the kernel, without the GIL."""
    with open(source, "rb") as src, open(target, "wb") as dst:
        done = 0
        while done < length:
            try:
                moved = os.copy_file_range(src.fileno(), dst.fileno(), length - done,
                                           offset + done)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                src.seek(offset + done)
                moved = dst.write(src.read(min(limits.snapshot_copy_chunk_bytes, length - done)))
            if moved == 0:
                raise InvariantBroken(f"{source}: the snapshot image ends after {done} of "
                                      f"{length} bytes")
            done += moved
        dst.flush()
        os.fdatasync(dst.fileno())


def _check_image_pages(path: str) -> None:
    """Refuse an LMDB data file shorter than its newest meta page says: LMDB
    maps the file, and reading a page past its end kills the process (SIGBUS).
    LMDB 0.9's two meta pages start each page (the first at 0, the second one
    page size later): page header (16 bytes), magic, version, address, map
    size, the two database records (the first one's pad holds the page size),
    the last page number and the transaction id."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        first = fh.read(_META_LAST_PAGE_AT + 16)
        if len(first) < _META_LAST_PAGE_AT + 16:
            raise InvariantBroken(f"snapshot image: {size} bytes is no LMDB file")
        page_bytes = struct.unpack_from("<I", first, _META_PAGE_SIZE_AT)[0]
        fh.seek(page_bytes)
        second = fh.read(_META_LAST_PAGE_AT + 16)
    metas = []
    for page in (first, second):
        if len(page) == _META_LAST_PAGE_AT + 16 and \
                struct.unpack_from("<I", page, _META_MAGIC_AT)[0] == _LMDB_MAGIC:
            last_page, txn_id = struct.unpack_from("<QQ", page, _META_LAST_PAGE_AT)
            metas.append((txn_id, last_page))
    if not metas or not 512 <= page_bytes <= 65536:
        raise InvariantBroken(f"snapshot image: no LMDB meta page in {size} bytes")
    _, last_page = max(metas)
    if (last_page + 1) * page_bytes > size:
        raise InvariantBroken(f"snapshot image: {size} bytes, its pages need "
                              f"{(last_page + 1) * page_bytes}")


class StateFileRead:
    """A consistent read of the state in the LMDB environment at `path`, from
    another process than the node's, running or stopped (`raftsched backup`).
    LMDB lets readers in other processes share an environment with its one
    writer, so the node goes on committing meanwhile. The environment is
    opened read-only: a backup never writes to a node's state."""

    def __init__(self, path: str) -> None:
        data_file = os.path.join(path, _DATA_FILE)
        if not os.path.isfile(data_file):
            raise FileNotFoundError(f"{data_file}: no LMDB state here")
        try:
            self._begin_read(path, data_file)
        except lmdb.Error as exc:
            raise InvariantBroken(f"{path}: cannot read the LMDB state: {exc}") from exc
        try:
            self.applied_index = self._read_meta(path)
        except BaseException:
            self.close()
            raise

    def _begin_read(self, path: str, data_file: str) -> None:
        for _ in range(3):
            # The map must cover every page the read sees: the file's size now
            # does, unless the node grows the file before the read begins.
            self._env = lmdb.open(path, map_size=max(os.path.getsize(data_file), 1),
                                  max_dbs=_MAX_DBS, subdir=True, readonly=True,
                                  lock=True, readahead=False, create=False)
            try:
                self._txn = self._env.begin(buffers=False)
                return
            except lmdb.MapResizedError:
                self._env.close()
        raise InvariantBroken(f"{path}: the state kept growing past the map while opened")

    def _read_meta(self, path: str) -> int:
        meta = self._env.open_db(_META.encode(), txn=self._txn, create=False)
        schema, applied = self._txn.get(_SCHEMA, db=meta), self._txn.get(_APPLIED, db=meta)
        if schema is None or keys.from_u64(schema) not in _SCHEMAS_READ:
            raise InvariantBroken(f"{path}: schema version "
                                  f"{None if schema is None else keys.from_u64(schema)}, "
                                  f"this build reads {_SCHEMAS_READ_TEXT}")
        return 0 if applied is None else keys.from_u64(applied)

    def copy_to(self, fd: int) -> None:
        """Write the state as of the read to `fd` as a compacted LMDB environment."""
        self._env.copyfd(fd, compact=True, txn=self._txn)

    def close(self) -> None:
        self._txn.abort()
        self._env.close()
