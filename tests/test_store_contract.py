"""Both stores keep one contract: atomic commits, LMDB's key rules, ordered scans, restart."""

from __future__ import annotations

import pytest

from raftsched import limits
from raftsched.core.apply import DUE, JOBS, RUNS, Transition
from raftsched.core import keys
from raftsched.core.tx import Tx, WriteRefused
from raftsched.errors import InvariantBroken
from raftsched.storage.base import InvalidKey, digest, due_until
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.memory_store import MemoryStore


def tx(*writes) -> Transition:
    return Transition(writes=tuple(writes), effects=(), result={})


def test_commit_persists_writes_and_the_index_together(store):
    store.commit(tx((JOBS, b"job_1", {"v": 1, "n": 1})), 5)
    assert store.applied_index() == 5
    assert store.get(JOBS, b"job_1") == {"v": 1, "n": 1}
    store.commit(tx((JOBS, b"job_1", None)), 6)
    assert store.get(JOBS, b"job_1") is None
    with pytest.raises(InvariantBroken):
        store.commit(tx((JOBS, b"job_2", {"v": 1})), 6)
    assert store.get(JOBS, b"job_2") is None


def test_apply_commit_skips_an_applied_index_only_when_asked(store):
    seen = []

    def apply(view):
        before = view.get(JOBS, b"job_1")
        seen.append(before)
        return "tag", tx((JOBS, b"job_1", {"v": 1, "n": 1 + (before or {"n": 0})["n"]}))
    assert store.apply_commit(3, apply, skip_applied=True)[0] == "tag"
    assert (store.applied_index(), store.get(JOBS, b"job_1")) == (3, {"v": 1, "n": 1})
    # A replay of an applied index: apply is not called, nothing is written.
    assert store.apply_commit(3, apply, skip_applied=True) is None
    assert store.apply_commit(2, apply, skip_applied=True) is None
    assert seen == [None]
    with pytest.raises(InvariantBroken):
        store.apply_commit(3, apply)
    assert store.apply_commit(4, apply, skip_applied=True)[0] == "tag"
    assert (store.applied_index(), store.get(JOBS, b"job_1")) == (4, {"v": 1, "n": 2})


def test_records_decode_as_msgpacks_unpacker_decodes_them():
    from raftsched.core import codec
    values = [{"v": 1, "a": [1, 2.5, None, True, b"xy", -5, 2 ** 64 - 1, -2 ** 63],
               "nested": {"m": {}, "l": [], "s": "é\u2028"}, 7: "int key"}, [], 0.1, "s"]
    for value in values:
        raw = codec.pack(value)
        assert codec.unpack_record(raw) == codec.unpack(raw) == value
        assert type(codec.unpack_record(raw)) is type(value)


def test_who_holds_a_run_reads_as_its_record_says(store):
    run_id = keys.run_id("job_0123456789abcdef0123", 5)
    run = {"v": 1, "id": run_id, "job_id": "job_0123456789abcdef0123", "tenant": "t",
           "scheduled_ms": 5, "attempt": 2, "execution_id": "exe_x", "state": "running",
           "node": "n1", "queue": None, "trigger": "schedule", "token": 2, "created_ms": 6,
           "queued_ms": 6, "started_ms": 7, "finished_ms": None, "holder": "n2",
           "lease_ms": None, "retry_due_ms": None, "http_status": None, "exit_code": None,
           "error": None, "reason": None, "attempts": [], "alert": None,
           "priority": "normal", "shard": 3}
    store.commit(tx((RUNS, run_id.encode(), run), (RUNS, b"run_map", {"state": "failed"})), 1)
    assert store.run_hold(run_id) == ("running", 2, "n2", 2)
    assert store.run_hold("run_map") == ("failed", None, None, None)   # a map form: read whole
    assert store.run_hold("run_gone") is None and store.run_hold("") is None
    store.commit(tx((RUNS, run_id.encode(), {**run, "state": "succeeded", "holder": None})), 2)
    assert store.run_hold(run_id) == ("succeeded", 2, None, 2)


