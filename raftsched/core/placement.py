"""Shard placement: which live node owns which shard. Pure.

Balanced: every live node owns floor(n/k) or ceil(n/k) of the n shards
(the first n % k nodes in id order take one extra). Sticky: a shard stays with
its owner while that owner is live and within its share, so a rebalance moves
only what it must (each move costs a new fencing token and a short pause in
that shard's firing).
"""

from __future__ import annotations


def quotas(shard_count: int, live: list[str]) -> dict[str, int]:
    ordered = sorted(live)
    base, extra = divmod(shard_count, len(ordered))
    return {node: base + (1 if i < extra else 0) for i, node in enumerate(ordered)}


def plan_assignments(shard_count: int, owners: dict[int, str | None],
                     live: list[str]) -> list[tuple[int, str]]:
    """The (shard, new_owner) changes that make the placement balanced over `live`."""
    assert live, "at least the planning node itself is live"
    quota = quotas(shard_count, live)
    held: dict[str, list[int]] = {node: [] for node in quota}
    orphans: list[int] = []
    for shard in range(shard_count):
        owner = owners.get(shard)
        if owner in held:
            held[owner].append(shard)
        else:
            orphans.append(shard)
    for node, shards in held.items():
        while len(shards) > quota[node]:
            orphans.append(shards.pop())   # give up the highest-numbered shards first
    orphans.sort()
    changes: list[tuple[int, str]] = []
    for node in sorted(quota):
        while len(held[node]) < quota[node]:
            shard = orphans.pop(0)
            held[node].append(shard)
            changes.append((shard, node))
    assert not orphans, orphans
    return changes
