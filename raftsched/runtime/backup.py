"""`raftsched backup` and `raftsched restore`: a node's state as one file, and
a new node's data folder made from it (docs/operations.md, "Backup and restore").

A backup is a compacted LMDB copy of the state (`state/` in the data folder)
as of one read, wrapped as the snapshot file a node loads at start
(replication/raft.py write_backup). It is taken from another process while
the node runs (LMDB readers do not stop its writer) or while it is stopped.
Restoring puts that file where a node with an empty data folder finds its
snapshot (`raft.snapshot`); the node installs it when it starts.
"""

from __future__ import annotations

import os
import shutil
import sys

from raftsched.errors import InvariantBroken
from raftsched.replication.raft import read_snapshot_header, write_backup
from raftsched.storage.base import fsync_dir
from raftsched.storage.lmdb_store import StateFileRead

# What a node keeps in its data folder; restore refuses a folder holding any.
_NODE_FILES = ("state", "raft.journal", "raft.snapshot")


def backup(data_dir: str, out_path: str) -> int:
    """Write the state of the node whose data folder is `data_dir` to
    `out_path` (a new file); the applied_index it holds."""
    source = StateFileRead(os.path.join(data_dir, "state"))
    try:
        write_backup(out_path, source)
    finally:
        source.close()
    return source.applied_index


def restore(backup_path: str, data_dir: str) -> int:
    """Make `data_dir` (absent, or without a node's files) start from the
    backup at `backup_path`; the applied_index it holds."""
    header = read_snapshot_header(backup_path)
    present = [name for name in _NODE_FILES if os.path.exists(os.path.join(data_dir, name))]
    if present:
        raise ValueError(f"{data_dir} already holds a node's data ({', '.join(present)}); "
                         "restore into an empty folder")
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    target = os.path.join(data_dir, "raft.snapshot")
    partial = target + ".restoring"
    shutil.copyfile(backup_path, partial)
    os.chmod(partial, 0o600)
    with open(partial, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(partial, target)
    fsync_dir(data_dir)
    return header["applied_index"]


def run_backup_cli(data_dir: str, out_path: str) -> int:
    try:
        index = backup(data_dir, out_path)
    except (OSError, ValueError, InvariantBroken) as exc:
        print(f"raftsched backup: {exc}", file=sys.stderr)
        return 1
    print(f"raftsched backup: {out_path}: the state at applied_index {index}, "
          f"{os.path.getsize(out_path)} bytes")
    return 0


def run_restore_cli(backup_path: str, data_dir: str) -> int:
    try:
        index = restore(backup_path, data_dir)
    except (OSError, ValueError) as exc:
        print(f"raftsched restore: {exc}", file=sys.stderr)
        return 1
    print(f"raftsched restore: {data_dir} starts from the state at applied_index {index}")
    return 0
