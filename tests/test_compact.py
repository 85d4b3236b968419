"""Stored job and run records are compacted and read back whole: expand(compact(r)) == r."""

from __future__ import annotations

import copy
import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import codec, compact as compact_module, jobspec, keys
from raftsched.core.compact import compact, expand
from raftsched.storage.memory_store import MemoryStore
from raftsched.core.tx import Transition
from raftsched.testing.proptest import examples

RUN_AT = "2030-01-01T00:00:00Z"


def _round_trip(table: str, record: dict) -> dict:
    stored = codec.pack(compact(table, copy.deepcopy(record)))
    return expand(table, codec.unpack(stored))


def _job(spec: dict, **extra: object) -> dict:
    return {"v": 1, "id": "job_1", "tenant": "default", "spec": spec, "status": "active",
            "version": 1, "shard": 3, "next_ms": 1, "created_ms": 1, "updated_ms": 1,
            "idempotency_key": None, "last_run_id": None, **extra}


bodies = st.fixed_dictionaries(
    {"run_at": st.just(RUN_AT),
     "target": st.fixed_dictionaries(
         {"type": st.just("http"), "url": st.just("http://127.0.0.1:9/x")},
         optional={"method": st.sampled_from(["POST", "GET", "put"]),
                   "timeout_s": st.one_of(st.integers(1, 60), st.floats(0.5, 60)),
                   "headers": st.dictionaries(st.sampled_from(["A", "B"]), st.text("xyz", max_size=3)),
                   "body": st.one_of(st.none(), st.text(max_size=5),
                                     st.dictionaries(st.text(max_size=2), st.integers(-9, 9)))})},
    optional={"retry": st.fixed_dictionaries({}, optional={
                  "max_attempts": st.integers(1, 5), "base_s": st.one_of(st.integers(1, 3),
                                                                         st.floats(0.5, 3)),
                  "non_retryable_exit_codes": st.lists(st.integers(1, 9), max_size=2)}),
              "priority": st.sampled_from(["high", "normal", "low"]),
              "metadata": st.dictionaries(st.sampled_from(["k", "l"]), st.text(max_size=3)),
              "concurrency": st.sampled_from(["allow", "skip_if_running", "replace"]),
              "misfire": st.sampled_from([{"policy": "skip"}, {"policy": "fire_all"}])})


@settings(max_examples=examples(200), deadline=None)
@given(bodies)
def test_a_job_reads_back_as_it_was_written(body: dict) -> None:
    job = _job(jobspec.validate_create(body)["spec"])
    assert _round_trip("jobs", job) == job


def test_a_job_with_every_default_is_stored_small() -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/x"}})["spec"]
    job = _job(spec)
    stored = compact("jobs", copy.deepcopy(job))
    # Positional: [others, v, id, tenant, spec, ...]; the spec likewise,
    # [others, name, schedule, target], every default left out.
    assert stored[0] is None and stored[1:4] == [1, "job_1", "default"], stored
    assert stored[4][0] is None and len(stored[4]) == 4, stored[4]
    packed = codec.pack(stored)
    for name in (b"created_ms", b"tenant", b"schedule", b"retry", b"idempotency_key"):
        assert name not in packed, name
    assert len(packed) < len(codec.pack(job)) / 2


def test_values_equal_to_a_default_but_of_another_type_are_kept() -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/x"}})["spec"]
    spec["retry"]["base_s"] = 1          # an int where the default is 1.0
    spec["target"]["timeout_s"] = 30     # likewise
    job = _job(spec)
    back = _round_trip("jobs", job)
    assert type(back["spec"]["retry"]["base_s"]) is int
    assert type(back["spec"]["target"]["timeout_s"]) is int
    assert back == job


