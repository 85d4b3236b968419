"""The LMDB adapter: the one module that imports lmdb.

One environment per node, one named database per replicated table, plus
`meta` (applied_index, schema version). Keys are big-endian so byte order is
time order.

Durability: writes are not fsynced per transaction (sync=False). A committed
transaction is in the OS page cache, so it survives the process being killed
(SIGKILL); `sync()` is called about once a second, which is the same bound
pysyncobj's own journal gives against a power loss (it flushes its mmap once a
second). Raft replicas on other machines cover a single machine's loss.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import lmdb

from raftsched.core import codec, keys
from raftsched.core.apply import TABLES, Transition
from raftsched.errors import InvariantBroken

SCHEMA_VERSION = 1
_APPLIED = b"applied_index"
_SCHEMA = b"schema_version"
# A sparse file: this is address space, not disk, on Linux.
map_size_default = 8 * 1024 ** 3


class LmdbStore:
    def __init__(self, path: str, *, map_size: int = map_size_default) -> None:
        os.makedirs(path, exist_ok=True)
        self._env = lmdb.open(path, map_size=map_size, max_dbs=len(TABLES) + 2, subdir=True,
                              sync=False, metasync=False, writemap=False, lock=True,
                              readahead=False, max_readers=256)
        self._meta = self._env.open_db(b"meta")
        self._dbs = {name: self._env.open_db(name.encode()) for name in TABLES}
        with self._env.begin(write=True) as txn:
            schema = txn.get(_SCHEMA, db=self._meta)
            if schema is None:
                txn.put(_SCHEMA, keys.u64(SCHEMA_VERSION), db=self._meta)
            elif keys.from_u64(schema) != SCHEMA_VERSION:
                raise InvariantBroken(f"{path}: schema version {keys.from_u64(schema)}, "
                                      f"this build reads {SCHEMA_VERSION}")

    def get(self, table: str, key: bytes) -> Any | None:
        with self._env.begin(db=self._dbs[table]) as txn:
            raw = txn.get(key)
        return None if raw is None else codec.unpack(raw)

    def applied_index(self) -> int:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(_APPLIED)
        return 0 if raw is None else keys.from_u64(raw)

    def commit(self, transition: Transition, index: int) -> None:
        with self._env.begin(write=True) as txn:
            raw = txn.get(_APPLIED, db=self._meta)
            current = 0 if raw is None else keys.from_u64(raw)
            if index <= current:
                raise InvariantBroken(f"commit of index {index} at applied_index {current}")
            for table, key, value in transition.writes:
                db = self._dbs[table]
                if value is None:
                    txn.delete(key, db=db)
                else:
                    txn.put(key, codec.pack(value), db=db)
            txn.put(_APPLIED, keys.u64(index), db=self._meta)

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]:
        out: list[tuple[bytes, Any]] = []
        with self._env.begin(db=self._dbs[table]) as txn:
            cursor = txn.cursor()
            if reverse:
                items = self._reverse(cursor, start, stop)
            else:
                items = cursor.iternext() if cursor.set_range(start) else iter(())
            for key, raw in items:
                if not reverse and stop is not None and key >= stop:
                    break
                if reverse and key < start:
                    break
                out.append((bytes(key), codec.unpack(raw)))
                if limit is not None and len(out) >= limit:
                    break
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
        with self._env.begin() as txn:
            raw = txn.get(_APPLIED, db=self._meta)
            index = 0 if raw is None else keys.from_u64(raw)
            items = [(table, bytes(k), bytes(v)) for table in TABLES
                     for k, v in txn.cursor(db=self._dbs[table])]
        return index, items

    def replace_all(self, applied_index: int, items: Iterable[tuple[str, bytes, bytes]]) -> None:
        with self._env.begin(write=True) as txn:
            for db in self._dbs.values():
                txn.drop(db, delete=False)
            for table, key, value in items:
                txn.put(key, value, db=self._dbs[table])
            txn.put(_APPLIED, keys.u64(applied_index), db=self._meta)

    def sync(self) -> None:
        self._env.sync(True)

    def close(self) -> None:
        self._env.sync(True)
        self._env.close()
