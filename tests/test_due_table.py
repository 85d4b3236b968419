"""The due table as LMDB keeps it: sorted duplicates under each shard.

Readers see the rows the in-memory store holds (the property test compares the
two stores over random writes and scans); each shard's newest entries fill
their pages; a state of schema 2 is rewritten when a node opens it."""

from __future__ import annotations

import os

import lmdb
import pytest
from hypothesis import given, settings, strategies as st

from raftsched import limits
from raftsched.core import codec, keys
from raftsched.core.apply import DUE, JOBS, Transition
from raftsched.core.tx import Tx, WriteRefused, check_key
from raftsched.storage import lmdb_store
from raftsched.storage.base import InvalidKey, digest, encode_value
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.memory_store import MemoryStore

MAP_BYTES = 64 * 1024 ** 2


def tx(*writes) -> Transition:
    return Transition(writes=tuple(writes), effects=(), result={})


def value(tenant: str = "default", priority: str | None = None) -> dict:
    return keys.due_value(tenant, priority)


# Ids chosen so that some are prefixes of others ("job_a", "job_ab"), where a
# layout that joins an id and a value could misorder them.
IDS = st.sampled_from(["job_a", "job_ab", "job_abc", "job_b", "run_a", "x", "job_\u00e9"])
KEY = st.builds(keys.due_key, st.integers(0, 3), st.integers(0, 4).map(lambda t: t * 255),
                IDS, st.sampled_from([keys.KIND_OCCURRENCE, keys.KIND_RETRY]))
WRITE = st.tuples(KEY, st.one_of(st.none(), st.builds(value, st.sampled_from(["a", "tn_b"]),
                                                      st.sampled_from([None, "high"]))))
BOUND = st.one_of(st.just(b""), st.binary(max_size=3), KEY,
                  st.builds(keys.due_upto_key, st.integers(0, 4), st.integers(0, 1100)))


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(WRITE, max_size=12), min_size=1, max_size=4),
       scans=st.lists(st.tuples(BOUND, st.one_of(st.none(), BOUND), st.booleans(),
                                st.one_of(st.none(), st.integers(1, 5))), max_size=6))
def test_lmdb_reads_the_due_rows_the_memory_store_holds(tmp_path_factory, batches, scans):
    memory = MemoryStore()
    lmdb_ = LmdbStore(str(tmp_path_factory.mktemp("due")), map_size=MAP_BYTES)
    try:
        for index, batch in enumerate(batches, 1):
            for store in (memory, lmdb_):
                store.commit(tx(*((DUE, k, v) for k, v in batch)), index)
        for start, stop, reverse, limit in scans:
            assert lmdb_.scan(DUE, start=start, stop=stop, reverse=reverse, limit=limit) == \
                memory.scan(DUE, start=start, stop=stop, reverse=reverse, limit=limit)
        for key, _ in (w for batch in batches for w in batch):
            assert lmdb_.get(DUE, key) == memory.get(DUE, key)
        assert lmdb_.raw_items() == memory.raw_items()
        assert digest(lmdb_) == digest(memory)
    finally:
        lmdb_.close()


def test_a_write_overwrites_and_a_delete_removes_the_one_entry_under_its_key(store):
    key = keys.due_key(7, 1000, "job_a")
    longer = keys.due_key(7, 1000, "job_ab")
    store.commit(tx((DUE, key, value("a")), (DUE, longer, value("b"))), 1)
    store.commit(tx((DUE, key, value("a", "high"))), 2)
    assert store.get(DUE, key) == value("a", "high")
    assert [k for k, _ in store.scan(DUE)] == [key, longer]
    store.commit(tx((DUE, key, None)), 3)
    assert store.get(DUE, key) is None and store.get(DUE, longer) == value("b")
    assert store.scan(DUE) == [(longer, value("b"))]


def test_the_view_apply_reads_sees_the_due_table_as_scans_do(tmp_path):
    store = LmdbStore(str(tmp_path / "db"), map_size=MAP_BYTES)
    key = keys.due_key(2, 5000, "job_1")
    store.commit(tx((DUE, key, value())), 1)
    seen = store.apply_commit(2, lambda view: ("t", tx((DUE, key, None)))
                              if view.get(DUE, key) == value() else ("t", tx()))
    assert seen is not None and store.get(DUE, key) is None
    store.close()


