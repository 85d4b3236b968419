"""The circuit breaker, per tenant and host, opens on a mostly failing window, cools off,
lets one probe through, and closes or re-opens on its result."""

from __future__ import annotations

import logging

from raftsched.core import commands, jobspec, keys
from raftsched.executors.base import Outcome
from raftsched.executors.breaker import CLOSED, OPENED, REOPENED, Breaker
from raftsched.runtime.dispatcher import Calls, Dispatcher
from raftsched.runtime.lateness import LatenessHistogram
from raftsched.testing.replica import Replica


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


async def test_the_dispatcher_holds_back_only_the_tenant_whose_breaker_is_open():
    log = _jobs_at_shared_host("a", "b")
    clock = Clock()
    breaker = Breaker(window=20, failure_ratio=0.9, cooloff_s=30.0, clock=clock)
    # Parking reads the breaker and the clock; nothing here calls, reports or holds.
    dispatcher = _dispatcher(log, breaker, clock)
    for _ in range(20):
        breaker.record("a", "shared.example", False)
    run_a = {"id": "run_a", "job_id": "job_a1", "tenant": "a", "attempt": 1}
    run_b = {"id": "run_b", "job_id": "job_b1", "tenant": "b", "attempt": 1}

    def job_of(run: dict) -> dict | None:
        return log.store.get("jobs", run["job_id"].encode())
    assert dispatcher._maybe_park(run_a, job_of(run_a))
    assert not dispatcher._maybe_park(run_b, job_of(run_b))
    assert dispatcher.parked_total == 1


def test_record_says_what_it_changed_and_status_lists_the_open_pairs():
    clock = Clock()
    b = breaker(clock)
    changes = [b.record("t", "h", False) for _ in range(20)]
    assert changes == [None] * 19 + [OPENED]
    assert b.failures("t", "h") == (20, 20)
    # Calls that began before it opened: their failures neither open it again
    # nor hold it longer; the probe after the cool-off decides.
    clock.now += 10
    assert b.record("t", "h", False) is None
    assert b.retry_at("t", "h") == 130.0
    for i in range(3):
        for _ in range(20):
            b.record("u", f"h{i}", False)
    assert b.status(listed_max=2) == {"open": 4, "hosts": [
        {"tenant": "t", "host": "h", "calls_resume_in_s": 20.0},
        {"tenant": "u", "host": "h0", "calls_resume_in_s": 30.0}]}
    clock.now += 20
    assert b.allow("t", "h")
    assert b.record("t", "h", False) == REOPENED
    clock.now += 30
    assert b.allow("t", "h")
    assert b.record("t", "h", True) == CLOSED
    assert b.status() == {"open": 0, "hosts": []}   # the others' cool-offs ended too
    assert b.opened_total == 5


async def test_the_dispatcher_logs_when_a_breaker_opens_stays_open_and_closes(caplog):
    log = _jobs_at_shared_host("a")
    run = log.run(commands.trigger_job(job_id="job_a1", scheduled_ms=2_000, node="n1",
                                       at_ms=2_000))["run"]
    job = log.store.get("jobs", b"job_a1")

    class Http:
        outcome = Outcome(ok=False, error="ClientConnectorError: connection refused")

        async def run(self, attempt, target, deadline_ms):
            return self.outcome

    clock, http = Clock(), Http()
    breaker = Breaker(window=20, failure_ratio=0.9, cooloff_s=30.0, clock=clock)
    dispatcher = _dispatcher(log, breaker, clock, http)
    caplog.set_level(logging.INFO, "raftsched.dispatch")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "circuit breaker" in r.getMessage()]
    for _ in range(25):   # 5 of them in flight when it opened
        await dispatcher._call(job, run)
    assert lines() == [
        "circuit breaker open for tenant a's calls to shared.example: 20 of its last 20 calls "
        "failed, the latest with ClientConnectorError: connection refused; this node holds its "
        "runs for that host (running, not called, spending no attempt) for 30 s "
        "(breaker_cooloff_s), then lets one call through"]
    clock.now += 30
    assert breaker.allow("a", "shared.example")
    http.outcome = Outcome(ok=False, http_status=503)
    await dispatcher._call(job, run)
    assert lines()[1] == ("circuit breaker for tenant a's calls to shared.example stays open "
                          "another 30 s (breaker_cooloff_s): the call let through after the "
                          "cool-off failed with HTTP 503")
    clock.now += 30
    assert breaker.allow("a", "shared.example")
    http.outcome = Outcome(ok=True, http_status=200)
    await dispatcher._call(job, run)
    assert lines()[2].startswith("circuit breaker closed for tenant a's calls to shared.example")
    assert len(lines()) == 3


