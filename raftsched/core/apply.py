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
    False (or a `stale` count) and no writes.
  - apply never raises on a command that decoded (commands.decode checked its
    shape): a raise would happen on every replica at once. A write the store
    cannot hold (Tx refuses the key) refuses the whole command with error
    `refused`. An exception inside a handler (a failed assert, an
    InvalidTransition, any other bug) refuses the whole command with error
    `apply_failed` and the stack in `traceback`, which the node logs as a bug.
    Either way the transition has no writes and no effects, so every replica
    agrees, and only the entry's index is recorded. Only a failure to read the
    view (this node's storage) passes through: that node must stop.
"""

from __future__ import annotations

import traceback
from typing import Callable

from raftsched import limits
from raftsched.core import (backfill, commands, compact, keys, lifecycle, redrive, retention,
                            runs, tenancy, topics)
from raftsched.core.firing import DEFAULT_MISFIRE, PENDING_ONCE_SPEC, armable, due_at_ms
from raftsched.core.timeutil import format_ms
from raftsched.core.tx import (ALERTS, AUDIT, DUE, GROUPS, IDEM, JOB_STATE, JOBS,
                               JOBS_BY_TENANT, LEASES, NODES, READY, RECORD_VERSION, RUNS,
                               RUNS_OPEN, SHARDS, TABLES, TALLY_MISFIRE, TENANTS, TOKENS,
                               TOPIC_IDEM, TOPIC_META, TOPICS, AlertPending, DueArmed, NodeRenewed,
                               RunCancelled, RunQueued, ShardsAssigned, TopicAppended, Transition,
                               Tx, View, ViewFailed, WriteRefused, job_state_record, live_job,
                               refuse)
from raftsched.errors import CommandRefused

# The tables and effects are defined in core/tx.py; the rest of the code
# imports them from here, next to apply().
__all__ = ["apply", "apply_entry", "refused_transition", "misfire_decisions", "HANDLERS",
           "DEFAULT_MISFIRE", "ALERTS", "DUE", "GROUPS", "IDEM", "JOBS", "LEASES", "NODES",
           "READY", "RECORD_VERSION", "RUNS", "RUNS_OPEN", "SHARDS", "TABLES",
           "TOPIC_IDEM", "TOPIC_META", "TOPICS", "TOKENS", "TENANTS", "AUDIT",
           "AlertPending", "DueArmed", "NodeRenewed", "RunCancelled", "RunQueued",
           "ShardsAssigned", "TopicAppended", "Transition", "View"]

_refuse = refuse
_live_job = live_job


def apply(view: View, command: commands.Command, index: int) -> Transition:
    assert index > 0
    tag = commands.tag_of(command)
    handler = HANDLERS[tag]
    tx = Tx(view)
    try:
        result = handler(tx, command)
    except (ViewFailed, MemoryError):
        raise   # this node's trouble, not the command's (see the module docstring)
    except WriteRefused as exc:
        return refused_transition("refused", f"{tag}: {exc.detail}")
    except Exception as exc:
        return refused_transition("apply_failed", f"{tag}: {exc!r}",
                                  traceback=_stack_text(exc))
    return tx.transition(result)


def apply_entry(view: View, data: bytes, index: int) -> tuple[str | None, Transition]:
    """Decode one log entry and apply it: (its tag, the transition). An entry
    that does not decode to a well-formed command is refused whole with error
    `invalid_command` (tag None). UnknownCommand passes through: a newer
    build's entry, which this node must not skip."""
    try:
        command = commands.decode(data)
    except CommandRefused as exc:
        return None, refused_transition("invalid_command", exc.detail, field=exc.field or "")
    return commands.tag_of(command), apply(view, command, index)


def refused_transition(error: str, detail: str, **extra: str) -> Transition:
    """A command refused whole: no writes, no effects."""
    return Transition(writes=(), effects=(), result={"ok": False, "error": error,
                                                     "detail": detail, **extra})


def _stack_text(exc: BaseException) -> str:
    """Where a handler raised, one frame a line. Source lines are not looked
    up: that would read files, and apply does no I/O."""
    frames = traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__),
                                            lookup_lines=False)
    lines = [f"  {f.filename}:{f.lineno} in {f.name}" for f in frames]
    return "\n".join(["Traceback (most recent call last):", *lines,
                      f"{type(exc).__name__}: {exc}"])


# --- jobs ------------------------------------------------------------------------------

def _arm(tx: Tx, job: dict) -> None:
    if job["next_ms"] is not None and job["status"] == "active":
        due_ms = due_at_ms(job, job["next_ms"])
        value = keys.due_value(job["tenant"], job["spec"].get("priority"))
        if armable(job["spec"]):
            value["a"] = 1   # the trigger may fire it ahead (runtime/trigger.py)
        tx.put(DUE, keys.due_key(job["shard"], due_ms, job["id"]), value)
        tx.effects.append(DueArmed(shard=job["shard"], due_ms=due_ms))


