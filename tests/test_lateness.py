"""The trigger-lateness histogram: every run counted, percentiles within a bucket."""

from hypothesis import given, settings, strategies as st

from raftsched.runtime.lateness import (BOUNDS_MS, BUCKET_GROWTH, LatenessHistogram, difference,
                                        merged_percentile)
from raftsched.testing.proptest import examples


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.integers(0, 600_000), min_size=1, max_size=300))
def test_a_percentile_is_the_bucket_of_the_exact_one(values):
    hist = LatenessHistogram()
    for v in values:
        hist.record(v)
    snap = hist.snapshot()
    assert snap["count"] == len(values) and snap["max_ms"] == max(values)
    exact = sorted(values)[max(0, -(-99 * len(values) // 100) - 1)]
    got = merged_percentile([snap], 99)
    # The bucket's upper bound: at or above the exact value, within one bucket's growth.
    assert exact <= got <= max(1, exact * BUCKET_GROWTH + 1)


def test_a_difference_holds_only_the_runs_between_two_snapshots():
    hist = LatenessHistogram()
    for v in (5, 5, 5000):
        hist.record(v)
    before = hist.snapshot()
    for v in (100, 100, 100, 100):
        hist.record(v)
    between = difference(hist.snapshot(), before)
    assert between["count"] == 4
    assert merged_percentile([between], 50) == min(b for b in BOUNDS_MS if b >= 100)


def test_early_runs_are_counted_apart_and_as_on_time():
    hist = LatenessHistogram()
    hist.record(-30)
    snap = hist.snapshot()
    assert snap["recorded_early"] == 1 and snap["count"] == 1 and snap["max_ms"] == 0
