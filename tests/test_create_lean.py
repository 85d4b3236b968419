"""A create whose spec decoding leaves as stored (core/compact.py LeanSpec)
writes its job from that form (core/apply.py _create_lean) and leaves every
replica with what the create of the whole spec leaves: two replicas take the
same commands, one each way, compared byte for byte after each, with the
same answers."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raftsched.api import app
from raftsched.core import apply as apply_mod
from raftsched.core import codec, commands, compact, jobspec, keys
from raftsched.errors import CommandRefused
from raftsched.testing.replica import Replica
from tests.test_fire_pending import (CREATED_MS, DUE_MS, HTTP, NODE, SHARDS, Pair, _iso,
                                     bodies)

JOB_IDS = ["job_0123456789abcdef0001", "job_0123456789abcdef0002", "job_0123456789abcdef0003"]
_TAKEN = object()   # (_create_lean never declines: every call is one taken)


def pair_of(monkeypatch) -> Pair:
    return Pair(monkeypatch, apply_mod, "CREATE_FROM_STORED", "_create_lean", declined=_TAKEN)


def _item(body: dict, job_id: str, next_ms: int | None, idem: str | None):
    spec = jobspec.validate_create(body, job_id)["spec"]
    return commands.create_job_item(job_id=job_id, spec=spec, idempotency_key=idem,
                                    shard=keys.shard_of(job_id, SHARDS), next_ms=next_ms)


def _assign(pair: Pair) -> None:
    pair.run(commands.assign_shards(
        assignments=[(keys.shard_of(j, SHARDS), NODE) for j in JOB_IDS], at_ms=CREATED_MS))


items = st.tuples(bodies, st.sampled_from(JOB_IDS),
                  st.sampled_from([DUE_MS, DUE_MS, None, DUE_MS + 5]),
                  st.sampled_from([None, None, "k1", "k2"]))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(items, min_size=1, max_size=4), min_size=1, max_size=3),
       quota=st.sampled_from([None, None, 2]), edit=st.sampled_from(["none", "delete", "fire"]))
def test_a_lean_create_writes_and_answers_what_the_whole_create_does(monkeypatch, batches,
                                                                    quota, edit):
    pair = pair_of(monkeypatch)
    _assign(pair)
    at_ms = CREATED_MS
    for batch in batches:
        entry = commands.create_jobs(
            tenant="default", at_ms=at_ms, stored=True,
            quota=None if quota is None else {"jobs_max": quota, "creates_per_s": 100},
            items=[_item(body, job_id, next_ms, idem) for body, job_id, next_ms, idem in batch])
        result = pair.run(entry)
        for outcome in result["results"]:
            if outcome.get("ok"):   # the answer reads as the job a read returns
                job = compact.created_job(outcome["job"])
                assert job == pair.fast.job(job["id"])
                # and batchCreate answers it as it answers the whole job
                whole = dict(outcome, job=job)
                assert app._batch_result(None, outcome) == app._batch_result(None, whole)
        at_ms += 1_000
        if edit == "delete":
            pair.run(commands.DeleteJob(job_id=JOB_IDS[0], at_ms=at_ms))
        elif edit == "fire":
            shard = keys.shard_of(JOB_IDS[0], SHARDS)
            token = pair.fast.store.get("shards", keys.shard_key(shard))["token"]
            pair.run(commands.fire(shard=shard, token=token, upto_ms=DUE_MS, node=NODE,
                                   at_ms=DUE_MS,
                                   items=[(JOB_IDS[0], DUE_MS, None, [DUE_MS], False)]))
    event(f"created lean: {min(pair.taken, 3)}")


@pytest.mark.parametrize("body", [
    {"run_at": _iso(DUE_MS), "target": HTTP},
    {"run_at": _iso(DUE_MS), "target": HTTP, "name": "named", "retry": {"max_attempts": 1},
     "labels": {"team": "a"}, "metadata": {"k": "v"}},
    {"run_at": _iso(DUE_MS), "target": dict(HTTP, method="PUT", timeout_s=5,
                                              headers={"x-a": "1"}, body={"k": 1})},
])
def test_a_plain_one_off_is_created_lean_and_fires_from_its_record(monkeypatch, body):
    pair = pair_of(monkeypatch)
    _assign(pair)
    entry = commands.create_jobs(tenant="default", at_ms=CREATED_MS, stored=True,
                                 items=[_item(body, JOB_IDS[0], DUE_MS, "k1")])
    decoded = commands.decode(commands.encode(entry))
    assert type(decoded.items[0].spec) is compact.LeanSpec
    outcome = pair.run(entry)["results"][0]
    assert outcome["ok"] and not outcome["existing"] and pair.taken == 1
    assert type(outcome["job"]) is compact.CreatedJob
    assert compact.created_job(outcome["job"])["spec"] == entry_spec(body)
    # A repeat of its idempotency key answers the job, as a read has it.
    again = pair.run(entry)["results"][0]
    assert again["existing"] and again["job"] == outcome["job"] and pair.taken == 2


def entry_spec(body: dict) -> dict:
    return jobspec.validate_create(body, JOB_IDS[0])["spec"]


@pytest.mark.parametrize("member", [
    {"priority": "high"}, {"jitter_s": 5}, {"concurrency": {"policy": "queue"}},
    {"misfire": {"policy": "skip", "misfire_tolerance_s": 1}},
    {"target": {"type": "publish", "topic": "orders", "message": {"k": 1}}},
    {"run_at": "2023-11-15T00:00:00+05:30"},
])
def test_a_spec_that_changes_a_create_or_fire_is_made_whole(monkeypatch, member):
    pair = pair_of(monkeypatch)
    _assign(pair)
    body = {"run_at": _iso(DUE_MS), "target": HTTP, **member}
    entry = commands.create_jobs(tenant="default", at_ms=CREATED_MS, stored=True,
                                 items=[_item(body, JOB_IDS[0], DUE_MS, None)])
    assert type(commands.decode(commands.encode(entry)).items[0].spec) is compact.StoredSpec
    assert pair.run(entry)["results"][0]["ok"] and pair.taken == 0


def test_a_default_name_no_read_could_make_is_refused_as_the_whole_create_refuses_it():
    """A stored spec that leaves its name to its URL, where the URL cannot
    make one: refused when decoded, lean or not (a read could not restore it)."""
    for schedule in ([None, "once", DUE_MS], [{"offset_min": 60}, "once", DUE_MS]):
        spec = [None, None, schedule, [None, "http", "http://[::1/x"]]
        raw = codec.pack({"v": commands.VERSION, "t": "create_jobs_stored", "tenant": "t",
                          "at_ms": CREATED_MS, "items": [{
                              "job_id": JOB_IDS[0], "spec": spec, "idempotency_key": None,
                              "shard": 1, "next_ms": DUE_MS}]})
        with pytest.raises(CommandRefused) as refused:
            commands.decode(raw)
        assert "spec.name" in str(refused.value), refused.value
        replica = Replica()
        assert replica.run_entry(raw)["error"] == "invalid_command"
