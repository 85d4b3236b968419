"""Backfill: run every occurrence of a job's schedule in a past range [start, end).

A backfill is a record in BACKFILLS (and, while it runs, a key in
BACKFILLS_OPEN). Its progress is replicated state, so a new leader carries on
where the old one stopped:

  cursor_ms  the last occurrence launched (None: none yet); the next ones are
             those of the schedule after it and before end_ms
  open       [run_id, created] of its runs not yet finished: `created` is False
             for an occurrence that had a run already (from the schedule or an
             earlier backfill), which the backfill waits for but never cancels
  launched, existing, succeeded, failed, skipped   counts
  exhausted  no occurrence of the range is left to launch

The leader's backfiller (runtime/backfiller.py) proposes `backfill_step`
commands: for each running backfill, the occurrences that fit in its room
(max_concurrent minus its open runs), computed from the schedule the backfill
copied from the job when it was created (apply reads no zone database). apply
first counts the open runs that finished, then creates a run for each
occurrence after the cursor, inside the range, within the room, with trigger
`backfill`, through runs.create_run: an occurrence that has a run is not run
again (the run's identity is (job, scheduled_for)). A backfill ends when it is
exhausted and none of its runs is open (succeeded, or failed if any run
failed), when it is cancelled, or when its job is deleted (cancelled).

Overlap, per backfill:
  allow (default)  its runs are admitted whatever the job's concurrency policy
                   and are not counted among the job's open runs: the backfill
                   and the job's own runs neither hold back, skip nor cancel
                   each other; max_concurrent alone bounds them.
  job              each run goes through the job's concurrency policy as a
                   scheduled occurrence would (skip_if_running records it
                   skipped while a run of the job is open, queue makes it wait,
                   replace cancels the open run); under a policy other than
                   allow the backfill keeps one run open at a time.

Pure: no clock (every time is the proposer's at_ms), no I/O beyond the view.
"""

from __future__ import annotations

import typing

from raftsched import limits
from raftsched.core import commands, keys, lifecycle, runs, spec, tenancy
from raftsched.core.schedule import next_fire_ms, parse_instant
from raftsched.core.tx import (BACKFILLS, BACKFILLS_OPEN, COUNTERS, JOBS, SHARDS, BackfillOpened,
                               Tx, live_job, refuse)
from raftsched.errors import InvalidInput

TRIGGER = "backfill"
OVERLAPS = typing.get_args(spec.BackfillOverlap)
RUNNING, SUCCEEDED, FAILED, CANCELLED = "running", "succeeded", "failed", "cancelled"
STATES = (RUNNING, SUCCEEDED, FAILED, CANCELLED)
# Schedules a backfill can enumerate; any other kind has no occurrences to run.
SCHEDULE_KINDS = ("cron", "every", "once")
ID_PREFIX = "bf_"
ID_PATTERN = "bf_[0-9a-f]{20}"

_RECORDS_COUNTER = b"backfills"
_OPEN_COUNTER = b"backfills_open"
# The members of POST /v1/jobs/{id}:backfill.
REQUEST_FIELDS = spec.members(spec.BackfillCreate)


# --- the request --------------------------------------------------------------------------

def parse_request(body: object, now_ms: int) -> dict:
    """{start_ms, end_ms, overlap, max_concurrent, dry_run} of a backfill
    request, or InvalidInput naming the member. The range is of the past:
    `end` may not be after `now_ms` (a backfill would otherwise run future
    occurrences early, ahead of the schedule)."""
    request = spec.check_shape(body, spec.BackfillCreate)
    start_ms = parse_instant(request.start, "start")[0]
    end_ms = parse_instant(request.end, "end")[0]
    if start_ms >= end_ms:
        raise InvalidInput("`end` must be after `start` (the range is [start, end))",
                           field="end")
    if end_ms > now_ms:
        raise InvalidInput("`end` is in the future; a backfill runs past occurrences only",
                           field="end")
    return {"start_ms": start_ms, "end_ms": end_ms, "overlap": request.overlap,
            "max_concurrent": request.max_concurrent, "dry_run": request.dry_run}