def _disarm(tx: Tx, job: dict) -> None:
    if job["next_ms"] is not None:
        tx.delete(DUE, keys.due_key(job["shard"], due_at_ms(job, job["next_ms"]), job["id"]))


def _create_job(tx: Tx, cmd: commands.CreateJob) -> dict:
    counter = tenancy.CreateCounter(tx, cmd.tenant, commands.given(cmd.quota), cmd.at_ms)
    result = _create_one(tx, cmd, cmd.tenant, cmd.at_ms, counter)
    if result.get("ok") and not result.get("existing"):
        counter.finish()
        tenancy.audit(tx, cmd, "job.create", cmd.tenant, cmd.job_id)
    return result


def _create_one(tx: Tx, item: commands.CreateJob | commands.CreateJobItem, tenant: str,
                at_ms: int, counter: tenancy.CreateCounter) -> dict:
    """One job of a create_job or a create_jobs, of `tenant` at `at_ms`."""
    if item.spec.__class__ is compact.LeanSpec:
        if CREATE_FROM_STORED:
            return _create_lean(tx, item, tenant, at_ms, counter)
        item.spec = item.spec.whole()
    idem = item.idempotency_key
    if idem is not None:
        reserved = tx.get(IDEM, keys.idem_key(tenant, idem))
        if reserved is not None:
            return _idempotent_answer(tx, idem, reserved)
    if tx.get(JOBS, keys.job_key(item.job_id)) is not None:
        return _refuse("conflict", f"job {item.job_id} exists")
    refusal = tenancy.command_refusal_in(tx, tenant, item.spec)
    if refusal is not None:
        return refusal
    refusal = counter.take()
    if refusal is not None:
        return refusal
    job = {"v": RECORD_VERSION, "id": item.job_id, "tenant": tenant,
           "spec": item.spec, "status": "active", "version": 1, "shard": item.shard,
           "next_ms": item.next_ms, "created_ms": at_ms, "updated_ms": at_ms,
           "idempotency_key": idem, "last_run_id": None}
    tx.put(JOBS, keys.job_key(job["id"]), job)
    tx.put(JOBS_BY_TENANT, keys.jobs_by_tenant_key(job["tenant"], job["id"]), 1)
    if idem is not None:
        tx.put(IDEM, keys.idem_key(tenant, idem), retention.idem_value(job["id"], at_ms))
    _arm(tx, job)
    return {"ok": True, "existing": False, "job": job}


# Whether a create whose spec decoding left as stored (compact.LeanSpec) is
# written from it (_create_lean); tests/test_create_lean.py turns it off to
# compare with the whole spec's create.
CREATE_FROM_STORED = True


def _create_lean(tx: Tx, item: commands.CreateJobItem, tenant: str, at_ms: int,
                 counter: tenancy.CreateCounter) -> dict:
    """_create_one of a pending one-off whose spec a create reads nothing of
    but its time (compact.LeanSpec): its record written in the form it is
    stored in (compact.created_pending_once), not built whole and compacted,
    and its due entry as _arm writes that of such a job (priority normal,
    armable, no jitter). Answered with the record as stored
    (compact.CreatedJob), which the node that proposed it reads whole."""
    idem = item.idempotency_key
    if idem is not None:
        reserved = tx.get(IDEM, keys.idem_key(tenant, idem))
        if reserved is not None:
            return _idempotent_answer(tx, idem, reserved)
    key = keys.job_key(item.job_id)
    if tx.get(JOBS, key) is not None:
        return _refuse("conflict", f"job {item.job_id} exists")
    refusal = counter.take()
    if refusal is not None:
        return refusal
    stored = compact.created_pending_once(item.spec, RECORD_VERSION, item.job_id, key, tenant,
                                          item.shard, item.next_ms, at_ms, idem)
    tx.put_stored(JOBS, key, stored)
    tx.put(JOBS_BY_TENANT, keys.jobs_by_tenant_key(tenant, item.job_id), 1)
    if idem is not None:
        tx.put(IDEM, keys.idem_key(tenant, idem), retention.idem_value(item.job_id, at_ms))
    if item.next_ms is not None:
        value = keys.due_value(tenant, None)
        value["a"] = 1
        tx.put(DUE, keys.due_key(item.shard, item.next_ms, item.job_id), value)
        tx.effects.append(DueArmed(shard=item.shard, due_ms=item.next_ms))
    return {"ok": True, "existing": False,
            "job": compact.CreatedJob(stored, key, item.job_id, item.next_ms)}


