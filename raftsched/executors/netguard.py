"""Which addresses HTTP targets and alert webhooks may reach (the SSRF guard).

Anyone who may create a job chooses the URL a node calls, and can read the
head of the answer back through the run's logs. Without a guard, a job could
call the cloud metadata service (169.254.169.254), the node's own API or Raft
port, or any internal service next to the cluster. So by default a call may
only reach a public address; `--allow-target-cidr CIDR` (repeatable) opens a
range, as `raftsched dev` does for 127.0.0.0/8.

Refused unless allowed (REFUSED_V4, REFUSED_V6): unspecified, loopback,
link-local, private (RFC 1918, unique local and the deprecated site-local),
shared address space (100.64.0.0/10: carrier-grade NAT, and where some clouds
put their metadata service), the IETF protocol block, benchmarking, multicast,
and the reserved 240.0.0.0/4 with the broadcast address. An IPv6 address that
carries an IPv4 one (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, the
NAT64 prefix `64:ff9b::/96`) is judged by the IPv4 address it reaches.

The same policy is applied four times, each for a reason:
  - at create (api/policy.py): a literal address, in any form the C library
    accepts (`2130706433`, `0x7f000001`, `0177.0.0.1`, `[::1]`), or a
    localhost name, is refused with a 400 before anything is stored;
  - before a call (check_url): aiohttp resolves no literal address, so the
    resolver below never sees one;
  - at resolution (GuardedResolver): the addresses a name resolves to are
    checked, the refused ones dropped, and the name refused when none is left;
    aiohttp then connects to the addresses that passed, never resolving again,
    so a name that changes its answer (DNS rebinding) gains nothing;
  - at connect (guarded_socket_factory): every socket's destination is checked
    once more, whatever parsed the URL, so no parser difference slips through.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
from typing import Iterable, Sequence
from urllib.parse import unquote, urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from raftsched import limits

log = logging.getLogger("raftsched.netguard")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

REFUSED_V4: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(net), reason) for net, reason in (
        ("0.0.0.0/8", "unspecified"),     # connecting to 0.0.0.0 reaches this host
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared address space"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved or broadcast"),
    ))
REFUSED_V6: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(net), reason) for net, reason in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("fc00::/7", "unique local"),
        ("ff00::/8", "multicast"),
    ))
# IPv6 prefixes whose last 32 bits are an IPv4 address the connection reaches.
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Names every resolver maps to loopback (RFC 6761, and the usual /etc/hosts
# entries); judged at create as if they were 127.0.0.1. Any other name is
# judged by what it resolves to, when it is called.
_LOCALHOST_NAMES = frozenset(("localhost", "localhost.localdomain", "ip6-localhost",
                              "ip6-loopback"))
_LOCALHOST_ADDRESS = ipaddress.IPv4Address("127.0.0.1")


class AddressRefused(OSError):
    """A call's destination is an address the node's policy refuses. An
    OSError, as resolvers raise, so aiohttp carries it as the cause of the
    connection error it raises (refusal_in finds it there)."""

    def __init__(self, host: str, address: str, reason: str, *,
                 how: str | None = "resolves to") -> None:
        """`how` the host leads to the address; None when the host is the
        address, as written."""
        self.host, self.address, self.reason = host, address, reason
        if how is None:
            text = f"address {address} is refused ({reason})"
        else:
            text = f"{host} {how} {address}, which is refused ({reason})"
        super().__init__(f"{text}: this node calls only public addresses unless started "
                         f"with --allow-target-cidr")


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches, if it carries one."""
    if address.version != 6:
        return None
    assert isinstance(address, ipaddress.IPv6Address)
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    plain = ipaddress.IPv6Address(int(address))   # without a scope id
    if plain in _NAT64 or (plain in _IPV4_COMPATIBLE and int(plain) > 1):
        return ipaddress.IPv4Address(int(plain) & 0xFFFF_FFFF)
    return None


def literal_address(host: str) -> Address | None:
    """The address a URL host names literally, in any form the C library
    accepts (getaddrinfo takes `2130706433`, `0x7f000001`, `0177.0.0.1`,
    `127.1` as 127.0.0.1), or None for a name."""
    text = unquote(host.strip("[]"))
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):   # not an address; ValueError for a NUL
        return None


def is_localhost_name(host: str) -> bool:
    name = host.rstrip(".").lower()
    return name in _LOCALHOST_NAMES or name.endswith(".localhost")