async def test_a_run_held_past_breaker_hold_max_s_is_called_anyway(caplog):
    from raftsched import limits

    log = _jobs_at_shared_host("a")
    clock = Clock()
    # A host that never answers again: the breaker stays open (its probes fail).
    breaker = Breaker(window=20, failure_ratio=0.9, cooloff_s=10 ** 9, clock=clock)
    dispatcher = _dispatcher(log, breaker, clock)
    for _ in range(20):
        breaker.record("a", "shared.example", False)
    job = log.store.get("jobs", b"job_a1")
    runs = [{"id": f"run_{i}", "job_id": "job_a1", "tenant": "a", "attempt": 1}
            for i in range(3)]
    caplog.set_level(logging.WARNING, "raftsched.dispatch")
    assert all(dispatcher._maybe_park(run, job) for run in runs)
    clock.now += limits.breaker_hold_max_s - 1
    assert all(dispatcher._maybe_park(run, job) for run in runs)   # held still
    clock.now += 1
    assert not any(dispatcher._maybe_park(run, job) for run in runs)   # called anyway
    assert dispatcher.held_past_bound_total == 3
    assert not breaker.allow("a", "shared.example")   # the breaker is as it was
    lines = [r.getMessage() for r in caplog.records if "called anyway" in r.getMessage()]
    assert lines == [f"runs held behind an open circuit breaker for breaker_hold_max_s "
                     f"({limits.breaker_hold_max_s:g} s) are called anyway: 1 since the last "
                     f"such line, the latest of tenant a to shared.example; each ends as the "
                     f"host answers, and its retry policy decides the rest"]   # once a cool-off
    # Its next attempt is held afresh, for as long again.
    assert dispatcher._maybe_park(dict(runs[0], attempt=2), job)
    assert dispatcher._held_since == {("run_0", 2): clock.now}
    # An entry whose run left unseen goes once the table is past its bound.
    dispatcher._held_since.update({(f"gone_{i}", 1): clock.now - limits.breaker_hold_max_s
                                   for i in range(limits.dispatch_queue_max)})
    assert dispatcher._maybe_park(dict(runs[1], attempt=2), job)
    assert dispatcher._held_since == {("run_0", 2): clock.now, ("run_1", 2): clock.now}


def _jobs_at_shared_host(*tenants: str) -> Replica:
    """A replica with one one-off job per tenant, job_<tenant>1, calling
    https://shared.example/hook."""
    log = Replica()
    spec = jobspec.validate_create({"run_at": "2030-01-01T00:00:00Z", "target": {
        "type": "http", "url": "https://shared.example/hook"}})["spec"]
    for tenant in tenants:
        job_id = f"job_{tenant}1"
        assert log.run(commands.create_job(job_id=job_id, tenant=tenant, spec=spec,
                                           idempotency_key=None, shard=keys.shard_of(job_id, 16),
                                           next_ms=None, at_ms=1_000))["ok"]
    return log


def _dispatcher(log: Replica, breaker: Breaker, clock: Clock, http=None) -> Dispatcher:
    """A dispatcher whose calls go to `http` through `breaker`; nothing it
    does here reports, holds or spawns."""
    return Dispatcher(
        log.replicated(),
        calls=Calls(http=http, command=None, breaker=breaker, outputs=None,
                    storage_past_mark=lambda: None, lateness=LatenessHistogram()),
        lease=None, armed=None, report=None, spawn=None,
        quota_of=lambda tenant: {"weight": 1, "runs_concurrent_max": 10},
        cluster_applies=lambda: 0, monotonic=clock)

