"""A small internet with real NAT in Linux network namespaces, for testing nodes behind home routers.

    internet namespace  ── bridge ──┬── public host j: 11.0.0.(j+1)   (its own namespace: relays, bootstrap peers)
                                    └── router i's WAN 11.0.0.(100+i) (one per home)
    router i          ── iptables MASQUERADE out of its WAN; FORWARD drops new connections from it
                          │   (no port forwards: nothing outside can open a connection in)
    home i            ── 10.(i+1).0.2, default route via 10.(i+1).0.1

The namespaces have no link to the host's own network, so nothing is routed out of them. The
"public" segment uses ordinary unicast addresses on purpose: AutoNAT (go-libp2p, through
go-multiaddr's IsPublicAddr) never dials back an address in a reserved range (RFC 1918,
100.64/10, the benchmarking range 198.18/15, the TEST-NETs), so a simulated internet in one of
those would leave every node "unknown" and no relay would ever be used.

Needs root, `ip` (iproute2) and `iptables` (scripts/setup.sh installs iptables where it runs as
root with apt); `unavailable()` says what is missing. Everything is torn down on exit, also after
a failure: processes started through `popen` are ended by their handles first.
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path

from protocol.ground import stop_processes

PUBLIC_PREFIX = "11.0.0"
_COUNTER = itertools.count()


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


def unavailable() -> str | None:
    """Why a NatLab cannot be built here (None if it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/setup.sh installs iptables when run as root with apt)"
    name = f"snprobe{os.getpid() % 100000}"
    try:
        _run("ip", "netns", "add", name)
    except (subprocess.SubprocessError, OSError) as err:
        return f"cannot create a network namespace: {err}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
    return None


class NatLab:
    """`with NatLab(homes=2, public_hosts=2) as lab:` then `lab.popen(lab.home(0), argv)`."""

    def __init__(self, homes: int = 2, public_hosts: int = 2) -> None:
        self.homes, self.public_hosts = homes, public_hosts
        self.tag = f"sn{os.getpid() % 10000}{next(_COUNTER)}"  # interface names stay under 15 bytes
        self.internet = f"{self.tag}net"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []

    # -- addresses ---------------------------------------------------------------------------------
    def public_ip(self, i: int) -> str:
        return f"{PUBLIC_PREFIX}.{i + 1}"

    def router_wan_ip(self, i: int) -> str:
        return f"{PUBLIC_PREFIX}.{100 + i}"

    def home_ip(self, i: int) -> str:
        return f"10.{i + 1}.0.2"

    def home(self, i: int) -> str:
        return f"{self.tag}h{i}"

    def public(self, j: int) -> str:
        return f"{self.tag}p{j}"

    # -- lifetime ----------------------------------------------------------------------------------
    def __enter__(self) -> NatLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ns(self, name: str) -> str:
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _build(self) -> None:
        net = self._ns(self.internet)
        _run("ip", "-n", net, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", net, "link", "set", "br0", "up")
        for j in range(self.public_hosts):
            host = self._ns(self.public(j))
            self._plug(host, f"{self.tag}e{j}", f"{self.tag}E{j}", f"{self.public_ip(j)}/24")
        for i in range(self.homes):
            self._home(i)

    def _plug(self, namespace: str, dev: str, bridge_port: str, addr: str) -> None:
        """A veth from `namespace` (device `dev`, address `addr`) into the internet's bridge."""
        _run("ip", "link", "add", dev, "type", "veth", "peer", "name", bridge_port)
        _run("ip", "link", "set", dev, "netns", namespace)
        _run("ip", "link", "set", bridge_port, "netns", self.internet)
        _run("ip", "-n", self.internet, "link", "set", bridge_port, "master", "br0")
        _run("ip", "-n", self.internet, "link", "set", bridge_port, "up")
        _run("ip", "-n", namespace, "addr", "add", addr, "dev", dev)
        _run("ip", "-n", namespace, "link", "set", dev, "up")

    def _home(self, i: int) -> None:
        router, home, t = self._ns(f"{self.tag}r{i}"), self._ns(self.home(i)), self.tag
        wan, lan, lan_peer = f"{t}w{i}", f"{t}l{i}", f"{t}L{i}"
        self._plug(router, wan, f"{t}W{i}", f"{self.router_wan_ip(i)}/24")
        _run("ip", "link", "add", lan, "type", "veth", "peer", "name", lan_peer)
        _run("ip", "link", "set", lan, "netns", router)
        _run("ip", "link", "set", lan_peer, "netns", home)
        gateway = f"10.{i + 1}.0.1"
        for ns, dev, addr in ((router, lan, f"{gateway}/24"), (home, lan_peer, f"{self.home_ip(i)}/24")):
            _run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
        _run("ip", "-n", home, "route", "add", "default", "via", gateway)
        in_router = ("ip", "netns", "exec", router)
        _run(*in_router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run(*in_router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", wan, "-j", "MASQUERADE")
        _run(*in_router, "iptables", "-A", "FORWARD", "-i", wan, "-m", "conntrack", "--ctstate",
             "ESTABLISHED,RELATED", "-j", "ACCEPT")
        _run(*in_router, "iptables", "-A", "FORWARD", "-i", wan, "-j", "DROP")

    def popen(self, namespace: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """`argv` inside `namespace`; ended by `close` by its handle."""
        proc = subprocess.Popen(["ip", "netns", "exec", namespace, *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        stop_processes(self.procs, timeout=10.0)
        self.procs.clear()
        for name in reversed(self.namespaces):  # veths go with their namespace
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        self.namespaces.clear()

    def exists(self) -> bool:
        return any(Path("/run/netns", name).exists() for name in self.namespaces)
