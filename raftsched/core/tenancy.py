"""Tokens, tenants and their quotas, and the audit table, in apply.

Tokens: the state keeps a token's tenant, role and name, and the SHA-256 of
its text, never the text (a token is 256 random bits, so a plain hash is
enough: there is nothing to guess). Revoking deletes the record; every node
stops accepting the token when it applies the revocation.

Tenants: a record per tenant holds the quotas an admin set (None: the node
flags' default) and what apply counts against them: the jobs that are not
deleted, and a token bucket for the create rate. A record without jobs can be
deleted, which frees its place under tenants_max. The bucket is refilled from
the commands' `at_ms`, never backwards, so every replica counts alike and the
rate holds for the whole cluster, not per node. The quota in force comes with
each create (the proposer read it), since the flags' defaults are not state.

Commands: a tenant runs command targets (on the nodes or on its workers)
only while an admin granted it (`commands` in its record, false until then).
Apply refuses a create or update of a job with a command target for a tenant
without the grant, whatever the node that proposed it believed; the runs of
jobs made before a grant was withdrawn fail when they come to be called
(runtime/dispatcher.py, runtime/workers.py).

Audit: who created and revoked tokens, changed quotas, and created, changed,
paused, resumed, triggered or deleted jobs, with the token id. Records are
listed in one sequence, but kept in streams, each of which drops only its own
oldest records: the admin's stream (tokens, tenants, and whatever an admin
token did) keeps its newest `audit_admin_entries_max`; each tenant's stream
(what its writers did) keeps its newest `audit_entries_per_tenant_max`, and
while the tenants' streams together hold more than `audit_entries_max`, a
tenant that writes drops its own oldest (down to `audit_entries_kept_min`).
So a tenant's writes never evict the admin's records nor another tenant's.
Records written before streams were kept (seq below the `audit_streams_from`
counter) go once the sequence is `audit_entries_max` past them.
"""

from __future__ import annotations

import typing

from raftsched import limits
from raftsched.core import commands, dag, keys, spec
from raftsched.core.tx import AUDIT, AUDIT_STREAMS, COUNTERS, TENANTS, TOKENS, Tx

ROLES = typing.get_args(spec.Role)
# Roles that see or act on the whole cluster, not one tenant: a token of one
# is made for the default tenant only (a tenant's admin would be every tenant's).
CLUSTER_ROLES = ("admin", "operator")
CLUSTER_TENANT = "default"
QUOTA_NAMES = ("jobs_max", "creates_per_s", "runs_concurrent_max", "weight")
_TOKENS_COUNTER = b"tokens"
_TENANTS_COUNTER = b"tenants"
_AUDIT_COUNTER = b"audit"
_AUDIT_POOL_COUNTER = b"audit_pool"            # records in the tenants' streams
_AUDIT_STREAMS_FROM = b"audit_streams_from"    # the first seq kept in a stream
# The admin's stream: "*" is in no tenant name (limits.tenant_name_pattern).
ADMIN_STREAM = "*admin"
_ADMIN_ACTIONS = ("token.", "tenant.")
# Actors that are admins without a token record: the nodes' bootstrap token.
_ADMIN_ACTORS = ("bootstrap",)


def _count(tx: Tx, name: bytes) -> int:
    counter = tx.get(COUNTERS, name)
    return counter["count"] if counter else 0


def _set_count(tx: Tx, name: bytes, count: int) -> None:
    tx.put(COUNTERS, name, {"v": 1, "count": count})


# --- tenants ------------------------------------------------------------------------------

def tenant_record(tx: Tx, tenant: str) -> dict | None:
    return tx.get(TENANTS, tenant.encode())


def _new_tenant(tx: Tx, tenant: str, at_ms: int) -> dict | None:
    """A record for a tenant seen for the first time, or None past tenants_max."""
    count = _count(tx, _TENANTS_COUNTER)
    if count >= limits.tenants_max:
        return None
    _set_count(tx, _TENANTS_COUNTER, count + 1)
    return {"v": 1, "name": tenant, "quota": {q: None for q in QUOTA_NAMES}, "jobs": 0,
            "bucket_milli": None, "bucket_ms": 0, "created_ms": at_ms, "commands": False}


