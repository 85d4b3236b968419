"""Schedules: parsing, next fire across DST (Debian cron's rules), misfire coverage.

DST dates used (2026):
  America/New_York   spring 03-08 02:00 -> 03:00    autumn 11-01 02:00 -> 01:00
  Europe/Berlin      spring 03-29 02:00 -> 03:00    autumn 10-25 03:00 -> 02:00
  Australia/Lord_Howe autumn 04-05 02:00 -> 01:30   spring 10-04 02:00 -> 02:30
  Antarctica/Troll   spring 03-29 01:00 -> 03:00    autumn 10-25 03:00 -> 01:00
  Asia/Kolkata       no DST (+05:30)
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import example, given, settings
from hypothesis import strategies as st

from raftsched import limits
from raftsched.core import schedule as sch
from raftsched.core.timeutil import datetime_to_ms, ms_to_datetime
from raftsched.errors import InvalidInput
from raftsched.testing.proptest import examples

UTC = dt.timezone.utc


def ms(text: str) -> int:
    """RFC 3339 with offset -> Unix ms."""
    return datetime_to_ms(dt.datetime.fromisoformat(text))


def utc(value_ms: int) -> str:
    return ms_to_datetime(value_ms, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fires(cron: str, tz: str, after: str, count: int) -> list[str]:
    spec = sch.parse_schedule({"cron": cron, "timezone": tz}, None)
    return [utc(t) for t in sch.preview_ms(spec, ms(after), count)]


# --- DST: the table of cases ------------------------------------------------------------

DST_CASES = [
    # daily, fixed time inside the spring gap: the first instant after the gap
    ("30 2 * * *", "America/New_York", "2026-03-07T12:00:00-05:00",
     ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    ("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00+01:00",
     ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
    ("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00+10:30",
     ["2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"]),
    # daily, fixed time inside the autumn fold: once, in the first copy
    ("30 1 * * *", "America/New_York", "2026-10-31T12:00:00-04:00",
     ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
    ("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00+02:00",
     ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
    ("45 1 * * *", "Australia/Lord_Howe", "2026-04-04T12:00:00+11:00",
     ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]),
    # daily, outside the transitions: just the local time
    ("30 2 * * *", "America/New_York", "2026-10-31T12:00:00-04:00",
     ["2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"]),
    ("30 2 * * *", "Asia/Kolkata", "2026-03-07T12:00:00+05:30",
     ["2026-03-07T21:00:00Z", "2026-03-08T21:00:00Z", "2026-03-09T21:00:00Z"]),
    # hourly (wildcard hour): the missing hour is skipped, the repeated hour fires twice
    ("0 * * * *", "America/New_York", "2026-03-08T00:30:00-05:00",
     ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"]),
    ("0 * * * *", "America/New_York", "2026-11-01T00:30:00-04:00",
     ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"]),
    ("0 * * * *", "Europe/Berlin", "2026-10-25T01:30:00+02:00",
     ["2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"]),
    ("0 * * * *", "Australia/Lord_Howe", "2026-04-05T00:30:00+11:00",
     ["2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z"]),
    ("0 * * * *", "Asia/Kolkata", "2026-03-08T00:30:00+05:30",
     ["2026-03-07T19:30:00Z", "2026-03-07T20:30:00Z", "2026-03-07T21:30:00Z"]),
    # every 30 minutes (stepped minute): both copies of a repeated half hour
    ("*/30 * * * *", "Europe/Berlin", "2026-10-25T01:45:00+02:00",
     ["2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z",
      "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"]),
    ("*/30 * * * *", "Europe/Berlin", "2026-03-29T00:45:00+01:00",
     ["2026-03-29T00:00:00Z", "2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z"]),
    ("*/30 * * * *", "Australia/Lord_Howe", "2026-04-05T00:45:00+11:00",
     ["2026-04-04T14:00:00Z", "2026-04-04T14:30:00Z", "2026-04-04T15:00:00Z",
      "2026-04-04T15:30:00Z"]),
    # 01:30 (+10:30), then 02:00 does not exist, then 02:30 (+11:00), 03:00
    ("*/30 * * * *", "Australia/Lord_Howe", "2026-10-04T01:15:00+10:30",
     ["2026-10-03T15:00:00Z", "2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z"]),
    ("*/30 * * * *", "America/New_York", "2026-11-01T00:45:00-04:00",
     ["2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:00:00Z",
      "2026-11-01T06:30:00Z", "2026-11-01T07:00:00Z"]),
    # ranged hour (a fixed-time schedule): once in the fold; the gap hour moves
    # to the end of the gap, where it coincides with 03:00 and fires once
    ("0 1-3 * * *", "America/New_York", "2026-11-01T00:00:00-04:00",
     ["2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z",
      "2026-11-02T06:00:00Z"]),
    ("0 1-3 * * *", "America/New_York", "2026-03-08T00:00:00-05:00",
     ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-09T05:00:00Z"]),
    ("0 1-3 * * *", "Europe/Berlin", "2026-10-25T00:00:00+02:00",
     ["2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z",
      "2026-10-26T00:00:00Z"]),
    ("0 1-3 * * *", "Asia/Kolkata", "2026-03-08T00:00:00+05:30",
     ["2026-03-07T19:30:00Z", "2026-03-07T20:30:00Z", "2026-03-07T21:30:00Z",
      "2026-03-08T19:30:00Z"]),
    # Shifts that are not one hour follow the same rules. Lord Howe's repeated
    # half hour (01:30-02:00): a stepped minute fires in both copies of 01:40,
    # the second at 15:10Z, though the first copy of 01:20 comes before the fold.
    ("*/20 1-3 * * *", "Australia/Lord_Howe", "2026-04-05T00:30:00+11:00",
     ["2026-04-04T14:00:00Z", "2026-04-04T14:20:00Z", "2026-04-04T14:40:00Z",
      "2026-04-04T15:10:00Z", "2026-04-04T15:30:00Z", "2026-04-04T15:50:00Z"]),
    # its missing half hour (02:00-02:30): 02:00 and 02:20 do not exist
    ("*/20 1-3 * * *", "Australia/Lord_Howe", "2026-10-04T00:30:00+10:30",
     ["2026-10-03T14:30:00Z", "2026-10-03T14:50:00Z", "2026-10-03T15:10:00Z",
      "2026-10-03T15:40:00Z", "2026-10-03T16:00:00Z"]),
    # a fixed time in the repeated half hour: once, in the first copy
    ("40 1 * * *", "Australia/Lord_Howe", "2026-04-04T12:00:00+11:00",
     ["2026-04-04T14:40:00Z", "2026-04-05T15:10:00Z"]),
    # Troll moves by two hours: a fixed time in its two-hour gap fires at its end
    ("30 2 * * *", "Antarctica/Troll", "2026-03-28T12:00:00+00:00",
     ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
    ("30 1 * * *", "Antarctica/Troll", "2026-10-24T12:00:00+02:00",
     ["2026-10-24T23:30:00Z", "2026-10-26T01:30:00Z"]),
    # and an hourly schedule fires in both copies of 01:00 and of 02:00
    ("0 * * * *", "Antarctica/Troll", "2026-10-25T00:30:00+02:00",
     ["2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z",
      "2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"]),
]


@pytest.mark.parametrize("cron, tz, after, expected", DST_CASES,
                         ids=[f"{c[1]}:{c[0]}:{c[2][:10]}" for c in DST_CASES])
def test_dst_rules(cron, tz, after, expected):
    assert fires(cron, tz, after, len(expected)) == expected


def test_six_field_schedules_follow_the_same_rules():
    # A stepped seconds field makes the schedule wildcard: both copies of 01:30.
    got = fires("*/20 30 1 * * *", "America/New_York", "2026-11-01T01:00:00-04:00", 6)
    assert got == ["2026-11-01T05:30:00Z", "2026-11-01T05:30:20Z", "2026-11-01T05:30:40Z",
                   "2026-11-01T06:30:00Z", "2026-11-01T06:30:20Z", "2026-11-01T06:30:40Z"]
    # Fixed seconds, minute and hour: the first copy only.
    got = fires("0 30 1 * * *", "America/New_York", "2026-11-01T01:00:00-04:00", 2)
    assert got == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]


def test_wildcard_rule_looks_at_seconds_minute_and_hour_only():
    assert sch.is_wildcard("*/5 * * * * *")
    assert sch.is_wildcard("0 * * * *")
    assert sch.is_wildcard("*/30 2 * * *")
    assert not sch.is_wildcard("0 1-3 * * *")
    assert not sch.is_wildcard("30 2 * * *")
    assert not sch.is_wildcard("0 30 2 * * *")
    assert not sch.is_wildcard("0 2 */2 * *")   # stepped day: still a fixed time of day


# --- parsing ------------------------------------------------------------------------------

def test_six_fields_have_seconds_first():
    spec = sch.parse_schedule({"cron": "*/5 * * * * *"}, None)
    start = ms("2026-01-01T00:00:01+00:00")
    assert [utc(t) for t in sch.preview_ms(spec, start, 3)] == [
        "2026-01-01T00:00:05Z", "2026-01-01T00:00:10Z", "2026-01-01T00:00:15Z"]


@pytest.mark.parametrize("macro, expanded", sorted(sch.MACROS.items()))
def test_macros_expand(macro, expanded):
    assert sch.parse_schedule({"cron": macro}, None)["cron"] == expanded
    assert sch.parse_schedule({"cron": macro.upper()}, None)["cron"] == expanded


def test_default_timezone_is_utc_and_whitespace_is_collapsed():
    spec = sch.parse_schedule({"cron": "  0   2 * *  * "}, None)
    assert spec == {"kind": "cron", "cron": "0 2 * * *", "timezone": "UTC"}


def test_every_is_epoch_aligned():
    spec = sch.parse_schedule({"every": "1h30m"}, None)
    assert spec["every_ms"] == 5_400_000
    assert sch.next_fire_ms(spec, 5_400_000) == 10_800_000
    assert sch.next_fire_ms(spec, 5_399_999) == 5_400_000


def test_run_at_keeps_its_offset_and_fires_once_even_if_past():
    spec = sch.parse_schedule(None, "2026-10-11T02:00:00+05:30")
    assert spec == {"kind": "once", "run_at_ms": ms("2026-10-11T02:00:00+05:30"),
                    "offset_min": 330}
    assert sch.next_fire_ms(spec, spec["run_at_ms"] + 10_000) == spec["run_at_ms"]
    assert sch.preview_ms(spec, 0, 5) == [spec["run_at_ms"]]


@pytest.mark.parametrize("schedule, run_at, field", [
    ({"cron": "61 * * * *"}, None, "schedule.cron"),
    ({"cron": "* * * *"}, None, "schedule.cron"),
    ({"cron": "0 0 30 2 *"}, None, "schedule.cron"),          # never fires
    ({"cron": "@fortnightly"}, None, "schedule.cron"),
    ({"cron": ""}, None, "schedule.cron"),
    ({"cron": 5}, None, "schedule.cron"),
    ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, None, "schedule.timezone"),
    ({"cron": "0 2 * * *", "timezone": ""}, None, "schedule.timezone"),
    ({"cron": "0 2 * * *", "tz": "UTC"}, None, "schedule.tz"),
    ({"every": "10 parsecs"}, None, "schedule.every"),
    ({"every": "0s"}, None, "schedule.every"),
    ({"every": "400d"}, None, "schedule.every"),
    ({"every": "10s", "timezone": "UTC"}, None, "schedule.timezone"),
    ({"every": "10s", "cron": "* * * * *"}, None, "schedule"),
    ({}, None, "schedule"),
    ("0 2 * * *", None, "schedule"),
    (None, None, "schedule"),
    ({"cron": "0 2 * * *"}, "2026-01-01T00:00:00Z", "schedule"),
    (None, "tomorrow", "run_at"),
    (None, "2026-01-01T00:00:00", "run_at"),                 # no offset
    (None, 1767225600, "run_at"),
])
def test_bad_schedules_name_the_field(schedule, run_at, field):
    with pytest.raises(InvalidInput) as exc:
        sch.parse_schedule(schedule, run_at)
    assert exc.value.field == field
    assert exc.value.status == 400


def test_every_limits_are_named():
    with pytest.raises(InvalidInput) as exc:
        sch.parse_schedule({"every": "0s"}, None)
    assert exc.value.limit == "every_ms_min"
    with pytest.raises(InvalidInput) as exc:
        sch.parse_schedule({"every": "367d"}, None)
    assert exc.value.limit == "every_ms_max"


def test_a_cron_expression_is_bounded_to_what_a_person_writes():
    longest = "0 " + ",".join(["1"] * ((limits.cron_expression_bytes_max - 10) // 2)) + " * * *"
    assert len(longest) <= limits.cron_expression_bytes_max
    assert sch.parse_schedule({"cron": longest}, None)["cron"] == longest
    too_long = "0 " + ",".join(["1"] * (limits.cron_expression_bytes_max // 2)) + " * * *"
    with pytest.raises(InvalidInput) as exc:
        sch.parse_schedule({"cron": too_long}, None)
    assert (exc.value.status, exc.value.field) == (400, "schedule.cron")
    assert exc.value.limit == "cron_expression_bytes_max"


def test_an_expression_is_parsed_once_whatever_job_gives_it(monkeypatch):
    parsed = []
    real = sch.croniter

    def counting(expr, *args, **kwargs):
        parsed.append(expr)
        return real(expr, *args, **kwargs)
    sch._checked_cron.cache_clear()
    monkeypatch.setattr(sch, "croniter", counting)
    for _ in range(3):
        assert sch.normalise_cron("5  4 * * 1-5", "schedule.cron") == "5 4 * * 1-5"
        with pytest.raises(InvalidInput) as exc:   # a refusal is kept too
            sch.normalise_cron("61 * * * *", "dag.schedule.cron")
        assert exc.value.field == "dag.schedule.cron"
    assert parsed == ["5 4 * * 1-5", "61 * * * *"]
    assert sch._checked_cron.cache_info().maxsize == limits.cron_parse_cache_max


# --- misfire coverage ---------------------------------------------------------------------

EVERY_10S = {"kind": "every", "every_ms": 10_000}


def test_on_time_fire_covers_one_occurrence():
    assert sch.covered_occurrences(EVERY_10S, 20_000, 20_050, 100) == ([20_000], False, 30_000)


def test_late_fire_covers_every_missed_occurrence():
    assert sch.covered_occurrences(EVERY_10S, 0, 35_000, 100) == (
        [0, 10_000, 20_000, 30_000], False, 40_000)


def test_catchup_limit_keeps_the_first_and_the_latest():
    occurrences, omitted, next_ms = sch.covered_occurrences(EVERY_10S, 0, 95_000, 3)
    assert occurrences == [0, 10_000, 20_000, 90_000]
    assert omitted is True
    assert next_ms == 100_000


def test_catchup_limit_reached_exactly_omits_nothing():
    occurrences, omitted, _ = sch.covered_occurrences(EVERY_10S, 0, 35_000, 3)
    assert occurrences == [0, 10_000, 20_000, 30_000]
    assert omitted is False


def test_one_off_covers_itself_only():
    spec = {"kind": "once", "run_at_ms": 5_000, "offset_min": 0}
    assert sch.covered_occurrences(spec, 5_000, 99_000, 100) == ([5_000], False, None)


def test_cron_catchup_over_a_day():
    spec = sch.parse_schedule({"cron": "0 */6 * * *"}, None)
    due = ms("2026-05-01T00:00:00+00:00")
    now = ms("2026-05-02T07:00:00+00:00")
    occurrences, omitted, next_ms = sch.covered_occurrences(spec, due, now, 100)
    assert [utc(o) for o in occurrences] == [
        "2026-05-01T00:00:00Z", "2026-05-01T06:00:00Z", "2026-05-01T12:00:00Z",
        "2026-05-01T18:00:00Z", "2026-05-02T00:00:00Z", "2026-05-02T06:00:00Z"]
    assert not omitted
    assert utc(next_ms) == "2026-05-02T12:00:00Z"


def test_latest_at_or_before():
    assert sch.latest_at_or_before(EVERY_10S, 35_000, 0) == 30_000
    assert sch.latest_at_or_before(EVERY_10S, 35_000, 33_000) == 33_000
    daily = sch.parse_schedule({"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, None)
    now = ms("2026-07-10T12:00:00+02:00")
    floor = ms("2026-01-01T00:00:00+00:00")
    assert sch.latest_at_or_before(daily, now, floor) == ms("2026-07-10T02:00:00+02:00")
    yearly = sch.parse_schedule({"cron": "@yearly"}, None)
    assert sch.latest_at_or_before(yearly, now, floor) == ms("2026-01-01T00:00:00+00:00")
    # nothing in [floor, now]: floor itself
    assert sch.latest_at_or_before(yearly, now, floor + 1) == floor + 1


# --- properties -------------------------------------------------------------------------

ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata",
         "America/Santiago", "Pacific/Chatham", "Europe/London", "Antarctica/Troll"]
FIXED_ZONES = ["UTC", "Asia/Kolkata", "Asia/Tokyo"]

minute_field = st.one_of(st.integers(0, 59).map(str), st.just("*"),
                         st.sampled_from(["*/5", "*/15", "*/30", "0,30", "10-20", "*/20",
                                          "*/7", "20,40"]))
hour_field = st.one_of(st.integers(0, 23).map(str), st.just("*"),
                       st.sampled_from(["*/2", "*/6", "1-3", "0,12", "2"]))
day_field = st.sampled_from(["*", "1", "15", "*/2", "1-7"])
weekday_field = st.sampled_from(["*", "0", "1-5", "6"])
crons = st.builds(lambda m, h, d, w: f"{m} {h} {d} * {w}",
                  minute_field, hour_field, day_field, weekday_field)
instants = st.integers(ms("2020-01-01T00:00:00+00:00"), ms("2035-12-31T00:00:00+00:00"))


@settings(deadline=None, max_examples=examples(300))
@given(cron=crons, tz=st.sampled_from(ZONES), after=instants)
def test_next_fire_is_strictly_later_and_nothing_lies_between(cron, tz, after):
    first = sch.next_fire_cron(cron, tz, after)
    assert first is not None and first > after
    # Asking from any instant between `after` and the answer gives the same answer.
    for probe in {after + 1, (after + first) // 2, first - 1}:
        if after <= probe < first:
            assert sch.next_fire_cron(cron, tz, probe) == first


@settings(deadline=None, max_examples=examples(300))
@given(cron=crons, tz=st.sampled_from(ZONES), after=instants)
def test_fire_wall_time_matches_the_expression_or_ends_a_gap(cron, tz, after):
    zone = ZoneInfo(tz)
    fired = sch.next_fire_cron(cron, tz, after)
    local = ms_to_datetime(fired, zone)
    wall = local.replace(tzinfo=None)
    if croniter.match(cron, wall):
        return
    # Otherwise the schedule's local time did not exist: a fixed-time schedule
    # fires at the first instant after a gap, where the offset just changed.
    assert not sch.is_wildcard(cron)
    before = ms_to_datetime(fired - 1000, zone)
    assert before.utcoffset() < local.utcoffset(), (cron, tz, utc(fired))


@settings(deadline=None, max_examples=examples(200))
@given(cron=crons, tz=st.sampled_from(FIXED_ZONES), after=instants)
def test_without_dst_it_is_plain_croniter(cron, tz, after):
    zone = ZoneInfo(tz)
    start = ms_to_datetime(after, zone)
    expected = croniter(cron, start.replace(tzinfo=None), ret_type=dt.datetime).get_next()
    assert sch.next_fire_cron(cron, tz, after) == datetime_to_ms(expected.replace(tzinfo=zone))


@settings(deadline=None, max_examples=examples(150))
@given(cron=crons, tz=st.sampled_from(ZONES), after=instants, count=st.integers(1, 30))
def test_preview_is_strictly_increasing(cron, tz, after, count):
    spec = {"kind": "cron", "cron": cron, "timezone": tz}
    times = sch.preview_ms(spec, after, count)
    assert len(times) == count
    assert all(a < b for a, b in zip(times, times[1:]))
    assert times[0] > after


@settings(deadline=None, max_examples=examples(150))
@given(every_s=st.integers(1, 7200), due_steps=st.integers(0, 1000),
       late_ms=st.integers(0, 10_000_000), limit=st.integers(1, 100))
def test_covered_occurrences_every(every_s, due_steps, late_ms, limit):
    spec = {"kind": "every", "every_ms": every_s * 1000}
    due = due_steps * every_s * 1000
    now = due + late_ms
    occurrences, omitted, next_ms = sch.covered_occurrences(spec, due, now, limit)
    assert occurrences[0] == due
    assert all(a < b for a, b in zip(occurrences, occurrences[1:]))
    assert occurrences[-1] <= now < next_ms
    assert next_ms == occurrences[-1] + spec["every_ms"] or omitted or \
        next_ms == sch.next_fire_ms(spec, now)
    total = late_ms // spec["every_ms"] + 1          # occurrences in [due, now]
    assert len(occurrences) == min(total, limit + 1) or len(occurrences) == total
    assert omitted == (total > limit + 1)


# --- DST, by brute force -----------------------------------------------------------------

DST_ZONES = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Antarctica/Troll",
             "Pacific/Chatham", "America/Santiago", "Europe/London"]


def transitions(zone: str, year: int = 2026) -> list[int]:
    """The instants (ms) where the zone's UTC offset changes in `year`."""
    tz = ZoneInfo(zone)
    out, hour_ms = [], 3_600_000
    start = ms(f"{year}-01-01T00:00:00+00:00")
    for t in range(start, start + 366 * 24 * hour_ms, hour_ms):
        if ms_to_datetime(t, tz).utcoffset() != ms_to_datetime(t + hour_ms, tz).utcoffset():
            out.append(sch._transition_ms(t, t + hour_ms, tz))
    return out


