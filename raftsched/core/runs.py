"""Runs in apply: creation under the job's concurrency policy, leases,
attempts, durable retries, cancellation and alerts.

Every state change goes through `lifecycle.next_state`; the indexes that
follow a run's state are kept here and only here:

  RUNS_OPEN  shard | run  a node-executed run not yet ended, under its job's shard
  READY      queue | ms | run   a worker-executed run waiting to be claimed
  LEASES     expiry | run        a worker's running attempt (what the reaper scans)
  DUE        shard | ms | r | run   a retry_wait run's next attempt
  job["active"], job["waiting"]  the job's open runs, for its concurrency policy

The lease is taken at fire. A node-executed run (HTTP, publish, a command
on the default queue) is created already held: running, its holder the
owner of its job's shard, its token that shard's fencing token, its attempt
record opened. There is no `start` entry and no per-run lease: the run is
held while its holder holds the shard (runtime/dispatcher.py calls it only
then). When the shard moves, the new owner takes the shard's open runs over
(`take_over`: the next attempt, under the new token); the old holder's late
finish is refused, as it no longer holds the attempt. Worker-executed runs
keep their claim (`start`), lease and heartbeats.

Callers that pass a `job` record in mutate it and must put it afterwards
(`put_job`); run records are put here.

A DAG job's run is executed by the task runs it releases (core/dagrun.py):
the hooks here hand a DAG run to dagrun where an ordinary run would be queued,
started or cancelled, and tell it of each task run's start, retry and end.
"""

from __future__ import annotations

from raftsched import limits
from raftsched.core import commands, compact, dag, dagrun, keys, lifecycle, retry
from raftsched.core.lifecycle import (ACTIVE, QUEUED, RETRY_WAIT, RUNNING, SCHEDULED, SKIPPED,
                                      SUCCEEDED)
from raftsched.core.tx import (ALERTS, DUE, JOB_STATE, JOBS, LEASES, NODES, READY,
                               RECORD_VERSION, RUNS, RUNS_BY_TENANT, RUNS_OPEN, SHARDS,
                               TALLY_DEAD_LETTER, TALLY_REDELIVERED, TALLY_RETRY, TALLY_RUN_ENDED, AlertPending, DueArmed, RunCancelled,
                               RunQueued, Tx)

DEFAULT_QUEUE = "default"


def worker_queue(spec: dict) -> str | None:
    """The worker queue a job's runs wait in, or None when a node executes them
    (HTTP and publish targets, commands on the default queue). `spec` is a
    job's or a DAG task's; a DAG job's own runs have no queue."""
    target = spec.get("target")
    if target is None:
        return None
    if target["type"] == "command" and target.get("queue", DEFAULT_QUEUE) != DEFAULT_QUEUE:
        return target["queue"]
    return None


def put_job(tx: Tx, job: dict) -> None:
    tx.put(JOBS, keys.job_key(job["id"]), job)


def put_run(tx: Tx, run: dict) -> None:
    tx.put(RUNS, run["id"].encode(), run)


def get_run(tx: Tx, run_id: str) -> dict | None:
    return tx.get(RUNS, run_id.encode())


def _move(run: dict, event: str) -> None:
    run["state"] = lifecycle.next_state(run["id"], run["state"], event)


# --- creation --------------------------------------------------------------------------

def create_run(tx: Tx, job: dict, scheduled_ms: int, node: str | None, at_ms: int,
               trigger: str, token: int | None = None, state: str = QUEUED,
               reason: str | None = None, overlap: str | None = None) -> tuple[dict, bool]:
    """Create the run (job, scheduled_for) unless it exists: a second fire of
    the same occurrence is a no-op. A run asked for as queued goes through the
    job's concurrency policy first (`overlap="allow"` admits it as the allow
    policy would, whatever the job's); one created missed or skipped only
    records the occurrence. `node` and `token`: the shard's owner and token
    when the caller checked them (a fire); None reads them from the shard."""
    run_id = keys.run_id(job["id"], scheduled_ms)
    earlier = get_run(tx, run_id)
    if earlier is not None:
        if not earlier.get("withdrawn"):
            return earlier, False
        # An armed run withdrawn by an edit, whose occurrence the job's
        # schedule brought back (a resume or a PATCH before its second): the
        # occurrence runs after all, in a new record under the same ids.
        job["runs_count"] = max(0, job.get("runs_count", 0) - 1)
    run = {"v": RECORD_VERSION, "id": run_id,
           "job_id": job["id"], "tenant": job["tenant"], "scheduled_ms": scheduled_ms,
           "attempt": 1, "execution_id": keys.execution_id(job["id"], scheduled_ms),
           "state": SCHEDULED, "node": node, "queue": worker_queue(job["spec"]),
           "trigger": trigger, "token": token or 0, "created_ms": at_ms, "queued_ms": None,
           "started_ms": None, "finished_ms": None, "holder": None, "lease_ms": None,
           "retry_due_ms": None, "http_status": None, "exit_code": None, "error": None,
           "reason": reason, "attempts": [], "alert": None,
           "priority": job["spec"].get("priority", "normal"), "shard": job["shard"]}
    if state == QUEUED:
        state, run["reason"] = _admit(tx, job, run, at_ms, overlap)
    if "dag" in job["spec"]:
        dagrun.prepare(run, job["spec"], state)
    tx.put(RUNS_BY_TENANT, keys.runs_by_tenant_key(job["tenant"], scheduled_ms, run["id"]), 1)
    # Runs in the job's history: the purger's count bound reads it (core/retention.py).
    job["runs_count"] = job.get("runs_count", 0) + 1
    if state == QUEUED:
        run["state"] = QUEUED
        _enqueue(tx, run, node, at_ms, token)
        job.setdefault("active", []).append(run["id"])
    elif state == SCHEDULED:
        job.setdefault("waiting", []).append(run["id"])
    else:
        run["state"], run["finished_ms"] = state, at_ms
        tx.tally(TALLY_RUN_ENDED, state)
    put_run(tx, run)
    return run, True