# --- pure: occurrences, room, progress, the next step ------------------------------------

def occurrences(schedule: dict, after_ms: int, end_ms: int, count: int) -> list[int]:
    """Up to `count` occurrences of `schedule` after `after_ms` and before
    `end_ms`, ascending."""
    assert schedule["kind"] in SCHEDULE_KINDS, schedule
    if schedule["kind"] == "once":
        at_ms = schedule["run_at_ms"]
        return [at_ms] if after_ms < at_ms < end_ms and count > 0 else []
    found: list[int] = []
    cursor = after_ms
    while len(found) < count:
        nxt = next_fire_ms(schedule, cursor)
        if nxt is None or nxt >= end_ms or nxt <= cursor:
            break
        found.append(nxt)
        cursor = nxt
    return found


def range_occurrences(schedule: dict, start_ms: int, end_ms: int, count: int) -> list[int]:
    """Up to `count` occurrences in [start_ms, end_ms)."""
    return occurrences(schedule, start_ms - 1, end_ms, count)


def runs_open_max(backfill: dict, job: dict) -> int:
    """How many of the backfill's runs may be open at once (see the module docstring)."""
    if backfill["overlap"] == "job":
        policy = (job["spec"].get("concurrency") or {"policy": "allow"})["policy"]
        if policy != "allow":
            return 1
    return backfill["max_concurrent"]


def progress(backfill: dict, open_states: list[str | None]) -> dict:
    """The counts a reader sees: the record's, plus what its open runs (their
    states now, None for a run that is gone) have become since the last step."""
    counts = {name: backfill[name] for name in ("succeeded", "failed", "skipped")}
    running = 0
    for state in open_states:
        if state in lifecycle.OPEN:
            running += 1
        else:
            counts[_outcome(state)] += 1
    done = sum(counts.values())
    return {"total": backfill["total"], "done": done, **counts, "running": running,
            "existing": backfill["existing"], "launched": backfill["launched"]}


def plan_step(backfill: dict, job: dict | None, open_states: list[str | None],
              runs_max: int) -> dict | None:
    """The backfill_step item the backfiller proposes for a running backfill,
    or None when there is nothing to do: no open run finished, no room or no
    occurrence left to launch, and it is not ready to end. At most `runs_max`
    occurrences (what is left of the entry's budget)."""
    ended = sum(1 for state in open_states if state not in lifecycle.OPEN)
    still_open = len(open_states) - ended
    item = {"backfill_id": backfill["id"], "occurrences": [],
            "exhausted": backfill["exhausted"]}
    if job is None or job["status"] == "deleted":
        return item   # apply ends it
    left = backfill["total"] - backfill["launched"]
    want = min(runs_open_max(backfill, job) - still_open, runs_max, left)
    if not backfill["exhausted"] and left <= 0:
        item["exhausted"] = True
    elif not backfill["exhausted"] and want > 0:
        found = occurrences(backfill["schedule"], after_ms(backfill), backfill["end_ms"],
                            want + 1)
        item["occurrences"] = found[:want]
        item["exhausted"] = len(found) <= want
    changed = ended or item["occurrences"] or item["exhausted"] != backfill["exhausted"]
    ready_to_end = item["exhausted"] and still_open == 0
    return item if changed or ready_to_end else None


def after_ms(backfill: dict) -> int:
    """The next occurrences to launch come after this instant."""
    cursor = backfill["cursor_ms"]
    return backfill["start_ms"] - 1 if cursor is None else cursor


def _outcome(state: str | None) -> str:
    """Which count a finished run adds to. Skipped also counts runs that ended
    missed or cancelled, and one removed by retention before it was counted."""
    if state == lifecycle.SUCCEEDED:
        return "succeeded"
    if state == lifecycle.FAILED:
        return "failed"
    return "skipped"


# --- counters -----------------------------------------------------------------------------

def _count(tx: Tx, name: bytes) -> int:
    counter = tx.get(COUNTERS, name)
    return counter["count"] if counter else 0


