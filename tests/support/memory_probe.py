"""A tiny node that peers send completions at every size limit, from many keys at once; prints its
peak RSS as JSON. Run as a subprocess by tests/integration/node/test_memory_bounds.py (peak RSS is per process):
    python tests/support/memory_probe.py [--attack] [--rounds N]
The tiny preset's character tokenizer is where text expands most: one digit, one token."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from node.train.loop import Node  # noqa: E402
from node.service.assembly import memory_bus_node  # noqa: E402
from protocol import Limits, MemoryBus, MemoryTransport, NodeIdentity, topic_name  # noqa: E402
from protocol.testing import seal_message  # noqa: E402
from tests.unit.peers.test_exchange import honest_group  # noqa: E402
from tests.support.tiny_node import tiny_cfg  # noqa: E402

SWARM = "mem"
KEYS = 48  # every size limit, each with 8 and with the most completions a group may hold, 4 times over


def peak_rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def attack_messages(node: Node, limits: Limits) -> list[bytes]:
    """One group per key: a correct short answer and wrong digit strings at each size limit, up to
    the most completions a group may hold; no token ids (nothing to compare the text with)."""
    max_new = node.cfg.sampling.max_new_tokens
    lengths = [max_new, max_new + 1, 4 * max_new + 1, 512, limits.max_tokens_per_completion,
               limits.max_text_chars]
    now_ms = int(time.time() * 1000)
    out = []
    for k in range(KEYS):
        length = lengths[k % len(lengths)]
        n = limits.max_completions if (k // len(lengths)) % 2 else 8
        group = honest_group(node, 500 + k)
        answer = group.completions[0].text
        wrong = str((int(answer) + 1) % 10)
        texts = [answer] + [wrong * length] * (n - 1)
        group = honest_group(node, 500 + k, texts=texts)
        for completion in group.completions:
            del completion.token_ids[:]
            del completion.behavior_logprobs[:]
            del completion.char_offsets[:]
        out.append(seal_message(NodeIdentity.generate(), group, 1, now_ms))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attack", action="store_true")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args()
    cfg = tiny_cfg(f"swarm.name={SWARM}")
    bus = MemoryBus()
    node = memory_bus_node(cfg, args.run_dir, bus, "receiver",
                           **({"ingest": os.environ["INGEST"]} if "INGEST" in os.environ else {}))
    exchange = node.exchange
    rows = [node.run_one(10_000)]  # warm: the quiet figure includes one round's allocations
    sizes = []
    if args.attack:
        messages = attack_messages(node, Limits())
        sizes = [len(m) for m in messages]
        for i, data in enumerate(messages):
            sender = MemoryTransport(bus, f"attacker-{i}")
            sender.start()
            sender.publish(topic_name(SWARM, "rollouts"), data)
        del messages
    deadline = time.monotonic() + 60
    while len(rows) < args.rounds or (args.attack and time.monotonic() < deadline
                                      and exchange.status().get("ingest", {}).get("staged", 0)):
        rows.append(node.run_one(10_000))
    status = exchange.status()
    if hasattr(exchange, "close"):
        exchange.close()
    print(json.dumps({"peak_rss_mb": peak_rss_mb(), "rounds": len(rows), "bytes_sent": sum(sizes),
                      "max_message_bytes": max(sizes, default=0), "accepted": status["ingress_accepted"],
                      "rejected": status["rejected_by_reason"],
                      "external_used": sum(r.get("external_used", 0) for r in rows),
                      "max_tokens_trained": max(r.get("tokens_trained", 0) for r in rows)}))


if __name__ == "__main__":
    main()
