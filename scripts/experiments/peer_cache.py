"""Issue 16 on real p2pd daemons on 127.0.0.1: can hosts that connect and leave fill a node's peer cache?

Node V keeps a peer cache. An honest peer H dials V and publishes a group that V uses (V names H
through `note_useful_peers`, as `swarm-node join` does for the peers whose groups it trains on).
Then `--attackers` short-lived hosts (bare p2pd daemons) dial V, stay until V has cached them, and
leave. Measured: V's failed redials in the `--after-s` seconds after they left, the most departed
hosts peers.json held at any time after they left, its order then and at the end, and whom V
restarted from the cache as it was when they left (dead entries and all) dials first. Prints one
JSON line. Only the daemons started here are stopped, by their handles.

    .venv/bin/python -m scripts.experiments.peer_cache --attackers 12 --after-s 40
"""
from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from protocol import NodeIdentity, P2pdOptions
from protocol.transports.p2pd import P2pdTransport
from protocol.transports.p2pd.addrs import peer_id_bytes, split_peer_addr
from protocol.transports.p2pd.control import ControlConnection, connect_request
from protocol.transports.p2pd.daemon import DaemonProcess
from scripts.common import arg_parser

TOPIC = "swarm-node/peer-cache-exp/rollouts/v1"
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def wait_until(predicate, what: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def cached_ids(path: Path) -> list[str]:
    try:
        return list(json.loads(path.read_text())["peers"])
    except (OSError, ValueError, KeyError):
        return []


class DialLog(logging.Handler):
    """Collects the peer ids one transport's discovery thread announces it dials, in order."""

    def __init__(self, peer_id: str) -> None:
        super().__init__(logging.DEBUG)
        self.thread_suffix = peer_id[-6:]  # transport threads are named <role>-<last 6 of the peer id>
        self.dialed: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:  # H also logs its dials (of V, its bootstrap)
        if record.msg == "dialing %s" and record.threadName.endswith(self.thread_suffix):
            self.dialed.append(str(record.args[0]))


def run(work: Path, attackers: int = 12, after_s: float = 20.0, cache_kwargs: dict | None = None,
        expect_cached: int = 4, timeout_s: float = 30.0) -> dict:
    """The whole scenario in `work`: V and H, the attackers come and go, V watched for `after_s`,
    then a V restarted from the cache as it was when they left. Its figures (one JSON line in main)."""
    cache = work / "peers.json"
    made: list[P2pdTransport] = []
    hosts: list[DaemonProcess] = []
    try:
        v, h = honest_pair(cache, made, cache_kwargs or {}, timeout_s)
        attacker_ids = connect_attackers(v, attackers, hosts, timeout_s)
        wait_until(lambda: len(set(cached_ids(cache)) & set(attacker_ids)) >= expect_cached,
                   f"V to cache {expect_cached} attackers", timeout_s)
        for daemon in hosts:  # they leave
            daemon.stop()
        at_departure = work / "peers-at-departure.json"  # what a node that crashed now would restart from
        at_departure.write_bytes(cache.read_bytes())
        failures_before = v.stats()["dial_failures"]
        most_dead, end = 0, time.monotonic() + after_s
        while time.monotonic() < end:
            most_dead = max(most_dead, len(set(cached_ids(cache)) & set(attacker_ids)))
            time.sleep(0.1)
        failed_redials = v.stats()["dial_failures"] - failures_before
        v.close()
        after = cached_ids(cache)
        dialed, rejoin_s = restart_from(at_departure, h, made, cache_kwargs or {}, timeout_s)

        def roles(ids: list[str]) -> list[str]:
            return ["honest" if p == h.peer_id else "attacker" if p in attacker_ids else "other" for p in ids]

        return {"attackers": attackers, "after_s": after_s, "failed_redials": failed_redials,
                "cache_at_departure": roles(cached_ids(at_departure)),
                "most_dead_cached_after_leaving": most_dead,
                "cache_after": roles(after),
                "honest_first": bool(after) and after[0] == h.peer_id,
                "restart_first_dial": ("honest" if dialed[:1] == [h.peer_id] else
                                       "none logged" if not dialed else "attacker"),
                "restart_rejoin_s": round(rejoin_s, 2)}
    finally:
        for daemon in hosts:
            daemon.stop()
        for t in made:
            t.close()


def honest_pair(cache: Path, made: list[P2pdTransport], cache_kwargs: dict,
                timeout_s: float) -> tuple[P2pdTransport, P2pdTransport]:
    """V (keeping its peer cache in `cache`) and H, which dials V and publishes a group V then names
    useful (as `swarm-node join` does for the peers whose groups it trains on)."""
    v = P2pdTransport(NodeIdentity.generate().private_seed(), P2pdOptions(
        listen=LOOPBACK, topics=[TOPIC], peer_cache=cache, discovery_interval_s=0.3, **cache_kwargs))
    made.append(v)
    v.start()
    h = P2pdTransport(NodeIdentity.generate().private_seed(), P2pdOptions(
        listen=LOOPBACK, bootstrap=list(v.listen_addrs()), topics=[TOPIC], discovery_interval_s=0.3))
    made.append(h)
    h.start()
    wait_until(lambda: h.peer_id in v.peers(), "H to connect to V", timeout_s)
    # H publishes until V has its group: the node would verify it, train on it, and say so
    got: list = []
    wait_until(lambda: h.publish(TOPIC, b"a verified group") or got.extend(v.drain(TOPIC)) or got,
               "V to receive H's group", timeout_s)
    note_useful = getattr(v, "note_useful_peers", None)  # absent before issue 16 (so old code runs too)
    if note_useful is not None:
        note_useful(sorted({item.from_peer for item in got}))
    return v, h


def connect_attackers(v: P2pdTransport, attackers: int, hosts: list[DaemonProcess], timeout_s: float) -> list[str]:
    """`attackers` bare p2pd daemons (appended to `hosts`) dial V; their peer ids once V sees them all."""
    v_peer, v_transport = split_peer_addr(v.listen_addrs()[0])
    attacker_ids = []
    for _ in range(attackers):
        identity = NodeIdentity.generate()
        daemon = DaemonProcess(identity.private_seed(), listen=LOOPBACK, expected_peer_id=identity.peer_id())
        hosts.append(daemon)
        daemon.start(timeout_s)
        with ControlConnection(daemon.socket_path, 5.0) as conn:
            conn.request(connect_request(peer_id_bytes(v_peer), [v_transport], timeout_s=4))
        attacker_ids.append(identity.peer_id())
    wait_until(lambda: set(attacker_ids) <= set(v.peers()), "V to see every attacker connected", timeout_s)
    return attacker_ids


def restart_from(cache: Path, h: P2pdTransport, made: list[P2pdTransport], cache_kwargs: dict,
                 timeout_s: float) -> tuple[list[str], float]:
    """A V restarted from `cache` (with a fresh key only so that its dials can be told from anyone
    else's): (the peers it dialed, in order; seconds until it reached H)."""
    seed_v2 = NodeIdentity.generate().private_seed()
    dial_log = DialLog(NodeIdentity.from_seed(seed_v2).peer_id())
    discovery_log = logging.getLogger("protocol.transports.p2pd.discovery")
    old_level = discovery_log.level
    discovery_log.setLevel(logging.DEBUG)
    discovery_log.addHandler(dial_log)
    try:
        started = time.monotonic()
        v2 = P2pdTransport(seed_v2, P2pdOptions(listen=LOOPBACK, topics=[TOPIC], peer_cache=cache,
                                                discovery_interval_s=0.3, **cache_kwargs))
        made.append(v2)
        v2.start()
        wait_until(lambda: h.peer_id in v2.peers(), "restarted V to reach H from its cache", timeout_s)
        return dial_log.dialed, time.monotonic() - started
    finally:
        discovery_log.removeHandler(dial_log)
        discovery_log.setLevel(old_level)


def main() -> int:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--attackers", type=int, default=12, help="short-lived hosts that connect to V and leave")
    p.add_argument("--after-s", type=float, default=20.0, help="how long V is watched after they left")
    p.add_argument("--expect-cached", type=int, default=4,
                   help="wait until V's peers.json holds this many of them before they leave")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="exp-peer-cache-") as work:
        print(json.dumps(run(Path(work), args.attackers, args.after_s, expect_cached=args.expect_cached)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