def test_restored_defaults_are_fresh_copies() -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/x"}})["spec"]
    first = _round_trip("jobs", _job(spec))
    first["spec"]["metadata"]["x"] = "y"
    first["spec"]["retry"]["non_retryable_exit_codes"].append(3)
    second = _round_trip("jobs", _job(spec))
    assert second["spec"]["metadata"] == {} and second["spec"]["retry"]["non_retryable_exit_codes"] == []


def _run(**extra: object) -> dict:
    run = {"v": 1, "id": keys.run_id("job_1", 5), "job_id": "job_1", "tenant": "default",
           "scheduled_ms": 5, "attempt": 1, "execution_id": keys.execution_id("job_1", 5),
           "state": "queued", "node": "n1", "queue": None, "trigger": "schedule", "token": 2,
           "created_ms": 6, "queued_ms": 6, "started_ms": None, "finished_ms": None,
           "holder": None, "lease_ms": None, "retry_due_ms": None, "http_status": None,
           "exit_code": None, "error": None, "reason": None, "attempts": [], "alert": None,
           "priority": "normal", "shard": 3}
    run.update(extra)
    return run


def test_runs_read_back_at_every_stage() -> None:
    attempt = {"attempt": 1, "holder": "n1", "started_ms": 7, "finished_ms": None,
               "http_status": None, "exit_code": None, "error": None, "output_node": None,
               "retry_delay_ms": None}
    for run in (_run(), _run(state="running", holder="n1", lease_ms=9, attempts=[attempt]),
                _run(state="failed", finished_ms=9, error="boom", http_status=500,
                     attempts=[dict(attempt, finished_ms=9, http_status=500, error="boom")]),
                _run(execution_id="exe_other")):   # an id not derived is kept
        assert _round_trip("runs", run) == run
        assert len(codec.pack(compact("runs", copy.deepcopy(run)))) < len(codec.pack(run))


_LONE = {"attempt": 1, "holder": "n1", "started_ms": 6, "finished_ms": 9, "http_status": 200,
         "exit_code": None, "error": None, "output_node": None, "retry_delay_ms": None}


@settings(max_examples=examples(300), deadline=None)
@given(queued=st.sampled_from([6, 6.0, 7, None, False]),
       started=st.sampled_from([6, 7, None, True]),
       priority=st.sampled_from(["normal", "high", None, False, b"normal"]),
       attempt=st.sampled_from([{}, {"holder": "n2"}, {"http_status": 200.0}, {"attempt": 2},
                                {"output_node": "n1"}, {"retry_delay_ms": 5}, None]),
       extra_attempt=st.booleans(), node=st.sampled_from(["n1", None]))
def test_a_run_s_derived_members_read_back_as_written(queued, started, priority, attempt,
                                                      extra_attempt, node) -> None:
    """A queue and start time equal to the run's creation time, the priority
    "normal" and a lone attempt that repeats the run are left out of its form
    and read back as written; so does every value that only looks like them."""
    attempts = [] if attempt is None else [{**_LONE, **attempt}]
    if extra_attempt and attempts:
        attempts.append({**_LONE, "attempt": 2})
    run = _run(state="succeeded", queued_ms=queued, started_ms=started, priority=priority,
               finished_ms=9, http_status=200, node=node, attempts=attempts)
    back = _round_trip("runs", run)
    assert back == run
    assert [type(back[k]) for k in sorted(run)] == [type(run[k]) for k in sorted(run)]
    assert [[type(a[k]) for k in sorted(a)] for a in back["attempts"]] == \
        [[type(a[k]) for k in sorted(a)] for a in run["attempts"]]


def test_a_run_called_once_by_its_node_stores_only_what_it_cannot_derive() -> None:
    run = _run(state="succeeded", created_ms=1_796_490_905_345, queued_ms=1_796_490_905_345,
               started_ms=1_796_490_905_345, finished_ms=1_796_490_905_360, http_status=200,
               attempts=[{**_LONE, "started_ms": 1_796_490_905_345,
                          "finished_ms": 1_796_490_905_360}])
    stored = codec.pack(compact("runs", copy.deepcopy(run), run["id"].encode()))
    assert stored.count(codec.pack(1_796_490_905_345)) == 1
    assert stored.count(codec.pack(1_796_490_905_360)) == 1
    assert b"normal" not in stored and len(stored) <= 70
    assert expand("runs", codec.unpack(stored), run["id"].encode()) == run


