"""H, not_before/not_after, jitter, the catch-up window, labels and pause notes: in schedules, validators, the proposer's fire items and apply."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings, strategies as st

from raftsched import limits
from raftsched.core import commands, firing, jobspec, keys, lifecycle
from raftsched.core import schedule as sch
from raftsched.core.apply import DUE, JOBS, RUNS, misfire_decisions
from raftsched.core.timeutil import datetime_to_ms
from raftsched.errors import InvalidInput
from raftsched.testing.proptest import examples
from raftsched.testing.replica import Replica

JOB = "job_0123456789abcdef0123"
HTTP = {"type": "http", "url": "http://127.0.0.1:1/x"}


def ms(text: str) -> int:
    return datetime_to_ms(dt.datetime.fromisoformat(text))


def cron(expr: str, key: str = JOB, tz: str = "UTC") -> dict:
    return sch.parse_schedule({"cron": expr, "timezone": tz}, None, hash_key=key)


# --- H -----------------------------------------------------------------------------------

def test_h_is_stable_for_a_job_and_kept_as_written():
    # Fixed values: the hash may never change between releases, or every
    # hashed job would move to another time on upgrade.
    assert sch.resolve_hashed("H * * * *", JOB) == "9 * * * *"
    assert sch.resolve_hashed("H(0-29)/10 H(2-4) H * H", JOB) == "9-29/10 4 1 * 0"
    spec = cron("H H(2-4) * * *")
    assert spec == {"kind": "cron", "cron": "9 4 * * *", "timezone": "UTC",
                    "text": "H H(2-4) * * *"}
    assert cron("0 3 * * *") == {"kind": "cron", "cron": "0 3 * * *", "timezone": "UTC"}


def test_h_spreads_hourly_jobs_over_the_hour():
    minutes = {sch.resolve_hashed("H * * * *", f"job_{i:020x}") for i in range(600)}
    assert len(minutes) == 60


@settings(deadline=None, max_examples=examples(200))
@given(key=st.text(min_size=1, max_size=30), low=st.integers(0, 59), width=st.integers(0, 59),
       step=st.integers(1, 60))
def test_h_terms_stay_in_their_range(key, low, width, step):
    high = min(59, low + width)
    step = min(step, high - low + 1)
    term = f"H({low}-{high})" + (f"/{step}" if step > 1 else "")
    minute = sch.resolve_hashed(f"{term} * * * *", key).split(" ")[0]
    it = sch._iter(f"{minute} * * * *", dt.datetime(2026, 1, 1))
    values = {it.get_next(dt.datetime).minute for _ in range(60)}
    assert all(low <= v <= high for v in values)
    if step == 1:
        assert len(values) == 1
    else:
        start = min(values)
        assert start < low + step
        assert values == set(range(start, high + 1, step))


def test_h_in_every_field_and_in_lists():
    spec = cron("H H H H H")
    minute, hour, day, month, weekday = (int(f) for f in spec["cron"].split(" "))
    assert 0 <= minute <= 59 and 0 <= hour <= 23 and 1 <= day <= 28
    assert 1 <= month <= 12 and 0 <= weekday <= 6
    listed = sch.resolve_hashed("0 0 * * THU,H(5-6)", JOB)
    assert listed.split(" ")[4].split(",")[0] == "THU"
    assert listed.split(" ")[4].split(",")[1] in ("5", "6")
    seconds = sch.resolve_hashed("H/15 * * * * *", JOB)
    assert seconds.split(" ")[0].endswith("-59/15")


def test_a_stepped_h_stays_stepped_for_the_dst_rules():
    assert sch.is_wildcard(cron("H/20 * * * *")["cron"])
    assert sch.is_wildcard(cron("H(0-29)/10 1-3 * * *")["cron"])
    assert not sch.is_wildcard(cron("H H(2-4) * * *")["cron"])


@pytest.mark.parametrize("expr", ["H(30-10) * * * *", "H/0 * * * *", "H/61 * * * *",
                                  "H5 * * * *", "0 H(0-24) * * *", "0 0 H(0-3) * *",
                                  "H(0-9)/11 * * * *", "HH * * * *"])
def test_bad_h_terms_are_refused_naming_the_field(expr):
    with pytest.raises(InvalidInput) as exc:
        sch.parse_schedule({"cron": expr}, None)
    assert exc.value.field == "schedule.cron"


def test_h_is_hashed_from_the_job_id_at_create_and_patch():
    body = {"schedule": {"cron": "H * * * *"}, "target": HTTP}
    one = jobspec.validate_create(body, "job_" + "1" * 20)["spec"]["schedule"]
    two = jobspec.validate_create(body, "job_" + "2" * 20)["spec"]["schedule"]
    assert one["text"] == two["text"] == "H * * * *"
    assert one["cron"] == sch.resolve_hashed("H * * * *", "job_" + "1" * 20)
    assert two["cron"] == sch.resolve_hashed("H * * * *", "job_" + "2" * 20)
    current = jobspec.validate_create({"schedule": {"every": "1h"}, "target": HTTP},
                                      JOB)["spec"]
    patched = jobspec.validate_patch({"schedule": {"cron": "H * * * *"}}, current, JOB)
    assert patched["schedule"]["cron"] == "9 * * * *"


# --- not_before / not_after ----------------------------------------------------------------

def test_bounds_keep_every_occurrence_between_them():
    spec = sch.bound_schedule({"kind": "every", "every_ms": 10_000}, 35_000, 70_000)
    assert sch.preview_ms(spec, 0, 10) == [40_000, 50_000, 60_000, 70_000]
    assert sch.next_fire_ms(spec, 70_000) is None
    daily = sch.bound_schedule(cron("0 2 * * *"), ms("2026-05-03T00:00:00+00:00"),
                               ms("2026-05-04T02:00:00+00:00"))
    assert sch.preview_ms(daily, ms("2026-05-01T00:00:00+00:00"), 5) == [
        ms("2026-05-03T02:00:00+00:00"), ms("2026-05-04T02:00:00+00:00")]


def test_a_late_fire_covers_nothing_past_not_after():
    spec = sch.bound_schedule({"kind": "every", "every_ms": 10_000}, None, 30_000)
    assert sch.covered_occurrences(spec, 0, 95_000, 100) == ([0, 10_000, 20_000, 30_000],
                                                              False, None)
    assert sch.covered_occurrences(spec, 0, 95_000, 1) == ([0, 30_000], True, None)


def test_bounds_at_the_edge():
    body = {"schedule": {"every": "1h"}, "target": HTTP, "not_before": "2026-01-01T00:00:00Z",
            "not_after": "2026-02-01T00:00:00+01:00"}
    schedule = jobspec.validate_create(body, JOB)["spec"]["schedule"]
    assert schedule["not_before_ms"] == ms("2026-01-01T00:00:00+00:00")
    assert schedule["not_after_ms"] == ms("2026-01-31T23:00:00+00:00")
    # A PATCH of the schedule keeps the bounds; null clears one.
    spec = jobspec.validate_create(body, JOB)["spec"]
    patched = jobspec.validate_patch({"schedule": {"every": "2h"}}, spec, JOB)
    assert patched["schedule"]["not_after_ms"] == schedule["not_after_ms"]
    cleared = jobspec.validate_patch({"not_after": None}, spec, JOB)
    assert "not_after_ms" not in cleared["schedule"]
    assert cleared["schedule"]["not_before_ms"] == schedule["not_before_ms"]
    # A one-off drops the bounds of the schedule it replaces.
    assert jobspec.validate_patch({"run_at": "2026-06-01T00:00:00Z"}, spec, JOB)[
        "schedule"] == {"kind": "once", "run_at_ms": ms("2026-06-01T00:00:00+00:00"),
                        "offset_min": 0}


@pytest.mark.parametrize("over, field", [
    ({"run_at": "2026-06-01T00:00:00Z", "schedule": None, "not_before": "2026-01-01T00:00:00Z"},
     "not_before"),
    ({"not_before": "2026-02-01T00:00:00Z", "not_after": "2026-01-01T00:00:00Z"}, "not_after"),
    ({"not_after": "soon"}, "not_after"),
    ({"jitter_s": -1}, "jitter_s"),
    ({"jitter_s": limits.jitter_s_max + 1}, "jitter_s"),
    ({"jitter_s": True}, "jitter_s"),
    ({"misfire": {"catchup_window_s": 0}}, "misfire.catchup_window_s"),
    ({"misfire": {"catchup_window_s": limits.catchup_window_s_max + 1}},
     "misfire.catchup_window_s"),
])
def test_bad_optional_members_are_named(over, field):
    body = {"schedule": {"every": "1h"}, "target": HTTP, **over}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_create(body, JOB)
    assert exc.value.field == field


def test_optional_members_are_stored_in_their_units():
    spec = jobspec.validate_create({"schedule": {"every": "1h"}, "target": HTTP,
                                    "jitter_s": 1.5,
                                    "misfire": {"catchup_window_s": 600}}, JOB)["spec"]
    assert spec["jitter_ms"] == 1500
    assert spec["misfire"]["catchup_window_ms"] == 600_000
    plain = jobspec.validate_create({"schedule": {"every": "1h"}, "target": HTTP}, JOB)["spec"]
    assert "jitter_ms" not in plain and "catchup_window_ms" not in plain["misfire"]
    commands.check(commands.create_job(job_id=JOB, tenant="t", spec=spec, idempotency_key=None,
                                       shard=0, next_ms=None, at_ms=1))


# --- labels ---------------------------------------------------------------------------------

@pytest.mark.parametrize("labels, field, limit", [
    ("team", "labels", None),
    ({"te am": "x"}, "labels.te am", None),
    ({"team:x": "x"}, "labels.team:x", None),
    ({"k" * (limits.label_key_bytes_max + 1): "x"}, "labels." + "k" * 64, "label_key_bytes_max"),
    ({"team": "é" * 32}, "labels.team", "label_value_bytes_max"),
    ({"team": "a\nb"}, "labels.team", None),
    ({"team": 5}, "labels", None),   # a map value of the wrong type: named by its map
    ({f"k{i}": "v" for i in range(limits.job_labels_max + 1)}, "labels", "job_labels_max"),
])
def test_labels_are_bounded(labels, field, limit):
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_labels(labels)
    assert exc.value.field == field
    assert exc.value.limit == limit


def test_labels_at_their_bounds_are_kept_and_replicated():
    labels = {f"k{i:02d}" + "x" * 60: "é" * 31 for i in range(limits.job_labels_max)}
    assert jobspec.validate_labels(labels) == labels
    spec = jobspec.validate_create({"schedule": {"every": "1h"}, "target": HTTP,
                                    "labels": labels}, JOB)["spec"]
    commands.check(commands.create_job(job_id=JOB, tenant="t", spec=spec, idempotency_key=None,
                                       shard=0, next_ms=None, at_ms=1))


# --- jitter ----------------------------------------------------------------------------------

@settings(deadline=None, max_examples=examples(200))
@given(job=st.text(min_size=1, max_size=24), occurrence=st.integers(0, limits.timestamp_ms_max),
       jitter_ms=st.integers(0, limits.jitter_s_max * 1000))
def test_a_delay_is_stable_and_within_the_jitter(job, occurrence, jitter_ms):
    delay = sch.fire_delay_ms(job, occurrence, jitter_ms)
    assert 0 <= delay <= jitter_ms
    assert delay == sch.fire_delay_ms(job, occurrence, jitter_ms)


def test_delays_differ_between_occurrences():
    delays = {sch.fire_delay_ms(JOB, k * 3_600_000, 600_000) for k in range(50)}
    assert len(delays) > 40


def job_record(schedule: dict, next_ms: int, jitter_ms: int = 0, misfire: dict | None = None):
    spec = {"schedule": schedule, "misfire": misfire or dict(firing.DEFAULT_MISFIRE)}
    if jitter_ms:
        spec["jitter_ms"] = jitter_ms
    return {"id": JOB, "next_ms": next_ms, "spec": spec}


def test_a_jittered_occurrence_is_fired_once_at_its_delay():
    every = {"kind": "every", "every_ms": 10_000}
    job = job_record(every, 10_000, jitter_ms=30_000)
    due = firing.due_at_ms(job, 10_000)
    assert due == 10_000 + sch.fire_delay_ms(JOB, 10_000, 30_000) > 10_000
    assert firing.fire_item(job, 10_000, due) is None   # not the armed entry's key
    item = firing.fire_item(job, due, due)
    assert item[:2] == (JOB, 10_000)
    # Only the occurrences surely due are covered: the next one is armed on its own.
    assert item[3] == [10_000]
    assert item[2] == sch.next_fire_ms(every, max(10_000, due - 30_000))


def test_the_catch_up_window_leaves_older_occurrences_out():
    every = {"kind": "every", "every_ms": 10_000}
    job = job_record(every, 0, misfire={"policy": "fire_all", "tolerance_ms": 0,
                                        "catchup_max": 100, "catchup_window_ms": 25_000})
    _, first, next_ms, occurrences, omitted = firing.fire_item(job, 0, 95_000)
    assert (first, occurrences, omitted, next_ms) == (0, [0, 70_000, 80_000, 90_000], True,
                                                      100_000)
    decided = misfire_decisions(job["spec"]["misfire"], occurrences, 95_000)
    assert [(o, state) for o, state, _ in decided] == [
        (0, "missed"), (70_000, "queued"), (80_000, "queued"), (90_000, "queued")]
    assert "catch-up window" in decided[0][2]


def test_lateness_is_counted_from_the_jittered_time():
    skip = {"policy": "skip", "tolerance_ms": 1_000, "catchup_max": 100}
    late = misfire_decisions(skip, [10_000], 15_000)
    assert late[0][1] == lifecycle.SKIPPED
    on_time = misfire_decisions(skip, [10_000], 15_000, lambda o: o + 4_500)
    assert on_time[0][1] == lifecycle.QUEUED


# --- in apply ----------------------------------------------------------------------------

SHARDS = 8


def create(log: Replica, spec_over: dict, next_ms: int = 10_000) -> dict:
    spec = {"name": "j", "schedule": {"kind": "every", "every_ms": 10_000, "text": "10s"},
            "target": {**HTTP, "method": "POST", "headers": {}, "body": None, "timeout_s": 5.0},
            "retry": {"max_attempts": 1}, "concurrency": {"policy": "allow"}, "metadata": {},
            "misfire": dict(firing.DEFAULT_MISFIRE), **spec_over}
    shard = keys.shard_of(JOB, SHARDS)
    log.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=1))
    return log.run(commands.create_job(job_id=JOB, tenant="t", spec=spec, idempotency_key=None,
                                       shard=shard, next_ms=next_ms, at_ms=1))


def fire(log: Replica, now: int) -> dict:
    job = log.store.get(JOBS, JOB.encode())
    due = firing.due_at_ms(job, job["next_ms"])
    item = firing.fire_item(job, due, now)
    return log.run(commands.fire(shard=job["shard"], token=1, upto_ms=now, node="n1",
                                 at_ms=now, items=[item]))


def test_apply_keys_a_jittered_due_entry_by_its_fire_time_and_records_the_delay():
    log = Replica()
    create(log, {"jitter_ms": 5_000})
    delay = sch.fire_delay_ms(JOB, 10_000, 5_000)
    [(key, _)] = log.store.scan(DUE)
    assert keys.parse_due_key(key)[1] == 10_000 + delay
    assert fire(log, 10_000 + delay)["fired"] == 1
    run = log.store.get(RUNS, keys.run_id(JOB, 10_000).encode())
    assert run["scheduled_ms"] == 10_000          # the occurrence keeps its identity
    assert run["jitter_ms"] == delay
    [(key, _)] = log.store.scan(DUE)
    assert keys.parse_due_key(key)[1] == firing.due_at_ms(log.store.get(JOBS, JOB.encode()),
                                                          20_000)
    # Pausing removes the jittered entry (it is found by the same delay).
    log.run(commands.pause_job(job_id=JOB, at_ms=12_000, note="maintenance"))
    assert log.store.scan(DUE) == []


def test_a_schedule_past_not_after_completes_its_job():
    log = Replica()
    create(log, {"schedule": {"kind": "every", "every_ms": 10_000, "not_after_ms": 20_000}})
    fire(log, 10_000)
    assert log.store.get(JOBS, JOB.encode())["status"] == "active"
    fire(log, 20_000)
    job = log.store.get(JOBS, JOB.encode())
    assert (job["status"], job["next_ms"], job["updated_ms"]) == ("completed", None, 20_000)
    assert log.store.scan(DUE) == []


def test_a_pause_keeps_its_note_until_resume():
    log = Replica()
    create(log, {})
    paused = log.run(commands.pause_job(job_id=JOB, at_ms=2_000, note="db migration"))["job"]
    assert (paused["status"], paused["pause_note"], paused["paused_ms"]) == \
        ("paused", "db migration", 2_000)
    again = log.run(commands.pause_job(job_id=JOB, at_ms=3_000, note="still migrating"))["job"]
    assert again["pause_note"] == "still migrating"
    assert again["paused_ms"] == 2_000
    same = log.run(commands.pause_job(job_id=JOB, at_ms=4_000))["job"]
    assert same["pause_note"] == "still migrating" and same["version"] == again["version"]
    resumed = log.run(commands.resume_job(job_id=JOB, next_ms=50_000, at_ms=5_000))["job"]
    assert resumed["pause_note"] is None and resumed["paused_ms"] is None


@settings(deadline=None, max_examples=examples(200))
@given(every_s=st.integers(1, 600), due_steps=st.integers(0, 100),
       late_ms=st.integers(0, 5_000_000), window_ms=st.integers(1, 3_000_000),
       limit=st.integers(1, 50))
def test_a_window_covers_the_due_occurrence_and_only_recent_others(every_s, due_steps, late_ms,
                                                                    window_ms, limit):
    spec = {"kind": "every", "every_ms": every_s * 1000}
    due = due_steps * spec["every_ms"]
    now = due + late_ms
    start = now - window_ms
    occurrences, omitted, next_ms = sch.covered_occurrences(spec, due, now, limit, start)
    assert occurrences[0] == due
    assert all(a < b for a, b in zip(occurrences, occurrences[1:]))
    assert all(start <= o <= now for o in occurrences[1:])
    assert next_ms > now
    in_window = [o for o in range(due + spec["every_ms"], now + 1, spec["every_ms"])
                 if o >= start]
    left_out = [o for o in range(due + spec["every_ms"], now + 1, spec["every_ms"])
                if o < start]
    assert omitted == (bool(left_out) or len(in_window) > limit)
    if len(in_window) <= limit:
        assert occurrences[1:] == in_window
    else:
        assert occurrences[-1] == in_window[-1]
