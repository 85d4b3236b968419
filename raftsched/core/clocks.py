"""Clock offsets between nodes, the cluster's time, and which clocks are out of bound. Pure.

A node measures a peer's wall clock against its own *monotonic* clock with one
request and its answer (runtime/clock.py): it reads its monotonic clock before
sending (t0) and after the answer arrives (t3); the peer reads its wall clock
(w) while answering, so somewhere between t0 and t3. At the midpoint the peer's
wall clock was therefore w - (t0 + t3) / 2 ahead of this node's monotonic
clock, give or take half the round trip. Measured against the monotonic clock,
an estimate survives any step of this node's own wall clock; this node's own
wall clock is one more value of the same kind, read exactly.

The cluster's time is the median of those values (the lower of the two middle
ones for an even count, so that of two disagreeing clocks the one that reads
earlier wins: late is better than early), carried forward on the monotonic
clock.
It is only trusted when more than half of the cluster's nodes have clocks
within the bound of it; otherwise no one can tell which clock is wrong.

All times here are integers in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One exchange with a peer, seen from the measuring node."""
    offset_us: int   # the peer's wall clock minus this node's monotonic clock
    error_us: int    # the most offset_us can be off by when taken (half the round trip)
    taken_us: int    # this node's monotonic clock at the exchange's midpoint

    def error_at(self, now_us: int, drift_ppm: int) -> int:
        """The error bound now: a clock may drift this much since the sample."""
        return self.error_us + max(0, now_us - self.taken_us) * drift_ppm // 1_000_000


def sample(t0_us: int, wall_us: int, t3_us: int) -> Sample:
    """The sample of one exchange: sent at t0_us, answered with the peer's wall
    clock wall_us, answer read at t3_us (both t on this node's monotonic clock)."""
    assert t3_us >= t0_us, (t0_us, t3_us)
    midpoint_us = (t0_us + t3_us) // 2
    # +1 covers the rounding of the midpoint.
    return Sample(offset_us=wall_us - midpoint_us, error_us=(t3_us - t0_us + 1) // 2 + 1,
                  taken_us=midpoint_us)


def best(samples: tuple[Sample, ...], now_us: int, drift_ppm: int) -> Sample:
    """The sample with the smallest error bound now: a quick round trip is
    worth more than a newer slow one, until drift makes it the worse."""
    assert samples
    return min(samples, key=lambda s: (s.error_at(now_us, drift_ppm), -s.taken_us))


def add_sample(samples: tuple[Sample, ...], new: Sample, kept_max: int,
               drift_ppm: int) -> tuple[Sample, ...]:
    """The samples to keep once `new` arrives: the newest kept_max, or `new`
    alone when it contradicts the best of the others beyond both their error
    bounds, which means the peer's clock stepped and the older ones are void."""
    assert kept_max >= 1
    if samples:
        current = best(samples, new.taken_us, drift_ppm)
        if abs(new.offset_us - current.offset_us) > \
                new.error_us + current.error_at(new.taken_us, drift_ppm):
            return (new,)
    return (samples + (new,))[-kept_max:]


@dataclass(frozen=True, kw_only=True)
class Estimate:
    offset_us: int   # the node's wall clock minus the measuring node's monotonic clock
    error_us: int


@dataclass(frozen=True, kw_only=True)
class Judgement:
    # Whether more than half of the cluster's nodes are within the bound of the
    # median; when not, nothing else here may be acted on.
    agreed: bool
    median_node: str
    base_us: int           # the cluster's time minus the measuring node's monotonic clock
    base_error_us: int
    # Each measured node's wall clock minus the cluster's time, and its error bound.
    deviations_us: dict[str, int]
    errors_us: dict[str, int]


def judge(estimates: dict[str, Estimate], cluster_size: int, bound_us: int) -> Judgement:
    """Judge the measured clocks (the measuring node's own among them) against
    their median, for a cluster of cluster_size nodes."""
    assert estimates
    ordered = sorted(estimates.items(), key=lambda item: (item[1].offset_us, item[0]))
    median_node, median = ordered[(len(ordered) - 1) // 2]
    agreeing = sum(1 for e in estimates.values() if abs(e.offset_us - median.offset_us) <= bound_us)
    return Judgement(
        agreed=agreeing * 2 > cluster_size, median_node=median_node,
        base_us=median.offset_us, base_error_us=median.error_us,
        deviations_us={n: e.offset_us - median.offset_us for n, e in estimates.items()},
        errors_us={n: e.error_us + (0 if n == median_node else median.error_us)
                   for n, e in estimates.items()})


def next_verdict(previous: bool | None, deviation_us: int, error_us: int, bound_us: int,
                 rejoin_us: int) -> bool | None:
    """Whether a clock is within the bound (None: not known yet). It is out
    once it is certainly past bound_us, whatever the measurement error; back in
    once it is certainly within rejoin_us (a little inside the bound, so a
    clock sitting at the bound does not move shards back and forth); in between
    the verdict stands."""
    assert rejoin_us <= bound_us
    if abs(deviation_us) - error_us > bound_us:
        return False
    limit_us = rejoin_us if previous is False else bound_us
    if abs(deviation_us) + error_us <= limit_us:
        return True
    return previous
