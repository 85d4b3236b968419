"""RFC 9457 problem+json responses with a stable `type`, a human `detail` and,
for bad input, the offending `field` (and the `limit` exceeded, by name)."""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web, web_protocol, web_server
from aiohttp.http_exceptions import LineTooLong

from raftsched import limits

log = logging.getLogger("raftsched.http")

TITLES = {
    "invalid-field": "Invalid request",
    "bad-request": "Bad request",
    "not-found": "Not found",
    "conflict": "Conflict",
    "too-large": "Request too large",
    "unsupported-media-type": "Unsupported media type",
    "unavailable": "Cluster unavailable",
    "insufficient-storage": "Insufficient storage",
    "unauthorized": "Unauthorized",
    "forbidden": "Forbidden",
    "quota-exceeded": "Quota exceeded",
    "method-not-allowed": "Method not allowed",
    "internal": "Internal error",
}


def problem(status: int, type_: str, detail: str, *, field: str | None = None,
            limit: str | None = None, headers: dict | None = None, **extra: object) -> web.Response:
    body = problem_body(status, type_, detail, field=field, limit=limit, **extra)
    return web.Response(status=status, text=json.dumps(body),
                        content_type="application/problem+json", headers=headers)


def problem_body(status: int, type_: str, detail: str, *, field: str | None = None,
                 limit: str | None = None, **extra: object) -> dict:
    """The problem document itself, also used inside a larger answer (the
    per-job results of a batch create)."""
    body: dict = {"type": f"/problems/{type_}", "title": TITLES.get(type_, type_),
                  "status": status, "detail": detail}
    if field is not None:
        body["field"] = field
    if limit is not None:
        body["limit"] = limit
    body.update(extra)
    return body


class _ProblemRequestHandler(web_protocol.RequestHandler):
    """aiohttp answers a request its parser refuses (a request line or a
    header over its size, a line that is not HTTP) before any handler or
    middleware runs, in text/plain, and logs the client's mistake at ERROR
    with a traceback. This answers it as every other refusal is answered,
    application/problem+json, and logs one line at INFO. Server errors, and a
    response already under way, are left to aiohttp."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        why = (message or str(exc)).strip().partition("\n")[0]
        log.info("refused a request from %s that could not be read: %s", request.remote,
                 why[:200])
        if isinstance(exc, LineTooLong):
            response = problem(status, "bad-request", "the request line or a header is longer "
                               f"than {limits.request_line_bytes_max} bytes",
                               limit="request_line_bytes_max")
        else:
            response = problem(status, "bad-request", "the request is not valid HTTP")
        response.force_close()
        return response


class _ProblemServer(web_server.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class ProblemAppRunner(web.AppRunner):
    """An AppRunner whose connections answer a request aiohttp cannot read
    with problem+json (_ProblemRequestHandler), reading request and header
    lines up to limits.request_line_bytes_max. aiohttp has no hook for those
    answers (aio-libs/aiohttp#3287): the server it makes is given this
    module's request handler."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("max_line_size", limits.request_line_bytes_max)
        kwargs.setdefault("max_field_size", limits.request_line_bytes_max)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web_server.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer
        return server
