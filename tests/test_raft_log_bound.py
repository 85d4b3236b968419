"""The Raft journal: entries read from its file rather than held in memory, in
pysyncobj's format and with FileJournal's results through adds, truncations,
compactions and reopening; the log read in ranges as pysyncobj reads it; and
a node snapshots early past a byte bound that grows with its state, a leader
only while every follower has the entries it would drop."""

import os
import tracemalloc
from types import SimpleNamespace

from hypothesis import given, settings, strategies as st
from pysyncobj import SyncObj
from pysyncobj.journal import FileJournal

from raftsched import limits
from raftsched.replication import raft
from raftsched.replication.raft import _StateMachine, _TrackedJournal, log_bytes_bound


def contents(journal) -> list[tuple]:
    return [journal[i] for i in range(len(journal))]


def reopened(kind, path: str) -> list[tuple]:
    """What a journal of `kind` opened on the file reads."""
    journal = kind(path)
    try:
        return contents(journal)
    finally:
        journal._destroy()


def test_entries_read_back_by_position_slice_and_after_reopening(tmp_path):
    path = str(tmp_path / "journal")
    journal = _TrackedJournal(path)
    added = [(bytes([i]) * (i * 37 + 1), i + 1, 1 + i // 4) for i in range(20)]
    for entry in added:
        journal.add(*entry)
    assert contents(journal) == added
    assert (journal[0], journal[-1], journal[-3]) == (added[0], added[-1], added[-3])
    assert journal[5:9] == added[5:9] and journal[17:] == added[17:]
    journal.flush()
    assert reopened(_TrackedJournal, path) == added
    assert reopened(FileJournal, path) == added   # pysyncobj's own reader agrees
    journal._destroy()


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3000)),
    st.tuples(st.just("from"), st.integers(0, 40)),
    st.tuples(st.just("to"), st.integers(0, 40)),
    st.tuples(st.just("clear"), st.just(0))), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_every_change_leaves_what_pysyncobj_s_file_journal_leaves(tmp_path_factory, changes):
    folder = tmp_path_factory.mktemp("j")
    ours = _TrackedJournal(str(folder / "ours"))
    theirs = FileJournal(str(folder / "theirs"))
    idx = 0
    for op, n in changes:
        if op == "add":
            idx += 1
            command = os.urandom(n)
            for journal in (ours, theirs):
                journal.add(command, idx, 1 + idx // 7)
            if n % 2:
                ours._last = None   # read the last entry back from the file too
        elif op == "from" and len(theirs):
            ours.deleteEntriesFrom(n % (len(theirs) + 1))
            theirs.deleteEntriesFrom(n % (len(theirs) + 1))
        elif op == "to" and len(theirs):
            ours.deleteEntriesTo(n % (len(theirs) + 1))
            theirs.deleteEntriesTo(n % (len(theirs) + 1))
        elif op == "clear":
            ours.clear()
            theirs.clear()
        assert contents(ours) == contents(theirs)
        assert ours.held_bytes() == sum(len(e[0]) + 24 for e in contents(theirs))
    ours.flush()
    assert reopened(FileJournal, str(folder / "ours")) == contents(theirs)
    assert reopened(_TrackedJournal, str(folder / "ours")) == contents(theirs)
    ours._destroy()
    theirs._destroy()


def test_the_journal_does_not_hold_its_entries_in_memory(tmp_path):
    journal = _TrackedJournal(str(tmp_path / "journal"))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for idx in range(1, 65):
            journal.add(os.urandom(1024 * 1024), idx, 1)   # 64 MB of batch-create-sized entries
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert journal.held_bytes() == 64 * (1024 * 1024 + 24)
    # The offsets and the last entry; FileJournal held all 64 MB.
    assert held < 4 * 1024 * 1024, held
    journal._destroy()


def test_ranges_are_read_as_pysyncobj_reads_them(tmp_path):
    ours = _TrackedJournal(str(tmp_path / "ours"))
    theirs = FileJournal(str(tmp_path / "theirs"))
    for idx in range(5, 30):
        for journal in (ours, theirs):
            journal.add(b"c" * (idx * 100), idx, 2)
    ask = SimpleNamespace(_SyncObj__raftLog=ours)
    plain = SimpleNamespace(_SyncObj__raftLog=theirs)
    for args in [(None,), (4,), (5,), (10,), (29,), (30,), (7, 1), (7, 5), (28, 5),
                 (10, None, 1), (10, None, 2500), (10, None, 10 ** 6), (10, 3, 2500)]:
        assert _StateMachine._SyncObj__getEntries(ask, *args) == \
            SyncObj._SyncObj__getEntries(plain, *args), args
    ours._destroy()
    theirs._destroy()


def test_a_snapshot_s_compaction_hands_the_freed_memory_back(tmp_path, monkeypatch):
    released = []
    monkeypatch.setattr(raft, "release_freed_memory", lambda: released.append(True))
    journal = _TrackedJournal(str(tmp_path / "journal"))
    for idx in range(1, 5):
        journal.add(b"x" * 1000, idx, 1)
    journal.deleteEntriesFrom(3)        # a truncation (keeps three): no trim
    assert released == []
    journal.deleteEntriesTo(2)          # a snapshot's compaction
    assert released == [True]
    assert contents(journal) == [(b"x" * 1000, 3, 1)]
    journal._destroy()


def test_a_node_builds_this_journal(tmp_path):
    # SyncObj looks createJournal up in its module when it starts.
    assert raft.pysyncobj_syncobj.createJournal is raft._create_journal
    built = raft._create_journal(str(tmp_path / "journal"))
    assert isinstance(built, _TrackedJournal)
    built._destroy()
    assert not isinstance(raft._create_journal(None), FileJournal)   # no file: in memory


def test_releasing_freed_memory_is_glibc_s_trim_or_nothing():
    # On glibc (this project's images and CI) the trim is there; elsewhere the
    # call answers False and does nothing.
    assert raft.release_freed_memory() is (raft._MALLOC_TRIM is not None)


def test_the_log_bound_grows_with_the_state_within_its_limits():
    share = limits.raft_log_snapshot_share
    assert log_bytes_bound(0) == limits.raft_log_bytes_min
    assert log_bytes_bound(limits.raft_log_bytes_min * share) == limits.raft_log_bytes_min
    assert log_bytes_bound(4 * 10 ** 9) == 4 * 10 ** 9 // share
    assert log_bytes_bound(10 ** 12) == limits.raft_log_bytes_max
    assert limits.raft_log_bytes_max < limits.raft_log_bytes_hard_max < 2 ** 32


class _Held(_TrackedJournal):
    """A journal that says how many bytes it holds, nothing else."""

    def __init__(self, held_bytes: int) -> None:   # no file: only held_bytes is asked
        self._held = held_bytes

    def held_bytes(self) -> int:
        return self._held


def bound_log(held_bytes: int, leader: bool, match: dict[str, int], applied: int = 100,
              snapshot_bytes: int = 0, snapshotting: bool = False) -> int:
    """How many snapshots _raftsched_bound_log asks for, on a stand-in node."""
    asked = []
    node = SimpleNamespace(
        _SyncObj__raftLog=_Held(held_bytes), _isLeader=lambda: leader,
        _SyncObj__raftLastApplied=applied, _SyncObj__raftMatchIndex=match,
        _SyncObj__otherNodes=list(match), forceLogCompaction=lambda: asked.append(1),
        _raftsched_snapshot_bytes=lambda: snapshot_bytes,
        _raftsched_snapshotting=lambda: snapshotting)
    _StateMachine._raftsched_bound_log(node)
    return len(asked)


def test_a_log_past_its_byte_bound_is_snapshotted_early():
    bound = limits.raft_log_bytes_min
    assert bound_log(bound, leader=False, match={}) == 0
    assert bound_log(bound + 1, leader=False, match={}) == 1   # a follower drops what it applied
    assert bound_log(bound + 1, leader=True, match={"n2": 100, "n3": 120}) == 1
    # Against a 4 GB state the bound is an eighth of it.
    big = 4 * 10 ** 9
    assert bound_log(big // 8, leader=False, match={}, snapshot_bytes=big) == 0
    assert bound_log(big // 8 + 1, leader=False, match={}, snapshot_bytes=big) == 1


def test_no_snapshot_is_asked_for_while_one_is_written():
    # pysyncobj would keep the request and start another as soon as this one
    # is done, with the log it covers already dropped.
    assert bound_log(limits.raft_log_bytes_hard_max + 1, leader=False, match={},
                     snapshotting=True) == 0


def test_a_leader_keeps_its_log_while_a_follower_lacks_entries_it_would_drop():
    # n3 has not got entry 100 yet: dropping it would leave n3 needing the
    # whole state sent, so the leader holds more log until n3 catches up...
    over = limits.raft_log_bytes_min + 1
    assert bound_log(over, leader=True, match={"n2": 100, "n3": 99}) == 0
    assert bound_log(over, leader=True, match={"n2": 100}, applied=101) == 0
    # ...but not past what the journal's 32-bit offsets can hold.
    past = limits.raft_log_bytes_hard_max + 1
    assert bound_log(past, leader=True, match={"n2": 100, "n3": 99}) == 1


def test_a_node_knows_its_last_snapshot_s_size(tmp_path):
    snapshot = tmp_path / "raft.snapshot"
    node = SimpleNamespace(_raftsched_snapshot_path=str(snapshot),
                           _raftsched_snapshot_size=0, _raftsched_snapshot_size_at=0.0)
    assert _StateMachine._raftsched_snapshot_bytes(node) == 0
    snapshot.write_bytes(b"s" * 12345)
    # Looked at once a second at most: the size read stands until then.
    assert _StateMachine._raftsched_snapshot_bytes(node) == 0
    node._raftsched_snapshot_size_at = 0.0   # the second has passed
    assert _StateMachine._raftsched_snapshot_bytes(node) == 12345


def test_under_the_floor_the_snapshot_file_is_not_looked_at():
    # _onTick asks every turn: an idle node must not stat a file each time.
    def stat_asked() -> int:
        raise AssertionError("the snapshot's size was read under raft_log_bytes_min")

    node = SimpleNamespace(
        _SyncObj__raftLog=_Held(limits.raft_log_bytes_min), _isLeader=lambda: False,
        forceLogCompaction=lambda: None, _raftsched_snapshot_bytes=stat_asked,
        _raftsched_snapshotting=lambda: False)
    _StateMachine._raftsched_bound_log(node)