def commands_granted(record: dict | None) -> bool:
    """Whether an admin granted the tenant of `record` command targets (a
    record made before the grant existed has no member: not granted)."""
    return bool(record and record.get("commands"))


def command_field(spec: dict) -> str | None:
    """The member of a job spec that names a command target, or None."""
    for field, target in dag.targets(spec):
        if target.get("type") == "command":
            return f"{field}.type"
    return None


def command_refusal(record: dict | None, tenant: str, spec: dict) -> dict | None:
    """The refusal of a job spec with a command target for a tenant without
    the grant (its record: `record`), or None. Apply and the API both ask."""
    field = command_field(spec)
    if field is None or commands_granted(record):
        return None
    return {"ok": False, "error": "forbidden", "field": field,
            "detail": f"tenant {tenant} may not run commands: an admin grants it with "
                      f"PUT /v1/tenants/{tenant} {{\"commands\": true}}"}


def command_refusal_in(tx: Tx, tenant: str, spec: dict) -> dict | None:
    """command_refusal for apply: the tenant's record is read only for a spec
    with a command target, so a create of any other job reads nothing more."""
    if command_field(spec) is None:
        return None
    return command_refusal(tenant_record(tx, tenant), tenant, spec)


def command_run_refusal(record: dict | None, tenant: str) -> str | None:
    """Why a run of a command target of `tenant` must not start (the grant was
    withdrawn after its job was made), or None."""
    if commands_granted(record):
        return None
    return (f"tenant {tenant} may not run commands (an admin grants it: "
            f"PUT /v1/tenants/{tenant} {{\"commands\": true}}); the command was not started")


def _quota_refusal(limit: str, detail: str, retry_after_s: int) -> dict:
    return {"ok": False, "error": "quota", "limit": limit, "detail": detail,
            "retry_after_s": retry_after_s}


class CreateCounter:
    """Counts one command's creates against a tenant's quota, and writes the
    tenant record once at the end (a batch of 250 creates writes it once)."""

    def __init__(self, tx: Tx, tenant: str, quota: commands.CreateQuota | dict | None,
                 at_ms: int) -> None:
        if isinstance(quota, commands.CreateQuota):   # judged as the edge judges a map
            quota = {"jobs_max": quota.jobs_max, "creates_per_s": quota.creates_per_s}
        self._tx, self._tenant, self._quota, self._at_ms = tx, tenant, quota, at_ms
        self._record = tenant_record(tx, tenant)
        self._refill_done = False

    def take(self) -> dict | None:
        """Count one create; a refusal (the result to answer) when over a quota."""
        if self._record is None:
            self._record = _new_tenant(self._tx, self._tenant, self._at_ms)
            if self._record is None:
                return _quota_refusal("tenants_max", f"the cluster holds {limits.tenants_max} "
                                      f"tenants (tenants_max)", 60)
        if self._quota is not None:
            refusal = _over_quota(self._record, self._quota, self._tenant, self._at_ms,
                                  refill=not self._refill_done)
            self._refill_done = True
            if refusal is not None:
                return refusal
        self._record["jobs"] += 1
        return None

    def finish(self) -> None:
        if self._record is not None:
            self._tx.put(TENANTS, self._tenant.encode(), self._record)


def _over_quota(rec: dict, quota: dict, tenant: str, at_ms: int, refill: bool) -> dict | None:
    """The refusal of one more create by `tenant` under `quota`, or None; takes
    a create from its bucket when there is one to take."""
    if rec["jobs"] >= quota["jobs_max"]:
        return _quota_refusal("jobs_max", f"tenant {tenant} has {rec['jobs']} "
                              f"jobs, its jobs_max; delete some first", 60)
    return _take_token(rec, quota["creates_per_s"], tenant, at_ms, refill)


