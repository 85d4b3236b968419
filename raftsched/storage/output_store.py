"""The per-node output store: run output kept off the Raft log.

What it keeps: one record per (run_id, attempt) holding the attempt's output as
the executor produced it (stdout, stderr, the head of an HTTP response body,
what was truncated, exit_code, http_status, holder), plus "v", "attempt" and
"stored_ms". The node that received the output keeps it; the replicated run
record only names that node (`output_node`). Nothing here is replicated,
digested or part of a snapshot, and its directory (e.g. <data_dir>/output) is
separate from the replicated state.

Contract:
  put(run_id, attempt, record, now_ms, tenant) -> bool
      Stores the record, replacing an earlier one of the same (run_id, attempt)
      (a completion reported twice), then deletes the tenant's oldest records
      until the tenant's bytes <= tenant_bytes_max, then the oldest records of
      all until bytes <= bytes_max, in the same transaction: both bounds hold
      after every put. Returns whether the record is stored (False: it alone
      is larger than a bound, or the LMDB map is full; output is best effort).
      The tenant bound keeps one tenant (or one worker posting its outputs)
      from filling the node's store and so evicting every other tenant's
      output: at its bound a tenant loses its own oldest output.
  get(run_id) -> list[dict]
      Every stored attempt of the run, ascending attempt; [] if none.
  prune(now_ms) -> int
      Deletes records stored more than retention_s before now_ms, then the
      oldest until bytes <= bytes_max; returns how many it deleted.
  delete_runs(run_ids) -> int
      Deletes every record of these runs (removed from the replicated state);
      returns how many it deleted.
  stats() -> {"records": n, "bytes": total}
      `bytes` is the sum of the packed record sizes, kept exact in the write
      transaction of every put and delete. LMDB keys and page overhead come
      on top, so the directory is larger than `bytes` (the map leaves room).

Layout, one LMDB environment with four named databases:
  by_run     run_id + b"\\x00" + u16 attempt -> packed record (with its "tenant")
  by_time    u64 stored_ms + <by_run key>   -> b""   (oldest first, for pruning)
  by_tenant  tenant + b"\\x00" + u64 stored_ms + <by_run key> -> b""
             (a tenant's oldest first, for its bound)
  meta       bytes_total (u64), schema_version (u64),
             b"tenant_bytes\\x00" + tenant -> the tenant's bytes (u64)
A record stored before tenants were counted has no "tenant": it counts
towards bytes_max only.
Integers are big-endian, so byte order is attempt order and time order. The NUL
after run_id ends the prefix, so run_a never sees run_ab's records; a run_id
containing NUL is refused.

Durability: best effort, by design. Writes are not fsynced (sync=False,
metasync=False): a committed put is in the OS page cache and survives the
process being killed, the last seconds of output may be lost on a power loss,
and all of it is lost with the node's disk. That is the documented trade for
keeping output (up to limits.output_bytes_max per stream per attempt) out of
Raft, where every node would store and replay it. Losing output never changes
a run's state.

Threads: put and prune write; LMDB's lock serializes write transactions, and
py-lmdb releases the GIL while one waits. get and stats may run on other
threads at the same time: each reads in its own read transaction, sees the
last committed state and never blocks the writer (py-lmdb opens the
environment with MDB_NOTLS, so a read transaction is not tied to a thread).
close() must come after every other call has returned.
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Any

import lmdb

from raftsched import limits
from raftsched.core import codec
from raftsched.errors import InvariantBroken

log = logging.getLogger("raftsched.output")

RECORD_VERSION = 1
SCHEMA_VERSION = 1
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_TOTAL = b"bytes_total"
_SCHEMA = b"schema_version"
_TENANT_BYTES = b"tenant_bytes\x00"
_RESERVED = ("v", "attempt", "stored_ms", "tenant")


class OutputStore:
    def __init__(self, path: str, *, bytes_max: int = limits.output_store_bytes_max,
                 tenant_bytes_max: int = limits.output_store_tenant_bytes_max,
                 retention_s: float = limits.output_retention_s,
                 map_size: int | None = None) -> None:
        """map_size None: limits.output_map_size_factor * bytes_max, at least
        limits.output_map_bytes_min."""
        if bytes_max <= 0:
            raise ValueError(f"bytes_max must be positive, not {bytes_max}")
        if retention_s <= 0:
            raise ValueError(f"retention_s must be positive, not {retention_s}")
        if tenant_bytes_max <= 0:
            raise ValueError(f"tenant_bytes_max must be positive, not {tenant_bytes_max}")
        self._bytes_max = bytes_max
        self._tenant_bytes_max = tenant_bytes_max
        self._retention_ms = int(retention_s * 1000)
        if map_size is None:
            map_size = max(limits.output_map_size_factor * bytes_max, limits.output_map_bytes_min)
        # Private whatever the umask: outputs may hold what commands printed.
        os.makedirs(path, mode=limits.private_dir_mode, exist_ok=True)
        self._env = lmdb.open(path, map_size=map_size, max_dbs=4, subdir=True, sync=False,
                              metasync=False, writemap=False, lock=True, readahead=False,
                              max_readers=256, mode=limits.private_dir_mode)
        self._by_run = self._env.open_db(b"by_run")
        self._by_time = self._env.open_db(b"by_time")
        self._by_tenant = self._env.open_db(b"by_tenant")
        self._meta = self._env.open_db(b"meta")
        self._closed = False
        self._check_schema(path)
        # bytes_max may be lower than when the records were stored; restore the
        # bound now rather than in the first put's transaction.
        self._prune_batched(cutoff_ms=None)

    def put(self, run_id: str, attempt: int, record: dict, *, now_ms: int,
            tenant: str = "") -> bool:
        """`tenant`: whose output it is ("" for output no tenant is known of,
        counted as one more tenant)."""
        run_key = _run_key(run_id, attempt)
        tenant_prefix = _tenant_prefix(tenant)
        packed = codec.pack(_stamped(record, attempt, now_ms, tenant))
        try:
            with self._env.begin(write=True) as txn:
                total = self._total(txn) - self._remove(txn, run_key) + len(packed)
                txn.put(run_key, packed, db=self._by_run)
                txn.put(_U64.pack(now_ms) + run_key, b"", db=self._by_time)
                txn.put(tenant_prefix + _U64.pack(now_ms) + run_key, b"", db=self._by_tenant)
                self._add_tenant_bytes(txn, tenant, len(packed))
                # Unbounded count, but each put overflows by at most its own size.
                total = self._evict_tenant(txn, tenant, total)
                total, _ = self._evict(txn, total, cutoff_ms=None, count_max=None)
                txn.put(_TOTAL, _U64.pack(total), db=self._meta)
                kept = txn.get(run_key, db=self._by_run) is not None
        except lmdb.MapFullError:
            log.warning("output of %s attempt %d dropped: the output store's map is full",
                        run_id, attempt)
            return False
        return kept

    def get(self, run_id: str) -> list[dict]:
        prefix = _run_prefix(run_id)
        out: list[dict] = []
        with self._env.begin(db=self._by_run) as txn:
            cursor = txn.cursor()
            items = cursor.iternext() if cursor.set_range(prefix) else iter(())
            for key, raw in items:
                if not key.startswith(prefix):
                    break
                out.append(_checked(codec.unpack(raw)))
        return out

    def delete_runs(self, run_ids: list[str]) -> int:
        """Delete every attempt's record of these runs (runs removed from the
        replicated state, whose output nothing can ask for); returns how many."""
        deleted = 0
        with self._env.begin(write=True) as txn:
            total = self._total(txn)
            for run_id in run_ids:
                prefix = _run_prefix(run_id)
                with txn.cursor(db=self._by_run) as cursor:
                    found = cursor.set_range(prefix)
                    run_keys = []
                    while found and cursor.key().startswith(prefix):
                        run_keys.append(bytes(cursor.key()))
                        found = cursor.next()
                for run_key in run_keys:
                    total -= self._remove(txn, run_key)
                    deleted += 1
            if deleted:
                txn.put(_TOTAL, _U64.pack(total), db=self._meta)
        return deleted

    def prune(self, *, now_ms: int) -> int:
        return self._prune_batched(cutoff_ms=now_ms - self._retention_ms)

    def stats(self) -> dict:
        with self._env.begin() as txn:
            return {"records": txn.stat(self._by_run)["entries"], "bytes": self._total(txn)}

    def tenant_bytes(self, tenant: str) -> int:
        """Bytes of `tenant`'s records (packed sizes, as `bytes` in stats())."""
        with self._env.begin() as txn:
            return self._tenant_total(txn, tenant)

    def close(self) -> None:
        """Flush to disk and close; a second close does nothing."""
        if self._closed:
            return
        self._closed = True
        self._env.sync(True)
        self._env.close()

    def _check_schema(self, path: str) -> None:
        with self._env.begin(write=True) as txn:
            raw = txn.get(_SCHEMA, db=self._meta)
            if raw is None:
                txn.put(_SCHEMA, _U64.pack(SCHEMA_VERSION), db=self._meta)
            elif _U64.unpack(raw)[0] != SCHEMA_VERSION:
                raise InvariantBroken(f"{path}: output store schema {_U64.unpack(raw)[0]}, "
                                      f"this build reads {SCHEMA_VERSION}")

    def _prune_batched(self, *, cutoff_ms: int | None) -> int:
        """Evict in transactions of at most limits.output_prune_txn_records_max deletions."""
        deleted_all = 0
        while True:
            with self._env.begin(write=True) as txn:
                total, deleted = self._evict(txn, self._total(txn), cutoff_ms=cutoff_ms,
                                             count_max=limits.output_prune_txn_records_max)
                if deleted:
                    txn.put(_TOTAL, _U64.pack(total), db=self._meta)
            deleted_all += deleted
            if deleted < limits.output_prune_txn_records_max:
                return deleted_all

    def _evict(self, txn: Any, total: int, *, cutoff_ms: int | None,
               count_max: int | None) -> tuple[int, int]:
        """Delete oldest first while the oldest was stored before cutoff_ms or
        total > bytes_max. Expired records are a prefix of by_time, so this is
        "age first, then size". Returns (total, deleted)."""
        deleted = 0
        while count_max is None or deleted < count_max:
            oldest = self._oldest(txn)
            if oldest is None:
                break
            expired = cutoff_ms is not None and _U64.unpack_from(oldest)[0] < cutoff_ms
            if not expired and total <= self._bytes_max:
                break
            size = self._remove(txn, oldest[_U64.size:])
            # Without this the loop would find the same dangling entry forever.
            if size == 0:
                raise InvariantBroken(f"output by_time entry {oldest!r} has no record")
            total -= size
            deleted += 1
        return total, deleted

    def _evict_tenant(self, txn: Any, tenant: str, total: int) -> int:
        """Delete the tenant's oldest records while it holds more than
        tenant_bytes_max; returns the store's total."""
        prefix = _tenant_prefix(tenant)
        while self._tenant_total(txn, tenant) > self._tenant_bytes_max:
            with txn.cursor(db=self._by_tenant) as cursor:
                found = cursor.set_range(prefix)
                oldest = bytes(cursor.key()) if found else b""
            if not oldest.startswith(prefix):
                raise InvariantBroken(f"output of tenant {tenant!r} counts "
                                      f"{self._tenant_total(txn, tenant)} bytes but has no record")
            size = self._remove(txn, oldest[len(prefix) + _U64.size:])
            if size == 0:
                raise InvariantBroken(f"output by_tenant entry {oldest!r} has no record")
            total -= size
        return total

    def _add_tenant_bytes(self, txn: Any, tenant: str, delta: int) -> None:
        key = _TENANT_BYTES + tenant.encode()
        count = self._tenant_total(txn, tenant) + delta
        if count > 0:
            txn.put(key, _U64.pack(count), db=self._meta)
        else:
            txn.delete(key, db=self._meta)   # a tenant's count goes with its last record

    def _tenant_total(self, txn: Any, tenant: str) -> int:
        raw = txn.get(_TENANT_BYTES + tenant.encode(), db=self._meta)
        return 0 if raw is None else _U64.unpack(raw)[0]

    def _oldest(self, txn: Any) -> bytes | None:
        with txn.cursor(db=self._by_time) as cursor:
            return bytes(cursor.key()) if cursor.first() else None

    def _remove(self, txn: Any, run_key: bytes) -> int:
        """Delete the record at run_key and its by_time entry; return its size (0 if absent)."""
        raw = txn.get(run_key, db=self._by_run)
        if raw is None:
            return 0
        record = _checked(codec.unpack(raw))
        stored_ms = record["stored_ms"]
        txn.delete(run_key, db=self._by_run)
        if not txn.delete(_U64.pack(stored_ms) + run_key, db=self._by_time):
            raise InvariantBroken(f"output record {run_key!r} has no by_time entry")
        tenant = record.get("tenant")
        if tenant is not None:   # (records from before tenants were counted have none)
            if not txn.delete(_tenant_prefix(tenant) + _U64.pack(stored_ms) + run_key,
                              db=self._by_tenant):
                raise InvariantBroken(f"output record {run_key!r} has no by_tenant entry")
            self._add_tenant_bytes(txn, tenant, -len(raw))
        return len(raw)

    def _total(self, txn: Any) -> int:
        raw = txn.get(_TOTAL, db=self._meta)
        return 0 if raw is None else _U64.unpack(raw)[0]


