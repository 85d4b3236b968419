"""Key layouts of the replicated tables, ids, and the stable shard hash.

Integers are big-endian so that LMDB's byte order is time order: a shard's due
range is one contiguous key range.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct

from raftsched import limits

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_U16U64 = struct.Struct(">HQ")

KIND_OCCURRENCE = b"o"   # the id after it is a job id: the job's next occurrence
KIND_RETRY = b"r"        # the id after it is a run id: the run's next attempt


def stable_hash(text: str) -> int:
    """A hash that is the same on every node and every release (never hash())."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def shard_of(job_id: str, shard_count: int) -> int:
    return stable_hash(job_id) % shard_count


# A run's execution id is read back from its job and occurrence on every
# read of it (core/compact.py), and a run is read several times in its life on
# a node: the recent ones are remembered (run_ids_remembered_max). `typed`: 1
# and 1.0 give different ids.
@functools.lru_cache(maxsize=limits.run_ids_remembered_max, typed=True)
def execution_id(job_id: str, scheduled_ms: int) -> str:
    """Stable across retries and failover: what a target deduplicates on."""
    digest = hashlib.sha256(f"{job_id}|{scheduled_ms}".encode()).hexdigest()
    return "exe_" + digest[:32]


RUN_PREFIX = "run_"
_JOB_PREFIX = "job_"
_OTHER_JOB = "~"   # marks a job id that is not "job_" + a name (tests, hand-made commands)


def _job_part(job_id: str) -> str:
    """The job's part of its runs' ids: an API job id ("job_" and 20 hex
    digits) without its "job_". One to one: an id that does not start with
    "job_", or whose rest starts with the marker, is kept whole after it."""
    if job_id.startswith(_JOB_PREFIX) and not job_id.startswith(_OTHER_JOB, 4):
        return job_id[4:]
    return _OTHER_JOB + job_id


@functools.lru_cache(maxsize=limits.run_ids_remembered_max, typed=True)
def run_id(job_id: str, scheduled_ms: int) -> str:
    """The id of the run of the job's occurrence at `scheduled_ms` (every
    attempt of it): "run_", the job's part, and the time as 12 hex digits,
    so that the runs table holds a job's runs together in time order (its
    history needs no index of its own). "run_" and 32 hex digits for an API
    job. A time past 2**48 ms (year 10889, past timestamp_ms_max) takes more
    digits: no request can give one."""
    return f"{RUN_PREFIX}{_job_part(job_id)}{scheduled_ms:012x}"


def run_occurrence(run_id: str) -> tuple[str, int] | None:
    """(job id, scheduled_ms) that keys.run_id made `run_id` from, read
    back; None for an id it cannot have made. A DAG task run's id
    (task_run_id) reads as some pair: check it with run_id."""
    found = _RUN_ID.fullmatch(run_id)
    if found is None:
        return None
    other, part, digits = found.groups()
    return (part if other else _JOB_PREFIX + part), int(digits, 16)


_RUN_ID = re.compile(r"run_(~?)(.*)([0-9a-f]{12})", re.DOTALL)


def names_occurrence(an_id: str, job_id: object, scheduled_ms: object) -> bool:
    """Whether run_occurrence(an_id) reads back exactly (job_id, scheduled_ms)."""
    return type(job_id) is str and type(scheduled_ms) is int \
        and 0 <= scheduled_ms < 1 << 48 and an_id == run_id(job_id, scheduled_ms)


def job_runs_prefix(job_id: str) -> bytes:
    """The runs-table key prefix of a job's runs (keys.run_id). Another job's
    runs may share it only if that job's id extends this one's (never for two
    API job ids, which are all 24 characters): readers check `job_id`."""
    return (RUN_PREFIX + _job_part(job_id)).encode()


def job_runs_stop(job_id: str) -> bytes:
    """The first key after every run of the job: a run id is UTF-8, where no
    byte is 0xff."""
    return job_runs_prefix(job_id) + b"\xff"


def job_run_key(job_id: str, scheduled_ms: int) -> bytes:
    return run_id(job_id, scheduled_ms).encode()


def task_execution_id(job_id: str, scheduled_ms: int, task_id: str) -> str:
    """A DAG task's execution id: stable across its retries and failover, and
    distinct from every other task's of the same run."""
    digest = hashlib.sha256(f"{job_id}|{scheduled_ms}|{task_id}".encode()).hexdigest()
    return "exe_" + digest[:32]


def task_run_id(dag_run_id: str, task_id: str) -> str:
    """The id of the run that executes task `task_id` of DAG run `dag_run_id`:
    a run id like any other, so executors, workers and the API take it as one."""
    digest = hashlib.sha256(f"{dag_run_id}|task|{task_id}".encode()).hexdigest()
    return "run_" + digest[:24]


def job_key(job_id: str) -> bytes:
    return job_id.encode()


def due_key(shard: int, due_ms: int, job_id: str, kind: bytes = KIND_OCCURRENCE) -> bytes:
    return _U16U64.pack(shard, due_ms) + kind + job_id.encode()


