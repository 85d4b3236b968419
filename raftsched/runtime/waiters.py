"""Wake-up events keyed by names callers choose: long-polling topic readers
(by topic) and workers waiting to claim (by queue).

A name has an entry only while someone waits on it: the entry is made by the
first waiter and dropped when its last waiter leaves, so names that come and
go leave nothing behind. Distinct names waited on at once are bounded per
tenant (names are scoped `tenant/name`, core/keys.scoped) and per node: a
wait on a new name past either bound is refused with QuotaExceeded (429,
Retry-After, the limit named), so one tenant's many names neither grow the
node's memory nor take the room of another tenant's waiters.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from typing import Iterator

from raftsched import limits
from raftsched.errors import QuotaExceeded


@dataclasses.dataclass
class _Entry:
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    waiters: int = 0


class Waiting:
    """One waiter's hold on a name: `event()` is the event the next wake of
    the name sets. Take it before looking for what you wait for, then wait on
    it, so that a wake between the two is not missed. Once `ended` (the node
    is stopping), answer with what there is instead of waiting again."""

    def __init__(self, entry: _Entry, owner: "Waiters") -> None:
        self._entry, self._owner = entry, owner

    def event(self) -> asyncio.Event:
        return self._entry.event

    @property
    def ended(self) -> bool:
        return self._owner.closed


class Waiters:
    def __init__(self, *, names_max: int, names_per_tenant_max: int,
                 names_limit: str, per_tenant_limit: str, what: str) -> None:
        assert names_max >= 1
        assert names_per_tenant_max >= 1
        self._entries: dict[str, _Entry] = {}
        self._per_tenant: collections.Counter[str] = collections.Counter()
        self._names_max, self._per_tenant_max = names_max, names_per_tenant_max
        self._names_limit, self._per_tenant_limit = names_limit, per_tenant_limit
        self._what = what
        self.refused_total = 0
        self.closed = False

    def names_waited(self) -> int:
        """Names waited on now."""
        return len(self._entries)

    __len__ = names_waited

    @contextlib.contextmanager
    def waiting(self, name: str) -> Iterator[Waiting]:
        """Hold `name` while the block runs (QuotaExceeded past a bound)."""
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = self._new_entry(name)
        entry.waiters += 1
        try:
            yield Waiting(entry, self)
        finally:
            entry.waiters -= 1
            if entry.waiters == 0 and self._entries.get(name) is entry:
                del self._entries[name]
                tenant = _tenant_of(name)
                self._per_tenant[tenant] -= 1
                if self._per_tenant[tenant] <= 0:
                    del self._per_tenant[tenant]

    def _new_entry(self, name: str) -> _Entry:
        tenant = _tenant_of(name)
        if self._per_tenant[tenant] >= self._per_tenant_max:
            self.refused_total += 1
            raise QuotaExceeded(
                f"tenant {tenant} already waits on {self._per_tenant_max} {self._what} at once "
                f"on this node ({self._per_tenant_limit}); wait on fewer names, or retry",
                limit=self._per_tenant_limit, retry_after_s=limits.waited_names_retry_after_s)
        if len(self._entries) >= self._names_max:
            self.refused_total += 1
            raise QuotaExceeded(
                f"this node has waiters on {self._names_max} {self._what} at once "
                f"({self._names_limit}); retry", limit=self._names_limit,
                retry_after_s=limits.waited_names_retry_after_s)
        self._per_tenant[tenant] += 1
        return _Entry()

    def close(self) -> None:
        """Loop thread, as the node stops: wake every waiter, and let none
        wait again (Waiting.ended), so that long polls answer at once rather
        than hold the node's HTTP server open."""
        self.closed = True
        for entry in self._entries.values():
            entry.event.set()

    def wake(self, name: str) -> None:
        """Loop thread: wake every waiter of `name`; later waiters wait for the next wake."""
        entry = self._entries.get(name)
        if entry is not None:
            entry.event.set()
            entry.event = asyncio.Event()


def _tenant_of(name: str) -> str:
    tenant, _, _ = name.partition("/")
    return tenant
