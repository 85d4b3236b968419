"""The layer contracts hold on this tree, and each breaks on an import crossing its layer."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"

CONTRACTS = ("core is pure: no I/O, no clock, no randomness, no outer layer",
             "the API reaches the node only through raftsched.nodeport",
             "the runtime does not know the API (raftsched.server composes them)",
             "the node interface depends on core, errors and limits only",
             "only storage imports lmdb, only replication imports pysyncobj",
             "the API does not know the storage layout: it reads through named queries",
             "the loops read the state only through named queries")

# One import per contract that the contract must refuse, added to a copy of the
# package: (module file, the import, the contract that must break).
VIOLATIONS = (
    ("core/keys.py", "import os", CONTRACTS[0]),
    ("core/schedule.py", "from raftsched.storage import base", CONTRACTS[0]),
    ("api/views.py", "from raftsched.runtime import node", CONTRACTS[1]),
    ("api/problems.py", "from raftsched.storage import lmdb_store", CONTRACTS[1]),
    ("runtime/lateness.py", "from raftsched.api import app", CONTRACTS[2]),
    ("nodeport.py", "from raftsched.runtime import port", CONTRACTS[3]),
    ("executors/base.py", "import lmdb", CONTRACTS[4]),
    ("api/views.py", "from raftsched.core import tx", CONTRACTS[5]),
    ("api/history.py", "from raftsched.core import keys", CONTRACTS[5]),
    ("runtime/dispatcher.py", "from raftsched.core import tx", CONTRACTS[6]),
    ("runtime/trigger.py", "from raftsched.core import apply", CONTRACTS[6]),
)


def lint(cwd: pathlib.Path, pythonpath: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([str(LINT_IMPORTS), "--no-logo", "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_layer_contract():
    result = lint(ROOT, ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in CONTRACTS:
        assert f"{name} KEPT" in result.stdout, result.stdout
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


def test_each_contract_breaks_on_an_import_across_its_layer(tmp_path):
    # The project's own configuration, over a copy of the package with one
    # crossing import per contract: the linter must fail and name each one.
    shutil.copytree(ROOT / "raftsched", tmp_path / "raftsched",
                    ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, statement, _ in VIOLATIONS:
        module = tmp_path / "raftsched" / path
        module.write_text(module.read_text() + f"\n{statement}  # crosses a layer\n")
    result = lint(tmp_path, tmp_path)
    assert result.returncode != 0, result.stdout
    for name in CONTRACTS:
        assert f"{name} BROKEN" in result.stdout, result.stdout
    for path, statement, _ in VIOLATIONS:
        module = "raftsched." + path.removesuffix(".py").replace("/", ".")
        imported = statement.split()[-1] if statement.startswith("import") else \
            f"{statement.split()[1]}.{statement.split()[3]}"
        assert f"{module} -> {imported}" in result.stdout, (module, imported, result.stdout)