# Whether create_held writes a fired one-off's run in its stored form;
# tests/test_fire_pending.py turns it off to compare with create_run.
CREATE_HELD_AS_STORED = True


def create_held(tx: Tx, job: dict, scheduled_ms: int, node: str, token: int,
                at_ms: int) -> dict | None:
    """create_run of a pending one-off's occurrence fired by its shard's
    owner (`job`: its id, tenant and shard, its spec every default: the
    allow policy, no worker queue, no DAG, priority normal), armed when fired
    before its time: the same run, writes and effect, the run written in
    its stored form (compact.held_run_stored) rather than compacted. None,
    with nothing done, when the run exists (create_run decides)."""
    run_id = keys.run_id(job["id"], scheduled_ms)
    key = run_id.encode()
    if not CREATE_HELD_AS_STORED or not 0 <= scheduled_ms < 1 << 48 or tx.has(RUNS, key):
        return None
    run = {"v": RECORD_VERSION, "id": run_id, "job_id": job["id"], "tenant": job["tenant"],
           "scheduled_ms": scheduled_ms, "attempt": 1,
           "execution_id": keys.execution_id(job["id"], scheduled_ms), "state": RUNNING,
           "node": node, "queue": None, "trigger": "schedule", "token": token,
           "created_ms": at_ms, "queued_ms": at_ms, "started_ms": at_ms, "finished_ms": None,
           "holder": node, "lease_ms": None, "retry_due_ms": None, "http_status": None,
           "exit_code": None, "error": None, "reason": None,
           "attempts": [{"attempt": 1, "holder": node, "started_ms": at_ms, "finished_ms": None,
                         "http_status": None, "exit_code": None, "error": None,
                         "output_node": None, "retry_delay_ms": None}],
           "alert": None, "priority": "normal", "shard": job["shard"]}
    if scheduled_ms > at_ms:
        run["armed_ms"] = at_ms
    tx.put(RUNS_BY_TENANT, keys.runs_by_tenant_key(job["tenant"], scheduled_ms, run_id), 1)
    job["runs_count"] = job.get("runs_count", 0) + 1
    tx.put(RUNS_OPEN, keys.open_run_key(job["shard"], run_id), 1)
    tx.effects.append(RunQueued(run=run))
    job.setdefault("active", []).append(run_id)
    tx.put_stored(RUNS, key, compact.held_run_stored(run, key))
    return run


def _admit(tx: Tx, job: dict, run: dict, at_ms: int,
           overlap: str | None = None) -> tuple[str, str | None]:
    """The concurrency policy's answer for a new occurrence: (state, reason).
    `overlap="allow"`: the allow policy's answer, whatever the job's policy."""
    concurrency = job["spec"].get("concurrency") or {"policy": "allow"}
    policy = "allow" if overlap == "allow" else concurrency["policy"]
    active, waiting = job.get("active", []), job.get("waiting", [])
    if policy == "skip_if_running" and active:
        return SKIPPED, f"run {active[0]} of this job was still open (skip_if_running)"
    if policy == "queue" and (active or waiting):
        bound = concurrency.get("queue_max", limits.concurrency_queue_max_default)
        if len(waiting) >= bound:
            return SKIPPED, (f"{len(waiting)} runs already waiting, the queue bound "
                             f"(concurrency.queue_max {bound})")
        return SCHEDULED, f"waiting for run {(active or waiting)[-1]} (queue policy)"
    if policy == "replace":
        for other_id in list(active):
            other = get_run(tx, other_id)
            if other is not None and other["state"] in ACTIVE:
                cancel(tx, job, other, at_ms, f"replaced by the run for {run['scheduled_ms']} "
                                              f"(replace policy)")
        return QUEUED, None
    if len(active) >= limits.job_active_runs_max:
        return SKIPPED, (f"{len(active)} runs of this job are open (job_active_runs_max)")
    return QUEUED, None


