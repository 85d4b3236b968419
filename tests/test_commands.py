"""Every command tag has a schema; decode refuses malformed entries, stops on unknown v or t."""

from __future__ import annotations

import copy

import msgspec
import pytest

from raftsched import limits
from raftsched.core import backfill, codec, commands, compact, keys
from raftsched.core.apply import HANDLERS
from raftsched.errors import CommandRefused, UnknownCommand

SPEC = {"name": "j", "schedule": {"kind": "every", "every_ms": 2000, "text": "2s"},
        "target": {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST",
                   "headers": {}, "body": None, "timeout_s": 5.0},
        "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0, "max_s": 60.0,
                  "non_retryable_exit_codes": []},
        "concurrency": {"policy": "allow"},
        "misfire": {"policy": "fire_once", "tolerance_ms": 60_000, "catchup_max": 100},
        "alert": {}, "metadata": {"team": "a"}}


def create(**overrides) -> dict:
    fields = dict(job_id="job_a1", tenant="default", spec=SPEC, idempotency_key="k", shard=3,
                  next_ms=10_000, at_ms=1_000)
    fields.update(overrides)
    return commands.create_job(**fields)


def refused(command: commands.Command) -> CommandRefused:
    with pytest.raises(CommandRefused) as info:
        commands.decode(commands.encode(command))
    return info.value


def test_every_tag_has_a_schema_and_a_handler():
    assert set(commands.SHAPES) == set(commands.TAGS)
    assert all(issubclass(shape, commands.Command) for shape in commands.SHAPES.values())
    assert set(HANDLERS) == set(commands.TAGS)


