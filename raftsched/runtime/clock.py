"""This node's clocks: its wall clock, the cluster's time, and how far off every node's clock is.

Every `clock_probe_period_stable_s` while every node's clock is judged within
the bound, and every `clock_probe_period_s` otherwise (a node out of bound, or
not judged), the node asks each registered peer for its wall clock (GET
/v1/node/clock) and measures it against its own monotonic clock,
with an error bound of half the round trip (core/clocks.py). It judges every
node's wall clock, its own included, against the median of them all:

- The cluster's time is that median, carried forward on this node's monotonic
  clock between measurements, less the median's error bound (so the cluster's
  time errs towards late). `now_ms()` answers it: firing, leases, renewals and
  every `at_ms` this node proposes use it, so a step of this node's own wall
  clock changes none of them. Before the first judgement it is the wall clock.
- A node whose wall clock is certainly further than --max-clock-skew-ms from
  the cluster's time is out of bound: the coordinator gives it no shards
  (runtime/coordinator.py), and the node itself logs at ERROR by how much.
  It is back in once certainly within `clock_rejoin_ratio` of the bound.
- Judgements are only made while more than half of the cluster's nodes agree
  (within the bound) on the median; until this node has made one it is not
  `synced()`, and its trigger loop fires nothing (a node started with a wrong
  clock must not fire by it).

Test seam: when the environment names RAFTSCHED_TEST_CLOCK_SHIFT_FILE, this
node's wall clock is shifted by the number of milliseconds written in that
file (a path relative to the node's data directory; no file or no number:
no shift), re-read every `limits.clock_test_shift_reread_s`. Tests shift one node's clock at run
time through it; it is not an operator's setting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Callable, Mapping

import aiohttp

from raftsched import limits
from raftsched.core.commands import APPLY_LEVEL, APPLY_LEVEL_UNSAID
from raftsched.core.clocks import Estimate, Judgement, Sample, add_sample, best, judge, \
    next_verdict, sample

if TYPE_CHECKING:
    from raftsched.runtime.peer import PeerClient

log = logging.getLogger("raftsched.clock")

TEST_SHIFT_ENV = "RAFTSCHED_TEST_CLOCK_SHIFT_FILE"


def monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class _TestShift:
    """The test seam (see the module docstring). Read from the loop and the Raft
    thread; a race between them only reads the file twice."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._read_at = -math.inf
        self._shift_us = 0

    def us(self) -> int:
        now = time.monotonic()
        if now - self._read_at >= limits.clock_test_shift_reread_s:
            self._read_at = now
            try:
                with open(self._path, encoding="ascii") as f:
                    self._shift_us = int(float(f.read().strip() or 0) * 1000)
            except (OSError, ValueError):
                self._shift_us = 0
        return self._shift_us


