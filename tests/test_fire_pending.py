"""A pending one-off fired from its record as stored (core/apply.py
_fire_pending_once) leaves every replica with what the fire from the whole
job leaves: two replicas take the same commands, one firing such jobs from
their stored record and one reading every job whole, and their stores,
results and effects are compared byte for byte after every command."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raftsched.core import apply as apply_mod
from raftsched.core import commands, cost, jobspec, keys, queries, runs
from raftsched.core.firing import PENDING_ONCE_SPEC, fire_item, pending_fire_item
from raftsched.core.apply import SHARDS as SHARDS_TABLE
from raftsched.testing.replica import Replica

SHARDS = 64
NODE = "n1"
CREATED_MS = 1_700_000_000_000
DUE_MS = CREATED_MS + 3_600_000
JOB_ID = "job_0123456789abcdef0123"


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()


class Pair:
    """Two replicas given the same commands: `fast` with `module.flag` on (a
    path that reads a stored record rather than the whole one), `whole` with
    it off. `taken` counts the calls of `module.function` that took the path
    (did not answer `declined`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module=apply_mod,
                 flag: str = "FIRE_PENDING_FROM_STORED", function: str = "_fire_pending_once",
                 declined: object = None) -> None:
        self.fast, self.whole = Replica(), Replica()
        self.taken = 0
        original = getattr(module, function)

        def counted(*args, **kwargs):
            answer = original(*args, **kwargs)
            self.taken += answer is not declined
            return answer

        monkeypatch.setattr(module, function, counted)
        self._monkeypatch, self._module, self._flag = monkeypatch, module, flag

    def run(self, command: commands.Command) -> dict:
        self._monkeypatch.setattr(self._module, self._flag, True)
        fast = self.fast.run(command)
        self._monkeypatch.setattr(self._module, self._flag, False)
        whole = self.whole.run(command)
        assert fast == whole
        assert self.fast.effects == self.whole.effects
        with self.fast.store.pin() as a, self.whole.store.pin() as b:
            assert list(a.items()) == list(b.items())
        return fast


def _create(pair: Pair, body: dict, stored: bool) -> None:
    spec = jobspec.validate_create(body, JOB_ID)["spec"]
    shard = keys.shard_of(JOB_ID, SHARDS)
    pair.run(commands.assign_shards(assignments=[(shard, NODE)], at_ms=CREATED_MS))
    if stored:
        item = commands.create_job_item(job_id=JOB_ID, spec=spec, idempotency_key=None,
                                        shard=shard, next_ms=DUE_MS)
        result = pair.run(commands.create_jobs(tenant="default", at_ms=CREATED_MS,
                                               items=[item], stored=True))
    else:
        result = pair.run(commands.create_job(job_id=JOB_ID, tenant="default", spec=spec,
                                              idempotency_key=None, shard=shard,
                                              next_ms=DUE_MS, at_ms=CREATED_MS))
    assert result["ok"], result


def _fire(pair: Pair, at_ms: int) -> dict:
    shard = keys.shard_of(JOB_ID, SHARDS)
    token = pair.fast.store.get(SHARDS_TABLE, keys.shard_key(shard))["token"]
    return pair.run(commands.fire(shard=shard, token=token, upto_ms=at_ms, node=NODE,
                                  at_ms=at_ms, items=[(JOB_ID, DUE_MS, None, [DUE_MS], False)]))


def _finish(pair: Pair, at_ms: int, **report) -> dict:
    run_id = keys.run_id(JOB_ID, DUE_MS)
    report = {"ok": True, "http_status": 200, "called_ms": max(at_ms - 5, DUE_MS), **report}
    return pair.run(commands.run_updates(updates=[commands.run_finish(
        run_id=run_id, holder=NODE, attempt=1, at_ms=at_ms, **report)]))


