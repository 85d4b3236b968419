"""Concurrent single creates share Raft entries (each answered with its own result, idempotency per request); a node past its admission bounds refuses before it proposes; a commit timeout names its real cause."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftsched import limits
from raftsched.api import app
from raftsched.core import commands
from raftsched.errors import Busy, Unavailable
from raftsched.replication import raft
from raftsched.runtime.admission import Admission, ClientProposals, CreateGroups
from raftsched.testing.inprocess import ReplicaPort, api_client

ONE_OFF = {"run_at": "2030-01-01T00:00:00Z",
           "target": {"type": "http", "url": "https://h.example/x"}}


class GatedPort(ReplicaPort):
    """A ReplicaPort whose entries wait for `gate` before they are applied:
    what is proposed meanwhile is in flight, as on a node awaiting commit."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.gate = asyncio.Event()
        self.waiting = 0

    async def propose_entry(self, command: Any) -> dict:
        self.proposed.append(command)
        self.waiting += 1
        await self.gate.wait()
        self.waiting -= 1
        return self.replica.run(command)


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not met in time: {condition}"
        await asyncio.sleep(0.005)


async def test_concurrent_single_creates_share_entries_and_each_gets_its_own_result():
    port = GatedPort()
    requests = 24
    bodies = [dict(ONE_OFF, name=f"job {i}") for i in range(requests)]
    # Three requests with one idempotency key: one job, answered to all three.
    for i in (5, 11, 17):
        bodies[i] = dict(bodies[i], idempotency_key="same-key")
    async with api_client(port) as client:

        async def post(body: dict) -> tuple[int, dict]:
            response = await client.post("/v1/jobs", json=body)
            return response.status, await response.json()

        tasks = [asyncio.ensure_future(post(body)) for body in bodies]
        # Every request is admitted and waits: in an entry in flight, or
        # gathered behind one.
        await _until(lambda: port.client_proposals.admission.writes == requests)
        port.gate.set()
        answers = await asyncio.gather(*tasks)
    assert len(port.proposed) < requests
    assert any(commands.tag_of(c) == "create_jobs" and len(c.items) > 1 for c in port.proposed)
    keyed = [answers[i] for i in (5, 11, 17)]
    assert sorted(status for status, _ in keyed) == [200, 200, 201]
    assert len({view["job_id"] for _, view in keyed}) == 1
    others = [answers[i] for i in range(requests) if i not in (5, 11, 17)]
    assert all(status == 201 for status, _ in others)
    # Each request got its own job: its name, its id.
    for i, (_, view) in enumerate(answers):
        if i not in (5, 11, 17):
            assert view["name"] == f"job {i}"
    ids = {view["job_id"] for _, view in answers}
    assert len(ids) == requests - 2
    for job_id in ids:
        assert port.job(job_id)["status"] == "active"


async def test_groups_keep_tenants_and_actors_apart_and_a_lone_create_stays_a_create_job():
    proposed: list[commands.Command] = []
    gate = asyncio.Event()

    async def propose(command: commands.Command) -> dict:
        proposed.append(command)
        await gate.wait()
        if commands.tag_of(command) == "create_job":
            return {"ok": True, "existing": False, "job": {"id": command.job_id}}
        return {"ok": True, "results": [{"ok": True, "existing": False, "job": {"id": i.job_id}}
                                        for i in command.items]}

    groups = CreateGroups(propose, inflight_max=1)

    def create(job_id: str, tenant: str, actor: str | None) -> asyncio.Future:
        spec = {"name": job_id, "schedule": {"kind": "once", "run_at_ms": 5_000, "offset_min": 0},
                "target": {"type": "http", "url": "http://a/", "method": "POST",
                           "timeout_s": 1.0}, "retry": None, "concurrency": None, "metadata": {}}
        command = commands.create_job(job_id=job_id, tenant=tenant, spec=spec,
                                      idempotency_key=None, shard=1, next_ms=5_000, at_ms=1,
                                      actor=actor)
        return asyncio.ensure_future(groups.create(command, 100))

    first = create("job_first", "a", "tok1")
    await _until(lambda: len(proposed) == 1)
    waiting = [create("job_a1", "a", "tok1"), create("job_b1", "b", "tok2"),
               create("job_a2", "a", "tok1"), create("job_a3", "a", "tok3")]
    await asyncio.sleep(0.01)
    gate.set()
    results = await asyncio.gather(first, *waiting)
    assert [r["job"]["id"] for r in results] == ["job_first", "job_a1", "job_b1", "job_a2",
                                                 "job_a3"]
    assert commands.tag_of(proposed[0]) == "create_job"
    grouped = {(c.tenant, c.actor): [i.job_id for i in c.items] for c in proposed[1:]
               if commands.tag_of(c) == "create_jobs"}
    assert grouped == {("a", "tok1"): ["job_a1", "job_a2"]}
    lone = sorted((c.tenant, c.actor, c.job_id) for c in proposed[1:]
                  if commands.tag_of(c) == "create_job")
    assert lone == [("a", "tok3", "job_a3"), ("b", "tok2", "job_b1")]


