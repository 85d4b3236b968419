"""What a command's items cost a replica's apply, in cost units.

Every replica applies each Raft entry on its Raft thread in one go and sends
no heartbeat meanwhile (runtime/apply_bridge.py). An entry that takes too long
looks like a dead leader, and its followers call an election. The number of
items an entry carries says little about its cost: one fire item of a DAG job
creates a task run per task that starts at once, and one finished task can
release every task downstream of it. So the proposers (the trigger loop, the
reporter, the backfill stepper) fill each entry up to
`limits.apply_entry_cost_max` units, estimated here from what they already
hold, and what does not fit goes in the next entry, in order.

One unit is about one run record created or rewritten: a run, a DAG run, a
task run, or the job a fire rewrites (docs/benchmarks.md has the measured
figures). An estimate errs high: it counts what an item may do, not what it
will do.

Pure: values in, integers out.
"""

from __future__ import annotations

from raftsched import limits

# What a task instance inside a DAG run record costs, as a fraction of a unit:
# it is a small map in a record that is written anyway (measured at about a
# tenth of a run record).
_INSTANCES_PER_UNIT = 10


def dag_tasks(spec: dict) -> list[dict]:
    """The tasks of a DAG job's spec (none for any other job)."""
    dag = spec.get("dag")
    return dag["tasks"] if dag else []


def occurrence_cost(spec: dict) -> int:
    """What one run of the job costs when a fire creates it: the run, and for
    a DAG job its task instances and the task runs of the tasks that start at
    once (those with no upstream task, or the rule `always`)."""
    tasks = dag_tasks(spec)
    if not tasks:
        return 1
    starting = sum(1 for task in tasks
                   if not task["depends_on"] or task.get("trigger_rule") == "always")
    return 1 + starting + len(tasks) // _INSTANCES_PER_UNIT


def fire_item_cost(spec: dict, occurrences: int) -> int:
    """A fire item covering `occurrences` of the job: the job rewritten and
    re-armed, and a run per occurrence (each counted as if it runs)."""
    return 1 + occurrences * occurrence_cost(spec)


def catchup_fitting(spec: dict, catchup_max: int) -> int:
    """The catch-up bound a fire of this job uses: its policy's catchup_max,
    lowered so that a fire item covering that many occurrences and the latest
    one fits an entry on its own (a job of a large DAG catches up fewer
    missed occurrences; the rest are omitted, as past catchup_max). At least 1."""
    fitting = (limits.apply_entry_cost_max - 1) // occurrence_cost(spec) - 1
    return max(1, min(catchup_max, fitting))


def downstream_count(spec: dict, task_id: str | None) -> int:
    """Tasks downstream of `task_id` in the job's DAG, directly or not: the
    most that the end of one of its task runs can release or decide."""
    tasks = dag_tasks(spec)
    if not tasks or task_id is None:
        return 0
    below: dict[str, list[str]] = {}
    for task in tasks:
        for parent in task["depends_on"]:
            below.setdefault(parent, []).append(task["id"])
    seen: set[str] = set()
    stack = list(below.get(task_id, ()))
    while stack:
        child = stack.pop()
        if child not in seen:
            seen.add(child)
            stack.extend(below.get(child, ()))
    return len(seen)


def run_update_cost(spec: dict | None, task_id: str | None, event: str) -> int:
    """A run report: one unit. The start or finish of a DAG task run also
    rewrites its DAG run (every task's instance), and a finish may release or
    decide every task downstream of it: a unit for each."""
    tasks = dag_tasks(spec) if spec is not None else []
    if event == "heartbeat" or task_id is None or not tasks:
        return 1
    moved = 2 + len(tasks) // _INSTANCES_PER_UNIT
    return moved + downstream_count(spec, task_id) if event == "finish" else moved


def pack(costs: list[int], cost_max: int, count_max: int) -> list[int]:
    """Split items of these costs, in order, into entries of at most
    `count_max` items and `cost_max` units: the sizes of the entries. An item
    that costs more than cost_max alone goes in an entry by itself."""
    sizes: list[int] = []
    count = total = 0
    for cost in costs:
        if count and (count >= count_max or total + cost > cost_max):
            sizes.append(count)
            count = total = 0
        count += 1
        total += cost
    if count:
        sizes.append(count)
    return sizes