def _add(tx: Tx, name: bytes, delta: int) -> None:
    count = max(0, _count(tx, name) + delta)
    if count:
        tx.put(COUNTERS, name, {"v": 1, "count": count})
    else:
        tx.delete(COUNTERS, name)   # a tenant's counter goes when it reaches zero


def tenant_open_counter_key(tenant: str) -> bytes:
    return _OPEN_COUNTER + b"\x00" + tenant.encode()


def tenant_records_counter_key(tenant: str) -> bytes:
    return _RECORDS_COUNTER + b"\x00" + tenant.encode()


def _limit(name: str, detail: str) -> dict:
    return {"ok": False, "error": "limit", "limit": name, "field": "backfill", "detail": detail}


# --- apply: create ------------------------------------------------------------------------

def handle_create_backfill(tx: Tx, cmd: commands.Command) -> dict:
    """A backfill of the job's schedule as the proposer read it (expected_version):
    refused if the job changed since, or past a bound on backfills."""
    job = live_job(tx, cmd.job_id)
    if job is None or job["tenant"] != cmd.tenant:
        return refuse("not_found", f"job {cmd.job_id} not found")
    if job["version"] != cmd.expected_version:
        return refuse("conflict", f"job {job['id']} changed (version {job['version']}, "
                                  f"expected {cmd.expected_version}); retry")
    key = cmd.backfill_id.encode()
    if tx.get(BACKFILLS, key) is not None:
        return refuse("conflict", f"backfill {cmd.backfill_id} exists")
    refusal = _check_bounds(tx, cmd.tenant)
    if refusal is not None:
        return refusal
    record = {"v": 1, "id": cmd.backfill_id, "job_id": job["id"], "tenant": job["tenant"],
              "schedule": job["spec"]["schedule"], "start_ms": cmd.start_ms,
              "end_ms": cmd.end_ms, "overlap": cmd.overlap,
              "max_concurrent": cmd.max_concurrent, "total": cmd.total, "launched": 0,
              "cursor_ms": None, "exhausted": False, "open": [], "existing": 0,
              "succeeded": 0, "failed": 0, "skipped": 0, "state": RUNNING, "reason": None,
              "created_ms": cmd.at_ms, "updated_ms": cmd.at_ms, "finished_ms": None}
    tx.put(BACKFILLS, key, record)
    tx.put(BACKFILLS_OPEN, key, 1)
    tx.effects.append(BackfillOpened(backfill_id=cmd.backfill_id))
    _add(tx, _RECORDS_COUNTER, 1)
    _add(tx, tenant_records_counter_key(job["tenant"]), 1)
    _add(tx, _OPEN_COUNTER, 1)
    _add(tx, tenant_open_counter_key(job["tenant"]), 1)
    tenancy.audit(tx, cmd, "backfill.create", job["tenant"], record["id"], job_id=job["id"],
                  start_ms=cmd.start_ms, end_ms=cmd.end_ms, total=cmd.total)
    return {"ok": True, "backfill": record}


def _check_bounds(tx: Tx, tenant: str) -> dict | None:
    if _count(tx, tenant_records_counter_key(tenant)) >= limits.backfills_per_tenant_max:
        return _limit("backfills_per_tenant_max",
                      f"tenant {tenant} keeps {limits.backfills_per_tenant_max} backfills "
                      "(backfills_per_tenant_max); finished ones are removed after the retention")
    if _count(tx, _RECORDS_COUNTER) >= limits.backfills_max:
        return _limit("backfills_max", f"the cluster keeps {limits.backfills_max} backfills "
                      "(backfills_max); finished ones are removed after the retention")
    if _count(tx, _OPEN_COUNTER) >= limits.backfills_open_max:
        return _limit("backfills_open_max", f"{limits.backfills_open_max} backfills are "
                      "running in the cluster (backfills_open_max); wait for one to end")
    if _count(tx, tenant_open_counter_key(tenant)) >= limits.backfills_open_per_tenant_max:
        return _limit("backfills_open_per_tenant_max",
                      f"tenant {tenant} has {limits.backfills_open_per_tenant_max} backfills "
                      "running (backfills_open_per_tenant_max); wait for one to end")
    return None


