"""K flooding origins in one process: each key its own libp2p host, each publishing valid, distinct,
trainable rollout groups at R messages/s (issue 31: an honest peer must still be heard).

    python -m node.hostile.flood_origins --keys K --rate R --peers MULTIADDR [MULTIADDR ...] --swarm NAME
        --seconds T [--preset tiny] [--set key=value ...] [--transport libp2p|p2pd] [--subscribe]
        [--listen /ip4/127.0.0.1/tcp/0] [--out FILE] [--seed N] [--connect-timeout-s S] [--tick-s S]

Every key is the host key of its own transport (an in-process py-libp2p host, the default, or a
go-libp2p daemon each with p2pd), so GossipSub's signed `from` of its messages is that key: each origin
stays under a receiver's per-origin limits (swarm.p2pd.flood_cut_rate, 80 msg/s) at R = 60, and together
K origins send K x R messages/s. Each message is a fresh task from the key's own task stream (a
HostilePeer's blocks, node/hostile/peer.py), 1 to 7 of its 8 completions the reference answer,
every claimed reward computed with the honest nodes' verifier: valid, unique (no content is ever
sent twice, so never `duplicate_content`) and trainable (reward variance). Messages are stamped
and sequenced by each key's own outbox. Cost, measured on 2 shared cores: 8 keys x 60 msg/s for
10 s took 7 CPU-seconds with libp2p hosts (connected after 1 s) and 10 with p2pd daemons (3 s);
building and signing a group is about 0.25 ms.

The transports do not subscribe to the swarm's topics unless --subscribe: GossipSub publishes to
subscribed peers through fanout either way, and an unsubscribed host is not sent the swarm's
traffic back (K hosts in one process receiving the whole flood would cost this process more than
sending it). Each transport dials every --peers address.

Pacing: every --tick-s each origin is owed R x elapsed messages (fractions carry over; a late tick
is caught up at most one second's worth, so no burst nears a receiver's 200-message flood burst).
The summary (JSON to --out, else stdout) is written once every transport listens (keys known: a
harness can read them while the flood runs) and again at the end: keys, per-key counters and
transport stats, started_unix / flood_started_unix / ended_unix, signal, error. SIGTERM / SIGINT
end it after the current tick; every wait is bounded (start 30 s a transport, first connection
--connect-timeout-s, close 15 s a transport).
"""
from __future__ import annotations

import signal
import threading

_STOP = threading.Event()  # set by SIGTERM / SIGINT
_CAUGHT: list[int] = []


def _on_signal(signum: int, _frame) -> None:
    _CAUGHT.append(signum)
    _STOP.set()


if __name__ == "__main__":  # before the heavy imports below: a signal during start-up exits cleanly too
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

import argparse  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from node.scoring.verifiers import Verifier  # noqa: E402
from node.config.presets import PRESETS  # noqa: E402
from node.hostile.peer import HostilePeer  # noqa: E402
from node.hostile.process import write_json  # noqa: E402
from protocol import (Libp2pOptions, Limits, NodeIdentity, P2pdOptions, Transport,  # noqa: E402
                      make_transport, topic_name)

KIND = "flood"  # the HostilePeer shell's kind: its groups carry the ModelCard marker "hostile-flood"
MAX_CATCH_UP_S = 1.0  # a late tick sends at most this many seconds' worth at once


class _ContentOnly:
    """The transport a HostilePeer builds content against here: it subscribes to nothing and sends
    nothing (the origin publishes through its real transport itself)."""

    def subscribe(self, topic: str) -> None:
        pass

    def drain(self, topic: str) -> list:
        return []

    def publish(self, topic: str, data: bytes) -> None:
        raise AssertionError("flood_origins publishes through Origin.transport")


