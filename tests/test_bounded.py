"""bounded_int and bounded_float accept exactly the numbers in range, refuse bools, NaN and infinities, and name the field and the limit."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import raftsched
from raftsched.core.bounded import bounded_float, bounded_int
from raftsched.core.jobspec import validate_create
from raftsched.errors import InvalidInput


def test_an_int_in_range_is_returned_as_is():
    assert bounded_int(1, "f", 1, 10) == 1
    assert bounded_int(10, "f", 1, 10) == 10


@pytest.mark.parametrize("value", [True, False, 1.0, "3", None, [1], 0, 11, -(2 ** 70)])
def test_an_int_refuses_bools_other_types_and_out_of_range(value):
    with pytest.raises(InvalidInput) as caught:
        bounded_int(value, "retry.max_attempts", 1, 10, limit="retry_max_attempts_max")
    assert caught.value.field == "retry.max_attempts"
    assert caught.value.limit == "retry_max_attempts_max"
    assert caught.value.detail == "`retry.max_attempts` must be an integer from 1 to 10"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "1", None, -0.5, 3601])
def test_a_float_refuses_nan_infinities_bools_other_types_and_out_of_range(value):
    with pytest.raises(InvalidInput) as caught:
        bounded_float(value, "target.timeout_s", 0.1, 3600.0, limit="target_timeout_s_max")
    assert caught.value.field == "target.timeout_s"
    assert caught.value.limit == "target_timeout_s_max"
    assert caught.value.detail == "`target.timeout_s` must be a number from 0.1 to 3600"


def test_a_float_takes_ints_and_says_its_unit():
    assert bounded_float(5, "jitter_s", 0, 3600) == 5.0
    assert isinstance(bounded_float(5, "jitter_s", 0, 3600), float)
    with pytest.raises(InvalidInput, match="must be a number of seconds from 0 to 3600"):
        bounded_float(-1, "jitter_s", 0, 3600, unit="seconds")


@given(st.integers(min_value=-(2 ** 64), max_value=2 ** 64),
       st.integers(min_value=-1000, max_value=1000), st.integers(min_value=0, max_value=1000))
def test_int_accepts_exactly_the_range(value, lo, width):
    hi = lo + width
    if lo <= value <= hi:
        assert bounded_int(value, "f", lo, hi) == value
    else:
        with pytest.raises(InvalidInput):
            bounded_int(value, "f", lo, hi)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_float_accepts_exactly_the_finite_range(value):
    if math.isfinite(value) and -1.5 <= value <= 1e6:
        assert bounded_float(value, "f", -1.5, 1e6) == value
    else:
        with pytest.raises(InvalidInput):
            bounded_float(value, "f", -1.5, 1e6)


def test_job_fields_go_through_it():
    # One field of each kind the job spec bounds: their errors have the same shape.
    base = {"name": "n", "schedule": {"cron": "0 3 * * *"},
            "target": {"type": "http", "url": "https://example.com/x"}}
    for member, value, field in (("retry", {"max_attempts": True}, "retry.max_attempts"),
                                 ("retry", {"base_s": math.nan}, "retry.base_s"),
                                 ("jitter_s", math.inf, "jitter_s"),
                                 ("history", {"max_age_s": 0.5}, "history.max_age_s")):
        with pytest.raises(InvalidInput) as caught:
            validate_create(dict(base, **{member: value}))
        assert caught.value.field == field
        assert caught.value.limit is not None
        assert " must be " in caught.value.detail


# Type-and-range checks written by hand, the pattern bounded.py replaces.
_HAND_MADE = re.compile(r"isinstance\((?P<v>[^,()]+), bool\) or not isinstance\((?P=v), "
                        r"(int|\(int, float\))\)"
                        r"|isinstance\((?P<w>[^,()]+), int\) and not isinstance\((?P=w), bool\)")
# (module, why it checks a number itself).
_HAND_MADE_ALLOWED = {
    "core/commands.py": "a command's version is any integer, compared with the versions known",
    "core/bounded.py": "the one implementation",
}


def test_no_hand_made_number_check_outside_bounded():
    package = Path(raftsched.__file__).resolve().parent
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith("testing/") or rel in _HAND_MADE_ALLOWED:
            continue
        found += [f"{rel}: {m.group(0)}" for m in _HAND_MADE.finditer(path.read_text())]
    assert not found, "use core/bounded.py (bounded_int, bounded_float, refusal): " + str(found)


def test_the_hand_made_pattern_is_recognised():
    assert _HAND_MADE.search("if isinstance(n, bool) or not isinstance(n, int) or n < 0:")
    assert _HAND_MADE.search("isinstance(x, bool) or not isinstance(x, (int, float))")
    assert _HAND_MADE.search("isinstance(c, int) and not isinstance(c, bool) and c <= 255")