def test_every_key_layout_fits_lmdb_at_the_bounds():
    """A key built from parts at their byte limits is at most lmdb_key_bytes_max."""
    def part(n: int) -> str:
        return "é" * (n // 2)   # two UTF-8 bytes a character

    job, run = part(limits.job_id_bytes_max), part(limits.run_id_bytes_max)
    node = part(limits.node_id_bytes_max)
    tenant = part(limits.tenant_bytes_max)
    topic = keys.scoped(tenant, part(limits.topic_bytes_max))
    ms = 2 ** 64 - 1
    layouts = [
        keys.job_key(job), keys.due_key(65_535, ms, job), keys.retry_due_key(65_535, ms, run),
        keys.job_run_key(job, ms), keys.open_run_key(65_535, run),
        keys.runs_by_tenant_key(tenant, ms, run),
        keys.lease_key(ms, run), keys.ready_key(keys.scoped(tenant, part(limits.queue_bytes_max)), 2, ms, run),
        keys.topic_key(topic, ms),
        keys.topic_idem_key(topic, part(limits.execution_id_bytes_max)),
        keys.group_key(topic, part(limits.group_bytes_max)),
        keys.idem_key(part(limits.tenant_bytes_max), part(limits.idempotency_key_bytes_max)),
        node.encode(), run.encode(), topic.encode(),
        part(limits.key_part_bytes_max).encode(), backfill.tenant_open_counter_key(tenant),
    ]
    assert max(len(key) for key in layouts) <= limits.lmdb_key_bytes_max
    # A run id apply makes fits the bound commands hold run ids to.
    assert len(keys.job_run_key(job, ms)) <= limits.run_id_bytes_max


def test_well_formed_commands_decode_unchanged():
    commands_ = [
        create(), create(idempotency_key=None, next_ms=None),
        commands.fire(shard=3, token=2, upto_ms=5_000, node="n1", at_ms=5_000,
                      items=[("job_a1", 2_000, 6_000, [2_000, 4_000], True)],
                      retries=[("run_x", 4_500)]),
        commands.run_updates(updates=[
            {"run_id": "run_x", "event": "start", "holder": "worker:w1", "attempt": 1,
             "at_ms": 1, "lease_ms": 5_001},
            {"run_id": "run_x", "event": "finish", "holder": "n1", "attempt": 2, "at_ms": 1,
             "ok": False, "retryable": True, "retry_delay_ms": 40, "http_status": 503,
             "exit_code": None, "error": "HTTP 503", "output_node": "n1"}]),
        commands.commit_offset(topic="t", group="g", offset=0, at_ms=1),
        commands.publish(topic="t", key=None, message=[1, {"a": None}], execution_id="exe_1",
                         job_id="job_a1", at_ms=1),
        commands.fire_many(node="n1", at_ms=9, parts=[
            {"shard": 1, "token": 2, "upto_ms": 9, "items": [("job_a1", 5, None, [5], False)],
             "retries": [("run_x", 4)]}]),
        commands.assign_shards(assignments=[(0, "n1"), (1, "n2")], at_ms=1),
        commands.expire_leases(items=[("run_x", 1, 40)], at_ms=1),
        commands.reassign_runs(items=[("run_x", "n1", "n2")], at_ms=1),
        commands.purge(at_ms=1, history_max_runs=5, history_max_age_ms=0,
                       finished_job_retention_ms=0, idempotency_ttl_ms=0,
                       runs=[("run_x", "job_a1")], jobs=["job_b"], idem=[("default", "k")]),
        commands.put_tenant(tenant="t", quota={"jobs_max": 5, "creates_per_s": None},
                            actor=None, at_ms=1),
        commands.trigger_job(job_id="job_a1", scheduled_ms=1, node="n1", at_ms=1),
        commands.pause_job(job_id="job_a1", at_ms=1, note="why"),
    ]
    for command in commands_:
        data = commands.encode(command)
        assert commands.decode(data) == command
        # The log format is the map it has always been: entries written before
        # the shapes were Structs decode alike, and these decode as maps.
        as_map = msgspec.to_builtins(command)
        assert codec.unpack(data) == as_map
        assert commands.decode(codec.pack(as_map)) == command
    # Records that were tuples are still msgpack arrays in the log.
    assert codec.unpack(commands.encode(commands_[6]))["parts"][0]["items"] == \
        [["job_a1", 5, None, [5], False]]
    # A member that may be left out, and was, is not in the entry.
    assert "overlap" not in codec.unpack(commands.encode(commands_[-2]))


def test_unknown_versions_and_tags_stop_the_node():
    for command in ({"v": 2, "t": "fire"}, {"v": 0, "t": "renew"}, {"v": 1, "t": "drop_tables"}):
        with pytest.raises(UnknownCommand):
            commands.decode(codec.pack(command))


@pytest.mark.parametrize("data", [
    b"", b"\xc1", b"\x93\x01\x02",            # nothing, not msgpack, a list
    b"\x81\xa1v\x01\xff",                     # trailing bytes
    codec.pack({"t": "renew"}),               # no version
    codec.pack({"v": True, "t": "renew", "node": "n1", "at_ms": 1}),
    codec.pack({"v": 1, "t": 7}),
    b"\x83\xa1v\x01\xa1t\xa5renew\xa4node\xa3\xed\xa0\x80",   # a lone surrogate as UTF-8
    b"\x81\x90\x01",                          # a map keyed by a list
    b"\x91" * 5000 + b"\xc0",                 # nested past msgpack's stack
])
def test_bytes_that_are_not_a_command_are_refused(data):
    with pytest.raises(CommandRefused):
        commands.decode(data)


@pytest.mark.parametrize("overrides, field", [
    ({"job_id": ""}, "job_id"),
    ({"job_id": "a\x00b"}, "job_id"),
    ({"job_id": "é" * 65}, "job_id"),                       # 130 bytes, 65 characters
    ({"idempotency_key": "€" * 200}, "idempotency_key"),  # 600 bytes
    ({"job_id": "\U0001d11e" * 33}, "job_id"),             # 132 bytes, 33 characters
    ({"tenant": "\U0001d11e" * 16 + "a"}, "tenant"),        # 65 bytes, 17 characters
    ({"tenant": 5}, "tenant"),
    ({"shard": 65_536}, "shard"),
    ({"shard": -1}, "shard"),
    ({"next_ms": 2 ** 63}, "next_ms"),
    ({"at_ms": True}, "at_ms"),
    ({"spec": {**SPEC, "schedule": {"kind": "hourly"}}}, "spec.schedule.kind"),
    ({"spec": {**SPEC, "schedule": {"kind": "every", "every_ms": 0}}}, "spec.schedule.every_ms"),
    ({"spec": {**SPEC, "target": {"type": "command", "argv": [], "timeout_s": 1}}},
     "spec.target.argv"),
    ({"spec": {**SPEC, "misfire": None}}, "spec.misfire"),
    ({"spec": {**SPEC, "concurrency": {"policy": "queue", "queue_max": "3"}}},
     "spec.concurrency.queue_max"),
    ({"spec": {k: v for k, v in SPEC.items() if k != "target"}}, "spec.target"),
    ({"spec": {**SPEC, "metadata": {"a": float("nan")}}}, "spec.metadata.a"),
    # Members no shape declares are stored as sent, so they must be JSON too.
    ({"spec": {**SPEC, "later": float("inf")}}, "spec.later"),
    ({"spec": {**SPEC, "schedule": {**SPEC["schedule"], "later": [float("nan")]}}},
     "spec.schedule.later[0]"),
    ({"spec": {**SPEC, "target": {**SPEC["target"], "body": {"a": [b"raw"]}}}},
     "spec.target.body.a[0]"),
    # A label key is a key string inside a map: bounded in bytes, free of NUL.
    ({"spec": {**SPEC, "labels": {"a\x00b": "v"}}}, "spec.labels"),
    ({"spec": {**SPEC, "labels": {"\U0001d11e" * 16: "v"}}}, "spec.labels"),   # 64 bytes
])
def test_a_member_of_the_wrong_shape_is_refused_and_named(overrides, field):
    assert refused(create(**overrides)).field == field


def test_free_form_values_are_bounded_in_depth():
    deep: object = "leaf"
    for _ in range(limits.command_nesting_max):
        deep = [deep]
    commands.check(create(spec={**SPEC, "metadata": {"d": deep[0]}}))   # at the bound
    error = refused(create(spec={**SPEC, "metadata": {"d": deep}}))
    assert error.field.startswith("spec.metadata.d")


def test_a_lone_surrogate_is_refused_by_the_checks_too():
    with pytest.raises(CommandRefused):
        commands.check(create(job_id="job_\ud800"))
    with pytest.raises(CommandRefused):
        commands.check(create(spec={**SPEC, "metadata": {"\udfff": 1}}))


def test_fire_items_must_be_consistent():
    def fire(item: tuple, retries: int = 0) -> dict:
        return commands.fire(shard=1, token=1, upto_ms=9, node="n1", at_ms=9, items=[item],
                             retries=[("run_x", 1)] * retries)
    assert refused(fire(("job_a", 5, 9, [4, 5], False))).field == "items[0]"   # not from due
    assert refused(fire(("job_a", 5, 9, [5, 5], False))).field == "items[0]"   # not ascending
    assert refused(fire(("job_a", 5, 5, [5], False))).field == "items[0]"      # next not after
    assert refused(fire(("job_a", 5, None, [], False))).field == "items[0][3]"
    assert refused(fire(("job_a", 5, None, [5], False), limits.fire_batch_max)).field == ""
    commands.check(fire(("job_a", 5, None, [5], False), limits.fire_batch_max - 1))


def test_run_updates_are_checked_item_by_item():
    start = {"run_id": "run_x", "event": "start", "holder": "n1", "attempt": 1, "at_ms": 1,
             "lease_ms": 2}
    commands.check_run_update(start)
    for bad, field in [({"run_id": ""}, "update.run_id"), ({"attempt": 0}, "update.attempt"),
                       ({"attempt": 2 ** 64}, "update.attempt"), ({"event": "stop"},
                                                                   "update.event"),
                       ({"lease_ms": None}, "update.lease_ms")]:
        with pytest.raises(CommandRefused) as info:
            commands.check_run_update({**start, **bad})
        assert info.value.field == field
    finish = {**start, "event": "finish", "ok": False}
    del finish["lease_ms"]
    with pytest.raises(CommandRefused):   # a retryable failure needs its drawn delay
        commands.check_run_update(finish)
    commands.check_run_update({**finish, "retryable": False})
    batch = commands.run_updates(updates=[start] * (limits.run_update_batch_max + 1))
    assert refused(batch).field == "updates"


def test_a_report_built_by_a_node_is_checked_as_its_map_is():
    """A report built as a Struct (the dispatcher's, the workers') is judged
    from its bytes, as a replica decodes it: the same refusals as its map,
    and what the log cannot carry refused rather than sent."""
    done = commands.run_finish(run_id="run_x", holder="n1", attempt=1, at_ms=1, ok=True,
                               http_status=200, output_node="n1", called_ms=1)
    assert commands.run_update(done) == done
    for bad, field in [({"run_id": ""}, "update.run_id"), ({"attempt": 0}, "update.attempt"),
                       ({"http_status": 1000}, "update.http_status")]:
        for update in (msgspec.structs.replace(done, **bad),
                       {**msgspec.to_builtins(done), **bad}):
            with pytest.raises(CommandRefused) as info:
                commands.run_update(update)
            assert info.value.field == field
    with pytest.raises(CommandRefused) as info:
        commands.run_update(msgspec.structs.replace(done, ok=False, retryable=False,
                                                    error="bad \udc80 text"))
    assert info.value.field == "update"


def test_a_member_no_shape_declares_is_kept_as_sent():
    spec = {**SPEC, "later": {"added": [1, "two"]}, "schedule": {**SPEC["schedule"], "x": None}}
    assert commands.decode(commands.encode(create(spec=spec))).spec == spec


def _one_of_each_tag() -> list:
    c = commands
    start = c.run_start(run_id="r", holder="n1", attempt=1, at_ms=1, lease_ms=2)
    failed = c.run_finish(run_id="r", holder="n1", attempt=1, at_ms=1, ok=False,
                          retry_delay_ms=3)
    done = c.run_finish(run_id="r", holder="n1", attempt=1, at_ms=1, ok=True)
    item = c.create_job_item(job_id="j", spec=SPEC, idempotency_key=None, shard=1, next_ms=None)
    return [
        create(),
        create(idempotency_key=None, next_ms=None, quota={"jobs_max": 5, "creates_per_s": 2},
               actor="tok"),
        c.create_jobs(tenant="t", at_ms=1, items=[item]),
        c.create_jobs(tenant="t", at_ms=1, items=[item], compact=True),
        c.create_jobs(tenant="t", at_ms=1, items=[item], stored=True),
        c.fire(shard=3, token=2, upto_ms=5000, node="n1", at_ms=5000,
               items=[("job_a1", 2000, 6000, [2000, 4000], True)], retries=[("run_x", 4500)]),
        c.fire(shard=3, token=2, upto_ms=5000, node="n1", at_ms=5000, items=[]),
        c.fire_many(node="n1", at_ms=9, parts=[
            {"shard": 1, "token": 2, "upto_ms": 9, "items": [("job_a1", 5, None, [5], False)],
             "retries": []}]),
        c.run_updates(updates=[start, failed, done]),
        c.expire_leases(items=[("r", 1, 4)], at_ms=1),
        c.reassign_runs(items=[("r", "a", "b")], at_ms=1),
        c.take_over_runs(node="n2", shard=3, token=4, run_ids=["r", "s"], at_ms=1),
        c.take_over_runs(node="n2", shard=3, token=4, run_ids=["r"], at_ms=1, judge_uncalled=True),
        c.hand_over_runs(node="n2", holder="n1", shard=3, token=4, run_ids=["r"], at_ms=1),
        c.miss_uncalled(node="n1", shard=3, token=4, uncalled_after_ms=5, run_ids=["r"],
                        at_ms=9),
        c.assign_shards(assignments=[(1, "n1")], at_ms=1),
        c.purge(at_ms=1, history_max_runs=5, history_max_age_ms=0, finished_job_retention_ms=0,
                idempotency_ttl_ms=0, runs=[("r", "j")], jobs=["j"], idem=[("t", "k")]),
        c.put_tenant(tenant="t", quota={"jobs_max": 5}, actor=None, at_ms=1),
        c.delete_tenant(tenant="t", actor=None, at_ms=1),
        c.create_token(token_id="tk", tenant="t", role="admin", name="n", sha256="a" * 64,
                       actor=None, at_ms=1),
        c.revoke_token(token_id="tk", actor=None, at_ms=1),
        c.scoped(c.trigger_job(job_id="j", scheduled_ms=1, node="n1", at_ms=1), tenant="t",
                 actor="a"),
        c.trigger_job(job_id="j", scheduled_ms=1, node="n1", at_ms=1, overlap="allow"),
        c.retry_run(run_id="r", node="n1", at_ms=1),
        c.pause_job(job_id="j", at_ms=1),
        c.resume_job(job_id="j", next_ms=None, at_ms=1),
        c.delete_job(job_id="j", at_ms=1),
        c.update_job(job_id="j", spec=SPEC, expected_version=1, next_ms=None, at_ms=1),
        c.cancel_run(run_id="r", reason="x", at_ms=1),
        c.alert_done(run_id="r", outcome="sent", error=None, at_ms=1),
        c.publish(topic="t", key=None, message={"a": 1}, execution_id="e", job_id="j", at_ms=1),
        c.commit_offset(topic="t", group="g", offset=1, at_ms=1),
        c.register_node(node="n1", http="h", raft="r", at_ms=1),
        c.renew(node="n1", at_ms=1),
        c.renew(node="n1", at_ms=1, record=True),
        c.check_digest(node="n1", at_ms=1),
        c.create_backfill(backfill_id="bf", job_id="j", tenant="t", expected_version=1,
                          start_ms=1, end_ms=2, overlap="job", max_concurrent=1, total=1,
                          at_ms=1),
        c.backfill_step(node="n1", at_ms=1,
                        items=[{"backfill_id": "bf", "occurrences": [1], "exhausted": False}]),
        c.cancel_backfill(backfill_id="bf", reason=None, at_ms=1),
    ]


def test_every_tag_keeps_its_log_format():
    """An entry of every tag is the versioned map the log has always carried:
    the map decodes to the same command, and the command encodes to that map."""
    examples = _one_of_each_tag()
    assert {commands.tag_of(command) for command in examples} == set(commands.TAGS)
    for command in examples:
        as_map = msgspec.to_builtins(command)
        assert as_map["v"] == commands.VERSION
        assert codec.unpack(commands.encode(command)) == as_map
        decoded = commands.decode(codec.pack(as_map))
        if isinstance(command, commands.CreateJobsStored):
            # Decoding reads each spec from the form it came in, keeping that form.
            assert [dict(i.spec) for i in decoded.items] == \
                [compact.expand_spec(copy.deepcopy(SPEC))]
            assert [codec.pack(i.spec.stored) for i in decoded.items] == \
                [codec.pack(i.spec) for i in command.items]
            continue
        assert decoded == command


def _at_stack_depth(frames: int, call):
    return call() if frames == 0 else _at_stack_depth(frames - 1, call)


def test_a_deeply_nested_member_is_judged_alike_at_any_stack_depth():
    """A member no shape declares, nested 800 deep, is skipped by the decoder on
    the caller's stack: a replica deeper in its own stack (or replaying its
    journal) must still judge the entry as every other replica does."""
    deep = b"\x91" * 800 + b"\xc0"
    data = b"\x85" + b"".join(codec.pack(member) for member in (
        "v", 1, "t", "renew", "node", "n1", "at_ms", 1)) + codec.pack("later") + deep
    expected = commands.renew(node="n1", at_ms=1)
    assert commands.decode(data) == expected
    assert _at_stack_depth(400, lambda: commands.decode(data)) == expected
    too_deep = data.replace(deep, b"\x91" * 5000 + b"\xc0")
    for frames in (0, 400):
        with pytest.raises(CommandRefused):
            _at_stack_depth(frames, lambda: commands.decode(too_deep))