def _enqueue(tx: Tx, run: dict, node: str | None, at_ms: int, token: int | None = None) -> None:
    """Hand a queued run to its executor: its worker queue, or the owner of
    its shard, which holds it from here (`_hold`). A DAG run has no executor:
    its first tasks are released instead. `node` and `token`: the shard's
    owner and token when the caller knows them (a fire checked them), else
    they are read from the shard."""
    assert run["state"] == QUEUED, run
    if dagrun.is_dag_run(run):
        dagrun.begin(tx, run, node, at_ms)
        return
    run["queued_ms"] = at_ms
    if run.get("queue"):
        run["node"] = None
        tx.put(READY, _ready_key(run, at_ms), 1)
        tx.effects.append(RunQueued(run=run))
        return
    if token is None or node is None:
        node, token = _shard_holder(tx, run["shard"])
    tx.put(RUNS_OPEN, keys.open_run_key(run["shard"], run["id"]), 1)
    if node is None:
        run["node"] = None   # no owner yet: the shard's first owner takes it over
        return
    _hold(tx, run, node, token, at_ms)


def _hold(tx: Tx, run: dict, node: str, token: int, at_ms: int) -> None:
    """The lease taken at fire: the run's attempt is held by `node` (its
    shard's owner) under the shard's fencing token, and begins now."""
    run["node"], run["token"] = node, token
    _move(run, "start")
    run.update(holder=node, lease_ms=None, started_ms=at_ms)
    run["attempts"] = run.get("attempts", []) + [
        {"attempt": run["attempt"], "holder": node, "started_ms": at_ms,
         "finished_ms": None, "http_status": None, "exit_code": None, "error": None,
         "output_node": None, "retry_delay_ms": None}]
    tx.effects.append(RunQueued(run=run))


def _shard_holder(tx: Tx, shard: int) -> tuple[str | None, int]:
    state = tx.get(SHARDS, keys.shard_key(shard))
    return (state["owner"], state["token"]) if state else (None, 0)


def _ready_key(run: dict, queued_ms: int) -> bytes:
    rank = keys.PRIORITY_RANK[run.get("priority", "normal")]
    return keys.ready_key(keys.scoped(run["tenant"], run["queue"]), rank, queued_ms, run["id"])


def _dequeue(tx: Tx, run: dict) -> None:
    if run.get("queue"):
        tx.delete(READY, _ready_key(run, run["queued_ms"]))
    else:
        tx.delete(RUNS_OPEN, keys.open_run_key(run["shard"], run["id"]))


def _shard_owner(tx: Tx, job: dict) -> str | None:
    return _shard_holder(tx, job["shard"])[0]


# --- attempts --------------------------------------------------------------------------

def _holds(run: dict, update: commands.RunUpdate) -> bool:
    """Only the current holder of the current attempt may report on it."""
    return run.get("holder") == update.holder and run["attempt"] == update.attempt


def start(tx: Tx, run: dict, update: commands.RunUpdate) -> bool:
    """A remote worker's claim. A node-executed run is held from its fire on
    and never starts by report."""
    if run["state"] != QUEUED or run["attempt"] != update.attempt or not run.get("queue"):
        return False
    if dagrun.is_dag_run(run):
        return False   # it starts with its first task
    _dequeue(tx, run)
    _move(run, "start")
    run.update(holder=update.holder, lease_ms=update.lease_ms,
               started_ms=update.at_ms)
    run["attempts"] = run.get("attempts", []) + [
        {"attempt": run["attempt"], "holder": update.holder, "started_ms": update.at_ms,
         "finished_ms": None, "http_status": None, "exit_code": None, "error": None,
         "output_node": None, "retry_delay_ms": None}]
    tx.put(LEASES, keys.lease_key(run["lease_ms"], run["id"]), update.holder)
    put_run(tx, run)
    if "dag_run" in run:
        dagrun.task_moved(tx, run)
    return True


def heartbeat(tx: Tx, run: dict, update: commands.RunUpdate) -> bool:
    if run["state"] != RUNNING or not _holds(run, update) or run["lease_ms"] is None:
        return False   # (a node-executed run has no lease of its own to extend)
    if update.lease_ms > run["lease_ms"]:
        tx.delete(LEASES, keys.lease_key(run["lease_ms"], run["id"]))
        run["lease_ms"] = update.lease_ms
        tx.put(LEASES, keys.lease_key(run["lease_ms"], run["id"]), update.holder)
        put_run(tx, run)
    return True


