"""What both transports share: the client's settings, a Call turned into bytes
on the wire, and an answer turned into a result or an error. The transports
(sync.py, aio.py) only move bytes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

from raftsched import limits
from raftsched.client import errors
from raftsched.client.operations import Call, rfc3339

DEFAULT_URL = "http://127.0.0.1:8701"


@dataclasses.dataclass(frozen=True)
class Settings:
    """`url`: a node's API (any node: each forwards writes to the leader itself).
    `tenant`: with an admin token, act for this tenant. `ca_file`: the CA
    certificates (PEM) an https node is verified by (None: the system's)."""
    url: str
    token: str | None
    tenant: str | None
    timeout_s: float
    ca_file: str | None = None

    @classmethod
    def resolve(cls, url: str | None, token: str | None, tenant: str | None,
                timeout_s: float | None, environ: Mapping[str, str] | None = None, *,
                ca_file: str | None = None) -> "Settings":
        """Arguments first, then RAFTSCHED_URL, RAFTSCHED_TOKEN and
        RAFTSCHED_TLS_CA, then the defaults."""
        env = os.environ if environ is None else environ
        resolved_url = url or env.get("RAFTSCHED_URL") or DEFAULT_URL
        timeout = limits.client_timeout_s_default if timeout_s is None else timeout_s
        if not timeout > 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        return cls(url=resolved_url.rstrip("/"), token=token or env.get("RAFTSCHED_TOKEN") or None,
                   tenant=tenant, timeout_s=timeout,
                   ca_file=ca_file or env.get("RAFTSCHED_TLS_CA") or None)

    def ssl_context(self) -> ssl.SSLContext | None:
        """What verifies an https node: ca_file's CAs, or None for the system's.
        Raises OSError / ssl.SSLError for a file that cannot be read as PEM."""
        if self.ca_file is None:
            return None
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    timeout_s: float


def _json_default(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return rfc3339(value)
    raise TypeError(f"{type(value).__name__} is not JSON: {value!r}")


def encode(call: Call[Any], settings: Settings) -> Request:
    op = call.op
    assert op is not None, "a Call is made by an operation's builder"
    query = list(call.query)
    if op.tenant and settings.tenant:
        query.append(("tenant", settings.tenant))
    url = settings.url + call.path + ("?" + urllib.parse.urlencode(query) if query else "")
    headers = {"Accept": "application/json", "User-Agent": "raftsched-client"}
    if settings.token:
        headers["Authorization"] = f"Bearer {settings.token}"
    body = None
    if call.has_body:
        body = json.dumps(call.body, default=_json_default, allow_nan=False).encode()
        headers["Content-Type"] = "application/json"
    return Request(op.method, url, headers, body, settings.timeout_s + call.wait_s)


def decode(call: Call[Any], status: int, headers: Mapping[str, str], data: bytes) -> Any:
    """The result of a 2xx/3xx answer, or the ApiError of an error status."""
    assert call.op is not None
    if status >= 400:
        raise _error(status, headers, data)
    if call.op.result == "none" or not data:
        return None
    if call.op.result == "text":
        return data.decode("utf-8", "replace")
    return json.loads(data)


def _error(status: int, headers: Mapping[str, str], data: bytes) -> errors.ApiError:
    problem: dict[str, Any] = {}
    try:
        parsed = json.loads(data) if data else None
        if isinstance(parsed, dict):
            problem = parsed
    except ValueError:
        pass
    if not problem:
        # Not problem+json (a proxy's page, say): keep its text as the detail.
        problem = {"status": status, "title": f"HTTP {status}",
                   "detail": data.decode("utf-8", "replace")[:500]}
    return errors.api_error(status, problem, _retry_after_s(headers))


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return float(value)
            except ValueError:
                return None
    return None
