"""What a job may reach, checked when it is created or updated: the node's
policy on targets (which addresses an HTTP target or alert webhook may name,
whether commands may run on the nodes). The spec is already well-formed
(core/jobspec.py); these checks depend on how the node was started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftsched.core import dag
from raftsched.core.runs import DEFAULT_QUEUE
from raftsched.errors import InvalidInput
from raftsched.executors.netguard import policy_for

if TYPE_CHECKING:
    from raftsched.nodeport import Settings


def check_spec(config: "Settings", spec: dict) -> None:
    """Raise InvalidInput (400, naming the field) for a spec this node's policy refuses."""
    check_addresses(config, spec)
    check_command_queue(config, spec)


def check_addresses(config: "Settings", spec: dict) -> None:
    """An HTTP target or alert webhook whose host is a literal address (in any
    form the C library reads) or a localhost name, in a range the node refuses
    (executors/netguard.py). A name is judged when it is called, by what it
    resolves to then: its answer at create could change before the call."""
    policy = policy_for(config.allow_target_cidrs)
    urls = {f"{prefix}.url": target["url"] for prefix, target in targets(spec)
            if target["type"] == "http"}
    urls["alert.webhook_url"] = (spec.get("alert") or {}).get("webhook_url")
    for field, url in urls.items():
        refused = policy.url_refusal(url) if url else None
        if refused is not None:
            raise InvalidInput(f"`{field}`: {refused}", field=field)


def check_command_queue(config: "Settings", spec: dict) -> None:
    """A command on the default queue runs on a node, as the node's user: only
    a node started with --allow-commands accepts one. Otherwise a command must
    name a `target.queue` that `raftsched worker` processes serve, on machines
    an operator chose for it. Nodes should agree on the flag; a node without it
    that is handed such a run anyway fails it (runtime/dispatcher.py)."""
    if config.allow_commands:
        return
    for prefix, target in targets(spec):
        if target["type"] == "command" and target.get("queue", DEFAULT_QUEUE) == DEFAULT_QUEUE:
            raise InvalidInput(f"a command without `{prefix}.queue` would run on the nodes, "
                               "which were not started with --allow-commands: name a queue "
                               "that `raftsched worker --queue NAME` serves",
                               field=f"{prefix}.queue")


targets = dag.targets