def finish(tx: Tx, run: dict, update: commands.RunUpdate) -> bool:
    """End the current attempt: succeeded, retry_wait (a retryable failure with
    attempts left) or failed."""
    if run["state"] != RUNNING or not _holds(run, update):
        return False
    # A success of a run outside a DAG changes only its job's state (its open
    # runs): read that alone, not the job's record and spec (tx.job_state).
    alone = update.ok and "dag_run" not in run
    job = tx.job_state(run["job_id"]) if alone else None
    if job is None:
        alone = False
        job = tx.get(JOBS, keys.job_key(run["job_id"]))
    _release(tx, run)
    at_ms = update.at_ms
    summary = {name: getattr(update, name) for name in ("http_status", "exit_code", "error",
                                                     "output_node")}
    run["attempts"][-1].update(summary, finished_ms=at_ms)
    if update.called_ms is not None and not run.get("queue"):
        # Held from its fire, the attempt began its call then: what a user
        # reads as its start once it has ended.
        run["attempts"][-1]["started_ms"] = run["started_ms"] = update.called_ms
    run.update({k: v for k, v in summary.items() if k != "output_node"})
    # A re-driven run counts its attempts from the re-drive (core/redrive.py).
    if update.ok:
        _move(run, "succeed")
    elif update.retryable is not False and job["status"] != "deleted" \
            and run["attempt"] - run.get("redrive_base", 0) < \
            retry.policy_of(dag.retry_of(job["spec"], run.get("task_id")))["max_attempts"]:
        _move(run, "retry")
        tx.tally(TALLY_RETRY)
        delay_ms = update.retry_delay_ms
        assert delay_ms is not None and delay_ms >= 0, update
        run["attempts"][-1]["retry_delay_ms"] = delay_ms
        run["retry_due_ms"] = at_ms + delay_ms
        tx.put(DUE, keys.retry_due_key(job["shard"], run["retry_due_ms"], run["id"]),
               keys.due_value(run["tenant"], run.get("priority")))
        tx.effects.append(DueArmed(shard=job["shard"], due_ms=run["retry_due_ms"]))
    else:
        _move(run, "fail")
        if "dag_run" not in run:   # a task's failure is its DAG run's to report
            _raise_alert(tx, job, run, at_ms)
    if run["state"] != RETRY_WAIT:
        run["finished_ms"] = at_ms
        tx.tally(TALLY_RUN_ENDED, run["state"])
        if "dag_run" in run:
            dagrun.task_ended(tx, job, run, at_ms)
        else:
            settle(tx, job, run, at_ms)
        if alone:
            tx.put_job_state(job)
        else:
            put_job(tx, job)
    elif "dag_run" in run:
        dagrun.task_moved(tx, run)
    put_run(tx, run)
    return True


# Whether a success of a run held from its fire is written from the run's
# stored form (_finish_held); tests/test_finish_held.py turns it off to compare.
FINISH_HELD_FROM_STORED = True


# Whether such a success settles its job's state as stored (compact.state_settled)
# where it can; tests/test_finish_held.py turns it off to compare.
SETTLE_AS_STORED = True


def _finish_held(tx: Tx, update: commands.RunFinish) -> bool:
    """`finish` for the success of a run a node held from its fire, whose
    job's state is a record of its own (compact.finished_held says which):
    the run's record is patched as stored rather than restored, changed and
    compacted again; the rest is `finish`'s own. False, with nothing done,
    for any other report: `finish` takes it."""
    if not FINISH_HELD_FROM_STORED:
        return False
    key = update.run_id.encode()
    stored = tx.stored_run(key)
    if stored is None:
        return False
    finished = compact.finished_held(
        stored, key, update.holder, update.attempt, update.at_ms, update.called_ms,
        (update.http_status, update.exit_code, update.error, update.output_node))
    occurrence = keys.run_occurrence(update.run_id) if finished is not None else None
    if occurrence is None:
        return False
    job_key = keys.job_key(occurrence[0])
    settled = compact.state_settled(tx.stored_state(job_key), job_key, update.run_id) \
        if SETTLE_AS_STORED else None
    job = None
    if settled is None:
        job = tx.job_state(occurrence[0])
        if job is None or "spec" in job:
            return False   # (its state is in its record: read whole)
    tx.delete(RUNS_OPEN, keys.open_run_key(finished[compact.RUN_SHARD_AT], update.run_id))
    tx.tally(TALLY_RUN_ENDED, SUCCEEDED)
    if job is not None:
        settle(tx, job, {"id": update.run_id}, update.at_ms)
        tx.put_job_state(job)
    else:
        tx.put_stored(JOB_STATE, job_key, settled)
    tx.put_stored(RUNS, key, finished)
    return True


def _release(tx: Tx, run: dict) -> None:
    if run["lease_ms"] is not None:
        tx.delete(LEASES, keys.lease_key(run["lease_ms"], run["id"]))
    if not run.get("queue"):
        tx.delete(RUNS_OPEN, keys.open_run_key(run["shard"], run["id"]))
    run["holder"], run["lease_ms"] = None, None


