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
the 10 ms batching is the choice. Batching paces only what there is to send:
while followers lack nothing, the leader sends bare heartbeats every
`limits.heartbeat_period_s` (100 ms), and the Raft thread's loop waits up to
`limits.auto_tick_period_s` (50 ms), woken by each proposed command
(`_StateMachine._raftsched_pace`, `_WakePipe`): an idle node's Raft thread
sleeps instead of turning 200 times a second. `leaderFallbackTimeout` is cut
from 30 s to 2 s so that a leader cut off from its peers stops accepting writes
quickly.

Snapshots never stop the Raft thread for long. pysyncobj calls the serializer
on its thread and, as soon as it returns, renames `<snapshot>.tmp` over the
snapshot; then it asks `serializeChecker` each tick, and on SUCCESS drops the
journal entries the snapshot covers. So:

1. `_serialize` (Raft thread) only pins a read transaction of LMDB (the state
   exactly as applied so far), and makes `<snapshot>.tmp` a hard link to the
   current snapshot (an empty file if there is none yet), so pysyncobj's
   rename leaves the good snapshot in place.
2. The first `_check_snapshot` (Raft thread, the next tick, after that rename)
   starts a thread that writes the header and a compacted LMDB copy of the
   pinned read to `<snapshot>.building` and fsyncs it. LMDB writes the copy
   with the GIL released.
3. While the thread runs the checker answers SERIALIZING. When it is done, the
   checker renames the file over the snapshot, another thread fsyncs the
   directory, and only then does the checker answer SUCCESS, so the journal
   is never compacted past a snapshot that is not on disk whole. The rename
   happens on the Raft thread, so it cannot race with pysyncobj installing a
   snapshot received from the leader (which it also does on the Raft thread);
   `_deserialize` first abandons a snapshot still being written.

Installing (`_deserialize`, on the Raft thread, at start and when the leader
sends a snapshot) copies the image into a fresh LMDB environment that replaces
the live one (storage/lmdb_store.py). A long install would let this node's
election deadline pass while it cannot hear the leader, and it would start an
election as soon as it returns; so the deadline is reset after an install.

The journal (_TrackedJournal) is pysyncobj's file, read from its mapping
when pysyncobj asks for an entry rather than held in memory as pysyncobj's
FileJournal holds it, so a node's memory does not grow with the log since its
last snapshot; and the log it holds before it snapshots early grows with the
state (log_bytes_bound), so a large state is not copied for every few seconds
of writes.

Journal durability (docs/operations.md). pysyncobj writes its journal into an
mmap and never flushes it. A thread here fdatasyncs the journal file every
`limits.journal_flush_period_s` (on Linux that writes back the pages dirtied through
the shared mapping, as msync does, but without holding the GIL, which mmap's
flush does). With `--fsync always`, the journal is also flushed on the Raft
thread before an appended entry counts towards commit: a follower flushes
before it acknowledges an append, and the leader, which counts itself, flushes
at the start of each tick, before it computes the commit index. In both modes
the journal's term and vote are fsynced whenever they change.

