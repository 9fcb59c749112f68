"""One hostile testnet peer as its own process over libp2p (the testnet harness starts K of them
beside the honest nodes; the kinds are in node/hostile/peer.py):

    python -m node.hostile.process --kind KIND --peers MULTIADDR [MULTIADDR ...] --swarm NAME
        --preset tiny [--set key=value ...] --rounds N --period-s S [--listen /ip4/127.0.0.1/tcp/0]
        [--out FILE] [--seed N] [--per-step N] [--sybil-keys N] [--connect-timeout-s S]

builds the task source and verifier exactly as `swarm-node join` would from the same preset and
overrides, starts a libp2p transport with a fresh identity (its host key is the main signing key,
so `identities()[0]` is its transport peer id), waits (bounded) for a first connection, steps every
S seconds N times, and writes a JSON summary to FILE (stdout without --out): kind, valid, peer_id,
identities, claimed_identities, counters, learned, steps, signal, error, transport stats. SIGTERM
and SIGINT end it after the current step, with the summary; every wait has a timeout.
"""
from __future__ import annotations

import signal
import threading

_STOP = threading.Event()  # set by SIGTERM / SIGINT
_CAUGHT: list[int] = []


def _on_signal(signum: int, _frame) -> None:
    _CAUGHT.append(signum)
    _STOP.set()


if __name__ == "__main__":  # before the heavy imports below (seconds): a signal during start-up exits cleanly too
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from node.config.presets import PRESETS  # noqa: E402
from policy.ground import atomic_write_text  # noqa: E402
from node.scoring.verifiers import Verifier  # noqa: E402
from node.hostile.peer import KINDS, TOPIC_KINDS, VALID_KINDS, HostilePeer  # noqa: E402
from protocol import Limits, NodeIdentity, Transport, topic_name  # noqa: E402


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m node.hostile.process",
                                description="Run one hostile testnet peer over libp2p (see the module docstring).")
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--peers", nargs="+", required=True, metavar="MULTIADDR",
                   help="bootstrap peers (/ip4/.../tcp/.../p2p/<peer-id>)")
    p.add_argument("--swarm", required=True, help="swarm name (gossip topic namespace)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="the honest nodes' preset: task source and verifier are built from it")
    p.add_argument("--config", help="TOML file with overrides of the preset (as the honest nodes)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    p.add_argument("--rounds", type=int, required=True, help="steps to run")
    p.add_argument("--period-s", type=float, required=True, help="seconds between steps")
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="listen multiaddr")
    p.add_argument("--out", help="write the JSON summary here (default: stdout)")
    p.add_argument("--seed", type=int, help="content RNG seed (default: random)")
    p.add_argument("--per-step", type=int, default=8, help="messages per step (flood: 20 times this)")
    p.add_argument("--sybil-keys", type=int, default=50, help="sybil: distinct keys it rotates through")
    p.add_argument("--connect-timeout-s", type=float, default=15.0,
                   help="wait at most this long for a first connection before stepping anyway")
    args = p.parse_args(argv)
    if args.rounds < 0 or args.period_s < 0 or args.per_step < 0 or args.sybil_keys < 1:
        p.error("--rounds, --period-s and --per-step must be >= 0, --sybil-keys >= 1")
    return args


def write_json(path: str | None, data: dict) -> None:
    """`data` as sorted JSON to `path`, atomically (stdout without a path)."""
    text = json.dumps(data, indent=2, sort_keys=True)
    if path is None:
        print(text, flush=True)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, text + "\n")


def _refuse(out: str | None, summary: dict, stage: str, err: Exception) -> int:
    """Exit status 2 for a bad config or address, with the summary written and the error named."""
    summary["error"] = f"{stage}: {err}"
    write_json(out, summary)
    print(f"hostile: {err}", file=sys.stderr)
    return 2


