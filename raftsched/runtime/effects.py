"""What an applied entry did, handed to the parts of the node that act on it.

apply (core/apply.py) returns effects beside its writes: a run queued here,
a run cancelled, a shard that changed owner, a topic appended to, a renewal.
The apply bridge (runtime/apply_bridge.py) hands them, on the event loop, to
this bus, and the bus to the handlers subscribed to each effect's type, in
the order apply made them and, for one effect, in the order of subscription.
runtime/node.py subscribes each loop's handlers where it builds the loops, so
no loop reaches another through the node.

A handler may also ask to be called once after all the effects of one entry
were handed out (`after=`), for work that is best done once per entry (the
dispatcher's runs of shards lost, say).

Handlers run on the event loop and must not block; one that raises is
logged with the effect and the others still get theirs (apply has committed
the entry: what is not acted on here is picked up by the loops' own passes,
which rescan the state).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

log = logging.getLogger("raftsched.node")


@dataclasses.dataclass(frozen=True)
class SnapshotInstalled:
    """Not apply's: this node's whole state was replaced by a snapshot, so
    whatever acts on effects looks at the state again."""


class Effects:
    def __init__(self) -> None:
        self._handlers: dict[type, list[Callable[[Any], None]]] = {}
        self._after: dict[type, list[Callable[[], None]]] = {}
        self.failed_total = 0

    def subscribe(self, kind: type, handler: Callable[[Any], None], *,
                  after: Callable[[], None] | None = None) -> None:
        """Call `handler(effect)` for every effect of type `kind`, and
        `after()` once after an entry's effects if any was of that type."""
        self._handlers.setdefault(kind, []).append(handler)
        if after is not None:
            self._after.setdefault(kind, []).append(after)

    def kinds(self) -> set[type]:
        """The effect types something acts on."""
        return set(self._handlers)

    def deliver(self, effects: tuple) -> None:
        """The effects of one applied entry, in apply's order."""
        seen: set[type] = set()
        for effect in effects:
            kind = type(effect)
            seen.add(kind)
            for handler in self._handlers.get(kind, ()):
                self._call(handler, effect)
        for kind in seen:
            for after in self._after.get(kind, ()):
                self._call(after)

    def _call(self, handler: Callable, *effect: Any) -> None:
        try:
            handler(*effect)
        except Exception:
            self.failed_total += 1
            log.exception("acting on an applied entry's effect failed (%s%s); the loops' "
                          "next passes rescan the state",
                          getattr(handler, "__qualname__", handler),
                          f" on {effect[0]!r}" if effect else ", after an entry's effects")