def retry_due(tx: Tx, run: dict, node: str, token: int, at_ms: int) -> bool:
    """A retry's due entry fired: queue the next attempt on the firing node
    (the shard's owner) or in the run's worker queue."""
    if run["state"] != RETRY_WAIT:
        return False
    _move(run, "due")
    run["attempt"] += 1
    run["token"] = token
    run["retry_due_ms"] = None
    _enqueue(tx, run, node, at_ms, token)
    put_run(tx, run)
    if "dag_run" in run:
        dagrun.task_moved(tx, run)
    return True


def take_over(tx: Tx, run: dict, node: str, token: int, at_ms: int,
              uncalled_by: str | None = None, lease_bound: int | None = None) -> bool:
    """The run's shard is `node`'s under `token` now: an open node-executed run
    held under an older token gets its next attempt (same run and execution
    id), held by `node` and counted as a redelivery; one nobody held (fired
    while the shard had no owner) is held by `node` as it is. The old holder
    is told to stop; its late finish is refused (it holds no attempt).
    The same attempt moves instead when no node can have called it: fired
    ahead and not due yet, or handed over by its holder (`uncalled_by`),
    which lost the shard before its call and drops it uncalled, or fired
    ahead of a second no earlier than `lease_bound`, the end of its holder's
    shard lease (lease_bound_ms)."""
    if run.get("queue") or dagrun.is_dag_run(run) \
            or tx.get(RUNS_OPEN, keys.open_run_key(run["shard"], run["id"])) is None:
        return False
    if run["state"] == QUEUED:
        _hold(tx, run, node, token, at_ms)
    elif run["state"] == RUNNING and run["token"] < token \
            and (not_due(run, at_ms)
                 or (uncalled_by is not None and run.get("holder") == uncalled_by)
                 or (lease_bound is not None and armed_open(run)
                     and run["scheduled_ms"] + run.get("jitter_ms", 0) >= lease_bound)):
        # Fired ahead and not due by the taker's clock (with a margin for the
        # nodes' clocks): its holder, which calls nothing early, cannot have
        # called it; or its holder says it did not and will not. The same
        # attempt moves to the new owner; the old holder drops it (its report
        # would name a holder it no longer is).
        tx.effects.append(RunCancelled(run_id=run["id"], holder=run["holder"],
                                       attempt=run["attempt"]))
        run["node"], run["token"], run["holder"] = node, token, node
        run["attempts"][-1]["holder"] = node
        tx.effects.append(RunQueued(run=run))
    elif run["state"] == RUNNING and run["token"] < token:
        old = run["holder"]
        tx.effects.append(RunCancelled(run_id=run["id"], holder=old, attempt=run["attempt"]))
        run["attempts"][-1].update(
            finished_ms=at_ms, error=f"taken over by {node}: {old} no longer holds shard "
                                     f"{run['shard']}")
        _move(run, "take_over")
        run["attempt"] += 1
        run["redeliveries"] = run.get("redeliveries", 0) + 1
        tx.tally(TALLY_REDELIVERED)
        _hold(tx, run, node, token, at_ms)
    else:
        return False
    put_run(tx, run)
    if "dag_run" in run:
        dagrun.task_moved(tx, run)
    return True


# How long after a node's latest recorded renewal its shard lease has ended
# for sure: node_lease_s, and a renewal period more for a renewal of it applied
# out of order just before its first recorded one. Every replica must agree on
# it: changing either limit is a change of what apply does.
LEASE_BOUND_MS = round((limits.node_lease_s + limits.renew_period_s) * 1000)


def lease_bound_ms(tx: Tx, node: str) -> int | None:
    """When `node`'s shard lease ended at the latest, by its latest renewal
    recorded (apply's renew): LEASE_BOUND_MS after it. The node calls only
    while its lease holds (node_lease_s after its latest renewal, less a
    margin: runtime/coordinator.py) and never before a run's second, so it
    called no run due at or after this. None when no renewal of it is
    recorded."""
    record = tx.get(NODES, node.encode())
    renewed_ms = None if record is None else record.get("renewed_ms")
    if type(renewed_ms) is not int:
        return None
    return renewed_ms + LEASE_BOUND_MS


def not_due(run: dict, at_ms: int) -> bool:
    """Is `run` one fired ahead of its second (armed) that is not due by
    `at_ms` with take_over_armed_margin_ms to spare?"""
    return run.get("armed_ms") is not None and \
        run["scheduled_ms"] + run.get("jitter_ms", 0) > at_ms + limits.take_over_armed_margin_ms


def armed_open(run: dict) -> bool:
    """Is `run` fired ahead of its second (armed) with its first attempt
    open? Its record then says when it was fired, not when its call began:
    the finish records that (update_run's `called_ms`)."""
    return run.get("armed_ms") is not None and run["attempt"] == 1 \
        and run["state"] in (QUEUED, RUNNING)