def test_a_job_state_names_its_last_run_by_the_run_s_time() -> None:
    state = {"v": 1, "next_ms": None, "active": [], "runs_count": 1, "status": "completed",
             "updated_ms": 9, "last_run_id": keys.run_id("job_1a246fcd8804f1410000", 77)}
    key = b"job_1a246fcd8804f1410000"
    stored = codec.pack(compact("job_state", dict(state), key))
    assert b"run_" not in stored
    assert expand("job_state", codec.unpack(stored), key) == state
    for last in (keys.run_id("job_other", 77), "run_x", None, 77, keys.task_run_id("d", "t")):
        other = {**state, "last_run_id": last}   # not this job's run: kept as it is
        stored = codec.pack(compact("job_state", dict(other), key))
        assert expand("job_state", codec.unpack(stored), key) == other


# Members a run or job may hold besides its form's, and values of any kind.
_values = st.one_of(st.none(), st.integers(-2 ** 63, 2 ** 64 - 1), st.text(max_size=4),
                    st.booleans(), st.lists(st.integers(0, 3), max_size=2),
                    st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2))
_extras = st.dictionaries(st.sampled_from(["jitter_ms", "armed_ms", "dag_run", "task_id",
                                           "withdrawn", "redeliveries", "active", "waiting",
                                           "runs_count", "paused_ms", "pause_note"]),
                          _values, max_size=4)


@settings(max_examples=examples(300), deadline=None)
@given(overrides=st.dictionaries(st.sampled_from(sorted(_run())), _values, max_size=6),
       dropped=st.sets(st.sampled_from(sorted(_run())), max_size=3), extra=_extras,
       attempts=st.lists(st.dictionaries(st.sampled_from(
           ["attempt", "holder", "started_ms", "finished_ms", "error", "output_node", "node"]),
           _values), max_size=2))
def test_any_run_reads_back_as_it_was_written(overrides, dropped, extra, attempts) -> None:
    """Whatever its members' values, whichever are missing or added: a run
    stored positionally or as a map reads back equal (members the map form
    restores as None aside)."""
    run = {**_run(**overrides), **extra, "attempts": attempts}
    for name in dropped:
        run.pop(name, None)
    back = _round_trip("runs", run)
    if "scheduled_ms" not in run:   # not a run record: stored as it is
        assert back == run
        return
    restored = {k: None for k in compact_module._RUN_NONE if k not in run}
    if "execution_id" not in run:
        restored["execution_id"] = compact_module._execution_id(run)
    if "attempts" in run:
        restored["attempts"] = [{**dict.fromkeys(compact_module._ATTEMPT_NONE), **a}
                                for a in run["attempts"]]
    assert back == {**run, **restored}


@settings(max_examples=examples(300), deadline=None)
@given(overrides=st.dictionaries(st.sampled_from(["state", "attempt", "holder", "token", "id",
                                                  "job_id", "scheduled_ms", "alert", "reason",
                                                  "error", "queued_ms"]), _values, max_size=4),
       dropped=st.sets(st.sampled_from(sorted(_run())), max_size=3), extra=_extras,
       keyed=st.booleans())
def test_who_holds_a_run_reads_as_the_whole_record_says(overrides, dropped, extra,
                                                        keyed) -> None:
    """compact.run_hold, read from the stored form alone, is (state, attempt,
    holder, token) of the run read whole, whatever form it was stored in."""
    run = {**_run(**{"state": "running", "holder": "n1", **overrides}), **extra}
    for name in dropped:
        run.pop(name, None)
    if "scheduled_ms" not in run:
        return   # not a run record
    key = run["id"].encode() if keyed and type(run.get("id")) is str else b"run_k"
    raw = codec.pack(compact("runs", copy.deepcopy(run), key))
    whole = expand("runs", codec.unpack_record(raw), key)
    assert compact_module.run_hold(codec.unpack_record(raw), key) == \
        (whole.get("state"), whole.get("attempt"), whole.get("holder"), whole.get("token"))


