"""What both transports share: the client's settings, a Call turned into bytes
on the wire, an answer turned into a result or an error, and which node to
send to. The transports (sync.py, aio.py) only move bytes.

A client may be given several node URLs (comma-separated). It sends each call
to the node that answered last, and when that node gives no answer (refused,
reset, unresolved, timed out) to the next, under one rule: a call goes to
another node only if sending it twice cannot do it twice. That holds when no
connection was made (nothing was sent), for reads (GET) and for PUT (it sets
what it names), and for creates, which carry idempotency keys: a create given
without one gets one here (`keyed`), so the node that takes it again answers
the job the first one may have made. Any other write that got no answer
raises, as with one URL: its outcome is unknown. An answer, even 503, is
returned as it is: every node would say the same of the cluster.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import ssl
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from raftsched import limits
from raftsched.client import errors
from raftsched.client.operations import Call, rfc3339

DEFAULT_URL = "http://127.0.0.1:8701"


@dataclasses.dataclass(frozen=True)
class Settings:
    """`url`: a node's API (any node: each forwards writes to the leader itself).
    `urls`: every node URL the client may send to, `url` first (default: `url`
    alone). `tenant`: with an admin token, act for this tenant. `ca_file`: the
    CA certificates (PEM) an https node is verified by (None: the system's)."""
    url: str
    token: str | None
    tenant: str | None
    timeout_s: float
    ca_file: str | None = None
    urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.urls:
            object.__setattr__(self, "urls", (self.url,))

    @classmethod
    def resolve(cls, url: str | None, token: str | None, tenant: str | None,
                timeout_s: float | None, environ: Mapping[str, str] | None = None, *,
                ca_file: str | None = None) -> "Settings":
        """Arguments first, then RAFTSCHED_URL, RAFTSCHED_TOKEN and
        RAFTSCHED_TLS_CA, then the defaults. A URL may list several nodes,
        separated by commas."""
        env = os.environ if environ is None else environ
        urls = parse_urls(url or env.get("RAFTSCHED_URL") or DEFAULT_URL)
        timeout = limits.client_timeout_s_default if timeout_s is None else timeout_s
        if not timeout > 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        return cls(url=urls[0], urls=urls, token=token or env.get("RAFTSCHED_TOKEN") or None,
                   tenant=tenant, timeout_s=timeout,
                   ca_file=ca_file or env.get("RAFTSCHED_TLS_CA") or None)

    def ssl_context(self) -> ssl.SSLContext | None:
        """What verifies an https node: ca_file's CAs, or None for the system's.
        Raises OSError / ssl.SSLError for a file that cannot be read as PEM."""
        if self.ca_file is None:
            return None
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)


def parse_urls(text: str) -> tuple[str, ...]:
    """Node URLs separated by commas, in order, each once, without a final "/".
    Raises ValueError for an empty one or more than client_urls_max."""
    urls = [part.strip().rstrip("/") for part in text.split(",")]
    if not all(urls):
        raise ValueError(f"the node URLs {text!r} hold an empty one: give URLs separated "
                         f"by commas")
    unique = tuple(dict.fromkeys(urls))
    if len(unique) > limits.client_urls_max:
        raise ValueError(f"{len(unique)} node URLs given; a client takes at most "
                         f"{limits.client_urls_max} (client_urls_max)")
    return unique


