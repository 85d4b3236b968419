"""raftsched: a distributed job scheduler on a Raft-replicated state machine."""

__version__ = "0.1.0"
