"""What the node's loops are given instead of the node: a few named collaborators.

A loop (trigger, dispatcher, reporter, reaper, purger, backfiller) reads the
applied state, proposes commands, reads the cluster's time and asks whether
this node leads; that much is `Replicated`. What else a loop needs (the
dispatcher's call slots, a tenant's quota, the HTTP executor) it is handed by
name where runtime/node.py builds it, so each loop can be read, and tested,
with only what it uses: tests/test_loop_context.py builds them over an
in-process replica with no node at all.

What a loop does when an entry is applied reaches it through the effects
bus (runtime/effects.py), to which node.py subscribes each loop's handlers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Awaitable, Callable, Coroutine, Protocol

from raftsched.storage.base import Store


class Propose(Protocol):
    """A command to the cluster: its result once it is applied on this node
    (raises Unavailable when it was not proposed or not committed in time)."""

    def __call__(self, command: dict, wait_max_s: float | None = None) -> Awaitable[dict]: ...


Spawn = Callable[[str, Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]
"""Start a named background task that is not awaited; its failure is logged
and counted (runtime/supervise.py Supervisor.spawn), never lost."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Replicated:
    """This node's place in the replicated state, as a loop uses it."""

    node_id: str
    # Reads of the state as applied on this node (storage/lmdb_store.py); a
    # loop never writes it: what it changes, it proposes.
    store: Store
    propose: Propose
    # The cluster's time (runtime/clock.py), which every proposal is dated by.
    now_ms: Callable[[], int]
    # Whether this node leads now: leader-only loops act only then.
    is_leader: Callable[[], bool]