_STATE = {"v": 1, "next_ms": None, "active": ["run_a"], "last_run_id": "run_a",
          "runs_count": 1, "status": "completed", "updated_ms": 9}


@settings(max_examples=examples(300), deadline=None)
@given(body=bodies, named=st.booleans(),
       overrides=st.dictionaries(st.sampled_from(["id", "tenant", "status", "updated_ms",
                                                  "next_ms", "version"]), _values, max_size=3),
       dropped=st.sets(st.sampled_from(sorted(_job({}))), max_size=2), extra=_extras,
       state=st.one_of(st.none(), st.just(_STATE),
                       st.fixed_dictionaries({"status": _values}).map(
                           lambda o: {**_STATE, **o}),
                       st.dictionaries(st.sampled_from(sorted(_STATE)), _values, max_size=3)),
       keyed=st.booleans())
def test_what_a_call_reads_of_a_job_is_what_the_whole_read_shows(
        body, named, overrides, dropped, extra, state, keyed) -> None:
    """compact.job_to_call, read from the stored job and state records with
    neither restored whole, is the id, tenant, status and spec of the job as
    a whole read shows it (its state laid over it), whatever form each was
    stored in."""
    spec = jobspec.validate_create({**body, **({"name": "nightly"} if named else {})})["spec"]
    job = {**_job(spec), **overrides, **extra}
    for name in dropped:
        job.pop(name, None)
    key = job["id"].encode() if keyed and type(job.get("id")) is str else b"job_k"
    raw = codec.pack(compact("jobs", copy.deepcopy(job), key))
    raw_state = None if state is None else codec.pack(compact("job_state", dict(state), key))
    whole = expand("jobs", codec.unpack_record(raw), key)
    if raw_state is not None:
        whole.update((name, value) for name, value
                     in expand("job_state", codec.unpack_record(raw_state), key).items()
                     if name != "v")
    seen = compact_module.job_to_call(
        codec.unpack_record(raw), key,
        None if raw_state is None else codec.unpack_record(raw_state))
    assert seen == {name: whole.get(name) for name in compact_module.CALL_VIEW}


@settings(max_examples=examples(200), deadline=None)
@given(overrides=st.dictionaries(st.sampled_from(sorted(_job({}))), _values, max_size=4),
       dropped=st.sets(st.sampled_from(sorted(_job({}))), max_size=2), extra=_extras)
def test_any_job_reads_back_as_it_was_written(overrides, dropped, extra) -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/x"}})["spec"]
    job = {**_job(spec), **overrides, **extra}
    job["spec"] = spec   # a spec that is not a map is stored as it is, unread
    for name in dropped - {"spec"}:
        del job[name]
    back = _round_trip("jobs", job)
    assert back == {**{k: None for k in compact_module._JOB_NONE}, **job}


@settings(max_examples=examples(200), deadline=None)
@given(status=st.sampled_from(["active", "paused", "completed", None, 1]),
       times=st.sampled_from([(5, 5), (5, 6), (5, None), (5, 5.0), (None, 5)]),
       next_ms=st.sampled_from(["run_at", 7, None, False, True, "run_at_float"]),
       name=st.sampled_from(["default", "nightly", None, "default_bytes", 3]),
       target=st.sampled_from([{"method": "POST", "url": "http://127.0.0.1:9/x"},
                               {"method": "GET", "url": "https://example.com:8443/a/b?q=1"}]))
