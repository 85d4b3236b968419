"""DAG workflows: the rules of a DAG job's graph and the release of its tasks.

Pure: plain values in and out, no state, no clock. core/jobspec.py checks a
DAG body with the functions here; core/dagrun.py keeps a DAG run's task
instances in the run record and calls `begin` and `task_ended` from apply.

A DAG job's spec holds `dag: {"tasks": [task, ...]}`, each task
{id, target, depends_on, trigger_rule, retry, timeout_s}. The graph must be
acyclic, with unique ids and only known dependencies (`graph_problem`).

A DAG run keeps one instance per task, in the spec's order:

  {"id", "upstream": [ids], "rule", "queue", "pending", "state", "run_id",
   "attempt", "started_ms", "finished_ms", "error"}

`pending` counts the upstream tasks that have not ended. Tasks are released
in Kahn's order, incrementally: a task without upstream tasks (or with the
rule `always`) is released when the run begins; every other one is decided
when its counter reaches zero, by its trigger rule over its upstream tasks'
final states. A task decided `skipped` or `upstream_failed` has ended too, so
the decision cascades downstream at once. `one_success` and `one_failed` do
not wait for the zero: the first upstream success (failure) releases them.
Every other decision waits for all upstream tasks, so a task's final state
does not depend on the order its upstream tasks ended in.

A failed DAG run can be re-driven (`reset`): its failed tasks and those they
held back are decided again; the rest keep what they did.
"""

from __future__ import annotations

from typing import NamedTuple

from raftsched import limits
from raftsched.core import lifecycle, retry

ALL_SUCCESS = "all_success"
RULES = (ALL_SUCCESS, "all_failed", "all_done", "one_success", "one_failed", "none_failed",
         "none_failed_min_one_success", "always")

# Task instance states: the run lifecycle's for a released task, and three of
# the DAG's own for a task that was never released or cancelled before it was.
PENDING = "pending"                  # waiting for its upstream tasks
UPSTREAM_FAILED = "upstream_failed"  # not run: an upstream task failed (its rule says so)
SKIPPED = lifecycle.SKIPPED          # not run: its rule said so (an upstream task skipped)
QUEUED = lifecycle.QUEUED
SUCCEEDED = lifecycle.SUCCEEDED
FAILED = lifecycle.FAILED
CANCELLED = lifecycle.CANCELLED
TASK_STATES = (PENDING, QUEUED, lifecycle.RUNNING, lifecycle.RETRY_WAIT, SUCCEEDED, FAILED,
               UPSTREAM_FAILED, SKIPPED, CANCELLED)
TERMINAL = frozenset({SUCCEEDED, FAILED, UPSTREAM_FAILED, SKIPPED, CANCELLED})
# What a trigger rule counts as a failure upstream.
_FAILURES = frozenset({FAILED, UPSTREAM_FAILED})

# Decisions on a task whose upstream tasks have ended (enough of them).
RUN = "run"


# --- the graph ---------------------------------------------------------------------------

class GraphProblem(NamedTuple):
    """What is wrong with a DAG's graph: `detail`, at member `member` of task
    number `index`; `limit` names the bound exceeded, if that is what it is;
    `cycle` the ids of a cycle's tasks, each depending on the next."""
    detail: str
    index: int
    member: str
    limit: str | None = None
    cycle: tuple[str, ...] = ()


