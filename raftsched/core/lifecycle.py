"""The run lifecycle: one table, every legal edge.

    queued --start--> running
    queued --succeed--> succeeded        (a fast target finished before its
    queued --fail--> failed               start was replicated: one batch)
    running --succeed--> succeeded
    running --fail--> failed

A run may also be created directly in a terminal state that records an
occurrence which was not run, with its reason: `missed` (the misfire policy ran
a later occurrence instead) or `skipped` (later than `misfire_tolerance_s`).

`next_state` raises InvalidTransition for any other pair. apply treats a
transition from a terminal state as a stale duplicate (it is counted, not
applied), and anything else as the caller's bug.
"""

from __future__ import annotations

from raftsched.errors import InvalidTransition

QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
MISSED = "missed"
SKIPPED = "skipped"

TERMINAL = frozenset({SUCCEEDED, FAILED, MISSED, SKIPPED})
OPEN = frozenset({QUEUED, RUNNING})

TRANSITIONS: dict[tuple[str, str], str] = {
    (QUEUED, "start"): RUNNING,
    (QUEUED, "succeed"): SUCCEEDED,
    (QUEUED, "fail"): FAILED,
    (RUNNING, "succeed"): SUCCEEDED,
    (RUNNING, "fail"): FAILED,
}

EVENTS = frozenset(event for _, event in TRANSITIONS)


def next_state(run_id: str, state: str, event: str) -> str:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(run_id, state, event) from None
