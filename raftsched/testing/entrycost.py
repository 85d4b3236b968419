"""How long one Raft entry holds a replica's Raft thread, for the worst fires
a tenant can cause (`python -m raftsched.testing.entrycost`).

In one process, with no network and no Raft, as runcost.py does: jobs are
created, then fired through fire_many entries packed two ways, by a count of
items alone (fire_batch_max, as fires were) and by cost (core/cost.py, as the
trigger does); each entry is decoded, applied and committed to a real LMDB
store. Times are CPU of this thread (time.thread_time), so a loaded machine
does not inflate them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from raftsched import limits
from raftsched.core import commands, cost, jobspec, keys
from raftsched.core.firing import fire_item
from raftsched.storage.base import due_rows
from raftsched.testing.runcost import NODE, SHARDS, Replica

HOUR_MS = 3_600_000
T0 = 1_700_002_800_000   # on the hour


def job_spec(tasks: int, misfire: dict | None = None) -> dict:
    """An hourly job: a plain HTTP call, or a DAG of `tasks` tasks that all start at once."""
    target = {"type": "http", "url": "http://127.0.0.1:9/h"}
    body: dict = {"schedule": {"cron": "0 * * * *"}}
    if misfire is not None:
        body["misfire"] = misfire
    if tasks:
        body["dag"] = {"tasks": [{"id": f"t{i}", "target": target} for i in range(tasks)]}
    else:
        body["target"] = target
    return jobspec.validate_create(body)["spec"]


def fire(jobs: int, spec: dict, by_cost: bool, late_ms: int = 0) -> dict:
    """Create `jobs` jobs of `spec` due at T0, fire them at T0 + late_ms."""
    with tempfile.TemporaryDirectory() as tmp:
        replica = Replica(os.path.join(tmp, "state"))
        replica.apply(commands.assign_shards(assignments=[(s, NODE) for s in range(SHARDS)],
                                             at_ms=T0 - HOUR_MS))
        for start in range(0, jobs, 50):
            items = [commands.create_job_item(job_id=f"job_{i:020x}", spec=spec,
                                              idempotency_key=None,
                                              shard=keys.shard_of(f"job_{i:020x}", SHARDS),
                                              next_ms=T0)
                     for i in range(start, min(jobs, start + 50))]
            replica.apply(commands.create_jobs(tenant="default", at_ms=T0 - HOUR_MS,
                                               items=items))
        at_ms = T0 + late_ms + 5
        chosen = [(shard, fire_item(replica.store.get("jobs", keys.job_key(job_id)), due, at_ms))
                  for shard in range(SHARDS)
                  for due, _, job_id, _ in due_rows(replica.store, shard, at_ms,
                                                    limits.fire_batch_max)]
        costs = [cost.fire_item_cost(spec, len(item[3])) for _, item in chosen]
        sizes = (cost.pack(costs, limits.apply_entry_cost_max, limits.fire_batch_max) if by_cost
                 else cost.pack([1] * len(chosen), limits.fire_batch_max, limits.fire_batch_max))
        times, start = [], 0
        for size in sizes:
            parts: dict[int, dict] = {}
            for shard, item in chosen[start:start + size]:
                parts.setdefault(shard, {"shard": shard, "token": 1, "upto_ms": at_ms,
                                         "items": [], "retries": []})["items"].append(item)
            start += size
            started = time.thread_time()
            replica.apply(commands.fire_many(node=NODE, at_ms=at_ms, parts=list(parts.values())))
            times.append(time.thread_time() - started)
        replica.store.close()
    times.sort()
    return {"entries": len(times), "longest_ms": round(times[-1] * 1000),
            "p50_ms": round(times[len(times) // 2] * 1000),
            "occurrences": max(len(item[3]) for _, item in chosen)}


def measure(dag_jobs: int = 2000) -> list[tuple[str, str, dict]]:
    dag, plain = job_spec(limits.dag_tasks_max), job_spec(0)
    rows = []
    for name, jobs, spec in ((f"{dag_jobs} DAG jobs of {limits.dag_tasks_max} tasks", dag_jobs,
                              dag), ("2000 plain jobs", 2000, plain)):
        for by_cost in (False, True):
            rows.append((name, "by cost" if by_cost else "by count", fire(jobs, spec, by_cost)))
    late = job_spec(limits.dag_tasks_max, {"policy": "fire_all", "catchup_max": 1000})
    rows.append(("1 DAG job, fire_all, 1000 hours late", "by cost",
                 fire(1, late, True, late_ms=1000 * HOUR_MS)))
    return rows


def render(rows: list[tuple[str, str, dict]]) -> str:
    lines = [f"conditions: one replica in one process, LMDB, apply_entry_cost_max "
             f"{limits.apply_entry_cost_max}, cores {os.cpu_count()}, "
             f"python {sys.version.split()[0]}; CPU ms of the applying thread"]
    for name, packing, r in rows:
        lines.append(f"{name:40} {packing:9} entries {r['entries']:4}  longest "
                     f"{r['longest_ms']:6} ms  p50 {r['p50_ms']:5} ms  "
                     f"occurrences/item {r['occurrences']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)))
