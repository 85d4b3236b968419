"""A success of a run held from its fire, written by patching the run's
stored record (core/runs.py _finish_held, core/compact.py finished_held),
leaves every replica with what the whole read and write leave: two replicas
take the same commands, one each way, compared byte for byte after each."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raftsched.core import commands, keys, runs
from tests.test_fire_pending import (DUE_MS, HTTP, JOB_ID, NODE, Pair, _create, _finish, _fire,
                                     _iso, bodies)


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
