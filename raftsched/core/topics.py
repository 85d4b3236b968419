"""Built-in replicated topics, in apply: what `publish` targets append to.

A topic is an append-only sequence of messages with offsets 1, 2, 3, ...
Each message records the execution id that published it; a second publish
of the same execution (a retried attempt whose first answer was lost)
returns the first offset and appends nothing, so a publish target is
effectively-once. Consumer groups commit the offset they have processed.

Retention is bounded by count (`topic_messages_max`) and age
(`topic_retention_s`, judged against the proposer's `at_ms`); each publish
trims at most `topic_trim_per_publish_max` old messages, so apply stays
bounded however far behind the trimming is.
"""

from __future__ import annotations

from raftsched import limits
from raftsched.core import keys
from raftsched.core.tx import GROUPS, TOPIC_IDEM, TOPIC_META, TOPICS, TopicAppended, Tx


def meta(tx: Tx, topic: str) -> dict:
    return tx.get(TOPIC_META, topic.encode()) or {"v": 1, "first": 1, "next": 1}


def handle_publish(tx: Tx, cmd: dict) -> dict:
    topic = cmd["topic"]
    idem = keys.topic_idem_key(topic, cmd["execution_id"])
    existing = tx.get(TOPIC_IDEM, idem)
    if existing is not None:
        return {"ok": True, "offset": existing, "duplicate": True}
    state = meta(tx, topic)
    offset = state["next"]
    tx.put(TOPICS, keys.topic_key(topic, offset), {
        "v": 1, "offset": offset, "key": cmd["key"], "message": cmd["message"],
        "execution_id": cmd["execution_id"], "job_id": cmd["job_id"],
        "published_ms": cmd["at_ms"]})
    tx.put(TOPIC_IDEM, idem, offset)
    state["next"] = offset + 1
    _trim(tx, topic, state, cmd["at_ms"])
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
        if message is not None and not over_count and message["published_ms"] >= oldest_kept_ms:
            return
        if message is not None:
            tx.delete(TOPICS, key)
            tx.delete(TOPIC_IDEM, keys.topic_idem_key(topic, message["execution_id"]))
        state["first"] += 1


def handle_commit_offset(tx: Tx, cmd: dict) -> dict:
    state = meta(tx, cmd["topic"])
    offset = cmd["offset"]
    if not 0 <= offset < state["next"]:
        return {"ok": False, "error": "invalid",
                "detail": f"offset {offset} is past the topic's last offset {state['next'] - 1}"}
    tx.put(GROUPS, keys.group_key(cmd["topic"], cmd["group"]),
           {"v": 1, "offset": offset, "committed_ms": cmd["at_ms"]})
    return {"ok": True, "offset": offset}
