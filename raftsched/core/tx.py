"""What apply reads and returns: the table names, the read view, the effects
and the Transition, and the write buffer handlers work through.

Kept apart from apply.py so the handler modules (jobs in apply.py, runs.py,
topics.py) share them without importing each other.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Protocol

from raftsched import limits
from raftsched.core import codec, compact, keys

JOBS = "jobs"
DUE = "due"
# run_id -> the run. A job's runs are together, in time order: their ids
# (keys.run_id) begin with the job's id, so the table is each job's history.
RUNS = "runs"
RUNS_OPEN = "runs_open"      # shard | run_id: node-executed runs not ended, by job shard
SHARDS = "shards"
IDEM = "idem"
NODES = "nodes"
LEASES = "leases"            # expiry_ms | run_id -> holder: what the reaper scans
READY = "ready"              # queue | queued_ms | run_id: runs waiting for a worker
ALERTS = "alerts"            # run_id -> alert waiting for delivery
TOPICS = "topics"            # topic | offset -> message
TOPIC_META = "topic_meta"    # topic -> first and next offset
TOPIC_IDEM = "topic_idem"    # topic | execution_id -> offset (a retried publish appends once)
GROUPS = "groups"            # topic | group -> committed offset
COUNTERS = "counters"        # name -> cluster-wide count apply keeps (topics, tokens, ...)
TOKENS = "tokens"            # token_id -> tenant, role, name, sha256 of the token
TENANTS = "tenants"          # tenant -> quotas, jobs counted, the create-rate bucket
AUDIT = "audit"              # seq -> who did what (bounded per stream: core/tenancy.py)
# stream | n -> seq: the n-th audit record of a stream (the admin's, or one
# tenant's), so that a stream drops its own oldest record and no other's.
AUDIT_STREAMS = "audit_streams"
BACKFILLS = "backfills"      # backfill_id -> a backfill's range, progress and state
BACKFILLS_OPEN = "backfills_open"   # backfill_id -> 1 while it runs: what the backfiller scans
# tenant | scheduled_ms | run_id -> 1: a tenant's runs in time order (GET /v1/runs),
# written with the run and removed with it.
RUNS_BY_TENANT = "runs_by_tenant"
# tenant | job_id -> 1: a tenant's jobs in id order (GET /v1/jobs), written with
# the job and removed when it is purged, so a listing reads its own tenant's
# jobs only, however many another tenant has.
JOBS_BY_TENANT = "jobs_by_tenant"
# job_id -> the job's mutable state (JOB_STATE_FIELDS) once a fire or a
# finish changed it: kept apart from the job's record (its spec), so that the
# runs of a job rewrite this small record, not the spec. A read of `jobs`
# (apply's Tx, a store's get or scan) overlays it on the job's record.
JOB_STATE = "job_state"
# Every replicated table, in digest order.
TABLES = (JOBS, DUE, RUNS, RUNS_OPEN, SHARDS, IDEM, NODES, LEASES, READY, ALERTS,
          TOPICS, TOPIC_META, TOPIC_IDEM, GROUPS, COUNTERS, TOKENS, TENANTS, AUDIT,
          BACKFILLS, BACKFILLS_OPEN, RUNS_BY_TENANT, AUDIT_STREAMS, JOBS_BY_TENANT, JOB_STATE)
# The same, for `in` (every read and write of apply asks: a tuple's test goes
# through the names in order, a tenth of a microsecond apiece).
_TABLE_NAMES = frozenset(TABLES)

# The members of a job record its runs change (fires, finishes, the queue
# policy, a one-off's completion): what JOB_STATE holds.
JOB_STATE_FIELDS = ("next_ms", "active", "waiting", "last_run_id", "runs_count",
                    "misfires_omitted", "status", "updated_ms")


def merge_job(job: dict | None, state: dict | None) -> dict | None:
    """A job as every reader sees it: its record, with its state record (if
    any) laid over it. Pure."""
    if job is None or state is None:
        return job
    job.update((name, value) for name, value in state.items() if name != "v")
    return job


_STATE_NAMES = frozenset(JOB_STATE_FIELDS)


def _same_static(job: dict, before: dict) -> bool:
    """Whether `job` and `before` agree on every member but JOB_STATE_FIELDS
    (a member one lacks reads as None), a value compared only when it is not
    the very one read (a spec is replaced, never changed in place: see _snapshot)."""
    for name, value in job.items():
        if name in _STATE_NAMES:
            continue
        old = before.get(name)
        if value is not old and value != old:
            return False
    for name, old in before.items():
        if old is not None and name not in job and name not in _STATE_NAMES:
            return False
    return True


def _same_state(job: dict, before: dict) -> bool:
    """Whether `job` and `before` agree on JOB_STATE_FIELDS (missing reads as None)."""
    for name in JOB_STATE_FIELDS:
        value, old = job.get(name), before.get(name)
        if value is not old and value != old:
            return False
    return True


def job_state_record(job: dict) -> dict:
    """The state record of `job` (its JOB_STATE_FIELDS), as put_job_state writes it."""
    state = {"v": 1}
    for name in JOB_STATE_FIELDS:
        if name in job:
            state[name] = job[name]
    return state


def _snapshot(job: dict) -> dict:
    """A copy of a job as read, deep enough to tell later what changed: the
    lists callers change in place (active, waiting) are copied; the spec is
    only ever replaced, never changed in place, so it is shared."""
    snapshot = dict(job)
    for name, value in job.items():
        if type(value) is list:
            snapshot[name] = value.copy()
    return snapshot

RECORD_VERSION = 1


class View(Protocol):
    """The narrow read interface apply needs. Values are decoded records."""

    def get(self, table: str, key: bytes) -> Any | None: ...

    # Optional, both answering as `get` would find the record (a Tx works
    # without them, reading through `get`):
    # get_stored(table, key) -> the record as stored, decoded but not restored
    #   (core/compact.py), or None: Tx.stored_pending_job and Tx.stored_run;
    # has(table, key) -> whether there is a record, not decoded: Tx.has.


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunQueued:
    """A run is ready for an executor: `run["node"]` runs it, or, when
    `run["queue"]` is set, a worker of that queue claims it."""
    run: dict


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunCancelled:
    """A run was cancelled; its holder (a node or a worker) should stop it."""
    run_id: str
    holder: str | None
    attempt: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class DueArmed:
    """A due entry now exists at `due_ms` in `shard`: the trigger loop may need to wake."""
    shard: int
    due_ms: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardsAssigned:
    """`shard` now belongs to `owner` under fencing token `token`."""
    shard: int
    owner: str
    token: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeRenewed:
    """`node` renewed its liveness at its own clock's `at_ms`."""
    node: str
    at_ms: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class AlertPending:
    """A run failed for good: the leader's alerter delivers its alert."""
    run_id: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackfillOpened:
    """A backfill began: the leader's backfiller paces it from now on."""
    backfill_id: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class TopicAppended:
    """`topic` has messages up to `offset`: wake its long-polling readers."""
    topic: str
    offset: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunsPurged:
    """Runs were removed for good (core/retention.py): each node drops the
    output it keeps of them, which nothing can ask for any more."""
    run_ids: tuple[str, ...]


