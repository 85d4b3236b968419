"""A write or a consistent read arriving while no leader is reachable waits for one, up to leader_wait_s, and a write that waited is proposed once; past the bound it is refused no_leader without being proposed."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from raftsched import limits
from raftsched.core import commands
from raftsched.errors import Unavailable
from raftsched.replication.raft import Replicator
from raftsched.runtime.node import Node
from raftsched.testing.http import Response, expect, wait_until


class _Raft:
    """A replicator whose leader becomes reachable after `unreachable` looks."""

    def __init__(self, unreachable: int, role: str = "follower") -> None:
        self.looks = 0
        self.unreachable = unreachable
        self.proposed: list[bytes] = []
        self.role = role

    def leader_reachable(self) -> bool:
        self.looks += 1
        return self.looks > self.unreachable

    async def propose_wait(self, data: bytes, wait_max_s: float | None = None) -> dict:
        self.proposed.append(data)
        return {"ok": True}

    def status(self):
        return SimpleNamespace(role=self.role, leader="127.0.0.1:1", commit_index=7)


def node_with(raft: _Raft, wait_s: float = limits.leader_wait_s, **extra) -> SimpleNamespace:
    node = SimpleNamespace(replicator=raft, **extra)
    node.wait_for_leader = lambda timeout_s=wait_s: Node.wait_for_leader(node, timeout_s)
    return node


async def test_a_write_during_an_election_waits_and_is_proposed_once():
    raft = _Raft(unreachable=5)
    command = commands.renew(node="n1", at_ms=1)
    assert await Node.propose(node_with(raft), command) == {"ok": True}
    assert raft.looks == 6
    assert len(raft.proposed) == 1


async def test_a_write_with_no_leader_past_the_bound_is_refused_and_not_proposed():
    raft = _Raft(unreachable=10 ** 9)
    started = time.monotonic()
    with pytest.raises(Unavailable) as refused:
        await Node.propose(node_with(raft, wait_s=0.2), commands.renew(node="n1", at_ms=1))
    assert time.monotonic() - started >= 0.2
    assert refused.value.reason == "no_leader"
    assert "leader_wait_s" in refused.value.detail
    assert raft.proposed == []


async def test_a_consistent_read_asks_again_while_the_leader_cannot_be_asked():
    raft = _Raft(unreachable=0)
    answers = [Unavailable("gone", reason="no_leader"),
               Unavailable("not me", reason="leader_changed"), 42]

    async def leader_commit_index(leader_raft, timeout_s):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    node = node_with(raft, _leader_commit_index=leader_commit_index)
    assert await Node._commit_index_to_reach(node, 5.0) == 42
    assert answers == []


async def test_a_consistent_read_gives_up_at_the_bound(monkeypatch):
    monkeypatch.setattr(limits, "leader_wait_s", 0.1)
    raft = _Raft(unreachable=0)

    async def leader_commit_index(leader_raft, timeout_s):
        raise Unavailable("gone", reason="no_leader")

    node = node_with(raft, _leader_commit_index=leader_commit_index)
    with pytest.raises(Unavailable) as refused:
        await Node._commit_index_to_reach(node, 5.0)
    assert refused.value.reason == "no_leader"


@pytest.mark.parametrize("leads, leader, connected, reachable", [
    (True, None, False, True),
    (False, "L", True, True),
    (False, "L", False, False),     # a killed leader still named until the election
    (False, None, False, False),    # an election
])
def test_a_leader_is_reachable_when_this_node_leads_or_is_connected_to_it(
        leads, leader, connected, reachable):
    obj = SimpleNamespace(_isLeader=lambda: leads, _getLeader=lambda: leader,
                          isNodeConnected=lambda node: connected and node == leader)
    replicator = SimpleNamespace(_obj=obj)
    assert Replicator.leader_reachable(replicator) is reachable


def test_a_test_helper_asks_again_after_a_503_until_its_deadline():
    answers = [Response(503, {"reason": "no_leader"}, {}), Response(200, {"ok": 1}, {})]
    got = wait_until(lambda: expect(answers.pop(0), 200).body, 5, "a read after the election")
    assert got == {"ok": 1}
    with pytest.raises(TimeoutError, match="no_leader"):
        wait_until(lambda: expect(Response(503, {"reason": "no_leader"}, {}), 200), 0.1,
                   "a read that is always refused")
    with pytest.raises(AssertionError):
        wait_until(lambda: expect(Response(404, None, {}), 200), 5, "a missing run")


class _Peers:
    """The leader's answers by path, as a follower's peer client gets them."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def get_json(self, url: str, timeout_s: float) -> object:
        path = url.split("127.0.0.1:8701", 1)[1]
        self.asked.append(path)
        return self.answers[path]


def _follower(peers: _Peers) -> SimpleNamespace:
    nodes = [(b"n1", {"id": "n1", "raft": "127.0.0.1:9701", "http": "http://127.0.0.1:8701"})]
    return SimpleNamespace(peers=peers, store=SimpleNamespace(scan=lambda table: nodes))


async def test_a_follower_reads_the_leader_s_commit_index_from_its_clock_answer():
    peers = _Peers({"/v1/node/clock": {"node": "n1", "wall_us": 1, "role": "leader",
                                       "commit_index": 42},
                    "/v1/node": {"role": "leader", "commit_index": 41}})
    assert await Node._leader_commit_index(_follower(peers), "127.0.0.1:9701", 1.0) == 42
    assert peers.asked == ["/v1/node/clock"]   # not the leader's whole status


async def test_a_leader_of_an_earlier_release_is_asked_for_its_status():
    peers = _Peers({"/v1/node/clock": {"node": "n1", "wall_us": 1},
                    "/v1/node": {"role": "leader", "commit_index": 41}})
    assert await Node._leader_commit_index(_follower(peers), "127.0.0.1:9701", 1.0) == 41
    assert peers.asked == ["/v1/node/clock", "/v1/node"]
    deposed = _Peers({"/v1/node/clock": {"node": "n1", "wall_us": 1, "role": "follower",
                                         "commit_index": 42}})
    with pytest.raises(Unavailable) as refused:
        await Node._leader_commit_index(_follower(deposed), "127.0.0.1:9701", 1.0)
    assert refused.value.reason == "leader_changed"