def _create_jobs(tx: Tx, cmd: commands.CreateJobs) -> dict:
    """A batch of creates, each exactly a create_job, in order: an item sees the
    items before it (a key used twice creates one job), and an item that is
    refused (a reserved key, an id that exists, a quota) refuses only itself.
    The batch is one audit record naming the jobs it created."""
    counter = tenancy.CreateCounter(tx, cmd.tenant, commands.given(cmd.quota), cmd.at_ms)
    results = [_create_one(tx, item, cmd.tenant, cmd.at_ms, counter) for item in cmd.items]
    counter.finish()
    created = [item.job_id for item, r in zip(cmd.items, results)
               if r.get("ok") and not r.get("existing")]
    if created:
        tenancy.audit(tx, cmd, "job.create", cmd.tenant, created[0], jobs=created)
    return {"ok": True, "results": results}


def _create_jobs_compact(tx: Tx, cmd: commands.CreateJobsCompact) -> dict:
    """A create_jobs whose specs left out the members equal to their defaults:
    each spec restored first (fresh from the decoder, so in place), so that
    it stores and answers what the create_jobs of the whole specs would."""
    for item in cmd.items:
        compact.expand_spec(item.spec)
    return _create_jobs(tx, cmd)


def _scoped_job(tx: Tx, cmd: commands.Command) -> dict | None:
    """The live job a write names, if it belongs to the tenant the write is for
    (another tenant's job is answered as not found)."""
    job = _live_job(tx, cmd.job_id)
    tenant = commands.given(cmd.tenant)
    if job is None or (tenant is not None and job["tenant"] != tenant):
        return None
    return job


def _idempotent_answer(tx: Tx, idem: str, reserved: object) -> dict:
    """A create whose key is reserved: the job it created, while that job is
    not deleted; else a refusal, since the key stays reserved until its TTL
    (the proposer says until when, from `reserved_ms`)."""
    job_id, _ = retention.idem_entry(reserved)
    job = tx.get(JOBS, keys.job_key(job_id))
    if job is not None and job["status"] != "deleted":
        return {"ok": True, "existing": True, "job": job}
    gone = "was deleted" if job is not None else "no longer exists"
    return {"ok": False, "error": "idempotency_key_reserved", "field": "idempotency_key",
            "job_id": job_id, "reserved_ms": retention.idem_created_ms(tx, reserved),
            "detail": f"idempotency_key {idem!r} was used by job {job_id}, which {gone}; "
                      f"the key stays reserved"}


def _update_job(tx: Tx, cmd: commands.Command) -> dict:
    job = _scoped_job(tx, cmd)
    if job is None:
        return _refuse("not_found", f"job {cmd.job_id} not found")
    if job["version"] != cmd.expected_version:
        return _refuse("conflict", f"job {job['id']} changed (version {job['version']}, "
                                   f"expected {cmd.expected_version}); read it and retry")
    refusal = tenancy.command_refusal_in(tx, job["tenant"], cmd.spec)
    if refusal is not None:
        return refusal
    if _rearmed(job["spec"], cmd.spec):
        runs.withdraw_armed(tx, job, cmd.at_ms, "the job's schedule was changed")
    _disarm(tx, job)
    job["spec"] = cmd.spec
    job["version"] += 1
    job["updated_ms"] = cmd.at_ms
    job["next_ms"] = cmd.next_ms
    if job["status"] == "completed" and cmd.next_ms is not None:
        job["status"] = "active"
    tx.put(JOBS, keys.job_key(job["id"]), job)
    _arm(tx, job)
    tenancy.audit(tx, cmd, "job.update", job["tenant"], job["id"])
    return {"ok": True, "job": job}


def _delete_job(tx: Tx, cmd: commands.Command) -> dict:
    job = _scoped_job(tx, cmd)
    if job is None:
        return _refuse("not_found", f"job {cmd.job_id} not found")
    # The idempotency key stays reserved until its TTL (the purger removes it),
    # so a retried create of this job cannot create it again.
    _disarm(tx, job)
    runs.withdraw_armed(tx, job, cmd.at_ms, "the job was deleted")
    job.update(status="deleted", next_ms=None, updated_ms=cmd.at_ms, version=job["version"] + 1)
    tx.put(JOBS, keys.job_key(job["id"]), job)
    tenancy.release_job(tx, job["tenant"])
    tenancy.audit(tx, cmd, "job.delete", job["tenant"], job["id"])
    return {"ok": True, "job": job}


def _pause_job(tx: Tx, cmd: commands.Command) -> dict:
    """Pause an active job, keeping the command's note (why) until it resumes.
    A paused job is left as it is, but for a new note, which replaces its own."""
    job = _scoped_job(tx, cmd)
    if job is None:
        return _refuse("not_found", f"job {cmd.job_id} not found")
    note = commands.given(cmd.note)
    if job["status"] == "paused" and note is not None and note != job.get("pause_note"):
        job.update(pause_note=note, updated_ms=cmd.at_ms, version=job["version"] + 1)
        tx.put(JOBS, keys.job_key(job["id"]), job)
        tenancy.audit(tx, cmd, "job.pause", job["tenant"], job["id"])
        return {"ok": True, "job": job}
    if job["status"] not in ("active", "completed"):
        return {"ok": True, "job": job}
    # A one-off completes when it fires: fired ahead, its armed run is
    # withdrawn and the job paused, as it would be had it not fired yet.
    withdrawn = runs.withdraw_armed(tx, job, cmd.at_ms, "the job was paused")
    if job["status"] == "completed" and not withdrawn:
        return {"ok": True, "job": job}
    _disarm(tx, job)
    job.update(status="paused", next_ms=None, updated_ms=cmd.at_ms, version=job["version"] + 1,
               pause_note=note, paused_ms=cmd.at_ms)
    tx.put(JOBS, keys.job_key(job["id"]), job)
    tenancy.audit(tx, cmd, "job.pause", job["tenant"], job["id"])
    return {"ok": True, "job": job}