Effect = (RunQueued | RunCancelled | DueArmed | ShardsAssigned | NodeRenewed | AlertPending
          | BackfillOpened | TopicAppended | RunsPurged)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transition:
    """What one command does. Persist `writes` (with the index) first, then
    perform `effects`; `result` goes back to the proposer."""
    writes: tuple[tuple[str, bytes, Any | None], ...]
    effects: tuple[Effect, ...]
    result: dict
    # What the command did, counted for this replica's metrics (runtime/metrics.py):
    # ((name, label), count) pairs, TALLY_* below. Not state: never persisted,
    # not in the digest.
    tallies: tuple[tuple[tuple[str, str], int], ...] = ()
    # Whether every key in `writes` was checked as a store can hold it
    # (check_key, which Tx applies to each write as it is made): a store then
    # need not check them again. A transition made otherwise is checked by
    # the store's commit.
    keys_checked: bool = False


# Tally names (Tx.tally): a run reached a terminal state (label: the state); a
# failed attempt will be retried (no label); a run failed for good and raised
# its alert, a dead letter (no label; a DAG's task runs alert through their DAG
# run); an occurrence a fire recorded missed or skipped under the job's misfire
# policy (label: policy:state).
TALLY_RUN_ENDED = "run_ended"
TALLY_RETRY = "retry"
# A held run's next attempt went to its shard's new owner (runs.take_over).
TALLY_REDELIVERED = "redelivered"
TALLY_DEAD_LETTER = "dead_letter"
TALLY_MISFIRE = "misfire"


