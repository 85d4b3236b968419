"""One replica of the state machine in memory, for tests of the pure core:
commands go through encode/decode and apply, then commit, as on a node."""

from __future__ import annotations

from raftsched.core import commands
from raftsched.core.apply import JOBS, RUNS, apply_entry
from raftsched.storage.memory_store import MemoryStore


class Replica:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.index = 0
        self.effects: list = []

    def run(self, command: dict) -> dict:
        return self.run_entry(commands.encode(command))

    def run_entry(self, data: bytes) -> dict:
        """Apply one raw log entry, well-formed or not, as a node does."""
        self.index += 1
        _, transition = apply_entry(self.store, data, self.index)
        self.store.commit(transition, self.index)
        self.effects.extend(transition.effects)
        return transition.result

    def get_run(self, run_id: str) -> dict:
        return self.store.get(RUNS, run_id.encode())

    def job(self, job_id: str = "job_a1") -> dict:
        return self.store.get(JOBS, job_id.encode())


# A spec's schedule and HTTP target as the validators store them, for
# tests that build commands by hand.
EVERY_2S = {"kind": "every", "every_ms": 2000, "text": "2s"}
HTTP = {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST", "headers": {},
        "body": None, "timeout_s": 5.0}
