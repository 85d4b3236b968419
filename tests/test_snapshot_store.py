"""Snapshot support in the stores: pinned reads stay consistent, an LMDB image installs under live readers."""

from __future__ import annotations

import os
import threading
import time

import pytest

from raftsched.core import keys
from raftsched.core.apply import DUE, JOBS, Transition
from raftsched.errors import InvariantBroken
from raftsched.storage.base import digest, digest_pinned
from raftsched.storage.lmdb_store import LmdbStore, SnapshotAborted
from raftsched.storage.memory_store import MemoryStore

MAP_BYTES = 64 * 1024 ** 2


def tx(*writes) -> Transition:
    return Transition(writes=tuple(writes), effects=(), result={})


def fill(store, index: int, count: int, tag: str) -> None:
    store.commit(tx(*((JOBS, f"job_{tag}_{i:05d}".encode(), {"v": 1, "i": i})
                      for i in range(count))), index)


def image_of(store: LmdbStore, path: str) -> tuple[int, int]:
    """Write the store's state as a snapshot image after a 3-byte prefix, as
    the snapshot file does after its header; return (offset, length)."""
    with open(path, "wb") as fh:
        fh.write(b"HDR")
        fh.flush()
        with store.pin() as pinned:
            pinned.copy_to(fh.fileno())
    return 3, os.path.getsize(path) - 3


def source_and_image(tmp_path, index: int, count: int) -> tuple[LmdbStore, int, int]:
    """A store `source` holding `count` records and its image in `snap`:
    (source, offset, length)."""
    source = LmdbStore(str(tmp_path / "source"), map_size=MAP_BYTES)
    fill(source, index, count, "new")
    return (source, *image_of(source, str(tmp_path / "snap")))


@pytest.mark.parametrize("kind", ["memory", "lmdb"])
def test_a_pinned_read_keeps_its_moment_while_commits_go_on(kind, tmp_path):
    store = MemoryStore() if kind == "memory" else LmdbStore(str(tmp_path / "db"),
                                                             map_size=MAP_BYTES)
    fill(store, 1, 100, "a")
    before = digest(store)
    with store.pin() as pinned:
        fill(store, 2, 100, "b")
        store.commit(tx((JOBS, b"job_a_00000", None)), 3)
        assert digest_pinned(pinned) == before
    assert digest(store)[0] == 3
    store.close()


def test_an_image_installs_while_other_threads_read(tmp_path):
    source, offset, length = source_and_image(tmp_path, 50, 2000)
    target = LmdbStore(str(tmp_path / "target"), map_size=MAP_BYTES)
    fill(target, 7, 10, "old")
    stop, errors, reads = threading.Event(), [], [0]

    def read() -> None:
        while not stop.is_set():
            try:
                target.get(JOBS, b"job_old_00001")
                target.scan(JOBS, limit=50)
                target.applied_index()
                reads[0] += 1
            except Exception as exc:   # a closed environment would show here
                errors.append(exc)
                return

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    try:
        for _ in range(5):
            assert target.install_image(str(tmp_path / "snap"), offset, length) == 50
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert errors == []
    assert reads[0] > 0
    assert digest(target) == digest(source)
    assert target.get(JOBS, b"job_old_00001") is None
    assert sorted(os.listdir(tmp_path)) == ["snap", "source", "target"]   # no staging left
    target.close()
    # The installed state is the one on disk.
    reopened = LmdbStore(str(tmp_path / "target"), map_size=MAP_BYTES)
    assert digest(reopened) == digest(source)
    reopened.close()
    source.close()


def test_a_truncated_image_is_refused_and_the_state_kept(tmp_path):
    source, offset, length = source_and_image(tmp_path, 5, 500)
    target = LmdbStore(str(tmp_path / "target"), map_size=MAP_BYTES)
    fill(target, 3, 10, "old")
    before = digest(target)
    with pytest.raises(InvariantBroken):
        target.install_image(str(tmp_path / "snap"), offset, length + 4096)
    # Cut inside the image: LMDB would map pages past the file's end (SIGBUS).
    with pytest.raises(InvariantBroken):
        target.install_image(str(tmp_path / "snap"), offset, length // 2)
    assert digest(target) == before
    source.close()
    target.close()


def test_an_install_aborts_a_pinned_read_still_iterating(tmp_path):
    source, offset, length = source_and_image(tmp_path, 9, 10)
    target = LmdbStore(str(tmp_path / "target"), map_size=MAP_BYTES)
    fill(target, 4, 5000, "old")
    target.commit(tx((DUE, keys.due_key(1, 0, "job_1"), {"v": 1})), 5)
    pinned = target.pin()
    items = pinned.items()
    next(items)
    outcome: list = []

    def finish() -> None:
        # Slowly: left alone, it would take over 5 s to read its 5000 records.
        try:
            outcome.append(sum(1 for _ in items if time.sleep(0.001) is None))
        except SnapshotAborted as exc:
            outcome.append(exc)
        finally:
            pinned.close()

    installer = threading.Thread(target=target.install_image,
                                 args=(str(tmp_path / "snap"), offset, length))
    installer.start()
    # The install waits for the pinned read, which gives up at its next check.
    finisher = threading.Thread(target=finish)
    finisher.start()
    installer.join(4)
    finisher.join(4)
    assert not installer.is_alive()
    assert target.applied_index() == 9
    assert len(outcome) == 1
    assert isinstance(outcome[0], SnapshotAborted)
    source.close()
    target.close()
