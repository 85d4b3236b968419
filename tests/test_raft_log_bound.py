"""The Raft journal counts the bytes it holds in memory, through adds, truncations and snapshots, and a node snapshots early past the byte bound, a leader only while every follower has the entries it would drop."""

from types import SimpleNamespace

from pysyncobj.journal import FileJournal

from raftsched import limits
from raftsched.replication import raft
from raftsched.replication.raft import _StateMachine, _TrackedJournal


def test_the_journal_counts_the_bytes_it_holds(tmp_path):
    journal = FileJournal(str(tmp_path / "journal"))
    journal.__class__ = _TrackedJournal
    for idx in range(1, 11):
        journal.add(b"x" * (100 * idx), idx, 1)
    assert journal.held_bytes() == sum(100 * i for i in range(1, 11))
    journal.deleteEntriesTo(5)          # a snapshot drops the first five
    assert journal.held_bytes() == sum(100 * i for i in range(6, 11))
    journal.deleteEntriesFrom(3)        # a truncation keeps the first three left
    assert journal.held_bytes() == 600 + 700 + 800
    journal.clear()
    assert journal.held_bytes() == 0
    journal._destroy()


def test_a_snapshot_s_compaction_hands_the_freed_memory_back(tmp_path, monkeypatch):
    released = []
    monkeypatch.setattr(raft, "release_freed_memory", lambda: released.append(True))
    journal = FileJournal(str(tmp_path / "journal"))
    journal.__class__ = _TrackedJournal
    for idx in range(1, 5):
        journal.add(b"x" * 1000, idx, 1)
    journal.deleteEntriesFrom(3)        # a truncation (keeps three): no trim
    assert released == []
    journal.deleteEntriesTo(2)          # a snapshot's compaction
    assert released == [True]
    assert journal.held_bytes() == 1000
    journal._destroy()


def test_releasing_freed_memory_is_glibc_s_trim_or_nothing():
    # On glibc (this project's images and CI) the trim is there; elsewhere the
    # call answers False and does nothing.
    assert raft.release_freed_memory() is (raft._MALLOC_TRIM is not None)


class _Held(_TrackedJournal):
    """A journal that says how many bytes it holds, nothing else."""

    def __init__(self, held_bytes: int) -> None:   # no file: only held_bytes is asked
        self._held = held_bytes

    def held_bytes(self) -> int:
        return self._held


def bound_log(held_bytes: int, leader: bool, match: dict[str, int], applied: int = 100) -> int:
    """How many snapshots _raftsched_bound_log asks for, on a stand-in node."""
    asked = []
    node = SimpleNamespace(
        _SyncObj__raftLog=_Held(held_bytes), _isLeader=lambda: leader,
        _SyncObj__raftLastApplied=applied, _SyncObj__raftMatchIndex=match,
        _SyncObj__otherNodes=list(match), forceLogCompaction=lambda: asked.append(1))
    _StateMachine._raftsched_bound_log(node)
    return len(asked)


def test_a_log_past_its_byte_bound_is_snapshotted_early():
    over = limits.raft_log_bytes_max + 1
    assert bound_log(limits.raft_log_bytes_max, leader=False, match={}) == 0
    assert bound_log(over, leader=False, match={}) == 1   # a follower drops what it applied
    assert bound_log(over, leader=True, match={"n2": 100, "n3": 120}) == 1


def test_a_leader_keeps_its_log_while_a_follower_lacks_entries_it_would_drop():
    # n3 has not got entry 100 yet: dropping it would leave n3 needing the
    # whole state sent, so the leader holds more log until n3 catches up.
    over = limits.raft_log_bytes_max + 1
    assert bound_log(over, leader=True, match={"n2": 100, "n3": 99}) == 0
    assert bound_log(over, leader=True, match={"n2": 100}, applied=101) == 0
