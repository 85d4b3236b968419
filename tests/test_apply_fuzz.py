"""decode+apply never raises on hostile logs but for unknown versions and tags; replicas agree."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

import msgspec
from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import backfill, codec, commands, keys
from raftsched.core.apply import DUE, JOBS, RUNS, SHARDS, apply_entry
from raftsched.core.tx import BACKFILLS, BACKFILLS_OPEN
from raftsched.errors import UnknownCommand
from raftsched.storage.base import digest
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.memory_store import MemoryStore
from raftsched.testing.proptest import examples

SHARD_COUNT = 4
JOB_IDS = ("job_a", "job_b", "job_c")
TOPICS = ("t1", "t2")
GROUPS = ("g1", "g2")
HTTP = {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST", "headers": {},
        "body": None, "timeout_s": 5.0}
QUEUED_COMMAND = {"type": "command", "argv": ["true"], "env": {}, "cwd": None, "timeout_s": 5.0,
                  "queue": "q1", "shell": False}
# A DAG (core/dag.py) in place of a target: node and worker tasks, a fan-in,
# and rules that run on failure or whatever happens.
DAG = {"dag": {"tasks": [
    {"id": "a", "target": HTTP, "depends_on": [], "trigger_rule": "all_success", "retry": None},
    {"id": "b", "target": QUEUED_COMMAND, "depends_on": ["a"], "trigger_rule": "all_success",
     "retry": {"max_attempts": 2, "backoff": "fixed", "base_s": 0.1, "max_s": 0.1,
               "non_retryable_exit_codes": []}},
    {"id": "c", "target": HTTP, "depends_on": ["a"], "trigger_rule": "one_failed",
     "retry": None},
    {"id": "d", "target": HTTP, "depends_on": ["b", "c"], "trigger_rule": "all_done",
     "retry": None}]}}
SCHEDULES = ({"kind": "every", "every_ms": 2000, "text": "2s"},
             {"kind": "once", "run_at_ms": 10_000, "offset_min": 0})
CONCURRENCY = ({"policy": "allow"}, {"policy": "queue", "queue_max": 2}, {"policy": "replace"},
               {"policy": "skip_if_running"})
# A string that stands where a hostile msgpack object is spliced into an entry.
PLACEHOLDER = "\x01placeholder\x02"

# Encoded msgpack objects codec.pack would not produce (or would, but no
# proposer should send): each replaces one member of a valid command.
HOSTILE_RAW = (
    codec.pack(""), codec.pack("x" * 600), codec.pack("é" * 300), codec.pack("a\x00b"),
    codec.pack(-1), codec.pack(2 ** 64 - 1), codec.pack(-(2 ** 63)), codec.pack(2 ** 63),
    codec.pack(None), codec.pack(True), codec.pack(1.5), codec.pack(float("nan")),
    codec.pack(float("inf")), codec.pack([]), codec.pack({}), codec.pack(b"\x00bytes"),
    codec.pack([[]]), codec.pack({"x": 1}), codec.pack(["a", 1]), codec.pack(0),
    b"\xa3\xed\xa0\x80",            # a str holding a UTF-8-encoded lone surrogate
    b"\xa2\xff\xfe",                # a str of bytes that are not UTF-8
    b"\x91" * 100 + b"\xc0",        # nested 100 deep: msgpack takes it, the schema must not
    b"\x91" * 5000 + b"\xc0",       # nested past msgpack's own stack
    b"\xd4\x05\x00",                # an extension type
    b"\xd6\xff\x00\x00\x00\x00",    # a msgpack timestamp
    b"\x81\x01\x02",                # a map with an integer key
    b"\x81\x90\x01",                # a map with a list key (unhashable)
    b"\xcf\x00",                    # a truncated uint64: the rest of the entry misparses
    b"\xc1",                        # the one byte msgpack never uses
)


def _spec(schedule: dict, target: dict, concurrency: dict, max_attempts: int) -> dict:
    """`target`: a target, or DAG (the spec runs that DAG instead)."""
    work = dict(target) if target is DAG else {"target": target}
    return {"name": "fuzz", "schedule": schedule, **work,
            "retry": {"max_attempts": max_attempts, "backoff": "exponential", "base_s": 1.0,
                      "max_s": 5.0, "non_retryable_exit_codes": []},
            "concurrency": concurrency,
            "misfire": {"policy": "fire_all", "tolerance_ms": 60_000, "catchup_max": 10},
            "alert": {}, "metadata": {"team": "fuzz", "n": [1, 2.5, None]}}


def _runs(store: MemoryStore, state: str) -> list[dict]:
    return [run for _, run in store.scan(RUNS) if run["state"] == state]


def _pick(items: list, k: int):
    return items[k % len(items)] if items else None


def _fire(store: MemoryStore, job_id: str, t: int) -> dict:
    """Fire `job_id`'s next occurrence (and its shard's due retries) as its
    shard's owner would; assign the shard to n1 first if it has no owner."""
    shard = keys.shard_of(job_id, SHARD_COUNT)
    state = store.get(SHARDS, keys.shard_key(shard))
    if state is None or state["owner"] != "n1":
        return commands.assign_shards(assignments=[(shard, "n1")], at_ms=t)
    job = store.get(JOBS, keys.job_key(job_id))
    items = []
    if job is not None and job["next_ms"] is not None:
        due = job["next_ms"]
        nxt = None if job["spec"]["schedule"]["kind"] == "once" else due + 2000
        items.append((job_id, due, nxt, [due], False))
    retries = [(ident, due_ms) for key, _ in store.scan(DUE, start=keys.shard_prefix(shard),
                                                        stop=keys.shard_prefix(shard + 1))
               for _, due_ms, kind, ident in [keys.parse_due_key(key)] if kind == keys.KIND_RETRY]
    upto = max([t] + [i[1] for i in items] + [r[1] for r in retries])
    return commands.fire(shard=shard, token=state["token"], upto_ms=upto, node="n1", at_ms=upto,
                         items=items, retries=retries)


