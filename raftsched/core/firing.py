"""When a job's occurrence fires, and what the proposer's fire says about it.

A job with `jitter_ms` fires each occurrence later by a delay from 0 to
jitter_ms that a stable hash of (job id, occurrence) picks (core/schedule.py
fire_delay_ms): its due entry is keyed by that instant, while the occurrence
(the run's scheduled_for, and so its execution id) stays the schedule's own.
apply keys the due entry with `due_at_ms`, and the trigger loop builds each fire
item with `fire_item`; both compute the delay from the job alone, so they agree
without carrying it.

Pure: the caller passes the job record and now_ms.
"""

from __future__ import annotations

from typing import NamedTuple

from raftsched.core.cost import catchup_fitting
from raftsched.core.runs import worker_queue
from raftsched.core.schedule import covered_occurrences, fire_delay_ms

# The misfire policy of a job stored before jobs had one.
DEFAULT_MISFIRE = {"policy": "fire_once", "tolerance_ms": 60_000, "catchup_max": 100}


class FireItem(NamedTuple):
    """What a fire says of one job's due entry (commands.FireItem, whose
    array form it is): the occurrence due, the job's next one after those
    covered, the occurrences covered (the due one first), and how many a
    catch-up window or bound left out."""
    job_id: str
    occurrence: int
    next_ms: int | None
    occurrences: list[int]
    omitted: int


def due_at_ms(job: dict, occurrence_ms: int) -> int:
    """When an occurrence of the job fires: at it, later by the job's delay for it."""
    return occurrence_ms + fire_delay_ms(job["id"], occurrence_ms,
                                         job["spec"].get("jitter_ms", 0))


def fire_item(job: dict, due_ms: int, now_ms: int) -> FireItem | None:
    """The fire item for the
    job's due entry at `due_ms`, or None when the entry is not the job's armed
    one any more (the job changed since: apply would refuse it as stale).

    The occurrences covered are those whose fire time has surely come: at or
    before now minus the job's jitter (a later one fires from its own entry, at
    once if its delay has passed), and, with a catch-up window, none between
    the due one and the window's start. A job of a large DAG catches up
    fewer than its catchup_max, so that its item fits one Raft entry
    (core/cost.py catchup_fitting)."""
    occurrence = job["next_ms"]
    if occurrence is None or due_at_ms(job, occurrence) != due_ms:
        return None
    spec = job["spec"]
    policy = spec.get("misfire") or DEFAULT_MISFIRE
    window_ms = policy.get("catchup_window_ms")
    occurrences, omitted, next_ms = covered_occurrences(
        spec["schedule"], occurrence, now_ms - spec.get("jitter_ms", 0),
        catchup_fitting(spec, policy["catchup_max"]),
        None if window_ms is None else now_ms - window_ms)
    return FireItem(job["id"], occurrence, next_ms, occurrences, omitted)


# What every member a fire reads of the spec of a pending one-off that
# compact.pending_once_facts admits answers: an HTTP target a node calls;
# priority, concurrency, misfire policy, queue, jitter and DAG at their
# defaults. Only ever read.
PENDING_ONCE_SPEC = {"target": {"type": "http"}}


def pending_fire_item(job_id: str, facts: tuple[str, int, int], due_ms: int) -> FireItem | None:
    """fire_item for a pending one-off of compact.pending_once_facts, from
    those facts alone: its one occurrence, at its due entry's time."""
    run_at_ms = facts[2]
    if run_at_ms != due_ms:
        return None
    return FireItem(job_id, due_ms, None, [due_ms], False)


def armable(spec: dict) -> bool:
    """May an occurrence of a job with this spec fire ahead of its second (be
    armed, runtime/armed.py)? Only when nothing about its run is decided at
    the call: a node executes it (a remote worker would claim it at once), it
    is no DAG (its first tasks are released at the fire), and its concurrency
    policy is `allow` (the others look at the job's open runs, which must be
    judged when the run is due, not before). Anything else fires at its second."""
    if "dag" in spec:
        return False
    concurrency = spec.get("concurrency") or {"policy": "allow"}
    if concurrency["policy"] != "allow":
        return False
    return spec.get("target") is not None and worker_queue(spec) is None
