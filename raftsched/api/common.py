"""Helpers every route module shares: the node, JSON in and out, parameters,
and turning apply's refusals into problem+json errors."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from raftsched.errors import Conflict, InvalidInput, NotFound

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

NODE_KEY = web.AppKey("node", object)


def node_of(request: web.Request) -> "Node":
    return request.app[NODE_KEY]  # type: ignore[return-value]


async def json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise InvalidInput("the request body is empty; send a JSON object", field="body")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the request body is not JSON: {exc}", field="body") from None


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def int_param(request: web.Request, name: str, default: int, maximum: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"`{name}` must be an integer", field=name) from None
    if not 1 <= value <= maximum:
        raise InvalidInput(f"`{name}` must be from 1 to {maximum}", field=name,
                           limit="list_limit_max")
    return value


def raise_refusal(result: dict, field: str = "job_id") -> None:
    if result.get("ok"):
        return
    if result["error"] == "not_found":
        raise NotFound(result["detail"], field=field)
    if result["error"] == "conflict":
        raise Conflict(result["detail"], field=field)
    raise InvalidInput(result["detail"])


def float_param(request: web.Request, name: str, default: float, maximum: float) -> float:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"`{name}` must be a number", field=name) from None
    if not 0 <= value <= maximum:
        raise InvalidInput(f"`{name}` must be from 0 to {maximum:g}", field=name)
    return value


async def maybe_consistent(request: web.Request) -> None:
    """`?consistent=true`: read after this node applied what the leader had committed."""
    if request.query.get("consistent", "").lower() in ("1", "true", "yes"):
        await node_of(request).wait_caught_up()
