"""The entries one Raft tick applies share one LMDB transaction: nothing of
them is readable, acted on or answered before it commits."""

from __future__ import annotations

import threading

import pytest

from raftsched import limits
from raftsched.core import commands
from raftsched.core.apply import JOBS, Transition, apply_entry
from raftsched.replication import raft
from raftsched.replication.raft import _StateMachine
from raftsched.runtime.apply_bridge import ApplyBridge
from raftsched.runtime.effects import Effects
from raftsched.storage.lmdb_store import LmdbStore


@pytest.fixture
def store(tmp_path):
    s = LmdbStore(str(tmp_path / "db"), map_size=64 * 1024 ** 2)
    yield s
    s.close()


def put_job(n: int):
    """apply for LmdbStore.apply_commit: writes one job record."""
    def apply(view):
        return "test", Transition(writes=((JOBS, f"job_{n}".encode(), {"v": 1, "n": n}),),
                                  effects=(), result={"ok": True})
    return apply


def read_elsewhere(store: LmdbStore, key: bytes) -> tuple[int, object]:
    """(applied_index, the record under `key`) as another thread reads them."""
    seen: list = []
    thread = threading.Thread(target=lambda: seen.append((store.applied_index(),
                                                          store.get(JOBS, key))))
    thread.start()
    thread.join()
    return seen[0]


def test_entries_of_a_batch_are_read_by_others_only_once_it_is_committed(store):
    store.apply_commit(1, put_job(1))
    store.begin_batch()
    store.apply_commit(2, put_job(2))
    store.apply_commit(3, put_job(3))
    assert read_elsewhere(store, b"job_3") == (1, None)
    store.end_batch()
    assert read_elsewhere(store, b"job_3") == (3, {"v": 1, "n": 3})
    assert store.get(JOBS, b"job_2") == {"v": 1, "n": 2}
    store.apply_commit(4, put_job(4))   # after the batch: committed at once again
    assert read_elsewhere(store, b"job_4") == (4, {"v": 1, "n": 4})
    assert store.commits_total == 3   # entry 1, the batch of 2 and 3, entry 4
    store.begin_batch()
    store.end_batch()   # a tick that applied nothing commits nothing
    assert store.commits_total == 3


def test_an_entry_that_fails_in_a_batch_leaves_none_of_the_batch_committed(store):
    store.apply_commit(1, put_job(1))
    store.begin_batch()
    store.apply_commit(2, put_job(2))

    def fails(view):
        raise RuntimeError("apply broke")

    with pytest.raises(RuntimeError):
        store.apply_commit(3, fails)
    store.end_batch()   # nothing left to commit
    assert store.applied_index() == 1
    assert store.get(JOBS, b"job_2") is None
    store.apply_commit(2, put_job(2))   # the store goes on (a replay, after a restart)
    assert store.applied_index() == 2


