"""The one check of a caller's bounded number: its type, its range, and the
error that names the field and the limit.

Every integer or number a request, a command or a flag gives with a bound goes
through `bounded_int` or `bounded_float`, so the rules are the same everywhere:
a bool is not a number (JSON's `true` is not 1), NaN and the infinities are
refused (a NaN compares false with every bound, so a range check alone would
let it through on one side), and the error is InvalidInput with `field=` (the
dotted path of the member) and `limit=` (the name in raftsched/limits.py a
caller may look up), with a `detail` that states the range.
"""

from __future__ import annotations

import math

from raftsched.errors import InvalidInput


def bounded_int(value: object, field: str, lo: int, hi: int, *,
                limit: str | None = None) -> int:
    """`value` if it is an int (not a bool) with lo <= value <= hi; else InvalidInput."""
    reason = refusal(value, lo, hi, integral=True)
    if reason is not None:
        raise InvalidInput(f"`{field}` {reason}", field=field, limit=limit)
    return value   # type: ignore[return-value]


def bounded_float(value: object, field: str, lo: float, hi: float, *,
                  limit: str | None = None, unit: str = "") -> float:
    """`value` as a float if it is an int or a finite float (not a bool) with
    lo <= value <= hi; else InvalidInput. `unit` ("seconds") names what the
    number counts in the error's detail."""
    reason = refusal(value, lo, hi, integral=False, unit=unit)
    if reason is not None:
        raise InvalidInput(f"`{field}` {reason}", field=field, limit=limit)
    return float(value)   # type: ignore[arg-type]


def refusal(value: object, lo: float, hi: float, *, integral: bool,
            unit: str = "") -> str | None:
    """None if `value` is a number in [lo, hi] (an int when `integral`, else
    an int or a finite float; never a bool), else why not, as the end of a
    sentence ("must be an integer from 1 to 10"). The one judgement behind
    bounded_int, bounded_float and the command shapes (core/shape.py)."""
    assert lo <= hi, (lo, hi)
    kinds = (int,) if integral else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value)
    if ok and lo <= value <= hi:   # type: ignore[operator]
        return None
    noun = "an integer" if integral else f"a number of {unit}" if unit else "a number"
    return f"must be {noun} from {_text(lo)} to {_text(hi)}"


def _text(bound: float) -> str:
    """A bound as a person reads it: 3600 and 0.1, not 3600.0."""
    if isinstance(bound, float) and bound.is_integer():
        return str(int(bound))
    return str(bound)