def _edit(pair: Pair, edit: str) -> None:
    at_ms = CREATED_MS + 1_000
    if edit == "pause":
        pair.run(commands.PauseJob(job_id=JOB_ID, at_ms=at_ms))
    elif edit == "pause_resume":
        pair.run(commands.PauseJob(job_id=JOB_ID, at_ms=at_ms))
        pair.run(commands.ResumeJob(job_id=JOB_ID, next_ms=DUE_MS, at_ms=at_ms + 1))
    elif edit == "delete":
        pair.run(commands.DeleteJob(job_id=JOB_ID, at_ms=at_ms))
    elif edit == "trigger":
        pair.run(commands.trigger_job(job_id=JOB_ID, scheduled_ms=at_ms, node=NODE,
                                      at_ms=at_ms))
    elif edit in ("move", "move_back"):
        job = pair.fast.job(JOB_ID)
        moved = dict(job["spec"], schedule={"kind": "once", "run_at_ms": DUE_MS + 60_000})
        pair.run(commands.UpdateJob(job_id=JOB_ID, spec=moved, expected_version=job["version"],
                                    next_ms=DUE_MS + 60_000, at_ms=at_ms))
        if edit == "move_back":
            job = pair.fast.job(JOB_ID)
            pair.run(commands.UpdateJob(job_id=JOB_ID, spec=dict(job["spec"], schedule={
                "kind": "once", "run_at_ms": DUE_MS}), expected_version=job["version"],
                next_ms=DUE_MS, at_ms=at_ms + 1))
    else:
        assert edit == "none", edit


HTTP = {"type": "http", "url": "http://127.0.0.1:9/hook"}

bodies = st.fixed_dictionaries(
    {"run_at": st.just(_iso(DUE_MS)),
     "target": st.sampled_from([
         HTTP, dict(HTTP, method="PUT", timeout_s=5, headers={"x-a": "1"}, body={"k": 1}),
         {"type": "publish", "topic": "orders", "message": {"k": 1}}])},
    optional={
        "name": st.sampled_from(["named", "another"]),
        "retry": st.sampled_from([{"max_attempts": 1}, {"max_attempts": 5, "base_s": 2}]),
        "labels": st.just({"team": "a"}),
        "metadata": st.just({"k": "v"}),
        "priority": st.sampled_from(["normal", "high", "low"]),
        "jitter_s": st.sampled_from([0, 5]),
        "misfire": st.sampled_from([{"policy": "skip", "misfire_tolerance_s": 1},
                                    {"policy": "fire_once"}]),
        "concurrency": st.sampled_from([{"policy": "allow"}, {"policy": "skip_if_running"},
                                        {"policy": "queue"}]),
    })


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, stored=st.booleans(),
       edit=st.sampled_from(["none", "none", "pause", "pause_resume", "delete", "trigger",
                             "move", "move_back"]),
       fire_at=st.sampled_from([DUE_MS - 20_000, DUE_MS - 1, DUE_MS, DUE_MS + 90_000]),
       again=st.booleans())
def test_a_fire_from_the_stored_record_writes_what_the_whole_read_writes(
        monkeypatch, body, stored, edit, fire_at, again):
    pair = Pair(monkeypatch)
    _run_through(pair, body, stored, edit, fire_at, again, trigger_item=True)
    event(f"fired from the stored record: {pair.taken}")


def _run_through(pair: Pair, body: dict, stored: bool, edit: str, fire_at: int, again: bool,
                 trigger_item: bool = False) -> None:
    """Create, edit, fire (twice if `again`) and finish the job on both replicas."""
    _create(pair, body, stored)
    _edit(pair, edit)
    if trigger_item:
        _same_trigger_item(pair, fire_at)
    _fire(pair, fire_at)
    if again:
        _fire(pair, max(fire_at, DUE_MS) + 1)
    _finish(pair, max(fire_at, DUE_MS) + 50)


def _same_trigger_item(pair: Pair, now_ms: int) -> None:
    """The trigger's fire item from the stored record (runtime/trigger.py)
    is the one it builds from the whole job, at the same cost."""
    store = pair.fast.store
    facts = queries.pending_once_facts(store, JOB_ID)
    if facts is None:
        return
    job = queries.job(store, JOB_ID)
    for due_ms in (DUE_MS, DUE_MS + 1):
        assert pending_fire_item(JOB_ID, facts, due_ms) == fire_item(job, due_ms, now_ms)
    assert cost.fire_item_cost(PENDING_ONCE_SPEC, 1) == cost.fire_item_cost(job["spec"], 1)
    event("trigger item from the stored record")


@pytest.mark.parametrize("stored", [False, True])
@pytest.mark.parametrize("fire_at", [DUE_MS - 20_000, DUE_MS + 5])
def test_a_plain_pending_one_off_fires_from_its_stored_record(monkeypatch, stored, fire_at):
    pair = Pair(monkeypatch)
    _create(pair, {"run_at": _iso(DUE_MS), "target": HTTP,
                   "retry": {"max_attempts": 2}, "labels": {"team": "a"}}, stored)
    assert queries.pending_once_facts(pair.fast.store, JOB_ID) is not None
    result = _fire(pair, fire_at)
    assert result["fired"] == 1 and pair.taken == 1
    assert queries.pending_once_facts(pair.fast.store, JOB_ID) is None   # (fired: a state)
    run = pair.fast.get_run(keys.run_id(JOB_ID, DUE_MS))
    assert run["state"] == "running" and run["holder"] == NODE
    assert ("armed_ms" in run) == (fire_at < DUE_MS)
    job = pair.fast.job(JOB_ID)
    assert job["status"] == "completed" and job["active"] == [run["id"]]
    # A second fire of the occurrence finds no due entry: the whole read calls it stale.
    assert _fire(pair, DUE_MS + 10)["stale"] == 1 and pair.taken == 1