class AddressPolicy:
    """Refuses the ranges above, except those the node allows."""

    def __init__(self, allowed: Sequence[Network] = ()) -> None:
        self.allowed = tuple(allowed)
        # URL hosts check_url found callable: a host is judged by its text
        # alone and the policy never changes, so each is parsed once (a burst
        # calls the same few hosts many times). At most callable_hosts_known_max.
        self._callable_hosts: set[str] = set()
        # url_refusal's answer for each host it judged (the same reasoning: the
        # host's text alone decides): a batch of creates names a few hosts
        # many times. At most callable_hosts_known_max.
        self._host_refusals: dict[str, AddressRefused | None] = {}

    @classmethod
    def parse(cls, cidrs: Iterable[str]) -> "AddressPolicy":
        """Raise ValueError, naming the CIDR, for one that is not a network."""
        allowed = []
        for cidr in cidrs:
            try:
                allowed.append(ipaddress.ip_network(cidr.strip(), strict=True))
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a network in CIDR form such as "
                                 f"127.0.0.0/8 or fd00::/8 ({exc})") from None
        return cls(allowed)

    def refusal(self, address: Address | str) -> str | None:
        """Why `address` is refused (its range's name), or None when it may be called."""
        if isinstance(address, str):
            address = ipaddress.ip_address(address)
        inner = embedded_ipv4(address)
        if any(address in net or (inner is not None and inner in net) for net in self.allowed):
            return None
        if inner is not None:
            reason = self.refusal(inner)
            return None if reason is None else f"{reason}: it reaches IPv4 {inner}"
        table = REFUSED_V4 if address.version == 4 else REFUSED_V6
        return next((reason for net, reason in table if address in net), None)

    def check(self, host: str, address: str) -> None:
        """Raise AddressRefused when `host`'s address `address` is refused."""
        reason = self.refusal(address)
        if reason is not None:
            raise AddressRefused(host, address, reason, how=None if host == address else
                                 "resolves to")

    def url_refusal(self, url: str) -> AddressRefused | None:
        """At create: the refusal of a URL whose host is a literal address or a
        localhost name. The host is taken as both urllib and yarl (which
        aiohttp calls with) read it, so neither reading slips past."""
        for host in url_hosts(url):
            if host in self._host_refusals:
                refused = self._host_refusals[host]
            else:
                refused = self.host_refusal(host)
                if len(self._host_refusals) >= limits.callable_hosts_known_max:
                    self._host_refusals.clear()
                self._host_refusals[host] = refused
            if refused is not None:
                return refused
        return None

    def host_refusal(self, host: str) -> AddressRefused | None:
        address = literal_address(host)
        if address is not None:
            return self.literal_refusal(host, address)
        if not is_localhost_name(host):
            return None   # judged by what it resolves to, when it is called
        reason = self.refusal(_LOCALHOST_ADDRESS)
        if reason is None:
            return None
        return AddressRefused(host, str(_LOCALHOST_ADDRESS), reason, how="is a name for")

    def literal_refusal(self, host: str, address: Address) -> AddressRefused | None:
        reason = self.refusal(address)
        if reason is None:
            return None
        text = unquote(host.strip("[]"))
        try:
            as_written = ipaddress.ip_address(text) == address
        except ValueError:   # a form only the C library reads, such as 2130706433
            as_written = False
        return AddressRefused(host, text if as_written else str(address), reason,
                              how=None if as_written else "is another form of the address")

    def check_url(self, url: str) -> None:
        """Before a call: raise AddressRefused for a refused literal host (one
        aiohttp would connect to without asking the resolver)."""
        try:
            host = URL(url).raw_host
        except ValueError:
            return   # aiohttp refuses the URL itself (InvalidURL)
        if host is None or host in self._callable_hosts:
            return
        address = literal_address(host)
        refused = None if address is None else self.literal_refusal(host, address)
        if refused is not None:
            raise refused
        if len(self._callable_hosts) >= limits.callable_hosts_known_max:
            self._callable_hosts.clear()
        self._callable_hosts.add(host)


def url_hosts(url: str) -> list[str]:
    hosts = []
    try:
        hosts.append(urlsplit(url).hostname)
    except ValueError:
        pass
    try:
        hosts.append(URL(url).raw_host)
    except ValueError:
        pass
    return [h for h in dict.fromkeys(hosts) if h]


@functools.lru_cache(maxsize=1)   # a node has one list; another one is parsed again
def policy_for(cidrs: tuple[str, ...]) -> AddressPolicy:
    """The policy of a node's --allow-target-cidr list, parsed once."""
    return AddressPolicy.parse(cidrs)


def refusal_in(exc: BaseException) -> AddressRefused | None:
    """The AddressRefused behind an aiohttp connection error, if there is one
    (aiohttp wraps what the resolver or the socket factory raised)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, AddressRefused):
            return current
        todo += [current.__cause__, current.__context__, getattr(current, "os_error", None)]
    return None


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, keeping only the addresses the policy allows.

    A name with some refused addresses keeps the others (a warning names the
    dropped ones); a name with none left is refused. Build it inside the event
    loop (the default resolver binds to the running loop)."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        kept = [r for r in found if self._policy.refusal(r["host"]) is None]
        refused = [r["host"] for r in found if r not in kept]
        if not kept and refused:
            self._policy.check(host, refused[0])
        if refused:
            log.warning("%s resolves to refused addresses %s as well; calling only %s", host,
                        ", ".join(refused), ", ".join(r["host"] for r in kept))
        return kept

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket_factory(policy: AddressPolicy):
    """A TCPConnector socket_factory that refuses a refused destination
    before the socket exists: the last check, on the address connected."""

    def make_socket(addr_info: tuple) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        policy.check(sockaddr[0], sockaddr[0])
        return socket.socket(family=family, type=type_, proto=proto)

    return make_socket