def _holder(run: dict) -> str:
    return "worker:w1" if run.get("queue") else run["node"]


def _run_command(store: MemoryStore, kind: str, k: int, t: int, flag: bool) -> dict | None:
    """Commands about existing runs: start, heartbeat, finish, expire, cancel, ...
    A report about a running run when none runs starts one instead, and a
    start when none is queued fires a job, so short logs get far."""
    running = _runs(store, "running")
    if kind == "start" or (kind in ("heartbeat", "finish", "expire") and not running):
        run = _pick(_runs(store, "queued"), k)
        if run is None:
            return _fire(store, JOB_IDS[k % len(JOB_IDS)], t)
        return commands.run_updates(updates=[{
            "run_id": run["id"], "event": "start", "holder": _holder(run),
            "attempt": run["attempt"], "at_ms": t, "lease_ms": t + 5000}])
    run = _pick(running, k)
    if kind == "heartbeat":
        return run and commands.run_updates(updates=[{
            "run_id": run["id"], "event": "heartbeat", "holder": run["holder"] or "n1",
            "attempt": run["attempt"], "at_ms": t, "lease_ms": t + 9000}])
    if kind == "finish":
        return run and commands.run_updates(updates=[{
            "run_id": run["id"], "event": "finish", "holder": run["holder"] or "n1",
            "attempt": run["attempt"], "at_ms": t, "ok": flag, "retryable": True,
            "retry_delay_ms": 100, "http_status": 200 if flag else 500, "exit_code": None,
            "error": None if flag else "HTTP 500", "output_node": "n1"}])
    if kind == "expire":
        return run and commands.expire_leases(items=[(run["id"], run["attempt"], 50)],
                                              at_ms=(run["lease_ms"] or t) + 1)
    if kind == "take_over":
        # Its shard given to n2 first, then its runs taken over, judged (flag)
        # by their holder's recorded lease or not.
        run = _pick(running, k)
        if run is None:
            return None
        state = store.get(SHARDS, keys.shard_key(run["shard"]))
        if state is None or state["owner"] != "n2":
            return commands.assign_shards(assignments=[(run["shard"], "n2")], at_ms=t)
        return commands.take_over_runs(node="n2", shard=run["shard"], token=state["token"],
                                       run_ids=[run["id"]], at_ms=t, judge_uncalled=flag)
    if kind == "reassign":
        run = _pick(_runs(store, "queued"), k)
        return run and commands.reassign_runs(items=[(run["id"], run["node"] or "n1", "n2")],
                                              at_ms=t)
    if kind == "retry":
        run = _pick(_runs(store, "failed"), k)
        return run and commands.retry_run(run_id=run["id"], node="n2", at_ms=t,
                                          overlap="allow" if flag else None)
    any_run = _pick([run for _, run in store.scan(RUNS)], k)
    if kind == "cancel":
        return any_run and commands.cancel_run(run_id=any_run["id"], reason="fuzz", at_ms=t)
    assert kind == "alert_done", kind
    return any_run and commands.alert_done(run_id=any_run["id"], outcome="sent", error=None,
                                           at_ms=t)