def test_a_job_s_derived_members_read_back_as_written(status, times, next_ms, name,
                                                      target) -> None:
    """Members left out of a job's form when its other members say them (an
    active status, an update time equal to the creation time, a pending
    one-off's next time, a name made from its target) read back as written,
    and so does every value that only looks like them."""
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {"type": "http", **target}})["spec"]
    run_at_ms = spec["schedule"]["run_at_ms"]
    spec["name"] = {"default": spec["name"], "default_bytes": spec["name"].encode(),
                    "nightly": "nightly", None: None, 3: 3}[name]
    job = _job(spec, status=status, created_ms=times[0], updated_ms=times[1],
               next_ms={"run_at": run_at_ms, "run_at_float": float(run_at_ms)}.get(
                   next_ms, next_ms))
    back = _round_trip("jobs", job)
    assert back == job
    assert [type(back[k]) for k in sorted(job)] == [type(job[k]) for k in sorted(job)]
    assert type(back["spec"]["name"]) is type(spec["name"])


def test_a_pending_one_off_named_by_its_target_stores_only_what_it_cannot_derive() -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/hook"}})["spec"]
    job = _job(spec, next_ms=spec["schedule"]["run_at_ms"], created_ms=1_796_487_305_340,
               updated_ms=1_796_487_305_340)
    stored = codec.pack(compact("jobs", copy.deepcopy(job), b"job_1"))
    for derived in (b"POST", b"127.0.0.1/hook", b"active"):
        assert derived not in stored
    assert stored.count(codec.pack(1_796_487_305_340)) == 1
    assert stored.count(codec.pack(spec["schedule"]["run_at_ms"])) == 1
    assert expand("jobs", codec.unpack(stored), b"job_1") == job


def test_names_made_from_a_target_are_pinned_since_stored_jobs_are_read_with_them() -> None:
    """A job created without a name is stored without it and read back with
    the name jobspec.default_name makes now: a change to that function
    renames every such job already stored. Change it only with a new stored
    form."""
    for target, name in (({"method": "POST", "url": "http://127.0.0.1:9/hook"},
                          "POST 127.0.0.1/hook"),
                         ({"method": "GET", "url": "https://Example.com:8443/a/b?q=1#f"},
                          "GET example.com/a/b"),
                         ({"method": "PUT", "url": "http://[::1]:80"}, "PUT ::1"),
                         ({"method": "POST", "url": "http://h/" + "p" * 300},
                          ("POST h/" + "p" * 300)[:200])):
        assert jobspec.default_name({"type": "http", **target}) == name
        assert compact_module._default_name(target["method"], target["url"]) == name


_AUDIT_IDS = st.lists(st.one_of(
    st.builds(lambda ms, n: f"job_{ms:011x}abcde{n:04x}", st.integers(0, 3),
              st.sampled_from([0, 1, 2, 3, 0xfffe, 0xffff])),
    st.sampled_from(["job_", "job_x", "job_00000000000abcde000g", "x" * 30])), max_size=12)


@settings(max_examples=examples(300), deadline=None)
@given(jobs=st.one_of(st.none(), _AUDIT_IDS, st.just([1, "job_a"]), st.just("job_a")),
       others=st.dictionaries(st.sampled_from(["quota", "note"]), st.integers(0, 3), max_size=2),
       actor=st.sampled_from([None, "tok_1"]), tenant=st.sampled_from([None, "acme"]),
       dropped=st.sets(st.sampled_from(["actor", "detail", "subject"]), max_size=1))
def test_an_audit_record_reads_back_as_written(jobs, others, actor, tenant, dropped) -> None:
    detail = dict(others) if jobs is None else {**others, "jobs": jobs}
    record = {"v": 1, "seq": 9, "at_ms": 5, "actor": actor, "action": "job.create",
              "tenant": tenant, "subject": "job_a", "detail": detail}
    for name in dropped:
        del record[name]
    assert _round_trip("audit", record) == record