class Origin:
    """One key: its own transport (host key = signing key) and its own stream of fresh groups."""

    def __init__(self, transport: Transport, peer: HostilePeer, topic: str) -> None:
        self.transport, self.peer, self.topic = transport, peer, topic
        self.counters: Counter[str] = Counter()
        self.owed = 0.0  # messages due but not sent yet (fractions carry over)

    @property
    def key(self) -> str:
        return self.peer.identity.peer_id()

    def send(self, n: int, round_index: int) -> None:
        """Publishes `n` fresh, valid groups with reward variance, each from a new task."""
        for task in self.peer.tasks(n) if n > 0 else ():
            data = self.peer.valid_outbox.seal(self.peer.group(task, round_index))
            self.transport.publish(self.topic, data)
            self.counters["messages"] += 1
            self.counters["bytes"] += len(data)

    def summary(self) -> dict:
        return {"key": self.key, "counters": dict(self.counters), "connected_peers": self.transport.peers(),
                "transport": self.transport.stats()}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m node.hostile.flood_origins",
                                description="K flooding origins (keys) in one process (see the module docstring).")
    p.add_argument("--keys", type=int, required=True, help="origins (keys, hosts) in this process")
    p.add_argument("--rate", type=float, required=True, help="messages per second per key")
    p.add_argument("--peers", nargs="+", required=True, metavar="MULTIADDR", help="addresses every host dials")
    p.add_argument("--swarm", required=True, help="swarm name (gossip topic namespace)")
    p.add_argument("--seconds", type=float, required=True, help="how long to flood (after the first connection)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="the honest nodes' preset")
    p.add_argument("--config", help="TOML file with overrides of the preset (as the honest nodes)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    p.add_argument("--transport", choices=("libp2p", "p2pd"), default="libp2p", help="one host per key of this kind")
    p.add_argument("--subscribe", action="store_true", help="subscribe each host to the rollouts topic")
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="listen multiaddr of every host")
    p.add_argument("--out", help="write the JSON summary here (default: stdout, at the end only)")
    p.add_argument("--seed", type=int, help="content RNG seed (default: random)")
    p.add_argument("--connect-timeout-s", type=float, default=30.0,
                   help="wait at most this long for every host's first connection, then flood anyway")
    p.add_argument("--tick-s", type=float, default=0.1, help="pacing period")
    args = p.parse_args(argv)
    if args.keys < 1 or args.rate < 0 or args.seconds < 0 or not 0 < args.tick_s <= 1:
        p.error("need --keys >= 1, --rate >= 0, --seconds >= 0 and 0 < --tick-s <= 1")
    return args


def _make_transport(args: argparse.Namespace, identity: NodeIdentity, topics: list[str]) -> Transport:

    if args.transport == "libp2p":
        options = Libp2pOptions(listen=[args.listen], bootstrap=args.peers, topics=topics, start_timeout=20.0,
                                close_timeout=10.0)
    else:  # connected to the peers it dials and no more: no DHT walks, no peer cache
        wanted = len({addr.rsplit("/p2p/", 1)[-1] for addr in args.peers})
        options = P2pdOptions(listen=[args.listen], bootstrap=args.peers, topics=topics, peer_cache=None,
                              conn_low=max(1, wanted), conn_high=max(1, wanted) + 2, start_timeout_s=25.0)
    return make_transport(identity.private_seed(), options)


def _make_origins(args: argparse.Namespace, cfg, source, seed: int) -> list[Origin]:
    """Builds and starts one transport per key (in parallel: a p2pd daemon takes a second or two)."""
    topic = topic_name(cfg.swarm.name, "rollouts")
    limits = Limits()

    def build(i: int) -> Origin:
        identity = NodeIdentity.generate()
        transport = _make_transport(args, identity, [topic] if args.subscribe else [])
        peer = HostilePeer(KIND, _ContentOnly(), cfg.swarm.name, source, Verifier.from_config(cfg.verifier), seed=seed + 7919 * i,
                           per_step=0, limits=limits, identity=identity)
        origin = Origin(transport, peer, topic)
        transport.start()
        return origin

    with ThreadPoolExecutor(max_workers=min(8, args.keys)) as pool:
        futures = [pool.submit(build, i) for i in range(args.keys)]
        origins, errors = [], []
        for future in futures:
            try:
                origins.append(future.result(timeout=60))
            except Exception as err:  # noqa: BLE001 - reported below, after the others are closed
                errors.append(err)
    if errors:
        _close_all(origins)
        raise RuntimeError(f"{len(errors)} of {args.keys} hosts did not start: {errors[0]!r}")
    return origins


def _close_all(origins: list[Origin]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(origins)))) as pool:
        for future in [pool.submit(o.transport.close) for o in origins]:
            try:
                future.result(timeout=15)
            except Exception:  # noqa: BLE001 - closing is best effort; each transport stops its daemon
                logging.getLogger(__name__).warning("a transport did not close cleanly", exc_info=True)


