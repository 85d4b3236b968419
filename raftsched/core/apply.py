"""apply(view, command, index) -> Transition: the replicated state machine.

Contract (every node relies on it):
  - Deterministic: the output depends only on `view`, `command` and `index`.
    No clock, no randomness, no environment, no zone database.
  - Pure: `view` is only read. The runtime persists `Transition.writes`
    together with `applied_index = index` in one storage transaction, and only
    then performs `Transition.effects`. An entry at or below the persisted
    applied_index is never applied again.
  - Refusals are results, not exceptions: a command about a missing job, a
    stale version or an already-fired occurrence yields a result with `ok`
    False (or a `stale` count) and no writes. Exceptions mean a bug.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

from raftsched.core import keys, lifecycle
from raftsched.errors import InvalidTransition

JOBS = "jobs"
DUE = "due"
RUNS = "runs"
RUNS_BY_JOB = "runs_by_job"
RUNS_OPEN = "runs_open"
SHARDS = "shards"
IDEM = "idem"
NODES = "nodes"
# Every replicated table, in digest order.
TABLES = (JOBS, DUE, RUNS, RUNS_BY_JOB, RUNS_OPEN, SHARDS, IDEM, NODES)

RECORD_VERSION = 1


class View(Protocol):
    """The narrow read interface apply needs. Values are decoded records."""

    def get(self, table: str, key: bytes) -> Any | None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunCreated:
    """A run was created and should be executed by `run["node"]`."""
    run: dict


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
class Transition:
    """What one command does. Persist `writes` (with the index) first, then
    perform `effects`; `result` goes back to the proposer."""
    writes: tuple[tuple[str, bytes, Any | None], ...]
    effects: tuple[RunCreated | DueArmed | ShardsAssigned | NodeRenewed, ...]
    result: dict


class _Tx:
    """Reads through to the view, seeing this command's own writes first."""

    _DELETED = object()

    def __init__(self, view: View) -> None:
        self._view = view
        self._writes: dict[tuple[str, bytes], Any] = {}
        self.effects: list[RunCreated | DueArmed | ShardsAssigned | NodeRenewed] = []

    def get(self, table: str, key: bytes) -> Any | None:
        value = self._writes.get((table, key), None)
        if value is None and (table, key) not in self._writes:
            return self._view.get(table, key)
        return None if value is self._DELETED else value

    def put(self, table: str, key: bytes, value: Any) -> None:
        assert value is not None
        self._writes[(table, key)] = value

    def delete(self, table: str, key: bytes) -> None:
        self._writes[(table, key)] = self._DELETED

    def transition(self, result: dict) -> Transition:
        writes = tuple((t, k, None if v is self._DELETED else v)
                       for (t, k), v in self._writes.items())
        return Transition(writes=writes, effects=tuple(self.effects), result=result)


def apply(view: View, command: dict, index: int) -> Transition:
    assert index > 0
    handler = HANDLERS[command["t"]]
    tx = _Tx(view)
    result = handler(tx, command)
    return tx.transition(result)


# --- jobs ------------------------------------------------------------------------------

def _refuse(error: str, detail: str) -> dict:
    return {"ok": False, "error": error, "detail": detail}


def _arm(tx: _Tx, job: dict) -> None:
    if job["next_ms"] is not None and job["status"] == "active":
        tx.put(DUE, keys.due_key(job["shard"], job["next_ms"], job["id"]), {"v": 1})
        tx.effects.append(DueArmed(shard=job["shard"], due_ms=job["next_ms"]))


def _disarm(tx: _Tx, job: dict) -> None:
    if job["next_ms"] is not None:
        tx.delete(DUE, keys.due_key(job["shard"], job["next_ms"], job["id"]))


def _live_job(tx: _Tx, job_id: str) -> dict | None:
    job = tx.get(JOBS, keys.job_key(job_id))
    if job is None or job["status"] == "deleted":
        return None
    return job