def test_a_batch_s_audit_record_holds_its_ids_as_runs() -> None:
    ids = [f"job_{1_796_487_305_340:011x}abcde{n:04x}" for n in range(1000)]
    ids[500:] = [f"job_{1_796_487_305_341:011x}abcde{n:04x}" for n in range(500)]   # next ms
    record = {"v": 1, "seq": 9, "at_ms": 5, "actor": None, "action": "job.create",
              "tenant": "default", "subject": ids[0], "detail": {"jobs": ids}}
    stored = codec.pack(compact("audit", copy.deepcopy(record)))
    assert len(stored) < 150
    assert expand("audit", codec.unpack(stored)) == record


def test_a_record_with_a_member_not_named_by_a_string_is_stored_as_a_map() -> None:
    run = {**_run(), 7: "seven", "jitter_ms": 3}
    assert isinstance(compact("runs", copy.deepcopy(run)), dict)
    assert _round_trip("runs", run) == run
    plain = {**_run(), "jitter_ms": 3}
    assert isinstance(compact("runs", copy.deepcopy(plain)), list)


def test_an_id_equal_to_its_key_is_left_out_and_read_back_from_it() -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/x"}})["spec"]
    for table, record in (("jobs", _job(spec)), ("runs", _run())):
        key = record["id"].encode()
        stored = codec.pack(compact(table, copy.deepcopy(record), key))
        assert key not in stored
        assert expand(table, codec.unpack(stored), key) == record
        # Under another key the id is kept.
        other = codec.pack(compact(table, copy.deepcopy(record), b"elsewhere"))
        assert key in other and expand(table, codec.unpack(other), b"elsewhere") == record


def test_a_run_stored_under_its_id_leaves_out_the_job_and_time_the_id_names() -> None:
    run = _run()
    key = run["id"].encode()
    stored = codec.pack(compact("runs", copy.deepcopy(run), key))
    assert b"job_1" not in stored
    assert expand("runs", codec.unpack(stored), key) == run
    # A DAG task's run id (a hash) names neither: both are kept.
    task = _run(id=keys.task_run_id(run["id"], "t1"), task_id="t1")
    key = task["id"].encode()
    stored = codec.pack(compact("runs", copy.deepcopy(task), key))
    assert b"job_1" in stored and expand("runs", codec.unpack(stored), key) == task
    # A job id of None is stored as such (a map): nothing reads it as left out.
    odd = _run(job_id=None)
    key = odd["id"].encode()
    assert expand("runs", codec.unpack(codec.pack(compact("runs", copy.deepcopy(odd), key))),
                  key) == odd


_JOB_IDS = st.one_of(st.from_regex(r"job_[0-9a-f]{20}", fullmatch=True),
                     st.text(max_size=12), st.just("job_~x"), st.just("~x"), st.just("job_"))
_TIMES = st.integers(0, 2 ** 48 - 1)


@settings(max_examples=examples(300), deadline=None)
@given(_JOB_IDS, _TIMES, _JOB_IDS, _TIMES)
def test_run_ids_name_their_job_and_time_one_to_one(job_a: str, ms_a: int, job_b: str,
                                                      ms_b: int) -> None:
    a = keys.run_id(job_a, ms_a)
    assert keys.run_occurrence(a) == (job_a, ms_a)
    assert (a == keys.run_id(job_b, ms_b)) == ((job_a, ms_a) == (job_b, ms_b))
    # A job's runs lie under its prefix, in time order.
    key = a.encode()
    assert keys.job_runs_prefix(job_a) <= key < keys.job_runs_stop(job_a)
    if job_a == job_b:
        assert (key < keys.run_id(job_b, ms_b).encode()) == (ms_a < ms_b)