def presented_state(run: dict, now_ms: int) -> str:
    """The state an answer shows for `run` at `now_ms` (the cluster's time):
    ARMED while it is fired ahead and not due, since no node calls a run
    before its second (docs/operations.md, "Clocks"); else its state."""
    if armed_open(run) and run["scheduled_ms"] + run.get("jitter_ms", 0) > now_ms:
        return lifecycle.ARMED
    return run["state"]


def uncalled_late(run: dict, node: str, token: int, uncalled_after_ms: int,
                  at_ms: int) -> bool:
    """Is `run` one `node` holds under `token`, fired ahead of its second
    (its first attempt, from its schedule), due after `uncalled_after_ms`
    (so `node` never called it: runtime/horizon.py) and by `at_ms`?"""
    if run["state"] != RUNNING or run.get("holder") != node or run["token"] != token \
            or run.get("armed_ms") is None or run["attempt"] != 1 \
            or run.get("trigger") != "schedule" or run.get("queue") \
            or "dag_run" in run or dagrun.is_dag_run(run):
        return False
    due_ms = run["scheduled_ms"] + run.get("jitter_ms", 0)
    return uncalled_after_ms < due_ms <= at_ms


def end_uncalled(tx: Tx, job: dict, run: dict, state: str, reason: str, at_ms: int) -> None:
    """End a run its holder never called (uncalled_late) as `state`, missed
    or skipped, as a fire would have created it: no attempt, the reason
    given. Its holder drops it (RunCancelled). The caller puts the job."""
    tx.effects.append(RunCancelled(run_id=run["id"], holder=run["holder"],
                                   attempt=run["attempt"]))
    _release(tx, run)
    _move(run, "miss" if state == lifecycle.MISSED else "skip")
    run["attempts"] = run["attempts"][:-1]
    run["started_ms"] = None
    run["reason"], run["finished_ms"] = reason, at_ms
    tx.tally(TALLY_RUN_ENDED, run["state"])
    settle(tx, job, run, at_ms)
    put_run(tx, run)


def reassign(tx: Tx, run: dict, from_node: str, to_node: str, at_ms: int) -> bool:
    """A queued run whose node died before starting it moves to a live node."""
    if run["state"] != QUEUED or run.get("queue") or run["node"] != from_node \
            or dagrun.is_dag_run(run):
        return False
    _dequeue(tx, run)
    _move(run, "reassign")
    job = tx.get(JOBS, keys.job_key(run["job_id"]))
    state = tx.get(SHARDS, keys.shard_key(job["shard"])) if job is not None else None
    if state is not None and state["owner"] == to_node:
        # Moved to the shard's owner (a run fired ahead, say, whose owner died
        # before its second): it calls under its own fencing token.
        run["token"] = state["token"]
    _enqueue(tx, run, to_node, at_ms)
    put_run(tx, run)
    return True


def settle(tx: Tx, job: dict, run: dict, at_ms: int) -> None:
    """A run left the active set: under the queue policy the next waiting run
    of the job is queued. `job` may be its state alone (Tx.job_state)."""
    active = job.get("active", [])
    if run["id"] in active:
        active.remove(run["id"])
    waiting = job.get("waiting", [])
    if active or not waiting:
        return
    nxt = get_run(tx, waiting.pop(0))
    assert nxt is not None and nxt["state"] == SCHEDULED, (job["id"], nxt)
    _move(nxt, "promote")
    _enqueue(tx, nxt, _shard_holder(tx, nxt["shard"])[0] or nxt["node"], at_ms)
    active.append(nxt["id"])
    job["active"] = active
    put_run(tx, nxt)


def cancel(tx: Tx, job: dict, run: dict, at_ms: int, reason: str) -> None:
    """Cancel an open run wherever it is; its holder is told to stop. A DAG
    run cancels its tasks that have not ended."""
    previous = run["state"]
    _move(run, "cancel")
    if previous == SCHEDULED:
        job["waiting"].remove(run["id"])
    if dagrun.is_dag_run(run):
        dagrun.cancel_tasks(tx, job, run, at_ms, reason)
    elif previous == QUEUED:
        _dequeue(tx, run)
        if not run.get("queue") and run["node"] is not None:
            # Its node may hold it armed until its second (runtime/armed.py).
            tx.effects.append(RunCancelled(run_id=run["id"], holder=run["node"],
                                           attempt=run["attempt"]))
    elif previous == RUNNING:
        tx.effects.append(RunCancelled(run_id=run["id"], holder=run["holder"],
                                       attempt=run["attempt"]))
        _release(tx, run)
        run["attempts"][-1].update(finished_ms=at_ms, error="cancelled")
    elif previous == RETRY_WAIT:
        tx.delete(DUE, keys.retry_due_key(job["shard"], run["retry_due_ms"], run["id"]))
        run["retry_due_ms"] = None
    run["reason"], run["finished_ms"] = reason, at_ms
    tx.tally(TALLY_RUN_ENDED, run["state"])
    if previous in ACTIVE and "dag_run" not in run:
        settle(tx, job, run, at_ms)
    put_run(tx, run)