def _rearmed(old: dict, new: dict) -> bool:
    """Does an update change when, or whether, the job's runs may be armed
    (its schedule or run_at, its jitter, or what makes it armable)? Then the
    runs armed under the old spec are withdrawn, and the new next occurrence
    fires as any other. Any other change (its target, say) leaves them: the
    call reads the job's spec as it is then."""
    return (old["schedule"] != new["schedule"] or old.get("jitter_ms") != new.get("jitter_ms")
            or armable(old) != armable(new))


def _resume_job(tx: Tx, cmd: commands.Command) -> dict:
    job = _scoped_job(tx, cmd)
    if job is None:
        return _refuse("not_found", f"job {cmd.job_id} not found")
    if job["status"] != "paused":
        return {"ok": True, "job": job}
    job.update(status="active", next_ms=cmd.next_ms, updated_ms=cmd.at_ms,
               version=job["version"] + 1, pause_note=None, paused_ms=None)
    if job["next_ms"] is None and job["spec"]["schedule"]["kind"] != "none":
        job["status"] = "completed"   # (a DAG job without a schedule never completes)
    tx.put(JOBS, keys.job_key(job["id"]), job)
    _arm(tx, job)
    tenancy.audit(tx, cmd, "job.resume", job["tenant"], job["id"])
    return {"ok": True, "job": job}


# --- runs ------------------------------------------------------------------------------


def _shard_state(tx: Tx, shard: int) -> dict:
    return tx.get(SHARDS, keys.shard_key(shard)) or {
        "v": 1, "owner": None, "token": 0, "checkpoint_ms": 0, "stale_fires": 0}


def misfire_decisions(policy: dict, occurrences: list[int], at_ms: int,
                      due_at: Callable[[int], int] | None = None
                      ) -> list[tuple[int, str, str | None]]:
    """For each occurrence a fire covers: (occurrence_ms, state, reason), where
    state is queued (run it), missed or skipped (record why it did not run).

    Lateness is at_ms minus when the occurrence was due to fire (`due_at`: the
    occurrence plus the job's jitter delay; the occurrence itself by default).
    With a `catchup_window_ms`, an occurrence later than the window is missed
    and the policy decides among the others."""
    window_ms = policy.get("catchup_window_ms")
    if window_ms is None:
        return _policy_decisions(policy, occurrences, at_ms, due_at)
    due_at = due_at or _itself
    inside = [o for o in occurrences if at_ms - due_at(o) <= window_ms]
    outside = [(o, lifecycle.MISSED, f"fired {at_ms - due_at(o)} ms late, older than the "
                                     f"catch-up window of {window_ms} ms")
               for o in occurrences if at_ms - due_at(o) > window_ms]
    decided = _policy_decisions(policy, inside, at_ms, due_at) if inside else []
    return sorted(outside + decided, key=lambda decision: decision[0])


def _itself(occurrence_ms: int) -> int:
    return occurrence_ms


def _policy_decisions(policy: dict, occurrences: list[int], at_ms: int,
                      due_at: Callable[[int], int] | None) -> list[tuple[int, str, str | None]]:
    kind = policy["policy"]
    if kind == "fire_all":
        return [(o, lifecycle.QUEUED, None) for o in occurrences]
    if kind == "skip":
        tolerance = policy["tolerance_ms"]
        due_at = due_at or _itself
        return [(o, lifecycle.QUEUED, None) if at_ms - due_at(o) <= tolerance else
                (o, lifecycle.SKIPPED, f"fired {at_ms - due_at(o)} ms late, over the misfire "
                                       f"tolerance of {tolerance} ms (skip policy)")
                for o in occurrences]
    assert kind == "fire_once", kind
    latest = occurrences[-1]
    return [(o, lifecycle.MISSED, f"missed while nothing could fire; one late run for "
                                  f"{latest} instead (fire_once policy)")
            for o in occurrences[:-1]] + [(latest, lifecycle.QUEUED, None)]


def _fire(tx: Tx, cmd: commands.Fire) -> dict:
    return _fire_part(tx, cmd, cmd.node, cmd.at_ms)