def graph_problem(tasks: list[dict]) -> GraphProblem | None:
    """What is wrong with a DAG's graph, or None. `tasks` are {id, depends_on}
    maps whose members have their types. Checks, in order: duplicate ids, a
    dependency on an unknown task or twice on one, the edge bound, and cycles."""
    index: dict[str, int] = {}
    for i, task in enumerate(tasks):
        if task["id"] in index:
            return GraphProblem(f"task id {task['id']!r} is used twice (dag.tasks"
                                f"[{index[task['id']]}] and dag.tasks[{i}])", i, "id")
        index[task["id"]] = i
    edges = 0
    for i, task in enumerate(tasks):
        seen: set[str] = set()
        for dep in task["depends_on"]:
            if dep not in index:
                return GraphProblem(f"task {task['id']!r} depends on {dep!r}, which is not "
                                    "a task of this DAG", i, "depends_on")
            if dep in seen:
                return GraphProblem(f"task {task['id']!r} lists {dep!r} twice", i, "depends_on")
            seen.add(dep)
        edges += len(seen)
    if edges > limits.dag_edges_max:
        return GraphProblem(f"the DAG has {edges} dependencies; at most "
                            f"{limits.dag_edges_max}", 0, "depends_on", "dag_edges_max")
    cycle = find_cycle(tasks)
    if cycle is not None and len(cycle) == 1:
        return GraphProblem(f"task {cycle[0]!r} depends on itself; a DAG has no cycle",
                            index[cycle[0]], "depends_on", cycle=tuple(cycle))
    if cycle is not None:
        return GraphProblem(f"the tasks {', '.join(cycle)} form a cycle "
                            f"({' -> '.join(cycle + cycle[:1])}, each depending on the next); "
                            "a DAG has none", index[cycle[0]], "depends_on", cycle=tuple(cycle))
    return None


def find_cycle(tasks: list[dict]) -> list[str] | None:
    """The ids of one cycle of the graph, each depending on the next, or None.

    Kahn's algorithm removes every task that does not depend on a cycle; from
    any task left, following dependencies among the tasks left must come back
    to a task already seen, and the path from there is a cycle."""
    upstream = {t["id"]: [d for d in t["depends_on"] if d != t["id"]] for t in tasks}
    selfish = [t["id"] for t in tasks if t["id"] in t["depends_on"]]
    if selfish:
        return [selfish[0]]
    remaining = {tid: len(deps) for tid, deps in upstream.items()}
    downstream: dict[str, list[str]] = {tid: [] for tid in upstream}
    for tid, deps in upstream.items():
        for dep in deps:
            downstream.setdefault(dep, []).append(tid)
    ready = [tid for tid, count in remaining.items() if count == 0]
    while ready:
        tid = ready.pop()
        del remaining[tid]
        for child in downstream[tid]:
            remaining[child] -= 1
            if remaining[child] == 0:
                ready.append(child)
    if not remaining:
        return None
    path: list[str] = []
    at: dict[str, int] = {}
    tid = min(remaining)   # deterministic: the same answer for the same graph
    while tid not in at:
        at[tid] = len(path)
        path.append(tid)
        tid = next(dep for dep in upstream[tid] if dep in remaining)
    return path[at[tid]:]


def topological_order(tasks: list[dict]) -> list[str]:
    """The ids in an order where every task comes after its dependencies
    (Kahn's, ties by spec order). The graph must pass graph_problem."""
    pending = {t["id"]: len(t["depends_on"]) for t in tasks}
    downstream: dict[str, list[str]] = {t["id"]: [] for t in tasks}
    for t in tasks:
        for dep in t["depends_on"]:
            downstream[dep].append(t["id"])
    order = [t["id"] for t in tasks if pending[t["id"]] == 0]
    for tid in order:   # grows as tasks are released
        for child in downstream[tid]:
            pending[child] -= 1
            if pending[child] == 0:
                order.append(child)
    assert len(order) == len(tasks), "the graph has a cycle"
    return order


# --- a task's spec ----------------------------------------------------------------------

def task_spec(spec: dict, task_id: str) -> dict | None:
    for task in (spec.get("dag") or {}).get("tasks", ()):
        if task["id"] == task_id:
            return task
    return None


def target_of(spec: dict, task_id: str | None) -> dict | None:
    """The target a run calls: the job's, or, for a task run, its task's (None
    once the task is gone from the job's DAG, changed by an update)."""
    if task_id is None:
        return spec.get("target")
    task = task_spec(spec, task_id)
    return task["target"] if task is not None else None


