"""DAG runs in apply: one run of a DAG job, and a task run per released task.

A DAG run is a run record like any other (its identity is (job,
scheduled_for), the job's concurrency policy admits it, it is counted among
the job's open runs) with one more member, `tasks`: the instances of its
tasks (core/dag.py), which hold the graph as it was when the run was created,
its pending-parent counters and each task's state. The DAG run itself is
never executed: it has no executor, lease or holder. It is

  queued    admitted; its first tasks are released
  running   from the start of its first task
  succeeded or failed   once every task has ended (dag.outcome); a failed
            DAG run raises the job's failure alert
  cancelled with every task that had not ended

A released task is executed as a *task run*: a run record with `dag_run` and
`task_id`, id keys.task_run_id(dag run, task) and execution id
keys.task_execution_id(job, scheduled_for, task), created queued on the node
that owns the job's shard (or in its worker queue). From there it goes the
way every run goes (core/runs.py): started, heartbeated and finished by its
executor's reports, retried under its task's retry policy with the job's
semantics, ended by the reaper when its holder dies, moved off a dead node.
Its own state changes call back here (`task_moved`, `task_ended`), and a
task's end decrements its downstream tasks' counters, in apply: two upstream
tasks that end in one batch are counted one after the other, so one of them
sees the counter reach zero. Task runs are not in the job's history (their
ids, keys.task_run_id, are not under its keys.job_runs_prefix) and are not
counted by its concurrency policy; they are removed with their DAG run.

A failed DAG run is re-driven as a whole (core/redrive.py, `redrive`): its
failed tasks run again, as the next attempt of the same task runs, and the
tasks they held back are decided again; tasks that succeeded are kept.
"""

from __future__ import annotations

from raftsched import limits
from raftsched.core import dag, keys, lifecycle, runs
from raftsched.core.tx import TALLY_RUN_ENDED, Tx


def is_dag_run(run: dict) -> bool:
    return "tasks" in run


def prepare(run: dict, spec: dict, state: str) -> None:
    """Give a new run of a DAG job its task instances: pending, or skipped when
    the run is created `state` skipped or missed (it will not run)."""
    instances = dag.new_instances(spec["dag"]["tasks"])
    for inst, task in zip(instances, spec["dag"]["tasks"]):
        inst["queue"] = runs.worker_queue(task)
        if state not in (lifecycle.QUEUED, lifecycle.SCHEDULED):
            inst["state"] = dag.SKIPPED
    run["tasks"] = instances


def begin(tx: Tx, run: dict, node: str, at_ms: int) -> None:
    """The DAG run was admitted (queued): release the tasks that run at once.
    The caller puts the run."""
    assert run["state"] == lifecycle.QUEUED, run["id"]
    run["queued_ms"] = at_ms
    for task_id in dag.begin(run["tasks"]):
        _release(tx, run, task_id, node, at_ms)


def task_run_ids(run: dict) -> list[str]:
    """The task runs a DAG run has made (none for any other run)."""
    return [inst["run_id"] for inst in run.get("tasks", ()) if inst["run_id"] is not None]


def _instance(run: dict, task_id: str) -> dict:
    return next(inst for inst in run["tasks"] if inst["id"] == task_id)


def _release(tx: Tx, run: dict, task_id: str, node: str | None, at_ms: int) -> None:
    """Create the task run of `task_id`, queued on `node` or in its worker queue."""
    inst = _instance(run, task_id)
    child_id = keys.task_run_id(run["id"], task_id)
    before = runs.get_run(tx, child_id)
    if before is not None and before["state"] == lifecycle.FAILED and inst["attempt"]:
        _reopen_task(tx, run, inst, before, node, at_ms)
        return
    if before is not None:
        return   # released before: a task runs once per DAG run
    # Every member the DAG run has (tenant, trigger, token, priority, ...)
    # and the attempt's own members fresh.
    child = {name: value for name, value in run.items() if name != "tasks"}
    child.update(
        id=child_id, execution_id=keys.task_execution_id(run["job_id"], run["scheduled_ms"],
                                                         task_id),
        attempt=1, state=lifecycle.QUEUED, queue=inst["queue"], created_ms=at_ms,
        queued_ms=None, started_ms=None, finished_ms=None, holder=None, lease_ms=None,
        retry_due_ms=None, http_status=None, exit_code=None, error=None, reason=None,
        attempts=[], alert=None, dag_run=run["id"], task_id=task_id)
    runs.enqueue(tx, child, node or run["node"], at_ms)
    runs.put_run(tx, child)
    inst.update(run_id=child_id)
    _follow_held(run, inst, child)


def redrive(run: dict) -> None:
    """The failed DAG run gets a new attempt (core/redrive.py): its failed
    tasks and those they held back are pending again; `begin`, when the run
    is queued, releases them, and a failed task's run gets its next attempt."""
    dag.reset(run["tasks"])


