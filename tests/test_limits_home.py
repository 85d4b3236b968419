"""Every limit lives in raftsched/limits.py: a numeric module constant or parameter default named like a bound elsewhere fails here unless allowlisted with its reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import raftsched

PACKAGE = Path(raftsched.__file__).resolve().parent

# Names that say "bound, period, timeout or size": what limits.py holds.
LIMIT_NAME = re.compile(r"(_s|_ms|_us|_ns|_max|_min|_bytes|_default|_period|_timeout|_kept"
                        r"|_every|_factor|_ratio|_ppm|_chunk|_size|_limit|_count|_rows|_records)$"
                        r"|(^|_)(max|min|timeout|period|bytes|limit|chunk)(_|$)", re.IGNORECASE)

# (module, name): why it is not a limit, or why it cannot live in limits.py.
ALLOWED = {
    ("core/shape.py", "_MSGPACK_INT_MIN"): "msgpack's own integer range, a fact of the format",
    ("core/shape.py", "_MSGPACK_INT_MAX"): "msgpack's own integer range, a fact of the format",
    ("core/schedule.py", "_LOOKBACK_MS"): "the steps of the look-back search, not a bound "
                                          "(the bound is limits.schedule_walk_steps_max)",
    ("replication/raft.py", "_STORED_MAX"): "a stored deflate block's length field is 16 "
                                            "bits (RFC 1951), a fact of the format",
    ("executors/command_shim.py", "parent_poll_s"): "the shim runs isolated (python -I -S), "
                                                    "stdlib only: it cannot import raftsched",
}
# The test harness (local clusters, chaos, benchmarks) sets its own scenario
# sizes and timings; they bound no node.
EXCLUDED_DIRS = ("testing",)


def _numeric(node: ast.expr) -> bool:
    """A number, or arithmetic or a tuple made only of numbers."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_numeric(e) for e in node.elts)
    return False


def limit_like_constants(source: str) -> list[str]:
    """Module-level names assigned a numeric value and named like a limit."""
    found = []
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        for target in targets:
            pairs = [(target, value)]
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                    and len(target.elts) == len(value.elts):
                pairs = list(zip(target.elts, value.elts))   # A_MIN, A_MAX = 1, 2
            for name, one in pairs:
                if isinstance(name, ast.Name) and _numeric(one) and LIMIT_NAME.search(name.id):
                    found.append(name.id)
    return found


# (module, function, parameter): why its numeric default is not a limit.
ALLOWED_DEFAULTS = {
}


def limit_like_defaults(source: str) -> list[tuple[str, str]]:
    """(function, parameter) of numeric parameter defaults named like a limit:
    a bound written into a signature rather than taken from limits.py."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        found += [(node.name, arg.arg) for arg, default in pairs
                  if _numeric(default) and LIMIT_NAME.search(arg.arg)]
    return found


def test_no_limit_like_parameter_default_outside_limits_py():
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "limits.py" or rel.split("/")[0] in EXCLUDED_DIRS:
            continue
        stray += [f"{rel}: {fn}({arg}=...)" for fn, arg in limit_like_defaults(path.read_text())
                  if (rel, fn, arg) not in ALLOWED_DEFAULTS]
    assert not stray, "take these defaults from raftsched/limits.py: " + ", ".join(stray)
    assert limit_like_defaults("def f(a, hosts_max: int = 10, *, wait_s=2.5, n=3): pass") \
        == [("f", "hosts_max"), ("f", "wait_s")]


def test_no_limit_like_constant_outside_limits_py():
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "limits.py" or rel.split("/")[0] in EXCLUDED_DIRS:
            continue
        for name in limit_like_constants(path.read_text()):
            if (rel, name) not in ALLOWED:
                stray.append(f"{rel}: {name}")
    assert not stray, ("move these into raftsched/limits.py with a comment saying why and "
                       "their unit, or allowlist them here with the reason: " + ", ".join(stray))


def test_every_allowlisted_constant_still_exists():
    for (rel, name), reason in ALLOWED.items():
        assert reason
        assert name in limit_like_constants((PACKAGE / rel).read_text()), (rel, name)


def test_the_scan_finds_what_it_looks_for():
    source = ("a_timeout_s = 5\nB_MAX = 2 ** 10\nanswer = 3\nNAMES_MAX = ('x',)\n"
              "flag_max = True\nwindows_ms = (1, 2)\nclass C:\n    inner_s = 1\n"
              "LO_MIN, HI = 1, 2\n")
    assert limit_like_constants(source) == ["a_timeout_s", "B_MAX", "windows_ms", "LO_MIN"]
