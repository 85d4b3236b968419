"""Lateness histograms, measured where it matters. Trigger lateness: when the
dispatcher begins the first call of a scheduled run, the cluster's time minus
the run's due time (runtime/dispatcher.py), whether the run was fired at its
second or ahead of it (runtime/armed.py). Arming lead: when a fire this node
proposed is committed and applied here, how long before its due time each run
it queued is (0 when at or after it: runtime/apply_bridge.py).

Kept as a histogram with fixed, log-spaced buckets (each 25% wider than the
one before, from 1 ms to about 20 minutes), so every run counts and the
memory is constant. `GET /v1/node` shows it as `trigger_lateness`; a
percentile read from it is exact to within its bucket's width.
"""

from __future__ import annotations

import bisect
import threading

BUCKET_GROWTH = 1.25
# Upper bounds (ms, inclusive) of the buckets; one more bucket holds the rest.
BOUNDS_MS: tuple[int, ...] = tuple(sorted({round(BUCKET_GROWTH ** k) for k in range(0, 64)}))


class LatenessHistogram:
    """Thread-safe: the Raft thread records, the event loop reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BOUNDS_MS) + 1)
        self._count = 0
        self._sum_ms = 0
        self._max_ms = 0
        self._early = 0   # runs recorded before their time (a clock behind the proposer's)

    def record(self, lateness_ms: int) -> None:
        with self._lock:
            if lateness_ms < 0:
                self._early += 1
                lateness_ms = 0
            self._counts[bisect.bisect_left(BOUNDS_MS, lateness_ms)] += 1
            self._count += 1
            self._sum_ms += lateness_ms
            self._max_ms = max(self._max_ms, lateness_ms)

    def snapshot(self) -> dict:
        """Cumulative since the node started: `buckets` maps each upper bound
        (ms; "+Inf" for the last) to the runs at or under it, as Prometheus
        histograms count."""
        with self._lock:
            counts, total = list(self._counts), self._count
            summary = {"count": total, "sum_ms": self._sum_ms, "max_ms": self._max_ms,
                       "recorded_early": self._early}
        cumulative, buckets = 0, {}
        for bound, n in zip([*map(str, BOUNDS_MS), "+Inf"], counts):
            cumulative += n
            if n:
                buckets[bound] = cumulative
        return dict(summary, buckets=buckets)


def merged_percentile(snapshots: list[dict], p: float) -> float:
    """The p-th percentile (ms, the upper bound of its bucket) of the runs in
    `snapshots` taken together (each a snapshot, or a difference of two)."""
    counts: dict[float, int] = {}
    for snap in snapshots:
        previous = 0
        for bound, cumulative in sorted(snap["buckets"].items(), key=lambda kv: _bound(kv[0])):
            counts[_bound(bound)] = counts.get(_bound(bound), 0) + cumulative - previous
            previous = cumulative
    total = sum(counts.values())
    if not total:
        return 0.0
    rank, seen = p / 100 * total, 0
    for bound in sorted(counts):
        seen += counts[bound]
        if seen >= rank:
            return bound
    return max(counts)


def difference(after: dict, before: dict) -> dict:
    """The runs recorded between two snapshots of the same node."""
    buckets = {}
    for bound, cumulative in after["buckets"].items():
        below = max((c for b, c in before["buckets"].items() if _bound(b) <= _bound(bound)),
                    default=0)
        buckets[bound] = cumulative - below
    return {"count": after["count"] - before["count"], "buckets": buckets,
            "max_ms": after["max_ms"]}


def _bound(text: str) -> float:
    return float("inf") if text == "+Inf" else float(text)
