"""The msgpack adapter: the one module that imports msgpack.

Every replicated command and every persisted record is a msgpack map with a
`v` (version) member. Encoding is deterministic for the same input (maps keep
insertion order), which the state digest relies on.
"""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec

# Untyped: maps, lists and scalars, as msgpack's unpacker gives them.
_RECORDS = msgspec.msgpack.Decoder()
_ENCODER = msgspec.msgpack.Encoder()


def pack(value: Any) -> bytes:
    """`value` as msgpack: the bytes msgpack's packer writes
    (`packb(value, use_bin_type=True)`: the smallest form of each integer,
    floats as float64, str and bin types apart), made by msgspec's encoder in
    about a quarter of the time (tests/test_codec.py holds them equal). The
    values given are maps, lists, tuples and scalars; a set, which msgspec
    would write in its own (per-process) order, is never one of them."""
    return _ENCODER.encode(value)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def unpack_record(data: bytes) -> Any:
    """A stored record: what `pack` wrote from a value apply built (its
    depth bounded by the checks before it), decoded by msgspec's decoder,
    about twice as fast as msgpack's unpacker and equal in what it gives.
    Raft log entries keep `unpack`, whose fixed stack judges a hostile
    entry's nesting alike on every replica (core/commands.py _decode_flat)."""
    return _RECORDS.decode(data)