def withdraw_armed(tx: Tx, job: dict, at_ms: int, why: str) -> int:
    """Withdraw the job's armed runs that are not due yet by `at_ms` (the
    editing command's time): fired ahead of their second (`armed_ms`), held
    by their shard's owner (or queued for its first owner), so not called: a
    node calls nothing before its second. Each ends cancelled, saying why, and its
    node drops it (RunCancelled); an occurrence the job's schedule brings back
    fires again (create_run). A run already due by at_ms is left to run.
    Bounded by job_active_runs_max (the job's open runs). The caller puts the job."""
    withdrawn = 0
    for run_id in list(job.get("active", [])):
        run = get_run(tx, run_id)
        if run is None or run["state"] not in (QUEUED, RUNNING) or run.get("armed_ms") is None:
            continue
        if run["scheduled_ms"] + run.get("jitter_ms", 0) <= at_ms:
            continue
        cancel(tx, job, run, at_ms, f"withdrawn: {why} before its due second")
        run["withdrawn"] = True
        put_run(tx, run)
        withdrawn += 1
    return withdrawn


def _raise_alert(tx: Tx, job: dict, run: dict, at_ms: int) -> None:
    url = (job["spec"].get("alert") or {}).get("webhook_url")
    tx.put(ALERTS, run["id"].encode(), {"v": 1, "run_id": run["id"], "job_id": job["id"],
                                        "url": url, "created_ms": at_ms})
    run["alert"] = "pending"
    tx.tally(TALLY_DEAD_LETTER)
    tx.effects.append(AlertPending(run_id=run["id"]))


def reopen(run: dict, trigger: str, token: int, reason: str | None) -> None:
    """A failed run's next attempt is made (a re-drive, core/redrive.py, or a
    re-driven DAG run's failed task, core/dagrun.py): the same record, ids and
    execution id, `attempt` one up, the retry policy counted afresh from here
    (`redrive_base`), and the summary fields the new attempt's (its earlier
    attempts keep theirs). The caller moves its state and queues it."""
    run.setdefault("first_trigger", run["trigger"])
    run.update(trigger=trigger, redrives=run.get("redrives", 0) + 1,
               redrive_base=run["attempt"], attempt=run["attempt"] + 1, token=token,
               finished_ms=None, http_status=None, exit_code=None, error=None, reason=reason,
               retry_due_ms=None, holder=None, lease_ms=None)


# What core/dagrun.py uses to queue, place and report the task runs and DAG
# runs it makes, as this module does its own.
enqueue, shard_owner, raise_alert = _enqueue, _shard_owner, _raise_alert
# What core/redrive.py uses to admit and queue a failed run again.
admit, move = _admit, _move


# --- handlers --------------------------------------------------------------------------

_UPDATES = {commands.RunStart: start, commands.RunHeartbeat: heartbeat,
            commands.RunFinish: finish}


def handle_run_updates(tx: Tx, cmd: commands.Command) -> dict:
    """Batched reports from executors: start (take the lease), heartbeat
    (extend it), finish (end the attempt). Each is conditioned on the run's
    state and holder; one that does not hold is refused, counted and named."""
    accepted = []
    for update in cmd.updates:
        if type(update) is commands.RunFinish and update.ok and _finish_held(tx, update):
            accepted.append(True)
            continue
        run = get_run(tx, update.run_id)
        accepted.append(run is not None and _UPDATES[type(update)](tx, run, update))
    stale = accepted.count(False)
    return {"ok": True, "applied": len(accepted) - stale, "stale": stale, "accepted": accepted}


def handle_expire_leases(tx: Tx, cmd: commands.Command) -> dict:
    """The reaper: attempts whose lease ran out by the proposer's `at_ms` end
    as a retryable failure (retry_wait, or failed when attempts are spent)."""
    expired = 0
    for item in cmd.items:
        run_id, attempt, delay_ms = item.run_id, item.attempt, item.retry_delay_ms
        run = get_run(tx, run_id)
        if run is None or run["state"] != RUNNING or run["attempt"] != attempt \
                or run["lease_ms"] is None or run["lease_ms"] > cmd.at_ms:
            continue   # (a DAG run holds no lease: its tasks' runs do)
        update = commands.run_finish(
            run_id=run_id, holder=run["holder"], attempt=attempt, at_ms=cmd.at_ms, ok=False,
            retryable=True, retry_delay_ms=delay_ms,
            error=f"lease expired: {run['holder']} stopped heartbeating")
        expired += int(finish(tx, run, update))
    return {"ok": True, "expired": expired}