async def test_a_group_that_is_not_committed_gives_each_of_its_creates_the_error():
    async def propose(command: commands.Command) -> dict:
        raise Unavailable("no leader", reason="no_leader")

    proposals = ClientProposals(propose)
    spec = {"name": "x", "schedule": {"kind": "once", "run_at_ms": 5_000, "offset_min": 0},
            "target": {"type": "http", "url": "http://a/", "method": "POST", "timeout_s": 1.0},
            "retry": None, "concurrency": None, "metadata": {}}
    made = [commands.create_job(job_id=f"job_{i}", tenant="t", spec=spec, idempotency_key=None,
                                shard=1, next_ms=5_000, at_ms=1) for i in range(3)]
    async def create(command: commands.CreateJob) -> dict:
        with proposals.admit(1, "t"):
            return await proposals.create(command, 100)

    outcomes = await asyncio.gather(*(create(c) for c in made), return_exceptions=True)
    assert all(isinstance(o, Unavailable) and o.reason == "no_leader" for o in outcomes)
    # Every admission it held is released.
    assert (proposals.admission.writes, proposals.admission.jobs) == (0, 0)
    assert proposals.admission.jobs_by_tenant == {}


async def test_a_create_past_the_jobs_in_flight_bound_is_refused_busy_before_proposal(
        monkeypatch):
    checked: list[object] = []
    check = app._batch_item
    monkeypatch.setattr(app, "_batch_item", lambda *a: checked.append(a) or check(*a))
    port = GatedPort()
    port.client_proposals = ClientProposals(
        port.propose_entry, admission=Admission(jobs_max=limits.batch_create_jobs_max))
    async with api_client(port) as client:
        batch = asyncio.ensure_future(client.post(
            "/v1/jobs:batchCreate", json={"jobs": [ONE_OFF] * limits.batch_create_jobs_max}))
        await _until(lambda: port.waiting > 0)
        entries = len(port.proposed)
        assert len(checked) == limits.batch_create_jobs_max
        for path, body in (("/v1/jobs", ONE_OFF), ("/v1/jobs:batchCreate", {"jobs": [ONE_OFF]})):
            refused = await client.post(path, json=body)
            problem = await refused.json()
            assert refused.status == 503
            assert refused.headers["Retry-After"] == str(limits.busy_retry_after_s)
            assert problem["type"].endswith("busy")
            assert problem["limit"] == "create_jobs_inflight_max"
            assert "busy" in problem["detail"] and "not proposed" in problem["detail"]
            assert len(port.proposed) == entries   # nothing proposed for it
        # The refused batch's jobs were not even checked: admission comes first.
        assert len(checked) == limits.batch_create_jobs_max
        port.gate.set()
        answer = await batch
        assert answer.status == 200
        results = (await answer.json())["results"]
        assert all(r.get("created") for r in results)
        # Once the batch is answered, the node takes creates again.
        assert (await client.post("/v1/jobs", json=ONE_OFF)).status == 201
    assert port.client_proposals.admission.refused_total == 2


async def test_a_write_past_the_requests_in_flight_bound_is_refused_busy():
    port = GatedPort()
    port.client_proposals = ClientProposals(port.propose_entry, admission=Admission(writes_max=2))
    async with api_client(port) as client:
        held = [asyncio.ensure_future(client.post("/v1/jobs", json=ONE_OFF)) for _ in range(2)]
        await _until(lambda: port.client_proposals.admission.writes == 2)
        refused = await client.post("/v1/jobs", json=ONE_OFF)
        assert refused.status == 503
        assert (await refused.json())["limit"] == "writes_inflight_max"
        port.gate.set()
        assert [r.status for r in await asyncio.gather(*held)] == [201, 201]


def test_one_tenant_cannot_take_all_of_a_nodes_room_for_creates():
    admission = Admission(jobs_max=4000, tenant_jobs_max=2000)
    with admission.admit(jobs=1000, tenant="noisy"), admission.admit(jobs=1000, tenant="noisy"):
        with pytest.raises(Busy) as caught:
            with admission.admit(jobs=1, tenant="noisy"):
                pass
        assert caught.value.limit == "create_jobs_inflight_per_tenant_max"
        assert "noisy" in caught.value.detail
        with admission.admit(jobs=1000, tenant="quiet"):   # the others keep their room
            assert admission.jobs_by_tenant == {"noisy": 2000, "quiet": 1000}
    assert (admission.jobs, admission.jobs_by_tenant) == (0, {})


