"""The coordinator: on the Raft leader, keep every shard owned by a live node.

Liveness is what the leader's Raft thread sees: a peer whose connection is
down (a killed process) is dead at once; a peer that has not answered an
append-entries for `node_lease_s` (a frozen or cut-off process) is dead after
that. Its shards then move to live nodes with new fencing tokens, so a former
owner that wakes up has every fire refused. Raft leadership alone is never the
fence: a cut-off leader may believe it leads for a while, but it cannot commit.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from raftsched.core import commands
from raftsched.core.apply import NODES, SHARDS
from raftsched.core.placement import plan_assignments
from raftsched.errors import Unavailable

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

log = logging.getLogger("raftsched.coordinator")

# A peer silent for this long loses its shards. Raft heartbeats every 10 ms, so
# this is many missed answers, and it keeps failover inside 3 s.
node_lease_s = 1.5
# How often the leader re-checks liveness and placement.
coordinator_period_s = 0.25


class Coordinator:
    def __init__(self, node: "Node") -> None:
        self._node = node
        self.rebalances_total = 0

    def live_nodes(self) -> list[str]:
        node = self._node
        by_raft = {rec["raft"]: rec["id"] for _, rec in node.store.scan(NODES)}
        live = {node.node_id}
        for addr, age_s in node.replicator.peer_liveness().items():
            nid = by_raft.get(addr)
            if nid is not None and age_s is not None and age_s < node_lease_s:
                live.add(nid)
        return sorted(live)

    def owners(self) -> dict[int, str | None]:
        return {int.from_bytes(key, "big"): state["owner"]
                for key, state in self._node.store.scan(SHARDS)}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(coordinator_period_s)
            if not self._node.replicator.is_leader():
                continue
            try:
                await self.maybe_rebalance()
            except Unavailable as exc:
                log.warning("shard assignment not committed: %s", exc.detail)
            except Exception:
                log.exception("coordinator pass failed")

    async def maybe_rebalance(self) -> bool:
        """Propose the placement changes live nodes need; say whether it did."""
        node = self._node
        live = self.live_nodes()
        changes = plan_assignments(node.shard_count, self.owners(), live)
        if not changes:
            return False
        moved_from = {}
        owners = self.owners()
        for shard, _ in changes:
            moved_from[owners.get(shard)] = moved_from.get(owners.get(shard), 0) + 1
        log.info("assigning %d shards over live nodes %s (taken from %s)", len(changes),
                 ",".join(live), ", ".join(f"{k or 'nobody'}: {v}" for k, v in moved_from.items()))
        await node.propose(commands.assign_shards(assignments=changes, at_ms=node.now_ms()))
        self.rebalances_total += 1
        return True