def handle_take_over_runs(tx: Tx, cmd: commands.Command) -> dict:
    """A shard's new owner takes over the shard's open runs (take_over), if
    it still owns the shard under the token it names."""
    return _take_over_runs(tx, cmd, None)


def handle_hand_over_runs(tx: Tx, cmd: commands.Command) -> dict:
    """As take_over_runs, proposed by the runs' former holder, which says it
    did not call them: those it still holds move as the same attempt."""
    return _take_over_runs(tx, cmd, cmd.holder)


def take_over_refusal(tx: Tx, cmd: commands.Command) -> dict | None:
    """The answer refusing a take-over (or hand-over) whole, unless cmd.node
    owns cmd.shard under cmd.token."""
    shard = tx.get(SHARDS, keys.shard_key(cmd.shard))
    if shard is None or shard["owner"] != cmd.node or shard["token"] != cmd.token:
        return {"ok": False, "error": "stale_token", "taken": 0,
                "detail": f"shard {cmd.shard} token {cmd.token} from {cmd.node}; current "
                          f"owner {shard and shard['owner']}"}
    return None


def _take_over_runs(tx: Tx, cmd: commands.Command, uncalled_by: str | None) -> dict:
    return take_over_refusal(tx, cmd) or take_over_runs(tx, cmd, cmd.run_ids,
                                                        uncalled_by=uncalled_by)


def take_over_runs(tx: Tx, cmd: commands.Command, run_ids: list[str], *,
                   uncalled_by: str | None = None,
                   lease_bounds: dict[str, int | None] | None = None) -> dict:
    """take_over each of `run_ids` in cmd's shard, whose owner the caller
    checked cmd.node is under cmd.token. `lease_bounds`: lease_bound_ms by
    holder, for the runs their holders cannot have called."""
    taken = next_attempts = 0
    for run_id in run_ids:
        run = get_run(tx, run_id)
        if run is not None and run.get("shard") == cmd.shard:
            attempt = run["attempt"]
            bound = None if lease_bounds is None else lease_bounds.get(run.get("holder"))
            if take_over(tx, run, cmd.node, cmd.token, cmd.at_ms, uncalled_by, bound):
                taken += 1
                next_attempts += int(run["attempt"] > attempt)
    result = {"ok": True, "taken": taken, "stale": len(cmd.run_ids) - taken}
    if next_attempts:
        result["next_attempts"] = next_attempts
    return result


def handle_reassign_runs(tx: Tx, cmd: commands.Command) -> dict:
    moved = 0
    for item in cmd.items:
        run_id, from_node, to_node = item.run_id, item.from_node, item.to_node
        run = get_run(tx, run_id)
        moved += int(run is not None and reassign(tx, run, from_node, to_node, cmd.at_ms))
    return {"ok": True, "moved": moved}


def handle_cancel_run(tx: Tx, cmd: commands.Command) -> dict:
    run = get_run(tx, cmd.run_id)
    if run is None or (commands.given(cmd.tenant) is not None and run["tenant"] != cmd.tenant):
        return {"ok": False, "error": "not_found", "detail": f"run {cmd.run_id} not found"}
    if not lifecycle.allows(run["state"], "cancel"):
        return {"ok": False, "error": "conflict",
                "detail": f"run {run['id']} is {run['state']}; only an open run can be cancelled"}
    refusal = dagrun.cancel_refusal(run)
    if refusal is not None:
        return refusal
    job = tx.get(JOBS, keys.job_key(run["job_id"]))
    cancel(tx, job, run, cmd.at_ms, cmd.reason)
    put_job(tx, job)
    return {"ok": True, "run": run}


def handle_alert_done(tx: Tx, cmd: commands.Command) -> dict:
    run = get_run(tx, cmd.run_id)
    if tx.get(ALERTS, cmd.run_id.encode()) is None or run is None:
        return {"ok": True, "stale": True}   # another leader delivered it first
    tx.delete(ALERTS, cmd.run_id.encode())
    run["alert"] = cmd.outcome
    run["alert_error"] = cmd.error
    put_run(tx, run)
    return {"ok": True, "stale": False}


def fire_retries(tx: Tx, shard: int, node: str, token: int, at_ms: int,
                 items: list[commands.RetryDue]) -> tuple[int, int]:
    """Queue the next attempt of each retry due entry of a fire: (fired, stale)."""
    fired = stale = 0
    for item in items:
        run_id, due_ms = item.run_id, item.due_ms
        due = keys.retry_due_key(shard, due_ms, run_id)
        run = get_run(tx, run_id)
        if tx.get(DUE, due) is None or run is None or run.get("retry_due_ms") != due_ms:
            stale += 1
            continue
        tx.delete(DUE, due)
        fired += int(retry_due(tx, run, node, token, at_ms))
    return fired, stale

