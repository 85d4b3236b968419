"""A follower sent again entries it has applied keeps them (no truncation, no CRITICAL) when they are the same, and logs CRITICAL when one differs."""

from __future__ import annotations

import logging
import struct

import pytest
from pysyncobj import SyncObjConf
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.node import TCPNode

from raftsched.replication.raft import _StateMachine
from raftsched.testing.cluster import free_ports

NOOP = struct.pack("B", 1)   # pysyncobj's no-op entry: applying it calls no method


@pytest.fixture
def follower():
    """A Raft member ticked by hand (no thread), with one peer that never
    answers: the test plays that peer's part as leader."""
    own, peer = free_ports(2)
    conf = SyncObjConf(autoTick=False, raftMinTimeout=60, raftMaxTimeout=61, connectionTimeout=61,
                       dynamicMembershipChange=False, useFork=False)
    obj = _StateMachine(f"127.0.0.1:{own}", [f"127.0.0.1:{peer}"], conf, on_apply=lambda d, i: None,
                        flush_before_commit=None, on_created=lambda o: None, listen=True)
    leader = TCPNode(f"127.0.0.1:{peer}")
    try:
        yield obj, leader
    finally:
        obj.destroy()


def append(obj, leader, *, term: int, prev: int, prev_term: int, entries: list, commit: int):
    obj._SyncObj__onMessageReceived(leader, {
        "type": "append_entries", "term": term, "commit_index": commit,
        "entries": entries, "prevLogIdx": prev, "prevLogTerm": prev_term})
    obj.doTick(0.0)   # applies what is committed


def send_chunks(obj, leader, chunks: list[tuple[str, bytes]], *, prev: int, prev_term: int,
                commit: int) -> None:
    """One pickled entry sent in chunks, as pysyncobj sends a large one:
    (transmission, data) each, in term 1."""
    for transmission, data in chunks:
        obj._SyncObj__onMessageReceived(leader, {
            "type": "append_entries", "transmission": transmission, "data": data, "term": 1,
            "commit_index": commit, "prevLogIdx": prev, "prevLogTerm": prev_term})


def log_of(obj) -> list[tuple]:
    return [(entry[1], entry[2], entry[0]) for entry in obj._SyncObj__getEntries(1)]


def batch(first: int, last: int, term: int = 1, command: bytes = NOOP) -> list:
    return [(command, idx, term) for idx in range(first, last + 1)]


def test_entries_sent_again_after_they_were_applied_are_kept_without_a_critical_log(
        follower, caplog):
    obj, leader = follower
    append(obj, leader, term=1, prev=1, prev_term=0, entries=batch(2, 4), commit=1)
    append(obj, leader, term=1, prev=4, prev_term=1, entries=batch(5, 7), commit=6)
    assert obj.raftLastApplied == 6
    before = log_of(obj)
    caplog.set_level(logging.DEBUG)
    # The leader sends 5..7 again after the acknowledgement of 2..4 set its
    # next index back to 5: 5 and 6 are applied here.
    append(obj, leader, term=1, prev=4, prev_term=1, entries=batch(5, 7), commit=7)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert log_of(obj) == before
    assert obj.raftLastApplied == 7
    assert any("sent again by the leader are the ones applied here" in r.getMessage()
               for r in caplog.records if r.levelno == logging.DEBUG)


def test_a_resend_that_goes_past_the_log_appends_the_new_entries(follower):
    obj, leader = follower
    append(obj, leader, term=1, prev=1, prev_term=0, entries=batch(2, 4), commit=4)
    append(obj, leader, term=1, prev=1, prev_term=0, entries=batch(2, 6), commit=6)
    assert [idx for idx, _t, _c in log_of(obj)] == [1, 2, 3, 4, 5, 6]
    assert obj.raftLastApplied == 6


def test_a_different_entry_at_an_applied_index_is_logged_critical(follower, caplog):
    obj, leader = follower
    append(obj, leader, term=1, prev=1, prev_term=0, entries=batch(2, 4), commit=4)
    assert obj.raftLastApplied == 4
    append(obj, leader, term=2, prev=1, prev_term=0, entries=batch(2, 4, term=2), commit=4)
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert any(m.startswith("Raft: the leader sent entry 2 at term 2 where this node applied "
                            "one at term 1") for m in critical), critical


def test_a_large_entry_sent_again_in_chunks_is_kept_too(follower, caplog):
    obj, leader = follower
    big = NOOP + b"x" * 4096
    append(obj, leader, term=1, prev=1, prev_term=0, entries=batch(2, 3, command=big), commit=3)
    assert obj.raftLastApplied == 3
    pickled = pysyncobj_pickle.dumps((big, 3, 1))
    send_chunks(obj, leader, [("start", pickled[:1000]), ("process", pickled[1000:2000]),
                              ("finish", pickled[2000:])], prev=2, prev_term=1, commit=3)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [idx for idx, _t, _c in log_of(obj)] == [1, 2, 3]


def test_a_chunk_marked_finish_before_the_entry_is_whole_waits_for_the_rest(follower, caplog):
    obj, leader = follower
    big = NOOP + b"y" * 4096
    pickled = pysyncobj_pickle.dumps((big, 2, 1))
    # pysyncobj marks 'finish' the chunk that reaches the command's length,
    # short of the pickled entry's.
    send_chunks(obj, leader, [("start", pickled[:1000]), ("finish", pickled[1000:4100]),
                              ("finish", pickled[4100:])], prev=1, prev_term=0, commit=2)
    obj.doTick(0.0)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert log_of(obj) == [(1, 0, NOOP), (2, 1, big)]
    assert obj.raftLastApplied == 2
