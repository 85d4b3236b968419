"""Exceptions of raftsched.

    RaftschedError
     +-- InvalidInput            the caller's fault (400/404/409/413); carries field and status
     +-- Unavailable             no leader, no quorum, commit timeout (503); retryable
     +-- InvariantBroken         a bug: the process must stop rather than diverge
          +-- InvalidTransition  a run moved along an edge the lifecycle table has not
          +-- UnknownCommand     a log entry of a version or tag this build does not know

Operating errors (a target answering 500, a stale fire) are data, not exceptions.
"""

from __future__ import annotations


class RaftschedError(Exception):
    pass


class InvalidInput(RaftschedError):
    """Bad input from a caller. `field` names the offending member (dotted path)."""

    def __init__(self, detail: str, *, field: str | None = None, status: int = 400,
                 type_: str = "invalid-field", limit: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.status = status
        self.type = type_
        self.limit = limit


class NotFound(InvalidInput):
    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail, field=field, status=404, type_="not-found")


class Conflict(InvalidInput):
    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail, field=field, status=409, type_="conflict")


class Unavailable(RaftschedError):
    """The cluster cannot commit right now (no leader, no quorum, timeout)."""

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


class InvariantBroken(RaftschedError):
    pass


class InvalidTransition(InvariantBroken):
    def __init__(self, run_id: str, state: str, event: str) -> None:
        super().__init__(f"run {run_id}: no transition from {state!r} on {event!r}")
        self.run_id = run_id
        self.state = state
        self.event = event


class UnknownCommand(InvariantBroken):
    pass
