"""Clocks are measured within half a round trip and judged against the median of all nodes."""

from __future__ import annotations

import logging
import math
import re
import time

import aiohttp
from hypothesis import given, settings, strategies as st

from raftsched import limits
from raftsched.core.clocks import Estimate, Sample, add_sample, best, judge, next_verdict, sample
from raftsched.runtime.clock import TEST_SHIFT_ENV, ClusterClock, monotonic_us
from raftsched.testing.proptest import examples

DRIFT_PPM = 500
BOUND_US = 500_000
REJOIN_US = 450_000


@settings(max_examples=examples(200), deadline=None)
@given(true_offset_us=st.integers(-10 ** 9, 10 ** 9), t0_us=st.integers(0, 10 ** 12),
       there_us=st.integers(0, 10 ** 6), back_us=st.integers(0, 10 ** 6))
def test_a_sample_is_within_half_the_round_trip_however_asymmetric(true_offset_us, t0_us,
                                                                   there_us, back_us):
    # The peer reads its clock after the request took there_us and before the
    # answer takes back_us: any split of the round trip.
    wall_us = t0_us + there_us + true_offset_us
    taken = sample(t0_us, wall_us, t0_us + there_us + back_us)
    assert abs(taken.offset_us - true_offset_us) <= taken.error_us
    assert taken.error_us <= (there_us + back_us) // 2 + 2


def test_the_best_sample_has_the_smallest_error_bound_counting_drift():
    quick = Sample(offset_us=100, error_us=50, taken_us=0)
    assert quick.error_at(1_000_000, DRIFT_PPM) == 550   # 500 ppm of a second
    slow_soon = Sample(offset_us=120, error_us=200, taken_us=100_000)
    assert best((quick, slow_soon), 100_000, DRIFT_PPM) == quick
    # A second on, the quick one has drifted too far to be worth more.
    slow_later = Sample(offset_us=120, error_us=200, taken_us=1_000_000)
    assert best((quick, slow_later), 1_000_000, DRIFT_PPM) == slow_later


def test_the_newest_samples_are_kept_and_a_step_voids_the_older_ones():
    kept: tuple[Sample, ...] = ()
    for i in range(10):
        kept = add_sample(kept, Sample(offset_us=1000 + i, error_us=100, taken_us=i * 1000),
                          kept_max=4, drift_ppm=DRIFT_PPM)
    assert [s.offset_us for s in kept] == [1006, 1007, 1008, 1009]
    stepped = Sample(offset_us=5_001_000, error_us=100, taken_us=20_000)
    assert add_sample(kept, stepped, kept_max=4, drift_ppm=DRIFT_PPM) == (stepped,)
    # Within both error bounds it is no step, only noise.
    close = Sample(offset_us=1150, error_us=100, taken_us=20_000)
    assert add_sample(kept, close, kept_max=4, drift_ppm=DRIFT_PPM)[-1] == close
    assert len(add_sample(kept, close, kept_max=4, drift_ppm=DRIFT_PPM)) == 4


def estimates(**offsets_ms: float) -> dict[str, Estimate]:
    return {node: Estimate(offset_us=int(ms * 1000), error_us=1000)
            for node, ms in offsets_ms.items()}


def test_an_outlier_is_judged_against_the_others_also_by_itself():
    # n1 measures: its own clock 5 s ahead of both peers'. Measured from n1,
    # the peers are 5 s behind; the median is theirs, so n1 is the outlier.
    seen_by_outlier = judge(estimates(n1=0, n2=-5000, n3=-5001), cluster_size=3,
                            bound_us=BOUND_US)
    assert seen_by_outlier.agreed
    assert seen_by_outlier.median_node in ("n2", "n3")
    assert 4999_000 <= seen_by_outlier.deviations_us["n1"] <= 5001_000
    assert abs(seen_by_outlier.deviations_us["n2"]) <= 1000
    # Seen from n2 the same clocks give the same verdicts.
    seen_by_peer = judge(estimates(n2=0, n1=5000, n3=-1), cluster_size=3, bound_us=BOUND_US)
    assert seen_by_peer.agreed
    assert 4999_000 <= seen_by_peer.deviations_us["n1"] <= 5001_000
    assert seen_by_peer.errors_us["n1"] == 2000   # its own error and the median's


