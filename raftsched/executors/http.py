"""The HTTP target executor (aiohttp client).

Every call carries `Idempotency-Key: <execution_id>` and the X-Raftsched-*
headers, so a target can achieve effectively-once by deduplicating on the key.
2xx is success; anything else, a connection error or the timeout, is failure.
A 4xx other than 408 and 429 is not retryable (the request itself is wrong),
nor is a URL aiohttp cannot call. The head of the response body is kept as
the attempt's output.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Awaitable, Callable

import aiohttp

from raftsched import limits
from raftsched.core.retry import http_status_retryable
from raftsched.core.timeutil import format_ms
from raftsched.executors.base import Attempt, Outcome, short_error, since_ms

# The transport seam: tests may replace the network with one function.
Send = Callable[[str, str, dict, bytes | None, float], Awaitable[tuple[int, bytes]]]


def request_headers(attempt: Attempt, target: dict) -> dict[str, str]:
    headers = dict(target.get("headers") or {})
    headers.update({
        "Idempotency-Key": attempt.execution_id,
        "X-Raftsched-Execution-Id": attempt.execution_id,
        "X-Raftsched-Job-Id": attempt.job_id,
        "X-Raftsched-Scheduled-For": format_ms(attempt.scheduled_ms) or "",
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
    def __init__(self, send: Send | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._send = send or self._send_aiohttp

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=limits.runs_inflight_max, limit_per_host=0,
                                         ttl_dns_cache=60)
        self._session = aiohttp.ClientSession(connector=connector, raise_for_status=False,
                                              auto_decompress=True, trust_env=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def run(self, attempt: Attempt, target: dict, deadline_ms: int) -> Outcome:
        started = time.monotonic()
        timeout_s = max(0.001, min(target["timeout_s"], deadline_ms / 1000 - time.time()))
        headers = request_headers(attempt, target)
        body = request_body(target, headers)
        try:
            status, head = await self._send(target["method"], target["url"], headers, body,
                                            timeout_s)
        except asyncio.TimeoutError:
            return Outcome(ok=False, error=f"timed out after {timeout_s:g} s",
                           duration_ms=since_ms(started))
        except aiohttp.InvalidURL as exc:
            return Outcome(ok=False, retryable=False, error=short_error(f"invalid URL: {exc}"),
                           duration_ms=since_ms(started))
        except aiohttp.ClientError as exc:
            return Outcome(ok=False, error=short_error(f"{type(exc).__name__}: {exc}"),
                           duration_ms=since_ms(started))
        text = head.decode("utf-8", "replace")
        output = {"http_body": text}
        if len(head) >= limits.http_response_head_bytes_max:
            output["http_body"] += (f"\n[raftsched: response body cut at "
                                    f"http_response_head_bytes_max={len(head)} bytes]")
        if 200 <= status < 300:
            return Outcome(ok=True, http_status=status, duration_ms=since_ms(started),
                           output=output)
        snippet = text.strip()   # the error keeps the head without the cut notice
        return Outcome(ok=False, http_status=status, duration_ms=since_ms(started), output=output,
                       retryable=http_status_retryable(status),
                       error=short_error(f"HTTP {status}" + (f": {snippet}" if snippet else "")))

    async def _send_aiohttp(self, method: str, url: str, headers: dict, body: bytes | None,
                            timeout_s: float) -> tuple[int, bytes]:
        assert self._session is not None, "start() the executor first"
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.request(method, url, headers=headers, data=body,
                                         timeout=timeout, allow_redirects=False) as response:
            head = await response.content.read(limits.http_response_head_bytes_max)
            return response.status, head
