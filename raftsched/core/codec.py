"""The msgpack adapter: the one module that imports msgpack.

Every replicated command and every persisted record is a msgpack map with a
`v` (version) member. Encoding is deterministic for the same input (maps keep
insertion order), which the state digest relies on.
"""

from __future__ import annotations

from typing import Any

import msgpack


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)
