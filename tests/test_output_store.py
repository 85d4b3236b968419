"""The output store keeps output per attempt, counts bytes exactly, bounds size and age, reopens."""

from __future__ import annotations

import pytest

from raftsched import limits
from raftsched.core import codec
from raftsched.errors import InvariantBroken
from raftsched.storage.output_store import OutputStore

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def open_store(tmp_path):
    """Opens stores in tmp_path/output and closes them all at the end."""
    opened: list[OutputStore] = []

    def _open(**kwargs) -> OutputStore:
        kwargs.setdefault("map_size", 16 * 1024 ** 2)
        store = OutputStore(str(tmp_path / "output"), **kwargs)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


def output(text: str) -> dict:
    return {"stdout": text, "stderr": "", "truncated": {}, "exit_code": 0,
            "http_status": None, "holder": "n1"}


def packed_bytes(store: OutputStore, run_ids: list[str]) -> int:
    """The byte total recomputed from what get() returns (packing is deterministic)."""
    return sum(len(codec.pack(r)) for run in run_ids for r in store.get(run))


def test_put_get_round_trip_orders_attempts(open_store):
    store = open_store()
    # 256 sorts before 2 if the attempt were little-endian or text.
    for attempt in (3, 256, 1, 2):
        assert store.put("run_1", attempt, output(f"out {attempt}"), now_ms=1000 + attempt)
    got = store.get("run_1")
    assert [r["attempt"] for r in got] == [1, 2, 3, 256]
    assert got[0] == {"v": 1, "attempt": 1, "stored_ms": 1001, "tenant": "", **output("out 1")}
    assert store.stats() == {"records": 4, "bytes": packed_bytes(store, ["run_1"])}


def test_replacing_an_attempt_does_not_double_count_bytes(open_store):
    store = open_store()
    store.put("run_1", 1, output("x" * 5000), now_ms=1000)
    store.put("run_1", 1, output("short"), now_ms=2000)
    assert store.get("run_1") == [{"v": 1, "attempt": 1, "stored_ms": 2000, "tenant": "",
                                   **output("short")}]
    assert store.stats() == {"records": 1, "bytes": packed_bytes(store, ["run_1"])}


def test_replacing_an_attempt_moves_its_age_to_the_new_put(open_store):
    store = open_store(retention_s=1.0)
    store.put("run_1", 1, output("first"), now_ms=1000)
    store.put("run_1", 1, output("again"), now_ms=5000)
    # A by_time entry left over from the first put would expire the second.
    assert store.prune(now_ms=5500) == 0
    assert [r["stdout"] for r in store.get("run_1")] == ["again"]


def test_age_pruning_deletes_only_records_older_than_retention(open_store):
    store = open_store(retention_s=10.0)
    store.put("run_c", 1, output("old"), now_ms=0)
    store.put("run_b", 1, output("at the limit"), now_ms=5000)
    store.put("run_a", 1, output("new"), now_ms=10_000)
    assert store.prune(now_ms=15_000) == 1
    assert store.get("run_c") == []
    assert len(store.get("run_b")) == 1
    assert len(store.get("run_a")) == 1
    assert store.stats() == {"records": 2, "bytes": packed_bytes(store, ["run_a", "run_b"])}
    assert store.prune(now_ms=15_000) == 0


def test_size_bound_holds_after_every_put_and_evicts_oldest_first(open_store):
    record_bytes = len(codec.pack({"v": 1, "attempt": 1, "stored_ms": 0, **output("x" * 1000)}))
    bytes_max = 3 * record_bytes + record_bytes // 2
    store = open_store(bytes_max=bytes_max)
    # Run ids sort opposite to time, so evicting in by_run order would keep the wrong ones.
    runs = [f"run_{9 - i}" for i in range(10)]
    for i, run in enumerate(runs):
        assert store.put(run, 1, output("x" * 1000), now_ms=1000 + i)
        assert store.stats()["bytes"] <= bytes_max
        kept = [r for r in runs[: i + 1] if store.get(r)]
        assert kept == runs[max(0, i - 2): i + 1]
    assert store.stats() == {"records": 3, "bytes": packed_bytes(store, runs)}


def test_a_record_larger_than_the_bound_is_not_kept(open_store):
    store = open_store(bytes_max=500)
    assert not store.put("run_1", 1, output("x" * 1000), now_ms=1000)
    assert store.get("run_1") == []
    assert store.stats() == {"records": 0, "bytes": 0}


def test_prune_finishes_across_several_transactions(open_store, monkeypatch):
    monkeypatch.setattr(limits, "output_prune_txn_records_max", 2)
    store = open_store(retention_s=1.0)
    for i in range(5):
        store.put(f"run_{i}", 1, output("old"), now_ms=1000 + i)
    store.put("run_new", 1, output("new"), now_ms=DAY_MS)
    assert store.prune(now_ms=DAY_MS) == 5
    assert store.stats() == {"records": 1, "bytes": packed_bytes(store, ["run_new"])}


