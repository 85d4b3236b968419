"""What one run costs a replica, from create to finish (`raftsched bench cost N`).

In one process, with no network and no Raft: N one-off HTTP jobs are created
through the same commands a node proposes (create_jobs_stored entries of
batch_entry_jobs_max), fired through fire_many entries as the trigger builds
them (each run held by the shard's owner from its fire on: there is no
start entry), and finished through run_updates entries as the dispatcher's
reports come. Each entry is decoded, applied and committed to a real LMDB
store exactly as a node does (core/apply.apply_entry, LmdbStore.commit).

For each phase it counts, per job or run: Raft entries, LMDB writes (puts
and deletes), msgpack encodes and decodes of records, bytes encoded, and CPU
microseconds of this process (time.process_time: decode, apply, encode,
commit, and the garbage collections they cause, with the collector tuned as
in a node). Every replica pays this for every run; the proposer's side (the
trigger reading due entries, building the commands) is counted apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from typing import Iterator

from raftsched import limits
from raftsched.api.ids import JobIds
from raftsched.core import codec, commands, keys, jobspec
from raftsched.core.apply import apply_entry
from raftsched.runtime.trigger import job_fire_item
from raftsched.core.schedule import next_fire_ms
from raftsched.runtime import gcpolicy
from raftsched.storage.base import due_rows
from raftsched.storage.lmdb_store import LmdbStore

NODE = "n1"
SHARDS = 64
REPORT_BATCH = limits.run_update_batch_max


@dataclasses.dataclass
class Phase:
    name: str
    items: int = 0
    entries: int = 0
    writes: int = 0
    packs: int = 0
    unpacks: int = 0
    packed_bytes: int = 0
    cpu_s: float = 0.0

    def per_item(self) -> dict:
        n = max(1, self.items)
        return {"phase": self.name, "items": self.items,
                "entries": round(self.entries / n, 4), "lmdb_writes": round(self.writes / n, 2),
                "encodes": round(self.packs / n, 2), "decodes": round(self.unpacks / n, 2),
                "encoded_bytes": round(self.packed_bytes / n),
                "cpu_us": round(self.cpu_s / n * 1e6, 1)}


class _Counting:
    """Counts codec.pack/unpack/unpack_record calls (every record the store
    encodes or decodes goes through them) while installed."""

    def __init__(self) -> None:
        self.packs = self.unpacks = self.packed_bytes = 0
        self._pack, self._unpack, self._unpack_record = \
            codec.pack, codec.unpack, codec.unpack_record

    def pack(self, value: object) -> bytes:
        data = self._pack(value)
        self.packs += 1
        self.packed_bytes += len(data)
        return data

    def unpack(self, data: bytes) -> object:
        self.unpacks += 1
        return self._unpack(data)

    def unpack_record(self, data: bytes) -> object:
        self.unpacks += 1
        return self._unpack_record(data)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        codec.pack, codec.unpack, codec.unpack_record = \
            self.pack, self.unpack, self.unpack_record
        try:
            yield
        finally:
            codec.pack, codec.unpack, codec.unpack_record = \
                self._pack, self._unpack, self._unpack_record


class Replica:
    def __init__(self, path: str) -> None:
        self.store = LmdbStore(path)
        self.index = 0
        self.counting = _Counting()

    def apply(self, command: dict, phase: Phase | None = None) -> dict:
        data = commands.encode(command)
        self.index += 1
        before = (self.counting.packs, self.counting.unpacks, self.counting.packed_bytes)
        started = time.process_time()
        with self.counting.installed():
            _, transition = self.store.apply_commit(
                self.index, lambda view: apply_entry(view, data, self.index))
        if phase is not None:
            phase.cpu_s += time.process_time() - started
            phase.entries += 1
            phase.writes += len(transition.writes)
            phase.packs += self.counting.packs - before[0]
            phase.unpacks += self.counting.unpacks - before[1]
            phase.packed_bytes += self.counting.packed_bytes - before[2]
        assert transition.result.get("ok"), transition.result
        return transition.result


_JOB_IDS = JobIds()


def _job_id(i: int) -> str:
    """A job id as the API makes them (api/ids.py): in the order made, so the
    tables keyed by it fill as on a node."""
    return _JOB_IDS.next()


def _spec(run_at_ms: int) -> dict:
    body = {"run_at": _iso(run_at_ms),
            "target": {"type": "http", "url": "http://127.0.0.1:9/hook", "timeout_s": 30}}
    return jobspec.validate_create(body)["spec"]


def _iso(ms: int) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()


def measure(n: int) -> dict:
    # The collector as a node process has it (runtime/gcpolicy.py): what a
    # replica's apply costs there includes the collections it causes.
    gcpolicy.tune()
    now_ms = int(time.time() * 1000)
    due_ms = now_ms + 3_600_000
    phases = {name: Phase(name) for name in ("create", "fire", "finish")}
    proposer = Phase("trigger (proposer only)")
    with tempfile.TemporaryDirectory() as tmp:
        replica = Replica(os.path.join(tmp, "state"))
        replica.apply(commands.assign_shards(assignments=[(s, NODE) for s in range(SHARDS)],
                                             at_ms=now_ms))
        spec = _spec(due_ms)
        size = limits.batch_entry_jobs_max
        for start in range(0, n, size):
            items = []
            for i in range(start, min(n, start + size)):
                job_id = _job_id(i)
                items.append(commands.create_job_item(
                    job_id=job_id, spec=spec, idempotency_key=None,
                    shard=keys.shard_of(job_id, SHARDS),
                    next_ms=next_fire_ms(spec["schedule"], now_ms)))
            replica.apply(commands.create_jobs(tenant="default", at_ms=now_ms, items=items,
                                               stored=True),
                          phases["create"])
            phases["create"].items += len(items)
        run_ids = _fire_all(replica, due_ms, phases["fire"], proposer)
        for event, at in (("finish", due_ms + 20),):
            phase = phases[event]
            for start in range(0, len(run_ids), REPORT_BATCH):
                updates = [_update(event, run_id, at)
                           for run_id in run_ids[start:start + REPORT_BATCH]]
                result = replica.apply(commands.run_updates(updates=updates), phase)
                assert result["applied"] == len(updates), result
                phase.items += len(updates)
        replica.store.close()
    rows = [p.per_item() for p in (*phases.values(), proposer)]
    total = {"phase": "fire to finish (one replica)", "items": n}
    for field in ("entries", "lmdb_writes", "encodes", "decodes", "encoded_bytes", "cpu_us"):
        total[field] = round(sum(r[field] for r in rows[1:3]), 4 if field == "entries" else 1)
    return {"scenario": "cost", "runs": n, "cores": os.cpu_count(),
            "python": sys.version.split()[0], "phases": rows + [total]}


def _fire_all(replica: Replica, due_ms: int, phase: Phase, proposer: Phase) -> list[str]:
    """Fire every due entry, as the trigger does: per shard, read the due
    rows and each job, and propose fire_many entries of fire_batch_max."""
    store, run_ids = replica.store, []
    at_ms = due_ms + 5
    chosen = []
    started = time.process_time()
    for shard in range(SHARDS):
        for row_due_ms, _kind, job_id, _value in due_rows(store, shard, at_ms,
                                                          limits.fire_batch_max):
            built = job_fire_item(store, job_id, row_due_ms, at_ms)
            assert built is not None, job_id
            chosen.append((shard, built[0]))
    proposer.cpu_s += time.process_time() - started
    proposer.items += len(chosen)
    for start in range(0, len(chosen), limits.fire_batch_max):
        parts: dict[int, dict] = {}
        for shard, item in chosen[start:start + limits.fire_batch_max]:
            parts.setdefault(shard, {"shard": shard, "token": 1, "upto_ms": at_ms,
                                     "items": [], "retries": []})["items"].append(item)
            run_ids.append(keys.run_id(item[0], item[1]))
        result = replica.apply(commands.fire_many(node=NODE, at_ms=at_ms,
                                                  parts=list(parts.values())), phase)
        phase.items += result["fired"]
    return run_ids


def _update(event: str, run_id: str, at_ms: int) -> dict:
    update = {"run_id": run_id, "event": event, "holder": NODE, "attempt": 1, "at_ms": at_ms}
    if event == "start":
        update["lease_ms"] = at_ms + 30_000
    else:
        update.update(ok=True, retryable=True, retry_delay_ms=None, http_status=200,
                      exit_code=None, error=None, output_node=None)
    return update


def measure_repeated(n: int, repeat: int) -> dict:
    """measure(n) `repeat` times in this process: each phase's CPU as the
    least of the runs (`cpu_us`), their median and every run's; the counts
    are the same in every run. On a machine whose speed wanders, the least
    is what compares builds."""
    runs = [measure(n) for _ in range(repeat)]
    figures = runs[0]
    figures["repeat"] = repeat
    for at, row in enumerate(figures["phases"]):
        each = [r["phases"][at]["cpu_us"] for r in runs]
        row["cpu_us"], row["cpu_us_median"] = min(each), sorted(each)[len(each) // 2]
        row["cpu_us_runs"] = each
    return figures


def render(figures: dict) -> str:
    repeat = figures.get("repeat", 1)
    head = (f"conditions: scenario cost, runs {figures['runs']}, one replica in one process "
            f"(no network, no Raft), LMDB, cores {figures['cores']}, python {figures['python']}"
            + (f", {repeat} times: cpu us the least, then the median" if repeat > 1 else ""))
    lines = [head, f"{'per job or run':30} {'entries':>8} {'writes':>7} {'encodes':>8} "
                   f"{'decodes':>8} {'bytes':>7} {'cpu us':>8}"
                   + (f" {'median':>8}" if repeat > 1 else "")]
    for row in figures["phases"]:
        lines.append(f"{row['phase']:30} {row['entries']:8.4f} {row['lmdb_writes']:7.2f} "
                     f"{row['encodes']:8.2f} {row['decodes']:8.2f} {row['encoded_bytes']:7d} "
                     f"{row['cpu_us']:8.1f}"
                     + (f" {row['cpu_us_median']:8.1f}" if repeat > 1 else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)))
