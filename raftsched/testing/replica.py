"""One replica of the state machine in memory, for tests of the pure core:
commands go through encode/decode and apply, then commit, as on a node."""

from __future__ import annotations

from typing import Callable

from raftsched.core import commands
from raftsched.core.apply import JOBS, RUNS, apply_entry
from raftsched.runtime.context import Replicated
from raftsched.storage.memory_store import MemoryStore


class Replica:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.index = 0
        self.effects: list = []
        # What a node's apply notes for its purger while it leads
        # (runtime/purger.py Touched), or None.
        self.touched = None

    def run(self, command: dict) -> dict:
        return self.run_entry(commands.encode(command))

    def run_entry(self, data: bytes) -> dict:
        """Apply one raw log entry, well-formed or not, as a node does."""
        self.index += 1
        tag, transition = apply_entry(self.store, data, self.index)
        self.store.commit(transition, self.index)
        if self.touched is not None:
            self.touched.note(tag, transition.writes)
        self.effects.extend(transition.effects)
        return transition.result

    def replicated(self, *, node_id: str = "n1", now_ms: Callable[[], int] = lambda: 0,
                   is_leader: Callable[[], bool] = lambda: True) -> Replicated:
        """What a loop is given (runtime/context.py), over this replica: what
        it proposes is applied here at once."""
        async def propose(command: dict, wait_max_s: float | None = None) -> dict:
            return self.run(command)
        return Replicated(node_id=node_id, store=self.store, propose=propose, now_ms=now_ms,
                          is_leader=is_leader)

    async def propose_entry(self, data: bytes) -> dict:
        """An encoded command proposed, as a loop that proposes raw entries does."""
        return self.run_entry(data)

    def get_run(self, run_id: str) -> dict:
        return self.store.get(RUNS, run_id.encode())

    def job(self, job_id: str = "job_a1") -> dict:
        return self.store.get(JOBS, job_id.encode())


async def no_call(method: str, url: str, headers: dict, body: bytes | None,
                  timeout_s: float) -> None:
    """An HTTP send for loops given one that a test expects never to call
    (a reaper with no alerts to deliver)."""
    raise AssertionError(f"unexpected call: {method} {url}")


# A spec's schedule and HTTP target as the validators store them, for
# tests that build commands by hand.
EVERY_2S = {"kind": "every", "every_ms": 2000, "text": "2s"}
HTTP = {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST", "headers": {},
        "body": None, "timeout_s": 5.0}
