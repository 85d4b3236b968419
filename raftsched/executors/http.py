"""The HTTP target executor (aiohttp client).

Every call carries `Idempotency-Key: <execution_id>` and the X-Raftsched-*
headers, so a target can achieve effectively-once by deduplicating on the key.
2xx is success; anything else, a connection error or the timeout, is failure.
A 4xx other than 408 and 429 is not retryable (the request itself is wrong),
nor is a URL aiohttp cannot call. Redirects are not followed: a 3xx is a
failure, not retried either (it would redirect again). An address the node's
policy refuses (executors/netguard.py) fails the attempt, not retryably, and
is never connected to. The head of the response body is kept as the
attempt's output.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Awaitable, Callable, NamedTuple

import aiohttp

from raftsched import limits
from raftsched.core.retry import http_status_retryable
from raftsched.core.timeutil import format_ms
from raftsched.executors.base import Attempt, Outcome, short_error, since_ms, wall_ms
from raftsched.executors.netguard import (AddressPolicy, AddressRefused, GuardedResolver,
                                          guarded_socket_factory, refusal_in)

log = logging.getLogger("raftsched.http")


class Reply(NamedTuple):
    status: int
    head: bytes             # at most http_response_head_bytes_max of the body
    location: str | None    # the Location header (of a redirect, not followed)


# The transport seam: tests may replace the network with one function.
Send = Callable[[str, str, dict, bytes | None, float], Awaitable[Reply]]
# What a call may raise that is the target's failure, not a bug.
CALL_ERRORS = (asyncio.TimeoutError, aiohttp.ClientError, AddressRefused)


@functools.lru_cache(maxsize=limits.scheduled_for_remembered_max)
def _scheduled_for(scheduled_ms: int) -> str:
    """The header's time: a burst's runs share a few seconds."""
    return format_ms(scheduled_ms) or ""


def request_headers(attempt: Attempt, target: dict) -> dict[str, str]:
    headers = dict(target.get("headers") or {})
    headers.update({
        "Idempotency-Key": attempt.execution_id,
        "X-Raftsched-Execution-Id": attempt.execution_id,
        "X-Raftsched-Job-Id": attempt.job_id,
        "X-Raftsched-Scheduled-For": _scheduled_for(attempt.scheduled_ms),
        "X-Raftsched-Attempt": str(attempt.attempt),
        "X-Raftsched-Fencing-Token": str(attempt.fencing_token),
    })
    return headers


def request_body(target: dict, headers: dict[str, str]) -> bytes | None:
    body = target.get("body")
    if body is None:
        return None
    if isinstance(body, str):
        return body.encode()
    if not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = "application/json"
    return json.dumps(body, separators=(",", ":")).encode()


class HttpExecutor:
    """`policy`: where calls may go (default: public addresses only)."""

    def __init__(self, policy: AddressPolicy | None = None, send: Send | None = None, *,
                 now_ms: Callable[[], int] = wall_ms) -> None:
        self._policy = policy if policy is not None else AddressPolicy()
        # Deadlines are instants on this clock: its node's (the cluster's time).
        self._now_ms = now_ms
        self._session: aiohttp.ClientSession | None = None
        self.send = send or self._send_aiohttp

    async def start(self) -> None:
        allowed = ", ".join(str(net) for net in self._policy.allowed) or "none"
        log.info("HTTP targets and alert webhooks may call public addresses; ranges allowed "
                 "besides (--allow-target-cidr): %s", allowed)
        connector = aiohttp.TCPConnector(limit=limits.runs_inflight_max,
                                         limit_per_host=limits.http_connections_per_host_max,
                                         ttl_dns_cache=60,
                                         resolver=GuardedResolver(self._policy),
                                         socket_factory=guarded_socket_factory(self._policy))
        # One session calls every tenant's targets and alert webhooks: it keeps
        # no cookie a target sets (a default jar would send it with the next
        # call to that host, whichever job or tenant made it).
        self._session = aiohttp.ClientSession(connector=connector, raise_for_status=False,
                                              auto_decompress=True, trust_env=False,
                                              cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def run(self, attempt: Attempt, target: dict, deadline_ms: int) -> Outcome:
        started = time.monotonic()
        timeout_s = max(0.001, min(target["timeout_s"], (deadline_ms - self._now_ms()) / 1000))
        headers = request_headers(attempt, target)
        body = request_body(target, headers)
        try:
            reply = await self.send(target["method"], target["url"], headers, body, timeout_s)
        except CALL_ERRORS as exc:
            error, retryable = describe_failure(exc, timeout_s)
            return Outcome(ok=False, retryable=retryable, error=error,
                           duration_ms=since_ms(started))
        text = reply.head.decode("utf-8", "replace")
        # An empty body leaves nothing to keep: no output record, no write.
        output = {"http_body": text} if text else None
        if output and len(reply.head) >= limits.http_response_head_bytes_max:
            output["http_body"] += (f"\n[raftsched: response body cut at "
                                    f"http_response_head_bytes_max={len(reply.head)} bytes]")
        if 200 <= reply.status < 300:
            return Outcome(ok=True, http_status=reply.status, duration_ms=since_ms(started),
                           output=output)
        snippet = text.strip()   # the error keeps the head without the cut notice
        return Outcome(ok=False, http_status=reply.status, duration_ms=since_ms(started),
                       output=output, retryable=status_retryable(reply.status),
                       error=short_error(status_error(reply) + (f": {snippet}" if snippet else "")))

    async def _send_aiohttp(self, method: str, url: str, headers: dict, body: bytes | None,
                            timeout_s: float) -> Reply:
        """One call, redirects not followed, only to addresses the policy allows."""
        assert self._session is not None, "start() the executor first"
        self._policy.check_url(url)
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.request(method, url, headers=headers, data=body,
                                         timeout=timeout, allow_redirects=False) as response:
            head = await response.content.read(limits.http_response_head_bytes_max)
            return Reply(response.status, head, response.headers.get("Location"))


def status_retryable(status: int) -> bool:
    """A redirect would redirect again; otherwise as core.retry says."""
    return not 300 <= status < 400 and http_status_retryable(status)


def status_error(reply: Reply) -> str:
    if 300 <= reply.status < 400:
        return (f"HTTP {reply.status}, a redirect (not followed) to "
                f"{reply.location or 'no Location'}")
    return f"HTTP {reply.status}"


def describe_failure(exc: BaseException, timeout_s: float) -> tuple[str, bool]:
    """(error, retryable) of a call that raised one of CALL_ERRORS."""
    refused = refusal_in(exc)
    if refused is not None:
        return short_error(str(refused)), False
    if isinstance(exc, asyncio.TimeoutError):
        return f"timed out after {timeout_s:g} s", True
    if isinstance(exc, aiohttp.InvalidURL):
        return short_error(f"invalid URL: {exc}"), False
    return short_error(f"{type(exc).__name__}: {exc}"), True