def _create_job(tx: _Tx, cmd: dict) -> dict:
    idem = cmd["idempotency_key"]
    if idem is not None:
        existing_id = tx.get(IDEM, keys.idem_key(cmd["tenant"], idem))
        if existing_id is not None:
            return {"ok": True, "existing": True, "job": tx.get(JOBS, keys.job_key(existing_id))}
    if tx.get(JOBS, keys.job_key(cmd["job_id"])) is not None:
        return _refuse("conflict", f"job {cmd['job_id']} exists")
    job = {"v": RECORD_VERSION, "id": cmd["job_id"], "tenant": cmd["tenant"],
           "spec": cmd["spec"], "status": "active", "version": 1, "shard": cmd["shard"],
           "next_ms": cmd["next_ms"], "created_ms": cmd["at_ms"], "updated_ms": cmd["at_ms"],
           "idempotency_key": idem, "last_run_id": None}
    tx.put(JOBS, keys.job_key(job["id"]), job)
    if idem is not None:
        tx.put(IDEM, keys.idem_key(cmd["tenant"], idem), job["id"])
    _arm(tx, job)
    return {"ok": True, "existing": False, "job": job}


def _update_job(tx: _Tx, cmd: dict) -> dict:
    job = _live_job(tx, cmd["job_id"])
    if job is None:
        return _refuse("not_found", f"job {cmd['job_id']} not found")
    if job["version"] != cmd["expected_version"]:
        return _refuse("conflict", f"job {job['id']} changed (version {job['version']}, "
                                   f"expected {cmd['expected_version']}); read it and retry")
    _disarm(tx, job)
    job["spec"] = cmd["spec"]
    job["version"] += 1
    job["updated_ms"] = cmd["at_ms"]
    job["next_ms"] = cmd["next_ms"]
    if job["status"] == "completed" and cmd["next_ms"] is not None:
        job["status"] = "active"
    tx.put(JOBS, keys.job_key(job["id"]), job)
    _arm(tx, job)
    return {"ok": True, "job": job}


def _delete_job(tx: _Tx, cmd: dict) -> dict:
    job = _live_job(tx, cmd["job_id"])
    if job is None:
        return _refuse("not_found", f"job {cmd['job_id']} not found")
    _disarm(tx, job)
    if job["idempotency_key"] is not None:
        tx.delete(IDEM, keys.idem_key(job["tenant"], job["idempotency_key"]))
    job.update(status="deleted", next_ms=None, updated_ms=cmd["at_ms"], version=job["version"] + 1)
    tx.put(JOBS, keys.job_key(job["id"]), job)
    return {"ok": True, "job": job}


def _pause_job(tx: _Tx, cmd: dict) -> dict:
    job = _live_job(tx, cmd["job_id"])
    if job is None:
        return _refuse("not_found", f"job {cmd['job_id']} not found")
    if job["status"] != "active":
        return {"ok": True, "job": job}
    _disarm(tx, job)
    job.update(status="paused", next_ms=None, updated_ms=cmd["at_ms"], version=job["version"] + 1)
    tx.put(JOBS, keys.job_key(job["id"]), job)
    return {"ok": True, "job": job}


def _resume_job(tx: _Tx, cmd: dict) -> dict:
    job = _live_job(tx, cmd["job_id"])
    if job is None:
        return _refuse("not_found", f"job {cmd['job_id']} not found")
    if job["status"] != "paused":
        return {"ok": True, "job": job}
    job.update(status="active", next_ms=cmd["next_ms"], updated_ms=cmd["at_ms"],
               version=job["version"] + 1)
    if job["next_ms"] is None:
        job["status"] = "completed"
    tx.put(JOBS, keys.job_key(job["id"]), job)
    _arm(tx, job)
    return {"ok": True, "job": job}


# --- runs ------------------------------------------------------------------------------

DEFAULT_MISFIRE = {"policy": "fire_once", "tolerance_ms": 60_000, "catchup_max": 100}


def _shard_state(tx: _Tx, shard: int) -> dict:
    return tx.get(SHARDS, keys.shard_key(shard)) or {
        "v": 1, "owner": None, "token": 0, "checkpoint_ms": 0, "stale_fires": 0}


def _new_run(job: dict, scheduled_ms: int, node: str, at_ms: int, trigger: str,
             token: int, state: str, reason: str | None) -> dict:
    return {"v": RECORD_VERSION, "id": keys.run_id(job["id"], scheduled_ms, 1),
            "job_id": job["id"], "tenant": job["tenant"], "scheduled_ms": scheduled_ms,
            "attempt": 1, "execution_id": keys.execution_id(job["id"], scheduled_ms),
            "state": state, "node": node, "trigger": trigger, "token": token,
            "created_ms": at_ms, "started_ms": None, "finished_ms": None,
            "http_status": None, "error": None, "reason": reason}