@pytest.mark.parametrize("key", [
    keys.due_key(1, 5, "job\x00a"),                     # a NUL in the id
    keys.due_key(1, 5, ""),                             # no id
    keys.due_key(1, 5, "j" * (limits.due_key_bytes_max - keys.DUE_HEAD_BYTES + 1)),
])
def test_a_due_key_the_layout_cannot_hold_is_refused_by_both_stores_and_by_apply(store, key):
    store.commit(tx((DUE, keys.due_key(1, 5, "job_1"), value())), 1)
    with pytest.raises(InvalidKey):
        store.commit(tx((DUE, keys.due_key(1, 6, "job_2"), value()), (DUE, key, value())), 2)
    assert store.applied_index() == 1 and store.get(DUE, keys.due_key(1, 6, "job_2")) is None
    assert store.get(DUE, key) is None
    with pytest.raises(WriteRefused):
        check_key(DUE, key)


def test_the_longest_due_key_and_value_a_command_can_make_are_stored(store):
    key = keys.due_key(65_535, 2 ** 63, "r" * limits.run_id_bytes_max, keys.KIND_RETRY)
    longest = value("t" * limits.tenant_bytes_max, "normal")
    assert len(key) == limits.due_key_bytes_max
    store.commit(tx((DUE, key, longest)), 1)
    assert store.get(DUE, key) == longest
    assert store.scan(DUE, start=keys.shard_prefix(65_535)) == [(key, longest)]


def test_a_value_too_large_for_the_layout_fails_the_whole_commit(store):
    key = keys.due_key(1, 5, "job_1")
    big = {"v": 1, "tn": "t" * (limits.lmdb_key_bytes_max - len(key))}
    assert len(key) - 1 + len(encode_value(DUE, big, key)) > limits.lmdb_key_bytes_max
    with pytest.raises(InvalidKey):
        store.commit(tx((JOBS, b"job_1", {"v": 1}), (DUE, key, big)), 1)
    assert store.applied_index() == 0 and store.get(JOBS, b"job_1") is None


def test_apply_refuses_a_write_under_a_due_key_the_stores_cannot_hold():
    """Ids with NUL are refused at the edge and by the commands' shapes; were
    one to get through, the write is refused in apply (the whole command is),
    not raised on in a store's commit."""
    t = Tx(MemoryStore())
    with pytest.raises(WriteRefused):
        t.put(DUE, keys.due_key(0, 1, "a\x00b"), value())
    t.put(DUE, keys.due_key(0, 1, "ab"), value())


def _pages(store: LmdbStore) -> int:
    with store._begin() as txn:
        stat = txn.stat(store._dbs[DUE])
    return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]