# --- apply: steps -------------------------------------------------------------------------

def handle_backfill_step(tx: Tx, cmd: commands.Command) -> dict:
    """The backfiller's: per item, count the backfill's open runs that finished,
    launch the item's occurrences that fit, and end the backfill when it is done.
    An item about a backfill that is not running is stale (counted)."""
    launched = stale = 0
    for item in cmd.items:
        backfill = tx.get(BACKFILLS, item.backfill_id.encode())
        if backfill is None or backfill["state"] != RUNNING:
            stale += 1
            continue
        launched += _step(tx, backfill, item, cmd)
    return {"ok": True, "launched": launched, "stale": stale}


def _step(tx: Tx, backfill: dict, item: commands.BackfillStepItem,
          cmd: commands.BackfillStep) -> int:
    _settle(tx, backfill)
    job = live_job(tx, backfill["job_id"])
    launched = 0
    if job is None:
        _end(tx, backfill, CANCELLED, cmd.at_ms, "the job was deleted")
    else:
        launched, all_taken = _launch(tx, backfill, job, item.occurrences, cmd)
        # The proposer's "none left" holds only if nothing it sent was left over.
        if (item.exhausted and all_taken) or backfill["launched"] >= backfill["total"]:
            backfill["exhausted"] = True
        if backfill["exhausted"] and not backfill["open"]:
            _end(tx, backfill, FAILED if backfill["failed"] else SUCCEEDED, cmd.at_ms, None)
    backfill["updated_ms"] = cmd.at_ms
    tx.put(BACKFILLS, backfill["id"].encode(), backfill)
    return launched


def _settle(tx: Tx, backfill: dict) -> None:
    """Count the open runs that finished (or are gone) and forget them."""
    still = []
    for run_id, created in backfill["open"]:
        run = runs.get_run(tx, run_id)
        if run is not None and run["state"] in lifecycle.OPEN:
            still.append([run_id, created])
        else:
            backfill[_outcome(run["state"] if run else None)] += 1
    backfill["open"] = still


def _launch(tx: Tx, backfill: dict, job: dict, occurrences: list[int],
            cmd: commands.Command) -> tuple[int, bool]:
    """Create the runs of the occurrences after the cursor and inside the range,
    while there is room: (runs created, whether no occurrence was left over).
    Each occurrence taken uses a slot of the room, also one whose run is not
    open (it existed and ended, or the job's policy skipped it): a step takes
    no more than the room the proposer planned for."""
    room = runs_open_max(backfill, job) - len(backfill["open"])
    node, token = _executor(tx, job, cmd.node)
    created_count = taken = 0
    all_taken = True
    for scheduled_ms in occurrences:
        if not backfill["start_ms"] <= scheduled_ms < backfill["end_ms"] \
                or scheduled_ms <= after_ms(backfill):
            continue   # outside the range, or launched already (a stale proposer)
        if room <= 0 or backfill["launched"] >= backfill["total"]:
            all_taken = False
            break
        run, created = _create_run(tx, job, backfill, scheduled_ms, node, token, cmd.at_ms)
        backfill["cursor_ms"] = scheduled_ms
        backfill["launched"] += 1
        taken += 1
        created_count += int(created)
        if not created:
            backfill["existing"] += 1
        room -= 1
        if run["state"] in lifecycle.OPEN:
            backfill["open"].append([run["id"], created])
        else:
            backfill[_outcome(run["state"])] += 1
    if taken:
        runs.put_job(tx, job)
    return created_count, all_taken


def _executor(tx: Tx, job: dict, proposer: str) -> tuple[str, int]:
    """The node that runs the job's backfill runs, and the fencing token they
    carry: its shard's owner, as for scheduled runs; the proposer if the
    shard has none yet."""
    state = tx.get(SHARDS, keys.shard_key(job["shard"]))
    if state is not None and state["owner"] is not None:
        return state["owner"], state["token"]
    return proposer, 0