def _run_prefix(run_id: str) -> bytes:
    encoded = run_id.encode()
    if b"\x00" in encoded:
        raise ValueError(f"run_id {run_id!r} contains NUL, which ends the key prefix")
    if len(encoded) > limits.output_run_id_bytes_max:
        raise ValueError(f"run_id is {len(encoded)} bytes, "
                         f"at most {limits.output_run_id_bytes_max}")
    return encoded + b"\x00"


def _run_key(run_id: str, attempt: int) -> bytes:
    if not 0 <= attempt <= 0xFFFF:
        raise ValueError(f"attempt {attempt} does not fit in u16")
    return _run_prefix(run_id) + _U16.pack(attempt)


def _tenant_prefix(tenant: str) -> bytes:
    encoded = tenant.encode()
    if b"\x00" in encoded:
        raise ValueError(f"tenant {tenant!r} contains NUL, which ends the key prefix")
    if len(encoded) > limits.tenant_bytes_max:
        raise ValueError(f"tenant is {len(encoded)} bytes, at most {limits.tenant_bytes_max}")
    return encoded + b"\x00"


def _stamped(record: dict, attempt: int, now_ms: int, tenant: str) -> dict:
    clashing = [k for k in _RESERVED if k in record]
    if clashing:
        raise ValueError(f"record members {clashing} are set by the store")
    if now_ms < 0:
        raise ValueError(f"now_ms {now_ms} is negative")
    return {"v": RECORD_VERSION, "attempt": attempt, "stored_ms": now_ms, "tenant": tenant,
            **record}


def _checked(record: dict) -> dict:
    if record.get("v") != RECORD_VERSION:
        raise InvariantBroken(f"output record version {record.get('v')!r}, "
                              f"this build reads {RECORD_VERSION}")
    return record
