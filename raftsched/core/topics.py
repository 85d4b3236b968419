"""Built-in replicated topics, in apply: what `publish` targets append to.

A topic is an append-only sequence of messages with offsets 1, 2, 3, ...
Each message records the execution id that published it; a second publish
of the same execution (a retried attempt whose first answer was lost)
returns the first offset and appends nothing, so a publish target is
effectively-once. Consumer groups commit the offset they have processed.

Retention is bounded by count (`topic_messages_max`), encoded bytes
(`topic_messages_bytes_max`, the messages as stored) and age
(`topic_retention_s`, judged against the proposer's `at_ms`); each publish
trims at most `topic_trim_per_publish_max` old messages, so apply stays
bounded however far behind the trimming is.

A tenant holds at most `topics_per_tenant_max` topics and the cluster at
most `topics_max` (both counted in the counters table; a topic's tenant is
the scope of its name, `tenant/name`), so a tenant that makes many topics
reaches its own bound long before the cluster's. Each topic holds at most
`groups_per_topic_max` consumer groups (counted in its meta record). A
publish to a new topic, or a commit of a new group, past its bound is refused
with the limit named. A commit of offset 0 to a
topic that has no messages yet stores nothing: every group starts there.
"""

from __future__ import annotations

from raftsched import limits
from raftsched.core import codec, commands, keys
from raftsched.core.tx import (COUNTERS, GROUPS, TOPIC_IDEM, TOPIC_META, TOPICS, TopicAppended,
                               Tx)

_TOPICS_COUNTER = b"topics"


def meta(tx: Tx, topic: str) -> dict:
    """first and next offset, bytes kept, groups committed (the last two are
    missing from records written before they were counted: read as 0)."""
    return tx.get(TOPIC_META, topic.encode()) or {"v": 1, "first": 1, "next": 1, "bytes": 0,
                                                  "groups": 0}


def topic_count(tx: Tx, tenant: str | None = None) -> int:
    """Topics of the cluster, or of `tenant`."""
    counter = tx.get(COUNTERS, _TOPICS_COUNTER if tenant is None else _tenant_counter(tenant))
    return counter["count"] if counter else 0


def _tenant_counter(tenant: str) -> bytes:
    return _TOPICS_COUNTER + b"\x00" + tenant.encode()


def tenant_of(topic: str) -> str:
    """The tenant a topic belongs to: the scope of its name (keys.scoped)."""
    tenant, scoped, _ = topic.partition("/")
    return tenant if scoped else ""


def _new_topic_refusal(tx: Tx, topic: str) -> dict | None:
    """Count a new topic, or the refusal past a bound on topics."""
    tenant = tenant_of(topic)
    owned = topic_count(tx, tenant)
    if owned >= limits.topics_per_tenant_max:
        return _limit("topics_per_tenant_max",
                      f"topic {topic!r} would be new, and tenant {tenant} already has {owned} "
                      f"topics (topics_per_tenant_max); publish to an existing topic")
    count = topic_count(tx)
    if count >= limits.topics_max:
        return _limit("topics_max", f"topic {topic!r} would be new, and the cluster already "
                                    f"has {count} topics (topics_max); publish to an "
                                    f"existing topic")
    tx.put(COUNTERS, _TOPICS_COUNTER, {"v": 1, "count": count + 1})
    tx.put(COUNTERS, _tenant_counter(tenant), {"v": 1, "count": owned + 1})
    return None


def _limit(limit: str, detail: str) -> dict:
    return {"ok": False, "error": "limit", "limit": limit, "detail": detail}


def handle_publish(tx: Tx, cmd: commands.Command) -> dict:
    topic = cmd.topic
    idem = keys.topic_idem_key(topic, cmd.execution_id)
    existing = tx.get(TOPIC_IDEM, idem)
    if existing is not None:
        return {"ok": True, "offset": existing, "duplicate": True}
    if tx.get(TOPIC_META, topic.encode()) is None:
        refusal = _new_topic_refusal(tx, topic)
        if refusal is not None:
            return refusal
    state = meta(tx, topic)
    offset = state["next"]
    message = {"v": 1, "offset": offset, "key": cmd.key, "message": cmd.message,
               "execution_id": cmd.execution_id, "job_id": cmd.job_id,
               "published_ms": cmd.at_ms}
    tx.put(TOPICS, keys.topic_key(topic, offset), message)
    tx.put(TOPIC_IDEM, idem, offset)
    state["next"] = offset + 1
    state["bytes"] = state.get("bytes", 0) + len(codec.pack(message))
    _trim(tx, topic, state, cmd.at_ms)
    tx.put(TOPIC_META, topic.encode(), state)
    tx.effects.append(TopicAppended(topic=topic, offset=offset))
    return {"ok": True, "offset": offset, "duplicate": False}


def _trim(tx: Tx, topic: str, state: dict, at_ms: int) -> None:
    oldest_kept_ms = at_ms - int(limits.topic_retention_s * 1000)
    for _ in range(limits.topic_trim_per_publish_max):
        if state["first"] >= state["next"]:
            return
        key = keys.topic_key(topic, state["first"])
        message = tx.get(TOPICS, key)
        over_count = state["next"] - state["first"] > limits.topic_messages_max
        over_bytes = state.get("bytes", 0) > limits.topic_messages_bytes_max
        if message is not None and not over_count and not over_bytes \
                and message["published_ms"] >= oldest_kept_ms:
            return
        if message is not None:
            tx.delete(TOPICS, key)
            tx.delete(TOPIC_IDEM, keys.topic_idem_key(topic, message["execution_id"]))
            state["bytes"] = max(0, state.get("bytes", 0) - len(codec.pack(message)))
        state["first"] += 1


def handle_commit_offset(tx: Tx, cmd: commands.Command) -> dict:
    topic, offset = cmd.topic, cmd.offset
    known = tx.get(TOPIC_META, topic.encode()) is not None
    state = meta(tx, topic)
    if not 0 <= offset < state["next"]:
        return {"ok": False, "error": "invalid",
                "detail": f"offset {offset} is past the topic's last offset {state['next'] - 1}"}
    if not known:
        return {"ok": True, "offset": offset}   # offset 0 of an empty topic: nothing to keep
    group = keys.group_key(topic, cmd.group)
    if tx.get(GROUPS, group) is None:
        groups = state.get("groups", 0)
        if groups >= limits.groups_per_topic_max:
            return _limit("groups_per_topic_max",
                          f"group {cmd.group!r} would be new, and topic {topic!r} already has "
                          f"{groups} groups (groups_per_topic_max)")
        state["groups"] = groups + 1
        tx.put(TOPIC_META, topic.encode(), state)
    tx.put(GROUPS, group, {"v": 1, "offset": offset, "committed_ms": cmd.at_ms})
    return {"ok": True, "offset": offset}
