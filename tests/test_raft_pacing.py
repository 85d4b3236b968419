"""An idle Raft leader sends bare heartbeats every heartbeat_period_s, not every append_entries_period_s, and a command proposed to an idle group is still sent and committed at once."""

from __future__ import annotations

import os
import statistics
import threading
import time

import pytest
from pysyncobj import SyncObjConf

from raftsched import limits
from raftsched.replication.raft import Replicator, _StateMachine
from raftsched.testing.cluster import free_ports
from raftsched.testing.http import wait_until


class _Counting(_StateMachine):
    """Counts the append-entries rounds this member sends as leader, and the
    turns of its Raft thread."""

    turns = 0

    def _onTick(self, timeToWait: float = 0.0) -> None:
        self.turns += 1
        _StateMachine._onTick(self, timeToWait)

    def _SyncObj__sendAppendEntries(self) -> None:
        self.rounds_sent = getattr(self, "rounds_sent", 0) + 1
        _StateMachine._SyncObj__sendAppendEntries(self)


@pytest.fixture
def group():
    """Three members on loopback, ticking in their own threads with the
    node's Raft timing (no journal, no secret)."""
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    applied: dict[int, list[float]] = {i: [] for i in range(3)}
    members = []
    for i, addr in enumerate(addrs):
        conf = SyncObjConf(appendEntriesPeriod=limits.append_entries_period_s,
                           autoTickPeriod=limits.auto_tick_period_s,
                           raftMinTimeout=limits.election_timeout_min_s,
                           raftMaxTimeout=limits.election_timeout_max_s,
                           dynamicMembershipChange=False, useFork=False)
        members.append(_Counting(
            addr, [a for a in addrs if a != addr], conf,
            on_apply=lambda data, index, i=i: applied[i].append(time.monotonic()),
            flush_before_commit=None, on_created=lambda o: None, listen=True))
    try:
        yield members
    finally:
        for member in members:
            member.destroy()


def _leader(members: list[_Counting]) -> _Counting | None:
    leaders = [m for m in members if m._isLeader()]
    return leaders[0] if len(leaders) == 1 else None


def test_an_idle_leader_sends_heartbeats_at_the_heartbeat_period(group):
    leader = wait_until(lambda: _leader(group), 20, "a leader elected")
    committed = threading.Event()
    leader.apply_command(b"x", callback=lambda result, error: committed.set())
    assert committed.wait(10)
    # The commit index goes out to the followers; then nothing is left to send.
    wait_until(lambda: not leader._raftsched_replicating(), 10, "the commit index sent")
    before, started = leader.rounds_sent, time.monotonic()
    time.sleep(2.0)   # the measured interval itself
    rounds = leader.rounds_sent - before
    elapsed_s = time.monotonic() - started
    # Each round is one append-entries to each follower; at
    # append_entries_period_s it would be 200 rounds.
    assert rounds <= 1.5 * elapsed_s / limits.heartbeat_period_s, rounds
    assert rounds >= 0.5 * elapsed_s / limits.heartbeat_period_s, rounds
    assert _leader(group) is leader   # no follower stood for election meanwhile


def test_an_idle_groups_raft_threads_turn_when_they_hear_or_their_timer_is_due(group):
    """A follower turns when a heartbeat arrives (its election deadline is
    further off), not every auto_tick_period_s besides (which gave it about
    23 turns a second). A leader turns when it sends and when each answer
    arrives (and when a send waits for its socket, which a loaded machine
    makes more often): held here only to not turning at the pace of
    append_entries_period_s."""
    leader = wait_until(lambda: _leader(group), 20, "a leader elected")
    wait_until(lambda: not leader._raftsched_replicating(), 10, "nothing left to send")
    before, started = [m.turns for m in group], time.monotonic()
    time.sleep(2.0)   # the measured interval itself
    periods = (time.monotonic() - started) / limits.heartbeat_period_s
    for member, turns_before in zip(group, before):
        per_period = (member.turns - turns_before) / periods
        # The leader: its send, an answer from each of two followers, and
        # room for sends that wait for their socket.
        most = 4.5 if member is leader else 1.5
        assert per_period <= most, (member is leader, per_period)
    assert _leader(group) is leader


