"""The circuit breaker, per tenant and host, opens on a mostly failing window, cools off,
lets one probe through, and closes or re-opens on its result."""

from __future__ import annotations

from raftsched.executors.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock) -> Breaker:
    return Breaker(window=20, failure_ratio=0.9, cooloff_s=30.0, clock=clock)


def test_opens_at_18_of_the_last_20_failed_and_not_before():
    clock = Clock()
    b = breaker(clock)
    for ok in [True, True] + [False] * 17:
        b.record("t", "h", ok)
    assert b.allow("t", "h")                 # 19 calls: the window is not full yet
    b.record("t", "h", False)                # 18 of 20 failed
    assert not b.allow("t", "h")
    assert b.retry_at("t", "h") == 130.0
    assert b.open_hosts() == [("t", "h")]
    assert b.allow("t", "other")             # per host


def test_17_of_20_failures_keep_it_closed():
    clock = Clock()
    b = breaker(clock)
    for ok in [True] * 3 + [False] * 17:
        b.record("t", "h", ok)
    assert b.allow("t", "h")


def test_after_the_cooloff_one_probe_goes_through_and_its_result_decides():
    clock = Clock()
    b = breaker(clock)
    for _ in range(20):
        b.record("t", "h", False)
    clock.now += 30.0
    assert b.allow("t", "h")                 # the probe
    assert not b.allow("t", "h")             # only one while it is out
    b.record("t", "h", False)
    assert not b.allow("t", "h")             # re-opened for another cool-off
    assert b.retry_at("t", "h") == 160.0
    clock.now += 30.0
    assert b.allow("t", "h")
    b.record("t", "h", True)
    assert b.allow("t", "h")
    assert b.allow("t", "h")                 # closed, with a fresh window
    assert b.opened_total == 2


def test_tenant_hosts_are_bounded():
    clock = Clock()
    b = Breaker(window=2, failure_ratio=1.0, cooloff_s=1.0, clock=clock, keys_max=3)
    for i in range(10):
        b.record("t", f"h{i}", False)
    assert len(b._hosts) == 3


def test_one_tenants_timeouts_open_its_breaker_only():
    clock = Clock()
    b = breaker(clock)
    for _ in range(20):
        b.record("tenant-a", "shared.example:443", False)
    assert not b.allow("tenant-a", "shared.example:443")
    assert b.allow("tenant-b", "shared.example:443")    # the same host, another tenant
    b.record("tenant-b", "shared.example:443", True)
    assert b.open_hosts() == [("tenant-a", "shared.example:443")]
