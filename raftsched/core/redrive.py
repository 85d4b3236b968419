"""Re-drive in apply: a failed run gets a new attempt under the same execution id.

Runs that ended `failed` are the dead letters (GET /v1/runs?state=failed).
POST /v1/runs/{id}:retry proposes `retry_run`, which apply accepts only for a
run that is failed when the command is applied, of a job that is not deleted:

  - The run is the same record, with the same run id and execution id; its
    attempt number goes up by one and its earlier attempts stay listed.
  - It goes through the job's concurrency policy as a new occurrence would,
    and joins the job's open runs: under `allow` it is queued (up to
    job_active_runs_max open runs), under `queue` it waits behind the open
    ones (up to queue_max), under `replace` the open ones are cancelled. Where
    a new occurrence would be recorded skipped (`skip_if_running` while a run
    is open, a full queue), the re-drive is refused as a conflict and the run
    stays failed. `overlap: "allow"` admits it as `allow` would.
  - The job's retry policy applies afresh from the new attempt: up to
    retry.max_attempts attempts, counted from the re-drive (`redrive_base`).
  - `trigger` becomes "retry"; `first_trigger` keeps how the run first
    started (schedule, manual or backfill); `redrives` counts the re-drives,
    at most run_redrives_max.
  - The new attempt runs on the proposing node (or in the run's worker queue),
    under the fencing token the run's shard has now.

A failed DAG run is re-driven as a whole: its failed tasks run again, each as
the next attempt of its task run (same ids, its task's retry policy afresh),
the tasks they held back (upstream_failed, or skipped downstream of them) are
decided again by their trigger rules, and tasks that succeeded are kept
(core/dag.py `reset`). A task run is not re-driven alone: its state is the
DAG run's, which a single task's new attempt would not update.
"""

from __future__ import annotations

from raftsched import limits
from raftsched.core import commands, dagrun, keys, runs, tenancy
from raftsched.core.lifecycle import FAILED, QUEUED, SCHEDULED, SKIPPED
from raftsched.core.tx import SHARDS, Tx, live_job, refuse

TRIGGER = "retry"


def handle_retry_run(tx: Tx, cmd: commands.Command) -> dict:
    run = runs.get_run(tx, cmd.run_id)
    if run is None or (commands.given(cmd.tenant) is not None and run["tenant"] != cmd.tenant):
        return refuse("not_found", f"run {cmd.run_id} not found")
    refusal = _refusal(tx, run)
    if refusal is not None:
        return refusal
    job = live_job(tx, run["job_id"])
    assert job is not None, run["job_id"]   # _refusal checked it
    state, reason = runs.admit(tx, job, run, cmd.at_ms, commands.given(cmd.overlap))
    if state == SKIPPED:
        return refuse("conflict", f"run {run['id']} was not retried: {reason}; retry it when "
                                  "the job's open runs have ended, or give "
                                  "{\"overlap\": \"allow\"}")
    _reopen(tx, job, run, reason)
    if state == QUEUED:
        runs.move(run, "redrive")
        runs.enqueue(tx, run, cmd.node, cmd.at_ms)
        job.setdefault("active", []).append(run["id"])
    else:
        assert state == SCHEDULED, state
        runs.move(run, "redrive_wait")
        job.setdefault("waiting", []).append(run["id"])
    runs.put_run(tx, run)
    runs.put_job(tx, job)
    tenancy.audit(tx, cmd, "run.retry", job["tenant"], job["id"], run_id=run["id"],
                  attempt=run["attempt"])
    return {"ok": True, "run": run}


def _refusal(tx: Tx, run: dict) -> dict | None:
    """Why this run cannot be re-driven now, or None."""
    if run["state"] != FAILED:
        return refuse("conflict", f"run {run['id']} is {run['state']}; only a failed run "
                                  "can be retried")
    if "dag_run" in run:
        return refuse("conflict", f"run {run['id']} is task {run.get('task_id')!r} of DAG "
                                  f"run {run['dag_run']}; retry the DAG run, which runs "
                                  "its failed tasks again")
    if live_job(tx, run["job_id"]) is None:
        return refuse("conflict", f"job {run['job_id']} was deleted; its runs do not run again")
    if run.get("redrives", 0) >= limits.run_redrives_max:
        return {"ok": False, "error": "limit", "limit": "run_redrives_max", "field": "run_id",
                "detail": f"run {run['id']} was retried {run['redrives']} times, the most "
                          f"a run may be (run_redrives_max)"}
    return None


def _reopen(tx: Tx, job: dict, run: dict, reason: str | None) -> None:
    """The run's new attempt, under the fencing token its shard has now."""
    shard = tx.get(SHARDS, keys.shard_key(job["shard"]))
    runs.reopen(run, TRIGGER, shard["token"] if shard else 0, reason)
    if dagrun.is_dag_run(run):
        dagrun.redrive(run)   # its tasks are released when it is queued
