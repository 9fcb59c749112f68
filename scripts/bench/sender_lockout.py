"""Can many keys lock new honest nodes out of the replay guard? (issue 16, "sender tables")

On the real Ingress with real signed envelopes, in simulated time (the Ingress and its replay
guard run on a fake clock, so an hour takes seconds): --attackers keys each send one valid message
every --period-s seconds (spread evenly over the period), enough to fill both the known and the
unknown sender tables (10,000 + 4,096 by default). After one period, --newcomers honest keys join
one after another over --minutes and each sends a message every --every-s seconds until the end.

Reported: how many newcomers got at least one message accepted, how many at their first message,
and every rejection by reason.

    .venv/bin/python -m scripts.bench.sender_lockout     # JSON on stdout

Runs against whatever `protocol` it imports (the same script measured the code before and after:
run from the root of the checkout to measure).
"""
from __future__ import annotations

import heapq
import json
import time

from scripts.common import arg_parser

START = 1.9e9  # simulated Unix time (s)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lockout(attackers: int = 14_100, newcomers: int = 50, period_s: float = 714.0, minutes: float = 60.0,
            every_s: float = 30.0) -> dict:
    from protocol import Ingress, NodeIdentity
    from protocol.testing import make_hint, seal_message

    clock = FakeClock(START)
    ingress = Ingress(clock=clock)
    body = make_hint()
    keys = [NodeIdentity.generate() for _ in range(attackers + newcomers)]
    sequences = [1 << 40] * len(keys)
    end = START + period_s + minutes * 60
    # (time, sender index): attackers from START, newcomers from one period later, staggered
    events = [(START + i * period_s / attackers, i) for i in range(attackers)]
    join_span = minutes * 60 / 2
    events += [(START + period_s + j * join_span / newcomers, attackers + j) for j in range(newcomers)]
    heapq.heapify(events)
    first: dict[int, bool] = {}
    accepted: set[int] = set()
    started = time.perf_counter()
    while events:
        at, sender = heapq.heappop(events)
        if at > end:
            break
        clock.now = at
        data = seal_message(keys[sender], body, sequences[sender], int(at * 1000))
        sequences[sender] += 1
        ok = ingress.accept(f"origin-{sender}", data) is not None
        if sender >= attackers:
            first.setdefault(sender, ok)
            if ok:
                accepted.add(sender)
        heapq.heappush(events, (at + (period_s if sender < attackers else every_s), sender))
    return {"attackers": attackers, "period_s": period_s, "newcomers": newcomers, "minutes": minutes,
            "newcomers_in": len(accepted), "newcomers_in_at_first_message": sum(first.values()),
            "rejected": dict(ingress.snapshot().rejected_by_reason),
            "known_senders": ingress.replay.known_senders, "senders_tracked": ingress.replay.senders_tracked,
            "wall_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = arg_parser(__spec__, __doc__)
    parser.add_argument("--attackers", type=int, default=14_100)
    parser.add_argument("--newcomers", type=int, default=50)
    parser.add_argument("--period-s", type=float, default=714.0, help="each attacker key sends this often (< 720 s ttl)")
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated time after the tables filled")
    parser.add_argument("--every-s", type=float, default=30.0, help="each newcomer sends this often")
    args = parser.parse_args()
    print(json.dumps(lockout(args.attackers, args.newcomers, args.period_s, args.minutes, args.every_s), indent=2))


if __name__ == "__main__":
    main()
