"""Read-only queries of the committed state, named by what they return.

These are what the HTTP API asks of its node (raftsched/nodeport.py NodePort
offers each one; runtime/port.py answers them over the node's store), and
what the node's loops read (the last section). They
keep the storage layout to core: which table holds what, how keys are built,
and which index serves a listing (a job's runs are the runs table's own
order; a tenant's, runs_by_tenant). Each takes a
`Reader`, which a store and core's View-with-scan both are, and returns
decoded records or None; nothing here writes.

A key built from a name no record can have (too long for LMDB, say) reads as
nothing: a store answers None for it, and a scan from it finds no row.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Protocol

from raftsched import limits
from raftsched.core import compact, keys, runs, topics
from raftsched.core.tx import (ALERTS, AUDIT, BACKFILLS, BACKFILLS_OPEN, DUE, GROUPS, JOBS,
                               JOBS_BY_TENANT, LEASES, NODES, READY, RUNS, RUNS_BY_TENANT,
                               RUNS_OPEN, SHARDS, TENANTS, TOKENS, TOPICS)


class Reader(Protocol):
    """The two reads every query needs (a store has both)."""

    def get(self, table: str, key: bytes) -> Any | None: ...

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]: ...


# --- jobs and runs ----------------------------------------------------------------------

def job(reader: Reader, job_id: str) -> dict | None:
    """The job record (a deleted job's too, until it is purged), or None."""
    return reader.get(JOBS, keys.job_key(job_id))


def pending_once_facts(reader: Reader, job_id: str) -> tuple[str, int, int] | None:
    """(tenant, shard, run_at_ms) of a pending one-off whose fire its spec
    does not change (compact.pending_once_facts), read from its record as
    stored; None for any other job, or a reader that keeps no stored forms."""
    stored_of = getattr(reader, "pending_job_stored", None)
    if stored_of is None:
        return None
    return compact.pending_once_facts(stored_of(keys.job_key(job_id)))


class CallReader(Protocol):
    def job_to_call(self, job_id: str) -> dict | None: ...


def job_to_call(store: CallReader, job_id: str) -> dict | None:
    """What a node reads of a job before it calls one of its runs: its id,
    tenant, status and whole spec (compact.CALL_VIEW) as `job` would show
    them, or None if the job is gone; the rest of the record and its state
    are not read into maps (a node reads it before every call)."""
    return store.job_to_call(job_id)


def run(reader: Reader, run_id: str) -> dict | None:
    return reader.get(RUNS, run_id.encode())


class RunHold(NamedTuple):
    state: str
    attempt: int
    holder: str | None
    token: int

    def running_for(self, node: str, attempt: int) -> bool:
        """Is this the run's attempt `attempt`, running, held by `node`?"""
        return self.state == "running" and self.holder == node and self.attempt == attempt


class HoldReader(Protocol):
    def run_hold(self, run_id: str) -> tuple[Any, Any, Any, Any] | None: ...


def run_hold(store: HoldReader, run_id: str) -> RunHold | None:
    """Who holds the run's current attempt, as stored: its state, attempt,
    holder and fencing token, or None if the run is gone. Read without the
    rest of the record: a node reads it before every call."""
    found = store.run_hold(run_id)
    return None if found is None else RunHold(*found)


def run_states(reader: Reader, run_ids: Iterable[str]) -> list[str | None]:
    """Each run's state, in order; None for a run that is gone."""
    states: list[str | None] = []
    for run_id in run_ids:
        record = run(reader, run_id)
        states.append(record["state"] if record is not None else None)
    return states


def job_runs(reader: Reader, job_id: str, limit: int) -> list[dict]:
    """Up to `limit` of the job's runs, the latest scheduled first."""
    return _read_runs(reader, _JobRuns(job_id), limit, lambda record: True)[0]


def occurrences_with_a_run(reader: Reader, job_id: str, scheduled_ms: Iterable[int]) -> int:
    """How many of the job's occurrences at `scheduled_ms` already have a run
    (keys.run_id names it by the two)."""
    return sum(reader.get(RUNS, keys.job_run_key(job_id, ms)) is not None
               for ms in scheduled_ms)


class _TenantRuns:
    """Where a tenant's runs page reads, newest first: runs_by_tenant rows
    between two keys, each naming a run to read."""

    table = RUNS_BY_TENANT

    def __init__(self, tenant: str, after: int | None, before: int | None) -> None:
        self.tenant = tenant
        self.prefix = keys.runs_by_tenant_prefix(tenant)
        self.low = self.prefix + (keys.u64(after) if after is not None else b"")
        self.high = (self.prefix + keys.u64(before) if before is not None
                     else keys.prefix_end(self.prefix))

    def resume_after(self, scheduled_ms: int, run_id: str) -> None:
        """Go on below (older than) the run a previous page ended with."""
        self.high = min(self.high, keys.runs_by_tenant_key(self.tenant, scheduled_ms, run_id))

    def position(self, key: bytes, value: object) -> tuple[int, str]:
        """(scheduled_ms, run_id) of a row."""
        return keys.parse_runs_by_tenant_key(self.prefix, key)

    def record(self, reader: Reader, key: bytes, value: Any) -> dict | None:
        """The run a row names; None once purged (between the index read and this one)."""
        return run(reader, self.position(key, value)[1])


class _JobRuns:
    """Where a job's runs page reads, newest first: the runs table itself,
    whose keys put a job's runs together in time order (keys.run_id)."""

    table = RUNS

    def __init__(self, job_id: str, after: int | None = None,
                 before: int | None = None) -> None:
        self.job_id = job_id
        self.prefix = keys.job_runs_prefix(job_id)
        self.low = keys.job_run_key(job_id, after) if after is not None else self.prefix
        self.high = (keys.job_run_key(job_id, before) if before is not None
                     else keys.job_runs_stop(job_id))

    def resume_after(self, scheduled_ms: int, run_id: str) -> None:
        self.high = min(self.high, keys.job_run_key(self.job_id, scheduled_ms))

    def position(self, key: bytes, value: Any) -> tuple[int, str]:
        return value["scheduled_ms"], value["id"]

    def record(self, reader: Reader, key: bytes, value: Any) -> dict | None:
        """The row's run, if it is this job's: a job whose id extends this
        one's shares the prefix."""
        return value if value["job_id"] == self.job_id else None


def runs_page(reader: Reader, tenant: str, filters: dict, limit: int,
              after: tuple[int, str] | None,
              now_ms: int | None = None) -> tuple[list[dict], tuple[int, str] | None]:
    """(runs, position to go on from or None): up to `limit` of the tenant's
    runs matching `filters` (any of job_id, state, trigger, and
    scheduled_after / scheduled_before in ms, the latter exclusive), newest
    first, older than `after` (the (scheduled_ms, run_id) a previous page
    ended with). A page reads at most list_scan_rows_max index rows, so it
    may come back short with a position to go on from. With `now_ms` (the
    cluster's time), a `state` filter judges the state an answer shows
    (runs.presented_state: `armed`, or `running` for an armed run once due)."""
    job_id = filters.get("job_id")
    if job_id:
        owner = job(reader, job_id)
        if owner is None or owner["tenant"] != tenant:
            return [], None   # another tenant's job is answered as one without runs
    after_ms, before_ms = filters.get("scheduled_after"), filters.get("scheduled_before")
    source: _TenantRuns | _JobRuns = (_JobRuns(job_id, after_ms, before_ms) if job_id
                                      else _TenantRuns(tenant, after_ms, before_ms))
    if after is not None:
        source.resume_after(*after)

    state = filters.get("state")

    def matches(record: dict) -> bool:
        return (record["tenant"] == tenant
                and (state is None or state == (record["state"] if now_ms is None else
                                                runs.presented_state(record, now_ms)))
                and filters.get("trigger", record["trigger"]) == record["trigger"])

    found, last = _read_runs(reader, source, limit, matches)
    more = last is not None and bool(reader.scan(source.table, start=source.low,
                                                 stop=source.high, reverse=True, limit=1))
    return found, last if more else None


def _read_runs(reader: Reader, source: _TenantRuns | _JobRuns, limit: int,
               matches: Any) -> tuple[list[dict], tuple[int, str] | None]:
    """Read rows newest first from source.high down, moving source.high past
    each; return the matching runs and the position of the last row read
    (None if none was)."""
    found: list[dict] = []
    last: tuple[int, str] | None = None
    scanned = 0
    while len(found) < limit and scanned < limits.list_scan_rows_max:
        chunk = min(limits.list_scan_chunk_rows, limits.list_scan_rows_max - scanned)
        rows = reader.scan(source.table, start=source.low, stop=source.high,
                           reverse=True, limit=chunk)
        for key, value in rows:
            scanned += 1
            source.high = key
            last = source.position(key, value)
            record = source.record(reader, key, value)
            if record is None:
                continue
            if matches(record):
                found.append(record)
                if len(found) >= limit:
                    break
        if len(rows) < chunk:
            break
    return found, last


def job_matches(record: dict, tenant: str, filters: dict) -> bool:
    """Whether a job is listed for `tenant` under `filters` (any of status,
    name_prefix, and label: [key, value] pairs that must all match)."""
    if record["tenant"] != tenant or record["status"] == "deleted":
        return False
    if filters.get("status", record["status"]) != record["status"]:
        return False
    if not record["spec"]["name"].startswith(filters.get("name_prefix", "")):
        return False
    labels = record["spec"].get("labels") or {}
    return all(labels.get(key) == value for key, value in filters.get("label", ()))


def jobs_page(reader: Reader, tenant: str, filters: dict, limit: int,
              after: str | None) -> tuple[list[dict], str | None, bool]:
    """Up to `limit` of the tenant's jobs matching `filters` (job_matches), in
    id order, after job id `after`. It reads the tenant's own index
    (jobs_by_tenant), never another tenant's jobs; a page stops after
    list_scan_rows_max of them however few matched (a name_prefix or label
    filter over many jobs). Returns (jobs, the last id read, whether rows
    may follow)."""
    prefix = keys.jobs_by_tenant_prefix(tenant)
    start = prefix if after is None else keys.jobs_by_tenant_key(tenant, after) + b"\x00"
    stop = keys.prefix_end(prefix)
    jobs: list[dict] = []
    last: str | None = None
    scanned, more = 0, False
    while len(jobs) < limit and scanned < limits.list_scan_rows_max:
        rows = reader.scan(JOBS_BY_TENANT, start=start, stop=stop, limit=limit)
        scanned += len(rows)
        more = len(rows) == limit
        for key, _ in rows:
            start, last = key + b"\x00", key[len(prefix):].decode()
            record = job(reader, last)
            if record is not None and job_matches(record, tenant, filters):
                jobs.append(record)
                if len(jobs) >= limit:
                    break
        if not more:
            break
    return jobs, last, more


def backfill(reader: Reader, backfill_id: str) -> dict | None:
    return reader.get(BACKFILLS, backfill_id.encode())


# --- topics -----------------------------------------------------------------------------

def topic_bounds(reader: Reader, topic: str) -> tuple[int, int]:
    """(first, next) offsets of `topic` (a tenant-scoped name): the messages
    kept are first..next-1; (1, 1) for a topic never published to."""
    state = topics.meta(reader, topic)   # type: ignore[arg-type]
    return state["first"], state["next"]


def topic_messages(reader: Reader, topic: str, start: int, limit: int) -> list[dict]:
    """Up to `limit` messages of `topic` from offset `start`, oldest first."""
    rows = reader.scan(TOPICS, start=keys.topic_key(topic, start),
                       stop=keys.prefix_end(keys.topic_prefix(topic)), limit=limit)
    return [message for _, message in rows]


def group_offset(reader: Reader, topic: str, group: str) -> dict | None:
    """The offset `group` committed on `topic` and when, or None if it never did."""
    return reader.get(GROUPS, keys.group_key(topic, group))


# --- cluster ----------------------------------------------------------------------------

def registered_node(reader: Reader, node_id: str) -> dict | None:
    """A node's registration (its HTTP and Raft addresses), or None."""
    return reader.get(NODES, node_id.encode())


def registered_nodes(reader: Reader) -> list[dict]:
    """Every registered node, in id order."""
    return [record for _, record in reader.scan(NODES)]


def node_record(reader: Reader, node_id: str) -> dict | None:
    """A registered node's record (its addresses, and its latest recorded
    renewal: apply's renew), or None."""
    return reader.get(NODES, node_id.encode())


def shards(reader: Reader) -> list[tuple[int, dict]]:
    """(shard, its owner, fencing token, checkpoint and stale fires) of every
    shard assigned so far, in shard order."""
    return [(int.from_bytes(key, "big"), state) for key, state in reader.scan(SHARDS)]


# --- tenancy and audit ------------------------------------------------------------------

def token(reader: Reader, token_id: str) -> dict | None:
    """A token's record (tenant, role, name, the sha256 of its text), or None."""
    return reader.get(TOKENS, token_id.encode())


def tokens(reader: Reader) -> list[dict]:
    """Every token's record, in id order (the table holds at most tokens_max)."""
    return [record for _, record in reader.scan(TOKENS, limit=limits.tokens_max)]


def tenant(reader: Reader, name: str) -> dict | None:
    """A tenant's record (its own quotas, jobs counted), or None if it has none."""
    return reader.get(TENANTS, name.encode())


def tenants(reader: Reader) -> list[tuple[str, dict]]:
    """(name, record) of every tenant that has a record, in name order."""
    rows = reader.scan(TENANTS, limit=limits.tenants_max)
    return [(key.decode(), record) for key, record in rows]


def audit_after(reader: Reader, after: int, limit: int) -> list[dict]:
    """Up to `limit` audit records with seq > `after`, oldest first."""
    return [record for _, record in reader.scan(AUDIT, start=keys.u64(after + 1), limit=limit)]


# --- what the node's loops read ---------------------------------------------------------
#
# The trigger, dispatcher, coordinator, reaper, backfiller and worker service
# read through these (runtime/*.py). The purger walks the tables with cursors
# of its own and reads them directly (runtime/purger.py).

def shard(reader: Reader, shard_id: int) -> dict | None:
    """A shard's owner, fencing token, checkpoint and stale fires, or None
    before it was first assigned."""
    return reader.get(SHARDS, keys.shard_key(shard_id))


def owned_shards(reader: Reader, node_id: str) -> dict[int, int]:
    """The shards `node_id` owns: shard -> its fencing token."""
    return {shard_id: state["token"] for shard_id, state in shards(reader)
            if state["owner"] == node_id}


def shard_owners(reader: Reader) -> dict[int, str | None]:
    """Every assigned shard's owner."""
    return {shard_id: state["owner"] for shard_id, state in shards(reader)}


def open_run_ids(reader: Reader, shard_id: int, limit: int) -> list[str]:
    """The ids of node-executed runs of `shard_id` not ended yet, at most
    `limit`, in run id order."""
    rows = reader.scan(RUNS_OPEN, start=keys.open_run_prefix(shard_id),
                       stop=keys.open_run_prefix_end(shard_id), limit=limit)
    return [key[2:].decode() for key, _ in rows]


def open_runs(reader: Reader, shard_id: int, limit: int) -> list[dict]:
    """Node-executed runs of `shard_id` not ended yet, at most `limit` index
    rows read, in run id order."""
    found = (run(reader, run_id) for run_id in open_run_ids(reader, shard_id, limit))
    return [record for record in found if record is not None]


DueRow = tuple[int, bytes, str, dict]
"""A due entry: (due_ms, kind, id, value), where kind is keys.KIND_OCCURRENCE
(the id a job's) or keys.KIND_RETRY (a run's), and value keys.due_value."""


def due(reader: Reader, shard_id: int, after_ms: int | None, upto_ms: int,
        limit: int) -> list[DueRow]:
    """The due entries of `shard_id` after `after_ms` (None: from the first)
    and at or before `upto_ms`, earliest first, at most `limit`."""
    start = keys.shard_prefix(shard_id) if after_ms is None \
        else keys.due_upto_key(shard_id, after_ms)
    rows = reader.scan(DUE, start=start, stop=keys.due_upto_key(shard_id, upto_ms),
                       limit=limit)
    return [(*keys.parse_due_key(key)[1:], value) for key, value in rows]


def earliest_due(reader: Reader, shard_id: int) -> int | None:
    """When the shard's earliest due entry is due, or None if it has none."""
    first = reader.scan(DUE, start=keys.shard_prefix(shard_id),
                        stop=keys.shard_prefix(shard_id + 1), limit=1)
    return keys.parse_due_key(first[0][0])[1] if first else None


def due_tenant(reader: Reader, kind: bytes, ident: str) -> str | None:
    """Whose a due entry is, from its job (an occurrence) or run (a retry):
    for an entry written before due values named it. None if that is gone."""
    record = run(reader, ident) if kind == keys.KIND_RETRY else job(reader, ident)
    return record["tenant"] if record is not None else None


def leases_expired(reader: Reader, now_ms: int, limit: int) -> list[tuple[str, str]]:
    """(run id, holder) of worker leases that expired before `now_ms`,
    earliest first, at most `limit`."""
    rows = reader.scan(LEASES, stop=keys.u64(now_ms), limit=limit)
    return [(keys.parse_lease_key(key)[1], holder) for key, holder in rows]


def pending_alerts(reader: Reader, limit: int) -> list[dict]:
    """Failure alerts waiting for delivery, at most `limit`, in run id order."""
    return [alert for _, alert in reader.scan(ALERTS, limit=limit)]


def running_backfill_ids(reader: Reader, limit: int) -> list[str]:
    """The backfills still launching runs, at most `limit`, in id order."""
    return [key.decode() for key, _ in reader.scan(BACKFILLS_OPEN, limit=limit)]


def ready_run_ids(reader: Reader, scoped_queue: str, limit: int) -> list[str]:
    """Runs waiting for a worker on a tenant's queue (keys.scoped), high
    priority first, then oldest; at most `limit`."""
    prefix = keys.ready_prefix(scoped_queue)
    rows = reader.scan(READY, start=prefix, stop=keys.prefix_end(prefix), limit=limit)
    return [keys.ready_run_id(prefix, key) for key, _ in rows]
