"""Reachability from outside on the go-libp2p daemon: its flags for AutoNAT, circuit relay v2,
announced and mapped addresses (NatOptions), and what it learned, read back.

The bundled daemon (hivemind's p2pd, go-libp2p v0.32.1) does the work:
* AutoNAT: the host asks peers that serve AutoNAT to dial it back at its observed addresses and
  concludes public or private (a peer only serves it while not private itself, and dials back
  only addresses go-multiaddr calls public: 10/8, 192.168/16, 127/8 and the documentation and
  benchmarking ranges such as 198.18.0.0/15 are never tested, so a LAN-only swarm stays "unknown").
* Relays: a private node with relays (static: our relays or bootstrap peers) reserves a slot on
  each and advertises `<relay addr>/p2p-circuit` addresses; a public node with the relay service
  serves slots. The limits are go-libp2p's defaults whatever the flags say: with relaying on, the
  daemon also starts a relay of its own with default resources (hivemind's p2pd
  `EnableRelayV2`), and whichever registered last serves. Measured here: a relayed connection was
  reset after exactly 131,072 bytes. So RELAY_LIMIT_FLAGS set the configurable service to the same
  defaults (128 KiB each way and 2 minutes per relayed connection, 16 circuits per peer, 128
  reservations), and the limits are the same whichever serves: a relay never carries much for
  anyone, and a message over 128 KiB cannot cross one at all. Relayed connections are "transient"
  (limited): GossipSub ignores them, so relayed peers get our messages on streams (relayed.py).
  With relaying on at all (relay_client or relay_service), the daemon's default relay answers
  reservation requests even on a private node; only both off (-relay=false) serves none.
* Hole punching (DCUtR) comes with `-autonat`: two peers connected through a relay try a direct
  connection.

The daemon reports its AutoNAT verdict only as a Prometheus gauge, so it serves its metrics on a
loopback port of its own choosing (`-metricsAddr=127.0.0.1:0`), which we find in /proc (Linux,
like the rest of this transport) and read every few seconds (`read_reach`).
"""
from __future__ import annotations

import http.client
import ipaddress
import os
import urllib.request
from dataclasses import dataclass

from ..options import REACHABILITY_NAMES, NatOptions

METRICS_FLAG = "-metricsAddr=127.0.0.1:0"  # loopback only; the kernel picks the port
RELAY_LIMIT_FLAGS = ["-relayDataLimit=131072", "-relayTimeLimit=120s", "-relayMaxCircuits=16",
                     "-relayMaxReservations=128", "-relayBufferSize=2048"]  # = go-libp2p's relay defaults
REACHABILITY_CODES = {name: code for code, name in REACHABILITY_NAMES.items()}
_METRICS_READ_LIMIT = 4 << 20  # bytes of a metrics page read at most


def nat_flags(nat: NatOptions, bootstrap: list[str]) -> list[str]:
    """The daemon's flags for `nat`; relays default to the bootstrap peers' addresses."""
    flags = [f"-autonat={_go(nat.autonat_service)}", f"-natPortMap={_go(nat.port_map)}", METRICS_FLAG]
    if nat.reachability == "public":
        flags.append("-forceReachabilityPublic")
    elif nat.reachability == "private":
        flags.append("-forceReachabilityPrivate")
    relays = list(nat.relays) or list(bootstrap)
    relaying = nat.relay_service or (nat.relay_client and bool(relays))
    flags += [f"-relay={_go(relaying)}", f"-relayService={_go(nat.relay_service)}"]
    if nat.relay_service:
        flags += RELAY_LIMIT_FLAGS
    if nat.relay_client and relays:
        # static relays only: no DHT-fed candidates (and no 3-minute wait to collect enough of them)
        flags += ["-autoRelay", "-relayDiscovery=false", f"-trustedRelays={','.join(relays)}"]
    if nat.announce:
        flags.append(f"-announceAddrs={','.join(nat.announce)}")
    return flags


def _go(value: bool) -> str:
    return "true" if value else "false"