class WriteRefused(Exception):
    """Raised by Tx, inside apply only, on a write no store can hold (a key that
    is empty, too long or not bytes, or a table that does not exist). apply()
    catches it and refuses the whole command; handlers never catch it."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ViewFailed(Exception):
    """A read of the view failed (a storage error on this node, not something
    the command did). apply() lets it through: refusing the command here alone
    would make this replica diverge, so the node must stop."""


def check_key(table: str, key: object) -> None:
    """Raise WriteRefused unless `key` is one a store can hold in `table`."""
    if table not in _TABLE_NAMES:
        raise WriteRefused(f"there is no table {table!r}")
    if not isinstance(key, bytes):
        raise WriteRefused(f"a key in {table} must be bytes, not {type(key).__name__}")
    if not 1 <= len(key) <= limits.lmdb_key_bytes_max:
        raise WriteRefused(f"a key of {len(key)} bytes in {table}; keys are 1 to "
                           f"{limits.lmdb_key_bytes_max} bytes (lmdb_key_bytes_max)")
    if table == DUE and not keys.due_key_storable(key):
        raise WriteRefused(f"a due key of {len(key)} bytes: a shard, a time, a kind and an id "
                           f"without NUL, at most {limits.due_key_bytes_max} bytes "
                           f"(due_key_bytes_max)")


# What Tx.get finds in its writes for a key the command has not written.
_UNWRITTEN = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _Stored:
    """A write of a record in its stored form (Tx.put_stored)."""
    stored: list

# Whether a job written by put_fired_job is checked to have changed its state
# alone (its other members compared with the job as read, as a whole write
# is): the test suite turns it on (tests/conftest.py); a node does not pay it.
CHECK_FIRED_STATE_ONLY = False


class Tx:
    """Reads through to the view, seeing this command's own writes first.
    Writes are checked as they are made (check_key), so a command that would
    write what the store refuses is refused whole, before anything is stored."""

    _DELETED = object()

    def __init__(self, view: View) -> None:
        self._view = view
        self._writes: dict[tuple[str, bytes], Any] = {}
        # key -> (the job as read, whether it had a state record): what a
        # write of the job is compared with (_job_writes).
        self._jobs_read: dict[bytes, tuple[dict, bool]] = {}
        # Keys of jobs read whole whose write changed their state alone
        # (put_fired_job): written as their state record without comparing
        # the rest of the record.
        self._state_only: set[bytes] = set()
        self.effects: list[Effect] = []
        self._tallies: collections.Counter[tuple[str, str]] = collections.Counter()

    def get(self, table: str, key: bytes) -> Any | None:
        if table not in _TABLE_NAMES:
            raise KeyError(f"there is no table {table!r}")   # a bug: apply refuses it
        if not isinstance(key, bytes) or not 1 <= len(key) <= limits.lmdb_key_bytes_max:
            return None   # no record can be stored under a key no store can hold
        value = self._writes.get((table, key), _UNWRITTEN)
        if value is _UNWRITTEN:
            try:
                if table == JOBS:
                    return self._read_job(key)
                return self._view.get(table, key)
            except ViewFailed:
                raise
            except Exception as exc:
                raise ViewFailed(f"reading {table}: {exc!r}") from exc
        if type(value) is _Stored:
            # Written as stored (put_stored): read back as any reader reads it.
            return compact.expand(table, codec.unpack_record(codec.pack(value.stored)), key)
        return None if value is self._DELETED else value

    def has(self, table: str, key: bytes) -> bool:
        """Whether `get` would find a record, without decoding it where the
        view can tell (`has`)."""
        value = self._writes.get((table, key), _UNWRITTEN)
        if value is not _UNWRITTEN:
            return value is not self._DELETED
        has = getattr(self._view, "has", None)
        if has is None or table == JOBS or table not in _TABLE_NAMES \
                or not isinstance(key, bytes) or not 1 <= len(key) <= limits.lmdb_key_bytes_max:
            return self.get(table, key) is not None
        try:
            return has(table, key)
        except Exception as exc:
            raise ViewFailed(f"reading {table}: {exc!r}") from exc

    def _read_job(self, key: bytes) -> dict | None:
        job = self._view.get(JOBS, key)
        if job is None:
            return None
        # A state this command wrote alone (put_job_state) is the job's state now.
        state = self._writes.get((JOB_STATE, key), None)
        if state is None:
            state = self._view.get(JOB_STATE, key)
        elif state is self._DELETED:
            state = None
        elif type(state) is _Stored:   # (put_stored: read back as any reader reads it)
            state = self.get(JOB_STATE, key)
        merge_job(job, state)
        if key not in self._jobs_read:
            self._jobs_read[key] = (_snapshot(job), state is not None)
        return job

    def stored_pending_job(self, key: bytes) -> Any | None:
        """A job's record as stored (decoded, not restored: core/compact.py),
        when its state is still in that record (it has no state record) and
        this command has neither read nor written the job: what a fire of a
        pending one-off reads instead of the whole job. None otherwise, or
        when the view keeps no stored forms (`get_stored`)."""
        get_stored = getattr(self._view, "get_stored", None)
        if get_stored is None or key in self._jobs_read or (JOBS, key) in self._writes \
                or (JOB_STATE, key) in self._writes:
            return None
        has = getattr(self._view, "has", None)
        try:
            if (has(JOB_STATE, key) if has is not None
                    else self._view.get(JOB_STATE, key) is not None):
                return None
            return get_stored(JOBS, key)
        except ViewFailed:
            raise
        except Exception as exc:
            raise ViewFailed(f"reading {JOBS}: {exc!r}") from exc

    def job_state(self, job_id: str) -> dict | None:
        """A job's state (JOB_STATE_FIELDS) and id, for a change to its state
        alone (a run's end), read without its record and spec: its state
        record. A job whose state is still in its record (not fired yet, or
        written whole since), or that this command has written whole, is read
        whole, as `get` reads it. Write it back with put_job_state."""
        key = keys.job_key(job_id)
        if (JOBS, key) not in self._writes:
            state = self.get(JOB_STATE, key)
            if state is not None:
                view = dict(state)
                view["id"] = job_id
                return view
        return self.get(JOBS, key)

    def put_job_state(self, job: dict) -> None:
        """Write back what job_state gave: a state read alone as a state
        record, a job read whole as `put` writes a job."""
        key = keys.job_key(job["id"])
        if "spec" in job:
            self.put(JOBS, key, job)
        else:
            self.put(JOB_STATE, key, job_state_record(job))

    def put_fired_job(self, job: dict) -> None:
        """Write back a job read whole (`get`) of which only JOB_STATE_FIELDS
        changed, as a fire leaves it: stored as its state record without
        comparing the rest of it member by member (_same_static). A job not
        read from the store, or written whole by this command before, is
        written as `put` writes it."""
        key = keys.job_key(job["id"])
        whole = (JOBS, key) in self._writes and key not in self._state_only
        self.put(JOBS, key, job)
        if not whole and key in self._jobs_read:
            self._state_only.add(key)

    def stored_run(self, key: bytes) -> Any | None:
        """A run's record as stored (decoded, not restored: core/compact.py),
        when this command has not written the run; else None, as when the
        view keeps no stored forms (`get_stored`)."""
        return None if (RUNS, key) in self._writes else self._view_stored(RUNS, key)

    def stored_state(self, key: bytes) -> Any | None:
        """A job's state record as stored (decoded, not restored), when this
        command has written neither the job nor its state; else None, as when
        the job has no state record (its state is in its record) or the view
        keeps no stored forms (`get_stored`)."""
        if (JOB_STATE, key) in self._writes or (JOBS, key) in self._writes:
            return None
        return self._view_stored(JOB_STATE, key)

    def _view_stored(self, table: str, key: bytes) -> Any | None:
        """The view's record as stored (`get_stored`), or None if it keeps none."""
        get_stored = getattr(self._view, "get_stored", None)
        if get_stored is None:
            return None
        try:
            return get_stored(table, key)
        except ViewFailed:
            raise
        except Exception as exc:
            raise ViewFailed(f"reading {table}: {exc!r}") from exc

    def put_stored(self, table: str, key: bytes, stored: list) -> None:
        """Write a record already in the form the stores keep (a positional
        form core/compact.py made): written as it is, and read back restored."""
        check_key(table, key)
        self._writes[(table, key)] = _Stored(stored)

    def put(self, table: str, key: bytes, value: Any) -> None:
        assert value is not None
        check_key(table, key)
        self._writes[(table, key)] = value
        if table == JOBS and self._state_only:
            self._state_only.discard(key)

    def delete(self, table: str, key: bytes) -> None:
        check_key(table, key)
        self._writes[(table, key)] = self._DELETED

    def tally(self, name: str, label: str = "") -> None:
        """Count one event of the command for metrics (Transition.tallies). A
        command refused whole carries no tallies, as it carries no writes."""
        self._tallies[(name, label)] += 1

    def _job_writes(self, key: bytes, job: Any) -> list[tuple[str, bytes, Any]]:
        """A job written through the `jobs` table, as stored: its state
        record alone when only its state changed since it was read, else the
        whole record (and no state record)."""
        read = self._jobs_read.get(key)
        if job is self._DELETED:
            return [(JOBS, key, None), (JOB_STATE, key, None)]
        if type(job) is _Stored:   # (put_stored: a whole record, its state in it)
            had_state = read is not None and read[1]
            return [(JOBS, key, job.stored)] + ([(JOB_STATE, key, None)] if had_state else [])
        if read is not None:
            before, had_state = read
            fired = key in self._state_only
            if fired and CHECK_FIRED_STATE_ONLY and not _same_static(job, before):
                raise AssertionError(f"job {key!r} written by put_fired_job changed more than "
                                     f"its state")
            if fired or _same_static(job, before):
                if _same_state(job, before):
                    return []   # written unchanged
                return [(JOB_STATE, key, job_state_record(job))]
            if had_state:
                return [(JOBS, key, job), (JOB_STATE, key, None)]
        return [(JOBS, key, job)]

    def transition(self, result: dict) -> Transition:
        writes = []
        for (t, k), v in self._writes.items():
            if t == JOBS:
                writes.extend(self._job_writes(k, v))
            elif type(v) is _Stored:
                writes.append((t, k, v.stored))
            else:
                writes.append((t, k, None if v is self._DELETED else v))
        writes = tuple(writes)
        return Transition(writes=writes, effects=tuple(self.effects), result=result,
                          tallies=tuple(self._tallies.items()), keys_checked=True)


def refuse(error: str, detail: str) -> dict:
    return {"ok": False, "error": error, "detail": detail}


def live_job(tx: Tx, job_id: str) -> dict | None:
    job = tx.get(JOBS, keys.job_key(job_id))
    if job is None or job["status"] == "deleted":
        return None
    return job