def test_no_judgement_without_a_majority_that_agrees():
    # Two of three measured and 5 s apart: nobody can tell which is wrong.
    assert not judge(estimates(n1=0, n2=5000), cluster_size=3, bound_us=BOUND_US).agreed
    # Two of three that agree are a majority.
    assert judge(estimates(n1=0, n2=3), cluster_size=3, bound_us=BOUND_US).agreed
    # Alone in a cluster of one, a node agrees with itself.
    assert judge(estimates(n1=0), cluster_size=1, bound_us=BOUND_US).agreed
    # One of three measured is not enough.
    assert not judge(estimates(n1=0), cluster_size=3, bound_us=BOUND_US).agreed
    # Of an even count, the earlier of the two middle clocks is the median.
    assert judge(estimates(a=0, b=100, c=200, d=300), cluster_size=4,
                 bound_us=BOUND_US).median_node == "b"


def test_verdicts_need_certainty_and_come_back_a_little_inside_the_bound():
    assert next_verdict(None, 400_000, 1000, BOUND_US, REJOIN_US) is True
    assert next_verdict(None, -600_000, 1000, BOUND_US, REJOIN_US) is False
    # Within the error of the bound either way: the verdict stands.
    assert next_verdict(True, 500_500, 1000, BOUND_US, REJOIN_US) is True
    assert next_verdict(None, 500_500, 1000, BOUND_US, REJOIN_US) is None
    assert next_verdict(False, 499_500, 1000, BOUND_US, REJOIN_US) is False
    # Back in only once within the rejoin bound.
    assert next_verdict(False, 460_000, 1000, BOUND_US, REJOIN_US) is False
    assert next_verdict(False, -440_000, 1000, BOUND_US, REJOIN_US) is True


# --- the node's clock ------------------------------------------------------------------

def measure(clock: ClusterClock, node: str, ahead_ms: float, round_trip_us: int = 200) -> None:
    """A made-up exchange with a peer whose clock is `ahead_ms` ahead of the real time."""
    t0 = monotonic_us()
    wall = time.time_ns() // 1000 + round_trip_us // 2 + int(ahead_ms * 1000)
    clock.observe(node, t0, wall, t0 + round_trip_us)


def make_clock(tmp_path, shift_ms: float = 0, cluster_size: int = 3) -> ClusterClock:
    (tmp_path / "shift").write_text(str(shift_ms))
    return ClusterClock(node_id="n1", cluster_size=cluster_size, max_skew_ms=500,
                        data_dir=str(tmp_path), env={TEST_SHIFT_ENV: "shift"})


def set_shift(clock: ClusterClock, tmp_path, shift_ms: float) -> None:
    (tmp_path / "shift").write_text(str(shift_ms))
    clock._shift._read_at = -math.inf   # type: ignore[union-attr]   # re-read at once


def test_a_node_alone_is_synced_at_once_and_reads_its_wall_clock(tmp_path):
    clock = make_clock(tmp_path, cluster_size=1)
    assert clock.synced()
    assert abs(clock.now_ms() - time.time() * 1000) < 50


def test_a_node_ahead_keeps_the_cluster_time_and_judges_itself_out(tmp_path, caplog):
    clock = make_clock(tmp_path, shift_ms=5000)
    assert not clock.synced()   # its trigger fires nothing yet
    # (Margins of 250 ms against a 5 s step: a test process may be descheduled
    # between two reads while the fast tier runs in parallel.)
    assert clock.now_ms() - time.time() * 1000 > 4750   # its own clock until then
    measure(clock, "n2", 0)
    measure(clock, "n3", 1)
    with caplog.at_level(logging.ERROR, logger="raftsched.clock"):
        clock.evaluate()
    assert clock.synced()
    assert abs(clock.now_ms() - time.time() * 1000) < 250   # the others' time, not its own
    assert clock.out_of_bound() == {"n1"}
    assert 4750 <= clock.offsets_ms()["n1"] <= 5250
    assert re.search(r"this node's wall clock is (4[7-9]\d\d|5[0-2]\d\d) ms ahead of the "
                     r"cluster's time",
                     caplog.text), caplog.text
    # Back in bound: in again, and a step of its own wall clock moves nothing.
    set_shift(clock, tmp_path, 0)
    clock.evaluate()
    assert clock.out_of_bound() == set()
    set_shift(clock, tmp_path, -5000)
    assert abs(clock.now_ms() - time.time() * 1000) < 250
    clock.evaluate()
    assert clock.out_of_bound() == {"n1"}
    assert abs(clock.now_ms() - time.time() * 1000) < 250