def _fire_part(tx: Tx, part: commands.Fire | commands.FirePart, node: str, at_ms: int) -> dict:
    """Fire due entries of one shard, if the proposer still holds the shard's
    fencing token. A stale token (a paused or cut-off former owner) is refused
    and counted; nothing else is written."""
    shard = part.shard
    state = _shard_state(tx, shard)
    if state["token"] != part.token or state["owner"] != node:
        state["stale_fires"] += 1
        tx.put(SHARDS, keys.shard_key(shard), state)
        return {"ok": False, "error": "stale_token", "fired": 0,
                "stale": len(part.items) + len(part.retries),
                "detail": f"shard {shard} token {part.token} from {node}; current "
                          f"token {state['token']} owned by {state['owner']}"}
    fired = stale = 0
    for item in part.items:
        fired_here = _fire_pending_once(tx, shard, item, node, part.token, at_ms)
        if fired_here is not None:
            fired += fired_here
            continue
        job_id, due_ms, next_ms, occurrences = (item.job_id, item.due_ms, item.next_ms,
                                                item.occurrences)
        job = _live_job(tx, job_id)
        if job is None or job["next_ms"] != due_ms:
            stale += 1  # the job changed since the proposer looked
            continue
        # due_ms is the occurrence; its due entry is keyed by when it fires.
        due = keys.due_key(shard, due_at_ms(job, due_ms), job_id)
        if not tx.has(DUE, due):
            stale += 1  # fired already
            continue
        assert occurrences[0] == due_ms, (job_id, due_ms, occurrences)
        fires_at = due_at_ms(job, due_ms)
        if fires_at > at_ms and (not armable(job["spec"]) or len(occurrences) != 1
                                 or fires_at - at_ms > limits.arm_ahead_s_max * 1000):
            stale += 1   # fired ahead though it may not be armed (so far ahead)
            continue
        tx.delete(DUE, due)
        policy = job["spec"].get("misfire", DEFAULT_MISFIRE)
        jittered = bool(job["spec"].get("jitter_ms"))
        due_at = (lambda o, job=job: due_at_ms(job, o)) if jittered else None
        for occurrence, run_state, reason in misfire_decisions(policy, occurrences, at_ms,
                                                               due_at):
            run, created = runs.create_run(tx, job, occurrence, node, at_ms,
                                           "schedule", part.token, run_state, reason)
            if created and jittered:
                run["jitter_ms"] = due_at_ms(job, occurrence) - occurrence
                runs.put_run(tx, run)
            if created and fires_at > at_ms and run_state == lifecycle.QUEUED \
                    and run["state"] in (lifecycle.QUEUED, lifecycle.RUNNING):
                # Armed: its owner calls it at its second; an edit made
                # before then withdraws it (runs.withdraw_armed).
                run["armed_ms"] = at_ms
                runs.put_run(tx, run)
            if run_state == lifecycle.QUEUED:
                fired += int(created)
                job["last_run_id"] = run["id"]
            elif created:
                tx.tally(TALLY_MISFIRE, f"{policy['policy']}:{run_state}")
        if item.omitted:
            job["misfires_omitted"] = job.get("misfires_omitted", 0) + 1
        if job["spec"]["schedule"]["kind"] == "once":
            # updated_ms dates the completion: retention counts from it.
            job["status"], job["next_ms"], job["updated_ms"] = "completed", None, at_ms
        else:
            assert next_ms is None or next_ms > occurrences[-1], (job_id, occurrences, next_ms)
            job["next_ms"] = next_ms
            if next_ms is None:
                # A schedule with no occurrence left (past its not_after).
                job["status"], job["updated_ms"] = "completed", at_ms
            _arm(tx, job)
        tx.put_fired_job(job)
    retried, retries_stale = runs.fire_retries(tx, shard, node, part.token,
                                               at_ms, part.retries)
    fired += retried
    stale += retries_stale
    if part.upto_ms > state["checkpoint_ms"]:
        state["checkpoint_ms"] = part.upto_ms
        tx.put(SHARDS, keys.shard_key(shard), state)
    return {"ok": True, "fired": fired, "stale": stale, "node": node}


# Whether a pending one-off fires from its record as stored (_fire_pending_once);
# tests/test_fire_pending.py turns it off to compare with the whole read.
FIRE_PENDING_FROM_STORED = True