class ClusterClock:
    def __init__(self, *, node_id: str, cluster_size: int, max_skew_ms: int, data_dir: str,
                 env: Mapping[str, str] = os.environ) -> None:
        assert cluster_size >= 1
        assert max_skew_ms > 0
        self.node_id = node_id
        self.max_skew_ms = max_skew_ms
        self._cluster_size = cluster_size
        self._bound_us = max_skew_ms * 1000
        self._rejoin_us = int(self._bound_us * limits.clock_rejoin_ratio)
        shift_file = env.get(TEST_SHIFT_ENV)
        self._shift = _TestShift(os.path.join(data_dir, shift_file)) if shift_file else None
        self._samples: dict[str, tuple[Sample, ...]] = {}
        self._verdicts: dict[str, bool | None] = {}          # node -> within the bound
        self._judged: dict[str, tuple[int, int]] = {}        # node -> (deviation, error) µs
        # The cluster's time minus the monotonic clock (µs), once judged; read
        # by now_ms() on any thread, so it is replaced whole, never updated.
        self._base_us: int | None = None
        self._median_node: str | None = None
        self._disagreeing = False
        self._skew_logged_at = -math.inf
        self.on_synced: Callable[[], None] | None = None
        self.probes_failed_total = 0
        # Peers whose latest clock answer said they are draining (stopping:
        # runtime/node.py Node.drain); the leader places no shards on them.
        self._draining: set[str] = set()
        # Each peer's command level, as its latest clock answer said, and the
        # peers of the latest round (commands.APPLY_LEVEL).
        self._applies: dict[str, int] = {}
        self._peers: frozenset[str] = frozenset()
        self.evaluate()   # alone in its cluster, a node is judged at once

    # --- reading the time (any thread) ------------------------------------------------

    def wall_us(self) -> int:
        """This node's own wall clock (shifted by the test seam, if any)."""
        return time.time_ns() // 1000 + (self._shift.us() if self._shift else 0)

    def now_ms(self) -> int:
        """The cluster's time, or this node's wall clock until it is synced."""
        base_us = self._base_us
        if base_us is None:
            return self.wall_us() // 1000
        return (monotonic_us() + base_us) // 1000

    def synced(self) -> bool:
        return self._base_us is not None

    # --- judging (loop thread) ---------------------------------------------------------

    def observe(self, node_id: str, t0_us: int, wall_us: int, t3_us: int) -> None:
        """One exchange with `node_id`: sent at t0_us, its wall clock read as
        wall_us, the answer read at t3_us (this node's monotonic clock)."""
        self._samples[node_id] = add_sample(self._samples.get(node_id, ()),
                                            sample(t0_us, wall_us, t3_us),
                                            limits.clock_samples_kept, limits.clock_drift_ppm_max)

    def estimates(self, now_us: int) -> dict[str, Estimate]:
        """This node's clock and every peer's measured lately, against the monotonic clock."""
        found = {self.node_id: Estimate(offset_us=self.wall_us() - monotonic_us(), error_us=0)}
        for node_id, samples in self._samples.items():
            if now_us - samples[-1].taken_us > limits.clock_sample_age_s_max * 1_000_000:
                continue
            chosen = best(samples, now_us, limits.clock_drift_ppm_max)
            found[node_id] = Estimate(offset_us=chosen.offset_us,
                                      error_us=chosen.error_at(now_us, limits.clock_drift_ppm_max))
        return found

    def evaluate(self) -> None:
        """Judge every clock measured lately; move the cluster's time and the verdicts."""
        estimates = self.estimates(monotonic_us())
        judgement = judge(estimates, self._cluster_size, self._bound_us)
        if not judgement.agreed:
            self._note_disagreement(judgement, len(estimates))
            return
        self._disagreeing = False
        first = self._base_us is None
        self._base_us = judgement.base_us - judgement.base_error_us
        self._median_node = judgement.median_node
        for node_id, deviation_us in judgement.deviations_us.items():
            error_us = judgement.errors_us[node_id]
            before = self._verdicts.get(node_id)
            after = next_verdict(before, deviation_us, error_us, self._bound_us, self._rejoin_us)
            self._verdicts[node_id] = after
            self._judged[node_id] = (deviation_us, error_us)
            self._log_verdict(node_id, before, after, deviation_us, len(estimates))
        if first:
            log.info("clock synced: the cluster's time is node %s's clock; this node's is "
                     "%+.1f ms off it", judgement.median_node,
                     judgement.deviations_us[self.node_id] / 1000)
            if self.on_synced is not None:
                self.on_synced()

    def _note_disagreement(self, judgement: Judgement, measured: int) -> None:
        if self._disagreeing or measured * 2 <= self._cluster_size:
            return   # said already, or simply not measured enough yet
        self._disagreeing = True
        log.warning("the clocks of the %d nodes measured disagree: no %d of the cluster's %d "
                    "are within %d ms of their median (offsets from it: %s); verdicts stand, "
                    "and this node keeps the cluster's time it last judged", measured,
                    self._cluster_size // 2 + 1, self._cluster_size, self.max_skew_ms,
                    _offsets_text(judgement.deviations_us))

    def _log_verdict(self, node_id: str, before: bool | None, after: bool | None,
                     deviation_us: int, measured: int) -> None:
        off = f"{abs(deviation_us) / 1000:.0f} ms {'ahead of' if deviation_us > 0 else 'behind'}"
        now = time.monotonic()
        remind = now - self._skew_logged_at >= limits.clock_skew_log_period_s
        if node_id == self.node_id and after is False and (before is not False or remind):
            self._skew_logged_at = now
            log.error("this node's wall clock is %s the cluster's time (the median of %d "
                      "nodes' clocks), past --max-clock-skew-ms %d: it owns no shards until "
                      "its clock is back within %d ms; check its time synchronisation (NTP)",
                      off, measured, self.max_skew_ms, self._rejoin_us // 1000)
        elif after is False and before is not False:
            log.warning("node %s's wall clock is %s the cluster's time, past "
                        "--max-clock-skew-ms %d: it gets no shards", node_id, off,
                        self.max_skew_ms)
        elif after is True and before is False:
            log.warning("%s wall clock is back within the bound (%s the cluster's time): "
                        "it may own shards again",
                        "this node's" if node_id == self.node_id else f"node {node_id}'s", off)

    def draining(self) -> set[str]:
        """The peers whose latest clock answer said they are draining."""
        return set(self._draining)

    def cluster_applies(self, unheard: Callable[[str], int] | None = None) -> int:
        """The lowest command level of the cluster: this build's, and each
        peer's as it last said; a peer not heard from yet counts as one that
        does not say, or as `unheard(peer)` says (what the state shows of it)."""
        if len(self._peers) < self._cluster_size - 1:
            return APPLY_LEVEL_UNSAID
        return min([APPLY_LEVEL, *(self._applies[p] if p in self._applies else
                                   unheard(p) if unheard is not None else APPLY_LEVEL_UNSAID
                                   for p in self._peers)])

    def out_of_bound(self) -> set[str]:
        """The nodes whose clocks are judged out of bound (never-measured ones are not)."""
        return {node_id for node_id, within in self._verdicts.items() if within is False}

    def offsets_ms(self) -> dict[str, int]:
        """Each judged node's wall clock minus the cluster's time, as last judged here."""
        return {node_id: round(dev_us / 1000) for node_id, (dev_us, _) in self._judged.items()}

    def status(self) -> dict:
        own = self._judged.get(self.node_id)
        return {"synced": self.synced(), "median_node": self._median_node,
                "offset_ms": None if own is None else round(own[0] / 1000, 1),
                "error_ms": None if own is None else round(own[1] / 1000, 1),
                "in_bound": self._verdicts.get(self.node_id),
                "max_clock_skew_ms": self.max_skew_ms,
                "probes_failed_total": self.probes_failed_total}

    # --- measuring (loop thread) -------------------------------------------------------

    async def run(self, peers: Callable[[], dict[str, str]], client: "PeerClient") -> None:
        """Measure every peer (`peers()`: node id -> HTTP URL) each period, then
        judge. `client`: the node's peer client (runtime/peer.py), which calls
        with the node credential, over TLS, on kept-alive connections. Runs
        under the node's supervisor."""
        while True:
            await asyncio.sleep(await self.measure_round(client, peers()))

    async def measure_round(self, client: "PeerClient", targets: dict[str, str]) -> float:
        """Measure every peer in `targets` once, then judge; the seconds to wait
        before the next round."""
        self._peers = frozenset(targets)
        await asyncio.gather(*(self._probe(client, node_id, url)
                               for node_id, url in targets.items()))
        self.evaluate()
        unmeasured = not self.synced() or any(n not in self._samples for n in targets)
        if unmeasured:
            return limits.clock_probe_period_unmeasured_s
        if all(self._verdicts.get(n) is True for n in (self.node_id, *targets)):
            return limits.clock_probe_period_stable_s
        return limits.clock_probe_period_s

    async def _probe(self, client: "PeerClient", node_id: str, url: str) -> None:
        try:
            t0_us = monotonic_us()
            status, raw = await client.get(url + "/v1/node/clock",
                                           timeout_s=limits.clock_probe_timeout_s)
            t3_us = monotonic_us()
            if status != 200:
                raise ValueError(f"HTTP {status}")
            wall_us, draining, applies = _clock_answer(raw)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            self.probes_failed_total += 1
            log.debug("clock of node %s not measured: %r", node_id, exc)
            return
        self.observe(node_id, t0_us, wall_us, t3_us)
        self._applies[node_id] = applies
        if draining:
            if node_id not in self._draining:
                log.info("node %s is draining (stopping): it is given no shards", node_id)
            self._draining.add(node_id)
        else:
            self._draining.discard(node_id)


def _clock_answer(raw: bytes) -> tuple[int, bool, int]:
    """(wall_us, draining, applies) of a peer's GET /v1/node/clock; a node of
    a release that does not say is not draining, at APPLY_LEVEL_UNSAID."""
    body = json.loads(raw)
    wall_us = body.get("wall_us") if isinstance(body, dict) else None
    if type(wall_us) is not int:
        raise ValueError("the answer holds no integer wall_us")
    applies = body.get("applies")
    return (wall_us, body.get("draining") is True,
            applies if type(applies) is int else APPLY_LEVEL_UNSAID)


def _offsets_text(deviations_us: dict[str, int]) -> str:
    return ", ".join(f"{node_id} {dev / 1000:+.0f} ms"
                     for node_id, dev in sorted(deviations_us.items()))
