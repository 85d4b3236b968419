"""Secrets are write-only: what reads, run output, errors and alerts show of them.

A job's secrets are the values of its HTTP target's `Authorization`, `Cookie`
and `Proxy-Authorization` headers (in any case), the password of its URL
(`https://user:password@host/`), and the value of each header, URL query
parameter or env variable its `secret_keys` names; a DAG job's, those of every
task's target. Header and query parameter names compare case-insensitively (as
HTTP compares header names; `?Token=` and `?token=` are both a token); env
names compare exactly, as the process environment does (`TOKEN` and `token`
are two variables).

The stored spec keeps the real values, since the executor sends them. What a
caller can read does not:

- a job read shows MASK in place of each secret value (redact_target);
- an attempt's output and error have every occurrence of a secret value of at
  least `limits.secret_redact_chars_min` characters replaced by MASK
  (redact_text, redact_output): a shorter value would mask ordinary text
  everywhere, and by where it did, tell what the value is;
- a write that gives MASK as a secret's value keeps the stored value
  (restore_secrets), so reading a job, changing it and writing it back never
  replaces a secret with the mask; it keeps it only where it was sent (the
  same origin for an HTTP target, the same queue for a command, the same
  header, parameter, password or env name), never for a name the write takes
  out of secret_keys, and a write of secret_keys alone may not un-list a
  stored secret (unlisted_secrets): once stored, a secret is never shown.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Iterable

from raftsched import limits
from raftsched.errors import InvalidInput

MASK = "***"
ALWAYS_SECRET_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
# The member of a target that holds named values a job may keep secret.
SECRET_MEMBERS = {"http": "headers", "command": "env"}
# Headers whose value is "<scheme> <credentials>": the credentials alone are a secret too.
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization"})
# How raftsched marks text it cut to a bound (executors/command.py, executors/http.py,
# executors/base.py short_error): a secret may end cut short right before it.
_CUT_NOTICE = "\n[raftsched: "
_CUT_ELLIPSIS = "…"
# The members of an attempt's output that hold text a target or command wrote.
OUTPUT_TEXTS = frozenset({"stdout", "stderr", "http_body", "published"})


def is_secret(kind: str, name: str, secret_keys: Iterable[str]) -> bool:
    """Whether a target of type `kind` keeps the value named `name` secret."""
    if kind == "http":
        lowered = name.lower()
        return lowered in ALWAYS_SECRET_HEADERS or any(k.lower() == lowered for k in secret_keys)
    if kind == "command":
        return name in secret_keys
    return False


def _named_values(target: dict) -> tuple[str | None, dict]:
    member = SECRET_MEMBERS.get(target.get("type", ""))
    values = target.get(member) if member else None
    return member, values if isinstance(values, dict) else {}


def redact_target(target: dict, secret_keys: Iterable[str]) -> dict:
    """A copy of `target` with MASK for every secret value."""
    keys = list(secret_keys)
    if target.get("type") == "http" and isinstance(target.get("url"), str):
        target = dict(target, url=redact_url(target["url"], keys))
    member, values = _named_values(target)
    if not values:
        return target
    kind = target["type"]
    return dict(target, **{member: {name: MASK if is_secret(kind, name, keys) else value
                                    for name, value in values.items()}})


# --- secrets inside an HTTP target's URL ---------------------------------------------------

def _url_parts(url: str) -> tuple[str, str | None, str, list[str], str] | None:
    """(before the userinfo, the password as written or None, from the host to
    the query, the query's name=value pairs, from the fragment on), or None
    for a URL without an authority. Every other character is kept as written,
    so a URL with nothing secret in it comes back unchanged."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    authority_end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    authority, tail = rest[:authority_end], rest[authority_end:]
    userinfo, at, hostport = authority.rpartition("@")
    user, colon, password = userinfo.partition(":")
    head = f"{scheme}://{user}{colon}" if at and colon else f"{scheme}://{userinfo}{at}"
    host = f"@{hostport}" if at and colon else hostport
    path, hash_, fragment = tail.partition("#")
    path, qmark, query = path.partition("?")
    pairs = query.split("&") if qmark else []
    return head, password if at and colon else None, host + path + qmark, pairs, hash_ + fragment


def _query_name(pair: str) -> str:
    return urllib.parse.unquote_plus(pair.partition("=")[0]).lower()


def _is_secret_param(pair: str, lowered_keys: set[str]) -> bool:
    return "=" in pair and _query_name(pair) in lowered_keys


def _join_url(head: str, password: str | None, host: str, pairs: list[str], end: str) -> str:
    return head + (password or "") + host + "&".join(pairs) + end


def redact_url(url: str, secret_keys: Iterable[str]) -> str:
    """`url` with MASK for its password and for the value of each query
    parameter `secret_keys` names."""
    parts = _url_parts(url)
    if parts is None:
        return url
    head, password, host, pairs, end = parts
    lowered = {k.lower() for k in secret_keys}
    pairs = [pair.partition("=")[0] + "=" + MASK if _is_secret_param(pair, lowered) else pair
             for pair in pairs]
    return _join_url(head, MASK if password is not None else None, host, pairs, end)


def url_secrets(url: str, secret_keys: Iterable[str]) -> list[str]:
    """The secret pieces of `url` as written and percent-decoded."""
    parts = _url_parts(url)
    if parts is None:
        return []
    _, password, _, pairs, _ = parts
    lowered = {k.lower() for k in secret_keys}
    raw = [password] if password else []
    raw += [pair.partition("=")[2] for pair in pairs if _is_secret_param(pair, lowered)]
    return [form for value in raw
            for form in {value, urllib.parse.unquote(value), urllib.parse.unquote_plus(value)}
            if form]


def _restore_url(url: str, stored_url: str | None, keys: _Keys) -> str:
    """`url` with each MASK in a secret place (the password, a secret query
    parameter's value) replaced by the stored URL's value in the same place,
    as long as the URL's origin is the stored one's."""
    if MASK not in url:
        return url
    parts = _url_parts(url)
    if parts is None:
        return url
    head, password, host, pairs, end = parts
    stored = _url_parts(stored_url) if stored_url else None
    if password == MASK:
        password = stored[1] if stored else None
        if password is None:
            raise InvalidInput(f'"{MASK}" is what reads show for a URL\'s password; this job '
                               "has no stored password to keep, so give the password itself",
                               field="target.url")
        _check_same_origin(url, stored_url, "the URL's password", "target.url")
    restored = []
    for pair in pairs:
        if "=" in pair and pair.partition("=")[2] == MASK:
            pair = _restore_param(pair, stored, keys, url, stored_url)
        restored.append(pair)
    return _join_url(head, password, host, restored, end)


def _restore_param(pair: str, stored: tuple | None, keys: _Keys, url: str,
                   stored_url: str | None) -> str:
    name = _query_name(pair)
    if not keys.secret_after("http", name):
        if keys.secret_before("http", name):
            raise _unlisted(name, "target.url")
        return pair   # MASK is an ordinary value of a parameter that is not secret
    kept = next((p.partition("=")[2] for p in (stored[3] if stored else ())
                 if _is_secret_param(p, {name})), None)
    if kept is None:
        raise InvalidInput(f'"{MASK}" is what reads show for a secret; this job has no '
                           f"stored value of the query parameter {name!r} to keep, so "
                           "give the value itself", field="target.url")
    _check_same_origin(url, stored_url, f"the query parameter {name!r}", "target.url")
    return pair.partition("=")[0] + "=" + kept


def url_origin(url: str | None) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port made explicit; None for
    anything else. Where a kept secret may go: the same origin only."""
    if not isinstance(url, str):
        return None
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not host:
        return None
    return scheme, host.lower(), port if port is not None else (443 if scheme == "https" else 80)


def _check_same_origin(url: object, stored_url: object, what: str, field: str) -> None:
    origin, stored = url_origin(url), url_origin(stored_url)
    if origin is None:
        return   # not an http(s) URL with a host: the target's validator refuses it
    if origin != stored:
        where = "{}://{}:{}".format(*stored) if stored else "nowhere"
        raise InvalidInput(f'"{MASK}" keeps the stored value of {what} only where it is '
                           f"sent now ({where}); this change sends the target elsewhere, so "
                           "give the value itself", field=field)


def _unlisted(name: str, field: str) -> InvalidInput:
    return InvalidInput(f'"{MASK}" stands for the stored value of {name!r}, which this change '
                        "takes out of `secret_keys`: a secret stays write-only, so give the "
                        "value itself (or keep the name in `secret_keys`)", field=field)


class _Keys:
    """The secret_keys before a write (the stored spec's; none for a create)
    and after it: MASK keeps a value secret after; for one secret only before,
    it would reveal the stored value, so it is refused."""

    def __init__(self, after: Iterable[str], before: Iterable[str]) -> None:
        self.after, self.before = list(after), list(before)

    def secret_after(self, kind: str, name: str) -> bool:
        return is_secret(kind, name, self.after)

    def secret_before(self, kind: str, name: str) -> bool:
        return is_secret(kind, name, self.before)


def unlisted_secrets(spec: dict, secret_keys: Iterable[str]) -> list[str]:
    """The names of the stored spec's secret values (headers, query parameters,
    env variables) that `secret_keys` would no longer keep secret: a change of
    secret_keys alone that un-lists one of them would show its value."""
    keys = _Keys(secret_keys, spec.get("secret_keys") or ())
    found = []
    for target in spec_targets(spec):
        kind = target.get("type", "")
        names = list(_named_values(target)[1])
        if kind == "http" and isinstance(target.get("url"), str):
            parts = _url_parts(target["url"])
            names += [_query_name(p) for p in (parts[3] if parts else ()) if "=" in p]
        found += [n for n in names if keys.secret_before(kind, n)
                  and not keys.secret_after(kind, n) and n not in found]
    return found


def redact_spec_target(spec: dict) -> dict | None:
    """The spec's target as a read shows it (None for a DAG job)."""
    if "target" not in spec:
        return None
    return redact_target(spec["target"], spec.get("secret_keys") or ())


def redact_spec_dag(spec: dict) -> dict | None:
    """A DAG job's tasks as a read shows them: each target's secrets masked."""
    if "dag" not in spec:
        return None
    keys = spec.get("secret_keys") or ()
    return {"tasks": [dict(task, target=redact_target(task["target"], keys))
                      for task in spec["dag"]["tasks"]]}


def spec_targets(spec: dict) -> list[dict]:
    """Every target a job calls: its own, or each of its DAG's tasks'."""
    if "dag" in spec:
        return [task["target"] for task in spec["dag"]["tasks"]]
    return [spec.get("target") or {}]


def secret_values(spec: dict) -> tuple[str, ...]:
    """The texts to mask in the output and errors of the job's attempts, longest
    first (so a longer secret is masked whole before a part of it is): each
    secret value, the credentials of an Authorization header without their
    scheme, each cookie value of a Cookie header, and the JSON-escaped form of
    each, all of at least secret_redact_chars_min characters."""
    keys = list(spec.get("secret_keys") or ())
    found: set[str] = set()
    for target in spec_targets(spec):
        _, values = _named_values(target)
        pieces: list[str] = []
        for name, value in values.items():
            if isinstance(value, str) and is_secret(target["type"], name, keys):
                pieces += [value, *_pieces(target["type"], name, value)]
        if target.get("type") == "http" and isinstance(target.get("url"), str):
            pieces += url_secrets(target["url"], keys)
        for piece in pieces:
            piece = piece.strip()
            found.update({piece, json.dumps(piece)[1:-1],
                          json.dumps(piece, ensure_ascii=False)[1:-1]})
    kept = (v for v in found if len(v) >= limits.secret_redact_chars_min)
    return tuple(sorted(kept, key=lambda v: (-len(v), v)))


def _pieces(kind: str, name: str, value: str) -> list[str]:
    if kind != "http":
        return []
    lowered = name.lower()
    if lowered in _CREDENTIAL_HEADERS:
        return value.split(None, 1)[1:]
    if lowered == "cookie":
        return [pair.partition("=")[2] for pair in value.split(";")]
    return []


def redact_text(text: str, values: tuple[str, ...]) -> str:
    """`text` with MASK for every occurrence of each of `values` (secret_values),
    and for the start of one cut short where the text was cut to a bound (at
    its end, before a cut notice or a closing ellipsis)."""
    if not values or not text:
        return text
    for value in values:
        text = text.replace(value, MASK)
    for end in _cut_points(text):
        head = text[:end].rstrip("\ufffd")   # a character cut in two decodes as U+FFFD
        for value in values:
            cut = _cut_secret_chars(head, value)
            if cut:
                text = head[:-cut] + MASK + text[len(head):]
                break
    return text


def _cut_points(text: str) -> list[int]:
    """Where a bound may have cut the text, last first (so masking at one
    leaves the earlier ones where they were)."""
    points = {len(text)}
    notice = text.rfind(_CUT_NOTICE)
    if notice >= 0:
        points.add(notice)
    if text.endswith(_CUT_ELLIPSIS):
        points.add(len(text) - len(_CUT_ELLIPSIS))
    return sorted(points, reverse=True)


def _cut_secret_chars(head: str, value: str) -> int:
    """How many characters at the end of `head` are the start of `value` cut
    short: at least secret_redact_chars_min of them, else 0.

    Linear in len(value) (Knuth-Morris-Pratt), since a job chooses both its
    secrets and its output: trying each place the start could begin costs
    len(value) squared for a value like "aaa…b", about 50 ms at 32 KiB."""
    tail = head[-(len(value) - 1):] if len(value) > 1 else ""
    start = tail.find(value[0]) if value else -1
    if start == -1 or len(tail) - start < limits.secret_redact_chars_min:
        return 0   # the common case, decided without the table
    fallback = _prefix_table(value)
    matched = 0
    for char in tail[start:]:
        while matched and value[matched] != char:
            matched = fallback[matched - 1]
        if value[matched] == char:
            matched += 1
    return matched if matched >= limits.secret_redact_chars_min else 0


def _prefix_table(value: str) -> list[int]:
    """For each i, the length of the longest proper prefix of value[:i + 1]
    that is also its suffix."""
    table = [0] * len(value)
    matched = 0
    for i in range(1, len(value)):
        while matched and value[matched] != value[i]:
            matched = table[matched - 1]
        if value[matched] == value[i]:
            matched += 1
        table[i] = matched
    return table


def redact_output(output: dict, values: tuple[str, ...]) -> dict:
    """An attempt's output (or its stored record) with the secrets masked in
    its texts (OUTPUT_TEXTS); other members as they are."""
    if not values:
        return output
    return {name: redact_text(text, values) if name in OUTPUT_TEXTS and isinstance(text, str)
            else text for name, text in output.items()}


def restore_secrets(target: object, current: dict | None, secret_keys: Iterable[str],
                    keys_before: Iterable[str] = ()) -> object:
    """The target body of a write, with each secret value given as MASK replaced
    by the stored value of the same name (compared as is_secret compares) in
    `current`, the stored target (None for a create). `secret_keys` are the
    job's after the write, `keys_before` the stored job's.

    Raises InvalidInput naming the member when MASK stands for a secret that is
    not stored (MASK is what reads show, never a value to send), for one whose
    name the write takes out of secret_keys (the value would show in reads),
    and for one the write would send elsewhere: to another origin (scheme,
    host, port) for an HTTP target, another queue for a command. Anything that
    is not a well-formed target is returned as it is, for the validators to
    refuse.
    """
    if not isinstance(target, dict):
        return target
    keys = _Keys(secret_keys, keys_before)
    kind = target.get("type")
    same_kind = bool(current) and current.get("type") == kind
    if kind == "http" and isinstance(target.get("url"), str):
        stored_url = current.get("url") if same_kind else None
        target = dict(target, url=_restore_url(target["url"], stored_url, keys))
    member = SECRET_MEMBERS.get(kind) if isinstance(kind, str) else None
    given = target.get(member) if member else None
    if not isinstance(given, dict) or MASK not in given.values():
        return target
    stored = _named_values(current)[1] if same_kind else {}
    restored = {}
    for name, value in given.items():
        field = f"target.{member}.{name}"
        if value == MASK and not keys.secret_after(kind, name) and keys.secret_before(kind, name):
            raise _unlisted(name, field)
        if value == MASK and keys.secret_after(kind, name):
            value = _stored_value(kind, name, stored)
            if value is None:
                raise InvalidInput(
                    f'"{MASK}" is what reads show for a secret; this job has no stored value '
                    f"of {name!r} to keep, so give the value itself", field=field)
            _check_same_place(target, current, name, field)
        restored[name] = value
    return dict(target, **{member: restored})


def _check_same_place(target: dict, current: dict | None, name: str, field: str) -> None:
    """A kept named value goes where the stored one went: the same origin for
    an HTTP header, the same queue (the same workers) for a command's env."""
    assert current is not None
    if target.get("type") == "http":
        _check_same_origin(target.get("url"), current.get("url"), repr(name), field)
    elif (target.get("queue") or "default") != (current.get("queue") or "default"):
        raise InvalidInput(f'"{MASK}" keeps the stored value of {name!r} only for the queue '
                           f"it is sent to now ({current.get('queue') or 'default'!r}); this "
                           "change sends the command elsewhere, so give the value itself",
                           field=field)


def _stored_value(kind: str, name: str, stored: dict) -> str | None:
    if kind == "http":
        lowered = name.lower()
        return next((v for k, v in stored.items() if k.lower() == lowered), None)
    return stored.get(name)