def test_a_node_carrying_a_batch_refuses_creates_while_its_renewals_come_back_late():
    """Whoever filled the log: past create_log_latency_max_s of renewal round
    trip, a node with a batch's worth of creates in flight takes no more."""
    latency = [limits.create_log_latency_max_s + 0.1]
    admission = Admission(log_latency_s=lambda: latency[0])
    with admission.admit(jobs=limits.batch_create_jobs_max - 1, tenant="a"):
        with admission.admit(jobs=1, tenant="b"):   # under a batch's worth: not judged
            with pytest.raises(Busy) as caught:
                with admission.admit(jobs=1, tenant="b"):
                    pass
            assert caught.value.limit == "create_log_latency_max_s"
            assert "trails its proposals by 0.40 s" in caught.value.detail
            latency[0] = limits.create_log_latency_max_s
            with admission.admit(jobs=1, tenant="b"):
                pass


def test_a_node_carrying_a_batch_refuses_creates_once_its_oldest_has_waited_too_long():
    """Behind a log that trails, renewals would come too late for the shard
    lease: a node with a batch's worth of creates in flight refuses more once
    the oldest has waited create_log_latency_max_s; other writes go on, and a
    node with fewer in flight takes any create."""
    now = [100.0]
    admission = Admission(clock=lambda: now[0])
    with admission.admit(jobs=limits.batch_create_jobs_max, tenant="a"):
        now[0] += limits.create_log_latency_max_s
        with admission.admit(jobs=10, tenant="a"):   # not over the bound yet
            now[0] += 0.01
            with pytest.raises(Busy) as caught:
                with admission.admit(jobs=1, tenant="b"):
                    pass
            assert caught.value.limit == "create_log_latency_max_s"
            assert "oldest create in flight has waited 0.31 s" in caught.value.detail
            assert admission.jobs == limits.batch_create_jobs_max + 10   # nothing held for it
            with admission.admit(jobs=0):   # a delete, a pause: no creates, admitted
                pass
    with admission.admit(jobs=5, tenant="a"):   # fewer than a batch in flight: not judged
        now[0] += 10.0
        with admission.admit(jobs=5, tenant="a"):
            pass


def test_busy_is_an_unavailable_that_names_its_limit():
    with pytest.raises(Busy) as caught:
        admission = Admission(writes_max=1)
        with admission.admit(jobs=0):
            with admission.admit(jobs=0):
                pass
    assert isinstance(caught.value, Unavailable)
    assert (caught.value.reason, caught.value.limit) == ("busy", "writes_inflight_max")


# --- a commit timeout says what this node sees -----------------------------------------

class _FakeSyncObj:
    def __init__(self, *, leader: bool = True, quorum: bool = True) -> None:
        self.leader, self.hasQuorum = leader, quorum
        self.applied = 10
        self.callbacks: list = []
        self.progress = False

    @property
    def _SyncObj__raftLastApplied(self) -> int:
        if self.progress:   # the cluster commits others' entries meanwhile
            self.applied += 1
        return self.applied

    def _isLeader(self) -> bool:
        return self.leader

    def _getLeader(self) -> None:
        return None

    def apply_command(self, data: bytes, callback: Any) -> None:
        self.callbacks.append(callback)


def _replicator(obj: _FakeSyncObj) -> raft.Replicator:
    replicator = object.__new__(raft.Replicator)
    replicator._obj = obj
    replicator._loop = asyncio.get_running_loop()
    replicator._after_commit = lambda settle: settle()
    return replicator


async def test_a_timeout_with_a_quorum_and_a_leader_does_not_say_no_quorum():
    replicator = _replicator(_FakeSyncObj())
    with pytest.raises(Unavailable) as caught:
        await replicator.propose_wait(b"x", timeout_s=0.05)
    assert caught.value.reason == "timeout"
    assert "quorum" not in caught.value.detail.replace("reaches a quorum", "")
    assert "nothing was committed" in caught.value.detail


async def test_a_timeout_without_a_quorum_says_so():
    replicator = _replicator(_FakeSyncObj(quorum=False))
    with pytest.raises(Unavailable) as caught:
        await replicator.propose_wait(b"x", timeout_s=0.05)
    assert "no quorum" in caught.value.detail


async def test_a_queued_client_command_is_waited_for_while_the_cluster_commits():
    obj = _FakeSyncObj()
    obj.progress = True
    replicator = _replicator(obj)
    waiting = asyncio.ensure_future(replicator.propose_wait(b"x", timeout_s=0.05,
                                                            wait_max_s=30))
    await asyncio.sleep(0.2)   # four timeouts' worth: committed later, not lost
    assert not waiting.done()
    obj.callbacks[0]({"ok": True}, raft.FAIL_REASON.SUCCESS)
    assert await asyncio.wait_for(waiting, 5) == {"ok": True}
    with pytest.raises(Unavailable) as caught:
        await replicator.propose_wait(b"y", timeout_s=0.05, wait_max_s=0.2)
    assert "overloaded" in caught.value.detail
    # Without wait_max_s (the node's own loops), timeout_s is the whole wait.
    with pytest.raises(Unavailable) as caught:
        await replicator.propose_wait(b"z", timeout_s=0.05)
    assert "overloaded" in caught.value.detail
