"""Micro-benchmark: verified messages/s through the Ingress on one core.

    python -m protocol.bench [--completions 8] [--tokens 64] [--messages 5000]

Every message is a distinct, validly signed RolloutGroup from one of 16 senders, so each one pays
for the full path (decode, Ed25519 verify, replay window, schema validation). Rate limits are
lifted: the point is the cost of verification, not the policy.
"""
from __future__ import annotations

import argparse
import time

from .identity import NodeIdentity
from .ingress import Ingress
from .outbox import Outbox
from .ratelimit import RateLimits
from .testing import make_rollout_group


def run(completions: int = 8, tokens: int = 64, messages: int = 5000, senders: int = 16) -> dict[str, float]:
    outboxes = [Outbox(NodeIdentity.generate()) for _ in range(senders)]
    groups = [make_rollout_group(completions, tokens, seed=i) for i in range(8)]
    sealed = [outboxes[i % senders].seal(groups[i % len(groups)]) for i in range(messages)]
    ingress = Ingress(rate_limits=RateLimits(messages_per_s=1e9, message_burst=1e9, bytes_per_s=1e12, byte_burst=1e12))
    start = time.perf_counter()
    accepted = sum(ingress.accept(f"peer-{i % senders}", raw) is not None for i, raw in enumerate(sealed))
    elapsed = time.perf_counter() - start
    if accepted != messages:
        raise RuntimeError(f"only {accepted}/{messages} accepted: {dict(ingress.rejected)}")
    return {
        "messages_per_s": messages / elapsed,
        "us_per_message": elapsed / messages * 1e6,
        "bytes_per_message": sum(map(len, sealed)) / messages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args()
    result = run(args.completions, args.tokens, args.messages)
    print(
        f"ingress: {result['messages_per_s']:,.0f} verified msgs/s ({result['us_per_message']:.0f} us each), "
        f"{args.completions} x {args.tokens}-token RolloutGroup, {result['bytes_per_message']:,.0f} bytes"
    )


if __name__ == "__main__":
    main()