def test_get_of_an_unknown_run_is_empty(open_store):
    store = open_store()
    assert store.get("run_missing") == []
    store.put("run_1", 1, output("a"), now_ms=1000)
    assert store.get("run_0") == []
    assert store.get("run_2") == []


def test_reopening_keeps_records_and_the_byte_total(open_store):
    store = open_store()
    store.put("run_1", 1, output("a"), now_ms=1000)
    store.put("run_1", 2, output("b" * 3000), now_ms=2000)
    before = (store.get("run_1"), store.stats())
    store.close()
    reopened = open_store()
    assert (reopened.get("run_1"), reopened.stats()) == before
    assert before[1]["bytes"] > 0


def test_reopening_with_a_lower_bound_evicts_down_to_it(open_store):
    store = open_store()
    store.put("run_1", 1, output("a" * 2000), now_ms=1000)
    store.put("run_2", 1, output("b" * 2000), now_ms=2000)
    store.close()
    reopened = open_store(bytes_max=3000)
    assert reopened.get("run_1") == []
    assert len(reopened.get("run_2")) == 1
    assert reopened.stats()["bytes"] <= 3000


def test_runs_sharing_a_prefix_stay_apart(open_store):
    store = open_store()
    store.put("run_a", 1, output("a1"), now_ms=1000)
    store.put("run_ab", 1, output("ab1"), now_ms=1001)
    store.put("run_ab", 2, output("ab2"), now_ms=1002)
    assert [r["stdout"] for r in store.get("run_a")] == ["a1"]
    assert [r["stdout"] for r in store.get("run_ab")] == ["ab1", "ab2"]
    assert store.get("run_") == []


@pytest.mark.parametrize("run_id, attempt, record", [
    ("run\x00a", 1, {"stdout": ""}),      # NUL would end the key prefix early
    ("r" * 501, 1, {"stdout": ""}),       # over LMDB's key size
    ("run_1", 65_536, {"stdout": ""}),    # attempt is a u16 in the key
    ("run_1", 1, {"v": 2}),               # store-owned members
    ("run_1", 1, {"stored_ms": 0}),
])
def test_put_refuses_what_the_key_layout_cannot_hold(open_store, run_id, attempt, record):
    store = open_store()
    with pytest.raises(ValueError):
        store.put(run_id, attempt, record, now_ms=1000)
    assert store.stats() == {"records": 0, "bytes": 0}


def test_a_tenant_at_its_bound_loses_its_own_oldest_output_not_anothers(open_store):
    one = len(codec.pack({"v": 1, "attempt": 1, "stored_ms": 1000, "tenant": "a",
                          **output("x" * 1000)}))
    store = open_store(bytes_max=10 * one, tenant_bytes_max=3 * one)
    for i in range(3):
        assert store.put(f"run_b{i}", 1, output("y" * 1000), now_ms=1000 + i, tenant="b")
    for i in range(20):   # a worker of tenant a posting output after output
        assert store.put(f"run_a{i:02d}", 1, output("x" * 1000), now_ms=2000 + i, tenant="a")
    assert [i for i in range(20) if store.get(f"run_a{i:02d}")] == [17, 18, 19]
    assert all(store.get(f"run_b{i}") for i in range(3))   # b's output is untouched
    assert store.tenant_bytes("a") == 3 * one
    assert store.stats() == {"records": 6, "bytes": packed_bytes(
        store, [f"run_a{i:02d}" for i in range(20)] + [f"run_b{i}" for i in range(3)])}
    store.delete_runs(["run_a17", "run_a18", "run_a19"])
    assert store.tenant_bytes("a") == 0
    with store._env.begin() as txn:
        assert txn.stat(store._by_tenant)["entries"] == 3


def test_records_without_a_tenant_count_towards_the_store_only(open_store):
    # As an older build stored it: no tenant member, no by_tenant entry.
    record = codec.pack({"v": 1, "attempt": 1, "stored_ms": 5, **output("old")})
    new = codec.pack({"v": 1, "attempt": 1, "stored_ms": 10, "tenant": "a",
                      **output("z" * 9000)})
    store = open_store(bytes_max=len(record) + len(new) - 1)
    with store._env.begin(write=True) as txn:
        txn.put(b"run_old\x00\x00\x01", record, db=store._by_run)
        txn.put((5).to_bytes(8, "big") + b"run_old\x00\x00\x01", b"", db=store._by_time)
        txn.put(b"bytes_total", len(record).to_bytes(8, "big"), db=store._meta)
    assert store.put("run_new", 1, output("z" * 9000), now_ms=10, tenant="a")
    assert store.get("run_old") == []   # evicted, oldest first, by the store's bound
    assert store.tenant_bytes("a") == store.stats()["bytes"]


def test_a_dangling_time_entry_stops_pruning_loudly(open_store):
    # Only corruption gets here; the guard keeps prune from looping on it forever.
    store = open_store(retention_s=1.0)
    with store._env.begin(write=True) as txn:
        txn.put((0).to_bytes(8, "big") + b"run_gone\x00\x00\x01", b"", db=store._by_time)
    with pytest.raises(InvariantBroken):
        store.prune(now_ms=DAY_MS)
