"""One replica of the state machine in memory, for tests of the pure core:
commands go through encode/decode and apply, then commit, as on a node."""

from __future__ import annotations

from raftsched.core import commands
from raftsched.core.apply import apply_entry
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