def test_a_command_on_an_idle_group_commits_without_waiting_for_a_tick(group):
    leader = wait_until(lambda: _leader(group), 20, "a leader elected")
    follower = next(m for m in group if m is not leader)
    latencies = []
    for proposer in [leader, follower] * 10:
        done = threading.Event()
        time.sleep(limits.heartbeat_period_s / 2)   # idle between commands, off the tick
        started = time.monotonic()
        proposer.apply_command(b"x", callback=lambda result, error: done.set())
        assert done.wait(10)
        latencies.append(time.monotonic() - started)
    # Waiting for the Raft thread's next turn (auto_tick_period_s, 50 ms) on
    # the proposer and on the leader would put the median past 25 ms.
    assert statistics.median(latencies) < 0.02, sorted(latencies)


def test_a_destroyed_member_closes_its_wake_up_pipe():
    own, peer = free_ports(2)
    conf = SyncObjConf(autoTickPeriod=limits.auto_tick_period_s, dynamicMembershipChange=False,
                       useFork=False)
    member = _StateMachine(f"127.0.0.1:{own}", [f"127.0.0.1:{peer}"], conf,
                           on_apply=lambda d, i: None, flush_before_commit=None,
                           on_created=lambda o: None, listen=True)
    wake = member._raftsched_wake
    member.destroy()
    wait_until(lambda: not member.tick_thread_alive(), 5, "the Raft thread to end", 0.001)
    with pytest.raises(OSError):
        os.fstat(wake._read_fd)   # closed


def _replicator_of(member: _StateMachine) -> Replicator:
    """The adapter's reading of one member (the rest of a node is not needed)."""
    replicator = object.__new__(Replicator)
    replicator._obj, replicator._alias = member, {}
    return replicator


def test_a_peer_never_connected_since_this_start_is_left_to_its_renewals():
    """A link down since this process started says nothing (a peer slower to
    start); one that was up and went down says the peer died."""
    from types import SimpleNamespace

    class Peer:   # hashable, as pysyncobj's nodes are
        def __init__(self, port: int) -> None:
            self.id = f"127.0.0.1:{port}"

    late, killed, up = Peer(1), Peer(2), Peer(3)
    connected = {up}
    obj = SimpleNamespace(_isLeader=lambda: True, otherNodes=[late, killed, up],
                          _SyncObj__lastResponseTime={late: 0.0, killed: 0.0, up: 0.0},
                          isNodeConnected=lambda node: node in connected,
                          _raftsched_connected_once={killed.id, up.id})
    replicator = SimpleNamespace(_obj=obj, _alias={})
    seen = Replicator.peer_liveness(replicator)
    assert set(seen) == {killed.id, up.id}
    assert seen[killed.id] is None and seen[up.id] >= 0


def test_only_the_leader_reports_its_peers_links(group):
    """pysyncobj records peers' answers only while leading: a follower that
    reported its peers as down would judge live shard holders dead."""
    leader = wait_until(lambda: _leader(group), 20, "a leader elected")
    committed = threading.Event()
    leader.apply_command(b"x", callback=lambda result, error: committed.set())
    assert committed.wait(10)
    others = {str(m.selfNode.id) for m in group if m is not leader}
    seen = wait_until(lambda: (lambda s: s if None not in s.values() else None)(
        _replicator_of(leader).peer_liveness()), 10, "the leader connected to both")
    assert set(seen) == others and all(age >= 0 for age in seen.values())
    assert leader._raftsched_connected_once == others   # noted as each link came up
    for follower in (m for m in group if m is not leader):
        assert follower.isNodeConnected(leader.selfNode)
        assert _replicator_of(follower).peer_liveness() == {}
