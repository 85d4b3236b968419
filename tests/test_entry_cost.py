"""No Raft entry a tenant can cause costs apply more than apply_entry_cost_max: fires of many large DAG jobs due at once are split by cost (core/cost.py), nothing lost, order kept."""

from __future__ import annotations

import asyncio

from raftsched import limits
from raftsched.core import commands, cost, jobspec, keys
from raftsched.core.apply import RUNS, apply_entry
from raftsched.core.firing import fire_item
from raftsched.runtime.context import Replicated
from raftsched.runtime.reaper import Reaper
from raftsched.runtime.reporter import Reporter
from raftsched.runtime.supervise import Supervisor
from raftsched.runtime.trigger import TriggerLoop
from raftsched.testing.replica import Replica, no_call

SHARDS = 4
NODE = "n1"
DUE_MS = 1_800_000_000_000 - 1_800_000_000_000 % 3_600_000   # on the hour


def dag_spec(tasks: int, **extra) -> dict:
    body = {"schedule": {"cron": "0 * * * *"}, **extra, "dag": {"tasks": [
        {"id": f"t{i}", "target": {"type": "http", "url": "http://127.0.0.1:9/h"}}
        for i in range(tasks)]}}
    return jobspec.validate_create(body)["spec"]


class Recorder(Replica):
    """A replica that notes the run records each entry wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.runs_written: list[int] = []

    def run_entry(self, data: bytes) -> dict:
        self.index += 1
        _, transition = apply_entry(self.store, data, self.index)
        self.store.commit(transition, self.index)
        self.runs_written.append(sum(1 for w in transition.writes if w[0] == RUNS))
        return transition.result


def replica_with_dag_jobs(jobs: int, spec: dict, commands_granted: bool = False) -> Recorder:
    replica = Recorder()
    if commands_granted:
        replica.run(commands.put_tenant(tenant="acme", quota={}, actor=None,
                                        at_ms=DUE_MS - 60_000, commands=True))
    replica.run(commands.assign_shards(assignments=[(s, NODE) for s in range(SHARDS)],
                                       at_ms=DUE_MS - 60_000))
    for i in range(jobs):
        job_id = f"job_{i:04d}"
        replica.run(commands.create_jobs(tenant="acme", at_ms=DUE_MS - 60_000, items=[
            commands.create_job_item(job_id=job_id, spec=spec, idempotency_key=None,
                                     shard=keys.shard_of(job_id, SHARDS), next_ms=DUE_MS)]))
    replica.runs_written.clear()
    return replica


def trigger_over(replica: Replica) -> TriggerLoop:
    trigger = TriggerLoop(replica.replicated(node_id=NODE), arm_ahead_ms=0,
                          propose_entry=replica.propose_entry,
                          spawn=lambda name, coro: asyncio.ensure_future(coro),
                          synced=lambda: True, armed_room=lambda: 0)
    trigger.resync()
    return trigger


async def fire_pass(trigger: TriggerLoop, at_ms: int) -> None:
    trigger._propose_pass(list(range(SHARDS)), at_ms)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.gather(*pending)


async def test_a_fire_of_many_maximal_dag_jobs_is_split_by_cost_and_every_task_runs():
    spec = dag_spec(limits.dag_tasks_max)
    jobs = 20
    replica = replica_with_dag_jobs(jobs, spec)
    await fire_pass(trigger_over(replica), DUE_MS + 5)
    # Each entry wrote at most a budget's worth of runs (a DAG run and a task
    # run per task that starts at once are records apply creates)...
    assert len(replica.runs_written) > 1
    assert max(replica.runs_written) <= limits.apply_entry_cost_max
    # ...and every job's DAG run and every task run was created, once.
    assert sum(replica.runs_written) == jobs * (1 + limits.dag_tasks_max)
    for i in range(jobs):
        run_id = keys.run_id(f"job_{i:04d}", DUE_MS)
        run = replica.get_run(run_id)
        # Every task starts at once, held by the shard's owner from its release.
        assert run["state"] == "running"
        assert all(inst["state"] == "running" for inst in run["tasks"])
        assert replica.job(f"job_{i:04d}")["next_ms"] == DUE_MS + 3_600_000


async def test_plain_jobs_still_fire_many_to_an_entry():
    spec = jobspec.validate_create({"schedule": {"cron": "0 * * * *"},
                                    "target": {"type": "http",
                                               "url": "http://127.0.0.1:9/h"}})["spec"]
    replica = replica_with_dag_jobs(300, spec)
    await fire_pass(trigger_over(replica), DUE_MS + 5)
    assert replica.runs_written == [300]


def test_the_cost_of_a_dag_fire_counts_the_tasks_that_start_at_once():
    fan_out = {"schedule": {"cron": "0 * * * *"}, "dag": {"tasks": [
        {"id": "root", "target": {"type": "http", "url": "http://127.0.0.1:9/h"}},
        *({"id": f"leaf{i}", "depends_on": ["root"],
           "target": {"type": "http", "url": "http://127.0.0.1:9/h"}} for i in range(99))]}}
    spec = jobspec.validate_create(fan_out)["spec"]
    assert cost.occurrence_cost(spec) == 1 + 1 + 10   # the run, the root, the instances
    assert cost.fire_item_cost(spec, 3) == 1 + 3 * 12
    assert cost.downstream_count(spec, "root") == 99
    assert cost.downstream_count(spec, "leaf1") == 0
    assert cost.run_update_cost(spec, "root", "finish") == 2 + 10 + 99
    assert cost.run_update_cost(spec, "leaf1", "start") == 2 + 10   # its DAG run rewritten
    assert cost.run_update_cost(spec, "leaf1", "heartbeat") == 1
    assert cost.run_update_cost(None, None, "finish") == 1


def test_pack_keeps_order_and_bounds_each_entry():
    assert cost.pack([3, 3, 3, 3], cost_max=6, count_max=10) == [2, 2]
    assert cost.pack([1] * 5, cost_max=100, count_max=2) == [2, 2, 1]
    assert cost.pack([50, 1, 1], cost_max=10, count_max=10) == [1, 2]   # too big: alone
    assert cost.pack([], cost_max=10, count_max=10) == []


async def test_the_reporter_bounds_a_batch_by_what_its_finishes_may_release():
    fan_out = {"schedule": {"cron": "0 * * * *"}, "dag": {"tasks": [
        {"id": "root", "target": {"type": "http", "url": "http://127.0.0.1:9/h"}},
        *({"id": f"leaf{i}", "depends_on": ["root"],
           "target": {"type": "http", "url": "http://127.0.0.1:9/h"}}
          for i in range(limits.dag_tasks_max - 1))]}}
    spec = jobspec.validate_create(fan_out)["spec"]
    root_cost = cost.run_update_cost(spec, "root", "finish")
    proposed: list[list[str]] = []

    async def propose(command: commands.RunUpdates) -> dict:
        proposed.append([u.run_id for u in command.updates])
        return {"ok": True, "accepted": [True] * len(command.updates)}
    reporter = Reporter(propose=propose, spawn=Supervisor("test").spawn)
    task = asyncio.ensure_future(reporter.run())
    try:
        futures = []
        for i in range(30):
            update = {"run_id": f"run_{i:03d}", "event": "finish", "holder": NODE,
                      "attempt": 1, "at_ms": DUE_MS, "ok": True, "retryable": True,
                      "retry_delay_ms": None, "http_status": 200, "exit_code": None,
                      "error": None, "output_node": None}
            futures.append(reporter.send(update, "acme", root_cost))
        assert all(await asyncio.wait_for(asyncio.gather(*futures), 10))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [run_id for batch in proposed for run_id in batch] == \
        [f"run_{i:03d}" for i in range(30)]   # nothing lost, order kept
    assert len(proposed) > 1
    assert max(len(batch) for batch in proposed) * root_cost <= limits.apply_entry_cost_max


def test_a_large_dag_jobs_catch_up_fits_one_entry():
    spec = dag_spec(limits.dag_tasks_max, misfire={"policy": "fire_all", "catchup_max": 100})
    job = {"id": "job_late", "spec": spec, "next_ms": DUE_MS}
    item = fire_item(job, DUE_MS, DUE_MS + 50 * 3_600_000)   # 50 hours late
    _, _, next_ms, occurrences, omitted = item
    assert cost.fire_item_cost(spec, len(occurrences)) <= limits.apply_entry_cost_max
    assert omitted is True
    assert occurrences[0] == DUE_MS
    assert occurrences[-1] == DUE_MS + 50 * 3_600_000   # the latest is never left out
    assert next_ms == DUE_MS + 51 * 3_600_000
    # A plain job catches up its whole catchup_max.
    plain = jobspec.validate_create({"schedule": {"cron": "0 * * * *"},
                                     "misfire": {"policy": "fire_all",
                                                 "catchup_max": limits.catchup_max_max},
                                     "target": {"type": "http",
                                                "url": "http://127.0.0.1:9/h"}})["spec"]
    assert cost.catchup_fitting(plain, limits.catchup_max_max) == limits.catchup_max_max


def test_the_entry_cost_measure_packs_a_dag_fire_into_bounded_entries():
    from raftsched.testing import entrycost
    spec = entrycost.job_spec(limits.dag_tasks_max)
    by_count = entrycost.fire(12, spec, by_cost=False)
    by_cost = entrycost.fire(12, spec, by_cost=True)
    assert by_count["entries"] == 1
    assert by_cost["entries"] == 2   # 12 items of 112 units: 9, then 3


def fan_out_spec() -> dict:
    # Tasks for remote workers: their attempts hold leases of their own, which
    # the reaper ends (a node's task runs are held under its shard lease).
    target = {"type": "command", "argv": ["true"], "queue": "q"}
    return jobspec.validate_create({"schedule": {"cron": "0 * * * *"}, "dag": {"tasks": [
        {"id": "root", "target": target},
        *({"id": f"leaf{i}", "depends_on": ["root"], "target": target}
          for i in range(limits.dag_tasks_max - 1))]}})["spec"]


async def test_the_reaper_bounds_an_expiry_batch_by_what_it_may_release():
    spec = fan_out_spec()
    replica = replica_with_dag_jobs(20, spec, commands_granted=True)
    await fire_pass(trigger_over(replica), DUE_MS + 5)
    roots = [keys.task_run_id(keys.run_id(f"job_{i:04d}", DUE_MS), "root") for i in range(20)]
    started = replica.run(commands.run_updates(updates=[
        {"run_id": run_id, "event": "start", "holder": "worker:w1", "attempt": 1,
         "at_ms": DUE_MS + 10, "lease_ms": DUE_MS + 1000} for run_id in roots]))
    assert started["applied"] == 20, started
    proposed: list[commands.ExpireLeases] = []

    async def propose(command: commands.ExpireLeases) -> dict:
        proposed.append(command)
        return replica.run(command)
    state = Replicated(node_id="n1", store=replica.store, now_ms=lambda: DUE_MS + 10_000,
                       propose=propose, is_leader=lambda: True)
    reaper = Reaper(state, spawn=Supervisor("test").spawn, send=no_call)
    while await reaper.maybe_expire_leases():
        pass
    per_entry = limits.apply_entry_cost_max // cost.run_update_cost(spec, "root", "finish")
    assert [len(c.items) for c in proposed] == [per_entry, per_entry, 20 - 2 * per_entry]