def _reopen_task(tx: Tx, run: dict, inst: dict, child: dict, node: str | None,
                 at_ms: int) -> None:
    """A failed task of a re-driven DAG run runs again: the same task run, with
    the same ids, its next attempt, its task's retry policy afresh from here."""
    runs.reopen(child, run["trigger"], run["token"], None)
    child.update(queue=inst["queue"], started_ms=None)
    child["state"] = lifecycle.next_state(child["id"], child["state"], "redrive")
    runs.enqueue(tx, child, node or run["node"], at_ms)
    runs.put_run(tx, child)
    _follow_held(run, inst, child)


def _follow_held(run: dict, inst: dict, child: dict) -> None:
    """A released task run is queued (a worker's) or already held by its
    shard's owner (the lease taken at release): its instance follows, and the
    first task to run starts the DAG run, as task_moved does."""
    inst.update(attempt=child["attempt"], state=child["state"])
    if child["state"] == lifecycle.RUNNING:
        if inst.get("started_ms") is None:
            inst["started_ms"] = child["started_ms"]
        if run["state"] == lifecycle.QUEUED:
            run["state"] = lifecycle.next_state(run["id"], run["state"], "start")
            run["started_ms"] = child["started_ms"]


def _dag_run_of(tx: Tx, child: dict) -> tuple[dict, dict] | None:
    """(the DAG run, the task's instance) of a task run still open in it."""
    run = runs.get_run(tx, child["dag_run"])
    if run is None or run["state"] not in lifecycle.ACTIVE or not is_dag_run(run):
        return None
    inst = _instance(run, child["task_id"])
    if inst["run_id"] != child["id"] or inst["state"] in dag.TERMINAL:
        return None
    return run, inst


def _copy_state(inst: dict, child: dict) -> None:
    inst.update(state=child["state"], attempt=child["attempt"], error=child["error"],
                finished_ms=child["finished_ms"])
    if inst["started_ms"] is None:
        inst["started_ms"] = child["started_ms"]


def task_moved(tx: Tx, child: dict) -> None:
    """A task run started, or waits for its next attempt, or was queued for it:
    its instance follows. The first task to start starts the DAG run."""
    found = _dag_run_of(tx, child)
    if found is None:
        return
    run, inst = found
    _copy_state(inst, child)
    if child["state"] == lifecycle.RUNNING and run["state"] == lifecycle.QUEUED:
        run["state"] = lifecycle.next_state(run["id"], run["state"], "start")
        run["started_ms"] = child["started_ms"]
    runs.put_run(tx, run)


def task_ended(tx: Tx, job: dict, child: dict, at_ms: int) -> None:
    """A task run ended (succeeded, or failed for good): count it off its
    downstream tasks, release those it settles on the shard's owner, and end
    the DAG run once every task has ended. The caller puts the job."""
    found = _dag_run_of(tx, child)
    if found is None:
        return
    run, inst = found
    _copy_state(inst, child)
    released = dag.task_ended(run["tasks"], inst["id"], child["state"])
    node = runs.shard_owner(tx, job) or child["node"] or run["node"]
    for task_id in released:
        _release(tx, run, task_id, node, at_ms)
    ended = dag.outcome(run["tasks"])
    if ended is not None:
        _end(tx, job, run, ended, at_ms)
    runs.put_run(tx, run)


def _end(tx: Tx, job: dict, run: dict, ended: str, at_ms: int) -> None:
    if run["state"] == lifecycle.QUEUED:   # no task started (each ended at once)
        run["state"] = lifecycle.next_state(run["id"], run["state"], "start")
    run["state"] = lifecycle.next_state(run["id"], run["state"],
                                        "succeed" if ended == dag.SUCCEEDED else "fail")
    run["finished_ms"] = at_ms
    tx.tally(TALLY_RUN_ENDED, run["state"])
    if ended == dag.FAILED:
        run["error"] = dag.failure_summary(run["tasks"], limits.run_error_chars_max)
        runs.raise_alert(tx, job, run, at_ms)
    runs.settle(tx, job, run, at_ms)


def cancel_tasks(tx: Tx, job: dict, run: dict, at_ms: int, reason: str) -> None:
    """The DAG run is being cancelled: cancel every task that has not ended,
    stopping the task runs of those released."""
    for inst in dag.cancel(run["tasks"]):
        inst["finished_ms"] = at_ms
        child = runs.get_run(tx, inst["run_id"]) if inst["run_id"] is not None else None
        if child is not None and lifecycle.allows(child["state"], "cancel"):
            runs.cancel(tx, job, child, at_ms, reason)


def cancel_refusal(run: dict) -> dict | None:
    """A task run is cancelled with its DAG run, not alone."""
    if "dag_run" not in run:
        return None
    return {"ok": False, "error": "conflict",
            "detail": f"run {run['id']} is task {run['task_id']!r} of DAG run "
                      f"{run['dag_run']}; cancel the DAG run"}
