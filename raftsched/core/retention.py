"""Retention in apply: the `purge` command removes what the bounds let go.

The leader's purger (runtime/purger.py) chooses the items and the bounds; apply
checks every item again against the state and the command's own `at_ms`, and
removes it only if it is still past a bound. An item that is not (a run that a
newer command has not finished, a job that was updated since) is counted as
refused and left alone, on every replica alike.

  runs  (run_id, job_id): a finished run (terminal, with no alert waiting for
        delivery) past a bound of its job's history: more finished runs than
        `max_runs`, or finished more than `max_age_ms` before at_ms; or any
        finished run of a job that was deleted or completed more than the
        retention before at_ms. Its runs_by_tenant entry goes
        with it, and so do the task runs of a DAG run (core/dagrun.py).
  jobs  job_id: a job deleted or completed more than the retention before
        at_ms, with no runs left and none open.
  idem  (tenant, key): an idempotency key created more than the TTL before at_ms.
  backfills  backfill_id: a backfill that ended (succeeded, failed or was
        cancelled) more than the finished-job retention before at_ms.

A job's history bounds are its spec's `history` members, else the cluster
defaults the command carries (the proposer's --history-max-runs and
--history-max-age-s). The job record counts its runs (`runs_count`, kept by
runs.create_run and here), so "more than max_runs finished" is one read.
"""

from __future__ import annotations

from typing import Any

from raftsched.core import backfill, commands, dagrun, keys, tenancy
from raftsched.core.lifecycle import TERMINAL
from raftsched.core.tx import (ALERTS, IDEM, JOBS, JOBS_BY_TENANT, RUNS,
                               RUNS_BY_TENANT, RunsPurged, Tx)

# Statuses of a job that will not fire again on its own: deleted, or completed
# (a one-off that fired, or a schedule with no occurrence left).
RETIRED = frozenset({"deleted", "completed"})


def idem_entry(value: Any) -> tuple[str, int | None]:
    """(job_id, created_ms) of an idempotency table value. Values written before
    keys had a TTL are the bare job id; their creation time is unknown (None)."""
    if isinstance(value, str):
        return value, None
    return value["job_id"], value["created_ms"]


def idem_value(job_id: str, created_ms: int) -> dict:
    return {"v": 1, "job_id": job_id, "created_ms": created_ms}


def idem_created_ms(tx: Any, value: Any) -> int | None:
    """When the key was reserved: its own time, or (for an old value) its job's
    creation time; None when neither is known (the job is gone)."""
    job_id, created_ms = idem_entry(value)
    if created_ms is None:
        job = tx.get(JOBS, keys.job_key(job_id))
        created_ms = job["created_ms"] if job is not None else None
    return created_ms


def history_bounds(job: dict, max_runs_default: int, max_age_ms_default: int) -> tuple[int, int]:
    """(max_runs, max_age_ms) of a job: its own history members, else the defaults."""
    history = job["spec"].get("history") or {}
    return (history.get("max_runs", max_runs_default),
            history.get("max_age_ms", max_age_ms_default))


def open_runs(job: dict) -> int:
    return len(job.get("active", [])) + len(job.get("waiting", []))


def finished_runs(job: dict) -> int:
    """Runs of the job in its history that are finished (the rest are open)."""
    return job.get("runs_count", 0) - open_runs(job)


def retired_before(job: dict, cutoff_ms: int) -> bool:
    """Deleted or completed at or before cutoff_ms (when it was last changed)."""
    return job["status"] in RETIRED and job["updated_ms"] <= cutoff_ms


def run_past_bounds(job: dict, run: dict, cmd: commands.Command) -> bool:
    """Whether a finished run of `job` may go, by the command's bounds and at_ms."""
    at_ms = cmd.at_ms
    if retired_before(job, at_ms - cmd.finished_job_retention_ms):
        return True
    max_runs, max_age_ms = history_bounds(job, cmd.history_max_runs, cmd.history_max_age_ms)
    if run["finished_ms"] is not None and run["finished_ms"] <= at_ms - max_age_ms:
        return True
    return finished_runs(job) > max_runs


