"""The run lifecycle: one table, every legal edge (docs/lifecycle.md is
generated from it by scripts/gen_lifecycle_doc.py, and a test keeps the two equal).

A run is one occurrence of a job, identified by (job_id, scheduled_for); its
attempts share the run and its execution id. A run is created in one of
CREATED_STATES:

  scheduled  waiting behind an open run of the same job (the `queue` policy)
  queued     ready: waiting for its executor (a node, or a worker of its queue)
  skipped    not run: the concurrency policy or the misfire tolerance said so
  missed     not run: the misfire policy ran a later occurrence instead

and then moves only along TRANSITIONS. `start` takes a lease (holder,
attempt, expiry); `heartbeat` extends it; `succeed`, `fail` and `retry` end the
attempt and are accepted only from the lease's holder for its attempt. `retry`
parks the run in retry_wait behind a durable due entry; `due` (that entry
fired) queues the next attempt. The reaper ends an attempt whose lease expired
with `retry` or `fail`. `reassign` moves a queued run off a node that died
before starting it.

A node-executed run is `start`ed in the apply that queues it (the lease is
taken at fire: its shard's owner holds it, core/runs.py). `take_over` ends
its attempt when its shard moved to another node, which holds the next
attempt at once (queued, then started in the same apply). `miss` and `skip`
end a run fired ahead of its second that its node never called, having
stopped before the second and come back after it: its job's misfire policy
judges it as it would a late occurrence (runtime/horizon.py).

A failed run is terminal, with one way out: `redrive` (POST /v1/runs/{id}:retry)
gives it a new attempt under the same execution id, queued, or `redrive_wait`
behind an open run of its job (the `queue` policy). Every other terminal state
is final.

`next_state` raises InvalidTransition for any other pair. apply treats a
transition the table does not allow as a stale report (counted, not applied):
reports are delivered at least once.
"""

from __future__ import annotations

from raftsched.errors import InvalidTransition

SCHEDULED = "scheduled"
QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
RETRY_WAIT = "retry_wait"
SKIPPED = "skipped"
MISSED = "missed"
CANCELLED = "cancelled"

STATES = (SCHEDULED, QUEUED, RUNNING, RETRY_WAIT, SUCCEEDED, FAILED, SKIPPED, MISSED,
          CANCELLED)
TERMINAL = frozenset({SUCCEEDED, FAILED, SKIPPED, MISSED, CANCELLED})
# Counted against the job's concurrency policy: the run has or will get an executor.
ACTIVE = frozenset({QUEUED, RUNNING, RETRY_WAIT})
OPEN = frozenset({SCHEDULED}) | ACTIVE
CREATED_STATES = frozenset({SCHEDULED, QUEUED, SKIPPED, MISSED})
# Not a state of the table: what the API shows for a run fired ahead of its
# second whose call cannot have begun yet (core/runs.py presented_state). It
# is `running` (or `queued`) in the state; an answer reads it against the
# cluster's time, so a list filtered by it needs no write.
ARMED = "armed"
PRESENTED_STATES = STATES + (ARMED,)

TRANSITIONS: dict[tuple[str, str], str] = {
    (SCHEDULED, "promote"): QUEUED,
    (SCHEDULED, "cancel"): CANCELLED,
    (QUEUED, "start"): RUNNING,
    (QUEUED, "reassign"): QUEUED,
    (QUEUED, "cancel"): CANCELLED,
    (RUNNING, "heartbeat"): RUNNING,
    (RUNNING, "take_over"): QUEUED,
    (RUNNING, "succeed"): SUCCEEDED,
    (RUNNING, "fail"): FAILED,
    (RUNNING, "retry"): RETRY_WAIT,
    (RUNNING, "cancel"): CANCELLED,
    (RUNNING, "miss"): MISSED,
    (RUNNING, "skip"): SKIPPED,
    (RETRY_WAIT, "due"): QUEUED,
    (RETRY_WAIT, "cancel"): CANCELLED,
    (FAILED, "redrive"): QUEUED,
    (FAILED, "redrive_wait"): SCHEDULED,
}
# The only edges out of a terminal state: a failed run re-driven.
REDRIVE_EVENTS = frozenset({"redrive", "redrive_wait"})

EVENTS = frozenset(event for _, event in TRANSITIONS)

assert TERMINAL.isdisjoint(state for state, event in TRANSITIONS
                          if event not in REDRIVE_EVENTS)
assert {state for state, event in TRANSITIONS if event in REDRIVE_EVENTS} == {FAILED}
assert set(TRANSITIONS.values()) | CREATED_STATES == set(STATES)


def next_state(run_id: str, state: str, event: str) -> str:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(run_id, state, event) from None


def allows(state: str, event: str) -> bool:
    return (state, event) in TRANSITIONS


def diagram() -> str:
    """A Mermaid state diagram of the table (docs/lifecycle.md)."""
    lines = ["stateDiagram-v2"]
    for state in sorted(CREATED_STATES, key=STATES.index):
        lines.append(f"    [*] --> {state}")
    for (state, event), target in TRANSITIONS.items():
        lines.append(f"    {state} --> {target}: {event}")
    for state in sorted(TERMINAL, key=STATES.index):
        lines.append(f"    {state} --> [*]")
    return "\n".join(lines) + "\n"