def test_what_a_call_reads_of_a_job_is_what_get_shows(store):
    from raftsched.core import jobspec
    from raftsched.core.tx import JOB_STATE
    job_id = "job_0123456789abcdef0123"
    spec = jobspec.validate_create({"run_at": "2030-01-01T00:00:00Z", "target": {
        "type": "http", "url": "http://127.0.0.1:9/x", "timeout_s": 5}})["spec"]
    job = {"v": 1, "id": job_id, "tenant": "t", "spec": spec, "status": "active",
           "version": 1, "shard": 3, "next_ms": spec["schedule"]["run_at_ms"], "created_ms": 1,
           "updated_ms": 1, "idempotency_key": None, "last_run_id": None}
    store.commit(tx((JOBS, job_id.encode(), job)), 1)
    view = {"id": job_id, "tenant": "t", "status": "active", "spec": spec}
    assert store.job_to_call(job_id) == view
    state = {"v": 1, "next_ms": None, "active": [], "last_run_id": keys.run_id(job_id, 5),
             "runs_count": 1, "status": "completed", "updated_ms": 9}
    store.commit(tx((JOB_STATE, job_id.encode(), state)), 2)
    assert store.job_to_call(job_id) == {**view, "status": "completed"}
    assert {k: store.get(JOBS, job_id.encode())[k] for k in view} == \
        {**view, "status": "completed"}
    assert store.job_to_call("job_gone") is None and store.job_to_call("") is None


def test_scans_are_ordered_bounded_and_reversible(store):
    writes = [(DUE, keys.due_key(s, ms, f"job_{ms}"), {"v": 1})
              for s in (1, 2) for ms in (300, 100, 200)]
    store.commit(tx(*writes), 1)
    assert due_until(store, 1, 200, 10) == [(100, "job_100"), (200, "job_200")]
    assert due_until(store, 2, 99, 10) == []
    first = store.scan(DUE, start=keys.shard_prefix(2), limit=1)
    assert keys.parse_due_key(first[0][0])[:2] == (2, 100)
    assert store.scan(DUE, start=keys.shard_prefix(3)) == []
    rows = store.scan(DUE, start=keys.shard_prefix(1), stop=keys.shard_prefix(2), reverse=True)
    assert [keys.parse_due_key(k)[1] for k, _ in rows] == [300, 200, 100]
    assert len(store.scan(DUE, limit=4)) == 4


@pytest.mark.parametrize("bad_key", [b"", b"k" * 512, "job_1"])
def test_a_key_lmdb_cannot_hold_fails_the_whole_commit(store, bad_key):
    store.commit(tx((JOBS, b"job_0", {"v": 1})), 1)
    with pytest.raises(InvalidKey):
        store.commit(tx((JOBS, b"job_1", {"v": 1}), (JOBS, bad_key, {"v": 1})), 2)
    with pytest.raises(InvalidKey):
        store.commit(tx((JOBS, b"job_0", None), (JOBS, bad_key, None)), 2)
    assert store.applied_index() == 1
    assert store.get(JOBS, b"job_1") is None
    assert store.get(JOBS, b"job_0") == {"v": 1}
    with pytest.raises(InvalidKey):
        store.replace_all(5, [(JOBS, b"job_9", b"\x80"), (JOBS, bad_key, b"\x80")])
    assert store.applied_index() == 1


@pytest.mark.parametrize("table, bad_key", [(JOBS, b""), (JOBS, b"k" * 512), (JOBS, "job_1"),
                                            (DUE, keys.due_key(1, 5, "a\x00b"))])
def test_a_transition_apply_makes_holds_only_keys_the_stores_take(store, table, bad_key):
    """A store does not check again the keys of a transition Tx made
    (keys_checked): Tx refuses, as each write is made, every key the store's
    own check would."""
    with pytest.raises(InvalidKey):
        store.commit(tx((table, bad_key, None)), 1)
    made = Tx(MemoryStore())
    for write in (lambda: made.put(table, bad_key, {"v": 1}),
                  lambda: made.delete(table, bad_key)):
        with pytest.raises(WriteRefused):
            write()
    made.put(JOBS, b"job_1", {"v": 1})
    transition = made.transition({"ok": True})
    assert transition.keys_checked
    store.commit(transition, 1)
    assert store.get(JOBS, b"job_1") == {"v": 1}
    assert not tx((JOBS, b"job_2", {"v": 1})).keys_checked   # made otherwise: the store checks


def test_keys_up_to_lmdbs_limit_are_stored_and_longer_ones_are_never_found(store):
    longest = b"k" * limits.lmdb_key_bytes_max
    store.commit(tx((JOBS, longest, {"v": 1})), 1)
    assert store.get(JOBS, longest) == {"v": 1}
    assert store.get(JOBS, longest + b"k") is None
    assert store.get(JOBS, b"") is None
    store.commit(tx((JOBS, longest, None)), 2)
    assert store.get(JOBS, longest) is None


def test_replace_all_installs_a_snapshot(store):
    store.commit(tx((JOBS, b"job_old", {"v": 1})), 3)
    source = MemoryStore()
    source.commit(tx((JOBS, b"job_new", {"v": 1, "x": 2})), 9)
    index, items = source.raw_items()
    store.replace_all(index, items)
    assert store.applied_index() == 9
    assert store.get(JOBS, b"job_old") is None
    assert digest(store) == digest(source)


