"""core/codec.py: records are packed by msgspec's encoder into the very bytes
msgpack's packer writes, so a state written by an earlier build (packed by
msgpack) and its digest read the same, and every replica stores the same bytes."""

import math

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import codec
from raftsched.testing.proptest import examples

_SCALARS = (st.none() | st.booleans()
            | st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1)
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.text() | st.binary())
# Integers at each boundary of msgpack's forms, where a packer picks its width.
_EDGES = [0, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, 2 ** 63,
          2 ** 64 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2 ** 31), -(2 ** 31) - 1,
          -(2 ** 63)]
_VALUES = st.recursive(
    _SCALARS | st.sampled_from(_EDGES),
    lambda inner: (st.lists(inner, max_size=6)
                   | st.lists(inner, max_size=6).map(tuple)
                   | st.dictionaries(st.text(max_size=8) | st.integers(-300, 300), inner,
                                     max_size=6)),
    max_leaves=40)


def _packb(value):
    return msgpack.packb(value, use_bin_type=True)


@settings(max_examples=examples(800))
@given(_VALUES)
def test_pack_writes_the_bytes_msgpack_writes(value):
    assert codec.pack(value) == _packb(value)


def test_pack_writes_each_width_as_msgpack_does():
    long_texts = ["x" * n for n in (31, 32, 255, 256, 65535, 65536)]
    long_bytes = [b"y" * n for n in (255, 256, 65535, 65536)]
    many = [list(range(n)) for n in (15, 16, 65535, 65536)]
    maps = [{str(i): i for i in range(n)} for n in (15, 16, 65536)]
    for value in (*_EDGES, *long_texts, *long_bytes, *many, *maps,
                  math.nan, -math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324):
        assert codec.pack(value) == _packb(value), repr(value)[:60]


@settings(max_examples=examples(300))
@given(_VALUES)
def test_a_packed_record_reads_back(value):
    def plain(v):   # what msgpack gives back: tuples as lists
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    read = codec.unpack_record(codec.pack(value))
    # NaN is not equal to itself: compare the bytes the two write.
    assert _packb(read) == _packb(plain(value))