def _take_token(rec: dict, rate_per_s: int, tenant: str, at_ms: int,
                refill: bool) -> dict | None:
    """The bucket, in thousandths of a create: it refills `rate_per_s` per
    second of at_ms and holds tenant_create_burst_s seconds' worth (refilled
    once a command: `refill`)."""
    capacity = max(1000, int(rate_per_s * limits.tenant_create_burst_s * 1000))
    if refill:
        if rec["bucket_milli"] is None:
            rec["bucket_milli"], rec["bucket_ms"] = capacity, at_ms
        elif at_ms > rec["bucket_ms"]:
            gained = (at_ms - rec["bucket_ms"]) * rate_per_s
            rec["bucket_milli"] = min(capacity, rec["bucket_milli"] + gained)
            rec["bucket_ms"] = at_ms
        rec["bucket_milli"] = min(rec["bucket_milli"], capacity)
    if rec["bucket_milli"] < 1000:
        wait_ms = -(-(1000 - rec["bucket_milli"]) // rate_per_s)
        return _quota_refusal("creates_per_s", f"tenant {tenant} creates more than "
                              f"{rate_per_s} jobs a second (creates_per_s)",
                              max(1, -(-wait_ms // 1000)))
    rec["bucket_milli"] -= 1000
    return None


def create_refusal(record: dict | None, quota: dict | None, tenant: str,
                   at_ms: int) -> dict | None:
    """What apply would answer to one create by `tenant` at `at_ms` under
    `quota`, judged on a copy of its tenant record: the quota refusal, or None.
    The API asks before it proposes, so that a create over a quota does not
    cost a Raft entry (it judges again on caught-up state before it refuses).
    A tenant without a record is judged by apply alone (only tenants_max can
    refuse its first create)."""
    if record is None or quota is None:
        return None
    # A shallow copy: the judgement changes only the record's own numbers.
    return _over_quota(dict(record), quota, tenant, at_ms, refill=True)


def release_job(tx: Tx, tenant: str) -> None:
    """A job stopped counting towards its tenant's jobs_max (deleted, or purged)."""
    rec = tenant_record(tx, tenant)
    if rec is not None and rec["jobs"] > 0:
        rec["jobs"] -= 1
        tx.put(TENANTS, tenant.encode(), rec)


def handle_put_tenant(tx: Tx, cmd: commands.Command) -> dict:
    tenant = cmd.tenant
    rec = tenant_record(tx, tenant) or _new_tenant(tx, tenant, cmd.at_ms)
    if rec is None:
        return {"ok": False, "error": "limit", "limit": "tenants_max", "field": "tenant",
                "detail": f"the cluster holds {limits.tenants_max} tenants (tenants_max)"}
    rec["quota"] = {q: getattr(cmd.quota, q) for q in QUOTA_NAMES}
    if cmd.commands is not None:   # left out: the grant stays as it was
        rec["commands"] = cmd.commands
    rec.setdefault("commands", False)
    tx.put(TENANTS, tenant.encode(), rec)
    audit(tx, cmd, "tenant.put", tenant, tenant, quota=rec["quota"], commands=rec["commands"])
    return {"ok": True, "tenant": rec}


def handle_delete_tenant(tx: Tx, cmd: commands.Command) -> dict:
    """Drop a tenant's record, which frees its place under tenants_max. Only a
    tenant without jobs (deleted ones do not count) may go: the record holds
    the count its jobs_max is judged by. The tenant's tokens stay valid; a
    create by one of them makes a new record, with the node flags' quotas."""
    tenant = cmd.tenant
    rec = tenant_record(tx, tenant)
    if rec is None:
        return {"ok": False, "error": "not_found", "detail": f"tenant {tenant} has no record"}
    if rec["jobs"] > 0:
        return {"ok": False, "error": "conflict",
                "detail": f"tenant {tenant} has {rec['jobs']} jobs; delete them first"}
    tx.delete(TENANTS, tenant.encode())
    _set_count(tx, _TENANTS_COUNTER, max(0, _count(tx, _TENANTS_COUNTER) - 1))
    audit(tx, cmd, "tenant.delete", tenant, tenant)
    return {"ok": True}


# --- tokens -------------------------------------------------------------------------------

def handle_create_token(tx: Tx, cmd: commands.Command) -> dict:
    key = cmd.token_id.encode()
    if tx.get(TOKENS, key) is not None:
        return {"ok": False, "error": "conflict", "detail": f"token {cmd.token_id} exists"}
    count = _count(tx, _TOKENS_COUNTER)
    if count >= limits.tokens_max:
        return {"ok": False, "error": "limit", "limit": "tokens_max", "field": "token",
                "detail": f"the cluster holds {count} tokens (tokens_max); revoke some"}
    record = {"v": 1, "id": cmd.token_id, "tenant": cmd.tenant, "role": cmd.role,
              "name": cmd.name, "sha256": cmd.sha256, "created_ms": cmd.at_ms,
              "created_by": cmd.actor}
    tx.put(TOKENS, key, record)
    _set_count(tx, _TOKENS_COUNTER, count + 1)
    audit(tx, cmd, "token.create", cmd.tenant, cmd.token_id, role=cmd.role,
          name=cmd.name)
    return {"ok": True, "token": record}


def handle_revoke_token(tx: Tx, cmd: commands.Command) -> dict:
    key = cmd.token_id.encode()
    record = tx.get(TOKENS, key)
    if record is None:
        return {"ok": False, "error": "not_found", "detail": f"token {cmd.token_id} not found"}
    tx.delete(TOKENS, key)
    _set_count(tx, _TOKENS_COUNTER, max(0, _count(tx, _TOKENS_COUNTER) - 1))
    audit(tx, cmd, "token.revoke", record["tenant"], cmd.token_id)
    return {"ok": True, "token": record}


# --- audit --------------------------------------------------------------------------------

def audit(tx: Tx, cmd: commands.Command, action: str, tenant: str | None, subject: str,
          **detail: object) -> None:
    """Append one audit record (seq 1, 2, ...) to its stream, and drop that
    stream's oldest record when the stream is over its bound."""
    seq = _count(tx, _AUDIT_COUNTER) + 1
    _set_count(tx, _AUDIT_COUNTER, seq)
    actor = cmd.actor
    tx.put(AUDIT, keys.u64(seq), {"v": 1, "seq": seq, "at_ms": cmd.at_ms,
                                  "actor": actor, "action": action,
                                  "tenant": tenant, "subject": subject, "detail": detail})
    _drop_unstreamed(tx, seq)
    stream = audit_stream(tx, action, tenant, actor)
    ring = tx.get(COUNTERS, _stream_counter(stream)) or {"v": 1, "first": 1, "next": 1}
    tx.put(AUDIT_STREAMS, _stream_key(stream, ring["next"]), seq)
    ring["next"] += 1
    kept = ring["next"] - ring["first"]
    if stream == ADMIN_STREAM:
        if kept > limits.audit_admin_entries_max:
            _drop_oldest(tx, stream, ring)
    else:
        pool = _count(tx, _AUDIT_POOL_COUNTER) + 1
        if kept > limits.audit_entries_per_tenant_max or (
                pool > limits.audit_entries_max and kept > limits.audit_entries_kept_min):
            _drop_oldest(tx, stream, ring)
            pool -= 1
        _set_count(tx, _AUDIT_POOL_COUNTER, pool)
    tx.put(COUNTERS, _stream_counter(stream), ring)


def audit_stream(tx: Tx, action: str, tenant: str | None, actor: str | None) -> str:
    """Whose stream a record is kept in: the admin's for cluster administration
    and for whatever an admin token did, else its tenant's."""
    if tenant is None or action.startswith(_ADMIN_ACTIONS) or actor in _ADMIN_ACTORS:
        return ADMIN_STREAM
    token = tx.get(TOKENS, actor.encode()) if actor else None
    if token is not None and token["role"] == "admin":
        return ADMIN_STREAM
    return tenant


def _stream_counter(stream: str) -> bytes:
    return _AUDIT_COUNTER + b"\x00" + stream.encode()


def _stream_key(stream: str, n: int) -> bytes:
    return stream.encode() + b"\x00" + keys.u64(n)


def _drop_oldest(tx: Tx, stream: str, ring: dict) -> None:
    key = _stream_key(stream, ring["first"])
    seq = tx.get(AUDIT_STREAMS, key)
    if seq is not None:
        tx.delete(AUDIT, keys.u64(seq))
        tx.delete(AUDIT_STREAMS, key)
    ring["first"] += 1


def _drop_unstreamed(tx: Tx, seq: int) -> None:
    """Records from before streams (seq under audit_streams_from) go as the
    table used to drop them: once the sequence is audit_entries_max past."""
    streams_from = tx.get(COUNTERS, _AUDIT_STREAMS_FROM)
    if streams_from is None:
        _set_count(tx, _AUDIT_STREAMS_FROM, seq)
        streams_from = {"count": seq}
    old = seq - limits.audit_entries_max
    if 1 <= old < streams_from["count"]:
        tx.delete(AUDIT, keys.u64(old))