def test_lmdb_state_survives_reopen(tmp_path):
    path = str(tmp_path / "db")
    first = LmdbStore(path, map_size=64 * 1024 ** 2)
    first.commit(tx((JOBS, b"job_1", {"v": 1})), 42)
    before = digest(first)
    first.close()
    second = LmdbStore(path, map_size=64 * 1024 ** 2)
    assert second.applied_index() == 42
    assert digest(second) == before
    second.close()


def _job(job_id: str, **members) -> dict:
    """A job record as apply writes one: a one-off due in 2030, never run."""
    from raftsched.core import jobspec
    spec = jobspec.validate_create({"run_at": "2030-01-01T00:00:00Z",
                                    "target": {"type": "http", "url": "https://h.example/x"}}
                                   )["spec"]
    return {"v": 1, "id": job_id, "tenant": "default", "spec": spec, "status": "active",
            "version": 1, "shard": 3, "next_ms": spec["schedule"]["run_at_ms"],
            "created_ms": 1_796_000_000_000, "updated_ms": 1_796_000_000_000,
            "idempotency_key": None, "last_run_id": None, **members}


def test_a_scan_for_the_purger_skips_pending_jobs_and_reads_every_other(store):
    """scan_jobs_with_history reads as None exactly the active jobs that have
    never had a run, and every other job as scan reads it."""
    from raftsched.core.tx import JOB_STATE
    store.commit(tx(
        (JOBS, b"job_a", _job("job_a")),                                   # pending
        (JOBS, b"job_b", _job("job_b", runs_count=2, active=[])),          # history in its record
        (JOBS, b"job_c", _job("job_c")),                                   # history in a state record
        (JOB_STATE, b"job_c", {"v": 1, "runs_count": 1, "status": "active", "active": []}),
        (JOBS, b"job_d", _job("job_d", status="completed")),               # retired
        (JOBS, b"job_e", _job("job_e", status="paused")),
        (JOBS, b"job_f", _job("job_f", runs_count=0)),                     # a count of 0: read
        (JOBS, b"job_g", {"v": 1, "id": "job_g", "odd": True}),            # no positional form
    ), 1)
    rows = store.scan_jobs_with_history(limit=100)
    assert [k for k, _ in rows] == [k for k, _ in store.scan(JOBS)]
    assert [k for k, job in rows if job is None] == [b"job_a"]
    assert {k: job for k, job in rows if job is not None} == \
        {k: job for k, job in store.scan(JOBS) if k != b"job_a"}
    assert [k for k, _ in store.scan_jobs_with_history(start=b"job_b", limit=2)] == \
        [b"job_b", b"job_c"]


def test_stored_forms_and_presence_read_alike_in_both_stores(store):
    """pending_job_stored, a view's get_stored and has (what apply's fires
    and finishes read instead of whole records) agree with get."""
    from raftsched.core import codec, compact
    from raftsched.core.tx import JOB_STATE
    due = keys.due_key(3, 1_000, "job_a")
    store.commit(tx(
        (JOBS, b"job_a", _job("job_a")),                                   # pending
        (JOBS, b"job_c", _job("job_c")),
        (JOB_STATE, b"job_c", {"v": 1, "runs_count": 1, "status": "active", "active": []}),
        (DUE, due, {"v": 1, "tn": "t"}),
    ), 1)
    pending = store.pending_job_stored(b"job_a")
    assert pending == codec.unpack_record(codec.pack(compact.compact(JOBS, _job("job_a"),
                                                                     b"job_a")))
    assert compact.expand(JOBS, pending, b"job_a") == store.get(JOBS, b"job_a")
    assert store.pending_job_stored(b"job_c") is None       # its state is a record of its own
    assert store.pending_job_stored(b"job_x") is None and store.pending_job_stored(b"") is None

    def view(reader):
        assert reader.get_stored(JOBS, b"job_a") == pending
        assert reader.get_stored(JOBS, b"job_x") is None
        seen = {
                "has": [reader.has(t, k) for t, k in ((JOBS, b"job_a"), (DUE, due),
                                                      (JOB_STATE, b"job_c"), (JOBS, b"job_x"),
                                                      (DUE, keys.due_key(3, 1_001, "job_a")),
                                                      (JOBS, b""))]}
        assert seen["has"] == [reader.get(t, k) is not None for t, k in (
            (JOBS, b"job_a"), (DUE, due), (JOB_STATE, b"job_c"), (JOBS, b"job_x"),
            (DUE, keys.due_key(3, 1_001, "job_a")), (JOBS, b""))]
        return "tag", tx((JOBS, b"job_z", {"v": 1, "seen": seen["has"]}))
    store.apply_commit(2, view)
    assert store.get(JOBS, b"job_z")["seen"] == [True, True, True, False, False, False]
