"""A circuit breaker for target calls, per (tenant, host).

When at least `failure_ratio` of the last `window` calls of one tenant to one
host failed (by default 18 of 20), that pair is open: the tenant's dispatch to
the host pauses for `cooloff_s`, and its runs waiting for it stay held by the
node, not called, so a target that is down does not burn their attempts
(for at most limits.breaker_hold_max_s each: runtime/dispatcher.py).
After the cool-off one call goes through (half-open): success closes the
breaker, failure opens it for another cool-off.

Keyed by tenant as well as host: one tenant's calls that time out (a slow
endpoint of its own on a shared host, or a path it alone calls) open its own
breaker and never hold back another tenant's calls to the same host.

A failure here is what says the host is unwell: a connection error, a
timeout, a 5xx, a 429. A 4xx other than 429 is the request's fault, so it
counts as the host answering. Pure: the clock is passed in.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

from raftsched import limits


# What record() changed.
OPENED, REOPENED, CLOSED = "opened", "reopened", "closed"


@dataclasses.dataclass
class _Host:
    outcomes: collections.deque = dataclasses.field(default_factory=collections.deque)
    open_until: float | None = None
    probing: bool = False


class Breaker:
    def __init__(self, *, window: int, failure_ratio: float, cooloff_s: float,
                 clock: Callable[[], float],
                 keys_max: int = limits.breaker_tenant_hosts_max) -> None:
        assert window >= 1
        assert 0 < failure_ratio <= 1
        self._window = window
        self._ratio = failure_ratio
        self._cooloff_s = cooloff_s
        self._clock = clock
        self._hosts: collections.OrderedDict[tuple[str, str], _Host] = collections.OrderedDict()
        self._keys_max = keys_max
        self.opened_total = 0

    def _host(self, tenant: str, host: str) -> _Host:
        key = (tenant, host)
        state = self._hosts.get(key)
        if state is None:
            state = self._hosts[key] = _Host()
            while len(self._hosts) > self._keys_max:   # forget the least recently used
                self._hosts.popitem(last=False)
        self._hosts.move_to_end(key)
        return state

    def allow(self, tenant: str, host: str) -> bool:
        """May a call of `tenant` to `host` start now? In half-open state, only one may."""
        state = self._host(tenant, host)
        if state.open_until is None:
            return True
        if self._clock() < state.open_until or state.probing:
            return False
        state.probing = True
        return True

    def retry_at(self, tenant: str, host: str) -> float:
        """When a call refused by allow() should ask again (clock units)."""
        state = self._host(tenant, host)
        return state.open_until if state.open_until is not None else self._clock()

    def record(self, tenant: str, host: str, ok: bool) -> str | None:
        """Count a call's outcome; what it changed, for the caller to log:
        OPENED (the window's failures reached the ratio), REOPENED (the probe
        after a cool-off failed), CLOSED (the probe succeeded), or None."""
        state = self._host(tenant, host)
        if state.open_until is not None and state.probing:
            state.probing = False
            state.outcomes.clear()
            state.open_until = None if ok else self._clock() + self._cooloff_s
            if not ok:
                self.opened_total += 1
            return REOPENED if not ok else CLOSED
        if state.open_until is not None:
            return None   # a call that began before it opened: the probe decides
        state.outcomes.append(ok)
        if len(state.outcomes) > self._window:
            state.outcomes.popleft()
        failures = state.outcomes.count(False)
        if len(state.outcomes) == self._window and failures >= self._ratio * self._window:
            state.open_until = self._clock() + self._cooloff_s
            self.opened_total += 1
            return OPENED
        return None

    def failures(self, tenant: str, host: str) -> tuple[int, int]:
        """(failed, counted) of the calls in the pair's window."""
        state = self._host(tenant, host)
        return state.outcomes.count(False), len(state.outcomes)

    def status(self, listed_max: int = limits.breakers_listed_max) -> dict:
        """The open pairs, for GET /v1/node: how many, and up to listed_max of
        them, soonest to resume first, with the seconds until one call may go."""
        now = self._clock()
        held = sorted((max(0.0, s.open_until - now), tenant, host)
                      for (tenant, host), s in self._hosts.items() if _holds(s, now))
        return {"open": len(held),
                "hosts": [{"tenant": tenant, "host": host, "calls_resume_in_s": round(wait, 1)}
                          for wait, tenant, host in held[:listed_max]]}

    def open_hosts(self) -> list[tuple[str, str]]:
        """The (tenant, host) pairs whose calls are held back now."""
        now = self._clock()
        return [h for h, s in self._hosts.items() if _holds(s, now)]


def _holds(state: _Host, now: float) -> bool:
    """Whether a pair's calls are held back now: open, and in its cool-off or
    with its probe out."""
    return state.open_until is not None and (now < state.open_until or state.probing)