def test_an_api_job_s_run_ids_have_the_shape_the_api_takes() -> None:
    import re
    from raftsched.core.spec import RUN_ID_PATTERN
    job_id = "job_" + "ab" * 10
    run_id = keys.run_id(job_id, 253_402_128_000_000)   # timestamp_ms_max
    assert re.fullmatch(RUN_ID_PATTERN, run_id) and len(run_id) == 36
    assert re.fullmatch(RUN_ID_PATTERN, keys.task_run_id(run_id, "t1"))
    assert keys.run_occurrence("run_not_one") is None


def test_a_job_state_is_stored_positionally_when_a_fire_has_filled_it() -> None:
    state = {"v": 1, "next_ms": None, "active": ["run_a"], "last_run_id": "run_a",
             "runs_count": 1, "status": "completed", "updated_ms": 9}
    for record in (state, {**state, "waiting": ["run_b"], "misfires_omitted": 2},
                   {"v": 1, "next_ms": 5, "status": "active"}):   # not fired yet: a map
        stored = compact("job_state", dict(record))
        assert isinstance(stored, list) == ("runs_count" in record)
        assert expand("job_state", codec.unpack(codec.pack(stored))) == record


def test_due_values_are_stored_positionally() -> None:
    value = keys.due_value("acme", "high")
    stored = compact("due", dict(value))
    assert isinstance(stored, list) and b"tn" not in codec.pack(stored)
    assert expand("due", codec.unpack(codec.pack(stored))) == value


def test_a_record_stored_whole_reads_back_unchanged() -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/x"}})["spec"]
    for table, record in (("jobs", _job(spec)), ("runs", _run())):
        assert expand(table, codec.unpack(codec.pack(copy.deepcopy(record)))) == record


def test_the_stores_compact_what_they_keep() -> None:
    spec = jobspec.validate_create({"run_at": RUN_AT, "target": {
        "type": "http", "url": "http://127.0.0.1:9/x"}})["spec"]
    store = MemoryStore()
    job = _job(spec)
    store.commit(Transition(writes=(("jobs", b"job_1", job),), effects=(), result={}), 1)
    assert store.get("jobs", b"job_1") == job
    with store.pin() as pinned:
        raw = dict(((t, k), v) for t, k, v in pinned.items())
    assert len(raw[("jobs", b"job_1")]) < len(codec.pack(job)) / 2


def test_remembered_ids_are_those_of_the_exact_arguments() -> None:
    """keys.execution_id remembers recent answers: a call with an equal
    argument of another type (1.0 for 1) is not answered from them."""
    assert keys.execution_id("job_a", 1000) == keys.execution_id("job_a", 1000)
    assert keys.execution_id("job_a", 1000) != keys.execution_id("job_a", 1000.0)
    assert keys.execution_id("job_a", 1000) == "exe_" + hashlib.sha256(b"job_a|1000").hexdigest()[:32]


@settings(max_examples=examples(300), deadline=None)
@given(records=st.lists(st.tuples(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.integers(0, 3)),
                    min_size=2),
    st.dictionaries(st.sampled_from(["armed_ms", "x", "y"]), st.integers(0, 3))),
    min_size=1, max_size=6))
def test_a_form_packs_each_record_as_a_fresh_form_would(records) -> None:
    """A form remembers the members of the last record it packed with members
    of its own and others (an armed run's): any record after it, with the
    same members or not, packs exactly as a form that saw nothing before."""
    shared = compact_module._Form(("a", "b", "c"), optional=("c",))
    for declared, others in records:
        record = {**declared, **others}
        fresh = compact_module._Form(("a", "b", "c"), optional=("c",))
        assert shared.pack(record) == fresh.pack(record), record


