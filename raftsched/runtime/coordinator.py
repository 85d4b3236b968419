"""The coordinator: on the Raft leader, keep every shard owned by a live node.

Every node proposes a `renew` command each `limits.renew_period_s` (at its
multiples on the cluster's time, so that the nodes' renewals share a Raft round); every replica
notes (on its own monotonic clock) when it applied each node's latest
renewal. A node is live while its last renewal was applied less than
`limits.node_lease_s` ago here. A frozen, killed or cut-off node cannot get a renewal
committed, so it lapses after the lease, and, because followers track
renewals too, a leader elected a moment ago knows already how long a peer has
been silent (pysyncobj's own view of its peers restarts at election). A peer
whose Raft connection is down (a killed process) is also dead at once.

The shards of a dead node move to live nodes with new fencing tokens, so a
former owner that wakes up has every fire refused. So do the shards of a node
whose wall clock is out of bound (runtime/clock.py), while it is. Raft leadership alone is
never the fence: a cut-off leader may believe it leads for a while, but it
cannot commit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Protocol

from raftsched import limits
from raftsched.core import commands, queries
from raftsched.core.placement import plan_assignments
from raftsched.errors import Unavailable
from raftsched.runtime.context import Replicated, Spawn

log = logging.getLogger("raftsched.coordinator")

# The command level (commands.APPLY_LEVEL) that records a renewal's time.
RECORDED_RENEWAL_LEVEL = 4


class Clocks(Protocol):
    """What the nodes' clock answers say (runtime/clock.py ClusterClock)."""

    def out_of_bound(self) -> set[str]:
        """Nodes whose wall clock is too far from the cluster's time."""

    def draining(self) -> set[str]:
        """Other nodes that said they are stopping."""