TRANSITIONS = [(zone, t) for zone in DST_ZONES for t in transitions(zone)]


def expected_fires(cron: str, zone: str, start_ms: int, end_ms: int,
                   change_ms: int) -> list[int]:
    """Debian cron's rules, minute by minute over (start, end], around the one
    offset change at change_ms: a matching wall time that happens once fires;
    in a repeated period a wildcard schedule fires in both copies and a
    fixed-time one in the first; a fixed-time schedule whose time falls in a
    gap fires at the gap's end."""
    tz = ZoneInfo(zone)
    wildcard = sch.is_wildcard(cron)
    fired = set()
    for t in range(start_ms - start_ms % 60_000 + 60_000, end_ms + 1, 60_000):
        local = ms_to_datetime(t, tz)
        wall = local.replace(tzinfo=None)
        if not croniter.match(cron, wall):
            continue
        repeated = (wall.replace(tzinfo=tz, fold=0).utcoffset()
                    != wall.replace(tzinfo=tz, fold=1).utcoffset())
        if wildcard or not repeated or local.fold == 0:
            fired.add(t)
    before = ms_to_datetime(change_ms - 60_000, tz)
    after = ms_to_datetime(change_ms, tz)
    if not wildcard and after.utcoffset() > before.utcoffset() and start_ms < change_ms <= end_ms:
        minute = before.replace(tzinfo=None) + dt.timedelta(minutes=1)
        while minute < after.replace(tzinfo=None):   # the wall times that do not exist
            if croniter.match(cron, minute):
                fired.add(change_ms)
            minute += dt.timedelta(minutes=1)
    return sorted(fired)