def purgeable_state(run: dict) -> bool:
    """Finished, with no failure alert still waiting for delivery."""
    return run["state"] in TERMINAL and run.get("alert") != "pending"


def _purge_run(tx: Tx, cmd: commands.Command, run_id: str, job_id: str) -> bool:
    run = tx.get(RUNS, run_id.encode())
    if run is None or run["job_id"] != job_id or not purgeable_state(run):
        return False
    if tx.get(ALERTS, run_id.encode()) is not None:
        return False
    job = tx.get(JOBS, keys.job_key(job_id))
    if job is not None and not run_past_bounds(job, run, cmd):
        return False
    tx.delete(RUNS, run_id.encode())
    _purge_task_runs(tx, run)
    tx.delete(RUNS_BY_TENANT, keys.runs_by_tenant_key(run["tenant"], run["scheduled_ms"], run_id))
    if job is not None:
        job["runs_count"] = max(0, job.get("runs_count", 0) - 1)
        tx.put(JOBS, keys.job_key(job_id), job)
    return True


def _purge_task_runs(tx: Tx, run: dict) -> None:
    """A DAG run goes with the task runs it made (they ended before it did):
    at most dag_tasks_max of them."""
    task_runs = [run_id for run_id in dagrun.task_run_ids(run)
                 if tx.get(RUNS, run_id.encode()) is not None]
    for run_id in task_runs:
        tx.delete(RUNS, run_id.encode())
    if task_runs:
        tx.effects.append(RunsPurged(run_ids=tuple(task_runs)))


def _purge_job(tx: Tx, cmd: commands.Command, job_id: str) -> bool:
    job = tx.get(JOBS, keys.job_key(job_id))
    if job is None or not retired_before(job, cmd.at_ms - cmd.finished_job_retention_ms):
        return False
    if job.get("runs_count", 0) > 0 or open_runs(job) or job["next_ms"] is not None:
        return False
    tx.delete(JOBS, keys.job_key(job_id))
    tx.delete(JOBS_BY_TENANT, keys.jobs_by_tenant_key(job["tenant"], job_id))
    if job["status"] != "deleted":
        # A completed job counted towards its tenant's jobs_max until now.
        tenancy.release_job(tx, job["tenant"])
    return True


def _purge_idem(tx: Tx, cmd: commands.Command, tenant: str, key: str) -> bool:
    idem = keys.idem_key(tenant, key)
    value = tx.get(IDEM, idem)
    if value is None:
        return False
    created_ms = idem_created_ms(tx, value)
    if created_ms is not None and created_ms > cmd.at_ms - cmd.idempotency_ttl_ms:
        return False
    tx.delete(IDEM, idem)
    return True


def handle_purge(tx: Tx, cmd: commands.Command) -> dict:
    """Runs first, then jobs (a job goes only once its runs are gone, possibly
    earlier in this same command), then idempotency keys, then backfills."""
    purged = [r.run_id for r in cmd.runs if _purge_run(tx, cmd, r.run_id, r.job_id)]
    if purged:
        tx.effects.append(RunsPurged(run_ids=tuple(purged)))
    runs = len(purged)
    jobs = sum(_purge_job(tx, cmd, job_id) for job_id in cmd.jobs)
    idem = sum(_purge_idem(tx, cmd, i.tenant, i.key) for i in cmd.idem)
    backfills = sum(backfill.purge(tx, cmd, ident) for ident in cmd.backfills)
    asked = len(cmd.runs) + len(cmd.jobs) + len(cmd.idem) + len(cmd.backfills)
    return {"ok": True, "runs": runs, "jobs": jobs, "idem": idem, "backfills": backfills,
            "refused": asked - runs - jobs - idem - backfills}