def _fire_pending_once(tx: Tx, shard: int, item: commands.FireItem, node: str, token: int,
                       at_ms: int) -> int | None:
    """Fire `item` if its job is a pending one-off whose fire nothing in its
    spec changes (compact.pending_once_facts), reading its record as stored
    rather than the whole job and its spec: the run, its due entry's
    removal and the job's state are written as the whole read's fire
    writes them (tests/test_fire_pending.py holds the two alike): the runs
    it fired (0 when the occurrence's run exists already). None, with
    nothing done, for any other item: it is fired from the whole job."""
    if not FIRE_PENDING_FROM_STORED or item.omitted or len(item.occurrences) != 1:
        return None
    job_id, due_ms = item.job_id, item.due_ms
    facts = compact.pending_once_facts(tx.stored_pending_job(keys.job_key(job_id)))
    if facts is None:
        return None
    tenant, job_shard, run_at_ms = facts
    due = keys.due_key(shard, due_ms, job_id)
    if job_shard != shard or run_at_ms != due_ms or item.occurrences[0] != due_ms \
            or due_ms - at_ms > limits.arm_ahead_s_max * 1000 or not tx.has(DUE, due):
        return None   # (the whole read says why not)
    tx.delete(DUE, due)
    job = {"id": job_id, "tenant": tenant, "shard": shard, "spec": PENDING_ONCE_SPEC,
           "last_run_id": None}
    run = runs.create_held(tx, job, due_ms, node, token, at_ms)
    held = created = run is not None
    if run is None:
        run, created = runs.create_run(tx, job, due_ms, node, at_ms, "schedule", token,
                                       lifecycle.QUEUED, None)
        if created and due_ms > at_ms and run["state"] in (lifecycle.QUEUED, lifecycle.RUNNING):
            run["armed_ms"] = at_ms
            runs.put_run(tx, run)
    job["last_run_id"] = run["id"]
    del job["spec"]
    # updated_ms dates the completion: retention counts from it.
    job["status"], job["next_ms"], job["updated_ms"] = "completed", None, at_ms
    if held and FIRED_STATE_AS_STORED:
        # The state such a fire always leaves, in the form the stores keep it.
        stored = compact.fired_once_state(run["id"], due_ms, at_ms)
        if CHECK_FIRED_STATE:
            _check_fired_state(job, stored)
        tx.put_stored(JOB_STATE, keys.job_key(job_id), stored)
    else:
        tx.put_job_state(job)
    return int(created)


# Whether a pending one-off's fire whose run was created held writes its job's
# state in its stored form (compact.fired_once_state); tests/test_fire_pending.py
# turns it off to compare.
FIRED_STATE_AS_STORED = True
# Whether each such state is checked against what `compact` writes for the
# state the fire made (the test suite turns it on: tests/conftest.py).
CHECK_FIRED_STATE = False


def _check_fired_state(job: dict, stored: list) -> None:
    """Raise unless `stored` is what put_job_state would have written for `job`."""
    compact.check_as_compacted("fired_once_state", JOB_STATE, job_state_record(job),
                               keys.job_key(job["id"]), stored)


def _miss_uncalled(tx: Tx, cmd: commands.Command) -> dict:
    """Runs `cmd.node` holds in the shard and never called (core/runs.uncalled_late),
    judged job by job by the job's misfire policy as occurrences firing
    late at cmd.at_ms: those it would not run end missed or skipped; the others
    stay held, and are called late. Refused whole unless the node still owns
    the shard under the token."""
    state = _shard_state(tx, cmd.shard)
    if state["owner"] != cmd.node or state["token"] != cmd.token:
        return {"ok": False, "error": "stale_token", "ended": 0,
                "detail": f"shard {cmd.shard} token {cmd.token} from {cmd.node}; current "
                          f"token {state['token']} owned by {state['owner']}"}
    by_job: dict[str, list[dict]] = {}
    for run_id in dict.fromkeys(cmd.run_ids):
        run = runs.get_run(tx, run_id)
        if run is not None and run.get("shard") == cmd.shard and runs.uncalled_late(
                run, cmd.node, cmd.token, cmd.uncalled_after_ms, cmd.at_ms):
            by_job.setdefault(run["job_id"], []).append(run)
    why = (f"fired ahead of its second, and not called: node {cmd.node} stopped "
           f"and called nothing due after {format_ms(cmd.uncalled_after_ms)}")
    ended = _judge_jobs_uncalled(tx, by_job, cmd.at_ms, lambda held: why)
    return {"ok": True, "ended": len(ended), "judged": sum(map(len, by_job.values()))}


def _judge_jobs_uncalled(tx: Tx, by_job: dict[str, list[dict]], at_ms: int,
                         why_of: Callable[[list[dict]], str]) -> list[str]:
    """_judge_uncalled each job's runs never called (`by_job`), in job id
    order, the reason starting with why_of(those runs); write back each job
    with a run ended. The ids of the runs ended."""
    ended: list[str] = []
    for job_id, held in sorted(by_job.items()):
        job = _live_job(tx, job_id)
        if job is None:
            continue   # a deleted job's runs are its deletion's to end
        held.sort(key=lambda run: run["scheduled_ms"])
        ended_here = _judge_uncalled(tx, job, held, at_ms, why_of(held))
        if ended_here:   # (a policy that calls them all leaves the job as it was)
            tx.put(JOBS, keys.job_key(job_id), job)
            ended += ended_here
    return ended


