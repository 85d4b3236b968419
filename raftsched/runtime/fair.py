"""Fair shares where a backlog forms: deficit round robin between tenants, by
weight, and priority (high, normal, low) then age within a tenant.

The trigger loop orders a pass's due items with `drr_order`; each node's
dispatcher takes runs from a `FairQueue`. One tenant's million jobs due at
midnight then delay another tenant's handful by about one round (a quantum
of each tenant's items), not by the whole backlog.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable, Generic, Iterable, TypeVar

from raftsched import limits
from raftsched.core.keys import PRIORITY_RANK

T = TypeVar("T")


def drr_order(queues: dict[str, list[T]], weight_of: Callable[[str], int],
              quantum: int = limits.fair_quantum) -> list[T]:
    """Every item of `queues` (tenant -> items, each list already in the order
    the tenant's items should go), interleaved: each round every tenant that
    still has items gives up to quantum x its weight of them, tenants in name
    order (so every node orders alike)."""
    order: list[T] = []
    cursors = {tenant: 0 for tenant in sorted(queues) if queues[tenant]}
    while cursors:
        for tenant in list(cursors):
            start = cursors[tenant]
            share = quantum * max(1, weight_of(tenant))
            order.extend(queues[tenant][start:start + share])
            if start + share >= len(queues[tenant]):
                del cursors[tenant]
            else:
                cursors[tenant] = start + share
    return order


class FairQueue(Generic[T]):
    """Runs waiting for a dispatcher slot. `put_nowait` never blocks (it raises
    asyncio.QueueFull past `maxsize`); `get` waits for a run of a tenant below
    its concurrency cap, chosen by deficit round robin between tenants and by
    priority, then arrival, within a tenant. `done(tenant)` gives back the
    place a run took from its tenant's cap."""

    def __init__(self, tenant_of: Callable[[T], str], priority_of: Callable[[T], str],
                 weight_of: Callable[[str], int], cap_of: Callable[[str], int],
                 maxsize: int, quantum: int = limits.fair_quantum) -> None:
        self._tenant_of, self._priority_of = tenant_of, priority_of
        self._weight_of, self._cap_of = weight_of, cap_of
        self._maxsize, self._quantum = maxsize, quantum
        # tenant -> one deque per priority rank
        self._queues: dict[str, list[collections.deque[T]]] = {}
        self._ring: collections.deque[str] = collections.deque()   # tenants with runs waiting
        self._deficit: dict[str, int] = {}
        self._running: collections.Counter[str] = collections.Counter()
        self._size = 0
        self._ready = asyncio.Event()

    def qsize(self) -> int:
        return self._size

    def depths(self) -> dict[str, int]:
        """Runs waiting, by tenant."""
        return {tenant: sum(len(q) for q in queues) for tenant, queues in self._queues.items()}

    def running(self, tenant: str) -> int:
        return self._running[tenant]

    def put_nowait(self, item: T) -> None:
        if self._size >= self._maxsize:
            raise asyncio.QueueFull
        tenant = self._tenant_of(item)
        queues = self._queues.get(tenant)
        if queues is None:
            queues = self._queues[tenant] = [collections.deque() for _ in PRIORITY_RANK]
            self._ring.append(tenant)
            self._deficit[tenant] = 0
        queues[PRIORITY_RANK.get(self._priority_of(item), 1)].append(item)
        self._size += 1
        self._ready.set()

    def take(self, tenant: str) -> None:
        """Count a run of `tenant` that runs without having been taken by get
        (one that waited elsewhere, out of the cap), as get counts it; done
        gives it back. It may take the tenant past its cap for a while."""
        self._running[tenant] += 1

    def done(self, tenant: str) -> None:
        if self._running[tenant] > 0:
            self._running[tenant] -= 1
            if self._running[tenant] == 0:
                del self._running[tenant]
        if self._size:
            self._ready.set()

    async def get(self) -> T:
        while True:
            item = self.get_nowait()
            if item is not None:
                return item
            self._ready.clear()
            await self._ready.wait()

    def get_nowait(self) -> T | None:
        """The next run by the rules above, or None if every waiting run's
        tenant is at its cap (or nothing waits)."""
        for _ in range(2 * len(self._ring)):
            tenant = self._ring[0]
            if self._running[tenant] >= self._cap_of(tenant):
                self._ring.rotate(-1)
                continue
            if self._deficit[tenant] <= 0:
                self._deficit[tenant] += self._quantum * max(1, self._weight_of(tenant))
            item = self._pop(tenant)
            self._deficit[tenant] -= 1
            self._running[tenant] += 1
            if tenant not in self._queues:
                self._ring.popleft()
                del self._deficit[tenant]
            elif self._deficit[tenant] <= 0:
                self._ring.rotate(-1)
            return item
        return None

    def _pop(self, tenant: str) -> T:
        queues = self._queues[tenant]
        item = next(q for q in queues if q).popleft()
        self._size -= 1
        if not any(queues):
            del self._queues[tenant]
        return item

    def drain(self) -> Iterable[T]:
        """Everything waiting, emptied out (caps are not counted)."""
        for tenant in list(self._queues):
            for queue in self._queues.pop(tenant):
                yield from queue
        self._ring.clear()
        self._deficit.clear()
        self._size = 0