The transport (docs/operations.md, "The Raft port"). pysyncobj unpickles what
a connection sends, so no node listens unauthenticated: a node with peers
needs the shared secret (the CLI refuses to start without one unless
--insecure), with which pysyncobj encrypts and authenticates every frame; a
node with no peers and no secret opens no Raft port at all (_Transport). Each
frame is a 4-byte length, then that many bytes, and pysyncobj buffers a frame
whole before it decrypts it; so a declared length is checked as soon as its
header arrives (_CappedConnection): over raft_frame_preauth_bytes_max before
the connection's first frame has decrypted, over raft_frame_bytes_max after,
the connection is closed. An incoming connection must also finish its
handshake (first frame decrypted, then the peer's address) within
raft_handshake_timeout_s, and at most raft_preauth_connections_per_source_max
connections from one address (raft_preauth_connections_max in all) may be
in their handshake at once: more are closed as they are accepted
(_Transport).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import pickle
import struct
import threading
import time
import zlib
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from pysyncobj import FAIL_REASON, SERIALIZER_STATE, SyncObj, SyncObjConf, replicated
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.journal import (FIRST_RECORD_OFFSET, FileJournal, MemoryJournal, MetaStorer,
                               ResizableFile, to_bytes)
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import TCPTransport

from raftsched import limits
from raftsched.core import codec
from raftsched.errors import Unavailable
from raftsched.storage.base import fsync_dir

log = logging.getLogger("raftsched.raft")

FSYNC_MODES = ("periodic", "always")
# Snapshot file: magic, image length (u64, written last), header length (u32),
# msgpack header, then the LMDB image. Version 1 was one msgpack map.
SNAPSHOT_MAGIC = b"RSCHSNAP"
SNAPSHOT_VERSION = 2
_SNAPSHOT_PREFIX = struct.Struct(">8sQI")

# Every private pysyncobj name this adapter reads, calls or replaces, as
# (owner, name, kind): "method" is looked up on the class (a replacement
# defined here under a name pysyncobj no longer has would never be called,
# silently), "attribute" is set on the instance by the class's __init__, and
# "module" is a module-level name. pysyncobj is pinned (pyproject.toml);
# tests/test_pysyncobj_names.py checks each one against the installed release,
# and that every mangled name this module uses is listed here.
PYSYNCOBJ_PRIVATE_NAMES: tuple[tuple[Any, str, str], ...] = (
    (SyncObj, "_onTick", "method"),
    (SyncObj, "_isLeader", "method"),
    (SyncObj, "_getLeader", "method"),
    (SyncObj, "_SyncObj__applyLogEntries", "method"),
    (SyncObj, "_SyncObj__sendAppendEntries", "method"),
    (SyncObj, "_SyncObj__sendNextNodeIdx", "method"),
    (SyncObj, "_SyncObj__onMessageReceived", "method"),
    (SyncObj, "_SyncObj__getCurrentLogIndex", "method"),
    (SyncObj, "_SyncObj__getEntries", "method"),
    (SyncObj, "_SyncObj__generateRaftTimeout", "method"),
    (SyncObj, "_applyCommand", "method"),
    (SyncObj, "_checkCommandsToApply", "method"),
    (SyncObj, "_doDestroy", "method"),
    (SyncObj, "_poller", "attribute"),
    (SyncObj, "_SyncObj__newAppendEntriesTime", "attribute"),
    (SyncObj, "_SyncObj__raftNextIndex", "attribute"),
    (SyncObj, "_SyncObj__connectedNodes", "attribute"),
    (SyncObj, "_SyncObj__raftLog", "attribute"),
    (SyncObj, "_SyncObj__raftLastApplied", "attribute"),
    (SyncObj, "_SyncObj__raftCommitIndex", "attribute"),
    (SyncObj, "_SyncObj__raftElectionDeadline", "attribute"),
    (SyncObj, "_SyncObj__raftMatchIndex", "attribute"),
    (SyncObj, "_SyncObj__otherNodes", "attribute"),
    (SyncObj, "_SyncObj__lastResponseTime", "attribute"),
    (SyncObj, "_SyncObj__recvTransmission", "attribute"),
    # _TrackedJournal stands in for FileJournal: its __init__ sets these, and
    # the methods it does not replace read them.
    (FileJournal, "_FileJournal__journalFile", "attribute"),
    (FileJournal, "_FileJournal__journal", "attribute"),
    (FileJournal, "_FileJournal__metaStorer", "attribute"),
    (FileJournal, "_FileJournal__meta", "attribute"),
    (FileJournal, "_FileJournal__metaSaved", "attribute"),
    (FileJournal, "_FileJournal__currentOffset", "attribute"),
    (FileJournal, "_FileJournal__getDefaultHeader", "method"),
    (FileJournal, "_FileJournal__getLastRecordOffset", "method"),
    (FileJournal, "_FileJournal__setLastRecordOffset", "method"),
    (ResizableFile, "_ResizableFile__mm", "attribute"),
    # SyncObj builds its journal with the function its module holds.
    (pysyncobj_syncobj, "createJournal", "module"),
    (TcpConnection, "_TcpConnection__processRead", "method"),
    (TcpConnection, "_TcpConnection__processParseMessage", "method"),
    (TcpConnection, "_TcpConnection__readBuffer", "attribute"),
    (TcpConnection, "_TcpConnection__writeBuffer", "attribute"),
    (TcpConnection, "_TcpConnection__trySendBuffer", "method"),
    (TcpConnection, "send", "method"),
    (TcpConnection, "sendRandKey", "attribute"),
    (TcpConnection, "encryptor", "attribute"),
    (TcpConnection, "_TcpConnection__socket", "attribute"),
    (TCPTransport, "_createServer", "method"),
    (TCPTransport, "_onNewIncomingConnection", "method"),
    (TCPTransport, "_connections", "attribute"),
    (TCPTransport, "_syncObj", "attribute"),
    (TCPTransport, "_ready", "attribute"),
    (TCPTransport, "_bindOverEvent", "attribute"),
    # write_backup writes a no-op entry as this type's byte.
    (pysyncobj_syncobj, "_COMMAND_TYPE", "module"),
)

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


# A journal record, as pysyncobj's FileJournal writes it: the length of what
# follows up to the trailing copy of that length (16 + the command's bytes),
# the entry's index and term, the command, the length again.
_RECORD_HEAD = struct.Struct("<IQQ")
_RECORD_TAIL = struct.Struct("<I")


class _TrackedJournal(FileJournal):
    """pysyncobj's journal file, in its own format, with the entries read from
    the file when they are asked for instead of held in memory.

    FileJournal keeps every entry since the last snapshot in a list as well
    as in its file (an mmap). On a large state a snapshot takes minutes, and
    under batch creates the entries that arrive meanwhile held hundreds of MB
    of a node's private memory (docs/benchmarks.md). This journal keeps only
    each entry's offset in the file (8 bytes), and its first and last entries,
    which pysyncobj asks for many times a tick; everything else is read from
    the mapping, whose pages are the page cache's. pysyncobj reads the log
    through __getitem__ and __len__ and, for ranges, through its
    __getEntries, which _StateMachine replaces to read only what it returns.

    It also notes each change, so that a flush before commit is skipped when
    nothing changed since the last one, and counts the bytes since the last
    snapshot, which decide when the next one is taken (_StateMachine).
    Built in place of pysyncobj's (see _create_journal)."""

    _raftsched_dirty = True

    def __init__(self, path: str) -> None:   # FileJournal's reads every entry into a list
        self._FileJournal__journalFile = ResizableFile(
            path, defaultContent=self._FileJournal__getDefaultHeader())
        self._FileJournal__journal = None   # FileJournal's list: not kept
        self._FileJournal__metaStorer = _SyncedMetaStorer(path + ".meta")
        self._FileJournal__meta = self._FileJournal__metaStorer.getMeta()
        self._FileJournal__metaSaved = True
        self._offsets = array("Q")
        # The first and the last entry, which pysyncobj asks for many times a tick.
        self._first: tuple | None = None
        self._last: tuple | None = None
        file = self._FileJournal__journalFile
        at, end = FIRST_RECORD_OFFSET, self._FileJournal__getLastRecordOffset()
        while at < end:
            self._offsets.append(at)
            at += _RECORD_TAIL.unpack(file.read(at, 4))[0] + 8
        self._FileJournal__currentOffset = at

    def _end(self) -> int:
        return self._FileJournal__currentOffset

    def _set_end(self, offset: int) -> None:
        self._FileJournal__currentOffset = offset
        self._FileJournal__setLastRecordOffset(offset)
        self._raftsched_dirty = True

    def _read(self, at: int) -> tuple:
        file = self._FileJournal__journalFile
        size, idx, term = _RECORD_HEAD.unpack(file.read(at, _RECORD_HEAD.size))
        return file.read(at + _RECORD_HEAD.size, size - 16), idx, term

    def add(self, command: bytes, idx: int, term: int) -> None:
        command = to_bytes(command)
        at = self._end()
        record = (_RECORD_HEAD.pack(len(command) + 16, idx, term) + command
                  + _RECORD_TAIL.pack(len(command) + 16))
        self._FileJournal__journalFile.write(at, record)
        self._offsets.append(at)
        self._last = (command, idx, term)
        self._set_end(at + len(record))

    def clear(self) -> None:
        self._offsets = array("Q")
        self._first = self._last = None
        self._set_end(FIRST_RECORD_OFFSET)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.entries(*i.indices(len(self._offsets))[:2])
        count = len(self._offsets)
        if i == -1 or i == count - 1:
            if self._last is None:
                self._last = self._read(self._offsets[-1])
            return self._last
        if i == 0 or i == -count:
            if self._first is None:
                self._first = self._read(self._offsets[0])
            return self._first
        return self._read(self._offsets[i])

    def entries(self, start: int, stop: int, size_max: int | None = None) -> list[tuple]:
        """The entries at positions start..stop-1; with size_max, only up to
        and including the first whose commands reach size_max bytes in all."""
        found, size, offsets = [], 0, self._offsets
        for i in range(start, stop):   # (a slice would copy the offsets to the end)
            entry = self._read(offsets[i])
            found.append(entry)
            size += len(entry[0])
            if size_max is not None and size >= size_max:
                break
        return found

    def __len__(self) -> int:
        return len(self._offsets)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """A truncation: the entries from position entryFrom on go."""
        if entryFrom < len(self._offsets):
            end = self._offsets[max(entryFrom, 0)]
            del self._offsets[max(entryFrom, 0):]
            self._first = self._last = None
            self._set_end(end)

    def deleteEntriesTo(self, entryTo: int) -> None:
        """A snapshot's compaction: the entries before position entryTo go, and
        the rest move to the start of the file in one memmove (FileJournal
        wrote each of them again). Until the move is done the file's header
        says it is empty, so a crash meanwhile leaves a journal that starts
        from the snapshot, as FileJournal's rewrite would. Then the memory
        that pysyncobj's buffers freed is handed back (release_freed_memory)."""
        if entryTo >= len(self._offsets):
            self.clear()
        elif entryTo > 0:
            start, end = self._offsets[entryTo], self._end()
            self._set_end(FIRST_RECORD_OFFSET)
            self._FileJournal__journalFile._ResizableFile__mm.move(
                FIRST_RECORD_OFFSET, start, end - start)
            shift = start - FIRST_RECORD_OFFSET
            self._offsets = array("Q", (at - shift for at in self._offsets[entryTo:]))
            self._first = None
            self._set_end(end - shift)
        release_freed_memory()

    def held_bytes(self) -> int:
        """Bytes of the journal's records: the log since the last snapshot."""
        return self._end() - FIRST_RECORD_OFFSET

    def onOneSecondTimer(self) -> None:
        """pysyncobj calls this in its tick just before it checks the election
        deadline, and it writes the commit index to a file: on a busy disk that
        can block long enough for the deadline to pass with the leader's
        heartbeats unread. _StateMachine._onTick calls store_meta instead."""

    def store_meta(self) -> None:
        FileJournal.onOneSecondTimer(self)


def log_bytes_bound(snapshot_bytes: int) -> int:
    """How many bytes of log a node holds since its last snapshot before it
    takes the next: a share of the state's size (the last snapshot's), so
    that a large state is not copied whole for every few seconds of writes,
    within raft_log_bytes_min..raft_log_bytes_max (docs/operations.md)."""
    return min(limits.raft_log_bytes_max,
               max(limits.raft_log_bytes_min, snapshot_bytes // limits.raft_log_snapshot_share))


def _create_journal(path: str | None) -> Any:
    """What pysyncobj's SyncObj builds its journal with (it looks the function
    up in its module when it starts): this module's file journal."""
    return MemoryJournal() if path is None else _TrackedJournal(path)


pysyncobj_syncobj.createJournal = _create_journal


class _SyncedMetaStorer(MetaStorer):
    """pysyncobj's file of the current term, the vote and the commit index.
    Raft needs the term and the vote on disk before a message that reflects
    them leaves the node, and pysyncobj only writes the file: so a write that
    changes them is fsynced (rare: elections). The commit index, which it also
    writes once a second, needs no fsync (it is relearned from the leader)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._durable_vote = self._vote(self.getMeta())

    @staticmethod
    def _vote(meta: dict) -> tuple:
        return meta.get("currentTerm"), meta.get("votedForNodeId")

    def storeMeta(self, meta: dict) -> None:
        path = self.getPath()
        durable = self._vote(meta) != self._durable_vote
        with open(path + ".tmp", "wb") as fh:
            fh.write(pysyncobj_pickle.dumps(meta))
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(path + ".tmp", path)
        if durable:
            fsync_dir(os.path.dirname(path) or ".")
            self._durable_vote = self._vote(meta)


# pysyncobj's frame header: the length of the frame that follows, as a signed
# 32-bit integer in the machine's byte order (its tcp_connection.py packs 'i').
_FRAME_HEADER = struct.Struct("i")


class _FrameRefusals:
    """Counts the connections closed for an oversized frame (Raft thread only)."""

    def __init__(self) -> None:
        self.total = 0
        self._unlogged = 0
        self._logged_at = float("-inf")

    def note(self, peer: str, declared: int, authenticated: bool) -> None:
        self.total += 1
        now = time.monotonic()
        if now - self._logged_at < limits.frame_refusal_log_period_s:
            self._unlogged += 1
            return
        name = "raft_frame_bytes_max" if authenticated else "raft_frame_preauth_bytes_max"
        log.warning("Raft port: closed the connection with %s: it declared a frame of %d bytes, "
                    "over %s (%d)%s", peer, declared, name, getattr(limits, name),
                    f"; {self._unlogged} more closed since the last such warning"
                    if self._unlogged else "")
        self._logged_at = now
        self._unlogged = 0


_frame_refusals = _FrameRefusals()


class _HandshakeRefusals:
    """Counts the incoming connections closed before their handshake finished
    (Raft thread only): too slow, or over a cap of connections in handshake."""

    def __init__(self) -> None:
        self.total = 0
        self._unlogged = 0
        self._logged_at = float("-inf")

    def note(self, source: str, why: str) -> None:
        self.total += 1
        now = time.monotonic()
        if now - self._logged_at < limits.frame_refusal_log_period_s:
            self._unlogged += 1
            return
        log.warning("Raft port: closed a connection from %s before it authenticated: %s%s",
                    source, why, f"; {self._unlogged} more closed since the last such warning"
                    if self._unlogged else "")
        self._logged_at = now
        self._unlogged = 0


_handshake_refusals = _HandshakeRefusals()


def _source_of(conn: TcpConnection) -> str:
    """The address (no port) an incoming connection comes from."""
    try:
        return str(conn._TcpConnection__socket.getpeername()[0])
    except (OSError, AttributeError, TypeError, IndexError):
        return "an unknown address"


class _CappedConnection(TcpConnection):
    """pysyncobj's TCP connection, closed as soon as a frame header declares
    more than the cap: raft_frame_preauth_bytes_max until a first frame has
    been decrypted (that is, authenticated with the shared secret),
    raft_frame_bytes_max after. pysyncobj itself would buffer whatever length
    a header declares (up to 2 GiB), unauthenticated.

    Installed by changing the class of the connections pysyncobj creates
    (_Transport). The methods replaced are pysyncobj 0.3.17's private reading
    methods, looked up under their mangled names: `__processRead` (one recv)
    and `__processParseMessage` (one frame out of the buffer). A pysyncobj
    upgrade is checked here (tests/test_raft_transport.py)."""

    # Whether the connection counts as authenticated from the start, again
    # after each disconnect: a link this node dials without a secret has no
    # handshake to wait for.
    _raftsched_trusted = False
    _raftsched_authenticated = False

    def _TcpConnection__processRead(self) -> bool:
        more = TcpConnection._TcpConnection__processRead(self)
        if not more or not self._raftsched_length_ok():
            return False
        # pysyncobj reads until the socket is empty, then parses. Reading stops
        # once a whole frame at the cap fits in the buffer, so the buffer stays
        # within one frame and one recv: the parse that follows takes the whole
        # frames out, and the rest waits in the socket (pysyncobj's pollers are
        # level-triggered, so it is read on the next turn).
        return len(self._TcpConnection__readBuffer) < _FRAME_HEADER.size + self._raftsched_cap()

    def _TcpConnection__processParseMessage(self) -> Any:
        # Each header is checked when it reaches the front of the buffer, which
        # covers the frames that follow the first one in a single read.
        if not self._raftsched_length_ok():
            return None
        message = TcpConnection._TcpConnection__processParseMessage(self)
        if message is not None:
            # With a secret, the frame decrypted: the sender has the secret.
            self._raftsched_authenticated = True
        return message

    def send(self, message: Any) -> None:
        """pysyncobj's send (pickled, zlib, encrypted with a secret, after a
        4-byte length), with the body framed by zlib_frame."""
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = zlib_frame(pysyncobj_pickle.dumps(message))
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(pysyncobj_monotonic()))
        self._TcpConnection__writeBuffer += _FRAME_HEADER.pack(len(data)) + data
        self._TcpConnection__trySendBuffer()

    def disconnect(self) -> None:
        # pysyncobj reuses the object when it dials the peer again: the new
        # link authenticates afresh.
        self._raftsched_authenticated = self._raftsched_trusted
        TcpConnection.disconnect(self)

    def _raftsched_cap(self) -> int:
        if self._raftsched_authenticated:
            return limits.raft_frame_bytes_max
        return limits.raft_frame_preauth_bytes_max

    def _raftsched_length_ok(self) -> bool:
        """Whether the frame at the front of the buffer may be buffered; if
        not, the connection is closed."""
        buffered = self._TcpConnection__readBuffer
        if len(buffered) < _FRAME_HEADER.size:
            return True
        (declared,) = _FRAME_HEADER.unpack_from(buffered)
        if 0 <= declared <= self._raftsched_cap():
            return True
        try:
            peer = "%s:%s" % self._TcpConnection__socket.getpeername()[:2]
        except (OSError, AttributeError, TypeError):
            peer = "a peer"
        _frame_refusals.note(peer, declared, self._raftsched_authenticated)
        self.disconnect()
        return False


# A zlib stream (RFC 1950) holding its data in one stored, uncompressed
# deflate block (RFC 1951, 3.2.4): header 0x78 0x01 (32 KiB window, fastest),
# the final block's header byte with type "stored", the length and its
# complement (little-endian), the data, its Adler-32 (big-endian).
_STORED_HEAD = struct.Struct("<2sBHH")
_ADLER = struct.Struct(">I")
_STORED_MAX = 0xFFFF


def zlib_frame(payload: bytes) -> bytes:
    """What pysyncobj reads as a frame's body (`zlib.decompress`): its
    compression at level 3 as pysyncobj writes, or, for a payload of at most
    raft_frame_stored_bytes_max, the payload stored in a zlib stream as it
    is. Each zlib.compress sets up a whole deflate state (about 65 us here),
    which a heartbeat or an acknowledgement of a hundred bytes does not repay;
    a stored stream is a header, the bytes and a checksum (about 1 us), and
    any zlib reads it, so nodes of either kind talk to each other."""
    n = len(payload)
    if n > limits.raft_frame_stored_bytes_max or n > _STORED_MAX:
        return zlib.compress(payload, 3)
    return (_STORED_HEAD.pack(b"\x78\x01", 1, n, n ^ 0xFFFF) + payload
            + _ADLER.pack(zlib.adler32(payload)))


def _cap_frames(conn: TcpConnection, *, trusted: bool) -> None:
    conn.__class__ = _CappedConnection
    assert isinstance(conn, _CappedConnection)
    conn._raftsched_trusted = trusted
    conn._raftsched_authenticated = trusted


class _Transport(TCPTransport):
    """pysyncobj's TCP transport, with every connection's frames capped
    (_CappedConnection), and with no listening socket on a node that has no
    peers and no secret (nothing would ever need to connect to it, and an
    open port without a secret would run pickle for anyone).

    pysyncobj builds it as `transportClass(syncObj, selfNode, otherNodes)`;
    the replaced methods are TCPTransport's (pysyncobj 0.3.17)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        self._raftsched_listen = getattr(syncObj, "_raftsched_listen", True)
        # The peers (by node id) a link to was up at some moment since this
        # process started: Replicator.peer_liveness. Only ever grows.
        self._raftsched_connected_once: set[str] = set()
        syncObj._raftsched_connected_once = self._raftsched_connected_once
        super().__init__(syncObj, selfNode, otherNodes)
        if not self._raftsched_listen:
            self._ready = True   # pysyncobj waits for a bind otherwise
            self._bindOverEvent.set()

    def _createServer(self) -> None:
        if self._raftsched_listen:
            super()._createServer()

    def setOnNodeConnectedCallback(self, callback: Callable[[Any], None] | None) -> None:
        """pysyncobj's callback, and a note of each peer a link came up to."""
        if callback is None:
            super().setOnNodeConnectedCallback(None)
            return
        once = self._raftsched_connected_once

        def connected(node: Any) -> None:
            once.add(str(node.id))
            callback(node)
        super().setOnNodeConnectedCallback(connected)

    def _onNewIncomingConnection(self, conn: TcpConnection) -> None:
        _cap_frames(conn, trusted=False)   # before any byte of it is read
        source = _source_of(conn)
        refusal = self._raftsched_admission(source)
        if refusal is not None:
            _handshake_refusals.note(source, refusal)
            conn.disconnect()   # no callback is set yet: pysyncobj never sees it
            return
        conn._raftsched_source = source
        conn._raftsched_accepted_at = time.monotonic()
        super()._onNewIncomingConnection(conn)

    def _raftsched_admission(self, source: str) -> str | None:
        """Why a new connection from `source` must be closed at once, or None.
        pysyncobj keeps every incoming connection in _unknownConnections until
        the peer has sent its address, which takes the handshake first."""
        pending = self._unknownConnections
        if len(pending) >= limits.raft_preauth_connections_max:
            return (f"{len(pending)} connections are in their handshake, the most "
                    f"raft_preauth_connections_max ({limits.raft_preauth_connections_max}) allows")
        from_source = sum(1 for c in pending if getattr(c, "_raftsched_source", None) == source)
        if from_source >= limits.raft_preauth_connections_per_source_max:
            return (f"{from_source} connections from it are in their handshake, the most "
                    f"raft_preauth_connections_per_source_max "
                    f"({limits.raft_preauth_connections_per_source_max}) allows")
        return None

    def _onTick(self) -> None:
        super()._onTick()
        if self._unknownConnections:
            self._raftsched_close_slow_handshakes()

    def _raftsched_close_slow_handshakes(self) -> None:
        """Close the incoming connections still in their handshake
        raft_handshake_timeout_s after they were accepted."""
        accepted_before = time.monotonic() - limits.raft_handshake_timeout_s
        for conn in list(self._unknownConnections):
            if getattr(conn, "_raftsched_accepted_at", accepted_before) <= accepted_before:
                _handshake_refusals.note(
                    getattr(conn, "_raftsched_source", "an unknown address"),
                    f"no handshake within raft_handshake_timeout_s "
                    f"({limits.raft_handshake_timeout_s:g} s)")
                self._unknownConnections.discard(conn)
                conn.disconnect()

    def addNode(self, node: Any) -> None:
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None and not isinstance(conn, _CappedConnection):
            # A link this node dials. With a secret, the peer's first frame is
            # its random key; without one there is no handshake at all.
            _cap_frames(conn, trusted=self._syncObj.encryptor is None)


class _StateMachine(SyncObj):
    def __init__(self, self_addr: str, peers: list[str], conf: SyncObjConf,
                 on_apply: Callable[[bytes, int], Any],
                 flush_before_commit: Callable[[], None] | None,
                 on_created: Callable[["_StateMachine"], None], listen: bool = True,
                 snapshot_path: str | None = None,
                 snapshotting: Callable[[], bool] = lambda: False,
                 apply_batch: tuple[Callable[[], None], Callable[[], None]] | None = None) -> None:
        self._raftsched_on_apply = on_apply
        # (begin, end) around the entries one tick applies (see
        # _SyncObj__applyLogEntries).
        self._raftsched_apply_batch = apply_batch
        self._raftsched_snapshot_path = snapshot_path   # its size spaces snapshots
        self._raftsched_snapshot_size, self._raftsched_snapshot_size_at = 0, 0.0
        self._raftsched_snapshotting = snapshotting     # whether one is being written
        # --fsync always: flush the journal before an entry counts towards commit.
        self._raftsched_flush = flush_before_commit
        self._raftsched_started = False   # the first turn on the Raft thread has run
        self._raftsched_meta_due = 0.0   # when the journal's meta file is next written
        self._raftsched_commit_index = 0   # see _SyncObj__applyLogEntries
        self._raftsched_listen = listen   # read by _Transport, which SyncObj builds
        # Pacing of append-entries (see _raftsched_pace): when the last were
        # sent, with which commit index, and whether commands were queued
        # since the last turn. The wake-up pipe is watched from the Raft
        # thread's first turn on (its poller is not thread-safe).
        self._raftsched_sent_at = 0.0
        self._raftsched_sent_commit = -1
        self._raftsched_queued = False
        self._raftsched_wake = _WakePipe()
        # The Raft thread's native id, once it has turned (runtime/threadcpu.py).
        self.raftsched_thread_id: int | None = None
        on_created(self)   # before pysyncobj's thread starts, which may call back at once
        super().__init__(self_addr, peers, conf=conf, transportClass=_Transport)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        """One turn of pysyncobj's loop on the Raft thread, and before it: the
        journal flush of --fsync always (what the last turn appended, before
        pysyncobj computes the commit index, in which the leader counts
        itself), the journal's meta file once a second, and a look at the
        network for a follower about to start an election."""
        if not self._raftsched_started:
            self._raftsched_started = True
            self._raftsched_wake.watch(self._poller)
            self.raftsched_thread_id = threading.get_native_id()
        self._raftsched_flush_if_changed()
        now = time.monotonic()
        if now >= self._raftsched_meta_due:
            self._raftsched_meta_due = now + 1.0
            journal = self._SyncObj__raftLog
            if isinstance(journal, _TrackedJournal):
                journal.store_meta()
        self._raftsched_hear_before_electing()
        self._raftsched_bound_log()
        # While committed entries wait to be applied (see _applyLogEntries
        # below), the turn does not wait for the network.
        behind = self._SyncObj__raftLastApplied < self._SyncObj__raftCommitIndex
        wait_s = self._raftsched_pace(timeToWait)
        SyncObj._onTick(self, 0.0 if behind else wait_s)

    def _raftsched_pace(self, wait_s: float) -> float:
        """On the leader, when the next append-entries go out, and how long
        this turn may wait for the network. While followers lack entries, or
        their commit index, or commands wait to be appended, append-entries
        go every append_entries_period_s (the commit batching); otherwise
        they are bare heartbeats, every heartbeat_period_s. A turn waits no
        longer than until the next send is due; new commands wake it (the
        wake-up pipe), so an idle node's Raft thread sleeps between
        heartbeats instead of turning every few milliseconds. A follower's
        turn waits until its election deadline, a message waking it sooner.
        Neither waits more than raft_turn_wait_max_s (the other timers of a
        turn: connection retries, the journal's meta file, snapshots). Times
        are on pysyncobj's clock (CLOCK_MONOTONIC_RAW), which its own send
        and election tests read."""
        now = pysyncobj_monotonic()
        queued, self._raftsched_queued = self._raftsched_queued, False
        if not self._isLeader():
            # A follower's (or candidate's) own timer is its election
            # deadline; what it hears wakes the turn sooner. Once that has
            # passed (not connected to anyone yet), the usual turn.
            until = self._SyncObj__raftElectionDeadline - now
            if until <= 0:
                return wait_s
            return min(limits.raft_turn_wait_max_s, until + limits.raft_deadline_slack_s)
        sent_at = self._raftsched_sent_at
        if self._raftsched_replicating():
            due = sent_at + limits.append_entries_period_s
        else:
            due = sent_at + limits.heartbeat_period_s
        self._SyncObj__newAppendEntriesTime = due
        if queued:
            # Appended at the end of this turn: the next turn sends them.
            due = min(due, sent_at + limits.append_entries_period_s)
        return min(limits.raft_turn_wait_max_s, max(0.0, due - now))

    def _raftsched_replicating(self) -> bool:
        """Whether a connected follower lacks entries, or the commit index it
        was last sent."""
        if self._SyncObj__raftCommitIndex != self._raftsched_sent_commit:
            return True
        last = self._SyncObj__getCurrentLogIndex()
        next_index = self._SyncObj__raftNextIndex
        return any(next_index.get(node, 0) <= last
                   for node in self._SyncObj__connectedNodes
                   if node in self._SyncObj__otherNodes)

    def _SyncObj__sendAppendEntries(self) -> None:
        self._raftsched_sent_at = pysyncobj_monotonic()
        self._raftsched_sent_commit = self._SyncObj__raftCommitIndex
        SyncObj._SyncObj__sendAppendEntries(self)

    def _applyCommand(self, command: Any, callback: Any, commandType: Any = None) -> None:
        """Any thread: queue a command for the Raft thread, and wake it."""
        SyncObj._applyCommand(self, command, callback, commandType)
        self._raftsched_queued = True
        self._raftsched_wake.notify()

    def destroy(self) -> None:
        """Any thread: stop, waking the Raft thread so that it stops at once
        rather than at the end of its wait."""
        SyncObj.destroy(self)
        self._raftsched_wake.notify()

    def _doDestroy(self) -> None:
        SyncObj._doDestroy(self)
        self._raftsched_wake.close()

    def _checkCommandsToApply(self) -> None:
        started = time.monotonic()
        SyncObj._checkCommandsToApply(self)
        if time.monotonic() - started >= limits.append_entries_period_s:
            # pysyncobj stopped at its time budget: commands may remain queued.
            self._raftsched_queued = True

    def _raftsched_bound_log(self) -> None:
        """Snapshot early once the log since the last snapshot holds more than
        log_bytes_bound(the last snapshot's size): pysyncobj counts only
        entries, so a burst of batch creates (about 100 KB an entry) wrote
        gigabytes of journal before the entry count was reached."""
        journal = self._SyncObj__raftLog
        if not isinstance(journal, _TrackedJournal) or self._raftsched_snapshotting():
            # While one is written the log cannot shrink, and pysyncobj keeps
            # a request made meanwhile: it would start the next snapshot as
            # soon as this one is done, with the log already compacted.
            return
        held = journal.held_bytes()
        # (The bound is at least raft_log_bytes_min: under it, no file to look at.)
        if held <= limits.raft_log_bytes_min \
                or held <= log_bytes_bound(self._raftsched_snapshot_bytes()):
            return
        if self._isLeader() and held <= limits.raft_log_bytes_hard_max:
            # A leader drops the entries up to its snapshot: a follower that
            # has not got them yet would need the whole state sent instead.
            # So it snapshots early only while every follower has what it
            # applied, and otherwise holds more log until they catch up (up
            # to raft_log_bytes_hard_max: the journal's offsets are 32-bit).
            applied = self._SyncObj__raftLastApplied
            match = self._SyncObj__raftMatchIndex
            if any(match.get(node, 0) < applied for node in self._SyncObj__otherNodes):
                return
        self.forceLogCompaction()

    def _raftsched_snapshot_bytes(self) -> int:
        """The size of this node's last snapshot file (0 when it has none),
        looked at once a second at most: past the log's floor this is asked
        every Raft turn."""
        now = time.monotonic()
        if now >= self._raftsched_snapshot_size_at:
            self._raftsched_snapshot_size_at = now + 1.0
            try:
                self._raftsched_snapshot_size = os.stat(self._raftsched_snapshot_path).st_size
            except (OSError, TypeError):
                self._raftsched_snapshot_size = 0
        return self._raftsched_snapshot_size

    # pysyncobj reads ranges of its log here: to apply, to send to a follower
    # (up to a size), to compare with what a leader sent. It slices the journal
    # from the first entry asked for to the end and then keeps what it needs,
    # which for _TrackedJournal would read the whole rest of the file; this
    # reads only the entries it returns, and answers as pysyncobj's does.
    def _SyncObj__getEntries(self, fromIDx: int | None, count: int | None = None,
                             maxSizeBytes: int | None = None) -> list:
        journal = self._SyncObj__raftLog
        if not isinstance(journal, _TrackedJournal):
            return SyncObj._SyncObj__getEntries(self, fromIDx, count, maxSizeBytes)
        first = journal[0][1]
        if fromIDx is None or fromIDx < first:
            return []
        start = fromIDx - first
        stop = len(journal) if count is None else min(len(journal), start + count)
        return journal.entries(start, stop, maxSizeBytes)

    # pysyncobj applies every committed entry in one go before it sends the
    # next heartbeats or reads a message. Batch creates commit several entries
    # of tens of milliseconds each at once, which held a leader's Raft thread
    # past the election timeout, and its followers, hearing nothing, started
    # an election. So each tick applies entries for at most limits.apply_budget_s
    # (and at least one), and the next tick goes on: pysyncobj is shown a
    # commit index one entry ahead at a time.
    def _SyncObj__applyLogEntries(self) -> bool:
        commit_index = self._SyncObj__raftCommitIndex
        if self._SyncObj__raftLastApplied < commit_index and self._isLeader():
            # Heartbeat first (it also carries the new commit index): the
            # followers' election clocks then start after the last heartbeat
            # before this apply, not long before it.
            self._SyncObj__sendAppendEntries()
        deadline = time.monotonic() + limits.apply_budget_s
        send_now = False
        self._raftsched_commit_index = commit_index   # what status reports meanwhile
        batch = self._raftsched_apply_batch
        batching = batch is not None and self._SyncObj__raftLastApplied < commit_index
        if batching:
            # The entries of this tick may be committed to the store together
            # (an LMDB commit costs more than a small entry's apply; their
            # proposers' results wait for it: Replicator.propose).
            batch[0]()
        try:
            while self._SyncObj__raftLastApplied < commit_index:
                before = self._SyncObj__raftLastApplied
                self._SyncObj__raftCommitIndex = before + 1
                send_now = SyncObj._SyncObj__applyLogEntries(self) or send_now
                if self._SyncObj__raftLastApplied == before or time.monotonic() > deadline:
                    break
        finally:
            self._SyncObj__raftCommitIndex = commit_index
            self._raftsched_commit_index = 0
            if batching:
                batch[1]()
        return send_now

    @property
    def raftCommitIndex(self) -> int:
        """The commit index, also while _applyLogEntries shows pysyncobj a lower
        one (read-your-writes compares the leader's with an applied index)."""
        return max(self._SyncObj__raftCommitIndex, self._raftsched_commit_index)

    def _raftsched_hear_before_electing(self) -> None:
        """A follower whose election deadline passed while its Raft thread was
        busy (a flush, a file write, an apply, the machine's load) reads what
        arrived meanwhile before pysyncobj decides it has not heard from the
        leader: a heartbeat waiting unread resets the deadline. (The deadline
        is on pysyncobj's clock, CLOCK_MONOTONIC_RAW, which drifts from
        time.monotonic by the clock's NTP corrections, by as much as a fifth
        of a second a day.)"""
        if self._isLeader() or self._SyncObj__raftElectionDeadline > pysyncobj_monotonic():
            return
        self._poller.poll(0)

    def _raftsched_flush_if_changed(self) -> None:
        if self._raftsched_flush is None:
            return
        journal = self._SyncObj__raftLog
        if getattr(journal, "_raftsched_dirty", True):
            journal._raftsched_dirty = False
            self._raftsched_flush()

    def _raftsched_reset_election_deadline(self) -> None:
        """Raft thread: give the leader a full election timeout from now to be
        heard again (after a long snapshot install, see the module docstring)."""
        self._SyncObj__raftElectionDeadline = (pysyncobj_monotonic()
                                               + self._SyncObj__generateRaftTimeout())

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
        if success:
            # A follower's acknowledgement counts towards commit: under --fsync
            # always, what it acknowledges must be on disk first.
            self._raftsched_flush_if_changed()
        SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=nextNodeIdx,
                                          success=success)

    # pysyncobj sends an entry larger than appendEntriesBatchSizeBytes (a batch
    # create) in chunks, and marks as 'finish' every chunk that reaches the
    # length of the entry's command rather than of the pickled entry, which is
    # longer (protocol 2 pickles bytes as latin-1 text). The first such chunk
    # leaves the entry incomplete: unpickling it raises inside the tick, and
    # the Raft thread logs a traceback for each chunk until the last one. Until
    # the pickled entry is whole, a 'finish' is taken as a 'process'.
    def _SyncObj__onMessageReceived(self, node: Any, message: dict) -> None:
        if message.get("type") == "append_entries":
            if message.get("transmission") == "finish":
                message = self._raftsched_finish_transmission(message)
            if "entries" in message and "prevLogIdx" in message:
                message = self._raftsched_keep_applied(message)
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _raftsched_finish_transmission(self, message: dict) -> dict:
        """The last chunk of an entry sent in chunks: a 'process' while the
        pickled entry is not whole (see above), else the same message with
        the entry in it, as a regular append-entries, so that a re-sent large
        entry is compared like any other (_raftsched_keep_applied)."""
        received = self._SyncObj__recvTransmission
        if not isinstance(received, bytes):
            return message
        whole = received + message["data"]
        entry = _unpickled(whole)
        if entry is _TRUNCATED:
            return dict(message, transmission="process")
        self._SyncObj__recvTransmission = ""
        regular = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        # Whole but odd to the C unpickler: pysyncobj's own loader decides.
        regular["entries"] = [pysyncobj_pickle.loads(whole) if entry is _ODD else entry]
        return regular

    # pysyncobj's leader, on a follower's acknowledgement of an earlier batch,
    # sets the follower's next index back to the end of that batch, although
    # it has sent later batches meanwhile; so it sends those entries again.
    # The follower, holding more entries than the previous one the message
    # names, truncates its log there and appends the entries sent, logging
    # CRITICAL "truncating already-applied log entries ... may have diverged"
    # when some of them were applied already. Three nodes on loopback do so
    # during ordinary creates. The entries sent again are the same ones (same
    # index, term and command): a leader makes one entry per index in its
    # term, and an applied entry is committed, so every leader holds it. So
    # before pysyncobj sees such a message, the entries this node has applied
    # are compared with those sent, and if they are the same the message is
    # cut to start after the last applied entry: nothing applied is truncated.
    # A different entry at an applied index is a broken Raft invariant: it is
    # logged CRITICAL and the message is left to pysyncobj as it came.
    def _raftsched_keep_applied(self, message: dict) -> dict:
        prev = message["prevLogIdx"]
        applied = self._SyncObj__raftLastApplied
        if prev >= applied or message["term"] < self.raftCurrentTerm:
            return message   # nothing applied would be truncated, or pysyncobj ignores it
        held = self._SyncObj__getEntries(prev, applied - prev + 1)
        if len(held) < 2 or held[0][2] != message["prevLogTerm"]:
            return message   # pysyncobj refuses it, or has nothing to truncate
        sent = message["entries"]
        for entry in sent:
            position = entry[1] - prev
            if position >= len(held):
                break
            mine = held[position]
            if mine[1] != entry[1] or mine[2] != entry[2] or mine[0] != entry[0]:
                log.critical("Raft: the leader sent entry %d at term %d where this node applied "
                             "one at term %s (%s command): the replicas' states may differ; "
                             "compare GET /v1/state/digest on every node", entry[1], entry[2],
                             mine[2], "the same" if mine[0] == entry[0] else "another")
                return message
        last = held[-1]
        log.debug("Raft: entries %d..%d sent again by the leader are the ones applied here; "
                  "kept", prev + 1, last[1])
        return dict(message, prevLogIdx=last[1], prevLogTerm=last[2],
                    entries=[entry for entry in sent if entry[1] > last[1]])

    @replicated
    def apply_command(self, data: bytes) -> Any:
        # pysyncobj increments raftLastApplied after this returns, so the entry
        # being applied has index raftLastApplied + 1.
        return self._raftsched_on_apply(data, self.raftLastApplied + 1)


class SnapshotSource(Protocol):
    """What a snapshot is written from: a pinned read of the state
    (storage/lmdb_store.py PinnedRead)."""

    applied_index: int

    def copy_to(self, fd: int) -> None: ...

    def close(self) -> None: ...


@dataclass(kw_only=True)
class _SnapshotJob:
    """One snapshot being written: pinned on the Raft thread, written on its own."""
    source: SnapshotSource | None
    last: tuple
    prev: tuple
    thread: threading.Thread | None = None
    ok: bool = False              # the file is written and fsynced
    renamed: bool = False         # it replaced the snapshot (on the Raft thread)
    durable: bool = False         # and that rename is fsynced
    abandoned: bool = False
    written_s: float = 0.0        # how long writing and fsyncing the file took


class Replicator:
    """Start the Raft member; propose commands; report status."""

    def __init__(self, *, self_addr: str, peers: list[str], data_dir: str,
                 secret: str | None, loop: asyncio.AbstractEventLoop,
                 on_apply: Callable[[bytes, int], Any],
                 snapshot_pin: Callable[[], SnapshotSource],
                 snapshot_install: Callable[[str, int, int, int], bool],
                 snapshot_install_items: Callable[[int, list], bool],
                 snapshot_entries: int = limits.log_compaction_entries_default,
                 fsync: str = "periodic",
                 apply_batch: tuple[Callable[[], None], Callable[[], None]] | None = None,
                 after_commit: Callable[[Callable[[], None]], None] = lambda settle: settle()
                 ) -> None:
        """`apply_batch`: (begin, end), called on the Raft thread around the
        entries one tick applies: `end` commits what `on_apply` applied
        since `begin` (ApplyBridge.begin_batch). `after_commit(settle)`
        calls `settle`, a proposer's result, once the entry just applied is
        committed (ApplyBridge.after_commit)."""
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync mode {fsync!r}: one of {', '.join(FSYNC_MODES)}")
        self._loop = loop
        self._after_commit = after_commit
        self._snapshot_pin = snapshot_pin
        self._snapshot_install = snapshot_install
        self._snapshot_install_items = snapshot_install_items
        self._snapshot_path = os.path.join(data_dir, "raft.snapshot")
        self._snapshot_job: _SnapshotJob | None = None
        self.snapshots_written_total = 0
        self.snapshot_installs_total = 0
        # Seconds the snapshot thread took to write the last snapshot put in
        # place, and all of them since start (GET /metrics).
        self.snapshot_write_s_last: float | None = None
        self.snapshot_write_s_sum = 0.0
        self.fsync = fsync
        os.makedirs(data_dir, mode=limits.private_dir_mode, exist_ok=True)
        _clean_snapshot_leftovers(self._snapshot_path)
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
        journal_path = os.path.join(data_dir, "raft.journal")
        conf = SyncObjConf(
            password=secret,
            journalFile=journal_path,
            fullDumpFile=self._snapshot_path,
            serializer=self._serialize,
            serializeChecker=self._check_snapshot,
            deserializer=self._deserialize,
            appendEntriesPeriod=limits.append_entries_period_s,
            autoTickPeriod=limits.auto_tick_period_s,
            raftMinTimeout=limits.election_timeout_min_s,
            raftMaxTimeout=limits.election_timeout_max_s,
            leaderFallbackTimeout=limits.leader_fallback_timeout_s,
            connectionRetryTime=limits.connection_retry_s,
            commandsQueueSize=limits.raft_commands_queue_max,
            logCompactionMinEntries=snapshot_entries,
            logCompactionMinTime=limits.log_compaction_period_s,
            dynamicMembershipChange=False,
            commandsWaitLeader=True,
            useFork=False,
            onStateChanged=self._on_state_changed,
        )
        self._flusher = _JournalFlusher(journal_path)
        self._obj: _StateMachine
        # A node with no peers and no secret opens no Raft port: it has no one
        # to talk to, and an open port without a secret would run pickle.
        listen = bool(peers) or secret is not None
        if not listen:
            log.info("no peers and no Raft secret: no Raft port is opened")
        _StateMachine(self_addr, dial, conf, on_apply,
                      self._flusher.flush if fsync == "always" else None,
                      on_created=self._created, listen=listen, snapshot_path=self._snapshot_path,
                      snapshotting=lambda: self._snapshot_job is not None,
                      apply_batch=apply_batch)
        self._flusher.start()

    def _created(self, obj: "_StateMachine") -> None:
        self._obj = obj

    def _on_state_changed(self, old: int, new: int) -> None:
        """Raft thread: every role change is logged, with the term it happens in."""
        names = {0: "follower", 1: "candidate", 2: "leader"}
        log.info("raft role %s -> %s at term %d", names.get(old, old), names.get(new, new),
                 self._obj.raftCurrentTerm)

    @property
    def journal_flushes_total(self) -> int:
        return self._flusher.flushes_total

    def thread_ids(self) -> dict[str, int | None]:
        """Native ids of the Raft thread (applying every entry) and of the
        journal flusher, None until each has started (runtime/threadcpu.py)."""
        return {"raft": self._obj.raftsched_thread_id, "journal": self._flusher.native_id}

    @property
    def frames_refused_total(self) -> int:
        """Raft connections this process closed for a declared frame length
        over the cap (an HTTP request or a probe sent to the Raft port)."""
        return _frame_refusals.total

    @property
    def handshakes_refused_total(self) -> int:
        """Incoming Raft connections this process closed before they
        authenticated: too slow, or over a cap of connections in handshake."""
        return _handshake_refusals.total

    # --- snapshots: a compacted LMDB copy, written off the Raft thread ------------------

    def _serialize(self, filename: str, raft_data: tuple) -> None:
        """Raft thread, called by pysyncobj with filename `<snapshot>.tmp`: pin the
        state and leave at `filename` what pysyncobj may rename over the snapshot."""
        last, prev, _cluster = raft_data
        assert self._snapshot_job is None, "pysyncobj started a second snapshot"
        # Whatever fails here, a job is left for the checker to report FAILED:
        # pysyncobj takes no other snapshot until the checker reports an end.
        job = _SnapshotJob(source=None, last=tuple(last), prev=tuple(prev))
        self._snapshot_job = job
        try:
            _link_or_empty(self._snapshot_path, filename)
            job.source = self._snapshot_pin()
        except Exception:
            log.exception("snapshot at raft index %d: cannot start", job.last[1])
            job.abandoned = True

    def _check_snapshot(self) -> int:
        """Raft thread, every tick (pysyncobj's serializeChecker)."""
        job = self._snapshot_job
        if job is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if job.thread is None and not job.abandoned:
            job.thread = threading.Thread(target=self._write_snapshot, args=(job,),
                                          name="raftsched-snapshot", daemon=True)
            job.thread.start()
            return SERIALIZER_STATE.SERIALIZING
        if job.thread is not None and job.thread.is_alive():
            return SERIALIZER_STATE.SERIALIZING
        if job.ok and not job.abandoned and not job.renamed:
            # The rename is on the Raft thread, where a snapshot from the leader
            # is also put in place, so the two never cross; fsyncing the
            # directory can take long when the disk is busy, so a thread does it.
            try:
                os.replace(self._snapshot_path + ".building", self._snapshot_path)
            except OSError:
                log.exception("snapshot: cannot put %s in place", self._snapshot_path)
            else:
                job.renamed = True
                job.thread = threading.Thread(target=self._sync_snapshot_dir, args=(job,),
                                              name="raftsched-snapshot-sync", daemon=True)
                job.thread.start()
                return SERIALIZER_STATE.SERIALIZING
        self._snapshot_job = None
        _clean_snapshot_leftovers(self._snapshot_path)   # with the .tmp link to the old one
        if job.durable and not job.abandoned:
            self.snapshots_written_total += 1
            self.snapshot_write_s_last = job.written_s
            self.snapshot_write_s_sum += job.written_s
            return SERIALIZER_STATE.SUCCESS
        return SERIALIZER_STATE.FAILED

    def _sync_snapshot_dir(self, job: _SnapshotJob) -> None:
        try:
            fsync_dir(os.path.dirname(self._snapshot_path))
            job.durable = True
        except OSError:
            log.exception("snapshot: cannot fsync the directory of %s; the journal is kept",
                          self._snapshot_path)

    def _write_snapshot(self, job: _SnapshotJob) -> None:
        """Snapshot thread: header, then the pinned state as an LMDB image, fsynced."""
        started = time.monotonic()
        path = self._snapshot_path + ".building"
        assert job.source is not None
        try:
            with open(path, "wb") as fh:
                header = codec.pack({"v": SNAPSHOT_VERSION, "format": "lmdb-compact",
                                     "last": list(job.last), "prev": list(job.prev),
                                     "applied_index": job.source.applied_index})
                fh.write(_SNAPSHOT_PREFIX.pack(SNAPSHOT_MAGIC, 0, len(header)) + header)
                fh.flush()
                image_start = fh.tell()
                job.source.copy_to(fh.fileno())
                job.source.close()   # let LMDB reuse the pages it held
                size = os.fstat(fh.fileno()).st_size
                os.pwrite(fh.fileno(), struct.pack(">Q", size - image_start), 8)
                if not job.abandoned:
                    os.fsync(fh.fileno())
            job.ok = True
            job.written_s = time.monotonic() - started
            log.info("snapshot written at applied_index %d (raft index %d) in %.2f s, %d bytes",
                     job.source.applied_index, job.last[1], job.written_s, size)
        except Exception:
            log.exception("snapshot at raft index %d failed; the journal is kept", job.last[1])
        finally:
            job.source.close()

    def _abandon_snapshot(self) -> None:
        """Raft thread: a snapshot from the leader replaces the state, so one
        still being written here is of no use and must not be put in place."""
        job = self._snapshot_job
        if job is None:
            return
        job.abandoned = True
        if job.thread is not None:
            job.thread.join()
        elif job.source is not None:
            job.source.close()
        log.info("snapshot at raft index %d abandoned: a snapshot from the leader is "
                 "installed", job.last[1])

    def _deserialize(self, filename: str) -> tuple:
        """Raft thread, called by pysyncobj at start (its own snapshot) and when
        the leader sent one. Returns pysyncobj's (last, prev, cluster)."""
        self._abandon_snapshot()
        with open(filename, "rb") as fh:
            prefix = fh.read(_SNAPSHOT_PREFIX.size)
            if len(prefix) < _SNAPSHOT_PREFIX.size or not prefix.startswith(SNAPSHOT_MAGIC):
                return self._deserialize_v1(filename)
            _magic, image_bytes, header_bytes = _SNAPSHOT_PREFIX.unpack(prefix)
            header = codec.unpack(fh.read(header_bytes))
            size = os.fstat(fh.fileno()).st_size
        if header.get("v") != SNAPSHOT_VERSION or header.get("format") != "lmdb-compact":
            raise ValueError(f"{filename}: snapshot version {header.get('v')!r} "
                             f"({header.get('format')!r}) is unknown")
        offset = _SNAPSHOT_PREFIX.size + header_bytes
        if size != offset + image_bytes:
            raise ValueError(f"{filename}: {size} bytes, the header says {offset + image_bytes}")
        if self._snapshot_install(filename, offset, image_bytes, header["applied_index"]):
            self.snapshot_installs_total += 1
        self._obj._raftsched_reset_election_deadline()
        return tuple(header["last"]), tuple(header["prev"]), []

    def _deserialize_v1(self, filename: str) -> tuple:
        """A snapshot written by an earlier release: one msgpack map."""
        with open(filename, "rb") as fh:
            data = codec.unpack(fh.read())
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError(f"{filename}: not a snapshot this build reads")
        if self._snapshot_install_items(data["applied_index"], data["items"]):
            self.snapshot_installs_total += 1
        self._obj._raftsched_reset_election_deadline()
        return tuple(data["last"]), tuple(data["prev"]), []

    # --- proposing -------------------------------------------------------------------

    def propose(self, data: bytes) -> asyncio.Future:
        """Submit a command; the future resolves with apply's result on this node
        (so the command is committed and applied here), or fails Unavailable."""
        future: asyncio.Future = self._loop.create_future()

        def on_result(result: Any, error: int) -> None:  # pysyncobj thread
            self._after_commit(
                lambda: self._loop.call_soon_threadsafe(_settle, future, result, error))

        self._obj.apply_command(data, callback=on_result)
        return future

    async def propose_wait(self, data: bytes, timeout_s: float = limits.propose_timeout_s,
                           wait_max_s: float | None = None) -> Any:
        """propose, and wait for the result. With wait_max_s, the wait goes on
        past timeout_s while the cluster visibly commits (this node applied
        entries in the last timeout_s and reaches a leader): the command is
        queued behind others, not lost; up to wait_max_s in all. Then
        Unavailable (timeout), saying what this node sees: no leader, no
        quorum, a stalled leader, or a queue."""
        future = self.propose(data)
        waited_s = 0.0
        applied = self.applied_index()
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(future), timeout_s)
            except asyncio.TimeoutError:
                waited_s += timeout_s
            now_applied = self.applied_index()
            progressing = now_applied > applied and self.leader_reachable()
            if not progressing or wait_max_s is None or waited_s + timeout_s > wait_max_s:
                break
            applied = now_applied
        future.cancel()
        raise Unavailable(f"the command was not committed within {waited_s:g} s; "
                          f"{self._why_not_committed(progressing)}; its outcome is unknown: "
                          "retry with the same idempotency_key", reason="timeout")

    def applied_index(self) -> int:
        """The last Raft index applied here (read off pysyncobj's thread: an int)."""
        return int(self._obj._SyncObj__raftLastApplied)

    def _why_not_committed(self, progressing: bool) -> str:
        if not self.leader_reachable():
            return "no Raft leader is reachable from this node"
        if not self._obj.hasQuorum:
            return "this node does not reach a quorum of the cluster (no quorum)"
        if progressing:
            return ("the cluster is committing, but this command was queued behind others "
                    "all that time: it is overloaded")
        return ("a leader is reachable and this node reaches a quorum, but nothing was "
                "committed meanwhile (the leader is stalled, or lost the command)")

    # --- status ----------------------------------------------------------------------

    def is_leader(self) -> bool:
        return bool(self._obj._isLeader())

    def term(self) -> int:
        """The Raft term this node is in (a cheap read, unlike status())."""
        return int(self._obj.raftCurrentTerm)

    def leader_reachable(self) -> bool:
        """Whether a command proposed now reaches a leader: this node leads, or
        the leader it knows of is connected to it. False during an election and
        while a follower still names a leader whose connection dropped (a
        killed leader): pysyncobj would forward the command to it and lose it,
        and the caller would learn only that the leader changed."""
        obj = self._obj
        if obj._isLeader():
            return True
        leader = obj._getLeader()
        return leader is not None and bool(obj.isNodeConnected(leader))

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
        internals, so a pysyncobj upgrade is checked here.

        On a follower, nothing: pysyncobj records answers only while leading,
        so a follower would report every peer it never led as down (a node
        that gained shards as a follower then judged their live holders dead
        and called their runs fired ahead again, as next attempts). There
        liveness is the renewals' alone (Coordinator.live_nodes).

        A peer no link has come up to since this process started is left
        out, not reported down: in a whole cluster restarted, the node
        slowest to start is not connected yet when the first leader looks
        (links are dialled every connection_retry_s), and judged dead then
        it lost its shards before it could judge its own uncalled runs, which
        were then called again as next attempts. The renewals judge it, from
        this start. A peer whose link was up and is down (a killed process)
        is still down at once."""
        obj = self._obj
        if not obj._isLeader():
            return {}
        for _ in range(3):
            try:
                last = dict(getattr(obj, "_SyncObj__lastResponseTime"))
                break
            except RuntimeError:   # resized by the Raft thread while copying
                continue
        else:
            last = {}
        now = pysyncobj_monotonic()   # the clock pysyncobj stamps answers with
        once = getattr(obj, "_raftsched_connected_once", None)
        out: dict[str, float | None] = {}
        for peer in obj.otherNodes:
            seen = last.get(peer)
            addr = self._alias.get(str(peer.id), str(peer.id))
            if obj.isNodeConnected(peer) and seen is not None:
                out[addr] = max(0.0, now - seen)
            elif once is None or str(peer.id) in once:
                out[addr] = None
        return out

    def destroy(self) -> None:
        self._obj.destroy()
        self._flusher.close()
        job = self._snapshot_job
        if job is not None and job.thread is not None:
            job.abandoned = True
            job.thread.join()


class _WakePipe:
    """Wakes the Raft thread's poller from any thread: pysyncobj otherwise
    sees a queued command only at its next turn (auto_tick_period_s). At most
    one byte is in the pipe at a time; a wake-up lost to a race costs at most
    one such period."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._pending = False

    def watch(self, poller: Any) -> None:
        """Raft thread: read the pipe whenever it is readable."""
        from pysyncobj.poller import POLL_EVENT_TYPE
        poller.subscribe(self._read_fd, self._drain, POLL_EVENT_TYPE.READ)

    def notify(self) -> None:
        if self._pending:
            return
        self._pending = True
        try:
            os.write(self._write_fd, b"w")
        except (BlockingIOError, OSError):
            pass   # full (already readable) or closed at shutdown

    def close(self) -> None:
        """The Raft thread's last act (or its owner's, without one)."""
        self._pending = True   # no more writes
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _drain(self, fd: int, event_mask: int) -> None:
        """Raft thread, from its poller. The pipe is emptied before a new
        wake-up may write again: a command queued meanwhile is taken by the
        turn that follows this poll, which runs at once."""
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        self._pending = False


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


