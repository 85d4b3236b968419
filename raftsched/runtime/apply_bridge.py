"""The apply bridge: from a committed Raft entry to state, and on to the node.

    Replicator (pysyncobj thread) -> on_apply(bytes, index)
        decode + core.apply(view, command, index) -> Transition   (core/apply.py)
        store.apply_commit: writes + applied_index    (one LMDB txn, shared by the
                                                       entries of a tick: begin_batch)
        effects, once committed -> loop.call_soon_threadsafe(Effects.deliver)
                                -> their subscribers          (runtime/effects.py)

It also serves the Raft thread's snapshots (pin the state to write one,
install one received) and records the state digests of check_digest entries,
hashed on a thread of their own. Everything here but digest_at runs on the
Raft thread: it never touches asyncio objects directly (the effects are
delivered on the loop, through call_soon_threadsafe).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from raftsched import limits
from raftsched.core.apply import RunQueued, apply_entry
from raftsched.errors import InvariantBroken, Unavailable
from raftsched.runtime.effects import Effects, SnapshotInstalled
from raftsched.runtime.lateness import LatenessHistogram
from raftsched.runtime.metrics import AppliedCounts
from raftsched.runtime.purger import Touched
from raftsched.storage.base import Store, digest_pinned
from raftsched.storage.lmdb_store import PinnedRead, SnapshotAborted

log = logging.getLogger("raftsched.node")

# checked_digests' value while the digest thread hashes the state.
DIGEST_PENDING = "pending"
# Exit code of a node that stopped itself on a broken invariant.
EXIT_INVARIANT = 70


class ApplyBridge:
    """Applies committed entries to one node's store and hands their effects
    to the node's loop."""

    def __init__(self, *, store: Store, node_id: str, now_ms: Callable[[], int],
                 effects: Effects, applied_counts: AppliedCounts | None = None,
                 arming_lead: LatenessHistogram | None = None,
                 renewal_applied: Callable[[tuple], None] = lambda effects: None) -> None:
        """`effects`: who acts on what each entry did, on the loop.
        On the Raft thread, right after an entry is applied: `applied_counts`
        adds its tallies (GET /metrics), `arming_lead` records how far ahead
        of their second this node's own fires queued their runs, and
        `renewal_applied` gets a renewal's effects (a shard lease counts
        from here: runtime/coordinator.py)."""
        self._store = store
        self._node_id = node_id
        self._now_ms = now_ms
        self.effects = effects
        self._applied_counts = applied_counts if applied_counts is not None else AppliedCounts()
        self._arming_lead = arming_lead if arming_lead is not None else LatenessHistogram()
        self._renewal_applied = renewal_applied
        # The node's event loop, set when the node starts; effects wait for it.
        self.loop: asyncio.AbstractEventLoop | None = None
        # index -> state digest recorded when a check_digest entry was applied
        # here (DIGEST_PENDING while the digest thread computes it). Written by
        # the Raft and digest threads, read by the loop: under _digests_lock.
        self.checked_digests: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._digests_lock = threading.Lock()
        self._digest_queue: queue.Queue = queue.Queue(maxsize=limits.digests_computing_max)
        # While this node leads, what each entry applied here wrote that the
        # purger reads (runtime/purger.py Touched), or None.
        self.touched: Touched | None = None
        # The most CPU one entry's apply took here since start, and its tag.
        self.apply_entry_s_max = 0.0
        self.apply_entry_slowest: str | None = None
        self.digest_thread: threading.Thread | None = None
        # Between begin_batch and end_batch (one Raft tick's entries): what
        # waits for the entries applied to be committed (their proposers'
        # results, their effects, the purger's notes of them).
        self._batching = False
        self._batch_until = 0.0   # when the batch is committed after its entry
        self._uncommitted = False   # entries of the batch applied and not committed
        self._held_results: list[Callable[[], None]] = []
        self._held_effects: list[tuple] = []
        self._held_touched: list[tuple[Touched, str | None, tuple]] = []

    def start_digest_thread(self) -> None:
        self.digest_thread = threading.Thread(target=self._digest_worker,
                                              name="raftsched-digest", daemon=True)
        self.digest_thread.start()

    # --- the Raft thread side --------------------------------------------------------

    def on_apply(self, data: bytes, index: int) -> dict | None:
        """Runs on pysyncobj's thread. Never touches asyncio objects directly.

        A refused entry (malformed, or refused whole by apply) commits no
        writes, only its index, so a replay skips it, and every replica agrees.
        A version or tag this build does not know, or a failed commit, stops
        the node."""
        try:
            store = self._store
            started = time.thread_time()
            applied = store.apply_commit(index, self._apply_noting(data, index),
                                         skip_applied=True)
            if applied is None:
                return {"ok": True, "replayed": True}   # persisted before a restart
            tag, transition = applied
            self._note_apply_time(index, tag, time.thread_time() - started)
            touched = self.touched
            if touched is not None:
                if self._batching:   # noted once readable: the purger reads what it notes
                    self._held_touched.append((touched, tag, transition.writes))
                else:
                    touched.note(tag, transition.writes)
            if transition.tallies:   # what apply did, for GET /metrics (runtime/metrics.py)
                self._applied_counts.add(transition.tallies)
            if tag in ("fire", "fire_many") and transition.result.get("node") == self._node_id:
                self._note_arming_lead(transition.effects)
            self._log_refusal(index, tag or "malformed", transition.result)
            if tag in ("renew", "renew_recorded") and transition.effects:
                # This node's shard lease counts from here, not from when the
                # loop gets to the effect (runtime/coordinator.py).
                self._renewal_applied(transition.effects)
            if tag == "check_digest":
                self._commit_batch()   # the digest is of the state committed as of `index`
                return self._record_digest(index, transition.result)
        except InvariantBroken as exc:
            self._die(f"raft entry {index}: {exc}")
        except Exception as exc:
            self._die(f"raft entry {index}: apply failed: {exc!r}")
        if transition.effects:
            if self._batching:
                self._held_effects.append(transition.effects)
            else:
                assert self.loop is not None
                self.loop.call_soon_threadsafe(self.effects.deliver, transition.effects)
        if self._batching:
            if time.monotonic() >= self._batch_until:
                self._commit_batch()
            else:
                self._uncommitted = True
        return transition.result

    def after_commit(self, settle: Callable[[], None]) -> None:
        """Raft thread: call `settle` (the result of an entry just applied, for
        its proposer) once that entry is committed: at once if it is."""
        if self._uncommitted:
            self._held_results.append(settle)
        else:
            settle()

    def begin_batch(self) -> None:
        """Raft thread, before a tick's entries: they are committed together
        (LmdbStore.begin_batch) at end_batch, or once they have taken
        apply_batch_max_s, and their effects delivered and their results
        settled (after_commit) then, in order, so that nothing acts on an
        entry, nor answers it, before its writes can be read."""
        self._batching = True
        self._batch_until = time.monotonic() + limits.apply_batch_max_s
        self._store.begin_batch()

    def end_batch(self) -> None:
        """Raft thread, after the tick's entries: commit them and deliver
        their effects. A failed commit stops the node, as a failed apply does."""
        self._batching = False
        self._commit_batch()

    def _commit_batch(self) -> None:
        try:
            self._store.end_batch()
        except Exception as exc:
            self._die(f"the commit of applied entries failed: {exc!r}")
        if self._batching:
            self._batch_until = time.monotonic() + limits.apply_batch_max_s
            self._store.begin_batch()
        touched, self._held_touched = self._held_touched, []
        for watch, tag, writes in touched:
            watch.note(tag, writes)
        self._uncommitted = False
        held, self._held_effects = self._held_effects, []
        if held:
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self._deliver_each, held)
        results, self._held_results = self._held_results, []
        for settle in results:
            settle()

    def _deliver_each(self, held: list[tuple]) -> None:
        """Loop: each entry's effects, entry by entry, as applied."""
        for effects in held:
            self.effects.deliver(effects)

    def _apply_noting(self, data: bytes, index: int) -> Callable[[Any], tuple]:
        def apply_one(view: Any) -> tuple:
            tag, transition = apply_entry(view, data, index)
            if tag == "check_digest":
                # Noted before the index is committed, so a reader that sees
                # the index applied also sees that a digest is on its way.
                self._note_digest(index, DIGEST_PENDING)
            return tag, transition
        return apply_one

    def _note_apply_time(self, index: int, tag: str | None, cpu_s: float) -> None:
        """Raft thread: the longest apply since start (CPU of this thread, so
        a busy machine does not inflate it), for GET /v1/node; an entry over
        apply_entry_slow_s is logged, as it delays every heartbeat behind it."""
        if cpu_s > self.apply_entry_s_max:
            self.apply_entry_s_max, self.apply_entry_slowest = cpu_s, tag or "malformed"
        if cpu_s > limits.apply_entry_slow_s:
            log.warning("raft entry %d (%s) took %.0f ms of CPU to apply, over "
                        "apply_entry_slow_s (%.0f ms): every replica's Raft thread sent no "
                        "heartbeat meanwhile", index, tag or "malformed", cpu_s * 1000,
                        limits.apply_entry_slow_s * 1000)

    def _note_arming_lead(self, effects: tuple) -> None:
        """Raft thread, right after this node's own fire became durable here:
        each run it queued was armed this long before it is due (0 when the
        fire came at or after it; runtime/lateness.py). How late the call
        then was is the dispatcher's to record (trigger_lateness)."""
        now = self._now_ms()
        for effect in effects:
            if isinstance(effect, RunQueued) and effect.run["attempt"] == 1:
                # A jittered job's run is due at its occurrence plus its delay.
                lead = effect.run["scheduled_ms"] + effect.run.get("jitter_ms", 0) - now
                self._arming_lead.record(max(0, lead))

    @staticmethod
    def _log_refusal(index: int, tag: str, result: dict) -> None:
        """Once per refused entry, on every replica."""
        error = result.get("error")
        if error == "apply_failed":
            log.critical("raft entry %d (%s): apply raised, which is a bug; the entry is "
                         "refused on every replica: %s\n%s", index, tag, result["detail"],
                         result.get("traceback", ""))
        elif error in ("invalid_command", "refused"):
            log.error("raft entry %d (%s) refused (%s): %s", index, tag, error,
                      result["detail"])

    def _record_digest(self, index: int, result: dict) -> dict:
        """Raft thread: the state is exactly as of `index` here, on every replica.
        It is pinned here and hashed on the digest thread: hashing millions of
        records on the Raft thread would hold it past the election timeout."""
        pinned = self._store.pin()
        assert pinned.applied_index == index, (pinned.applied_index, index)
        try:
            self._digest_queue.put_nowait((index, pinned))
        except queue.Full:
            pinned.close()
            self._note_digest(index, None)
            log.warning("digest check at index %d skipped: %d digests are being computed",
                        index, limits.digests_computing_max)
        return dict(result, index=index)

    def _note_digest(self, index: int, value: str | None) -> None:
        """Record (None: forget) the digest at `index`; any thread."""
        with self._digests_lock:
            if value is None:
                self.checked_digests.pop(index, None)
                return
            if value != DIGEST_PENDING and index not in self.checked_digests:
                return   # evicted while it was computed
            self.checked_digests[index] = value
            while len(self.checked_digests) > limits.checked_digests_kept:
                self.checked_digests.popitem(last=False)

    def _digest_worker(self) -> None:
        """The digest thread: hash pinned states, one at a time, forever."""
        while True:
            index, pinned = self._digest_queue.get()
            value = None
            try:
                with pinned:
                    value = digest_pinned(pinned)[1]
            except SnapshotAborted:
                log.info("digest check at index %d passed over by a snapshot install", index)
            except Exception:
                log.exception("digest check at index %d failed", index)
            self._note_digest(index, value)

    async def digest_at(self, index: int, timeout_s: float) -> str | None:
        """The digest this node recorded at the check_digest entry `index`,
        waiting (at most timeout_s) until it applied and hashed it; None if it
        has none there (not such an entry, evicted, or passed over). Raises
        Unavailable if it is still being computed at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            applied = self._store.applied_index() >= index   # read first: see on_apply
            with self._digests_lock:
                value = self.checked_digests.get(index)
            if value is not None and value != DIGEST_PENDING:
                return value
            if applied and value is None:
                return None
            if time.monotonic() > deadline:
                if value == DIGEST_PENDING:
                    raise Unavailable(f"the digest at index {index} is still being computed "
                                      "here; ask again", reason="digest_pending")
                return None
            await asyncio.sleep(limits.digest_wait_poll_s)

    def _die(self, why: str) -> None:
        # Applying the rest of the log after a failed entry would make this
        # replica diverge silently; stopping is the only safe answer.
        log.critical("stopping node %s: %s", self._node_id, why, exc_info=True)
        logging.shutdown()
        os._exit(EXIT_INVARIANT)

    def snapshot_pin(self) -> PinnedRead:
        """Raft thread: the state a snapshot is written from, exactly as applied
        so far. Its applied_index may be below pysyncobj's last applied index
        (the entries in between were Raft no-ops, which change no state), or
        above it while this node replays its journal after a restart (the
        state was persisted further than pysyncobj's journal position). Both
        are safe: whoever loads the snapshot skips the journal entries at or
        below the state's applied_index (on_apply), and those entries are
        committed, so the same on every node."""
        return self._store.pin()

    def snapshot_install(self, path: str, offset: int, length: int,
                         applied_index: int) -> bool:
        """Raft thread: install a snapshot's LMDB image (at start: this node's
        own snapshot; later: one the leader sent), unless the state here is at
        least as new (at start, LMDB is usually ahead of its own snapshot).
        Whether it installed."""
        if applied_index <= self._store.applied_index():
            log.info("keeping the state at applied_index %d; the snapshot is at %d",
                     self._store.applied_index(), applied_index)
            return False
        log.info("installing a snapshot at applied_index %d (%d bytes)", applied_index, length)
        started = time.monotonic()
        installed = self._store.install_image(path, offset, length)
        if installed != applied_index:
            raise InvariantBroken(f"the snapshot's image is at applied_index {installed}, its "
                                  f"header says {applied_index}")
        log.info("installed the snapshot at applied_index %d in %.2f s", applied_index,
                 time.monotonic() - started)
        self._after_install()
        return True

    def snapshot_install_items(self, applied_index: int, items: list) -> bool:
        """Raft thread: a snapshot written by an earlier release (a list of records)."""
        if applied_index <= self._store.applied_index():
            return False
        log.info("installing a snapshot at applied_index %d (%d records)",
                 applied_index, len(items))
        self._store.replace_all(applied_index, [tuple(item) for item in items])
        self._after_install()
        return True

    def _after_install(self) -> None:
        """The whole state changed at once: what acts on effects looks again."""
        touched = self.touched
        if touched is not None:
            touched.overflow = True
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.effects.deliver, (SnapshotInstalled(),))