def _fired_through_edits(test):
    """A test of a stored-form write under a fire from the stored record,
    given the creates, edits, fires and finishes _run_through makes."""
    return settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])(given(
        body=bodies, stored=st.booleans(),
        edit=st.sampled_from(["none", "pause_resume", "trigger", "move_back"]),
        fire_at=st.sampled_from([DUE_MS - 20_000, DUE_MS, DUE_MS + 90_000]),
        again=st.booleans())(test))


@_fired_through_edits
def test_a_fired_run_written_as_stored_is_what_create_run_writes(
        monkeypatch, body, stored, edit, fire_at, again):
    """runs.create_held against runs.create_run, both under a fire from the
    stored record (and every held run's form checked against `compact` of
    the run, compact.CHECK_HELD_RUN, as in every test)."""
    pair = Pair(monkeypatch, runs, "CREATE_HELD_AS_STORED", "create_held")
    _run_through(pair, body, stored, edit, fire_at, again)
    event(f"run written as stored: {pair.taken}")


@pytest.mark.parametrize("fire_at", [DUE_MS - 20_000, DUE_MS, DUE_MS + 5])
def test_a_plain_one_off_s_run_is_written_as_stored(monkeypatch, fire_at):
    pair = Pair(monkeypatch, runs, "CREATE_HELD_AS_STORED", "create_held")
    _create(pair, {"run_at": _iso(DUE_MS), "target": HTTP}, stored=True)
    assert _fire(pair, fire_at)["fired"] == 1 and pair.taken == 1
    run = pair.fast.get_run(keys.run_id(JOB_ID, DUE_MS))
    assert run["state"] == "running" and ("armed_ms" in run) == (fire_at < DUE_MS)
    assert _fire(pair, DUE_MS + 10)["stale"] == 1 and pair.taken == 1


@_fired_through_edits
def test_a_fired_state_written_as_stored_is_what_the_state_write_is(
        monkeypatch, body, stored, edit, fire_at, again):
    """The job's state a fire from the stored record writes in its stored
    form (compact.fired_once_state) against the state written as a map and
    compacted, both replicas given the same commands (and each such form
    checked against `compact` of the state, apply.CHECK_FIRED_STATE, as in
    every test)."""
    pair = Pair(monkeypatch, apply_mod, "FIRED_STATE_AS_STORED", "_fire_pending_once")
    _run_through(pair, body, stored, edit, fire_at, again)
    event(f"fired from the stored record: {pair.taken}")


def test_a_plain_one_off_s_fired_state_is_written_as_stored(monkeypatch):
    pair = Pair(monkeypatch, apply_mod, "FIRED_STATE_AS_STORED", "_fire_pending_once")
    _create(pair, {"run_at": _iso(DUE_MS), "target": HTTP}, stored=True)
    assert _fire(pair, DUE_MS - 20_000)["fired"] == 1
    job = pair.fast.job(JOB_ID)
    assert (job["status"], job["next_ms"], job["runs_count"], job["active"],
            job["last_run_id"]) == ("completed", None, 1, [keys.run_id(JOB_ID, DUE_MS)],
                                    keys.run_id(JOB_ID, DUE_MS))
    assert _finish(pair, DUE_MS + 20)["accepted"] == [True]
    assert pair.fast.job(JOB_ID)["active"] == []


@pytest.mark.parametrize("body", [
    {"jitter_s": 5}, {"priority": "high"}, {"concurrency": {"policy": "queue"}},
    {"misfire": {"policy": "skip", "misfire_tolerance_s": 1}},
    {"target": {"type": "publish", "topic": "orders", "message": {"k": 1}}},
])
def test_a_one_off_whose_spec_changes_its_fire_is_read_whole(monkeypatch, body):
    pair = Pair(monkeypatch)
    _create(pair, {"run_at": _iso(DUE_MS), "target": HTTP, **body}, stored=True)
    _fire(pair, DUE_MS + 5)
    assert pair.taken == 0
