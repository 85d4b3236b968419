"""Every log line raftsched writes at WARNING or above is in the table of docs/operations.md that says what it asks the operator to do."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import raftsched

PACKAGE = Path(raftsched.__file__).resolve().parent
DOC = PACKAGE.parent / "docs" / "operations.md"
LEVELS = {"warning", "error", "critical", "exception"}
# The test harness (local clusters, chaos, benchmarks) is not run by operators.
EXCLUDED_DIRS = ("testing",)
# A message is identified by its start: enough to tell the lines apart and to
# find them in a log, short enough for a table cell.
PREFIX_CHARS = 60
_CONVERSION = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[sdrifgxX]")


def _text(node: ast.expr) -> str | None:
    """A log call's message with each substituted value shown as `…`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _CONVERSION.sub("…", node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_CONVERSION.sub("…", part.value) if isinstance(part, ast.Constant)
                       else "…" for part in node.values)
    return None


def message_prefix(message: str) -> str:
    """The message, or its first PREFIX_CHARS characters cut back to a whole word."""
    if len(message) <= PREFIX_CHARS:
        return message
    return message[:PREFIX_CHARS].rsplit(" ", 1)[0].rstrip(" ,;:(")


def warning_messages(source: str) -> list[str]:
    """The messages of `log.warning/error/critical/exception(...)` calls in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in LEVELS and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in ("log", "logger", "logging") and node.args:
            text = _text(node.args[0])
            assert text is not None, f"line {node.lineno}: a log message that is not a literal"
            found.append(text)
    return found


def all_messages() -> dict[str, str]:
    """prefix -> module, for the whole package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] in EXCLUDED_DIRS:
            continue
        for message in warning_messages(path.read_text()):
            out[message_prefix(message)] = rel
    return out


def _log_table() -> str:
    text = DOC.read_text()
    start = text.index("## Log lines at WARNING and above")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_every_warning_and_error_line_is_in_the_operations_table():
    table = _log_table()
    missing = [f"{module}: {prefix}" for prefix, module in all_messages().items()
               if f"`{prefix}" not in table]
    assert not missing, ("add these log lines to docs/operations.md, \"Log lines at WARNING "
                         "and above\", with what each asks the operator to do:\n"
                         + "\n".join(missing))


def test_the_extraction_sees_every_form_of_call():
    source = ('log.warning("run %s attempt %d: lease lost", r, a)\n'
              'log.info("not this one")\n'
              'def f():\n    log.exception(f"snapshot {x} failed")\n'
              'log.error("a" "b %.2f s", 1)\n')
    assert sorted(warning_messages(source)) == ["ab … s", "run … attempt …: lease lost",
                                                "snapshot … failed"]
    assert len(all_messages()) > 40