class _JournalFlusher:
    """fdatasyncs pysyncobj's journal file: every limits.journal_flush_period_s on its
    own thread, and when asked (by the Raft thread, under --fsync always).
    Counts the flushes (journal_flushes_total in GET /v1/node)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raftsched-journal-flush",
                                        daemon=True)
        self.flushes_total = 0

    def start(self) -> None:
        self._thread.start()

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    def flush(self) -> None:
        with self._lock:
            if self._fd is None:
                # Opened late: pysyncobj creates the file, with its header, itself.
                self._fd = os.open(self._path, os.O_RDWR)
            fd = self._fd
        os.fdatasync(fd)
        with self._lock:
            self.flushes_total += 1

    def _run(self) -> None:
        while not self._stop.wait(limits.journal_flush_period_s):
            try:
                self.flush()
            except OSError:
                log.critical("cannot flush the Raft journal %s; retrying in %g s", self._path,
                             limits.journal_flush_period_s, exc_info=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim   # glibc's; elsewhere there is none
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Hand the C allocator's free memory back to the system (glibc's
    malloc_trim; False where there is none), after a snapshot's compaction.
    When the Raft log was held in memory, glibc kept what its entries had
    held as the process's own after they were freed: 380-630 MB of RssAnon a
    node at 10M pending one-offs, 59 MB after one trim (docs/benchmarks.md).
    The log is now read from the journal file (_TrackedJournal), but the
    buffers of a burst of large entries (append-entries, unpickled commands)
    are freed the same way. ctypes releases the GIL for the call."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


_TRUNCATED, _ODD = object(), object()


def _unpickled(data: bytes) -> Any:
    """The value `data` pickles, read once (an entry of a batch create is
    hundreds of KB); _TRUNCATED when it is the start of a pickle rather than
    a whole one, _ODD when C's unpickler refuses it otherwise."""
    try:
        return pickle.loads(data)
    except (EOFError, pickle.UnpicklingError) as exc:
        truncated = isinstance(exc, EOFError) or "truncated" in str(exc)
        return _TRUNCATED if truncated else _ODD
    except Exception:
        return _ODD


