"""The executor contract.

    await executor.run(attempt, target, deadline_ms) -> Outcome

Preconditions: `target` is a validated target spec (raftsched.core.jobspec);
`deadline_ms` is the instant after which the call is abandoned, on the executor's
clock (`now_ms`: its node's, the cluster's time; the wall clock by default).
Postconditions: returns an Outcome for every job failure (a 500, a refused
connection, a timeout): a failed job is data, not an exception. Raises only for
bugs. Never retries by itself: retries are durable and belong to the scheduler.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

from raftsched import limits


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt:
    run_id: str
    job_id: str
    execution_id: str   # same across retries and failover: what targets dedupe on
    scheduled_ms: int
    attempt: int
    fencing_token: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    ok: bool
    http_status: int | None = None
    exit_code: int | None = None
    error: str | None = None      # short, human: kept in the replicated run record
    duration_ms: int = 0
    # False for a failure another attempt cannot fix (HTTP 4xx other than 408
    # and 429, an invalid target, a listed exit code): the run fails at once.
    retryable: bool = True
    # Kept off the Raft log, on the node that received it (storage/output_store.py):
    # {"stdout": str, "stderr": str, "http_body": str, "truncated": {stream: bytes dropped}}
    output: dict | None = None


class Executor(Protocol):
    async def run(self, attempt: Attempt, target: dict, deadline_ms: int) -> Outcome: ...


def wall_ms() -> int:
    """The wall clock in milliseconds: an executor's clock unless its node gives its own."""
    return time.time_ns() // 1_000_000


def since_ms(started: float) -> int:
    """Milliseconds since a time.monotonic() reading."""
    return int((time.monotonic() - started) * 1000)


def short_error(text: str) -> str:
    """An error summary short enough for the replicated run record."""
    limit = limits.run_error_chars_max
    return text if len(text) <= limit else text[: limit - 1] + "…"
