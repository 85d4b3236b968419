"""The API asks its node only what NodePort offers, by named queries that hide the storage layout; the runtime adapter offers all of it."""

from __future__ import annotations

import ast
import inspect
import pathlib

from raftsched import nodeport
from raftsched.core import tx
from raftsched.runtime.node import NodeConfig
from raftsched.runtime.port import NodeAdapter

API = pathlib.Path(nodeport.__file__).parent / "api"


def members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_adapter_has_every_member_of_the_port_with_the_same_parameters():
    port_members = members(nodeport.NodePort)
    assert {"propose", "wait_caught_up", "job", "runs_page", "status", "metrics_text"} <= \
        port_members
    # Reads are named queries: no table-and-key access the API would have to lay out.
    assert not {"get", "scan", "store"} & port_members
    for name in port_members:
        wanted = vars(nodeport.NodePort)[name]
        given = getattr(NodeAdapter, name, None)
        assert given is not None, f"NodeAdapter has no {name}"
        if isinstance(wanted, property):
            assert isinstance(given, property), name
            continue
        assert inspect.iscoroutinefunction(given) == inspect.iscoroutinefunction(wanted), name
        assert list(inspect.signature(given).parameters.values()) == \
            list(inspect.signature(wanted).parameters.values()), name


def test_the_node_config_has_every_setting_the_api_reads():
    config = NodeConfig(node_id="n1", http_host="127.0.0.1", http_port=1,
                        raft_addr="127.0.0.1:2", peers=(), data_dir="/nonexistent",
                        raft_secret=None)
    for name in members(nodeport.Settings):
        assert hasattr(config, name), name


def _asked(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(attributes read of `node` or node_of(...), attributes read of a config)."""
    of_node: set[str] = set()
    of_config: set[str] = set()
    for item in ast.walk(tree):
        if not isinstance(item, ast.Attribute):
            continue
        value = item.value
        if isinstance(value, ast.Name) and value.id == "node" or \
                isinstance(value, ast.Call) and getattr(value.func, "id", None) == "node_of":
            of_node.add(item.attr)
        elif isinstance(value, ast.Name) and value.id == "config" or \
                isinstance(value, ast.Attribute) and value.attr == "config":
            of_config.add(item.attr)
    return of_node, of_config


def test_every_handler_asks_its_node_only_what_the_port_offers():
    of_node: set[str] = set()
    of_config: set[str] = set()
    for path in sorted(API.glob("*.py")):
        node_attrs, config_attrs = _asked(ast.parse(path.read_text()))
        extra = node_attrs - members(nodeport.NodePort)
        assert not extra, f"{path.name} asks its node for {sorted(extra)}, not in NodePort"
        extra = config_attrs - members(nodeport.Settings)
        assert not extra, f"{path.name} reads {sorted(extra)} of the config, not in Settings"
        of_node |= node_attrs
        of_config |= config_attrs
    # The scan sees the handlers' calls (were it blind, the checks above would pass vacuously).
    assert {"propose", "job", "runs_page", "wait_caught_up", "now_ms"} <= of_node
    assert {"propose", "peers"} <= of_node
    assert {"node_credential_sha256", "insecure_no_auth"} <= of_config


def test_the_scan_catches_a_handler_that_reaches_into_the_node():
    node_attrs, _ = _asked(ast.parse("async def h(node):\n    node.store.get('jobs', b'x')\n"))
    assert node_attrs - members(nodeport.NodePort) == {"store"}


# What the API may use of core.keys: the tenant-scoped name of a topic or worker
# queue, which commands and the node's topic and queue calls take (the import
# contract lets raftsched.api.execution import keys for it alone).
KEYS_THE_API_MAY_USE = {"scoped"}
TABLE_NAMES = {name for name, value in vars(tx).items()
               if name.isupper() and isinstance(value, str) and value in tx.TABLES}


def _layout_used(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(members of `keys` read, table-name constants imported)."""
    of_keys = {item.attr for item in ast.walk(tree) if isinstance(item, ast.Attribute)
               and isinstance(item.value, ast.Name) and item.value.id == "keys"}
    tables = {alias.name for item in ast.walk(tree) if isinstance(item, ast.ImportFrom)
              for alias in item.names if alias.name in TABLE_NAMES}
    return of_keys, tables


def test_no_handler_lays_out_keys_or_names_a_table():
    for path in sorted(API.glob("*.py")):
        of_keys, tables = _layout_used(ast.parse(path.read_text()))
        assert of_keys <= KEYS_THE_API_MAY_USE, f"{path.name} builds keys: {sorted(of_keys)}"
        assert not tables, f"{path.name} imports table names {sorted(tables)}"


def test_the_layout_check_catches_a_key_built_from_a_table_name():
    source = "from raftsched.core.apply import RUNS\nrow = node.get(RUNS, keys.job_key(x))\n"
    assert _layout_used(ast.parse(source)) == ({"job_key"}, {"RUNS"})