def _link_or_empty(snapshot: str, tmp: str) -> None:
    """Make `tmp` the current snapshot (a hard link: renaming it over the
    snapshot changes nothing) or, with no snapshot yet, an empty file (removed
    at start if it is ever left in the snapshot's place)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    try:
        os.link(snapshot, tmp)
    except FileNotFoundError:
        open(tmp, "wb").close()


def _clean_snapshot_leftovers(snapshot: str) -> None:
    """Remove what an interrupted or finished snapshot left: the file being
    built, pysyncobj's temporary name, and an empty placeholder."""
    for leftover in (snapshot + ".building", snapshot + ".tmp"):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
    try:
        if os.path.getsize(snapshot) == 0:
            os.unlink(snapshot)
    except FileNotFoundError:
        pass


def write_backup(path: str, source: SnapshotSource) -> None:
    """Write `source` (a read of a node's state) to `path` as a snapshot file
    a fresh node starts from (`raftsched backup`; docs/operations.md). A
    node's own snapshot names the Raft entries it ends at with their terms,
    which only its cluster knows; a backup names two Raft no-ops at the
    state's applied_index and the index before, at term 0, so that every node
    of a new cluster restored from the same file agrees on them, and its log
    goes on after the state's applied_index (entries at or below it would be
    skipped as already applied). It is for new clusters only: a live cluster
    has other terms at those indexes."""
    index = source.applied_index
    if index < 2:
        raise ValueError(f"the state has applied no entry yet (applied_index {index})")
    noop = struct.pack("B", pysyncobj_syncobj._COMMAND_TYPE.NO_OP)
    header = codec.pack({"v": SNAPSHOT_VERSION, "format": "lmdb-compact",
                         "last": [noop, index, 0], "prev": [noop, index - 1, 0],
                         "applied_index": index})
    with open(path, "xb") as fh:   # never over an existing file
        try:
            fh.write(_SNAPSHOT_PREFIX.pack(SNAPSHOT_MAGIC, 0, len(header)) + header)
            fh.flush()
            image_start = fh.tell()
            source.copy_to(fh.fileno())
            size = os.fstat(fh.fileno()).st_size
            os.pwrite(fh.fileno(), struct.pack(">Q", size - image_start), 8)
            os.fsync(fh.fileno())
        except BaseException:
            os.unlink(path)   # a partial backup must not pass for one
            raise


def read_snapshot_header(path: str) -> dict:
    """The header of a snapshot file in this build's format (a backup is
    one), after checking its length; ValueError if it is not one."""
    with open(path, "rb") as fh:
        prefix = fh.read(_SNAPSHOT_PREFIX.size)
        if len(prefix) < _SNAPSHOT_PREFIX.size or not prefix.startswith(SNAPSHOT_MAGIC):
            raise ValueError(f"{path}: not a raftsched snapshot or backup")
        _magic, image_bytes, header_bytes = _SNAPSHOT_PREFIX.unpack(prefix)
        header = codec.unpack(fh.read(header_bytes))
        size = os.fstat(fh.fileno()).st_size
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a raftsched snapshot or backup")
    if header.get("v") != SNAPSHOT_VERSION or header.get("format") != "lmdb-compact":
        raise ValueError(f"{path}: snapshot version {header.get('v')!r} is unknown")
    if size != _SNAPSHOT_PREFIX.size + header_bytes + image_bytes:
        raise ValueError(f"{path}: {size} bytes, its header says "
                         f"{_SNAPSHOT_PREFIX.size + header_bytes + image_bytes}")
    return header
