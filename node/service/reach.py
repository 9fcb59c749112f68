"""What a networked node tells people about reaching it: the addresses to join with (public and
relayed ones when it has any: protocol/transports/p2pd/nat.py `join_addrs`) and its reachability
(unknown / public / private, from AutoNAT). Said at start and again whenever either changes (relay
slots arrive seconds after AutoNAT says private), and kept in node.json for scripts."""
from __future__ import annotations

import threading

from node.observe.control import write_node_file
from node.observe.logs import say
from protocol.transports.options import REACHABILITY_NAMES as REACH_NAMES  # the counter's codes
from protocol.transports.p2pd.nat import join_addrs

NAT_HELP = 'docs/joining-a-swarm.md "Joining from behind NAT"'


def reachability_of(transport) -> str:
    """The transport's AutoNAT verdict; "unknown" where it has none (py-libp2p, memory)."""
    read = getattr(transport, "reachability", None)
    return read() if callable(read) else "unknown"


def join_text(peer_id: str, swarm: str, addrs: list[str], reachability: str) -> str:
    shown, outside = join_addrs(addrs)
    lines = [f"peer id {peer_id} in swarm {swarm!r} (reachability: {reachability}); others can join with:"]
    lines += [f"  swarm-node join --peers {addr}" for addr in shown]
    if not outside:
        lines.append(f"  (these work on this host or its LAN only; to be reached from outside see {NAT_HELP})")
    return "\n".join(lines)


class ReachWatch:
    """Says the join addresses and reachability at start (`announce`) and on every change (a
    thread polling the transport every `interval_s`), and writes them into node.json with `info`."""

    def __init__(self, transport, console, run_dir, info: dict, interval_s: float = 5.0) -> None:
        self.transport, self.console, self.run_dir = transport, console, run_dir
        self.info, self.interval_s = dict(info), interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reach-watch", daemon=True)
        self._last: tuple | None = None

    def current(self) -> tuple[tuple[str, ...], str]:
        return tuple(self.transport.listen_addrs()), reachability_of(self.transport)

    def announce(self, event: str = "reachability", **fields) -> None:
        """Writes node.json and says the join addresses: at start (`event` "joined", with the
        start's `fields`), or on a change."""
        addrs, reachability = self._last = self.current()
        shown, outside = join_addrs(list(addrs))
        write_node_file(self.run_dir, {**self.info, "listen_addrs": list(addrs), "join_addrs": shown,
                                       "reachable_from_outside": outside, "reachability": reachability})
        say(self.console, join_text(self.info["peer_id"], self.info["swarm"], list(addrs), reachability),
            event, peer_id=self.info["peer_id"], listen_addrs=list(addrs),
            join_addrs=shown, reachability=reachability, **fields)

    def start(self) -> ReachWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.current() != self._last:
                    self.announce()
            except Exception:  # noqa: BLE001 - a closed transport at shutdown; the node goes on either way
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)


REACH_MEANING = {
    "public": "peers can dial this node",
    "private": "peers cannot dial this node directly (NAT or firewall): they reach it through its relays",
    "unknown": "no AutoNAT verdict yet (it needs peers with public addresses: a loopback or LAN swarm stays "
               "unknown)",
}


def reach_summary(counters: dict[str, int]) -> str | None:
    """One line for `status`: reachability, relay slots, relay service; None for a transport without them."""
    if "reachability" not in counters:
        return None
    name = REACH_NAMES.get(int(counters["reachability"]), "unknown")
    line = (f"reachability {name}: {REACH_MEANING[name]}; relay slots held {counters.get('relay_reservations', 0)}, "
            f"relayed addresses {counters.get('relayed_addrs', 0)}")
    if counters.get("relay_serving"):
        line += "; serving as a relay"
    return line