LORD_HOWE_FOLD = ("Australia/Lord_Howe", ms("2026-04-05T02:00:00+11:00"))
FOLDS = [(zone, t) for zone, t in TRANSITIONS
         if ms_to_datetime(t - 1000, ZoneInfo(zone)).utcoffset()
         > ms_to_datetime(t, ZoneInfo(zone)).utcoffset()]


@settings(deadline=None, max_examples=examples(80))
@given(cron=crons, where=st.sampled_from(TRANSITIONS),
       offset_min=st.integers(-180, 30), span_min=st.integers(60, 240))
@example(cron="*/20 1-3 * * *", where=LORD_HOWE_FOLD, offset_min=-90, span_min=120)
def test_fires_around_any_transition_follow_the_rules(cron, where, offset_min, span_min):
    """Whatever the size of the shift (one hour, 30 minutes at Lord Howe, two
    hours at Troll), the fires in a window around it are exactly what the
    rules give, computed minute by minute."""
    zone, change_ms = where
    start = change_ms + offset_min * 60_000
    end = start + span_min * 60_000
    spec = {"kind": "cron", "cron": cron, "timezone": zone}
    got = [t for t in sch.preview_ms(spec, start, span_min + 5) if t <= end]
    assert got == expected_fires(cron, zone, start, end, change_ms), (cron, zone, utc(start))