def test_a_peer_behind_is_out_and_the_cluster_time_is_not_moved_by_it(tmp_path):
    clock = make_clock(tmp_path)
    measure(clock, "n2", -5000)
    clock.evaluate()
    assert not clock.synced()   # two clocks that disagree: no judgement
    measure(clock, "n3", 2)
    clock.evaluate()
    assert clock.synced()
    assert clock.out_of_bound() == {"n2"}
    assert abs(clock.now_ms() - time.time() * 1000) < 50
    # Within the bound nothing is out.
    measure(clock, "n2", 300)
    clock.evaluate()
    assert clock.out_of_bound() == set()
    assert 250 <= clock.offsets_ms()["n2"] <= 350


def test_the_cluster_time_errs_late_by_the_medians_error(tmp_path):
    clock = make_clock(tmp_path, shift_ms=5000)
    measure(clock, "n2", 0, round_trip_us=100_000)   # +-50 ms
    measure(clock, "n3", 0, round_trip_us=100_000)
    clock.evaluate()
    lag_ms = time.time() * 1000 - clock.now_ms()
    assert 40 <= lag_ms <= 100, lag_ms


async def test_clocks_are_measured_less_often_while_every_clock_is_within_the_bound(tmp_path):
    clock = make_clock(tmp_path)

    async def probe(session, node_id: str, url: str) -> None:   # the peers' answers, made up
        measure(clock, node_id, offsets[node_id])

    clock._probe = probe   # type: ignore[method-assign]
    peers = {"n2": "http://n2", "n3": "http://n3"}
    offsets = {"n2": 0, "n3": 1}
    assert await clock.measure_round(None, peers) == limits.clock_probe_period_stable_s
    assert limits.clock_probe_period_stable_s > limits.clock_probe_period_s
    offsets["n2"] = -5000   # out of bound: measured at the base period until it is back
    assert await clock.measure_round(None, peers) == limits.clock_probe_period_s
    offsets["n2"] = 0
    assert await clock.measure_round(None, peers) == limits.clock_probe_period_stable_s


async def test_the_cluster_applies_the_lowest_level_its_nodes_said(tmp_path):
    """A peer's clock answer says whether it drains and the level of the
    commands it applies; one that does not say (an earlier release), or has
    not answered yet, holds the cluster at the lowest level."""
    import json

    from raftsched.core import commands

    clock = make_clock(tmp_path)
    answers: dict[str, dict] = {}

    class Client:
        async def get(self, url: str, timeout_s: float, params=None):
            node_id = url.split("//")[1].split("/")[0]
            return 200, json.dumps({"node": node_id, "wall_us": clock.wall_us(),
                                    **answers[node_id]}).encode()

    peers = {"n2": "http://n2", "n3": "http://n3"}
    assert clock.cluster_applies() == commands.APPLY_LEVEL_UNSAID   # nobody heard yet
    answers.update(n2={"applies": commands.APPLY_LEVEL, "draining": True}, n3={})
    await clock.measure_round(Client(), peers)
    assert clock.cluster_applies() == commands.APPLY_LEVEL_UNSAID
    assert clock.draining() == {"n2"}
    answers["n3"] = {"applies": commands.APPLY_LEVEL, "draining": False}
    answers["n2"]["draining"] = False
    await clock.measure_round(Client(), peers)
    assert clock.cluster_applies() == commands.APPLY_LEVEL and clock.draining() == set()


async def test_a_peer_not_heard_from_counts_as_what_the_state_shows_of_it(tmp_path):
    """A dead holder answers no clock probe: the level its record shows (a
    recorded renewal: runtime/dispatcher.py recorded_level) stands in for its
    answer, where the caller gives one; an answer heard always wins."""
    import json

    from raftsched.core import commands

    clock = make_clock(tmp_path)

    class Client:
        async def get(self, url: str, timeout_s: float, params=None):
            node_id = url.split("//")[1].split("/")[0]
            if node_id == "n3":
                raise aiohttp.ClientConnectionError("n3 is down")
            return 200, json.dumps({"node": node_id, "wall_us": clock.wall_us(),
                                    "applies": commands.APPLY_LEVEL}).encode()

    await clock.measure_round(Client(), {"n2": "http://n2", "n3": "http://n3"})
    assert clock.cluster_applies() == commands.APPLY_LEVEL_UNSAID
    assert clock.cluster_applies(unheard=lambda peer: 4) == min(4, commands.APPLY_LEVEL)
    assert clock.cluster_applies(unheard=lambda peer: commands.APPLY_LEVEL_UNSAID) == \
        commands.APPLY_LEVEL_UNSAID
    # n2 was heard: its answer counts, not what the caller would say of it.
    assert clock.cluster_applies(unheard=lambda peer: 1 if peer == "n2" else 4) == \
        min(4, commands.APPLY_LEVEL)
