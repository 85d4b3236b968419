"""The composition root: builds a node, hands the HTTP API its view of it, serves.

The runtime never imports the api package and the api package never imports
the runtime (pyproject.toml's import contracts); this module is where the two
meet. The API gets the node only as a raftsched.nodeport.NodePort
(raftsched/runtime/port.py NodeAdapter).
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from raftsched.api.app import make_app
from raftsched.api.problems import ProblemAppRunner
from raftsched.runtime import gcpolicy
from raftsched.runtime.node import Node, NodeConfig
from raftsched.runtime.port import NodeAdapter

log = logging.getLogger("raftsched.node")


def app_for(node: Node) -> web.Application:
    """The HTTP application of `node`: what Node.start serves."""
    return make_app(NodeAdapter(node))


async def start_node(config: NodeConfig) -> Node:
    """A started node serving its API (stop it with `await node.stop()`)."""
    node = Node(config)
    await node.start(app_for, ProblemAppRunner)
    return node


async def serve(config: NodeConfig) -> None:
    """Run a node until SIGTERM or SIGINT, then stop it cleanly: after
    SIGTERM it drains first (Node.drain), unless a second signal comes;
    SIGINT (Ctrl-C, or a whole local cluster stopping) stops it at once."""
    node = await start_node(config)
    # What start made lives as long as the process: never scanned again.
    gcpolicy.tune()
    stop = asyncio.Event()
    signals: list[int] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda sig=sig: (signals.append(sig), stop.set()))
    await stop.wait()
    stop.clear()
    if signals[0] == signal.SIGTERM:
        drain = asyncio.ensure_future(node.drain())
        again = asyncio.ensure_future(stop.wait())
        await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            log.warning("node %s: a second signal; stopping without draining", node.node_id)
        for task in (drain, again):
            task.cancel()
        await asyncio.gather(drain, again, return_exceptions=True)
    log.info("node %s stopping", node.node_id)
    await node.stop()
