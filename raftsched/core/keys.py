"""Key layouts of the replicated tables, ids, and the stable shard hash.

Integers are big-endian so that LMDB's byte order is time order: a shard's due
range is one contiguous key range.
"""

from __future__ import annotations

import hashlib
import struct

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_U16U64 = struct.Struct(">HQ")

KIND_OCCURRENCE = b"o"


def stable_hash(text: str) -> int:
    """A hash that is the same on every node and every release (never hash())."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def shard_of(job_id: str, shard_count: int) -> int:
    return stable_hash(job_id) % shard_count


def execution_id(job_id: str, scheduled_ms: int) -> str:
    """Stable across retries and failover: what a target deduplicates on."""
    digest = hashlib.sha256(f"{job_id}|{scheduled_ms}".encode()).hexdigest()
    return "exe_" + digest[:32]


def run_id(job_id: str, scheduled_ms: int, attempt: int) -> str:
    digest = hashlib.sha256(f"{job_id}|{scheduled_ms}|{attempt}".encode()).hexdigest()
    return "run_" + digest[:24]


def job_key(job_id: str) -> bytes:
    return job_id.encode()


def due_key(shard: int, due_ms: int, job_id: str, kind: bytes = KIND_OCCURRENCE) -> bytes:
    return _U16U64.pack(shard, due_ms) + kind + job_id.encode()


def parse_due_key(key: bytes) -> tuple[int, int, bytes, str]:
    shard, due_ms = _U16U64.unpack_from(key)
    return shard, due_ms, key[10:11], key[11:].decode()


def shard_prefix(shard: int) -> bytes:
    return _U16.pack(shard)


def due_upto_key(shard: int, due_ms: int) -> bytes:
    """The first key after every due entry of `shard` at or before `due_ms`."""
    return _U16U64.pack(shard, due_ms + 1)


def runs_by_job_prefix(job_id: str) -> bytes:
    return job_id.encode() + b"\x00"


def runs_by_job_key(job_id: str, scheduled_ms: int, attempt: int) -> bytes:
    return runs_by_job_prefix(job_id) + _U64.pack(scheduled_ms) + _U16.pack(attempt)


def open_run_key(node: str, run: str) -> bytes:
    return node.encode() + b"\x00" + run.encode()


def open_run_prefix(node: str) -> bytes:
    return node.encode() + b"\x00"


def shard_key(shard: int) -> bytes:
    return _U16.pack(shard)


def idem_key(tenant: str, key: str) -> bytes:
    return tenant.encode() + b"\x00" + key.encode()


def u64(value: int) -> bytes:
    return _U64.pack(value)


def from_u64(data: bytes) -> int:
    return _U64.unpack(data)[0]