def _run_steps(args: argparse.Namespace, transport: Transport, peer: HostilePeer, summary: dict,
               stop: threading.Event) -> None:
    """Wait (bounded) for a first connection, step every --period-s until --rounds or a signal, then
    give what was queued (bounded) a moment to reach the wire."""
    deadline = time.monotonic() + args.connect_timeout_s
    while not stop.is_set() and not transport.peers() and time.monotonic() < deadline:
        stop.wait(0.1)
    summary["connected_at_start"] = bool(transport.peers())
    for round_index in range(args.rounds):
        if stop.wait(args.period_s):
            break
        peer.step(round_index)
        summary["steps"] = round_index + 1
    # Let the outbound pump hand what we queued to GossipSub (bounded).
    flush_deadline = time.monotonic() + 3.0
    while time.monotonic() < flush_deadline and not stop.is_set():
        stats = transport.stats()
        if stats.get("published", 0) + stats.get("dropped_outbound", 0) >= peer.counters["messages"]:
            break
        time.sleep(0.05)
    stop.wait(min(0.5, args.period_s))  # and GossipSub a moment to write it


def main(argv: list[str] | None = None) -> int:
    """`python -m node.hostile.process ...`: one hostile peer as its own process over libp2p.

    Every wait is bounded: the transport start (20 s), the first connection (--connect-timeout-s),
    each step period, the final flush (3 s) and the transport close (10 s). SIGTERM / SIGINT stop
    it after the current step; the summary is written in every case."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s hostile %(levelname)s %(message)s")
    stop, caught = _STOP, _CAUGHT
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)

    # the peer's own: importers of its helpers (write_json, the harness) load no py-libp2p (trio)
    from node.config.schema import ConfigError, load_config
    from node.tasks import make_source
    from protocol.transports.libp2p import Libp2pOptions, Libp2pTransport, TransportStartError

    summary: dict = {"kind": args.kind, "valid": args.kind in VALID_KINDS, "swarm": args.swarm, "steps": 0,
                     "identities": [], "claimed_identities": [], "counters": {}, "learned": {}}
    try:
        cfg = load_config(args.preset, args.config, [*args.set, f"swarm.name={args.swarm}"])
        source = make_source(cfg.tasks.source, cfg.tasks.datasets, cfg.tasks.seed,
                             heldout_split=cfg.tasks.heldout_split)
    except (ConfigError, ValueError) as err:
        return _refuse(args.out, summary, "config", err)
    limits = Limits()
    identity = NodeIdentity.generate()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**62)
    # The oversized kind must get its bytes onto the wire: our own transport would drop them.
    max_msg = 2 * limits.max_message_bytes if args.kind == "oversized" else limits.max_message_bytes
    try:
        transport = Libp2pTransport(identity.private_seed(), Libp2pOptions(
            listen=[args.listen], bootstrap=args.peers or [], topics=[topic_name(cfg.swarm.name, k) for k in TOPIC_KINDS],
            max_msg_bytes=max_msg, start_timeout=20.0, close_timeout=10.0))
    except ValueError as err:  # a bad multiaddr
        return _refuse(args.out, summary, "transport", err)
    peer = None
    code = 0
    try:
        transport.start()
        summary["peer_id"] = transport.peer_id
        summary["listen_addrs"] = transport.listen_addrs()
        peer = HostilePeer(args.kind, transport, cfg.swarm.name, source, Verifier.from_config(cfg.verifier), seed=seed,
                           per_step=args.per_step, sybil_keys=args.sybil_keys, limits=limits, identity=identity)
        _run_steps(args, transport, peer, summary, stop)
    except TransportStartError as err:
        summary["error"] = f"transport: {err}"
        print(f"hostile: {err}", file=sys.stderr)
        code = 1
    finally:
        if peer is not None:
            summary.update(identities=peer.identities(), claimed_identities=peer.claimed_identities(),
                           counters=dict(peer.counters), learned=dict(peer.learned))
        summary["signal"] = caught[0] if caught else None
        summary["connected_peers"] = transport.peers()
        transport.close()
        summary["transport"] = transport.stats()
        write_json(args.out, summary)
    return code


if __name__ == "__main__":
    sys.exit(main())