def _create_run(tx: _Tx, job: dict, scheduled_ms: int, node: str, at_ms: int, trigger: str,
                token: int = 0, state: str = lifecycle.QUEUED,
                reason: str | None = None) -> tuple[dict, bool]:
    """Create the run (job, scheduled_for, attempt 1) unless it exists: runs are
    identified by (job_id, scheduled_for), so a second fire is a no-op. A run
    created in a terminal state (missed, skipped) only records the occurrence."""
    by_job = keys.runs_by_job_key(job["id"], scheduled_ms, 1)
    existing = tx.get(RUNS_BY_JOB, by_job)
    if existing is not None:
        return tx.get(RUNS, existing.encode()), False
    run = _new_run(job, scheduled_ms, node, at_ms, trigger, token, state, reason)
    tx.put(RUNS, run["id"].encode(), run)
    tx.put(RUNS_BY_JOB, by_job, run["id"])
    if state == lifecycle.QUEUED:
        tx.put(RUNS_OPEN, keys.open_run_key(node, run["id"]), 1)
        tx.effects.append(RunCreated(run=run))
    return run, True


def misfire_decisions(policy: dict, occurrences: list[int], at_ms: int
                      ) -> list[tuple[int, str, str | None]]:
    """For each occurrence a fire covers: (occurrence_ms, state, reason), where
    state is queued (run it), missed or skipped (record why it did not run)."""
    kind = policy["policy"]
    if kind == "fire_all":
        return [(o, lifecycle.QUEUED, None) for o in occurrences]
    if kind == "skip":
        tolerance = policy["tolerance_ms"]
        return [(o, lifecycle.QUEUED, None) if at_ms - o <= tolerance else
                (o, lifecycle.SKIPPED, f"fired {at_ms - o} ms late, over the misfire "
                                       f"tolerance of {tolerance} ms (skip policy)")
                for o in occurrences]
    assert kind == "fire_once", kind
    latest = occurrences[-1]
    return [(o, lifecycle.MISSED, f"missed while nothing could fire; one late run for "
                                  f"{latest} instead (fire_once policy)")
            for o in occurrences[:-1]] + [(latest, lifecycle.QUEUED, None)]


def _fire(tx: _Tx, cmd: dict) -> dict:
    """Fire due entries of one shard, if the proposer still holds the shard's
    fencing token. A stale token (a paused or cut-off former owner) is refused
    and counted; nothing else is written."""
    shard = cmd["shard"]
    state = _shard_state(tx, shard)
    if state["token"] != cmd["token"] or state["owner"] != cmd["node"]:
        state["stale_fires"] += 1
        tx.put(SHARDS, keys.shard_key(shard), state)
        return {"ok": False, "error": "stale_token", "fired": 0, "stale": len(cmd["items"]),
                "detail": f"shard {shard} token {cmd['token']} from {cmd['node']}; current "
                          f"token {state['token']} owned by {state['owner']}"}
    fired = stale = 0
    for job_id, due_ms, next_ms, occurrences, omitted in cmd["items"]:
        due = keys.due_key(shard, due_ms, job_id)
        job = _live_job(tx, job_id)
        if tx.get(DUE, due) is None or job is None or job["next_ms"] != due_ms:
            stale += 1  # fired already, or the job changed since the proposer looked
            continue
        assert occurrences[0] == due_ms, (job_id, due_ms, occurrences)
        tx.delete(DUE, due)
        policy = job["spec"].get("misfire", DEFAULT_MISFIRE)
        for occurrence, run_state, reason in misfire_decisions(policy, occurrences, cmd["at_ms"]):
            run, created = _create_run(tx, job, occurrence, cmd["node"], cmd["at_ms"],
                                       "schedule", cmd["token"], run_state, reason)
            if run_state == lifecycle.QUEUED:
                fired += int(created)
                job["last_run_id"] = run["id"]
        if omitted:
            job["misfires_omitted"] = job.get("misfires_omitted", 0) + 1
        if job["spec"]["schedule"]["kind"] == "once":
            job["status"], job["next_ms"] = "completed", None
        else:
            assert next_ms is None or next_ms > occurrences[-1], (job_id, occurrences, next_ms)
            job["next_ms"] = next_ms
            _arm(tx, job)
        tx.put(JOBS, keys.job_key(job_id), job)
    if cmd["upto_ms"] > state["checkpoint_ms"]:
        state["checkpoint_ms"] = cmd["upto_ms"]
        tx.put(SHARDS, keys.shard_key(shard), state)
    return {"ok": True, "fired": fired, "stale": stale}


