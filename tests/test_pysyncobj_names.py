"""The private pysyncobj names the Raft adapter relies on exist in the installed pysyncobj."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from pysyncobj.tcp_connection import TcpConnection

from raftsched.replication import raft


def _missing(entries) -> list[str]:
    """The entries of a PYSYNCOBJ_PRIVATE_NAMES-like tuple the installed pysyncobj lacks."""
    missing = []
    for owner, name, kind in entries:
        if kind == "attribute":
            # Set on the instance by the class's __init__: read in its source,
            # under the name as written there (before mangling).
            written = re.sub(r"^_[A-Za-z]+(__\w+)$", r"\1", name)
            found = re.search(rf"\bself\.{re.escape(written)}\s*=", inspect.getsource(owner.__init__))
        else:
            found = hasattr(owner, name)
        if not found:
            missing.append(f"{getattr(owner, '__name__', owner)}.{name} ({kind})")
    return missing


def test_every_private_name_the_adapter_uses_exists_in_the_installed_pysyncobj():
    assert len(raft.PYSYNCOBJ_PRIVATE_NAMES) >= 27
    assert _missing(raft.PYSYNCOBJ_PRIVATE_NAMES) == []


def test_a_name_gone_from_pysyncobj_is_reported(monkeypatch):
    monkeypatch.delattr(TcpConnection, "_TcpConnection__processRead")
    assert _missing(raft.PYSYNCOBJ_PRIVATE_NAMES) == [
        "TcpConnection._TcpConnection__processRead (method)"]


def test_an_attribute_no_longer_set_by_init_is_reported():
    class Upgraded:
        def __init__(self) -> None:
            self.__renamed = 0   # what a release that renamed __raftLog would hold

    assert _missing([(Upgraded, "_Upgraded__raftLog", "attribute")]) == [
        "Upgraded._Upgraded__raftLog (attribute)"]


def test_the_list_names_every_mangled_pysyncobj_name_the_adapter_uses():
    source = Path(raft.__file__).read_text()
    used = set(re.findall(r"\b_(?:SyncObj|FileJournal|ResizableFile|TcpConnection|TCPTransport)__\w+", source))
    listed = {name for _owner, name, _kind in raft.PYSYNCOBJ_PRIVATE_NAMES}
    assert used - listed == set()


@pytest.mark.parametrize("owner, name, kind", raft.PYSYNCOBJ_PRIVATE_NAMES,
                         ids=[name for _o, name, _k in raft.PYSYNCOBJ_PRIVATE_NAMES])
def test_each_listed_name_is_checked(owner, name, kind):
    assert kind in ("method", "attribute", "module")
    assert _missing([(owner, name, kind)]) == []


def test_the_no_op_entry_type_a_backup_writes_is_still_one():
    # A backup's snapshot header names no-op entries by this byte; another value
    # would make backups written before the upgrade unreadable.
    assert raft.pysyncobj_syncobj._COMMAND_TYPE.NO_OP == 1


def test_syncobj_still_builds_its_journal_with_the_function_the_adapter_replaces():
    # raft.py replaces pysyncobj.syncobj.createJournal (so listing it checks
    # nothing by itself): SyncObj.__init__ must still call it by that name.
    from pysyncobj import SyncObj
    assert re.search(r"\bcreateJournal\(", inspect.getsource(SyncObj.__init__))
