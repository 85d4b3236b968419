"""A small synchronous JSON client (stdlib only), usable from any thread."""

from __future__ import annotations

import json
import secrets
import ssl
import time
import urllib.error
import urllib.request
from typing import Any, Callable


# The bootstrap admin token LocalCluster gives its nodes (RAFTSCHED_ADMIN_TOKEN);
# call() sends it unless told otherwise, so a test reads as an admin of the
# `default` tenant unless it asks for another token (or none: token=None).
ADMIN_TOKEN = "rsadmin_" + secrets.token_hex(16)
_ADMIN = object()


def auth_headers(token: str | None = ADMIN_TOKEN) -> dict[str, str]:
    """Headers for a client other than call() (aiohttp, schemathesis)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


class Response:
    def __init__(self, status: int, body: Any, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.body!r})"

    @property
    def busy(self) -> bool:
        """Refused 503 `busy` before proposal: nothing of it was done."""
        return is_busy(self.status, self.body)

    @property
    def retry_after_s(self) -> float:
        return float(self.headers.get("Retry-After", "1"))


def is_busy(status: int, body: Any) -> bool:
    """A node's 503 `busy` (admission: refused before proposal)."""
    return status == 503 and isinstance(body, dict) and body.get("reason") == "busy"


def unless_busy(send: Callable[[], Response], attempts: int = 10) -> Response:
    """The answer to `send()`, sent again after Retry-After while it is 503
    busy (refused before proposal: nothing of it was done), as a client
    honouring Retry-After does; the last answer, busy or not, after `attempts`."""
    for _ in range(attempts - 1):
        answer = send()
        if not answer.busy:
            return answer
        time.sleep(answer.retry_after_s)
    return send()


def call(method: str, url: str, body: Any = None, *, timeout_s: float = 10.0,
         raw: bytes | None = None, token: Any = _ADMIN,
         headers: dict[str, str] | None = None,
         context: ssl.SSLContext | None = None) -> Response:
    """`token`: the bearer token to send (default ADMIN_TOKEN; None sends none).
    `context`: what verifies an https node (None: the system's CAs)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = {"Content-Type": "application/json",
            **auth_headers(ADMIN_TOKEN if token is _ADMIN else token), **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            payload = resp.read()
            return Response(resp.status, decode_body(payload), dict(resp.headers))
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        return Response(exc.code, decode_body(payload), dict(exc.headers))


class ServiceUnavailable(Exception):
    """A 503 answer: the node could not serve the request now (no leader during
    an election, no quorum). wait_until counts it as "not yet": during a
    failover a read or a write may be refused, and the caller's deadline, not
    the first refusal, decides."""

    def __init__(self, response: Response) -> None:
        super().__init__(repr(response))
        self.response = response


def expect(response: Response, status: int) -> Response:
    """`response` if it has `status`; ServiceUnavailable if it is a 503 (to
    be asked again within a deadline); AssertionError otherwise."""
    if response.status == 503 and status != 503:
        raise ServiceUnavailable(response)
    assert response.status == status, response
    return response


def decode_body(payload: bytes) -> Any:
    if not payload:
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode("utf-8", "replace")


def wait_until(check: Callable[[], Any], timeout_s: float, what: str,
               interval_s: float = 0.05) -> Any:
    """Poll `check` until it returns a truthy value; fail with `what` at the deadline.
    Exceptions from `check` count as "not yet" (a node may be restarting), and
    so does a 503 raised by expect() (a failover is under way)."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError, KeyError,
                ServiceUnavailable) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}{detail}")
        time.sleep(interval_s)
