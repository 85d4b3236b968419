"""A malformed or unstorable command is refused alike, writes only its index, kills no loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from raftsched.core import apply as apply_module
from raftsched.core import codec, commands
from raftsched.core.apply import GROUPS, IDEM, JOBS, apply, apply_entry
from raftsched.core.tx import ViewFailed
from raftsched.errors import CommandRefused
from raftsched.runtime.apply_bridge import ApplyBridge
from raftsched.runtime.effects import Effects
from raftsched.runtime.reporter import Reporter
from raftsched.runtime.supervise import Supervisor
from raftsched.runtime.trigger import TriggerLoop
from raftsched.storage.base import digest
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.memory_store import MemoryStore
from raftsched.testing.replica import Replica

SPEC = {"name": "j", "schedule": {"kind": "once", "run_at_ms": 10_000, "offset_min": 0},
        "target": {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST",
                   "headers": {}, "body": None, "timeout_s": 5.0},
        "retry": None, "concurrency": None, "metadata": {}}


def run_entry(store, data: bytes) -> dict:
    """Apply one log entry as a node does: decode, apply, commit (even a refusal)."""
    index = store.applied_index() + 1
    _, transition = apply_entry(store, data, index)
    store.commit(transition, index)
    return transition.result


def assert_refused_with_no_writes(store, data: bytes, error: str) -> dict:
    before_index, before = digest(store)
    result = run_entry(store, data)
    assert result["ok"] is False
    assert result["error"] == error
    assert digest(store) == (before_index + 1, before)   # only applied_index moved
    return result


# --- the requests that once stopped every node, at the apply level -------------------

def test_a_600_byte_idempotency_key_is_refused(store):
    command = commands.create_job(job_id="job_a1", tenant="default", spec=SPEC,
                                  idempotency_key="€" * 200, shard=1, next_ms=10_000, at_ms=1)
    result = assert_refused_with_no_writes(store, commands.encode(command), "invalid_command")
    assert result["field"] == "idempotency_key"
    # Without the decode check, Tx refuses the key itself and the job is not half-created.
    transition = apply(store, command, store.applied_index() + 1)
    assert transition.writes == ()
    assert transition.result["error"] == "refused"
    assert store.get(JOBS, b"job_a1") is None
    assert store.scan(IDEM) == []


def test_a_600_character_group_is_refused(store):
    run_entry(store, commands.encode(commands.publish(
        topic="t", key=None, message=1, execution_id="exe_1", job_id="job_a1", at_ms=1)))
    command = commands.commit_offset(topic="t", group="g" * 600, offset=1, at_ms=2)
    result = assert_refused_with_no_writes(store, commands.encode(command), "invalid_command")
    assert result["field"] == "group"
    assert apply(store, command, store.applied_index() + 1).result["error"] == "refused"
    assert store.scan(GROUPS) == []


def test_a_run_report_with_an_empty_run_id_is_refused(store):
    beat = commands.run_heartbeat(run_id="", holder="worker:w", attempt=1, at_ms=1, lease_ms=5)
    command = commands.run_updates(updates=[beat])
    result = assert_refused_with_no_writes(store, commands.encode(command), "invalid_command")
    assert result["field"] == "updates[0].run_id"
    # apply itself (over LMDB, whose get raises on an empty key) reads nothing there.
    assert apply(store, command, store.applied_index() + 1).result["accepted"] == [False]


def test_a_run_report_with_attempt_2_to_the_64_never_reaches_the_log(store):
    beat = {"run_id": "run_x", "event": "heartbeat", "holder": "worker:w", "attempt": 2 ** 64,
            "at_ms": 1, "lease_ms": 5}
    with pytest.raises(CommandRefused):
        commands.check_run_update(beat)
    built = commands.run_heartbeat(run_id="run_x", holder="worker:w", attempt=2 ** 64, at_ms=1,
                                   lease_ms=5)
    with pytest.raises(CommandRefused):
        commands.check(commands.run_updates(updates=[built]))
    transition = apply(store, commands.run_updates(updates=[built]), 1)
    assert transition.writes == ()
    assert transition.result["accepted"] == [False]


# --- apply refuses whole, and says why -----------------------------------------------

def test_an_exception_in_a_handler_is_refused_whole(monkeypatch):
    def broken(tx, cmd):
        tx.put(JOBS, b"job_half", {"v": 1})
        raise AssertionError("an invariant of this handler")
    monkeypatch.setitem(apply_module.HANDLERS, "renew", broken)
    store = MemoryStore()
    transition = apply(store, commands.renew(node="n1", at_ms=1), 1)
    assert transition.writes == ()
    assert transition.effects == ()
    assert transition.result["error"] == "apply_failed"
    assert "an invariant of this handler" in transition.result["detail"]
    assert "in broken" in transition.result["traceback"]


def test_a_failed_read_of_the_view_is_not_refused_but_raised():
    class FailingView:
        def get(self, table, key):
            raise OSError("disk gone")
    with pytest.raises(ViewFailed):
        apply(FailingView(), commands.delete_job(job_id="job_a1", at_ms=1), 1)


# --- the node: a refused entry is committed empty and logged once --------------------

def test_the_node_commits_a_refused_entry_empty_and_logs_it_once(caplog, monkeypatch):
    # The apply bridge over a store, with no node.
    store = MemoryStore()
    bridge = ApplyBridge(store=store, node_id="n1", now_ms=lambda: 0, effects=Effects())
    with caplog.at_level(logging.ERROR, logger="raftsched.node"):
        result = bridge.on_apply(b"\xc1", 1)
    assert result["error"] == "invalid_command"
    assert store.applied_index() == 1
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert bridge.on_apply(b"\xc1", 1) == {"ok": True, "replayed": True}

    monkeypatch.setitem(apply_module.HANDLERS, "renew", lambda tx, cmd: 1 / 0)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="raftsched.node"):
        result = bridge.on_apply(commands.encode(commands.renew(node="n1", at_ms=1)), 2)
    assert result["error"] == "apply_failed"
    assert store.applied_index() == 2
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL]
    assert "ZeroDivisionError" in caplog.records[0].getMessage()


# --- proposers read a refusal without dying ------------------------------------------

REFUSAL = {"ok": False, "error": "invalid_command", "detail": "updates[0]: test"}


async def test_the_reporter_resolves_a_refused_batch_false_and_goes_on():
    proposed = []

    async def propose(command):
        proposed.append(command)
        return REFUSAL if len(proposed) == 1 else {"ok": True, "accepted": [True]}
    reporter = Reporter(propose=propose, spawn=Supervisor("test").spawn)
    task = asyncio.ensure_future(reporter.run())
    try:
        beat = {"run_id": "run_x", "event": "heartbeat", "holder": "n1", "attempt": 1,
                "at_ms": 1, "lease_ms": 5}
        assert await asyncio.wait_for(reporter.send(beat), 5) is False
        assert await asyncio.wait_for(reporter.send(dict(beat, attempt=2 ** 64)), 5) is False
        assert len(proposed) == 1   # the malformed report never joined a batch
        assert await asyncio.wait_for(reporter.send(beat), 5) is True
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_trigger_counts_a_refused_fire_and_goes_on():
    async def propose_entry(data):
        return REFUSAL
    trigger = TriggerLoop(Replica().replicated(), arm_ahead_ms=0, propose_entry=propose_entry,
                          spawn=Supervisor("test").spawn, synced=lambda: True,
                          armed_room=lambda: 0)
    part = {"shard": 1, "token": 1, "upto_ms": 5, "items": [], "retries": []}
    await trigger._send(commands.fire_many(node="n1", at_ms=5, parts=[part, dict(part, shard=2)]))
    assert trigger.refused_fires_total == 1   # refused whole: one refusal, however many parts
    assert trigger.fired_total == 0


def test_refusals_are_the_same_bytes_on_every_replica(tmp_path):
    memory, lmdb = MemoryStore(), LmdbStore(str(tmp_path / "db"), map_size=32 * 1024 ** 2)
    try:
        entries = [b"\xc1", codec.pack({"v": 1, "t": "renew"}),
                   commands.encode(commands.commit_offset(topic="t", group="g" * 600, offset=0,
                                                          at_ms=1)),
                   commands.encode(commands.delete_job(job_id="job_a1", at_ms=1))]
        for data in entries:
            assert run_entry(memory, data) == run_entry(lmdb, data)
        assert digest(memory) == digest(lmdb) == (4, digest(MemoryStore())[1])
    finally:
        lmdb.close()
