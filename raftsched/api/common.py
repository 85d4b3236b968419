"""Helpers every route module shares: the node, JSON in and out, parameters,
and turning apply's refusals into problem+json errors."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from aiohttp import hdrs, web

from raftsched import limits
from raftsched.api import strictjson
from raftsched.core.bounded import bounded_float, bounded_int
from raftsched.core import spec
from raftsched.core.redact import secret_values
from raftsched.errors import Conflict, Forbidden, InvalidInput, NotFound, QuotaExceeded
from raftsched.nodeport import NodePort

# The app's node, as the one interface the API has to it (raftsched/nodeport.py).
NODE_KEY = web.AppKey("node", NodePort)


def node_of(request: web.Request) -> NodePort:
    return request.app[NODE_KEY]


async def json_body(request: web.Request, max_bytes: int = limits.request_body_bytes_max,
                    limit_name: str = "request_body_bytes_max", *,
                    empty_ok: bool = False, off_loop: bool = False) -> Any:
    """The request's JSON body, checked at the edge (api/strictjson.py): a body
    over `max_bytes` is a 413 naming `limit_name` (the name of `max_bytes` in
    raftsched.limits; give both or neither). A missing Content-Type is read as
    JSON; a declared one must be application/json or a +json type, in UTF-8.
    `empty_ok`: an empty body is None rather than a 400. `off_loop`: decode
    on a worker thread (a body of megabytes takes a tenth of a second to
    decode and check, which the loop would otherwise wait out)."""
    _check_content_type(request)
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes, limit_name)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(max_bytes, limit_name) from None
    if len(raw) > max_bytes:
        raise _too_large(max_bytes, limit_name)
    if not raw and empty_ok:
        return None
    if off_loop:
        return await asyncio.get_running_loop().run_in_executor(None, strictjson.decode, raw)
    return strictjson.decode(raw)


def _too_large(max_bytes: int, limit_name: str) -> InvalidInput:
    return InvalidInput(f"the request body is larger than {max_bytes} bytes", field="body",
                        status=413, type_="too-large", limit=limit_name)


def _check_content_type(request: web.Request) -> None:
    if hdrs.CONTENT_TYPE not in request.headers:
        return
    mime = request.content_type
    if mime != "application/json" and not (mime.startswith("application/")
                                           and mime.endswith("+json")):
        raise InvalidInput(f"the request body must be application/json, not {mime!r}",
                           field="Content-Type", status=415, type_="unsupported-media-type")
    if (request.charset or "utf-8").lower() not in ("utf-8", "utf8"):
        raise InvalidInput(f"JSON is UTF-8; charset {request.charset!r} is not read",
                           field="Content-Type", status=415, type_="unsupported-media-type")


_JSON = msgspec.json.Encoder()


def json_response(data: Any, status: int = 200) -> web.Response:
    """`data` as compact UTF-8 JSON, encoded by msgspec (several times
    faster than the json module for a job's view)."""
    return web.Response(body=_JSON.encode(data), status=status,
                        content_type="application/json", charset="utf-8")


def json_size(value: Any) -> int:
    """The size of `value` as compact UTF-8 JSON, as json_response writes it."""
    return len(_JSON.encode(value))


def int_param(request: web.Request, name: str, default: int, maximum: int,
              limit: str = "list_limit_max") -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"`{name}` must be an integer", field=name) from None
    return bounded_int(value, name, 1, maximum, limit=limit)


def raise_refusal(result: dict, field: str = "job_id") -> None:
    if result.get("ok"):
        return
    error, detail = result.get("error"), result.get("detail", "refused")
    if error == "apply_failed":
        # A bug in apply, refused on every replica and logged by the node with
        # its stack: the caller gets a 500, not a claim that its input was wrong.
        raise RuntimeError(f"apply failed: {detail}")
    if error == "not_found":
        raise NotFound(detail, field=field)
    if error == "conflict":
        raise Conflict(detail, field=field)
    if error == "forbidden":
        raise Forbidden(detail, field=result.get("field") or field)
    if error == "quota":
        raise QuotaExceeded(detail, limit=result["limit"], retry_after_s=result["retry_after_s"])
    if error == "limit":
        raise InvalidInput(detail, field=result.get("field") or field, status=409,
                           type_="conflict", limit=result["limit"])
    # invalid_command (the command's shape) and refused (a key the store
    # cannot hold) name the command member at fault, when they can.
    raise InvalidInput(detail, field=result.get("field") or None)


def float_param(request: web.Request, name: str, default: float, maximum: float,
                limit: str | None = None) -> float:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"`{name}` must be a number", field=name) from None
    return bounded_float(value, name, 0, maximum, limit=limit)


async def maybe_consistent(request: web.Request) -> None:
    """`?consistent=true`: read after this node applied what the leader had committed."""
    if request.query.get("consistent", "").lower() in ("1", "true", "yes"):
        await node_of(request).wait_caught_up()


def job_secrets(node: "NodePort", job_id: str) -> tuple[str, ...]:
    """The texts to mask in what a job's runs show (core/redact.py secret_values);
    none once the job is removed (its runs' output and errors were masked when
    they were recorded)."""
    job = node.job(job_id)
    return secret_values(job["spec"]) if job is not None else ()


async def optional_reason(request: web.Request, default: str | None) -> str | None:
    """The optional body {"reason": "..."} of a cancel, cut to
    run_error_chars_max characters; `default` when there is no body or no
    reason in it."""
    parsed = await json_body(request, empty_ok=True)
    if parsed is None:
        return default
    reason = spec.check_shape(parsed, spec.CancelReason).reason or default
    return reason[:limits.run_error_chars_max] if reason else reason
