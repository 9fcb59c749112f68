"""Network groups: which hosts an attacker can cheaply have many of counts as one place.

Keys are free; addresses are not (Bitcoin's addrman buckets peers the same way). A peer's group
is the /16 of its IPv4 address ('ip4:203.0.0.0/16'), the /32 of its IPv6 one, or, for a peer we
reach only through a relay, that relay ('relay:<relay peer id>'): one address range, or one relay,
is one group however many keys and hosts it runs. A DNS name is a group of its own; "" is unknown
(no address yet, or a transport that has none). Loopback and private ranges are groups like any
other: on one machine every node shares one. Admission (node/peers/admission.py) and the peer cache
(p2pd/peer_cache.py) both group by this.
"""
from __future__ import annotations

import ipaddress

CIRCUIT = "/p2p-circuit"


def network_group(addr: str, ipv4_prefix: int = 16, ipv6_prefix: int = 32) -> str:
    """The group of one multiaddr text (e.g. '/ip4/203.0.113.7/tcp/4001', a /p2p-circuit one)."""
    if CIRCUIT in addr:
        relay = addr.split(CIRCUIT, 1)[0].rsplit("/p2p/", 1)
        return f"relay:{relay[1]}" if len(relay) == 2 and relay[1] else ""
    parts = addr.split("/")
    if len(parts) < 3 or not parts[2]:
        return ""
    kind, host = parts[1], parts[2]
    if kind not in ("ip4", "ip6"):
        return f"{kind}:{host}"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return ""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # an IPv4 host is one group however it is written
    prefix = ipv4_prefix if address.version == 4 else ipv6_prefix
    return f"ip{address.version}:{ipaddress.ip_network(f'{address}/{prefix}', strict=False)}"


def peer_group(addrs: list[str]) -> str:
    """The group of a connected peer from the addresses of its connections: a direct one's if it has
    one (a relayed peer could otherwise pick the group it is counted in), else its relay's."""
    direct = [network_group(a) for a in addrs if CIRCUIT not in a]
    relayed = [network_group(a) for a in addrs if CIRCUIT in a]
    return next((g for g in direct if g), next((g for g in relayed if g), ""))
