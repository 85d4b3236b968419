"""The pysyncobj adapter: the one module that imports pysyncobj.

One replicated method, `apply_command(bytes)`: the bytes are a versioned
msgpack command (raftsched.core.commands). pysyncobj wraps each call in its own
pickled envelope on the wire and in its journal; our payload inside is plain
msgpack, so the log's meaning never depends on Python class layouts.

Threads: pysyncobj runs its own tick thread and calls `apply_command` there.
This module never touches asyncio objects from that thread: results are handed
to the event loop with `loop.call_soon_threadsafe`.

Timing settings (measured on 3 processes on loopback): pysyncobj's defaults
batch appends every 100 ms, a 100 ms floor under every commit (p50 101 ms).
`appendEntriesPeriod=0.01, autoTickPeriod=0.005` gives p50 about 11 ms at about
24K commits/s; non-batched appends give 0.5 ms but only 5K commits/s. We fire
many runs per entry, so throughput per entry matters less than the 100 ms floor:
the 10 ms batching is the choice. `leaderFallbackTimeout` is cut from 30 s to
2 s so that a leader cut off from its peers stops accepting writes quickly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from raftsched import limits
from raftsched.core import codec
from raftsched.errors import Unavailable

log = logging.getLogger("raftsched.raft")

append_entries_period_s = 0.01
auto_tick_period_s = 0.005
election_timeout_min_s = 0.4
election_timeout_max_s = 1.4
leader_fallback_timeout_s = 2.0
# Raft log entries between snapshots (default of --raft-snapshot-entries); a
# snapshot copies the whole state, so this trades journal size and restart
# replay time against snapshot frequency.
log_compaction_entries_default = 20_000
log_compaction_period_s = 600

_FAIL_TEXT = {
    FAIL_REASON.QUEUE_FULL: ("overloaded", "the Raft command queue is full"),
    FAIL_REASON.MISSING_LEADER: ("no_leader", "there is no Raft leader"),
    FAIL_REASON.DISCARDED: ("discarded", "the command was discarded by a leader change"),
    FAIL_REASON.NOT_LEADER: ("not_leader", "the node forwarded to is no longer leader"),
    FAIL_REASON.LEADER_CHANGED: ("leader_changed", "the leader changed"),
    FAIL_REASON.REQUEST_DENIED: ("denied", "the leader refused the command"),
    getattr(FAIL_REASON, "UNKNOWN_OUTCOME", 7): ("unknown_outcome",
                                                 "the outcome is unknown (connection lost)"),
}


@dataclass(frozen=True, kw_only=True)
class RaftStatus:
    role: str                 # leader | follower | candidate
    leader: str | None        # Raft address of the leader, as this node believes
    term: int
    commit_index: int
    applied_index: int        # pysyncobj's view; the store's applied_index may be ahead on replay
    leader_commit_index: int | None
    has_quorum: bool


class _StateMachine(SyncObj):
    def __init__(self, self_addr: str, peers: list[str], conf: SyncObjConf,
                 on_apply: Callable[[bytes, int], Any]) -> None:
        self._raftsched_on_apply = on_apply
        super().__init__(self_addr, peers, conf=conf)

    # pysyncobj's follower answers a failed append-entries with "send from N":
    # N is its own last index + 1 when it lacks the leader's previous entry,
    # but the mismatching index when it has a different entry there. A leader
    # streams its whole backlog in one tick, so a follower holding a divergent
    # tail (a former leader back from a partition, with entries it could not
    # commit) answers both kinds, and each answer undoes the other's step
    # back: the follower stalls for tens of seconds or for good, while the
    # leader resends its backlog every tick. Answer every refusal with the
    # follower's commit index + 1 instead, a point where its log is known to
    # agree with any leader's: all refusals of a burst then name one index,
    # and the next attempt matches. (pysyncobj looks this method up on the
    # instance under its mangled name, so defining it here replaces it.)
    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False,
                                  nextNodeIdx: int | None = None, success: bool = False) -> None:
        if reset and not success:
            agreed = self._SyncObj__raftCommitIndex + 1
            if nextNodeIdx is None:
                nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
            nextNodeIdx = min(nextNodeIdx, agreed)
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=nextNodeIdx,
                                          success=success)

    @replicated
    def apply_command(self, data: bytes) -> Any:
        # pysyncobj increments raftLastApplied after this returns, so the entry
        # being applied has index raftLastApplied + 1.
        return self._raftsched_on_apply(data, self.raftLastApplied + 1)


class Replicator:
    """Start the Raft member; propose commands; report status."""

    def __init__(self, *, self_addr: str, peers: list[str], data_dir: str,
                 secret: str | None, loop: asyncio.AbstractEventLoop,
                 on_apply: Callable[[bytes, int], Any],
                 snapshot_items: Callable[[], tuple[int, list]],
                 snapshot_install: Callable[[int, list], None],
                 snapshot_entries: int = log_compaction_entries_default) -> None:
        self._loop = loop
        self._snapshot_items = snapshot_items
        self._snapshot_install = snapshot_install
        os.makedirs(data_dir, exist_ok=True)
        # A peer may be given as ADDR@VIA: it identifies itself as ADDR, and this
        # node reaches it through VIA (a relay or port forward). pysyncobj knows
        # it by VIA; everything above this adapter speaks of ADDR.
        self._alias: dict[str, str] = {}
        dial = []
        for peer in peers:
            addr, via = parse_peer(peer, self_addr)
            if via != addr:
                self._alias[via] = addr
            dial.append(via)
        conf = SyncObjConf(
            password=secret,
            journalFile=os.path.join(data_dir, "raft.journal"),
            fullDumpFile=os.path.join(data_dir, "raft.snapshot"),
            serializer=self._serialize,
            deserializer=self._deserialize,
            appendEntriesPeriod=append_entries_period_s,
            autoTickPeriod=auto_tick_period_s,
            raftMinTimeout=election_timeout_min_s,
            raftMaxTimeout=election_timeout_max_s,
            leaderFallbackTimeout=leader_fallback_timeout_s,
            commandsQueueSize=limits.raft_commands_queue_max,
            logCompactionMinEntries=snapshot_entries,
            logCompactionMinTime=log_compaction_period_s,
            dynamicMembershipChange=False,
            commandsWaitLeader=True,
            useFork=False,
        )
        self._obj = _StateMachine(self_addr, dial, conf, on_apply)

    # --- snapshots: the LMDB state, not pickled Python objects -----------------------

    def _serialize(self, filename: str, raft_data: tuple) -> None:
        last, prev, _cluster = raft_data
        applied_index, items = self._snapshot_items()
        with open(filename, "wb") as fh:
            fh.write(codec.pack({"v": 1, "last": list(last), "prev": list(prev),
                                 "applied_index": applied_index, "items": items}))
            fh.flush()
            os.fsync(fh.fileno())
        log.info("snapshot written at applied_index %d (%d records)", applied_index, len(items))

    def _deserialize(self, filename: str) -> tuple:
        with open(filename, "rb") as fh:
            data = codec.unpack(fh.read())
        if data.get("v") != 1:
            raise ValueError(f"{filename}: snapshot version {data.get('v')!r} is unknown")
        self._snapshot_install(data["applied_index"], data["items"])
        return tuple(data["last"]), tuple(data["prev"]), []

    # --- proposing -------------------------------------------------------------------

    def propose(self, data: bytes) -> asyncio.Future:
        """Submit a command; the future resolves with apply's result on this node
        (so the command is committed and applied here), or fails Unavailable."""
        future: asyncio.Future = self._loop.create_future()

        def on_result(result: Any, error: int) -> None:  # pysyncobj thread
            self._loop.call_soon_threadsafe(_settle, future, result, error)

        self._obj.apply_command(data, callback=on_result)
        return future

    async def propose_wait(self, data: bytes, timeout_s: float = limits.propose_timeout_s) -> Any:
        try:
            return await asyncio.wait_for(self.propose(data), timeout_s)
        except asyncio.TimeoutError:
            raise Unavailable(f"the command was not committed within {timeout_s:g} s (no quorum "
                              "reachable?); its outcome is unknown: retry with the same "
                              "idempotency_key", reason="timeout") from None

    # --- status ----------------------------------------------------------------------

    def is_leader(self) -> bool:
        return bool(self._obj._isLeader())

    def status(self) -> RaftStatus:
        raw = self._obj.getStatus()
        role = {0: "follower", 1: "candidate", 2: "leader"}.get(raw["state"], str(raw["state"]))
        leader = raw["leader"]
        leader_addr = None if leader is None else str(leader.id)
        leader_addr = self._alias.get(leader_addr, leader_addr)
        return RaftStatus(role=role, leader=leader_addr,
                          term=raw["raft_term"], commit_index=raw["commit_idx"],
                          applied_index=raw["last_applied"],
                          leader_commit_index=raw["leader_commit_idx"],
                          has_quorum=bool(raw["has_quorum"]))

    def peer_liveness(self) -> dict[str, float | None]:
        """On the leader: for each peer's Raft address, the seconds since it last
        answered an append-entries, or None if its connection is down (a killed
        process is seen at once; a frozen one by the growing age). pysyncobj has
        no public call for this; this adapter is the one place that reads its
        internals, so a pysyncobj upgrade is checked here."""
        obj = self._obj
        for _ in range(3):
            try:
                last = dict(getattr(obj, "_SyncObj__lastResponseTime"))
                break
            except RuntimeError:   # resized by the Raft thread while copying
                continue
        else:
            last = {}
        now = time.monotonic()
        out: dict[str, float | None] = {}
        for peer in obj.otherNodes:
            seen = last.get(peer)
            addr = self._alias.get(str(peer.id), str(peer.id))
            connected = obj.isNodeConnected(peer) and seen is not None
            out[addr] = max(0.0, now - seen) if connected else None
        return out

    def destroy(self) -> None:
        self._obj.destroy()


def parse_peer(peer: str, self_addr: str) -> tuple[str, str]:
    """`ADDR` or `ADDR@VIA` -> (ADDR, VIA). pysyncobj opens a link from the node
    whose own address sorts higher, and the receiving side recognises the caller
    by its own address; so VIA works only where this node is the caller, that is
    when this node's address sorts above both ADDR and VIA."""
    addr, _, via = peer.partition("@")
    via = via or addr
    for text in (addr, via):
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"peer {peer!r}: {text!r} is not HOST:PORT")
    if via != addr and not (self_addr > addr and self_addr > via):
        raise ValueError(f"peer {peer!r}: a VIA address is only usable on the node that opens "
                         f"the link, whose own address ({self_addr}) must sort above both "
                         f"{addr} and {via}")
    return addr, via


def _settle(future: asyncio.Future, result: Any, error: int) -> None:
    if future.done():  # the waiter timed out already
        return
    if error == FAIL_REASON.SUCCESS:
        future.set_result(result)
        return
    reason, text = _FAIL_TEXT.get(error, ("error", f"pysyncobj error {error}"))
    future.set_exception(Unavailable(f"not committed: {text}; retry", reason=reason))
