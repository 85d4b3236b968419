"""The asyncio client: one aiohttp session, opened on first use.

    from raftsched.client import AsyncClient
    async with AsyncClient() as api:            # RAFTSCHED_URL, RAFTSCHED_TOKEN
        job = await api.create_job({"run_at": "...", "target": {...}})

The same methods as Client (operations.py), each a coroutine; the same errors
(errors.py); the same choice of node among several URLs (wire.py). Nothing
else is retried, for the reasons sync.py gives.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

import aiohttp

from raftsched.client import errors, operations as ops, wire
from raftsched.client.operations import Call

P = ParamSpec("P")
T = TypeVar("T")


def _method(build: Callable[P, Call[T]]) -> Callable[Concatenate["AsyncClient", P], Awaitable[T]]:
    @functools.wraps(build)
    async def method(self: "AsyncClient", /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(build(*args, **kwargs))
    return method


class AsyncClient:
    """The arguments of Client. Use it as `async with`, or call close()."""

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 tenant: str | None = None, timeout_s: float | None = None,
                 ca_file: str | None = None) -> None:
        self.settings = wire.Settings.resolve(url, token, tenant, timeout_s, ca_file=ca_file)
        self._ssl = self.settings.ssl_context()
        self._session: aiohttp.ClientSession | None = None
        self._nodes = wire.Nodes(self.settings.urls)

    async def send(self, call: Call[T]) -> T:
        """Send one built Call; every operation method goes through here."""
        attempts = self._nodes.attempts(call, self.settings)
        for request in attempts:
            try:
                answer = await self._open(request)
            except (errors.CannotConnect, errors.Timeout) as exc:
                attempts.failed(exc)
                continue
            result: T = attempts.answered(request, *answer)
            return result
        raise attempts.no_answer()

    async def _open(self, request: wire.Request) -> tuple[int, dict[str, str], bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                ssl=self._ssl if self._ssl is not None else True))
        try:
            async with self._session.request(
                    request.method, request.url, data=request.body, headers=request.headers,
                    timeout=aiohttp.ClientTimeout(total=request.timeout_s),
                    allow_redirects=True) as answer:
                return answer.status, dict(answer.headers), await answer.read()
        except asyncio.TimeoutError as exc:
            raise errors.Timeout(request.url, request.timeout_s) from exc
        except aiohttp.ClientConnectorError as exc:   # no connection made: nothing sent
            raise errors.CannotConnect(request.url, str(exc) or type(exc).__name__,
                                       sent=False) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise errors.CannotConnect(request.url, str(exc) or type(exc).__name__) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({self.settings.url!r})"

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