def test_a_swap_waiting_for_a_batch_does_not_block_the_batch_reading(tmp_path):
    # A swap (a close, a snapshot install) waits for the batch; the batch's
    # own thread may still read meanwhile, or neither would go on.
    store = LmdbStore(str(tmp_path / "db"), map_size=64 * 1024 ** 2)
    store.begin_batch()
    store.apply_commit(1, put_job(1))
    closing = threading.Thread(target=store.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()   # it waits for the batch
    assert store.get(JOBS, b"job_0") is None
    store.end_batch()
    closing.join(5)
    assert not closing.is_alive()


class _Loop:
    """call_soon_threadsafe recorded, run when the test says."""

    def __init__(self) -> None:
        self.calls: list = []

    def call_soon_threadsafe(self, fn, *args) -> None:
        self.calls.append((fn, args))

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for fn, args in calls:
            fn(*args)


def bridge_over(store) -> tuple[ApplyBridge, list, _Loop]:
    effects = Effects()
    delivered: list = []
    for kind in _renew_effect_kinds():
        effects.subscribe(kind, delivered.append)
    bridge = ApplyBridge(store=store, node_id="n1", now_ms=lambda: 0, effects=effects)
    bridge.loop = _Loop()
    return bridge, delivered, bridge.loop


def _renew_effect_kinds() -> set[type]:
    from raftsched.storage.memory_store import MemoryStore
    _, transition = apply_entry(MemoryStore(), renew(1), 1)
    assert transition.effects, "a renewal has an effect to deliver"
    return {type(effect) for effect in transition.effects}


def renew(at_ms: int) -> bytes:
    return commands.encode(commands.renew(node="n1", at_ms=at_ms))


def test_the_bridge_delivers_a_batchs_effects_after_its_commit_in_order(store, monkeypatch):
    monkeypatch.setattr(limits, "apply_batch_max_s", 60.0)
    bridge, delivered, loop = bridge_over(store)
    bridge.begin_batch()
    bridge.on_apply(renew(1), 1)
    bridge.on_apply(renew(2), 2)
    loop.run()
    assert delivered == [] and store.applied_index() == 0
    bridge.end_batch()
    assert store.applied_index() == 2
    loop.run()
    assert [effect.at_ms for effect in delivered] == [1, 2]


def test_a_batch_is_committed_once_its_entries_took_apply_batch_max_s(store, monkeypatch):
    monkeypatch.setattr(limits, "apply_batch_max_s", 0.0)
    bridge, delivered, loop = bridge_over(store)
    bridge.begin_batch()
    bridge.on_apply(renew(1), 1)
    assert store.applied_index() == 1   # committed after the entry, as without a batch
    loop.run()
    assert [effect.at_ms for effect in delivered] == [1]
    bridge.on_apply(renew(2), 2)
    assert store.applied_index() == 2
    bridge.end_batch()
    loop.run()
    assert [effect.at_ms for effect in delivered] == [1, 2]


def test_a_digest_entry_in_a_batch_is_taken_of_the_state_committed_at_it(store, monkeypatch):
    monkeypatch.setattr(limits, "apply_batch_max_s", 60.0)
    bridge, _, _ = bridge_over(store)
    bridge.start_digest_thread()   # hashes the pinned state, and lets go of it
    bridge.begin_batch()
    bridge.on_apply(renew(1), 1)
    result = bridge.on_apply(commands.encode(commands.check_digest(node="n1", at_ms=2)), 2)
    assert result["index"] == 2
    assert store.applied_index() == 2   # the batch was committed for the digest's pin
    bridge.on_apply(renew(3), 3)
    assert store.applied_index() == 2
    bridge.end_batch()
    assert store.applied_index() == 3


# --- results reach their proposers once committed --------------------------------------

def test_a_result_is_settled_once_its_entry_is_committed(store, monkeypatch):
    monkeypatch.setattr(limits, "apply_batch_max_s", 60.0)
    bridge, _, _ = bridge_over(store)
    settled: list[tuple[int, int]] = []   # (entry, applied_index readable then)

    def apply_and_answer(index: int) -> None:   # as pysyncobj does for a proposer
        bridge.on_apply(renew(index), index)
        bridge.after_commit(lambda: settled.append((index, read_elsewhere(store, b"-")[0])))

    bridge.begin_batch()
    apply_and_answer(1)
    apply_and_answer(2)
    assert settled == []
    bridge.end_batch()
    assert settled == [(1, 2), (2, 2)]
    apply_and_answer(3)   # outside a batch: committed, so answered at once
    assert settled[-1] == (3, 3)


def test_results_are_settled_at_each_commit_of_a_long_tick(store, monkeypatch):
    monkeypatch.setattr(limits, "apply_batch_max_s", 0.0)
    bridge, _, _ = bridge_over(store)
    settled: list[int] = []
    bridge.begin_batch()
    bridge.on_apply(renew(1), 1)   # took its batch's time: committed after it
    bridge.after_commit(lambda: settled.append(1))
    assert settled == [1]
    bridge.end_batch()


def test_the_raft_thread_brackets_a_ticks_entries_with_the_batch(monkeypatch):
    order: list[str] = []
    machine = object.__new__(_StateMachine)
    machine._SyncObj__raftCommitIndex = 3
    machine._SyncObj__raftLastApplied = 0
    machine._raftsched_commit_index = 0
    machine._raftsched_apply_batch = (lambda: order.append("begin"),
                                      lambda: order.append("end"))
    monkeypatch.setattr(_StateMachine, "_isLeader", lambda self: False)

    def apply_one(self) -> bool:   # pysyncobj's: one entry at a time, as the override shows it
        self._SyncObj__raftLastApplied += 1
        order.append(f"apply {self._SyncObj__raftLastApplied}")
        return False

    monkeypatch.setattr(raft.SyncObj, "_SyncObj__applyLogEntries", apply_one)
    machine._SyncObj__applyLogEntries()
    assert order == ["begin", "apply 1", "apply 2", "apply 3", "end"]
    order.clear()
    machine._SyncObj__applyLogEntries()   # nothing to apply: no batch
    assert order == []