class Coordinator:
    def __init__(self, replicated: Replicated, *, shard_count: int, spawn: Spawn,
                 term: Callable[[], int],
                 peer_liveness: Callable[[], dict[str, float | None]],
                 clocks: Clocks, draining: Callable[[], bool],
                 monotonic: Callable[[], float] = time.monotonic,
                 cluster_applies: Callable[[], int] = lambda: commands.APPLY_LEVEL_UNSAID
                 ) -> None:
        """`term` and `peer_liveness`: this node's Raft term and, as leader,
        its peers' links (Replicator); `draining`: whether this node is
        stopping (Node.drain); `monotonic`: the clock its shard lease is
        kept on; `cluster_applies`: the command level every node applies
        (runtime/clock.py), from which its renewals are recorded."""
        self._replicated = replicated
        self._store = replicated.store
        self._node_id = replicated.node_id
        self._shard_count = shard_count
        self._spawn = spawn
        self._term = term
        self._peer_liveness = peer_liveness
        self._clocks = clocks
        self._self_draining = draining
        self._monotonic = monotonic
        self._cluster_applies = cluster_applies
        self.rebalances_total = 0
        # node id -> the cluster time (at_ms) of its latest renewal applied here,
        # and the latest of all: liveness is judged against the log's own
        # progress (live_nodes), so a log that lags under load judges no one.
        self._renewed: dict[str, int] = {}
        self._latest_renewal_ms = 0
        # The cluster's time (as this node then had it) when this process
        # started: a renewal proposed before it, applied here from the log's
        # tail after a restart, says nothing of whether its node is up now.
        self._started_ms = replicated.now_ms()
        self._no_candidates_logged = False
        # (Raft term, candidates) of the last pass that found the placement
        # right, and when (time.monotonic()) it read the shards: see maybe_rebalance.
        self._settled: tuple[tuple[int, tuple[str, ...]], float] | None = None
        self.placement_reads_total = 0
        # This node's shard lease, on its monotonic clock (`monotonic`): the
        # end of what its latest renewal seen applied here covers.
        self._lease_until = float("-inf")
        self._lease_extended = asyncio.Event()   # set (and replaced) at each extension
        # Renewals of this node in flight: at_ms -> monotonic() when proposed
        # (at most renewals_inflight_max), for renewal_applied on the Raft thread.
        self._renewals_sent: dict[int, float] = {}
        self.lease_lapses_total = 0
        # Seconds the latest renewal seen applied here took from its proposal,
        # within one term: how far this node's applied log trails what it
        # proposes (log_latency_s).
        self._renewal_latency_s = 0.0

    def renewed_since(self, at_ms: int) -> bool:
        """Has a renewal of this node proposed at or after `at_ms` (the
        cluster's time) been applied here?"""
        return self._renewed.get(self._node_id, -1) >= at_ms

    def renewed(self, node_id: str, at_ms: int) -> None:
        """Loop thread, from apply's NodeRenewed effect."""
        if at_ms > self._renewed.get(node_id, -1):
            self._renewed[node_id] = at_ms
        self._latest_renewal_ms = max(self._latest_renewal_ms, at_ms)

    def live_nodes(self) -> list[str]:
        """This node, and each registered node whose Raft link is up (as the
        leader knows it: Replicator.peer_liveness) and whose
        latest renewal applied here was proposed less than node_lease_s (plus
        shard_lease_margin_s) before the latest renewal of any node applied
        here. Judged against the log's progress rather than this node's clock:
        when the log falls behind under load, every node's renewals are late
        alike and none lapses, while a node that stopped renewing (dead,
        frozen, cut off) falls behind the others' renewals and lapses. A node
        whose renewal is applied so late still holds its shards by its own
        monotonic clock only until node_lease_s after it proposed it, less
        the margin (shard_lease_valid), which is before it can lapse here.

        A node with no renewal applied here since this process started (a
        renewal from before it, replayed from the log's tail, is no evidence)
        is judged from this start: live until renewals proposed a lease, its
        margin and start_liveness_grace_s after this start are applied here.
        So a restart followed by an election, in which no renewal is committed
        for seconds, judges no node dead by this node's clock, and a cluster
        restarted whole gives its slowest node time to connect and renew (a
        link that has not come up since this start is not a down one:
        Replicator.peer_liveness)."""
        registered = queries.registered_nodes(self._store)
        by_raft = {rec["raft"]: rec["id"] for rec in registered}
        bound_ms = (limits.node_lease_s + limits.shard_lease_margin_s) * 1000
        down = {by_raft.get(addr) for addr, age_s in self._peer_liveness().items()
                if age_s is None}
        # Until the log has moved a lease, its margin and start_liveness_grace_s
        # past this process's start, a node that has not renewed since is live:
        # a cluster restarted whole is still connecting its links.
        start_bound_ms = bound_ms + limits.start_liveness_grace_s * 1000
        starting = self._latest_renewal_ms - self._started_ms < start_bound_ms
        live = {self._node_id}
        for rec in registered:
            nid = rec["id"]
            if nid in down:
                continue
            # No renewal since this start counts from the start: judged by its
            # renewals from before it (a cluster restarted whole applies its
            # nodes' last renewals from before the stop), the node slowest to
            # start lost its shards a second after the others, and their runs
            # were taken over as next attempts; judged by this node's clock
            # from its start, a live holder whose renewals an election held
            # back had its runs taken over at once, called again.
            renewed_ms = self._renewed.get(nid, -1)
            if renewed_ms < self._started_ms:
                if starting:
                    live.add(nid)
            elif self._latest_renewal_ms - renewed_ms < bound_ms:
                live.add(nid)
        return sorted(live)

    async def renew_loop(self) -> None:
        """Renew, and with each renewal seen applied here extend this node's
        shard lease: node_lease_s from when it was proposed, less
        shard_lease_margin_s. It renews at each multiple of renew_period_s on
        the cluster's time: every node renews at about the same instant, so the
        leader replicates and commits their renewals in one round of
        append-entries rather than one round each. The leader judges this node
        dead node_lease_s after it applied the renewal, which is later than it
        was proposed, and by the time this node has applied its own renewal it
        has applied every reassignment committed before it (the log is in order)."""
        replicated = self._replicated
        period_ms = max(1, round(limits.renew_period_s * 1000))
        inflight: set[asyncio.Task] = set()
        while True:
            # Every renew_period_s, whether the renewals before have come back
            # or not: under load a renewal's round trip (commit, apply, this
            # loop's turn) can take longer than the period, and renewals that
            # waited for each other would reach the leader too far apart.
            if len(inflight) < limits.renewals_inflight_max:
                command = commands.renew(
                    node=self._node_id, at_ms=replicated.now_ms(),
                    record=self._cluster_applies() >= RECORDED_RENEWAL_LEVEL)
                sent = self._monotonic()
                self._renewals_sent[command.at_ms] = sent
                task = self._spawn("renew.propose", self._renew(command, sent))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            await asyncio.sleep((period_ms - replicated.now_ms() % period_ms) / 1000)

    async def _renew(self, command: commands.Renew, sent: float) -> None:
        term = self._term()
        try:
            await self._replicated.propose(command)
        except Unavailable:
            return   # no quorum: the lease lapses, which is the point
        finally:
            self._renewals_sent.pop(command.at_ms, None)
        self.extend_lease(sent)
        if self._term() == term:
            # A round trip across an election measures the election, not the log.
            self._renewal_latency_s = max(0.0, self._monotonic() - sent)

    def renewal_applied(self, effects: tuple) -> None:
        """Raft thread, right after a renewal was committed here: if it is one
        of this node's in flight, its lease counts from its proposal now,
        before the loop gets to it (a float assignment; the loop's
        extend_lease follows and wakes the waiters)."""
        for effect in effects:
            if getattr(effect, "node", None) == self._node_id:
                sent = self._renewals_sent.get(effect.at_ms)
                if sent is not None:
                    self._lease_until = max(self._lease_until,
                                            sent + limits.node_lease_s
                                            - limits.shard_lease_margin_s)

    def extend_lease(self, sent: float) -> None:
        """A renewal proposed at monotonic `sent` was applied here."""
        until = sent + limits.node_lease_s - limits.shard_lease_margin_s
        if self._monotonic() >= self._lease_until > float("-inf"):
            self.lease_lapses_total += 1
            log.warning("this node's shard lease had lapsed (no renewal applied for over "
                        "%.2f s); its runs were not called meanwhile",
                        limits.node_lease_s - limits.shard_lease_margin_s)
        self._lease_until = max(self._lease_until, until)
        self._lease_extended.set()
        self._lease_extended = asyncio.Event()

    def log_latency_s(self) -> float:
        """How far this node's applied log trails its proposals, in seconds:
        what its latest renewal took from proposal to apply here (one that
        crossed an election excepted: that measures the election, and writes
        then wait for the new leader instead). Its shard lease lapses once
        this passes node_lease_s - shard_lease_margin_s less renew_period_s,
        so the node's admission refuses creates well before that
        (create_log_latency_max_s)."""
        return self._renewal_latency_s

    async def wait_lease_extended(self, timeout_s: float) -> None:
        """Return at this node's next lease extension, or after timeout_s."""
        try:
            await asyncio.wait_for(self._lease_extended.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    def shard_lease_valid(self) -> bool:
        """Does this node hold its shards now, by its monotonic clock? Its runs
        are called only while it does (runtime/dispatcher.py)."""
        return self._monotonic() < self._lease_until

    def owners(self) -> dict[int, str | None]:
        return queries.shard_owners(self._store)

    async def run(self) -> None:
        """Any other failure is the node's supervisor's: it logs it and starts
        the loop again (runtime/supervise.py)."""
        while True:
            await asyncio.sleep(limits.coordinator_period_s)
            if not self._replicated.is_leader():
                continue
            try:
                await self.maybe_rebalance()
            except Unavailable as exc:
                log.warning("shard assignment not committed: %s", exc.detail)

    def _placement_settled(self, candidates: list[str]) -> bool:
        """Whether the placement is known to be right without reading the
        shards again: a pass in this Raft term with these candidates found
        nothing to change, less than placement_recheck_period_s ago. Within a
        term only this leader assigns shards, so the placement changes only
        with the candidates; reading and planning all the shards every pass was
        most of an idle leader's work. The recheck bounds what an assignment
        committed late from an earlier term could leave unseen."""
        settled = self._settled
        return (settled is not None and settled[0] == self._placement_key(candidates)
                and time.monotonic() - settled[1] < limits.placement_recheck_period_s)

    def _settle(self, candidates: list[str]) -> None:
        key = self._placement_key(candidates)
        if self._settled is None or self._settled[0] != key \
                or time.monotonic() - self._settled[1] >= limits.placement_recheck_period_s:
            self._settled = (key, time.monotonic())

    def _placement_key(self, candidates: list[str]) -> tuple[int, tuple[str, ...]]:
        return self._term(), tuple(candidates)

    def owner_candidates(self) -> list[str]:
        """The live nodes whose clocks are not judged out of bound (runtime/clock.py):
        a node with a wrong clock owns no shards, the leader itself included.
        Nor does a node that is draining (stopping: Node.drain), by its clock
        answers or, for the leader, its own flag."""
        left_out = self._clocks.out_of_bound() | self._draining()
        return [nid for nid in self.live_nodes() if nid not in left_out]

    def _draining(self) -> set[str]:
        """The nodes stopping: peers by their clock answers, this one by its flag."""
        return self._clocks.draining() | ({self._node_id} if self._self_draining() else set())

    async def maybe_rebalance(self) -> bool:
        """Propose the placement changes live nodes need; say whether it did."""
        candidates = self.owner_candidates()
        if not candidates:
            # Placing shards nowhere would stop every fire: the placement stays.
            if not self._no_candidates_logged:
                log.error("no live node may own shards (clocks out of bound: %s; draining: "
                          "%s); shards stay where they are",
                          ",".join(sorted(self._clocks.out_of_bound())) or "none",
                          ",".join(sorted(self._draining())) or "none")
            self._no_candidates_logged = True
            return False
        self._no_candidates_logged = False
        if self._placement_settled(candidates):
            return False
        self.placement_reads_total += 1
        changes = plan_assignments(self._shard_count, self.owners(), candidates)
        if not changes:
            self._settle(candidates)
            return False
        self._settled = None
        moved_from = {}
        owners = self.owners()
        for shard, _ in changes:
            moved_from[owners.get(shard)] = moved_from.get(owners.get(shard), 0) + 1
        skewed = sorted(self._clocks.out_of_bound())
        log.info("assigning %d shards over live nodes %s (taken from %s)%s", len(changes),
                 ",".join(candidates),
                 ", ".join(f"{k or 'nobody'}: {v}" for k, v in moved_from.items()),
                 f"; clocks out of bound: {','.join(skewed)}" if skewed else "")
        await self._replicated.propose(commands.assign_shards(assignments=changes,
                                                              at_ms=self._replicated.now_ms()))
        self.rebalances_total += 1
        return True