class Nodes:
    """The order a client tries its node URLs in: the one that answered
    last first, then the others in the order given."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = tuple(urls)
        self._first = 0

    def attempts(self, call: Call[Any], settings: Settings) -> "Attempts":
        return Attempts(self, keyed(call, settings), settings)

    def order(self) -> list[str]:
        return [*self.urls[self._first:], *self.urls[:self._first]]

    def answered(self, url: str) -> None:
        """`url` answered: it is tried first from now on."""
        self._first = self.urls.index(url)


class Attempts:
    """One call's requests, node by node, for a transport to send in turn:

        attempts = nodes.attempts(call, settings)
        for request in attempts:
            try:
                answer = send(request)
            except (errors.CannotConnect, errors.Timeout) as exc:
                attempts.failed(exc)   # raises unless the next node may have it
                continue
            return attempts.answered(request, *answer)
        raise attempts.no_answer()
    """

    def __init__(self, nodes: Nodes, call: Call[Any], settings: Settings) -> None:
        self._nodes, self.call, self._settings = nodes, call, settings
        self._failures: list[errors.ClusterError] = []

    def __iter__(self) -> Iterator[Request]:
        for node in self._nodes.order():
            yield encode(self.call, self._settings, node)

    def failed(self, failure: errors.ClusterError) -> None:
        self._failures.append(failure)
        if not may_resend(self.call, failure):
            raise failure

    def answered(self, request: Request, status: int, headers: Mapping[str, str],
                 data: bytes) -> Any:
        self._nodes.answered(request.node)
        return decode(self.call, status, headers, data)

    def no_answer(self) -> errors.ClusterError:
        """The error of a call no node answered: the one failure of a single
        URL; else one CannotConnect naming each node's, or the last timeout."""
        failures = self._failures
        if len(failures) == 1 or not all(isinstance(f, errors.CannotConnect)
                                         for f in failures):
            return failures[-1]
        unreached = [f for f in failures if isinstance(f, errors.CannotConnect)]
        return errors.CannotConnect(", ".join(f.url for f in unreached),
                                    "; ".join(f"{f.url}: {f.reason}" for f in unreached),
                                    sent=any(f.sent for f in unreached))


def keyed(call: Call[Any], settings: Settings) -> Call[Any]:
    """The call as sent: a create to a client of several nodes carries an
    idempotency key on every job (a new one where the caller gave none), so
    that sending it again to another node cannot create a job twice."""
    op = call.op
    assert op is not None
    if op.keyed is None or len(settings.urls) < 2:
        return call
    if op.keyed == "body":
        return dataclasses.replace(call, body=with_key(call.body))
    body = call.body
    if isinstance(body, Mapping) and isinstance(body.get("jobs"), list):
        return dataclasses.replace(call, body={**body, "jobs": [with_key(job)
                                                                for job in body["jobs"]]})
    return call


def with_key(job: Any) -> Any:
    """The job body with an idempotency key: its own, else a new `client-` one."""
    if isinstance(job, Mapping) and job.get("idempotency_key") is None:
        return {**job, "idempotency_key": f"client-{uuid.uuid4().hex}"}
    return job


def _has_keys(call: Call[Any]) -> bool:
    op, body = call.op, call.body
    assert op is not None
    if op.keyed == "body":
        return isinstance(body, Mapping) and body.get("idempotency_key") is not None
    if op.keyed == "jobs":
        jobs = body.get("jobs") if isinstance(body, Mapping) else None
        return isinstance(jobs, list) and all(
            isinstance(job, Mapping) and job.get("idempotency_key") is not None
            for job in jobs)
    return False


def may_resend(call: Call[Any], failure: errors.ClusterError) -> bool:
    """Whether `call`, which got no answer (`failure`), may go to another node:
    nothing was sent, or sending it twice cannot do it twice (see above)."""
    assert call.op is not None
    if isinstance(failure, errors.CannotConnect) and not failure.sent:
        return True
    return call.op.method in ("GET", "PUT") or _has_keys(call)


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    timeout_s: float
    node: str = ""   # the node URL it goes to (one of Settings.urls)


def _json_default(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return rfc3339(value)
    raise TypeError(f"{type(value).__name__} is not JSON: {value!r}")


def json_bytes(value: Any) -> bytes:
    """A request body as the client sends it: JSON, datetimes as RFC 3339."""
    return json.dumps(value, default=_json_default, allow_nan=False).encode()


def encode(call: Call[Any], settings: Settings, node: str | None = None) -> Request:
    """The request of `call` to `node` (one of settings.urls; default: the first)."""
    op = call.op
    assert op is not None, "a Call is made by an operation's builder"
    query = list(call.query)
    if op.tenant and settings.tenant:
        query.append(("tenant", settings.tenant))
    url = (node or settings.url) + call.path + ("?" + urllib.parse.urlencode(query) if query else "")
    headers = {"Accept": "application/json", "User-Agent": "raftsched-client"}
    if settings.token:
        headers["Authorization"] = f"Bearer {settings.token}"
    body = None
    if call.has_body:
        body = json_bytes(call.body)
        headers["Content-Type"] = "application/json"
    return Request(op.method, url, headers, body, settings.timeout_s + call.wait_s,
                   node or settings.url)


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
