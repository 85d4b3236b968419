"""A success of a run held from its fire, written by patching the run's
stored record (core/runs.py _finish_held, core/compact.py finished_held),
leaves every replica with what the whole read and write leave: two replicas
take the same commands, one each way, compared byte for byte after each."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raftsched.core import codec, commands, compact, jobspec, keys, runs
from tests.test_fire_pending import (CREATED_MS, DUE_MS, HTTP, JOB_ID, NODE, SHARDS, Pair,
                                     _create, _finish, _fire, _iso, bodies)


def pair_of(monkeypatch) -> Pair:
    return Pair(monkeypatch, runs, "FINISH_HELD_FROM_STORED", "_finish_held", declined=False)


reports = st.fixed_dictionaries({
    "ok": st.booleans(),
    "http_status": st.sampled_from([None, 200, 204, 500]),
}, optional={
    "called_ms": st.sampled_from([None, DUE_MS, DUE_MS + 3]),
    "output_node": st.sampled_from([None, NODE]),
    "error": st.sampled_from([None, "HTTP 500: boom"]),
    "exit_code": st.sampled_from([None, 0, 3]),
    "retryable": st.sampled_from([False, True]),
    "retry_delay_ms": st.just(1_000),
})


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, stored=st.booleans(),
       fire_at=st.sampled_from([DUE_MS - 20_000, DUE_MS, DUE_MS + 90_000]),
       report=reports, twice=st.booleans(), attempt=st.sampled_from([1, 1, 2]),
       holder=st.sampled_from([NODE, NODE, "n2"]))
def test_a_success_written_as_stored_is_what_the_whole_write_is(
        monkeypatch, body, stored, fire_at, report, twice, attempt, holder):
    if not report["ok"] and report.get("retryable") is not False:
        report["retry_delay_ms"] = 1_000
    pair = pair_of(monkeypatch)
    _create(pair, body, stored)
    _fire(pair, fire_at)
    at_ms = max(fire_at, DUE_MS) + 50
    update = commands.run_finish(run_id=keys.run_id(JOB_ID, DUE_MS), holder=holder,
                                 attempt=attempt, at_ms=at_ms, **report)
    pair.run(commands.run_updates(updates=[update] * (2 if twice else 1)))
    pair.run(commands.run_updates(updates=[update]))
    event(f"written as stored: {pair.taken}")


@pytest.mark.parametrize("output_node", [None, NODE])
@pytest.mark.parametrize("called_ms", [None, DUE_MS, DUE_MS + 7])
@pytest.mark.parametrize("fire_at", [DUE_MS - 20_000, DUE_MS])
def test_a_held_runs_success_is_written_from_its_stored_record(monkeypatch, output_node,
                                                               called_ms, fire_at):
    pair = pair_of(monkeypatch)
    _create(pair, {"run_at": _iso(DUE_MS), "target": HTTP}, stored=True)
    assert _fire(pair, fire_at)["fired"] == 1
    # The job's state is a record of its own after the fire: the success is
    # written from the run as stored.
    result = _finish(pair, DUE_MS + 20, called_ms=called_ms, output_node=output_node)
    assert result["accepted"] == [True] and pair.taken == 1
    run = pair.fast.get_run(keys.run_id(JOB_ID, DUE_MS))
    assert run["state"] == "succeeded" and run["finished_ms"] == DUE_MS + 20
    assert run["attempts"][0]["output_node"] == output_node
    assert pair.fast.job(JOB_ID)["active"] == []
    # Reported again: refused, by `finish` as ever.
    assert _finish(pair, DUE_MS + 30)["accepted"] == [False] and pair.taken == 1


def settle_pair(monkeypatch) -> tuple[Pair, list]:
    """A pair whose fast replica settles a job's state as stored
    (runs.SETTLE_AS_STORED), with each state compact.state_settled made."""
    pair = Pair(monkeypatch, runs, "SETTLE_AS_STORED", "_finish_held", declined=False)
    made: list = []
    original = compact.state_settled

    def counted(*args):
        answer = original(*args)
        made.append(answer)
        return answer

    monkeypatch.setattr(compact, "state_settled", counted)
    return pair, made


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fired=st.integers(1, 4),
       batches=st.lists(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([True, True, False])),
                                 min_size=1, max_size=4), min_size=1, max_size=3),
       policy=st.sampled_from(["allow", "queue", "skip_if_running"]))
def test_a_jobs_state_settled_as_stored_is_what_the_whole_write_is(
        monkeypatch, fired, batches, policy):
    """A recurring job with several runs open, their ends reported in
    batches (the same run twice, runs of one job in one entry, runs not
    open, failures read whole after a success settled as stored): its
    state settled from its stored record leaves both replicas alike, byte
    for byte, as the state read whole and settled does."""
    pair, made = settle_pair(monkeypatch)
    spec = jobspec.validate_create({"schedule": {"every": "2s"}, "target": HTTP,
                                    "concurrency": {"policy": policy},
                                    "misfire": {"policy": "fire_all"}}, JOB_ID)["spec"]
    shard = keys.shard_of(JOB_ID, SHARDS)
    pair.run(commands.assign_shards(assignments=[(shard, NODE)], at_ms=CREATED_MS))
    pair.run(commands.create_job(job_id=JOB_ID, tenant="default", spec=spec,
                                 idempotency_key=None, shard=shard, next_ms=DUE_MS,
                                 at_ms=CREATED_MS))
    occurrences = [DUE_MS + 2000 * i for i in range(fired)]
    token = pair.fast.store.get("shards", keys.shard_key(shard))["token"]
    at_ms = occurrences[-1] + 10
    pair.run(commands.fire(shard=shard, token=token, upto_ms=at_ms, node=NODE, at_ms=at_ms,
                           items=[(JOB_ID, DUE_MS, occurrences[-1] + 2000, occurrences,
                                   False)]))
    for batch in batches:
        at_ms += 100
        pair.run(commands.run_updates(updates=[commands.run_finish(
            run_id=keys.run_id(JOB_ID, DUE_MS + 2000 * i), holder=NODE, attempt=1,
            at_ms=at_ms, ok=ok, http_status=200 if ok else 500, called_ms=at_ms - 5,
            retry_delay_ms=None if ok else 1_000) for i, ok in batch]))
    event(f"settled as stored: {sum(m is not None for m in made)}")


def test_a_held_one_offs_state_is_settled_as_stored(monkeypatch):
    pair, made = settle_pair(monkeypatch)
    _create(pair, {"run_at": _iso(DUE_MS), "target": HTTP}, stored=True)
    assert _fire(pair, DUE_MS)["fired"] == 1
    assert _finish(pair, DUE_MS + 20)["accepted"] == [True]
    # Both replicas write the run as stored; only the fast one its state.
    assert len(made) == 1 and made[0] is not None and pair.taken == 2
    assert pair.fast.job(JOB_ID)["active"] == []


def test_a_state_with_runs_waiting_is_settled_whole():
    """The queue policy's next run is promoted by settle: no stored patch."""
    key = keys.job_key(JOB_ID)
    state = {"v": 1, "next_ms": 5, "active": [keys.run_id(JOB_ID, 1)], "runs_count": 2,
             "status": "active", "updated_ms": 9, "last_run_id": keys.run_id(JOB_ID, 1),
             "waiting": [keys.run_id(JOB_ID, 3)]}
    stored = codec.unpack_record(codec.pack(compact.compact("job_state", dict(state), key)))
    assert compact.state_settled(stored, key, keys.run_id(JOB_ID, 1)) is None
    del state["waiting"]
    stored = codec.unpack_record(codec.pack(compact.compact("job_state", dict(state), key)))
    assert compact.state_settled(stored, key, keys.run_id(JOB_ID, 2)) is None   # not open
    assert compact.state_settled(stored, key, keys.run_id(JOB_ID, 1))[-1] == []