stepped_minutes = st.one_of(
    st.integers(2, 40).map(lambda step: f"*/{step}"),
    st.tuples(st.integers(0, 30), st.integers(2, 29)).map(lambda p: f"{p[0]}-59/{p[1]}"))


@settings(deadline=None, max_examples=examples(50))
@given(minute=stepped_minutes, hour=st.sampled_from(["*", "0-4", "1,2", "*/2"]),
       where=st.sampled_from(FOLDS), offset_min=st.integers(-130, -10))
@example(minute="*/4", hour="*", where=LORD_HOWE_FOLD, offset_min=-10)
def test_a_stepped_minute_fires_in_both_copies_of_any_repeated_period(minute, hour, where,
                                                                        offset_min):
    """The repeated period is 30 minutes at Lord Howe, an hour in most zones and
    two hours at Troll: every wall time in it that a stepped schedule names
    fires twice, whichever of its times come before the period starts."""
    zone, change_ms = where
    cron = f"{minute} {hour} * * *"
    start = change_ms + offset_min * 60_000
    end = change_ms + 130 * 60_000   # past the second copy of Troll's two hours
    spec = {"kind": "cron", "cron": cron, "timezone": zone}
    got = [t for t in sch.preview_ms(spec, start, 400) if t <= end]
    assert got == expected_fires(cron, zone, start, end, change_ms), (cron, zone, utc(start))
