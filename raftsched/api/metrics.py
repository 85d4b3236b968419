"""GET /metrics: this node's metrics in the Prometheus text format.

What the answer holds is the node's to say (runtime/metrics.py builds it;
docs/metrics.md lists it). It needs a token as every read does: a reader's is
enough, and Prometheus sends one with `authorization: credentials_file`.
"""

from __future__ import annotations

from aiohttp import web

from raftsched.api.common import node_of

# The text exposition format, version 0.0.4: what every Prometheus reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=node_of(request).metrics_text(),
                        headers={"Content-Type": CONTENT_TYPE})


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/metrics", metrics)
