"""Shard placement is balanced within one of the fair share and moves only what it must."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from raftsched.core.placement import plan_assignments, quotas
from raftsched.testing.proptest import examples

NODES = ["n1", "n2", "n3", "n4", "n5"]


def apply_plan(owners: dict, changes: list) -> dict:
    out = dict(owners)
    out.update(changes)
    return out


@settings(max_examples=examples(300), deadline=None)
@given(shard_count=st.integers(1, 300),
       owners=st.dictionaries(st.integers(0, 299), st.sampled_from(NODES + [None])),
       live=st.lists(st.sampled_from(NODES), min_size=1, unique=True))
def test_plans_are_balanced_sticky_and_stable(shard_count, owners, live):
    owners = {s: o for s, o in owners.items() if s < shard_count}
    changes = plan_assignments(shard_count, owners, live)
    after = apply_plan(owners, changes)
    counts = [sum(1 for s in range(shard_count) if after.get(s) == n) for n in live]
    assert sum(counts) == shard_count               # every shard owned by a live node
    assert max(counts) - min(counts) <= 1           # within one of the fair share
    assert len({s for s, _ in changes}) == len(changes)
    quota = quotas(shard_count, live)
    held_before = {n: sum(1 for s in range(shard_count) if owners.get(s) == n) for n in live}
    for shard, _ in changes:                        # a live owner within its share keeps all
        owner = owners.get(shard)
        assert owner not in live or held_before[owner] > quota[owner]
    assert plan_assignments(shard_count, after, live) == []   # a second pass changes nothing


def test_a_dead_nodes_shards_move_and_nothing_else_does():
    owners = {s: ["n1", "n2", "n3"][s % 3] for s in range(255)}
    changes = plan_assignments(255, owners, ["n1", "n2"])
    assert sorted(s for s, _ in changes) == [s for s in range(255) if s % 3 == 2]
    after = apply_plan(owners, changes)
    assert sorted(sum(1 for o in after.values() if o == n) for n in ("n1", "n2")) == [127, 128]
