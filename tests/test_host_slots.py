"""A node makes at most http_connections_per_host_max calls to one host at once;
the runs past that wait in the dispatcher, tenants in turn, not in the HTTP
client's queue (where they waited in arrival order, their timeouts running)."""

from __future__ import annotations

import asyncio
import collections

import pytest

from raftsched import limits
from raftsched.core import commands, keys
from raftsched.executors.base import Outcome
from tests import test_lease_at_fire
from tests.test_lease_at_fire import AT_MS, SHARDS, Cluster, FakeNode, start, until

HOST_MAX = 2


class HeldCalls:
    """An HTTP target that holds every call until the test lets it end, and
    notes the order calls began in and the most in flight to each host."""

    def __init__(self) -> None:
        self.began: list[str] = []            # run ids, in the order called
        self.gates: dict[str, asyncio.Event] = {}
        self.in_flight: collections.Counter[str] = collections.Counter()
        self.most: collections.Counter[str] = collections.Counter()

    async def run(self, attempt, target: dict, deadline_ms: int) -> Outcome:
        host = target["url"].split("/")[2]
        self.began.append(attempt.run_id)
        self.in_flight[host] += 1
        self.most[host] = max(self.most[host], self.in_flight[host])
        gate = self.gates[attempt.run_id] = asyncio.Event()
        try:
            await gate.wait()
        finally:
            self.in_flight[host] -= 1
        return Outcome(ok=True, http_status=200)

    def end(self, run_id: str) -> None:
        self.gates[run_id].set()


def make_job(cluster: Cluster, job_id: str, tenant: str, url: str) -> int:
    shard = keys.shard_of(job_id, SHARDS)
    cluster.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=AT_MS - 10_000))
    spec = {"name": job_id, "schedule": {"kind": "every", "every_ms": 2000, "text": "2s"},
            "target": {"type": "http", "url": url, "method": "POST", "headers": {},
                       "body": None, "timeout_s": 5.0},
            "misfire": {"policy": "fire_all", "tolerance_ms": 3_600_000, "catchup_max": 1000},
            "alert": {}, "metadata": {}, "concurrency": {"policy": "allow"},
            "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0,
                      "max_s": 60.0, "non_retryable_exit_codes": []}}
    assert cluster.run(commands.create_job(job_id=job_id, tenant=tenant, spec=spec,
                                           idempotency_key=None, shard=shard, next_ms=AT_MS,
                                           at_ms=AT_MS - 10_000))["ok"]
    return shard


def fire(cluster: Cluster, node: FakeNode, job_id: str, count: int) -> list[str]:
    """`count` occurrences of the job fired at once: its run ids."""
    shard = keys.shard_of(job_id, SHARDS)
    occurrences = [AT_MS + 2000 * i for i in range(count)]
    node.clock_ms = max(node.clock_ms, occurrences[-1])
    token = cluster.store.get("shards", keys.shard_key(shard))["token"]
    result = cluster.run(commands.fire(
        shard=shard, token=token, upto_ms=occurrences[-1], node="n1", at_ms=occurrences[-1],
        items=[(job_id, AT_MS, occurrences[-1] + 2000, occurrences, False)]))
    assert result["fired"] == count, result
    return [keys.run_id(job_id, o) for o in occurrences]


# The fixture of a replicated log and its fake nodes, with 4 call slots a node.
cluster = test_lease_at_fire.cluster


@pytest.fixture(autouse=True)
def host_max(monkeypatch):
    monkeypatch.setattr(limits, "http_connections_per_host_max", HOST_MAX)


def state(cluster: Cluster, run_id: str) -> str:
    return cluster.get_run(run_id)["state"]