@dataclass(frozen=True)
class Reach:
    """What the daemon knows of its reachability. `reachability`: unknown / public / private."""

    reachability: str = "unknown"
    relay_reservations: int = 0   # relay slots we hold now (private nodes)
    relay_serving: bool = False   # the configurable relay service runs (public nodes with relay_service)
    metrics_ok: bool = False      # the daemon's metrics could be read

    def counters(self) -> dict[str, int]:
        """As integer transport counters (stats(), /metrics): reachability 0 unknown, 1 public, 2 private."""
        return {"reachability": REACHABILITY_CODES[self.reachability], "relay_reservations": self.relay_reservations,
                "relay_serving": int(self.relay_serving)}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value} (comments and bad lines skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def reach_from_metrics(metrics: dict[str, float]) -> Reach:
    code = int(metrics.get("libp2p_autonat_reachability_status", 0))
    opened = metrics.get("libp2p_autorelay_reservations_opened_total", 0.0)
    closed = metrics.get("libp2p_autorelay_reservations_closed_total", 0.0)
    return Reach(reachability=REACHABILITY_NAMES.get(code, "unknown"), relay_reservations=max(0, int(opened - closed)),
                 relay_serving=metrics.get("libp2p_relaysvc_status", 0.0) >= 1, metrics_ok=True)


def read_reach(port: int, timeout_s: float) -> Reach:
    """The daemon's reachability from its metrics on 127.0.0.1:`port`; raises OSError if unreadable
    (also when something else answers there: a libp2p port speaks multistream, not HTTP)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as reply:  # noqa: S310
            text = reply.read(_METRICS_READ_LIMIT).decode("utf-8", "replace")
    except http.client.HTTPException as err:
        raise OSError(f"127.0.0.1:{port} does not serve the daemon's metrics: {err!r}") from err
    if "libp2p_" not in text:
        raise OSError(f"127.0.0.1:{port}/metrics has no libp2p metrics")
    return reach_from_metrics(parse_metrics(text))


def loopback_listen_ports(pid: int) -> set[int]:
    """TCP ports that process `pid` listens on at 127.0.0.1 (from /proc: its own sockets, in its
    own network namespace). Empty where /proc cannot tell (not Linux, the process gone)."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
        with open(f"/proc/{pid}/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
    except OSError:
        return set()
    return {int(row[1].split(":")[1], 16) for row in rows
            if len(row) > 9 and row[3] == "0A" and row[1].startswith("0100007F:") and row[9] in inodes}


def metrics_port(pid: int, libp2p_ports: set[int], timeout_s: float = 1.0) -> int | None:
    """The daemon's metrics port: its loopback listener that is not a libp2p listen port, or, where
    several are (announced addresses hide the real listen ports), the one that serves /metrics."""
    ports = sorted(loopback_listen_ports(pid) - libp2p_ports)
    if len(ports) <= 1:
        return ports[0] if ports else None
    for port in ports:
        try:
            read_reach(port, timeout_s)
            return port
        except (OSError, ValueError):
            continue
    return None


def addr_scope(addr: str) -> str:
    """'relayed' (a /p2p-circuit address), 'public' (an address others can dial from anywhere),
    or 'local' (loopback, private, link-local, unspecified: this host or LAN only)."""
    if "/p2p-circuit" in addr:
        return "relayed"
    parts = addr.split("/")
    if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
        try:
            ip = ipaddress.ip_address(parts[2])
        except ValueError:
            return "local"
        return "public" if ip.is_global else "local"
    if len(parts) > 2 and parts[1] in ("dns", "dns4", "dns6", "dnsaddr"):
        return "public" if parts[2] not in ("localhost",) else "local"
    return "local"


def join_addrs(addrs: list[str]) -> tuple[list[str], bool]:
    """The addresses to give people who want to join us, and whether they work from outside: the
    public and relayed ones when there are any (public first), else all (this host or LAN only)."""
    outside = [a for a in addrs if addr_scope(a) == "public"] + [a for a in addrs if addr_scope(a) == "relayed"]
    return (outside, True) if outside else (list(addrs), False)
