"""One end of a relayed-gossip measurement, run inside a network namespace (node/labs/netns.py):
a bare p2pd transport (no model) that sends or receives timestamped messages.

    python -m node.labs.relay_probe send    --peers ADDR... --topics T1,T2 --count N --burst B --size S --out F
    python -m node.labs.relay_probe receive --peers ADDR... --topics T --expect N --out F

`send` waits (bounded) until every receiver is in place (a relayed-only peer for the relayed
topic, a gossip subscriber for the direct one: `--wait-relayed`, `--wait-subscribed`), then
publishes N messages one at a time (`--gap-s` apart) and N more in bursts of B, each on every
topic; a message carries its sequence number, its mode and its send time (the namespaces share
the host's clock). `receive` writes the one-way latency of every message it got, per mode, and
the transport's counters, once it has `--expect` messages or `--seconds` passed. Both print their
node.json-like line (peer id, addresses) to `--info` first.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from protocol import NodeIdentity
from protocol.transports.options import NatOptions, P2pdOptions
from protocol.transports.p2pd import P2pdTransport


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("role", choices=("send", "receive"))
    p.add_argument("--peers", nargs="*", default=[])
    p.add_argument("--listen", default="/ip4/0.0.0.0/tcp/0")
    p.add_argument("--topics", required=True, help="comma-separated")
    p.add_argument("--count", type=int, default=50)
    p.add_argument("--burst", type=int, default=25)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--gap-s", type=float, default=0.05)
    p.add_argument("--expect", type=int, default=100)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--wait-relayed", type=int, default=0, help="send: relayed-only peers to wait for")
    p.add_argument("--wait-subscribed", default="", help="send: topic that needs a gossip subscriber first")
    p.add_argument("--relay-client", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--info", required=True)
    return p.parse_args(argv)


def message(seq: int, mode: str, size: int) -> bytes:
    head = json.dumps({"seq": seq, "mode": mode, "sent_at": time.time()}, separators=(",", ":")).encode()
    return head + b" " * max(0, size - len(head))


def send(transport: P2pdTransport, args: argparse.Namespace) -> dict:
    topics = args.topics.split(",")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:  # the receivers must be there, or messages go to nobody
        stats = transport.stats()
        subscribed = not args.wait_subscribed or stats.get(f"topic_peers:{args.wait_subscribed}", 0) > 0
        if stats.get("relayed_peers", 0) >= args.wait_relayed and subscribed:
            break
        time.sleep(0.2)
    else:
        return {"error": "receivers never appeared", "stats": transport.stats()}
    time.sleep(1.0)  # a new gossip subscription loses its first messages (protocol/transports/p2pd/transport.py)
    seq = 0
    for _ in range(args.count):
        for topic in topics:
            transport.publish(topic, message(seq, "single", args.size))
        seq += 1
        time.sleep(args.gap_s)
    for start in range(0, args.count, args.burst):
        for _ in range(min(args.burst, args.count - start)):
            for topic in topics:
                transport.publish(topic, message(seq, "burst", args.size))
            seq += 1
        time.sleep(1.0)
    time.sleep(3.0)  # let the queues drain before the transport closes
    return {"sent": seq, "stats": transport.stats()}


def receive(transport: P2pdTransport, args: argparse.Namespace) -> dict:
    topic = args.topics.split(",")[0]
    got: dict[int, dict] = {}
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and len(got) < args.expect:
        for item in transport.drain(topic):
            try:
                head = json.loads(item.data.split(b" ", 1)[0])
            except ValueError:
                continue  # not one of ours
            got.setdefault(head["seq"], {"mode": head["mode"], "latency_s": item.received_at - head["sent_at"]})
        time.sleep(0.01)
    return {"received": len(got), "messages": got, "stats": transport.stats()}


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s relay_probe %(levelname)s %(message)s")
    args = parse_args(argv)
    identity = NodeIdentity.generate()
    nat = NatOptions(relay_client=args.relay_client, relay_service=False)
    options = P2pdOptions(listen=(args.listen,), bootstrap=tuple(args.peers), topics=tuple(args.topics.split(",")),
                          nat=nat, conn_high=0)
    with P2pdTransport(identity.private_seed(), options) as transport:
        Path(args.info).write_text(json.dumps({"peer_id": transport.peer_id, "listen_addrs": transport.listen_addrs()}))
        result = send(transport, args) if args.role == "send" else receive(transport, args)
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
