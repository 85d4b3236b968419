"""Fair shares: deficit round robin between tenants by weight, priority within one, caps."""

import asyncio

import pytest

from raftsched.runtime.fair import FairQueue, drr_order


def test_drr_order_gives_a_light_tenant_its_items_in_the_first_round():
    queues = {"a": [f"a{i}" for i in range(1000)], "b": ["b0", "b1", "b2"]}
    order = drr_order(queues, lambda t: 1, quantum=10)
    assert sorted(order) == sorted(queues["a"] + queues["b"])
    assert max(order.index(x) for x in queues["b"]) < 13
    assert order[:10] == queues["a"][:10]   # tenants in name order, each its quantum


def test_drr_order_shares_by_weight():
    queues = {"a": [("a", i) for i in range(300)], "b": [("b", i) for i in range(300)]}
    order = drr_order(queues, {"a": 1, "b": 2}.__getitem__, quantum=10)
    first = order[:90]
    assert sum(1 for t, _ in first if t == "b") == 60
    assert sum(1 for t, _ in first if t == "a") == 30


def _queue(weights=None, caps=None, maxsize=10_000, quantum=4):
    weights, caps = weights or {}, caps or {}
    return FairQueue(tenant_of=lambda r: r["tenant"], priority_of=lambda r: r["priority"],
                     weight_of=lambda t: weights.get(t, 1), cap_of=lambda t: caps.get(t, 10**9),
                     maxsize=maxsize, quantum=quantum)


def _run(tenant, n, priority="normal"):
    return {"tenant": tenant, "id": f"{tenant}{n}", "priority": priority}


def test_fair_queue_interleaves_tenants_and_keeps_priority_within_one():
    q = _queue()
    for i in range(20):
        q.put_nowait(_run("a", i))
    q.put_nowait(_run("b", 0, "low"))
    q.put_nowait(_run("b", 1, "high"))
    ids = [q.get_nowait()["id"] for _ in range(22)]
    assert ids.index("b1") < ids.index("b0") < 10
    assert q.qsize() == 0 and q.get_nowait() is None


def test_fair_queue_passes_over_a_tenant_at_its_cap_until_done():
    q = _queue(caps={"a": 2})
    for i in range(5):
        q.put_nowait(_run("a", i))
    q.put_nowait(_run("b", 0))
    got = [q.get_nowait() for _ in range(4)]
    assert [r["id"] if r else None for r in got] == ["a0", "a1", "b0", None]
    assert q.running("a") == 2
    q.done("a")
    assert q.get_nowait()["id"] == "a2"


def test_fair_queue_refuses_past_maxsize():
    q = _queue(maxsize=2)
    q.put_nowait(_run("a", 0))
    q.put_nowait(_run("a", 1))
    with pytest.raises(asyncio.QueueFull):
        q.put_nowait(_run("a", 2))


async def test_fair_queue_get_waits_for_a_put_or_a_done():
    q = _queue(caps={"a": 1})
    q.put_nowait(_run("a", 0))
    q.put_nowait(_run("a", 1))
    assert (await q.get())["id"] == "a0"
    waiter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    q.done("a")
    assert (await asyncio.wait_for(waiter, 1.0))["id"] == "a1"