def _judge_uncalled(tx: Tx, job: dict, held: list[dict], at_ms: int, why: str) -> list[str]:
    """End those of `held` (runs of `job` fired ahead and never called, late
    by at_ms) its misfire policy would not run, each with `why` and the
    policy's reason; the ids of those ended."""
    policy = job["spec"].get("misfire", DEFAULT_MISFIRE)
    jittered = bool(job["spec"].get("jitter_ms"))
    due_at = (lambda o, job=job: due_at_ms(job, o)) if jittered else None
    by_occurrence = {run["scheduled_ms"]: run for run in held}
    decisions = misfire_decisions(policy, list(by_occurrence), at_ms, due_at)
    if policy["policy"] == "fire_once" and _later_occurrence_due(tx, job, held, at_ms):
        # A later occurrence is late too (fired late already, or about to
        # be): it is the one late run, and these are all missed.
        decisions = [(o, lifecycle.MISSED, "a later occurrence runs late instead "
                                           "(fire_once policy)") for o, _, _ in decisions]
    ended: list[str] = []
    for occurrence, run_state, reason in decisions:
        if run_state == lifecycle.QUEUED:
            continue   # called late, as the policy says
        if policy["policy"] == "fire_once" and reason is not None \
                and reason.startswith("missed while nothing could fire"):
            reason = (f"the run for {format_ms(decisions[-1][0])} is called late instead "
                      f"(fire_once policy)")
        elif reason is not None:
            reason = reason.removeprefix("fired ")   # "25000 ms late, over ..."
        runs.end_uncalled(tx, job, by_occurrence[occurrence], run_state,
                          f"{why}; {reason}", at_ms)
        tx.tally(TALLY_MISFIRE, f"{policy['policy']}:{run_state}")
        ended.append(by_occurrence[occurrence]["id"])
    return ended


def _later_occurrence_due(tx: Tx, job: dict, held: list[dict], at_ms: int) -> bool:
    """Has `job` an occurrence after the latest of `held` that is due by
    at_ms: its next one, not fired yet, or one fired late whose run is open?"""
    if job.get("next_ms") is not None and due_at_ms(job, job["next_ms"]) <= at_ms:
        return True
    latest, held_ids = held[-1]["scheduled_ms"], {run["id"] for run in held}
    for run_id in job.get("active", []):
        other = None if run_id in held_ids else runs.get_run(tx, run_id)
        if other is not None and other["scheduled_ms"] > latest \
                and due_at_ms(job, other["scheduled_ms"]) <= at_ms:
            return True
    return False


def _fire_many(tx: Tx, cmd: commands.Command) -> dict:
    """Each part exactly as a `fire` of its shard, in order; a part under a
    stale token is refused (and counted) alone."""
    parts = [_fire_part(tx, part, cmd.node, cmd.at_ms) for part in cmd.parts]
    return {"ok": True, "node": cmd.node, "parts": parts,
            "fired": sum(p.get("fired", 0) for p in parts),
            "stale": sum(p.get("stale", 0) for p in parts)}


def _assign_shards(tx: Tx, cmd: commands.Command) -> dict:
    """Give shards to nodes; every (re)assignment bumps the shard's fencing token."""
    tokens = {}
    for assignment in cmd.assignments:
        shard, node = assignment.shard, assignment.node
        state = _shard_state(tx, shard)
        if state["owner"] == node:
            continue
        state["owner"] = node
        state["token"] += 1
        tx.put(SHARDS, keys.shard_key(shard), state)
        tokens[shard] = state["token"]
        tx.effects.append(ShardsAssigned(shard=shard, owner=node, token=state["token"]))
    return {"ok": True, "tokens": tokens}


def _trigger_job(tx: Tx, cmd: commands.Command) -> dict:
    job = _scoped_job(tx, cmd)
    if job is None:
        return _refuse("not_found", f"job {cmd.job_id} not found")
    # Held by the shard's owner, as a fired run is (cmd.node took the request).
    run, created = runs.create_run(tx, job, cmd.scheduled_ms, None, cmd.at_ms,
                                   "manual", overlap=commands.given(cmd.overlap))
    job["last_run_id"] = run["id"]
    tx.put(JOBS, keys.job_key(job["id"]), job)
    tenancy.audit(tx, cmd, "job.trigger", job["tenant"], job["id"], run_id=run["id"])
    return {"ok": True, "run": run, "created": created}