def retry_due_key(shard: int, due_ms: int, run: str) -> bytes:
    return due_key(shard, due_ms, run, KIND_RETRY)


def parse_due_key(key: bytes) -> tuple[int, int, bytes, str]:
    shard, due_ms = _U16U64.unpack_from(key)
    return shard, due_ms, key[10:11], key[11:].decode()


# What precedes the id in a due key: its shard, time and kind.
DUE_HEAD_BYTES = _U16U64.size + 1


def due_key_storable(key: bytes) -> bool:
    """Whether a store holds `key` in the due table: a shard, a time, a kind
    and an id of at least one byte with no NUL in it, due_key_bytes_max
    bytes in all. The LMDB store keeps the id, a NUL and the entry's value
    together (storage/lmdb_store.py); ids never hold NUL (every name that
    becomes a key is refused with one at the edge)."""
    return DUE_HEAD_BYTES < len(key) <= limits.due_key_bytes_max \
        and key.find(b"\0", DUE_HEAD_BYTES) < 0


def shard_prefix(shard: int) -> bytes:
    return _U16.pack(shard)


def due_upto_key(shard: int, due_ms: int) -> bytes:
    """The first key after every due entry of `shard` at or before `due_ms`."""
    return _U16U64.pack(shard, due_ms + 1)


def runs_by_tenant_prefix(tenant: str) -> bytes:
    return tenant.encode() + b"\x00"


def runs_by_tenant_key(tenant: str, scheduled_ms: int, run: str) -> bytes:
    """A tenant's runs in (scheduled_for, run id) order: what GET /v1/runs pages
    through, newest first, from the last key a page showed."""
    return runs_by_tenant_prefix(tenant) + _U64.pack(scheduled_ms) + run.encode()


def jobs_by_tenant_prefix(tenant: str) -> bytes:
    return tenant.encode() + b"\x00"


def jobs_by_tenant_key(tenant: str, job_id: str) -> bytes:
    """A tenant's jobs in id order: what GET /v1/jobs pages through."""
    return jobs_by_tenant_prefix(tenant) + job_id.encode()


def parse_runs_by_tenant_key(prefix: bytes, key: bytes) -> tuple[int, str]:
    return _U64.unpack_from(key, len(prefix))[0], key[len(prefix) + 8:].decode()


def open_run_key(shard: int, run: str) -> bytes:
    """A node-executed run not yet ended, under its job's shard: what the
    shard's owner calls, and what a new owner of the shard takes over."""
    return _U16.pack(shard) + run.encode()


def open_run_prefix(shard: int) -> bytes:
    return _U16.pack(shard)


def open_run_prefix_end(shard: int) -> bytes:
    """The first key after every open run of `shard`."""
    return _U16.pack(shard + 1) if shard + 1 < 1 << 16 else b"\xff\xff\xff"


def lease_key(expiry_ms: int, run: str) -> bytes:
    return _U64.pack(expiry_ms) + run.encode()


def parse_lease_key(key: bytes) -> tuple[int, str]:
    return _U64.unpack_from(key)[0], key[8:].decode()


# A job's `priority`, as it orders a worker queue (and the dispatcher's queues).
PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


def scoped(tenant: str, name: str) -> str:
    """A topic or worker queue name as the state keys it: tenants' names never
    meet (neither a tenant nor a topic or queue name holds "/")."""
    return f"{tenant}/{name}"


def due_value(tenant: str, priority: str | None) -> dict:
    """A due entry's value: whose it is and its priority rank, so the trigger
    can order a backlog without reading every job (runtime/trigger.py)."""
    return {"v": 1, "tn": tenant, "p": PRIORITY_RANK.get(priority or "normal", 1)}


def ready_prefix(scoped_queue: str) -> bytes:
    return scoped_queue.encode() + b"\x00"


def ready_key(scoped_queue: str, priority_rank: int, queued_ms: int, run: str) -> bytes:
    """Higher priority first, then oldest first, within a tenant's queue."""
    return ready_prefix(scoped_queue) + bytes((priority_rank,)) + _U64.pack(queued_ms) + run.encode()


def ready_run_id(prefix: bytes, key: bytes) -> str:
    return key[len(prefix) + 9:].decode()


def topic_prefix(topic: str) -> bytes:
    return topic.encode() + b"\x00"


def topic_key(topic: str, offset: int) -> bytes:
    return topic_prefix(topic) + _U64.pack(offset)


def topic_idem_key(topic: str, execution: str) -> bytes:
    return topic_prefix(topic) + execution.encode()


def group_key(topic: str, group: str) -> bytes:
    return topic_prefix(topic) + group.encode()


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with `prefix` (which ends in 0x00)."""
    assert prefix.endswith(b"\x00")
    return prefix[:-1] + b"\x01"


def shard_key(shard: int) -> bytes:
    return _U16.pack(shard)


def idem_key(tenant: str, key: str) -> bytes:
    return tenant.encode() + b"\x00" + key.encode()


def u64(value: int) -> bytes:
    return _U64.pack(value)


def from_u64(data: bytes) -> int:
    return _U64.unpack(data)[0]