def _job_command(kind: str, job_id: str, t: int, variant: int) -> dict:
    if kind == "create":
        spec = _spec(SCHEDULES[variant % 2], (HTTP, QUEUED_COMMAND, DAG)[variant // 2 % 3],
                     CONCURRENCY[variant // 4 % 4], 1 + variant % 3)
        if variant % 3 == 0:   # a jittered job with a catch-up window and labels
            spec.update(jitter_ms=700, labels={"team": "fuzz"},
                        misfire=dict(spec["misfire"], catchup_window_ms=3000))
        idem = f"idem-{variant % 3}" if variant % 5 else None
        if variant % 2:   # as a node at level 5 proposes a group of creates
            return commands.create_jobs(tenant="default", at_ms=t, compact=True, items=[
                commands.create_job_item(job_id=job_id, spec=spec, idempotency_key=idem,
                                         shard=keys.shard_of(job_id, SHARD_COUNT),
                                         next_ms=10_000 + t)])
        return commands.create_job(job_id=job_id, tenant="default", spec=spec,
                                   idempotency_key=idem,
                                   shard=keys.shard_of(job_id, SHARD_COUNT), next_ms=10_000 + t,
                                   at_ms=t)
    if kind == "update":
        spec = _spec(SCHEDULES[0], (HTTP, DAG)[variant // 4 % 2], CONCURRENCY[variant % 4], 2)
        return commands.update_job(job_id=job_id, spec=spec, expected_version=1 + variant % 3,
                                   next_ms=20_000 + t, at_ms=t)
    if kind == "pause":
        return commands.pause_job(job_id=job_id, at_ms=t,
                                  note=f"note {variant}" if variant % 2 else None)
    if kind == "resume":
        return commands.resume_job(job_id=job_id, next_ms=30_000 + t, at_ms=t)
    if kind == "delete":
        return commands.delete_job(job_id=job_id, at_ms=t)
    assert kind == "trigger", kind
    return commands.trigger_job(job_id=job_id, scheduled_ms=t, node="n2", at_ms=t,
                                overlap="allow" if variant % 2 else None)


def _other_command(kind: str, k: int, t: int) -> dict:
    topic = TOPICS[k % 2]
    if kind == "publish":
        return commands.publish(topic=topic, key=None, message={"k": k}, execution_id=f"exe_{k}",
                                job_id="job_a", at_ms=t)
    if kind == "commit_offset":
        return commands.commit_offset(topic=topic, group=GROUPS[k % 2], offset=k % 4, at_ms=t)
    if kind == "register":
        return commands.register_node(node=f"n{k % 3}", http="http://127.0.0.1:1",
                                      raft="127.0.0.1:2", at_ms=t)
    if kind in ("renew", "renew_recorded"):
        return commands.renew(node=f"n{k % 3}", at_ms=t, record=kind == "renew_recorded")
    assert kind == "check_digest", kind
    return commands.check_digest(node="n1", at_ms=t)


def _backfill_command(store: MemoryStore, kind: str, k: int, t: int, variant: int) -> dict:
    """Backfills bf_0..bf_2 of the three jobs: created, stepped (with occurrences
    in and out of their ranges, claimed exhausted or not), cancelled, purged."""
    running = [key.decode() for key, _ in store.scan(BACKFILLS_OPEN)]
    backfill_id = f"bf_{k}" if kind == "backfill" else _pick(running, k) or f"bf_{k}"
    if kind == "backfill":
        job = store.get(JOBS, keys.job_key(JOB_IDS[k]))
        return commands.create_backfill(
            backfill_id=backfill_id, job_id=JOB_IDS[k], tenant="default",
            expected_version=job["version"] if job and variant % 7 else 1,
            start_ms=variant * 1000, end_ms=variant * 1000 + 20_000,
            overlap=("allow", "job")[variant % 2], max_concurrent=1 + variant % 3,
            total=1 + variant % 3, at_ms=t)
    if kind == "backfill_step":
        # The next occurrences after its cursor, a step apart: some beyond its
        # end, and (one variant in five) one at or before the cursor.
        record = store.get(BACKFILLS, backfill_id.encode())
        after = variant * 500 if record is None else backfill.after_ms(record)
        spacing = 1000 + variant * 300
        first = after + 1 - (spacing if variant % 5 == 0 else 0)
        occurrences = sorted({max(0, first + i * spacing) for i in range(1 + variant % 4)})
        return commands.backfill_step(node="n1", at_ms=t, items=[
            {"backfill_id": backfill_id, "occurrences": occurrences,
             "exhausted": variant % 3 == 0}])
    if kind == "cancel_backfill":
        return commands.cancel_backfill(backfill_id=backfill_id,
                                        reason="fuzz" if variant % 2 else None, at_ms=t)
    assert kind == "purge", kind
    return commands.purge(at_ms=t, history_max_runs=1 + variant % 3, history_max_age_ms=variant,
                          finished_job_retention_ms=variant * 100, idempotency_ttl_ms=variant,
                          runs=[], jobs=[], idem=[], backfills=[backfill_id])


JOB_KINDS = ("create", "update", "pause", "resume", "delete", "trigger")
RUN_KINDS = ("start", "heartbeat", "finish", "expire", "reassign", "cancel", "alert_done",
             "retry", "take_over")
OTHER_KINDS = ("publish", "commit_offset", "register", "renew", "renew_recorded",
               "check_digest")
BACKFILL_KINDS = ("backfill", "backfill_step", "backfill_step", "cancel_backfill", "purge")

_VALID = {
    "job": st.tuples(st.just("job"), st.sampled_from(JOB_KINDS), st.integers(0, 2),
                     st.integers(0, 40)),
    "fire": st.tuples(st.just("fire"), st.integers(0, 2)),
    "run": st.tuples(st.just("run"), st.sampled_from(RUN_KINDS), st.integers(0, 5),
                     st.booleans()),
    "other": st.tuples(st.just("other"), st.sampled_from(OTHER_KINDS), st.integers(0, 7)),
    "backfill": st.tuples(st.just("backfill"), st.sampled_from(BACKFILL_KINDS),
                          st.integers(0, 2), st.integers(0, 40)),
}
# Weighted towards fires and run reports, which need runs made by earlier entries.
_valid_op = st.sampled_from(["job", "fire", "fire", "run", "run", "run", "run", "other",
                             "backfill", "backfill"]).flatmap(_VALID.__getitem__)
# Each log starts with every shard owned by n1 and the three jobs created (in
# drawn variants), so fires and run reports find something to act on.
_setup = st.lists(st.integers(0, 40), min_size=len(JOB_IDS), max_size=len(JOB_IDS))
_HOSTILE = {
    "valid": _valid_op,
    # Replace one member (at any depth) of a valid command by a hostile object.
    "splice": st.tuples(st.just("splice"), _valid_op, st.integers(0, 200),
                        st.sampled_from(HOSTILE_RAW)),
    # Leave one member out.
    "drop": st.tuples(st.just("drop"), _valid_op, st.integers(0, 200)),
    "garbage": st.tuples(st.just("garbage"), st.binary(max_size=64)),
    "version": st.tuples(st.just("version"), st.integers(-3, 3),
                         st.sampled_from(sorted(commands.TAGS) + ["drop_tables"])),
}
_op = st.sampled_from(["valid", "valid", "valid", "splice", "splice", "drop", "garbage",
                       "version"]).flatmap(_HOSTILE.__getitem__)


def _valid_command(store: MemoryStore, op: tuple, t: int) -> dict | None:
    if op[0] == "job":
        return _job_command(op[1], JOB_IDS[op[2]], t, op[3])
    if op[0] == "fire":
        return _fire(store, JOB_IDS[op[1]], t)
    if op[0] == "run":
        return _run_command(store, op[1], op[2], t, op[3])
    if op[0] == "backfill":
        return _backfill_command(store, op[1], op[2], t, op[3])
    return _other_command(op[1], op[2], t)


def _paths(value: object, path: tuple = ()) -> list[tuple]:
    """Every member path of a command (map keys and list indexes), v and t excepted."""
    out = []
    children = (value.items() if isinstance(value, dict) else enumerate(value)
                if isinstance(value, (list, tuple)) else ())
    for name, child in children:
        if path == () and name in ("v", "t"):
            continue
        out.append(path + (name,))
        out.extend(_paths(child, path + (name,)))
    return out


def _set(command: dict, path: tuple, value: object, drop: bool = False) -> dict:
    command = codec.unpack(codec.pack(command))   # a deep copy, with tuples as lists
    parent = command
    for name in path[:-1]:
        parent = parent[name]
    if drop:
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return command


def _entry(store: MemoryStore, op: tuple, t: int) -> bytes | None:
    """The log entry for `op` against the current state (None: nothing to propose)."""
    if op[0] == "garbage":
        return op[1]
    if op[0] == "version":
        return codec.pack({"v": op[1], "t": op[2], "node": "n1", "at_ms": t})
    if op[0] in ("splice", "drop"):
        command = _valid_command(store, op[1], t)
        command = command and msgspec.to_builtins(command)   # the map the log carries
        paths = command and _paths(command)
        if not paths:
            return None
        path = paths[op[2] % len(paths)]
        if op[0] == "drop":
            return codec.pack(_set(command, path, None, drop=True))
        data = codec.pack(_set(command, path, PLACEHOLDER))
        assert data.count(codec.pack(PLACEHOLDER)) == 1
        return data.replace(codec.pack(PLACEHOLDER), op[3])
    command = _valid_command(store, op, t)
    return None if command is None else commands.encode(command)


def _is_unknown(data: bytes) -> bool:
    """Would decode stop the node here: a map with an integer v other than
    this build's, or the right v and a string tag this build does not know?"""
    command = codec.unpack(data)
    v, t = command.get("v"), command.get("t")
    if isinstance(v, int) and not isinstance(v, bool) and v != commands.VERSION:
        return True
    return v == commands.VERSION and isinstance(t, str) and t not in commands.TAGS


def _setup_entries(variants: list[int]) -> list[bytes]:
    assign = commands.assign_shards(assignments=[(s, "n1") for s in range(SHARD_COUNT)], at_ms=1)
    return [commands.encode(assign)] + [
        commands.encode(_job_command("create", job_id, 1, variant))
        for job_id, variant in zip(JOB_IDS, variants)]


def _apply_both(replicas: list, data: bytes, index: int) -> dict | None:
    """Apply one entry on every replica; return the (common) result, or None
    if the entry is of an unknown version or tag (a node would stop there)."""
    results = []
    for store in replicas:
        try:
            tag, transition = apply_entry(store, data, index)
        except UnknownCommand:
            assert _is_unknown(data), data
            return None
        store.commit(transition, index)
        results.append(transition.result)
    assert all(r == results[0] for r in results), results
    return results[0]


@contextlib.contextmanager
def _replicas() -> Iterator[tuple[MemoryStore, LmdbStore]]:
    """Two replicas to apply the same log to: in memory and in LMDB."""
    with tempfile.TemporaryDirectory() as tmp:
        lmdb_store = LmdbStore(tmp, map_size=32 * 1024 ** 2)
        try:
            yield MemoryStore(), lmdb_store
        finally:
            lmdb_store.close()


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_setup, st.lists(_op, min_size=1, max_size=25))
def test_hostile_logs_never_raise_and_replicas_agree(variants, ops):
    with _replicas() as (memory, lmdb_store):
        for index, data in enumerate(_setup_entries(variants), start=1):
            _apply_both([memory, lmdb_store], data, index)
        for step, op in enumerate(ops):
            data = _entry(memory, op, 1000 * (step + 1))
            if data is None:
                continue
            before = digest(memory)[1]
            result = _apply_both([memory, lmdb_store], data, index + 1)
            if result is None:
                continue
            index += 1
            assert result.get("error") != "apply_failed", result.get("traceback")
            if result.get("error") in ("invalid_command", "refused"):
                assert digest(memory)[1] == before, op   # nothing written but the index
        assert digest(lmdb_store) == digest(memory)


@settings(max_examples=examples(100), deadline=None)
@given(_setup, st.lists(_valid_op, min_size=5, max_size=40))
def test_valid_logs_are_accepted_and_replicas_agree(variants, ops):
    """The generator's valid commands pass the schemas: none is refused as malformed."""
    with _replicas() as (memory, lmdb_store):
        index = 0
        for data in _setup_entries(variants):
            index += 1
            _apply_both([memory, lmdb_store], data, index)
        for step, op in enumerate(ops):
            data = _entry(memory, op, 1000 * (step + 1))
            if data is None:
                continue
            index += 1
            result = _apply_both([memory, lmdb_store], data, index)
            assert result is not None
            assert result.get("error") not in ("invalid_command", "refused",
                                               "apply_failed"), (op, result)
        assert digest(lmdb_store) == digest(memory)