# Records as the stores hold them on disk (codec.pack of their compacted form),
# each with the record it must read back as. Every node's LMDB and every
# snapshot holds records in these forms, so a change to a form's members or
# order, or to a default left out (compact._SPEC_DEFAULTS and the others), would
# make records already stored read back as other records: such a change needs
# forms of its own, with these still read.
_DUE_MS = 1893456000000   # 2030-01-01T00:00:00Z
_STORED = {
    # A pending one-off of every default: [others, v, id, tenant, spec: [others,
    # name, schedule, target], ...], its id, name, status and next time left out.
    "a pending one-off": (
        "jobs", keys.job_key("job_1"),
        "9bc001c0a764656661756c7494c0c093c0a46f6e6365cf000001b8dac5b40093c0a468747470b468"
        "7474703a2f2f3132372e302e302e313a392f78c0010301c0c2",
        {"v": 1, "id": "job_1", "tenant": "default", "status": "active", "version": 1,
         "shard": 3, "created_ms": 1, "updated_ms": 1, "next_ms": _DUE_MS,
         "last_run_id": None, "idempotency_key": None,
         "spec": {"name": "POST 127.0.0.1/x",
                  "schedule": {"kind": "once", "run_at_ms": _DUE_MS, "offset_min": 0},
                  "target": {"type": "http", "url": "http://127.0.0.1:9/x", "method": "POST",
                             "headers": {}, "body": None, "timeout_s": 30.0},
                  "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0,
                            "max_s": 60.0, "non_retryable_exit_codes": []},
                  "concurrency": {"policy": "allow"},
                  "misfire": {"policy": "fire_once", "tolerance_ms": 60_000,
                              "catchup_max": 100},
                  "alert": {}, "metadata": {}, "history": {}, "secret_keys": [],
                  "priority": "normal", "labels": {}}}),
    # A run fired ahead and called once, with success: its id, job, time,
    # execution id, queue and start times and its lone attempt left out.
    "a run that succeeded": (
        "runs", keys.run_id("job_1", _DUE_MS).encode(),
        "dc0018c001c0c0a764656661756c74c001a9737563636565646564a87363686564756c6502cf0000"
        "01b8dac58cf003c200c0a26e31c2c2cf000001b8dac5b428a26e31c0c0c0ccc8",
        {"v": 1, "id": keys.run_id("job_1", _DUE_MS), "job_id": "job_1", "tenant": "default",
         "scheduled_ms": _DUE_MS, "attempt": 1,
         "execution_id": keys.execution_id("job_1", _DUE_MS), "state": "succeeded",
         "node": "n1", "queue": None, "trigger": "schedule", "token": 2,
         "created_ms": _DUE_MS - 10_000, "queued_ms": _DUE_MS - 10_000,
         "started_ms": _DUE_MS - 10_000, "finished_ms": _DUE_MS + 40, "holder": "n1",
         "lease_ms": None, "retry_due_ms": None, "http_status": 200, "exit_code": None,
         "error": None, "reason": None, "alert": None, "priority": "normal", "shard": 3,
         "attempts": [{"attempt": 1, "holder": "n1", "started_ms": _DUE_MS - 10_000,
                       "finished_ms": _DUE_MS + 40, "http_status": 200, "exit_code": None,
                       "error": None, "output_node": None, "retry_delay_ms": None}]}),
    # The state a pending one-off's fire leaves: its last run named by its time.
    "a fired one-off's state": (
        "job_state", keys.job_key("job_1"),
        "98c001a9636f6d706c65746564cf000001b8dac58cf001c0cf000001b8dac5b40091b172756e5f"
        "31303162386461633562343030",
        {"v": 1, "status": "completed", "updated_ms": _DUE_MS - 10_000, "runs_count": 1,
         "next_ms": None, "last_run_id": keys.run_id("job_1", _DUE_MS),
         "active": [keys.run_id("job_1", _DUE_MS)]}),
}


@pytest.mark.parametrize("what", sorted(_STORED))
def test_records_already_stored_read_back_as_they_were_written(what: str) -> None:
    table, key, stored_hex, record = _STORED[what]
    assert expand(table, codec.unpack(bytes.fromhex(stored_hex)), key) == record
    # And this build stores the record so still: a new form would show here first.
    assert codec.pack(compact(table, copy.deepcopy(record), key)).hex() == stored_hex