def targets(spec: dict) -> list[tuple[str, dict]]:
    """(the member's name, the target) of each target a job spec calls: its
    own, or each of its DAG's tasks'."""
    if "target" in spec:
        return [("target", spec["target"])]
    return [(f"dag.tasks[{i}].target", task["target"])
            for i, task in enumerate((spec.get("dag") or {}).get("tasks") or ())]


def retry_of(spec: dict, task_id: str | None) -> dict | None:
    """The stored retry member that governs a run: its task's own, else the job's."""
    task = task_spec(spec, task_id) if task_id is not None else None
    if task is not None and task.get("retry") is not None:
        return task["retry"]
    return spec.get("retry")


def retry_policy(spec: dict | None, task_id: str | None) -> dict:
    """The retry policy of a run (retry.policy_of of retry_of); the default
    policy when the job is gone."""
    return retry.policy_of(retry_of(spec, task_id) if spec is not None else None)


# --- a run's instances -------------------------------------------------------------------

def new_instances(tasks: list[dict]) -> list[dict]:
    """The instances of a new DAG run, all pending."""
    return [{"id": t["id"], "upstream": list(t["depends_on"]),
             "rule": t.get("trigger_rule") or ALL_SUCCESS, "queue": None,
             "pending": len(t["depends_on"]), "state": PENDING, "run_id": None, "attempt": 0,
             "started_ms": None, "finished_ms": None, "error": None} for t in tasks]


def decide(rule: str, upstream: int, succeeded: int, failed: int, skipped: int) -> str | None:
    """A pending task's decision: RUN, SKIPPED, UPSTREAM_FAILED, or None (wait),
    from how many of its `upstream` tasks ended succeeded, failed (failed or
    upstream_failed) or skipped. Airflow's trigger rules."""
    if rule == "always" or upstream == 0:
        return RUN
    if rule == "one_success" and succeeded:
        return RUN
    if rule == "one_failed" and failed:
        return RUN
    if succeeded + failed + skipped < upstream:
        return None
    if rule == ALL_SUCCESS:
        return RUN if succeeded == upstream else UPSTREAM_FAILED if failed else SKIPPED
    if rule == "all_failed":
        return RUN if failed == upstream else SKIPPED
    if rule == "all_done":
        return RUN
    if rule == "one_success":
        return SKIPPED if skipped == upstream else UPSTREAM_FAILED
    if rule == "one_failed":
        return SKIPPED
    if rule == "none_failed":
        return UPSTREAM_FAILED if failed else RUN
    assert rule == "none_failed_min_one_success", rule
    return UPSTREAM_FAILED if failed else RUN if succeeded else SKIPPED


def begin(instances: list[dict]) -> list[str]:
    """Release what runs at once: their state becomes queued. Returns their
    ids, in the order they were decided.

    In a new run every task is pending, so this is the tasks without upstream
    tasks and those with the rule `always`. In a re-driven run (`reset`) a
    pending task may have upstream tasks that ended before (succeeded or
    skipped, kept): each is decided from those as `task_ended` would, and one
    decided skipped or upstream_failed cascades downstream."""
    by_id = {inst["id"]: inst for inst in instances}
    released: list[str] = []
    for inst in instances:
        if inst["state"] != PENDING:
            continue   # kept from before, or decided by an earlier cascade
        decision = _decision(inst, by_id)
        if decision == RUN:
            inst["state"] = QUEUED
            released.append(inst["id"])
        elif decision is not None:
            released += task_ended(instances, inst["id"], decision)
    return released