def test_each_shards_newest_entries_fill_their_pages(tmp_path):
    """Entries added at the end of each of 64 shards, as one-offs created in
    id order are: the layout keeps the pages nearly full, where one table
    keyed by (shard, time, id) leaves them about half full."""
    store = LmdbStore(str(tmp_path / "db"), map_size=MAP_BYTES)
    n, row = 100_000, None
    for start in range(0, n, 1000):
        writes = []
        for i in range(start, start + 1000):
            job = f"job_{i:020x}"
            key = keys.due_key(keys.shard_of(job, 64), 1_796_490_905_340, job)
            writes.append((DUE, key, value()))
            row = len(key) - 1 + len(encode_value(DUE, value(), key))
        store.commit(tx(*writes), start // 1000 + 1)
    # A duplicate's node: an 8-byte header, the data and a 2-byte pointer.
    fill = n * (row + 8 + 2) / (_pages(store) * 4096)
    assert fill > 0.8, fill
    store.close()


def _schema_2_state(path: str, rows: list[tuple[bytes, bytes]], applied: int) -> None:
    """A data folder as the release before schema 3 left it: the due table a
    plain LMDB table named "due"."""
    env = lmdb.open(path, map_size=MAP_BYTES, max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        due = env.open_db(b"due", txn=txn)
        jobs = env.open_db(b"jobs", txn=txn)
        txn.put(b"schema_version", keys.u64(2), db=meta)
        txn.put(b"applied_index", keys.u64(applied), db=meta)
        for key, raw in rows:
            txn.put(key, raw, db=due)
        txn.put(b"job_1", codec.pack({"v": 1, "n": 1}), db=jobs)
    env.close()


def _due_rows(n: int) -> list[tuple[bytes, bytes]]:
    rows = []
    for i in range(n):
        key = keys.due_key(i % 5, 1000 + i, f"job_{i}")
        rows.append((key, encode_value(DUE, value(f"t{i % 3}"), key)))
    return sorted(rows)


def test_a_state_of_schema_2_is_rewritten_when_opened(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(limits, "schema_migrate_txn_entries", 7)   # several transactions
    rows = _due_rows(50)
    path = str(tmp_path / "db")
    _schema_2_state(path, rows, applied=41)
    expected = MemoryStore()
    expected.replace_all(41, [(DUE, k, r) for k, r in rows] +
                         [(JOBS, b"job_1", codec.pack({"v": 1, "n": 1}))])
    with caplog.at_level("INFO", logger="raftsched.storage"):
        store = LmdbStore(path, map_size=MAP_BYTES)
    assert "rewritten as schema 3 (50 due entries)" in caplog.text
    assert store.applied_index() == 41
    assert digest(store) == digest(expected)
    assert store.scan(DUE, start=keys.shard_prefix(2)) == expected.scan(
        DUE, start=keys.shard_prefix(2))
    store.close()
    env = lmdb.open(path, map_size=MAP_BYTES, max_dbs=32, subdir=True)
    with env.begin() as txn:
        names = {bytes(k) for k, _ in txn.cursor()}
        schema = txn.get(b"schema_version", db=env.open_db(b"meta", txn=txn))
    env.close()
    assert b"due" not in names and keys.from_u64(schema) == 3
    reopened = LmdbStore(path, map_size=MAP_BYTES)   # nothing left to rewrite
    assert digest(reopened) == digest(expected)
    reopened.close()


def test_a_rewrite_cut_short_is_made_again_from_the_start(tmp_path):
    """A crash during the rewrite leaves schema 2, the old table whole and a
    partial copy: the next open clears the copy and makes it again."""
    rows = _due_rows(20)
    path = str(tmp_path / "db")
    _schema_2_state(path, rows, applied=9)
    env = lmdb.open(path, map_size=MAP_BYTES, max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        partial = env.open_db(lmdb_store._DUE_DB.encode(), txn=txn, dupsort=True)
        stale = keys.due_key(4, 1, "job_gone")
        txn.put(stale[:2], stale[2:] + b"\0" + encode_value(DUE, value(), stale), db=partial)
        key, raw = rows[0]
        txn.put(key[:2], key[2:] + b"\0" + raw, db=partial)
    env.close()
    store = LmdbStore(path, map_size=MAP_BYTES)
    assert [(k, encode_value(DUE, v, k)) for k, v in store.scan(DUE)] == rows
    store.close()


def test_a_snapshot_image_of_schema_2_is_installed_and_rewritten(tmp_path):
    rows = _due_rows(30)
    source = str(tmp_path / "old")
    _schema_2_state(source, rows, applied=77)
    image = str(tmp_path / "image")
    env = lmdb.open(source, map_size=MAP_BYTES, max_dbs=8, subdir=True)
    with open(image, "wb") as fh:
        env.copyfd(fh.fileno(), compact=True)
    env.close()
    target = LmdbStore(str(tmp_path / "new"), map_size=MAP_BYTES)
    target.commit(tx((DUE, keys.due_key(0, 1, "job_old"), value())), 3)
    assert target.install_image(image, 0, os.path.getsize(image)) == 77
    assert [(k, encode_value(DUE, v, k)) for k, v in target.scan(DUE)] == rows
    target.close()
