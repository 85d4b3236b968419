"""The Raft journal counts the bytes it holds in memory, through adds, truncations and snapshots."""

from pysyncobj.journal import FileJournal

from raftsched.replication.raft import _TrackedJournal


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