def reset(instances: list[dict]) -> list[str]:
    """A failed DAG run is re-driven: its failed tasks, and the tasks they held
    back (upstream_failed, or skipped downstream of one of those), become
    pending again; every other task keeps its state, so a task that succeeded
    (a cleanup or an alert task that ran because of the failure included) is
    not run again. Each counter becomes the number of its upstream tasks that
    were reset. Returns the ids reset, in topological order; `begin` then
    releases what can run."""
    by_id = {inst["id"]: inst for inst in instances}
    order = topological_order([{"id": i["id"], "depends_on": i["upstream"]} for i in instances])
    again: set[str] = set()
    for tid in order:
        inst = by_id[tid]
        held = inst["state"] == SKIPPED and any(dep in again for dep in inst["upstream"])
        if inst["state"] in _FAILURES or held:
            again.add(tid)
    for inst in instances:
        inst["pending"] = sum(1 for dep in inst["upstream"] if dep in again)
        if inst["id"] in again:
            inst.update(state=PENDING, started_ms=None, finished_ms=None, error=None)
    return [tid for tid in order if tid in again]


def task_ended(instances: list[dict], task_id: str, state: str) -> list[str]:
    """Task `task_id` ended in `state` (succeeded or failed): record it, count
    it off its downstream tasks' pending counters and decide those it settles,
    cascading through the ones decided skipped or upstream_failed. Returns the
    ids released (now queued), in the order they were decided."""
    assert state in TERMINAL, state
    by_id = {inst["id"]: inst for inst in instances}
    by_id[task_id]["state"] = state
    released: list[str] = []
    ended = [task_id]
    for done in ended:   # grows as decisions cascade
        for inst in instances:
            if done not in inst["upstream"]:
                continue
            inst["pending"] -= 1
            if inst["state"] != PENDING:
                continue   # released early (one_success, one_failed, always)
            decision = _decision(inst, by_id)
            if decision == RUN:
                inst["state"] = QUEUED
                released.append(inst["id"])
            elif decision is not None:
                inst["state"] = decision
                ended.append(inst["id"])
    return released


def _decision(inst: dict, by_id: dict[str, dict]) -> str | None:
    """From the upstream tasks' states. Within one cascade a state is set
    before its downstream counters are decremented, so the states may be
    ahead of the counter, never behind: the counter reaching zero always
    finds every upstream task ended."""
    states = [by_id[dep]["state"] for dep in inst["upstream"]]
    succeeded = states.count(SUCCEEDED)
    failed = sum(1 for s in states if s in _FAILURES)
    skipped = states.count(SKIPPED)
    assert succeeded + failed + skipped >= len(states) - inst["pending"], inst
    return decide(inst["rule"], len(states), succeeded, failed, skipped)


def cancel(instances: list[dict]) -> list[dict]:
    """Cancel every task that has not ended; returns the instances cancelled
    (the caller stops the runs of those that were released)."""
    cancelled = [inst for inst in instances if inst["state"] not in TERMINAL]
    for inst in cancelled:
        inst["state"] = CANCELLED
    return cancelled


def outcome(instances: list[dict]) -> str | None:
    """The DAG run's end, once every task has ended: failed if a task failed
    or was upstream_failed (a failure is never hidden by a task that ran after
    it, such as a cleanup), else succeeded. None while a task has not ended."""
    if any(inst["state"] not in TERMINAL for inst in instances):
        return None
    if any(inst["state"] in _FAILURES for inst in instances):
        return FAILED
    return SUCCEEDED


def failure_summary(instances: list[dict], chars_max: int) -> str:
    """A DAG run's error: the tasks that failed, each with its error, and the
    count of those it held back, cut to `chars_max` characters."""
    failed = [i for i in instances if i["state"] == FAILED]
    held = sum(1 for i in instances if i["state"] == UPSTREAM_FAILED)
    parts = [f"task {i['id']} failed" + (f": {i['error']}" if i["error"] else "")
             for i in failed]
    text = "; ".join(parts) or "no task failed"
    if held:
        text += f"; {held} task{'s' if held > 1 else ''} upstream_failed"
    return text if len(text) <= chars_max else text[:chars_max - 1] + "…"