def _assign_shards(tx: _Tx, cmd: dict) -> dict:
    """Give shards to nodes; every (re)assignment bumps the shard's fencing token."""
    tokens = {}
    for shard, node in cmd["assignments"]:
        state = _shard_state(tx, shard)
        if state["owner"] == node:
            continue
        state["owner"] = node
        state["token"] += 1
        tx.put(SHARDS, keys.shard_key(shard), state)
        tokens[shard] = state["token"]
        tx.effects.append(ShardsAssigned(shard=shard, owner=node, token=state["token"]))
    return {"ok": True, "tokens": tokens}


def _trigger_job(tx: _Tx, cmd: dict) -> dict:
    job = _live_job(tx, cmd["job_id"])
    if job is None:
        return _refuse("not_found", f"job {cmd['job_id']} not found")
    run, created = _create_run(tx, job, cmd["scheduled_ms"], cmd["node"], cmd["at_ms"], "manual")
    job["last_run_id"] = run["id"]
    tx.put(JOBS, keys.job_key(job["id"]), job)
    return {"ok": True, "run": run, "created": created}


def _run_updates(tx: _Tx, cmd: dict) -> dict:
    applied = stale = 0
    for update in cmd["updates"]:
        run = tx.get(RUNS, update["run_id"].encode())
        if run is None or run["node"] != update["node"]:
            stale += 1  # a run this executor does not own
            continue
        try:
            state = lifecycle.next_state(run["id"], run["state"], update["event"])
        except InvalidTransition:
            # Reports are delivered at least once (a batch retried after a lost
            # answer, a run resumed after a restart): a report the table does
            # not allow from the current state is a duplicate, counted, not applied.
            stale += 1
            continue
        run["state"] = state
        if update["event"] == "start":
            run["started_ms"] = update["at_ms"]
        else:
            run["started_ms"] = run["started_ms"] or update["at_ms"]
            run["finished_ms"] = update["at_ms"]
            run["http_status"] = update.get("http_status")
            run["error"] = update.get("error")
        if state in lifecycle.TERMINAL:
            tx.delete(RUNS_OPEN, keys.open_run_key(run["node"], run["id"]))
        tx.put(RUNS, run["id"].encode(), run)
        applied += 1
    return {"ok": True, "applied": applied, "stale": stale}


def _register_node(tx: _Tx, cmd: dict) -> dict:
    record = {"v": 1, "id": cmd["node"], "http": cmd["http"], "raft": cmd["raft"],
              "registered_ms": cmd["at_ms"]}
    current = tx.get(NODES, cmd["node"].encode())
    if current is None or (current["http"], current["raft"]) != (cmd["http"], cmd["raft"]):
        tx.put(NODES, cmd["node"].encode(), record)
    return {"ok": True}


def _renew(tx: _Tx, cmd: dict) -> dict:
    # No replicated write: liveness is judged by each replica from when it
    # applied the renewal, which is not state every replica must agree on.
    tx.effects.append(NodeRenewed(node=cmd["node"], at_ms=cmd["at_ms"]))
    return {"ok": True}


def _check_digest(tx: _Tx, cmd: dict) -> dict:
    # Writes nothing: the runtime digests the state as of this index after the
    # (empty) commit, on every replica (runtime/node.py).
    return {"ok": True}


HANDLERS: dict[str, Callable[[_Tx, dict], dict]] = {
    "create_job": _create_job,
    "update_job": _update_job,
    "delete_job": _delete_job,
    "pause_job": _pause_job,
    "resume_job": _resume_job,
    "trigger_job": _trigger_job,
    "fire": _fire,
    "assign_shards": _assign_shards,
    "run_updates": _run_updates,
    "register_node": _register_node,
    "renew": _renew,
    "check_digest": _check_digest,
}