async def test_a_tenants_run_for_a_busy_host_is_called_next_not_after_anothers_backlog(cluster):
    node = FakeNode(cluster, "n1", collections.Counter())
    target = HeldCalls()
    node.http_executor.run = target.run   # the executor its dispatcher calls through
    for job_id, tenant, url in (("job_a", "a", "http://shared.example/a"),
                                ("job_b", "b", "http://shared.example/b"),
                                ("job_c", "c", "http://other.example/c")):
        make_job(cluster, job_id, tenant, url)
    node.renew()
    a_runs = fire(cluster, node, "job_a", 6)
    start(node)
    await until(lambda: len(target.began) == HOST_MAX, "a's first calls")
    (b_run,) = fire(cluster, node, "job_b", 1)
    (c_run,) = fire(cluster, node, "job_c", 1)
    # Another host is called at once; the shared one has no more calls than its bound.
    await until(lambda: c_run in target.began, "the call to the other host")
    assert target.in_flight["shared.example"] == HOST_MAX
    assert node.dispatcher.waiting_for_host() == len(a_runs) - HOST_MAX + 1
    assert node.dispatcher.queue_depths() == {"a": len(a_runs) - HOST_MAX, "b": 1}
    # As calls to the shared host end, the waiting runs go one per tenant in
    # turn: b's within the first round (two calls ending), ahead of a's four.
    for ended in range(2):
        target.end(target.began[ended])
        await until(lambda: len(target.began) == HOST_MAX + 2 + ended,
                    "the next call to the shared host")
    assert b_run in target.began[-2:], target.began
    # Then a's, one as each call ends, never more than the bound at once.
    while any(state(cluster, r) != "succeeded" for r in a_runs + [b_run, c_run]):
        for run_id in list(target.began):
            target.end(run_id)
        await asyncio.sleep(0.01)
    assert sorted(target.began) == sorted(a_runs + [b_run, c_run])   # each called once
    assert target.most["shared.example"] == HOST_MAX
    assert node.dispatcher.waiting_for_host() == 0
    assert node.dispatcher._host_calls == {} and node.dispatcher._host_waiting == {}
    assert node.dispatcher.host_waited_total == len(a_runs) - HOST_MAX + 1


def test_calls_are_counted_by_what_the_client_pools_connections_by():
    from raftsched.runtime.dispatcher import Dispatcher

    def key(url: str) -> str | None:
        job = {"spec": {"target": {"type": "http", "url": url}}}
        return Dispatcher._connection_of({}, job)

    assert key("http://Shared.Example/a") == key("http://user@shared.example:80/b") \
        == "http://shared.example:80"
    assert key("https://shared.example/a") == "https://shared.example:443"
    assert key("http://shared.example:8080/") == "http://shared.example:8080"
    assert key("http://[::1]:99999/") is None    # a port out of range: no call is made
    assert Dispatcher._connection_of({}, {"spec": {"target": {"type": "publish"}}}) is None
    assert Dispatcher._connection_of({}, None) is None


class CappedNode(FakeNode):
    """A node whose tenants may run 3 runs at once (runs_concurrent_max)."""

    def quota_of(self, tenant: str) -> dict:
        return {"weight": 1, "runs_concurrent_max": 3}


async def test_a_tenants_runs_waiting_for_a_busy_host_do_not_hold_back_its_other_hosts(cluster):
    node = CappedNode(cluster, "n1", collections.Counter())
    target = HeldCalls()
    node.http_executor.run = target.run
    make_job(cluster, "job_slow", "a", "http://slow.example/a")
    make_job(cluster, "job_other", "a", "http://other.example/a")
    node.renew()
    slow_runs = fire(cluster, node, "job_slow", 6)
    start(node)
    await until(lambda: len(target.began) == HOST_MAX, "the first calls to the slow host")
    await until(lambda: node.dispatcher.waiting_for_host() == len(slow_runs) - HOST_MAX,
                "the rest of a's runs for it to wait for it")
    # Those four hold no place in a's cap of 3: its run for another host is called.
    (other_run,) = fire(cluster, node, "job_other", 1)
    await until(lambda: other_run in target.began, "a's call to the other host")
    assert node.dispatcher._queue.running("a") == HOST_MAX + 1
    # As calls end, the waiting runs take their places again, each called once.
    while any(state(cluster, r) != "succeeded" for r in slow_runs + [other_run]):
        for run_id in list(target.began):
            target.end(run_id)
        await asyncio.sleep(0.01)
    assert sorted(target.began) == sorted(slow_runs + [other_run])
    assert target.most["slow.example"] == HOST_MAX
    assert node.dispatcher._queue.running("a") == 0
