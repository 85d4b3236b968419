"""What the client raises, and whose fault each error is.

    RaftschedError
     +-- UserError            the request was wrong: 4xx (exit code 1 in the CLI)
     |    +-- BadRequest      400: `field` names the member, `limit` the bound
     |    +-- Unauthorized    401, Forbidden 403
     |    +-- NotFound        404
     |    +-- Conflict        409
     |    +-- QuotaExceeded   429: `retry_after_s` says when to try again
     +-- ClusterError         the cluster could not answer: 5xx, no answer (exit code 2)
          +-- ServerError     500 and 507 (`limit` names the storage mark)
          |    +-- Unavailable 503: no leader, no quorum or not committed in time
          +-- CannotConnect   nothing answered at the URL, or the connection broke
          +-- Timeout         no answer within the client's timeout

An error with an HTTP answer (ApiError) carries the problem+json document
(RFC 9457) as `problem`, and its members as attributes. The outcome of a write
that raised ClusterError is unknown: retry it with the same idempotency_key.
"""

from __future__ import annotations

from typing import Any


class RaftschedError(Exception):
    """Every error the client raises."""


class UserError(RaftschedError):
    """The request was refused as it was: sending it again will not help."""


class ClusterError(RaftschedError):
    """The cluster could not answer; the same request may succeed later."""


class ApiError(RaftschedError):
    """An answer with an error status, and its problem+json document."""

    def __init__(self, status: int, problem: dict[str, Any],
                 retry_after_s: float | None = None) -> None:
        self.status = status
        self.problem = problem
        self.type: str = str(problem.get("type", "about:blank"))
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        self.field: str | None = problem.get("field")
        self.limit: str | None = problem.get("limit")
        self.reason: str | None = problem.get("reason")
        self.retry_after_s = retry_after_s if retry_after_s is not None else \
            problem.get("retry_after_s")
        super().__init__(self.describe())

    def describe(self) -> str:
        """One line: status, title, detail, and the field and limit when named."""
        text = f"{self.status} {self.title}: {self.detail}".rstrip(": ")
        named = [f"{key} {value}" for key, value in (("field", self.field),
                                                      ("limit", self.limit),
                                                      ("reason", self.reason)) if value]
        return f"{text} ({', '.join(named)})" if named else text


class BadRequest(ApiError, UserError):
    pass


class Unauthorized(ApiError, UserError):
    pass


class Forbidden(ApiError, UserError):
    pass


class NotFound(ApiError, UserError):
    pass


class Conflict(ApiError, UserError):
    pass


class QuotaExceeded(ApiError, UserError):
    pass


class OtherUserError(ApiError, UserError):
    """A 4xx without a class of its own (413, 415, 405...)."""


class ServerError(ApiError, ClusterError):
    pass


class Unavailable(ServerError):
    pass


class CannotConnect(ClusterError):
    """No HTTP answer: refused, reset, or the name did not resolve. `sent`:
    whether the request may have reached the node (False: no connection was
    made, so nothing was sent)."""

    def __init__(self, url: str, reason: str, *, sent: bool = True) -> None:
        self.url = url
        self.reason = reason
        self.sent = sent
        super().__init__(f"cannot reach {url}: {reason}")


class Timeout(ClusterError):
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        super().__init__(f"no answer from {url} within {timeout_s:g} s")


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    429: QuotaExceeded, 503: Unavailable}


def api_error(status: int, problem: dict[str, Any],
              retry_after_s: float | None = None) -> ApiError:
    """The error class for an answer's status: 4xx is the caller's, 5xx the cluster's."""
    cls = _BY_STATUS.get(status) or (OtherUserError if status < 500 else ServerError)
    return cls(status, problem, retry_after_s)
