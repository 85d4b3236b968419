"""RFC 9457 problem+json responses with a stable `type`, a human `detail` and,
for bad input, the offending `field` (and the `limit` exceeded, by name)."""

from __future__ import annotations

import json

from aiohttp import web

TITLES = {
    "invalid-field": "Invalid request",
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