def _wait_connected(origins: list[Origin], timeout_s: float, stop: threading.Event) -> bool:
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        if all(o.transport.peers() for o in origins):
            return True
        stop.wait(0.1)
    return all(o.transport.peers() for o in origins)


def _flood(args: argparse.Namespace, origins: list[Origin], stop: threading.Event) -> int:
    """Sends R messages/s from every origin for --seconds; returns the ticks run."""
    started = last = time.monotonic()
    ticks = 0
    while not stop.is_set() and time.monotonic() - started < args.seconds:
        now = time.monotonic()
        elapsed = min(now - last, MAX_CATCH_UP_S)
        last = now
        for origin in origins:
            origin.owed += args.rate * elapsed
            n = int(origin.owed)
            origin.owed -= n
            origin.send(n, ticks)
            if args.subscribe:  # read and forget what came back: nobody learns from it here
                origin.transport.drain(origin.topic)
        ticks += 1
        stop.wait(max(0.0, args.tick_s - (time.monotonic() - now)))
    return ticks


def _summary(args: argparse.Namespace, origins: list[Origin], **extra) -> dict:
    per_key = [o.summary() for o in origins]
    return {"kind": "flood_origins", "swarm": args.swarm, "transport": args.transport, "rate_per_key": args.rate,
            "keys": [o.key for o in origins], "per_key": per_key, "subscribed": args.subscribe,
            "messages": sum(k["counters"].get("messages", 0) for k in per_key),
            "published": sum(k["transport"].get("published", 0) for k in per_key), **extra}


def main(argv: list[str] | None = None) -> int:
    """`python -m node.hostile.flood_origins ...`: K origins flooding valid groups (module docstring)."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s flood_origins %(levelname)s %(message)s")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
    from node.config.schema import ConfigError, load_config  # the origins' own: not importers' of Origin
    from node.tasks import make_source

    base = {"kind": "flood_origins", "swarm": args.swarm, "keys": [], "started_unix": time.time()}
    try:
        cfg = load_config(args.preset, args.config, [*args.set, f"swarm.name={args.swarm}"])
        source = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed,
                             heldout_split=cfg.tasks.heldout_split)
        origins = _make_origins(args, cfg, source, args.seed if args.seed is not None
                                else random.SystemRandom().randrange(2**40))
    except (ConfigError, ValueError, RuntimeError) as err:
        write_json(args.out, {**base, "error": f"start: {err}", "signal": _CAUGHT[0] if _CAUGHT else None})
        print(f"flood_origins: {err}", file=sys.stderr)
        return 2
    extra = {"started_unix": base["started_unix"], "listen_addrs": [o.transport.listen_addrs() for o in origins]}
    try:
        if args.out:
            write_json(args.out, _summary(args, origins, **extra, state="starting"))
        extra["connected_at_start"] = _wait_connected(origins, args.connect_timeout_s, _STOP)
        extra["flood_started_unix"] = time.time()
        if args.out:
            write_json(args.out, _summary(args, origins, **extra, state="flooding"))
        extra["ticks"] = _flood(args, origins, _STOP)
        extra["ended_unix"] = time.time()
        time.sleep(0.5 if not _STOP.is_set() else 0.0)  # the writers a moment to hand the last tick over
    finally:
        summary = _summary(args, origins, **extra, state="done", signal=_CAUGHT[0] if _CAUGHT else None)
        _close_all(origins)
        write_json(args.out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
