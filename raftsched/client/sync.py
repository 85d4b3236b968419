"""The blocking client: urllib from the standard library, one request at a time.

    from raftsched.client import Client
    with Client() as api:                       # RAFTSCHED_URL, RAFTSCHED_TOKEN
        job = api.create_job({"run_at": "...", "target": {...}})

Every method sends one request (operations.py has them all) and returns the
decoded JSON, or raises a RaftschedError (errors.py). Any node forwards writes
to the Raft leader itself. Given several node URLs, a call no node answers goes
to the next where wire.py's rule allows it; nothing else is retried: whether a
write that failed with a ClusterError was applied is unknown (retry it with its
idempotency_key).
"""

from __future__ import annotations

import errno
import functools
import http.client
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from raftsched.client import errors, operations as ops, wire
from raftsched.client.operations import Call

P = ParamSpec("P")
T = TypeVar("T")


def _method(build: Callable[P, Call[T]]) -> Callable[Concatenate["Client", P], T]:
    @functools.wraps(build)
    def method(self: "Client", /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(build(*args, **kwargs))
    return method


def _open(request: wire.Request,
          context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    sent = urllib.request.Request(request.url, data=request.body, method=request.method,
                                  headers=request.headers)
    try:
        with urllib.request.urlopen(sent, timeout=request.timeout_s, context=context) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (socket.timeout, TimeoutError)):
            raise errors.Timeout(request.url, request.timeout_s) from exc
        raise errors.CannotConnect(request.url, str(exc.reason),
                                   sent=not _never_connected(exc.reason)) from exc
    except (socket.timeout, TimeoutError) as exc:
        raise errors.Timeout(request.url, request.timeout_s) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise errors.CannotConnect(request.url, str(exc) or type(exc).__name__) from exc


# Errors of a connect that never reached the node.
_UNREACHABLE = (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)


def _never_connected(reason: object) -> bool:
    """Whether urllib's failure was in making the connection (so nothing was
    sent): refused, unreachable, or a name that did not resolve."""
    return isinstance(reason, socket.gaierror) or \
        (isinstance(reason, OSError) and reason.errno in _UNREACHABLE)


class Client:
    """`url`, `token`: arguments, else RAFTSCHED_URL and RAFTSCHED_TOKEN, else
    http://127.0.0.1:8701 and no token. `tenant`: with an admin token, act for
    this tenant. `timeout_s`: per request (default limits.client_timeout_s_default).
    `ca_file`: else RAFTSCHED_TLS_CA; the CAs an https node is verified by."""

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 tenant: str | None = None, timeout_s: float | None = None,
                 ca_file: str | None = None) -> None:
        self.settings = wire.Settings.resolve(url, token, tenant, timeout_s, ca_file=ca_file)
        self._ssl = self.settings.ssl_context()
        self._nodes = wire.Nodes(self.settings.urls)

    def send(self, call: Call[T]) -> T:
        """Send one built Call; every operation method goes through here."""
        attempts = self._nodes.attempts(call, self.settings)
        for request in attempts:
            try:
                answer = _open(request, self._ssl)
            except (errors.CannotConnect, errors.Timeout) as exc:
                attempts.failed(exc)
                continue
            result: T = attempts.answered(request, *answer)
            return result
        raise attempts.no_answer()

    def close(self) -> None:
        """Nothing to release (each request has its own connection); for symmetry."""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.settings.url!r})"

    create_job = _method(ops.create_job)
    list_jobs = _method(ops.list_jobs)
    batch_create_jobs = _method(ops.batch_create_jobs)
    get_job = _method(ops.get_job)
    update_job = _method(ops.update_job)
    delete_job = _method(ops.delete_job)
    pause_job = _method(ops.pause_job)
    resume_job = _method(ops.resume_job)
    trigger_job = _method(ops.trigger_job)
    list_job_runs = _method(ops.list_job_runs)
    preview_job = _method(ops.preview_job)
    backfill_job = _method(ops.backfill_job)
    get_backfill = _method(ops.get_backfill)
    cancel_backfill = _method(ops.cancel_backfill)
    preview_schedule = _method(ops.preview_schedule)
    get_run = _method(ops.get_run)
    list_runs = _method(ops.list_runs)
    retry_run = _method(ops.retry_run)
    cancel_run = _method(ops.cancel_run)
    run_logs = _method(ops.run_logs)
    read_topic = _method(ops.read_topic)
    get_group_offset = _method(ops.get_group_offset)
    commit_group_offset = _method(ops.commit_group_offset)
    worker_claim = _method(ops.worker_claim)
    worker_heartbeat = _method(ops.worker_heartbeat)
    worker_complete = _method(ops.worker_complete)
    ui = _method(ops.ui)
    ui_file = _method(ops.ui_file)
    healthz_unversioned = _method(ops.healthz_unversioned)
    healthz = _method(ops.healthz)
    openapi = _method(ops.openapi)
    metrics = _method(ops.metrics)
    cluster = _method(ops.cluster)
    cluster_shards = _method(ops.cluster_shards)
    node_status = _method(ops.node_status)
    node_clock = _method(ops.node_clock)
    state_digest = _method(ops.state_digest)
    check_state_digest = _method(ops.check_state_digest)
    create_token = _method(ops.create_token)
    list_tokens = _method(ops.list_tokens)
    revoke_token = _method(ops.revoke_token)
    list_tenants = _method(ops.list_tenants)
    get_tenant = _method(ops.get_tenant)
    set_tenant_quota = _method(ops.set_tenant_quota)
    delete_tenant = _method(ops.delete_tenant)
    list_audit = _method(ops.list_audit)
