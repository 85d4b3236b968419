"""Exceptions of raftsched.

    RaftschedError
     +-- InvalidInput            the caller's fault (400/404/409/413); carries field and status
     |    +-- InsufficientStorage  a write that adds state while storage is past its mark (507)
     |    +-- Unauthorized         no bearer token, or one this cluster does not know (401)
     |    +-- Forbidden            a token whose role or tenant may not do this (403)
     |    +-- QuotaExceeded        over a tenant's quota (429, with Retry-After)
     +-- Unavailable             no leader, no quorum, commit timeout (503); retryable
     |    +-- Busy                 refused before proposal: the node has all it may take (503)
     +-- CommandRefused          a log entry of a known version and tag whose shape is wrong,
     |                           or bytes that are not a command: refused alike everywhere
     +-- InvariantBroken         a bug: the process must stop rather than diverge
          +-- StorageFull        the LMDB map cannot hold a committed entry's writes
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


class InsufficientStorage(InvalidInput):
    """A write that would add state while this node or a peer is past its
    storage mark (507). `limit` is max_data_bytes or min_free_disk_bytes. It is
    not the caller's fault, but it is an answer, not an outage: retry later."""

    def __init__(self, detail: str, *, limit: str) -> None:
        super().__init__(detail, status=507, type_="insufficient-storage", limit=limit)


class Unauthorized(InvalidInput):
    def __init__(self, detail: str) -> None:
        super().__init__(detail, field="Authorization", status=401, type_="unauthorized")


class Forbidden(InvalidInput):
    def __init__(self, detail: str, *, field: str | None = "Authorization") -> None:
        super().__init__(detail, field=field, status=403, type_="forbidden")


class QuotaExceeded(InvalidInput):
    """Over a tenant's quota; `limit` names it (jobs_max, creates_per_s, ...)."""

    def __init__(self, detail: str, *, limit: str, retry_after_s: int) -> None:
        super().__init__(detail, status=429, type_="quota-exceeded", limit=limit)
        self.retry_after_s = retry_after_s


class Unavailable(RaftschedError):
    """The cluster cannot commit right now (no leader, no quorum, timeout)."""

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


class Busy(Unavailable):
    """This node already has as much awaiting commit as it takes (`limit` names
    the bound): the command was not proposed. Retry after retry_after_s."""

    def __init__(self, detail: str, *, limit: str, retry_after_s: int) -> None:
        super().__init__(detail, reason="busy")
        self.limit = limit
        self.retry_after_s = retry_after_s


class CommandRefused(RaftschedError):
    """A log entry this build understands but will not apply: not msgpack, not
    a map, or a command whose members have the wrong shape (`field` names the
    dotted path). Every replica refuses it the same way and writes nothing but
    its applied index; nothing need stop."""

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class InvariantBroken(RaftschedError):
    pass


class StorageFull(InvariantBroken):
    """The LMDB map has no room for a committed entry's writes. Every later
    entry would need room too, so the node stops; raise --max-data-bytes."""


class InvalidTransition(InvariantBroken):
    def __init__(self, run_id: str, state: str, event: str) -> None:
        super().__init__(f"run {run_id}: no transition from {state!r} on {event!r}")
        self.run_id = run_id
        self.state = state
        self.event = event


class UnknownCommand(InvariantBroken):
    pass
