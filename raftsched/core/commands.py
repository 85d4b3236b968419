"""Replicated commands: versioned, tagged msgpack maps; nothing pickled.

Every command is computed completely by its proposer: the time it was proposed
(`at_ms`), the next fire time of a recurring job, the node that will execute a
run. apply never has to read a clock or the zone database, so the same log
gives the same state on every node.
"""

from __future__ import annotations

from typing import Any

from raftsched.core import codec
from raftsched.errors import UnknownCommand

VERSION = 1

TAGS = frozenset({"create_job", "update_job", "delete_job", "pause_job", "resume_job",
                  "trigger_job", "fire", "assign_shards", "run_updates", "register_node", "renew",
                  "check_digest", "expire_leases", "reassign_runs", "cancel_run", "alert_done",
                  "publish", "commit_offset"})


def encode(command: dict) -> bytes:
    assert command.get("v") == VERSION, command
    assert command.get("t") in TAGS, command
    return codec.pack(command)


def decode(data: bytes) -> dict:
    """Refuse loudly what this build cannot apply: a node must not guess."""
    try:
        command = codec.unpack(data)
    except Exception as exc:  # msgpack raises several unrelated types
        raise UnknownCommand(f"log entry is not msgpack: {exc}") from exc
    if not isinstance(command, dict):
        raise UnknownCommand(f"log entry is a {type(command).__name__}, not a map")
    if command.get("v") != VERSION:
        raise UnknownCommand(f"command version {command.get('v')!r}; this build applies "
                             f"version {VERSION} (upgrade this node)")
    if command.get("t") not in TAGS:
        raise UnknownCommand(f"unknown command tag {command.get('t')!r}")
    return command


def _cmd(tag: str, **fields: Any) -> dict:
    return {"v": VERSION, "t": tag, **fields}


def create_job(*, job_id: str, tenant: str, spec: dict, idempotency_key: str | None,
               shard: int, next_ms: int | None, at_ms: int) -> dict:
    return _cmd("create_job", job_id=job_id, tenant=tenant, spec=spec,
                idempotency_key=idempotency_key, shard=shard, next_ms=next_ms, at_ms=at_ms)


def update_job(*, job_id: str, spec: dict, expected_version: int, next_ms: int | None,
               at_ms: int) -> dict:
    return _cmd("update_job", job_id=job_id, spec=spec, expected_version=expected_version,
                next_ms=next_ms, at_ms=at_ms)


def delete_job(*, job_id: str, at_ms: int) -> dict:
    return _cmd("delete_job", job_id=job_id, at_ms=at_ms)


def pause_job(*, job_id: str, at_ms: int) -> dict:
    return _cmd("pause_job", job_id=job_id, at_ms=at_ms)


def resume_job(*, job_id: str, next_ms: int | None, at_ms: int) -> dict:
    return _cmd("resume_job", job_id=job_id, next_ms=next_ms, at_ms=at_ms)


def trigger_job(*, job_id: str, scheduled_ms: int, node: str, at_ms: int) -> dict:
    return _cmd("trigger_job", job_id=job_id, scheduled_ms=scheduled_ms, node=node, at_ms=at_ms)


def fire(*, shard: int, token: int, upto_ms: int, node: str, at_ms: int,
         items: list[tuple[str, int, int | None, list[int], bool]],
         retries: list[tuple[str, int]] = ()) -> dict:
    """Fire due entries of `shard` under fencing `token`. items, one per due
    occurrence: (job_id, due_ms, next_ms or None, occurrences covered
    (ascending, starting with due_ms), omitted: whether occurrences past
    catchup_max were left out). retries, one per due retry: (run_id, due_ms)."""
    return _cmd("fire", shard=shard, token=token, upto_ms=upto_ms, node=node, at_ms=at_ms,
                items=[list(item) for item in items], retries=[list(r) for r in retries])


def assign_shards(*, assignments: list[tuple[int, str]], at_ms: int) -> dict:
    """(shard, node) pairs: each changed owner gets a new fencing token."""
    return _cmd("assign_shards", assignments=[list(a) for a in assignments], at_ms=at_ms)


def run_updates(*, updates: list[dict]) -> dict:
    """Executor reports, each {run_id, event, holder, attempt, at_ms} and:
    start, heartbeat: lease_ms (the new lease expiry, holder's clock);
    finish: ok, retryable, retry_delay_ms (drawn by the proposer), http_status,
    exit_code, error (short), output_node (where the attempt's output is kept)."""
    return _cmd("run_updates", updates=updates)


def expire_leases(*, items: list[tuple[str, int, int]], at_ms: int) -> dict:
    """The reaper's: (run_id, attempt, retry_delay_ms) for leases expired by at_ms."""
    return _cmd("expire_leases", items=[list(i) for i in items], at_ms=at_ms)


def reassign_runs(*, items: list[tuple[str, str, str]], at_ms: int) -> dict:
    """(run_id, from_node, to_node): queued runs of a dead node move to a live one."""
    return _cmd("reassign_runs", items=[list(i) for i in items], at_ms=at_ms)


def cancel_run(*, run_id: str, reason: str, at_ms: int) -> dict:
    return _cmd("cancel_run", run_id=run_id, reason=reason, at_ms=at_ms)


def alert_done(*, run_id: str, outcome: str, error: str | None, at_ms: int) -> dict:
    """outcome: sent | undeliverable | no_webhook."""
    return _cmd("alert_done", run_id=run_id, outcome=outcome, error=error, at_ms=at_ms)


def publish(*, topic: str, key: str | None, message: object, execution_id: str, job_id: str,
            at_ms: int) -> dict:
    return _cmd("publish", topic=topic, key=key, message=message, execution_id=execution_id,
                job_id=job_id, at_ms=at_ms)


def commit_offset(*, topic: str, group: str, offset: int, at_ms: int) -> dict:
    return _cmd("commit_offset", topic=topic, group=group, offset=offset, at_ms=at_ms)


def register_node(*, node: str, http: str, raft: str, at_ms: int) -> dict:
    return _cmd("register_node", node=node, http=http, raft=raft, at_ms=at_ms)


def renew(*, node: str, at_ms: int) -> dict:
    """A node's liveness renewal: writes nothing; every replica notes when it
    applied the latest renewal of each node (see runtime/coordinator.py)."""
    return _cmd("renew", node=node, at_ms=at_ms)


def check_digest(*, node: str, at_ms: int) -> dict:
    """Ask every replica to record its state digest as of this entry's index, so
    replicas can be compared at one index while the log keeps moving."""
    return _cmd("check_digest", node=node, at_ms=at_ms)