def _create_run(tx: Tx, job: dict, backfill: dict, scheduled_ms: int, node: str,
                token: int, at_ms: int) -> tuple[dict, bool]:
    if backfill["overlap"] == "job":
        return runs.create_run(tx, job, scheduled_ms, node, at_ms, TRIGGER, token)
    # overlap allow: create_run sees the job with the allow policy and no open
    # runs, so the run is admitted and listed in that copy only; whatever else
    # create_run records on the job (its run count) is copied back.
    view = dict(job, spec=dict(job["spec"], concurrency={"policy": "allow"}),
                active=[], waiting=[])
    run, created = runs.create_run(tx, view, scheduled_ms, node, at_ms, TRIGGER, token)
    for name, value in view.items():
        if name not in ("spec", "active", "waiting"):
            job[name] = value
    return run, created


def _end(tx: Tx, backfill: dict, state: str, at_ms: int, reason: str | None) -> None:
    """A backfill that ends holds no open runs: those left (when it is cancelled)
    are no longer its own to count or to wait for."""
    backfill.update(state=state, finished_ms=at_ms, reason=reason, open=[])
    tx.delete(BACKFILLS_OPEN, backfill["id"].encode())
    _add(tx, _OPEN_COUNTER, -1)
    _add(tx, tenant_open_counter_key(backfill["tenant"]), -1)


# --- apply: cancel and purge --------------------------------------------------------------

def handle_cancel_backfill(tx: Tx, cmd: commands.Command) -> dict:
    """Launch nothing more, and cancel the runs the backfill created that have
    not finished (runs it found existing are left alone). Cancelling a
    cancelled backfill answers it again; a finished one is a conflict."""
    key = cmd.backfill_id.encode()
    backfill = tx.get(BACKFILLS, key)
    if backfill is None or (commands.given(cmd.tenant) is not None and backfill["tenant"] != cmd.tenant):
        return refuse("not_found", f"backfill {cmd.backfill_id} not found")
    if backfill["state"] == CANCELLED:
        return {"ok": True, "backfill": backfill}
    if backfill["state"] != RUNNING:
        return refuse("conflict", f"backfill {backfill['id']} is {backfill['state']}; only a "
                                  "running backfill can be cancelled")
    job = tx.get(JOBS, keys.job_key(backfill["job_id"]))
    reason = cmd.reason or f"backfill {backfill['id']} was cancelled"
    for run_id, created in backfill["open"]:
        run = runs.get_run(tx, run_id)
        if created and job is not None and run is not None \
                and lifecycle.allows(run["state"], "cancel"):
            runs.cancel(tx, job, run, cmd.at_ms, reason)
    if job is not None:
        runs.put_job(tx, job)
    _settle(tx, backfill)
    _end(tx, backfill, CANCELLED, cmd.at_ms, reason)
    backfill["updated_ms"] = cmd.at_ms
    tx.put(BACKFILLS, key, backfill)
    tenancy.audit(tx, cmd, "backfill.cancel", backfill["tenant"], backfill["id"],
                  job_id=backfill["job_id"])
    return {"ok": True, "backfill": backfill}


def purgeable(backfill: dict, cutoff_ms: int) -> bool:
    """Ended at or before cutoff_ms."""
    return backfill["state"] != RUNNING and backfill["finished_ms"] <= cutoff_ms


def purge(tx: Tx, cmd: commands.Command, backfill_id: str) -> bool:
    """Remove a backfill that ended more than the finished-job retention before
    the purge's at_ms."""
    key = backfill_id.encode()
    backfill = tx.get(BACKFILLS, key)
    if backfill is None or not purgeable(backfill, cmd.at_ms - cmd.finished_job_retention_ms):
        return False
    tx.delete(BACKFILLS, key)
    _add(tx, _RECORDS_COUNTER, -1)
    _add(tx, tenant_records_counter_key(backfill["tenant"]), -1)
    return True