def _take_over_judged(tx: Tx, cmd: commands.Command) -> dict:
    """A shard's new owner takes over the shard's open runs (runs.take_over),
    and a run fired ahead whose holder's shard lease ended before its second
    (runs.lease_bound_ms) was never called: those late by now are judged job
    by job by the job's misfire policy, as the holder would have judged them
    at its restart (miss_uncalled), and those it would not run end missed or
    skipped. The others, and those it runs, move as the same attempt."""
    refusal = runs.take_over_refusal(tx, cmd)
    if refusal is not None:
        return refusal
    bounds: dict[str, int | None] = {}
    late: dict[str, list[dict]] = {}
    for run_id in dict.fromkeys(cmd.run_ids):
        run = runs.get_run(tx, run_id)
        holder = None if run is None else run.get("holder")
        if run is None or run.get("shard") != cmd.shard or holder is None \
                or run["token"] >= cmd.token:
            continue
        if holder not in bounds:
            bounds[holder] = runs.lease_bound_ms(tx, holder)
        bound = bounds[holder]
        if bound is not None and runs.uncalled_late(run, holder, run["token"], bound - 1,
                                                    cmd.at_ms):
            late.setdefault(run["job_id"], []).append(run)

    def why_of(held: list[dict]) -> str:
        holders = sorted({run["holder"] for run in held})
        ends = [bound for holder, bound in bounds.items() if holder in holders and bound]
        return (f"fired ahead of its second, and not called: node {', '.join(holders)} "
                f"held no shard lease after {format_ms(min(ends))}")
    ended = set(_judge_jobs_uncalled(tx, late, cmd.at_ms, why_of))
    result = runs.take_over_runs(tx, cmd, [r for r in cmd.run_ids if r not in ended],
                                 lease_bounds=bounds)
    if ended:
        result["ended"] = len(ended)
        result["stale"] -= len(ended)
    return result


def _register_node(tx: Tx, cmd: commands.Command) -> dict:
    record = {"v": 1, "id": cmd.node, "http": cmd.http, "raft": cmd.raft,
              "registered_ms": cmd.at_ms}
    current = tx.get(NODES, cmd.node.encode())
    if current is None or (current["http"], current["raft"]) != (cmd.http, cmd.raft):
        if current is not None and "renewed_ms" in current:
            record["renewed_ms"] = current["renewed_ms"]   # its lease's end still holds
        tx.put(NODES, cmd.node.encode(), record)
    return {"ok": True}


def _renew(tx: Tx, cmd: commands.Command) -> dict:
    # Liveness is judged by each replica from when it applied the renewal,
    # which is not state every replica must agree on. A renew_recorded keeps
    # the renewal's own time (the node's shard lease ends node_lease_s after
    # it: runs.lease_bound_ms) in the record of a registered node; once a
    # node's record holds one, every replica applies level 4 (a node proposes
    # renew_recorded only then), so each renewal of it after that keeps the
    # latest, recorded or not (a renew, proposed while a peer was not heard).
    tx.effects.append(NodeRenewed(node=cmd.node, at_ms=cmd.at_ms))
    key = cmd.node.encode()
    current = tx.get(NODES, key)
    if current is not None \
            and (isinstance(cmd, commands.RenewRecorded) or "renewed_ms" in current) \
            and cmd.at_ms > current.get("renewed_ms", -1):
        tx.put(NODES, key, {**current, "renewed_ms": cmd.at_ms})
    return {"ok": True}


def _check_digest(tx: Tx, cmd: commands.Command) -> dict:
    # Writes nothing: the runtime digests the state as of this index after the
    # (empty) commit, on every replica (runtime/node.py).
    return {"ok": True}


HANDLERS: dict[str, Callable[[Tx, dict], dict]] = {
    "create_job": _create_job,
    "create_jobs": _create_jobs,
    "create_jobs_compact": _create_jobs_compact,
    # Its specs were made whole when the entry was decoded
    # (commands.StoredCreateJobItem) and are written in the form they came in
    # (compact.StoredSpec): otherwise a create_jobs.
    "create_jobs_stored": _create_jobs,
    "update_job": _update_job,
    "delete_job": _delete_job,
    "pause_job": _pause_job,
    "resume_job": _resume_job,
    "trigger_job": _trigger_job,
    "fire": _fire,
    "fire_many": _fire_many,
    "assign_shards": _assign_shards,
    "run_updates": runs.handle_run_updates,
    "expire_leases": runs.handle_expire_leases,
    "reassign_runs": runs.handle_reassign_runs,
    "take_over_runs": runs.handle_take_over_runs,
    "take_over_judged": _take_over_judged,
    "miss_uncalled": _miss_uncalled,
    "hand_over_runs": runs.handle_hand_over_runs,
    "cancel_run": runs.handle_cancel_run,
    "alert_done": runs.handle_alert_done,
    "publish": topics.handle_publish,
    "commit_offset": topics.handle_commit_offset,
    "purge": retention.handle_purge,
    "register_node": _register_node,
    "renew": _renew,
    "renew_recorded": _renew,
    "check_digest": _check_digest,
    "create_token": tenancy.handle_create_token,
    "revoke_token": tenancy.handle_revoke_token,
    "put_tenant": tenancy.handle_put_tenant,
    "delete_tenant": tenancy.handle_delete_tenant,
    "retry_run": redrive.handle_retry_run,
    "create_backfill": backfill.handle_create_backfill,
    "backfill_step": backfill.handle_backfill_step,
    "cancel_backfill": backfill.handle_cancel_backfill,
}
